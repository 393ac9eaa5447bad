// The communicator ops of a role (docs/protocol.md, "Communicators"): comm_id makes a
// communicator on its rank 0 and returns its id, comm_join opens that id and starts joining
// without waiting, comm_ready waits until every rank has joined and hands the communicator to
// its user. Three exist: "tp", the ranks of one tensor-parallel group (the model's shards),
// "dp", a group's data-parallel ranks of one tensor-parallel rank (the trainer's gradient
// reductions), and "sync", the tensor-parallel ranks of the policy's dp rank 0 with every
// generator rank (sync_weights). The controller
// sends comm_ready only once every rank of every group it is forming has answered comm_join,
// so no rank waits inside an op for a peer that is still busy with another group's.
#include <stdio.h>
#include <string.h>

#include "roles/worker_impl.h"

// One communicator of a role as the ops see it: where it lives and this rank's place in it.
typedef struct comm_slot {
    const char *name;
    tr_comm **comm;
    char *id;                 // [TR_COMM_ID_MAX]: on rank 0, the id comm_id made
    int32_t rank, world;
} comm_slot;

// dp: the layout from init. sync: rank and world come with the op (the controller places the
// policy's first tensor-parallel group first and the generator's ranks after it), except where
// comm_id implies rank 0.
static int get_slot(tr_role_ctx *role, const tr_msg_map *a, const char *op, comm_slot *s, tr_err *err) {
    char name[16];
    if (tr_msg_get_str_buf(a, "name", name, sizeof name, err)) return -1;
    if (!role->w->has_backend)
        return tr_errf(err, TR_EINVAL, "%s: %s hosts no model, so it has no backend to communicate over", op, role->id);
    if (strcmp(name, "dp") == 0) {
        if (tr_msg_has(a, "rank") || tr_msg_has(a, "world"))
            return tr_errf(err, TR_EINVAL, "%s: the dp communicator takes its rank and world from init's parallel "
                           "layout, not from the op", op);
        if (role->dp < 2)
            return tr_errf(err, TR_EINVAL, "%s: %s has dp %d: a data-parallel communicator needs 2 or more ranks", op,
                           role->id, role->dp);
        *s = (comm_slot){"dp", &role->comm, role->comm_id, role->dp_rank, role->dp};
        return 0;
    }
    if (strcmp(name, "tp") == 0) {
        if (tr_msg_has(a, "rank") || tr_msg_has(a, "world"))
            return tr_errf(err, TR_EINVAL, "%s: the tp communicator takes its rank and world from init's parallel "
                           "layout, not from the op", op);
        if (role->tp < 2 || !role->has_model)
            return tr_errf(err, TR_EINVAL, "%s: %s has tp %d%s: a tensor-parallel communicator needs a model split "
                           "over 2 or more ranks", op, role->id, role->tp, role->has_model ? "" : " and no model");
        *s = (comm_slot){"tp", &role->tp_comm, role->tp_comm_id, role->tp_rank, role->tp};
        return 0;
    }
    if (strcmp(name, "sync") != 0)
        return tr_errf(err, TR_EINVAL, "%s: communicator '%s': only 'tp' (tensor parallel), 'dp' (data parallel) "
                       "and 'sync' (weight sync) exist", op, name);
    if (role->kind != TR_ROLE_POLICY && role->kind != TR_ROLE_GENERATOR)
        return tr_errf(err, TR_EINVAL, "%s: the %s role takes no part in the weight sync", op, role->name);
    int64_t rank = 0, world = 0;
    bool ready = strcmp(op, "comm_ready") == 0, id = strcmp(op, "comm_id") == 0;
    if (!ready && (tr_msg_get_int(a, "world", &world, err) || (!id && tr_msg_get_int(a, "rank", &rank, err))))
        return -1;
    if (ready) {
        if (!role->sync_comm)
            return tr_errf(err, TR_EINVAL, "comm_ready: %s has not joined a sync communicator", role->id);
        rank = tr_comm_rank(role->sync_comm);
        world = tr_comm_world(role->sync_comm);
    }
    if (world < 2 || world > TR_COMM_MAX_RANKS || rank < 0 || rank >= world)
        return tr_errf(err, TR_EINVAL, "%s: sync rank %lld of %lld (2..%d ranks)", op, (long long)rank,
                       (long long)world, TR_COMM_MAX_RANKS);
    // The senders are the policy's dp rank 0, its tensor-parallel rank k as sync rank k; every
    // other sync rank receives.
    bool sender = role->kind == TR_ROLE_POLICY;
    if (sender && (rank != role->tp_rank || role->dp_rank != 0))
        return tr_errf(err, TR_EINVAL, "%s: %s cannot be sync rank %lld: the policy's dp rank 0 sends, its tp rank k "
                       "as sync rank k", op, role->id, (long long)rank);
    if (!sender && rank == 0)
        return tr_errf(err, TR_EINVAL, "%s: %s cannot be sync rank 0 (the policy's)", op, role->id);
    *s = (comm_slot){"sync", &role->sync_comm, role->sync_comm_id, (int32_t)rank, (int32_t)world};
    return 0;
}

