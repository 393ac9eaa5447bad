// The recipe schema: every key, its type, default, range and meaning, in recipe order.
// This table is the one place defaults live; docs/recipes.md is generated from it and a
// test keeps the two identical.
#include <stdbool.h>

#include "engine/plan.h"
#include "rl/recipe.h"
#include "rl/recipe_schema.h"

const char *const tr_recipe_workflow_names[] = {"grpo", "ppo", "sft", "pretrain", NULL};
const char *const tr_recipe_role_names[] = {"policy", "reference", "critic", "reward", "generator", NULL};
static const char *const gen_backend_names[] = {"run", "cpu", "cuda", NULL};
static const char *const share_names[] = {"auto", "yes", "no", NULL};
static const char *const old_lp_names[] = {"auto", "recompute", "rollout", NULL};
static const char *const backend_names[] = {"cpu", "cuda", NULL};
static const char *const precision_names[] = {"auto", "fp32", "bf16", NULL};
static const char *const save_dtype_names[] = {"fp32", "bf16", NULL};
static const char *const schedule_names[] = {"constant", "linear", "cosine", NULL};
static const char *const reward_kind_names[] = {"rule", "model", "service", NULL};
static const char *const reward_fn_names[] = {"exact_match", "numeric_match", "regex", NULL};
static const char *const on_failure_names[] = {"fail", "zero", NULL};
const char *const tr_recipe_chat_names[] = {"chatml", "llama3", "qwen3", "none", NULL};
static const char *const from_names[] = {"none", "policy", NULL};

const char *tr_recipe_role_name(enum tr_recipe_role role) {
    if ((int)role < 0 || role >= TR_RECIPE_N_ROLES) return "unknown";
    return tr_recipe_role_names[role];
}

// Enums are stored through an int; the compiler must agree on their size.
_Static_assert(sizeof(enum tr_recipe_workflow) == sizeof(int), "enum size");
_Static_assert(sizeof(enum tr_adv_kind) == sizeof(int), "enum size");
_Static_assert(sizeof(enum tr_loss_agg) == sizeof(int), "enum size");

#define MIN (TR_RK_HAS_MIN)
#define POS (TR_RK_HAS_MIN | TR_RK_MIN_OPEN)
#define UNIT (TR_RK_HAS_MIN | TR_RK_HAS_MAX)

// The upper bounds are the workers' own limits (a forward's tokens, the rows of a step,
// threads, sampling and reward settings), so a recipe that loads is one the workers accept.
#define MAX_TOKENS (1 << 24)

static const tr_rkey parallel_keys[] = {
    {.name = "tp", .type = TR_RK_INT, .off = offsetof(tr_recipe_parallel, tp), .flags = MIN, .min = 1,
     .def = "1", .doc = "tensor-parallel ranks (Megatron column/row splits); must divide the query heads"},
    {.name = "dp", .type = TR_RK_INT, .off = offsetof(tr_recipe_parallel, dp), .flags = MIN, .min = 1,
     .def = "1", .doc = "data-parallel ranks: token-balanced shares of each batch, ZeRO-1 optimizer shards"},
    {.name = "sequence_parallel", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_parallel, sequence_parallel),
     .def = "false", .doc = "with tp > 1: norms and the residual stream split along the sequence (less "
     "activation memory, the same results)"},
    {0},
};

static const tr_rkey optim_keys[] = {
    {.name = "lr", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_optim, lr), .flags = POS, .min = 0,
     .def = "1.0e-6", .doc = "peak learning rate (AdamW)"},
    {.name = "weight_decay", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_optim, weight_decay),
     .flags = MIN, .min = 0, .def = "0.0", .doc = "decoupled weight decay"},
    {.name = "betas", .type = TR_RK_FLOATS, .off = offsetof(tr_recipe_optim, betas), .size = 2,
     .flags = UNIT | TR_RK_MAX_OPEN, .min = 0, .max = 1, .def = "[0.9, 0.999]",
     .doc = "Adam beta1, beta2"},
    {.name = "eps", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_optim, eps), .flags = POS, .min = 0,
     .def = "1.0e-8", .doc = "Adam epsilon"},
    {.name = "grad_clip", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_optim, grad_clip),
     .flags = MIN, .min = 0, .def = "1.0", .doc = "global gradient-norm clip; 0 = off"},
    {.name = "schedule", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_optim, schedule),
     .names = schedule_names, .def = "constant", .doc = "learning rate after warmup"},
    {.name = "warmup_steps", .type = TR_RK_INT, .off = offsetof(tr_recipe_optim, warmup_steps),
     .flags = MIN, .min = 0, .def = "0",
     .doc = "linear warmup from 0 over this many optimizer steps; cut to the run's length"},
    {.name = "min_lr_ratio", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_optim, min_lr_ratio),
     .flags = UNIT, .min = 0, .max = 1, .def = "0.0",
     .doc = "linear/cosine decay ends at this fraction of lr"},
    {0},
};

