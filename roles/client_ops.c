// The typed calls of client.h: each builds its op's args (docs/protocol.md) for every rank,
// with rank r's share of the sequences, and reads the results back into the caller's arrays
// at that share's offset, so the gathered output is in the caller's order.
#include <stdlib.h>
#include <string.h>

#include "roles/client.h"
#include "roles/client_impl.h"
#include "roles/rollout_wire.h"

// ---- init ----

static void put_str_opt(tr_msg_writer *w, const char *key, const char *s) {
    if (s && s[0]) tr_msg_put_str(w, key, s);
}

static uint32_t n_str(const char *s) {
    return s && s[0] ? 1u : 0u;
}

static void build_init(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    const tr_init_args *a = ctx;
    bool has_reward = a->reward.kind && a->reward.kind[0];
    bool has_gen = a->kv_tokens > 0 || a->kv_want > 0 || a->max_seqs > 0;
    uint32_t n = 7 + n_str(a->model) + n_str(a->init_config) + n_str(a->head) + n_str(a->tokenizer) +
                 n_str(a->precision) + n_str(a->save_dtype) +
                 n_str(a->chat_format) + (a->init_config && a->init_config[0] ? 1 : 0) + (a->train ? 2 : 0) +
                 (has_gen ? 3 : 0) + (has_reward ? 1 : 0) + 1 + (a->no_generate ? 1 : 0) + (a->share_weights ? 1 : 0) +
                 (a->no_batch_invariance ? 1 : 0) + (a->no_prompt_sharing ? 1 : 0) + (a->logit_rows > 0 ? 1 : 0) +
                 (a->min_tokens > 0 ? 1 : 0) + (a->max_tokens_want > 0 ? 1 : 0) + n_str(a->recompute);
    tr_msg_begin_request(w, op, id, n);
    put_str_opt(w, "model", a->model);
    put_str_opt(w, "init_config", a->init_config);
    if (a->init_config && a->init_config[0]) tr_msg_put_uint(w, "init_seed", a->init_seed);
    put_str_opt(w, "head", a->head);
    tr_msg_put_str(w, "backend", a->backend && a->backend[0] ? a->backend : "cpu");
    put_str_opt(w, "precision", a->precision);
    put_str_opt(w, "save_dtype", a->save_dtype);
    tr_msg_put_int(w, "threads", a->threads);
    tr_msg_put_int(w, "device", rank < a->n_devices ? a->devices[rank] : rank);
    tr_msg_put_int(w, "memory_bytes", a->memory_bytes);
    tr_msg_put_int(w, "max_tokens", a->max_tokens);
    if (a->min_tokens > 0) tr_msg_put_int(w, "min_tokens", a->min_tokens);
    if (a->max_tokens_want > 0) tr_msg_put_int(w, "max_tokens_want", a->max_tokens_want);
    put_str_opt(w, "recompute", a->recompute);
    tr_msg_put_uint(w, "seed", a->seed);
    put_str_opt(w, "tokenizer", a->tokenizer);
    put_str_opt(w, "chat_format", a->chat_format);
    tr_msg_put_bool(w, "train", a->train);
    if (a->no_generate) tr_msg_put_bool(w, "generate", false);
    if (a->no_batch_invariance) tr_msg_put_bool(w, "batch_invariant", false);
    if (a->no_prompt_sharing) tr_msg_put_bool(w, "share_prompts", false);
    if (a->logit_rows > 0) tr_msg_put_int(w, "logit_rows", a->logit_rows);
    if (a->share_weights) tr_msg_put_int(w, "share_weights", a->share_weights);
    int32_t tp = a->tp > 0 ? a->tp : 1;
    tr_msg_put_map(w, "parallel", a->sequence_parallel ? 3 : 2);
    tr_msg_put_int(w, "tp", tp);
    tr_msg_put_int(w, "dp", ranks / tp);
    if (a->sequence_parallel) tr_msg_put_bool(w, "sequence_parallel", true);
    if (a->train) {
        const tr_role_optim *o = &a->optim;
        tr_msg_put_map(w, "optim", 10);
        tr_msg_put_float(w, "lr", o->lr);
        tr_msg_put_float(w, "beta1", o->beta1);
        tr_msg_put_float(w, "beta2", o->beta2);
        tr_msg_put_float(w, "eps", o->eps);
        tr_msg_put_float(w, "weight_decay", o->weight_decay);
        tr_msg_put_float(w, "grad_clip", o->grad_clip);
        tr_msg_put_str(w, "schedule", o->schedule ? o->schedule : "constant");
        tr_msg_put_int(w, "warmup_steps", o->warmup_steps);
        tr_msg_put_int(w, "total_steps", o->total_steps);
        tr_msg_put_float(w, "min_lr_ratio", o->min_lr_ratio);
        const tr_role_loss *l = &a->loss;
        tr_msg_put_map(w, "loss", 12);
        tr_msg_put_float(w, "clip_low", l->clip_low);
        tr_msg_put_float(w, "clip_high", l->clip_high);
        tr_msg_put_float(w, "clip_dual", l->clip_dual);
        tr_msg_put_str(w, "ratio", l->ratio ? l->ratio : "token");
        tr_msg_put_str(w, "agg", l->agg ? l->agg : "token-mean");
        tr_msg_put_float(w, "kl_coef", l->kl_coef);
        tr_msg_put_str(w, "kl_estimator", l->kl_estimator ? l->kl_estimator : "k3");
        tr_msg_put_float(w, "entropy_coef", l->entropy_coef);
        tr_msg_put_float(w, "value_clip", l->value_clip);
        tr_msg_put_int(w, "ppo_epochs", l->ppo_epochs > 0 ? l->ppo_epochs : 1);
        tr_msg_put_int(w, "mini_batches", l->mini_batches > 0 ? l->mini_batches : 1);
        tr_msg_put_int(w, "max_len", l->max_len);
    }
    if (has_gen) {
        tr_msg_put_int(w, "kv_tokens", a->kv_tokens);
        tr_msg_put_int(w, "kv_want", a->kv_want);
        tr_msg_put_int(w, "max_seqs", a->max_seqs);
    }
    if (has_reward) {
        const tr_role_reward *r = &a->reward;
        tr_msg_put_map(w, "reward", 5 + n_str(r->function) + n_str(r->pattern) + n_str(r->endpoint));
        tr_msg_put_str(w, "kind", r->kind);
        put_str_opt(w, "function", r->function);
        put_str_opt(w, "pattern", r->pattern);
        put_str_opt(w, "endpoint", r->endpoint);
        tr_msg_put_int(w, "timeout_ms", r->timeout_ms);
        tr_msg_put_int(w, "attempts", r->attempts);
        tr_msg_put_int(w, "max_items", r->max_items);
        tr_msg_put_str(w, "on_failure", r->on_failure ? r->on_failure : "fail");
    }
}

