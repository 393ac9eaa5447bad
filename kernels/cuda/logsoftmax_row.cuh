// One row of the fused log-softmax on the GPU, shared by logsoftmax_forward and sample: both
// run it over logits of the activation dtype (float or bf16, widened exactly) in the order of
// TR_LSM_VT virtual threads, so the reductions have the same shape and the sample op's
// logprobs are the forward's bits. Who plays the virtual threads is the launch's choice and
// changes no bit: a row takes a cluster of C = 1, 2 or 4 blocks of TR_LSM_THREADS threads,
// each thread playing 4 / C virtual threads, so that a decode step's 64 rows run on 256 blocks
// (one row's pass, a few hundred kilobytes, is latency-bound in one block) and a batch of
// hundreds of rows on one block a row (tr_lsm_ctas_for). Rows are read in chunks of
// TR_LSM_CHUNK columns with 16-byte loads where the row's start allows, else element by
// element in the same order, each thread's next few chunks loading while it works on one
// (tr_lsm_each).
#pragma once
#include <cooperative_groups.h>
#include <stdint.h>

#include "kernels/cuda/attention_ptx.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define TR_LSM_THREADS 256
#define TR_LSM_VT 1024                              // a row's virtual threads
#define TR_LSM_UMAX (TR_LSM_VT / TR_LSM_THREADS)    // virtual threads a thread plays, at most
#define TR_LSM_WARPS (TR_LSM_THREADS / 32)          // a block's warps
static_assert(TR_LSM_VT == 32 * 32, "a row's warps must be one warp's lanes (tr_lsm_reduce)");

// Blocks a row for a launch of `rows` rows: as many as keep the grid within two blocks an SM
// (unless a test forced a count: tr_backend_cuda_force_row_ctas).
static inline int tr_lsm_ctas_for(const tr_cuda_ctx *ctx, long rows) {
    if (ctx->row_ctas) return ctx->row_ctas;
    return rows * 4 <= 2L * ctx->sms ? 4 : rows * 2 <= 2L * ctx->sms ? 2 : 1;
}

// Launches a row kernel over `rows` rows in clusters of C blocks (rows in blockIdx.x / C
// order).
template <typename... P, typename... A>
static cudaError_t tr_lsm_launch(void (*kernel)(P...), long rows, int C, size_t dyn,
                                 cudaStream_t st, A... args) {
    return tr_cuda_launch_ex(st, C, false, kernel, dim3((unsigned)(rows * C)),
                             dim3(TR_LSM_THREADS), dyn, args...);
}

// The row's cluster: C blocks; block r's thread t plays virtual threads r * TR_LSM_THREADS + t
// + u * C * TR_LSM_THREADS for u < U = TR_LSM_UMAX / C (C = 4: r * 256 + t; C = 1: t, t + 256,
// t + 512, t + 768).
__device__ __forceinline__ int32_t tr_lsm_ctas() {
    return (int32_t)cooperative_groups::this_cluster().dim_blocks().x;
}
__device__ __forceinline__ int32_t tr_lsm_rank() {
    return (int32_t)cooperative_groups::this_cluster().block_rank();
}
__device__ __forceinline__ int32_t tr_lsm_uses() { return TR_LSM_UMAX / tr_lsm_ctas(); }
__device__ __forceinline__ int32_t tr_lsm_vt(int32_t u) {
    return (tr_lsm_rank() + u * tr_lsm_ctas()) * TR_LSM_THREADS + (int32_t)threadIdx.x;
}
// The cluster's row, and the rows the grid strides by.
__device__ __forceinline__ int32_t tr_lsm_row_first() {
    return (int32_t)blockIdx.x / tr_lsm_ctas();
}
__device__ __forceinline__ int32_t tr_lsm_row_step() {
    return (int32_t)gridDim.x / tr_lsm_ctas();
}
// A barrier of the row's blocks (the block's alone when it has the row to itself).
__device__ __forceinline__ void tr_lsm_sync() {
    if (tr_lsm_ctas() > 1) cooperative_groups::this_cluster().sync();
    else __syncthreads();
}

// A pair of sums reduced together (each in the order of one sum).
struct tr_lsm_pair {
    double a, b;
};
struct tr_lsm_op_pair {
    __device__ tr_lsm_pair operator()(tr_lsm_pair x, tr_lsm_pair y) const {
        return {x.a + y.a, x.b + y.b};
    }
};

