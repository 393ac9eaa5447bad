// The controller's view of the role workers: typed calls for every op of docs/protocol.md,
// each sent SPMD to all ranks of a role group (data split across DP ranks: contiguous shares
// of sequences for the forward ops, token-balanced shares of every mini-batch or of the rows
// for training; results gathered in rank order, so in the caller's order). The worker side
// (roles/worker*.c) serves exactly these ops. Errors name the role, rank and op
// ("policy/1: generate: ..."); a dead peer is reported with its id.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "roles/rollout.h"
#include "roles/transport.h"

// What the owner of the group (the controller) adds to every call: check() runs about every
// 100 ms while a call waits and on every transport error; returning -1 (with err set) ends
// the call with that error, e.g. "policy/0 (pid 123) was killed by signal 9; last lines of
// its log: ...". NULL: none.
typedef struct tr_group_hooks {
    int (*check)(void *ctx, tr_err *err);
    void *ctx;
} tr_group_hooks;

// Calls left in flight (started, not finished) on groups that share one router: a reply to
// one of them that arrives while another call collects is kept for it here. The groups'
// owner (the controller) holds one and points every group at it; groups without one cannot
// leave calls in flight.
typedef struct tr_inflight tr_inflight;
typedef struct tr_inflight_set {
    tr_inflight *head;
} tr_inflight_set;

typedef struct tr_group {
    tr_router *router;            // not owned
    char role[TR_ROLE_NAME_MAX];  // "policy", "reference", "critic", "reward", "generator"
    int32_t world;                // ranks: peers "<role>/0" .. "<role>/<world-1>"
    int32_t tp;                   // tensor-parallel ranks (rank = dp_rank * tp + tp_rank); set
                                  // by tr_role_init, 1 before; world / tp is the dp size
    bool train;                   // initialized with train (its ranks step together)
    int32_t mini_batches;         // train: optimizer steps per epoch of an RL train call
    int timeout_ms;               // per call; -1 = wait forever (heartbeats still detect death)
    uint64_t next_id;
    tr_group_hooks hooks;
    tr_inflight_set *inflight;    // not owned; NULL: no call may be left in flight
    uint64_t stale_replies;       // replies to earlier (failed or timed-out) calls, dropped
} tr_group;

// What the workers' generation engines report for a generate call, summed over the
// data-parallel ranks (peaks: the largest rank's).
typedef struct tr_gen_report {
    int64_t prefill_tokens, decode_tokens, decode_steps, waits;
    int64_t peak_seqs, peak_blocks;
    double decode_bytes, decode_seconds;   // summed over replicas: their mean rate
    double host_seconds;                   // the decode steps' host scheduling, summed
    int64_t graph_steps, padded_rows;      // steps replayed from recorded graphs, their padding
    int64_t table_entries, table_rewrites; // block-table entries sent, whole rewrites
    int64_t rows_sent;                     // decode rows sent rather than advanced on the device
} tr_gen_report;

typedef struct tr_sampling {
    int32_t n;                 // samples per prompt
    int32_t max_new_tokens;
    int32_t min_new_tokens;    // stop ids do not end a sample before this many tokens
    float temperature;         // 0 = greedy
    float top_p;               // 1 = off
    int32_t top_k;             // 0 = off
    uint64_t seed;             // prompt i (its index in the call) samples with the request seed
                               // tr_rng_derive(seed, i); its sample j draws from
                               // tr_rng_derive(that, j), whatever the DP split
    int32_t stop_ids[8];       // n_stop 0: the worker's default (chat format's stops, else
    int32_t n_stop;            // the model config's eos ids)
    const int32_t *extra_stop_ids;  // not owned: ids that end a sample besides those (any
    int32_t n_extra_stop;           // number: a recipe's rollout.stop_ids)
    tr_gen_report *report;     // NULL, or where the call's generation statistics are added
} tr_sampling;

// Prompts for generate: ids of each prompt, flat.
typedef struct tr_prompt_batch {
    int32_t n;
    const int32_t *ids;        // concatenated
    const int64_t *offset;     // [n + 1]
    const int32_t *group;      // [n] group id reported back in the rollouts; NULL: i
    char *const *text;         // [n] optional prompt texts (copied into the rollouts)
    char *const *meta;         // [n] optional meta JSON (copied into the rollouts)
} tr_prompt_batch;