typedef struct init_ctx {
    const tr_init_args *a;
    tr_role_info *info;
    int32_t seen_rank;   // the first rank that replied (-1: none yet) and its max_tokens
    int64_t seen_tokens;
} init_ctx;

static void build_init_ctx(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    build_init((void *)((init_ctx *)ctx)->a, rank, ranks, w, op, id);
}

const char *const tr_mem_part_names[TR_MEM_PARTS] = {"weights", "masters", "grads", "optimizer",
                                                     "activations", "kv", "device_used"};

static int reply_init(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    init_ctx *c = ctx;
    int64_t np = 0, vocab = 0, mt = 0;
    bool recompute = false;
    if (tr_msg_get_int_opt(res, "max_tokens", &mt, err) || tr_msg_get_bool_opt(res, "recompute", &recompute, err))
        return -1;
    // Ranks plan their micro-batch from their own device's room when init leaves it to them;
    // they must pack alike, so a difference is an error rather than a silent choice.
    if (c->seen_rank >= 0 && mt != c->seen_tokens)
        return tr_errf(err, TR_EINVAL, "init: rank %d planned %lld tokens per micro-batch and rank %d %lld (their "
                       "devices differ); set train.micro_batch_tokens", rank, (long long)mt, c->seen_rank,
                       (long long)c->seen_tokens);
    if (c->seen_rank < 0) c->seen_rank = rank, c->seen_tokens = mt;
    if (rank != 0 || !c->info) return 0;
    memset(c->info, 0, sizeof *c->info);
    if (tr_msg_get_int_opt(res, "n_params", &np, err) || tr_msg_get_int_opt(res, "vocab_size", &vocab, err))
        return -1;
    if (tr_msg_has(res, "architecture") &&
        tr_msg_get_str_buf(res, "architecture", c->info->architecture, sizeof c->info->architecture, err))
        return -1;
    if (tr_msg_has(res, "memory")) {
        tr_msg_map mm;
        if (tr_msg_get_map(res, "memory", &mm, err)) return -1;
        for (int i = 0; i < TR_MEM_PARTS; i++)
            if (tr_msg_get_int_opt(&mm, tr_mem_part_names[i], &c->info->memory[i], err)) return -1;
    }
    c->info->n_params = np;
    c->info->vocab_size = (int32_t)vocab;
    c->info->max_tokens = (int32_t)mt;
    c->info->recompute = recompute;
    return 0;
}

