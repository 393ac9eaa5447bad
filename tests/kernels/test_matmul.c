// matmul_forward/backward against a float64 reference: forward on random inputs, every
// gradient against central differences of the float64 forward (small shape) and against the
// float64 closed form (shapes spanning several tiles); the output modes (A, fp32, fp32 added
// to); din written, dw and dbias accumulated; 1/2/3-thread bit equality. The bf16 mode is
// the fp32 op on bf16-valued inputs with each A output rounded once, bit for bit.
#include "tests/kernels/kernels_test.h"

typedef struct mm_ref {
    const double *in, *w, *bias, *dout;
    double *in_d, *w_d, *bias_d;   // the perturbed copies for finite differences
    int32_t T, IC, OC;
} mm_ref;

static void mm_forward_ref(double *out, const double *in, const double *w, const double *bias,
                           int32_t T, int32_t IC, int32_t OC) {
    for (int32_t t = 0; t < T; t++)
        for (int32_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int32_t i = 0; i < IC; i++) s += in[(size_t)t * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)t * OC + o] = s;
        }
}

// L = sum dout * out(in, w, bias)
static double mm_loss(void *arg) {
    mm_ref *r = arg;
    double *out = kt_malloc((size_t)r->T * r->OC * sizeof(double));
    mm_forward_ref(out, r->in_d, r->w_d, r->bias_d, r->T, r->IC, r->OC);
    double L = 0;
    for (size_t i = 0; i < (size_t)r->T * r->OC; i++) L += r->dout[i] * out[i];
    free(out);
    return L;
}

static void check_shape(int32_t T, int32_t IC, int32_t OC, int use_bias, int fd) {
    size_t nin = (size_t)T * IC, nw = (size_t)OC * IC, nout = (size_t)T * OC;
    float *in = kt_rand(nin, 1.0), *w = kt_rand(nw, 0.5), *bias = kt_rand(OC, 1.0);
    float *dout = kt_rand(nout, 1.0);
    double *ind = kt_to_double(in, nin), *wd = kt_to_double(w, nw), *bd = kt_to_double(bias, OC);
    double *doutd = kt_to_double(dout, nout);
    const float *b = use_bias ? bias : NULL;

    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *out = kt_fill(nout, NAN);   // beta = 0 must overwrite, not scale, old contents
    be.ops->matmul_forward(&be, out, in, w, b, T, IC, OC, 0);
    double *ref = kt_malloc(nout * sizeof(double));
    mm_forward_ref(ref, ind, wd, use_bias ? bd : NULL, T, IC, OC);
    double e = kt_rel_err_d(out, ref, nout);
    CHECKF(e < 1e-5, "forward T=%d IC=%d OC=%d bias=%d: rel err %.3g", T, IC, OC, use_bias, e);

    // fp32 outputs: the same bits; added into the residual stream: x + result, in place
    // and into another buffer (which starts as NaNs: it is written, not added to)
    float *out_f = kt_fill(nout, NAN), *out0 = kt_rand(nout, 1.0), *out_acc = kt_copy(out0, nout);
    float *out_to = kt_fill(nout, NAN);
    be.ops->matmul_forward(&be, out_f, in, w, b, T, IC, OC, TR_MM_OUT_F32);
    CHECK(kt_same_bits(out_f, out, nout));
    be.ops->matmul_forward_add(&be, out_acc, out_acc, in, w, b, T, IC, OC);
    be.ops->matmul_forward_add(&be, out_to, out0, in, w, b, T, IC, OC);
    int added = 1;
    for (size_t i = 0; i < nout; i++) added &= out_acc[i] == out0[i] + out[i];
    CHECKF(added, "matmul_forward_add in place is not x + result T=%d IC=%d OC=%d", T, IC, OC);
    CHECKF(kt_same_bits(out_to, out_acc, nout),
           "matmul_forward_add into another buffer differs from in place T=%d IC=%d OC=%d", T, IC,
           OC);

    // din is written: it starts as NaNs here
    float *din = kt_fill(nin, NAN), *dw = kt_fill(nw, 0), *db = kt_fill(OC, 0);
    be.ops->matmul_backward(&be, din, dw, use_bias ? db : NULL, dout, in, w, T, IC, OC);
    if (fd) {
        mm_ref r = {.dout = doutd, .in_d = ind, .w_d = wd, .bias_d = use_bias ? bd : NULL,
                    .T = T, .IC = IC, .OC = OC};
        e = kt_fd_rel_err(ind, nin, din, mm_loss, &r, 100000);
        CHECKF(e < 1e-5, "din vs finite differences: %.3g", e);
        e = kt_fd_rel_err(wd, nw, dw, mm_loss, &r, 100000);
        CHECKF(e < 1e-5, "dw vs finite differences: %.3g", e);
        if (use_bias) {
            e = kt_fd_rel_err(bd, OC, db, mm_loss, &r, 100000);
            CHECKF(e < 1e-5, "dbias vs finite differences: %.3g", e);
        }
    } else {
        // closed form in float64: din = dout w, dw = dout^T in, dbias = column sums of dout
        double *rdin = kt_malloc(nin * sizeof(double)), *rdw = kt_malloc(nw * sizeof(double));
        double *rdb = kt_malloc(OC * sizeof(double));
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < IC; i++) {
                double s = 0;
                for (int32_t o = 0; o < OC; o++) s += doutd[(size_t)t * OC + o] * wd[(size_t)o * IC + i];
                rdin[(size_t)t * IC + i] = s;
            }
        for (int32_t o = 0; o < OC; o++) {
            double sb = 0;
            for (int32_t i = 0; i < IC; i++) {
                double s = 0;
                for (int32_t t = 0; t < T; t++) s += doutd[(size_t)t * OC + o] * ind[(size_t)t * IC + i];
                rdw[(size_t)o * IC + i] = s;
            }
            for (int32_t t = 0; t < T; t++) sb += doutd[(size_t)t * OC + o];
            rdb[o] = sb;
        }
        e = kt_rel_err_d(din, rdin, nin);
        CHECKF(e < 1e-5, "din T=%d IC=%d OC=%d: %.3g", T, IC, OC, e);
        e = kt_rel_err_d(dw, rdw, nw);
        CHECKF(e < 1e-5, "dw T=%d IC=%d OC=%d: %.3g", T, IC, OC, e);
        if (use_bias) {
            e = kt_rel_err_d(db, rdb, OC);
            CHECKF(e < 1e-5, "dbias: %.3g", e);
        }
        free(rdin);
        free(rdw);
        free(rdb);
    }

    // dw and dbias accumulate: start from random gradients, expect start + the fresh result;
    // din is written whatever it held
    float *din0 = kt_rand(nin, 1.0), *dw0 = kt_rand(nw, 1.0), *db0 = kt_rand(OC, 1.0);
    float *din2 = kt_copy(din0, nin), *dw2 = kt_copy(dw0, nw), *db2 = kt_copy(db0, OC);
    be.ops->matmul_backward(&be, din2, dw2, use_bias ? db2 : NULL, dout, in, w, T, IC, OC);
    CHECK(kt_same_bits(din2, din, nin));
    CHECK(kt_accum_err(dw2, dw0, dw, nw) < 1e-5);
    if (use_bias) CHECK(kt_accum_err(db2, db0, db, OC) < 1e-5);

    // NULL gradients are skipped; the others are unchanged by their absence
    float *dw3 = kt_fill(nw, 0);
    be.ops->matmul_backward(&be, NULL, dw3, NULL, dout, in, w, T, IC, OC);
    CHECK(kt_same_bits(dw3, dw, nw));

    tr_backend_cpu_free(&be);
    free(in); free(w); free(bias); free(dout); free(ind); free(wd); free(bd); free(doutd);
    free(out); free(ref); free(din); free(dw); free(db); free(din0); free(dw0); free(db0);
    free(din2); free(dw2); free(db2); free(dw3); free(out_f); free(out0); free(out_acc); free(out_to);
}

