// The worker's model side: the init op (backend, model from a checkpoint or a config on the
// worker arena, the policy's or generator role's generation engine, trainer, tokenizer, chat
// stops), packing rollout sequences into micro-batches as separate documents, and the
// forward-only ops logprobs (policy, reference) and values (critic).
#include <libgen.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/heads.h"
#include "roles/rollout_wire.h"
#include "kernels/backend.h"
#include "roles/client.h"
#include "roles/worker_impl.h"

static const char *const role_names[] = {"policy", "reference", "critic", "reward", "generator"};

// ---- init ----

static int enum_from(const char *const *names, const char *s, const char *what, int *out, tr_err *err) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) {
            *out = i;
            return 0;
        }
    char allowed[256] = "";
    size_t n = 0;
    for (int i = 0; names[i] && n + 32 < sizeof allowed; i++)
        n += (size_t)snprintf(allowed + n, sizeof allowed - n, "%s%s", i ? ", " : "", names[i]);
    return tr_errf(err, TR_EINVAL, "init: %s '%s' is not one of: %s", what, s, allowed);
}

static int parse_optim(const tr_msg_map *m, tr_optim_cfg *o, tr_err *err) {
    static const char *const keys[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", "schedule",
                                       "warmup_steps", "total_steps", "min_lr_ratio", NULL};
    double lr, b1, b2, eps, wd, clip, minr;
    int64_t warm, total;
    char sched[16];
    if (tr_msg_check_keys(m, keys, err) || tr_msg_get_float(m, "lr", &lr, err) ||
        tr_msg_get_float(m, "beta1", &b1, err) || tr_msg_get_float(m, "beta2", &b2, err) ||
        tr_msg_get_float(m, "eps", &eps, err) || tr_msg_get_float(m, "weight_decay", &wd, err) ||
        tr_msg_get_float(m, "grad_clip", &clip, err) || tr_msg_get_str_buf(m, "schedule", sched, sizeof sched, err) ||
        tr_msg_get_int(m, "warmup_steps", &warm, err) || tr_msg_get_int(m, "total_steps", &total, err) ||
        tr_msg_get_float(m, "min_lr_ratio", &minr, err))
        return -1;
    memset(o, 0, sizeof *o);
    if (tr_lr_kind_parse(sched, &o->schedule.kind))
        return tr_errf(err, TR_EINVAL, "init: optim.schedule '%s' is not constant, linear or cosine", sched);
    o->lr = lr;
    o->beta1 = (float)b1;
    o->beta2 = (float)b2;
    o->eps = (float)eps;
    o->weight_decay = (float)wd;
    o->decay_all = false;  // norms and biases do not decay, as in transformers' Trainer
    o->max_grad_norm = (float)clip;
    o->schedule.warmup_steps = warm;
    o->schedule.total_steps = total;
    o->schedule.min_lr_ratio = minr;
    return 0;
}

static int parse_loss(tr_role_ctx *role, const tr_msg_map *m, tr_err *err) {
    static const char *const keys[] = {"clip_low", "clip_high", "clip_dual", "ratio", "agg", "kl_coef",
                                       "kl_estimator", "entropy_coef", "value_clip", "ppo_epochs",
                                       "mini_batches", "max_len", NULL};
    double lo, hi, dual, kl, ent, vclip;
    int64_t epochs, mbs, max_len;
    char ratio[16], agg[32], est[8];
    if (tr_msg_check_keys(m, keys, err) || tr_msg_get_float(m, "clip_low", &lo, err) ||
        tr_msg_get_float(m, "clip_high", &hi, err) || tr_msg_get_float(m, "clip_dual", &dual, err) ||
        tr_msg_get_str_buf(m, "ratio", ratio, sizeof ratio, err) || tr_msg_get_str_buf(m, "agg", agg, sizeof agg, err) ||
        tr_msg_get_float(m, "kl_coef", &kl, err) || tr_msg_get_str_buf(m, "kl_estimator", est, sizeof est, err) ||
        tr_msg_get_float(m, "entropy_coef", &ent, err) || tr_msg_get_float(m, "value_clip", &vclip, err) ||
        tr_msg_get_int(m, "ppo_epochs", &epochs, err) || tr_msg_get_int(m, "mini_batches", &mbs, err) ||
        tr_msg_get_int(m, "max_len", &max_len, err))
        return -1;
    int r, a, e;
    if (enum_from(tr_ratio_mode_names, ratio, "loss.ratio", &r, err) ||
        enum_from(tr_loss_agg_names, agg, "loss.agg", &a, err) ||
        enum_from(tr_kl_est_names, est, "loss.kl_estimator", &e, err))
        return -1;
    if (!(lo >= 0) || !(hi >= 0) || !(dual == 0 || dual > 1) || !(kl >= 0) || !(ent >= 0) || !(vclip >= 0) ||
        epochs < 1 || epochs > 1000 || mbs < 1 || mbs > 1000000 || max_len < 0 || max_len > INT32_MAX)
        return tr_errf(err, TR_EINVAL, "init: loss settings out of range (clips >= 0, clip_dual 0 or > 1, "
                       "coefficients >= 0, ppo_epochs and mini_batches >= 1, max_len >= 0)");
    role->loss = (tr_policy_loss_cfg){.clip_low = (float)lo, .clip_high = (float)hi, .clip_dual = (float)dual,
                                      .ratio = (enum tr_ratio_mode)r, .agg = (enum tr_loss_agg)a,
                                      .kl_coef = (float)kl, .kl_est = (enum tr_kl_est)e,
                                      .entropy_coef = (float)ent};
    role->value_clip = (float)vclip;
    role->ppo_epochs = (int32_t)epochs;
    role->mini_batches = (int32_t)mbs;
    role->max_len = (int32_t)max_len;
    return 0;
}

