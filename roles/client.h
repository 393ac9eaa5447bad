// The controller's view of the role workers: typed calls for every op of docs/protocol.md,
// each sent SPMD to all ranks of a role group (data split across DP ranks, results gathered
// in order). The worker side (roles/worker*.c) serves exactly these ops.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "roles/rollout.h"
#include "roles/transport.h"

typedef struct tr_group {
    tr_router *router;            // not owned
    char role[TR_ROLE_NAME_MAX];  // "policy", "reference", "critic", "reward"
    int32_t world;                // ranks: peers "<role>/0" .. "<role>/<world-1>"
    int timeout_ms;               // per call; -1 = wait forever (heartbeats still detect death)
    uint64_t next_id;
} tr_group;

typedef struct tr_sampling {
    int32_t n;                 // samples per prompt
    int32_t max_new_tokens;
    float temperature;         // 0 = greedy
    float top_p;               // 1 = off
    int32_t top_k;             // 0 = off
    uint64_t seed;             // sample j of prompt i uses tr_rng_derive(seed, i * n + j)
    int32_t stop_ids[8];
    int32_t n_stop;
} tr_sampling;

// Prompts for generate: ids of each prompt, flat.
typedef struct tr_prompt_batch {
    int32_t n;
    const int32_t *ids;        // concatenated
    const int64_t *offset;     // [n + 1]
    const int32_t *group;      // [n] group id reported back in the rollouts
    char *const *text;         // [n] optional prompt texts (copied into the rollouts)
    char *const *meta;         // [n] optional meta JSON (copied into the rollouts)
} tr_prompt_batch;

// What policy.train needs besides the rollouts: per-token arrays aligned with r->tokens.
typedef struct tr_train_batch {
    const tr_rollouts *r;
    const float *advantages;   // [n_tokens]
    const float *old_logprobs; // [n_tokens] behaviour logprobs (recomputed or generation's)
    const float *ref_logprobs; // [n_tokens] or NULL when KL is off
    const float *returns;      // [n_tokens] critic targets (critic.train)
    const float *old_values;   // [n_tokens] critic values at rollout (critic.train)
} tr_train_batch;

// Training metrics averaged over the step as reported by rank 0 (after DP reduction).
typedef struct tr_train_metrics {
    double loss, clip_frac, approx_kl, kl, entropy, grad_norm, lr, value_loss, value_clip_frac;
    int64_t tokens;
} tr_train_metrics;

int tr_group_init(tr_group *g, tr_router *router, const char *role, int32_t world);

// policy.generate: rollouts for every prompt x sampling.n, ordered by (prompt, sample).
int tr_policy_generate(tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                       tr_rollouts *out, tr_err *err);
// policy.logprobs / reference.logprobs: training-path logprob of every token ([n_tokens],
// 0 on prompt tokens); entropy may be NULL.
int tr_model_logprobs(tr_group *g, const tr_rollouts *r, float *logprobs, float *entropy,
                      tr_err *err);
// policy.train: one RL update (ppo_epochs x mini-batches as configured at worker init).
int tr_policy_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err);
// policy.train on supervised rows (SFT / pretrain): ids + loss mask + document starts.
int tr_policy_train_sft(tr_group *g, int32_t n_rows, int32_t row_len, const int32_t *ids,
                        const uint8_t *loss_mask, const int32_t *doc_starts_flat,
                        const int32_t *n_docs, tr_train_metrics *out, tr_err *err);
// critic.values ([n_tokens], 0 on prompt tokens) and critic.train.
int tr_critic_values(tr_group *g, const tr_rollouts *r, float *values, tr_err *err);
int tr_critic_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err);
// reward.score: one score per sequence (rule, model or service as the worker was set up).
int tr_reward_score(tr_group *g, const tr_rollouts *r, float *scores, int64_t *failures,
                    tr_err *err);
// save/load an HF directory (+ training state) under dir; sync_weights pushes the policy's
// weights to where generation runs (no-op when colocated in one process).
int tr_role_save(tr_group *g, const char *dir, tr_err *err);
int tr_role_load(tr_group *g, const char *dir, tr_err *err);
int tr_policy_sync_weights(tr_group *g, tr_err *err);
// Asks every rank to exit.
int tr_group_shutdown(tr_group *g, tr_err *err);