static const tr_rkey init_keys[] = {
    {.name = "config", .type = TR_RK_STR, .off = offsetof(tr_recipe_model, init_config),
     .size = TR_RECIPE_PATH_MAX, .flags = TR_RK_REQUIRED,
     .doc = "Hugging Face config.json to build a randomly initialised model from"},
    {.name = "seed", .type = TR_RK_INT, .off = offsetof(tr_recipe_model, init_seed), .flags = MIN,
     .min = 0, .def = "1", .doc = "seed of the random initialisation"},
    {0},
};

static const tr_rkey model_keys[] = {
    {.name = "path", .type = TR_RK_STR, .off = offsetof(tr_recipe_model, path),
     .size = TR_RECIPE_PATH_MAX, .def = "\"\"",
     .doc = "Hugging Face checkpoint directory (one of path, init, from)"},
    {.name = "init", .type = TR_RK_MAP, .off = 0, .flags = TR_RK_PRESENCE,
     .aux_off = offsetof(tr_recipe_model, has_init), .sub = init_keys,
     .doc = "random initialisation instead of a checkpoint"},
    {.name = "from", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_model, from), .names = from_names,
     .def = "none", .doc = "reference, critic: start from the policy's checkpoint"},
    {.name = "parallel", .type = TR_RK_MAP, .off = offsetof(tr_recipe_model, parallel),
     .sub = parallel_keys, .doc = "parallel layout"},
    {.name = "devices", .type = TR_RK_DEVICES, .off = offsetof(tr_recipe_model, devices),
     .flags = MIN, .min = 0, .def = "[]",
     .doc = "GPU ids, tp*dp of them; empty: assigned in order"},
    {.name = "optim", .type = TR_RK_MAP, .off = offsetof(tr_recipe_model, optim), .sub = optim_keys,
     .doc = "optimizer (policy, critic)"},
    {0},
};

static const tr_rkey curve_keys[] = {
    {.name = "correct", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_curve, correct), .def = "1.0",
     .doc = "rule: reward of a matching answer"},
    {.name = "wrong", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_curve, wrong), .def = "0.0",
     .doc = "rule: reward of an answer that does not match"},
    {.name = "missing", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_curve, missing), .def = "0.0",
     .doc = "rule: reward when no answer can be extracted"},
    {.name = "scale", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_curve, scale), .def = "1.0",
     .doc = "model, service: reward = scale * score + shift"},
    {.name = "shift", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_curve, shift), .def = "0.0",
     .doc = "model, service: added after scaling"},
    {0},
};