int tr_role_init(tr_group *g, const tr_init_args *a, tr_role_info *info, tr_err *err) {
    int32_t tp = a->tp > 0 ? a->tp : 1;
    if (g->world % tp != 0)
        return tr_errf(err, TR_EINVAL, "%s.init: %d ranks do not split into tp %d groups", g->role, g->world, tp);
    g->tp = tp;
    g->train = a->train;
    g->mini_batches = a->loss.mini_batches > 0 ? a->loss.mini_batches : 1;
    init_ctx c = {a, info, -1, 0};
    tr_call call = {.op = "init", .ranks = 0, .build = build_init_ctx, .reply = reply_init, .ctx = &c};
    return tr_group_call(g, &call, err);
}

// ---- generate ----

// A generate call's state: the prompts are read while the requests are built (all of them
// before the call returns or is left in flight), the counts again when the replies come.
typedef struct gen_ctx {
    const tr_prompt_batch *p;   // only while the requests are built
    int32_t n_prompts;
    tr_sampling s;
    int32_t *plen, *group;      // [n]
    tr_rollouts *out;
    int32_t world, tp;
} gen_ctx;

// The share of data-parallel rank rank / tp: every rank of a tensor-parallel group gets the
// same (it computes the same results, which its first rank returns).
static void dp_share(int64_t n, int32_t world, int32_t tp, int32_t rank, int64_t *first, int64_t *count) {
    tr_share(n, world / tp, rank / tp, first, count);
}

