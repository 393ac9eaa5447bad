// SwiGLU on the GPU over the fused [gate; up] projection: row t of gu holds gate in columns
// [0, I) and up in [I, 2I). Grid-stride loops over the T x I outputs; every element is the
// formula of kernels/cpu in fp32 (expf sigmoid), written with explicit roundings so that
// nothing is fused, and rounded once to the A dtype.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define EW_THREADS 256

__device__ inline float ew_sigmoid(float g) { return 1.0f / __fadd_rn(1.0f, expf(-g)); }

template <typename A>
__global__ void swiglu_forward_kernel(A *out, const A *gu, int32_t I, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I, c = i % (size_t)I;
        const A *row = gu + t * 2 * (size_t)I;
        float g = tr_f32(row[c]), u = tr_f32(row[I + c]);
        tr_store(out + i, __fmul_rn(__fmul_rn(g, ew_sigmoid(g)), u));
    }
}

// d gate = dout * up * silu'(gate), silu'(g) = sig * (1 + g * (1 - sig)); d up = dout * silu(g).
template <typename A>
__global__ void swiglu_backward_kernel(A *dgu, const A *dout, const A *gu, int32_t I, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I, c = i % (size_t)I, at = t * 2 * (size_t)I + c;
        float g = tr_f32(gu[at]), u = tr_f32(gu[at + I]), go = tr_f32(dout[i]);
        float sig = ew_sigmoid(g);
        float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig))));
        tr_store(dgu + at, __fmul_rn(__fmul_rn(go, u), dsilu));
        tr_store(dgu + at + I, __fmul_rn(go, __fmul_rn(g, sig)));
    }
}

void tr_cuda_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I) {
    size_t n = T > 0 && I > 0 ? (size_t)T * I : 0;
    if (n == 0) return;
    unsigned grid = tr_cuda_grid(n, EW_THREADS);
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_cuda_bf16(be))
        swiglu_forward_kernel<tr_bf16><<<grid, EW_THREADS, 0, st>>>(
            (tr_bf16 *)out, (const tr_bf16 *)gu, I, n);
    else
        swiglu_forward_kernel<float><<<grid, EW_THREADS, 0, st>>>((float *)out,
                                                                  (const float *)gu, I, n);
    TR_CUDA_LAUNCHED(be, "swiglu_forward");
}

void tr_cuda_swiglu_backward(tr_backend *be, void *dgu, const void *dout, const void *gu,
                             int32_t T, int32_t I) {
    size_t n = T > 0 && I > 0 ? (size_t)T * I : 0;
    if (n == 0 || !dgu) return;
    unsigned grid = tr_cuda_grid(n, EW_THREADS);
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_cuda_bf16(be))
        swiglu_backward_kernel<tr_bf16><<<grid, EW_THREADS, 0, st>>>(
            (tr_bf16 *)dgu, (const tr_bf16 *)dout, (const tr_bf16 *)gu, I, n);
    else
        swiglu_backward_kernel<float><<<grid, EW_THREADS, 0, st>>>(
            (float *)dgu, (const float *)dout, (const float *)gu, I, n);
    TR_CUDA_LAUNCHED(be, "swiglu_backward");
}
