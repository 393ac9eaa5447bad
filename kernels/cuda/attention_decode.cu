// Decode attention over the paged KV cache, bf16 path, on the flash forward's arithmetic: one
// block per (sequence, kv head, group of up to 16 of its query heads), whose query heads are
// the rows of the forward's MMA tile, so each KV block is read once for the whole group. The
// context is split into softmax chunks (a.chunk positions), fixed by the position in the
// sequence and not by the batch; the block's warps take chunks in turn, each streaming its
// tiles through its own cp.async stages, and warp 0 folds the finished chunks in position order, exactly as
// the forward folds a long row's chunks. So out row b is bitwise attention_forward's row of
// the same token (attention_tile.cuh says why). Positions at and past seq_len[b] are zeros in
// shared memory, whatever the cache holds there. A block holds all of its chunks, so one long
// sequence alone runs on only KVH blocks, well under the memory bandwidth (batches of 64 and
// more fill it); the split walk (tr_backend_cuda_decode_split) gives such a launch a block a
// chunk (one warp), which publish their chunks to the backend's memory, and a second launch
// folds each row's chunks in position order with warp 0's fold: the same bits.
#include <stdlib.h>

#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_tile.cuh"

#define FA_DEC_MAX_WARPS 4

// attention_decode_rope's part of a block (a.x non-NULL): rope_kv_write of its sequence's row
// b for its query heads h0.. (nrows of them, into qs as well, rows past nrows zeros as
// fa_load_rows leaves them) and its kv head, the key and v's row into the row's slot; cs: D
// floats of scratch. rope.cu's arithmetic: the angle pos * inv_freq in fp32, cos and sin in
// double rounded to fp32, the rotation in fp32 without contraction, rounded once. One block
// per (sequence, kv head) (the launch sees to it), so no other block reads or writes these
// heads. Ends on a block barrier, after which the block's copies may read the slot.
template <int D>
__device__ void fa_dec_rope(const fa_dec_args &a, tr_bf16 *qs, float *cs, int b, int kvh,
                            int h0, int nrows) {
    constexpr int HALF = D / 2, LDS = D + FA_PAD;
    const int tid = threadIdx.x, nthr = blockDim.x;
    const float p = (float)a.pos[b];
    for (int f = tid; f < HALF; f += nthr) {
        const float angle = __fmul_rn(p, a.inv_freq[f]);
        cs[f] = (float)cos((double)angle);
        cs[HALF + f] = (float)sin((double)angle);
    }
    for (int i = tid; i < (16 - nrows) * D; i += nthr)
        qs[(nrows + i / D) * LDS + i % D] = __float2bfloat16_rn(0.0f);
    __syncthreads();
    tr_bf16 *xr = a.x + (size_t)b * (size_t)a.ld;
    const int slot = a.slot[b];
    // rows 0 .. nrows - 1: the query heads; row nrows: the key head (k's heads follow q's)
    for (int i = tid; i < (nrows + 1) * HALF; i += nthr) {
        const int r = i / HALF, f = i % HALF;
        tr_bf16 *x1 = xr + (size_t)(r < nrows ? h0 + r : a.H + kvh) * D + f;
        const float xa = tr_f32(x1[0]), xb = tr_f32(x1[HALF]), c = cs[f], s = cs[HALF + f];
        const tr_bf16 y1 = __float2bfloat16_rn(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
        const tr_bf16 y2 = __float2bfloat16_rn(__fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s)));
        x1[0] = y1;
        x1[HALF] = y2;
        if (r < nrows) {
            qs[r * LDS + f] = y1;
            qs[r * LDS + f + HALF] = y2;
        } else if (slot >= 0) {
            const size_t to = ((size_t)slot * a.KVH + kvh) * D + f;
            const tr_bf16 *vr = a.v + (size_t)b * (size_t)a.ld + (size_t)kvh * D + f;
            tr_bf16 *kp = const_cast<tr_bf16 *>(a.kp), *vp = const_cast<tr_bf16 *>(a.vp);
            kp[to] = y1;
            kp[to + HALF] = y2;
            vp[to] = vr[0];
            vp[to + HALF] = vr[HALF];
        }
    }
    __syncthreads();
}

// A block's rows: sequence b, kv head kvh and its query heads h0 .. h0 + nrows - 1 (group
// blockIdx.x % n_hg of up to 16), whose outputs start at orow.
struct fa_dec_rows {
    int b, kvh, h0, nrows;
    tr_bf16 *orow;
};
template <int D>
__device__ __forceinline__ fa_dec_rows fa_dec_rows_of(const fa_dec_args &a) {
    const int b = blockIdx.y, kvh = blockIdx.x / a.n_hg, hg = blockIdx.x % a.n_hg;
    const int G = a.H / a.KVH, h0 = kvh * G + hg * 16;
    return {b, kvh, h0, min(16, G - hg * 16), a.out + ((size_t)b * a.H + h0) * D};
}

