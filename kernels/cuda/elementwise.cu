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

void tr_cuda_scale(tr_backend *be, float *x, float s, size_t n) {
    if (n == 0) return;
    scale_kernel<<<tr_cuda_grid(n, EW_THREADS), EW_THREADS, 0, tr_cuda_stream(be)>>>(x, s, n);
    TR_CUDA_LAUNCHED(be, "scale");
}
