// The backend op table: every numeric op the engine needs, as forward/backward pairs over
// flat row-major buffers. kernels/cpu implements it in fp32 (deterministic for any thread
// count: fixed work split, no racy reductions); kernels/cuda implements the same table.
// Model code (engine/) is written once against this table.
//
// Conventions: T = tokens (rows), C = channels. Backward functions ACCUMULATE (+=) into
// parameter gradients (dw, db) and into input gradients (din), as llm.c does, so the caller
// zeroes gradient buffers once per step and residual branches need no extra adds.
// Pointers are device pointers of the backend, from its alloc (host memory for cpu), and so
// are the arrays inside tr_doc_layout, tr_kv_pages and every index array an op reads; the
// structs themselves and scalar arguments are host values. Ops run in call order on the
// backend's stream; nothing is read back until a download and a sync.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct tr_backend tr_backend;

// Token layout of a batch for attention and RoPE: T tokens in n_docs contiguous documents;
// doc d covers tokens [doc_start[d], doc_start[d+1]). Attention is causal inside a document
// and never crosses one; pos[t] is the RoPE position of token t (restarts at 0 per document).
typedef struct tr_doc_layout {
    int32_t n_tokens;
    int32_t n_docs;
    const int32_t *doc_start;   // n_docs + 1 entries, doc_start[0] = 0, doc_start[n_docs] = T
    const int32_t *pos;         // T entries
} tr_doc_layout;