static int mb_alloc(tr_mb_buf *b, int32_t T, tr_err *err) {
    size_t n = (size_t)T;
    if (tr_pack_init(&b->pack, T, err)) return tr_err_wrap(err, "init");
    b->seq = malloc(n * sizeof(int32_t));
    b->out = malloc(n * sizeof(float));
    b->entropy = malloc(n * sizeof(float));
    b->weights = malloc(n * sizeof(float));
    if (!b->seq || !b->out || !b->entropy || !b->weights)
        return tr_errf(err, TR_ENOMEM, "init: out of memory for %d-token micro-batch buffers", T);
    for (size_t i = 0; i < n; i++) b->weights[i] = 1.0f;
    return 0;
}

static void mb_free(tr_mb_buf *b) {
    tr_pack_free(&b->pack);
    free(b->seq);
    free(b->out);
    free(b->entropy);
    free(b->weights);
    memset(b, 0, sizeof *b);
}

void tr_role_ctx_free(tr_role_ctx *role) {
    tr_comm_free(role->comm);
    role->comm = NULL;
    tr_comm_free(role->tp_comm);
    role->tp_comm = NULL;
    tr_comm_free(role->sync_comm);
    role->sync_comm = NULL;
    if (role->has_gen) tr_generator_free(&role->gen);
    if (role->has_trainer) tr_trainer_free(&role->trainer);
    if (role->has_model) tr_model_free(&role->model);
    tr_worker_share_free(role);   // the model never frees shared working weights
    role->has_gen = role->has_trainer = role->has_model = false;
    mb_free(&role->mb);
    tr_tokenizer_free(role->tok);
    role->tok = NULL;
    role->has_chat = false;
    tr_reward_rule_free(role->rule);
    role->rule = NULL;
    tr_reward_service_free(role->service);
    role->service = NULL;
    role->ready = false;
}

// An LM checkpoint's config turned into a critic's: same body, one value per token.
static void to_value_head(tr_model_config *cfg) {
    cfg->head = TR_HEAD_VALUE;
    cfg->num_labels = 1;
    char *p = strstr(cfg->architecture, "ForCausalLM");
    if (p) snprintf(p, sizeof cfg->architecture - (size_t)(p - cfg->architecture), "ForTokenClassification");
}

static enum tr_head role_head(enum tr_role_kind k) {
    // The generator samples from a causal LM, as the policy does.
    return k == TR_ROLE_CRITIC ? TR_HEAD_VALUE : k == TR_ROLE_REWARD ? TR_HEAD_SCORE : TR_HEAD_LM;
}

static const char *head_name(enum tr_head h) {
    return h == TR_HEAD_LM ? "causal LM" : h == TR_HEAD_VALUE ? "value (token classification) model"
                                                              : "score (sequence classification) model";
}

// The role's memory plan: weights, gradients and optimizer, the arena, and for a role that
// generates the KV cache and the samples decoding together, from what the device (or the
// budget) holds.
static int make_plan(tr_role_ctx *role, const tr_model_config *cfg, int32_t max_tokens, bool train, bool gen,
                     tr_err *err) {
    tr_plan_req pr = {.cfg = cfg, .max_tokens = max_tokens, .min_tokens = role->min_tokens,
                      .max_tokens_want = role->max_tokens_want, .recompute = role->recompute,
                      .training = train, .optim_shards = role->dp, .generate = gen,
                      .logit_rows = role->logit_rows,
                      .kv_tokens = role->kv_tokens, .kv_want = role->kv_want > 0 ? role->kv_want : 16384,
                      .max_seqs = role->max_seqs, .max_seqs_want = role->max_seqs,
                      .budget = (size_t)role->memory_bytes, .tp_size = role->tp, .tp_rank = role->tp_rank,
                      .sequence_parallel = role->sp,
                      .share_buffers = role->kind == TR_ROLE_POLICY ? role->share_buffers : 0,
                      .share_reader = role->kind == TR_ROLE_GENERATOR && role->share_buffers > 0};
    if (tr_plan_make(&role->w->be, &pr, &role->plan, err)) return tr_err_wrap(err, "init");
    char text[1024];
    tr_plan_format(&role->plan, text, sizeof text);
    tr_worker_logf(role, "memory plan on %s device %d:\n%s", role->w->be.ops->name, role->w->device, text);
    return 0;
}

// The policy's generator, sized by the plan.
static tr_gen_opts gen_opts(const tr_role_ctx *role) {
    return (tr_gen_opts){.kv_tokens = role->plan.kv_tokens, .max_seqs = role->plan.max_seqs};
}