static tr_comm_opts comm_opts(tr_role_ctx *role, const comm_slot *s, char *name, size_t cap) {
    snprintf(name, cap, "%s %s", role->name, s->name);
    return (tr_comm_opts){.be = &role->w->be, .rank = s->rank, .world = s->world, .name = name, .stop = role->w->stop};
}

int tr_worker_op_comm_id(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", "world", NULL};
    comm_slot s;
    if (tr_msg_check_keys(&req->args, keys, err) || get_slot(role, &req->args, "comm_id", &s, err)) return -1;
    if (*s.comm) return tr_errf(err, TR_EINVAL, "comm_id: %s already has its %s communicator", role->id, s.name);
    if (s.rank != 0)
        return tr_errf(err, TR_EINVAL, "comm_id: %s is %s rank %d; rank 0 makes the id", role->id, s.name, s.rank);
    char name[64];
    tr_comm_opts o = comm_opts(role, &s, name, sizeof name);
    if (tr_comm_create(s.comm, &o, s.id, TR_COMM_ID_MAX, err)) return -1;
    tr_worker_logf(role, "comm_id: %s communicator %s for %d ranks", tr_comm_kind(*s.comm), s.id, s.world);
    tr_msg_begin_reply(rep, req->id, 1);
    tr_msg_put_str(rep, "id", s.id);
    return 0;
}

int tr_worker_op_comm_join(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", "id", "rank", "world", NULL};
    char id[TR_COMM_ID_MAX];
    comm_slot s;
    if (tr_msg_check_keys(&req->args, keys, err) || get_slot(role, &req->args, "comm_join", &s, err) ||
        tr_msg_get_str_buf(&req->args, "id", id, sizeof id, err))
        return -1;
    if (s.rank == 0) {
        if (!*s.comm || strcmp(id, s.id) != 0)
            return tr_errf(err, TR_EINVAL, "comm_join: %s (%s rank 0) did not make the id %.60s", role->id, s.name, id);
    } else {
        if (*s.comm) return tr_errf(err, TR_EINVAL, "comm_join: %s already has its %s communicator", role->id, s.name);
        char name[64];
        tr_comm_opts o = comm_opts(role, &s, name, sizeof name);
        if (tr_comm_open(s.comm, &o, id, err)) return -1;
    }
    if (tr_comm_join(*s.comm, err)) return -1;
    tr_msg_begin_reply(rep, req->id, 0);
    return 0;
}

int tr_worker_op_comm_ready(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"name", "timeout_ms", NULL};
    int64_t timeout = 60000;
    comm_slot s;
    if (tr_msg_check_keys(&req->args, keys, err) || get_slot(role, &req->args, "comm_ready", &s, err) ||
        tr_msg_get_int_opt(&req->args, "timeout_ms", &timeout, err))
        return -1;
    if (!*s.comm) return tr_errf(err, TR_EINVAL, "comm_ready: %s has not joined a %s communicator", role->id, s.name);
    if (timeout < 1 || timeout > 3600000)
        return tr_errf(err, TR_EINVAL, "comm_ready: timeout_ms %lld (1..3600000)", (long long)timeout);
    if (tr_comm_wait(*s.comm, (int)timeout, err)) return -1;
    if (s.comm == &role->comm && role->has_trainer && tr_trainer_set_comm(&role->trainer, role->comm, err)) return -1;
    if (s.comm == &role->tp_comm &&
        (tr_model_set_tp_comm(&role->model, role->tp_comm, err) || tr_worker_tp_agree(role, err)))
        return -1;
    tr_worker_logf(role, "comm_ready: %s rank %d of %d (%s)", s.name, s.rank, s.world, tr_comm_kind(*s.comm));
    tr_msg_begin_reply(rep, req->id, 3);
    tr_msg_put_int(rep, "rank", s.rank);
    tr_msg_put_int(rep, "world", s.world);
    tr_msg_put_str(rep, "kind", tr_comm_kind(*s.comm));
    return 0;
}