// The block's query rows into qs (16 rows, those past nrows zeros) by its nthr threads:
// rotated here, with the key written into the cache (attention_decode_rope: a.x), or copied
// from q; the copies are committed as one group.
template <int D>
__device__ __forceinline__ void fa_dec_query(const fa_dec_args &a, const fa_dec_rows &w,
                                             tr_bf16 *qs, float *cs, int nthr) {
    if (a.x) {
        fa_dec_rope<D>(a, qs, cs, w.b, w.kvh, w.h0, w.nrows);
    } else {
        const tr_bf16 *qrow = a.q + (size_t)w.b * (size_t)a.ld;
        fa_load_rows<D>(
            qs, 16,
            [&](int r) -> const tr_bf16 * {
                return r < w.nrows ? qrow + (size_t)(w.h0 + r) * D : nullptr;
            },
            threadIdx.x, nthr, a.vecq != 0, a.q);
    }
    fa_cp_commit();
}

// One published chunk: m[16], l[16] (full row sums), o[16][D] fp32.
template <int D>
constexpr int fa_dec_slot_floats() { return 32 + 16 * D; }

// Folds published chunk sl into a lane's accumulated rows g and g + 8 (am, al) and its output
// columns of 8-column blocks i0 .. i0 + NI - 1 (ao[i][2 r + cc]: row g + 8 r, column
// 8 (i0 + i) + 2 t + cc): each value's fold is its own, whichever lanes fold the others.
template <int D, int NI>
__device__ __forceinline__ void fa_dec_fold(float (&am)[2], float (&al)[2], float (&ao)[NI][4],
                                            const float *sl, int i0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float mc = sl[g + 8 * r], lc = sl[16 + g + 8 * r];
        const fa_fold_t f = fa_fold_coef(am[r], mc);
        al[r] = fa_fold(f, al[r], lc);
        am[r] = fa_fold_max(f, am[r], mc);
#pragma unroll
        for (int i = 0; i < NI; i++)
#pragma unroll
            for (int cc = 0; cc < 2; cc++) {
                const float c = sl[32 + (g + 8 * r) * D + (i0 + i) * 8 + 2 * t + cc];
                ao[i][2 * r + cc] = fa_fold(f, ao[i][2 * r + cc], c);
            }
    }
}

// A finished row's columns as the fold leaves them (ao, al as fa_dec_fold's) into out rows
// orow + row D, rows below nrows.
template <int D, int NI>
__device__ __forceinline__ void fa_dec_store(tr_bf16 *orow, const float (&ao)[NI][4],
                                             const float (&al)[2], int nrows, int i0, bool out4) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = g + 8 * r;
        if (row >= nrows) continue;
        const float inv = fa_inv(al[r]);
        tr_bf16 *o = orow + (size_t)row * D + i0 * 8 + 2 * t;
#pragma unroll
        for (int i = 0; i < NI; i++)
            fa_store2(o + i * 8, fa_out(ao[i][2 * r], inv), fa_out(ao[i][2 * r + 1], inv), out4);
    }
}

template <int D, int NST>
__global__ void __launch_bounds__(FA_DEC_MAX_WARPS * 32) fa_decode_kernel(const fa_dec_args a) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const int W = (int)(blockDim.x >> 5), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm);
    tr_bf16 *wst = qs + (16 + warp * NST * 2 * BN) * LDS;   // this warp's stages: K then V
    float *slots = reinterpret_cast<float *>(qs + (16 + W * NST * 2 * BN) * LDS);
    long long *offs0 = reinterpret_cast<long long *>(slots + W * fa_dec_slot_floats<D>());
    long long *offs = offs0 + warp * BN;   // this warp's slot offsets of the tile being loaded
    float *cs = reinterpret_cast<float *>(offs0 + W * BN);   // attention_decode_rope's cos, sin
    tr_pdl_wait();
    tr_pdl_release();
    const fa_dec_rows rw = fa_dec_rows_of<D>(a);
    const int b = rw.b, kvh = rw.kvh, nrows = rw.nrows;
    tr_bf16 *orow = rw.orow;
    const bool split = a.part != nullptr;   // the split walk: one turn, chunks published

    fa_dec_query<D>(a, rw, qs, cs, (int)blockDim.x);   // a.x: never split (tr_fa_decode_splits)
    const int n = a.seq_len[b];
    if (n <= 0) {   // no keys: zeros, as the row kernel gives (split: the fold's launch)
        for (int i = tid; i < nrows * D && !split; i += blockDim.x)
            orow[i] = __float2bfloat16_rn(0.0f);
        fa_cp_wait<0>();
        return;
    }
    const int nch = (n + a.chunk - 1) / a.chunk;
    const int32_t *tbl = a.table + (size_t)b * a.max_blocks;
    const size_t sstride = (size_t)a.KVH * D;
    const tr_bf16 *kb = a.kp + (size_t)kvh * D, *vb = a.vp + (size_t)kvh * D;
    const int bs = a.block_size;
    const bool veckv = a.veckv != 0;
    const bool fast = veckv && a.bs_log2 >= 0;   // the copies' lean path (load, below)
    // every row sees the whole context: padding rows (heads past nrows, zeros) too, which
    // costs nothing, keeps their state finite, and lets fa_tile skip the mask on full tiles
    const int last[1][2] = {{n - 1, n - 1}};
    const bool hi_rows = nrows > 8;

    fa_state<D, 1> st;
    float am[2] = {-INFINITY, -INFINITY}, al[2] = {0.0f, 0.0f}, ao[D / 8][4];   // warp 0's fold
