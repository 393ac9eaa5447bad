// logsoftmax_forward/backward against float64: logprob of the target, entropy and lse on
// random logits (large ones too), dlogits from dlogprob and from dentropy against central
// differences of the float64 forward, target < 0 giving logprob 0 and no gradient, and
// bitwise equal results for 1, 2 and 3 threads. In bf16 mode (bf16 logits) the forward has
// the fp32 forward's bits on the same values and dlogits is the fp32 dlogits rounded once,
// target element included. The
// vocab-parallel ops: one rank's statistics combine into logsoftmax_forward's bits; the
// columns split over 1..4 ranks combine to the float64 results and the ranks' backward
// columns make logsoftmax_backward's dlogits. Logits in either activation dtype give the bits
// of the fp32 ops on their widened values (the convert op's), and the backwards written over
// their own logits give the bits they write elsewhere.
#include "tests/kernels/kernels_test.h"

typedef struct lsm_ref {
    double *logits;
    const int32_t *target;
    const double *dlp, *dent;   // loss = sum_t dlp[t] logprob[t] + dent[t] entropy[t]
    int32_t T, V;
} lsm_ref;

static void lsm_forward_ref(double *logprob, double *entropy, double *lse, const double *x,
                            const int32_t *target, int32_t T, int32_t V) {
    for (int32_t t = 0; t < T; t++) {
        const double *r = x + (size_t)t * V;
        double m = -INFINITY, s = 0, h = 0;
        for (int32_t i = 0; i < V; i++) m = fmax(m, r[i]);
        for (int32_t i = 0; i < V; i++) s += exp(r[i] - m);
        double l = m + log(s);
        for (int32_t i = 0; i < V; i++) {
            double lp = r[i] - l;
            h -= exp(lp) * lp;
        }
        lse[t] = l;
        entropy[t] = h;
        logprob[t] = target[t] < 0 ? 0.0 : r[target[t]] - l;
    }
}

static double lsm_loss(void *arg) {
    lsm_ref *r = arg;
    double *lp = kt_malloc(r->T * sizeof(double) * 3), *ent = lp + r->T, *lse = lp + 2 * r->T;
    lsm_forward_ref(lp, ent, lse, r->logits, r->target, r->T, r->V);
    double L = 0;
    for (int32_t t = 0; t < r->T; t++)
        L += (r->dlp ? r->dlp[t] * lp[t] : 0) + (r->dent ? r->dent[t] * ent[t] : 0);
    free(lp);
    return L;
}

