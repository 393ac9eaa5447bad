// Recipes: the YAML file that describes a run (workflow, models, data, rollout, algorithm,
// training, placement, logging), read through libyaml into the typed tr_recipe below.
// Unknown keys, wrong types and impossible values are errors naming file:line:column;
// `--set a.b.c=value` overrides any key. docs/recipes.md lists every key and its default.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "rl/advantage.h"
#include "engine/loss.h"

#define TR_RECIPE_PATH_MAX 1024
#define TR_RECIPE_NAME_MAX 256
#define TR_RECIPE_MAX_DEVICES 64
#define TR_RECIPE_MAX_PREFIXES 64
#define TR_RECIPE_MAX_GROUPS 4
#define TR_RECIPE_MAX_SETS 256
// rollout.stop_ids' room: 32 KiB of the recipe, thousands of ids (a benchmark's stop set of one
// id in 256 of a 152K vocabulary is 594).
#define TR_RECIPE_MAX_STOP_IDS 8192

enum tr_recipe_workflow {
    TR_RECIPE_GRPO,
    TR_RECIPE_PPO,
    TR_RECIPE_SFT,
    TR_RECIPE_PRETRAIN,
};

enum tr_recipe_backend { TR_RECIPE_CPU, TR_RECIPE_CUDA };
enum tr_recipe_precision { TR_RECIPE_PREC_AUTO, TR_RECIPE_FP32, TR_RECIPE_BF16 };
enum tr_recipe_save_dtype { TR_RECIPE_SAVE_FP32, TR_RECIPE_SAVE_BF16 };
// Activation recompute of the trained models (engine/plan.h's enum, in its order).
enum tr_recipe_recompute { TR_RECIPE_RECOMPUTE_AUTO, TR_RECIPE_RECOMPUTE_OFF, TR_RECIPE_RECOMPUTE_ON };

enum tr_recipe_schedule { TR_RECIPE_SCHED_CONSTANT, TR_RECIPE_SCHED_LINEAR, TR_RECIPE_SCHED_COSINE };

// The model roles, in the order of the models: section.
enum tr_recipe_role {
    TR_RECIPE_POLICY,
    TR_RECIPE_REFERENCE,
    TR_RECIPE_CRITIC,
    TR_RECIPE_REWARD,
    TR_RECIPE_GENERATOR,
    TR_RECIPE_N_ROLES,
};

enum tr_recipe_reward_kind { TR_RECIPE_REWARD_RULE, TR_RECIPE_REWARD_MODEL, TR_RECIPE_REWARD_SERVICE };
enum tr_recipe_reward_fn { TR_RECIPE_FN_EXACT_MATCH, TR_RECIPE_FN_NUMERIC_MATCH, TR_RECIPE_FN_REGEX };
enum tr_recipe_on_failure { TR_RECIPE_ON_FAILURE_FAIL, TR_RECIPE_ON_FAILURE_ZERO };
enum tr_recipe_chat_format {
    TR_RECIPE_CHAT_CHATML,
    TR_RECIPE_CHAT_LLAMA3,
    TR_RECIPE_CHAT_QWEN3,
    TR_RECIPE_CHAT_NONE
};
enum tr_recipe_from { TR_RECIPE_FROM_NONE, TR_RECIPE_FROM_POLICY };

typedef struct tr_recipe_optim {
    double lr;
    double weight_decay;
    double betas[2];
    double eps;
    double grad_clip;                  // global gradient-norm clip; 0 = off
    enum tr_recipe_schedule schedule;  // learning-rate schedule after warmup
    int64_t warmup_steps;              // linear warmup from 0
    double min_lr_ratio;               // floor of linear/cosine decay, as a fraction of lr
} tr_recipe_optim;

typedef struct tr_recipe_parallel {
    int64_t tp;  // tensor-parallel ranks
    int64_t dp;  // data-parallel ranks
    bool sequence_parallel;  // tp > 1: norms and the residual stream split along the sequence
} tr_recipe_parallel;

