// Tensor-parallel rank processes for the commands that take --tp N (logprobs, generate): the
// command forks N - 1 copies of itself once its input is read and before it starts a backend;
// every rank then starts its own backend (CUDA: device --device + rank), loads its shard of
// the model, and forms the group's communicator (shared memory on the CPU, NCCL on CUDA) from
// the id rank 0 sends down a pipe. All ranks run the same passes; only rank 0 writes output.
#pragma once
#include <stdint.h>
#include <sys/types.h>

#include "engine/comm.h"
#include "engine/err.h"

typedef struct tr_tp_ranks {
    int32_t size, rank;
    pid_t pids[TR_COMM_MAX_RANKS];   // rank 0: every other rank's process
    int fds[2];                      // the communicator's id, rank 0 to the others
    tr_comm *comm;
} tr_tp_ranks;

// Forks size - 1 rank processes (size 1: none); returns in every process, t->rank saying
// which rank it is. Standard output and error are flushed first, so nothing buffered is
// written twice. The other ranks die with rank 0.
int tr_tp_ranks_fork(tr_tp_ranks *t, int32_t size, tr_err *err);
// The group's communicator over be (nothing at size 1), waiting up to a minute for every rank.
int tr_tp_ranks_comm(tr_tp_ranks *t, tr_backend *be, tr_err *err);
// v[0..n) becomes each value's minimum over the ranks (nothing at size 1): the sizes every
// rank must agree on, such as a memory plan's KV cache when devices have different room.
int tr_tp_ranks_min(tr_tp_ranks *t, int64_t *v, int32_t n, tr_err *err);
// The end of the command on rank `rank`, whose own result is rc (0 or 1, err filled when 1).
// Rank 0 aborts the communicator on failure, waits for the other ranks and returns 1 (err
// naming the rank) when one of them failed, else rc. Every other rank exits the process with
// rc (its error printed as the command's); it never returns.
int tr_tp_ranks_end(tr_tp_ranks *t, const char *cmd, int rc, tr_err *err);
