// Flash-attention forward on tensor cores, the bf16 path: one block of four warps per (tile of
// 16 MT rows per warp, head), K and V tiles in FA_FWD_STAGES shared stages filled by cp.async
// (each refilled an iteration after its use, so an iteration waits at one barrier), each
// warp's rows advanced by fa_tile (attention_tile.cuh) over the keys of their documents. Never
// holds more than one tile of scores. Key tiles start at each document's first token, so a
// row's bits do not depend on where its document sits in the batch, and a query tile that
// straddles documents walks each document's keys in turn (rows of the others see nothing
// there, which leaves them unchanged). A document with a shared prefix walks its context: the
// prefix's keys, then its own, tiles and masks by context position (attention_tile.cuh), so
// its rows have the bits of the unshared document's. Where a row's context passes a multiple
// of a.chunk, the finished chunk is folded into an accumulator kept in local memory (touched
// once per chunk), as the decode step folds its split chunks. out [T, H D] and lse [T, H] are
// written, every row.
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/attention_tma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

#define FA_FWD_WARPS 4
#define FA_FWD_STAGES 3   // K/V tiles in shared memory at once (two blocks an SM fit either D)
#define FA_WGP_STAGES 4   // the same for the pipelined wgmma forward (it holds two)
#define FA_TMA_STAGES 4   // the same for the TMA forward (a stage is refilled two tiles later)

// The TMA forward's stages: FA_TMA_STAGES, but two (a double buffer) where the chunk
// accumulator in shared memory needs their room (D = 128: 96 KB for three warpgroups).
template <int D, bool SMACC>
__host__ __device__ constexpr int fa_tma_stages() {
    return SMACC && D > 64 ? 2 : FA_TMA_STAGES;
}

// Folds the warp's state st (the current chunk) into the finished chunks (am, al, acc):
// to_state false stores the result in the accumulator and empties st (a chunk boundary);
// true leaves it in st with full row sums (the end). acc holds a thread's outputs four to an
// element (o[mt][n][0..3]), so that local memory moves 16 bytes an access, `stride` elements
// apart (1 in local memory; a block's thread count in shared memory, where consecutive
// threads' elements are then consecutive).
template <int D, int MT>
__device__ __forceinline__ void fa_fold_acc(float (&am)[MT][2], float (&al)[MT][2], float4 *acc,
                                            fa_state<D, MT> &st, bool to_state,
                                            int stride = 1) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        fa_fold_t f[2];
        bool blend = true;
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const float lc = fa_quad_sum(st.l[mt][hi]);
            f[hi] = fa_fold_coef(am[mt][hi], st.m[mt][hi]);
            const float l = fa_fold(f[hi], al[mt][hi], lc);
            const float m = fa_fold_max(f[hi], am[mt][hi], st.m[mt][hi]);
            blend = blend && f[hi].mode == 2;
            if (to_state) {
                st.m[mt][hi] = m;
                st.l[mt][hi] = l;
            } else {
                am[mt][hi] = m;
                al[mt][hi] = l;
            }
        }
        blend = __all_sync(0xffffffffu, blend);
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            float4 &slot = acc[(mt * (D / 8) + n) * stride];
            const float4 x = slot;
            const float xs[4] = {x.x, x.y, x.z, x.w};
            float r[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const fa_fold_t &fe = f[e >> 1];
                const float c = st.o[mt][n][e];
                r[e] = blend ? __fmaf_rn(xs[e], fe.a, __fmul_rn(c, fe.c)) : fa_fold(fe, xs[e], c);
            }
            if (to_state) {
#pragma unroll
                for (int e = 0; e < 4; e++) st.o[mt][n][e] = r[e];
            } else {
                slot = make_float4(r[0], r[1], r[2], r[3]);
            }
        }
    }
    if (!to_state) fa_reset(st);
}

