// The CPU matrix product (gemm.h): tiles of C are tasks, each walks K in blocks, packs a
// panel of B per block and runs a register micro-kernel over the rows, reading an fp32 A in
// place (a strided A is packed, a bf16 A widened into fp32 rows). bf16 inputs become fp32 as
// they are packed, and a bf16 C is rounded from an fp32 tile at the end, so the micro-kernels
// only ever see fp32.
// Micro-kernels exist for AVX-512, AVX2+FMA and plain C (fmaf); each keeps one accumulator
// lane per element of C and adds the products in k order with a fused multiply-add, so all
// three give the same bits and a K-block boundary only stores and reloads the running sum.
#include "kernels/cpu/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_X86 1
#include <immintrin.h>
#else
#define GEMM_X86 0
#endif

#define GEMM_MR_MAX 12
#define GEMM_NR_MAX 32
#define GEMM_KC_MAX 256
#define GEMM_MC 192        // rows of C per task: a multiple of every MR (4, 6, 12)

// kc steps of the chain for an MR x NR tile: ar[r] points at A(row r, k0), successive k are
// aks apart; bp is the packed B panel (kc rows of NR floats). load_c continues the chain from
// the tile's current values; bias (NR floats) is added after the last step when not NULL.
typedef void (*gemm_ukr_fn)(int32_t kc, const float *const *ar, ptrdiff_t aks,
                            const float *bp, float *c, ptrdiff_t ldc, bool load_c,
                            const float *bias);

typedef struct gemm_kernel {
    int32_t mr, nr, kc;
    gemm_ukr_fn ukr;
    tr_gemm_isa isa;
} gemm_kernel;

// ---- plain C: 4 x 8, fmaf (correctly rounded everywhere, the reference for the others) ----

static void ukr_generic(int32_t kc, const float *const *ar, ptrdiff_t aks, const float *bp,
                        float *c, ptrdiff_t ldc, bool load_c, const float *bias) {
    float acc[4][8];
    for (int32_t r = 0; r < 4; r++)
        for (int32_t j = 0; j < 8; j++) acc[r][j] = load_c ? c[r * ldc + j] : 0.0f;
    for (int32_t k = 0; k < kc; k++) {
        const float *b = bp + (size_t)k * 8;
        for (int32_t r = 0; r < 4; r++) {
            float a = ar[r][k * aks];
            for (int32_t j = 0; j < 8; j++) acc[r][j] = fmaf(a, b[j], acc[r][j]);
        }
    }
    for (int32_t r = 0; r < 4; r++)
        for (int32_t j = 0; j < 8; j++) c[r * ldc + j] = bias ? acc[r][j] + bias[j] : acc[r][j];
}

#if GEMM_X86

// ---- AVX2 + FMA: 6 x 16 (12 accumulators, two B vectors, one broadcast) ----

