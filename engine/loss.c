// The policy loss: PPO clipped surrogate with separate low/high clip (DAPO clip-higher),
// dual clip (Ye et al. 2020) on negative advantages, token ratios or GSPO sequence ratios,
// plus KL-to-reference and entropy terms, all aggregated with the same per-token weights.
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "engine/loss.h"

// One token's clipped surrogate for ratio r: the loss and d(loss)/dr, plus which branch won.
typedef struct surrogate {
    double loss, dr;
    bool clipped, dual;
} surrogate;

static surrogate surrogate_eval(const tr_policy_loss_cfg *cfg, double r, double a) {
    surrogate s = {0};
    double lo = 1.0 - (double)cfg->clip_low, hi = 1.0 + (double)cfg->clip_high;
    double r_clip = r < lo ? lo : (r > hi ? hi : r);
    double l1 = -a * r, l2 = -a * r_clip;
    // max(l1, l2): the pessimistic bound; at a tie the unclipped branch carries the gradient.
    if (l2 > l1) {
        s.loss = l2;
        s.clipped = true;
    } else {
        s.loss = l1;
        s.dr = -a;
    }
    if (cfg->clip_dual > 0.0f && a < 0.0) {
        double l3 = -a * (double)cfg->clip_dual;
        if (l3 < s.loss) {
            s.loss = l3;
            s.dr = 0.0;
            s.dual = true;
        }
    }
    return s;
}

// exp of a clamped log ratio; *dexp = d/d(log ratio), 0 where the clamp is active.
static double ratio_exp(double log_ratio, double *dexp) {
    if (log_ratio > TR_LOSS_LOG_RATIO_MAX || log_ratio < -TR_LOSS_LOG_RATIO_MAX) {
        double r = exp(log_ratio > 0 ? TR_LOSS_LOG_RATIO_MAX : -TR_LOSS_LOG_RATIO_MAX);
        *dexp = 0.0;
        return r;
    }
    double r = exp(log_ratio);
    *dexp = r;
    return r;
}

static int check_cfg(const tr_policy_loss_cfg *cfg, const tr_policy_loss_in *in,
                     const float *grad_entropy, tr_err *err) {
    if (in->B < 0 || in->T < 0) return tr_errf(err, TR_EINVAL, "policy loss: negative batch shape");
    if (!(cfg->clip_low >= 0.0f && cfg->clip_low < 1.0f))
        return tr_errf(err, TR_EINVAL, "policy loss: clip low %g outside [0, 1)", (double)cfg->clip_low);
    if (!(cfg->clip_high >= 0.0f))
        return tr_errf(err, TR_EINVAL, "policy loss: clip high %g is negative", (double)cfg->clip_high);
    if (cfg->clip_dual != 0.0f && !(cfg->clip_dual > 1.0f))
        return tr_errf(err, TR_EINVAL, "policy loss: dual clip %g must be 0 (off) or > 1",
                       (double)cfg->clip_dual);
    if ((int)cfg->ratio < 0 || cfg->ratio > TR_RATIO_SEQUENCE)
        return tr_errf(err, TR_EINVAL, "policy loss: unknown ratio mode %d", (int)cfg->ratio);
    if ((int)cfg->agg < 0 || cfg->agg > TR_AGG_SEQ_MEAN_TOKEN_SUM_NORM)
        return tr_errf(err, TR_EINVAL, "policy loss: unknown aggregation %d", (int)cfg->agg);
    if ((int)cfg->kl_est < 0 || cfg->kl_est > TR_KL_K3)
        return tr_errf(err, TR_EINVAL, "policy loss: unknown KL estimator %d", (int)cfg->kl_est);
    if (cfg->kl_coef != 0.0f && !in->ref_logp)
        return tr_errf(err, TR_EINVAL, "policy loss: kl_coef %g needs reference logprobs",
                       (double)cfg->kl_coef);
    if (cfg->entropy_coef != 0.0f && (!in->entropy || !grad_entropy))
        return tr_errf(err, TR_EINVAL, "policy loss: entropy_coef %g needs entropies and their gradient buffer",
                       (double)cfg->entropy_coef);
    return 0;
}