static const tr_rkey reward_keys[] = {
    {.name = "kind", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_reward, kind),
     .names = reward_kind_names, .def = "rule",
     .doc = "rule (built-in verifier), model (score head), service (ZeroMQ)"},
    {.name = "function", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_reward, function),
     .names = reward_fn_names, .def = "exact_match", .doc = "rule: how a response is checked"},
    {.name = "pattern", .type = TR_RK_STR, .off = offsetof(tr_recipe_reward, pattern),
     .size = TR_RECIPE_NAME_MAX, .def = "\"\"",
     .doc = "regex: PCRE2 format check, score 1 when the response matches anywhere"},
    {.name = "path", .type = TR_RK_STR, .off = offsetof(tr_recipe_reward, path),
     .size = TR_RECIPE_PATH_MAX, .def = "\"\"", .doc = "model: a score-head (ForSequenceClassification) checkpoint"},
    {.name = "parallel", .type = TR_RK_MAP, .off = offsetof(tr_recipe_reward, parallel),
     .sub = parallel_keys, .doc = "model: parallel layout"},
    {.name = "devices", .type = TR_RK_DEVICES, .off = offsetof(tr_recipe_reward, devices),
     .flags = MIN, .min = 0, .def = "[]", .doc = "model: GPU ids"},
    {.name = "endpoint", .type = TR_RK_STR, .off = offsetof(tr_recipe_reward, endpoint),
     .size = TR_RECIPE_NAME_MAX, .def = "\"\"", .doc = "service: ZeroMQ endpoint (tcp://, ipc://)"},
    {.name = "timeout_ms", .type = TR_RK_INT, .off = offsetof(tr_recipe_reward, timeout_ms),
     .flags = UNIT, .min = 1, .max = INT32_MAX, .def = "30000", .doc = "service: per-request timeout"},
    {.name = "retries", .type = TR_RK_INT, .off = offsetof(tr_recipe_reward, retries), .flags = UNIT,
     .min = 0, .max = 999, .def = "2", .doc = "service: retries after a timeout or error"},
    {.name = "max_batch", .type = TR_RK_INT, .off = offsetof(tr_recipe_reward, max_batch),
     .flags = UNIT, .min = 1, .max = INT32_MAX, .def = "256", .doc = "items per score request"},
    {.name = "on_failure", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_reward, on_failure),
     .names = on_failure_names, .def = "fail",
     .doc = "after the retries: fail the step, or score the items 0"},
    {.name = "curve", .type = TR_RK_MAP, .off = offsetof(tr_recipe_reward, curve), .sub = curve_keys,
     .doc = "verdicts and scores to rewards"},
    {0},
};

static const tr_rkey generator_parallel_keys[] = {
    {.name = "tp", .type = TR_RK_INT, .off = offsetof(tr_recipe_parallel, tp), .flags = MIN, .min = 1,
     .def = "1", .doc = "tensor-parallel ranks of each replica; any tp the model splits into, the "
                        "policy's or another (the sync reshards)"},
    {.name = "dp", .type = TR_RK_INT, .off = offsetof(tr_recipe_parallel, dp), .flags = MIN, .min = 1,
     .def = "1", .doc = "replicas, each sampling a contiguous share of the prompts"},
    {0},
};

static const tr_rkey generator_keys[] = {
    {.name = "parallel", .type = TR_RK_MAP, .off = offsetof(tr_recipe_generator, parallel),
     .sub = generator_parallel_keys, .doc = "parallel layout"},
    {.name = "replicas", .type = TR_RK_INT, .off = offsetof(tr_recipe_generator, replicas), .flags = UNIT,
     .min = 0, .max = 4096, .def = "0", .doc = "generation replicas (another name for parallel.dp); 0 = parallel.dp"},
    {.name = "devices", .type = TR_RK_DEVICES, .off = offsetof(tr_recipe_generator, devices),
     .flags = MIN, .min = 0, .def = "[]", .doc = "GPU ids, tp*dp of them; empty: assigned in order"},
    {.name = "backend", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_generator, backend),
     .names = gen_backend_names, .def = "run",
     .doc = "run = the recipe's backend; the policy's and the generator's must be one (one communicator spans both)"},
    {.name = "one_step_off", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_generator, one_step_off),
     .def = "false",
     .doc = "sample step k+1 with the previous weights while the policy trains step k (staleness 1, "
            "truncated importance weights, algorithm.tis_cap)"},
    {.name = "sync_bucket_mb", .type = TR_RK_INT, .off = offsetof(tr_recipe_generator, sync_bucket_mb),
     .flags = UNIT, .min = 1, .max = 1 << 20, .def = "256",
     .doc = "weights per broadcast of the weight sync after every optimizer step (MiB)"},
    {.name = "verify_sync", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_generator, verify_sync),
     .def = "false",
     .doc = "after every sync compare checksums of the policy's and every generator replica's weights "
            "(reads them all back: for tests and debugging)"},
    {.name = "share_weights", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_generator, share_weights),
     .names = share_names, .def = "auto",
     .doc = "generator rank r reads policy rank r's working weights in place (CUDA IPC on one GPU; shared memory "
            "on the CPU), double-buffered with one_step_off, instead of a copy over the sync communicator; auto: "
            "on CUDA when every rank is on its policy rank's device with the policy's tp; yes: always"},
    {0},
};

