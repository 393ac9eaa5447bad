// rmsnorm_forward/backward against a float64 reference: forward and rstd on random inputs,
// din and dw against central differences of the float64 forward, accumulation, and bitwise
// equal results for 1, 2 and 3 threads. head_rmsnorm (per head of strided rows) likewise,
// with din written, the gaps between rows untouched, and fp32 bits equal to rmsnorm over the
// heads as rows. The bf16 mode is the fp32 op on bf16-valued A/W inputs with each A output
// rounded once, bit for bit; the backward's copy of the updated din in A (din_act) is din
// itself in fp32 and convert's rounding of it in bf16.
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
    kt_backend(&be, 2, TR_F32);
    be.ops->rmsnorm_forward(&be, out, rstd, in, w, eps, T, C);
    double *ind = kt_to_double(in, n), *wd = kt_to_double(w, C), *dd = kt_to_double(dout, n);
    double *ref = kt_malloc(n * sizeof(double)), *rref = kt_malloc(T * sizeof(double));
    rms_forward_ref(ref, rref, ind, wd, eps, T, C);
    double e = kt_rel_err_d(out, ref, n);
    CHECKF(e < 1e-6, "forward T=%d C=%d: %.3g", T, C, e);
    e = kt_rel_err_d(rstd, rref, T);
    CHECKF(e < 1e-6, "rstd T=%d C=%d: %.3g", T, C, e);

    float *din = kt_fill(n, 0), *dw = kt_fill(C, 0);
    be.ops->rmsnorm_backward(&be, din, NULL, dw, dout, in, w, rstd, T, C);
    rms_ref r = {.in = ind, .w = wd, .dout = dd, .eps = eps, .T = T, .C = C};
    e = kt_fd_rel_err(ind, n, din, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "din vs finite differences T=%d C=%d: %.3g", T, C, e);
    e = kt_fd_rel_err(wd, C, dw, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "dw vs finite differences T=%d C=%d: %.3g", T, C, e);

    float *din0 = kt_rand(n, 1.0), *dw0 = kt_rand(C, 1.0);
    float *din2 = kt_copy(din0, n), *dw2 = kt_copy(dw0, C), *dact = kt_fill(n, -7.0f);
    be.ops->rmsnorm_backward(&be, din2, dact, dw2, dout, in, w, rstd, T, C);
    CHECK(kt_accum_err(din2, din0, din, n) < 1e-5);
    CHECK(kt_accum_err(dw2, dw0, dw, C) < 1e-5);
    CHECKF(kt_same_bits(dact, din2, n), "fp32 din_act is not the updated din T=%d C=%d", T, C);
    free(dact);
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *o = kt_floats(n), *rs = kt_floats(T), *di = kt_copy(din0, n), *dwk = kt_copy(dw0, C);
        kt_backend(&be, k, TR_F32);
        be.ops->rmsnorm_forward(&be, o, rs, in, w, eps, T, C);
        be.ops->rmsnorm_backward(&be, di, NULL, dwk, dout, in, w, rs, T, C);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(o, out, n) && kt_same_bits(rs, rstd, T), "forward bits, %d threads", k);
        CHECKF(kt_same_bits(di, din2, n) && kt_same_bits(dwk, dw2, C), "backward bits, %d threads", k);
        free(o); free(rs); free(di); free(dwk);
    }
    free(in); free(w); free(dout); free(out); free(rstd); free(ind); free(wd); free(dd);
    free(ref); free(rref); free(din); free(dw); free(din0); free(dw0); free(din2); free(dw2);
}

// Rows (t, h) of a strided [T, ld] buffer as a contiguous [T*H, D] array, and back.
static float *heads_of(const float *x, int32_t T, int32_t H, int32_t D, int32_t ld) {
    float *y = kt_floats((size_t)T * H * D);
    for (int32_t t = 0; t < T; t++)
        memcpy(y + (size_t)t * H * D, x + (size_t)t * ld, (size_t)H * D * sizeof(float));
    return y;
}

// Whether the elements of a [T, ld] buffer outside the heads' rows equal ref's.
static int gaps_kept(const void *x, const void *ref, int32_t T, int32_t H, int32_t D,
                     int32_t ld, size_t es) {
    for (int32_t t = 0; t < T; t++) {
        size_t o = ((size_t)t * ld + (size_t)H * D) * es, n = (size_t)(ld - H * D) * es;
        if (memcmp((const char *)x + o, (const char *)ref + o, n) != 0) return 0;
    }
    return 1;
}

