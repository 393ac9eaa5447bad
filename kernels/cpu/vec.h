// Inner loops shared by the CPU kernels, written with GCC/Clang vector extensions (4-float
// vectors, the SIMD width every x86-64 and arm64 has). Sums keep 8 partial sums, element i in
// lane i % 8 (two vectors), combined in one fixed tree, so a dot product has the same bits
// whichever routine, row blocking or thread computes it. The _bf16 variants read bf16 rows,
// widened exactly as they are loaded, with the fp32 routines' lanes and order: their results
// are the fp32 routines' on the widened values, bit for bit.
#pragma once
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

typedef float tr_v4 __attribute__((vector_size(16)));

static inline tr_v4 tr_v4_load(const float *p) {
    tr_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void tr_v4_store(float *p, tr_v4 v) { memcpy(p, &v, sizeof v); }

// Four bf16 values as fp32: each is the top half of its fp32.
static inline tr_v4 tr_v4_load_bf16(const uint16_t *p) {
    tr_v4 v;
#if defined(__SSE2__)
    __m128i w = _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64((const __m128i *)p));
    memcpy(&v, &w, sizeof v);
#else
    uint32_t u[4] = {(uint32_t)p[0] << 16, (uint32_t)p[1] << 16, (uint32_t)p[2] << 16,
                     (uint32_t)p[3] << 16};
    memcpy(&v, u, sizeof v);
#endif
    return v;
}

// Eight bf16 values as two fp32 vectors (elements 0-3 and 4-7).
static inline void tr_v4_load_bf16x8(const uint16_t *p, tr_v4 *lo, tr_v4 *hi) {
#if defined(__SSE2__)
    __m128i h = _mm_loadu_si128((const __m128i *)p), z = _mm_setzero_si128();
    __m128i l = _mm_unpacklo_epi16(z, h), u = _mm_unpackhi_epi16(z, h);
    memcpy(lo, &l, sizeof *lo);
    memcpy(hi, &u, sizeof *hi);
#else
    *lo = tr_v4_load_bf16(p);
    *hi = tr_v4_load_bf16(p + 4);
#endif
}

static inline float tr_bf16_val(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// The 8 partial sums lo[0..3], hi[0..3] (lanes 0..7) added in a fixed tree.
static inline float tr_v4_sum2(tr_v4 lo, tr_v4 hi) {
    tr_v4 s = lo + hi;
    return (s[0] + s[2]) + (s[1] + s[3]);
}

// The tail of a dot product (n % 8 elements from i) into the lanes they belong to.
static inline void tr_vec_dot_tail(tr_v4 *lo, tr_v4 *hi, const float *a, const float *b,
                                   int32_t i, int32_t n) {
    for (; i < n; i++) {
        if ((i & 7) < 4) (*lo)[i & 3] += a[i] * b[i];
        else (*hi)[i & 3] += a[i] * b[i];
    }
}

// sum_i a[i] b[i]
static inline float tr_vec_dot(const float *a, const float *b, int32_t n) {
    tr_v4 lo = {0}, hi = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        lo += tr_v4_load(a + i) * tr_v4_load(b + i);
        hi += tr_v4_load(a + i + 4) * tr_v4_load(b + i + 4);
    }
    tr_vec_dot_tail(&lo, &hi, a, b, i, n);
    return tr_v4_sum2(lo, hi);
}

// y += a * x
static inline void tr_vec_axpy(float *y, float a, const float *x, int32_t n) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) tr_v4_store(y + i, tr_v4_load(y + i) + a * tr_v4_load(x + i));
    for (; i < n; i++) y[i] += a * x[i];
}

// y *= a
static inline void tr_vec_scale(float *y, float a, int32_t n) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) tr_v4_store(y + i, tr_v4_load(y + i) * a);
    for (; i < n; i++) y[i] *= a;
}