static const tr_rkey models_keys[] = {
    {.name = "policy", .type = TR_RK_MAP, .off = offsetof(tr_recipe, models[TR_RECIPE_POLICY]),
     .flags = TR_RK_PRESENCE | TR_RK_REQUIRED, .aux_off = offsetof(tr_recipe_model, present),
     .sub = model_keys, .doc = "the trained model"},
    {.name = "reference", .type = TR_RK_MAP, .off = offsetof(tr_recipe, models[TR_RECIPE_REFERENCE]),
     .flags = TR_RK_PRESENCE, .aux_off = offsetof(tr_recipe_model, present), .sub = model_keys,
     .doc = "frozen model for the KL term (needed when algorithm.kl.coef > 0)"},
    {.name = "critic", .type = TR_RK_MAP, .off = offsetof(tr_recipe, models[TR_RECIPE_CRITIC]),
     .flags = TR_RK_PRESENCE, .aux_off = offsetof(tr_recipe_model, present), .sub = model_keys,
     .doc = "value model (needed by advantage gae)"},
    {.name = "reward", .type = TR_RK_MAP, .off = offsetof(tr_recipe, reward), .flags = TR_RK_PRESENCE,
     .aux_off = offsetof(tr_recipe_reward, present), .sub = reward_keys,
     .doc = "reward (grpo, ppo)"},
    {.name = "generator", .type = TR_RK_MAP, .off = offsetof(tr_recipe, generator), .flags = TR_RK_PRESENCE,
     .aux_off = offsetof(tr_recipe_generator, present), .sub = generator_keys,
     .doc = "generation on processes (and devices) of its own, fed by the policy's weights after every "
            "optimizer step (grpo, ppo); absent: the policy generates on its own weights"},
    {0},
};

static const tr_rkey prefix_keys[] = {
    {.name = "path", .type = TR_RK_STR, .off = offsetof(tr_recipe_prefix, path),
     .size = TR_RECIPE_PATH_MAX, .flags = TR_RK_REQUIRED,
     .doc = "indexed dataset prefix (PATH.bin + PATH.idx)"},
    {.name = "weight", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_prefix, weight), .flags = POS,
     .min = 0, .def = "1.0", .doc = "sampling weight (normalised over prefixes)"},
    {0},
};

static const tr_rkey data_keys[] = {
    {.name = "train", .type = TR_RK_STR, .off = offsetof(tr_recipe_data, train),
     .size = TR_RECIPE_PATH_MAX, .def = "\"\"", .doc = "JSONL prompts (grpo, ppo) or conversations (sft)"},
    {.name = "eval", .type = TR_RK_STR, .off = offsetof(tr_recipe_data, eval),
     .size = TR_RECIPE_PATH_MAX, .def = "\"\"", .doc = "JSONL evaluation set; empty: none"},
    {.name = "chat_format", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_data, chat_format),
     .names = tr_recipe_chat_names, .def = "chatml", .doc = "chat template applied to prompts and conversations"},
    {.name = "enable_thinking", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_data, enable_thinking),
     .def = "true", .doc = "qwen3: false closes an empty think block in every generation prompt"},
    {.name = "prompt_key", .type = TR_RK_STR, .off = offsetof(tr_recipe_data, prompt_key),
     .size = TR_RECIPE_NAME_MAX, .def = "prompt", .doc = "JSONL field holding the prompt"},
    {.name = "max_prompt_len", .type = TR_RK_INT, .off = offsetof(tr_recipe_data, max_prompt_len),
     .flags = MIN, .min = 1, .def = "512", .doc = "longer prompts are skipped (tokens)"},
    {.name = "max_len", .type = TR_RK_INT, .off = offsetof(tr_recipe_data, max_len), .flags = MIN,
     .min = 1, .def = "2048", .doc = "sft: conversations are truncated to this many tokens"},
    {.name = "pack", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_data, pack), .def = "true",
     .doc = "sft: pack conversations into rows of max_len"},
    {.name = "prefixes", .type = TR_RK_LIST, .off = offsetof(tr_recipe_data, prefixes),
     .size = TR_RECIPE_MAX_PREFIXES, .stride = sizeof(tr_recipe_prefix),
     .aux_off = offsetof(tr_recipe_data, n_prefixes), .sub = prefix_keys, .def = "[]",
     .doc = "pretrain: [{path, weight}] indexed datasets"},
    {.name = "split", .type = TR_RK_STR, .off = offsetof(tr_recipe_data, split),
     .size = TR_RECIPE_NAME_MAX, .def = "\"969,30,1\"",
     .doc = "pretrain: train,valid,test proportions of each dataset"},
    {.name = "seq_len", .type = TR_RK_INT, .off = offsetof(tr_recipe_data, seq_len), .flags = MIN,
     .min = 1, .def = "2048", .doc = "pretrain: tokens per row"},
    {0},
};