static void check_case(int32_t T, int32_t V, double scale) {
    size_t n = (size_t)T * V;
    float *x = kt_rand(n, scale), *glp = kt_rand(T, 1.0), *gent = kt_rand(T, 1.0);
    int32_t *target = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) target[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * V) % V;
    if (T > 1) target[1] = -1;   // a masked row
    double *xd = kt_to_double(x, n), *glpd = kt_to_double(glp, T), *gentd = kt_to_double(gent, T);
    double *rl = kt_malloc(T * sizeof(double) * 3), *re = rl + T, *rs = rl + 2 * T;
    lsm_forward_ref(rl, re, rs, xd, target, T, V);

    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *lp = kt_fill(T, NAN), *ent = kt_fill(T, NAN), *lse = kt_fill(T, NAN);
    be.ops->logsoftmax_forward(&be, lp, ent, lse, x, target, T, V);
    double lp_err = 0, ent_err = 0, else_err = 0;
    for (int32_t t = 0; t < T; t++) {
        lp_err = fmax(lp_err, fabs(lp[t] - rl[t]));
        ent_err = fmax(ent_err, fabs(ent[t] - re[t]));
        else_err = fmax(else_err, fabs(lse[t] - rs[t]) / fmax(1.0, fabs(rs[t])));
    }
    // absolute errors: logprob and entropy are O(log V); float keeps ~7 digits of them
    CHECKF(lp_err < 1e-5 * fmax(1.0, scale), "logprob T=%d V=%d: %.3g", T, V, lp_err);
    CHECKF(ent_err < 1e-5, "entropy T=%d V=%d: %.3g", T, V, ent_err);
    CHECKF(else_err < 1e-6, "lse T=%d V=%d: %.3g", T, V, else_err);
    if (T > 1) CHECK(lp[1] == 0.0f);
    float *lp_only = kt_fill(T, NAN), *lse2 = kt_floats(T);
    be.ops->logsoftmax_forward(&be, lp_only, NULL, lse2, x, target, T, V);
    CHECK(kt_same_bits(lp_only, lp, T) && kt_same_bits(lse2, lse, T));

    // gradients: each term alone, then both together, against finite differences
    lsm_ref r = {.logits = xd, .target = target, .T = T, .V = V};
    float *dx = kt_fill(n, NAN);
    for (int32_t mode = 0; mode < 3; mode++) {
        const float *a = mode != 1 ? glp : NULL, *b = mode != 0 ? gent : NULL;
        r.dlp = a ? glpd : NULL;
        r.dent = b ? gentd : NULL;
        be.ops->logsoftmax_backward(&be, dx, a, b, x, lse, target, T, V);
        // vocabulary-sized rows: p ~ 1/V makes gradients tiny next to the loss, so a larger
        // step keeps the difference quotient's cancellation error small
        double e = V > 1000 ? kt_fd_rel_err_ex(xd, n, dx, lsm_loss, &r, 40, 1e-30, 1e-3)
                            : kt_fd_rel_err(xd, n, dx, lsm_loss, &r, n > 5000 ? 60 : 400);
        CHECKF(e < 1e-5, "dlogits (mode %d) vs finite differences T=%d V=%d: %.3g", mode, T, V, e);
    }
    // a masked row takes no gradient through its logprob
    if (T > 1) {
        be.ops->logsoftmax_backward(&be, dx, glp, NULL, x, lse, target, T, V);
        int zero = 1;
        for (int32_t i = 0; i < V; i++) zero &= dx[(size_t)V + i] == 0.0f;
        CHECK(zero);
    }
    tr_backend_cpu_free(&be);

    float *res[3];
    for (int32_t k = 0; k < 3; k++) {
        res[k] = kt_floats(n + 3 * (size_t)T);
        kt_backend(&be, k + 1, TR_F32);
        be.ops->logsoftmax_forward(&be, res[k] + n, res[k] + n + T, res[k] + n + 2 * T, x,
                                   target, T, V);
        be.ops->logsoftmax_backward(&be, res[k], glp, gent, x, lse, target, T, V);
        tr_backend_cpu_free(&be);
    }
    CHECKF(kt_same_bits(res[1], res[0], n + 3 * (size_t)T) &&
               kt_same_bits(res[2], res[0], n + 3 * (size_t)T),
           "bits differ across thread counts T=%d V=%d", T, V);
    // bf16: logits rounded to bf16 give the fp32 forward's bits on those values, and dlogits
    // (both terms) are the fp32 dlogits rounded once
    float *xr = kt_round_all(kt_copy(x, n), n), *want = kt_floats(n + 3 * (size_t)T);
    kt_backend(&be, 2, TR_F32);
    be.ops->logsoftmax_forward(&be, want + n, want + n + T, want + n + 2 * T, xr, target, T, V);
    be.ops->logsoftmax_backward(&be, want, glp, gent, xr, lse, target, T, V);
    tr_backend_cpu_free(&be);
    float *lp16 = kt_floats(T), *ent16 = kt_floats(T), *lse16 = kt_floats(T);
    uint16_t *x16 = kt_to(x, n, TR_BF16), *dx16 = kt_poison(n, TR_BF16);
    kt_backend(&be, 2, TR_BF16);
    be.ops->logsoftmax_forward(&be, lp16, ent16, lse16, x16, target, T, V);
    be.ops->logsoftmax_backward(&be, dx16, glp, gent, x16, lse, target, T, V);
    tr_backend_cpu_free(&be);
    CHECKF(kt_same_bits(lp16, want + n, T) && kt_same_bits(ent16, want + n + T, T) &&
               kt_same_bits(lse16, want + n + 2 * T, T),
           "bf16 forward differs from fp32 T=%d V=%d", T, V);
    CHECKF(kt_is_rounded(dx16, want, n, "dlogits"), "bf16 dlogits T=%d V=%d", T, V);
    free(xr); free(want); free(lp16); free(ent16); free(lse16); free(x16); free(dx16);
    for (int32_t k = 0; k < 3; k++) free(res[k]);
    free(x); free(glp); free(gent); free(target); free(xd); free(glpd); free(gentd); free(rl);
    free(lp); free(ent); free(lse); free(lp_only); free(lse2); free(dx);
}

