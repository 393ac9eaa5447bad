// Engine-side helpers over the backend's memory half (device.h).
#include "engine/device.h"

#include <stdio.h>

static int no_memory(tr_backend *be, size_t bytes, const char *what, const char *kind,
                     tr_err *err) {
    size_t free_b = 0, total_b = 0;
    be->ops->mem_info(be, &free_b, &total_b);
    return tr_errf(err, TR_ENOMEM, "%s: cannot allocate %.1f MiB of %s memory (%s backend: "
                   "%.1f of %.1f MiB free)", what, (double)bytes / (1 << 20), kind,
                   be->ops->name, (double)free_b / (1 << 20), (double)total_b / (1 << 20));
}

void *tr_dev_alloc(tr_backend *be, size_t bytes, const char *what, tr_err *err) {
    void *p = be->ops->alloc(be, bytes);
    if (!p) no_memory(be, bytes, what, "device", err);
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
    void *p = be->ops->alloc_host(be, bytes);
    if (!p) no_memory(be, bytes, what, "pinned host", err);
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