static const tr_rkey overlong_keys[] = {
    {.name = "buffer", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, overlong_buffer),
     .flags = MIN, .min = 0, .def = "0",
     .doc = "DAPO soft overlong zone before max_new_tokens (tokens); 0 = off"},
    {.name = "penalty", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_rollout, overlong_penalty),
     .flags = MIN, .min = 0, .def = "1.0", .doc = "reward taken off at max_new_tokens"},
    {0},
};

static const tr_rkey rollout_keys[] = {
    {.name = "n", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, n), .flags = UNIT, .min = 1,
     .max = 65536, .def = "8", .doc = "responses per prompt (the group)"},
    {.name = "max_new_tokens", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, max_new_tokens),
     .flags = UNIT, .min = 1, .max = MAX_TOKENS, .def = "256", .doc = "response length limit"},
    {.name = "min_new_tokens", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, min_new_tokens),
     .flags = MIN, .min = 0, .max = MAX_TOKENS, .def = "0",
     .doc = "a stop id sampled among a response's first N tokens does not end it (it stays as any "
            "token): benchmarks force lengths with it; the logprobs stay the model's"},
    {.name = "stop_ids", .type = TR_RK_TOKEN_IDS, .off = offsetof(tr_recipe_rollout, stop_ids),
     .size = TR_RECIPE_MAX_STOP_IDS, .flags = UNIT, .min = 0, .max = INT32_MAX, .def = "[]",
     .doc = "token ids that end a response too (and are part of it), besides the chat format's stop "
            "tokens, else the model's eos ids; checked against the vocabulary once the policy's workers "
            "have loaded it"},
    {.name = "temperature", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_rollout, temperature),
     .flags = MIN, .min = 0, .def = "1.0", .doc = "sampling temperature; 0 = greedy"},
    {.name = "top_p", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_rollout, top_p),
     .flags = UNIT | TR_RK_MIN_OPEN, .min = 0, .max = 1, .def = "1.0", .doc = "nucleus sampling"},
    {.name = "top_k", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, top_k), .flags = UNIT,
     .min = 0, .max = INT32_MAX, .def = "0", .doc = "top-k sampling; 0 = off"},
    {.name = "dynamic_sampling", .type = TR_RK_BOOL,
     .off = offsetof(tr_recipe_rollout, dynamic_sampling), .def = "false",
     .doc = "DAPO: drop groups whose rewards are all equal and sample more"},
    {.name = "max_resample", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, max_resample),
     .flags = MIN, .min = 0, .def = "0", .doc = "extra generation rounds per step for dynamic sampling"},
    {.name = "overlong", .type = TR_RK_MAP, .off = 0, .sub = overlong_keys,
     .doc = "DAPO soft overlong punishment"},
    {.name = "kv_tokens", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, kv_tokens),
     .flags = UNIT, .min = 0, .max = (int64_t)1 << 34, .def = "0",
     .doc = "KV cache tokens per policy rank; 0 = every sample of a step's share at full "
            "length, as far as the memory plan allows"},
    {.name = "max_seqs", .type = TR_RK_INT, .off = offsetof(tr_recipe_rollout, max_seqs),
     .flags = UNIT, .min = 0, .max = 1 << 20, .def = "0",
     .doc = "samples decoding together per policy rank; 0 = a step's share (at most "
            "train.micro_batch_tokens)"},
    {0},
};

static const tr_rkey clip_keys[] = {
    {.name = "low", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, clip_low),
     .flags = UNIT | TR_RK_MAX_OPEN, .min = 0, .max = 1, .def = "0.2", .doc = "ratio floor 1 - low"},
    {.name = "high", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, clip_high),
     .flags = MIN, .min = 0, .def = "0.2", .doc = "ratio ceiling 1 + high (DAPO clip-higher: 0.28)"},
    {.name = "dual", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, clip_dual),
     .flags = MIN, .min = 0, .def = "0.0", .doc = "dual clip c > 1 for negative advantages; 0 = off"},
    {0},
};