// Where a row's softmax chunk ends: the tile at context position p0 begins a new chunk when p0
// is a positive multiple of chunk. Tiles of a document come in order from position 0, a tile
// at a time, so the next edge is counted rather than divided for.
struct fa_chunk_edge {
    int next;
    // Whether the tile at p0 (the walk's next, every tile of it in order) starts a chunk.
    __device__ __forceinline__ bool at(int p0, int chunk) {
        if (p0 == 0) next = chunk;
        const bool edge = p0 == next;
        if (edge) next += chunk;
        return edge;
    }
};

// The context position each of a warp's rows w0 + 16 mt + g + 8 r sees up to in the
// iterator's document (-1: a row outside it).
template <int MT>
__device__ __forceinline__ void fa_rows_last(int (&last)[MT][2], const fa_kv_iter &it, int w0,
                                             int g) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = w0 + mt * 16 + g + 8 * r;
            last[mt][r] = i >= it.s && i < it.lim ? i - it.s + it.pl : -1;
        }
}

// The end of a warp's rows (from w0; rows from t1 on are not the block's): the last chunk
// folded in (or the row sums completed), then out and lse written.
template <int D, int MT>
__device__ __forceinline__ void fa_forward_finish(const fa_fwd_args &a, fa_state<D, MT> &st,
                                                  float (&am)[MT][2], float (&al)[MT][2],
                                                  float4 *acc, bool acc_used, int w0, int t1,
                                                  int h, int g, int t, int stride = 1) {
    if (acc_used) {
        fa_fold_acc<D, MT>(am, al, acc, st, true, stride);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) st.l[mt][r] = fa_quad_sum(st.l[mt][r]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = w0 + mt * 16 + g + 8 * r;
            if (i >= t1) continue;
            const float inv = fa_inv(st.l[mt][r]);
            tr_bf16 *o = a.out + ((size_t)i * a.H + h) * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; n++)
                fa_store2(o + n * 8, fa_out(st.o[mt][n][2 * r], inv),
                          fa_out(st.o[mt][n][2 * r + 1], inv), a.out4 != 0);
            if (t == 0) a.lse[(size_t)i * a.H + h] = fa_lse(st.m[mt][r], st.l[mt][r]);
        }
}

template <int D, int MT>
__global__ void __launch_bounds__(FA_FWD_WARPS * 32, 2) fa_forward_kernel(const fa_fwd_args a) {
    constexpr int BM = FA_FWD_WARPS * 16 * MT, BN = fa_bn<D>(), LDS = D + FA_PAD;
    constexpr int NTH = FA_FWD_WARPS * 32, ST = FA_FWD_STAGES;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm);
    tr_bf16 *ks = qs + BM * LDS;   // ST stages of BN rows each
    tr_bf16 *vs = ks + ST * BN * LDS;
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;   // the longest rows start first
    const int t1 = min(t0 + BM, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t ld = (size_t)a.ld;
    const tr_bf16 *kb = a.k + (size_t)kvh * D, *vb = a.v + (size_t)kvh * D;
    const bool vec = a.vec != 0;

    fa_load_run<D>(qs, BM, a.q + (size_t)t0 * ld + (size_t)h * D, ld, t1 - t0, tid, NTH,
                     vec, a.q);
    // it: the key tile taken next; group 0 holds the rows and the first tile
    fa_kv_stages<D, BN, NTH, ST> kv = {ks, vs, kb, vb, ld, vec, a.k, a.doc_start, a.prefix,
                                       a.n_docs, t1, tid, {}};
    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    kv.start(it);

    fa_state<D, MT> st;
    fa_reset(st);
    float am[MT][2], al[MT][2];
    float4 acc[MT * (D / 8)];   // local memory: see fa_opaque_zero
    const int z = fa_opaque_zero();
    fa_chunk_edge edge = {0};
    bool acc_used = false;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            am[mt][hi] = -INFINITY;
            al[mt][hi] = 0.0f;
        }
    const int w0 = t0 + warp * 16 * MT;   // the warp's first row
    int stage = 0;
    while (it.e >= 0) {
        fa_cp_wait<ST - 2>();
        __syncthreads();   // tile `stage` landed; every warp is done with the previous stage
        kv.refill(fa_prev_stage<ST>(stage));
        // the warp's rows in this document: lo..hi, seeing positions up to hi - s + pl
        const int lo = max(w0, it.s), hi = min(w0 + 16 * MT, it.lim) - 1;
        const bool fold = edge.at(it.p0, a.chunk);
        if (lo <= hi && it.p0 <= hi - it.s + it.pl) {
            if (fold) {
                fa_fold_acc<D, MT>(am, al, acc + z, st, false);
                acc_used = true;
            }
            int last[MT][2];
            fa_rows_last<MT>(last, it, w0, g);
            fa_tile<D, MT>(st, qs + warp * 16 * MT * LDS, ks + stage * BN * LDS,
                           vs + stage * BN * LDS, it.p0, last, a.sl2, true);
        }
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();
    fa_forward_finish<D, MT>(a, st, am, al, acc + z, acc_used, w0, t1, h, g, t);
}

