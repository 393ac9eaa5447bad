// Weight resync: a trainer's rank sends the weights generation reads to generation-only
// engines (the generator role) over a communicator that spans both (engine/comm.h: shared
// memory between CPU processes, NCCL on GPUs), as a header and then buckets, each one
// broadcast. The header carries the weight version (the trainer's optimizer step), so a
// receiver knows which weights it holds, and the element count, so a receiver of another
// shape fails before any bucket moves. Which buffer generation reads is decided in one
// place, tr_resync_weights, so that a bf16 working copy can take the fp32 parameters' place.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/comm.h"
#include "engine/err.h"
#include "engine/model.h"

// The bytes generation reads, in backend memory: n elements of dtype at buf.
typedef struct tr_resync_view {
    void *buf;
    size_t n;
    enum tr_comm_dtype dtype;
} tr_resync_view;

tr_resync_view tr_resync_weights(tr_model *m);

typedef struct tr_resync_stats {
    int64_t version;       // the trainer's optimizer step the weights are from
    size_t bytes;          // bytes of weights moved (what each receiver got)
    int32_t buckets;       // broadcasts the weights took
    double seconds;        // header to last bucket, on this rank
} tr_resync_stats;

// Buckets of at most this many bytes when the sender is not told otherwise.
#define TR_RESYNC_BUCKET_DEFAULT ((size_t)256 << 20)

// The sender (rank `root` of c): broadcasts version and m's weights in buckets of at most
// bucket_bytes (0: TR_RESYNC_BUCKET_DEFAULT). Every other rank of c runs tr_resync_recv at
// the same time. A failure aborts c for every rank.
int tr_resync_send(tr_comm *c, int32_t root, tr_model *m, int64_t version, size_t bucket_bytes,
                   tr_resync_stats *st, tr_err *err);
// A receiver: overwrites m's weights with root's, bucket by bucket; fails (aborting c) when
// root's weights are not of m's size or type. st->version is root's version.
int tr_resync_recv(tr_comm *c, int32_t root, tr_model *m, tr_resync_stats *st, tr_err *err);

// FNV-1a (64 bit) of the bytes tr_resync_weights names, read back through the backend: equal
// checksums on sender and receivers show the copy is bit for bit. Costs a download of every
// weight, so it is for tests and checks, not every step of a long run.
int tr_resync_checksum(tr_model *m, uint64_t *sum, tr_err *err);
