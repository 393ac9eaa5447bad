// Storage types of the CUDA backend (.cu files only). A and W buffers (ops.h) hold float or
// __nv_bfloat16, as tr_backend.act and .wt say; F buffers are always float. Kernels are
// templated on the storage type: loads convert exactly to fp32, stores round once to nearest
// even, so an op's arithmetic is the same fp32 in both precisions and only its rounding
// points are the dtype's.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/ops.h"

typedef __nv_bfloat16 tr_bf16;

__device__ __forceinline__ float tr_f32(float x) { return x; }
__device__ __forceinline__ float tr_f32(tr_bf16 x) { return __bfloat162float(x); }

// Round-to-nearest-even store of an fp32 result (the hardware conversion: overflow goes to
// inf, subnormals are kept).
__device__ __forceinline__ void tr_store(float *p, float x) { *p = x; }
__device__ __forceinline__ void tr_store(tr_bf16 *p, float x) { *p = __float2bfloat16_rn(x); }

// The bf16 bits of f as convert defines them (kernels/cpu uses the same bit arithmetic):
// round to nearest even by adding 0x7fff plus the lowest kept bit; a NaN keeps its sign and
// top payload bits, made quiet only when none of those is set.
__device__ __forceinline__ uint16_t tr_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The backend's A and W dtypes are one precision (tr_backend_cuda_init sets both), so a
// kernel over A and W buffers is dispatched once on this.
static inline bool tr_cuda_bf16(const tr_backend *be) { return be->act == TR_BF16; }