static void build_generate(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    gen_ctx *c = ctx;
    const tr_prompt_batch *p = c->p;
    int64_t first, count;
    dp_share(p->n, c->world, c->tp, rank, &first, &count);
    int64_t t0 = p->offset[first], nt = p->offset[first + count] - t0;
    tr_msg_begin_request(w, op, id, 4 + (p->text ? 1 : 0) + (p->meta ? 1 : 0) + 1);
    tr_msg_put_int(w, "index0", first);
    tr_msg_put_tensor(w, "prompt_len", TR_DTYPE_I32, 1, &count, count ? c->plen + first : NULL);
    tr_msg_put_tensor(w, "prompts", TR_DTYPE_I32, 1, &nt, nt ? p->ids + t0 : NULL);
    tr_msg_put_tensor(w, "group", TR_DTYPE_I32, 1, &count, count ? c->group + first : NULL);
    if (p->text) {
        tr_msg_put_array(w, "text", (uint32_t)count);
        for (int64_t i = first; i < first + count; i++) {
            if (p->text[i]) tr_msg_put_str(w, NULL, p->text[i]);
            else tr_msg_put_nil(w, NULL);
        }
    }
    if (p->meta) {
        tr_msg_put_array(w, "meta", (uint32_t)count);
        for (int64_t i = first; i < first + count; i++) tr_msg_put_str(w, NULL, p->meta[i] ? p->meta[i] : "{}");
    }
    const tr_sampling *s = &c->s;
    int64_t ns = s->n_stop, ne = s->n_extra_stop;
    tr_msg_put_map(w, "sampling", 7 + (s->min_new_tokens > 0) + (ne > 0));
    tr_msg_put_int(w, "n", s->n);
    tr_msg_put_int(w, "max_new_tokens", s->max_new_tokens);
    if (s->min_new_tokens > 0) tr_msg_put_int(w, "min_new_tokens", s->min_new_tokens);
    tr_msg_put_float(w, "temperature", s->temperature);
    tr_msg_put_float(w, "top_p", s->top_p);
    tr_msg_put_int(w, "top_k", s->top_k);
    tr_msg_put_uint(w, "seed", s->seed);
    tr_msg_put_tensor(w, "stop_ids", TR_DTYPE_I32, 1, &ns, ns ? s->stop_ids : NULL);
    if (ne > 0) tr_msg_put_tensor(w, "extra_stop_ids", TR_DTYPE_I32, 1, &ne, s->extra_stop_ids);
}

static int reply_generate(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    gen_ctx *c = ctx;
    if (rank % c->tp != 0) return 0;
    int64_t first, count;
    dp_share(c->n_prompts, c->world, c->tp, rank, &first, &count);
    int32_t before = c->out->n;
    if (tr_rollouts_get(res, "rollouts", 0, c->out, err)) return -1;
    if ((int64_t)(c->out->n - before) != count * c->s.n)
        return tr_errf(err, TR_EFORMAT, "%d rollouts for %lld prompts x %d samples", c->out->n - before,
                       (long long)count, c->s.n);
    tr_gen_report *g = c->s.report;
    if (!g || !tr_msg_has(res, "stats")) return 0;
    tr_msg_map st;
    int64_t v[6];
    static const char *const keys[6] = {"prefill_tokens", "decode_tokens", "decode_steps", "waits",
                                        "peak_seqs", "peak_blocks"};
    if (tr_msg_get_map(res, "stats", &st, err)) return -1;
    for (int i = 0; i < 6; i++)
        if (tr_msg_get_int(&st, keys[i], &v[i], err)) return -1;
    g->prefill_tokens += v[0];
    g->decode_tokens += v[1];
    g->decode_steps += v[2];
    g->waits += v[3];
    if (v[4] > g->peak_seqs) g->peak_seqs = v[4];
    if (v[5] > g->peak_blocks) g->peak_blocks = v[5];
    double bytes = 0, seconds = 0, host = 0;
    int64_t graph_steps = 0, padded = 0, entries = 0, rewrites = 0, sent = 0;
    if (tr_msg_get_float_opt(&st, "decode_bytes", &bytes, err) ||
        tr_msg_get_float_opt(&st, "decode_seconds", &seconds, err) ||
        tr_msg_get_float_opt(&st, "host_seconds", &host, err) ||
        tr_msg_get_int_opt(&st, "graph_steps", &graph_steps, err) ||
        tr_msg_get_int_opt(&st, "padded_rows", &padded, err) ||
        tr_msg_get_int_opt(&st, "table_entries", &entries, err) ||
        tr_msg_get_int_opt(&st, "table_rewrites", &rewrites, err) ||
        tr_msg_get_int_opt(&st, "rows_sent", &sent, err))
        return -1;
    g->graph_steps += graph_steps;
    g->padded_rows += padded;
    g->table_entries += entries;
    g->table_rewrites += rewrites;
    g->rows_sent += sent;
    g->decode_bytes += bytes;
    g->decode_seconds += seconds;
    g->host_seconds += host;
    return 0;
}

static void gen_ctx_free(gen_ctx *c) {
    free(c->plen);
    free(c->group);
}

