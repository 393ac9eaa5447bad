// The per-row arithmetic that the flash forward and the decode step share, so that a decoded
// token's output is bitwise the training forward's row: one warp's online-softmax step over a
// tile of FA_BN keys (scores by MMA, fp32 max and sums, P rounded to bf16 for the P V MMA),
// the fold of softmax chunks, and the final normalisation. A row's keys are its document's,
// tiled from the document's first token (position 0), never from where the document sits in
// a packed batch, and the softmax restarts every softmax chunk (the backend's, a multiple of 64
// positions), chunks then being folded in position order: decode splits a long context at the
// same positions and folds the same way.
// A document with a shared prefix (tr_doc_layout.prefix) has the prefix's tokens at positions
// 0..L-1 of its context and its own from L on: its tiles gather rows from the two ranges, so
// positions, tiles, masks and folds are those of the unshared document [prefix; own tokens].
#pragma once
#include <math.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/backend_cuda.h"

// Keys per online-softmax step (one tile): 64, or 32 at D = 128, where a warp's 32 rows of
// fp32 output take 128 registers and 64 scores more would not fit beside them.
template <int D>
constexpr int fa_bn() { return D > 64 ? 32 : 64; }
static_assert(TR_CUDA_SOFTMAX_CHUNK % 64 == 0, "a softmax chunk is whole tiles");

// How far (log2 units) a tile's maximum may pass a row's reference point m before m moves to
// it and the output is rescaled (fa_tile_probs): a factor of 2^8.
#define FA_MAX_SLACK 8.0f

// The running softmax of MT m16 tiles of rows. Thread (g, t) holds rows g ([mt][0]) and g+8
// ([mt][1]) of each m-tile, and channels 8n + 2t, 8n + 2t + 1 of each in o[mt][n][2 hi + c].
// m: the reference point of x = score * scale * log2(e), within FA_MAX_SLACK below the
// running maximum (-inf: no key seen yet); l: this thread's share of the row sum of 2^(x - m)
// (its own columns; fa_quad_sum makes the row's).
template <int D, int MT>
struct fa_state {
    float m[MT][2], l[MT][2];
    float o[MT][D / 8][4];
};

template <int D, int MT>
__device__ __forceinline__ void fa_reset(fa_state<D, MT> &st) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            st.m[mt][hi] = -INFINITY;
            st.l[mt][hi] = 0.0f;
        }
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) st.o[mt][n][e] = 0.0f;
    }
}

// Whether every row of the warp sees all of the tile at p0 (no mask to apply), from each
// row's last visible position (rows 8..15 of an m-tile only with hi_rows).
template <int D, int MT>
__device__ __forceinline__ bool fa_tile_whole(const int (&last)[MT][2], int p0, bool hi_rows) {
    int seen = p0 + fa_bn<D>() - 1;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++)
            if (hi == 0 || hi_rows) seen = min(seen, last[mt][hi]);
    return __all_sync(0xffffffffu, seen >= p0 + fa_bn<D>() - 1);
}

// The maximum of row (mt, hi)'s raw scores in the tile, columns past lim (relative to the
// tile) set to -inf unless whole, scaled once to log2 units: sl2 > 0 and rounding is
// monotonic, so it is the maximum of the scaled scores, bit for bit. Every lane of the quad
// gets it.
template <int D, int MT>
__device__ __forceinline__ float fa_row_max(float (&s)[MT][fa_bn<D>() / 8][4], int mt, int hi,
                                            int lim, bool whole, float sl2) {
    constexpr int NT = fa_bn<D>() / 8;
    const int t = threadIdx.x & 3;
    float mx = -INFINITY;
    if (whole) {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) mx = fmaxf(mx, s[mt][n][2 * hi + c]);
    } else {
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const float x = n * 8 + 2 * t + c <= lim ? s[mt][n][2 * hi + c] : -INFINITY;
                s[mt][n][2 * hi + c] = x;
                mx = fmaxf(mx, x);
            }
    }
    return __fmul_rn(fa_quad_max(mx), sl2);
}

// The reference point after a tile whose scaled maximum is mx, from m: it moves only when the
// tile's maximum passes it by more than FA_MAX_SLACK, so that probabilities stay below
// 2^FA_MAX_SLACK (fp32 and bf16 hold them as precisely as any other) and the output is
// rescaled a few times a chunk rather than at nearly every tile. (-inf + slack is -inf: an
// empty state takes any finite maximum.)
__device__ __forceinline__ float fa_ref_next(float mx, float m) {
    return mx > m + FA_MAX_SLACK ? mx : m;
}

