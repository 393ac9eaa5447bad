// Helpers shared by the kernel tests: seeded random inputs, float64 copies of float buffers,
// CPU backends with a chosen thread count, and central finite differences of a float64
// reference loss, the external reference every backward is checked against.
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
static inline void kt_backend(tr_backend *be, int32_t n_threads) {
    unsetenv("TROUPE_CPU_GUARD");
    if (tr_backend_cpu_init(be, n_threads) != 0) {
        fprintf(stderr, "tr_backend_cpu_init(%d) failed\n", n_threads);
        exit(1);
    }
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