// A hosted role whose weights this one may copy instead of loading or drawing them: initialised
// from the same source, unchanged since (no other op has run in the worker), of the same
// shape, slice and precision.
static const tr_role_ctx *weight_twin(const tr_role_ctx *role) {
    const tr_worker *w = role->w;
    for (int i = 0; i < w->n_roles; i++) {
        const tr_role_ctx *r = &w->roles[i];
        if (r != role && r->ready && r->has_model && r->init_src[0] &&
            strcmp(r->init_src, role->init_src) == 0 && r->init_ops == w->ops &&
            tr_model_can_copy_weights(&role->model, &r->model))
            return r;
    }
    return NULL;
}

// A generator holds weights only for generation: no gradients, no optimizer, and its weights
// come from the policy's first sync_weights, so none are read or drawn here. A role hosted
// beside one initialised from the same source (a colocated reference beside its policy)
// copies that role's weights on the device rather than reading or drawing them again.
static int load_model(tr_role_ctx *role, const tr_msg_map *a, int32_t max_tokens, bool train, bool gen,
                      tr_err *err) {
    char model[1024] = "", init_cfg[1024] = "", head[16] = "";
    int64_t init_seed = 0;
    if (tr_msg_has(a, "model") && tr_msg_get_str_buf(a, "model", model, sizeof model, err)) return -1;
    if (tr_msg_has(a, "init_config") && tr_msg_get_str_buf(a, "init_config", init_cfg, sizeof init_cfg, err))
        return -1;
    if (tr_msg_get_int_opt(a, "init_seed", &init_seed, err)) return -1;
    if (tr_msg_has(a, "head") && tr_msg_get_str_buf(a, "head", head, sizeof head, err)) return -1;
    if (!model[0] == !init_cfg[0])
        return tr_errf(err, TR_EINVAL, "init: give exactly one of model (a checkpoint) and init_config");
    if (head[0] && strcmp(head, "value") != 0)
        return tr_errf(err, TR_EINVAL, "init: head '%s': only 'value' converts a checkpoint", head);
    tr_model_config cfg;
    if (model[0] ? tr_checkpoint_load_config(model, &cfg, err) : tr_config_load(init_cfg, &cfg, err)) return -1;
    bool convert = head[0] && cfg.head == TR_HEAD_LM;
    if (convert) to_value_head(&cfg);
    enum tr_head want = role_head(role->kind);
    if (cfg.head != want)
        return tr_errf(err, TR_EINVAL, "init: %s is a %s (%s); the %s role needs a %s", model[0] ? model : init_cfg,
                       head_name(cfg.head), cfg.architecture, role->name, head_name(want));
    if (want == TR_HEAD_SCORE && cfg.num_labels != 1)
        return tr_errf(err, TR_EINVAL, "init: %s has %d labels; a reward model has 1", model, cfg.num_labels);
    // The model's activations (and a generating role's KV pool) come from the worker's one arena,
    // grown here to this role's need if it is the largest so far.
    tr_worker *w = role->w;
    if (make_plan(role, &cfg, max_tokens, train, gen, err)) return -1;
    max_tokens = role->plan.max_tokens;
    tr_model_opts mo = {.max_tokens = max_tokens, .training = train, .tp_size = role->tp, .tp_rank = role->tp_rank,
                        .logit_rows = role->plan.logit_rows, .sequence_parallel = role->sp,
                        .external_work = role->share_buffers > 0, .recompute = role->plan.recompute};
    tr_gen_opts go = gen_opts(role);
    tr_arena_need_init(&role->need, &cfg, &mo, gen ? &go : NULL, w->be.act);
    if (tr_arena_reserve(&w->arena, tr_arena_need_bytes(&role->need), err)) return -1;
    mo.acts = w->arena.base;
    mo.acts_bytes = w->arena.bytes;
    if (tr_model_init(&role->model, &cfg, &w->be, &mo, err)) return -1;
    role->has_model = true;
    if (tr_worker_share_init(role, err)) return -1;   // before any weight is written
    tr_arena_adopt(&w->arena, &role->model);
    if (gen) {
        size_t off = tr_arena_kv_offset(&role->model);
        go.kv_buf = (char *)w->arena.base + off;
        go.kv_buf_bytes = w->arena.bytes - off;
        if (tr_generator_init(&role->gen, &role->model, &go, err)) return -1;
        role->has_gen = true;
    }
    int rc = 0;
    role->init_src[0] = '\0';
    if (role->kind != TR_ROLE_GENERATOR && !convert) {
        if (model[0]) snprintf(role->init_src, sizeof role->init_src, "checkpoint %s", model);
        else snprintf(role->init_src, sizeof role->init_src, "config %s, seed %lld", init_cfg, (long long)init_seed);
    }
    const tr_role_ctx *twin = role->init_src[0] ? weight_twin(role) : NULL;
    if (role->kind == TR_ROLE_GENERATOR) {
        // Zero until the policy's first sync_weights; generate is refused before it.
    } else if (twin) {
        rc = tr_model_copy_weights(&role->model, &twin->model, err);
        if (!rc)
            tr_worker_logf(role, "init: weights copied from the %s role's (the same %s, unchanged since)",
                           twin->name, role->init_src);
    } else if (!model[0]) {
        rc = tr_model_init_weights(&role->model, (uint64_t)init_seed, 0.02f, err);
    } else if (convert) {
        // The value head is new: drawn as transformers' init would, the body from the checkpoint.
        rc = tr_model_init_weights(&role->model, (uint64_t)init_seed, 0.02f, err);
        if (!rc) rc = tr_model_load_weights(&role->model, model, true, err);
    } else {
        rc = tr_model_load_weights(&role->model, model, false, err);
    }
    if (rc) return -1;
    return mb_alloc(&role->mb, max_tokens, err);
}