typedef struct tr_recipe_devices {
    int32_t ids[TR_RECIPE_MAX_DEVICES];  // empty: the launcher assigns devices in order
    int32_t n;
} tr_recipe_devices;

// Token ids, each listed once, in the recipe's order.
typedef struct tr_recipe_token_ids {
    int32_t ids[TR_RECIPE_MAX_STOP_IDS];
    int32_t n;
} tr_recipe_token_ids;

// policy, reference, critic: a transformer loaded from a Hugging Face directory, freshly
// initialised from a config.json, or (reference, critic) started from the policy's checkpoint.
typedef struct tr_recipe_model {
    bool present;                      // the role appears in the recipe
    char path[TR_RECIPE_PATH_MAX];     // HF checkpoint directory
    bool has_init;
    char init_config[TR_RECIPE_PATH_MAX];  // init.config: a config.json for random init
    int64_t init_seed;
    enum tr_recipe_from from;          // from: policy (reference, critic)
    tr_recipe_parallel parallel;
    tr_recipe_devices devices;
    tr_recipe_optim optim;
} tr_recipe_model;

// How a verdict or a score becomes the reward (see docs/recipes.md).
typedef struct tr_recipe_curve {
    double correct;    // rule: the answer matches
    double wrong;      // rule: an answer was found and does not match
    double missing;    // rule: no answer could be extracted
    double scale;      // model/service: reward = scale * score + shift
    double shift;
} tr_recipe_curve;

typedef struct tr_recipe_reward {
    bool present;
    enum tr_recipe_reward_kind kind;
    enum tr_recipe_reward_fn function;
    char pattern[TR_RECIPE_NAME_MAX];  // regex: extracts the answer (first group, else match)
    char path[TR_RECIPE_PATH_MAX];     // model: HF *ForSequenceClassification directory
    tr_recipe_parallel parallel;
    tr_recipe_devices devices;
    char endpoint[TR_RECIPE_NAME_MAX]; // service: ZeroMQ endpoint
    int64_t timeout_ms;
    int64_t retries;
    int64_t max_batch;                 // items per score request
    enum tr_recipe_on_failure on_failure;
    tr_recipe_curve curve;
} tr_recipe_reward;

enum tr_recipe_gen_backend { TR_RECIPE_GEN_BACKEND_RUN, TR_RECIPE_GEN_BACKEND_CPU, TR_RECIPE_GEN_BACKEND_CUDA };
enum tr_recipe_share { TR_RECIPE_SHARE_AUTO, TR_RECIPE_SHARE_YES, TR_RECIPE_SHARE_NO };

// generator: a generation-only engine on devices of its own (weights and a KV cache, no
// gradients or optimizer), fed by the policy's weights after every optimizer step. Absent: the
// policy generates on its own weights (colocated, no copy).
typedef struct tr_recipe_generator {
    bool present;
    tr_recipe_parallel parallel;       // dp: the replicas, each sampling a share of the prompts
    int64_t replicas;                  // another name for parallel.dp (0: parallel.dp's)
    tr_recipe_devices devices;
    enum tr_recipe_gen_backend backend;  // run: the recipe's backend (it must be)
    bool one_step_off;                 // sample step k+1 while the policy trains step k
    int64_t sync_bucket_mb;            // weights per broadcast of a sync (MiB)
    bool verify_sync;                  // compare weight checksums after every sync
    enum tr_recipe_share share_weights;  // read the policy's working weights in place
} tr_recipe_generator;

typedef struct tr_recipe_prefix {
    char path[TR_RECIPE_PATH_MAX];  // Megatron indexed dataset prefix (PATH.bin, PATH.idx)
    double weight;
} tr_recipe_prefix;

