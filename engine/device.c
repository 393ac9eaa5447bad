// Engine-side helpers over the backend's memory half (device.h).
#include "engine/device.h"

#include <stdbool.h>
#include <stdio.h>

static int no_memory(tr_backend *be, size_t bytes, const char *what, const char *kind,
                     bool injected, tr_err *err) {
    size_t free_b = 0, total_b = 0;
    be->ops->mem_info(be, &free_b, &total_b);
    return tr_errf(err, TR_ENOMEM, "%s: cannot allocate %.1f MiB of %s memory (%s backend: "
                   "%.1f of %.1f MiB free%s%s)", what, (double)bytes / (1 << 20), kind,
                   be->ops->name, (double)free_b / (1 << 20), (double)total_b / (1 << 20),
                   injected ? "; injected by TROUPE_DEVICE_FAULT=" : "",
                   injected ? be->fault.spec : "");
}

// TROUPE_DEVICE_FAULT=oom:WHAT (kernels/fault.h): only here is an allocation's purpose known,
// so this is where one is picked; the backend's allocator then fails it (for real on CUDA)
// and it comes back as any shortage does, with the figures and a note that it was asked for.
static bool inject_oom(tr_backend *be, const char *what) {
    be->fault.fail_alloc = tr_fault_hit(&be->fault, TR_FAULT_OOM, what);
    return be->fault.fail_alloc;
}

void *tr_dev_alloc(tr_backend *be, size_t bytes, const char *what, tr_err *err) {
    bool injected = inject_oom(be, what);
    void *p = be->ops->alloc(be, bytes);
    if (!p) no_memory(be, bytes, what, "device", injected, err);
    return p;
}

void *tr_dev_zalloc(tr_backend *be, size_t bytes, const char *what, tr_err *err) {
    void *p = tr_dev_alloc(be, bytes, what, err);
    if (p) be->ops->fill(be, p, 0.0f, bytes / sizeof(float));
    return p;
}

void tr_dev_free(tr_backend *be, void *p) {
    if (p) be->ops->free(be, p);
}

void *tr_dev_alloc_host(tr_backend *be, size_t bytes, const char *what, tr_err *err) {
    bool injected = inject_oom(be, what);
    void *p = be->ops->alloc_host(be, bytes);
    if (!p) no_memory(be, bytes, what, "pinned host", injected, err);
    return p;
}

void tr_dev_free_host(tr_backend *be, void *p) {
    if (p) be->ops->free_host(be, p);
}

int tr_dev_sync(tr_backend *be, const char *where, tr_err *err) {
    char msg[TR_ERR_MSG_MAX - 64];
    if (be->ops->sync(be, where, msg, sizeof msg) == 0) return 0;
    return tr_errf(err, TR_EDEVICE, "%s", msg);
}

int tr_dev_upload_sync(tr_backend *be, void *dst, const void *src, size_t bytes,
                       const char *where, tr_err *err) {
    be->ops->upload(be, dst, src, bytes);
    return tr_dev_sync(be, where, err);
}

int tr_dev_download_sync(tr_backend *be, void *dst, const void *src, size_t bytes,
                         const char *where, tr_err *err) {
    be->ops->download(be, dst, src, bytes);
    return tr_dev_sync(be, where, err);
}

// Conversions go through a device scratch of this many values at a time, so a load never
// needs a second full-size copy of the weights on the device.
#define TR_CONVERT_CHUNK ((size_t)1 << 22)

static int convert_chunks(tr_backend *be, void *dev, tr_dt t, float *host, size_t n, bool up,
                          const char *where, tr_err *err) {
    size_t chunk = n < TR_CONVERT_CHUNK ? n : TR_CONVERT_CHUNK;
    float *tmp = tr_dev_alloc(be, (chunk ? chunk : 1) * sizeof(float), where, err);
    if (!tmp) return -1;
    size_t es = tr_dt_size(t);
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk;
        char *d = (char *)dev + off * es;
        if (up) {
            be->ops->upload(be, tmp, host + off, len * sizeof(float));
            be->ops->convert(be, d, t, tmp, TR_F32, len);
        } else {
            be->ops->convert(be, tmp, TR_F32, d, t, len);
            be->ops->download(be, host + off, tmp, len * sizeof(float));
        }
    }
    int rc = tr_dev_sync(be, where, err);
    tr_dev_free(be, tmp);
    return rc;
}

int tr_dev_upload_as(tr_backend *be, void *dst, tr_dt t, const float *src, size_t n,
                     const char *where, tr_err *err) {
    if (t == TR_F32) return tr_dev_upload_sync(be, dst, src, n * sizeof(float), where, err);
    return convert_chunks(be, dst, t, (float *)src, n, true, where, err);
}

int tr_dev_download_as_f32(tr_backend *be, float *dst, const void *src, tr_dt t, size_t n,
                           const char *where, tr_err *err) {
    if (t == TR_F32) return tr_dev_download_sync(be, dst, src, n * sizeof(float), where, err);
    return convert_chunks(be, (void *)src, t, dst, n, false, where, err);
}
