// Working weights shared, without a copy, with generation in another process on the same
// device (kernels/share.h: CUDA IPC on a GPU, POSIX shared memory on the CPU). The trainer's
// working copy lives in n shared buffers; a sync publishes the one the model is in, with the
// weights' version, and the generator maps that buffer and reads it in place.
//
// With one buffer the trainer writes the buffer generation reads, which is right only when
// the two never overlap. With two (the one-step-off pipeline: generation of step k+1 runs
// while step k trains) the trainer never writes the buffer it last published: the first write
// after a publish copies that buffer into the other and moves the model there, so a
// generation still reading the published weights sees them unchanged; the next publish names
// the other buffer, and the generator reads it once its running generation is done (the
// controller syncs only then).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/model.h"
#include "kernels/share.h"

typedef struct tr_wshare {
    tr_backend *be;
    int32_t n;                       // buffers: 1 or 2
    size_t bytes;                    // of each
    void *buf[2];
    tr_share_handle handle[2];
    int32_t cur;                     // the buffer the model's working weights are
    int32_t published;               // the buffer generation was last told to read (-1: none)
    int64_t version;                 // the version published with it
} tr_wshare;

// The trainer's side: n shared buffers of m's working weights; m (made with external_work)
// is bound to the first. Then m's weights are loaded or drawn as usual.
int tr_wshare_init(tr_wshare *s, tr_model *m, int32_t n, tr_err *err);
void tr_wshare_free(tr_wshare *s);
// Before anything writes m's working weights (a train step, a load): with two buffers, when
// m's is the published one, copies it into the other and binds m there.
int tr_wshare_begin_write(tr_wshare *s, tr_model *m, tr_err *err);
// Marks m's buffer as what generation reads from now on, holding weights of `version`;
// returns its index (m's weights must be complete: the trainer has synced its stream).
int32_t tr_wshare_publish(tr_wshare *s, int64_t version);

// The generator's side: the trainer's buffers, each mapped the first time a sync names it.
typedef struct tr_wshare_reader {
    tr_backend *be;
    size_t bytes;
    void *buf[2];
    tr_share_handle handle[2];
    int32_t reading;                 // the buffer the model reads (-1: none yet)
} tr_wshare_reader;

void tr_wshare_reader_init(tr_wshare_reader *r, tr_model *m);
// Binds m (made with external_work) to buffer `index` of the trainer's, opening it through h
// on first use; a buffer already open must come with the same handle and size.
int tr_wshare_read(tr_wshare_reader *r, tr_model *m, int32_t index, const tr_share_handle *h, size_t bytes,
                   tr_err *err);
void tr_wshare_reader_free(tr_wshare_reader *r);