static void check_head(int32_t T, int32_t H, int32_t D, int32_t ld, float eps) {
    size_t n = (size_t)T * ld, nh = (size_t)T * H * D;
    float *in = kt_rand(n, 2.0), *w = kt_rand(D, 1.0), *dout = kt_rand(n, 1.0);
    for (int32_t c = 0; c < D; c++) w[c] += 1.0f;
    float *out = kt_rand(n, 1.0), *out0 = kt_copy(out, n), *rstd = kt_floats((size_t)T * H);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    be.ops->head_rmsnorm_forward(&be, out, rstd, in, w, eps, T, H, D, ld);
    CHECKF(gaps_kept(out, out0, T, H, D, ld, 4), "head forward wrote between rows (ld %d)", ld);
    float *inh = heads_of(in, T, H, D, ld), *outh = heads_of(out, T, H, D, ld);
    float *douth = heads_of(dout, T, H, D, ld);
    double *ind = kt_to_double(inh, nh), *wd = kt_to_double(w, D), *dd = kt_to_double(douth, nh);
    double *ref = kt_malloc(nh * sizeof(double)), *rref = kt_malloc((size_t)T * H * sizeof(double));
    rms_forward_ref(ref, rref, ind, wd, eps, T * H, D);
    double e = kt_rel_err_d(outh, ref, nh);
    CHECKF(e < 1e-6, "head forward T=%d H=%d D=%d ld=%d: %.3g", T, H, D, ld, e);
    e = kt_rel_err_d(rstd, rref, (size_t)T * H);
    CHECKF(e < 1e-6, "head rstd T=%d H=%d D=%d: %.3g", T, H, D, e);

    // din is written (NaNs first), dw accumulates
    float *din = kt_fill(n, NAN), *dw0 = kt_rand(D, 1.0), *dwz = kt_fill(D, 0);
    be.ops->head_rmsnorm_backward(&be, din, dwz, dout, in, w, rstd, T, H, D, ld);
    float *dinh = heads_of(din, T, H, D, ld);
    rms_ref r = {.in = ind, .w = wd, .dout = dd, .eps = eps, .T = T * H, .C = D};
    e = kt_fd_rel_err(ind, nh, dinh, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "head din vs finite differences T=%d H=%d D=%d: %.3g", T, H, D, e);
    e = kt_fd_rel_err(wd, D, dwz, rms_loss, &r, 3000);
    CHECKF(e < 1e-5, "head dw vs finite differences T=%d H=%d D=%d: %.3g", T, H, D, e);
    int gaps_nan = 1;   // the poison between rows stays
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = H * D; c < ld; c++) gaps_nan &= isnan(din[(size_t)t * ld + c]);
    CHECKF(gaps_nan, "head backward wrote between rows (ld %d)", ld);
    float *din2 = kt_rand(n, 1.0);
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = H * D; c < ld; c++) din2[(size_t)t * ld + c] = NAN;
    float *dw = kt_copy(dw0, D);
    be.ops->head_rmsnorm_backward(&be, din2, dw, dout, in, w, rstd, T, H, D, ld);
    CHECKF(memcmp(din2, din, n * sizeof(float)) == 0, "head backward depends on what din held");
    CHECK(kt_accum_err(dw, dw0, dwz, D) < 1e-6);

    // the same bits as rmsnorm over the heads as rows (its din added to zeros)
    float *o2 = kt_floats(nh), *r2 = kt_floats((size_t)T * H), *di2 = kt_fill(nh, 0);
    float *dw3 = kt_copy(dw0, D);
    be.ops->rmsnorm_forward(&be, o2, r2, inh, w, eps, T * H, D);
    be.ops->rmsnorm_backward(&be, di2, NULL, dw3, douth, inh, w, r2, T * H, D);
    CHECKF(kt_same_bits(o2, outh, nh) && kt_same_bits(r2, rstd, (size_t)T * H) &&
               kt_same_bits(di2, dinh, nh) && kt_same_bits(dw3, dw, D),
           "head_rmsnorm differs from rmsnorm over the heads T=%d H=%d D=%d", T, H, D);

    // in place: out = in, din = dout (the engine may normalize inside the qkv buffer)
    float *x = kt_copy(in, n), *gx = kt_copy(dout, n), *rs = kt_floats((size_t)T * H);
    float *dw4 = kt_copy(dw0, D);
    be.ops->head_rmsnorm_forward(&be, x, rs, x, w, eps, T, H, D, ld);
    float *xh = heads_of(x, T, H, D, ld);
    CHECKF(kt_same_bits(xh, outh, nh), "head forward in place differs");
    free(xh);
    be.ops->head_rmsnorm_backward(&be, gx, dw4, gx, in, w, rstd, T, H, D, ld);
    float *gxh = heads_of(gx, T, H, D, ld);
    CHECKF(kt_same_bits(gxh, dinh, nh) && kt_same_bits(dw4, dw, D),
           "head backward with din = dout differs");
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *o = kt_copy(out0, n), *rk = kt_floats((size_t)T * H), *dk = kt_fill(n, NAN);
        float *dwk = kt_copy(dw0, D);
        kt_backend(&be, k, TR_F32);
        be.ops->head_rmsnorm_forward(&be, o, rk, in, w, eps, T, H, D, ld);
        be.ops->head_rmsnorm_backward(&be, dk, dwk, dout, in, w, rk, T, H, D, ld);
        tr_backend_cpu_free(&be);
        CHECKF(memcmp(o, out, n * 4) == 0 && memcmp(dk, din, n * 4) == 0 &&
                   kt_same_bits(dwk, dw, D), "head bits, %d threads", k);
        free(o); free(rk); free(dk); free(dwk);
    }
    free(in); free(w); free(dout); free(out); free(out0); free(rstd); free(inh); free(outh);
    free(douth); free(ind); free(wd); free(dd); free(ref); free(rref); free(din); free(dw0);
    free(dw); free(dinh); free(dwz); free(din2); free(o2); free(r2); free(di2);
    free(dw3); free(x); free(gx); free(rs); free(dw4); free(gxh);
}