#pragma unroll
    for (int i = 0; i < D / 8; i++) ao[i][0] = ao[i][1] = ao[i][2] = ao[i][3] = 0.0f;
    fa_cp_wait<0>();
    __syncthreads();

    for (int c0 = split ? (int)blockIdx.z * W : 0; c0 < nch; c0 += W) {
        const int c = c0 + warp;
        if (c < nch) {
            fa_reset(st);
            const int pb = c * a.chunk, pe = min(n, pb + a.chunk);
            const int nt = (pe - pb + BN - 1) / BN;
            auto load = [&](int kt) {
                tr_bf16 *ks = wst + (kt % NST) * 2 * BN * LDS;
                const int p0 = pb + kt * BN;
                if (fast) {
                    // A lane copies one 16-byte column piece of every RS-th row, each row's
                    // slot looked up as it goes (the warp's rows of one copy share a block, so
                    // a lookup is one address): the instructions a tile's copies took were half
                    // of a tile's, at two warps an SM (Nsight Compute).
                    constexpr int CPR = D / 8, RS = 32 / CPR;
                    const int r0 = lane / CPR, c = (lane % CPR) * 8;
                    const uint32_t kd = fa_smem(ks) + (uint32_t)((r0 * LDS + c) * 2);
                    const uint32_t vd = kd + (uint32_t)(BN * LDS * 2);
#pragma unroll 4
                    for (int r = r0; r < BN; r += RS) {
                        const int p = p0 + r;
                        const bool in = p < n;
                        const long long o =
                            in ? ((long long)__ldg(tbl + (p >> a.bs_log2)) * bs + (p & (bs - 1))) *
                                         (long long)sstride + c
                               : 0;
                        const uint32_t at = (uint32_t)((r - r0) * LDS * 2);
                        fa_cp16_at(kd + at, in ? (const void *)(kb + o) : a.kp, in ? 16u : 0u);
                        fa_cp16_at(vd + at, in ? (const void *)(vb + o) : a.vp, in ? 16u : 0u);
                    }
                    return;
                }
                // element offsets of the tile's slots, one table lookup per row (-1: past n)
                __syncwarp();   // the previous tile's copies have read offs
                for (int r = lane; r < BN; r += 32) {
                    const int p = p0 + r;
                    offs[r] = p < n ? ((long long)__ldg(tbl + p / bs) * bs + p % bs) *
                                          (long long)sstride
                                    : -1;
                }
                __syncwarp();
                fa_load_rows<D>(
                    ks, BN,
                    [&](int r) -> const tr_bf16 * {
                        const long long o = offs[r];
                        return o < 0 ? nullptr : kb + o;
                    },
                    lane, 32, veckv, a.kp);
                fa_load_rows<D>(
                    ks + BN * LDS, BN,
                    [&](int r) -> const tr_bf16 * {
                        const long long o = offs[r];
                        return o < 0 ? nullptr : vb + o;
                    },
                    lane, 32, veckv, a.vp);
            };
            for (int i = 0; i < NST - 1; i++) {
                if (i < nt) load(i);
                fa_cp_commit();
            }
            for (int kt = 0; kt < nt; kt++) {
                if (kt + NST - 1 < nt) load(kt + NST - 1);
                fa_cp_commit();
                fa_cp_wait<NST - 1>();
                __syncwarp();
                const tr_bf16 *ks = wst + (kt % NST) * 2 * BN * LDS;
                fa_tile<D, 1>(st, qs, ks, ks + BN * LDS, pb + kt * BN, last, a.sl2, hi_rows);
                __syncwarp();   // the stage is refilled next
            }
            if (nch > 1 || split) {   // publish the chunk for the fold (split: the fold's launch)
                float *sl = split ? a.part + (((size_t)b * gridDim.x + blockIdx.x) *
                                                  (size_t)a.part_chunks +
                                              (size_t)c) *
                                                 fa_dec_slot_floats<D>()
                                  : slots + warp * fa_dec_slot_floats<D>();
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float l = fa_quad_sum(st.l[0][r]);
                    if (t == 0) {
                        sl[g + 8 * r] = st.m[0][r];
                        sl[16 + g + 8 * r] = l;
                    }
#pragma unroll
                    for (int i = 0; i < D / 8; i++) {
                        sl[32 + (g + 8 * r) * D + i * 8 + 2 * t] = st.o[0][i][2 * r];
                        sl[32 + (g + 8 * r) * D + i * 8 + 2 * t + 1] = st.o[0][i][2 * r + 1];
                    }
                }
            }
        }
        if (split) return;   // one turn; the fold's launch takes it from here
        if (nch > 1) {
            __syncthreads();
            if (warp == 0) {
                for (int j = 0; j < W && c0 + j < nch; j++)   // chunks in position order
                    fa_dec_fold<D, D / 8>(am, al, ao, slots + j * fa_dec_slot_floats<D>(), 0);
            }
            __syncthreads();   // the slots are rewritten by the next turn
        }
    }

    if (warp != 0 || split) return;
    if (nch == 1) {   // warp 0 ran the only chunk: its state is the row
#pragma unroll
        for (int r = 0; r < 2; r++) al[r] = fa_quad_sum(st.l[0][r]);
#pragma unroll
        for (int i = 0; i < D / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) ao[i][e] = st.o[0][i][e];
    }
    fa_dec_store<D, D / 8>(orow, ao, al, nrows, 0, a.out4 != 0);
}

