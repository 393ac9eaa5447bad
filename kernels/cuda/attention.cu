// Causal grouped-query attention on the GPU: the entry points of the op table. The bf16 path
// at head dimensions 64 and 128 runs the tensor-core kernels (attention_flash.cu forward,
// attention_flash_bwd.cu backward, attention_decode.cu decode, which reproduces the forward's
// rows bit for bit). Every other case (fp32, other head dimensions) runs the row kernels
// below, correct but slow: one block per (query row, head) for the forward and the decode
// step, both through attn_row, so a decoded token's output is again bitwise the training
// forward's row. Keys are taken in chunks of ATT_THREADS (one thread per key scores it), with
// an online softmax across chunks; lse is saved. A row of a document with a shared prefix
// takes its context's keys in order (the prefix's, then its own: attention_tile.cuh maps a
// context position to its row), so its bits are the unshared document's. The row backward
// recomputes probabilities from lse and needs no atomics and no scratch: dq by query rows
// (keys in context order), then dk and dv by key rows (each summing its group's heads in
// order; a prefix's keys take the rows of the documents naming it after their own), all
// three written. q, k, v and their gradients are rows of stride ld (a fused [q;k;v] row read
// in place); out and dout are contiguous.
// Row kernels are templated on the A dtype: values are read as fp32, every score,
// probability and sum is fp32 (lse and the row term in double as noted), and each output is
// rounded once. Explicit fmaf/__fmul_rn keep the arithmetic the same whatever the compiler
// contracts.
#include <math.h>

#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define ATT_THREADS 128

// The keys and values one query row may read, for one kv head: key j sits at k + slot(j).
template <typename A>
struct kv_rows {
    const A *k, *v;
    size_t stride;              // elements between consecutive slots
    const int32_t *blocks;      // NULL: rows of a batch (below); else paged through this list
    int32_t block_size;
    // a batch's rows: key j (a context position) is row fa_key_row(j, ps, pl, s), the pl rows
    // of a prefix from ps, then rows from s (pl 0: row s + j)
    int32_t s, ps, pl;
    __device__ size_t slot(int32_t j) const {
        if (!blocks) return (size_t)fa_key_row(j, ps, pl, s) * stride;
        return ((size_t)blocks[j / block_size] * (size_t)block_size + (size_t)(j % block_size)) *
               stride;
    }
};

template <typename X, typename Y>
__device__ inline float attn_dot(const X *a, const Y *b, int32_t D) {
    float acc = 0.0f;
    for (int32_t d = 0; d < D; d++) acc = fmaf(tr_f32(a[d]), tr_f32(b[d]), acc);
    return acc;
}