static int gen_ctx_init(gen_ctx *c, tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                        tr_rollouts *out, tr_err *err) {
    memset(c, 0, sizeof *c);
    if (prompts->n < 0 || s->n < 1 || s->n_stop < 0 || s->n_stop > 8 || s->n_extra_stop < 0 ||
        (s->n_extra_stop > 0 && !s->extra_stop_ids))
        return tr_errf(err, TR_EINVAL, "%s.generate: %d prompts x %d samples, %d stop ids, %d extra", g->role,
                       prompts->n, s->n, s->n_stop, s->n_extra_stop);
    size_t n = prompts->n ? (size_t)prompts->n : 1;
    *c = (gen_ctx){prompts, prompts->n, *s, malloc(n * sizeof(int32_t)), malloc(n * sizeof(int32_t)), out, g->world,
                   g->tp > 0 ? g->tp : 1};
    if (!c->plen || !c->group) {
        gen_ctx_free(c);
        return tr_errf(err, TR_ENOMEM, "%s.generate: out of memory", g->role);
    }
    for (int32_t i = 0; i < prompts->n; i++) {
        c->plen[i] = (int32_t)(prompts->offset[i + 1] - prompts->offset[i]);
        c->group[i] = prompts->group ? prompts->group[i] : i;
    }
    return 0;
}

int tr_policy_generate(tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                       tr_rollouts *out, tr_err *err) {
    gen_ctx c;
    if (gen_ctx_init(&c, g, prompts, s, out, err)) return -1;
    tr_call call = {.op = "generate", .ranks = 0, .build = build_generate, .reply = reply_generate, .ctx = &c};
    int rc = tr_group_call(g, &call, err);
    gen_ctx_free(&c);
    return rc;
}

struct tr_generate_call {
    gen_ctx c;
    tr_inflight *f;
};

int tr_generate_start(tr_group *g, const tr_prompt_batch *prompts, const tr_sampling *s,
                      tr_rollouts *out, tr_generate_call **call, tr_err *err) {
    *call = NULL;
    tr_generate_call *gc = calloc(1, sizeof *gc);
    if (!gc) return tr_errf(err, TR_ENOMEM, "%s.generate: out of memory", g->role);
    if (gen_ctx_init(&gc->c, g, prompts, s, out, err)) {
        free(gc);
        return -1;
    }
    tr_call c = {.op = "generate", .ranks = 0, .build = build_generate, .reply = reply_generate, .ctx = &gc->c};
    if (tr_group_call_start(&g, &c, 1, &gc->f, err)) {
        tr_generate_abandon(gc);
        return -1;
    }
    gc->c.p = NULL;  // every request is built and sent
    *call = gc;
    return 0;
}

int tr_generate_finish(tr_generate_call *call, tr_err *err) {
    int rc = tr_group_call_finish(call->f, err);
    call->f = NULL;
    tr_generate_abandon(call);
    return rc;
}

void tr_generate_abandon(tr_generate_call *call) {
    if (!call) return;
    tr_group_call_abandon(call->f);
    gen_ctx_free(&call->c);
    free(call);
}

// ---- per-sequence ops: logprobs, values, score ----

typedef struct seq_ctx {
    const tr_rollouts *r;
    int32_t world, tp;
    const char *key;      // result tensor aligned with tokens ("logprobs", "values")
    float *out;
    float *entropy;       // logprobs only, may be NULL
    float *scores;        // score: per sequence
    int64_t base;         // score: the index of r's first sequence, for the worker's messages
    int64_t failures;
} seq_ctx;

static void build_seq(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    seq_ctx *c = ctx;
    int64_t first, count;
    dp_share(c->r->n, c->world, c->tp, rank, &first, &count);
    bool score = c->scores != NULL, lp = strcmp(op, "logprobs") == 0;
    tr_msg_begin_request(w, op, id, lp || score ? 2 : 1);
    tr_rollouts_put(w, "rollouts", c->r, (int32_t)first, (int32_t)count, score ? TR_RO_TEXT : 0);
    if (lp) tr_msg_put_bool(w, "entropy", c->entropy != NULL);
    if (score) tr_msg_put_int(w, "first", c->base + first);
}

