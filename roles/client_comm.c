// Forming communicators from the controller: the tensor-parallel and data-parallel ones of
// each role group, and the weight-sync one spanning the policy's first tensor-parallel group
// and the generator's ranks. The id comes from
// the communicator's rank 0 (comm_id), goes to every rank (comm_join, which returns without
// waiting) and only then is every rank asked to wait for the others (comm_ready). Each step
// is one call to all the groups at once, so a worker hosting ranks of several groups never
// blocks in one group's step while a peer waits for it in another's.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/comm.h"
#include "roles/client.h"
#include "roles/client_impl.h"

typedef struct comm_ctx {
    char id[TR_COMM_ID_MAX];   // sync: the one communicator's id
    int timeout_ms;
    // A group's communicators of one kind: "dp" (one per tensor-parallel rank k, over the
    // ranks d * tp + k) or "tp" (one per data-parallel rank d, over d * tp .. d * tp + tp - 1),
    // each of `world` ranks; ids[i] is communicator i's.
    const char *name;
    int32_t tp, world, n;
    char (*ids)[TR_COMM_ID_MAX];
    // The sync communicator: its world, and the sync rank of the group's rank 0 (each rank r
    // of the group is first + r).
    int32_t sync_world, sync_first;
} comm_ctx;

static bool is_dp(const comm_ctx *c) { return strcmp(c->name, "dp") == 0; }

// Which of the group's communicators rank r is in, and its rank there.
static int32_t comm_index(const comm_ctx *c, int32_t r) { return is_dp(c) ? r % c->tp : r / c->tp; }
static int32_t comm_rank(const comm_ctx *c, int32_t r) { return is_dp(c) ? r / c->tp : r % c->tp; }

static void build_id(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 1);
    tr_msg_put_str(w, "name", c->name);
}

// Every communicator's rank 0 reports its id.
static int reply_group_id(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    comm_ctx *c = ctx;
    return tr_msg_get_str_buf(res, "id", c->ids[comm_index(c, rank)], TR_COMM_ID_MAX, err);
}

static int reply_id(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    (void)rank;
    comm_ctx *c = ctx;
    return tr_msg_get_str_buf(res, "id", c->id, sizeof c->id, err);
}

static void build_join(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 2);
    tr_msg_put_str(w, "name", c->name);
    tr_msg_put_str(w, "id", c->ids[comm_index(c, rank)]);
}

static void build_ready(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 2);
    tr_msg_put_str(w, "name", c->name);
    tr_msg_put_int(w, "timeout_ms", c->timeout_ms);
}

// Each rank reports its place: in a dp communicator dp_rank = rank / tp, in a tp one
// tp_rank = rank % tp.
static int reply_ready(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    const comm_ctx *c = ctx;
    int64_t r, world;
    if (tr_msg_get_int(res, "rank", &r, err) || tr_msg_get_int(res, "world", &world, err)) return -1;
    if (world != c->world || r != comm_rank(c, rank))
        return tr_errf(err, TR_EPEER, "comm_ready: %s rank %lld of %lld, expected %d of %d (rank %d)", c->name,
                       (long long)r, (long long)world, comm_rank(c, rank), c->world, rank);
    return 0;
}

// Every group's communicators of one kind at once: comm_id to each communicator's rank 0,
// comm_join to every rank with its communicator's id, comm_ready.
static int groups_comm_init(tr_group *const *gs, int n, const char *name, int timeout_ms, tr_err *err) {
    if (n < 1) return 0;
    comm_ctx *cs = calloc((size_t)n, sizeof *cs);
    tr_call *calls = calloc((size_t)n, sizeof *calls);
    int rc = !cs || !calls ? tr_errf(err, TR_ENOMEM, "communicators: out of memory") : 0;
    bool dp = strcmp(name, "dp") == 0;
    for (int i = 0; i < n && !rc; i++) {
        comm_ctx *c = &cs[i];
        c->name = name;
        c->timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
        c->tp = gs[i]->tp > 0 ? gs[i]->tp : 1;
        c->world = dp ? gs[i]->world / c->tp : c->tp;
        c->n = gs[i]->world / c->world;
        if (c->world < 2)
            rc = tr_errf(err, TR_EINVAL, "%s: a %s communicator needs 2 or more ranks (got %d)", gs[i]->role,
                         dp ? "data-parallel" : "tensor-parallel", c->world);
        else if (!(c->ids = calloc((size_t)c->n, sizeof *c->ids)))
            rc = tr_errf(err, TR_ENOMEM, "communicators: out of memory");
        // dp: ranks 0 .. tp-1 are the communicators' rank 0; tp: every tp-th rank.
        calls[i] = (tr_call){.op = "comm_id", .ranks = dp ? c->tp : 0, .stride = dp ? 0 : c->tp,
                             .build = build_id, .reply = reply_group_id, .ctx = c};
    }
    if (!rc) rc = tr_group_call_many(gs, calls, n, err);
    for (int i = 0; i < n && !rc; i++)
        calls[i] = (tr_call){.op = "comm_join", .build = build_join, .ctx = &cs[i]};
    if (!rc) rc = tr_group_call_many(gs, calls, n, err);
    for (int i = 0; i < n && !rc; i++)
        calls[i] = (tr_call){.op = "comm_ready", .build = build_ready, .reply = reply_ready, .ctx = &cs[i]};
    if (!rc) rc = tr_group_call_many(gs, calls, n, err);
    for (int i = 0; cs && i < n; i++) free(cs[i].ids);
    free(cs);
    free(calls);
    return rc ? tr_err_wrap(err, "forming the %s communicators", dp ? "data-parallel" : "tensor-parallel") : 0;
}