__device__ __forceinline__ float tr_lsm_shfl(float v, int o) {
    return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ double tr_lsm_shfl(double v, int o) {
    return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ int32_t tr_lsm_shfl(int32_t v, int o) {
    return __shfl_xor_sync(0xffffffffu, v, o);
}
__device__ __forceinline__ tr_lsm_pair tr_lsm_shfl(tr_lsm_pair v, int o) {
    return {tr_lsm_shfl(v.a, o), tr_lsm_shfl(v.b, o)};
}

// A row-wide reduction in a fixed order: a butterfly over each virtual warp's lanes, then one
// over the row's 32 virtual warp results in virtual warp order, which every block's warp 0
// reads from the blocks' shared memory; so it is tr_block_reduce of one 1024-thread block,
// whoever played the threads. v[u]: the thread's value as virtual thread u (u < U). Every
// thread of the row calls; every thread gets the result. The second barrier ends the remote
// reads, so the next call (or the kernel's end) may reuse the buffers.
template <typename T, typename Op>
__device__ T tr_lsm_reduce(const T (&v)[TR_LSM_UMAX], Op op) {
    __shared__ T part[32];   // virtual warp w + 8 u of this block's threads at [w + 8 u]
    __shared__ T res;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const int C = tr_lsm_ctas(), U = TR_LSM_UMAX / C;
#pragma unroll
    for (int u = 0; u < TR_LSM_UMAX; u++) {
        if (u >= U) break;
        T x = v[u];
        for (int o = 16; o > 0; o >>= 1) x = op(x, tr_lsm_shfl(x, o));
        if (lane == 0) part[warp + TR_LSM_WARPS * u] = x;
    }
    tr_lsm_sync();
    if (warp == 0) {
        // virtual warp `lane` is block (lane / 8) % C's warp lane % 8, as its virtual thread
        // lane / (8 C)
        const int r = lane / TR_LSM_WARPS % C;
        const int slot = lane % TR_LSM_WARPS + lane / (TR_LSM_WARPS * C) * TR_LSM_WARPS;
        T x = C > 1 ? cooperative_groups::this_cluster().map_shared_rank(part, (unsigned)r)[slot]
                    : part[slot];
        for (int o = 16; o > 0; o >>= 1) x = op(x, tr_lsm_shfl(x, o));
        if (lane == 0) res = x;
    }
    tr_lsm_sync();
    return res;
}

// The same for an order-free operation (maximum, a total order's best), whose thread value
// covers all of its virtual threads: the others are the identity.
template <typename T, typename Op>
__device__ T tr_lsm_reduce1(T v, Op op, T identity) {
    T vs[TR_LSM_UMAX];
    vs[0] = v;
#pragma unroll
    for (int u = 1; u < TR_LSM_UMAX; u++) vs[u] = identity;
    return tr_lsm_reduce(vs, op);
}

// Chunk c of a row is columns [8c, 8c + 8) (the last one may be short); virtual thread
// c % TR_LSM_VT owns it, and each virtual thread goes through its chunks, and each chunk's
// columns, in order. That order depends on V alone: whether a chunk arrives by 16-byte loads (a 16-byte aligned row
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

// A chunk as loaded: its columns' bits, widened to fp32 only where they are used, so that a
// thread can have several chunks' loads in flight before it waits on the first (a row's pass
// is latency-bound: one block reads a few hundred kilobytes). fp32 takes w[0, 8), a column a
// word; bf16 takes w[0, 4), two columns a word, the lower column in the low half.
struct tr_lsm_raw {
    uint32_t w[TR_LSM_CHUNK];
};

// Loads chunk c of a row of V 32-bit words (fp32 columns, or the sampler's sort keys) into r
// and returns its column count n; columns past n are 0, and so is a chunk at or past end
// (n = 0).
__device__ __forceinline__ int32_t tr_lsm_fetch(const uint32_t *x, int32_t V, int32_t c,
                                                int32_t end, bool vec, tr_lsm_raw &r) {
    int32_t i0 = c * TR_LSM_CHUNK, n = V - i0 < TR_LSM_CHUNK ? V - i0 : TR_LSM_CHUNK;
    if (c >= end) n = 0;
    if (vec && n == TR_LSM_CHUNK) {
        uint4 a = reinterpret_cast<const uint4 *>(x + i0)[0];
        uint4 b = reinterpret_cast<const uint4 *>(x + i0)[1];
        r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
        r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
        return n;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) r.w[k] = k < n ? x[i0 + k] : 0u;
    return n;
}

__device__ __forceinline__ int32_t tr_lsm_fetch(const float *x, int32_t V, int32_t c,
                                                int32_t end, bool vec, tr_lsm_raw &r) {
    return tr_lsm_fetch(reinterpret_cast<const uint32_t *>(x), V, c, end, vec, r);
}

__device__ __forceinline__ int32_t tr_lsm_fetch(const tr_bf16 *x, int32_t V, int32_t c,
                                                int32_t end, bool vec, tr_lsm_raw &r) {
    int32_t i0 = c * TR_LSM_CHUNK, n = V - i0 < TR_LSM_CHUNK ? V - i0 : TR_LSM_CHUNK;
    if (c >= end) n = 0;
    if (vec && n == TR_LSM_CHUNK) {
        uint4 q = *reinterpret_cast<const uint4 *>(x + i0);
        r.w[0] = q.x, r.w[1] = q.y, r.w[2] = q.z, r.w[3] = q.w;
        return n;
    }
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK / 2; k++) {
        uint32_t lo = 2 * k < n ? __bfloat16_as_ushort(x[i0 + 2 * k]) : 0u;
        uint32_t hi = 2 * k + 1 < n ? __bfloat16_as_ushort(x[i0 + 2 * k + 1]) : 0u;
        r.w[k] = lo | hi << 16;
    }
    return n;
}

// The chunk's columns as fp32, exactly (a bf16 is the top half of its fp32).
__device__ __forceinline__ void tr_lsm_widen(const float *, const tr_lsm_raw &r,
                                             float v[TR_LSM_CHUNK]) {
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) v[k] = __uint_as_float(r.w[k]);
}