// Index of the document holding token t (doc_start is sorted, n_docs + 1 entries).
__device__ inline int32_t attn_doc_of(const int32_t *doc_start, int32_t n_docs, int32_t t) {
    int32_t lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (doc_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// One query row over keys 0..n-1. Shared memory: qs[D], acc[D], p[ATT_THREADS] floats and
// slot[ATT_THREADS]. Thread d-ownership of acc (d = tid mod blockDim) needs no sync.
template <typename A>
__device__ void attn_row(A *out, float *lse, const A *q, const kv_rows<A> &s, int32_t n,
                         int32_t D, float scale, float *sh, size_t *slot) {
    float *qs = sh, *acc = sh + D, *p = sh + 2 * D;
    int32_t tid = threadIdx.x;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        qs[d] = tr_f32(q[d]);
        acc[d] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY;
    double l = 0.0;
    for (int32_t c0 = 0; c0 < n; c0 += blockDim.x) {
        int32_t cn = n - c0 < (int32_t)blockDim.x ? n - c0 : (int32_t)blockDim.x;
        float sc = -INFINITY;
        if (tid < cn) {
            size_t o = s.slot(c0 + tid);
            slot[tid] = o;
            sc = __fmul_rn(attn_dot(qs, s.k + o, D), scale);
        }
        float mnew = fmaxf(m, tr_block_max(sc));
        float r = m == -INFINITY ? 0.0f : expf(m - mnew);
        float e = tid < cn ? expf(sc - mnew) : 0.0f;
        p[tid] = e;
        double cs = tr_block_sum((double)e);   // its barriers publish p and slot
        l = l * r + cs;
        m = mnew;
        for (int32_t d = tid; d < D; d += blockDim.x) {
            float a = __fmul_rn(acc[d], r);
            for (int32_t j = 0; j < cn; j++) a = fmaf(p[j], tr_f32(s.v[slot[j] + d]), a);
            acc[d] = a;
        }
        __syncthreads();   // p and slot are rewritten by the next chunk
    }
    float inv = n > 0 ? (float)(1.0 / l) : 0.0f;
    for (int32_t d = tid; d < D; d += blockDim.x) tr_store(out + d, __fmul_rn(acc[d], inv));
    if (lse && tid == 0) *lse = n > 0 ? (float)((double)m + log(l)) : -INFINITY;
}

static size_t attn_row_shared(int32_t D) {
    return (size_t)(2 * D + ATT_THREADS) * sizeof(float) + ATT_THREADS * sizeof(size_t);
}

__device__ inline size_t *attn_slots(float *sh, int32_t floats) {
    // size_t scratch after the floats, aligned to 8 bytes
    return (size_t *)(sh + ((floats + 1) & ~1));
}


// The keys of token t's context, for kv head kvh: its prefix's, then its document's up to t.
// Sets n to their count.
template <typename A>
__device__ inline kv_rows<A> attn_context(const A *k, const A *v, int32_t ld,
                                          const int32_t *doc_start, const int32_t *prefix,
                                          int32_t n_docs, int32_t t, int32_t kvh, int32_t D,
                                          int32_t &n) {
    int32_t d = attn_doc_of(doc_start, n_docs, t), ps;
    int32_t pl = fa_prefix_of(doc_start, prefix, d, ps), start = doc_start[d];
    n = pl + t - start + 1;
    return {k + (size_t)kvh * D, v + (size_t)kvh * D, (size_t)ld, NULL, 0, start, ps, pl};
}

// 16 blocks fill an SM; the bound keeps the prefix's row mapping from costing a quarter of them.
template <typename A>
__global__ void __launch_bounds__(ATT_THREADS, 16)
    attention_forward_kernel(A *out, float *lse, const A *q, const A *k, const A *v, int32_t ld,
                             const int32_t *doc_start, const int32_t *prefix, int32_t n_docs,
                             int32_t H, int32_t KVH, int32_t D, float scale) {
    extern __shared__ float sh[];
    int32_t t = blockIdx.x, h = blockIdx.y, n;
    kv_rows<A> s = attn_context(k, v, ld, doc_start, prefix, n_docs, t, h / (H / KVH), D, n);
    size_t row = (size_t)t * H + h;
    attn_row(out + row * D, lse + row, q + (size_t)t * ld + (size_t)h * D, s, n, D, scale, sh,
             attn_slots(sh, 2 * D + ATT_THREADS));
}

template <typename A>
__global__ void attention_decode_kernel(A *out, const A *q, int32_t ld, const A *k_pool,
                                        const A *v_pool, int32_t block_size, int32_t KVH,
                                        int32_t D, const int32_t *block_table,
                                        int32_t max_blocks, const int32_t *seq_len, int32_t H,
                                        float scale) {
    extern __shared__ float sh[];
    int32_t b = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH);
    kv_rows<A> s = {k_pool + (size_t)kvh * D, v_pool + (size_t)kvh * D, (size_t)KVH * D,
                    block_table + (size_t)b * max_blocks, block_size, 0, 0, 0};
    size_t row = (size_t)b * H + h;
    attn_row(out + row * D, (float *)NULL, q + (size_t)b * ld + (size_t)h * D, s, seq_len[b],
             D, scale, sh, attn_slots(sh, 2 * D + ATT_THREADS));
}

static float attn_scale(int32_t D) { return (float)(1.0 / sqrt((double)D)); }

// Dynamic shared memory above the 48 KiB default must be opted into per kernel.
static int attn_shared_ok(tr_backend *be, const void *kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return 0;
    return TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)bytes));
}

