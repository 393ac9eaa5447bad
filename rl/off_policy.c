// Truncated importance weights of off-policy rollouts (rl/off_policy.h): the ratio in double
// from the logprob difference, truncated at the cap, applied to the advantage in fp32.
#include "rl/off_policy.h"

#include <math.h>
#include <string.h>

void tr_tis_weight(const tr_rollouts *r, const float *old_lp, const float *behav_lp, double cap,
                   float *adv, tr_tis_stats *st) {
    memset(st, 0, sizeof *st);
    double sum = 0;
    int64_t clipped = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int64_t o = r->offset[i] + r->prompt_len[i];
        for (int32_t t = 0; t < r->response_len[i]; t++) {
            double ratio = exp((double)old_lp[o + t] - (double)behav_lp[o + t]);
            double w = ratio > cap ? cap : ratio;
            adv[o + t] = (float)((double)adv[o + t] * w);
            if (!(ratio <= st->ratio_max)) st->ratio_max = ratio;  // NaN propagates
            clipped += ratio > cap;
            sum += w;
            st->tokens++;
        }
    }
    st->weight_mean = st->tokens ? sum / (double)st->tokens : NAN;
    st->clip_frac = st->tokens ? (double)clipped / (double)st->tokens : NAN;
}