static const tr_rkey kl_keys[] = {
    {.name = "coef", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, kl_coef), .flags = MIN,
     .min = 0, .def = "0.0", .doc = "KL-to-reference weight; 0 = no KL (no reference needed)"},
    {.name = "estimator", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, kl_estimator),
     .names = tr_kl_est_names, .def = "k3", .doc = "Schulman's k1, k2 or k3 (clamped)"},
    {.name = "placement", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, kl_placement),
     .names = tr_kl_placement_names, .def = "loss",
     .doc = "a loss term, or a per-token penalty in the reward"},
    {0},
};

static const tr_rkey algorithm_keys[] = {
    {.name = "advantage", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, advantage),
     .names = tr_adv_kind_names, .def_doc = "grpo (ppo: gae)", .doc = "advantage estimator"},
    {.name = "norm_by_std", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_algorithm, norm_by_std),
     .def = "true", .doc = "grpo: divide by the group std; false = Dr.GRPO"},
    {.name = "gamma", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, gamma), .flags = UNIT,
     .min = 0, .max = 1, .def = "1.0", .doc = "discount (gae, reinforce_pp)"},
    {.name = "lam", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, lam), .flags = UNIT,
     .min = 0, .max = 1, .def = "1.0", .doc = "GAE lambda"},
    {.name = "clip", .type = TR_RK_MAP, .off = 0, .sub = clip_keys, .doc = "PPO ratio clipping"},
    {.name = "ratio", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, ratio),
     .names = tr_ratio_mode_names, .def = "token",
     .doc = "token ratios, or GSPO sequence ratios (geometric mean)"},
    {.name = "kl", .type = TR_RK_MAP, .off = 0, .sub = kl_keys, .doc = "KL to the reference"},
    {.name = "entropy_coef", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, entropy_coef),
     .flags = MIN, .min = 0, .def = "0.0", .doc = "entropy bonus weight"},
    {.name = "tis_cap", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, tis_cap),
     .flags = MIN, .min = 1, .def = "2.0",
     .doc = "off-policy rollouts (models.generator.one_step_off): each token's advantage is weighted by "
            "min(p_old / p_behaviour, tis_cap), the truncated importance weight against the sampling logprobs"},
    {.name = "value_clip", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_algorithm, value_clip),
     .flags = MIN, .min = 0, .def = "0.5", .doc = "PPO2 value clip range; 0 = off"},
    {.name = "loss_agg", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, loss_agg),
     .names = tr_loss_agg_names, .def = "token-mean",
     .doc = "per-token losses to one number (-norm divides by rollout.max_new_tokens)"},
    {.name = "ppo_epochs", .type = TR_RK_INT, .off = offsetof(tr_recipe_algorithm, ppo_epochs),
     .flags = UNIT, .min = 1, .max = 1000, .def = "1", .doc = "passes over each step's rollouts"},
    {.name = "mini_batches", .type = TR_RK_INT, .off = offsetof(tr_recipe_algorithm, mini_batches),
     .flags = UNIT, .min = 1, .max = 1000000, .def = "1", .doc = "optimizer steps per epoch"},
    {.name = "old_logprobs", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_algorithm, old_logprobs),
     .names = old_lp_names, .def = "auto",
     .doc = "the ratio's old logprobs: recompute (a policy.logprobs pass over the batch) or rollout (the "
            "logprobs generation reported, saving that pass; log.logprob_diff_sequences are still recomputed "
            "to measure the difference); auto: rollout where generation and training reduce alike (the cpu "
            "backend, or cuda in bf16 with batch_invariant; sampling by the policy or by a generator at its tp and not a step off), else recompute. "
            "Not rollout with models.generator.one_step_off"},
    {0},
};