// out[j] = tr_vec_dot(rows[j], b, n) for j < nr, bit for bit; four rows at a time share the
// loads of b.
static inline void tr_vec_dots(float *out, const float *const *rows, int32_t nr,
                               const float *b, int32_t n) {
    int32_t j = 0;
    for (; j + 4 <= nr; j += 4) {
        const float *a0 = rows[j], *a1 = rows[j + 1], *a2 = rows[j + 2], *a3 = rows[j + 3];
        tr_v4 l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
        int32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            tr_v4 bl = tr_v4_load(b + i), bh = tr_v4_load(b + i + 4);
            l0 += tr_v4_load(a0 + i) * bl;
            h0 += tr_v4_load(a0 + i + 4) * bh;
            l1 += tr_v4_load(a1 + i) * bl;
            h1 += tr_v4_load(a1 + i + 4) * bh;
            l2 += tr_v4_load(a2 + i) * bl;
            h2 += tr_v4_load(a2 + i + 4) * bh;
            l3 += tr_v4_load(a3 + i) * bl;
            h3 += tr_v4_load(a3 + i + 4) * bh;
        }
        tr_vec_dot_tail(&l0, &h0, a0, b, i, n);
        tr_vec_dot_tail(&l1, &h1, a1, b, i, n);
        tr_vec_dot_tail(&l2, &h2, a2, b, i, n);
        tr_vec_dot_tail(&l3, &h3, a3, b, i, n);
        out[j] = tr_v4_sum2(l0, h0);
        out[j + 1] = tr_v4_sum2(l1, h1);
        out[j + 2] = tr_v4_sum2(l2, h2);
        out[j + 3] = tr_v4_sum2(l3, h3);
    }
    for (; j < nr; j++) out[j] = tr_vec_dot(rows[j], b, n);
}

// y += sum_j w[j] * rows[j], added to each y[i] one row after another in order of j: bitwise
// what nr successive tr_vec_axpy calls give, but y stays in registers across the rows.
static inline void tr_vec_axpy_rows(float *y, const float *w, const float *const *rows,
                                    int32_t nr, int32_t n) {
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        tr_v4 a0 = tr_v4_load(y + i), a1 = tr_v4_load(y + i + 4);
        tr_v4 a2 = tr_v4_load(y + i + 8), a3 = tr_v4_load(y + i + 12);
        for (int32_t j = 0; j < nr; j++) {
            const float *r = rows[j] + i;
            float wj = w[j];
            a0 += wj * tr_v4_load(r);
            a1 += wj * tr_v4_load(r + 4);
            a2 += wj * tr_v4_load(r + 8);
            a3 += wj * tr_v4_load(r + 12);
        }
        tr_v4_store(y + i, a0);
        tr_v4_store(y + i + 4, a1);
        tr_v4_store(y + i + 8, a2);
        tr_v4_store(y + i + 12, a3);
    }
    for (; i + 4 <= n; i += 4) {
        tr_v4 a0 = tr_v4_load(y + i);
        for (int32_t j = 0; j < nr; j++) a0 += w[j] * tr_v4_load(rows[j] + i);
        tr_v4_store(y + i, a0);
    }
    for (; i < n; i++) {
        float a = y[i];
        for (int32_t j = 0; j < nr; j++) a += w[j] * rows[j][i];
        y[i] = a;
    }
}

// ---- bf16 rows (and a bf16 b for the dot products) ----

static inline void tr_vec_dot_tail_bf16(tr_v4 *lo, tr_v4 *hi, const uint16_t *a,
                                        const uint16_t *b, int32_t i, int32_t n) {
    for (; i < n; i++) {
        float p = tr_bf16_val(a[i]) * tr_bf16_val(b[i]);
        if ((i & 7) < 4) (*lo)[i & 3] += p;
        else (*hi)[i & 3] += p;
    }
}