// The ranks of a tensor-parallel group schedule generation alike only with the same KV pool
// and batch: each planned its own from its device's room, and all take the smallest. A
// smaller pool fits where the larger was laid out, so the generator is made again in place.
int tr_worker_tp_agree(tr_role_ctx *role, tr_err *err) {
    if (!role->has_gen) return 0;
    int64_t v[2] = {role->plan.kv_tokens, role->plan.max_seqs};
    if (tr_comm_min_i64(role->tp_comm, v, 2, err)) return -1;
    if (v[0] == role->plan.kv_tokens && v[1] == role->plan.max_seqs) return 0;
    tr_worker_logf(role, "tensor parallel: KV cache %lld tokens and %lld sequences, the group's smallest (planned "
                   "%lld and %d)", (long long)v[0], (long long)v[1], (long long)role->plan.kv_tokens,
                   role->plan.max_seqs);
    role->plan.kv_tokens = v[0];
    role->plan.max_seqs = (int32_t)v[1];
    tr_gen_opts go = gen_opts(role);
    size_t off = tr_arena_kv_offset(&role->model);
    go.kv_buf = (char *)role->w->arena.base + off;
    go.kv_buf_bytes = role->w->arena.bytes - off;
    tr_generator_free(&role->gen);
    role->has_gen = false;
    if (tr_generator_init(&role->gen, &role->model, &go, err)) return -1;
    role->has_gen = true;
    return 0;
}

static int load_tokenizer(tr_role_ctx *role, const tr_msg_map *a, tr_err *err) {
    char path[1024] = "", chat[16] = "";
    if (tr_msg_has(a, "tokenizer") && tr_msg_get_str_buf(a, "tokenizer", path, sizeof path, err)) return -1;
    if (tr_msg_has(a, "chat_format") && tr_msg_get_str_buf(a, "chat_format", chat, sizeof chat, err)) return -1;
    if (path[0]) {
        if (tr_tokenizer_load(&role->tok, path, err)) return -1;
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", path);
        snprintf(role->tokenizer_dir, sizeof role->tokenizer_dir, "%s", dirname(copy));
    }
    role->n_stop = 0;
    if (chat[0] && strcmp(chat, "none") != 0) {
        if (!role->tok) return tr_errf(err, TR_EINVAL, "init: chat_format %s needs a tokenizer", chat);
        if (tr_chat_format_init(&role->chat, chat, role->tok, err)) return -1;
        role->has_chat = true;
        for (int32_t i = 0; i < role->chat.n_stop; i++) role->stop_ids[role->n_stop++] = role->chat.stop[i];
    } else if (role->has_model) {
        for (int32_t i = 0; i < role->model.cfg.n_eos; i++)
            role->stop_ids[role->n_stop++] = role->model.cfg.eos_token_ids[i];
    }
    return 0;
}

// The group's layout: tp x dp = world, this rank's place in it (rank = dp_rank * tp + tp_rank),
// and whether the model is sequence-parallel.
static int parse_parallel(tr_role_ctx *role, const tr_msg_map *a, tr_err *err) {
    static const char *const keys[] = {"tp", "dp", "sequence_parallel", NULL};
    int64_t tp = 1, dp = role->w->world;
    bool sp = false;
    if (tr_msg_has(a, "parallel")) {
        tr_msg_map p;
        if (tr_msg_get_map(a, "parallel", &p, err) || tr_msg_check_keys(&p, keys, err) ||
            tr_msg_get_int(&p, "tp", &tp, err) || tr_msg_get_int(&p, "dp", &dp, err) ||
            tr_msg_get_bool_opt(&p, "sequence_parallel", &sp, err))
            return -1;
    }
    if (tp < 1 || dp < 1 || tp * dp != role->w->world)
        return tr_errf(err, TR_EINVAL, "init: parallel tp %lld x dp %lld does not make the group's %d ranks",
                       (long long)tp, (long long)dp, role->w->world);
    if (sp && tp < 2)
        return tr_errf(err, TR_EINVAL, "init: parallel.sequence_parallel needs tp 2 or more (tp %lld)",
                       (long long)tp);
    role->sp = sp;
    role->tp = (int32_t)tp;
    role->dp = (int32_t)dp;
    role->dp_rank = role->w->rank / role->tp;
    role->tp_rank = role->w->rank % role->tp;
    return 0;
}

