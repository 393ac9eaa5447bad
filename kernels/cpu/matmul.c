// Linear layers on the CPU: out = in @ w^T (+ bias) and its backward, all through the one
// batch-invariant product of gemm.h. Every output element is a k-ordered FMA chain, so a
// token's projection has the same bits whether it is computed alone (decode), in a packed
// micro-batch (training) or on another x86-64 machine. The weight and bias gradients continue
// their chains from the gradient buffer, so they do not depend on the micro-batch split.
// Activations (in, out, dout, din) are in the backend's dtype A, weights in W (ops.h).
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

static void matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                           const void *bias, int32_t T, int32_t IC, int32_t OC, bool f32,
                           bool add) {
    // out[t,o] = sum_i in[t,i] w[o,i]: B(k=i, j=o) = w[o*IC + i]
    tr_gemm g = {.M = T, .N = OC, .K = IC, .a = in, .a_rs = IC, .a_ks = 1, .a_t = be->act,
                 .b = w, .b_ks = 1, .b_cs = IC, .b_t = be->wt, .c = out, .ldc = OC,
                 .c_t = f32 ? TR_F32 : be->act, .bias = bias, .bias_t = be->wt, .add = add};
    tr_gemm_run(be, &g);
}

void tr_cpu_matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                           const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags) {
    matmul_forward(be, out, in, w, bias, T, IC, OC, (flags & TR_MM_OUT_F32) != 0, false);
}

// Adding into the fp32 stream adds the finished result: x + (chain + bias), out starting as
// a copy of x.
void tr_cpu_matmul_forward_add(tr_backend *be, float *out, const float *x, const void *in,
                               const void *w, const void *bias, int32_t T, int32_t IC,
                               int32_t OC) {
    if (out != x) memcpy(out, x, (size_t)T * OC * sizeof(float));
    matmul_forward(be, out, in, w, bias, T, IC, OC, true, true);
}

#define MM_BIAS_TILE 256

typedef struct dbias_job {
    float *dbias;
    const void *dout;
    tr_dt dout_t;
    int32_t T, OC;
} dbias_job;

// dbias[o] += dout[t, o] for t in order, one float add at a time: the same chain whether the
// tokens come in one call or in several.
static void dbias_tile(void *arg, int32_t task) {
    const dbias_job *j = arg;
    int32_t o0 = task * MM_BIAS_TILE;
    int32_t on = j->OC - o0 < MM_BIAS_TILE ? j->OC - o0 : MM_BIAS_TILE;
    float acc[MM_BIAS_TILE];
    for (int32_t i = 0; i < on; i++) acc[i] = j->dbias[o0 + i];
    for (int32_t t = 0; t < j->T; t++) {
        size_t row = (size_t)t * j->OC + o0;
        for (int32_t i = 0; i < on; i++) acc[i] += tr_ld(j->dout, row + i, j->dout_t);
    }
    for (int32_t i = 0; i < on; i++) j->dbias[o0 + i] = acc[i];
}

void tr_cpu_matmul_backward(tr_backend *be, void *din, float *dw, float *dbias,
                            const void *dout, const void *in, const void *w, int32_t T,
                            int32_t IC, int32_t OC) {
    if (T <= 0) return;
    if (din) {
        // din[t,i] = sum_o dout[t,o] w[o,i], written: each token's chain starts from +0
        tr_gemm g = {.M = T, .N = IC, .K = OC, .a = dout, .a_rs = OC, .a_ks = 1,
                     .a_t = be->act, .b = w, .b_ks = IC, .b_cs = 1, .b_t = be->wt, .c = din,
                     .ldc = IC, .c_t = be->act};
        tr_gemm_run(be, &g);
    }
    if (dw) {
        // dw[o,i] += sum_t dout[t,o] in[t,i]: A(o, t) = dout[t*OC + o]
        tr_gemm g = {.M = OC, .N = IC, .K = T, .a = dout, .a_rs = 1, .a_ks = OC,
                     .a_t = be->act, .b = in, .b_ks = IC, .b_cs = 1, .b_t = be->act, .c = dw,
                     .ldc = IC, .c_t = TR_F32, .accumulate = true};
        tr_gemm_run(be, &g);
    }
    if (dbias) {
        dbias_job j = {.dbias = dbias, .dout = dout, .dout_t = be->act, .T = T, .OC = OC};
        tr_cpu_run(be, tr_cpu_ceil_div(OC, MM_BIAS_TILE), dbias_tile, &j, (double)T * OC);
    }
}