__attribute__((target("avx2,fma"))) static void ukr_avx2(int32_t kc, const float *const *ar,
                                                        ptrdiff_t aks, const float *bp, float *c,
                                                        ptrdiff_t ldc, bool load_c,
                                                        const float *bias) {
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (load_c) {
        c00 = _mm256_loadu_ps(c), c01 = _mm256_loadu_ps(c + 8);
        c10 = _mm256_loadu_ps(c + ldc), c11 = _mm256_loadu_ps(c + ldc + 8);
        c20 = _mm256_loadu_ps(c + 2 * ldc), c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(c + 3 * ldc), c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(c + 4 * ldc), c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(c + 5 * ldc), c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = _mm256_setzero_ps();
        c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    }
    const float *a0 = ar[0], *a1 = ar[1], *a2 = ar[2], *a3 = ar[3], *a4 = ar[4], *a5 = ar[5];
    // One running offset for the six rows keeps the loop to indexed loads and FMAs.
    ptrdiff_t o = 0;
#pragma GCC unroll 4
    for (int32_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
        __m256 a;
        a = _mm256_broadcast_ss(a0 + o);
        c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01);
        a = _mm256_broadcast_ss(a1 + o);
        c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11);
        a = _mm256_broadcast_ss(a2 + o);
        c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21);
        a = _mm256_broadcast_ss(a3 + o);
        c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31);
        a = _mm256_broadcast_ss(a4 + o);
        c40 = _mm256_fmadd_ps(a, b0, c40), c41 = _mm256_fmadd_ps(a, b1, c41);
        a = _mm256_broadcast_ss(a5 + o);
        c50 = _mm256_fmadd_ps(a, b0, c50), c51 = _mm256_fmadd_ps(a, b1, c51);
        o += aks;
        bp += 16;
    }
    if (bias) {
        __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
        c00 = _mm256_add_ps(c00, b0), c01 = _mm256_add_ps(c01, b1);
        c10 = _mm256_add_ps(c10, b0), c11 = _mm256_add_ps(c11, b1);
        c20 = _mm256_add_ps(c20, b0), c21 = _mm256_add_ps(c21, b1);
        c30 = _mm256_add_ps(c30, b0), c31 = _mm256_add_ps(c31, b1);
        c40 = _mm256_add_ps(c40, b0), c41 = _mm256_add_ps(c41, b1);
        c50 = _mm256_add_ps(c50, b0), c51 = _mm256_add_ps(c51, b1);
    }
    _mm256_storeu_ps(c, c00), _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + ldc, c10), _mm256_storeu_ps(c + ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20), _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30), _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40), _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50), _mm256_storeu_ps(c + 5 * ldc + 8, c51);
}

// ---- AVX-512F: 12 x 32 (24 accumulators) ----

__attribute__((target("avx512f"))) static void ukr_avx512(int32_t kc, const float *const *ar,
                                                         ptrdiff_t aks, const float *bp,
                                                         float *c, ptrdiff_t ldc, bool load_c,
                                                         const float *bias) {
    __m512 acc[12][2];
    for (int32_t r = 0; r < 12; r++) {
        acc[r][0] = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        acc[r][1] = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    }
    ptrdiff_t o = 0;
    for (int32_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16);
        // Fully unrolled by the compiler: acc stays in registers (24 + 2 + 1 of 32).
#pragma GCC unroll 12
        for (int32_t r = 0; r < 12; r++) {
            __m512 x = _mm512_set1_ps(ar[r][o]);
            acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
        }
        o += aks;
        bp += 32;
    }
    __m512 b0 = bias ? _mm512_loadu_ps(bias) : _mm512_setzero_ps();
    __m512 b1 = bias ? _mm512_loadu_ps(bias + 16) : _mm512_setzero_ps();
    for (int32_t r = 0; r < 12; r++) {
        // Without a bias nothing is added: x + 0 would turn a -0 sum into +0.
        _mm512_storeu_ps(c + r * ldc, bias ? _mm512_add_ps(acc[r][0], b0) : acc[r][0]);
        _mm512_storeu_ps(c + r * ldc + 16, bias ? _mm512_add_ps(acc[r][1], b1) : acc[r][1]);
    }
}

#endif  // GEMM_X86

static gemm_kernel gemm_kernel_of(tr_gemm_isa isa) {
#if GEMM_X86
    if (isa == TR_GEMM_AVX512)
        return (gemm_kernel){.mr = 12, .nr = 32, .kc = 128, .ukr = ukr_avx512, .isa = isa};
    if (isa == TR_GEMM_AVX2)
        return (gemm_kernel){.mr = 6, .nr = 16, .kc = 256, .ukr = ukr_avx2, .isa = isa};
#endif
    (void)isa;
    return (gemm_kernel){.mr = 4, .nr = 8, .kc = 256, .ukr = ukr_generic, .isa = TR_GEMM_GENERIC};
}

