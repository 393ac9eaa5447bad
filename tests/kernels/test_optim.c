// Optimizer-step ops: AdamW against its formula written out in float64 for 3 steps (bias
// correction, decoupled weight decay), sumsq against a float64 sum (including a buffer large
// enough to switch to the grown block size) and adding into what its accumulator holds, scale and add against direct arithmetic, and
// bitwise equal results for 1, 2 and 3 threads.
#include "tests/kernels/kernels_test.h"

static void check_adamw(size_t n) {
    const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    float *p = kt_rand(n, 1.0), *m = kt_fill(n, 0), *v = kt_fill(n, 0);
    double *pd = kt_to_double(p, n), *md = kt_malloc(n * sizeof(double));
    double *vd = kt_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) md[i] = vd[i] = 0;
    tr_backend be;
    kt_backend(&be, 2);
    for (int32_t t = 1; t <= 3; t++) {
        float *g = kt_rand(n, t == 2 ? 1e-3 : 1.0);   // a step of tiny gradients: eps matters less than v
        be.ops->adamw(&be, p, g, m, v, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t);
        for (size_t i = 0; i < n; i++) {
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(b1, t)), vh = vd[i] / (1 - pow(b2, t));
            pd[i] -= lr * (mh / (sqrt(vh) + eps) + wd * pd[i]);
        }
        double ep = 0, em = kt_rel_err_d(m, md, n), ev = kt_rel_err_d(v, vd, n);
        for (size_t i = 0; i < n; i++) ep = fmax(ep, fabs(p[i] - pd[i]));
        // each step moves p by about lr; fp32 keeps that to ~1e-7 of |p| ~ 1
        CHECKF(ep < 1e-6, "adamw step %d: p max abs err %.3g", t, ep);
        CHECKF(em < 1e-6 && ev < 1e-5, "adamw step %d: m %.3g v %.3g", t, em, ev);
        free(g);
    }
    tr_backend_cpu_free(&be);
    free(p); free(m); free(v); free(pd); free(md); free(vd);
}

static void check_threads(size_t n) {
    float *g = kt_rand(n, 1.0), *p0 = kt_rand(n, 1.0), *a = kt_rand(n, 1.0);
    float *res[3];
    double ss[3];
    for (int32_t k = 0; k < 3; k++) {
        tr_backend be;
        kt_backend(&be, k + 1);
        res[k] = kt_floats(4 * n);
        float *p = res[k], *m = p + n, *v = p + 2 * n, *o = p + 3 * n;
        memcpy(p, p0, n * sizeof(float));
        memset(m, 0, 2 * n * sizeof(float));
        be.ops->adamw(&be, p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1);
        be.ops->add(&be, o, p, a, n);
        be.ops->scale(&be, o, 0.5f, n);
        ss[k] = 0.0;
        be.ops->sumsq(&be, &ss[k], o, n);
        tr_backend_cpu_free(&be);
    }
    CHECK(kt_same_bits(res[1], res[0], 4 * n) && kt_same_bits(res[2], res[0], 4 * n));
    CHECK(memcmp(&ss[1], &ss[0], sizeof(double)) == 0 && memcmp(&ss[2], &ss[0], sizeof(double)) == 0);
    for (int32_t k = 0; k < 3; k++) free(res[k]);
    free(g); free(p0); free(a);
}

static void check_sumsq(size_t n) {
    float *x = kt_rand(n, 2.0);
    long double acc = 0;   // 64-bit mantissa: a reference more exact than the double sum tested
    for (size_t i = 0; i < n; i++) acc += (long double)x[i] * x[i];
    double ref = (double)acc;
    tr_backend be;
    kt_backend(&be, 3);
    double s = 0.0, into = 0.75;
    be.ops->sumsq(&be, &s, x, n);
    CHECKF(fabs(s - ref) <= 1e-12 * fmax(ref, 1e-300), "sumsq n=%zu: %.17g vs %.17g", n, s, ref);
    be.ops->sumsq(&be, &into, x, n);   // adds to what it holds: one rounding of 0.75 + s
    CHECKF(into == 0.75 + s, "sumsq n=%zu into 0.75: %.17g, want %.17g", n, into, 0.75 + s);
    tr_backend_cpu_free(&be);
    free(x);
}

static void check_add_scale(size_t n) {
    float *a = kt_rand(n, 1.0), *b = kt_rand(n, 1.0), *out = kt_floats(n);
    tr_backend be;
    kt_backend(&be, 2);
    be.ops->add(&be, out, a, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= out[i] == a[i] + b[i];
    CHECKF(ok, "add n=%zu", n);
    float *a2 = kt_copy(a, n);
    be.ops->add(&be, a2, a2, b, n);   // out may alias a
    CHECK(kt_same_bits(a2, out, n));
    be.ops->scale(&be, out, -0.75f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= out[i] == a2[i] * -0.75f;
    CHECKF(ok, "scale n=%zu", n);
    tr_backend_cpu_free(&be);
    free(a); free(b); free(out); free(a2);
}

int main(void) {
    kt_seed(8);
    check_adamw(37);
    check_adamw(50001);
    check_sumsq(0);
    check_sumsq(1);
    check_sumsq(16384 * 3 + 7);
    check_sumsq((size_t)16384 * 1024 + 4099);   // past 1024 blocks: block size grows
    check_add_scale(37);
    check_add_scale(40000);
    check_threads(16384 * 5 + 3);
    return tr_test_summary("test_optim");
}
