// The CPU matrix product against its own definition, bit for bit: every element of C must be
// the k-ordered chain of fmaf calls this test computes one element at a time. That pins the
// promise behind zero-mismatch logprobs: each micro-kernel this machine can run (AVX-512,
// AVX2+FMA, plain C) gives those bits for every stride pattern the backend uses, for any
// number of rows in the call, any split of K into accumulating calls, and any thread count.
// In every dtype mix: bf16 A, B and bias are widened exactly, so the chain is the fp32 one on
// their values; a bf16 C is that chain's result rounded once; an adding C is C + result.
#include <math.h>

#include "kernels/cpu/gemm.h"
#include "tests/kernels/kernels_test.h"

typedef struct shape {
    int32_t M, N, K;
    int mode;   // 0: A row-major, B = W^T (forward); 1: B row-major (din); 2: A^T (dW)
} shape;

// How C is produced: written fp32, fp32 chain continuing from C, fp32 C + result, bf16.
enum { OUT_F32, OUT_ACC, OUT_ADD, OUT_BF16, N_OUT };
static const char *out_name[] = {"f32", "acc", "add", "bf16"};

static tr_gemm make(const shape *s, const void *a, tr_dt at, const void *b, tr_dt bt,
                    void *c, const void *bias, int out) {
    tr_gemm g = {.M = s->M, .N = s->N, .K = s->K, .a = a, .a_t = at, .b = b, .b_t = bt, .c = c,
                 .ldc = s->N, .c_t = out == OUT_BF16 ? TR_BF16 : TR_F32, .bias = bias,
                 .bias_t = bt, .accumulate = out == OUT_ACC, .add = out == OUT_ADD};
    g.a_rs = s->mode == 2 ? 1 : s->K;
    g.a_ks = s->mode == 2 ? s->M : 1;
    g.b_ks = s->mode == 0 ? 1 : s->N;
    g.b_cs = s->mode == 0 ? s->K : 1;
    return g;
}