// The split walk's second launch: row b's query heads h0.. from their published chunks, folded
// in position order as the walk's warp 0 folds them (fa_dec_fold), or taken as they are when
// there is one (as warp 0 takes its own), and stored as the walk stores them: the same bits.
// Warp w of D / 32 takes output columns [32 w, 32 w + 32), which fold independently.
template <int D>
__global__ void __launch_bounds__(D) fa_decode_fold_kernel(const fa_dec_args a) {
    constexpr int NI = 4, SLOT = fa_dec_slot_floats<D>();   // 8-column blocks a warp
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const fa_dec_rows rw = fa_dec_rows_of<D>(a);
    const int b = rw.b, nrows = rw.nrows;
    tr_bf16 *orow = rw.orow;
    const int n = a.seq_len[b];
    if (n <= 0) {   // no keys: zeros, as the walk gives
        for (int i = threadIdx.x; i < nrows * D; i += blockDim.x)
            orow[i] = __float2bfloat16_rn(0.0f);
        return;
    }
    const int nch = (n + a.chunk - 1) / a.chunk;
    const float *part = a.part + ((size_t)b * gridDim.x + blockIdx.x) * (size_t)a.part_chunks * SLOT;
    float am[2] = {-INFINITY, -INFINITY}, al[2] = {0.0f, 0.0f}, ao[NI][4];
#pragma unroll
    for (int i = 0; i < NI; i++) ao[i][0] = ao[i][1] = ao[i][2] = ao[i][3] = 0.0f;
    if (nch == 1) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            al[r] = part[16 + g + 8 * r];
#pragma unroll
            for (int i = 0; i < NI; i++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++)
                    ao[i][2 * r + cc] = part[32 + (g + 8 * r) * D + (warp * NI + i) * 8 + 2 * t + cc];
        }
    } else {
        // unrolled so that later chunks' loads go out while earlier ones fold (a long
        // context's chunks, 128 at 32K positions, are a chain of folds)
#pragma unroll 4
        for (int c = 0; c < nch; c++)
            fa_dec_fold<D, NI>(am, al, ao, part + (size_t)c * SLOT, warp * NI);
    }
    fa_dec_store<D, NI>(orow, ao, al, nrows, warp * NI, a.out4 != 0);
}

// ---- a chunk shared by the block's warps ----
//
// The walk above gives each warp a chunk of its own and leaves it to pass the chunk's tiles
// one after another, each tile's copies, products and softmax in turn; a short context (two
// chunks at 512 positions) then has two warps a block and most of the device's schedulers
// idle. Here the FA_DEC_COOP_WARPS warps of a block take one chunk at a time together, in
// three phases between block barriers, and reach the walk's bits:
//   A. warp w takes tiles w, w + W, ... of the chunk: its scores Q K^T (kept in registers)
//      and each row's maximum (fa_row_max, published);
//   B. for each of its tiles the warp replays the reference point's recurrence over the
//      maxima of the tiles before it (fa_ref_next, the walk's comparisons in its order), then
//      forms the tile's probabilities and row sums (fa_row_exp) and publishes them with the
//      scale factor and P's fragments;
//   C. warp w takes channels [w D / W, (w + 1) D / W) of the output and applies, tile by tile
//      in order, the walk's rescale and P V to them (an output's chain of MMAs involves no
//      other channel), runs the row sums' recurrence, and folds the chunk into the ones
//      before as the walk's warp 0 does. The fold's coefficients are the same for every warp.
// All threads copy a chunk's rows, looking each row's slot up as they go (the walk's lean
// path, so only for blocks of a power of two and aligned slots); NB chunk buffers, the K
// tiles of chunk c + NB copied once phase A has read chunk c's and its V tiles after phase C.
// The chunk is fixed at FA_DEC_COOP_CHUNK positions (the backend's default) so that its tiles
// fit the shared arrays; another chunk takes the walk.
#define FA_DEC_COOP_WARPS 4
#define FA_DEC_COOP_CHUNK 256

template <int D, int NB>
constexpr size_t fa_dec_coop_shared() {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD, CT = FA_DEC_COOP_CHUNK / BN;
    return (size_t)(16 + NB * 2 * CT * BN) * LDS * sizeof(tr_bf16) +   // Q, the buffers
           (size_t)CT * (16 + 16 + 64) * sizeof(float) +               // maxima, factors, sums
           (size_t)CT * (BN / 16) * 32 * sizeof(uint4) +               // P's fragments
           (size_t)NB * FA_DEC_COOP_CHUNK * sizeof(int32_t) +          // the chunks' slots
           (size_t)D * sizeof(float);                                  // rope's cos, sin
}

// What a chunk's phases publish to each other, in shared memory: each tile's row maxima
// (tmax, [tile][16]), scale factors (talpha, [tile][16]) and each thread's row sums (trs,
// [tile][lane][2]), and P's fragments (tp, [tile][k16 block][lane]).
struct fa_coop_pub {
    float *tmax, *talpha, *trs;
    uint4 *tp;
};

// Phase A: the scores of the warp's tiles (w, w + W, ... below nt, the chunk's K tiles at ks,
// its first position pb) and their rows' maxima, published.
template <int D, int TPW>
__device__ __forceinline__ void fa_coop_scores(float (&s)[TPW][1][fa_bn<D>() / 8][4],
                                               const tr_bf16 *qs, const tr_bf16 *ks,
                                               const fa_coop_pub &pub, int nt, int pb,
                                               const int (&last)[1][2], bool hi_rows,
                                               float sl2) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD, W = FA_DEC_COOP_WARPS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < TPW; i++) {
        const int k = warp + i * W;
        if (k >= nt) continue;
        fa_gemm_abt<D, 1, BN / 8>(s[i], qs, ks + k * BN * LDS, LDS);
        const int p0 = pb + k * BN;
        const bool whole = fa_tile_whole<D, 1>(last, p0, hi_rows);
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            if (hi == 1 && !hi_rows) continue;
            const float mx = fa_row_max<D, 1>(s[i], 0, hi, last[0][hi] - p0, whole, sl2);
            if (t == 0) pub.tmax[k * 16 + g + 8 * hi] = mx;
        }
    }
}