// Row (mt, hi)'s probabilities 2^(score sl2 - mu) in place, with the product and difference
// rounded once (a masked score, -inf, gives +0); returns this thread's share of their sum,
// added in column order.
template <int D, int MT>
__device__ __forceinline__ float fa_row_exp(float (&s)[MT][fa_bn<D>() / 8][4], int mt, int hi,
                                            float sl2, float mu) {
    float rs = 0.0f;
#pragma unroll
    for (int n = 0; n < fa_bn<D>() / 8; n++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const float e = fa_ex2(__fmaf_rn(s[mt][n][2 * hi + c], sl2, -mu));
            s[mt][n][2 * hi + c] = e;
            rs = __fadd_rn(rs, e);
        }
    return rs;
}

// The softmax step of fa_tile between its two products, for kernels that form the scores and
// multiply by V another way (attention_wgmma.cuh), in three parts. fa_tile_probs: s holds the
// tile's raw scores Q K^T in accumulator layout and leaves as probabilities (fp32); the
// reference points and sums of st are updated, and alphas receives each row's factor for the
// output, the return value telling whether any row of the warp has one other than 1.
// fa_tile_pack then rounds the probabilities into P's fragments and fa_tile_rescale applies
// the factors to st.o: a kernel may defer both while the previous tile's P V is still reading
// P and adding into the output.
template <int D, int MT>
__device__ __forceinline__ bool fa_tile_probs(fa_state<D, MT> &st,
                                              float (&s)[MT][fa_bn<D>() / 8][4], int p0,
                                              const int (&last)[MT][2], float sl2, bool hi_rows,
                                              float (&alphas)[MT][2]) {
    constexpr int NT = fa_bn<D>() / 8;
    // Most tiles are seen whole by every row of the warp: no mask to apply there.
    const bool whole = fa_tile_whole<D, MT>(last, p0, hi_rows);
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            if (hi == 1 && !hi_rows) {
#pragma unroll
                for (int n = 0; n < NT; n++) s[mt][n][2] = s[mt][n][3] = 0.0f;
                alphas[mt][hi] = 1.0f;
                continue;
            }
            const float mx = fa_row_max<D, MT>(s, mt, hi, last[mt][hi] - p0, whole, sl2);
            const float mold = st.m[mt][hi], mnew = fa_ref_next(mx, mold);
            const float mu = mnew == -INFINITY ? 0.0f : mnew;
            const float alpha = fa_ex2(__fsub_rn(mold, mu));
            st.m[mt][hi] = mnew;
            const float rs = fa_row_exp<D, MT>(s, mt, hi, sl2, mu);
            st.l[mt][hi] = __fmaf_rn(st.l[mt][hi], alpha, rs);
            alphas[mt][hi] = alpha;
            // an empty state's output is zeros (fa_reset; P V added only zeros since), which
            // its alpha of 0 leaves as they are: a chunk's first tile rescales nothing
            rescale |= alpha != 1.0f && mold != -INFINITY;
        }
    }
    return __any_sync(0xffffffffu, rescale);
}

// P rounded to bf16, for the tensor cores, as flash attention does (the row sums used the fp32
// values; this is the one rounding the CPU does not make): the A fragments of P V.
template <int D, int MT>
__device__ __forceinline__ void fa_tile_pack(uint32_t (&p)[MT][fa_bn<D>() / 16][4],
                                             const float (&s)[MT][fa_bn<D>() / 8][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int kk = 0; kk < fa_bn<D>() / 16; kk++) fa_acc_to_a(p[mt][kk], s[mt], kk);
}

// o *= alpha, skipped when no row of the warp moved its reference point (alpha exactly 1, and
// x * 1 is x: the same bits), which past a chunk's first tile is nearly all of them.
template <int D, int MT>
__device__ __forceinline__ void fa_tile_rescale(fa_state<D, MT> &st,
                                                const float (&alphas)[MT][2], bool any,
                                                bool hi_rows) {
    if (!any) return;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            if (hi == 1 && !hi_rows) continue;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                st.o[mt][n][2 * hi] = __fmul_rn(st.o[mt][n][2 * hi], alphas[mt][hi]);
                st.o[mt][n][2 * hi + 1] = __fmul_rn(st.o[mt][n][2 * hi + 1], alphas[mt][hi]);
            }
        }
}

