// The communicator handle: picks the implementation from the backend (shared memory for cpu,
// NCCL for cuda) or from the id's prefix, checks every collective's arguments once for both
// implementations, and names the communicator, rank and collective in every error.
#include "engine/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm_impl.h"
#include "engine/device.h"
#include "tr_build_config.h"

void tr_comm_base_init(tr_comm *c, const tr_comm_vt *vt, const tr_comm_opts *o) {
    c->vt = vt;
    c->be = o->be;
    c->rank = o->rank;
    c->world = o->world;
    snprintf(c->name, sizeof c->name, "%s", o->name && o->name[0] ? o->name : "comm");
    c->peer_timeout_ms = o->peer_timeout_ms > 0 ? o->peer_timeout_ms : 5000;
    c->op_timeout_ms = o->op_timeout_ms > 0 ? o->op_timeout_ms : 600000;
    c->stop = o->stop;
    c->joined = c->ready = false;
}

size_t tr_comm_dtype_size(enum tr_comm_dtype t) {
    return t == TR_COMM_F32 ? 4 : t == TR_COMM_BF16 ? 2 : 8;
}

const char *tr_comm_dtype_name(enum tr_comm_dtype t) {
    return t == TR_COMM_F32 ? "f32" : t == TR_COMM_F64 ? "f64" : t == TR_COMM_BF16 ? "bf16" : "i64";
}

// Sums of bf16 would round at every rank: the weights' working copy only moves.
static int summable(tr_comm *c, enum tr_comm_op op, enum tr_comm_dtype t, tr_err *err) {
    if (t != TR_COMM_BF16) return 0;
    return tr_errf(err, TR_EINVAL, "communicator %s rank %d: %s of bf16 (only broadcast and "
                   "all-gather move bf16)", c->name, c->rank, tr_comm_op_name(op));
}

const char *tr_comm_op_name(enum tr_comm_op op) {
    static const char *const names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                        "barrier"};
    return names[op];
}

static int check_opts(const tr_comm_opts *o, tr_err *err) {
    if (!o->be || !o->be->ops)
        return tr_errf(err, TR_EINVAL, "communicator: no backend");
    if (o->world < 1 || o->world > TR_COMM_MAX_RANKS || o->rank < 0 || o->rank >= o->world)
        return tr_errf(err, TR_EINVAL, "communicator %s: rank %d of %d (1..%d ranks)",
                       o->name ? o->name : "comm", o->rank, o->world, TR_COMM_MAX_RANKS);
    return 0;
}

static bool is_cuda(const tr_backend *be) {
    return strcmp(be->ops->name, "cuda") == 0;
}

int tr_comm_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err) {
    *out = NULL;
    if (check_opts(o, err)) return -1;
    if (o->rank != 0)
        return tr_errf(err, TR_EINVAL, "communicator %s: rank %d cannot create it (rank 0 does)",
                       o->name ? o->name : "comm", o->rank);
    if (is_cuda(o->be)) {
#if TR_HAVE_CUDA
        return tr_comm_nccl_create(out, o, id, cap, err);
#else
        (void)id;
        (void)cap;
        return tr_errf(err, TR_EUNSUPPORTED, "communicator: NCCL is not in this build");
#endif
    }
    return tr_comm_shm_create(out, o, id, cap, err);
}

int tr_comm_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err) {
    *out = NULL;
    if (check_opts(o, err)) return -1;
    const char *want = is_cuda(o->be) ? "nccl:" : "shm:";
    if (strncmp(id, want, strlen(want)) != 0)
        return tr_errf(err, TR_EINVAL, "communicator %s: rank %d on the %s backend cannot join "
                       "'%.40s' (a %s id is needed): every rank of a group runs one backend",
                       o->name ? o->name : "comm", o->rank, o->be->ops->name, id, want);
    if (is_cuda(o->be)) {
#if TR_HAVE_CUDA
        return tr_comm_nccl_open(out, o, id, err);
#else
        return tr_errf(err, TR_EUNSUPPORTED, "communicator: NCCL is not in this build");
#endif
    }
    return tr_comm_shm_open(out, o, id, err);
}

int tr_comm_join(tr_comm *c, tr_err *err) {
    if (c->joined) return 0;
    if (c->vt->join(c, err)) return tr_err_wrap(err, "communicator %s rank %d: join", c->name, c->rank);
    c->joined = true;
    return 0;
}

int tr_comm_wait(tr_comm *c, int timeout_ms, tr_err *err) {
    if (!c->joined)
        return tr_errf(err, TR_EINVAL, "communicator %s rank %d: wait before join", c->name, c->rank);
    if (c->ready) return 0;
    if (c->vt->wait(c, timeout_ms, err)) {
        c->vt->abort(c, err->msg);
        return tr_err_wrap(err, "communicator %s rank %d: joining %d ranks", c->name, c->rank, c->world);
    }
    c->ready = true;
    return 0;
}

void tr_comm_free(tr_comm *c) {
    if (c) c->vt->free(c);
}

int32_t tr_comm_rank(const tr_comm *c) { return c->rank; }
int32_t tr_comm_world(const tr_comm *c) { return c->world; }
const char *tr_comm_kind(const tr_comm *c) { return c->vt->kind; }

void tr_comm_abort(tr_comm *c, const char *why) {
    if (c) c->vt->abort(c, why ? why : "aborted");
}

