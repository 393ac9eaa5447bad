// Column sums of a [rows, width] matrix of per-element terms into an fp32 gradient, in a fixed
// order that uses the whole device: the rows are cut into chunks (a function of rows and width
// only), each chunk's column sums are taken in double by one thread a column, then each
// column's chunk sums are added in chunk order and the total added to the gradient once. The
// same inputs give the same bits on every run. The norms' weight gradients and the linear
// layers' bias gradients are such sums; the term is a functor: f(row, col) -> float.
// Up to TR_COLSUM_THREADS * 16 columns a chunk is one block's, its threads striding over a
// row's columns, so that each step reads whole rows; wider sums take a block per 256 columns
// of a chunk. Either way a column's chunk is summed row after row, the same bits.
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

// The same sum with chunk blockIdx.x one block's: thread t takes columns t, t + 256, ...
// (NC of them at most), row after row, the loads of a few rows in flight at once.
template <typename F, int NC>
__global__ void __launch_bounds__(TR_COLSUM_THREADS)
    tr_colsum_rows_kernel(double *partial, float *out, F f, int32_t rows, int32_t width,
                          int32_t rows_per_chunk) {
    const int32_t r0 = blockIdx.x * rows_per_chunk;
    const int32_t r1 = rows - r0 < rows_per_chunk ? rows : r0 + rows_per_chunk;
    // columns past the width read the last one's terms and keep none of them, so that every
    // load of a row is issued without a branch around it
    double acc[NC];
    int32_t col[NC];
#pragma unroll
    for (int k = 0; k < NC; k++) {
        acc[k] = 0.0;
        col[k] = min((int32_t)threadIdx.x + k * TR_COLSUM_THREADS, width - 1);
    }
#pragma unroll 4
    for (int32_t r = r0; r < r1; r++)
#pragma unroll
        for (int k = 0; k < NC; k++) acc[k] += (double)f(r, col[k]);
#pragma unroll
    for (int k = 0; k < NC; k++) {
        const int32_t c = (int32_t)threadIdx.x + k * TR_COLSUM_THREADS;
        if (c >= width) break;
        if (gridDim.x == 1) out[c] += (float)acc[k];
        else partial[(size_t)blockIdx.x * width + c] = acc[k];
    }
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
    const int32_t nc = (width + TR_COLSUM_THREADS - 1) / TR_COLSUM_THREADS;
    dim3 grid((unsigned)chunks, (unsigned)nc);
    double *pa = ctx->norm_partial;
    const unsigned ch = (unsigned)chunks;
    cudaStream_t st = ctx->stream;
    if (nc <= 1) tr_colsum_rows_kernel<F, 1><<<ch, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    else if (nc <= 2) tr_colsum_rows_kernel<F, 2><<<ch, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    else if (nc <= 4) tr_colsum_rows_kernel<F, 4><<<ch, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    else if (nc <= 8) tr_colsum_rows_kernel<F, 8><<<ch, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    else if (nc <= 16) tr_colsum_rows_kernel<F, 16><<<ch, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    else tr_colsum_chunk_kernel<F><<<grid, TR_COLSUM_THREADS, 0, st>>>(pa, out, f, rows, width, per);
    if (tr_cuda_launched(be, __FILE__, __LINE__, name) || chunks == 1) return;
    tr_colsum_total_kernel<<<grid.y, TR_COLSUM_THREADS, 0, ctx->stream>>>(
        out, ctx->norm_partial, (int32_t)chunks, width);
    tr_cuda_launched(be, __FILE__, __LINE__, total_name);
}
