// swiglu_forward/backward against float64 silu(g) * u: the forward on random inputs, dgate and
// dup against central differences of the float64 forward, accumulation, and bitwise equal
// results for 1, 2 and 3 threads on a buffer spanning several tasks.
#include "tests/kernels/kernels_test.h"

typedef struct sw_ref {
    double *gate, *up;
    const double *dout;
    size_t n;
} sw_ref;

static double silu_ref(double x) { return x / (1.0 + exp(-x)); }

static double sw_loss(void *arg) {
    sw_ref *r = arg;
    double L = 0;
    for (size_t i = 0; i < r->n; i++) L += r->dout[i] * silu_ref(r->gate[i]) * r->up[i];
    return L;
}

static void check_case(size_t n, double gate_scale) {
    float *gate = kt_rand(n, gate_scale), *up = kt_rand(n, 1.0), *dout = kt_rand(n, 1.0);
    double *gd = kt_to_double(gate, n), *ud = kt_to_double(up, n), *dd = kt_to_double(dout, n);
    double *ref = kt_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) ref[i] = silu_ref(gd[i]) * ud[i];
    tr_backend be;
    kt_backend(&be, 2);
    float *out = kt_floats(n);
    be.ops->swiglu_forward(&be, out, gate, up, n);
    double e = kt_rel_err_d(out, ref, n);
    CHECKF(e < 1e-6, "forward n=%zu: %.3g", n, e);

    float *dg = kt_fill(n, 0), *du = kt_fill(n, 0);
    be.ops->swiglu_backward(&be, dg, du, dout, gate, up, n);
    sw_ref r = {.gate = gd, .up = ud, .dout = dd, .n = n};
    e = kt_fd_rel_err(gd, n, dg, sw_loss, &r, 300);
    CHECKF(e < 1e-5, "dgate vs finite differences n=%zu: %.3g", n, e);
    e = kt_fd_rel_err(ud, n, du, sw_loss, &r, 300);
    CHECKF(e < 1e-5, "dup vs finite differences n=%zu: %.3g", n, e);

    float *dg0 = kt_rand(n, 1.0), *du0 = kt_rand(n, 1.0);
    float *dg2 = kt_copy(dg0, n), *du2 = kt_copy(du0, n);
    be.ops->swiglu_backward(&be, dg2, du2, dout, gate, up, n);
    CHECK(kt_accum_err(dg2, dg0, dg, n) < 1e-6);
    CHECK(kt_accum_err(du2, du0, du, n) < 1e-6);
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *o = kt_floats(n), *g2 = kt_copy(dg0, n), *u2 = kt_copy(du0, n);
        kt_backend(&be, k);
        be.ops->swiglu_forward(&be, o, gate, up, n);
        be.ops->swiglu_backward(&be, g2, u2, dout, gate, up, n);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(o, out, n) && kt_same_bits(g2, dg2, n) && kt_same_bits(u2, du2, n),
               "bits differ at %d threads", k);
        free(o); free(g2); free(u2);
    }
    free(gate); free(up); free(dout); free(gd); free(ud); free(dd); free(ref); free(out);
    free(dg); free(du); free(dg0); free(du0); free(dg2); free(du2);
}

int main(void) {
    kt_seed(6);
    check_case(1, 3.0);
    check_case(37, 3.0);
    check_case(40000, 8.0);   // three tasks; gates far into both tails of the sigmoid
    return tr_test_summary("test_swiglu");
}