// bf16 mode, rmsnorm: in is the fp32 residual stream, w and dout bf16-valued; out is the fp32
// op's out rounded once, rstd, din (added to) and dw the fp32 op's bits.
static void check_bf16(int32_t T, int32_t C, float eps) {
    size_t n = (size_t)T * C;
    float *in = kt_rand(n, 2.0), *w = kt_rand(C, 1.0), *dout = kt_round_all(kt_rand(n, 1.0), n);
    for (int32_t c = 0; c < C; c++) w[c] = kt_round_bf16(w[c] + 1.0f);
    float *din0 = kt_rand(n, 1.0), *dw0 = kt_rand(C, 1.0);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *out = kt_floats(n), *rstd = kt_floats(T), *din = kt_copy(din0, n), *dw = kt_copy(dw0, C);
    be.ops->rmsnorm_forward(&be, out, rstd, in, w, eps, T, C);
    be.ops->rmsnorm_backward(&be, din, NULL, dw, dout, in, w, rstd, T, C);
    tr_backend_cpu_free(&be);
    uint16_t *w16 = kt_to(w, C, TR_BF16), *dout16 = kt_to(dout, n, TR_BF16);
    uint16_t *out16 = kt_poison(n, TR_BF16);
    float *rstd16 = kt_floats(T), *din16 = kt_copy(din0, n), *dw16 = kt_copy(dw0, C);
    kt_backend(&be, 3, TR_BF16);
    be.ops->rmsnorm_forward(&be, out16, rstd16, in, w16, eps, T, C);
    // the updated din also in bf16, as convert would round it (the next GEMMs' input)
    uint16_t *dact16 = kt_poison(n, TR_BF16), *conv16 = kt_poison(n, TR_BF16);
    be.ops->rmsnorm_backward(&be, din16, dact16, dw16, dout16, in, w16, rstd16, T, C);
    be.ops->convert(&be, conv16, TR_BF16, din16, TR_F32, n);
    tr_backend_cpu_free(&be);
    CHECKF(memcmp(dact16, conv16, n * sizeof(uint16_t)) == 0,
           "bf16 rmsnorm din_act is not convert's din T=%d C=%d", T, C);
    free(dact16);
    free(conv16);
    CHECKF(kt_is_rounded(out16, out, n, "out"), "bf16 rmsnorm out T=%d C=%d", T, C);
    CHECKF(kt_same_bits(rstd16, rstd, T), "bf16 rmsnorm rstd T=%d C=%d", T, C);
    CHECKF(kt_same_bits(din16, din, n), "bf16 rmsnorm din T=%d C=%d", T, C);
    CHECKF(kt_same_bits(dw16, dw, C), "bf16 rmsnorm dw T=%d C=%d", T, C);
    free(in); free(w); free(dout); free(din0); free(dw0); free(out); free(rstd); free(din);
    free(dw); free(w16); free(dout16); free(out16); free(rstd16); free(din16); free(dw16);
}