// The same walk on Hopper's warpgroup MMA (attention_wgmma.cuh): NWG warpgroups a block, each
// over 64 query rows (a warp's 16 as fa_tile's MT = 1), Q and the K/V stages in
// 128-byte-swizzled shared tiles, Q's fragments taken into registers for each tile. Scores and P V
// come from wgmma, bit for bit mma.sync's (test_wgmma); the softmax between them is
// fa_tile_softmax, the chunk folds and the row ends are the kernel's above, so out and lse
// are the mma.sync kernel's bits. A warpgroup's product is all or nothing for its four warps:
// the group multiplies a tile when any of its rows sees it, and rows that see none of it keep
// their state bit for bit (fa_tile).
//
// PIPE overlaps a warpgroup's softmax with its products: a tile's Q K^T and the previous
// tile's P V are issued together, the softmax's probabilities run while P V still adds into
// the output, and the output is rescaled once it has. Every value takes the same operations
// in the same order, so the bits are the sequential kernel's. The previous tile's V stays in
// its stage an iteration longer, so the stages are FA_WGP_STAGES, two tiles loaded ahead.
template <int D, int NWG, int MINB, bool PIPE>
__global__ void __launch_bounds__(NWG * 128, MINB) fa_forward_wg_kernel(const fa_fwd_args a) {
    constexpr int BM = NWG * 64, BN = fa_bn<D>(), NTH = NWG * 128;
    constexpr int ST = PIPE ? FA_WGP_STAGES : FA_FWD_STAGES, NT = BN / 8;
    constexpr int HOLD = PIPE ? 2 : 1;   // stages in use while the next tiles load
    extern __shared__ __align__(16) unsigned char fa_sm[];
    // swizzled tiles start on 1024-byte boundaries (the launch adds the slack)
    const uint32_t sm0 = (fa_smem(fa_sm) + 1023u) & ~1023u;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm + (sm0 - fa_smem(fa_sm)));
    tr_bf16 *ks = qs + BM * D;   // ST stages of BN rows each
    tr_bf16 *vs = ks + ST * BN * D;
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;   // the longest rows start first
    const int t1 = min(t0 + BM, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2;
    const size_t ld = (size_t)a.ld;
    const tr_bf16 *kb = a.k + (size_t)kvh * D, *vb = a.v + (size_t)kvh * D;
    const bool vec = a.vec != 0;

    fa_load_run<D, true>(qs, BM, a.q + (size_t)t0 * ld + (size_t)h * D, ld, t1 - t0, tid, NTH,
                     vec, a.q);
    fa_kv_stages<D, BN, NTH, ST, true> kv = {ks, vs, kb, vb, ld, vec, a.k, a.doc_start, a.prefix,
                                             a.n_docs, t1, tid, {}};
    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    kv.start(it, ST - HOLD);

    fa_state<D, 1> st;
    fa_reset(st);
    float am[1][2] = {{-INFINITY, -INFINITY}}, al[1][2] = {{0.0f, 0.0f}};
    float4 acc[D / 8];   // local memory: see fa_opaque_zero
    const int z = fa_opaque_zero();
    fa_chunk_edge edge = {0};
    bool acc_used = false;
    const int w0 = t0 + warp * 16, g0 = t0 + wg * 64;   // the warp's and the group's first rows
    int stage = 0;
    // PIPE: the previous tile's P, whose product is issued with the next tile's scores, and
    // its V's stage (0: no tile yet, P zeros)
    uint32_t pp[BN / 16][4] = {};
    uint32_t pv_at = 0;
    while (it.e >= 0) {
        fa_cp_wait<ST - HOLD - 1>();
        wg_proxy_fence();
        // tile `stage` landed; every warp is done with the stage refilled next (HOLD back)
        __syncthreads();
        kv.refill(PIPE ? fa_prev_stage<ST>(fa_prev_stage<ST>(stage)) : fa_prev_stage<ST>(stage));
        // the group's rows in this document: lo..hi, seeing positions up to hi - s + pl
        const int lo = max(g0, it.s), hi = min(g0 + 64, it.lim) - 1;
        const bool fold = edge.at(it.p0, a.chunk);
        // PIPE takes every tile, so that no product is issued on a path the compiler cannot
        // prove uniform (it then serializes them all); rows that see none of a tile keep
        // their state bit for bit, and a fold of a state no tile changed since changes no bit.
        if (PIPE || (lo <= hi && it.p0 <= hi - it.s + it.pl)) {
            if (!PIPE && fold) {
                fa_fold_acc<D, 1>(am, al, acc + z, st, false);
                acc_used = true;
            }
            int last[1][2];
            fa_rows_last<1>(last, it, w0, g);
            // The warp's rows of Q as A fragments, loaded for every tile: held across the
            // loop, ptxas (CUDA 13.0) gave P their registers at D = 64 and the next tile read P
            // as Q (the PTX kept them apart).
            uint32_t qf[D / 16][4];
            wg_load_a<D, BM>(qf, fa_smem(qs), warp * 16);
            const uint32_t kt = fa_smem(ks + stage * BN * D), vt = fa_smem(vs + stage * BN * D);
            float s[1][NT][4];
            if constexpr (!PIPE) {
                uint32_t p[1][BN / 16][4];
                wg_qk<D, BN>(s[0], qf, kt);
                fa_tile_softmax<D, 1>(st, s, p, it.p0, last, a.sl2, true);
                wg_pv<D, BN>(st.o[0], p[0], vt);
            } else {
                // this tile's Q K^T and the previous tile's P V (zeros before the first tile)
                wg_fence();
                wg_qk_issue<D, BN>(s[0], qf, kt);
                wg_commit();
                wg_pv_issue<D, BN>(st.o[0], pp, pv_at ? pv_at : vt);
                wg_commit();
                wg_wait<1>();   // Q K^T done; P V may still run
                wg_keep(s[0]);
                if (fold) {   // the chunk's last P V in, then folded away
                    wg_wait<0>();
                    wg_keep(st.o[0]);
                    wg_keep(pp);
                    fa_fold_acc<D, 1>(am, al, acc + z, st, false);
                    acc_used = true;
                }
                // the probabilities in fp32 while P V runs; P and the output only after it
                // (registers a product in flight reads are not written)
                float alphas[1][2];
                const bool any = fa_tile_probs<D, 1>(st, s, it.p0, last, a.sl2, true, alphas);
                wg_wait<0>();
                wg_keep(st.o[0]);
                wg_keep(pp);
                fa_tile_rescale<D, 1>(st, alphas, any, true);
                fa_tile_pack<D, 1>(reinterpret_cast<uint32_t(&)[1][BN / 16][4]>(pp), s);
                pv_at = vt;
            }
        }
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    // the last tile's P V (every block has a tile: its rows see themselves)
    if constexpr (PIPE) wg_pv<D, BN>(st.o[0], pp, pv_at);
    fa_cp_wait<0>();
    fa_forward_finish<D, 1>(a, st, am, al, acc + z, acc_used, w0, t1, h, g, t);
}

// A wide tile of the TMA forward (WIDE): two fa_bn<D>() tiles of keys at p0 in one stage of
// 2 fa_bn<D>() rows, their scores in one m64n64 (D = 128) or m64n128 (D = 64) product with Q
// read from shared memory (q: the group's first row of the swizzled Q tile of BM rows), the
// softmax of each half in turn as of two tiles, and P V in one product when no row of the
// group moved its reference point in the second half (alpha exactly 1 there); otherwise the
// first half's P V, the rescale, then the second half's. Every value takes the two tiles'
// operations in their order, so out and lse are the bits of the kernels with fa_bn<D>() keys
// a tile; the step's fixed costs (waits, fences, barriers, the iteration) are paid once for
// twice the keys. Measured on an H100: 21-24% off the dense forward at D = 128, 4% off packed
// rows at D = 64 (dense rows unchanged there).
template <int D, int BM>
__device__ __forceinline__ void fa_wide_tile(fa_state<D, 1> &st, uint32_t q, uint32_t kt,
                                             uint32_t vt, int p0, const int (&last)[1][2],
                                             float sl2) {
    constexpr int BN = fa_bn<D>(), NT = BN / 8, K16 = BN / 16;
    float s[2][1][NT][4];
    auto &s_all = reinterpret_cast<float(&)[2 * NT][4]>(s);
    wg_fence();
    wg_abt_issue<D, BM, 2 * BN>(s_all, q, kt);
    wg_commit();
    wg_wait<0>();
    wg_keep(s_all);
    float alphas[2][1][2];
    const bool any0 = fa_tile_probs<D, 1>(st, s[0], p0, last, sl2, true, alphas[0]);
    fa_tile_rescale<D, 1>(st, alphas[0], any0, true);
    const bool any1 = fa_tile_probs<D, 1>(st, s[1], p0 + BN, last, sl2, true, alphas[1]);
    uint32_t p[2][1][K16][4];
    fa_tile_pack<D, 1>(p[0], s[0]);
    fa_tile_pack<D, 1>(p[1], s[1]);
    if (!wg_any(any1)) {
        wg_pv_part<D, 2 * K16, 2 * BN>(st.o[0], reinterpret_cast<uint32_t(&)[2 * K16][4]>(p),
                                       vt);
    } else {
        wg_pv_part<D, K16, 2 * BN>(st.o[0], p[0][0], vt);
        fa_tile_rescale<D, 1>(st, alphas[1], any1, true);
        wg_pv_part<D, K16, 2 * BN>(st.o[0], p[1][0], vt + BN * 128);
    }
}

// Where the TMA forward with SMACC keeps its chunk accumulator in shared memory: after the
// Q tile of BM rows and fa_tma_kv's stages and barriers (bytes from the 1024-aligned base).
template <int D, int BN, int ST>
__host__ __device__ constexpr uint32_t fa_tma_acc_at(int BM) {
    return ((uint32_t)BM * D * sizeof(tr_bf16) + fa_tma_kv<D, BN, ST>::EMPTY + ST * 8u + 15u) &
           ~15u;
}

// The wgmma forward with its key tiles brought by the tensor memory accelerator (fa_tma_kv,
// attention_tma.cuh), for layouts without shared prefixes and with 16-byte rows: no block
// barrier in the loop and no copy arithmetic but thread 0's. The zeros a tile's rows past its
// document add to P V (P = 0 there) leave the output's bits as the zero rows of the other
// kernels do, so out and lse are theirs. PIPE overlaps the softmax with the products as
// fa_forward_wg_kernel's does; a tile's stage is then given back in the next iteration, once
// the P V that reads its V is done (thread 0 still refills the stage of tile j - 2 at tile j).
// WIDE walks tiles of twice fa_bn<D>() keys (fa_wide_tile), the same bits. SMACC keeps the
// chunk accumulator in shared memory rather than local memory (where, at 150 KB and more of
// shared memory a block, it no longer fits L1: the chunk folds cost the forward 9-13%), the
// same bits again; at D = 128 it takes the room of two of the four K/V stages (fa_tma_stages),
// refilled a tile ahead rather than two.
template <int D, int NWG, int MINB, bool PIPE, bool WIDE, bool SMACC>
__global__ void __launch_bounds__(NWG * 128, MINB)
    fa_forward_tma_kernel(const __grid_constant__ CUtensorMap tk,
                          const __grid_constant__ CUtensorMap tv, const fa_fwd_args a) {
    static_assert(!(PIPE && WIDE), "the pipelined forward walks tiles of fa_bn keys");
    constexpr int BM = NWG * 64, BN = (WIDE ? 2 : 1) * fa_bn<D>(), NTH = NWG * 128;
    constexpr int ST = fa_tma_stages<D, SMACC>();
    static_assert(!(PIPE && ST < 3), "the pipelined forward gives a tile back an iteration late");
    using kv_t = fa_tma_kv<D, BN, ST>;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const uint32_t sm0 = (fa_smem(fa_sm) + 1023u) & ~1023u;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm + (sm0 - fa_smem(fa_sm)));
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BM;   // the longest rows start first
    const int t1 = min(t0 + BM, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2;
    kv_t kv;
    kv.base = sm0 + BM * D * sizeof(tr_bf16);
    // thread 0's source of copies
    auto src = [&] { return fa_tma_src{&tk, &tv, kvh, a.doc_start, a.prefix, a.n_docs, t1}; };

    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    if (tid == 0) kv.init(NWG * 4);
    fa_load_run<D, true>(qs, BM, a.q + (size_t)t0 * a.ld + (size_t)h * D, (size_t)a.ld, t1 - t0,
                         tid, NTH, true, a.q);
    fa_cp_commit();
    __syncthreads();   // the barriers are initialized
    if (tid == 0) kv.start(src(), it);
    fa_cp_wait<0>();
    wg_proxy_fence();   // WIDE's products read Q from shared memory
    __syncthreads();    // Q landed

    fa_state<D, 1> st;
    fa_reset(st);
    float am[1][2] = {{-INFINITY, -INFINITY}}, al[1][2] = {{0.0f, 0.0f}};
    // local memory (see fa_opaque_zero), or shared with element n of thread i at n NTH + i
    float4 acc_local[SMACC ? 1 : D / 8];
    float4 *const acc =
        SMACC ? reinterpret_cast<float4 *>(fa_sm + (sm0 - fa_smem(fa_sm)) +
                                           fa_tma_acc_at<D, BN, ST>(BM)) + tid
              : acc_local + fa_opaque_zero();
    constexpr int ACC_STRIDE = SMACC ? NTH : 1;
    fa_chunk_edge edge = {0};
    bool acc_used = false;
    const int w0 = t0 + warp * 16, g0 = t0 + wg * 64;   // the warp's and the group's first rows
    uint32_t pp[BN / 16][4] = {};   // PIPE: the previous tile's P (zeros before the first)
    int j = 0;
    for (; it.e >= 0; j++) {
        if (tid == 0) kv.refill(src(), j);
        const int lo = max(g0, it.s), hi = min(g0 + 64, it.lim) - 1;
        const bool fold = edge.at(it.p0, a.chunk);
        kv.wait(j);
        // PIPE takes every tile (see fa_forward_wg_kernel)
        if (PIPE || (lo <= hi && it.p0 <= hi - it.s + it.pl)) {
            if (!PIPE && fold) {
                fa_fold_acc<D, 1>(am, al, acc, st, false, ACC_STRIDE);
                acc_used = true;
            }
            int last[1][2];
            fa_rows_last<1>(last, it, w0, g);
            float s[1][BN / 8][4];
            uint32_t qf[D / 16][4];
            if constexpr (WIDE) {
                fa_wide_tile<D, BM>(st, fa_smem(qs) + (uint32_t)wg * 64 * 128, kv.k_at(j),
                                    kv.v_at(j), it.p0, last, a.sl2);
            } else if constexpr (!PIPE) {
                uint32_t p[1][BN / 16][4];
                wg_load_a<D, BM>(qf, fa_smem(qs), warp * 16);
                wg_qk<D, BN>(s[0], qf, kv.k_at(j));
                fa_tile_softmax<D, 1>(st, s, p, it.p0, last, a.sl2, true);
                wg_pv<D, BN>(st.o[0], p[0], kv.v_at(j));
            } else {
                wg_load_a<D, BM>(qf, fa_smem(qs), warp * 16);
                // this tile's Q K^T and the previous tile's P V (zeros before the first tile)
                wg_fence();
                wg_qk_issue<D, BN>(s[0], qf, kv.k_at(j));
                wg_commit();
                wg_pv_issue<D, BN>(st.o[0], pp, kv.v_at(j > 0 ? j - 1 : j));
                wg_commit();
                wg_wait<1>();   // Q K^T done; P V may still run
                wg_keep(s[0]);
                if (fold) {   // the chunk's last P V in, then folded away
                    wg_wait<0>();
                    wg_keep(st.o[0]);
                    wg_keep(pp);
                    fa_fold_acc<D, 1>(am, al, acc, st, false, ACC_STRIDE);
                    acc_used = true;
                }
                float alphas[1][2];
                const bool any = fa_tile_probs<D, 1>(st, s, it.p0, last, a.sl2, true, alphas);
                wg_wait<0>();
                wg_keep(st.o[0]);
                wg_keep(pp);
                if (j > 0) kv.release(j - 1);   // the previous tile's V is read
                fa_tile_rescale<D, 1>(st, alphas, any, true);
                fa_tile_pack<D, 1>(reinterpret_cast<uint32_t(&)[1][BN / 16][4]>(pp), s);
            }
        }
        if (!PIPE) kv.release(j);
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
    }
    // the last tile's P V (every block has a tile: its rows see themselves)
    if constexpr (PIPE) wg_pv<D, BN>(st.o[0], pp, kv.v_at(j - 1));
    fa_forward_finish<D, 1>(a, st, am, al, acc, acc_used, w0, t1, h, g, t, ACC_STRIDE);
}

// ---- launch (host) ----

template <int D, int MT>
static void fa_forward_run(tr_backend *be, const fa_fwd_args &a) {
    constexpr int BM = FA_FWD_WARPS * 16 * MT;
    const size_t shm =
        (size_t)(BM + 2 * FA_FWD_STAGES * fa_bn<D>()) * (D + FA_PAD) * sizeof(tr_bf16);
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_forward_kernel<D, MT>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)a.H, (unsigned)((a.T + BM - 1) / BM));
    fa_forward_kernel<D, MT><<<grid, FA_FWD_WARPS * 32, shm, tr_cuda_stream(be)>>>(a);
    TR_CUDA_LAUNCHED(be, "attention_forward");
}

