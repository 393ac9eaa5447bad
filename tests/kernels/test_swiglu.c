// swiglu_forward/backward over the fused [gate; up] rows against float64 silu(g) * u: the
// forward on random inputs, the gate and up halves of dgu against central differences of the
// float64 forward, dgu written whatever it held, and bitwise equal results for 1, 2 and 3
// threads on rows spanning several tasks. The bf16 mode is the fp32 op on bf16-valued inputs
// with each output rounded once, bit for bit.
#include "tests/kernels/kernels_test.h"

typedef struct sw_ref {
    double *gu;
    const double *dout;
    int32_t T, I;
} sw_ref;

static double silu_ref(double x) { return x / (1.0 + exp(-x)); }

static double sw_loss(void *arg) {
    sw_ref *r = arg;
    double L = 0;
    for (int32_t t = 0; t < r->T; t++)
        for (int32_t i = 0; i < r->I; i++) {
            const double *row = r->gu + (size_t)t * 2 * r->I;
            L += r->dout[(size_t)t * r->I + i] * silu_ref(row[i]) * row[r->I + i];
        }
    return L;
}

// gu rows: gates scaled by gate_scale, ups of order 1.
static float *make_gu(int32_t T, int32_t I, double gate_scale) {
    float *gu = kt_floats((size_t)T * 2 * I);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < 2 * I; i++)
            gu[(size_t)t * 2 * I + i] = (float)((i < I ? gate_scale : 1.0) * kt_uniform());
    return gu;
}

static void check_case(int32_t T, int32_t I, double gate_scale) {
    size_t n = (size_t)T * I, n2 = 2 * n;
    float *gu = make_gu(T, I, gate_scale), *dout = kt_rand(n, 1.0);
    double *gud = kt_to_double(gu, n2), *dd = kt_to_double(dout, n);
    double *ref = kt_malloc(n * sizeof(double));
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < I; i++) {
            const double *row = gud + (size_t)t * 2 * I;
            ref[(size_t)t * I + i] = silu_ref(row[i]) * row[I + i];
        }
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *out = kt_fill(n, NAN);
    be.ops->swiglu_forward(&be, out, gu, T, I);
    double e = kt_rel_err_d(out, ref, n);
    CHECKF(e < 1e-6, "forward T=%d I=%d: %.3g", T, I, e);

    float *dgu = kt_fill(n2, NAN);   // written: the NaNs must not survive or leak in
    be.ops->swiglu_backward(&be, dgu, dout, gu, T, I);
    sw_ref r = {.gu = gud, .dout = dd, .T = T, .I = I};
    e = kt_fd_rel_err(gud, n2, dgu, sw_loss, &r, 600);
    CHECKF(e < 1e-5, "dgu vs finite differences T=%d I=%d: %.3g", T, I, e);
    float *dgu2 = kt_rand(n2, 1.0);
    be.ops->swiglu_backward(&be, dgu2, dout, gu, T, I);
    CHECKF(kt_same_bits(dgu2, dgu, n2), "dgu depends on what it held T=%d I=%d", T, I);
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *o = kt_floats(n), *g2 = kt_floats(n2);
        kt_backend(&be, k, TR_F32);
        be.ops->swiglu_forward(&be, o, gu, T, I);
        be.ops->swiglu_backward(&be, g2, dout, gu, T, I);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(o, out, n) && kt_same_bits(g2, dgu, n2),
               "bits differ at %d threads", k);
        free(o); free(g2);
    }

    // bf16: the fp32 op on the rounded inputs, each output rounded once
    float *gur = kt_round_all(kt_copy(gu, n2), n2), *doutr = kt_round_all(kt_copy(dout, n), n);
    float *o32 = kt_floats(n), *d32 = kt_floats(n2);
    kt_backend(&be, 2, TR_F32);
    be.ops->swiglu_forward(&be, o32, gur, T, I);
    be.ops->swiglu_backward(&be, d32, doutr, gur, T, I);
    tr_backend_cpu_free(&be);
    uint16_t *gu16 = kt_to(gur, n2, TR_BF16), *dout16 = kt_to(doutr, n, TR_BF16);
    uint16_t *o16 = kt_poison(n, TR_BF16), *d16 = kt_poison(n2, TR_BF16);
    kt_backend(&be, 3, TR_BF16);
    be.ops->swiglu_forward(&be, o16, gu16, T, I);
    be.ops->swiglu_backward(&be, d16, dout16, gu16, T, I);
    tr_backend_cpu_free(&be);
    CHECKF(kt_is_rounded(o16, o32, n, "out") && kt_is_rounded(d16, d32, n2, "dgu"),
           "bf16 swiglu T=%d I=%d", T, I);

    free(gu); free(dout); free(gud); free(dd); free(ref); free(out); free(dgu); free(dgu2);
    free(gur); free(doutr); free(o32); free(d32); free(gu16); free(dout16); free(o16); free(d16);
}

int main(void) {
    kt_seed(6);
    check_case(1, 1, 3.0);
    check_case(3, 37, 3.0);
    check_case(5, 8000, 8.0);   // three tasks; gates far into both tails of the sigmoid
    return tr_test_summary("test_swiglu");
}
