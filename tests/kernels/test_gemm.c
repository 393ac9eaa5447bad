// The CPU matrix product against its own definition, bit for bit: every element of C must be
// the k-ordered chain of fmaf calls this test computes one element at a time. That pins the
// promise behind zero-mismatch logprobs: each micro-kernel this machine can run (AVX-512,
// AVX2+FMA, plain C) gives those bits for every stride pattern the backend uses, for any
// number of rows in the call, any split of K into accumulating calls, and any thread count.
#include <math.h>

#include "kernels/cpu/gemm.h"
#include "tests/kernels/kernels_test.h"

typedef struct shape {
    int32_t M, N, K;
    int mode;   // 0: A row-major, B = W^T (forward); 1: B row-major (din); 2: A^T (dW)
} shape;

static tr_gemm make(const shape *s, const float *a, const float *b, float *c, const float *bias,
                    bool acc) {
    tr_gemm g = {.M = s->M, .N = s->N, .K = s->K, .a = a, .b = b, .c = c, .ldc = s->N,
                 .bias = bias, .accumulate = acc};
    g.a_rs = s->mode == 2 ? 1 : s->K;
    g.a_ks = s->mode == 2 ? s->M : 1;
    g.b_ks = s->mode == 0 ? 1 : s->N;
    g.b_cs = s->mode == 0 ? s->K : 1;
    return g;
}

// The definition: start, then fmaf over k in order, then + bias.
static float chain(const tr_gemm *g, int32_t i, int32_t j, float start) {
    float acc = start;
    for (int32_t k = 0; k < g->K; k++)
        acc = fmaf(g->a[i * g->a_rs + k * g->a_ks], g->b[k * g->b_ks + j * g->b_cs], acc);
    return g->bias ? acc + g->bias[j] : acc;
}

static int same_bits(const float *x, const float *y, size_t n) {
    return memcmp(x, y, n * sizeof(float)) == 0;
}

static void check_shape(const shape *s, tr_gemm_isa best) {
    size_t na = (size_t)s->M * s->K, nb = (size_t)s->K * s->N, nc = (size_t)s->M * s->N;
    float *a = kt_rand(na, 1.0), *b = kt_rand(nb, 1.0), *bias = kt_rand(s->N, 1.0);
    float *c0 = kt_rand(nc, 1.0);
    for (int use_bias = 0; use_bias < 2; use_bias++)
        for (int acc = 0; acc < 2; acc++) {
            float *want = kt_floats(nc);
            tr_gemm g = make(s, a, b, want, use_bias ? bias : NULL, acc);
            for (int32_t i = 0; i < s->M; i++)
                for (int32_t j = 0; j < s->N; j++)
                    want[(size_t)i * s->N + j] = chain(&g, i, j, acc ? c0[(size_t)i * s->N + j] : 0.0f);
            for (int isa = TR_GEMM_GENERIC; isa <= (int)best; isa++) {
                float *got = kt_copy(c0, nc);
                g.c = got;
                tr_gemm_serial((tr_gemm_isa)isa, &g);
                CHECKF(same_bits(got, want, nc), "%s M=%d N=%d K=%d mode=%d bias=%d acc=%d: "
                       "not the fmaf chain", tr_gemm_isa_name((tr_gemm_isa)isa), s->M, s->N,
                       s->K, s->mode, use_bias, acc);
                free(got);
            }
            free(want);
        }
    free(a), free(b), free(bias), free(c0);
}

// One row alone, or any slice of rows, gives the bits that row has in a bigger call; the
// threaded product equals the serial one for 1, 2 and 3 threads; K split over accumulating
// calls equals one call.
static void check_invariance(tr_gemm_isa best) {
    shape s = {.M = 77, .N = 300, .K = 333, .mode = 0};
    size_t nc = (size_t)s.M * s.N;
    float *a = kt_rand((size_t)s.M * s.K, 1.0), *b = kt_rand((size_t)s.K * s.N, 1.0);
    float *bias = kt_rand(s.N, 1.0), *full = kt_floats(nc);
    tr_gemm g = make(&s, a, b, full, bias, false);
    tr_gemm_serial(best, &g);
    int rows_ok = 1;
    for (int32_t i0 = 0; i0 < s.M; i0 += 13) {
        int32_t n = s.M - i0 < 5 ? s.M - i0 : 5;
        float *part = kt_floats((size_t)n * s.N);
        tr_gemm p = g;
        p.M = n;
        p.a = a + (size_t)i0 * s.K;
        p.c = part;
        tr_gemm_serial(best, &p);
        rows_ok &= same_bits(part, full + (size_t)i0 * s.N, (size_t)n * s.N);
        free(part);
    }
    CHECKF(rows_ok, "rows computed in smaller calls differ from the full call");
    for (int32_t threads = 1; threads <= 3; threads++) {
        tr_backend be;
        kt_backend(&be, threads);
        float *c = kt_floats(nc);
        tr_gemm t = g;
        t.c = c;
        tr_gemm_run(&be, &t);
        CHECKF(same_bits(c, full, nc), "%d threads differ from the serial product", threads);
        free(c);
        tr_backend_cpu_free(&be);
    }
    // dW-style sum over tokens: K = 333 tokens in calls of 100, 7 and 226 tokens.
    shape w = {.M = 40, .N = 70, .K = 333, .mode = 2};
    float *dout = kt_rand((size_t)w.K * w.M, 1.0), *in = kt_rand((size_t)w.K * w.N, 1.0);
    float *dw0 = kt_rand((size_t)w.M * w.N, 1.0);
    float *one = kt_copy(dw0, (size_t)w.M * w.N), *split = kt_copy(dw0, (size_t)w.M * w.N);
    tr_gemm d = make(&w, dout, in, one, NULL, true);
    tr_gemm_serial(best, &d);
    const int32_t cuts[] = {0, 100, 107, 333};
    for (int c = 0; c < 3; c++) {
        tr_gemm q = d;
        q.K = cuts[c + 1] - cuts[c];
        q.a = dout + (size_t)cuts[c] * w.M;
        q.b = in + (size_t)cuts[c] * w.N;
        q.c = split;
        tr_gemm_serial(best, &q);
    }
    CHECKF(same_bits(one, split, (size_t)w.M * w.N), "a sum over tokens split into calls "
           "differs from one call");
    free(a), free(b), free(bias), free(full), free(dout), free(in), free(dw0), free(one);
    free(split);
}

int main(void) {
    tr_gemm_isa best = tr_gemm_isa_detect();
    printf("widest micro-kernel here: %s\n", tr_gemm_isa_name(best));
    kt_seed(7);
    // Edges of every micro-kernel tile (MR 4/6/12, NR 8/16/32), K blocks (128/256), M = 1.
    const shape shapes[] = {
        {1, 1, 1, 0},     {1, 37, 256, 0},  {1, 512, 257, 0}, {5, 7, 3, 1},
        {6, 16, 129, 0},  {7, 17, 300, 1},  {12, 32, 128, 2}, {13, 33, 513, 0},
        {25, 65, 64, 2},  {64, 64, 64, 1},  {200, 40, 19, 2}, {3, 100, 0, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(&shapes[i], best);
    check_invariance(best);
    return tr_test_summary("test_gemm");
}