typedef struct tr_recipe_data {
    char train[TR_RECIPE_PATH_MAX];
    char eval[TR_RECIPE_PATH_MAX];
    enum tr_recipe_chat_format chat_format;
    bool enable_thinking;  // qwen3: false closes an empty think block in generation prompts
    char prompt_key[TR_RECIPE_NAME_MAX];
    int64_t max_prompt_len;
    int64_t max_len;   // sft: conversations are truncated to this many tokens
    bool pack;         // sft: pack conversations into rows of max_len
    tr_recipe_prefix prefixes[TR_RECIPE_MAX_PREFIXES];
    int32_t n_prefixes;
    char split[TR_RECIPE_NAME_MAX];  // pretrain: train,valid,test proportions, "969,30,1"
    int64_t seq_len;   // pretrain: tokens per row
} tr_recipe_data;

typedef struct tr_recipe_rollout {
    int64_t n;               // responses per prompt (the group size)
    int64_t max_new_tokens;
    int64_t min_new_tokens;   // stop ids do not end a response before this many tokens
    tr_recipe_token_ids stop_ids;  // end a response too, besides the chat format's stop tokens
                                   // (else the model's eos ids); below the policy's vocabulary
                                   // size, checked once its workers report it
    double temperature;      // 0 = greedy
    double top_p;
    int64_t top_k;           // 0 = off
    bool dynamic_sampling;   // drop groups whose rewards are all equal, sample more
    int64_t max_resample;    // extra generation rounds dynamic sampling may use per step
    int64_t overlong_buffer; // DAPO soft overlong punishment zone, tokens; 0 = off
    double overlong_penalty;
    int64_t kv_tokens;       // KV cache capacity per policy rank; 0 = the memory plan's
    int64_t max_seqs;        // samples decoding together per rank; 0 = a step's share
} tr_recipe_rollout;

// Where an RL step's old (behaviour) logprobs come from: a policy.logprobs pass over the batch
// (recompute), or the logprobs generation reported for each sampled token (rollout), which
// equal the training path's when the engine reduces in an order independent of the batch;
// auto: rollout where that holds (the CPU backend or CUDA's batch-invariant bf16, sampling at the
// policy's tp, not a step off).
enum tr_recipe_old_lp { TR_RECIPE_OLD_LP_AUTO, TR_RECIPE_OLD_LP_RECOMPUTE, TR_RECIPE_OLD_LP_ROLLOUT };

typedef struct tr_recipe_algorithm {
    enum tr_adv_kind advantage;
    bool norm_by_std;
    double gamma;
    double lam;
    double clip_low;
    double clip_high;
    double clip_dual;        // 0 = off
    enum tr_ratio_mode ratio;
    double kl_coef;          // 0 = no KL to the reference
    enum tr_kl_est kl_estimator;
    enum tr_kl_placement kl_placement;
    double entropy_coef;
    double tis_cap;          // truncated importance weight cap on off-policy rollouts
    double value_clip;       // 0 = no value clipping
    enum tr_loss_agg loss_agg;
    int64_t ppo_epochs;
    int64_t mini_batches;
    enum tr_recipe_old_lp old_logprobs;
} tr_recipe_algorithm;

typedef struct tr_recipe_train {
    int64_t steps;
    int64_t prompts_per_step;    // grpo/ppo
    int64_t batch_size;          // sft/pretrain: rows per step
    int64_t micro_batch_tokens;  // 0: the policy's memory plan chooses
    enum tr_recipe_recompute recompute;
    int64_t logit_rows;          // the LM head's chunk; 0 = the memory plan's
    int64_t eval_every;          // 0 = no periodic eval
    int64_t save_every;          // 0 = only the final checkpoint
    enum tr_recipe_save_dtype save_dtype;  // weights in saved checkpoints
    int64_t max_len;             // longest row trained on; resolved from data/rollout when 0
} tr_recipe_train;

typedef struct tr_recipe_placement {
    int32_t colocate[TR_RECIPE_MAX_GROUPS][TR_RECIPE_N_ROLES];  // roles sharing one process
    int32_t colocate_len[TR_RECIPE_MAX_GROUPS];
    int32_t n_colocate;
    char endpoint[TR_RECIPE_NAME_MAX];  // controller's ZeroMQ endpoint; "" = ipc in run_dir
    bool attach;                        // workers are started elsewhere and attach
} tr_recipe_placement;

