// The memory plan (plan.h): fixed parts from the model's layout and arena formulas, then the
// KV cache from what is left, in whole blocks.
#include "engine/plan.h"

#include <stdio.h>
#include <string.h>

#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/params.h"

const char *const tr_recompute_names[] = {[TR_RECOMPUTE_AUTO] = "auto", [TR_RECOMPUTE_OFF] = "off",
                                           [TR_RECOMPUTE_ON] = "on", NULL};

int tr_recompute_parse(const char *name) {
    for (int i = 0; tr_recompute_names[i]; i++)
        if (strcmp(name, tr_recompute_names[i]) == 0) return i;
    return -1;
}

static double mib(size_t b) { return (double)b / (1 << 20); }

// Bytes of a KV cache of `tokens` tokens (whole blocks, K and V, every layer).
static size_t kv_bytes(const tr_model_config *cfg, int32_t bs, int64_t tokens, tr_dt act) {
    return tokens > 0 ? tr_kvcache_pool_bytes(cfg, bs, tokens, act) : 0;
}

// The arena's training and forward sizes for mo's tokens, recompute and logit rows (0: the
// model's default).
static void arena_sizes(tr_backend *be, const tr_plan_req *r, tr_model_opts *mo, tr_plan *p) {
    mo->training = false;
    p->arena_forward = tr_model_arena_bytes(r->cfg, mo, be->act);
    mo->training = true;
    p->arena_train = r->training ? tr_model_arena_bytes(r->cfg, mo, be->act) : 0;
    mo->training = false;
    p->logit_rows = tr_model_logit_rows(r->cfg, mo);
}

static size_t arena_max(const tr_plan *p) {
    return p->arena_train > p->arena_forward ? p->arena_train : p->arena_forward;
}

// Sets mo's and p's tokens per forward and recompute (tr_plan.max_tokens says how) within
// `room` bytes of activations, and the arena sizes that go with them. When nothing fits it
// leaves the smallest choice, for the caller's check to name the parts.
static void choose_tokens(tr_backend *be, const tr_plan_req *r, size_t room, tr_model_opts *mo,
                          tr_plan *p) {
    int32_t lo = r->min_tokens > 0 ? r->min_tokens : 1, hi = r->max_tokens;
    if (hi <= 0) {
        hi = r->max_tokens_want > 0 && r->max_tokens_want < TR_PLAN_MAX_TOKENS
                 ? r->max_tokens_want : TR_PLAN_MAX_TOKENS;
        if (hi < lo) hi = lo;
    } else {
        lo = hi;
    }
    // Recompute costs a forward per step: every size without it is tried first.
    bool tries[2] = {r->recompute != TR_RECOMPUTE_ON, r->training && r->recompute != TR_RECOMPUTE_OFF};
    for (int with = 0; with < 2; with++) {
        if (!tries[with]) continue;
        mo->recompute = with == 1;
        for (int32_t t = hi;; t = t / 2 > lo ? t / 2 : lo) {
            mo->max_tokens = t;
            arena_sizes(be, r, mo, p);
            if (arena_max(p) <= room) goto done;
            if (t == lo) break;
        }
    }
    mo->max_tokens = lo;
    mo->recompute = tries[1];
    arena_sizes(be, r, mo, p);
done:
    p->max_tokens = mo->max_tokens;
    p->recompute = mo->recompute;
}

// Widens the LM head's chunk (tr_plan.logit_rows says why) within `spare` bytes. A row costs
// the same in every layout, so its price is the difference of two arena sizes.
static void widen_logit_rows(tr_backend *be, const tr_plan_req *r, tr_model_opts *mo,
                             size_t spare, tr_plan *p) {
    if (r->logit_rows > 0 || r->cfg->head != TR_HEAD_LM || p->logit_rows >= p->max_tokens) return;
    // Vocab-parallel ranks must chunk alike, and each plans from its own device's room: they
    // keep the default, which depends on the model alone.
    if (r->tp_size > 1) return;
    tr_model_opts one = *mo;
    one.training = r->training;   // the larger layout: a trained head keeps d_logits too
    one.logit_rows = 1;
    size_t base = tr_model_arena_bytes(r->cfg, &one, be->act);
    one.logit_rows = 2;
    size_t row = tr_model_arena_bytes(r->cfg, &one, be->act) - base;
    if (row == 0) return;
    size_t fit = (spare / 8) / row;
    if (fit <= (size_t)p->logit_rows) return;
    mo->logit_rows = fit < (size_t)p->max_tokens ? (int32_t)fit : p->max_tokens;
    arena_sizes(be, r, mo, p);
}

