// Optimizer-step ops on the GPU: AdamW, and the sum of squares behind gradient-norm clipping.
// sumsq is deterministic: fixed-size blocks (the size depends on n only) summed in double in
// a fixed tree order, then one thread adds the block partials in order into the caller's
// device double, so the host waits for nothing.
#include <math.h>

#include "kernels/cuda/cuda_ctx.cuh"

#define OPT_THREADS 256
#define SUMSQ_MIN_BLOCK 16384

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v, size_t n, float lr,
                             float b1, float b2, float eps, float wd, float bc1, float bc2) {
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

void tr_cuda_adamw(tr_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                   float lr, float b1, float b2, float eps, float wd, int32_t t) {
    if (n == 0) return;
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    adamw_kernel<<<tr_cuda_grid(n, OPT_THREADS), OPT_THREADS, 0, tr_cuda_stream(be)>>>(
        p, g, m, v, n, lr, b1, b2, eps, wd, bc1, bc2);
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
