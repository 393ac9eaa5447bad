// SwiGLU's per-element formula on the GPU (.cu files only), the one kernels/cpu computes: fp32
// with an expf sigmoid, every operation rounded on its own (nothing fused), shared by the
// elementwise kernels and the decode products that apply it in their epilogue (gemm_seqk.cu).
#pragma once

__device__ inline float ew_sigmoid(float g) { return 1.0f / __fadd_rn(1.0f, expf(-g)); }

__device__ inline float ew_swiglu(float g, float u) {
    return __fmul_rn(__fmul_rn(g, ew_sigmoid(g)), u);
}