int tr_plan_make(tr_backend *be, const tr_plan_req *r, tr_plan *p, tr_err *err) {
    *p = (tr_plan){0};
    tr_tp tp;
    if (tr_tp_init(&tp, r->cfg, r->tp_size > 0 ? r->tp_size : 1, r->tp_size > 1 ? r->tp_rank : 0,
                   err) != 0)
        return tr_err_wrap(err, "memory plan");
    // Per-layer shapes (the KV cache) are the rank's; the model's own config sizes the rest.
    const tr_model_config local = tr_tp_local_config(r->cfg, &tp), *cfg = &local;
    tr_param_layout lay;
    if (tr_param_layout_init_tp(&lay, r->cfg, &tp, err) != 0) return tr_err_wrap(err, "memory plan");
    size_t pbytes = lay.total * sizeof(float);
    size_t wbytes = lay.total * tr_dt_size(be->wt);
    tr_param_layout_free(&lay);
    // fp32 masters where the model trains (or they are the working weights), plus the
    // working copy when it is narrower (tr_model_init); shared working weights are apart from
    // the masters, and a reader's are the trainer's.
    bool shared = r->share_buffers > 0 || r->share_reader;
    p->masters = r->training || (be->wt == TR_F32 && !shared) ? pbytes : 0;
    p->work = r->share_reader ? 0 : r->share_buffers > 0 ? (size_t)r->share_buffers * wbytes
                                                          : be->wt == TR_F32 ? 0 : wbytes;
    p->weights = p->masters + p->work;
    p->grads = r->training ? pbytes : 0;
    size_t shards = r->optim_shards > 1 ? (size_t)r->optim_shards : 1;
    p->optim = r->training ? 2 * ((pbytes + shards - 1) / shards) : 0;
    tr_model_opts mo = {.max_tokens = r->max_tokens, .training = false, .tp_size = tp.size,
                        .tp_rank = tp.rank, .logit_rows = r->logit_rows,
                        .sequence_parallel = r->sequence_parallel};
    size_t free_b = 0, total_b = 0;
    be->ops->mem_info(be, &free_b, &total_b);
    p->budget = r->budget > 0 ? r->budget : free_b;
    // Left to the backend itself: library workspaces, the CUDA context's growth, staging.
    p->reserve = p->budget / 32 > ((size_t)256 << 20) ? p->budget / 32 : (size_t)256 << 20;
    if (p->reserve > p->budget / 4) p->reserve = p->budget / 4;
    size_t fixed = p->weights + p->grads + p->optim;
    size_t usable = p->budget - p->reserve;
    size_t left = usable > fixed ? usable - fixed : 0;
    choose_tokens(be, r, r->max_tokens > 0 ? left : left / 2, &mo, p);
    size_t arena_min = arena_max(p);
    if (fixed + arena_min > usable)
        return tr_errf(err, TR_ENOMEM, "memory plan: weights %.1f MiB + gradients %.1f MiB + "
                       "optimizer %.1f MiB + activations %.1f MiB (%d tokens per forward%s) = "
                       "%.1f MiB, more than the %.1f MiB %s has (%.1f MiB kept back for the "
                       "backend); lower the tokens per micro-batch or use more devices",
                       mib(p->weights), mib(p->grads), mib(p->optim), mib(arena_min),
                       p->max_tokens, p->recompute ? ", with recompute" : "",
                       mib(fixed + arena_min), mib(p->budget),
                       r->budget > 0 ? "the budget" : "the device", mib(p->reserve));
    widen_logit_rows(be, r, &mo, usable - fixed - arena_min, p);
    arena_min = arena_max(p);
    int32_t bs = r->block_size > 0 ? r->block_size : 16;
    if (r->generate) {
        if (r->kv_tokens > 0) {
            p->kv_tokens = r->kv_tokens;
        } else {
            // The arena holds max(train, forward + kv): KV beyond what training's activations
            // leave free costs memory, so the tokens grow while the total fits.
            int64_t want = r->kv_want > 0 ? r->kv_want : bs;
            int64_t lo = 0, hi = want;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo + 1) / 2;
                size_t fwd_kv = p->arena_forward + kv_bytes(cfg, bs, mid, be->act);
                size_t arena = fwd_kv > p->arena_train ? fwd_kv : p->arena_train;
                if (fixed + arena <= usable) lo = mid;
                else hi = mid - 1;
            }
            p->kv_tokens = lo / bs * bs;
            if (p->kv_tokens < bs)
                return tr_errf(err, TR_ENOMEM, "memory plan: no room for a KV cache of one %d-token "
                               "block after weights, gradients, optimizer and activations "
                               "(%.1f of %.1f MiB)", bs, mib(fixed + arena_min), mib(usable));
        }
        p->kv = kv_bytes(cfg, bs, p->kv_tokens, be->act);
        int32_t seqs = r->max_seqs > 0 ? r->max_seqs : r->max_seqs_want > 0 ? r->max_seqs_want : 1;
        if (seqs > p->max_tokens) seqs = p->max_tokens;
        p->max_seqs = seqs;
    }
    size_t fwd_kv = p->arena_forward + p->kv;
    p->arena = fwd_kv > p->arena_train ? fwd_kv : p->arena_train;
    p->total = fixed + p->arena;
    if (p->total > usable)
        return tr_errf(err, TR_ENOMEM, "memory plan: %.1f MiB (weights %.1f, gradients %.1f, "
                       "optimizer %.1f, arena %.1f with a %lld-token KV cache of %.1f) exceeds "
                       "the %.1f MiB available", mib(p->total), mib(p->weights), mib(p->grads),
                       mib(p->optim), mib(p->arena), (long long)p->kv_tokens, mib(p->kv),
                       mib(usable));
    return 0;
}

void tr_plan_format(const tr_plan *p, char *buf, size_t cap) {
    snprintf(buf, cap,
             "  micro-batch    %10d tokens a forward%s\n"
             "  weights        %10.1f MiB  (fp32 masters %.1f, working copy %.1f)\n"
             "  gradients      %10.1f MiB\n"
             "  optimizer      %10.1f MiB  (Adam moments)\n"
             "  arena          %10.1f MiB  = max(train %.1f, forward %.1f + KV %.1f)\n"
             "  KV cache       %10lld tokens, %d sequences decoding together\n"
             "  LM head        %10d logit rows a chunk\n"
             "  total          %10.1f MiB of %.1f MiB (%.1f kept back for the backend)\n",
             p->max_tokens, p->recompute ? ", activations recomputed in backward" : "",
             mib(p->weights), mib(p->masters), mib(p->work), mib(p->grads), mib(p->optim),
             mib(p->arena), mib(p->arena_train),
             mib(p->arena_forward), mib(p->kv), (long long)p->kv_tokens, p->max_seqs,
             p->logit_rows,
             mib(p->total), mib(p->budget), mib(p->reserve));
}