template <int D, int NWG, int MINB, bool PIPE>
static void fa_forward_wg_run(tr_backend *be, const fa_fwd_args &a) {
    constexpr int BM = NWG * 64, ST = PIPE ? FA_WGP_STAGES : FA_FWD_STAGES;
    const size_t shm = 1024 + (size_t)(BM + 2 * ST * fa_bn<D>()) * D * sizeof(tr_bf16);
    auto kernel = fa_forward_wg_kernel<D, NWG, MINB, PIPE>;
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)a.H, (unsigned)((a.T + BM - 1) / BM));
    kernel<<<grid, NWG * 128, shm, tr_cuda_stream(be)>>>(a);
    TR_CUDA_LAUNCHED(be, "attention_forward");
}

// The TMA forward's launch: the tensor maps of K and V (rows of the fused buffer, the kv heads'
// columns) and the stages' barriers after the tiles.
template <int D, int NWG, int MINB, bool PIPE, bool WIDE, bool SMACC = false>
static void fa_forward_tma_run(tr_backend *be, const fa_fwd_args &a) {
    constexpr int BM = NWG * 64, BN = (WIDE ? 2 : 1) * fa_bn<D>();
    CUtensorMap tk, tv;
    const int64_t cols = (int64_t)a.KVH * D;
    if (tr_tma_map_bf16(be, &tk, a.k, cols, a.T, a.ld, BN) ||
        tr_tma_map_bf16(be, &tv, a.v, cols, a.T, a.ld, BN))
        return;
    const size_t shm = 1024 + fa_tma_acc_at<D, BN, fa_tma_stages<D, SMACC>()>(BM) +
                       (SMACC ? (size_t)NWG * 128 * (D / 8) * sizeof(float4) : 0);
    auto kernel = fa_forward_tma_kernel<D, NWG, MINB, PIPE, WIDE, SMACC>;
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)a.H, (unsigned)((a.T + BM - 1) / BM));
    kernel<<<grid, NWG * 128, shm, tr_cuda_stream(be)>>>(tk, tv, a);
    TR_CUDA_LAUNCHED(be, "attention_forward");
}

