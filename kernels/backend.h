// Starting and stopping a backend by name, so that nothing above kernels/ names one
// implementation: the engine, the commands and the workers take "cpu" or "cuda" from their
// options and get the same tr_ops table either way.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

typedef struct tr_backend_opts {
    const char *kind;    // "cpu" (also when NULL) or "cuda"
    int32_t threads;     // cpu: worker threads, 0 = one per core
    int32_t device;      // cuda: device index
    // "fp32", "bf16", or NULL for the backend's default (cpu: fp32; cuda: bf16). It sets the
    // backend's activation and working-weight dtypes (ops.h); bf16 on the CPU emulates CUDA's
    // rounding points.
    const char *precision;
    // cuda: 0 (a zeroed struct) batch-invariant products in bf16 (ops.h's tr_backend) unless
    // TROUPE_CUDA_BATCH_INVARIANT=0 is set; 1 on; -1 off (the fastest kernel for each whole
    // shape). The CPU backend is batch-invariant whatever this says.
    int32_t batch_invariant;
} tr_backend_opts;

// Returns 0, or -1 with msg saying why (unknown kind or precision, a build without CUDA, no
// such device, no memory for the thread pool, a malformed TROUPE_DEVICE_FAULT); nothing is
// left to free then. TROUPE_DEVICE_FAULT (kernels/fault.h) is read here, into be->fault.
int tr_backend_init(tr_backend *be, const tr_backend_opts *opts, char *msg, size_t cap);
void tr_backend_free(tr_backend *be);
// Whether this build contains the backend (a CUDA build may still find no device).
bool tr_backend_built(const char *kind);
// Number of CUDA devices visible (0 without a CUDA build, a driver or a device).
int32_t tr_backend_cuda_devices(void);
