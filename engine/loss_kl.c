// KL to the reference: Schulman's k1/k2/k3 estimators with their derivatives, used either as
// a loss term (tr_policy_loss) or as a per-token reward penalty (tr_kl_reward_penalty).
#include <math.h>
#include <stddef.h>

#include "engine/loss.h"

const char *const tr_kl_est_names[] = {"k1", "k2", "k3", NULL};
const char *const tr_kl_placement_names[] = {"loss", "reward", NULL};

// k3 bounds as in verl's low_var_kl: exp of a large log ratio would dominate the batch.
#define KL_K3_LOGR_MAX 20.0
#define KL_K3_VALUE_MAX 10.0

float tr_kl_estimate(enum tr_kl_est est, float logp, float ref_logp, float *d) {
    double logr = (double)ref_logp - (double)logp;
    double v = 0.0, g = 0.0;  // g = d(kl)/d(logp) = -d(kl)/d(logr)
    switch (est) {
    case TR_KL_K1:
        v = -logr;
        g = 1.0;
        break;
    case TR_KL_K2:
        v = 0.5 * logr * logr;
        g = -logr;
        break;
    case TR_KL_K3: {
        double lr = logr, dlr = 1.0;
        if (lr > KL_K3_LOGR_MAX) lr = KL_K3_LOGR_MAX, dlr = 0.0;
        if (lr < -KL_K3_LOGR_MAX) lr = -KL_K3_LOGR_MAX, dlr = 0.0;
        double e = exp(lr);
        v = e - 1.0 - lr;
        g = -(e - 1.0) * dlr;
        if (v > KL_K3_VALUE_MAX) v = KL_K3_VALUE_MAX, g = 0.0;
        if (v < -KL_K3_VALUE_MAX) v = -KL_K3_VALUE_MAX, g = 0.0;
        break;
    }
    }
    if (d) *d = (float)g;
    return (float)v;
}

double tr_kl_reward_penalty(enum tr_kl_est est, float coef, const float *logp,
                            const float *ref_logp, const uint8_t *mask, int64_t n, float *penalty) {
    double sum = 0.0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!mask[i]) {
            penalty[i] = 0.0f;
            continue;
        }
        float kl = tr_kl_estimate(est, logp[i], ref_logp[i], NULL);
        penalty[i] = -coef * kl;
        sum += kl;
        cnt++;
    }
    return cnt ? sum / (double)cnt : 0.0;
}