void tr_fa_forward(tr_backend *be, const fa_fwd_args &a, int32_t D) {
#if TR_CUDA_WGMMA
    if (tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_FWD) {
        // measured on an H200 (bench_cuda attention) against 2 to 4 warpgroups a block, with
        // Q in registers and in shared memory: at D = 64 two blocks an SM of two warpgroups,
        // at D = 128 one of three (its output takes 64 registers a thread); wide tiles take
        // one block of three at either (64 scores a thread at D = 64: 135 registers)
        const bool pipe = tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_FWD_PIPE;
        if ((tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_FWD_TMA) && !a.prefix && a.vec) {
            // a wide tile never straddles a softmax chunk's edge: at D = 64 it is 128 keys
            const int wide_bit = D == 64 ? TR_CUDA_WG_FWD_WIDE64 : TR_CUDA_WG_FWD_WIDE;
            const bool wide = (tr_cuda_ctx_of(be)->wgmma & wide_bit) &&
                              a.chunk % (2 * (D == 64 ? fa_bn<64>() : fa_bn<128>())) == 0;
            // the accumulator in shared memory: at D = 64 beside the wide tiles' four stages,
            // at D = 128 in place of two of them
            const bool smacc = tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_FWD_SMACC;
            if (D == 64 && pipe) fa_forward_tma_run<64, 2, 2, true, false>(be, a);
            else if (D == 64 && wide && smacc) fa_forward_tma_run<64, 3, 1, false, true, true>(be, a);
            else if (D == 64 && wide) fa_forward_tma_run<64, 3, 1, false, true>(be, a);
            else if (D == 64) fa_forward_tma_run<64, 2, 2, false, false>(be, a);
            else if (pipe) fa_forward_tma_run<128, 3, 1, true, false>(be, a);
            else if (wide && smacc) fa_forward_tma_run<128, 3, 1, false, true, true>(be, a);
            else if (wide) fa_forward_tma_run<128, 3, 1, false, true>(be, a);
            else fa_forward_tma_run<128, 3, 1, false, false>(be, a);
            return;
        }
        if (D == 64 && pipe) fa_forward_wg_run<64, 2, 2, true>(be, a);
        else if (D == 64) fa_forward_wg_run<64, 2, 2, false>(be, a);
        else if (pipe) fa_forward_wg_run<128, 3, 1, true>(be, a);
        else fa_forward_wg_run<128, 3, 1, false>(be, a);
        return;
    }
#endif
    if (D == 64) fa_forward_run<64, 2>(be, a);
    else fa_forward_run<128, 2>(be, a);
}
