// The worker arena: its one allocation, the sizing rule of arena.h, and the phases that lend
// the region to one model (and its generator) at a time by laying their views out over it.
#include "engine/arena.h"

#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

void tr_arena_need_init(tr_arena_need *n, const tr_model_config *cfg, const tr_model_opts *mo,
                        const tr_gen_opts *go, tr_dt act) {
    tr_model_opts o = *mo;
    o.acts = NULL;
    o.acts_bytes = 0;
    o.training = false;
    n->forward = tr_model_arena_bytes(cfg, &o, act);
    o.training = true;
    n->train = mo->training ? tr_model_arena_bytes(cfg, &o, act) : 0;
    // The KV cache holds this tensor-parallel rank's key/value heads.
    tr_tp tp;
    tr_err err;
    tr_model_config local = *cfg;
    if (mo->tp_size > 1 && tr_tp_init(&tp, cfg, mo->tp_size, mo->tp_rank, &err) == 0)
        local = tr_tp_local_config(cfg, &tp);
    n->kv = go ? tr_generator_kv_bytes(&local, go, act) : 0;
}

size_t tr_arena_need_bytes(const tr_arena_need *n) {
    size_t gen = n->forward + n->kv;
    return n->train > gen ? n->train : gen;
}

size_t tr_arena_separate_bytes(const tr_arena_need *n) {
    return (n->train ? n->train : n->forward) + n->kv;
}

int tr_arena_init(tr_arena *a, tr_backend *be, size_t bytes, tr_err *err) {
    memset(a, 0, sizeof *a);
    a->be = be;
    return tr_arena_reserve(a, bytes, err);
}

int tr_arena_reserve(tr_arena *a, size_t bytes, tr_err *err) {
    if (bytes <= a->bytes) return 0;
    if (a->phase != TR_PHASE_IDLE)
        return tr_errf(err, TR_EINVAL, "arena: cannot grow to %zu bytes during a %s phase",
                       bytes, tr_arena_phase_name(a->phase));
    if (bytes > SIZE_MAX - 64)
        return tr_errf(err, TR_ERANGE, "arena: %zu bytes is too many", bytes);
    size_t n = (bytes + 63) / 64 * 64;
    // The old region goes first: its contents are dropped anyway, and on a GPU both at once
    // might not fit.
    tr_dev_free(a->be, a->base);
    a->base = NULL;
    a->bytes = 0;
    void *p = tr_dev_zalloc(a->be, n, "arena (activations and KV cache)", err);
    if (!p) return -1;
    a->base = p;
    a->bytes = n;
    return 0;
}

void tr_arena_free(tr_arena *a) {
    if (a->be) tr_dev_free(a->be, a->base);
    memset(a, 0, sizeof *a);
}

void tr_arena_adopt(tr_arena *a, tr_model *m) {
    m->shared = a;
    m->shared_epoch = 0;   // no phase has epoch 0: the model waits for its first phase
}

size_t tr_arena_kv_offset(const tr_model *m) {
    return tr_model_acts_bytes(m, false);
}

const char *tr_arena_phase_name(tr_arena_phase p) {
    switch (p) {
    case TR_PHASE_IDLE: return "idle";
    case TR_PHASE_FORWARD: return "forward";
    case TR_PHASE_TRAIN: return "train";
    case TR_PHASE_GENERATE: return "generate";
    }
    return "unknown";
}

static int begin(tr_arena *a, tr_model *m, tr_arena_phase phase, size_t need, tr_err *err) {
    if (a->phase != TR_PHASE_IDLE)
        return tr_errf(err, TR_EINVAL, "arena: a %s phase cannot begin while a %s phase holds "
                       "the region", tr_arena_phase_name(phase), tr_arena_phase_name(a->phase));
    if (need > a->bytes)
        return tr_errf(err, TR_EINVAL, "arena: the %s phase needs %zu bytes, the region has "
                       "%zu", tr_arena_phase_name(phase), need, a->bytes);
    a->phase = phase;
    a->holder = m;
    a->epoch++;
    m->shared = a;
    m->shared_epoch = a->epoch;
    return 0;
}

int tr_arena_begin_forward(tr_arena *a, tr_model *m, tr_err *err) {
    if (begin(a, m, TR_PHASE_FORWARD, tr_model_acts_bytes(m, false), err) != 0) return -1;
    if (tr_model_bind_acts(m, a->base, a->bytes, false, err) != 0) {
        tr_arena_end(a);
        return -1;
    }
    return 0;
}

int tr_arena_begin_train(tr_arena *a, tr_model *m, tr_err *err) {
    if (!m->training)
        return tr_errf(err, TR_EINVAL, "arena: a train phase needs a model set up for training");
    if (begin(a, m, TR_PHASE_TRAIN, tr_model_acts_bytes(m, true), err) != 0) return -1;
    if (tr_model_bind_acts(m, a->base, a->bytes, true, err) != 0) {
        tr_arena_end(a);
        return -1;
    }
    return 0;
}

int tr_arena_begin_generate(tr_arena *a, tr_generator *g, tr_err *err) {
    tr_model *m = g->model;
    const tr_kvcache *c = &g->cache;
    size_t off = tr_arena_kv_offset(m);
    size_t kv = c->owns_pool ? 0
                : tr_kvcache_pool_bytes(&m->lcfg, c->block_size, (int64_t)c->n_blocks * c->block_size,
                                        c->dt);
    if (begin(a, m, TR_PHASE_GENERATE, off + kv, err) != 0) return -1;
    // The model's views end where the KV blocks start, so no pass can write into them.
    if (tr_model_bind_acts(m, a->base, off, false, err) != 0) {
        tr_arena_end(a);
        return -1;
    }
    tr_kvcache_rebind(&g->cache, c->owns_pool ? NULL : (char *)a->base + off);
    g->n_active = 0;
    g->reserved = 0;
    g->shared = a;
    g->shared_epoch = a->epoch;
    return 0;
}

void tr_arena_end(tr_arena *a) {
    a->phase = TR_PHASE_IDLE;
    a->holder = NULL;
}