// Rows of V columns split over R ranks as tensor parallelism splits a vocabulary.
static void check_vp(int32_t T, int32_t V, int32_t R, double scale) {
    size_t n = (size_t)T * V;
    float *x = kt_rand(n, scale), *glp = kt_rand(T, 1.0), *gent = kt_rand(T, 1.0);
    int32_t *target = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) target[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * V) % V;
    if (T > 1) target[1] = -1;
    double *xd = kt_to_double(x, n);
    double *rl = kt_malloc(T * sizeof(double) * 3), *re = rl + T, *rs = rl + 2 * T;
    lsm_forward_ref(rl, re, rs, xd, target, T, V);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    // The single-rank results, for bits (R = 1) and the backward.
    float *lp1 = kt_fill(T, NAN), *ent1 = kt_fill(T, NAN), *lse1 = kt_fill(T, NAN);
    be.ops->logsoftmax_forward(&be, lp1, ent1, lse1, x, target, T, V);
    float *dx1 = kt_fill(n, NAN);
    be.ops->logsoftmax_backward(&be, dx1, glp, gent, x, lse1, target, T, V);
    double *stats = kt_malloc((size_t)R * T * 4 * sizeof(double)), *mean = kt_malloc(T * sizeof(double));
    float **part = kt_malloc((size_t)R * sizeof(float *));
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = (int32_t)((int64_t)V * r / R), vr = (int32_t)((int64_t)V * (r + 1) / R) - v0;
        part[r] = kt_floats((size_t)T * vr);
        for (int32_t t = 0; t < T; t++) memcpy(part[r] + (size_t)t * vr, x + (size_t)t * V + v0, vr * sizeof(float));
        be.ops->logsoftmax_vp_stats(&be, stats + (size_t)r * T * 4, part[r], target, v0, T, vr);
    }
    float *lp = kt_fill(T, NAN), *ent = kt_fill(T, NAN), *lse = kt_fill(T, NAN);
    be.ops->logsoftmax_vp_combine(&be, lp, ent, lse, mean, stats, target, R, T);
    double e_lp = 0, e_ent = 0;
    for (int32_t t = 0; t < T; t++) {
        e_lp = fmax(e_lp, fabs(lp[t] - rl[t]));
        e_ent = fmax(e_ent, fabs(ent[t] - re[t]));
    }
    CHECKF(e_lp <= 2e-6 * (1 + scale) && e_ent <= 2e-6 * (1 + scale), "vp T=%d V=%d R=%d: logprob %.3g, "
           "entropy %.3g from float64", T, V, R, e_lp, e_ent);
    if (R == 1)
        CHECKF(memcmp(lp, lp1, T * sizeof(float)) == 0 && memcmp(ent, ent1, T * sizeof(float)) == 0 &&
               memcmp(lse, lse1, T * sizeof(float)) == 0, "vp T=%d V=%d: one rank is not logsoftmax_forward's bits", T, V);
    // Each rank's columns of dlogits from the whole row's lse and mean.
    double e_dx = 0, big = 0;
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = (int32_t)((int64_t)V * r / R), vr = (int32_t)((int64_t)V * (r + 1) / R) - v0;
        float *dx = kt_fill((size_t)T * vr, NAN);
        be.ops->logsoftmax_vp_backward(&be, dx, glp, gent, part[r], lse, mean, target, v0, T, vr);
        for (int32_t t = 0; t < T; t++)
            for (int32_t i = 0; i < vr; i++) {
                double want = dx1[(size_t)t * V + v0 + i];
                e_dx = fmax(e_dx, fabs(dx[(size_t)t * vr + i] - want));
                big = fmax(big, fabs(want));
            }
        free(dx);
        free(part[r]);
    }
    CHECKF(e_dx <= 1e-5 * big + 1e-7, "vp T=%d V=%d R=%d: dlogits %.3g from logsoftmax_backward's", T, V, R, e_dx);
    free(part);
    free(stats);
    free(mean);
    free(x);
    free(glp);
    free(gent);
    free(target);
    free(xd);
    free(rl);
    free(lp1);
    free(ent1);
    free(lse1);
    free(dx1);
    free(lp);
    free(ent);
    free(lse);
    tr_backend_cpu_free(&be);
}