static void check_threads(int32_t T, int32_t IC, int32_t OC, tr_dt t) {
    size_t nin = (size_t)T * IC, nw = (size_t)OC * IC, nout = (size_t)T * OC, es = tr_dt_size(t);
    float *inf = kt_rand(nin, 1.0), *wf = kt_rand(nw, 0.5), *biasf = kt_rand(OC, 1.0);
    float *doutf = kt_rand(nout, 1.0);
    void *in = kt_to(inf, nin, t), *w = kt_to(wf, nw, t), *bias = kt_to(biasf, OC, t);
    void *dout = kt_to(doutf, nout, t);
    void *out[3], *din[3];
    float *dw[3], *db[3];
    for (int32_t k = 0; k < 3; k++) {
        tr_backend be;
        kt_backend(&be, k + 1, t);
        out[k] = kt_malloc(nout * es);
        din[k] = kt_malloc(nin * es);
        dw[k] = kt_fill(nw, 0);
        db[k] = kt_fill(OC, 0);
        be.ops->matmul_forward(&be, out[k], in, w, bias, T, IC, OC, 0);
        be.ops->matmul_backward(&be, din[k], dw[k], db[k], dout, in, w, T, IC, OC);
        tr_backend_cpu_free(&be);
    }
    for (int32_t k = 1; k < 3; k++) {
        CHECKF(memcmp(out[k], out[0], nout * es) == 0, "%s: forward bits differ at %d threads",
               tr_dt_name(t), k + 1);
        CHECKF(memcmp(din[k], din[0], nin * es) == 0, "%s: din bits differ at %d threads",
               tr_dt_name(t), k + 1);
        CHECKF(kt_same_bits(dw[k], dw[0], nw), "dw bits differ at %d threads", k + 1);
        CHECKF(kt_same_bits(db[k], db[0], OC), "dbias bits differ at %d threads", k + 1);
    }
    for (int32_t k = 0; k < 3; k++) {
        free(out[k]); free(din[k]); free(dw[k]); free(db[k]);
    }
    free(inf); free(wf); free(biasf); free(doutf); free(in); free(w); free(bias); free(dout);
}