tr_gemm_isa tr_gemm_isa_detect(void) {
    tr_gemm_isa best = TR_GEMM_GENERIC;
#if GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = TR_GEMM_AVX2;
    if (__builtin_cpu_supports("avx512f")) best = TR_GEMM_AVX512;
#endif
    const char *want = getenv("TROUPE_CPU_ISA");
    if (want) {
        tr_gemm_isa w = best;
        if (strcmp(want, "generic") == 0) w = TR_GEMM_GENERIC;
        else if (strcmp(want, "avx2") == 0) w = TR_GEMM_AVX2;
        else if (strcmp(want, "avx512") == 0) w = TR_GEMM_AVX512;
        if (w < best) best = w;
    }
    return best;
}

const char *tr_gemm_isa_name(tr_gemm_isa isa) {
    return isa == TR_GEMM_AVX512 ? "avx512" : isa == TR_GEMM_AVX2 ? "avx2" : "generic";
}

#if GEMM_X86
// Eight consecutive elements of an fp32 or bf16 array from element i, as fp32.
__attribute__((target("avx2"))) static inline __m256 load8_avx2(const void *p, ptrdiff_t i,
                                                               bool bf16) {
    if (!bf16) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The transposing pack of B = W^T (columns contiguous along k) in 8 x 8 blocks: eight rows of
// W (eight columns of B), eight steps of k each, transposed in registers. Returns the k steps
// done (a multiple of 8); the caller packs the rest. Moving values only: any order is exact.
__attribute__((target("avx2"))) static int32_t pack_bt_avx2(float *bp, const tr_gemm *g,
                                                           int32_t k0, int32_t kn, int32_t j0,
                                                           int32_t nr, int32_t NR) {
    if (nr % 8 != 0) return 0;
    const bool bf = g->b_t == TR_BF16;
    const ptrdiff_t cs = g->b_cs;
    int32_t k8 = kn / 8 * 8;
    for (int32_t jb = 0; jb < nr; jb += 8) {
        ptrdiff_t src = (ptrdiff_t)(j0 + jb) * cs + k0;
        for (int32_t k = 0; k < k8; k += 8) {
            const void *B = g->b;
            ptrdiff_t o = src + k;
            __m256 r0 = load8_avx2(B, o, bf), r1 = load8_avx2(B, o + cs, bf);
            __m256 r2 = load8_avx2(B, o + 2 * cs, bf), r3 = load8_avx2(B, o + 3 * cs, bf);
            __m256 r4 = load8_avx2(B, o + 4 * cs, bf), r5 = load8_avx2(B, o + 5 * cs, bf);
            __m256 r6 = load8_avx2(B, o + 6 * cs, bf), r7 = load8_avx2(B, o + 7 * cs, bf);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *dst = bp + (size_t)k * NR + jb;
            _mm256_storeu_ps(dst + 0 * NR, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(dst + 1 * NR, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(dst + 2 * NR, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(dst + 3 * NR, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(dst + 4 * NR, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(dst + 5 * NR, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(dst + 6 * NR, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(dst + 7 * NR, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
    }
    return k8;
}
#endif

// Packs B(k0 .. k0+kn-1, j0 .. j0+nr-1) as kn rows of NR floats, zero beyond nr.
static void gemm_pack_b(float *bp, const tr_gemm *g, int32_t k0, int32_t kn, int32_t j0,
                        int32_t nr, int32_t NR, tr_gemm_isa isa) {
    if (g->b_cs == 1) {
        for (int32_t k = 0; k < kn; k++) {
            ptrdiff_t src = (ptrdiff_t)(k0 + k) * g->b_ks + j0;
            float *dst = bp + (size_t)k * NR;
            tr_ld_row(dst, g->b, (size_t)src, nr, g->b_t);
            for (int32_t j = nr; j < NR; j++) dst[j] = 0.0f;
        }
        return;
    }
    if (nr < NR)
        for (int32_t k = 0; k < kn; k++)
            for (int32_t j = nr; j < NR; j++) bp[(size_t)k * NR + j] = 0.0f;
    // Columns of B run along k (B = W^T): a transpose, in 8 x 8 blocks where the CPU has
    // AVX2, then one column of B at a time for what is left.
    int32_t kd = 0;
#if GEMM_X86
    if (isa >= TR_GEMM_AVX2 && g->b_ks == 1) kd = pack_bt_avx2(bp, g, k0, kn, j0, nr, NR);
#else
    (void)isa;
#endif
    for (int32_t j = 0; j < nr; j++) {
        ptrdiff_t src = (ptrdiff_t)(j0 + j) * g->b_cs + (ptrdiff_t)k0 * g->b_ks;
        float *dst = bp + j;
        if (g->b_t == TR_BF16) {
            const uint16_t *b = g->b;
            for (int32_t k = kd; k < kn; k++)
                dst[(size_t)k * NR] = tr_bf16_f32(b[src + k * g->b_ks]);
        } else {
            const float *b = g->b;
            for (int32_t k = kd; k < kn; k++) dst[(size_t)k * NR] = b[src + k * g->b_ks];
        }
    }
}

// Packs A(rows i0 .. i1-1, k0 .. k0+kn-1) as MR-row panels of kn steps (ap[panel][k][r]),
// the last panel's missing rows repeating its last real row. Used when A's steps along k are
// not contiguous (A^T, the weight gradient): there the rows a micro-kernel reads sit a whole
// row of the source apart per step, and such strides (often a multiple of 4 KiB) would fall
// into one L1 set and evict each other. A bf16 A is widened here.
static void gemm_pack_a(float *ap, const tr_gemm *g, int32_t i0, int32_t i1, int32_t k0,
                        int32_t kn, int32_t MR) {
    for (int32_t p0 = i0; p0 < i1; p0 += MR, ap += (size_t)kn * MR) {
        int32_t mr = i1 - p0 < MR ? i1 - p0 : MR;
        ptrdiff_t row[GEMM_MR_MAX];
        for (int32_t r = 0; r < MR; r++)
            row[r] = (ptrdiff_t)(p0 + (r < mr ? r : mr - 1)) * g->a_rs + (ptrdiff_t)k0 * g->a_ks;
        if (g->a_t == TR_BF16) {
            const uint16_t *a = g->a;
            for (int32_t k = 0; k < kn; k++) {
                float *dst = ap + (size_t)k * MR;
                for (int32_t r = 0; r < MR; r++) dst[r] = tr_bf16_f32(a[row[r] + k * g->a_ks]);
            }
        } else {
            const float *a = g->a;
            for (int32_t k = 0; k < kn; k++) {
                float *dst = ap + (size_t)k * MR;
                for (int32_t r = 0; r < MR; r++) dst[r] = a[row[r] + k * g->a_ks];
            }
        }
    }
}

// Widens a bf16 A with contiguous steps (rows i0 .. i1-1, k0 .. k0+kn-1) into fp32 rows of kn
// values, which the micro-kernels then read in place as they read an fp32 A.
static void gemm_widen_a(float *ap, const tr_gemm *g, int32_t i0, int32_t i1, int32_t k0,
                         int32_t kn) {
    for (int32_t i = i0; i < i1; i++)
        tr_ld_row(ap + (size_t)(i - i0) * kn, g->a, (size_t)((ptrdiff_t)i * g->a_rs + k0), kn,
                  g->a_t);
}

// C rows [i0, i1) x columns [j0, j1): the whole chain over K, block by block, into the fp32
// tile cb (row stride ldc, cb[0] being C(i0, j0)); load_c0: the chain starts from cb's values.
static void gemm_block_f32(const gemm_kernel *kr, const tr_gemm *g, int32_t i0, int32_t i1,
                           int32_t j0, int32_t j1, float *cb, ptrdiff_t ldc, bool load_c0) {
    const int32_t MR = kr->mr, NR = kr->nr;
    float bp[GEMM_KC_MAX * GEMM_NR_MAX] __attribute__((aligned(64)));
    // Packed A for strided rows, or widened bf16 rows: at most GEMM_MC rows of one K block
    // (192 KiB of stack, only touched when used).
    float ap[GEMM_MC * GEMM_KC_MAX] __attribute__((aligned(64)));
    const bool pack_a = g->a_ks != 1, widen_a = !pack_a && g->a_t != TR_F32;
    float tile[GEMM_MR_MAX * GEMM_NR_MAX], bias_pad[GEMM_NR_MAX];
    const float *ar[GEMM_MR_MAX];
    for (int32_t k0 = 0; k0 < g->K; k0 += kr->kc) {
        int32_t kn = g->K - k0 < kr->kc ? g->K - k0 : kr->kc;
        bool load_c = k0 > 0 || load_c0, last = k0 + kn == g->K;
        if (pack_a) gemm_pack_a(ap, g, i0, i1, k0, kn, MR);
        if (widen_a) gemm_widen_a(ap, g, i0, i1, k0, kn);
        for (int32_t j = j0; j < j1; j += NR) {
            int32_t nr = j1 - j < NR ? j1 - j : NR;
            gemm_pack_b(bp, g, k0, kn, j, nr, NR, kr->isa);
            const float *bias = NULL;
            if (last && g->bias) {
                if (nr == NR && g->bias_t == TR_F32) bias = (const float *)g->bias + j;
                else {
                    for (int32_t x = 0; x < NR; x++)
                        bias_pad[x] = x < nr ? tr_ld(g->bias, (size_t)(j + x), g->bias_t) : 0.0f;
                    bias = bias_pad;
                }
            }
            const float *a = g->a;
            for (int32_t i = i0; i < i1; i += MR) {
                int32_t mr = i1 - i < MR ? i1 - i : MR;
                // Rows past the end read the last real row; their results are dropped.
                ptrdiff_t aks = g->a_ks;
                if (pack_a) {
                    const float *panel = ap + (size_t)(i - i0) * kn;
                    for (int32_t r = 0; r < MR; r++) ar[r] = panel + r;
                    aks = MR;
                } else if (widen_a) {
                    for (int32_t r = 0; r < MR; r++)
                        ar[r] = ap + (size_t)(i - i0 + (r < mr ? r : mr - 1)) * kn;
                } else {
                    for (int32_t r = 0; r < MR; r++)
                        ar[r] = a + (i + (r < mr ? r : mr - 1)) * g->a_rs + k0 * g->a_ks;
                }
                float *c = cb + (ptrdiff_t)(i - i0) * ldc + (j - j0);
                if (mr == MR && nr == NR) {
                    kr->ukr(kn, ar, aks, bp, c, ldc, load_c, bias);
                    continue;
                }
                memset(tile, 0, sizeof tile);
                if (load_c)
                    for (int32_t r = 0; r < mr; r++)
                        for (int32_t x = 0; x < nr; x++) tile[r * NR + x] = c[r * ldc + x];
                kr->ukr(kn, ar, aks, bp, tile, NR, load_c, bias);
                for (int32_t r = 0; r < mr; r++)
                    for (int32_t x = 0; x < nr; x++) c[r * ldc + x] = tile[r * NR + x];
            }
        }
    }
}

// Columns of C per pass when the chain runs into a scratch tile: a multiple of every NR.
#define GEMM_NC_OUT 128

// The chain's result r (fp32) into C(i, j) as the product's mode asks: r, round(r), C + r
// (one element; gemm_block stores whole rows the same way).
static inline void gemm_store(const tr_gemm *g, int32_t i, int32_t j, float r) {
    size_t at = (size_t)((ptrdiff_t)i * g->ldc + j);
    if (g->add) ((float *)g->c)[at] += r;
    else tr_st(g->c, at, r, g->c_t);
}

// C rows [i0, i1) x columns [j0, j1). An fp32 C holds the chain between K blocks itself; a
// bf16 C or an adding product runs the chain in a stack tile of GEMM_MC x GEMM_NC_OUT fp32
// values and stores each result once at the end.
static void gemm_block(const gemm_kernel *kr, const tr_gemm *g, int32_t i0, int32_t i1,
                       int32_t j0, int32_t j1) {
    if (g->c_t == TR_F32 && !g->add) {
        float *c = (float *)g->c + (ptrdiff_t)i0 * g->ldc + j0;
        gemm_block_f32(kr, g, i0, i1, j0, j1, c, g->ldc, g->accumulate);
        return;
    }
    float cs[GEMM_MC * GEMM_NC_OUT] __attribute__((aligned(64)));
    for (int32_t jc = j0; jc < j1; jc += GEMM_NC_OUT) {
        int32_t jn = j1 - jc < GEMM_NC_OUT ? j1 - jc : GEMM_NC_OUT;
        gemm_block_f32(kr, g, i0, i1, jc, jc + jn, cs, GEMM_NC_OUT, false);
        for (int32_t i = i0; i < i1; i++) {
            const float *r = cs + (size_t)(i - i0) * GEMM_NC_OUT;
            size_t at = (size_t)((ptrdiff_t)i * g->ldc + jc);
            if (g->add) {
                float *c = (float *)g->c + at;
                for (int32_t x = 0; x < jn; x++) c[x] += r[x];
            } else {
                tr_st_row(g->c, at, r, jn, g->c_t);
            }
        }
    }
}

// K = 0: the chain is empty, so C is its start (0 or itself) plus the bias.
static void gemm_empty(const tr_gemm *g) {
    for (int32_t i = 0; i < g->M; i++)
        for (int32_t j = 0; j < g->N; j++) {
            float v = 0.0f;
            if (g->accumulate) v = ((const float *)g->c)[(ptrdiff_t)i * g->ldc + j];
            if (g->bias) v = v + tr_ld(g->bias, (size_t)j, g->bias_t);
            gemm_store(g, i, j, v);
        }
}

void tr_gemm_serial(tr_gemm_isa isa, const tr_gemm *g) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0) {
        gemm_empty(g);
        return;
    }
    gemm_kernel kr = gemm_kernel_of(isa);
    // Row blocks keep the part of A that each packed panel of B meets inside the L2 cache.
    for (int32_t i0 = 0; i0 < g->M; i0 += GEMM_MC)
        gemm_block(&kr, g, i0, g->M - i0 < GEMM_MC ? g->M : i0 + GEMM_MC, 0, g->N);
}

typedef struct gemm_job {
    const tr_gemm *g;
    gemm_kernel kr;
    int32_t mc, nc, n_tiles_n;
} gemm_job;

static void gemm_task(void *arg, int32_t task) {
    const gemm_job *j = arg;
    int32_t i0 = (task / j->n_tiles_n) * j->mc, j0 = (task % j->n_tiles_n) * j->nc;
    int32_t i1 = i0 + j->mc < j->g->M ? i0 + j->mc : j->g->M;
    int32_t j1 = j0 + j->nc < j->g->N ? j0 + j->nc : j->g->N;
    gemm_block(&j->kr, j->g, i0, i1, j0, j1);
}

void tr_gemm_run(tr_backend *be, const tr_gemm *g) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0) {
        gemm_empty(g);
        return;
    }
    gemm_job j = {.g = g, .kr = gemm_kernel_of(tr_cpu_isa(be))};
    const int32_t MR = j.kr.mr, NR = j.kr.nr;
    // Tiles only decide who computes what, never the bits: sized for cache and balance.
    j.mc = g->M < GEMM_MC ? tr_cpu_ceil_div(g->M, MR) * MR : GEMM_MC;
    int32_t n_tiles_m = tr_cpu_ceil_div(g->M, j.mc);
    int32_t want = 4 * be->n_threads, panels = tr_cpu_ceil_div(g->N, NR);
    int32_t per_row = want > n_tiles_m ? tr_cpu_ceil_div(want, n_tiles_m) : 1;
    if (per_row > panels) per_row = panels;
    j.nc = tr_cpu_ceil_div(panels, per_row) * NR;
    j.n_tiles_n = tr_cpu_ceil_div(g->N, j.nc);
    double flops = 2.0 * g->M * g->N * g->K;
    tr_cpu_run(be, n_tiles_m * j.n_tiles_n, gemm_task, &j, flops / 40.0);
}
