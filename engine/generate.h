// Batched generation with continuous batching over a paged KV cache. Each request's prompt is
// prefilled once; its n samples then share the prompt's blocks (a partially filled last block
// is copied when a sample first writes into it while others still share it) and decode one
// token per step together with every other running sample. Finished samples free their
// blocks at once and waiting ones take their place. The trunk is the training forward's own
// code (tr_model_forward_rows), so reported logprobs are the training path's.
//
// Admission reserves a sample's worst-case blocks (prompt + max_new_tokens - 1 positions)
// before it starts, so a running sample never runs out of blocks mid-decode: requests wait
// while the pool is short, and only a request whose prompt plus one sample exceeds the whole
// pool is an error.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/rng.h"
#include "engine/sample.h"
#include "engine/sample_tp.h"

// Rows of logits the generator samples at a time, at most: 512 rows of a 152K vocabulary take
// 1.2 GB of the sampler's sort storage.
#define TR_GEN_LOGIT_ROWS 512

typedef struct tr_gen_request {
    const int32_t *prompt;
    int32_t n_prompt;            // >= 1
    int32_t n_samples;           // >= 1, all continuing the same prompt
    tr_sample_params sampling;
    uint64_t seed;               // sample j draws from tr_rng_derive(seed, j)
    const int32_t *stop_ids;     // a sampled stop id ends the sample (and is part of it);
    int32_t n_stop;              // any number, any order, repeats allowed (a sorted copy is
                                 // searched per token)
    int32_t max_new_tokens;      // >= 1
    int32_t min_new_tokens;      // 0..max_new_tokens: a stop id sampled as one of the first
                                 // min_new_tokens tokens does not end the sample (it stays in
                                 // the output as any token), so benchmarks can force lengths
} tr_gen_request;

// How a sample ended. STOP and LENGTH have the values of roles' rollout finish codes.
enum tr_gen_finish { TR_GEN_RUNNING = -1, TR_GEN_STOP = 0, TR_GEN_LENGTH = 1 };

// One sample's result. logprobs[i] = ln p(tokens[i] | prompt, tokens[..i]) under the model's
// unmodified distribution (temperature 1, no top-k/top-p), whatever the sampling was.
typedef struct tr_gen_output {
    int32_t request, sample;
    int32_t *tokens;             // max_new_tokens entries allocated, n_tokens used
    float *logprobs;
    int32_t n_tokens;
    enum tr_gen_finish finish;
} tr_gen_output;

// Decode steps as graphs (kernels/ops.h graph_*): each step's rows are padded to a bucket
// (the next power of two, at most max_seqs) and its block tables to a bucket width, so that
// one step recorded per shape is replayed for every later step of that shape, one launch
// instead of hundreds. Padding rows write nothing into the KV cache (slot -1), read one slot
// of block 0 and sample greedily; their results are dropped, and in batch-invariant
// arithmetic they change no bit of the others. AUTO: where the backend records graphs (not with tensor parallelism, whose
// sampler talks to the other ranks); OFF: steps run op by op, unpadded; PAD: padded but not
// recorded (what the CPU backend, which has no graphs, can check of the padding).
enum tr_gen_graphs { TR_GEN_GRAPHS_AUTO, TR_GEN_GRAPHS_OFF, TR_GEN_GRAPHS_PAD };

// Recorded decode steps kept; past this the oldest is dropped.
#define TR_GEN_GRAPHS 48

typedef struct tr_gen_graph {
    int32_t rows, width;   // the bucket: rows and block-table entries per row
    bool ranked;           // some row ranks its logits (top-k/top-p): the draw sorts
    const void *weights;   // the working weights it read (double-buffered shared weights)
    void *exec;            // NULL until the shape's second step records it
} tr_gen_graph;

typedef struct tr_gen_opts {
    int64_t kv_tokens;     // KV pool capacity in tokens, rounded up to whole blocks (0: 16384)
    int32_t block_size;    // tokens per KV block (0: 16)
    int32_t max_seqs;      // samples decoded together (0: 64); at most the model's max_tokens
    int32_t max_seq_len;   // longest prompt + max_new_tokens - 1 accepted (0: the pool size)
    // The KV block pool in the caller's memory (64-byte aligned, kv_buf_bytes >=
    // tr_generator_kv_bytes), never freed by the generator; NULL: it allocates its own.
    void *kv_buf;
    size_t kv_buf_bytes;
    int graphs;            // enum tr_gen_graphs
} tr_gen_opts;

