// Tensor-core building blocks of the flash-attention kernels (.cu files only), over the
// instructions of attention_ptx.cuh: padded shared-memory tiles filled by asynchronous
// copies, operand loads, tile products, and the fragment bookkeeping between them. The
// numeric steps are explicit instructions or round-to-nearest intrinsics, never left to the
// compiler's contraction, so every kernel that shares them gets the same bits.
#pragma once
#include <stdint.h>

#include "kernels/cuda/attention_ptx.cuh"
#include "kernels/cuda/dtype.cuh"

// Shared-memory rows are D + FA_PAD elements: 16 bytes of padding shift consecutive rows by
// four banks, so the eight row addresses of an ldmatrix hit all 32 banks once.
#define FA_PAD 8

// The sum over the four lanes of a quad (the lanes sharing a fragment row); every lane gets
// the same bits ((a+b)+(c+d) in each, fp32 addition being commutative).
__device__ __forceinline__ float fa_quad_sum(float v) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float fa_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// ---- operand loads from padded row-major tiles (row stride LDS elements) ----

// A operand: rows 0..15 of `rows`, columns k0..k0+15.
__device__ __forceinline__ void fa_lda(uint32_t a[4], const tr_bf16 *rows, int LDS, int k0) {
    int lane = threadIdx.x & 31;
    fa_ldsm4(a, rows + (lane & 15) * LDS + k0 + (lane >> 4) * 8);
}
// B operands of the n8 tiles n0 and n0+8 of B = M^T, M row-major [n][k] (keys by channels
// for Q K^T): b[0], b[1] for n0 and b[2], b[3] for n0+8, k from k0.
__device__ __forceinline__ void fa_ldb(uint32_t b[4], const tr_bf16 *m, int LDS, int n0,
                                       int k0) {
    int lane = threadIdx.x & 31, mi = lane >> 3;
    fa_ldsm4(b, m + (n0 + (mi >> 1) * 8 + (lane & 7)) * LDS + k0 + (mi & 1) * 8);
}
// B operands of the n8 tiles n0 and n0+8 of B = M, M row-major [k][n] (keys by channels for
// P V): rows k0..k0+15, transposed by ldmatrix.
__device__ __forceinline__ void fa_ldbt(uint32_t b[4], const tr_bf16 *m, int LDS, int k0,
                                        int n0) {
    int lane = threadIdx.x & 31, mi = lane >> 3;
    fa_ldsm4_t(b, m + (k0 + (mi & 1) * 8 + (lane & 7)) * LDS + n0 + (mi >> 1) * 8);
}