int tr_policy_loss(const tr_policy_loss_cfg *cfg, const tr_policy_loss_in *in,
                   tr_policy_loss_out *out, float *grad_logp, float *grad_entropy, tr_err *err) {
    memset(out, 0, sizeof *out);
    if (check_cfg(cfg, in, grad_entropy, err) != 0) return -1;
    tr_loss_norm local;
    const tr_loss_norm *norm = in->norm;
    if (!norm) {
        tr_loss_norm_from_mask(in->mask, in->B, in->T, 0.0, &local);
        norm = &local;
    }
    // KL and entropy are measured whenever their inputs are given (they are worth logging
    // with a zero coefficient too); they reach the gradient only through their coefficients.
    bool use_kl = in->ref_logp != NULL, use_ent = in->entropy != NULL;
    int64_t n_clip = 0, n_low = 0, n_high = 0, n_dual = 0, n_tok = 0;
    double sum_kl_old = 0.0, sum_ratio = 0.0;
    double lo = 1.0 - (double)cfg->clip_low, hi = 1.0 + (double)cfg->clip_high;
    for (int32_t b = 0; b < in->B; b++) {
        int64_t row = (int64_t)b * in->T, len = 0;
        double sum_lr = 0.0;
        for (int32_t t = 0; t < in->T; t++)
            if (in->mask[row + t]) {
                len++;
                sum_lr += (double)in->logp[row + t] - (double)in->old_logp[row + t];
            }
        double w = tr_loss_agg_weight(cfg->agg, norm, len);
        // GSPO: one ratio per row, the exp of the mean token log ratio.
        double seq_r = 0.0, seq_dexp = 0.0, seq_dl_dr = 0.0;
        if (cfg->ratio == TR_RATIO_SEQUENCE && len > 0) seq_r = ratio_exp(sum_lr / (double)len, &seq_dexp);
        for (int32_t t = 0; t < in->T; t++) {
            int64_t i = row + t;
            grad_logp[i] = 0.0f;
            if (grad_entropy) grad_entropy[i] = 0.0f;
            if (!in->mask[i]) continue;
            double lr = (double)in->logp[i] - (double)in->old_logp[i], dexp;
            double tok_r = ratio_exp(lr, &dexp);
            double r = cfg->ratio == TR_RATIO_SEQUENCE ? seq_r : tok_r;
            double a = in->adv[i];
            surrogate s = surrogate_eval(cfg, r, a);
            out->pg_loss += w * s.loss;
            double g = 0.0;
            if (cfg->ratio == TR_RATIO_TOKEN)
                g = w * s.dr * dexp;
            else
                seq_dl_dr += w * s.dr;  // spread over the row below: ds/dlogp_t = s / len
            if (use_kl) {
                float dkl;
                float kl = tr_kl_estimate(cfg->kl_est, in->logp[i], in->ref_logp[i], &dkl);
                out->kl += w * kl;
                g += (double)cfg->kl_coef * w * dkl;
            }
            if (use_ent) {
                out->entropy += w * in->entropy[i];
                if (grad_entropy) grad_entropy[i] = (float)(-(double)cfg->entropy_coef * w);
            }
            grad_logp[i] = (float)g;
            n_tok++;
            n_clip += s.clipped;
            n_low += s.clipped && r < lo;
            n_high += s.clipped && r > hi;
            n_dual += s.dual;
            sum_ratio += r;
            sum_kl_old += tok_r - 1.0 - (lr > TR_LOSS_LOG_RATIO_MAX ? TR_LOSS_LOG_RATIO_MAX
                                         : lr < -TR_LOSS_LOG_RATIO_MAX ? -TR_LOSS_LOG_RATIO_MAX : lr);
        }
        if (cfg->ratio == TR_RATIO_SEQUENCE && len > 0) {
            double gs = seq_dl_dr * seq_dexp / (double)len;
            for (int32_t t = 0; t < in->T; t++)
                if (in->mask[row + t]) grad_logp[row + t] = (float)((double)grad_logp[row + t] + gs);
        }
    }
    out->loss = out->pg_loss + (double)cfg->kl_coef * out->kl - (double)cfg->entropy_coef * out->entropy;
    out->n_tokens = n_tok;
    if (n_tok > 0) {
        double n = (double)n_tok;
        out->clip_frac = (double)n_clip / n;
        out->clip_frac_low = (double)n_low / n;
        out->clip_frac_high = (double)n_high / n;
        out->dual_clip_frac = (double)n_dual / n;
        out->approx_kl = sum_kl_old / n;
        out->ratio_mean = sum_ratio / n;
    }
    return 0;
}