static const tr_rkey train_keys[] = {
    {.name = "steps", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, steps),
     .flags = TR_RK_REQUIRED | MIN, .min = 1, .doc = "training steps"},
    {.name = "prompts_per_step", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, prompts_per_step),
     .flags = MIN, .min = 1, .def = "16", .doc = "grpo, ppo: prompts per step (times rollout.n responses)"},
    {.name = "batch_size", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, batch_size),
     .flags = UNIT, .min = 1, .max = MAX_TOKENS, .def = "16", .doc = "sft, pretrain: rows per step"},
    {.name = "micro_batch_tokens", .type = TR_RK_INT,
     .off = offsetof(tr_recipe_train, micro_batch_tokens), .flags = UNIT, .min = 0, .max = MAX_TOKENS,
     .def = "0",
     .doc = "tokens per forward/backward (gradient accumulation), the same for every role; 0 = the "
            "policy's memory plan chooses: a step's tokens per rank up to 16384, halved while a "
            "micro-batch's activations would take more than half of the device memory left after "
            "weights, gradients and optimizer, printed in each worker's log"},
    {.name = "recompute", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_train, recompute),
     .names = tr_recompute_names, .def = "auto",
     .doc = "activation recompute of the trained models: keep only each layer's input and run the "
            "layer's forward again in backward (about a third more compute for several times less "
            "activation memory; the same gradients bit for bit); auto = only where a micro-batch "
            "does not fit otherwise"},
    {.name = "logit_rows", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, logit_rows), .flags = MIN,
     .min = 0, .max = MAX_TOKENS, .def = "0",
     .doc = "rows of LM-head logits the policy's and reference's passes hold at once (the fused "
            "linear + log-softmax's chunk); 0 = the memory plan's choice for the model and device "
            "(thousands on an H200), printed in each worker's log"},
    {.name = "eval_every", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, eval_every),
     .flags = MIN, .min = 0, .def = "0", .doc = "evaluate every N steps; 0 = off"},
    {.name = "save_every", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, save_every),
     .flags = MIN, .min = 0, .def = "0", .doc = "checkpoint every N steps; 0 = only at the end"},
    {.name = "save_dtype", .type = TR_RK_ENUM, .off = offsetof(tr_recipe_train, save_dtype),
     .names = save_dtype_names, .def = "fp32",
     .doc = "weights of saved checkpoints: fp32 (the masters) or bf16 (half the size); the "
            "optimizer state stays fp32"},
    {.name = "max_len", .type = TR_RK_INT, .off = offsetof(tr_recipe_train, max_len), .flags = MIN,
     .min = 0, .def_doc = "0: resolved",
     .doc = "longest row; 0 = max_prompt_len + max_new_tokens (sft: data.max_len, pretrain: data.seq_len)"},
    {0},
};

static const tr_rkey placement_keys[] = {
    {.name = "colocate", .type = TR_RK_ROLE_GROUPS, .off = 0, .def = "[]",
     .doc = "[[roles]] that share one process per rank (and its memory)"},
    {.name = "endpoint", .type = TR_RK_STR, .off = offsetof(tr_recipe_placement, endpoint),
     .size = TR_RECIPE_NAME_MAX, .def = "\"\"",
     .doc = "controller's ZeroMQ endpoint; empty: ipc:// in run_dir"},
    {.name = "attach", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_placement, attach),
     .def = "false", .doc = "workers are started elsewhere (srun, containers) and attach"},
    {0},
};

static const tr_rkey log_keys[] = {
    {.name = "tensorboard", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_log, tensorboard),
     .def = "true", .doc = "write TensorBoard event files into run_dir"},
    {.name = "samples_every", .type = TR_RK_INT, .off = offsetof(tr_recipe_log, samples_every),
     .flags = MIN, .min = 0, .def = "0", .doc = "log sample rollouts every N steps; 0 = never"},
    {.name = "progress", .type = TR_RK_BOOL, .off = offsetof(tr_recipe_log, progress), .def = "true",
     .doc = "one progress line per step on stderr"},
    {.name = "logprob_diff_sequences", .type = TR_RK_INT, .off = offsetof(tr_recipe_log, logprob_diff_sequences),
     .flags = MIN, .min = 0, .def = "8",
     .doc = "with old logprobs from the rollout: sequences per step, spread over the batch, whose logprobs "
            "the policy recomputes for logprob_diff/max and the entropy metric"},
    {.name = "peak_tflops", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_log, peak_tflops), .flags = MIN,
     .min = 0, .def = "0",
     .doc = "the device's dense bf16 rate that utilization/train_mfu is measured against (TFLOP/s); 0: the backend's, "
            "cuda 790 (an H200's cuBLAS GEMMs as measured), cpu none (no utilization/train_mfu)"},
    {.name = "peak_gbps", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe_log, peak_gbps), .flags = MIN,
     .min = 0, .def = "0",
     .doc = "the device's memory bandwidth that utilization/decode_roofline is measured against (GB/s); 0: the "
            "backend's, cuda 4300 (an H200's HBM as measured), cpu none"},
    {0},
};

