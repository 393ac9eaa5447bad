// Causal grouped-query attention on the GPU, correctness first: one block per (query row,
// head) for the forward and the decode step, both through attn_row, so a decoded token's
// output is bitwise the training forward's row. Keys are taken in chunks of ATT_THREADS (one
// thread per key scores it), with an online softmax across chunks; lse is saved. The
// backward recomputes probabilities from lse and needs no atomics and no scratch: dq by
// query rows, then dk and dv by key rows (each summing its group's heads in order).
// Explicit fmaf/__fmul_rn keep the arithmetic the same whatever the compiler contracts.
#include <math.h>

#include "kernels/cuda/cuda_ctx.cuh"

#define ATT_THREADS 128

// The keys and values one query row may read, for one kv head: key j sits at k + slot(j).
struct kv_rows {
    const float *k, *v;
    size_t stride;              // floats between consecutive slots
    const int32_t *blocks;      // NULL: slot j is row j; else paged through this block list
    int32_t block_size;
    __device__ size_t slot(int32_t j) const {
        if (!blocks) return (size_t)j * stride;
        return ((size_t)blocks[j / block_size] * (size_t)block_size + (size_t)(j % block_size)) *
               stride;
    }
};

__device__ inline float attn_dot(const float *a, const float *b, int32_t D) {
    float acc = 0.0f;
    for (int32_t d = 0; d < D; d++) acc = fmaf(a[d], b[d], acc);
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
__device__ void attn_row(float *out, float *lse, const float *q, const kv_rows &s, int32_t n,
                         int32_t D, float scale, float *sh, size_t *slot) {
    float *qs = sh, *acc = sh + D, *p = sh + 2 * D;
    int32_t tid = threadIdx.x;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        qs[d] = q[d];
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
            for (int32_t j = 0; j < cn; j++) a = fmaf(p[j], s.v[slot[j] + d], a);
            acc[d] = a;
        }
        __syncthreads();   // p and slot are rewritten by the next chunk
    }
    float inv = n > 0 ? (float)(1.0 / l) : 0.0f;
    for (int32_t d = tid; d < D; d += blockDim.x) out[d] = __fmul_rn(acc[d], inv);
    if (lse && tid == 0) *lse = n > 0 ? (float)((double)m + log(l)) : -INFINITY;
}

static size_t attn_row_shared(int32_t D) {
    return (size_t)(2 * D + ATT_THREADS) * sizeof(float) + ATT_THREADS * sizeof(size_t);
}

__device__ inline size_t *attn_slots(float *sh, int32_t floats) {
    // size_t scratch after the floats, aligned to 8 bytes
    return (size_t *)(sh + ((floats + 1) & ~1));
}

__global__ void attention_forward_kernel(float *out, float *lse, const float *q, const float *k,
                                         const float *v, const int32_t *doc_start,
                                         int32_t n_docs, int32_t H, int32_t KVH, int32_t D,
                                         float scale) {
    extern __shared__ float sh[];
    int32_t t = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH);
    int32_t start = doc_start[attn_doc_of(doc_start, n_docs, t)];
    size_t stride = (size_t)KVH * D;
    kv_rows s = {k + (size_t)start * stride + (size_t)kvh * D,
                 v + (size_t)start * stride + (size_t)kvh * D, stride, NULL, 0};
    size_t row = (size_t)t * H + h;
    attn_row(out + row * D, lse + row, q + row * D, s, t - start + 1, D, scale, sh,
             attn_slots(sh, 2 * D + ATT_THREADS));
}

__global__ void attention_decode_kernel(float *out, const float *q, const float *k_pool,
                                        const float *v_pool, int32_t block_size, int32_t KVH,
                                        int32_t D, const int32_t *block_table,
                                        int32_t max_blocks, const int32_t *seq_len, int32_t H,
                                        float scale) {
    extern __shared__ float sh[];
    int32_t b = blockIdx.x, h = blockIdx.y, kvh = h / (H / KVH);
    kv_rows s = {k_pool + (size_t)kvh * D, v_pool + (size_t)kvh * D, (size_t)KVH * D,
                 block_table + (size_t)b * max_blocks, block_size};
    size_t row = (size_t)b * H + h;
    attn_row(out + row * D, NULL, q + row * D, s, seq_len[b], D, scale, sh,
             attn_slots(sh, 2 * D + ATT_THREADS));
}