// The role's memory by part, in bytes: working weights, fp32 masters, gradients and Adam
// moments (this rank's shard) of its model, its share of the worker's activation arena and KV
// cache (what the arena's sizing rule asks for the role), and the device's memory in use
// once the role is set up (0 on the CPU): a worker allocates nothing per step after init.
static void put_memory(tr_role_ctx *role, tr_msg_writer *rep) {
    const tr_model *m = &role->model;
    bool own = role->has_model;
    size_t n = own ? m->layout.total : 0;
    size_t work = own && m->work && (void *)m->work != (void *)m->params && !m->external_work
                      ? n * tr_dt_size(m->wt)
                      : 0;
    size_t moments = role->has_trainer ? 2 * (role->trainer.shard_end - role->trainer.shard_begin) * sizeof(float) : 0;
    size_t free_b = 0, total_b = 0;
    tr_backend *be = &role->w->be;
    if (role->w->has_backend && strcmp(be->ops->name, "cpu") != 0) be->ops->mem_info(be, &free_b, &total_b);
    int64_t v[TR_MEM_PARTS] = {
        [TR_MEM_WEIGHTS] = (int64_t)(own && m->params && m->wt == TR_F32 ? n * sizeof(float) : work),
        [TR_MEM_MASTERS] = (int64_t)(own && m->params && m->wt != TR_F32 ? n * sizeof(float) : 0),
        [TR_MEM_GRADS] = (int64_t)(own && m->grads ? n * sizeof(float) : 0),
        [TR_MEM_OPTIMIZER] = (int64_t)moments,
        [TR_MEM_ACTIVATIONS] = (int64_t)(role->need.train > role->need.forward ? role->need.train : role->need.forward),
        [TR_MEM_KV] = (int64_t)role->need.kv,
        [TR_MEM_DEVICE_USED] = (int64_t)(total_b - free_b)};
    tr_msg_put_map(rep, "memory", TR_MEM_PARTS);
    for (int i = 0; i < TR_MEM_PARTS; i++) tr_msg_put_int(rep, tr_mem_part_names[i], v[i]);
}

// init's scalar arguments, read and range-checked before anything is set up.
typedef struct init_args {
    char backend[16], precision[8], save_dtype[8], recompute[8];
    int64_t threads, device, memory, max_tokens, kv_tokens, kv_want, max_seqs, share;
    int64_t logit_rows, min_tokens, want_tokens;
    uint64_t seed;
    bool train, generate, invariant, share_prompts;
} init_args;

static int init_read(const tr_msg_map *a, init_args *x, tr_err *err) {
    static const char *const keys[] = {"model", "init_config", "init_seed", "head", "backend", "threads",
                                       "device", "memory_bytes", "max_tokens", "seed", "tokenizer",
                                       "chat_format", "train", "optim", "loss", "kv_tokens", "kv_want",
                                       "max_seqs", "reward", "parallel", "generate", "precision",
                                       "save_dtype", "share_weights", "batch_invariant", "share_prompts", "logit_rows",
                                       "min_tokens", "max_tokens_want", "recompute", NULL};
    *x = (init_args){.save_dtype = "fp32", .recompute = "auto", .generate = true, .invariant = true,
                     .share_prompts = true};
    if (tr_msg_check_keys(a, keys, err) || tr_msg_get_bool_opt(a, "generate", &x->generate, err) ||
        tr_msg_get_bool_opt(a, "share_prompts", &x->share_prompts, err) ||
        tr_msg_get_int_opt(a, "logit_rows", &x->logit_rows, err) ||
        tr_msg_get_int_opt(a, "min_tokens", &x->min_tokens, err) ||
        tr_msg_get_int_opt(a, "max_tokens_want", &x->want_tokens, err) ||
        (tr_msg_has(a, "recompute") && tr_msg_get_str_buf(a, "recompute", x->recompute, sizeof x->recompute, err)) ||
        tr_msg_get_bool_opt(a, "batch_invariant", &x->invariant, err) ||
        tr_msg_get_str_buf(a, "backend", x->backend, sizeof x->backend, err) ||
        tr_msg_get_int(a, "threads", &x->threads, err) || tr_msg_get_int(a, "max_tokens", &x->max_tokens, err) ||
        tr_msg_get_uint(a, "seed", &x->seed, err) || tr_msg_get_bool(a, "train", &x->train, err) ||
        tr_msg_get_int_opt(a, "kv_tokens", &x->kv_tokens, err) || tr_msg_get_int_opt(a, "max_seqs", &x->max_seqs, err) ||
        tr_msg_get_int_opt(a, "device", &x->device, err) || tr_msg_get_int_opt(a, "memory_bytes", &x->memory, err) ||
        tr_msg_get_int_opt(a, "kv_want", &x->kv_want, err) || tr_msg_get_int_opt(a, "share_weights", &x->share, err) ||
        (tr_msg_has(a, "precision") && tr_msg_get_str_buf(a, "precision", x->precision, sizeof x->precision, err)) ||
        (tr_msg_has(a, "save_dtype") && tr_msg_get_str_buf(a, "save_dtype", x->save_dtype, sizeof x->save_dtype, err)))
        return -1;
    if (strcmp(x->save_dtype, "fp32") != 0 && strcmp(x->save_dtype, "bf16") != 0)
        return tr_errf(err, TR_EINVAL, "init: save_dtype must be fp32 or bf16, got '%s'", x->save_dtype);
    if (x->logit_rows < 0 || (x->max_tokens > 0 && x->logit_rows > x->max_tokens))
        return tr_errf(err, TR_EINVAL, "init: logit_rows %lld: 0 (the memory plan's) or 1..max_tokens (%lld)",
                       (long long)x->logit_rows, (long long)x->max_tokens);
    if (x->min_tokens < 0 || x->min_tokens > (1 << 24) || x->want_tokens < 0 || x->want_tokens > ((int64_t)1 << 40))
        return tr_errf(err, TR_EINVAL, "init: min_tokens %lld or max_tokens_want %lld out of range",
                       (long long)x->min_tokens, (long long)x->want_tokens);
    if (!tr_backend_built(x->backend))
        return tr_errf(err, TR_EUNSUPPORTED, "init: backend '%s' is not in this build of troupe", x->backend);
    if (x->device < 0 || x->device > 1024)
        return tr_errf(err, TR_EINVAL, "init: device %lld out of range", (long long)x->device);
    if (x->threads < 0 || x->threads > 4096 || x->max_tokens < 0 || x->max_tokens > (1 << 24) || x->kv_tokens < 0 ||
        x->kv_want < 0 || x->memory < 0 || x->max_seqs < 0 || x->max_seqs > (1 << 20))
        return tr_errf(err, TR_EINVAL, "init: threads %lld, max_tokens %lld, kv_tokens %lld or max_seqs %lld out "
                       "of range", (long long)x->threads, (long long)x->max_tokens, (long long)x->kv_tokens,
                       (long long)x->max_seqs);
    return 0;
}