const tr_rkey tr_recipe_schema[] = {
    {.name = "workflow", .type = TR_RK_ENUM, .off = offsetof(tr_recipe, workflow),
     .names = tr_recipe_workflow_names, .flags = TR_RK_REQUIRED, .doc = "what the run does"},
    {.name = "seed", .type = TR_RK_INT, .off = offsetof(tr_recipe, seed), .flags = MIN, .min = 0,
     .def = "1", .doc = "seed of data order and sampling"},
    {.name = "run_dir", .type = TR_RK_STR, .off = offsetof(tr_recipe, run_dir),
     .size = TR_RECIPE_PATH_MAX, .flags = TR_RK_REQUIRED,
     .doc = "checkpoints, logs and resolved.yaml go here"},
    {.name = "backend", .type = TR_RK_ENUM, .off = offsetof(tr_recipe, backend), .names = backend_names,
     .def = "cpu", .doc = "compute backend"},
    {.name = "precision", .type = TR_RK_ENUM, .off = offsetof(tr_recipe, precision),
     .names = precision_names, .def = "auto",
     .doc = "weights and activations as the passes read them (fp32 masters and optimizer either "
            "way); auto: the backend's, cpu fp32 and cuda bf16"},
    {.name = "batch_invariant", .type = TR_RK_BOOL, .off = offsetof(tr_recipe, batch_invariant),
     .def = "true",
     .doc = "cuda in bf16: every product picks its kernel without regard to the batch, so a row's "
            "bits do not depend on the rows beside it and generation reports the training path's "
            "logprobs exactly (what algorithm.old_logprobs auto relies on); false: the fastest kernel per "
            "shape, decode steps' products split over the device. fp32 on cuda is never "
            "batch-invariant; the cpu backend always is"},
    {.name = "share_prompts", .type = TR_RK_BOOL, .off = offsetof(tr_recipe, share_prompts),
     .def = "true",
     .doc = "the reference's and the policy's logprobs, the critic's values and the train passes "
            "compute the prompt of a group's samples once per micro-batch, each sample reading it "
            "as a shared prefix; the samples' logprobs keep their bits, and a 256-token prompt "
            "with 8 samples of 256 tokens packs 44% fewer tokens. false: every sample computes "
            "its prompt"},
    {.name = "threads", .type = TR_RK_INT, .off = offsetof(tr_recipe, threads), .flags = UNIT, .min = 0,
     .max = 4096, .def = "0", .doc = "CPU threads per worker; 0 = all cores"},
    {.name = "memory_gb", .type = TR_RK_FLOAT, .off = offsetof(tr_recipe, memory_gb), .flags = UNIT,
     .min = 0, .max = 1e6, .def = "0",
     .doc = "memory (GiB) each worker plans with; 0 = its device's free memory (cpu: the host's)"},
    {.name = "models", .type = TR_RK_MAP, .off = 0, .flags = TR_RK_REQUIRED, .sub = models_keys,
     .doc = "the model roles"},
    {.name = "data", .type = TR_RK_MAP, .off = offsetof(tr_recipe, data), .sub = data_keys,
     .doc = "datasets"},
    {.name = "rollout", .type = TR_RK_MAP, .off = offsetof(tr_recipe, rollout), .sub = rollout_keys,
     .doc = "generation (grpo, ppo)"},
    {.name = "algorithm", .type = TR_RK_MAP, .off = offsetof(tr_recipe, algorithm),
     .sub = algorithm_keys, .doc = "advantage and loss (grpo, ppo)"},
    {.name = "train", .type = TR_RK_MAP, .off = offsetof(tr_recipe, train), .flags = TR_RK_REQUIRED,
     .sub = train_keys, .doc = "the training loop"},
    {.name = "placement", .type = TR_RK_MAP, .off = offsetof(tr_recipe, placement),
     .sub = placement_keys, .doc = "processes and endpoints"},
    {.name = "log", .type = TR_RK_MAP, .off = offsetof(tr_recipe, log), .sub = log_keys,
     .doc = "logging"},
    {0},
};
