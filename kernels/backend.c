// The backend factory (backend.h): the only place that knows which backends were built.
#include "kernels/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tr_build_config.h"
#if TR_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#endif

bool tr_backend_built(const char *kind) {
    if (!kind || strcmp(kind, "cpu") == 0) return true;
    return strcmp(kind, "cuda") == 0 && TR_HAVE_CUDA;
}

int32_t tr_backend_cuda_devices(void) {
#if TR_HAVE_CUDA
    return tr_cuda_device_count();
#else
    return 0;
#endif
}

// Reads TROUPE_DEVICE_FAULT into a started backend; a malformed value stops it, since a test
// that meant to inject a failure must not pass because nothing was injected.
static int read_fault(tr_backend *be, char *msg, size_t cap) {
    if (tr_fault_parse(&be->fault, getenv("TROUPE_DEVICE_FAULT"), msg, cap) == 0) return 0;
    tr_backend_free(be);
    memset(be, 0, sizeof *be);
    return -1;
}

int tr_backend_init(tr_backend *be, const tr_backend_opts *opts, char *msg, size_t cap) {
    memset(be, 0, sizeof *be);
    const char *kind = opts->kind ? opts->kind : "cpu";
    const char *prec = opts->precision;
    if (prec && strcmp(prec, "fp32") != 0 && strcmp(prec, "bf16") != 0) {
        snprintf(msg, cap, "unknown precision '%s' (fp32 or bf16)", prec);
        return -1;
    }
    if (strcmp(kind, "cpu") == 0) {
        tr_dt p = prec && strcmp(prec, "bf16") == 0 ? TR_BF16 : TR_F32;
        if (opts->threads < 0 || tr_backend_cpu_init(be, opts->threads, p) != 0) {
            snprintf(msg, cap, "cpu backend: cannot start %d threads", opts->threads);
            return -1;
        }
        return read_fault(be, msg, cap);
    }
    if (strcmp(kind, "cuda") != 0) {
        snprintf(msg, cap, "unknown backend '%s' (cpu or cuda)", kind);
        return -1;
    }
#if TR_HAVE_CUDA
    int32_t n = tr_cuda_device_count();
    if (opts->device < 0 || opts->device >= n) {
        snprintf(msg, cap, "cuda backend: device %d does not exist (%d visible)", opts->device, n);
        return -1;
    }
    tr_dt p = prec && strcmp(prec, "fp32") == 0 ? TR_F32 : TR_BF16;
    int inv = opts->batch_invariant > 0 ? 1 : opts->batch_invariant < 0 ? 0 : -1;   // -1: env
    if (tr_backend_cuda_init(be, opts->device, p, inv) != 0) {
        char why[512];
        tr_backend_cuda_status(be, why, sizeof why);
        snprintf(msg, cap, "cuda backend on device %d: %s", opts->device, why);
        tr_backend_cuda_free(be);
        memset(be, 0, sizeof *be);
        return -1;
    }
    return read_fault(be, msg, cap);
#else
    snprintf(msg, cap, "cuda backend: this troupe was built without CUDA (meson -Dcuda=enabled)");
    return -1;
#endif
}

void tr_backend_free(tr_backend *be) {
    if (!be || !be->ops) return;
#if TR_HAVE_CUDA
    if (strcmp(be->ops->name, "cuda") == 0) {
        tr_backend_cuda_free(be);
        return;
    }
#endif
    tr_backend_cpu_free(be);
}
