// The sequential-k kernel (gemm_seqk.cu, .cu files only): a decode-sized forward product
// (tr_lt_gemm as matmul.cu issues it) reduced in cuBLASLt's unsplit order, one fp32 chain of
// ascending k16 blocks per output, with its parallelism from output tiles alone. It runs where
// plan_settle (gemm_lt.cu) finds its bits equal to the plan's and its time the best.
#pragma once
#include "kernels/cuda/gemm_lt.cuh"

// Tile configurations of the kernel (gemm_seqk.cu lists them); all reduce every output in the
// same chain, so they differ in time only.
#define TR_SEQK_CONFIGS 10

// Queues g (ta = T, tb = N: a = w[m][k], b = x[n][k], both bf16 with 16-byte aligned rows;
// d = out[n][ldd] bf16 or fp32, added into with accumulate; bias of d's type, not with
// accumulate) in configuration cfg, or in the default configuration for the shape when cfg
// is -1. Returns 0 when queued, 1 when the product or the configuration is not one the kernel
// takes (nothing queued, nothing recorded), -1 with the failure recorded. Queues one launch
// and nothing else: no allocation, no wait, so a recording can hold it.
int tr_gemm_seqk_cfg(tr_backend *be, const tr_lt_gemm *g, int cfg);
static inline int tr_gemm_seqk(tr_backend *be, const tr_lt_gemm *g) {
    return tr_gemm_seqk_cfg(be, g, -1);
}
// The configuration's tile and pipeline in words (a string literal), for the probes' lines.
const char *tr_gemm_seqk_name(int cfg);

// Queues g, the gate/up product of a decode step (m = 2I rows, gate's then up's; bf16 d, no
// bias, not accumulating), fused with SwiGLU: act[n][I] = swiglu_forward of the product, the
// product's own output (g->d) left unwritten, in configuration cfg. Returns 0, 1 when the
// product or the configuration is not one it takes (nothing queued), -1 with the failure
// recorded.
int tr_gemm_seqk_swiglu(tr_backend *be, const tr_lt_gemm *g, int32_t I, void *act, int cfg);
