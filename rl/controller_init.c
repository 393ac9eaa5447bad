// Recipe -> init args of each role: model source (own path or init config, or the policy's
// for `from: policy` and for the generator, a critic turning the policy's LM into a value
// model), optimizer and schedule length, the algorithm's loss settings, generation sizes and
// reward settings.
#include "rl/controller_init.h"

#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/file.h"
#include "engine/plan.h"

static const char *schedule_name(enum tr_recipe_schedule s) {
    return s == TR_RECIPE_SCHED_LINEAR ? "linear" : s == TR_RECIPE_SCHED_COSINE ? "cosine" : "constant";
}

static const char *chat_name(enum tr_recipe_chat_format f) {
    return f == TR_RECIPE_CHAT_CHATML   ? "chatml"
           : f == TR_RECIPE_CHAT_LLAMA3 ? "llama3"
           : f == TR_RECIPE_CHAT_QWEN3  ? "qwen3"
                                        : NULL;
}

static const char *reward_fn_name(enum tr_recipe_reward_fn f) {
    return f == TR_RECIPE_FN_NUMERIC_MATCH ? "numeric_match" : f == TR_RECIPE_FN_REGEX ? "regex" : "exact_match";
}

// The policy's tokenizer.json (beside its checkpoint or its init config), when present.
static void policy_tokenizer(const tr_recipe *r, char *out, size_t cap) {
    const tr_recipe_model *p = &r->models[TR_RECIPE_POLICY];
    char dir[TR_RECIPE_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", p->path[0] ? p->path : p->init_config);
    snprintf(out, cap, "%s/tokenizer.json", p->path[0] ? p->path : dirname(dir));
    if (!tr_file_exists(out)) out[0] = '\0';
}

static void model_source(const tr_recipe *r, enum tr_recipe_role role, tr_role_setup *s) {
    // The generator is the policy's shape; its weights come from the policy's syncs.
    const tr_recipe_model *m = &r->models[role == TR_RECIPE_GENERATOR ? TR_RECIPE_POLICY : role];
    const tr_recipe_model *src = m->from == TR_RECIPE_FROM_POLICY ? &r->models[TR_RECIPE_POLICY] : m;
    if (src->has_init) {
        snprintf(s->init_config, sizeof s->init_config, "%s", src->init_config);
        s->a.init_config = s->init_config;
        s->a.init_seed = (uint64_t)src->init_seed;
    } else {
        snprintf(s->model, sizeof s->model, "%s", src->path);
        s->a.model = s->model;
    }
    // A critic from the policy: the policy's body under a new value head.
    if (role == TR_RECIPE_CRITIC && m->from == TR_RECIPE_FROM_POLICY) {
        s->a.head = "value";
        if (!src->has_init) s->a.init_seed = (uint64_t)r->seed;
    }
}

static void optim(const tr_recipe *r, const tr_recipe_optim *o, tr_role_optim *out) {
    bool rl = r->workflow == TR_RECIPE_GRPO || r->workflow == TR_RECIPE_PPO;
    int64_t per_step = rl ? r->algorithm.ppo_epochs * r->algorithm.mini_batches : 1;
    *out = (tr_role_optim){.lr = o->lr, .beta1 = o->betas[0], .beta2 = o->betas[1], .eps = o->eps,
                           .weight_decay = o->weight_decay, .grad_clip = o->grad_clip,
                           .schedule = schedule_name(o->schedule), .warmup_steps = o->warmup_steps,
                           .total_steps = r->train.steps * per_step, .min_lr_ratio = o->min_lr_ratio};
}

static void loss(const tr_recipe *r, tr_role_loss *out) {
    const tr_recipe_algorithm *al = &r->algorithm;
    *out = (tr_role_loss){.clip_low = al->clip_low, .clip_high = al->clip_high, .clip_dual = al->clip_dual,
                          .ratio = tr_ratio_mode_names[al->ratio], .agg = tr_loss_agg_names[al->loss_agg],
                          // KL placed in the reward is the workflow's business, not the loss's.
                          .kl_coef = al->kl_placement == TR_KL_IN_LOSS ? al->kl_coef : 0.0,
                          .kl_estimator = tr_kl_est_names[al->kl_estimator], .entropy_coef = al->entropy_coef,
                          .value_clip = al->value_clip, .ppo_epochs = (int32_t)al->ppo_epochs,
                          .mini_batches = (int32_t)al->mini_batches,
                          .max_len = (int32_t)r->rollout.max_new_tokens};
}

void tr_controller_role_setup(const tr_recipe *r, enum tr_recipe_role role, tr_role_setup *s) {
    memset(s, 0, sizeof *s);
    tr_init_args *a = &s->a;
    a->backend = r->backend == TR_RECIPE_CUDA ? "cuda" : "cpu";
    a->precision = r->precision == TR_RECIPE_FP32 ? "fp32" : r->precision == TR_RECIPE_BF16 ? "bf16" : NULL;
    a->no_batch_invariance = !r->batch_invariant;
    a->no_prompt_sharing = !r->share_prompts;
    a->logit_rows = (int32_t)r->train.logit_rows;
    a->save_dtype = r->train.save_dtype == TR_RECIPE_SAVE_BF16 ? "bf16" : NULL;
    a->threads = (int32_t)r->threads;
    const tr_recipe_parallel *par = role == TR_RECIPE_REWARD      ? &r->reward.parallel
                                    : role == TR_RECIPE_GENERATOR ? &r->generator.parallel
                                                                  : &r->models[role].parallel;
    a->tp = (int32_t)par->tp;
    a->sequence_parallel = par->sequence_parallel;
    // The ranks of a group run at the same time on one machine's cores: "all cores" is
    // shared among them rather than taken by each.
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t ranks = par->tp * par->dp;
    if (a->threads == 0 && r->backend == TR_RECIPE_CPU && ranks > 1 && cores > 0)
        a->threads = (int32_t)(cores / ranks > 0 ? cores / ranks : 1);
    a->memory_bytes = (int64_t)(r->memory_gb * (double)(1 << 30));
    const tr_recipe_devices *dev = role == TR_RECIPE_REWARD      ? &r->reward.devices
                                   : role == TR_RECIPE_GENERATOR ? &r->generator.devices
                                                                 : &r->models[role].devices;
    a->devices = dev->ids;
    a->n_devices = dev->n;
    // micro_batch_tokens 0: the policy's plan chooses within the longest row and a step's
    // tokens per rank; the controller hands its choice to the other roles (controller.c).
    a->max_tokens = (int32_t)r->train.micro_batch_tokens;
    a->min_tokens = (int32_t)r->train.max_len;
    int64_t rows = r->workflow == TR_RECIPE_GRPO || r->workflow == TR_RECIPE_PPO
                       ? r->train.prompts_per_step * r->rollout.n : r->train.batch_size;
    int64_t dp_ranks = par->dp > 0 ? par->dp : 1;
    a->max_tokens_want = (rows + dp_ranks - 1) / dp_ranks * r->train.max_len;
    a->recompute = r->train.recompute != TR_RECIPE_RECOMPUTE_AUTO ? tr_recompute_names[r->train.recompute] : NULL;
    a->seed = (uint64_t)r->seed;
    policy_tokenizer(r, s->tokenizer, sizeof s->tokenizer);
    a->tokenizer = s->tokenizer[0] ? s->tokenizer : NULL;
    if (role == TR_RECIPE_REWARD) {
        const tr_recipe_reward *w = &r->reward;
        static const char *const kinds[] = {"rule", "model", "service"};
        a->reward = (tr_role_reward){.kind = kinds[w->kind], .function = reward_fn_name(w->function),
                                     .pattern = w->pattern, .endpoint = w->endpoint,
                                     .timeout_ms = (int32_t)w->timeout_ms, .attempts = (int32_t)(w->retries + 1),
                                     .max_items = (int32_t)w->max_batch,
                                     .on_failure = w->on_failure == TR_RECIPE_ON_FAILURE_ZERO ? "zero" : "fail"};
        if (w->kind == TR_RECIPE_REWARD_MODEL) {
            snprintf(s->model, sizeof s->model, "%s", w->path);
            a->model = s->model;
        }
        return;
    }
    model_source(r, role, s);
    if (role == TR_RECIPE_REFERENCE) return;
    if (role != TR_RECIPE_GENERATOR) {
        a->train = true;
        optim(r, &r->models[role].optim, &a->optim);
        loss(r, &a->loss);
    }
    // With a generator group the policy only trains: no KV cache is planned for it.
    if (role == TR_RECIPE_POLICY) a->no_generate = r->generator.present;
    // Weights read in place: two buffers when generation runs a step ahead of training.
    if ((role == TR_RECIPE_POLICY || role == TR_RECIPE_GENERATOR) && tr_recipe_generator_shares(r))
        a->share_weights = r->generator.one_step_off ? 2 : 1;
    if (role == TR_RECIPE_POLICY || role == TR_RECIPE_GENERATOR) a->chat_format = chat_name(r->data.chat_format);
    if ((role == TR_RECIPE_POLICY && !a->no_generate) || role == TR_RECIPE_GENERATOR) {
        // Decode together every sample of a step's share, with KV room for each to reach
        // the longest row, as far as the worker's memory plan allows (recipe keys override).
        int64_t dp = par->dp > 0 ? par->dp : 1;
        int64_t seqs = r->rollout.max_seqs > 0 ? r->rollout.max_seqs
                                               : (r->train.prompts_per_step * r->rollout.n + dp - 1) / dp;
        if (seqs < 1) seqs = 1;
        if (a->max_tokens > 0 && seqs > a->max_tokens) seqs = a->max_tokens;   // else the plan's bound
        a->max_seqs = (int32_t)seqs;
        a->kv_tokens = r->rollout.kv_tokens;
        // Each sequence fills whole KV blocks (16 tokens), and its first decode step may copy
        // the prompt's partly filled last block: a block more than its length, rounded up.
        a->kv_want = seqs * ((r->train.max_len + 15) / 16 * 16 + 16);
    }
}