__device__ __forceinline__ void tr_lsm_widen(const tr_bf16 *, const tr_lsm_raw &r,
                                             float v[TR_LSM_CHUNK]) {
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK / 2; k++) {
        v[2 * k] = __uint_as_float(r.w[k] << 16);
        v[2 * k + 1] = __uint_as_float(r.w[k] & 0xffff0000u);
    }
}

// Columns of chunk c of a walk of V columns, 0 at or past end.
__device__ __forceinline__ int32_t tr_lsm_count(int32_t V, int32_t c, int32_t end) {
    int32_t i0 = c * TR_LSM_CHUNK;
    return c >= end ? 0 : V - i0 < TR_LSM_CHUNK ? V - i0 : TR_LSM_CHUNK;
}

// Chunk c's raw words into a shared-memory slot of `bytes` (16 or 32): asynchronously where
// it is whole and 16-byte aligned (the caller commits and waits), else loaded and stored now.
// src: a global address of the chunk's first column (valid whenever the copy is async).
__device__ __forceinline__ void tr_lsm_stage_raw(unsigned char *slot, const void *src,
                                                 int bytes, bool async, const tr_lsm_raw &r) {
    if (async) {
        fa_cp16(slot, src, true);
        if (bytes > 16) fa_cp16(slot + 16, (const unsigned char *)src + 16, true);
        return;
    }
    uint32_t *w = reinterpret_cast<uint32_t *>(slot);
    for (int k = 0; k < bytes / 4; k++) w[k] = r.w[k];
}

// A row as a source of chunks for tr_lsm_each.
template <typename T>
struct tr_lsm_src {
    const T *x;
    int32_t V;
    bool vec;
    __device__ __forceinline__ int32_t fetch(int32_t c, int32_t end, tr_lsm_raw &r) const {
        return tr_lsm_fetch(x, V, c, end, vec, r);
    }
    __device__ __forceinline__ int32_t count(int32_t c, int32_t end) const {
        return tr_lsm_count(V, c, end);
    }
    // bytes of a chunk's raw words
    __device__ __forceinline__ int raw_bytes() const { return (int)sizeof(T) * TR_LSM_CHUNK; }
    __device__ __forceinline__ void stage(int32_t c, int32_t end, unsigned char *slot) const {
        const bool async = vec && count(c, end) == TR_LSM_CHUNK;
        tr_lsm_raw r;
        if (!async) fetch(c, end, r);
        tr_lsm_stage_raw(slot, x + (size_t)c * TR_LSM_CHUNK, raw_bytes(), async, r);
    }
    __device__ __forceinline__ void widen(const tr_lsm_raw &r, float v[TR_LSM_CHUNK]) const {
        tr_lsm_widen(x, r, v);
    }
};