// Phase B: the warp's tiles' probabilities from the reference point before each (replayed
// over the published maxima of the tiles before it), their row sums and scale factors, and
// P's fragments, published.
template <int D, int TPW>
__device__ __forceinline__ void fa_coop_probs(float (&s)[TPW][1][fa_bn<D>() / 8][4],
                                              const fa_coop_pub &pub, int nt, bool hi_rows,
                                              float sl2) {
    constexpr int BN = fa_bn<D>(), KT = BN / 16, W = FA_DEC_COOP_WARPS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < TPW; i++) {
        const int k = warp + i * W;
        if (k >= nt) continue;
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int row = g + 8 * hi;
            float rs = 0.0f, alpha = 1.0f;
            if (hi == 1 && !hi_rows) {   // padding rows: P zeros, the state untouched
#pragma unroll
                for (int nn = 0; nn < BN / 8; nn++) s[i][0][nn][2] = s[i][0][nn][3] = 0.0f;
            } else {
                float mold = -INFINITY;   // the reference point before tile k
                for (int j = 0; j < k; j++) mold = fa_ref_next(pub.tmax[j * 16 + row], mold);
                const float mnew = fa_ref_next(pub.tmax[k * 16 + row], mold);
                const float mu = mnew == -INFINITY ? 0.0f : mnew;
                alpha = fa_ex2(__fsub_rn(mold, mu));
                rs = fa_row_exp<D, 1>(s[i], 0, hi, sl2, mu);
            }
            pub.trs[(k * 32 + lane) * 2 + hi] = rs;
            if (t == 0) pub.talpha[k * 16 + row] = alpha;
        }
        uint32_t p[1][KT][4];
        fa_tile_pack<D, 1>(p, s[i]);
#pragma unroll
        for (int kk = 0; kk < KT; kk++)
            pub.tp[(k * KT + kk) * 32 + lane] =
                make_uint4(p[0][kk][0], p[0][kk][1], p[0][kk][2], p[0][kk][3]);
    }
}

// Phase C: the chunk's state on the warp's channels (o; the rows' reference points m and this
// thread's row sums l), tile by tile in order: the walk's rescale, then P V from the chunk's
// V tiles at vs.
template <int D>
__device__ __forceinline__ void fa_coop_output(float (&o)[1][D / FA_DEC_COOP_WARPS / 8][4],
                                               float (&l)[2], float (&m)[2],
                                               const fa_coop_pub &pub, const tr_bf16 *vs,
                                               int nt, bool hi_rows) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD, KT = BN / 16, DW = D / FA_DEC_COOP_WARPS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
    for (int i = 0; i < DW / 8; i++) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.0f;
    l[0] = l[1] = 0.0f;
    m[0] = m[1] = -INFINITY;
    for (int k = 0; k < nt; k++) {
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            if (hi == 1 && !hi_rows) continue;
            const int row = g + 8 * hi;
            const float alpha = pub.talpha[k * 16 + row];
            m[hi] = fa_ref_next(pub.tmax[k * 16 + row], m[hi]);
            l[hi] = __fmaf_rn(l[hi], alpha, pub.trs[(k * 32 + lane) * 2 + hi]);
            // x * 1 is x, and a chunk's first factor (0) meets zeros: multiplying every row
            // gives the bits of the walk's rescale, which skips a warp of ones
#pragma unroll
            for (int i = 0; i < DW / 8; i++) {
                o[0][i][2 * hi] = __fmul_rn(o[0][i][2 * hi], alpha);
                o[0][i][2 * hi + 1] = __fmul_rn(o[0][i][2 * hi + 1], alpha);
            }
        }
        uint32_t p[1][KT][4];
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            const uint4 v = pub.tp[(k * KT + kk) * 32 + lane];
            p[0][kk][0] = v.x;
            p[0][kk][1] = v.y;
            p[0][kk][2] = v.z;
            p[0][kk][3] = v.w;
        }
        fa_gemm_pv<DW, 1, KT>(o, p, vs + k * BN * LDS + warp * DW, LDS);
    }
}