// What policy.train / critic.train need besides the rollouts: per-token arrays aligned with
// r->tokens (entries on prompt tokens are ignored).
typedef struct tr_train_batch {
    const tr_rollouts *r;
    const float *advantages;   // [n_tokens] policy.train
    const float *old_logprobs; // [n_tokens] policy.train: behaviour logprobs
    const float *ref_logprobs; // [n_tokens] or NULL when KL is off
    const float *returns;      // [n_tokens] critic.train targets
    const float *old_values;   // [n_tokens] critic.train: values at rollout (the clip centre)
    // policy.train: the rollouts' weight versions (r->version) must be the trainer's current
    // weights (0) or those before its previous train call (1: the one-step-off pipeline); the
    // trainer refuses any other. -1: not checked.
    int32_t weight_lag;
} tr_train_batch;

// Supervised rows for policy.train_sft (SFT, pretraining), as data/sft.h fills them: each row
// of row_len tokens holds n_docs[r] documents (attention and positions restart per document).
typedef struct tr_sft_batch {
    int32_t n_rows, row_len;
    const int32_t *ids;        // [n_rows * row_len]
    const int32_t *targets;    // [n_rows * row_len] id to predict after token t; -1 = no loss
    const int32_t *doc_start;  // row r's n_docs[r] + 1 starts (0 ... row_len), rows back to back
    const int32_t *n_docs;     // [n_rows]
} tr_sft_batch;

// Training metrics of one train call over the whole batch (every data-parallel rank reports
// the same; rank 0's are read). Losses are means over the optimizer steps of the call;
// fractions are over trained tokens.
typedef struct tr_train_metrics {
    double loss, pg_loss, clip_frac, clip_frac_low, clip_frac_high, dual_clip_frac, approx_kl;
    double kl, entropy, ratio_mean, grad_norm, lr;
    double value_loss, value_clip_frac, value_mean;
    int64_t tokens;            // trained tokens (summed over epochs)
    double flops;              // of the passes that trained them (tr_model_forward_flops)
    int64_t steps;             // optimizer steps taken by this call
    int64_t step;              // the optimizer's step count afterwards
} tr_train_metrics;

// The init op: everything a worker needs, decided by the controller (workers never read the
// recipe). Strings may be NULL (absent).
typedef struct tr_role_optim {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_clip;          // global-norm clip; 0 = off
    const char *schedule;      // "constant", "linear", "cosine"
    int64_t warmup_steps, total_steps;
    double min_lr_ratio;
} tr_role_optim;

typedef struct tr_role_loss {
    double clip_low, clip_high, clip_dual;
    const char *ratio;         // engine/loss.h spellings: "token", "sequence"
    const char *agg;           // "token-mean", ...
    double kl_coef;
    const char *kl_estimator;  // "k1", "k2", "k3"
    double entropy_coef;
    double value_clip;         // critic: PPO2 value clip; 0 = off
    int32_t ppo_epochs, mini_batches;
    int32_t max_len;           // seq-mean-token-sum-norm's constant (max response length)
} tr_role_loss;

typedef struct tr_role_reward {
    const char *kind;          // "rule", "service", "model"
    const char *function;      // rule: "exact_match", "numeric_match", "regex"
    const char *pattern;       // rule regex
    const char *endpoint;      // service
    int32_t timeout_ms, attempts, max_items;
    const char *on_failure;    // service: "fail" or "zero"
} tr_role_reward;