typedef struct tr_recipe_log {
    bool tensorboard;
    int64_t samples_every;  // write sample rollouts every N steps; 0 = never
    bool progress;
    int64_t logprob_diff_sequences;   // old logprobs from the rollout: sequences recomputed per
                                      // step to measure logprob_diff (0 = none)
    double peak_tflops, peak_gbps;    // what utilization/train_mfu and utilization/decode_roofline divide by (0:
                                      // the backend's: cuda an H200's, cpu none)
} tr_recipe_log;

typedef struct tr_recipe {
    enum tr_recipe_workflow workflow;
    int64_t seed;
    char run_dir[TR_RECIPE_PATH_MAX];
    enum tr_recipe_backend backend;
    enum tr_recipe_precision precision;
    bool batch_invariant;    // cuda bf16: products that ignore the batch (tr_backend's)
    bool share_prompts;      // logprobs, values and train passes compute each prompt once
    int64_t threads;  // CPU worker threads; 0 = all cores
    double memory_gb; // memory each worker may plan with; 0 = the device's free memory
    tr_recipe_model models[TR_RECIPE_REWARD];  // policy, reference, critic
    tr_recipe_reward reward;
    tr_recipe_generator generator;
    tr_recipe_data data;
    tr_recipe_rollout rollout;
    tr_recipe_algorithm algorithm;
    tr_recipe_train train;
    tr_recipe_placement placement;
    tr_recipe_log log;
} tr_recipe;

// All defaults (docs/recipes.md), no role present; fails only if the built-in schema is broken.
int tr_recipe_defaults(tr_recipe *r, tr_err *err);

// Reads the recipe at path, applies the overrides ("a.b.c=value", in order; a value that
// starts with [ { " or ' is read as YAML flow, anything else literally), validates, and
// fills r. Errors name file:line:column (or the override) and the dotted key.
int tr_recipe_load(const char *path, const char *const *sets, int n_sets, tr_recipe *r, tr_err *err);
// The same from text in memory; name is used in error messages.
int tr_recipe_parse(const char *text, size_t len, const char *name, const char *const *sets,
                    int n_sets, tr_recipe *r, tr_err *err);

// The resolved recipe as YAML (every key, defaults filled): malloc'd, NUL-terminated.
int tr_recipe_emit(const tr_recipe *r, char **yaml, size_t *len, tr_err *err);
// Writes run_dir/resolved.yaml atomically, creating run_dir.
int tr_recipe_write_resolved(const tr_recipe *r, tr_err *err);

// 0 when a and b hold the same value for every key; otherwise 1 with the first differing
// dotted key in key (for tests and --resume checks).
int tr_recipe_diff(const tr_recipe *a, const tr_recipe *b, char *key, size_t cap);

// The key reference of docs/recipes.md (a Markdown table generated from the schema).
int tr_recipe_doc_table(char **md, size_t *len, tr_err *err);

extern const char *const tr_recipe_workflow_names[];
// data.chat_format values by enum tr_recipe_chat_format (the names data/chat.h knows, and none).
extern const char *const tr_recipe_chat_names[];
extern const char *const tr_recipe_role_names[];
const char *tr_recipe_role_name(enum tr_recipe_role role);
// Whether the generator reads the policy's working weights in place (weight_share.h) rather
// than getting them over the sync communicator: models.generator.share_weights yes, or auto
// on CUDA when every generator rank r is on policy rank r's device in the policy's layout.
bool tr_recipe_generator_shares(const tr_recipe *r);
// Whether RL steps take their old logprobs from generation (algorithm.old_logprobs resolved).
bool tr_recipe_old_lp_from_rollout(const tr_recipe *r);
// The device rank `rank` of a role with these devices runs on (the rank itself when none are
// listed).
int64_t tr_recipe_device_of(const tr_recipe_devices *d, int64_t rank);