template <int D, int NB>
__global__ void __launch_bounds__(FA_DEC_COOP_WARPS * 32) fa_decode_coop_kernel(
    const fa_dec_args a) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD, W = FA_DEC_COOP_WARPS;
    constexpr int CH = FA_DEC_COOP_CHUNK, CT = CH / BN, KT = BN / 16;
    constexpr int DW = D / W, TPW = (CT + W - 1) / W;   // a warp's channels; tiles in A and B
    static_assert(CH % BN == 0 && DW % 16 == 0, "chunk of whole tiles, channels of k16 pairs");
    extern __shared__ __align__(16) unsigned char fa_sm[];
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm);
    tr_bf16 *bufs = qs + 16 * LDS;   // NB x [CT K tiles; CT V tiles]
    float *tmax = reinterpret_cast<float *>(bufs + NB * 2 * CT * BN * LDS);   // [CT][16]
    float *talpha = tmax + CT * 16;                                           // [CT][16]
    float *trs = talpha + CT * 16;                                            // [CT][32][2]
    uint4 *tp = reinterpret_cast<uint4 *>(trs + CT * 64);                     // [CT][KT][32]
    int32_t *tslot = reinterpret_cast<int32_t *>(tp + CT * KT * 32);          // [NB][CH]
    const fa_coop_pub pub = {tmax, talpha, trs, tp};
    float *cs = reinterpret_cast<float *>(tslot + NB * CH);                   // [D]
    tr_pdl_wait();
    tr_pdl_release();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const fa_dec_rows rw = fa_dec_rows_of<D>(a);
    const int b = rw.b, kvh = rw.kvh, nrows = rw.nrows;
    tr_bf16 *orow = rw.orow;
    const int n = a.seq_len[b];
    const int nch = n > 0 ? (n + CH - 1) / CH : 0;
    const int32_t *tbl = a.table + (size_t)b * a.max_blocks;
    const size_t sstride = (size_t)a.KVH * D;
    const int bs = a.block_size;

    // Chunk c's slots (cache rows; -1 past n) are looked up once, into tslot[c % NB], so that
    // its copies wait on no global load: looked up as the copies went, each pass of a
    // thread's rows waited for its lookups (Nsight Compute: the walk's largest stall). A
    // thread takes rows tid, tid + W*32, ...: its lookups are loaded first (slots_get) and
    // stored when the loads are back (slots_put), so that a phase's work runs in between.
    constexpr int SPT = CH / (W * 32);   // slots a thread
    static_assert(CH % (W * 32) == 0, "slots a thread");
    auto slots_get = [&](int c, int32_t (&sl)[SPT]) {
#pragma unroll
        for (int i = 0; i < SPT; i++) {
            const int p = c * CH + tid + i * W * 32;
            sl[i] = c < nch && p < n
                        ? __ldg(tbl + (p >> a.bs_log2)) * bs + (p & (bs - 1))
                        : -1;
        }
    };
    auto slots_put = [&](int c, const int32_t (&sl)[SPT]) {
#pragma unroll
        for (int i = 0; i < SPT; i++) tslot[(c % NB) * CH + tid + i * W * 32] = sl[i];
    };
    // The first chunks' slots load while RoPE runs (they read the block table, which RoPE's
    // cache write leaves alone), so that the copies after it wait on no lookup.
    int32_t first[NB][SPT];
#pragma unroll
    for (int c = 0; c < NB; c++) slots_get(c, first[c]);
    fa_dec_query<D>(a, rw, qs, cs, W * 32);
    if (n <= 0) {   // no keys: zeros, as the row kernel gives
        for (int i = tid; i < nrows * D; i += W * 32) orow[i] = __float2bfloat16_rn(0.0f);
        fa_cp_wait<0>();
        return;
    }
    const bool hi_rows = nrows > 8;
    const int last[1][2] = {{n - 1, n - 1}};   // every row sees the whole context

    // Chunk c's K (v 0) or V (v 1) tiles into its buffer from its slots, rows past n as
    // zeros; nothing past the last chunk (the caller commits a group either way, so that the
    // count stays fixed).
    auto load = [&](int c, int v) {
        if (c >= nch) return;
        constexpr int CPR = D / 8, RS = W * 32 / CPR;   // 16-byte pieces a row; rows a pass
        const int pb = c * CH, rows = min(CT * BN, (n - pb + BN - 1) / BN * BN);
        const int r0 = tid / CPR, col = (tid % CPR) * 8;
        const tr_bf16 *src = (v ? a.vp : a.kp) + (size_t)kvh * D + col;
        const int32_t *sl = tslot + (c % NB) * CH;
        const uint32_t d0 = fa_smem(bufs + ((c % NB) * 2 + v) * CT * BN * LDS) +
                            (uint32_t)((r0 * LDS + col) * 2);
#pragma unroll 8
        for (int r = r0; r < rows; r += RS) {
            const int32_t slot = sl[r];
            fa_cp16_at(d0 + (uint32_t)((r - r0) * LDS * 2),
                       slot >= 0 ? (const void *)(src + (size_t)slot * sstride) : src,
                       slot >= 0 ? 16u : 0u);
        }
    };
#pragma unroll
    for (int c = 0; c < NB; c++) slots_put(c, first[c]);
    __syncthreads();   // the first chunks' slots
#pragma unroll
    for (int c = 0; c < NB; c++) {
        load(c, 0);
        fa_cp_commit();
        load(c, 1);
        fa_cp_commit();
    }

    // the chunks folded so far (rows g, g + 8; this warp's channels)
    float am[2] = {-INFINITY, -INFINITY}, al[2] = {0.0f, 0.0f}, ao[DW / 8][4];
