// Elementwise ops on the GPU: SwiGLU gating and its backward, add and scale. Grid-stride
// loops; every element is computed by the same formula as kernels/cpu (fp32, expf sigmoid).
#include "kernels/cuda/cuda_ctx.cuh"

#define EW_THREADS 256

__global__ void swiglu_forward_kernel(float *out, const float *gate, const float *up,
                                      size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        out[i] = g * sig * up[i];
    }
}

// d silu(g)/dg = sig * (1 + g * (1 - sig))
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dout,
                                       const float *gate, const float *up, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i], go = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        if (dgate) dgate[i] += go * u * (sig * (1.0f + g * (1.0f - sig)));
        if (dup) dup[i] += go * (g * sig);
    }
}

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float *x, float s, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

void tr_cuda_swiglu_forward(tr_backend *be, float *out, const float *gate, const float *up,
                            size_t n) {
    if (n == 0) return;
    swiglu_forward_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(
        out, gate, up, n);
    TR_CUDA_LAUNCHED(be, "swiglu_forward");
}

void tr_cuda_swiglu_backward(tr_backend *be, float *dgate, float *dup, const float *dout,
                             const float *gate, const float *up, size_t n) {
    if (n == 0 || (!dgate && !dup)) return;
    swiglu_backward_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(
        dgate, dup, dout, gate, up, n);
    TR_CUDA_LAUNCHED(be, "swiglu_backward");
}

void tr_cuda_add(tr_backend *be, float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    add_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(out, a, b, n);
    TR_CUDA_LAUNCHED(be, "add");
}

static __global__ void fill_kernel(float *x, float v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = v;
}

void tr_cuda_fill(tr_backend *be, float *x, float value, size_t n) {
    if (n == 0) return;
    fill_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(x, value, n);
    TR_CUDA_LAUNCHED(be, "fill");
}

void tr_cuda_scale(tr_backend *be, float *x, float s, size_t n) {
    if (n == 0) return;
    scale_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(x, s, n);
    TR_CUDA_LAUNCHED(be, "scale");
}

// One thread per 4-byte word of a row (row_bytes is a multiple of 4 for every caller).
static __global__ void rows_kernel(uint32_t *dst, const uint32_t *src, const int32_t *idx,
                                   int32_t n, size_t words, int scatter) {
    size_t total = (size_t)n * words;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / words, w = i % words;
        size_t other = (size_t)idx[r] * words + w;
        if (scatter) dst[other] = src[i];
        else dst[i] = src[other];
    }
}

void tr_cuda_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                         int32_t n, size_t row_bytes) {
    size_t words = row_bytes / 4;
    if (n <= 0 || words == 0) return;
    rows_kernel<<<tr_cuda_grid((size_t)n * words, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(
        (uint32_t *)out, (const uint32_t *)src, idx, n, words, 0);
    TR_CUDA_LAUNCHED(be, "gather_rows");
}

void tr_cuda_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                          int32_t n, size_t row_bytes) {
    size_t words = row_bytes / 4;
    if (n <= 0 || words == 0) return;
    rows_kernel<<<tr_cuda_grid((size_t)n * words, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(
        (uint32_t *)dst, (const uint32_t *)rows, idx, n, words, 1);
    TR_CUDA_LAUNCHED(be, "scatter_rows");
}
