// The backend op table: every numeric op the engine needs, as forward/backward pairs over
// flat row-major buffers. kernels/cpu and kernels/cuda implement the same table; model code
// (engine/) is written once against it. CPU results are deterministic for any thread count
// (fixed work split, no racy reductions); CUDA results do not depend on timing.
//
// Precision is decided by the role a buffer plays, not by a dtype on each view. A backend
// declares two dtypes at init (tr_backend.act and .wt):
//   A  activation dtype: inputs of GEMMs and attention (norm outputs, q/k/v, attention
//      output, SwiGLU in/out), the LM head's logits (as its GEMM rounds them, which is
//      where transformers' bf16 autocast rounds them too), activation gradients and the KV
//      cache. `void *` below.
//   W  working-weight dtype: weights as forward and backward read them. `const void *`.
//   F  fp32 always: the residual stream and its gradient, master weights, parameter
//      gradients, Adam moments, norm statistics (rstd), lse, logprobs, entropy and losses.
//      `float *`.
// fp32/fp32 on the CPU backend by default, bf16/bf16 on CUDA; either backend runs either
// (the CPU's bf16 mode emulates CUDA's rounding points so that CI runs the mixed path).
// Every op converts its A/W inputs to fp32 exactly, computes in fp32, and rounds each output
// once to its buffer's dtype (round to nearest even); GEMMs multiply A by W and accumulate in
// fp32. So two backends in the same precision differ only by summation order.
//
// Conventions: T = tokens (rows), C = channels. Parameter gradients (dw, db, dtable: F) are
// ACCUMULATED (+=), as in llm.c, so the caller zeroes them once per step and a tied weight
// collects both uses. Activation gradients (A) have a single producer and are WRITTEN; the
// residual stream's gradient (F) is the one accumulated activation gradient: rmsnorm_backward
// adds into it. Strided views (ld = elements between the starts of consecutive token rows)
// let fused [q;k;v] and [gate;up] GEMM outputs be read in place.
// Pointers are device pointers of the backend, from its alloc (host memory for cpu), and so
// are the arrays inside tr_doc_layout, tr_kv_pages and every index array an op reads; the
// structs themselves and scalar arguments are host values. Ops run in call order on the
// backend's stream; nothing is read back until a download and a sync.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/fault.h"

// Element types of backend buffers. F16 appears only as the source of convert (checkpoint
// files); the model never computes in it.
typedef enum tr_dt { TR_F32 = 0, TR_BF16 = 1, TR_F16 = 2 } tr_dt;

static inline size_t tr_dt_size(tr_dt t) { return t == TR_F32 ? 4 : 2; }
static inline const char *tr_dt_name(tr_dt t) {
    return t == TR_F32 ? "fp32" : t == TR_BF16 ? "bf16" : "fp16";
}

typedef struct tr_backend tr_backend;

// Token layout of a batch for attention and RoPE: T tokens in n_docs contiguous documents;
// doc d covers tokens [doc_start[d], doc_start[d+1]). Attention is causal inside a document
// and never crosses one; pos[t] is the RoPE position of token t (restarts at 0 per document).
// A shared prefix (the prompt of n samples, computed once): prefix[d] >= 0 names an earlier
// document whose tokens stand before doc d's in its context. Doc d's token at offset i sees
// all L = len(prefix[d]) of them, then its own tokens 0..i, in that order, as the token at
// context position L + i of one unshared document would (keys are taken in context order,
// so the rows' bits are the unshared layout's); its pos restart at L. A prefix document has
// no prefix of its own, and the documents naming it follow it directly.
typedef struct tr_doc_layout {
    int32_t n_tokens;
    int32_t n_docs;
    const int32_t *doc_start;   // n_docs + 1 entries, doc_start[0] = 0, doc_start[n_docs] = T
    const int32_t *pos;         // T entries
    const int32_t *prefix;      // n_docs entries, -1: none; NULL: no document has a prefix
} tr_doc_layout;