static int reply_seq(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    seq_ctx *c = ctx;
    if (rank % c->tp != 0) return 0;
    int64_t first, count;
    dp_share(c->r->n, c->world, c->tp, rank, &first, &count);
    if (c->scores) {
        int64_t f = 0;
        if (tr_token_floats_get(res, "scores", count, c->scores + first, err) ||
            tr_msg_get_int_opt(res, "failures", &f, err))
            return -1;
        c->failures += f;
        return 0;
    }
    int64_t t0 = c->r->offset[first], nt = c->r->offset[first + count] - t0;
    if (tr_token_floats_get(res, c->key, nt, c->out + t0, err)) return -1;
    if (c->entropy && tr_token_floats_get(res, "entropy", nt, c->entropy + t0, err)) return -1;
    return 0;
}

int tr_model_logprobs(tr_group *g, const tr_rollouts *r, float *logprobs, float *entropy,
                      tr_err *err) {
    seq_ctx c = {.r = r, .world = g->world, .tp = g->tp > 0 ? g->tp : 1, .key = "logprobs", .out = logprobs,
                 .entropy = entropy};
    tr_call call = {.op = "logprobs", .ranks = 0, .build = build_seq, .reply = reply_seq, .ctx = &c};
    return tr_group_call(g, &call, err);
}

int tr_critic_values(tr_group *g, const tr_rollouts *r, float *values, tr_err *err) {
    seq_ctx c = {.r = r, .world = g->world, .tp = g->tp > 0 ? g->tp : 1, .key = "values", .out = values};
    tr_call call = {.op = "values", .ranks = 0, .build = build_seq, .reply = reply_seq, .ctx = &c};
    return tr_group_call(g, &call, err);
}

int tr_reward_score(tr_group *g, const tr_rollouts *r, int64_t first, float *scores, int64_t *failures,
                    tr_err *err) {
    seq_ctx c = {.r = r, .world = g->world, .tp = g->tp > 0 ? g->tp : 1, .scores = scores, .base = first};
    tr_call call = {.op = "score", .ranks = 0, .build = build_seq, .reply = reply_seq, .ctx = &c};
    int rc = tr_group_call(g, &call, err);
    if (!rc && failures) *failures = c.failures;
    return rc;
}

// ---- save, load, sync_weights, shutdown ----

static void build_dir(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    tr_msg_begin_request(w, op, id, 1);
    tr_msg_put_str(w, "dir", ctx);
}

int tr_role_save(tr_group *g, const char *dir, tr_err *err) {
    // Every rank takes part: rank 0 writes the weights (gathered from its tensor-parallel
    // group), each rank its optimizer shard.
    tr_call call = {.op = "save", .ranks = 0, .build = build_dir, .reply = NULL, .ctx = (void *)dir};
    return tr_group_call(g, &call, err);
}

int tr_role_load(tr_group *g, const char *dir, tr_err *err) {
    tr_call call = {.op = "load", .ranks = 0, .build = build_dir, .reply = NULL, .ctx = (void *)dir};
    return tr_group_call(g, &call, err);
}

static void build_empty(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ctx;
    (void)rank;
    (void)ranks;
    tr_msg_begin_request(w, op, id, 0);
}

static int reply_sync(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    bool s = false;
    if (tr_msg_get_bool(res, "synced", &s, err)) return -1;
    if (rank == 0 && ctx) *(bool *)ctx = s;
    return 0;
}

int tr_policy_sync_weights(tr_group *g, bool *synced, tr_err *err) {
    tr_call call = {.op = "sync_weights", .ranks = 0, .build = build_empty, .reply = reply_sync, .ctx = synced};
    return tr_group_call(g, &call, err);
}

typedef struct sync_ctx {
    int64_t bucket_bytes;
    bool verify;
    int32_t gen_tp;            // ranks of each generator replica
    uint64_t sent, got;        // checksums: the senders' sum, the current replica's so far
    tr_sync_stats *st;
} sync_ctx;