static float attn_scale(int32_t D) { return (float)(1.0 / sqrt((double)D)); }

// Dynamic shared memory above the 48 KiB default must be opted into per kernel.
static int attn_shared_ok(tr_backend *be, const void *kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return 0;
    return TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel,
                                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)bytes));
}

void tr_cuda_attention_forward(tr_backend *be, float *out, float *lse, const float *q,
                               const float *k, const float *v, const tr_doc_layout *docs,
                               int32_t H, int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0 || H <= 0) return;
    size_t shm = attn_row_shared(D) + 2 * sizeof(float);
    if (attn_shared_ok(be, (const void *)attention_forward_kernel, shm)) return;
    dim3 grid((unsigned)T, (unsigned)H);
    attention_forward_kernel<<<grid, ATT_THREADS, shm, tr_cuda_stream(be)>>>(
        out, lse, q, k, v, docs->doc_start, docs->n_docs, H, KVH, D, attn_scale(D));
    TR_CUDA_LAUNCHED(be, "attention_forward");
}

void tr_cuda_attention_decode(tr_backend *be, float *out, const float *q,
                              const tr_kv_pages *kv, const int32_t *block_table,
                              int32_t max_blocks, const int32_t *seq_len, int32_t B,
                              int32_t H) {
    if (B <= 0 || H <= 0) return;
    int32_t D = kv->head_dim;
    size_t shm = attn_row_shared(D) + 2 * sizeof(float);
    if (attn_shared_ok(be, (const void *)attention_decode_kernel, shm)) return;
    dim3 grid((unsigned)B, (unsigned)H);
    attention_decode_kernel<<<grid, ATT_THREADS, shm, tr_cuda_stream(be)>>>(
        out, q, kv->k_pool, kv->v_pool, kv->block_size, kv->n_kv_heads, D, block_table,
        max_blocks, seq_len, H, attn_scale(D));
    TR_CUDA_LAUNCHED(be, "attention_decode");
}

// sum_d dout[d] * out[d] in double, sequentially: the softmax backward's row term. The dq and
// the dk/dv kernels both call it, so they agree on it bit for bit.
__device__ inline float attn_row_delta(const float *dout, const float *out, int32_t D) {
    double acc = 0.0;
    for (int32_t d = 0; d < D; d++) acc += (double)dout[d] * out[d];
    return (float)acc;
}

// dq for one (query row, head): keys of the row's document up to the row, in chunks; per key
// p = exp(s - lse), dS = p (dP - delta) * scale, dq += dS k. Shared: qs, gos, acc [D], ds.
__global__ void attention_backward_dq_kernel(float *dq, const float *dout, const float *out,
                                             const float *lse, const float *q, const float *k,
                                             const float *v, const int32_t *doc_start,
                                             int32_t n_docs, int32_t H, int32_t KVH, int32_t D,
                                             float scale) {
    extern __shared__ float sh[];
    float *qs = sh, *gos = sh + D, *acc = sh + 2 * D, *ds = sh + 3 * D;
    __shared__ float delta_sh;
    int32_t i = blockIdx.x, h = blockIdx.y, g = h / (H / KVH), tid = threadIdx.x;
    int32_t start = doc_start[attn_doc_of(doc_start, n_docs, i)];
    size_t row = (size_t)i * H + h, kstride = (size_t)KVH * D;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        qs[d] = q[row * D + d];
        gos[d] = dout[row * D + d];
        acc[d] = 0.0f;
    }
    if (tid == 0) delta_sh = attn_row_delta(dout + row * D, out + row * D, D);
    __syncthreads();
    float delta = delta_sh, l = lse[row];
    const float *kb = k + (size_t)g * D, *vb = v + (size_t)g * D;
    for (int32_t c0 = start; c0 <= i; c0 += blockDim.x) {
        int32_t cn = i + 1 - c0 < (int32_t)blockDim.x ? i + 1 - c0 : (int32_t)blockDim.x;
        if (tid < cn) {
            size_t o = (size_t)(c0 + tid) * kstride;
            float p = expf(__fmul_rn(attn_dot(qs, kb + o, D), scale) - l);
            float dp = attn_dot(gos, vb + o, D);
            ds[tid] = __fmul_rn(__fmul_rn(p, dp - delta), scale);
        }
        __syncthreads();
        for (int32_t d = tid; d < D; d += blockDim.x) {
            float a = acc[d];
            for (int32_t j = 0; j < cn; j++) a = fmaf(ds[j], kb[(size_t)(c0 + j) * kstride + d], a);
            acc[d] = a;
        }
        __syncthreads();
    }
    for (int32_t d = tid; d < D; d += blockDim.x) dq[row * D + d] += acc[d];
}