typedef struct tr_gen_stats {
    int64_t prefill_tokens;    // prompt tokens run through the trunk
    int64_t decode_tokens;     // tokens fed by decode steps
    int64_t decode_steps;
    int64_t passes;            // trunk forwards (prefill chunks and decode steps)
    int64_t waits;             // admission rounds that left a request waiting for KV blocks
    int32_t peak_seqs;         // most samples decoding at once
    int32_t peak_blocks;       // most KV blocks in use at once
    double decode_bytes;       // the decode steps' minimal memory traffic: the working
                               // weights once a step, and each row's keys and values
    double decode_seconds;     // wall time of the decode steps (each ends waiting for its
                               // ids), what decode_bytes is measured against
    double host_seconds;       // of which the host's scheduling: KV slots, copies on write
                               // queued, block tables packed, finished samples retired
    int64_t graph_steps;       // decode steps replayed from a recorded graph
    int64_t graphs_recorded;   // graphs recorded (new shapes) during the call
    int64_t table_entries;     // block-table entries a decode step sent to the device
    int64_t table_rewrites;    // steps that rewrote the device's tables whole
    int64_t padded_rows;       // padding rows the decode steps ran
    int64_t rows_sent;         // decode rows whose token and position the host sent (rows
                               // that started, moved or padded); the rest advanced on the
                               // device
    int64_t near_draws;        // draws within rounding of a cumulative boundary, where
                               // another summation order (another backend) could pick the
                               // neighbouring id: counted, so that a difference is explained
} tr_gen_stats;

// A decoding sample: its output, its share of the KV cache and the blocks still reserved
// for its growth.
typedef struct tr_gen_slot {
    int32_t out;
    int32_t reserved;
    tr_kv_seq kv;
} tr_gen_slot;

// The rows of one trunk pass that attend through the same block-table layout: rows
// [r0, r0 + n) read table + i * stride for their i-th row (stride 0: one shared table).
typedef struct tr_gen_segment {
    int32_t r0, n;
    const int32_t *table;
    int32_t stride;
    int32_t request;        // the request a prefill segment belongs to; -1 in decode steps
    int32_t start;          // the position of its first row (a prefill segment from 0 attends
                            // within the pass: pass_docs)
} tr_gen_segment;

