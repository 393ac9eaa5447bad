// Shared backend memory (share.h) by backend: a handle starts with the backend's name, so a
// handle of one backend is refused by the other rather than misread.
#include "kernels/share.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "tr_build_config.h"
#if TR_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/ipc.h"
#endif

#define CPU_TAG "cpu:"
#define CUDA_TAG "cuda:"

static bool is_cuda(const tr_backend *be) { return strcmp(be->ops->name, "cuda") == 0; }

// The handle's payload after tag, or NULL when it is another backend's.
static const uint8_t *payload(const tr_share_handle *h, const char *tag, size_t *len) {
    size_t t = strlen(tag);
    if (h->len < t || h->len > TR_SHARE_HANDLE_MAX || memcmp(h->bytes, tag, t) != 0) return NULL;
    *len = h->len - t;
    return h->bytes + t;
}

void *tr_share_alloc(tr_backend *be, size_t bytes, tr_share_handle *h, char *msg, size_t cap) {
    memset(h, 0, sizeof *h);
    if (is_cuda(be)) {
#if TR_HAVE_CUDA
        void *p = NULL;
        memcpy(h->bytes, CUDA_TAG, strlen(CUDA_TAG));
        if (tr_cuda_ipc_alloc(tr_backend_cuda_device(be), bytes, &p, h->bytes + strlen(CUDA_TAG), msg, cap)) return NULL;
        h->len = (uint32_t)(strlen(CUDA_TAG) + TR_CUDA_IPC_HANDLE_BYTES);
        return p;
#endif
    }
    char name[64];
    void *p = tr_cpu_share_alloc(be, bytes, name, sizeof name, msg, cap);
    if (p) h->len = (uint32_t)snprintf((char *)h->bytes, TR_SHARE_HANDLE_MAX, CPU_TAG "%s", name);
    return p;
}

void *tr_share_open(tr_backend *be, const tr_share_handle *h, size_t bytes, char *msg, size_t cap) {
    size_t len = 0;
    const uint8_t *b = payload(h, is_cuda(be) ? CUDA_TAG : CPU_TAG, &len);
    if (!b) {
        snprintf(msg, cap, "shared memory: the handle is not the %s backend's", be->ops->name);
        return NULL;
    }
    if (is_cuda(be)) {
#if TR_HAVE_CUDA
        void *p = NULL;
        if (len != TR_CUDA_IPC_HANDLE_BYTES) {
            snprintf(msg, cap, "shared memory: a CUDA IPC handle of %zu bytes", len);
            return NULL;
        }
        return tr_cuda_ipc_open(tr_backend_cuda_device(be), b, &p, msg, cap) ? NULL : p;
#endif
    }
    char name[64];
    if (len == 0 || len >= sizeof name) {
        snprintf(msg, cap, "shared memory: a segment name of %zu bytes", len);
        return NULL;
    }
    memcpy(name, b, len);
    name[len] = '\0';
    return tr_cpu_share_open(be, name, bytes, msg, cap);
}

int tr_share_free(tr_backend *be, void *p, char *msg, size_t cap) {
#if TR_HAVE_CUDA
    if (is_cuda(be)) return tr_cuda_ipc_free(p, msg, cap);
#endif
    return tr_cpu_share_release(be, p, msg, cap);
}

int tr_share_close(tr_backend *be, void *p, char *msg, size_t cap) {
#if TR_HAVE_CUDA
    if (is_cuda(be)) return tr_cuda_ipc_close(p, msg, cap);
#endif
    return tr_cpu_share_release(be, p, msg, cap);
}