template <typename T>
__device__ __forceinline__ tr_lsm_src<T> tr_lsm_row_src(const T *x, int32_t V) {
    return {x, V, tr_lsm_aligned(x)};
}

// Chunks a thread keeps loading ahead of the one it works on.
#define TR_LSM_AHEAD 4

// Chunks a thread stages at a time in shared memory, at most (tr_lsm_each).
#define TR_LSM_STAGE_MAX 16

// Dynamic shared memory a row kernel is launched with, for tr_lsm_each's staging: rows few
// enough that their blocks leave SMs idle read deeper through it; many rows keep the
// registers' loads ahead (0), so that more blocks fit an SM. 64 KiB leaves two blocks an SM
// room for the sampler's 25 KiB of its own. blocks: the launch's (rows times C).
#define TR_LSM_STAGE_BYTES (64 << 10)
static inline size_t tr_lsm_stage_bytes(long blocks, int sms) {
    return blocks < 2L * sms ? TR_LSM_STAGE_BYTES : 0;
}

__device__ __forceinline__ uint32_t tr_lsm_dyn_bytes() {
    uint32_t b;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(b));
    return b;
}

// tr_lsm_each through shared memory: each thread's chunks in batches of H, the next batch's
// copies in flight while it works on one, in two halves of the block's dynamic shared memory
// (H per thread and half, as many as it holds up to TR_LSM_STAGE_MAX). A thread reads only
// the slots it filled, so no barrier is needed. Returns false, doing nothing, when the
// kernel has too little dynamic shared memory for two chunks a half.
template <typename Src, typename F>
__device__ __forceinline__ bool tr_lsm_each_staged(const Src &src, int32_t first, int32_t step,
                                                   int32_t end, F f) {
    const int RB = src.raw_bytes();
    extern __shared__ __align__(16) unsigned char tr_lsm_dyn[];
    const int32_t fit = (int32_t)(tr_lsm_dyn_bytes() / (2u * blockDim.x * RB));
    if (fit < 2) return false;
    const int32_t H = fit < TR_LSM_STAGE_MAX ? fit : TR_LSM_STAGE_MAX;
    const int32_t total = end > first ? (end - first + step - 1) / step : 0;
    const int32_t batches = (total + H - 1) / H;
    auto slot = [&](int32_t b, int32_t j) {
        return tr_lsm_dyn + ((size_t)((b & 1) * H + j) * blockDim.x + threadIdx.x) * RB;
    };
    auto issue = [&](int32_t b) {
#pragma unroll 1
        for (int32_t j = 0; j < H; j++) {
            const int32_t c = first + (b * H + j) * step;
            if (c >= end) break;
            src.stage(c, end, slot(b, j));
        }
    };
    if (batches > 0) issue(0);
    fa_cp_commit();
#pragma unroll 1
    for (int32_t b = 0; b < batches; b++) {
        // the half batch b + 1 fills was read by batch b - 1, whose chunks f has used
        if (b + 1 < batches) issue(b + 1);
        fa_cp_commit();
        fa_cp_wait<1>();   // batch b's copies have landed
#pragma unroll 1
        for (int32_t j = 0; j < H; j++) {
            const int32_t c = first + (b * H + j) * step;
            if (c >= end) break;
            tr_lsm_raw r;
            const uint32_t *w = reinterpret_cast<const uint32_t *>(slot(b, j));
#pragma unroll
            for (int k = 0; k < TR_LSM_CHUNK; k++) r.w[k] = 4 * k < RB ? w[k] : 0u;
            float v[TR_LSM_CHUNK];
            src.widen(r, v);
            f(c, src.count(c, end), v);
        }
    }
    fa_cp_wait<0>();
    return true;
}

