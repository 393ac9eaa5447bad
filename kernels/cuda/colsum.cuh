// Column sums of a [rows, width] matrix of per-element terms into an fp32 gradient, in a fixed
// order that uses the whole device: the rows are cut into chunks (a function of rows and width
// only), each chunk's column sums are taken in double by one thread a column, then each
// column's chunk sums are added in chunk order and the total added to the gradient once. The
// same inputs give the same bits on every run. The norms' weight gradients and the linear
// layers' bias gradients are such sums; the term is a functor: f(row, col) -> float.
#pragma once
#include "kernels/cuda/cuda_ctx.cuh"

#define TR_COLSUM_THREADS 256
#define TR_COLSUM_MIN_ROWS 64   // rows per chunk, at least
#define TR_COLSUM_MAX_CHUNKS 1024

// Chunk blockIdx.x of rows_per_chunk rows into partial[chunk][c] (straight into out when
// there is one chunk).
template <typename F>
__global__ void tr_colsum_chunk_kernel(double *partial, float *out, F f, int32_t rows,
                                       int32_t width, int32_t rows_per_chunk) {
    int32_t c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= width) return;
    int32_t r0 = blockIdx.x * rows_per_chunk;
    int32_t r1 = rows - r0 < rows_per_chunk ? rows : r0 + rows_per_chunk;
    double acc = 0.0;
    for (int32_t r = r0; r < r1; r++) acc += (double)f(r, c);
    if (gridDim.x == 1) out[c] += (float)acc;
    else partial[(size_t)blockIdx.x * width + c] = acc;
}

// Each column's chunks, in order. Static: every .cu file that sums columns launches its own
// copy (the objects are not linked for relocatable device code).
static __global__ void tr_colsum_total_kernel(float *out, const double *partial,
                                              int32_t n_chunks, int32_t width) {
    int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    double acc = 0.0;
    for (int32_t k = 0; k < n_chunks; k++) acc += partial[(size_t)k * width + c];
    out[c] += (float)acc;
}

// out[c] += sum over r of f(r, c); the partial sums live in the context's norm_partial.
template <typename F>
static void tr_colsum(tr_backend *be, float *out, F f, int32_t rows, int32_t width,
                      const char *name, const char *total_name) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    int64_t chunks = rows / TR_COLSUM_MIN_ROWS;
    if (chunks > TR_COLSUM_MAX_CHUNKS) chunks = TR_COLSUM_MAX_CHUNKS;
    if (chunks > (int64_t)(TR_CUDA_NORM_PARTIALS / (size_t)width))
        chunks = (int64_t)(TR_CUDA_NORM_PARTIALS / (size_t)width);
    if (chunks < 1) chunks = 1;
    int32_t per = (int32_t)((rows + chunks - 1) / chunks);
    chunks = (rows + per - 1) / per;   // no empty chunk
    dim3 grid((unsigned)chunks, (unsigned)((width + TR_COLSUM_THREADS - 1) / TR_COLSUM_THREADS));
    tr_colsum_chunk_kernel<F><<<grid, TR_COLSUM_THREADS, 0, ctx->stream>>>(
        ctx->norm_partial, out, f, rows, width, per);
    if (tr_cuda_launched(be, __FILE__, __LINE__, name) || chunks == 1) return;
    tr_colsum_total_kernel<<<grid.y, TR_COLSUM_THREADS, 0, ctx->stream>>>(
        out, ctx->norm_partial, (int32_t)chunks, width);
    tr_cuda_launched(be, __FILE__, __LINE__, total_name);
}