// The role's settings from init's arguments, checked against the role's kind.
static int init_settings(tr_role_ctx *role, const tr_msg_map *a, const init_args *x, tr_err *err) {
    role->save_bf16 = strcmp(x->save_dtype, "bf16") == 0;
    role->share_prompts = x->share_prompts;
    role->logit_rows = (int32_t)x->logit_rows;
    if ((role->recompute = tr_recompute_parse(x->recompute)) < 0)
        return tr_errf(err, TR_EINVAL, "init: recompute must be auto, off or on, got '%s'", x->recompute);
    role->min_tokens = (int32_t)x->min_tokens;
    role->max_tokens_want = x->want_tokens > INT32_MAX ? INT32_MAX : (int32_t)x->want_tokens;
    if (parse_parallel(role, a, err)) return -1;
    if (x->train && role->kind != TR_ROLE_POLICY && role->kind != TR_ROLE_CRITIC)
        return tr_errf(err, TR_EINVAL, "init: the %s role does not train", role->name);
    if (tr_msg_has(a, "generate") && role->kind != TR_ROLE_POLICY)
        return tr_errf(err, TR_EINVAL, "init: generate is a policy setting (the %s role %s)", role->name,
                       role->kind == TR_ROLE_GENERATOR ? "always generates" : "never does");
    // Shared working weights: the policy's buffers (it trains and leaves sampling to the
    // generator), or the generator's mapping of them.
    if (x->share < 0 || x->share > 2 ||
        (x->share && role->kind != TR_ROLE_GENERATOR && (role->kind != TR_ROLE_POLICY || !x->train || x->generate)))
        return tr_errf(err, TR_EINVAL, "init: share_weights %lld: 1 or 2 buffers, for a policy that trains with "
                       "generate: false and for the generator", (long long)x->share);
    role->share_buffers = (int32_t)x->share;
    bool has_reward = tr_msg_has(a, "reward");
    if (has_reward != (role->kind == TR_ROLE_REWARD))
        return tr_errf(err, TR_EINVAL, "init: %s", has_reward ? "reward settings are for the reward role"
                                                              : "the reward role needs reward settings");
    if (x->train != (tr_msg_has(a, "optim") && tr_msg_has(a, "loss")))
        return tr_errf(err, TR_EINVAL, "init: train needs optim and loss settings, and only it takes them");
    role->kv_tokens = x->kv_tokens;
    role->kv_want = x->kv_want;
    role->max_seqs = (int32_t)x->max_seqs;
    role->memory_bytes = x->memory;
    role->weight_version = -1;
    role->prev_train_step = -1;
    return 0;
}

// The worker's one backend: started by the first role that needs a model; later roles must
// ask for the same kind, device and precision.
static int init_backend(tr_role_ctx *role, const init_args *x, tr_err *err) {
    tr_worker *w = role->w;
    if (!w->has_backend) {
        char why[512];
        tr_backend_opts bo = {.kind = x->backend, .threads = (int32_t)x->threads, .device = (int32_t)x->device,
                              .precision = x->precision[0] ? x->precision : NULL,
                              .batch_invariant = x->invariant ? 1 : -1};
        if (tr_backend_init(&w->be, &bo, why, sizeof why))
            return tr_errf(err, TR_EDEVICE, "init: %s", why);
        w->has_backend = true;
        w->threads = (int32_t)x->threads;
        w->device = (int32_t)x->device;
        w->arena.be = &w->be;
    } else if (strcmp(x->backend, w->be.ops->name) != 0 ||
               (strcmp(x->backend, "cuda") == 0 && x->device != w->device)) {
        return tr_errf(err, TR_EINVAL, "init: colocated roles share one backend: %s device %d, not %s device %lld",
                       w->be.ops->name, w->device, x->backend, (long long)x->device);
    } else if (x->precision[0] && strcmp(x->precision, tr_dt_name(w->be.act)) != 0) {
        return tr_errf(err, TR_EINVAL, "init: colocated roles share one backend in %s, not %s",
                       tr_dt_name(w->be.act), x->precision);
    } else if (x->threads != w->threads) {
        tr_worker_logf(role, "init: sharing the colocated roles' %d-thread pool (asked for %lld)", w->threads,
                       (long long)x->threads);
    }
    return 0;
}