#pragma unroll
    for (int i = 0; i < DW / 8; i++) ao[i][0] = ao[i][1] = ao[i][2] = ao[i][3] = 0.0f;
    for (int c = 0; c < nch; c++) {
        const int pb = c * CH, nt = (min(n, pb + CH) - pb + BN - 1) / BN;
        const tr_bf16 *ks = bufs + (c % NB) * 2 * CT * BN * LDS, *vs = ks + CT * BN * LDS;
        // groups after chunk c's K: its V and the 2 (NB - 1) of the chunks after it
        fa_cp_wait<2 * NB - 1>();
        __syncthreads();   // chunk c's K tiles (and Q) landed for every thread

        // A: scores and row maxima of the warp's tiles; chunk c + NB's slots looked up
        // meanwhile, into chunk c's (its copies were issued before the barrier above)
        int32_t sl_next[SPT];
        slots_get(c + NB, sl_next);
        float s[TPW][1][BN / 8][4];
        fa_coop_scores<D, TPW>(s, qs, ks, pub, nt, pb, last, hi_rows, a.sl2);
        slots_put(c + NB, sl_next);
        __syncthreads();   // the maxima and slots are published; chunk c's K tiles are read
        load(c + NB, 0);
        fa_cp_commit();

        // B: the warp's tiles' probabilities, sums, factors and P
        fa_coop_probs<D, TPW>(s, pub, nt, hi_rows, a.sl2);
        fa_cp_wait<2 * NB - 1>();
        __syncthreads();   // chunk c's V tiles landed; P, sums and factors are published

        // C: the chunk's output on the warp's channels, tile by tile, then the fold
        float o[1][DW / 8][4], l[2], m[2];
        fa_coop_output<D>(o, l, m, pub, vs, nt, hi_rows);
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const fa_fold_t f = fa_fold_coef(am[hi], m[hi]);
            al[hi] = fa_fold(f, al[hi], fa_quad_sum(l[hi]));
            am[hi] = fa_fold_max(f, am[hi], m[hi]);
#pragma unroll
            for (int i = 0; i < DW / 8; i++)
#pragma unroll
                for (int cc = 0; cc < 2; cc++)
                    ao[i][2 * hi + cc] = fa_fold(f, ao[i][2 * hi + cc], o[0][i][2 * hi + cc]);
        }
        __syncthreads();   // chunk c's buffers and the published arrays are free
        load(c + NB, 1);
        fa_cp_commit();
    }
    fa_cp_wait<0>();
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int row = g + 8 * hi;
        if (row >= nrows) continue;
        const float inv = fa_inv(al[hi]);
        tr_bf16 *o = orow + (size_t)row * D + warp * DW + 2 * t;
#pragma unroll
        for (int i = 0; i < DW / 8; i++)
            fa_store2(o + i * 8, fa_out(ao[i][2 * hi], inv), fa_out(ao[i][2 * hi + 1], inv),
                      a.out4 != 0);
    }
}

// ---- launch (host) ----

template <int D, int NST>
static size_t fa_dec_shared(int W) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD;
    return (size_t)(16 + W * NST * 2 * BN) * LDS * sizeof(tr_bf16) +
           (size_t)W * fa_dec_slot_floats<D>() * sizeof(float) +
           (size_t)W * BN * sizeof(long long) + D * sizeof(float);
}

// split: the split walk, over contexts of up to nch chunks (tr_fa_decode_splits said so).
template <int D, int NST>
static void fa_decode_run(tr_backend *be, const fa_dec_args &a, int32_t B, int W, bool split,
                          int32_t nch) {
    const size_t shm = fa_dec_shared<D, NST>(W);
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_decode_kernel<D, NST>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    fa_dec_args s = a;
    dim3 grid((unsigned)(a.KVH * a.n_hg), (unsigned)B);
    if (split) {
        s.part = tr_cuda_ctx_of(be)->dec_parts;
        s.part_chunks = nch;
        grid.z = (unsigned)((nch + W - 1) / W);
    }
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, true, fa_decode_kernel<D, NST>, grid,
                                         dim3((unsigned)(32 * W)), shm, s)))
        return;
    if (TR_CUDA_LAUNCHED(be, "attention_decode") || !split) return;
    fa_decode_fold_kernel<D><<<dim3(grid.x, grid.y), D, 0, tr_cuda_stream(be)>>>(s);
    TR_CUDA_LAUNCHED(be, "attention_decode fold");
}

// Stages per warp: each costs 2 * BN rows of shared memory (18 KB at D 64), which bounds the
// blocks an SM holds. A grid of at least one block per SM (a decode batch) runs best with
// two (on an H200, 0.5B shape, batch 256, context 512: 28.6 us with two, 34.3 with one, 52.7
// with four); a narrower one (a few long sequences) keeps four in flight per warp.
// TROUPE_CUDA_DECODE_STAGES (1, 2 or 4) overrides the choice, for measuring it.
static int fa_dec_stages(tr_backend *be, const fa_dec_args &a, int32_t B, int W) {
    const char *e = getenv("TROUPE_CUDA_DECODE_STAGES");
    if (e && (e[0] == '1' || e[0] == '2' || e[0] == '4') && !e[1]) return e[0] - '0';
    long blocks = (long)a.KVH * a.n_hg * B;
    long sms = tr_cuda_ctx_of(be)->sms;
    return blocks >= sms || W > 2 ? 2 : 4;
}

template <int D>
static void fa_decode_dispatch(tr_backend *be, const fa_dec_args &a, int32_t B, int W, int nst,
                               bool split, int32_t nch) {
    if (nst == 1) fa_decode_run<D, 1>(be, a, B, W, split, nch);
    else if (nst == 2) fa_decode_run<D, 2>(be, a, B, W, split, nch);
    else fa_decode_run<D, 4>(be, a, B, W, split, nch);
}