bool tr_comm_dead(tr_comm *c) {
    return c->vt->dead(c);
}

static int run(tr_comm *c, const tr_comm_call *call, tr_err *err) {
    const char *op = tr_comm_op_name(call->op);
    if (!c->ready)
        return tr_errf(err, TR_EINVAL, "communicator %s rank %d: %s before every rank joined", c->name,
                       c->rank, op);
    if (call->op != TR_COMM_OP_BARRIER && call->n > 0 && !call->buf)
        return tr_errf(err, TR_EINVAL, "communicator %s rank %d: %s of %zu elements without a buffer",
                       c->name, c->rank, op, call->n);
    if (c->vt->run(c, call, err)) {
        // One failed rank must not leave the others waiting: the failure aborts them all.
        c->vt->abort(c, err->msg);
        if (call->op == TR_COMM_OP_BARRIER) return tr_err_wrap(err, "communicator %s rank %d: %s", c->name, c->rank, op);
        return tr_err_wrap(err, "communicator %s rank %d: %s of %zu %s", c->name, c->rank, op, call->n,
                           tr_comm_dtype_name(call->dtype));
    }
    return 0;
}

int tr_comm_all_reduce(tr_comm *c, void *buf, size_t n, enum tr_comm_dtype t, tr_err *err) {
    tr_comm_call call = {.op = TR_COMM_OP_ALL_REDUCE, .buf = buf, .n = n, .dtype = t};
    if (summable(c, call.op, t, err)) return -1;
    return run(c, &call, err);
}

static int sum_counts(tr_comm *c, const size_t *counts, enum tr_comm_op op, size_t *n, tr_err *err) {
    *n = 0;
    if (!counts)
        return tr_errf(err, TR_EINVAL, "communicator %s rank %d: %s without counts", c->name, c->rank,
                       tr_comm_op_name(op));
    for (int32_t r = 0; r < c->world; r++) *n += counts[r];
    return 0;
}

int tr_comm_reduce_scatter(tr_comm *c, void *buf, const size_t *counts, enum tr_comm_dtype t,
                           tr_err *err) {
    tr_comm_call call = {.op = TR_COMM_OP_REDUCE_SCATTER, .buf = buf, .counts = counts, .dtype = t};
    if (summable(c, call.op, t, err) || sum_counts(c, counts, call.op, &call.n, err)) return -1;
    return run(c, &call, err);
}

int tr_comm_all_gather(tr_comm *c, void *buf, const size_t *counts, enum tr_comm_dtype t,
                       tr_err *err) {
    tr_comm_call call = {.op = TR_COMM_OP_ALL_GATHER, .buf = buf, .counts = counts, .dtype = t};
    if (sum_counts(c, counts, call.op, &call.n, err)) return -1;
    return run(c, &call, err);
}

int tr_comm_broadcast(tr_comm *c, void *buf, size_t n, enum tr_comm_dtype t, int32_t root,
                      tr_err *err) {
    if (root < 0 || root >= c->world)
        return tr_errf(err, TR_EINVAL, "communicator %s rank %d: broadcast from rank %d of %d", c->name,
                       c->rank, root, c->world);
    tr_comm_call call = {.op = TR_COMM_OP_BROADCAST, .buf = buf, .n = n, .dtype = t, .root = root};
    return run(c, &call, err);
}

int tr_comm_barrier(tr_comm *c, tr_err *err) {
    tr_comm_call call = {.op = TR_COMM_OP_BARRIER, .dtype = TR_COMM_F32};
    return run(c, &call, err);
}

int tr_comm_min_i64(tr_comm *c, int64_t *v, int32_t n, tr_err *err) {
    if (n < 1) return 0;
    const int32_t R = c->world;
    size_t counts[TR_COMM_MAX_RANKS] = {0}, all = (size_t)R * (size_t)n;
    for (int32_t r = 0; r < R; r++) counts[r] = (size_t)n;
    int64_t *dev = tr_dev_alloc(c->be, all * sizeof *dev, "agreeing over a communicator", err);
    int64_t *host = dev ? malloc(all * sizeof *host) : NULL;
    int rc = dev ? 0 : -1;
    if (dev && !host) rc = tr_errf(err, TR_ENOMEM, "agreeing over a communicator: out of memory");
    if (!rc) rc = tr_dev_upload_sync(c->be, dev + (size_t)c->rank * (size_t)n, v, (size_t)n * sizeof *v,
                                     "agreeing over a communicator", err);
    if (!rc) rc = tr_comm_all_gather(c, dev, counts, TR_COMM_I64, err);
    if (!rc) rc = tr_dev_download_sync(c->be, host, dev, all * sizeof *host, "agreeing over a communicator", err);
    for (int32_t r = 0; !rc && r < R; r++)
        for (int32_t i = 0; i < n; i++)
            if (host[(size_t)r * n + i] < v[i]) v[i] = host[(size_t)r * n + i];
    tr_dev_free(c->be, dev);
    free(host);
    return rc;
}

size_t tr_comm_shard_begin(size_t n, int32_t world, int32_t rank, size_t align) {
    if (align < 1) align = 1;
    size_t per = (n + (size_t)world - 1) / (size_t)world;
    per = (per + align - 1) / align * align;
    size_t b = per * (size_t)rank;
    return b < n ? b : n;
}
