// Helpers shared by the kernel tests: seeded random inputs, float64 copies of float buffers,
// CPU backends with a chosen thread count and precision, bf16 buffers and a bf16 rounding
// reference, and central finite differences of a float64 reference loss, the external
// reference every backward is checked against.
#pragma once
#include <stdint.h>

#include "kernels/ops.h"
#include "tests/test.h"

static uint64_t kt_rng_state = 0x9e3779b97f4a7c15ull;

static inline void kt_seed(uint64_t s) { kt_rng_state = s * 0x9e3779b97f4a7c15ull + 1; }

// splitmix64 -> uniform in [-1, 1)
static inline double kt_uniform(void) {
    uint64_t z = (kt_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static inline void *kt_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static inline float *kt_floats(size_t n) { return kt_malloc(n * sizeof(float)); }

static inline float *kt_rand(size_t n, double scale) {
    float *x = kt_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(scale * kt_uniform());
    return x;
}

static inline float *kt_copy(const float *x, size_t n) {
    float *y = kt_floats(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline float *kt_fill(size_t n, float value) {
    float *x = kt_floats(n);
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

static inline double *kt_to_double(const float *x, size_t n) {
    double *y = kt_malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

// The op tests hand ops host arrays on purpose (they test arithmetic, not where memory
// lives), so guarded mode, which is for the code above kernels/, is turned off for them.
static inline void kt_backend(tr_backend *be, int32_t n_threads, tr_dt precision) {
    unsetenv("TROUPE_CPU_GUARD");
    if (tr_backend_cpu_init(be, n_threads, precision) != 0) {
        fprintf(stderr, "tr_backend_cpu_init(%d, %s) failed\n", n_threads,
                tr_dt_name(precision));
        exit(1);
    }
}

// The CPU backend as the environment sets it up (TROUPE_CPU_GUARD=1: guarded memory), for
// tests whose buffers are all backend memory.
static inline void kt_backend_dev(tr_backend *be, int32_t n_threads, tr_dt precision) {
    if (tr_backend_cpu_init(be, n_threads, precision) != 0) {
        fprintf(stderr, "tr_backend_cpu_init(%d, %s) failed\n", n_threads,
                tr_dt_name(precision));
        exit(1);
    }
}

// ---- bf16: the bf16 mode's results are checked against the fp32 op run on the same
// (bf16-valued) inputs, each output rounded once with this reference ----

static inline float kt_f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t kt_bits_of_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kt_bf16_f32(uint16_t h) { return kt_f32_of_bits((uint32_t)h << 16); }

// The bf16 nearest to x, ties to the even pattern, found by comparing x's distance to the two
// bf16 neighbours in double (exact: both differences fit in 53 bits). The neighbour above the
// largest finite bf16 is taken at 2^128, where IEEE rounding overflows to inf. A NaN keeps
// its sign and top payload bits, plus the quiet bit when those are all zero.
static inline uint16_t kt_bf16(float x) {
    uint32_t u = kt_bits_of_f32(x);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (x != x) return (lo & 0x7fu) ? lo : (uint16_t)(lo | 0x40u);
    if ((u & 0xffffu) == 0) return lo;
    double ax = fabs((double)x), vlo = fabs((double)kt_bf16_f32(lo));
    double vhi = (hi & 0x7fffu) == 0x7f80u ? ldexp(1.0, 128) : fabs((double)kt_bf16_f32(hi));
    double dlo = ax - vlo, dhi = vhi - ax;
    if (dlo < dhi) return lo;
    if (dhi < dlo) return hi;
    return (lo & 1u) ? hi : lo;
}

static inline float kt_round_bf16(float x) { return kt_bf16_f32(kt_bf16(x)); }

// x rounded to bf16 values in place: inputs that both precisions hold exactly.
static inline float *kt_round_all(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = kt_round_bf16(x[i]);
    return x;
}

// A buffer of dtype t (fp32 or bf16) holding x, rounded when bf16.
static inline void *kt_to(const float *x, size_t n, tr_dt t) {
    if (t == TR_F32) return kt_copy(x, n);
    uint16_t *h = kt_malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = kt_bf16(x[i]);
    return h;
}

// The fp32 values of a buffer of dtype t.
static inline float *kt_from(const void *x, size_t n, tr_dt t) {
    if (t == TR_F32) return kt_copy(x, n);
    float *f = kt_floats(n);
    for (size_t i = 0; i < n; i++) f[i] = kt_bf16_f32(((const uint16_t *)x)[i]);
    return f;
}

// n elements of dtype t, each a NaN: what a written output must not keep or read.
static inline void *kt_poison(size_t n, tr_dt t) {
    if (t == TR_F32) return kt_fill(n, NAN);
    uint16_t *h = kt_malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = 0x7fc1;
    return h;
}

// Whether got (bf16) holds want (fp32) rounded once, element by element; the first few
// mismatches are printed under `what`.
static inline int kt_is_rounded(const uint16_t *got, const float *want, size_t n,
                                const char *what) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != kt_bf16(want[i]) && bad++ < 3)
            fprintf(stderr, "%s[%zu]: bf16 0x%04x, want 0x%04x (fp32 %.9g)\n", what, i, got[i],
                    kt_bf16(want[i]), (double)want[i]);
    return bad == 0;
}

// Max relative error of float results against a float64 reference: max|a-b| / max|b|.
static inline double kt_rel_err_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return INFINITY;
        if (d > num) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

typedef double (*kt_loss_fn)(void *ctx);

// Compares grad[i] with the central difference (L(x+h) - L(x-h)) / 2h of the float64 loss,
// for every element of x or, when n > max_checks, for an evenly spread subset of them.
// Returns max|grad - fd| / max(max|fd|, floor) over the checked elements; floor gives the
// scale to measure against where the true gradient is zero. Step h: 1e-5 by default; larger
// where the gradients are tiny next to the loss, so that cancellation in L(x+h) - L(x-h)
// stays below the fp32 error being measured.
static inline double kt_fd_rel_err_ex(double *x, size_t n, const float *grad, kt_loss_fn loss,
                                      void *ctx, size_t max_checks, double floor, double h) {
    size_t step = n > max_checks ? n / max_checks : 1;
    double num = 0, den = 0;
    for (size_t i = (n > max_checks ? step / 2 : 0); i < n; i += step) {
        double x0 = x[i];
        x[i] = x0 + h;
        double lp = loss(ctx);
        x[i] = x0 - h;
        double lm = loss(ctx);
        x[i] = x0;
        double fd = (lp - lm) / (2 * h);
        double d = fabs((double)grad[i] - fd);
        if (d != d) return INFINITY;
        if (d > num) num = d;
        if (fabs(fd) > den) den = fabs(fd);
    }
    return num / (den > floor ? den : floor);
}

static inline double kt_fd_rel_err(double *x, size_t n, const float *grad, kt_loss_fn loss,
                                   void *ctx, size_t max_checks) {
    return kt_fd_rel_err_ex(x, n, grad, loss, ctx, max_checks, 1e-30, 1e-5);
}

// a == pre + delta elementwise, up to fp32 rounding of the sum: the "+=" contract.
static inline double kt_accum_err(const float *acc, const float *pre, const float *delta,
                                  size_t n) {
    double m = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double want = (double)pre[i] + delta[i];
        double d = fabs(acc[i] - want);
        if (d != d) return INFINITY;
        if (d > m) m = d;
        if (fabs(want) > den) den = fabs(want);
    }
    return m / (den > 1e-30 ? den : 1e-30);
}

static inline int kt_same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}