// bf16 mode: every output is the fp32 op's on the same (bf16-valued) inputs, an A output
// rounded once (exact by construction: the chain is the same and only the store rounds), an
// F output (fp32 out, added out, dw, dbias) the same bits.
static void check_bf16(int32_t T, int32_t IC, int32_t OC, int use_bias) {
    size_t nin = (size_t)T * IC, nw = (size_t)OC * IC, nout = (size_t)T * OC;
    float *in = kt_round_all(kt_rand(nin, 1.0), nin), *w = kt_round_all(kt_rand(nw, 0.5), nw);
    float *bias = kt_round_all(kt_rand(OC, 1.0), OC);
    float *dout = kt_round_all(kt_rand(nout, 1.0), nout);
    const float *b = use_bias ? bias : NULL;
    float *out0 = kt_rand(nout, 1.0), *dw0 = kt_rand(nw, 1.0), *db0 = kt_rand(OC, 1.0);

    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *out = kt_floats(nout), *acc = kt_copy(out0, nout), *din = kt_floats(nin);
    float *dw = kt_copy(dw0, nw), *db = kt_copy(db0, OC);
    be.ops->matmul_forward(&be, out, in, w, b, T, IC, OC, 0);
    be.ops->matmul_forward_add(&be, acc, acc, in, w, b, T, IC, OC);
    be.ops->matmul_backward(&be, din, dw, use_bias ? db : NULL, dout, in, w, T, IC, OC);
    tr_backend_cpu_free(&be);

    uint16_t *in16 = kt_to(in, nin, TR_BF16), *w16 = kt_to(w, nw, TR_BF16);
    uint16_t *bias16 = kt_to(bias, OC, TR_BF16), *dout16 = kt_to(dout, nout, TR_BF16);
    uint16_t *out16 = kt_poison(nout, TR_BF16), *din16 = kt_poison(nin, TR_BF16);
    float *outf = kt_fill(nout, NAN), *acc16 = kt_copy(out0, nout);
    float *dw16 = kt_copy(dw0, nw), *db16 = kt_copy(db0, OC);
    kt_backend(&be, 2, TR_BF16);
    const uint16_t *b16 = use_bias ? bias16 : NULL;
    be.ops->matmul_forward(&be, out16, in16, w16, b16, T, IC, OC, 0);
    be.ops->matmul_forward(&be, outf, in16, w16, b16, T, IC, OC, TR_MM_OUT_F32);
    be.ops->matmul_forward_add(&be, acc16, acc16, in16, w16, b16, T, IC, OC);
    be.ops->matmul_backward(&be, din16, dw16, use_bias ? db16 : NULL, dout16, in16, w16, T, IC,
                            OC);
    tr_backend_cpu_free(&be);
    CHECKF(kt_is_rounded(out16, out, nout, "out"), "bf16 forward T=%d IC=%d OC=%d", T, IC, OC);
    CHECKF(kt_same_bits(outf, out, nout), "bf16 forward into fp32 T=%d IC=%d OC=%d", T, IC, OC);
    CHECKF(kt_same_bits(acc16, acc, nout), "bf16 forward added T=%d IC=%d OC=%d", T, IC, OC);
    CHECKF(kt_is_rounded(din16, din, nin, "din"), "bf16 din T=%d IC=%d OC=%d", T, IC, OC);
    CHECKF(kt_same_bits(dw16, dw, nw), "bf16 dw T=%d IC=%d OC=%d", T, IC, OC);
    if (use_bias) CHECKF(kt_same_bits(db16, db, OC), "bf16 dbias T=%d IC=%d OC=%d", T, IC, OC);
    free(in); free(w); free(bias); free(dout); free(out0); free(dw0); free(db0); free(out);
    free(acc); free(din); free(dw); free(db); free(in16); free(w16); free(bias16); free(dout16);
    free(out16); free(din16); free(outf); free(acc16); free(dw16); free(db16);
}

int main(void) {
    kt_seed(1);
    check_shape(5, 37, 19, 1, 1);     // odd sizes, every gradient by finite differences
    check_shape(1, 37, 300, 1, 1);    // one row (decode), two column tiles
    check_shape(3, 1, 7, 0, 1);
    check_shape(130, 70, 260, 1, 0); // several row and column tiles
    check_shape(70, 300, 9, 0, 0);
    check_threads(200, 96, 530, TR_F32);
    check_threads(200, 96, 530, TR_BF16);
    check_bf16(5, 37, 19, 1);
    check_bf16(1, 300, 130, 1);     // decode row; bf16 out wider than one 128-column pass
    check_bf16(130, 70, 260, 0);
    check_bf16(70, 300, 9, 1);
    return tr_test_summary("test_matmul");
}