template <typename A>
static void forward_run(tr_backend *be, void *out, float *lse, const void *q, const void *k,
                        const void *v, int32_t ld, const tr_doc_layout *docs, int32_t H,
                        int32_t KVH, int32_t D) {
    size_t shm = attn_row_shared(D) + 2 * sizeof(float);
    if (attn_shared_ok(be, (const void *)attention_forward_kernel<A>, shm)) return;
    dim3 grid((unsigned)docs->n_tokens, (unsigned)H);
    attention_forward_kernel<A><<<grid, ATT_THREADS, shm, tr_cuda_stream(be)>>>(
        (A *)out, lse, (const A *)q, (const A *)k, (const A *)v, ld, docs->doc_start,
        docs->prefix, docs->n_docs, H, KVH, D, attn_scale(D));
    TR_CUDA_LAUNCHED(be, "attention_forward");
}

static bool attn_aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

// The tensor-core kernels serve bf16 at their head dimensions (unless
// TROUPE_CUDA_FLASH_ATTENTION=0, which keeps the row kernels for comparison); the test is the
// same for the forward and the decode step, so the two always run the same arithmetic.
static bool attn_flash(const tr_backend *be, int32_t D) {
    return ((const tr_cuda_ctx *)be->ctx)->flash_attention && tr_cuda_bf16(be) && tr_fa_supported(D);
}

void tr_cuda_attention_forward(tr_backend *be, void *out, float *lse, const void *q,
                               const void *k, const void *v, int32_t ld,
                               const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    if (docs->n_tokens <= 0 || H <= 0) return;
    if (attn_flash(be, D)) {
        fa_fwd_args a = {(tr_bf16 *)out, lse, (const tr_bf16 *)q, (const tr_bf16 *)k,
                         (const tr_bf16 *)v, docs->doc_start, docs->prefix, docs->n_docs,
                         docs->n_tokens, H, KVH, ld, tr_fa_scale_log2(D), 0, 0,
                         tr_cuda_ctx_of(be)->softmax_chunk};
        a.vec = ld % 8 == 0 && attn_aligned(q, 16) && attn_aligned(k, 16) && attn_aligned(v, 16);
        a.out4 = attn_aligned(out, 4);
        tr_fa_forward(be, a, D);
        return;
    }
    if (tr_cuda_bf16(be)) forward_run<tr_bf16>(be, out, lse, q, k, v, ld, docs, H, KVH, D);
    else forward_run<float>(be, out, lse, q, k, v, ld, docs, H, KVH, D);
}

template <typename A>
static void decode_run(tr_backend *be, void *out, const void *q, int32_t ld,
                       const tr_kv_pages *kv, const int32_t *block_table, int32_t max_blocks,
                       const int32_t *seq_len, int32_t B, int32_t H) {
    int32_t D = kv->head_dim;
    size_t shm = attn_row_shared(D) + 2 * sizeof(float);
    if (attn_shared_ok(be, (const void *)attention_decode_kernel<A>, shm)) return;
    dim3 grid((unsigned)B, (unsigned)H);
    attention_decode_kernel<A><<<grid, ATT_THREADS, shm, tr_cuda_stream(be)>>>(
        (A *)out, (const A *)q, ld, (const A *)kv->k_pool, (const A *)kv->v_pool,
        kv->block_size, kv->n_kv_heads, D, block_table, max_blocks, seq_len, H, attn_scale(D));
    TR_CUDA_LAUNCHED(be, "attention_decode");
}

// The flash decode's arguments (attention_decode.cu), without the rope part.
static fa_dec_args decode_args(tr_backend *be, void *out, const void *q, int32_t ld,
                               const tr_kv_pages *kv, const int32_t *block_table,
                               int32_t max_blocks, const int32_t *seq_len, int32_t H) {
    int32_t D = kv->head_dim, G = H / kv->n_kv_heads;
    fa_dec_args a = {(tr_bf16 *)out, (const tr_bf16 *)q, (const tr_bf16 *)kv->k_pool,
                     (const tr_bf16 *)kv->v_pool, block_table, seq_len, ld,
                     kv->block_size, kv->n_kv_heads, H, D, max_blocks, (G + 15) / 16,
                     tr_fa_scale_log2(D), 0, 0, 0, tr_cuda_ctx_of(be)->softmax_chunk, -1};
    const int32_t bs = kv->block_size;
    if (bs > 0 && (bs & (bs - 1)) == 0 && !tr_cuda_ctx_of(be)->no_lean_copies)
        a.bs_log2 = __builtin_ctz((unsigned)bs);
    a.vecq = ld % 8 == 0 && attn_aligned(q, 16);
    a.veckv = attn_aligned(kv->k_pool, 16) && attn_aligned(kv->v_pool, 16);
    a.out4 = attn_aligned(out, 4);
    return a;
}

