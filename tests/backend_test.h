// Tests' access to a backend: the one engine tests run on, and moving test data to and from
// backend memory (kernel tests use these too). The backend comes from the environment, so one
// test binary checks the CPU backend (also in guarded mode, TROUPE_CPU_GUARD=1) and, on a GPU
// machine, the CUDA backend: TROUPE_BACKEND=cuda, TROUPE_DEVICE=N. Asking for CUDA where
// there is none skips the test (exit 77).
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"

// The backend $TROUPE_BACKEND names (cpu when unset) on $TROUPE_DEVICE, in `precision`.
static inline void et_backend_in(tr_backend *be, int32_t threads, const char *precision) {
    const char *kind = getenv("TROUPE_BACKEND"), *dev = getenv("TROUPE_DEVICE");
    tr_backend_opts o = {.kind = kind, .threads = threads, .device = dev ? atoi(dev) : 0,
                         .precision = precision};
    char msg[512];
    if (kind && strcmp(kind, "cuda") == 0 && tr_backend_cuda_devices() < 1) {
        printf("no CUDA device: skipped\n");
        exit(77);
    }
    if (tr_backend_init(be, &o, msg, sizeof msg) != 0) {
        fprintf(stderr, "backend: %s\n", msg);
        exit(1);
    }
}

// In fp32 on either backend: the tests against fp32 references (transformers fixtures,
// finite differences) hold every backend to the same limits.
static inline void et_backend(tr_backend *be, int32_t threads) { et_backend_in(be, threads, "fp32"); }

static inline void et_sync(tr_backend *be, const char *where) {
    char msg[512];
    if (be->ops->sync(be, where, msg, sizeof msg) != 0) {
        fprintf(stderr, "%s\n", msg);
        exit(1);
    }
}

// bytes of backend memory holding a copy of host (zeros when host is NULL).
static inline void *et_dev(tr_backend *be, const void *host, size_t bytes) {
    void *p = be->ops->alloc(be, bytes ? bytes : 4);
    if (!p) {
        fprintf(stderr, "backend: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    if (host) be->ops->upload(be, p, host, bytes);
    else be->ops->fill(be, p, 0.0f, bytes / 4);
    et_sync(be, "test upload");
    return p;
}

static inline void et_put(tr_backend *be, void *dev, const void *host, size_t bytes) {
    be->ops->upload(be, dev, host, bytes);
    et_sync(be, "test upload");
}

static inline void et_get(tr_backend *be, void *host, const void *dev, size_t bytes) {
    be->ops->download(be, host, dev, bytes);
    et_sync(be, "test download");
}

// A malloc'd host copy of n floats of backend memory.
static inline float *et_floats(tr_backend *be, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    et_get(be, h, dev, n * sizeof(float));
    return h;
}

// Whether two buffers of backend memory hold the same bytes.
static inline int et_same(tr_backend *be, const void *a, const void *b, size_t bytes) {
    char *x = malloc(bytes ? bytes : 1), *y = malloc(bytes ? bytes : 1);
    if (!x || !y) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    et_get(be, x, a, bytes);
    et_get(be, y, b, bytes);
    int same = memcmp(x, y, bytes) == 0;
    free(x);
    free(y);
    return same;
}

// Whether the backend promises batch-invariant results (a row's bits do not depend on the
// rows beside it or on T): the CPU backend does, CUDA in bf16 unless it was turned off; CUDA
// in fp32 does not (cuBLAS sgemm picks kernels by the whole shape), so there tests allow fp32
// rounding instead of exact equality.
static inline int et_batch_invariant(const tr_backend *be) { return be->batch_invariant; }
