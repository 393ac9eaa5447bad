// SwiGLU on the GPU over the fused [gate; up] projection: row t of gu holds gate in columns
// [0, I) and up in [I, 2I). Grid-stride loops over the T x I outputs; every element is the
// formula of kernels/cpu in fp32 (expf sigmoid), written with explicit roundings so that
// nothing is fused, and rounded once to the A dtype. In bf16 with I a multiple of 8, a thread
// takes 8 neighbouring columns with 16-byte loads and stores (the same per-element formula):
// the op is a pass over memory, and narrow accesses left half the bandwidth unused.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/swiglu.cuh"

#define EW_THREADS 256

// d gate = dout * up * silu'(gate), silu'(g) = sig * (1 + g * (1 - sig)); d up = dout * silu(g).
__device__ inline void ew_swiglu_grads(float g, float u, float go, float *dg, float *du) {
    float sig = ew_sigmoid(g);
    float dsilu = __fmul_rn(sig, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sig))));
    *dg = __fmul_rn(__fmul_rn(go, u), dsilu);
    *du = __fmul_rn(go, __fmul_rn(g, sig));
}

template <typename A>
__global__ void swiglu_forward_kernel(A *out, const A *gu, int32_t I, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I, c = i % (size_t)I;
        const A *row = gu + t * 2 * (size_t)I;
        float g = tr_f32(row[c]), u = tr_f32(row[I + c]);
        tr_store(out + i, ew_swiglu(g, u));
    }
}

template <typename A>
__global__ void swiglu_backward_kernel(A *dgu, const A *dout, const A *gu, int32_t I, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I, c = i % (size_t)I, at = t * 2 * (size_t)I + c;
        float dg, du;
        ew_swiglu_grads(tr_f32(gu[at]), tr_f32(gu[at + I]), tr_f32(dout[i]), &dg, &du);
        tr_store(dgu + at, dg);
        tr_store(dgu + at + I, du);
    }
}

// 8 bf16 values in one 16-byte word.
union ew_bf16x8 {
    uint4 u;
    tr_bf16 h[8];
};

// n8 = T * I / 8 groups of 8 columns; I8 = I / 8.
__global__ void swiglu_forward_x8_kernel(uint4 *out, const uint4 *gu, int32_t I8, size_t n8) {
    tr_pdl_wait();
    tr_pdl_release();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I8, c = i % (size_t)I8;
        ew_bf16x8 g, u, o;
        g.u = gu[t * 2 * (size_t)I8 + c];
        u.u = gu[t * 2 * (size_t)I8 + I8 + c];
#pragma unroll
        for (int j = 0; j < 8; j++)
            o.h[j] = __float2bfloat16_rn(ew_swiglu(tr_f32(g.h[j]), tr_f32(u.h[j])));
        out[i] = o.u;
    }
}

__global__ void swiglu_backward_x8_kernel(uint4 *dgu, const uint4 *dout, const uint4 *gu,
                                          int32_t I8, size_t n8) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / (size_t)I8, c = i % (size_t)I8, at = t * 2 * (size_t)I8 + c;
        ew_bf16x8 g, u, go, dg, du;
        g.u = gu[at];
        u.u = gu[at + I8];
        go.u = dout[i];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float a, b;
            ew_swiglu_grads(tr_f32(g.h[j]), tr_f32(u.h[j]), tr_f32(go.h[j]), &a, &b);
            dg.h[j] = __float2bfloat16_rn(a);
            du.h[j] = __float2bfloat16_rn(b);
        }
        dgu[at] = dg.u;
        dgu[at + I8] = du.u;
    }
}

// The 16-byte path: bf16, whole groups of 8 per row, every pointer 16-byte aligned.
static bool ew_x8(const tr_backend *be, int32_t I, const void *a, const void *b,
                  const void *c) {
    uintptr_t any = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return tr_cuda_bf16(be) && I % 8 == 0 && any % 16 == 0;
}

void tr_cuda_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I) {
    size_t n = T > 0 && I > 0 ? (size_t)T * I : 0;
    if (n == 0) return;
    unsigned grid = tr_cuda_grid(n, EW_THREADS);
    cudaStream_t st = tr_cuda_stream(be);
    if (ew_x8(be, I, out, gu, gu)) {   // a decode step's path (bf16), which may start early
        if (TR_CUDA_CHECK(be, tr_cuda_launch(be, T <= TR_CUDA_DECODE_ROWS, swiglu_forward_x8_kernel,
                                             dim3(tr_cuda_grid(n / 8, EW_THREADS)),
                                             dim3(EW_THREADS), 0, (uint4 *)out,
                                             (const uint4 *)gu, I / 8, n / 8)))
            return;
    } else if (tr_cuda_bf16(be))
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
    if (ew_x8(be, I, dgu, dout, gu))
        swiglu_backward_x8_kernel<<<tr_cuda_grid(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(
            (uint4 *)dgu, (const uint4 *)dout, (const uint4 *)gu, I / 8, n / 8);
    else if (tr_cuda_bf16(be))
        swiglu_backward_kernel<tr_bf16><<<grid, EW_THREADS, 0, st>>>(
            (tr_bf16 *)dgu, (const tr_bf16 *)dout, (const tr_bf16 *)gu, I, n);
    else
        swiglu_backward_kernel<float><<<grid, EW_THREADS, 0, st>>>(
            (float *)dgu, (const float *)dout, (const float *)gu, I, n);
    TR_CUDA_LAUNCHED(be, "swiglu_backward");
}
