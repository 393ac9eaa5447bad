// Optimizer-step ops on the GPU: AdamW over a whole flat range in one launch (per-segment
// weight decay, gradient clipping by a coefficient computed on the device, the bf16 working
// copy written alongside), and the sum of squares behind the clipping. sumsq is
// deterministic: fixed-size blocks (the size depends on n only) summed in double in a fixed
// tree order, then one thread adds the block partials in order into the caller's device
// double; the AdamW launch reads that double itself, so the host waits for nothing.
#include <math.h>

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define OPT_THREADS 256
#define SUMSQ_MIN_BLOCK 16384

// The clip coefficient from the device's sum of squares, in double: min(1, max_norm /
// (sqrt(sumsq) + 1e-6)), 1 when max_norm <= 0 (or no sum is given). Returns false when the
// sum is not finite: the step is skipped.
__device__ inline bool adamw_clip(const double *sumsq, float max_norm, double *c) {
    *c = 1.0;
    if (!sumsq) return true;
    double s = *sumsq;
    if (!isfinite(s)) return false;
    if (max_norm > 0.0f) {
        double q = (double)max_norm / (sqrt(s) + 1e-6);
        if (q < 1.0) *c = q;
    }
    return true;
}

// The segment holding element i: the last one that begins at or before it.
__device__ inline int32_t adamw_seg_of(const tr_adamw_seg *segs, int32_t n_segs, uint64_t i) {
    int32_t lo = 0, hi = n_segs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (segs[mid].begin <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The step's constants, one argument block.
struct adamw_k {
    const tr_adamw_seg *segs;
    int32_t n_segs;
    const double *sumsq;
    float max_norm, lr, b1, b2, eps, bc1, bc2;
};

// One element's update: the per-tensor kernel's expressions unchanged (so its fp32 bits when
// c = 1, where g' = g exactly).
__device__ __forceinline__ void adamw_one(const adamw_k &k, double c, float wd, float gr,
                                          float &p, float &m, float &v) {
    float gi = (float)(c * (double)gr);
    float mi = k.b1 * m + (1.0f - k.b1) * gi;
    float vi = k.b2 * v + (1.0f - k.b2) * (gi * gi);
    m = mi;
    v = vi;
    float mh = mi / k.bc1, vh = vi / k.bc2;
    p -= k.lr * (mh / (sqrtf(vh) + k.eps) + wd * p);
}

// Element i updated in place, its working copy written.
__device__ __forceinline__ void adamw_at(const adamw_k &k, double c, float wd, size_t i,
                                         float *p, const float *g, float *m, float *v,
                                         void *work, int32_t work_bf16) {
    adamw_one(k, c, wd, g[i], p[i], m[i], v[i]);
    if (!work) return;
    if (work_bf16) ((uint16_t *)work)[i] = tr_bf16_bits(p[i]);
    else ((float *)work)[i] = p[i];
}

// Block b updates groups [b * chunk, (b + 1) * chunk) of 4 elements, 16-byte loads and stores
// of p, g, m and v (the pass is memory-bound: scalar accesses left a third of the bandwidth
// unused). Each thread's elements rise, so it finds its segment once and then steps forward
// past segment ends, element by element (a group may straddle two). n4 = n / 4 groups; the
// last n % 4 elements are the first block's.
__global__ void adamw_kernel(float *p, void *work, int32_t work_bf16, const float *g, float *m,
                             float *v, size_t n, adamw_k k, size_t chunk) {
    double c;
    if (!adamw_clip(k.sumsq, k.max_norm, &c)) return;
    const size_t n4 = n / 4;
    size_t i0 = (size_t)blockIdx.x * chunk + threadIdx.x;
    size_t i1 = (size_t)blockIdx.x * chunk + chunk < n4 ? (size_t)blockIdx.x * chunk + chunk : n4;
    int32_t s = i0 < i1 ? adamw_seg_of(k.segs, k.n_segs, 4 * i0) : 0;
    for (size_t q = i0; q < i1; q += blockDim.x) {
        float4 pp = reinterpret_cast<float4 *>(p)[q], gg = reinterpret_cast<const float4 *>(g)[q];
        float4 mm = reinterpret_cast<float4 *>(m)[q], vv = reinterpret_cast<float4 *>(v)[q];
        float *pe = &pp.x, *ge = &gg.x, *me = &mm.x, *ve = &vv.x;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            while (s + 1 < k.n_segs && 4 * q + j >= k.segs[s].end) s++;
            adamw_one(k, c, k.segs[s].wd, ge[j], pe[j], me[j], ve[j]);
        }
        reinterpret_cast<float4 *>(p)[q] = pp;
        reinterpret_cast<float4 *>(m)[q] = mm;
        reinterpret_cast<float4 *>(v)[q] = vv;
        if (!work) continue;
        if (work_bf16) {
            ushort4 w = {tr_bf16_bits(pp.x), tr_bf16_bits(pp.y), tr_bf16_bits(pp.z),
                         tr_bf16_bits(pp.w)};
            reinterpret_cast<ushort4 *>(work)[q] = w;
        } else {
            reinterpret_cast<float4 *>(work)[q] = pp;
        }
    }
    if (blockIdx.x != 0) return;
    for (size_t i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x)   // the tail
        adamw_at(k, c, k.segs[adamw_seg_of(k.segs, k.n_segs, i)].wd, i, p, g, m, v, work,
                 work_bf16);
}

// The same update one element at a time, for ranges whose buffers are not 16-byte aligned
// (a ZeRO-1 shard may start anywhere in the flat parameters).
__global__ void adamw_scalar_kernel(float *p, void *work, int32_t work_bf16, const float *g,
                                    float *m, float *v, size_t n, adamw_k k, size_t chunk) {
    double c;
    if (!adamw_clip(k.sumsq, k.max_norm, &c)) return;
    size_t i0 = (size_t)blockIdx.x * chunk + threadIdx.x;
    size_t i1 = (size_t)blockIdx.x * chunk + chunk < n ? (size_t)blockIdx.x * chunk + chunk : n;
    int32_t s = i0 < i1 ? adamw_seg_of(k.segs, k.n_segs, i0) : 0;
    for (size_t i = i0; i < i1; i += blockDim.x) {
        while (s + 1 < k.n_segs && i >= k.segs[s].end) s++;
        adamw_at(k, c, k.segs[s].wd, i, p, g, m, v, work, work_bf16);
    }
}

void tr_cuda_adamw(tr_backend *be, const tr_adamw_args *a) {
    if (a->n == 0) return;
    if (a->n_segs <= 0 || (a->work && a->wt != TR_F32 && a->wt != TR_BF16)) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "adamw",
                       "needs segments, and a working copy of fp32 or bf16");
        return;
    }
    // The 16-byte groups need 16-byte aligned buffers (and 8 bytes for a bf16 copy).
    uintptr_t al = (uintptr_t)a->p | (uintptr_t)a->g | (uintptr_t)a->m | (uintptr_t)a->v;
    bool vec = al % 16 == 0 && (!a->work || (uintptr_t)a->work % (a->wt == TR_BF16 ? 8 : 16) == 0);
    adamw_k k = {a->segs, a->n_segs, a->sumsq, a->max_norm, a->lr, a->b1, a->b2, a->eps,
                 (float)(1.0 - pow((double)a->b1, (double)a->t)),
                 (float)(1.0 - pow((double)a->b2, (double)a->t))};
    size_t groups = vec ? a->n / 4 : a->n;
    unsigned grid = tr_cuda_grid(groups ? groups : 1, OPT_THREADS);
    size_t chunk = (groups + grid - 1) / grid;
    if (vec)
        adamw_kernel<<<grid, OPT_THREADS, 0, tr_cuda_stream(be)>>>(
            a->p, a->work, a->wt == TR_BF16, a->g, a->m, a->v, a->n, k, chunk);
    else
        adamw_scalar_kernel<<<grid, OPT_THREADS, 0, tr_cuda_stream(be)>>>(
            a->p, a->work, a->wt == TR_BF16, a->g, a->m, a->v, a->n, k, chunk);
    TR_CUDA_LAUNCHED(be, "adamw");
}