void tr_cuda_attention_decode(tr_backend *be, void *out, const void *q, int32_t ld,
                              const tr_kv_pages *kv, const int32_t *block_table,
                              int32_t max_blocks, const int32_t *seq_len, int32_t B,
                              int32_t H) {
    if (B <= 0 || H <= 0) return;
    if (attn_flash(be, kv->head_dim)) {
        tr_fa_decode(be, decode_args(be, out, q, ld, kv, block_table, max_blocks, seq_len, H),
                     B, max_blocks * kv->block_size);
        return;
    }
    if (tr_cuda_bf16(be))
        decode_run<tr_bf16>(be, out, q, ld, kv, block_table, max_blocks, seq_len, B, H);
    else
        decode_run<float>(be, out, q, ld, kv, block_table, max_blocks, seq_len, B, H);
}

// One launch where the flash decode takes it (a block per sequence and kv head: no two blocks
// rotate the same key), else rope_kv_write and attention_decode in turn.
void tr_cuda_attention_decode_rope(tr_backend *be, void *out, void *x, const void *v, int32_t ld,
                                   const int32_t *pos, const float *inv_freq,
                                   const tr_kv_pages *kv, const int32_t *slot,
                                   const int32_t *block_table, int32_t max_blocks,
                                   const int32_t *seq_len, int32_t B, int32_t H) {
    if (B <= 0 || H <= 0) return;
    fa_dec_args a = decode_args(be, out, x, ld, kv, block_table, max_blocks, seq_len, H);
    if (tr_cuda_ctx_of(be)->decode_rope && attn_flash(be, kv->head_dim) &&
        H / kv->n_kv_heads <= 16 && !tr_fa_decode_splits(be, a, B, max_blocks * kv->block_size)) {
        a.x = (tr_bf16 *)x;
        a.v = (const tr_bf16 *)v;
        a.pos = pos;
        a.slot = slot;
        a.inv_freq = inv_freq;
        tr_fa_decode(be, a, B, max_blocks * kv->block_size);
        return;
    }
    tr_cuda_rope_kv_write(be, x, v, ld, pos, inv_freq, B, H, kv, slot);
    tr_cuda_attention_decode(be, out, x, ld, kv, block_table, max_blocks, seq_len, B, H);
}

// sum_d dout[d] * out[d] in double, sequentially: the softmax backward's row term. The dq and
// the dk/dv kernels both call it, so they agree on it bit for bit.
template <typename A>
__device__ inline float attn_row_delta(const A *dout, const A *out, int32_t D) {
    double acc = 0.0;
    for (int32_t d = 0; d < D; d++) acc += (double)tr_f32(dout[d]) * tr_f32(out[d]);
    return (float)acc;
}

