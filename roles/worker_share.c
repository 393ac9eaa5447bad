// Weights shared with a generator on the same device (init's share_weights): the policy keeps
// its working weights in one or two buffers of shared backend memory (engine/weight_share.h),
// and sync_weights moves nothing: the policy publishes the buffer its weights are in, with a
// handle the controller forwards to the generator rank paired with it, which maps that buffer
// and reads it in place. With two buffers the policy's train never writes the published one,
// so a generation running one step ahead reads weights that stay as they were.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/device.h"
#include "engine/resync.h"
#include "roles/worker_impl.h"

int tr_worker_share_init(tr_role_ctx *role, tr_err *err) {
    if (role->share_buffers <= 0) return 0;
    if (role->kind == TR_ROLE_GENERATOR) {
        tr_wshare_reader_init(&role->wread, &role->model);
        role->has_wread = true;
        return 0;
    }
    if (tr_wshare_init(&role->wshare, &role->model, role->share_buffers, err)) return tr_err_wrap(err, "init");
    role->has_wshare = true;
    tr_worker_logf(role, "init: working weights in %d shared buffer%s of %zu bytes", role->share_buffers,
                   role->share_buffers > 1 ? "s" : "", role->wshare.bytes);
    return 0;
}

void tr_worker_share_free(tr_role_ctx *role) {
    if (role->has_wread) tr_wshare_reader_free(&role->wread);
    if (role->has_wshare) tr_wshare_free(&role->wshare);
    role->has_wread = role->has_wshare = false;
}

int tr_worker_begin_write(tr_role_ctx *role, tr_err *err) {
    if (!role->has_wshare) return 0;
    int32_t from = role->wshare.cur;
    if (tr_wshare_begin_write(&role->wshare, &role->model, err)) return -1;
    if (role->wshare.cur != from)
        tr_worker_logf(role, "shared weights: buffer %d is published; writing buffer %d", from, role->wshare.cur);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// The generator's side: the buffer, its handle and size, and the version it holds.
static int map_published(tr_role_ctx *role, const tr_msg_map *a, int64_t *version, int32_t *buf, tr_err *err) {
    int64_t buffer, size;
    tr_msg_str h;
    if (tr_msg_get_int(a, "buffer", &buffer, err) || tr_msg_get_int(a, "size", &size, err) ||
        tr_msg_get_int(a, "version", version, err) || tr_msg_get_bin(a, "handle", &h, err))
        return -1;
    if (h.len > TR_SHARE_HANDLE_MAX || buffer < 0 || buffer >= role->share_buffers || size < 0)
        return tr_errf(err, TR_EINVAL, "sync_weights: buffer %lld of %d, size %lld, a handle of %zu bytes (at most %d)",
                       (long long)buffer, role->share_buffers, (long long)size, h.len, TR_SHARE_HANDLE_MAX);
    tr_share_handle sh = {.len = (uint32_t)h.len};
    memcpy(sh.bytes, h.ptr, h.len);
    // Weights being swapped must never be sampled from: no version until the buffer is bound.
    role->weight_version = -1;
    if (tr_wshare_read(&role->wread, &role->model, (int32_t)buffer, &sh, (size_t)size, err)) return -1;
    role->weight_version = *version;
    *buf = (int32_t)buffer;
    return 0;
}

int tr_worker_share_sync(tr_role_ctx *role, const tr_msg *req, bool verify, tr_msg_writer *rep, tr_err *err) {
    double t0 = now_s();
    int64_t version = 0;
    int32_t buf = 0;
    bool policy = role->has_wshare;
    if (policy) {
        // What is published must be complete: every write queued before it has landed.
        if (tr_dev_sync(role->model.be, "sync_weights: publishing the shared weights", err)) return -1;
        version = tr_worker_weight_version(role);
        buf = tr_wshare_publish(&role->wshare, version);
    } else if (map_published(role, &req->args, &version, &buf, err)) {
        return tr_err_wrap(err, "sync_weights");
    }
    uint64_t sum = 0;
    if (verify && tr_resync_checksum(&role->model, &sum, err)) return tr_err_wrap(err, "sync_weights");
    double secs = now_s() - t0;
    tr_worker_logf(role, "sync_weights: %s shared buffer %d, weights of step %lld, nothing copied%s",
                   policy ? "published" : "reading", buf, (long long)version, verify ? ", checksum taken" : "");
    tr_msg_begin_reply(rep, req->id, 7 + (policy ? 2 : 0) + (verify ? 1 : 0));
    tr_msg_put_bool(rep, "synced", true);
    tr_msg_put_int(rep, "version", version);
    tr_msg_put_int(rep, "bytes", 0);
    tr_msg_put_int(rep, "buckets", 0);
    tr_msg_put_float(rep, "seconds", secs);
    tr_msg_put_str(rep, "kind", "share");
    tr_msg_put_int(rep, "buffer", buf);
    if (policy) {
        tr_msg_put_bin(rep, "handle", role->wshare.handle[buf].bytes, role->wshare.handle[buf].len);
        tr_msg_put_int(rep, "size", (int64_t)role->wshare.bytes);
    }
    if (verify) tr_msg_put_uint(rep, "checksum", sum);
    return 0;
}
