// One row of the fused log-softmax on the GPU, shared by logsoftmax_forward and sample: both
// run it in blocks of TR_LSM_THREADS threads over logits of the activation dtype (float or
// bf16, widened exactly), so the reductions have the same shape and the sample op's logprobs
// are the forward's bits. Rows are read in chunks of TR_LSM_CHUNK columns with 16-byte loads
// where the row's start allows, else element by element in the same order.
#pragma once
#include <stdint.h>

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define TR_LSM_THREADS 256

// Chunk c of a row is columns [8c, 8c + 8) (the last one may be short); thread c % blockDim.x
// owns it, and each thread goes through its chunks, and each chunk's columns, in order. That
// order depends on V alone: whether a chunk arrives by 16-byte loads (a 16-byte aligned row
// and a whole chunk) or one element at a time changes no sum, so a row gives the same bits
// wherever it lies (a decode row, a training chunk, one rank's columns). Eight columns are
// one 16-byte load of bf16 or two of fp32, and both dtypes sum in the same order.
#define TR_LSM_CHUNK 8

template <typename T>
__device__ __forceinline__ bool tr_lsm_aligned(const T *p) {
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

__device__ __forceinline__ int32_t tr_lsm_chunks(int32_t V) {
    return (V + TR_LSM_CHUNK - 1) / TR_LSM_CHUNK;
}

// Columns in chunk c; fills v[0, n) with them as fp32 (exact). Loops run the whole chunk
// with a guard, unrolled, so that v stays in registers.
__device__ __forceinline__ int32_t tr_lsm_load(const float *x, int32_t V, int32_t c, bool vec,
                                               float v[TR_LSM_CHUNK]) {
    int32_t i0 = c * TR_LSM_CHUNK, n = V - i0 < TR_LSM_CHUNK ? V - i0 : TR_LSM_CHUNK;
    if (vec && n == TR_LSM_CHUNK) {
        float4 a = reinterpret_cast<const float4 *>(x + i0)[0];
        float4 b = reinterpret_cast<const float4 *>(x + i0)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return n;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) v[k] = k < n ? x[i0 + k] : 0.0f;
    return n;
}

__device__ __forceinline__ int32_t tr_lsm_load(const tr_bf16 *x, int32_t V, int32_t c, bool vec,
                                               float v[TR_LSM_CHUNK]) {
    int32_t i0 = c * TR_LSM_CHUNK, n = V - i0 < TR_LSM_CHUNK ? V - i0 : TR_LSM_CHUNK;
    if (vec && n == TR_LSM_CHUNK) {
        // Little-endian pairs: the low half of each word is the lower column; a bf16 is the
        // top half of its fp32.
        uint4 q = *reinterpret_cast<const uint4 *>(x + i0);
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[2 * k] = __uint_as_float(w[k] << 16);
            v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
        return n;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) v[k] = k < n ? tr_f32(x[i0 + k]) : 0.0f;
    return n;
}

// Stores g[0, n) as chunk c of a row, each rounded once (tr_store's rounding).
__device__ __forceinline__ void tr_lsm_store(float *d, int32_t c, int32_t n, bool vec,
                                             const float g[TR_LSM_CHUNK]) {
    int32_t i0 = c * TR_LSM_CHUNK;
    if (vec && n == TR_LSM_CHUNK) {
        reinterpret_cast<float4 *>(d + i0)[0] = make_float4(g[0], g[1], g[2], g[3]);
        reinterpret_cast<float4 *>(d + i0)[1] = make_float4(g[4], g[5], g[6], g[7]);
        return;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
        if (k < n) d[i0 + k] = g[k];
}

__device__ __forceinline__ void tr_lsm_store(tr_bf16 *d, int32_t c, int32_t n, bool vec,
                                             const float g[TR_LSM_CHUNK]) {
    int32_t i0 = c * TR_LSM_CHUNK;
    if (vec && n == TR_LSM_CHUNK) {
        uint32_t w[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(g[2 * k])) |
                   (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(g[2 * k + 1])) << 16;
        *reinterpret_cast<uint4 *>(d + i0) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
        if (k < n) tr_store(d + i0 + k, g[k]);
}

// The row's maximum m, S = sum e and Sx = sum e (x - m) with e = exp(x - m), sums in double.
struct tr_lsm_stats {
    float m;
    double s, sx;
};

// Every thread of the block calls; every thread gets the statistics.
template <typename T>
__device__ inline tr_lsm_stats tr_lsm_row(const T *x, int32_t V) {
    const bool vec = tr_lsm_aligned(x);
    const int32_t nc = tr_lsm_chunks(V);
    float v[TR_LSM_CHUNK];
    float m = -INFINITY;
    for (int32_t c = threadIdx.x; c < nc; c += blockDim.x) {
        int32_t n = tr_lsm_load(x, V, c, vec, v);
#pragma unroll
        for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
            if (k < n) m = fmaxf(m, v[k]);
    }
    m = tr_block_max(m);
    double s = 0.0, sx = 0.0;
    for (int32_t c = threadIdx.x; c < nc; c += blockDim.x) {
        int32_t n = tr_lsm_load(x, V, c, vec, v);
#pragma unroll
        for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
            if (k < n) {
                float z = v[k] - m;
                double e = expf(z);
                s += e;
                sx += e * z;
            }
        }
    }
    tr_lsm_stats st;
    st.m = m;
    st.s = tr_block_sum(s);
    st.sx = tr_block_sum(sx);
    return st;
}

// log-sum-exp of the row, and the log-probability of token id, as the forward rounds them.
__device__ inline double tr_lsm_lse(const tr_lsm_stats &st) { return (double)st.m + log(st.s); }
template <typename T>
__device__ inline float tr_lsm_logprob(const T *x, int32_t id, double lse) {
    return (float)((double)tr_f32(x[id]) - lse);
}
