// The critic's loss: PPO2 clipped value loss (OpenAI baselines ppo2), the larger of the
// squared errors of the new prediction and of the prediction clipped around the old one.
#include <string.h>

#include "engine/loss.h"

int tr_value_loss(float clip, enum tr_loss_agg agg, const tr_value_loss_in *in,
                  tr_value_loss_out *out, float *grad_values, tr_err *err) {
    memset(out, 0, sizeof *out);
    if (in->B < 0 || in->T < 0) return tr_errf(err, TR_EINVAL, "value loss: negative batch shape");
    if ((int)agg < 0 || agg > TR_AGG_SEQ_MEAN_TOKEN_SUM_NORM)
        return tr_errf(err, TR_EINVAL, "value loss: unknown aggregation %d", (int)agg);
    tr_loss_norm local;
    const tr_loss_norm *norm = in->norm;
    if (!norm) {
        tr_loss_norm_from_mask(in->mask, in->B, in->T, 0.0, &local);
        norm = &local;
    }
    int64_t n_tok = 0, n_clip = 0;
    double sum_v = 0.0;
    for (int32_t b = 0; b < in->B; b++) {
        int64_t row = (int64_t)b * in->T, len = 0;
        for (int32_t t = 0; t < in->T; t++) len += in->mask[row + t] != 0;
        double w = tr_loss_agg_weight(agg, norm, len);
        for (int32_t t = 0; t < in->T; t++) {
            int64_t i = row + t;
            grad_values[i] = 0.0f;
            if (!in->mask[i]) continue;
            double v = in->values[i], old = in->old_values[i], ret = in->returns[i];
            double e1 = v - ret, l1 = 0.5 * e1 * e1, l = l1, g = e1;
            if (clip > 0.0f) {
                double d = v - old, dvc = 1.0;
                if (d > clip) d = clip, dvc = 0.0;
                if (d < -clip) d = -clip, dvc = 0.0;
                double e2 = old + d - ret, l2 = 0.5 * e2 * e2;
                if (l2 > l1) {
                    l = l2;
                    g = e2 * dvc;
                    n_clip++;
                }
            }
            out->loss += w * l;
            grad_values[i] = (float)(w * g);
            sum_v += v;
            n_tok++;
        }
    }
    out->n_tokens = n_tok;
    if (n_tok > 0) {
        out->clip_frac = (double)n_clip / (double)n_tok;
        out->value_mean = sum_v / (double)n_tok;
    }
    return 0;
}
