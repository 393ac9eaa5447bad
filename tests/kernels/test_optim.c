// Optimizer-step ops: AdamW against its formula written out in float64 for 3 steps (bias
// correction, decoupled weight decay), and bit for bit against the per-tensor fp32 kernel it
// replaces (written out below) when unclipped, and when clipped on that kernel given
// g' = c g; the clip factor from the sum of squares in backend memory, max_norm <= 0 and a
// norm under max_norm leaving g alone; a non-finite sum of squares writing nothing; segments
// with their own weight decay, boundaries inside a task; the working copy (fp32 or bf16,
// rounded once); bitwise equal results for 1, 2 and 3 threads and for either backend
// precision. sumsq against a float64 sum (including a buffer large enough to switch to the
// grown block size) and adding into what its accumulator holds.
#include "tests/kernels/kernels_test.h"

// The per-tensor fp32 AdamW kernel as it was before the fused op: the bits the fused op keeps.
static void adamw_old(float *p, const float *g, float *m, float *v, size_t n, float lr,
                      float b1, float b2, float eps, float wd, int32_t t) {
    float bc1 = (float)(1.0 - pow((double)b1, (double)t));
    float bc2 = (float)(1.0 - pow((double)b2, (double)t));
    float c1 = 1.0f - b1, c2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + c1 * gi;
        float vi = b2 * v[i] + c2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        float mh = mi / bc1, vh = vi / bc2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

typedef struct opt_state {
    float *p, *m, *v;
    size_t n;
} opt_state;

static opt_state state_new(size_t n) {
    opt_state s = {.p = kt_rand(n, 1.0), .m = kt_rand(n, 0.1), .v = kt_rand(n, 0.01), .n = n};
    for (size_t i = 0; i < n; i++) s.v[i] = fabsf(s.v[i]);
    return s;
}

static opt_state state_copy(const opt_state *s) {
    return (opt_state){.p = kt_copy(s->p, s->n), .m = kt_copy(s->m, s->n),
                       .v = kt_copy(s->v, s->n), .n = s->n};
}

static int state_same(const opt_state *a, const opt_state *b) {
    return kt_same_bits(a->p, b->p, a->n) && kt_same_bits(a->m, b->m, a->n) &&
           kt_same_bits(a->v, b->v, a->n);
}

static void state_free(opt_state *s) {
    free(s->p), free(s->m), free(s->v);
}

// One fused step on s with the given segments, clip and working copy.
static void step(tr_backend *be, opt_state *s, const float *g, const tr_adamw_seg *segs,
                 int32_t n_segs, double sumsq, float max_norm, void *work, tr_dt wt,
                 int32_t t) {
    tr_adamw_args a = {.p = s->p, .work = work, .g = g, .m = s->m, .v = s->v, .n = s->n,
                       .segs = segs, .n_segs = n_segs, .sumsq = &sumsq, .max_norm = max_norm,
                       .lr = 1e-2f, .b1 = 0.9f, .b2 = 0.99f, .eps = 1e-8f, .t = t, .wt = wt};
    be->ops->adamw(be, &a);
}

static void check_adamw(size_t n) {
    const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8, wd = 0.1;
    float *p = kt_rand(n, 1.0), *m = kt_fill(n, 0), *v = kt_fill(n, 0);
    double *pd = kt_to_double(p, n), *md = kt_malloc(n * sizeof(double));
    double *vd = kt_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) md[i] = vd[i] = 0;
    tr_adamw_seg seg = {.begin = 0, .end = n, .wd = (float)wd};
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    for (int32_t t = 1; t <= 3; t++) {
        float *g = kt_rand(n, t == 2 ? 1e-3 : 1.0);   // a step of tiny gradients: eps matters less than v
        opt_state s = {.p = p, .m = m, .v = v, .n = n};
        step(&be, &s, g, &seg, 1, 1.0, 0.0f, NULL, TR_F32, t);
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

// The fused op against the old kernel: unclipped, clipped, segments, work copies, skips.
static void check_fused(size_t n, int32_t threads) {
    float *g = kt_rand(n, 1.0);
    opt_state s0 = state_new(n);
    tr_backend be;
    kt_backend(&be, threads, TR_F32);
    tr_adamw_seg one = {.begin = 0, .end = n, .wd = 0.05f};

    // unclipped (max_norm 0; and a max_norm above the norm): the old kernel's bits
    for (int k = 0; k < 2; k++) {
        opt_state got = state_copy(&s0), want = state_copy(&s0);
        double ss = 4.0;   // norm 2
        step(&be, &got, g, &one, 1, ss, k == 0 ? 0.0f : 2.5f, NULL, TR_F32, 3);
        adamw_old(want.p, g, want.m, want.v, n, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.05f, 3);
        CHECKF(state_same(&got, &want), "unclipped adamw (max_norm %s) differs from the old "
               "kernel, n=%zu", k == 0 ? "0" : "2.5", n);
        state_free(&got), state_free(&want);
    }

    // clipped: c = max_norm / (norm + 1e-6) in double, g' = (float)c * g rounded to fp32
    {
        double ss = 0.0;
        for (size_t i = 0; i < n; i++) ss += (double)g[i] * g[i];
        float max_norm = (float)(0.3 * sqrt(ss));
        float c = (float)((double)max_norm / (sqrt(ss) + 1e-6));
        float *gc = kt_floats(n);
        for (size_t i = 0; i < n; i++) gc[i] = g[i] * c;
        opt_state got = state_copy(&s0), want = state_copy(&s0);
        step(&be, &got, g, &one, 1, ss, max_norm, NULL, TR_F32, 2);
        adamw_old(want.p, gc, want.m, want.v, n, 1e-2f, 0.9f, 0.99f, 1e-8f, 0.05f, 2);
        CHECKF(state_same(&got, &want), "clipped adamw is not the old kernel on c g, n=%zu", n);
        state_free(&got), state_free(&want);
        free(gc);
    }

    // a non-finite sum of squares: nothing written, working copy included
    static const double bad[] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        opt_state got = state_copy(&s0);
        uint16_t *work = kt_poison(n, TR_BF16), *work0 = kt_poison(n, TR_BF16);
        step(&be, &got, g, &one, 1, bad[k], 1.0f, work, TR_BF16, 1);
        CHECKF(state_same(&got, &s0) && memcmp(work, work0, n * 2) == 0,
               "adamw wrote with sumsq %g, n=%zu", bad[k], n);
        state_free(&got);
        free(work), free(work0);
    }

    // segments with their own decay (boundaries inside tasks, one empty), each the old kernel
    // over its span; the working copies p exactly (fp32) or rounded once (bf16)
    {
        size_t cut1 = n / 3 + 5, cut2 = n - n / 4;
        tr_adamw_seg segs[4] = {{0, cut1, 0.0f, 0}, {cut1, cut1, 0.3f, 0},
                                {cut1, cut2, 0.1f, 0}, {cut2, n, 0.0f, 0}};
        opt_state want = state_copy(&s0);
        for (int k = 0; k < 4; k++) {
            size_t b = segs[k].begin, e = segs[k].end;
            adamw_old(want.p + b, g + b, want.m + b, want.v + b, e - b, 1e-2f, 0.9f, 0.99f,
                      1e-8f, segs[k].wd, 5);
        }
        for (int w = 0; w < 2; w++) {
            tr_dt wt = w ? TR_BF16 : TR_F32;
            opt_state got = state_copy(&s0);
            void *work = kt_poison(n, wt);
            step(&be, &got, g, segs, 4, 9.0, 0.0f, work, wt, 5);
            CHECKF(state_same(&got, &want), "segmented adamw differs from the old kernel per "
                   "segment, n=%zu", n);
            CHECKF(wt == TR_F32 ? kt_same_bits(work, want.p, n)
                                : kt_is_rounded(work, want.p, n, "work"),
                   "%s working copy is not p, n=%zu", tr_dt_name(wt), n);
            state_free(&got);
            free(work);
        }
        state_free(&want);
    }
    tr_backend_cpu_free(&be);
    state_free(&s0);
    free(g);
}

// 1, 2 and 3 threads, and fp32 or bf16 backends: the same bits.
static void check_threads(size_t n) {
    float *g = kt_rand(n, 1.0);
    opt_state s0 = state_new(n);
    tr_adamw_seg segs[2] = {{0, n / 2 + 3, 0.1f, 0}, {n / 2 + 3, n, 0.0f, 0}};
    opt_state res[4];
    uint16_t *work[4];
    double ss[4];
    for (int32_t k = 0; k < 4; k++) {
        tr_backend be;
        kt_backend(&be, k < 3 ? k + 1 : 2, k < 3 ? TR_F32 : TR_BF16);
        res[k] = state_copy(&s0);
        work[k] = kt_poison(n, TR_BF16);
        ss[k] = 0.0;
        be.ops->sumsq(&be, &ss[k], g, n);
        step(&be, &res[k], g, segs, 2, ss[k], 1.0f, work[k], TR_BF16, 1);
        tr_backend_cpu_free(&be);
    }
    for (int32_t k = 1; k < 4; k++) {
        CHECKF(state_same(&res[k], &res[0]) && memcmp(work[k], work[0], n * 2) == 0,
               "adamw bits differ (run %d)", k);
        CHECK(memcmp(&ss[k], &ss[0], sizeof(double)) == 0);
    }
    for (int32_t k = 0; k < 4; k++) state_free(&res[k]), free(work[k]);
    state_free(&s0);
    free(g);
}

static void check_sumsq(size_t n) {
    float *x = kt_rand(n, 2.0);
    long double acc = 0;   // 64-bit mantissa: a reference more exact than the double sum tested
    for (size_t i = 0; i < n; i++) acc += (long double)x[i] * x[i];
    double ref = (double)acc;
    tr_backend be;
    kt_backend(&be, 3, TR_F32);
    double s = 0.0, into = 0.75;
    be.ops->sumsq(&be, &s, x, n);
    CHECKF(fabs(s - ref) <= 1e-12 * fmax(ref, 1e-300), "sumsq n=%zu: %.17g vs %.17g", n, s, ref);
    be.ops->sumsq(&be, &into, x, n);   // adds to what it holds: one rounding of 0.75 + s
    CHECKF(into == 0.75 + s, "sumsq n=%zu into 0.75: %.17g, want %.17g", n, into, 0.75 + s);
    tr_backend_cpu_free(&be);
    free(x);
}

int main(void) {
    kt_seed(8);
    check_adamw(37);
    check_adamw(50001);
    check_fused(37, 1);
    check_fused(16384 * 3 + 11, 2);   // several tasks; segment edges inside them
    check_sumsq(0);
    check_sumsq(1);
    check_sumsq(16384 * 3 + 7);
    check_sumsq((size_t)16384 * 1024 + 4099);   // past 1024 blocks: block size grows
    check_threads(16384 * 5 + 3);
    return tr_test_summary("test_optim");
}