// bf16 mode, head_rmsnorm on strided rows: out and din rounded once, rstd and dw the fp32
// op's bits, gaps between the rows untouched.
static void check_bf16_head(int32_t T, int32_t H, int32_t D, int32_t ld, float eps) {
    size_t n = (size_t)T * ld;
    float *in = kt_round_all(kt_rand(n, 2.0), n), *w = kt_rand(D, 1.0);
    float *dout = kt_round_all(kt_rand(n, 1.0), n);
    for (int32_t c = 0; c < D; c++) w[c] = kt_round_bf16(w[c] + 1.0f);
    float *dw0 = kt_rand(D, 1.0);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *out = kt_floats(n), *rstd = kt_floats((size_t)T * H), *din = kt_floats(n);
    float *dw = kt_copy(dw0, D);
    be.ops->head_rmsnorm_forward(&be, out, rstd, in, w, eps, T, H, D, ld);
    be.ops->head_rmsnorm_backward(&be, din, dw, dout, in, w, rstd, T, H, D, ld);
    tr_backend_cpu_free(&be);
    uint16_t *in16 = kt_to(in, n, TR_BF16), *w16 = kt_to(w, D, TR_BF16);
    uint16_t *dout16 = kt_to(dout, n, TR_BF16), *out16 = kt_poison(n, TR_BF16);
    uint16_t *din16 = kt_poison(n, TR_BF16), *poison = kt_poison(n, TR_BF16);
    float *rstd16 = kt_floats((size_t)T * H), *dw16 = kt_copy(dw0, D);
    kt_backend(&be, 3, TR_BF16);
    be.ops->head_rmsnorm_forward(&be, out16, rstd16, in16, w16, eps, T, H, D, ld);
    be.ops->head_rmsnorm_backward(&be, din16, dw16, dout16, in16, w16, rstd16, T, H, D, ld);
    tr_backend_cpu_free(&be);
    int ok_out = 1, ok_din = 1;
    for (int32_t t = 0; t < T; t++) {
        size_t o = (size_t)t * ld;
        ok_out &= kt_is_rounded(out16 + o, out + o, (size_t)H * D, "out");
        ok_din &= kt_is_rounded(din16 + o, din + o, (size_t)H * D, "din");
    }
    CHECKF(ok_out, "bf16 head out T=%d H=%d D=%d ld=%d", T, H, D, ld);
    CHECKF(ok_din, "bf16 head din T=%d H=%d D=%d ld=%d", T, H, D, ld);
    CHECKF(gaps_kept(out16, poison, T, H, D, ld, 2) && gaps_kept(din16, poison, T, H, D, ld, 2),
           "bf16 head wrote between rows");
    CHECKF(kt_same_bits(rstd16, rstd, (size_t)T * H), "bf16 head rstd");
    CHECKF(kt_same_bits(dw16, dw, D), "bf16 head dw");
    free(in); free(w); free(dout); free(dw0); free(out); free(rstd); free(din); free(dw);
    free(in16); free(w16); free(dout16); free(out16); free(din16); free(poison); free(rstd16);
    free(dw16);
}

int main(void) {
    kt_seed(3);
    check_case(1, 37, 1.0, 1e-6f);
    check_case(7, 37, 3.0, 1e-5f);
    check_case(5, 8, 1e-3, 1e-5f);   // eps matters when the row is tiny
    check_case(70, 200, 1.0, 1e-6f); // several row tasks and column blocks
    check_head(5, 3, 16, 48, 1e-6f);     // contiguous heads
    check_head(7, 2, 12, 40, 1e-6f);     // rows with a gap (a q view inside fused qkv)
    check_head(40, 4, 128, 768, 1e-6f);  // several token tasks, two column blocks
    check_bf16(7, 37, 1e-5f);
    check_bf16(70, 200, 1e-6f);
    check_bf16_head(7, 2, 12, 40, 1e-6f);
    check_bf16_head(40, 4, 128, 768, 1e-6f);
    return tr_test_summary("test_rmsnorm");
}
