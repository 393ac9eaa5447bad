// The communicator ops of a role (docs/protocol.md, "Communicators"): comm_id makes the
// data-parallel communicator on the group's rank 0 and returns its id, comm_join opens that
// id and starts joining without waiting, comm_ready waits until every rank has joined and
// hands the communicator to the trainer. The controller sends comm_ready only once every
// rank of every group it is forming has answered comm_join, so no rank waits inside an op
// for a peer that is still busy with another group's.
#include <stdio.h>
#include <string.h>

#include "roles/worker_impl.h"

static int check_name(tr_role_ctx *rc, const tr_msg_map *a, const char *op, tr_err *err) {
    char name[16];
    if (tr_msg_get_str_buf(a, "name", name, sizeof name, err)) return -1;
    if (strcmp(name, "dp") != 0)
        return tr_errf(err, TR_EINVAL, "%s: communicator '%s': only 'dp' (data parallel) exists", op, name);
    if (rc->dp < 2)
        return tr_errf(err, TR_EINVAL, "%s: %s has dp %d: a data-parallel communicator needs 2 or more ranks", op,
                       rc->id, rc->dp);
    if (!rc->w->has_backend)
        return tr_errf(err, TR_EINVAL, "%s: %s hosts no model, so it has no backend to communicate over", op, rc->id);
    return 0;
}

static tr_comm_opts comm_opts(tr_role_ctx *rc, char *name, size_t cap) {
    snprintf(name, cap, "%s dp", rc->name);
    return (tr_comm_opts){.be = &rc->w->be, .rank = rc->dp_rank, .world = rc->dp, .name = name,
                          .stop = rc->w->stop};
}

int tr_worker_op_comm_id(tr_role_ctx *rc, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", NULL};
    if (tr_msg_check_keys(&req->args, keys, err) || check_name(rc, &req->args, "comm_id", err)) return -1;
    if (rc->comm) return tr_errf(err, TR_EINVAL, "comm_id: %s already has its dp communicator", rc->id);
    if (rc->dp_rank != 0)
        return tr_errf(err, TR_EINVAL, "comm_id: %s is dp rank %d; rank 0 makes the id", rc->id, rc->dp_rank);
    char name[64];
    tr_comm_opts o = comm_opts(rc, name, sizeof name);
    if (tr_comm_create(&rc->comm, &o, rc->comm_id, sizeof rc->comm_id, err)) return -1;
    tr_worker_logf(rc, "comm_id: %s communicator %s for %d ranks", tr_comm_kind(rc->comm), rc->comm_id, rc->dp);
    tr_msg_begin_reply(rep, req->id, 1);
    tr_msg_put_str(rep, "id", rc->comm_id);
    return 0;
}

int tr_worker_op_comm_join(tr_role_ctx *rc, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", "id", NULL};
    char id[TR_COMM_ID_MAX];
    if (tr_msg_check_keys(&req->args, keys, err) || check_name(rc, &req->args, "comm_join", err) ||
        tr_msg_get_str_buf(&req->args, "id", id, sizeof id, err))
        return -1;
    if (rc->dp_rank == 0) {
        if (!rc->comm || strcmp(id, rc->comm_id) != 0)
            return tr_errf(err, TR_EINVAL, "comm_join: %s (dp rank 0) did not make the id %.60s", rc->id, id);
    } else {
        if (rc->comm) return tr_errf(err, TR_EINVAL, "comm_join: %s already has its dp communicator", rc->id);
        char name[64];
        tr_comm_opts o = comm_opts(rc, name, sizeof name);
        if (tr_comm_open(&rc->comm, &o, id, err)) return -1;
    }
    if (tr_comm_join(rc->comm, err)) return -1;
    tr_msg_begin_reply(rep, req->id, 0);
    return 0;
}

int tr_worker_op_comm_ready(tr_role_ctx *rc, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", "timeout_ms", NULL};
    int64_t timeout = 60000;
    if (tr_msg_check_keys(&req->args, keys, err) || check_name(rc, &req->args, "comm_ready", err) ||
        tr_msg_get_int_opt(&req->args, "timeout_ms", &timeout, err))
        return -1;
    if (!rc->comm) return tr_errf(err, TR_EINVAL, "comm_ready: %s has not joined a dp communicator", rc->id);
    if (timeout < 1 || timeout > 3600000)
        return tr_errf(err, TR_EINVAL, "comm_ready: timeout_ms %lld (1..3600000)", (long long)timeout);
    if (tr_comm_wait(rc->comm, (int)timeout, err)) return -1;
    if (rc->has_trainer && tr_trainer_set_comm(&rc->trainer, rc->comm, err)) return -1;
    tr_worker_logf(rc, "comm_ready: dp rank %d of %d (%s)", rc->dp_rank, rc->dp, tr_comm_kind(rc->comm));
    tr_msg_begin_reply(rep, req->id, 3);
    tr_msg_put_int(rep, "rank", rc->dp_rank);
    tr_msg_put_int(rep, "world", rc->dp);
    tr_msg_put_str(rep, "kind", tr_comm_kind(rc->comm));
    return 0;
}