typedef struct tr_generator {
    tr_model *model;            // not owned; an LM, inference or training set-up
    tr_kvcache cache;
    int32_t max_seqs;
    int32_t max_rows;           // rows per trunk pass (the model's max_tokens)
    int32_t logit_rows;         // rows of logits sampled at a time (TR_GEN_LOGIT_ROWS at most)
    int32_t table_cap;          // block-table entries per sequence
    int32_t max_seq_len;
    // Buffers of one pass, sized at init: host bookkeeping (pinned where a recorded decode
    // step copies from or to them: row_patch, target, lp, draw, table_upd; a decode step ends
    // with a sync, so the host never writes them while a copy from them waits; prefill passes
    // follow each other without one, and read the pageable row_slot, row_len) ...
    int32_t *row_ids, *row_pos, *row_slot, *row_len, *row_target;   // [max_rows]
    // A decode step's rows advance on the device (the decode_rows op): rows [0, dev_rows)
    // hold the last step's state there, dev_out[r] the output row r drew for; a step sends
    // row_patch ({k, then k (row, id, position)}) for the rows that did not simply continue:
    // started, moved into a freed slot, or padding. Any other pass (prefill) or draw writes
    // the rows the step reads, and sets dev_rows to 0.
    int32_t *row_patch;         // [1 + 3 max_seqs]
    int32_t *dev_out;           // [max_seqs]
    int32_t dev_rows;
    int32_t *dirty;             // [max_seqs] the step's rows whose block table may have changed
    int32_t n_dirty;            // (patched, or a block taken), the rows tables_update compares
    int32_t *row_out;           // [max_rows] the output each sampled row draws for
    int32_t *fin_reqs;          // [max_rows] the requests a prefill pass finished, in order
    float *row_lp;              // [max_rows]
    tr_sample_row *row_draw;    // [max_rows] each sampled row's parameters and stream
    tr_gen_segment *segs;       // [max_rows]
    int32_t n_segs;
    // A prefill pass's segments as documents (n_docs 0: none, a decode step): those that
    // start at position 0 have all their keys in the pass and take attention_forward, the
    // training path's kernel, instead of reading them back from the cache.
    tr_doc_layout pass_docs;
    int32_t *seg_docs;          // [max_rows + 1] its document starts, on the host
    int32_t *tables;            // [max_seqs][table_cap]: slot i's block table
    // A decode step's tables on the device are rows table_w entries apart (the step's width
    // bucket), kept there between steps: tables_dev mirrors what d_tables holds, and a step
    // sends only the entries that changed, as table_upd's (index, block) pairs (the first
    // n_table_upd of them; the rest write a dummy area past the tables), or rewrites them all
    // when the width changes or more changed than the pairs hold.
    int32_t *tables_dev;        // [max_seqs][table_cap] capacity
    int32_t *table_upd;         // [2 n_table_upd]: indices, then blocks
    int32_t n_table_upd, table_w;
    // ... and the backend copies the ops read (one allocation, dev).
    void *dev;
    int32_t *d_slot, *d_len;    // [max_rows] cache slot and attended length of each row
    int32_t *d_tables;          // [max_seqs][table_cap] decode block tables, then
                                // [n_table_upd] the dummy area
    int32_t *d_table_upd;       // [2 n_table_upd] table_upd's copy
    int32_t *d_patch;           // [1 + 3 max_seqs] row_patch's copy
    int32_t *d_seg_tables;      // [max_seqs][table_cap] a prefill pass's prompt tables
    int32_t *d_seg_docs;        // [max_rows + 1] pass_docs.doc_start
    int32_t *d_target;          // [max_rows] sampled ids
    float *d_lp;                // [max_rows] their logprobs
    tr_sample_row *d_draw;      // [max_rows]
    int32_t *d_near;            // near-boundary draws of the current call
    void *sample_scratch;       // the sample op's (NULL under tensor parallelism)
    tr_sample_tp vp;            // tensor parallelism: the vocab-parallel sampler (else unset)
    tr_gen_slot *slots;         // [max_seqs]; slots [0, n_active) are decoding
    int32_t n_active;
    int32_t reserved;           // blocks promised to admitted samples, not yet taken
    tr_gen_stats stats;         // of the last tr_generate
    // Decode graphs (enum tr_gen_graphs): whether steps are padded to buckets and recorded,
    // the recorded steps and the memory they were recorded over (activations, KV pool): a
    // move drops them all.
    bool pad_steps, record_steps;
    tr_gen_graph graphs[TR_GEN_GRAPHS];
    int32_t n_graphs;
    const void *graph_acts, *graph_kv;
    // Set after init to hear of every trunk pass (e.g. to report progress); the outputs of
    // the running tr_generate tell which samples have finished so far.
    void (*on_pass)(void *ctx, const tr_gen_stats *stats);
    void *on_pass_ctx;
    // Set by tr_arena_begin_generate when the model's activations (and the KV pool) live in
    // a worker arena: tr_generate runs only in the generation phase that laid them out.
    const struct tr_arena *shared;
    uint64_t shared_epoch;
} tr_generator;

// Bytes of the KV pool opts describe for cfg (defaults applied) in activation dtype act, as
// tr_kvcache_pool_bytes.
// cfg is the rank's under tensor parallelism (tr_tp_local_config: its key/value heads).
size_t tr_generator_kv_bytes(const tr_model_config *cfg, const tr_gen_opts *opts, tr_dt act);

// Sizes the KV pool and every per-pass buffer for model m (which must have an LM head). All
// the generator's memory is taken here; tr_generate allocates only per-call bookkeeping sized
// by its requests (and the outputs), before its first pass.
int tr_generator_init(tr_generator *g, tr_model *m, const tr_gen_opts *opts, tr_err *err);
void tr_generator_free(tr_generator *g);

// Runs the requests to completion. outs has sum(n_samples) entries, filled request by
// request, samples in order; their buffers are allocated here (before any step) and freed by
// tr_gen_outputs_free. Requests are checked before anything runs: errors name the request.
// The cache starts empty with fresh block tables (nothing survives from an earlier call, so
// other phases may overwrite the pool in between) and is left empty, on error too; outs then
// hold no buffers.
int tr_generate(tr_generator *g, const tr_gen_request *reqs, int32_t n_reqs,
                tr_gen_output *outs, tr_err *err);
void tr_gen_outputs_free(tr_gen_output *outs, int64_t n);

// Blocks one sample of a request needs beyond the prompt's shared full blocks, worst case.
int32_t tr_gen_sample_blocks(int32_t n_prompt, int32_t max_new_tokens, int32_t block_size);