int tr_groups_comm_init(tr_group *const *gs, int n, int timeout_ms, tr_err *err) {
    return groups_comm_init(gs, n, "dp", timeout_ms, err);
}

int tr_groups_tp_comm_init(tr_group *const *gs, int n, int timeout_ms, tr_err *err) {
    return groups_comm_init(gs, n, "tp", timeout_ms, err);
}

// ---- the weight-sync communicator ----

static void build_sync_id(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 2);
    tr_msg_put_str(w, "name", "sync");
    tr_msg_put_int(w, "world", c->sync_world);
}

static void build_sync_join(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 4);
    tr_msg_put_str(w, "name", "sync");
    tr_msg_put_str(w, "id", c->id);
    tr_msg_put_int(w, "rank", c->sync_first + rank);
    tr_msg_put_int(w, "world", c->sync_world);
}

static void build_sync_ready(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)rank;
    (void)ranks;
    const comm_ctx *c = ctx;
    tr_msg_begin_request(w, op, id, 2);
    tr_msg_put_str(w, "name", "sync");
    tr_msg_put_int(w, "timeout_ms", c->timeout_ms);
}

static int reply_sync_ready(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    const comm_ctx *c = ctx;
    int64_t r, world;
    if (tr_msg_get_int(res, "rank", &r, err) || tr_msg_get_int(res, "world", &world, err)) return -1;
    if (world != c->sync_world || r != c->sync_first + rank)
        return tr_errf(err, TR_EPEER, "comm_ready: sync rank %lld of %lld, expected %d of %d", (long long)r,
                       (long long)world, c->sync_first + rank, c->sync_world);
    return 0;
}

int tr_groups_sync_comm_init(tr_group *policy, tr_group *generator, int timeout_ms, tr_err *err) {
    // The policy's first tensor-parallel group (dp rank 0) sends: its ranks come first.
    int32_t senders = policy->tp > 0 ? policy->tp : 1, world = senders + generator->world;
    comm_ctx cs[2];
    memset(cs, 0, sizeof cs);
    for (int i = 0; i < 2; i++) {
        cs[i].timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
        cs[i].sync_world = world;
        cs[i].sync_first = i == 0 ? 0 : senders;
    }
    tr_group *gs[2] = {policy, generator};
    tr_call calls[2] = {{.op = "comm_id", .ranks = 1, .build = build_sync_id, .reply = reply_id, .ctx = &cs[0]}};
    int rc = tr_group_call(policy, &calls[0], err);
    if (!rc) memcpy(cs[1].id, cs[0].id, sizeof cs[1].id);
    for (int i = 0; i < 2 && !rc; i++)
        calls[i] = (tr_call){.op = "comm_join", .ranks = i == 0 ? senders : 0, .build = build_sync_join, .ctx = &cs[i]};
    if (!rc) rc = tr_group_call_many(gs, calls, 2, err);
    for (int i = 0; i < 2 && !rc; i++)
        calls[i] = (tr_call){.op = "comm_ready", .ranks = i == 0 ? senders : 0, .build = build_sync_ready,
                             .reply = reply_sync_ready, .ctx = &cs[i]};
    if (!rc) rc = tr_group_call_many(gs, calls, 2, err);
    return rc ? tr_err_wrap(err, "forming the weight-sync communicator of %s/0..%d and %d %s ranks", policy->role,
                            senders - 1, generator->world, generator->role)
              : 0;
}
