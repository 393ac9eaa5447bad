// Collectives among the ranks of one group (a data-parallel group of workers) over buffers
// of backend memory: sum all-reduce, in-place reduce-scatter and all-gather with per-rank
// counts, broadcast, barrier, and abort. Two implementations behind one handle, picked by the
// backend: POSIX shared memory between CPU processes of one machine (comm_shm.c), and NCCL on
// the CUDA backend's stream (comm_nccl.c). A communicator is made in three steps so that
// several can form at once without deadlock: rank 0 creates it and its id (tr_comm_create),
// the others open that id (tr_comm_open), every rank starts joining without waiting
// (tr_comm_join), and only then waits for the rest (tr_comm_wait).
#pragma once
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "kernels/ops.h"

// Element types; sums are taken in the type's own precision. BF16 only moves (broadcast,
// all-gather: a bf16 working copy of the weights); its sums are refused.
enum tr_comm_dtype { TR_COMM_F32, TR_COMM_F64, TR_COMM_I64, TR_COMM_BF16 };
size_t tr_comm_dtype_size(enum tr_comm_dtype t);
const char *tr_comm_dtype_name(enum tr_comm_dtype t);

// An id as text ("shm:/troupe-..." or "nccl:<hex>"), what travels from rank 0 to the others.
#define TR_COMM_ID_MAX 320
// Ranks of one shared-memory communicator.
#define TR_COMM_MAX_RANKS 256

typedef struct tr_comm tr_comm;

typedef struct tr_comm_opts {
    tr_backend *be;             // this rank's backend: every buffer is its memory
    int32_t rank, world;
    const char *name;           // in messages, e.g. "policy dp" (NULL: "comm")
    int peer_timeout_ms;        // shm: a peer whose heartbeat stopped this long is dead (0: 5000)
    int op_timeout_ms;          // nccl: a collective running this long is aborted (0: 600000)
    const volatile sig_atomic_t *stop;  // when set (a signal handler), blocked calls fail
} tr_comm_opts;

// Rank 0: a new communicator and the id the other ranks open (shm: the segment is created
// now; nccl: a unique id whose bootstrap root lives in this process).
int tr_comm_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err);
// Ranks other than 0: the communicator of id, not joined yet.
int tr_comm_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err);
// Starts joining and returns without waiting for the other ranks.
int tr_comm_join(tr_comm *c, tr_err *err);
// Waits up to timeout_ms until every rank has joined; then collectives may run.
int tr_comm_wait(tr_comm *c, int timeout_ms, tr_err *err);
void tr_comm_free(tr_comm *c);

int32_t tr_comm_rank(const tr_comm *c);
int32_t tr_comm_world(const tr_comm *c);
const char *tr_comm_kind(const tr_comm *c);   // "shm" or "nccl"

// Every rank calls the same collectives in the same order with the same sizes (a mismatch is
// an error on shm). They return once the result is in buf (the backend is synced), or fail:
// a dead or aborted peer, a stop request, a device error. After a failure the communicator
// is aborted for every rank; it cannot be used again.
//
// buf[i] = sum over ranks r = 0, 1, ... of rank r's buf[i] (shm: in that order, so every rank
// gets the same bits on every run).
int tr_comm_all_reduce(tr_comm *c, void *buf, size_t n, enum tr_comm_dtype t, tr_err *err);
// buf holds sum(counts) elements; rank r's segment starts at counts[0] + ... + counts[r-1].
// Afterwards rank r's segment holds the sum over ranks of that segment (the rest of buf is
// left undefined).
int tr_comm_reduce_scatter(tr_comm *c, void *buf, const size_t *counts, enum tr_comm_dtype t,
                           tr_err *err);
// Afterwards every rank's buf holds each rank r's segment (laid out as above) as rank r had it.
int tr_comm_all_gather(tr_comm *c, void *buf, const size_t *counts, enum tr_comm_dtype t,
                       tr_err *err);
// buf = root's buf on every rank.
int tr_comm_broadcast(tr_comm *c, void *buf, size_t n, enum tr_comm_dtype t, int32_t root,
                      tr_err *err);
int tr_comm_barrier(tr_comm *c, tr_err *err);
// v[0..n) (host values) becomes each value's minimum over the ranks, through backend memory:
// sizes every rank must agree on, such as a KV cache planned from each device's room.
int tr_comm_min_i64(tr_comm *c, int64_t *v, int32_t n, tr_err *err);

// Marks the communicator dead for every rank; any thread may call it. Blocked and later
// collectives on every rank fail with a message naming this rank and why.
void tr_comm_abort(tr_comm *c, const char *why);
// Whether the communicator was aborted (by any rank) or failed.
bool tr_comm_dead(tr_comm *c);

// The contiguous shards of n elements over world ranks that ZeRO-1 and checkpoints use:
// rank r holds [begin(r), begin(r+1)), each a multiple of `align` elements except the last.
size_t tr_comm_shard_begin(size_t n, int32_t world, int32_t rank, size_t align);
