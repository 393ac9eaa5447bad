// Element conversions of the CPU kernels: how an A or W buffer (fp32 or bf16, ops.h) is read
// as fp32 and how an fp32 result is stored in it. Reading is exact (bf16 is the top half of
// an fp32); storing rounds once, to nearest even. The bf16 mode emulates a GPU's rounding
// points with these two steps alone, so its arithmetic is the fp32 kernels' own.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/ops.h"

static inline float tr_bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Round to nearest even by adding 0x7fff plus the lowest kept bit: a carry out of the low
// half rounds up exactly when the dropped half exceeds the tie, or equals it with an odd kept
// bit; a carry into the exponent is the correct next binade (or inf). NaNs are truncated
// instead, since the addition could carry them into another NaN or to inf; one whose kept
// payload would be all zero (an inf pattern) gets the quiet bit.
static inline uint16_t tr_f32_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// IEEE half to fp32, exact: every half is an fp32 (subnormals become normal fp32 numbers;
// inf stays inf; a NaN keeps its sign and payload).
static inline float tr_f16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | m << 13;
    } else if (e != 0) {
        u = sign | (e + 112u) << 23 | m << 13;
    } else {
        float f = (float)m * 0x1p-24f;   // m < 2^10: the product is exact
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Element i of an fp32 or bf16 buffer, as fp32.
static inline float tr_ld(const void *p, size_t i, tr_dt t) {
    return t == TR_BF16 ? tr_bf16_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// Stores x as element i of an fp32 or bf16 buffer.
static inline void tr_st(void *p, size_t i, float x, tr_dt t) {
    if (t == TR_BF16) ((uint16_t *)p)[i] = tr_f32_bf16(x);
    else ((float *)p)[i] = x;
}

typedef uint32_t tr_u32x4 __attribute__((vector_size(16)));
typedef uint16_t tr_u16x4 __attribute__((vector_size(8)));

// tr_bf16_f32 of four values at once.
static inline void tr_bf16_f32x4(float *d, const uint16_t *s) {
    tr_u16x4 h;
    memcpy(&h, s, sizeof h);
    tr_u32x4 u = __builtin_convertvector(h, tr_u32x4) << 16;
    memcpy(d, &u, sizeof u);
}

// n elements from p (element offset off) into fp32 dst.
static inline void tr_ld_row(float *dst, const void *p, size_t off, int32_t n, tr_dt t) {
    if (t == TR_BF16) {
        const uint16_t *s = (const uint16_t *)p + off;
        int32_t i = 0;
        for (; i + 4 <= n; i += 4) tr_bf16_f32x4(dst + i, s + i);
        for (; i < n; i++) dst[i] = tr_bf16_f32(s[i]);
    } else {
        memcpy(dst, (const float *)p + off, (size_t)n * sizeof(float));
    }
}

// tr_f32_bf16 of four values at once, NaNs included (the same bits): rounding the result of
// every output row this way keeps a bf16 store from costing more than the fp32 one.
static inline void tr_f32_bf16x4(uint16_t *d, const float *s) {
    tr_u32x4 u;
    memcpy(&u, s, sizeof u);
    tr_u32x4 h = u >> 16;
    tr_u32x4 rounded = (u + 0x7fffu + (h & 1u)) >> 16;
    tr_u32x4 nan = h | ((tr_u32x4)((h & 0x7fu) == 0) & 0x40u);
    tr_u32x4 is_nan = (tr_u32x4)((u & 0x7fffffffu) > 0x7f800000u);
    tr_u16x4 r = __builtin_convertvector((is_nan & nan) | (~is_nan & rounded), tr_u16x4);
    memcpy(d, &r, sizeof r);
}

// n fp32 values into p at element offset off, each rounded once.
static inline void tr_st_row(void *p, size_t off, const float *src, int32_t n, tr_dt t) {
    if (t == TR_BF16) {
        uint16_t *d = (uint16_t *)p + off;
        int32_t i = 0;
        for (; i + 4 <= n; i += 4) tr_f32_bf16x4(d + i, src + i);
        for (; i < n; i++) d[i] = tr_f32_bf16(src[i]);
    } else {
        memcpy((float *)p + off, src, (size_t)n * sizeof(float));
    }
}

// The address of element i of a buffer of dtype t.
static inline const void *tr_at(const void *p, size_t i, tr_dt t) {
    return (const char *)p + i * tr_dt_size(t);
}

static inline void *tr_at_mut(void *p, size_t i, tr_dt t) {
    return (char *)p + i * tr_dt_size(t);
}