// dq for one (query row, head): the keys of the row's context (as the forward's), in chunks;
// per key p = exp(s - lse), dS = p (dP - delta) * scale, dq = sum dS k. Shared: qs, gos,
// acc [D], ds.
template <typename A>
__global__ void attention_backward_dq_kernel(A *dq, const A *dout, const A *out,
                                             const float *lse, const A *q, const A *k,
                                             const A *v, int32_t ld, const int32_t *doc_start,
                                             const int32_t *prefix, int32_t n_docs, int32_t H,
                                             int32_t KVH, int32_t D, float scale) {
    extern __shared__ float sh[];
    float *qs = sh, *gos = sh + D, *acc = sh + 2 * D, *ds = sh + 3 * D;
    __shared__ float delta_sh;
    int32_t i = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, n;
    kv_rows<A> s = attn_context(k, v, ld, doc_start, prefix, n_docs, i, h / (H / KVH), D, n);
    size_t row = (size_t)i * H + h, qat = (size_t)i * ld + (size_t)h * D;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        qs[d] = tr_f32(q[qat + d]);
        gos[d] = tr_f32(dout[row * D + d]);
        acc[d] = 0.0f;
    }
    if (tid == 0) delta_sh = attn_row_delta(dout + row * D, out + row * D, D);
    __syncthreads();
    float delta = delta_sh, l = lse[row];
    for (int32_t c0 = 0; c0 < n; c0 += blockDim.x) {
        int32_t cn = n - c0 < (int32_t)blockDim.x ? n - c0 : (int32_t)blockDim.x;
        if (tid < cn) {
            size_t o = s.slot(c0 + tid);
            float p = expf(__fmul_rn(attn_dot(qs, s.k + o, D), scale) - l);
            float dp = attn_dot(gos, s.v + o, D);
            ds[tid] = __fmul_rn(__fmul_rn(p, dp - delta), scale);
        }
        __syncthreads();
        for (int32_t d = tid; d < D; d += blockDim.x) {
            float a = acc[d];
            for (int32_t j = 0; j < cn; j++) a = fmaf(ds[j], tr_f32(s.k[s.slot(c0 + j) + d]), a);
            acc[d] = a;
        }
        __syncthreads();
    }
    for (int32_t d = tid; d < D; d += blockDim.x) tr_store(dq + qat + d, acc[d]);
}

// dk, dv for one (key row j, kv head g): the group's heads in order, then the query rows of
// the document from j on, in chunks, and for a prefix document on through the documents
// naming it (all of whose rows see j); dv = sum p dO, dk = sum dS q. Shared: ks, vs, acck,
// accv [D], p, ds [ATT_THREADS].
template <typename A>
__global__ void attention_backward_dkv_kernel(A *dk, A *dv, const A *dout, const A *out,
                                              const float *lse, const A *q, const A *k,
                                              const A *v, int32_t ld, const int32_t *doc_start,
                                              const int32_t *prefix, int32_t n_docs, int32_t H,
                                              int32_t KVH, int32_t D, float scale) {
    extern __shared__ float sh[];
    float *ks = sh, *vs = sh + D, *acck = sh + 2 * D, *accv = sh + 3 * D;
    float *ps = sh + 4 * D, *ds = ps + blockDim.x;
    int32_t j = blockIdx.x, g = blockIdx.y, group = H / KVH, tid = threadIdx.x;
    int32_t end = fa_query_end(doc_start, prefix, n_docs, attn_doc_of(doc_start, n_docs, j));
    size_t kat = (size_t)j * ld + (size_t)g * D, ostride = (size_t)H * D;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        ks[d] = tr_f32(k[kat + d]);
        vs[d] = tr_f32(v[kat + d]);
        acck[d] = 0.0f;
        accv[d] = 0.0f;
    }
    __syncthreads();
    for (int32_t h = g * group; h < (g + 1) * group; h++) {
        for (int32_t c0 = j; c0 < end; c0 += blockDim.x) {
            int32_t cn = end - c0 < (int32_t)blockDim.x ? end - c0 : (int32_t)blockDim.x;
            if (tid < cn) {
                size_t row = (size_t)(c0 + tid) * H + h;
                const A *qi = q + (size_t)(c0 + tid) * ld + (size_t)h * D;
                const A *goi = dout + row * D;
                float delta = attn_row_delta(goi, out + row * D, D);
                float p = expf(__fmul_rn(attn_dot(qi, ks, D), scale) - lse[row]);
                float dp = attn_dot(goi, vs, D);
                ps[tid] = p;
                ds[tid] = __fmul_rn(__fmul_rn(p, dp - delta), scale);
            }
            __syncthreads();
            for (int32_t d = tid; d < D; d += blockDim.x) {
                float ak = acck[d], av = accv[d];
                for (int32_t x = 0; x < cn; x++) {
                    size_t r = (size_t)(c0 + x);
                    av = fmaf(ps[x], tr_f32(dout[r * ostride + (size_t)h * D + d]), av);
                    ak = fmaf(ds[x], tr_f32(q[r * ld + (size_t)h * D + d]), ak);
                }
                acck[d] = ak;
                accv[d] = av;
            }
            __syncthreads();
        }
    }
    for (int32_t d = tid; d < D; d += blockDim.x) {
        if (dk) tr_store(dk + kat + d, acck[d]);
        if (dv) tr_store(dv + kat + d, accv[d]);
    }
}

