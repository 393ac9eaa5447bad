// Minimal test harness: CHECK macros that report file:line and keep going, a summary line,
// and helpers for float comparison and temporary directories. Include once per test program.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int tr_test_checks, tr_test_failures;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        tr_test_checks++;                                                               \
        if (!(cond)) {                                                                  \
            tr_test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
        }                                                                               \
    } while (0)

#define CHECKF(cond, ...)                                                               \
    do {                                                                                \
        tr_test_checks++;                                                               \
        if (!(cond)) {                                                                  \
            tr_test_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
        }                                                                               \
    } while (0)

// |a-b| <= tol, with NaN failing.
#define CHECK_NEAR(a, b, tol)                                                           \
    CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%.9g vs %.9g (tol %.3g)",          \
           (double)(a), (double)(b), (double)(tol))

// Max relative error of two float arrays: max|a-b| / max(max|b|, tiny).
static inline double tr_test_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > num) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / (den > 1e-30 ? den : 1e-30);
}

static inline double tr_test_max_abs_err(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

// Path under the source tree (TROUPE_SOURCE_ROOT is set by meson test).
static inline const char *tr_test_src(const char *rel) {
    static char buf[4096];
    const char *root = getenv("TROUPE_SOURCE_ROOT");
    int n = snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    if (n < 0 || (size_t)n >= sizeof buf) {
        fprintf(stderr, "test path too long: %s/%s\n", root ? root : ".", rel);
        exit(1);
    }
    return buf;
}

// Makes a fresh temporary directory; the caller may leave it for inspection on failure.
static inline const char *tr_test_tmpdir(void) {
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/troupe-test-XXXXXX");
    if (!mkdtemp(buf)) {
        perror("mkdtemp");
        exit(1);
    }
    return buf;
}

static inline int tr_test_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, tr_test_checks, tr_test_failures);
    if (tr_test_checks == 0) {
        fprintf(stderr, "%s: no checks ran\n", name);
        return 1;
    }
    return tr_test_failures ? 1 : 0;
}