// Both parts at once.
template <int D, int MT>
__device__ __forceinline__ void fa_tile_softmax(fa_state<D, MT> &st,
                                                float (&s)[MT][fa_bn<D>() / 8][4],
                                                uint32_t (&p)[MT][fa_bn<D>() / 16][4], int p0,
                                                const int (&last)[MT][2], float sl2,
                                                bool hi_rows) {
    float alphas[MT][2];
    const bool any = fa_tile_probs<D, MT>(st, s, p0, last, sl2, hi_rows, alphas);
    fa_tile_pack<D, MT>(p, s);
    fa_tile_rescale<D, MT>(st, alphas, any, hi_rows);
}

// One tile: keys at positions p0 .. p0 + fa_bn<D>() - 1 (ks, vs: their K and V rows in shared
// memory, rows of D + FA_PAD; rows past the sequence are zeros) against the warp's query rows
// (qs: 16 MT rows). Row (mt, hi) sees the positions <= last[mt][hi] (-1: none). hi_rows false
// leaves rows 8..15 of every m-tile out of the softmax (padding rows, whose results nobody
// reads). A row that sees no key of the tile keeps its state bit for bit: its scale factor is
// exactly 1 (or 0 on an empty state), its probabilities +0, and the MMA adds only zeros.
template <int D, int MT>
__device__ __forceinline__ void fa_tile(fa_state<D, MT> &st, const tr_bf16 *qs,
                                        const tr_bf16 *ks, const tr_bf16 *vs, int p0,
                                        const int (&last)[MT][2], float sl2, bool hi_rows) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD, NT = BN / 8;
    float s[MT][NT][4];
    fa_gemm_abt<D, MT, NT>(s, qs, ks, LDS);
    uint32_t p[MT][BN / 16][4];
    fa_tile_softmax<D, MT>(st, s, p, p0, last, sl2, hi_rows);
    fa_gemm_pv<D, MT, BN / 16>(st.o, p, vs, LDS);
}

// Folding softmax chunk C into the accumulated chunks A of one row (both with full row sums):
// with m = max(mA, mC), A = A 2^(mA - m) + C 2^(mC - m). An empty side (m = -inf) is no
// rescaling but a plain copy, so folds with empty chunks change no bit.
struct fa_fold_t {
    int mode;   // 0: keep A (C empty), 1: take C (A empty), 2: blend
    float a, c;
};

__device__ __forceinline__ fa_fold_t fa_fold_coef(float ma, float mc) {
    if (mc == -INFINITY) return {0, 0.0f, 0.0f};
    if (ma == -INFINITY) return {1, 0.0f, 0.0f};
    const float m = fmaxf(ma, mc);
    return {2, fa_ex2(__fsub_rn(ma, m)), fa_ex2(__fsub_rn(mc, m))};
}
// The blend is formed whatever the mode and then chosen, so that a fold of many values
// compiles to selects rather than a branch per value.
__device__ __forceinline__ float fa_fold(const fa_fold_t &f, float a, float c) {
    const float b = __fmaf_rn(a, f.a, __fmul_rn(c, f.c));
    return f.mode == 0 ? a : f.mode == 1 ? c : b;
}
__device__ __forceinline__ float fa_fold_max(const fa_fold_t &f, float ma, float mc) {
    return f.mode == 0 ? ma : f.mode == 1 ? mc : fmaxf(ma, mc);
}

// Output value of a finished row: o / l as o * (1/l), each rounded to nearest.
__device__ __forceinline__ float fa_inv(float l) { return __frcp_rn(l); }
__device__ __forceinline__ float fa_out(float o, float inv) { return __fmul_rn(o, inv); }
// Natural log-sum-exp of a finished row from m (log2 units) and l.
__device__ __forceinline__ float fa_lse(float m, float l) {
    return __fmul_rn(__fadd_rn(m, log2f(l)), 0.69314718055994531f);
}

// ---- shared prefixes (tr_doc_layout.prefix) ----