template <typename A>
static void backward_run(tr_backend *be, void *dq, void *dk, void *dv, const void *dout,
                         const void *out, const float *lse, const void *q, const void *k,
                         const void *v, int32_t ld, const tr_doc_layout *docs, int32_t H,
                         int32_t KVH, int32_t D) {
    cudaStream_t st = tr_cuda_stream(be);
    float scale = attn_scale(D);
    unsigned T = (unsigned)docs->n_tokens;
    if (dq) {
        size_t shm = (size_t)(3 * D + ATT_THREADS) * sizeof(float);
        if (attn_shared_ok(be, (const void *)attention_backward_dq_kernel<A>, shm)) return;
        attention_backward_dq_kernel<A><<<dim3(T, (unsigned)H), ATT_THREADS, shm, st>>>(
            (A *)dq, (const A *)dout, (const A *)out, lse, (const A *)q, (const A *)k,
            (const A *)v, ld, docs->doc_start, docs->prefix, docs->n_docs, H, KVH, D, scale);
        if (TR_CUDA_LAUNCHED(be, "attention_backward dq")) return;
    }
    if (dk || dv) {
        size_t shm = (size_t)(4 * D + 2 * ATT_THREADS) * sizeof(float);
        if (attn_shared_ok(be, (const void *)attention_backward_dkv_kernel<A>, shm)) return;
        attention_backward_dkv_kernel<A><<<dim3(T, (unsigned)KVH), ATT_THREADS, shm, st>>>(
            (A *)dk, (A *)dv, (const A *)dout, (const A *)out, lse, (const A *)q, (const A *)k,
            (const A *)v, ld, docs->doc_start, docs->prefix, docs->n_docs, H, KVH, D, scale);
        TR_CUDA_LAUNCHED(be, "attention_backward dkv");
    }
}

void tr_cuda_attention_backward(tr_backend *be, void *dq, void *dk, void *dv,
                                const void *dout, const void *out, const float *lse,
                                const void *q, const void *k, const void *v, int32_t ld,
                                const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    if (docs->n_tokens <= 0 || H <= 0) return;
    if (attn_flash(be, D)) {
        fa_bwd_args a = {(tr_bf16 *)dq, (tr_bf16 *)dk, (tr_bf16 *)dv, (const tr_bf16 *)dout,
                         (const tr_bf16 *)out, (const tr_bf16 *)q, (const tr_bf16 *)k,
                         (const tr_bf16 *)v, lse, docs->doc_start, docs->prefix, docs->n_docs,
                         docs->n_tokens, H, KVH, ld, (float)(1.0 / sqrt((double)D)),
                         tr_fa_scale_log2(D), 0, 0};
        a.vec = ld % 8 == 0 && attn_aligned(q, 16) && attn_aligned(k, 16) &&
                attn_aligned(v, 16) && attn_aligned(dout, 16) && attn_aligned(out, 16);
        a.st4 = ld % 2 == 0 && attn_aligned(dq, 4) && attn_aligned(dk, 4) && attn_aligned(dv, 4);
        const size_t rows = (size_t)docs->n_tokens * (size_t)H;
        a.delta = tr_cuda_rows(be, 2 * rows);
        if (!a.delta) return;
        a.lse2 = a.delta + rows;
        tr_fa_backward(be, a, D);
        return;
    }
    if (tr_cuda_bf16(be))
        backward_run<tr_bf16>(be, dq, dk, dv, dout, out, lse, q, k, v, ld, docs, H, KVH, D);
    else
        backward_run<float>(be, dq, dk, dv, dout, out, lse, q, k, v, ld, docs, H, KVH, D);
}