// Paged KV cache for generation: a pool of blocks of block_size tokens; each sequence lists
// its blocks. k and v pools are [n_blocks][block_size][n_kv_heads][head_dim].
typedef struct tr_kv_pages {
    float *k_pool;
    float *v_pool;
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

// A draw is "near" when its uniform target lies within TR_SAMPLE_NEAR of the kept weight
// of a cumulative boundary, or top-p's cut within TR_SAMPLE_NEAR of the nucleus mass of its
// limit: only there can another summation order pick a neighbouring id.
#define TR_SAMPLE_NEAR 1e-12

typedef struct tr_ops {
    const char *name;

    // ---- memory: every buffer an op reads or writes comes from here ----
    // Device memory (host memory on cpu), 256-byte aligned; NULL when there is not enough.
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
    // Waits for everything queued. Returns 0, or -1 with the first failure since init in msg
    // (ops return void, so a failed launch or a fault is kept until here); `where` names this
    // sync point in the message. In the debug mode (TROUPE_SYNC_EACH_OP=1) every op syncs and
    // the message names the op itself.
    int (*sync)(tr_backend *be, const char *where, char *msg, size_t cap);
    // Free and total device memory in bytes (cpu: the host's available and total memory).
    void (*mem_info)(tr_backend *be, size_t *free_bytes, size_t *total_bytes);

    // out[T,OC] = in[T,IC] @ w[OC,IC]^T (+ bias[OC] if not NULL)
    void (*matmul_forward)(tr_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int32_t T, int32_t IC, int32_t OC);
    // din += dout @ w; dw += dout^T @ in; dbias += sum_t dout. Any of din/dw/dbias may be NULL.
    void (*matmul_backward)(tr_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w,
                            int32_t T, int32_t IC, int32_t OC);

    // out[T,C] = table[ids[t], :]; ids are checked by the caller.
    void (*embedding_forward)(tr_backend *be, float *out, const int32_t *ids,
                              const float *table, int32_t T, int32_t C);
    // dtable[ids[t], :] += dout[t, :], each row adding its tokens' rows in token order (the
    // same bits on every backend). scratch: embedding_scratch_bytes(T) bytes of backend
    // memory, NULL when that is 0; scratch sized for T serves any smaller T.
    void (*embedding_backward)(tr_backend *be, float *dtable, const float *dout,
                               const int32_t *ids, int32_t T, int32_t C, void *scratch);
    size_t (*embedding_scratch_bytes)(tr_backend *be, int32_t T);

    // out = in * rstd * w with rstd[t] = 1/sqrt(mean(in[t]^2) + eps), saved for backward.
    void (*rmsnorm_forward)(tr_backend *be, float *out, float *rstd, const float *in,
                            const float *w, float eps, int32_t T, int32_t C);
    void (*rmsnorm_backward)(tr_backend *be, float *din, float *dw, const float *dout,
                             const float *in, const float *w, const float *rstd,
                             int32_t T, int32_t C);

    // In place on x[T, H, D]: HF rotate_half RoPE at position pos[t]:
    // x1 = x[..., :D/2], x2 = x[..., D/2:]; out = [x1*cos - x2*sin, x2*cos + x1*sin],
    // angle = pos * inv_freq[i] (inv_freq has D/2 entries, from tr_config_rope_inv_freq).
    void (*rope_forward)(tr_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                         int32_t T, int32_t H, int32_t D);
    // In place on dx: the transpose rotation (angle -> -angle).
    void (*rope_backward)(tr_backend *be, float *dx, const int32_t *pos, const float *inv_freq,
                          int32_t T, int32_t H, int32_t D);

    // Causal grouped-query attention within documents. q[T,H,D], k,v[T,KVH,D], out[T,H,D];
    // query head h reads kv head h / (H/KVH); scale = 1/sqrt(D). lse[T,H] saves the softmax
    // log-sum-exp for the backward pass (which recomputes probabilities from it).
    void (*attention_forward)(tr_backend *be, float *out, float *lse, const float *q,
                              const float *k, const float *v, const tr_doc_layout *docs,
                              int32_t H, int32_t KVH, int32_t D);
    // dq, dk, dv += gradients (dk/dv are [T,KVH,D]: the heads of a group sum into them).
    void (*attention_backward)(tr_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v,
                               const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
    // Generation: B query tokens, token b belongs to sequence b whose keys/values (including
    // this token's, already written) are the first seq_len[b] slots of its blocks
    // block_table[b * max_blocks + j]. Same arithmetic order as attention_forward, so decode
    // reproduces the training path's numbers. q[B,H,D], out[B,H,D].
    void (*attention_decode)(tr_backend *be, float *out, const float *q, const tr_kv_pages *kv,
                             const int32_t *block_table, int32_t max_blocks,
                             const int32_t *seq_len, int32_t B, int32_t H);

    // out[n] = silu(gate[n]) * up[n]
    void (*swiglu_forward)(tr_backend *be, float *out, const float *gate, const float *up,
                           size_t n);
    // dgate += dout * d silu(gate) * up; dup += dout * silu(gate)
    void (*swiglu_backward)(tr_backend *be, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, size_t n);

    // out[n] = a[n] + b[n] (out may alias a)
    void (*add)(tr_backend *be, float *out, const float *a, const float *b, size_t n);

    // Fused log-softmax over logits[T,V]: logprob[t] = log p(target[t]) (0 where target < 0),
    // entropy[t] = -sum p log p, lse[t] saved. Any of logprob/entropy may be NULL.
    void (*logsoftmax_forward)(tr_backend *be, float *logprob, float *entropy, float *lse,
                               const float *logits, const int32_t *target, int32_t T,
                               int32_t V);
    // dlogits = dlogprob[t] * (onehot(target) - p) + dentropy[t] * dH/dlogits, written
    // (not accumulated: logits are not reused). dlogprob or dentropy may be NULL (zero).
    void (*logsoftmax_backward)(tr_backend *be, float *dlogits, const float *dlogprob,
                                const float *dentropy, const float *logits, const float *lse,
                                const int32_t *target, int32_t T, int32_t V);

    // *acc += sum of x[i]^2, in double over a fixed blocking (deterministic). acc is one double
    // of backend memory, so nothing waits: the caller downloads it when it needs the value.
    void (*sumsq)(tr_backend *be, double *acc, const float *x, size_t n);
    // x *= s
    void (*scale)(tr_backend *be, float *x, float s, size_t n);
    // AdamW with decoupled weight decay, bias correction at step t (1-based):
    // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mh = m/(1-b1^t); vh = v/(1-b2^t);
    // p -= lr * (mh / (sqrt(vh) + eps) + wd * p)
    void (*adamw)(tr_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, int32_t t);

    // ---- buffers: filling, moving and converting backend memory in place of host loops ----
    // x[i] = value for i < n.
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
    // fp32 -> bf16 rounds to nearest, ties to even (overflowing to inf); inf and -0 are kept; a
    // NaN stays a NaN of the same sign with its top payload bits (plus the quiet bit only when
    // all the kept ones are zero), so every bf16 survives bf16 -> fp32 -> bf16. bf16 -> fp32
    // is exact.
    void (*cast_f32_bf16)(tr_backend *be, uint16_t *out, const float *in, size_t n);
    void (*cast_bf16_f32)(tr_backend *be, float *out, const uint16_t *in, size_t n);

    // ---- sampling ----
    // Draws ids[b] from logits[b, V] as engine/sample.h's host sampler does with rows[b]'s
    // parameters: weights exp((z - max) / T) in double; top-k, then top-p over the top-k
    // set's mass, by rank (logit descending, lower id on ties); one 53-bit uniform from the
    // row's next two Philox words (the caller then advances that row's tr_rng by two words,
    // unless greedy) walked along the cumulative weights in rank order (id order when
    // neither cut applies).
    // logprob[b] = log_softmax(logits[b])[ids[b]] of the unmodified distribution, the bits
    // logsoftmax_forward gives for that target. *n_near += the near draws (TR_SAMPLE_NEAR):
    // on another backend only those may differ. Every pointer is backend memory; scratch is
    // sample_scratch_bytes(B, V) bytes (sized for B rows, it serves fewer); the op allocates
    // nothing and waits for nothing.
    void (*sample)(tr_backend *be, int32_t *ids, float *logprob, const float *logits,
                   const tr_sample_row *rows, int32_t B, int32_t V, void *scratch,
                   int32_t *n_near);
    size_t (*sample_scratch_bytes)(tr_backend *be, int32_t B, int32_t V);
} tr_ops;

// A backend: its op table plus its private context (thread pool, streams, handles).
struct tr_backend {
    const tr_ops *ops;
    void *ctx;
    int32_t n_threads;
};

// CPU backend with n_threads worker threads (0 = number of cores). Results are bitwise the
// same for every thread count. Returns 0, or -1 if threads or memory could not be had.
// Code above kernels/ starts backends through kernels/backend.h instead.
int tr_backend_cpu_init(tr_backend *be, int32_t n_threads);
void tr_backend_cpu_free(tr_backend *be);
