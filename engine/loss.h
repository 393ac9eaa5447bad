// RL losses on flat per-token arrays: the PPO clipped surrogate (clip-higher, dual clip,
// token or GSPO sequence ratio), KL to the reference (k1/k2/k3, as a loss or a reward
// penalty), the entropy bonus and the clipped value loss. Each returns its value, metrics and
// the gradient with respect to its per-token inputs; the engine backpropagates from there.
#pragma once
#include <stdint.h>

#include "engine/err.h"

// The layout rl/advantage.h also uses: B rows of T tokens, row-major, mask 1 on trained tokens.

// How per-token losses l[b,t] become one number. n_seqs counts rows with a valid token.
enum tr_loss_agg {
    TR_AGG_TOKEN_MEAN,              // sum_bt l / n_tokens
    TR_AGG_SEQ_MEAN_TOKEN_SUM,      // sum_b (sum_t l) / n_seqs
    TR_AGG_SEQ_MEAN_TOKEN_MEAN,     // sum_b (sum_t l / len_b) / n_seqs
    TR_AGG_SEQ_MEAN_TOKEN_SUM_NORM, // sum_b (sum_t l / max_len) / n_seqs   (Dr.GRPO)
};

enum tr_ratio_mode {
    TR_RATIO_TOKEN,     // r_t = exp(logp_t - old_t)                        (PPO, GRPO, DAPO)
    TR_RATIO_SEQUENCE,  // s_b = exp(mean_t(logp_t - old_t)) for every token of row b (GSPO)
};

// Schulman, "Approximating KL Divergence" (2020): estimators of KL(pi || ref) from samples
// of pi, with logr = ref_logp - logp.
enum tr_kl_est {
    TR_KL_K1,  // -logr
    TR_KL_K2,  // logr^2 / 2
    TR_KL_K3,  // exp(logr) - 1 - logr, with logr clamped to [-20, 20] and the value to [-10, 10]
};

enum tr_kl_placement { TR_KL_IN_LOSS, TR_KL_IN_REWARD };

// Recipe spellings, indexed by the enums, NULL-terminated.
extern const char *const tr_loss_agg_names[];
extern const char *const tr_ratio_mode_names[];
extern const char *const tr_kl_est_names[];
extern const char *const tr_kl_placement_names[];

// Denominators of the aggregation. They belong to the whole mini-batch, so that the losses
// (and gradients) of its micro-batches add up to the mini-batch loss.
typedef struct tr_loss_norm {
    double n_tokens;  // valid tokens
    double n_seqs;    // rows with at least one valid token
    double max_len;   // the constant of seq-mean-token-sum-norm (maximum response length)
} tr_loss_norm;

void tr_loss_norm_from_mask(const uint8_t *mask, int32_t B, int32_t T, double max_len,
                            tr_loss_norm *norm);
// Weight of each valid token of a row with row_len valid tokens: the aggregate is
// sum_t weight * l_t (0 when a denominator is 0).
double tr_loss_agg_weight(enum tr_loss_agg agg, const tr_loss_norm *norm, int64_t row_len);

// KL estimate for one token; *d (if not NULL) receives d(kl)/d(logp).
float tr_kl_estimate(enum tr_kl_est est, float logp, float ref_logp, float *d);
// KL in the reward: penalty[i] = -coef * kl(logp[i], ref_logp[i]) on valid tokens, 0 elsewhere
// (logp is the rollout policy's). Returns the mean KL over valid tokens (0 if none).
double tr_kl_reward_penalty(enum tr_kl_est est, float coef, const float *logp,
                            const float *ref_logp, const uint8_t *mask, int64_t n, float *penalty);

// Log ratios are clamped to [-TR_LOSS_LOG_RATIO_MAX, +..] before exp so a stale token cannot
// overflow; the clamped region has zero gradient.
#define TR_LOSS_LOG_RATIO_MAX 20.0

typedef struct tr_policy_loss_cfg {
    float clip_low;      // ratio floor 1 - clip_low
    float clip_high;     // ratio ceiling 1 + clip_high (clip-higher when > clip_low)
    float clip_dual;     // dual clip c > 1 bounds the loss of negative advantages by -c*A; 0 = off
    enum tr_ratio_mode ratio;
    enum tr_loss_agg agg;
    float kl_coef;       // KL-to-reference loss weight; 0 = no KL term
    enum tr_kl_est kl_est;
    float entropy_coef;  // entropy bonus weight; 0 = no entropy term
} tr_policy_loss_cfg;

typedef struct tr_policy_loss_in {
    int32_t B, T;
    const uint8_t *mask;
    const float *logp;      // current policy log-probability of each sampled token
    const float *old_logp;  // the same under the policy that sampled (behaviour policy)
    const float *adv;       // per-token advantages
    const float *ref_logp;  // reference log-probabilities (needed when kl_coef != 0; when
                            // given with kl_coef 0 the KL is still measured)
    const float *entropy;   // per-token entropy of the current policy (needed when
                            // entropy_coef != 0; likewise measured whenever given)
    const tr_loss_norm *norm;  // NULL: computed from this batch's mask
} tr_policy_loss_in;

typedef struct tr_policy_loss_out {
    double loss;            // pg_loss + kl_coef * kl - entropy_coef * entropy
    double pg_loss;         // aggregated clipped surrogate
    double kl;              // aggregated KL estimate (before kl_coef)
    double entropy;         // aggregated entropy (before entropy_coef)
    // Fractions over this batch's valid tokens:
    double clip_frac;       // the clipped branch is active (zero gradient)
    double clip_frac_low;   // ... with the ratio below 1 - clip_low
    double clip_frac_high;  // ... with the ratio above 1 + clip_high
    double dual_clip_frac;  // the dual clip bound is active
    double approx_kl;       // mean k3 estimate of KL(old || new): r - 1 - log r, r = new/old
    double ratio_mean;
    int64_t n_tokens;
} tr_policy_loss_out;

// grad_logp[B*T] = dL/dlogp (0 on masked tokens); grad_entropy[B*T] = dL/dentropy, may be
// NULL when entropy_coef is 0.
int tr_policy_loss(const tr_policy_loss_cfg *cfg, const tr_policy_loss_in *in,
                   tr_policy_loss_out *out, float *grad_logp, float *grad_entropy, tr_err *err);

typedef struct tr_value_loss_in {
    int32_t B, T;
    const uint8_t *mask;
    const float *values;      // current critic predictions
    const float *old_values;  // predictions at rollout time (the clip centre)
    const float *returns;     // targets
    const tr_loss_norm *norm; // NULL: from this batch
} tr_value_loss_in;

typedef struct tr_value_loss_out {
    double loss;
    double clip_frac;   // fraction of valid tokens where the clipped term is the larger one
    double value_mean;
    int64_t n_tokens;
} tr_value_loss_out;

// PPO2 value loss: l_t = 1/2 max((v - R)^2, (v_clip - R)^2) with
// v_clip = old + clamp(v - old, -clip, clip); clip <= 0 gives the plain 1/2 (v - R)^2.
// grad_values[B*T] = dL/dv.
int tr_value_loss(float clip, enum tr_loss_agg agg, const tr_value_loss_in *in,
                  tr_value_loss_out *out, float *grad_values, tr_err *err);
