// The CPU backend's one matrix product. Every element of C is a single chain of fused
// multiply-adds over k = 0, 1, ..., K-1 in order, starting from +0 (or from C itself when
// accumulating), then plus bias (and, when adding, that result plus C). Vector lanes only
// ever hold different elements of C, so the bits of an element depend on its own row of A
// and column of B alone: not on M, on tiling, on threads, on the dtypes of the buffers, or
// on the instruction set (AVX-512, AVX2+FMA and the scalar fmaf path agree).
// A chain that continues from C also makes a sum over tokens independent of how the tokens
// were split into calls (micro-batches), as long as their order is the same.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

// Which micro-kernel runs. Only speed differs between them, never results.
typedef enum tr_gemm_isa {
    TR_GEMM_GENERIC = 0,   // scalar fmaf (any machine)
    TR_GEMM_AVX2 = 1,      // x86-64 with AVX2 and FMA
    TR_GEMM_AVX512 = 2,    // x86-64 with AVX-512F
} tr_gemm_isa;

// C[i,j] (+)= sum_k A[i,k] B[k,j] (+ bias[j]), with any strides:
// A(i,k) = a[i*a_rs + k*a_ks], B(k,j) = b[k*b_ks + j*b_cs], C(i,j) = c[i*ldc + j].
// A, B and bias are fp32 or bf16 (converted exactly while packing, so the chain is the
// same); C is fp32, or bf16 rounded once after the chain and the bias.
typedef struct tr_gemm {
    int32_t M, N, K;
    const void *a;
    ptrdiff_t a_rs, a_ks;
    tr_dt a_t;
    const void *b;
    ptrdiff_t b_ks, b_cs;
    tr_dt b_t;
    void *c;
    ptrdiff_t ldc;
    tr_dt c_t;
    const void *bias;      // [N], added once after the chain; NULL: none
    tr_dt bias_t;
    bool accumulate;       // the chain starts from C's value (else from +0); C fp32 only
    bool add;              // C = C + (chain from +0, + bias); C fp32 only
} tr_gemm;

// The widest kernel this CPU runs. TROUPE_CPU_ISA=generic|avx2|avx512 may narrow the choice
// (never widen it past what the CPU has), so tests can run every path on one machine; the
// environment of OpenBLAS or any other library plays no part.
tr_gemm_isa tr_gemm_isa_detect(void);
const char *tr_gemm_isa_name(tr_gemm_isa isa);

// The product over the backend's thread pool (tiles of C as tasks).
void tr_gemm_run(tr_backend *be, const tr_gemm *g);
// The product in the calling thread, for kernels that already run inside a pool task.
void tr_gemm_serial(tr_gemm_isa isa, const tr_gemm *g);
