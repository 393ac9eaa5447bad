// Forward products of few rows on tensor cores (gemm_small.cu), the decode step's, with the
// bits of the cuBLASLt path (matmul.cu picks between them).
#pragma once
#include <stdint.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// Rows up to which a product may take the small kernel.
#define TR_GS_MAX_ROWS 256

// A launch shape: mt m16 tiles of rows (16 mt rows) and nw warps of 16 outputs a block.
typedef struct tr_gs_shape {
    int mt, nw;
} tr_gs_shape;

// The shape the backend takes for T rows of M outputs.
tr_gs_shape tr_cuda_gemm_small_shape(tr_backend *be, int32_t T, int32_t M);

// Whether the product out[T, OC] = in[T, IC] w[OC, IC]^T may take the small kernel: enabled
// (TROUPE_CUDA_SMALL_GEMM is not 0), T within TR_GS_MAX_ROWS, 16-byte operand rows.
int tr_cuda_gemm_small_fits(tr_backend *be, const void *out, const void *in, const void *w,
                            int32_t T, int32_t IC, int32_t OC, int out_f32, int acc);

// matmul_forward's bf16 product (flags as out_f32 and acc) by the small kernel in shape s
// ({0, 0}: tr_cuda_gemm_small_shape's).
void tr_cuda_gemm_small(tr_backend *be, void *out, const void *in, const void *w,
                        const void *bias, int32_t T, int32_t IC, int32_t OC, int out_f32,
                        int acc, tr_gs_shape s);

#ifdef __cplusplus
}
#endif