// init's reply: the role's memory, its shape and the worker arena, also logged.
static void init_reply(tr_role_ctx *role, const tr_msg *req, int64_t max_tokens, bool train, tr_msg_writer *rep) {
    tr_worker *w = role->w;
    int64_t n_params = role->has_model ? (int64_t)tr_model_n_params(&role->model) : 0;
    tr_worker_logf(role, "init: %s%s%s, %lld parameters, %lld tokens per forward%s%s", role_names[role->kind],
                   role->has_model ? " " : "", role->has_model ? role->model.cfg.architecture : "", (long long)n_params,
                   (long long)max_tokens, train ? ", training" : "",
                   role->has_model && role->model.recompute ? ", activations recomputed" : "");
    if (role->has_model) w->separate_bytes += tr_arena_separate_bytes(&role->need);
    int64_t arena_bytes = (int64_t)w->arena.bytes;
    int64_t separate_bytes = (int64_t)w->separate_bytes;
    if (role->has_model)
        tr_worker_logf(role, "arena: %lld bytes for the hosted roles, separate buffers would take %lld; this role "
                       "needs %zu bytes = max(train %zu, forward %zu + kv %zu)", (long long)arena_bytes,
                       (long long)separate_bytes, tr_arena_need_bytes(&role->need), role->need.train,
                       role->need.forward, role->need.kv);
    tr_msg_begin_reply(rep, req->id, 8);
    put_memory(role, rep);
    tr_msg_put_bool(rep, "recompute", role->has_model && role->model.recompute);
    tr_msg_put_int(rep, "n_params", n_params);
    tr_msg_put_int(rep, "vocab_size", role->has_model ? role->model.cfg.vocab_size : 0);
    tr_msg_put_int(rep, "max_tokens", max_tokens);
    tr_msg_put_str(rep, "architecture", role->has_model ? role->model.cfg.architecture : "");
    tr_msg_put_int(rep, "arena_bytes", arena_bytes);
    tr_msg_put_int(rep, "arena_separate_bytes", separate_bytes);
}

int tr_worker_op_init(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    const tr_msg_map *a = &req->args;
    init_args x;
    if (init_read(a, &x, err) || init_settings(role, a, &x, err)) return -1;
    bool needs_model = role->kind != TR_ROLE_REWARD || tr_msg_has(a, "model") || tr_msg_has(a, "init_config");
    if (needs_model && init_backend(role, &x, err)) return -1;
    if (tr_msg_has(a, "reward")) {
        tr_msg_map rm;
        if (tr_msg_get_map(a, "reward", &rm, err) || tr_worker_reward_init(role, &rm, err)) return -1;
    }
    int64_t max_tokens = x.max_tokens;
    bool gen = (role->kind == TR_ROLE_POLICY && x.generate) || role->kind == TR_ROLE_GENERATOR;
    bool model_reward = role->kind == TR_ROLE_REWARD && role->reward_kind == TR_REWARD_KIND_MODEL;
    if (role->kind != TR_ROLE_REWARD || model_reward) {
        if (load_model(role, a, (int32_t)max_tokens, x.train, gen, err)) return -1;
        max_tokens = role->model.max_tokens;   // the plan's, when init left it to the plan
    } else if (tr_msg_has(a, "model") || tr_msg_has(a, "init_config")) {
        return tr_errf(err, TR_EINVAL, "init: a %s reward takes no model", role->reward_kind == TR_REWARD_KIND_RULE
                                                                               ? "rule" : "service");
    }
    if (load_tokenizer(role, a, err)) return -1;
    if (x.train) {
        tr_msg_map om, lm;
        tr_optim_cfg opt;
        if (tr_msg_get_map(a, "optim", &om, err) || parse_optim(&om, &opt, err) ||
            tr_msg_get_map(a, "loss", &lm, err) || parse_loss(role, &lm, err))
            return -1;
        // ZeRO-1: each data-parallel rank keeps the Adam moments of its shard only.
        if (tr_trainer_init_sharded(&role->trainer, &role->model, &opt, x.seed, role->dp, role->dp_rank, err))
            return -1;
        role->has_trainer = true;
    }
    init_reply(role, req, max_tokens, x.train, rep);
    return 0;
}

// ---- micro-batches of sequences ----

int tr_worker_get_rollouts(tr_role_ctx *role, const tr_msg_map *args, tr_rollouts *r, tr_err *err) {
    int64_t max_len = role->has_model ? role->model.max_tokens : 0;
    if (tr_rollouts_get(args, "rollouts", max_len, r, err)) return -1;
    if (!role->has_model) return 0;
    int32_t V = role->model.cfg.vocab_size;
    for (int64_t t = 0; t < r->n_tokens; t++)
        if (r->tokens[t] < 0 || r->tokens[t] >= V) {
            int32_t s = 0;
            while (r->offset[s + 1] <= t) s++;
            return tr_errf(err, TR_ERANGE, "rollouts: sequence %d token %lld is %d, outside the vocabulary [0, %d)",
                           s, (long long)(t - r->offset[s]), r->tokens[t], V);
        }
    return 0;
}