// Warps per block: one per chunk of the longest context, up to FA_DEC_MAX_WARPS, but no more
// than it takes for the grid to hold two warps an SM: a block's warps each keep their own
// stages in shared memory, so at a batch of hundreds, where blocks alone fill the device,
// more warps a block would only leave fewer blocks resident (0.5B shape, batch 256, context
// 512, on an H200: 48 us with four warps, 34.2 with two, 28.2 with one).
static int fa_dec_warps(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx) {
    const int nch = (max_ctx + a.chunk - 1) / a.chunk;
    const long blocks = (long)a.KVH * a.n_hg * B, want = 2L * tr_cuda_ctx_of(be)->sms;
    long w = (want + blocks - 1) / blocks;
    if (w > nch) w = nch;
    if (w > FA_DEC_MAX_WARPS) w = FA_DEC_MAX_WARPS;
    return w < 1 ? 1 : (int)w;
}

template <int D, int NB>
static void fa_decode_coop_run(tr_backend *be, const fa_dec_args &a, int32_t B) {
    constexpr size_t shm = fa_dec_coop_shared<D, NB>();
    static_assert(shm <= 227 * 1024, "one block an SM");
    auto kernel = fa_decode_coop_kernel<D, NB>;
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)(a.KVH * a.n_hg), (unsigned)B);
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, true, kernel, grid, dim3(FA_DEC_COOP_WARPS * 32),
                                         shm, a)))
        return;
    TR_CUDA_LAUNCHED(be, "attention_decode");
}

// Whether a launch takes the shared-chunk kernel: it needs the walk's lean copies and the
// backend's default chunk; TROUPE_CUDA_DECODE_COOP forces it where it can run, and the rule
// gives it grids of fewer blocks than two an SM, where the walk leaves schedulers idle, with
// contexts up to 2,048 positions, past which the walk's warps on chunks of their own catch up.
// Measured on an H200 (bench_cuda attention decode, us, walk against shared): 0.5B heads at
// batch 64, context 512 14.1 / 9.7, 1,024 24.2 / 19.0, 2,048 36.6 / 35.3, 4,096 68.7 / 66.2;
// 1.5B's at context 512 20.7 / 16.4, 2,048 54.0 / 55.1; 7B's at batch 16, context 4,096
// 100.9 / 104.0, at batch 64 (512 blocks), context 1,024 78.6 / 106.6.
static bool fa_dec_coop(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx) {
    const int mode = tr_cuda_ctx_of(be)->decode_coop;
    if (mode == 0 || !a.veckv || a.bs_log2 < 0 || a.chunk != FA_DEC_COOP_CHUNK) return false;
    if (mode == 1) return true;
    return (long)a.KVH * a.n_hg * B < 2L * tr_cuda_ctx_of(be)->sms && max_ctx <= 2048;
}

// Whether a launch takes the split walk: tr_backend_cuda_decode_split's mode (off by
// default), not where the shared-chunk kernel runs, not with RoPE in the launch (its block
// per sequence and kv head rotates the key that every block of the row reads), for contexts
// of two chunks and more, and only where every row's chunks fit the backend's memory for them.
// Mode 2 splits grids under two blocks an SM, whose few blocks the walk leaves short of the
// memory's bandwidth: one sequence of 32K positions over 8 KV heads ran at 7% of the copy
// bandwidth (bench/RESULTS.md).
bool tr_fa_decode_splits(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx) {
    const tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->decode_split || !ctx->dec_parts || (a.D != 64 && a.D != 128) ||
        fa_dec_coop(be, a, B, max_ctx))
        return false;
    const long nch = ((long)max_ctx + a.chunk - 1) / a.chunk, blocks = (long)a.KVH * a.n_hg * B;
    if (nch < 2 || (ctx->decode_split == 2 && blocks >= 2L * ctx->sms)) return false;
    const long slot = a.D == 64 ? fa_dec_slot_floats<64>() : fa_dec_slot_floats<128>();
    return (double)blocks * (double)nch * (double)slot <= (double)TR_CUDA_DECODE_PARTS &&
           nch < 65536;   // the grid's z: a block a chunk
}

void tr_fa_decode(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx) {
    if (fa_dec_coop(be, a, B, max_ctx)) {
        // two chunk buffers where they fit beside the rest (D = 64: 156 KB, one block an SM),
        // and where a block an SM is all the grid gives anyway
        const bool two = (long)a.KVH * a.n_hg * B <= tr_cuda_ctx_of(be)->sms;
        if (a.D == 64 && two) fa_decode_coop_run<64, 2>(be, a, B);
        else if (a.D == 64) fa_decode_coop_run<64, 1>(be, a, B);
        else fa_decode_coop_run<128, 1>(be, a, B);
        return;
    }
    const bool split = !a.x && tr_fa_decode_splits(be, a, B, max_ctx);
    // split: a block a chunk (one warp), so that a short context's two chunks are two blocks
    // too, each warp with the deep stages of a narrow grid
    int W = split ? 1 : fa_dec_warps(be, a, B, max_ctx);
    int nst = fa_dec_stages(be, a, B, W);
    const int32_t nch = (max_ctx + a.chunk - 1) / a.chunk;
    if (a.D == 64) fa_decode_dispatch<64>(be, a, B, W, nst, split, nch);
    else fa_decode_dispatch<128>(be, a, B, W, nst, split, nch);
}
