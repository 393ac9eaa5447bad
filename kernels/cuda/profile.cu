// TROUPE_CUDA_PROFILE=1: where a step's device time goes, without a system profiler. Every
// launch the backend queues is followed by an event; the time between consecutive events is
// the launch's, which includes any time the device sat idle waiting for the host to queue it:
// the `idle` column counts the launches that found the device with nothing left to do, and
// where it is high the host, not the op, set the pace. GEMMs are keyed by their shape. The table goes to stderr when the backend is freed, slowest first, with the
// host's wall time over the same span beside the device's sum.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_ctx.cuh"

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tr_cuda_prof_init(tr_cuda_ctx *ctx) {
    tr_cuda_prof *p = (tr_cuda_prof *)calloc(1, sizeof *p);
    if (!p) return -1;
    for (int i = 0; i < TR_CUDA_PROF_EVENTS; i++)
        if (cudaEventCreate(&p->ev[i]) != cudaSuccess) {
            for (int j = 0; j < i; j++) cudaEventDestroy(p->ev[j]);
            free(p);
            return -1;
        }
    ctx->prof = p;
    return 0;
}

static tr_cuda_prof_row *row_of(tr_cuda_prof *p, const tr_cuda_prof_tag *m) {
    for (int i = 0; i < p->n_rows; i++)
        if (p->rows[i].name == m->name && p->rows[i].m == m->m && p->rows[i].n == m->n &&
            p->rows[i].k == m->k)
            return &p->rows[i];
    if (p->n_rows == TR_CUDA_PROF_ROWS) return &p->rows[TR_CUDA_PROF_ROWS - 1];   // "other"
    tr_cuda_prof_row *r = &p->rows[p->n_rows++];
    r->name = p->n_rows == TR_CUDA_PROF_ROWS ? "(other)" : m->name;
    r->m = m->m, r->n = m->n, r->k = m->k;
    return r;
}

// Waits for the queued events and adds their intervals to the table; the last event starts
// the next batch.
static void flush(tr_cuda_prof *p) {
    if (p->n < 2) return;
    if (cudaEventSynchronize(p->ev[p->n - 1]) != cudaSuccess) return;
    for (int i = 1; i < p->n; i++) {
        float ms = 0.0f;
        if (cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i]) != cudaSuccess) continue;
        tr_cuda_prof_row *r = row_of(p, &p->marks[i]);
        r->ms += ms;
        r->count++;
        r->idle += p->marks[i].idle;
        p->total_ms += ms;
    }
    cudaEvent_t last = p->ev[p->n - 1];
    p->ev[p->n - 1] = p->ev[0];
    p->ev[0] = last;
    p->n = 1;
}

void tr_cuda_prof_mark(tr_cuda_ctx *ctx, const char *name, int64_t m, int64_t n, int64_t k) {
    tr_cuda_prof *p = ctx->prof;
    if (p->n == TR_CUDA_PROF_EVENTS) flush(p);
    if (p->n == 0) p->t0 = wall_s();
    // Queried after the launch: a completed earlier event means the device had drained the
    // queue before this launch reached it (or very nearly so).
    int idle = p->n > 0 && cudaEventQuery(p->ev[p->n - 1]) == cudaSuccess;
    if (cudaEventRecord(p->ev[p->n], ctx->stream) != cudaSuccess) return;
    p->marks[p->n] = (tr_cuda_prof_tag){name, m, n, k, idle};
    p->n++;
    p->t1 = wall_s();
}

extern "C" void tr_backend_cuda_profile_reset(tr_backend *be) {
    tr_cuda_prof *p = be && be->ctx ? tr_cuda_ctx_of(be)->prof : NULL;
    if (!p) return;
    flush(p);
    memset(p->rows, 0, sizeof p->rows);
    p->n_rows = 0;
    p->total_ms = 0.0;
    p->plans_made = 0;
    p->plan_ms = 0.0;
    p->t0 = wall_s();
}

static int by_time(const void *a, const void *b) {
    double x = ((const tr_cuda_prof_row *)a)->ms, y = ((const tr_cuda_prof_row *)b)->ms;
    return x < y ? 1 : x > y ? -1 : 0;
}

void tr_cuda_prof_free(tr_cuda_ctx *ctx) {
    tr_cuda_prof *p = ctx->prof;
    if (!p) return;
    flush(p);
    qsort(p->rows, (size_t)p->n_rows, sizeof p->rows[0], by_time);
    long launches = 0;
    for (int i = 0; i < p->n_rows; i++) launches += p->rows[i].count;
    fprintf(stderr, "cuda profile, device %d: %.1f ms of device time over %.1f ms of host time, "
            "%ld launches; %ld cuBLASLt plans made in %.1f ms of host time\n", ctx->device,
            p->total_ms, 1e3 * (p->t1 - p->t0), launches, p->plans_made, p->plan_ms);
    fprintf(stderr, "%10s %6s %9s %8s %5s  %s\n", "ms", "%", "count", "us/call", "idle", "op");
    for (int i = 0; i < p->n_rows; i++) {
        const tr_cuda_prof_row *r = &p->rows[i];
        char shape[64] = "";
        if (r->m) snprintf(shape, sizeof shape, " m=%lld n=%lld k=%lld", (long long)r->m,
                           (long long)r->n, (long long)r->k);
        fprintf(stderr, "%10.2f %6.2f %9ld %8.1f %4.0f%%  %s%s\n", r->ms,
                p->total_ms > 0 ? 100.0 * r->ms / p->total_ms : 0.0, r->count,
                r->count ? 1e3 * r->ms / (double)r->count : 0.0,
                r->count ? 100.0 * (double)r->idle / (double)r->count : 0.0, r->name, shape);
    }
    for (int i = 0; i < TR_CUDA_PROF_EVENTS; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    ctx->prof = NULL;
}
