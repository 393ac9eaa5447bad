// The NCCL communicator for the CUDA backend: ncclCommInitRankConfig with a unique id made
// by rank 0, non-blocking, so that joining returns at once and several communicators can
// form together; collectives run on the backend's stream, and the calling thread then waits
// for that stream while watching for an abort request, a stop request, NCCL's asynchronous
// errors and a time limit, any of which ends in ncclCommAbort. Uneven reduce-scatter and
// all-gather are grouped per-root reduces and broadcasts.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm_impl.h"
#include "kernels/cuda/backend_cuda.h"

typedef struct nccl_comm {
    tr_comm base;
    ncclUniqueId id;
    ncclComm_t comm;
    bool aborted;                 // ncclCommAbort was called: comm is gone
    _Atomic int abort_req;        // set by tr_comm_abort from any thread
    char why[256];
    float *scratch;               // one float of device memory for barriers
} nccl_comm;

static const tr_comm_vt nccl_vt;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

static int nccl_fail(nccl_comm *n, ncclResult_t r, const char *what, tr_err *err) {
    const char *last = n->comm ? ncclGetLastError(n->comm) : NULL;
    return tr_errf(err, TR_EDEVICE, "%s: %s%s%s", what, ncclGetErrorString(r), last && last[0] ? ": " : "",
                   last ? last : "");
}

static void do_abort(nccl_comm *n) {
    if (n->comm && !n->aborted) ncclCommAbort(n->comm);
    n->aborted = true;
}

static nccl_comm *nccl_new(const tr_comm_opts *o, tr_err *err) {
    nccl_comm *n = calloc(1, sizeof *n);
    if (!n) {
        tr_errf(err, TR_ENOMEM, "communicator: out of memory");
        return NULL;
    }
    tr_comm_base_init(&n->base, &nccl_vt, o);
    return n;
}

int tr_comm_nccl_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err) {
    nccl_comm *n = nccl_new(o, err);
    if (!n) return -1;
    ncclResult_t r = ncclGetUniqueId(&n->id);
    if (r != ncclSuccess) {
        nccl_fail(n, r, "ncclGetUniqueId", err);
        free(n);
        return -1;
    }
    if (cap < 6 + 2 * sizeof n->id.internal) {
        free(n);
        return tr_errf(err, TR_ERANGE, "communicator: id buffer of %zu bytes is too small", cap);
    }
    size_t k = (size_t)snprintf(id, cap, "nccl:");
    for (size_t i = 0; i < sizeof n->id.internal; i++)
        k += (size_t)snprintf(id + k, cap - k, "%02x", (unsigned char)n->id.internal[i]);
    *out = &n->base;
    return 0;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int tr_comm_nccl_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err) {
    const char *hex = id + 5;
    if (strlen(hex) != 2 * sizeof(((ncclUniqueId *)0)->internal))
        return tr_errf(err, TR_EINVAL, "communicator: '%.40s...' is not an NCCL id", id);
    nccl_comm *n = nccl_new(o, err);
    if (!n) return -1;
    for (size_t i = 0; i < sizeof n->id.internal; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(n);
            return tr_errf(err, TR_EINVAL, "communicator: '%.40s...' is not an NCCL id", id);
        }
        n->id.internal[i] = (char)(hi * 16 + lo);
    }
    *out = &n->base;
    return 0;
}

static int nccl_join(tr_comm *c, tr_err *err) {
    nccl_comm *n = (nccl_comm *)c;
    n->scratch = c->be->ops->alloc(c->be, sizeof(float));
    if (!n->scratch) return tr_errf(err, TR_ENOMEM, "no device memory for the barrier scratch");
    c->be->ops->fill(c->be, n->scratch, 0.0f, 1);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;   // returns at once; tr_comm_wait polls
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->world, n->id, c->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) return nccl_fail(n, r, "ncclCommInitRankConfig", err);
    return 0;
}

// Why a wait must end now, or 0.
static int interrupted(nccl_comm *n, int64_t deadline, const char *what, tr_err *err) {
    tr_comm *c = &n->base;
    if (atomic_load(&n->abort_req)) return tr_errf(err, TR_EPEER, "%s: aborted: %s", what, n->why);
    if (c->stop && *c->stop) return tr_errf(err, TR_ECANCELED, "%s: stopped by a signal", what);
    if (deadline >= 0 && now_ms() >= deadline)
        return tr_errf(err, TR_ETIMEOUT, "%s: not finished within %d ms", what, c->op_timeout_ms);
    return 0;
}

// Polls NCCL's state until it leaves ncclInProgress.
static int settle(nccl_comm *n, int64_t deadline, const char *what, tr_err *err) {
    for (;;) {
        ncclResult_t st;
        ncclResult_t r = ncclCommGetAsyncError(n->comm, &st);
        if (r != ncclSuccess) return nccl_fail(n, r, what, err);
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) return nccl_fail(n, st, what, err);
        if (interrupted(n, deadline, what, err)) return -1;
        sleep_us(200);
    }
}

static int nccl_wait(tr_comm *c, int timeout_ms, tr_err *err) {
    nccl_comm *n = (nccl_comm *)c;
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 60000);
    if (settle(n, deadline, "ncclCommInitRankConfig", err)) {
        do_abort(n);
        return -1;
    }
    return 0;
}

