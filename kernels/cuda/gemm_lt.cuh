// cuBLASLt products for the bf16 path (.cu files only): column-major D = A·B (+ D) (+ bias),
// fp32 accumulation, with one algorithm per shape chosen once and kept in the backend
// context (gemm_lt.cu says how).
#pragma once
#include "kernels/cuda/cuda_ctx.cuh"

// D[m,n] = op(A)[m,k] · op(B)[k,n] (+ C when accumulate) (+ bias[m] broadcast over columns),
// column-major with leading dimensions lda, ldb, ldd. C is c, of D's type and layout, or D
// itself (c NULL). The products and sums are fp32; D is rounded once to d_type. bias has D's
// type.
#define TR_LT_SPLIT_MAX_N 256
// Forward products of at most this many rows are timed among their equal-bit algorithms.
#define TR_LT_TIMED_MAX_N 512

typedef struct tr_lt_gemm {
    cublasOperation_t ta, tb;
    int64_t m, n, k;
    const void *a;
    int64_t lda;
    cudaDataType_t a_type;
    const void *b;
    int64_t ldb;
    cudaDataType_t b_type;
    void *d;
    int64_t ldd;
    cudaDataType_t d_type;
    bool accumulate;
    const void *c;   // what an accumulating product adds to: NULL for D itself
    const void *bias;
    // The algorithm must not depend on n (the token count of a forward product): it is the
    // one the rule picks for n = TR_CUDA_ANY_N, whatever n is, so every output element is reduced
    // by the same kernel in the same order for any batch (the batch-invariant mode).
    bool any_n;
    // The reduction may be split over blocks whose parts cuBLASLt adds in a fixed order (the
    // same bits run to run for one algorithm on one device, but not the unsplit chain's): for
    // forward products of at most TR_LT_SPLIT_MAX_N rows when batch invariance is off, where
    // a decode step's few rows leave most SMs idle otherwise.
    bool split_k;
    // A decode-sized forward product: on its first use outside a recording it may take the
    // fastest of the kernels (cuBLASLt's algorithms, gemm_seqk.cu's configurations) whose
    // outputs equal the plan's own bit for bit (plan_settle).
    bool timed;
    const char *name;   // a string literal naming the product in TROUPE_CUDA_PROFILE's table
} tr_lt_gemm;

// Queues the product on the backend's stream. Returns 0, or -1 with the failure recorded
// (no algorithm for the shape included).
int tr_lt_matmul(tr_backend *be, const tr_lt_gemm *g);

// The fastest configuration of the sequential-k kernel whose outputs equal g's plan's bit for
// bit on the product's own data (plan_settle), whether or not it is the kernel that runs g; -1
// when g's plan has not been settled or none was equal (or the plan could not be made:
// recorded).
int tr_lt_seqk_best(tr_backend *be, const tr_lt_gemm *g);