typedef struct tr_init_args {
    const char *model;         // Hugging Face directory
    const char *init_config;   // or: a config.json for random init (transformers' init)
    uint64_t init_seed;
    const char *head;          // NULL: the checkpoint's; "value": an LM checkpoint's body with
                               // a value head drawn from init_seed (a critic from the policy)
    const char *backend;       // "cpu" or "cuda"
    const char *precision;     // "fp32" or "bf16"; NULL or "": the backend's default
    bool no_batch_invariance;  // cuda: the fastest kernel per product shape (tr_backend_opts)
    bool no_prompt_sharing;    // each sample computes its prompt (mb_plan.h)
    const char *save_dtype;    // "bf16": checkpoints hold bf16 weights; NULL or "": fp32
    int32_t threads;           // 0 = all cores; colocated roles share the first init's pool
    int32_t tp;                // tensor-parallel ranks of the group (0: 1); dp = world / tp
    bool sequence_parallel;    // tp > 1: norms and the residual stream split along the sequence
    const int32_t *devices;    // rank r runs on devices[r] (r < n_devices), else on r
    int32_t n_devices;
    int64_t memory_bytes;      // the memory plan's budget per rank; 0 = the device's free memory
    int32_t max_tokens;        // tokens per forward (a micro-batch); every sequence must fit;
                               // 0: the worker's memory plan chooses (engine/plan.h), between
    int32_t min_tokens;        // the longest sequence and
    int64_t max_tokens_want;   // the tokens there are to take (a step's per rank)
    const char *recompute;     // training activations recomputed: "auto" (NULL), "off", "on"
    uint64_t seed;             // the trainer's random stream
    const char *tokenizer;     // tokenizer.json: response texts (policy), decoding (reward)
    const char *chat_format;   // "chatml", "llama3": default stop tokens of generate
    bool train;                // policy, critic: gradients and AdamW state
    tr_role_optim optim;
    tr_role_loss loss;
    int64_t kv_tokens;         // policy, generator: KV cache tokens exactly (0: the memory plan's)
    int64_t kv_want;           // policy, generator: KV tokens that hold every sample of a step
    int32_t max_seqs;          // policy, generator: samples decoded together (0: kv_want's)
    int32_t logit_rows;        // the LM head's chunk (0: the memory plan's)
    bool no_generate;          // policy: a generator group samples for it (init's generate:
                               // false), so it plans no KV cache
    int32_t share_weights;     // policy, generator: the policy's working weights are shared
                               // with the generator in this many buffers (0: synced by copy)
    tr_role_reward reward;     // reward role
} tr_init_args;

// A role's memory by part (bytes, rank 0's), as init reports it: working weights, fp32
// masters, gradients, Adam moments, its share of the activation arena and of the KV cache,
// and the device memory in use once it is set up (0 on the CPU).
enum { TR_MEM_WEIGHTS, TR_MEM_MASTERS, TR_MEM_GRADS, TR_MEM_OPTIMIZER, TR_MEM_ACTIVATIONS, TR_MEM_KV,
       TR_MEM_DEVICE_USED, TR_MEM_PARTS };
extern const char *const tr_mem_part_names[TR_MEM_PARTS];

// What a worker reports after init (rank 0's).
typedef struct tr_role_info {
    int64_t n_params;          // 0 for rule and service rewards
    int32_t vocab_size;
    int32_t max_tokens;        // tokens per forward, the same on every rank (init fails if not)
    bool recompute;            // training activations are recomputed in backward
    char architecture[64];
    int64_t memory[TR_MEM_PARTS];
} tr_role_info;

int tr_group_init(tr_group *g, tr_router *router, const char *role, int32_t world);

// init: sends the same args to every rank (the worker learns its rank from its hello).
int tr_role_init(tr_group *g, const tr_init_args *a, tr_role_info *info, tr_err *err);
// policy.generate or generator.generate: rollouts for every prompt x sampling.n, ordered by
// (prompt, sample), appended to out, each stamped with the version of the weights that
// sampled it. Response texts come back when the role has a tokenizer.
int tr_policy_generate(tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                       tr_rollouts *out, tr_err *err);
// The same left in flight: tr_generate_start sends the requests and returns (prompts and s
// are not needed afterwards); tr_generate_finish waits and appends the rollouts to out, which
// must live until then; tr_generate_abandon forgets the call (its replies are dropped). Other
// calls may run in between (the group needs an in-flight set).
typedef struct tr_generate_call tr_generate_call;
int tr_generate_start(tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                      tr_rollouts *out, tr_generate_call **call, tr_err *err);
int tr_generate_finish(tr_generate_call *call, tr_err *err);
void tr_generate_abandon(tr_generate_call *call);
// policy.logprobs / reference.logprobs: training-path logprob of every token ([n_tokens]):
// logprobs[t] = ln p(tokens[t] | tokens[..t]) on response tokens, 0 on prompt tokens.
// entropy (may be NULL) is that distribution's entropy, 0 on prompt tokens.
int tr_model_logprobs(tr_group *g, const tr_rollouts *r, float *logprobs, float *entropy,
                      tr_err *err);