static ncclDataType_t nccl_type(enum tr_comm_dtype t) {
    return t == TR_COMM_F32 ? ncclFloat32 : t == TR_COMM_F64 ? ncclFloat64
         : t == TR_COMM_BF16 ? ncclBfloat16 : ncclInt64;
}

static bool equal_counts(const size_t *counts, int32_t world) {
    for (int32_t r = 1; r < world; r++)
        if (counts[r] != counts[0]) return false;
    return true;
}

// Queues the collective on the stream.
static ncclResult_t enqueue(nccl_comm *n, const tr_comm_call *call, cudaStream_t st) {
    tr_comm *c = &n->base;
    ncclDataType_t t = nccl_type(call->dtype);
    size_t es = tr_comm_dtype_size(call->dtype);
    char *buf = call->buf;
    switch (call->op) {
    case TR_COMM_OP_ALL_REDUCE: return ncclAllReduce(buf, buf, call->n, t, ncclSum, n->comm, st);
    case TR_COMM_OP_BROADCAST: return ncclBroadcast(buf, buf, call->n, t, call->root, n->comm, st);
    case TR_COMM_OP_BARRIER: return ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum, n->comm, st);
    case TR_COMM_OP_REDUCE_SCATTER:
    case TR_COMM_OP_ALL_GATHER: break;
    }
    const size_t *k = call->counts;
    bool scatter = call->op == TR_COMM_OP_REDUCE_SCATTER;
    if (equal_counts(k, c->world)) {
        // In place as NCCL defines it: the rank's segment sits at rank * count.
        char *mine = buf + (size_t)c->rank * k[0] * es;
        return scatter ? ncclReduceScatter(buf, mine, k[0], t, ncclSum, n->comm, st)
                       : ncclAllGather(mine, buf, k[0], t, n->comm, st);
    }
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;   // no group was opened: nothing to end
    size_t off = 0;
    for (int32_t root = 0; root < c->world && (r == ncclSuccess || r == ncclInProgress); off += k[root], root++) {
        char *seg = buf + off * es;
        r = scatter ? ncclReduce(seg, seg, k[root], t, ncclSum, root, n->comm, st)
                    : ncclBroadcast(seg, seg, k[root], t, root, n->comm, st);
    }
    ncclResult_t e = ncclGroupEnd();
    return r == ncclSuccess || r == ncclInProgress ? e : r;
}

static int nccl_run(tr_comm *c, const tr_comm_call *call, tr_err *err) {
    nccl_comm *n = (nccl_comm *)c;
    if (n->aborted || atomic_load(&n->abort_req))
        return tr_errf(err, TR_EPEER, "the communicator was aborted: %s", n->why);
    cudaStream_t st = (cudaStream_t)tr_backend_cuda_stream(c->be);
    int64_t deadline = now_ms() + c->op_timeout_ms;
    const char *what = tr_comm_op_name(call->op);
    ncclResult_t r = enqueue(n, call, st);
    if (r != ncclSuccess && r != ncclInProgress) {
        nccl_fail(n, r, what, err);
        do_abort(n);
        return -1;
    }
    if (settle(n, deadline, what, err)) {
        do_abort(n);
        return -1;
    }
    // Wait for the stream, so that a peer that never arrives ends in an abort instead of a
    // hang inside a later sync.
    for (;;) {
        cudaError_t q = cudaStreamQuery(st);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) {
            tr_errf(err, TR_EDEVICE, "%s: %s", what, cudaGetErrorString(q));
            do_abort(n);
            return -1;
        }
        ncclResult_t as;
        if (ncclCommGetAsyncError(n->comm, &as) == ncclSuccess && as != ncclSuccess && as != ncclInProgress) {
            nccl_fail(n, as, what, err);
            do_abort(n);
            return -1;
        }
        if (interrupted(n, deadline, what, err)) {
            do_abort(n);
            return -1;
        }
        sleep_us(50);
    }
}

static void nccl_abort_req(tr_comm *c, const char *why) {
    nccl_comm *n = (nccl_comm *)c;
    int expect = 0;
    if (atomic_compare_exchange_strong(&n->abort_req, &expect, 1))
        snprintf(n->why, sizeof n->why, "rank %d: %s", c->rank, why);
}

static bool nccl_dead(tr_comm *c) {
    nccl_comm *n = (nccl_comm *)c;
    return n->aborted || atomic_load(&n->abort_req);
}

static void nccl_free(tr_comm *c) {
    nccl_comm *n = (nccl_comm *)c;
    if (n->comm) {
        // A communicator that failed may have work that never ends: only abort frees it.
        if (n->aborted || atomic_load(&n->abort_req) || ncclCommDestroy(n->comm) != ncclSuccess) do_abort(n);
    }
    if (n->scratch) c->be->ops->free(c->be, n->scratch);
    free(n);
}

static const tr_comm_vt nccl_vt = {
    .kind = "nccl",
    .join = nccl_join,
    .wait = nccl_wait,
    .run = nccl_run,
    .abort = nccl_abort_req,
    .dead = nccl_dead,
    .free = nccl_free,
};