// Columns [v0, v0 + vr) of T rows of V values of dtype t, packed.
static void *columns(const void *x, tr_dt t, int32_t T, int32_t V, int32_t v0, int32_t vr) {
    size_t es = tr_dt_size(t);
    char *out = kt_malloc((size_t)T * vr * es);
    for (int32_t r = 0; r < T; r++)
        memcpy(out + (size_t)r * vr * es, (const char *)x + ((size_t)r * V + v0) * es, vr * es);
    return out;
}

static int same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

// Logits in the activation dtype A against the path the LM head took before they were read
// as they are: the convert op widening them to fp32, the fp32 backend's log-softmax, dlogits
// rounded once to A. Every result must be those bits, for the whole row and for a split of
// the columns over two ranks; and a backward written over its own logits (the LM head's one
// buffer) must equal the one written into another buffer.
static void check_act_logits(tr_dt A, int32_t T, int32_t V, double scale) {
    size_t n = (size_t)T * V, as = tr_dt_size(A);
    float *x = kt_rand(n, scale), *glp = kt_rand(T, 1.0), *gent = kt_rand(T, 1.0);
    void *xa = kt_to(x, n, A);
    int32_t *target = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) target[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * V) % V;
    if (T > 1) target[1] = -1;
    tr_backend ba, bf;
    kt_backend(&ba, 2, A);
    kt_backend(&bf, 2, TR_F32);
    float *xf = kt_floats(n);
    ba.ops->convert(&ba, xf, TR_F32, xa, A, n);

    float *f0 = kt_floats(3 * (size_t)T), *f1 = kt_floats(3 * (size_t)T);
    bf.ops->logsoftmax_forward(&bf, f0, f0 + T, f0 + 2 * T, xf, target, T, V);
    ba.ops->logsoftmax_forward(&ba, f1, f1 + T, f1 + 2 * T, xa, target, T, V);
    CHECKF(kt_same_bits(f1, f0, 3 * (size_t)T), "%s logits T=%d V=%d: forward differs from "
           "convert + fp32", tr_dt_name(A), T, V);
    const float *lse = f0 + 2 * T;
    float *d0 = kt_floats(n);
    void *want = kt_poison(n, A), *got = kt_poison(n, A), *inplace = kt_to(x, n, A);
    bf.ops->logsoftmax_backward(&bf, d0, glp, gent, xf, lse, target, T, V);
    ba.ops->convert(&ba, want, A, d0, TR_F32, n);
    ba.ops->logsoftmax_backward(&ba, got, glp, gent, xa, lse, target, T, V);
    ba.ops->logsoftmax_backward(&ba, inplace, glp, gent, inplace, lse, target, T, V);
    CHECKF(same_bytes(got, want, n * as), "%s logits T=%d V=%d: dlogits differ from fp32 "
           "rounded once", tr_dt_name(A), T, V);
    CHECKF(same_bytes(inplace, got, n * as), "%s logits T=%d V=%d: dlogits in place differ",
           tr_dt_name(A), T, V);

    // Two ranks: [0, v1) and [v1, V).
    int32_t v1 = V / 3, v0s[2] = {0, v1}, vrs[2] = {v1, V - v1};
    double *stats = kt_malloc(2 * (size_t)T * 4 * sizeof(double)), *mean = kt_malloc(T * sizeof(double));
    double *stats_f = kt_malloc((size_t)T * 4 * sizeof(double));
    for (int32_t r = 0; r < 2; r++) {
        void *pa = columns(xa, A, T, V, v0s[r], vrs[r]);
        float *pf = columns(xf, TR_F32, T, V, v0s[r], vrs[r]);
        ba.ops->logsoftmax_vp_stats(&ba, stats + (size_t)r * T * 4, pa, target, v0s[r], T, vrs[r]);
        bf.ops->logsoftmax_vp_stats(&bf, stats_f, pf, target, v0s[r], T, vrs[r]);
        CHECKF(same_bytes(stats + (size_t)r * T * 4, stats_f, (size_t)T * 4 * sizeof(double)),
               "%s logits T=%d V=%d: rank %d's statistics differ from fp32", tr_dt_name(A), T, V, r);
        free(pa);
        free(pf);
    }
    ba.ops->logsoftmax_vp_combine(&ba, f1, f1 + T, f1 + 2 * T, mean, stats, target, 2, T);
    for (int32_t r = 0; r < 2; r++) {
        size_t nr = (size_t)T * vrs[r];
        void *pa = columns(xa, A, T, V, v0s[r], vrs[r]), *pin = columns(xa, A, T, V, v0s[r], vrs[r]);
        float *pf = columns(xf, TR_F32, T, V, v0s[r], vrs[r]), *df = kt_floats(nr);
        void *dw = kt_poison(nr, A), *dg = kt_poison(nr, A);
        bf.ops->logsoftmax_vp_backward(&bf, df, glp, gent, pf, f1 + 2 * T, mean, target, v0s[r], T, vrs[r]);
        ba.ops->convert(&ba, dw, A, df, TR_F32, nr);
        ba.ops->logsoftmax_vp_backward(&ba, dg, glp, gent, pa, f1 + 2 * T, mean, target, v0s[r], T, vrs[r]);
        ba.ops->logsoftmax_vp_backward(&ba, pin, glp, gent, pin, f1 + 2 * T, mean, target, v0s[r], T, vrs[r]);
        CHECKF(same_bytes(dg, dw, nr * as) && same_bytes(pin, dg, nr * as), "%s logits T=%d "
               "V=%d: rank %d's dlogits differ from fp32 rounded once or in place", tr_dt_name(A),
               T, V, r);
        free(pa); free(pin); free(pf); free(df); free(dw); free(dg);
    }
    tr_backend_cpu_free(&ba);
    tr_backend_cpu_free(&bf);
    free(x); free(glp); free(gent); free(xa); free(target); free(xf); free(f0); free(f1);
    free(d0); free(want); free(got); free(inplace); free(stats); free(mean); free(stats_f);
}

int main(void) {
    kt_seed(7);
    for (int i = 0; i < 2; i++) {
        tr_dt A = i == 0 ? TR_F32 : TR_BF16;
        check_act_logits(A, 6, 37, 3.0);
        check_act_logits(A, 5, 50000, 8.0);
        check_act_logits(A, 700, 100, 2.0);
    }
    for (int32_t R = 1; R <= 4; R++) {
        check_vp(6, 37, R, 3.0);
        check_vp(4, 11, R, 40.0);
        check_vp(3, 5000, R, 5.0);
    }
    check_case(1, 37, 3.0);
    check_case(6, 37, 3.0);
    check_case(4, 11, 40.0);      // peaked rows: exp underflows for most entries
    check_case(5, 50000, 5.0);    // one row per task, vocabulary-sized rows
    check_case(700, 100, 2.0);    // many rows per task, several tasks
    return tr_test_summary("test_logsoftmax");
}