int32_t tr_mb_fill(tr_role_ctx *role, const tr_rollouts *r, int32_t s0, int32_t s1, tr_err *err) {
    tr_mb_buf *b = &role->mb;
    tr_pack_clear(&b->pack);
    int32_t s = s0;
    for (; s < s1; s++) {
        int32_t len = (int32_t)(r->offset[s + 1] - r->offset[s]);
        b->seq[b->pack.docs.n_docs] = s;
        if (!tr_pack_add(&b->pack, r->tokens + r->offset[s], NULL, len)) break;
    }
    if (s == s0)
        return tr_errf(err, TR_ERANGE, "sequence %d has %lld tokens; this worker's forward takes %d", s0,
                       (long long)(r->offset[s0 + 1] - r->offset[s0]), role->model.max_tokens);
    return s - s0;
}

// ---- logprobs and values ----

// Runs the trunk and head over every sequence, in the train op's micro-batch plan;
// per-token outputs aligned with r->tokens.
static int forward_all(tr_role_ctx *role, const tr_rollouts *r, float *out, float *entropy, int64_t *packed,
                       tr_err *err) {
    tr_model *m = &role->model;
    tr_mb_buf *b = &role->mb;
    memset(out, 0, (size_t)r->n_tokens * sizeof(float));
    if (entropy) memset(entropy, 0, (size_t)r->n_tokens * sizeof(float));
    tr_mb_plan p;
    if (tr_mb_plan_build(r, 0, r->n, m->max_tokens, role->share_prompts, &p, err)) return -1;
    *packed = p.tokens;
    int rc = 0;
    for (int32_t i = 0; i < p.n && !rc; i++) {
        const tr_pack *pk = &p.packs[i];
        int32_t k0 = p.first[i], k1 = p.first[i + 1];
        rc = tr_model_forward(m, pk->ids, &pk->docs, err);
        if (!rc) rc = m->cfg.head == TR_HEAD_LM ? tr_lm_head_forward(m, pk->targets, b->out, entropy ? b->entropy : NULL, err)
                                                 : tr_value_head_forward(m, b->out, err);
        if (rc) {
            tr_err_wrap(err, "micro-batch %d of %d (%d sequences from sequence %d)", i + 1, p.n, k1 - k0,
                        p.seqs[k0]);
            break;
        }
        for (int32_t k = k0; k < k1; k++) {
            int32_t s = p.seqs[k], len = (int32_t)(r->offset[s + 1] - r->offset[s]);
            for (int32_t t = tr_first_scored(r->prompt_len[s]); t < len; t++) {
                int32_t o = tr_pack_row(pk, k - k0, t - 1);   // predicts token t
                out[r->offset[s] + t] = b->out[o];
                if (entropy) entropy[r->offset[s] + t] = b->entropy[o];
            }
        }
    }
    tr_mb_plan_free(&p);
    return rc;
}

static int op_forward(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, bool values, tr_err *err) {
    static const char *const lp_keys[] = {"rollouts", "entropy", NULL};
    static const char *const v_keys[] = {"rollouts", NULL};
    bool want_ent = false;
    if (tr_msg_check_keys(&req->args, values ? v_keys : lp_keys, err) ||
        tr_msg_get_bool_opt(&req->args, "entropy", &want_ent, err))
        return -1;
    tr_rollouts r;
    tr_rollouts_init(&r);
    float *out = NULL, *ent = NULL;
    int rc = tr_worker_get_rollouts(role, &req->args, &r, err);
    size_t nt = (size_t)(r.n_tokens ? r.n_tokens : 1);
    if (!rc && (!(out = malloc(nt * sizeof(float))) || (want_ent && !(ent = malloc(nt * sizeof(float))))))
        rc = tr_errf(err, TR_ENOMEM, "out of memory for %lld tokens", (long long)r.n_tokens);
    int64_t packed = 0;
    if (!rc) rc = forward_all(role, &r, out, ent, &packed, err);
    if (!rc && role->tp_rank != 0) {
        tr_msg_begin_reply(rep, req->id, 0);   // its tensor-parallel group's rank 0 answers
    } else if (!rc) {
        int64_t n = r.n_tokens;
        tr_msg_begin_reply(rep, req->id, want_ent ? 2 : 1);
        tr_msg_put_tensor(rep, values ? "values" : "logprobs", TR_DTYPE_F32, 1, &n, out);
        if (want_ent) tr_msg_put_tensor(rep, "entropy", TR_DTYPE_F32, 1, &n, ent);
        tr_worker_logf(role, "%s: %d sequences, %lld tokens (%lld packed)", values ? "values" : "logprobs", r.n,
                       (long long)n, (long long)packed);
    }
    free(out);
    free(ent);
    tr_rollouts_free(&r);
    return rc;
}

int tr_worker_op_logprobs(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    return op_forward(role, req, rep, false, err);
}

int tr_worker_op_values(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    return op_forward(role, req, rep, true, err);
}