// Document e's prefix: returns its length (0: none; pre NULL: no document has one) and sets
// ps to its first token.
__device__ __forceinline__ int fa_prefix_of(const int32_t *ds, const int32_t *pre, int e,
                                            int &ps) {
    const int p = pre ? pre[e] : -1;
    ps = p < 0 ? 0 : ds[p];
    return p < 0 ? 0 : ds[p + 1] - ps;
}
// Row of the key at context position p of a document starting at token s whose prefix is
// the pl tokens from ps.
__device__ __forceinline__ int fa_key_row(int p, int ps, int pl, int s) {
    return p < pl ? ps + p : s + (p - pl);
}
// The end of the query rows that see document e's keys: its own end, or for a prefix
// document the end of the documents naming it (they follow it directly, and every one of
// their rows sees all of its keys, causality holding as their rows all come later).
__device__ __forceinline__ int fa_query_end(const int32_t *ds, const int32_t *pre, int n_docs,
                                            int e) {
    int f = e + 1;
    if (pre)
        while (f < n_docs && pre[f] == e) f++;
    return ds[f];
}

// The KV tiles a tile of query rows [t0, t1) walks: for each document overlapping the rows,
// in order, the keys of its context BN at a time, from position 0: its prefix's (if any),
// then its own up to min(its end, t1). Rows of the document at token i see the positions up
// to i - s + pl.
struct fa_kv_iter {
    int e;        // document (-1: done)
    int s;        // its first token
    int lim;      // its own keys are tokens s .. lim - 1
    int ps, pl;   // its prefix: pl tokens from ps (pl 0: none)
    int p0;       // the tile's first position in the context
};

// Row of the key at position p of the iterator's document; -1 past its keys.
__device__ __forceinline__ int fa_kv_row(const fa_kv_iter &it, int p) {
    const int key = fa_key_row(p, it.ps, it.pl, it.s);
    return p < it.pl || key < it.lim ? key : -1;
}

// From document it.e on: the first non-empty one that starts before t1, at its first tile.
__device__ __forceinline__ void fa_iter_doc(fa_kv_iter &it, const int32_t *ds,
                                            const int32_t *pre, int n_docs, int t1) {
    while (it.e < n_docs && ds[it.e + 1] <= ds[it.e]) it.e++;
    if (it.e >= n_docs || ds[it.e] >= t1) {
        it.e = -1;
        return;
    }
    it.s = ds[it.e];
    it.lim = min(ds[it.e + 1], t1);
    it.pl = fa_prefix_of(ds, pre, it.e, it.ps);
    it.p0 = 0;
}
__device__ __forceinline__ void fa_iter_first(fa_kv_iter &it, const int32_t *ds,
                                              const int32_t *pre, int n_docs, int t0, int t1) {
    it.e = fa_doc_of(ds, n_docs, t0);
    fa_iter_doc(it, ds, pre, n_docs, t1);
}
template <int BN>
__device__ __forceinline__ void fa_iter_next(fa_kv_iter &it, const int32_t *ds,
                                             const int32_t *pre, int n_docs, int t1) {
    it.p0 += BN;
    if (it.p0 < it.pl + (it.lim - it.s)) return;
    it.e++;
    fa_iter_doc(it, ds, pre, n_docs, t1);
}

// The stage before `stage` in a ring of ST (the one an iteration refills), without a division.
template <int ST>
__device__ __forceinline__ int fa_prev_stage(int stage) { return stage == 0 ? ST - 1 : stage - 1; }

// ROWS rows of D bf16 values, rows src, src + stride, ... (the first `valid` of them; the
// rest zeros) into the shared tile at the 32-bit address dst (laid out as fa_sm_off<D, SW>),
// by NTH threads: the 16-byte aligned case of fa_load_rows, each thread's pieces at addresses
// it computes from its own row and column, without a per-row callback.
template <int D, int ROWS, int NTH, bool SW = false>
__device__ __forceinline__ void fa_cp_tile(uint32_t dst, const tr_bf16 *src, size_t stride,
                                           int valid, const void *any, int tid) {
    constexpr int CPR = D / 8, RP = NTH / CPR;   // pieces a row, rows a pass
    static_assert(NTH % CPR == 0, "whole rows a pass");
    // a pass moves the shared address by RP rows (the swizzle repeats every 8 rows)
    static_assert(!SW || RP % 8 == 0, "swizzled passes of whole 8-row groups");
    constexpr uint32_t PASS = RP * (SW ? 128 : (D + FA_PAD) * (int)sizeof(tr_bf16));
    const int r0 = tid / CPR, c = (tid % CPR) * 8;
    const tr_bf16 *p = src + (size_t)r0 * stride + c;
    const size_t step = (size_t)RP * stride;
    uint32_t at = dst + (uint32_t)fa_sm_off<D, SW>(r0, c, ROWS);
#pragma unroll
    for (int j = 0; j < (ROWS + RP - 1) / RP; j++, p += step, at += PASS) {
        const int r = r0 + j * RP;
        if (ROWS % RP != 0 && r >= ROWS) break;   // the last pass's threads past the tile
        const bool ok = r < valid;
        fa_cp16_at(at, ok ? (const void *)p : any, ok ? 16u : 0u);
    }
}

