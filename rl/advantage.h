// Advantage estimators of the RL workflows on flat arrays: GRPO (and Dr.GRPO), RLOO,
// REINFORCE++ (with and without the group baseline) and GAE, plus the masked batch whitening
// they share. Nothing here knows about models: rewards, values and masks come in as arrays.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"

// Layout used throughout rl/: a batch of B responses (rows), each padded to T tokens,
// row-major [B*T]. mask[b*T+t] is 1 for a response token that is trained on and 0 for
// padding. A response's outcome reward belongs to its last valid token.

enum tr_adv_kind {
    TR_ADV_GRPO,                   // (r - group mean) / (group std + eps); Dr.GRPO without std
    TR_ADV_GAE,                    // PPO: generalized advantage estimation from critic values
    TR_ADV_RLOO,                   // r - mean of the other responses of the group
    TR_ADV_REINFORCE_PP,           // REINFORCE++: discounted returns, whitened over the batch
    TR_ADV_REINFORCE_PP_BASELINE,  // REINFORCE++-baseline: r - group mean, whitened over the batch
};

// Epsilon added to the group std in GRPO (DeepSeekMath / verl use 1e-6).
#define TR_ADV_GRPO_EPS 1e-6f
// Added to the variance before the square root in batch whitening (verl's masked_whiten).
#define TR_ADV_WHITEN_EPS 1e-8

typedef struct tr_adv_cfg {
    enum tr_adv_kind kind;
    bool norm_by_std;   // GRPO only: false gives Dr.GRPO (no division by the group std)
    float eps;          // GRPO std epsilon, normally TR_ADV_GRPO_EPS
    float gamma;        // discount (GAE, REINFORCE++)
    float lam;          // GAE lambda
} tr_adv_cfg;

typedef struct tr_adv_input {
    int32_t B, T;
    const float *seq_rewards;    // [B] outcome reward of each response
    const int32_t *group;        // [B] prompt group of each response, in [0, n_groups)
    int32_t n_groups;
    const uint8_t *mask;         // [B*T]
    const float *values;         // [B*T] critic values at each token (GAE only, else NULL)
    const float *token_rewards;  // [B*T] extra per-token rewards, e.g. -kl_coef*kl, or NULL
} tr_adv_input;

// Fills adv[B*T] (0 on masked tokens) and, when returns is not NULL, returns[B*T]: the critic
// targets adv + values for GAE; for the critic-free estimators returns equal the advantages.
// Group estimators score each response by its outcome reward plus the sum of its per-token
// rewards (as verl does when the KL penalty sits in the reward).
int tr_adv_compute(const tr_adv_cfg *cfg, const tr_adv_input *in, float *adv, float *returns,
                   tr_err *err);

// The pieces, usable on their own. n responses with group ids in [0, n_groups).

// GRPO: A_i = (r_i - mean_g) / (std_g + eps), std the unbiased (n-1) estimator as torch.std
// in the DeepSeekMath/verl implementation; without norm_by_std, A_i = r_i - mean_g (Dr.GRPO).
// A group of one has no baseline and gets A = 0 (torch would give NaN for its std).
int tr_adv_grpo(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                bool norm_by_std, float eps, float *seq_adv, tr_err *err);
// RLOO: A_i = r_i - (sum_g - r_i) / (n_g - 1). A group of one gets A = 0.
int tr_adv_rloo(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                float *seq_adv, tr_err *err);
// r_i - group mean (a group of one gets 0): the REINFORCE++-baseline score before whitening.
int tr_adv_group_center(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                        float *seq_adv, tr_err *err);

// adv[b*T+t] = seq_adv[b] on valid tokens, 0 elsewhere.
void tr_adv_broadcast(const float *seq_adv, const uint8_t *mask, int32_t B, int32_t T, float *adv);
// token_rewards[B*T] = extra (or 0) on valid tokens, plus seq_rewards[b] on row b's last valid
// token; rows without valid tokens receive nothing.
void tr_adv_place_rewards(const float *seq_rewards, const float *extra, const uint8_t *mask,
                          int32_t B, int32_t T, float *token_rewards);
// Discounted returns G_t = r_t + gamma * G_next over the valid tokens of each row (masked
// tokens are skipped, not counted as steps); 0 on masked tokens.
void tr_adv_discounted_returns(const float *token_rewards, const uint8_t *mask, int32_t B,
                               int32_t T, float gamma, float *returns);
// GAE over the valid tokens of each row: delta_t = r_t + gamma V_next - V_t with V = 0 after
// the last valid token, A_t = delta_t + gamma lam A_next; returns_t = A_t + V_t.
void tr_adv_gae(const float *token_rewards, const float *values, const uint8_t *mask, int32_t B,
                int32_t T, float gamma, float lam, float *adv, float *returns);
// In place: x <- (x - mean) / sqrt(var + TR_ADV_WHITEN_EPS) over the n valid entries, var the
// unbiased estimator (0 when fewer than two valid entries); masked entries are set to 0.
void tr_adv_whiten(float *x, const uint8_t *mask, int64_t n);

// Recipe spellings, indexed by enum tr_adv_kind, NULL-terminated.
extern const char *const tr_adv_kind_names[];
const char *tr_adv_kind_name(enum tr_adv_kind kind);
