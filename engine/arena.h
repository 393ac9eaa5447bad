// A worker's activation memory: one 64-byte-aligned allocation from which every hosted
// model's activations and the policy's KV cache are carved. Phases (forward, train, generate)
// take the whole region in turn and lay their views out over it when they begin; a phase tag
// and an epoch make any use of views laid out in an earlier phase an error.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/generate.h"
#include "engine/model.h"

// Sizing rule, in bytes (T = the role's max_tokens, in the backend's activation dtype):
//   train    = tr_model_arena_bytes(cfg, {T, training}): every layer's saved activations
//              and the backward scratch (0 for a role that does not train);
//   forward  = tr_model_arena_bytes(cfg, {T, inference}): one layer set, the heads' buffers;
//   kv       = tr_kvcache_pool_bytes(cfg, block_size, kv_tokens): K and V of every layer
//              (0 for a role that does not generate);
//   need     = max(train, forward + kv)
// A role's phases never overlap (generate returns before train begins), so its training
// activations and its generation activations + KV blocks share the same bytes: generation
// puts the inference activations at the start of the region and the KV blocks right after.
// Only one op runs at a time in a worker process, so colocated roles share the region too:
//   region   = max over the hosted roles of need.
// Allocated separately the same roles would take the sum over roles of
//   separate = (train if training, else forward) + kv
// (a training policy generates on its training activations; the KV pool is its own).
typedef struct tr_arena_need {
    size_t train, forward, kv;
} tr_arena_need;

// One role's need: a model of cfg with mo's max_tokens, logit_rows and training, generating
// with go (NULL: the role does not generate), on a backend whose activation dtype is act.
void tr_arena_need_init(tr_arena_need *n, const tr_model_config *cfg, const tr_model_opts *mo,
                        const tr_gen_opts *go, tr_dt act);
size_t tr_arena_need_bytes(const tr_arena_need *n);
size_t tr_arena_separate_bytes(const tr_arena_need *n);

typedef enum tr_arena_phase {
    TR_PHASE_IDLE = 0,
    TR_PHASE_FORWARD,    // a model's inference activations (logprobs, values, scores)
    TR_PHASE_TRAIN,      // a training model's activations, every layer kept for backward
    TR_PHASE_GENERATE,   // inference activations, then the generator's KV blocks
} tr_arena_phase;

typedef struct tr_arena {
    tr_backend *be;         // whose memory the region is (not owned)
    void *base;             // bytes bytes of backend memory; NULL while 0
    size_t bytes;
    tr_arena_phase phase;
    const tr_model *holder; // the model whose views the current phase laid out; NULL idle
    uint64_t epoch;         // phases begun so far: views carry the epoch they were laid in
} tr_arena;

// A region of bytes bytes (0: none yet) of be's memory, zeroed.
int tr_arena_init(tr_arena *a, tr_backend *be, size_t bytes, tr_err *err);
// Grows the region to at least bytes, between phases only (at start-up, while roles are
// set up). The old contents are dropped: every model and generator lays its views out again
// when its next phase begins.
int tr_arena_reserve(tr_arena *a, size_t bytes, tr_err *err);
void tr_arena_free(tr_arena *a);

// m (set up with opts.acts on this region) runs only inside phases begun for it from now on.
void tr_arena_adopt(tr_arena *a, tr_model *m);
// Byte offset at which a generation phase for m puts the KV blocks: after m's inference
// activations. Where a generator on this region is given its KV buffer.
size_t tr_arena_kv_offset(const tr_model *m);

// Phases: each fails when another phase is running or the region is too small, else lays the
// holder's views out over the region and tags it. Generation also puts a caller-buffer KV
// pool at tr_arena_kv_offset and empties its block tables: nothing a generation leaves
// behind survives the phases in between.
int tr_arena_begin_forward(tr_arena *a, tr_model *m, tr_err *err);
int tr_arena_begin_train(tr_arena *a, tr_model *m, tr_err *err);
int tr_arena_begin_generate(tr_arena *a, tr_generator *g, tr_err *err);
void tr_arena_end(tr_arena *a);

const char *tr_arena_phase_name(tr_arena_phase p);
