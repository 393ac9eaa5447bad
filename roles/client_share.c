// The controller's side of weights shared on one device (init's share_weights): policy rank r
// publishes the buffer its working weights are in (sync_weights), and the controller forwards
// that buffer's handle, size and version to generator rank r, which maps it and reads it in
// place. Only the handle moves, in the two control messages.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/share.h"
#include "roles/client.h"
#include "roles/client_impl.h"

// What policy rank r published.
typedef struct published {
    int64_t version, buffer, size;
    uint64_t checksum;
    size_t handle_len;
    uint8_t handle[TR_SHARE_HANDLE_MAX];
} published;

typedef struct share_ctx {
    bool verify;
    published *p;              // [generator world]
} share_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void build_publish(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const share_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 1);
    tr_msg_put_bool(w, "verify", c->verify);
}

static int reply_publish(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    share_ctx *c = ctx;
    published *p = &c->p[rank];
    tr_msg_str h;
    bool synced = false;
    if (tr_msg_get_bool(res, "synced", &synced, err) || tr_msg_get_int(res, "version", &p->version, err) ||
        tr_msg_get_int(res, "buffer", &p->buffer, err) || tr_msg_get_int(res, "size", &p->size, err) ||
        tr_msg_get_bin(res, "handle", &h, err) || (c->verify && tr_msg_get_uint(res, "checksum", &p->checksum, err)))
        return -1;
    if (!synced || h.len > TR_SHARE_HANDLE_MAX)
        return tr_errf(err, TR_EPEER, "sync_weights: published no buffer (a handle of %zu bytes)", h.len);
    if (rank > 0 && p->version != c->p[0].version)
        return tr_errf(err, TR_EPEER, "sync_weights: published step %lld, rank 0 step %lld", (long long)p->version,
                       (long long)c->p[0].version);
    memcpy(p->handle, h.ptr, h.len);
    p->handle_len = h.len;
    return 0;
}

static void build_read(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    const share_ctx *c = ctx;
    const published *p = &c->p[rank];
    tr_msg_begin_request(w, op, id, 5);
    tr_msg_put_int(w, "buffer", p->buffer);
    tr_msg_put_bin(w, "handle", p->handle, p->handle_len);
    tr_msg_put_int(w, "size", p->size);
    tr_msg_put_int(w, "version", p->version);
    tr_msg_put_bool(w, "verify", c->verify);
}

// Generator rank r reads what policy rank r published: the same version, and with verify
// the same weights (one layout on both sides, so the checksums of the two ranks match).
static int reply_read(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    const share_ctx *c = ctx;
    const published *p = &c->p[rank];
    int64_t version;
    uint64_t sum = 0;
    if (tr_msg_get_int(res, "version", &version, err) || (c->verify && tr_msg_get_uint(res, "checksum", &sum, err)))
        return -1;
    if (version != p->version)
        return tr_errf(err, TR_EPEER, "sync_weights: reads the weights of step %lld, the policy published step %lld",
                       (long long)version, (long long)p->version);
    if (c->verify && sum != p->checksum)
        return tr_errf(err, TR_EPEER, "sync_weights: the shared weights it reads have the checksum %016llx, policy "
                       "rank %d's %016llx", (unsigned long long)sum, rank, (unsigned long long)p->checksum);
    return 0;
}

int tr_weights_share_sync(tr_group *policy, tr_group *generator, bool verify, tr_sync_stats *out, tr_err *err) {
    memset(out, 0, sizeof *out);
    if (generator->world > policy->world)
        return tr_errf(err, TR_EINVAL, "sync_weights: %d %s ranks read the weights of %d %s ranks", generator->world,
                       generator->role, policy->world, policy->role);
    share_ctx c = {.verify = verify, .p = calloc((size_t)generator->world, sizeof *c.p)};
    if (!c.p) return tr_errf(err, TR_ENOMEM, "sync_weights: out of memory");
    double t0 = now_s();
    tr_call pub = {.op = "sync_weights", .ranks = generator->world, .build = build_publish, .reply = reply_publish,
                   .ctx = &c};
    tr_call read = {.op = "sync_weights", .build = build_read, .reply = reply_read, .ctx = &c};
    int rc = tr_group_call(policy, &pub, err);
    if (!rc) rc = tr_group_call(generator, &read, err);
    if (!rc) {
        out->version = c.p[0].version;
        out->seconds = now_s() - t0;
        out->verified = verify;
        out->checksum = c.p[0].checksum;
    }
    free(c.p);
    return rc;
}
