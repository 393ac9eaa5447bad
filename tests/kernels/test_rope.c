// rope_forward/backward against a float64 reference of HF's rotate_half RoPE (angle = the
// fp32 product pos * inv_freq, as transformers computes it, then cos/sin in float64), the
// backward against central differences, and bitwise equal results for 1, 2 and 3 threads;
// rows of stride ld > H*D (q or k inside a fused qkv row) rotated as the contiguous rows and
// nothing between them touched; the bf16 mode is the fp32 rotation of the bf16 values
// rounded once, bit for bit.
#include "tests/kernels/kernels_test.h"

typedef struct rope_ref {
    double *x;
    const double *dout;
    const int32_t *pos;
    const float *inv_freq;
    int32_t T, H, D;
} rope_ref;

static void rope_forward_ref(double *out, const double *x, const int32_t *pos,
                             const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    int32_t half = D / 2;
    for (int32_t t = 0; t < T; t++)
        for (int32_t h = 0; h < H; h++)
            for (int32_t i = 0; i < half; i++) {
                double a = (double)((float)pos[t] * inv_freq[i]);
                size_t o = ((size_t)t * H + h) * D;
                double x1 = x[o + i], x2 = x[o + i + half];
                out[o + i] = x1 * cos(a) - x2 * sin(a);
                out[o + i + half] = x2 * cos(a) + x1 * sin(a);
            }
}

static double rope_loss(void *arg) {
    rope_ref *r = arg;
    size_t n = (size_t)r->T * r->H * r->D;
    double *out = kt_malloc(n * sizeof(double));
    rope_forward_ref(out, r->x, r->pos, r->inv_freq, r->T, r->H, r->D);
    double L = 0;
    for (size_t i = 0; i < n; i++) L += r->dout[i] * out[i];
    free(out);
    return L;
}

static void check_case(int32_t T, int32_t H, int32_t D, double theta, int32_t max_pos,
                       size_t fd_checks) {
    size_t n = (size_t)T * H * D;
    float *inv_freq = kt_floats(D / 2);
    for (int32_t i = 0; i < D / 2; i++)
        inv_freq[i] = (float)(1.0 / pow(theta, (2.0 * i) / D));
    int32_t *pos = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) pos[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * max_pos);
    pos[0] = 0;
    float *x = kt_rand(n, 1.0), *dout = kt_rand(n, 1.0);
    double *xd = kt_to_double(x, n), *dd = kt_to_double(dout, n);
    double *ref = kt_malloc(n * sizeof(double));
    rope_forward_ref(ref, xd, pos, inv_freq, T, H, D);

    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    float *y = kt_copy(x, n);
    be.ops->rope_forward(&be, y, H * D, pos, inv_freq, T, H, D);
    double e = kt_rel_err_d(y, ref, n);
    CHECKF(e < 1e-6, "forward T=%d H=%d D=%d: %.3g", T, H, D, e);
    CHECK(memcmp(y, x, D * sizeof(float)) == 0);   // position 0 (token 0) is the identity

    float *dx = kt_copy(dout, n);
    be.ops->rope_backward(&be, dx, H * D, pos, inv_freq, T, H, D);
    rope_ref r = {.x = xd, .dout = dd, .pos = pos, .inv_freq = inv_freq, .T = T, .H = H, .D = D};
    e = kt_fd_rel_err(xd, n, dx, rope_loss, &r, fd_checks);
    CHECKF(e < 1e-5, "backward vs finite differences T=%d H=%d D=%d: %.3g", T, H, D, e);
    tr_backend_cpu_free(&be);

    for (int32_t k = 1; k <= 3; k++) {
        float *y2 = kt_copy(x, n), *dx2 = kt_copy(dout, n);
        kt_backend(&be, k, TR_F32);
        be.ops->rope_forward(&be, y2, H * D, pos, inv_freq, T, H, D);
        be.ops->rope_backward(&be, dx2, H * D, pos, inv_freq, T, H, D);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(y2, y, n) && kt_same_bits(dx2, dx, n), "bits differ, %d threads", k);
        free(y2);
        free(dx2);
    }

    // strided rows: the H*D values of row t at t*ld, other values of the row left alone
    int32_t ld = H * D + 7;
    float *xs = kt_rand((size_t)T * ld, 1.0), *gs = kt_copy(xs, (size_t)T * ld);
    float *ref_s = kt_copy(xs, (size_t)T * ld), *ref_g = kt_copy(xs, (size_t)T * ld);
    for (int32_t t = 0; t < T; t++) {
        memcpy(xs + (size_t)t * ld, x + (size_t)t * H * D, (size_t)H * D * sizeof(float));
        memcpy(gs + (size_t)t * ld, dout + (size_t)t * H * D, (size_t)H * D * sizeof(float));
        memcpy(ref_s + (size_t)t * ld, y + (size_t)t * H * D, (size_t)H * D * sizeof(float));
        memcpy(ref_g + (size_t)t * ld, dx + (size_t)t * H * D, (size_t)H * D * sizeof(float));
    }
    kt_backend(&be, 2, TR_F32);
    be.ops->rope_forward(&be, xs, ld, pos, inv_freq, T, H, D);
    be.ops->rope_backward(&be, gs, ld, pos, inv_freq, T, H, D);
    tr_backend_cpu_free(&be);
    CHECKF(kt_same_bits(xs, ref_s, (size_t)T * ld) && kt_same_bits(gs, ref_g, (size_t)T * ld),
           "strided rows (ld %d) differ from contiguous ones T=%d H=%d D=%d", ld, T, H, D);
    free(xs); free(gs); free(ref_s); free(ref_g);

    // bf16: the fp32 op on the rounded values, each result rounded once (both directions)
    float *xr = kt_round_all(kt_copy(x, n), n), *gr = kt_round_all(kt_copy(dout, n), n);
    uint16_t *x16 = kt_to(xr, n, TR_BF16), *g16 = kt_to(gr, n, TR_BF16);
    kt_backend(&be, 2, TR_F32);
    be.ops->rope_forward(&be, xr, H * D, pos, inv_freq, T, H, D);
    be.ops->rope_backward(&be, gr, H * D, pos, inv_freq, T, H, D);
    tr_backend_cpu_free(&be);
    kt_backend(&be, 3, TR_BF16);
    be.ops->rope_forward(&be, x16, H * D, pos, inv_freq, T, H, D);
    be.ops->rope_backward(&be, g16, H * D, pos, inv_freq, T, H, D);
    tr_backend_cpu_free(&be);
    CHECKF(kt_is_rounded(x16, xr, n, "x") && kt_is_rounded(g16, gr, n, "dx"),
           "bf16 rope T=%d H=%d D=%d", T, H, D);
    free(xr); free(gr); free(x16); free(g16);
    free(inv_freq); free(pos); free(x); free(dout); free(xd); free(dd); free(ref); free(y);
    free(dx);
}

int main(void) {
    kt_seed(4);
    check_case(1, 1, 2, 10000.0, 1, 100000);
    check_case(7, 3, 8, 10000.0, 50, 100000);
    check_case(5, 2, 130, 500000.0, 4000, 100000);   // D/2 = 65 crosses the 64-frequency chunk
    check_case(300, 4, 32, 10000.0, 32768, 200); // several row tasks (run in parallel), long positions
    return tr_test_summary("test_rope");
}