// The K and V rows of the iterator's tile x (BN context positions from x.p0; keys past the
// document's are zeros) into shared ks and vs, by NTH threads. A tile wholly in the prefix or
// wholly in the document's own keys is a run of rows: fa_cp_tile's copies when rows are
// 16-byte aligned (vec); a tile across the two, or unaligned rows, takes fa_load_rows's.
template <int D, int BN, int NTH, bool SW = false>
__device__ __forceinline__ void fa_load_kv_tile(tr_bf16 *ks, tr_bf16 *vs, const fa_kv_iter &x,
                                                const tr_bf16 *kb, const tr_bf16 *vb, size_t ld,
                                                bool vec, const void *any, int tid) {
    const bool own = x.p0 >= x.pl;
    if (vec && (own || x.p0 + BN <= x.pl)) {
        const int key0 = fa_key_row(x.p0, x.ps, x.pl, x.s);
        const int valid = own ? x.lim - key0 : BN;
        fa_cp_tile<D, BN, NTH, SW>(fa_smem(ks), kb + (size_t)key0 * ld, ld, valid, any, tid);
        fa_cp_tile<D, BN, NTH, SW>(fa_smem(vs), vb + (size_t)key0 * ld, ld, valid, any, tid);
        return;
    }
    fa_load_rows<D, SW>(
        ks, BN,
        [&](int r) -> const tr_bf16 * {
            const int key = fa_kv_row(x, x.p0 + r);
            return key >= 0 ? kb + (size_t)key * ld : nullptr;
        },
        tid, NTH, vec, any);
    fa_load_rows<D, SW>(
        vs, BN,
        [&](int r) -> const tr_bf16 * {
            const int key = fa_kv_row(x, x.p0 + r);
            return key >= 0 ? vb + (size_t)key * ld : nullptr;
        },
        tid, NTH, vec, any);
}

// The K/V tiles of a query tile's walk through ST shared stages (ks, vs: ST stages of BN rows
// each), as the forward and the dQ pass stream them: ahead is the last tile loaded, tile j of
// the walk going to stage j % ST in cp.async group j (group 0 also holds what the caller
// queued before start). Each iteration refills the stage used an iteration before.
template <int D, int BN, int NTH, int ST, bool SW = false>
struct fa_kv_stages {
    static constexpr int STAGE = BN * (SW ? D : D + FA_PAD);   // elements a stage
    tr_bf16 *ks, *vs;
    const tr_bf16 *kb, *vb;   // the kv head's first K and V columns
    size_t ld;
    bool vec;
    const void *any;          // any global address (zero-filled copies read none)
    const int32_t *ds, *pre;  // tr_doc_layout's doc_start and prefix
    int n_docs, t1, tid;
    fa_kv_iter ahead;

    __device__ __forceinline__ void load(int stage) {
        fa_load_kv_tile<D, BN, NTH, SW>(ks + stage * STAGE, vs + stage * STAGE, ahead, kb, vb, ld,
                                        vec, any, tid);
    }
    // The tile after ahead (if any) into stage, and a group for it, empty or not.
    __device__ __forceinline__ void refill(int stage) {
        if (ahead.e >= 0) {
            fa_iter_next<BN>(ahead, ds, pre, n_docs, t1);
            if (ahead.e >= 0) load(stage);
        }
        fa_cp_commit();
    }
    // The walk's first n tiles (ST - 1 unless a kernel holds two stages at once) from first.
    __device__ __forceinline__ void start(const fa_kv_iter &first, int n = ST - 1) {
        ahead = first;
        if (ahead.e >= 0) load(0);
        fa_cp_commit();
#pragma unroll
        for (int s = 1; s < ST - 1; s++)
            if (s < n) refill(s);
    }
};
