// sync_weights: the tensor-parallel ranks of the policy's dp rank 0 broadcast the weights
// generation reads to every generator rank over the "sync" communicator (engine/resync.h),
// stamped with the optimizer step; a generator rank takes its layout's part of them and that
// version, which it stamps on every rollout it samples afterwards. A policy with no sync
// communicator generates on its own weights, so it has nothing to send and says so; weights
// shared on one device sync in worker_share.c.
#include <stdio.h>
#include <string.h>

#include "engine/resync.h"
#include "roles/worker_impl.h"

int64_t tr_worker_weight_version(const tr_role_ctx *role) {
    if (role->kind == TR_ROLE_GENERATOR) return role->weight_version;
    return role->has_trainer ? role->trainer.step : 0;
}

static void put_result(tr_role_ctx *role, tr_msg_writer *rep, uint64_t id, const tr_resync_stats *st, bool verify,
                       uint64_t sum) {
    tr_msg_begin_reply(rep, id, 6 + (verify ? 1 : 0));
    tr_msg_put_bool(rep, "synced", true);
    tr_msg_put_int(rep, "version", st->version);
    tr_msg_put_int(rep, "bytes", (int64_t)st->bytes);
    tr_msg_put_int(rep, "buckets", st->buckets);
    tr_msg_put_float(rep, "seconds", st->seconds);
    tr_msg_put_str(rep, "kind", tr_comm_kind(role->sync_comm));
    if (verify) tr_msg_put_uint(rep, "checksum", sum);
}

int tr_worker_op_sync_weights(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"bucket_bytes", "verify", "buffer", "handle", "size", "version", NULL};
    int64_t bucket = 0;
    bool verify = false;
    if (tr_msg_check_keys(&req->args, keys, err) || tr_msg_get_int_opt(&req->args, "bucket_bytes", &bucket, err) ||
        tr_msg_get_bool_opt(&req->args, "verify", &verify, err))
        return -1;
    if (bucket < 0 || bucket > ((int64_t)1 << 40))
        return tr_errf(err, TR_EINVAL, "sync_weights: bucket_bytes %lld (0: the default, at most 2^40)", (long long)bucket);
    if (role->has_wshare || role->has_wread) return tr_worker_share_sync(role, req, verify, rep, err);
    bool sender = role->kind == TR_ROLE_POLICY;
    if (!role->sync_comm) {
        if (!sender)
            return tr_errf(err, TR_EINVAL, "sync_weights: %s has no sync communicator (comm_ready name sync)",
                           role->id);
        tr_msg_begin_reply(rep, req->id, 2);
        tr_msg_put_bool(rep, "synced", false);
        tr_msg_put_str(rep, "reason", role->has_gen ? "generation runs on the trainer's weights"
                                                    : "the policy's dp rank 0 sends the weights");
        return 0;
    }
    tr_resync_stats st;
    int r;
    if (sender) {
        r = tr_resync_send(role->sync_comm, &role->model, tr_worker_weight_version(role), (size_t)bucket, &st, err);
    } else {
        // Half-received weights must never be sampled from: no version until this sync completes.
        role->weight_version = -1;
        r = tr_resync_recv(role->sync_comm, &role->model, &st, err);
        if (!r) role->weight_version = st.version;
    }
    uint64_t sum = 0;
    if (!r && verify) r = tr_resync_checksum(&role->model, &sum, err);
    if (r) return tr_err_wrap(err, "sync_weights");
    tr_worker_logf(role, "sync_weights: %s weights of step %lld, %zu bytes in %d buckets, %.4f s (%.3f GB/s)%s",
                   sender ? "sent" : "received", (long long)st.version, st.bytes, st.buckets, st.seconds,
                   st.seconds > 0 ? (double)st.bytes / st.seconds * 1e-9 : 0.0, verify ? ", checksum taken" : "");
    put_result(role, rep, req->id, &st, verify, sum);
    return 0;
}
