// Weight resync: a trainer's ranks send the weights generation reads to generation-only
// engines (the generator role) over a communicator that spans both (engine/comm.h: shared
// memory between CPU processes, NCCL on GPUs), as a header and then buckets, each one
// broadcast. The senders are one tensor-parallel group of the trainer (tp a), ranks 0 .. a-1
// of the communicator, rank k being tensor-parallel rank k; every other rank receives, in a
// tensor-parallel layout of its own (tp b): each sender's buffer goes out bucket by bucket,
// and a receiver takes from each bucket what its layout holds (engine/reshard.h), or, where
// its layout is the sender's, receives the bucket in place. The header carries the weight
// version (the trainer's optimizer step), so a receiver knows which weights it holds, and the
// model's fingerprint and dtype, so a receiver of another model fails before any bucket moves.
// Which buffer generation reads is decided in one place, tr_resync_weights.
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
    size_t bytes;          // bytes broadcast: every sender's weights
    int32_t buckets;       // broadcasts the weights took
    int32_t senders;       // the trainer's tensor-parallel ranks that sent
    double seconds;        // header to last bucket, on this rank
} tr_resync_stats;

// Buckets of at most this many bytes when the sender is not told otherwise.
#define TR_RESYNC_BUCKET_DEFAULT ((size_t)256 << 20)

// A sender: rank m->tp.rank of c, one of the m->tp.size ranks 0 .. tp-1 that send; rank 0
// broadcasts version and the bucket length (bucket_bytes, 0: TR_RESYNC_BUCKET_DEFAULT), the
// others take rank 0's. Every rank of c runs its side at the same time. A failure aborts c
// for every rank.
int tr_resync_send(tr_comm *c, tr_model *m, int64_t version, size_t bucket_bytes, tr_resync_stats *st,
                   tr_err *err);
// A receiver (any rank past the senders): overwrites m's weights with its layout's part of the
// senders', bucket by bucket; fails (aborting c) when the senders' model or dtype is not m's.
// st->version is the senders' version.
int tr_resync_recv(tr_comm *c, tr_model *m, tr_resync_stats *st, tr_err *err);

// A checksum of the weights tr_resync_weights names that does not depend on how they are
// split: every element this rank counts (params.h) adds a hash of its tensor, its place in
// the whole HF tensor and its bits, modulo 2^64. The ranks of one tensor-parallel group sum to
// the same value at any tp, so equal sums on the senders and on every receiving group show
// the weights arrived bit for bit. Costs a download of every weight: for tests and checks,
// not every step of a long run.
int tr_resync_checksum(tr_model *m, uint64_t *sum, tr_err *err);