// Calls f(c, n, v) for the chunks c = first, first + step, ... below end, in that order, v
// the chunk's n columns as fp32 (0 past n), with later chunks' loads in flight meanwhile:
// staged through the kernel's dynamic shared memory when it has some (tr_lsm_each_staged),
// else the next TR_LSM_AHEAD in registers. The chunks and their order are the plain loop's,
// so every sum comes out the same. src: fetch(c, end, raw) -> n, widen(raw, v), count(c, end)
// and stage(c, end, slot), as tr_lsm_src.
template <typename Src, typename F>
__device__ __forceinline__ void tr_lsm_each(const Src &src, int32_t first, int32_t step,
                                            int32_t end, F f) {
    if (tr_lsm_each_staged(src, first, step, end, f)) return;
#ifdef TR_LSM_STAGED_ONLY
    // A file whose kernels always launch with staging keeps only a plain loop besides it
    // (registers for the staged path, not for a second copy of every pass).
    for (int32_t c = first; c < end; c += step) {
        tr_lsm_raw r;
        const int32_t n = src.fetch(c, end, r);
        float v[TR_LSM_CHUNK];
        src.widen(r, v);
        f(c, n, v);
    }
#else
    tr_lsm_raw r[TR_LSM_AHEAD];
    int32_t n[TR_LSM_AHEAD];
#pragma unroll
    for (int u = 0; u < TR_LSM_AHEAD; u++) n[u] = src.fetch(first + u * step, end, r[u]);
    for (int32_t c = first; c < end; c += TR_LSM_AHEAD * step) {
#pragma unroll
        for (int u = 0; u < TR_LSM_AHEAD; u++) {
            int32_t cu = c + u * step, nu = n[u];
            float v[TR_LSM_CHUNK];
            src.widen(r[u], v);
            // r[u] is free again: its next chunk loads while this one is worked on
            n[u] = src.fetch(cu + TR_LSM_AHEAD * step, end, r[u]);
            if (cu < end) f(cu, nu, v);
        }
    }
#endif
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

// The row's maximum m, S = sum e and Sx = sum e (x - m) with e = exp(x - m), each thread's
// sums in double over its chunks' fp32 sums.
struct tr_lsm_stats {
    float m;
    double s, sx;
};

// Every thread of the row calls; every thread gets the statistics. SX: whether sx is summed
// (the entropy's); without it (the sampler, which needs the log-sum-exp alone) the terms of a
// chunk are also chosen rather than branched around, s keeping its bits.
template <bool SX = true, typename T>
__device__ inline tr_lsm_stats tr_lsm_row(const T *x, int32_t V) {
    const tr_lsm_src<T> src = tr_lsm_row_src(x, V);
    const int32_t nc = tr_lsm_chunks(V), U = tr_lsm_uses();
    float m = -INFINITY;
#pragma unroll 1
    for (int32_t u = 0; u < U; u++)
        tr_lsm_each(src, tr_lsm_vt(u), TR_LSM_VT, nc, [&](int32_t, int32_t n, const float *v) {
#pragma unroll
            for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
                if (k < n) m = fmaxf(m, v[k]);
        });
    m = tr_lsm_reduce1(m, tr_op_max(), -INFINITY);
    // A chunk's terms add in fp32 (at most TR_LSM_CHUNK of them, each e <= 1), its sums into
    // the virtual thread's double ones: two widenings a chunk instead of two a column, which
    // ran at the device's 16 conversions a clock and an SM and bounded a decode row's pass.
    tr_lsm_pair s[TR_LSM_UMAX] = {};
#pragma unroll 1
    for (int32_t u = 0; u < U; u++) {
        tr_lsm_pair acc = {0.0, 0.0};
        tr_lsm_each(src, tr_lsm_vt(u), TR_LSM_VT, nc, [&](int32_t, int32_t n, const float *v) {
            float cs = 0.0f, csx = 0.0f;
#pragma unroll
            for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
                if constexpr (SX) {
                    if (k < n) {
                        float z = v[k] - m;
                        float e = expf(z);
                        cs = __fadd_rn(cs, e);
                        csx = __fmaf_rn(e, z, csx);
                    }
                } else {   // cs >= +0, and cs + 0 is cs: a value past n adds 0
                    const float e = expf(v[k] - m);
                    cs = __fadd_rn(cs, k < n ? e : 0.0f);
                }
            }
            acc.a += (double)cs;
            acc.b += (double)csx;
        });
        s[u] = acc;
    }
    const tr_lsm_pair r = tr_lsm_reduce(s, tr_lsm_op_pair());
    tr_lsm_stats st;
    st.m = m;
    st.s = r.a;
    st.sx = r.b;
    return st;
}

// log-sum-exp of the row, and the log-probability of token id, as the forward rounds them.
__device__ inline double tr_lsm_lse(const tr_lsm_stats &st) { return (double)st.m + log(st.s); }
template <typename T>
__device__ inline float tr_lsm_logprob(const T *x, int32_t id, double lse) {
    return (float)((double)tr_f32(x[id]) - lse);
}