static float elem(const void *p, ptrdiff_t i, tr_dt t) {
    return t == TR_BF16 ? kt_bf16_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// The definition: start, then fmaf over k in order, then + bias.
static float chain(const tr_gemm *g, int32_t i, int32_t j, float start) {
    float acc = start;
    for (int32_t k = 0; k < g->K; k++)
        acc = fmaf(elem(g->a, i * g->a_rs + k * g->a_ks, g->a_t),
                   elem(g->b, k * g->b_ks + j * g->b_cs, g->b_t), acc);
    return g->bias ? acc + elem(g->bias, j, g->bias_t) : acc;
}

static size_t c_bytes(int out, size_t n) { return n * (out == OUT_BF16 ? 2 : 4); }

// The expected C (as bytes of its dtype) from the start values c0 (fp32, or bf16 for OUT_BF16,
// where they must not matter).
static void *expect(const tr_gemm *g, int out, const float *c0) {
    size_t n = (size_t)g->M * g->N;
    float *want = kt_floats(n);
    for (int32_t i = 0; i < g->M; i++)
        for (int32_t j = 0; j < g->N; j++) {
            size_t at = (size_t)i * g->N + j;
            want[at] = out == OUT_ACC ? chain(g, i, j, c0[at])
                       : out == OUT_ADD ? c0[at] + chain(g, i, j, 0.0f) : chain(g, i, j, 0.0f);
        }
    if (out != OUT_BF16) return want;
    void *w16 = kt_to(want, n, TR_BF16);
    free(want);
    return w16;
}

static void check_shape(const shape *s, tr_gemm_isa best) {
    size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
    float *a = kt_rand(na, 1.0), *b = kt_rand(nb, 1.0), *bias = kt_rand(s->N, 1.0);
    float *c0 = kt_rand(nc, 1.0);
    for (int dt = 0; dt < 4; dt++) {
        tr_dt at = dt & 1 ? TR_BF16 : TR_F32, bt = dt & 2 ? TR_BF16 : TR_F32;
        void *a_t = kt_to(a, na, at), *b_t = kt_to(b, nb, bt), *bias_t = kt_to(bias, s->N, bt);
        for (int use_bias = 0; use_bias < 2; use_bias++)
            for (int out = 0; out < N_OUT; out++) {
                tr_gemm g = make(s, a_t, at, b_t, bt, NULL, use_bias ? bias_t : NULL, out);
                void *want = expect(&g, out, c0);
                // a bf16 C starts as NaNs: its old contents must play no part
                void *start = out == OUT_BF16 ? kt_poison(nc, TR_BF16) : kt_copy(c0, nc);
                for (int isa = TR_GEMM_GENERIC; isa <= (int)best; isa++) {
                    void *got = kt_malloc(c_bytes(out, nc));
                    memcpy(got, start, c_bytes(out, nc));
                    g.c = got;
                    tr_gemm_serial((tr_gemm_isa)isa, &g);
                    CHECKF(memcmp(got, want, c_bytes(out, nc)) == 0,
                           "%s M=%d N=%d K=%d mode=%d A %s B %s bias=%d out=%s: not the fmaf "
                           "chain", tr_gemm_isa_name((tr_gemm_isa)isa), s->M, s->N, s->K,
                           s->mode, tr_dt_name(at), tr_dt_name(bt), use_bias,
                           out_name[out]);
                    free(got);
                }
                free(want);
                free(start);
            }
        free(a_t), free(b_t), free(bias_t);
    }
    free(a), free(b), free(bias), free(c0);
}

// One row alone, or any slice of rows, gives the bits that row has in a bigger call; the
// threaded product equals the serial one for 1, 2 and 3 threads; K split over accumulating
// calls equals one call. In fp32 and with bf16 inputs and output.
static void check_invariance(tr_gemm_isa best, tr_dt t) {
    shape s = {.M = 77, .N = 300, .K = 333, .mode = 0};
    size_t nc = (size_t)s.M * s.N, es = tr_dt_size(t), na = (size_t)s.M * s.K;
    float *af = kt_rand(na, 1.0), *bf = kt_rand((size_t)s.K * s.N, 1.0);
    float *biasf = kt_rand(s.N, 1.0);
    void *a = kt_to(af, na, t), *b = kt_to(bf, (size_t)s.K * s.N, t), *bias = kt_to(biasf, s.N, t);
    void *full = kt_malloc(nc * es);
    int out = t == TR_BF16 ? OUT_BF16 : OUT_F32;
    tr_gemm g = make(&s, a, t, b, t, full, bias, out);
    tr_gemm_serial(best, &g);
    int rows_ok = 1;
    for (int32_t i0 = 0; i0 < s.M; i0 += 13) {
        int32_t n = s.M - i0 < 5 ? s.M - i0 : 5;
        void *part = kt_malloc((size_t)n * s.N * es);
        tr_gemm p = g;
        p.M = n;
        p.a = (const char *)a + (size_t)i0 * s.K * es;
        p.c = part;
        tr_gemm_serial(best, &p);
        rows_ok &= memcmp(part, (char *)full + (size_t)i0 * s.N * es, (size_t)n * s.N * es) == 0;
        free(part);
    }
    CHECKF(rows_ok, "%s: rows computed in smaller calls differ from the full call",
           tr_dt_name(t));
    for (int32_t threads = 1; threads <= 3; threads++) {
        tr_backend be;
        kt_backend(&be, threads, t);
        void *c = kt_malloc(nc * es);
        tr_gemm r = g;
        r.c = c;
        tr_gemm_run(&be, &r);
        CHECKF(memcmp(c, full, nc * es) == 0, "%s: %d threads differ from the serial product",
               tr_dt_name(t), threads);
        free(c);
        tr_backend_cpu_free(&be);
    }
    // dW-style sum over tokens: K = 333 tokens in calls of 100, 7 and 226 tokens.
    shape w = {.M = 40, .N = 70, .K = 333, .mode = 2};
    float *doutf = kt_rand((size_t)w.K * w.M, 1.0), *inf = kt_rand((size_t)w.K * w.N, 1.0);
    void *dout = kt_to(doutf, (size_t)w.K * w.M, t), *in = kt_to(inf, (size_t)w.K * w.N, t);
    float *dw0 = kt_rand((size_t)w.M * w.N, 1.0);
    float *one = kt_copy(dw0, (size_t)w.M * w.N), *split = kt_copy(dw0, (size_t)w.M * w.N);
    tr_gemm d = make(&w, dout, t, in, t, one, NULL, OUT_ACC);
    tr_gemm_serial(best, &d);
    const int32_t cuts[] = {0, 100, 107, 333};
    for (int c = 0; c < 3; c++) {
        tr_gemm q = d;
        q.K = cuts[c + 1] - cuts[c];
        q.a = (const char *)dout + (size_t)cuts[c] * w.M * es;
        q.b = (const char *)in + (size_t)cuts[c] * w.N * es;
        q.c = split;
        tr_gemm_serial(best, &q);
    }
    CHECKF(kt_same_bits(one, split, (size_t)w.M * w.N), "%s: a sum over tokens split into "
           "calls differs from one call", tr_dt_name(t));
    free(af), free(bf), free(biasf), free(a), free(b), free(bias), free(full), free(doutf);
    free(inf), free(dout), free(in), free(dw0), free(one), free(split);
}

int main(void) {
    tr_gemm_isa best = tr_gemm_isa_detect();
    printf("widest micro-kernel here: %s\n", tr_gemm_isa_name(best));
    kt_seed(7);
    // Edges of every micro-kernel tile (MR 4/6/12, NR 8/16/32), K blocks (128/256), M = 1,
    // and a bf16 or added C wider than one 128-column pass.
    const shape shapes[] = {
        {1, 1, 1, 0},     {1, 37, 256, 0},  {1, 512, 257, 0}, {5, 7, 3, 1},
        {6, 16, 129, 0},  {7, 17, 300, 1},  {12, 32, 128, 2}, {13, 33, 513, 0},
        {25, 65, 64, 2},  {64, 64, 64, 1},  {200, 40, 19, 2}, {3, 100, 0, 0},
        {30, 300, 40, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], best);
    check_invariance(best, TR_F32);
    check_invariance(best, TR_BF16);
    return tr_test_summary("test_gemm");
}