// Paged KV cache for generation: a pool of blocks of block_size tokens; each sequence lists
// its blocks. k and v pools are [n_blocks][block_size][n_kv_heads][head_dim] in dtype A.
typedef struct tr_kv_pages {
    void *k_pool;
    void *v_pool;
    int32_t block_size;
    int32_t n_blocks;
    int32_t n_kv_heads;
    int32_t head_dim;
} tr_kv_pages;

// Every layer's K and V pools at once, for block copies (kv_copy_blocks): layer l's K pool
// starts layer_bytes after layer l-1's (V likewise), and holds blocks of block_size slots of
// slot_bytes each, a slot being one token's n_kv_heads * head_dim values in any dtype.
typedef struct tr_kv_pool {
    void *k, *v;
    size_t layer_bytes;
    int32_t n_layers, block_size;
    size_t slot_bytes;
} tr_kv_pool;

typedef struct tr_sample_row {   // one row of logits' draw
    float temperature;   // 0: greedy (argmax, lowest id on ties; draws nothing)
    int32_t top_k;       // 0: no limit
    float top_p;         // 1: no limit
    uint64_t seed;       // the row's Philox stream (tr_rng's seed)
    uint64_t counter;    // tr_rng's counter: blocks consumed so far
    int32_t used;        // tr_rng's used: words of block counter-1 handed out (4: none left)
} tr_sample_row;

// Whether the row's draw ranks the logits (top-k or top-p applies): the sample op's `ranked`.
static inline bool tr_sample_row_ranked(const tr_sample_row *r, int32_t V) {
    return r->temperature != 0.0f && ((r->top_k > 0 && r->top_k < V) || r->top_p < 1.0f);
}
static inline bool tr_sample_rows_ranked(const tr_sample_row *rows, int32_t B, int32_t V) {
    for (int32_t b = 0; b < B; b++)
        if (tr_sample_row_ranked(&rows[b], V)) return true;
    return false;
}

// A draw is "near" when its uniform target lies within TR_SAMPLE_NEAR of the kept weight
// of a cumulative boundary, or top-p's cut within TR_SAMPLE_NEAR of the nucleus mass of its
// limit: only there can another summation order pick a neighbouring id.
#define TR_SAMPLE_NEAR 1e-12

// One token of a tensor-parallel rank's vocabulary columns as vocab-parallel sampling
// exchanges it: its logit and its id in the whole vocabulary (-1: none, in a list longer than
// the rank's columns).
typedef struct tr_sample_cand {
    float logit;
    int32_t id;
} tr_sample_cand;

// matmul_forward flags.
enum { TR_MM_OUT_F32 = 1 };

// A span of the flat range an AdamW call updates, with its weight decay (0 for norms and
// biases): segments tile [0, n) in order. Backend memory.
typedef struct tr_adamw_seg {
    uint64_t begin, end;
    float wd;
    int32_t pad_;
} tr_adamw_seg;

// AdamW with decoupled weight decay and bias correction at step t (1-based), over n
// elements (host struct; every pointer is backend memory). With the gradient clipped by
// c = min(1, max_norm / (sqrt(*sumsq) + 1e-6)) (c = 1 when max_norm <= 0):
//   g' = c g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2; mh = m/(1-b1^t); vh = v/(1-b2^t);
//   p -= lr * (mh / (sqrt(vh) + eps) + wd * p)
// then work (dtype wt, NULL when the masters are the working weights) = p rounded. When
// *sumsq is not finite nothing is written, so a bad step is skipped without the host waiting
// first. All of one tensor-wide formula in one pass (one launch on CUDA).
typedef struct tr_adamw_args {
    float *p;                   // fp32 masters
    void *work;                 // working copy, dtype wt; NULL: none
    const float *g;
    float *m, *v;
    size_t n;
    const tr_adamw_seg *segs;   // n_segs spans tiling [0, n)
    int32_t n_segs;
    const double *sumsq;        // the global sum of squared gradients (one double)
    float max_norm;
    float lr, b1, b2, eps;
    int32_t t;
    tr_dt wt;
} tr_adamw_args;