// A thread's values are loaded SUMSQ_BATCH at a time, all before the first of their additions,
// which keep the values' order (the same bits): the loop had one load in flight a thread
// (0.5B shape's 494M gradients: 951 -> 914 us, an H100).
#define SUMSQ_BATCH 8

__global__ void sumsq_kernel(double *partial, const float *x, size_t n, size_t block) {
    size_t b0 = (size_t)blockIdx.x * block;
    size_t b1 = b0 + block < n ? b0 + block : n;
    const size_t step = blockDim.x;
    double acc = 0.0;
    size_t i = b0 + threadIdx.x;
    for (; i + (SUMSQ_BATCH - 1) * step < b1; i += SUMSQ_BATCH * step) {
        float v[SUMSQ_BATCH];
#pragma unroll
        for (int u = 0; u < SUMSQ_BATCH; u++) v[u] = x[i + u * step];
#pragma unroll
        for (int u = 0; u < SUMSQ_BATCH; u++) acc += (double)v[u] * v[u];
    }
    for (; i < b1; i += step) acc += (double)x[i] * x[i];
    acc = tr_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// The partials of at most TR_CUDA_SUMSQ_BLOCKS blocks, in block order: a serial loop is
// the fixed order, and a thousand additions are nothing next to the pass over x.
__global__ void sumsq_total_kernel(double *acc, const double *partial, unsigned n_blocks) {
    double total = 0.0;
    for (unsigned b = 0; b < n_blocks; b++) total += partial[b];
    *acc += total;
}

// The context's partials are reused by every call: the stream orders the calls.
void tr_cuda_sumsq(tr_backend *be, double *acc, const float *x, size_t n) {
    if (n == 0) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    size_t block = SUMSQ_MIN_BLOCK;
    if (n > block * TR_CUDA_SUMSQ_BLOCKS)
        block = (n + TR_CUDA_SUMSQ_BLOCKS - 1) / TR_CUDA_SUMSQ_BLOCKS;
    unsigned n_blocks = (unsigned)((n + block - 1) / block);
    sumsq_kernel<<<n_blocks, OPT_THREADS, 0, ctx->stream>>>(ctx->partial, x, n, block);
    if (TR_CUDA_LAUNCHED(be, "sumsq")) return;
    sumsq_total_kernel<<<1, 1, 0, ctx->stream>>>(acc, ctx->partial, n_blocks);
    TR_CUDA_LAUNCHED(be, "sumsq total");
}