// dk, dv for one (key row j, kv head g): the group's heads in order, then the query rows of
// the document from j on, in chunks; dv += p dO, dk += dS q. Shared: ks, vs, acck, accv [D],
// p, ds [ATT_THREADS].
__global__ void attention_backward_dkv_kernel(float *dk, float *dv, const float *dout,
                                              const float *out, const float *lse,
                                              const float *q, const float *k, const float *v,
                                              const int32_t *doc_start, int32_t n_docs,
                                              int32_t H, int32_t KVH, int32_t D, float scale) {
    extern __shared__ float sh[];
    float *ks = sh, *vs = sh + D, *acck = sh + 2 * D, *accv = sh + 3 * D;
    float *ps = sh + 4 * D, *ds = ps + blockDim.x;
    int32_t j = blockIdx.x, g = blockIdx.y, group = H / KVH, tid = threadIdx.x;
    int32_t end = doc_start[attn_doc_of(doc_start, n_docs, j) + 1];
    size_t krow = ((size_t)j * KVH + g) * D, qstride = (size_t)H * D;
    for (int32_t d = tid; d < D; d += blockDim.x) {
        ks[d] = k[krow + d];
        vs[d] = v[krow + d];
        acck[d] = 0.0f;
        accv[d] = 0.0f;
    }
    __syncthreads();
    for (int32_t h = g * group; h < (g + 1) * group; h++) {
        for (int32_t c0 = j; c0 < end; c0 += blockDim.x) {
            int32_t cn = end - c0 < (int32_t)blockDim.x ? end - c0 : (int32_t)blockDim.x;
            if (tid < cn) {
                size_t row = (size_t)(c0 + tid) * H + h;
                const float *qi = q + row * D, *goi = dout + row * D;
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
                    size_t o = (size_t)(c0 + x) * qstride + (size_t)h * D + d;
                    av = fmaf(ps[x], dout[o], av);
                    ak = fmaf(ds[x], q[o], ak);
                }
                acck[d] = ak;
                accv[d] = av;
            }
            __syncthreads();
        }
    }
    for (int32_t d = tid; d < D; d += blockDim.x) {
        if (dk) dk[krow + d] += acck[d];
        if (dv) dv[krow + d] += accv[d];
    }
}

void tr_cuda_attention_backward(tr_backend *be, float *dq, float *dk, float *dv,
                                const float *dout, const float *out, const float *lse,
                                const float *q, const float *k, const float *v,
                                const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0 || H <= 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    float scale = attn_scale(D);
    if (dq) {
        size_t shm = (size_t)(3 * D + ATT_THREADS) * sizeof(float);
        if (attn_shared_ok(be, (const void *)attention_backward_dq_kernel, shm)) return;
        attention_backward_dq_kernel<<<dim3((unsigned)T, (unsigned)H), ATT_THREADS, shm, st>>>(
            dq, dout, out, lse, q, k, v, docs->doc_start, docs->n_docs, H, KVH, D, scale);
        if (TR_CUDA_LAUNCHED(be, "attention_backward dq")) return;
    }
    if (dk || dv) {
        size_t shm = (size_t)(4 * D + 2 * ATT_THREADS) * sizeof(float);
        if (attn_shared_ok(be, (const void *)attention_backward_dkv_kernel, shm)) return;
        attention_backward_dkv_kernel<<<dim3((unsigned)T, (unsigned)KVH), ATT_THREADS, shm,
                                        st>>>(dk, dv, dout, out, lse, q, k, v, docs->doc_start,
                                              docs->n_docs, H, KVH, D, scale);
        TR_CUDA_LAUNCHED(be, "attention_backward dkv");
    }
}