// A decode step's n rows advanced where they live, so that the host sends only what changed
// (the decode_rows op): row r takes id drawn[r] (the last step's draw at row r) and position
// pos[r] + 1, unless patch names it. patch = {k, then k triples (row, id, position)}, rows
// ascending; a patched row takes the triple's id and position, position -1 marking a padding
// row (id 0, position 0, no cache slot). Then every row: len[r] = pos[r] + 1 (the context it
// attends, itself included), slot[r] = tables[r w + pos[r] / bs] bs + pos[r] % bs (the cache
// slot its key goes to; -1 for padding), doc_start[r] = r (doc_start[n] = n: a document a
// row) and, where emb_ids is set (tensor parallelism), emb_ids[r] = ids[r] - v0 when that is
// in [0, V) (a row of this rank's embedding), else -1. All int32 backend memory; tables has n
// rows of w blocks of bs slots.
typedef struct tr_decode_rows_args {
    int32_t *ids, *pos, *slot, *len, *doc_start;
    int32_t *emb_ids;   // NULL: none
    const int32_t *drawn, *patch, *tables;
    int32_t w, bs, n;
    int32_t v0, V;      // emb_ids' vocabulary rows
} tr_decode_rows_args;

typedef struct tr_ops {
    const char *name;

    // ---- memory: every buffer an op reads or writes comes from here ----
    // Device memory (host memory on cpu), 256-byte aligned; NULL when there is not enough,
    // and when TROUPE_DEVICE_FAULT picked this allocation (tr_fault.fail_alloc; alloc_host too).
    void *(*alloc)(tr_backend *be, size_t bytes);
    void (*free)(tr_backend *be, void *p);
    // Pinned host memory for staging transfers (plain host memory on cpu).
    void *(*alloc_host)(tr_backend *be, size_t bytes);
    void (*free_host)(tr_backend *be, void *p);
    // Copies in stream order. upload reads src (host) until the next sync; download's dst
    // (host) holds the bytes after the next sync; copy is device to device, not overlapping.
    void (*upload)(tr_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(tr_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(tr_backend *be, void *dst, const void *src, size_t bytes);
    // A block of rows: row r (row_bytes bytes) from src + r * src_pitch to dst + r * dst_pitch,
    // r < rows, device to device (pitches >= row_bytes, not overlapping). One call moves a
    // column slice of a row-major matrix, such as a tensor-parallel rank's part of o_proj.
    void (*copy_2d)(tr_backend *be, void *dst, size_t dst_pitch, const void *src,
                    size_t src_pitch, size_t row_bytes, size_t rows);
    // Waits for everything queued. Returns 0, or -1 with the first failure since init in msg
    // (ops return void, so a failed launch or a fault is kept until here); `where` names this
    // sync point in the message. In the debug mode (TROUPE_SYNC_EACH_OP=1) every op syncs and
    // the message names the op itself. The CPU backend fails only where TROUPE_DEVICE_FAULT
    // injects a failure (kernels/fault.h).
    int (*sync)(tr_backend *be, const char *where, char *msg, size_t cap);
    // Free and total device memory in bytes (cpu: the host's available and total memory).
    void (*mem_info)(tr_backend *be, size_t *free_bytes, size_t *total_bytes);
    // Graphs of the queue (NULL where a backend has none; the CPU runs ops as they are
    // called): between graph_begin and graph_end the ops are recorded, not run, and end makes
    // *exec of them; graph_launch replays it in queue order, reading then whatever the device
    // memory and the pinned host memory (alloc_host) the recorded copies name hold. Kernel
    // arguments (shapes, pointers) are fixed at recording. begin returns 1, recording
    // nothing, where it cannot record now (a debugging mode that acts between launches, or
    // TROUPE_CUDA_GRAPHS=0); otherwise 0, or -1 on a failure, which sync reports.
    int (*graph_begin)(tr_backend *be);
    int (*graph_end)(tr_backend *be, void **exec);
    int (*graph_launch)(tr_backend *be, void *exec);
    void (*graph_free)(tr_backend *be, void *exec);
    // A hint (NULL where a backend has none, and a no-op unless the backend has it on): start
    // bringing `bytes` of device memory at p into the device's cache now, beside the queue
    // rather than in its order, so that an op queued later finds them there. Nothing waits
    // for it and no result depends on it. Generation names the weights of a layer's coming
    // products (engine/model.c), whose reads at a decode step's few rows wait on memory.
    void (*prefetch)(tr_backend *be, const void *p, size_t bytes);

    // out[T,OC] = in[T,IC] @ w[OC,IC]^T (+ bias[OC] if not NULL). in: A; w, bias: W.
    // out is A, or F with TR_MM_OUT_F32. The reduction over IC of each output element runs in
    // an order that depends on neither T nor the row when be->batch_invariant (otherwise on T
    // too, never on the row).
    void (*matmul_forward)(tr_backend *be, void *out, const void *in, const void *w,
                           const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags);
    // out[T,OC] (F) = x[T,OC] (F) + the product above: how o_proj and down_proj add into the
    // residual stream, reading layer l's stream and writing layer l + 1's without a copy.
    // out may be x. Each element is x plus its product (with the bias), rounded as the
    // backend's accumulating product rounds them, whether or not out is x.
    void (*matmul_forward_add)(tr_backend *be, float *out, const float *x, const void *in,
                               const void *w, const void *bias, int32_t T, int32_t IC,
                               int32_t OC);
    // din = dout @ w (A, written); dw += dout^T @ in; dbias += sum_t dout (F). dout, in: A;
    // w: W. Any of din/dw/dbias may be NULL.
    void (*matmul_backward)(tr_backend *be, void *din, float *dw, float *dbias,
                            const void *dout, const void *in, const void *w,
                            int32_t T, int32_t IC, int32_t OC);

    // out[T,C] (F: the residual stream) = table[ids[t], :] (W); ids are checked by the caller.
    // ids[t] < 0 gives a row of zeros: a token another tensor-parallel rank's rows hold.
    void (*embedding_forward)(tr_backend *be, float *out, const int32_t *ids,
                              const void *table, int32_t T, int32_t C);
    // dtable[ids[t], :] += dout[t, :] (both F), each row adding its tokens' rows in token
    // order (the same bits on every backend); tokens with ids[t] < 0 add nothing.
    // scratch: embedding_scratch_bytes(T) bytes of
    // backend memory, NULL when that is 0; scratch sized for T serves any smaller T.
    void (*embedding_backward)(tr_backend *be, float *dtable, const float *dout,
                               const int32_t *ids, int32_t T, int32_t C, void *scratch);
    size_t (*embedding_scratch_bytes)(tr_backend *be, int32_t T);

    // Norm of the residual stream: out (A) = in (F) * rstd * w (W) with
    // rstd[t] = 1/sqrt(mean(in[t]^2) + eps) (F), saved for backward.
    void (*rmsnorm_forward)(tr_backend *be, void *out, float *rstd, const float *in,
                            const void *w, float eps, int32_t T, int32_t C);
    // din += (F: the residual gradient flows past the norm); dw += (F); dout: A. din_act
    // (A, or NULL): the updated din rounded to A as convert rounds it, the residual
    // gradient's copy that the next projections' backward GEMMs read (one pass, not two).
    void (*rmsnorm_backward)(tr_backend *be, float *din, void *din_act, float *dw,
                             const void *dout, const float *in, const void *w,
                             const float *rstd, int32_t T, int32_t C);
    // Per-head norm (Qwen3's q_norm/k_norm) over H heads of D values in each of T rows of
    // stride ld (A in and out, same ld): head h of row t is at t*ld + h*D. rstd[t*H + h] (F).
    void (*head_rmsnorm_forward)(tr_backend *be, void *out, float *rstd, const void *in,
                                 const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                 int32_t ld);
    // din written (A, stride ld), dw += (F).
    void (*head_rmsnorm_backward)(tr_backend *be, void *din, float *dw, const void *dout,
                                  const void *in, const void *w, const float *rstd, int32_t T,
                                  int32_t H, int32_t D, int32_t ld);

    // In place on x (A): H heads of D values per row, rows of stride ld; HF rotate_half RoPE
    // at position pos[t]: x1 = x[..., :D/2], x2 = x[..., D/2:];
    // out = [x1*cos - x2*sin, x2*cos + x1*sin], angle = pos * inv_freq[i] (inv_freq: D/2
    // entries of F, from tr_config_rope_inv_freq), computed in fp32 and rounded once.
    void (*rope_forward)(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                         const float *inv_freq, int32_t T, int32_t H, int32_t D);
    // In place on dx: the transpose rotation (angle -> -angle).
    void (*rope_backward)(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D);

    // Causal grouped-query attention within documents. q (H heads), k, v (KVH heads) are rows
    // of stride ld (A): head h of token t at t*ld + h*D, so one fused [q;k;v] projection is
    // read in place. out [T,H*D] (A, contiguous); query head h reads kv head h / (H/KVH);
    // scale = 1/sqrt(D); scores, softmax and the weighted sum are fp32. lse[T,H] (F) saves
    // the softmax log-sum-exp for the backward pass (which recomputes probabilities from it).
    void (*attention_forward)(tr_backend *be, void *out, float *lse, const void *q,
                              const void *k, const void *v, int32_t ld,
                              const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
    // dq, dk, dv written (A, rows of stride ld; dk/dv sum the heads of a group); dout, out
    // contiguous [T,H*D].
    void (*attention_backward)(tr_backend *be, void *dq, void *dk, void *dv,
                               const void *dout, const void *out, const float *lse,
                               const void *q, const void *k, const void *v, int32_t ld,
                               const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
    // Generation: B query tokens (q rows of stride ld, A), token b belongs to sequence b whose
    // keys/values (including this token's, already written) are the first seq_len[b] slots
    // of its blocks block_table[b * max_blocks + j] (max_blocks 0: the rows share one table, a
    // prefill chunk's tokens of one sequence). Same arithmetic order as attention_forward, so
    // decode reproduces the training path's numbers. out [B,H*D] (A).
    void (*attention_decode)(tr_backend *be, void *out, const void *q, int32_t ld,
                             const tr_kv_pages *kv, const int32_t *block_table,
                             int32_t max_blocks, const int32_t *seq_len, int32_t B, int32_t H);
    // Row t of k and of v (n_kv_heads*head_dim values, rows of stride ld, A) into slot slot[t]
    // (block * block_size + offset) of kv's pools, t < T; slots distinct, except that a
    // negative slot writes nothing (a padding row of a recorded decode step).
    void (*kv_write)(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot, const void *k,
                     const void *v, int32_t ld, int32_t T);
    // Generation's RoPE and cache write in one pass: rope_forward on the H + KVH heads of q and
    // k in x (k's heads follow q's in each row), then kv_write of each row's rotated k and its
    // v into slot[t] (KVH, D: kv's), rows of stride ld; the bits of those two ops in turn.
    void (*rope_kv_write)(tr_backend *be, void *x, const void *v, int32_t ld,
                          const int32_t *pos, const float *inv_freq, int32_t T, int32_t H,
                          const tr_kv_pages *kv, const int32_t *slot);
    // A decode step's attention with its RoPE and cache write: rope_kv_write of the B rows
    // of x, then attention_decode of their rotated q (x, stride ld) over kv; the bits of the
    // two ops in turn, in every output (out, x, the pools). Each row is a sequence of its own
    // (max_blocks > 0): no row reads the slot another writes. One launch on CUDA.
    void (*attention_decode_rope)(tr_backend *be, void *out, void *x, const void *v,
                                  int32_t ld, const int32_t *pos, const float *inv_freq,
                                  const tr_kv_pages *kv, const int32_t *slot,
                                  const int32_t *block_table, int32_t max_blocks,
                                  const int32_t *seq_len, int32_t B, int32_t H);

    // SwiGLU over the fused [gate; up] projection: gu[T, 2I] (A) holds gate in columns
    // [0, I) and up in [I, 2I); out[T, I] (A) = silu(gate) * up.
    void (*swiglu_forward)(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I);
    // dgu[T, 2I] written (A): d gate = dout * d silu(gate) * up, d up = dout * silu(gate).
    void (*swiglu_backward)(tr_backend *be, void *dgu, const void *dout, const void *gu,
                            int32_t T, int32_t I);
    // out[T, I] (A) = swiglu_forward of matmul_forward(in, w) into gu[T, 2I] (A, no bias),
    // with their bits, for a forward that keeps no activations: gu may be left unwritten.
    // NULL where a backend has no fused form (the caller runs the two ops).
    void (*matmul_swiglu_forward)(tr_backend *be, void *out, void *gu, const void *in,
                                  const void *w, int32_t T, int32_t IC, int32_t I);

    // out[i] = a[i] + b[i] (F), i < n, rounded once; out may be a or b. Sequence
    // parallelism's residual add: a row-parallel projection's sum, reduce-scattered over the
    // ranks, joins the rank's rows of the residual stream.
    void (*add)(tr_backend *be, float *out, const float *a, const float *b, size_t n);

    // Fused log-softmax over logits[T,V] (A, each value widened exactly, so the results are
    // those of an fp32 log-softmax over the same values): logprob[t] = log p(target[t]) (0
    // where target < 0), entropy[t] = -sum p log p, lse[t] saved. Any of logprob/entropy may
    // be NULL.
    void (*logsoftmax_forward)(tr_backend *be, float *logprob, float *entropy, float *lse,
                               const void *logits, const int32_t *target, int32_t T,
                               int32_t V);
    // dlogits (A, written) = dlogprob[t] * (onehot(target) - p) + dentropy[t] * dH/dlogits.
    // dlogprob or dentropy may be NULL (zero). dlogits may be logits itself: every element
    // is read before the same thread writes it, so the LM head keeps one buffer for both.
    void (*logsoftmax_backward)(tr_backend *be, void *dlogits, const float *dlogprob,
                                const float *dentropy, const void *logits, const float *lse,
                                const int32_t *target, int32_t T, int32_t V);

    // Vocab-parallel log-softmax: the vocabulary is split over tensor-parallel ranks, each
    // holding columns [v0, v0 + V) of every row. Each rank reduces its columns to per-row
    // statistics, the ranks' statistics are gathered, and every rank combines them into the
    // row's results; with one rank the results are logsoftmax_forward's bits.
    // stats[t*4 ..] (double) = m (the columns' max), s = sum e, sx = sum e (x - m) with
    // e = exp(x - m) (as logsoftmax_forward sums them), and x[target[t] - v0] when
    // v0 <= target[t] < v0 + V, else 0. target holds vocabulary ids.
    // logits are A, as logsoftmax_forward reads them.
    void (*logsoftmax_vp_stats)(tr_backend *be, double *stats, const void *logits,
                                const int32_t *target, int32_t v0, int32_t T, int32_t V);
    // From the R ranks' statistics (stats[(r*T + t)*4 ..], rank order): lse[t] (F), the mean
    // E_p[x] of the row (mean[t], double, for the backward), logprob[t] (0 where target < 0)
    // and entropy[t]. Any of logprob/entropy/mean may be NULL.
    void (*logsoftmax_vp_combine)(tr_backend *be, float *logprob, float *entropy, float *lse,
                                  double *mean, const double *stats, const int32_t *target,
                                  int32_t R, int32_t T);
    // logsoftmax_backward over this rank's columns from the whole row's lse and mean:
    // dlogits (A, written; may be logits itself) = dlogprob (onehot(target - v0) - p)
    // - dentropy p (x - mean).
    void (*logsoftmax_vp_backward)(tr_backend *be, void *dlogits, const float *dlogprob,
                                   const float *dentropy, const void *logits, const float *lse,
                                   const double *mean, const int32_t *target, int32_t v0,
                                   int32_t T, int32_t V);

    // *acc += sum of x[i]^2, in double over a fixed blocking (deterministic). acc is one double
    // of backend memory, so nothing waits: the caller downloads it when it needs the value.
    void (*sumsq)(tr_backend *be, double *acc, const float *x, size_t n);
    // One AdamW step over a flat range of parameters (a.n elements; see tr_adamw_args).
    void (*adamw)(tr_backend *be, const tr_adamw_args *a);

    // ---- buffers: filling, moving and converting backend memory in place of host loops ----
    // x[i] = value for i < n (F).
    void (*fill)(tr_backend *be, float *x, float value, size_t n);
    // Rows of row_bytes bytes of any dtype, r < n: gather sets out row r = src row idx[r];
    // scatter sets dst row idx[r] = rows row r, idx distinct. idx is backend memory; the rows
    // read and the rows written do not overlap.
    void (*gather_rows)(tr_backend *be, void *out, const void *src, const int32_t *idx,
                        int32_t n, size_t row_bytes);
    void (*scatter_rows)(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                         int32_t n, size_t row_bytes);
    // KV copy-on-write of n blocks in one call: for i < n, the first n_slots[i] slots of block
    // src[i] are copied into block dst[i] in the K and the V pool of every layer. src, dst and
    // n_slots are backend memory; no dst[i] is another pair's src or dst.
    void (*kv_copy_blocks)(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                           const int32_t *dst, const int32_t *n_slots, int32_t n);
    // A decode step's rows advanced on the device (see tr_decode_rows_args).
    void (*decode_rows)(tr_backend *be, const tr_decode_rows_args *a);
    // out[i] (out_t) = in[i] (in_t), i < n; out_t is F32 or BF16, in_t any; the same dtype is a
    // copy. fp32 -> bf16 rounds to nearest, ties to even (overflowing to inf); inf and -0 are
    // kept; a NaN stays a NaN of the same sign with its top payload bits (plus the quiet bit
    // only when all the kept ones are zero), so every bf16 survives bf16 -> fp32 -> bf16.
    // bf16 -> fp32 and fp16 -> fp32 are exact; fp16 -> bf16 goes through fp32.
    void (*convert)(tr_backend *be, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                    size_t n);

    // ---- sampling ----
    // Draws ids[b] from logits[b, V] (A, widened exactly: the draw from the fp32 row of the
    // same values) as engine/sample.h's host sampler does with rows[b]'s parameters:
    // weights exp((z - max) / T) in double; top-k, then top-p over the top-k
    // set's mass, by rank (logit descending, lower id on ties); one 53-bit uniform from the
    // row's next two Philox words (the caller then advances that row's tr_rng by two words,
    // unless greedy) walked along the cumulative weights in rank order (id order when
    // neither cut applies).
    // logprob[b] = log_softmax(logits[b])[ids[b]] of the unmodified distribution, the bits
    // logsoftmax_forward gives for that target. *n_near += the near draws (TR_SAMPLE_NEAR):
    // on another backend only those may differ. Every pointer is backend memory; scratch is
    // sample_scratch_bytes(B, V) bytes (sized for B rows, it serves fewer); the op allocates
    // nothing and waits for nothing. ranked: whether some row ranks its logits (temperature
    // > 0 with 0 < top_k < V or top_p < 1; tr_sample_row_ranked), which the caller knows from
    // the rows it filled: false lets a backend skip the ranking sort.
    void (*sample)(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                   const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                   int32_t *n_near);
    size_t (*sample_scratch_bytes)(tr_backend *be, int32_t B, int32_t V);

    // ---- vocab-parallel sampling: the draws of sample from rows whose columns are split
    // over R tensor-parallel ranks (rank r holding [v0, v0 + V) of each row), exchanging
    // short summaries instead of the rows (engine/sample_tp.c runs the exchange) ----
    // cand[b * k + j] for j < min(k, V): this rank's j-th token of row b by rank (logit
    // descending, lower id on ties); {-inf, -1} after them. Its first is the columns' maximum
    // and greedy pick. scratch: sample_vp_scratch_bytes(B, V, ..) bytes.
    void (*sample_vp_top)(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                          int32_t B, int32_t V, int32_t k, void *scratch);
    // Row b's walk over this rank's columns in id order, for rows with temperature > 0 (others
    // untouched): weights w = exp((x - mx) / temperature) in double, mx the highest first
    // candidate of the R ranks (cand[(r * B + b) * k], sample_vp_top's lists of every rank,
    // gathered), as sample weighs them; sum[b] = carry[b] (0 when carry is NULL) + w, added
    // one by one in id order: chained from rank to rank, sample's sum of the whole row. With
    // total (not NULL) the row's draw u (its next two Philox words, as sample takes them) aims
    // at target = u * total[b], and hit[b * 3 ..] = the first id whose running sum exceeds
    // target (-1: none in these columns), 1 when that is within TR_SAMPLE_NEAR * total[b] of
    // either of its boundaries (else 0), and the last id above 0 with w > 0 (-1: none).
    void (*sample_vp_scan)(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                           const tr_sample_row *rows, const tr_sample_cand *cand,
                           const double *carry, const double *total, int32_t R, int32_t k,
                           int32_t v0, int32_t B, int32_t V);
    // ids[b] as sample draws from the whole row of a V-token vocabulary, from every rank's
    // candidates (cand: R lists of k per row, gathered as above), walks (hit: sample_vp_scan's
    // of every rank, gathered as [R][B][3]; rows neither greedy nor ranked) and, for rows top-p
    // ranks without top-k, the row's whole weight mass[b]: greedy takes the best first
    // candidate, top-k and top-p merge the lists into rank order and take sample's steps with
    // its sums (kernels/sample_vp.h), the rest the lowest rank's hit. A top-p row whose cut
    // lies past what the lists hold for sure gets -1: ask again with a larger k. *n_near +=
    // the near draws. hit and mass may be NULL when no row needs them.
    void (*sample_vp_pick)(tr_backend *be, int32_t *ids, int32_t *n_near,
                           const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                           const tr_sample_row *rows, int32_t R, int32_t k, int32_t B,
                           int32_t V, void *scratch);
    // Scratch of sample_vp_top over B rows of V columns and of sample_vp_pick over n_cand
    // gathered candidates (R * k * B); one serves both, in turn.
    size_t (*sample_vp_scratch_bytes)(tr_backend *be, int32_t B, int32_t V, size_t n_cand);
} tr_ops;

// A backend: its op table plus its private context (thread pool, streams, handles).
struct tr_backend {
    const tr_ops *ops;
    void *ctx;
    int32_t n_threads;
    tr_dt act;   // A: activations, activation gradients, KV cache
    tr_dt wt;    // W: weights as forward and backward read them
    // 1 when a row's results do not depend on the rows beside it or on T, which makes
    // generation's logprobs (a decode step's rows) the training path's bits: the CPU backend
    // always; CUDA in bf16 unless turned off (tr_backend_opts.batch_invariant), its forward
    // products then taking one kernel per shape without regard to T. 0: CUDA in fp32 (cuBLAS
    // sgemm picks by the whole shape) or with it off.
    int batch_invariant;
    // TROUPE_DEVICE_FAULT (kernels/fault.h), read by tr_backend_init; zeroed by the backends'
    // own inits, so a backend started directly injects nothing.
    tr_fault fault;
};

// CPU backend with n_threads worker threads (0 = number of cores), fp32 (bf16: the emulated
// mixed-precision mode, act = wt = bf16). Results are bitwise the same for every thread
// count. Returns 0, or -1 if threads or memory could not be had.
// Code above kernels/ starts backends through kernels/backend.h instead.
int tr_backend_cpu_init(tr_backend *be, int32_t n_threads, tr_dt precision);
void tr_backend_cpu_free(tr_backend *be);