// The A fragment of columns 16kk..16kk+15 of an fp32 accumulator tile c[n8 tile][4], rounded
// to bf16: the accumulator layout of two n8 tiles is the A layout of one k16 block.
template <int NT>
__device__ __forceinline__ void fa_acc_to_a(uint32_t a[4], const float (&c)[NT][4], int kk) {
    a[0] = fa_pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = fa_pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = fa_pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = fa_pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// s[mt][n] = A_mt B^T over K channels, A_mt rows 16mt.. of `a` and B rows `b` (NT n8 tiles),
// both padded row-major with stride LDS; the k16 blocks are summed in ascending order.
template <int K, int MT, int NT>
__device__ __forceinline__ void fa_gemm_abt(float (&s)[MT][NT][4], const tr_bf16 *a,
                                            const tr_bf16 *b, int LDS) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) fa_lda(af[mt], a + mt * 16 * LDS, LDS, kk * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            fa_ldb(bf, b, LDS, np * 16, kk * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                fa_mma(s[mt][2 * np], af[mt], bf[0], bf[1]);
                fa_mma(s[mt][2 * np + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

// o[mt] += P_mt M, P_mt given as bf16 A fragments p[mt][kk] (KT k16 blocks of keys) and M
// row-major [key][channel] (D channels); keys in ascending k16 blocks.
template <int D, int MT, int KT>
__device__ __forceinline__ void fa_gemm_pv(float (&o)[MT][D / 8][4],
                                           const uint32_t (&p)[MT][KT][4], const tr_bf16 *m,
                                           int LDS) {
#pragma unroll
    for (int kk = 0; kk < KT; kk++)
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t bf[4];
            fa_ldbt(bf, m, LDS, kk * 16, dp * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                fa_mma(o[mt][2 * dp], p[mt][kk], bf[0], bf[1]);
                fa_mma(o[mt][2 * dp + 1], p[mt][kk], bf[2], bf[3]);
            }
        }
}

// Byte offset of element (r, c), c a multiple of 8, in a shared tile of `rows` rows of D bf16
// values. SW false: padded rows of D + FA_PAD elements. SW true: the 128-byte swizzle the
// Hopper warpgroup MMA reads (attention_wgmma.cuh): D / 64 blocks of 64 columns, each `rows`
// rows of 128 bytes, the 16-byte piece j of row r stored at piece j ^ (r mod 8); the tile
// starts on a 1024-byte boundary.
template <int D, bool SW>
__device__ __forceinline__ int fa_sm_off(int r, int c, int rows) {
    if (SW) return (c >> 6) * rows * 128 + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4);
    return (r * (D + FA_PAD) + c) * (int)sizeof(tr_bf16);
}

// Copies `rows` rows of D bf16 values into a shared tile laid out as fa_sm_off<D, SW> says,
// threads tid.. (stride nthr) sharing the work; src(r) gives row r's first element, NULL for
// a row of zeros. With vec (16-byte aligned rows) the copies are asynchronous (the caller
// commits and waits); without, plain loads that are done on return (an odd row stride).
template <int D, bool SW = false, typename Src>
__device__ __forceinline__ void fa_load_rows(tr_bf16 *sm, int rows, const Src &src, int tid,
                                             int nthr, bool vec, const void *any_global) {
    constexpr int CPR = D / 8;   // 16-byte pieces per row
#pragma unroll 2
    for (int i = tid; i < rows * CPR; i += nthr) {
        int r = i / CPR, c = (i % CPR) * 8;
        const tr_bf16 *p = src(r);
        tr_bf16 *d = reinterpret_cast<tr_bf16 *>(reinterpret_cast<unsigned char *>(sm) +
                                                 fa_sm_off<D, SW>(r, c, rows));
        if (vec) {
            fa_cp16(d, p ? (const void *)(p + c) : any_global, p != nullptr);
        } else {
            uint32_t w[4] = {0, 0, 0, 0};
            if (p) {
                const uint16_t *s = reinterpret_cast<const uint16_t *>(p + c);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    w[j] = (uint32_t)s[2 * j] | ((uint32_t)s[2 * j + 1] << 16);
            }
            *reinterpret_cast<uint4 *>(d) = make_uint4(w[0], w[1], w[2], w[3]);
        }
    }
}

// The common case of fa_load_rows: `rows` rows from src, stride elements apart, the first
// `valid` of them read and the rest zeros.
template <int D, bool SW = false>
__device__ __forceinline__ void fa_load_run(tr_bf16 *sm, int rows, const tr_bf16 *src,
                                            size_t stride, int valid, int tid, int nthr, bool vec,
                                            const void *any_global) {
    fa_load_rows<D, SW>(
        sm, rows,
        [&](int r) -> const tr_bf16 * { return r < valid ? src + (size_t)r * stride : nullptr; },
        tid, nthr, vec, any_global);
}

// Two adjacent bf16 outputs at p (even column): one 4-byte store when p is 4-byte aligned.
__device__ __forceinline__ void fa_store2(tr_bf16 *p, float x0, float x1, bool aligned4) {
    if (aligned4) {
        *reinterpret_cast<uint32_t *>(p) = fa_pack(x0, x1);
    } else {
        p[0] = __float2bfloat16_rn(x0);
        p[1] = __float2bfloat16_rn(x1);
    }
}

// Index of the document holding token t (doc_start is sorted, n_docs + 1 entries; among
// empty documents sharing a start, the last, which holds t).
__device__ __forceinline__ int fa_doc_of(const int32_t *doc_start, int n_docs, int t) {
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (doc_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}
