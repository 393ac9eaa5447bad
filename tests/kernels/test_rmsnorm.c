// rmsnorm_forward/backward against a float64 reference: forward and rstd on random inputs,
// din and dw against central differences of the float64 forward, accumulation, and bitwise
// equal results for 1, 2 and 3 threads.
#include "tests/kernels/kernels_test.h"

typedef struct rms_ref {
    double *in, *w;
    const double *dout;
    double eps;
    int32_t T, C;
} rms_ref;

static void rms_forward_ref(double *out, double *rstd, const double *in, const double *w,
                            double eps, int32_t T, int32_t C) {
    for (int32_t t = 0; t < T; t++) {
        double ss = 0;
        for (int32_t c = 0; c < C; c++) ss += in[(size_t)t * C + c] * in[(size_t)t * C + c];
        double r = 1.0 / sqrt(ss / C + eps);
        if (rstd) rstd[t] = r;
        for (int32_t c = 0; c < C; c++) out[(size_t)t * C + c] = in[(size_t)t * C + c] * r * w[c];
    }
}

static double rms_loss(void *arg) {
    rms_ref *r = arg;
    size_t n = (size_t)r->T * r->C;
    double *out = kt_malloc(n * sizeof(double));
    rms_forward_ref(out, NULL, r->in, r->w, r->eps, r->T, r->C);
    double L = 0;
    for (size_t i = 0; i < n; i++) L += r->dout[i] * out[i];
    free(out);
    return L;
}

static void check_case(int32_t T, int32_t C, double in_scale, float eps) {
    size_t n = (size_t)T * C;
    float *in = kt_rand(n, in_scale), *w = kt_rand(C, 1.0), *dout = kt_rand(n, 1.0);
    for (int32_t c = 0; c < C; c++) w[c] += 1.0f;   // weights near 1, as trained models have
    float *out = kt_floats(n), *rstd = kt_floats(T);
    tr_backend be;
    kt_backend(&be, 2);
    be.ops->rmsnorm_forward(&be, out, rstd, in, w, eps, T, C);
    double *ind = kt_to_double(in, n), *wd = kt_to_double(w, C), *dd = kt_to_double(dout, n);
    double *ref = kt_malloc(n * sizeof(double)), *rref = kt_malloc(T * sizeof(double));
    rms_forward_ref(ref, rref, ind, wd, eps, T, C);
    double e = kt_rel_err_d(out, ref, n);
    CHECKF(e < 1e-6, "forward T=%d C=%d: %.3g", T, C, e);
    e = kt_rel_err_d(rstd, rref, T);
    CHECKF(e < 1e-6, "rstd T=%d C=%d: %.3g", T, C, e);

    float *din = kt_fill(n, 0), *dw = kt_fill(C, 0);
    be.ops->rmsnorm_backward(&be, din, dw, dout, in, w, rstd, T, C);
    rms_ref r = {.in = ind, .w = wd, .dout = dd, .eps = eps, .T = T, .C = C};
    e = kt_fd_rel_err(ind, n, din, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "din vs finite differences T=%d C=%d: %.3g", T, C, e);
    e = kt_fd_rel_err(wd, C, dw, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "dw vs finite differences T=%d C=%d: %.3g", T, C, e);

    float *din0 = kt_rand(n, 1.0), *dw0 = kt_rand(C, 1.0);
    float *din2 = kt_copy(din0, n), *dw2 = kt_copy(dw0, C);
    be.ops->rmsnorm_backward(&be, din2, dw2, dout, in, w, rstd, T, C);
    CHECK(kt_accum_err(din2, din0, din, n) < 1e-5);
    CHECK(kt_accum_err(dw2, dw0, dw, C) < 1e-5);
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *o = kt_floats(n), *rs = kt_floats(T), *di = kt_copy(din0, n), *dwk = kt_copy(dw0, C);
        kt_backend(&be, k);
        be.ops->rmsnorm_forward(&be, o, rs, in, w, eps, T, C);
        be.ops->rmsnorm_backward(&be, di, dwk, dout, in, w, rs, T, C);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(o, out, n) && kt_same_bits(rs, rstd, T), "forward bits, %d threads", k);
        CHECKF(kt_same_bits(di, din2, n) && kt_same_bits(dwk, dw2, C), "backward bits, %d threads", k);
        free(o); free(rs); free(di); free(dwk);
    }
    free(in); free(w); free(dout); free(out); free(rstd); free(ind); free(wd); free(dd);
    free(ref); free(rref); free(din); free(dw); free(din0); free(dw0); free(din2); free(dw2);
}

int main(void) {
    kt_seed(3);
    check_case(1, 37, 1.0, 1e-6f);
    check_case(7, 37, 3.0, 1e-5f);
    check_case(5, 8, 1e-3, 1e-5f);   // eps matters when the row is tiny
    check_case(70, 200, 1.0, 1e-6f); // several row tasks and column blocks
    return tr_test_summary("test_rmsnorm");
}
