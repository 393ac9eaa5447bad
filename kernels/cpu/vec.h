// Inner loops shared by the CPU kernels, written in fixed blocks of 8 so that gcc -O2 maps
// them onto SIMD lanes without -ffast-math. The dot product keeps 8 partial sums combined in a
// fixed tree, so its result depends only on the inputs and n, never on who calls it.
#pragma once
#include <stdint.h>

static inline float tr_vec_dot(const float *a, const float *b, int32_t n) {
    float acc[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// y += a * x
static inline void tr_vec_axpy(float *restrict y, float a, const float *restrict x, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t l = 0; l < 8; l++) y[i + l] += a * x[i + l];
    for (; i < n; i++) y[i] += a * x[i];
}

// y *= a
static inline void tr_vec_scale(float *y, float a, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int32_t l = 0; l < 8; l++) y[i + l] *= a;
    for (; i < n; i++) y[i] *= a;
}