static void build_sync(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const sync_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 2);
    tr_msg_put_int(w, "bucket_bytes", c->bucket_bytes);
    tr_msg_put_bool(w, "verify", c->verify);
}

static int sync_result(const sync_ctx *c, const tr_msg_map *res, int64_t *version, uint64_t *sum, tr_err *err) {
    bool synced = false;
    if (tr_msg_get_bool(res, "synced", &synced, err) || tr_msg_get_int(res, "version", version, err)) return -1;
    if (!synced) return tr_errf(err, TR_EPEER, "sync_weights: the weights were not sent (no sync communicator)");
    return c->verify ? tr_msg_get_uint(res, "checksum", sum, err) : 0;
}

// The policy's replies come first (its group is the first of the call): its rank 0's are the
// sync's figures, and every sending rank adds its part of the checksum.
static int reply_sync_policy(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    sync_ctx *c = ctx;
    tr_sync_stats *st = c->st;
    int64_t version, bytes, buckets;
    uint64_t sum = 0;
    if (sync_result(c, res, &version, &sum, err)) return -1;
    c->sent += sum;
    if (rank > 0) return version == st->version ? 0 : tr_errf(err, TR_EPEER, "sync_weights: sent step %lld, rank 0 "
                                                              "step %lld", (long long)version, (long long)st->version);
    st->version = version;
    if (tr_msg_get_int(res, "bytes", &bytes, err) || tr_msg_get_int(res, "buckets", &buckets, err) ||
        tr_msg_get_float(res, "seconds", &st->seconds, err))
        return -1;
    st->bytes = bytes;
    st->buckets = (int32_t)buckets;
    return 0;
}

// Each generator replica's ranks add up to the senders' checksum (resync.h: the sum does
// not depend on the layout).
static int reply_sync_generator(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    sync_ctx *c = ctx;
    int64_t version;
    uint64_t sum = 0;
    if (sync_result(c, res, &version, &sum, err)) return -1;
    if (version != c->st->version)
        return tr_errf(err, TR_EPEER, "sync_weights: received the weights of step %lld, the policy sent step %lld",
                       (long long)version, (long long)c->st->version);
    c->got = rank % c->gen_tp == 0 ? sum : c->got + sum;
    if (c->verify && rank % c->gen_tp == c->gen_tp - 1 && c->got != c->sent)
        return tr_errf(err, TR_EPEER, "sync_weights: the weights of generator replica %d (ranks %d..%d) have the "
                       "checksum %016llx, the policy's %016llx", rank / c->gen_tp, rank - c->gen_tp + 1, rank,
                       (unsigned long long)c->got, (unsigned long long)c->sent);
    return 0;
}

int tr_weights_sync(tr_group *policy, tr_group *generator, int64_t bucket_bytes, bool verify,
                    tr_sync_stats *out, tr_err *err) {
    memset(out, 0, sizeof *out);
    sync_ctx c = {.bucket_bytes = bucket_bytes, .verify = verify, .gen_tp = generator->tp > 0 ? generator->tp : 1,
                  .st = out};
    tr_group *gs[2] = {policy, generator};
    // The senders: the policy's dp rank 0, every rank of its tensor-parallel group.
    tr_call calls[2] = {
        {.op = "sync_weights", .ranks = policy->tp > 0 ? policy->tp : 1, .build = build_sync,
         .reply = reply_sync_policy, .ctx = &c},
        {.op = "sync_weights", .ranks = 0, .build = build_sync, .reply = reply_sync_generator, .ctx = &c},
    };
    if (tr_group_call_many(gs, calls, 2, err)) return -1;
    out->verified = verify;
    out->checksum = c.sent;
    return 0;
}

int tr_group_shutdown(tr_group *g, tr_err *err) {
    tr_call call = {.op = "shutdown", .build = build_empty, .best_effort = true};
    return tr_group_call(g, &call, err);
}