static inline float tr_vec_dot_bf16(const uint16_t *a, const uint16_t *b, int32_t n) {
    tr_v4 lo = {0}, hi = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        tr_v4 al, ah, bl, bh;
        tr_v4_load_bf16x8(a + i, &al, &ah);
        tr_v4_load_bf16x8(b + i, &bl, &bh);
        lo += al * bl;
        hi += ah * bh;
    }
    tr_vec_dot_tail_bf16(&lo, &hi, a, b, i, n);
    return tr_v4_sum2(lo, hi);
}

// tr_vec_dots over bf16 rows and a bf16 b.
static inline void tr_vec_dots_bf16(float *out, const uint16_t *const *rows, int32_t nr,
                                    const uint16_t *b, int32_t n) {
    int32_t j = 0;
    for (; j + 4 <= nr; j += 4) {
        const uint16_t *a0 = rows[j], *a1 = rows[j + 1], *a2 = rows[j + 2], *a3 = rows[j + 3];
        tr_v4 l0 = {0}, h0 = {0}, l1 = {0}, h1 = {0}, l2 = {0}, h2 = {0}, l3 = {0}, h3 = {0};
        int32_t i = 0;
        for (; i + 8 <= n; i += 8) {
            tr_v4 bl, bh, xl, xh;
            tr_v4_load_bf16x8(b + i, &bl, &bh);
            tr_v4_load_bf16x8(a0 + i, &xl, &xh);
            l0 += xl * bl;
            h0 += xh * bh;
            tr_v4_load_bf16x8(a1 + i, &xl, &xh);
            l1 += xl * bl;
            h1 += xh * bh;
            tr_v4_load_bf16x8(a2 + i, &xl, &xh);
            l2 += xl * bl;
            h2 += xh * bh;
            tr_v4_load_bf16x8(a3 + i, &xl, &xh);
            l3 += xl * bl;
            h3 += xh * bh;
        }
        tr_vec_dot_tail_bf16(&l0, &h0, a0, b, i, n);
        tr_vec_dot_tail_bf16(&l1, &h1, a1, b, i, n);
        tr_vec_dot_tail_bf16(&l2, &h2, a2, b, i, n);
        tr_vec_dot_tail_bf16(&l3, &h3, a3, b, i, n);
        out[j] = tr_v4_sum2(l0, h0);
        out[j + 1] = tr_v4_sum2(l1, h1);
        out[j + 2] = tr_v4_sum2(l2, h2);
        out[j + 3] = tr_v4_sum2(l3, h3);
    }
    for (; j < nr; j++) out[j] = tr_vec_dot_bf16(rows[j], b, n);
}

// tr_vec_axpy_rows over bf16 rows (y stays fp32).
static inline void tr_vec_axpy_rows_bf16(float *y, const float *w,
                                         const uint16_t *const *rows, int32_t nr, int32_t n) {
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        tr_v4 a0 = tr_v4_load(y + i), a1 = tr_v4_load(y + i + 4);
        tr_v4 a2 = tr_v4_load(y + i + 8), a3 = tr_v4_load(y + i + 12);
        for (int32_t j = 0; j < nr; j++) {
            const uint16_t *r = rows[j] + i;
            float wj = w[j];
            tr_v4 x0, x1, x2, x3;
            tr_v4_load_bf16x8(r, &x0, &x1);
            tr_v4_load_bf16x8(r + 8, &x2, &x3);
            a0 += wj * x0;
            a1 += wj * x1;
            a2 += wj * x2;
            a3 += wj * x3;
        }
        tr_v4_store(y + i, a0);
        tr_v4_store(y + i + 4, a1);
        tr_v4_store(y + i + 8, a2);
        tr_v4_store(y + i + 12, a3);
    }
    for (; i + 4 <= n; i += 4) {
        tr_v4 a0 = tr_v4_load(y + i);
        for (int32_t j = 0; j < nr; j++) a0 += w[j] * tr_v4_load_bf16(rows[j] + i);
        tr_v4_store(y + i, a0);
    }
    for (; i < n; i++) {
        float a = y[i];
        for (int32_t j = 0; j < nr; j++) a += w[j] * tr_bf16_val(rows[j][i]);
        y[i] = a;
    }
}
