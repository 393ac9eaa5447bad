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

// Block b updates [b * chunk, (b + 1) * chunk): each thread's elements rise, so it finds its
// segment once and then steps forward past segment ends. The update is the per-tensor
// kernel's expressions unchanged (so its fp32 bits when c = 1, where g' = g exactly).
__global__ void adamw_kernel(float *p, void *work, int32_t work_bf16, const float *g, float *m,
                             float *v, size_t n, const tr_adamw_seg *segs, int32_t n_segs,
                             const double *sumsq, float max_norm, float lr, float b1, float b2,
                             float eps, float bc1, float bc2, size_t chunk) {
    double c;
    if (!adamw_clip(sumsq, max_norm, &c)) return;
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    size_t i0 = (size_t)blockIdx.x * chunk + threadIdx.x;
    size_t i1 = (size_t)blockIdx.x * chunk + chunk < n ? (size_t)blockIdx.x * chunk + chunk : n;
    if (i0 >= i1) return;
    int32_t s = adamw_seg_of(segs, n_segs, i0);
    for (size_t i = i0; i < i1; i += blockDim.x) {
        while (s + 1 < n_segs && i >= segs[s].end) s++;
        float wd = segs[s].wd;
        float gi = (float)(c * (double)g[i]);
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
        if (!work) continue;
        if (work_bf16) ((uint16_t *)work)[i] = tr_bf16_bits(p[i]);
        else ((float *)work)[i] = p[i];
    }
}

void tr_cuda_adamw(tr_backend *be, const tr_adamw_args *a) {
    if (a->n == 0) return;
    if (a->n_segs <= 0 || (a->work && a->wt != TR_F32 && a->wt != TR_BF16)) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "adamw",
                       "needs segments, and a working copy of fp32 or bf16");
        return;
    }
    float bc1 = (float)(1.0 - pow((double)a->b1, (double)a->t));
    float bc2 = (float)(1.0 - pow((double)a->b2, (double)a->t));
    unsigned grid = tr_cuda_grid(a->n, OPT_THREADS);
    size_t chunk = (a->n + grid - 1) / grid;
    adamw_kernel<<<grid, OPT_THREADS, 0, tr_cuda_stream(be)>>>(
        a->p, a->work, a->wt == TR_BF16, a->g, a->m, a->v, a->n, a->segs, a->n_segs, a->sumsq,
        a->max_norm, a->lr, a->b1, a->b2, a->eps, bc1, bc2, chunk);
    TR_CUDA_LAUNCHED(be, "adamw");
}

__global__ void sumsq_kernel(double *partial, const float *x, size_t n, size_t block) {
    size_t b0 = (size_t)blockIdx.x * block;
    size_t b1 = b0 + block < n ? b0 + block : n;
    double acc = 0.0;
    for (size_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) acc += (double)x[i] * x[i];
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
