// Linear layers on the CPU: out = in @ w^T (+ bias) and its backward, through single-threaded
// OpenBLAS sgemm calls on fixed tiles of the output. Each output element is computed by one
// sgemm call whose shape depends only on the matrix sizes, so any thread count gives the same
// bits; the tiles are large enough that packing overhead stays a few percent.
#include <cblas.h>

#include "kernels/cpu/cpu.h"

// Output tile: MM_TILE_M rows x MM_TILE_N columns. Changing them changes results in the last
// bits (sgemm's blocking follows the call shape), so they are constants, not tunables.
#define MM_TILE_M 64
#define MM_TILE_N 256
#define MM_BIAS_TILE 256

typedef struct gemm_job {
    int trans_a, trans_b;
    int32_t M, N, K;
    const float *A, *B;
    int32_t lda, ldb;
    float beta;
    float *C;
    int32_t ldc;
    const float *bias;   // added to each row of C after the product (forward only)
    int32_t n_tiles_n;
} gemm_job;

static void gemm_tile(void *arg, int32_t task) {
    const gemm_job *j = arg;
    int32_t r0 = (task / j->n_tiles_n) * MM_TILE_M;
    int32_t c0 = (task % j->n_tiles_n) * MM_TILE_N;
    int32_t rn = j->M - r0 < MM_TILE_M ? j->M - r0 : MM_TILE_M;
    int32_t cn = j->N - c0 < MM_TILE_N ? j->N - c0 : MM_TILE_N;
    const float *a = j->trans_a ? j->A + r0 : j->A + (size_t)r0 * j->lda;
    const float *b = j->trans_b ? j->B + (size_t)c0 * j->ldb : j->B + c0;
    float *c = j->C + (size_t)r0 * j->ldc + c0;
    cblas_sgemm(CblasRowMajor, j->trans_a ? CblasTrans : CblasNoTrans,
                j->trans_b ? CblasTrans : CblasNoTrans, rn, cn, j->K, 1.0f, a, j->lda, b,
                j->ldb, j->beta, c, j->ldc);
    if (j->bias) {
        for (int32_t r = 0; r < rn; r++) {
            float *row = c + (size_t)r * j->ldc;
            for (int32_t i = 0; i < cn; i++) row[i] += j->bias[c0 + i];
        }
    }
}

static void gemm_run(tr_backend *be, gemm_job *j) {
    if (j->M <= 0 || j->N <= 0) return;
    j->n_tiles_n = tr_cpu_ceil_div(j->N, MM_TILE_N);
    double flops = 2.0 * j->M * j->N * j->K;
    tr_cpu_run(be, tr_cpu_ceil_div(j->M, MM_TILE_M) * j->n_tiles_n, gemm_tile, j, flops / 50.0);
}

void tr_cpu_matmul_forward(tr_backend *be, float *out, const float *in, const float *w,
                           const float *bias, int32_t T, int32_t IC, int32_t OC) {
    if (IC == 0) {
        // sgemm with K = 0 may leave C untouched; the product of empty rows is zero.
        for (int32_t t = 0; t < T; t++)
            for (int32_t o = 0; o < OC; o++) out[(size_t)t * OC + o] = bias ? bias[o] : 0.0f;
        return;
    }
    gemm_job j = {.trans_a = 0, .trans_b = 1, .M = T, .N = OC, .K = IC, .A = in, .lda = IC,
                  .B = w, .ldb = IC, .beta = 0.0f, .C = out, .ldc = OC, .bias = bias};
    gemm_run(be, &j);
}

typedef struct dbias_job {
    float *dbias;
    const float *dout;
    int32_t T, OC;
} dbias_job;

// Column sums over all T rows in order, in double, per fixed block of columns.
static void dbias_tile(void *arg, int32_t task) {
    const dbias_job *j = arg;
    int32_t o0 = task * MM_BIAS_TILE;
    int32_t on = j->OC - o0 < MM_BIAS_TILE ? j->OC - o0 : MM_BIAS_TILE;
    double acc[MM_BIAS_TILE];
    for (int32_t i = 0; i < on; i++) acc[i] = 0.0;
    for (int32_t t = 0; t < j->T; t++) {
        const float *row = j->dout + (size_t)t * j->OC + o0;
        for (int32_t i = 0; i < on; i++) acc[i] += row[i];
    }
    for (int32_t i = 0; i < on; i++) j->dbias[o0 + i] += (float)acc[i];
}

void tr_cpu_matmul_backward(tr_backend *be, float *din, float *dw, float *dbias,
                            const float *dout, const float *in, const float *w, int32_t T,
                            int32_t IC, int32_t OC) {
    if (T <= 0) return;
    if (din && OC > 0) {
        // din[T,IC] += dout[T,OC] @ w[OC,IC]
        gemm_job j = {.trans_a = 0, .trans_b = 0, .M = T, .N = IC, .K = OC, .A = dout,
                      .lda = OC, .B = w, .ldb = IC, .beta = 1.0f, .C = din, .ldc = IC};
        gemm_run(be, &j);
    }
    if (dw) {
        // dw[OC,IC] += dout^T[OC,T] @ in[T,IC]
        gemm_job j = {.trans_a = 1, .trans_b = 0, .M = OC, .N = IC, .K = T, .A = dout,
                      .lda = OC, .B = in, .ldb = IC, .beta = 1.0f, .C = dw, .ldc = IC};
        gemm_run(be, &j);
    }
    if (dbias) {
        dbias_job j = {.dbias = dbias, .dout = dout, .T = T, .OC = OC};
        tr_cpu_run(be, tr_cpu_ceil_div(OC, MM_BIAS_TILE), dbias_tile, &j, (double)T * OC);
    }
}