// policy.train: one RL update (ppo_epochs x mini-batches as configured at init); with
// data-parallel ranks every rank takes those steps on its share of each mini-batch.
int tr_policy_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err);
// policy.train_sft: one optimizer step of token-mean cross entropy over the rows.
int tr_policy_train_sft(tr_group *g, const tr_sft_batch *b, tr_train_metrics *out, tr_err *err);
// critic.values ([n_tokens]: values[t] = V(tokens[..t]), the state response token t is
// sampled from; 0 on prompt tokens) and critic.train (clipped value loss).
int tr_critic_values(tr_group *g, const tr_rollouts *r, float *values, tr_err *err);
int tr_critic_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err);
// reward.score: one score per sequence (rule, model or service as the worker was set up);
// *failures (may be NULL) counts items a failing service scored 0 under on_failure: zero.
// Errors number the sequences from first (r's place in what the caller scores as a whole).
int tr_reward_score(tr_group *g, const tr_rollouts *r, int64_t first, float *scores, int64_t *failures,
                    tr_err *err);
// save/load an HF directory (+ training state) under dir (every rank takes part: rank 0
// writes the weights, each data-parallel rank its shard of the optimizer); sync_weights on a
// policy that generates on its own weights (no generator group) has nothing to move
// (*synced false).
int tr_role_save(tr_group *g, const char *dir, tr_err *err);
int tr_role_load(tr_group *g, const char *dir, tr_err *err);
int tr_policy_sync_weights(tr_group *g, bool *synced, tr_err *err);

// What one weight sync from the policy to the generator moved.
typedef struct tr_sync_stats {
    int64_t version;           // the policy's optimizer step the weights are from
    int64_t bytes;             // bytes broadcast (every sending rank's weights)
    int32_t buckets;           // broadcasts they took
    double seconds;            // the broadcast on the policy's side
    bool verified;             // checksums taken and equal on the policy and every generator replica
    uint64_t checksum;         // the policy's (resync.h: the same at any tensor-parallel layout)
} tr_sync_stats;
// sync_weights on the policy's first tensor-parallel group and every generator rank at once,
// over the sync communicator (tr_groups_sync_comm_init): the policy's ranks broadcast their
// weights in buckets of at most bucket_bytes (0: the worker's default), each generator rank
// keeping its layout's part. Fails when a generator rank reports another version than the
// policy sent, or, with verify, when a generator replica's ranks' checksums do not add up to
// the policy's.
int tr_weights_sync(tr_group *policy, tr_group *generator, int64_t bucket_bytes, bool verify,
                    tr_sync_stats *out, tr_err *err);
// The same where the generator reads the policy's working weights in place (init's
// share_weights): policy ranks 0 .. G-1 publish their buffers, then generator rank r maps
// policy rank r's. Nothing is copied (bytes and buckets 0; seconds: both calls). Fails when a
// generator rank reads another version than its policy rank published, or, with verify,
// weights of another checksum.
int tr_weights_share_sync(tr_group *policy, tr_group *generator, bool verify, tr_sync_stats *out, tr_err *err);
// Asks every rank to exit and waits for the acknowledgements (not for the processes) up to
// the group's timeout (10 s when it has none); ranks already dead or silent are skipped, so
// this only fails when the request cannot be built.
int tr_group_shutdown(tr_group *g, tr_err *err);

// Forms the data-parallel communicators of every group in gs (each with dp > 1; one per
// tensor-parallel rank k, over ranks d * tp + k): comm_id to each communicator's rank 0, then
// comm_join to every rank of every group, then comm_ready, each step sent to all the groups
// at once, so no worker waits for a peer that is busy with another group's step. timeout_ms
// bounds the wait for the last rank to join.
int tr_groups_comm_init(tr_group *const *gs, int n, int timeout_ms, tr_err *err);
// The same for the tensor-parallel communicators of every group in gs (each with tp > 1; one
// per data-parallel rank d, over ranks d * tp .. d * tp + tp - 1).
int tr_groups_tp_comm_init(tr_group *const *gs, int n, int timeout_ms, tr_err *err);
// Forms the weight-sync communicator: the policy's rank 0 makes it (comm_id), then the
// policy's ranks k < tp (its dp rank 0's tensor-parallel group) join as rank k and every
// generator rank r as rank tp + r (comm_join, both groups at once), then comm_ready.
int tr_groups_sync_comm_init(tr_group *policy, tr_group *generator, int timeout_ms, tr_err *err);
