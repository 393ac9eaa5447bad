// Flash-attention backward on tensor cores, the bf16 path, deterministic without atomics: a
// pass over the rows for delta = rowsum(dO * O) and lse in log2 units, into the backend's row
// scratch, so that neither main pass reads O or sums a row again; a dK/dV pass (one block per
// 128-key tile of a document and kv head, looping over the group's query heads and then the
// query tiles that see the keys, in a fixed order, both sums in registers; tiles with the
// most queries of their document start first); and a separate dQ pass (one block per 128-row
// query tile and head, looping over its documents' key tiles). With shared prefixes the dQ
// pass walks a row's context as the forward does (the prefix's keys, then its own), and a
// prefix's key tiles take the queries of the documents naming it after its own, so each key's
// sums stay in one block. Both recompute S = Q K^T and dP = dO V^T and take
// P = exp(S scale - lse) from the saved lse, so nothing T x T is ever stored; both read delta
// from the rows pass, so they agree on it bit for bit. Their operands stream through
// FA_BWD_STAGES shared stages, each refilled an iteration after its use, so an iteration
// waits at one barrier. P and dS = P (dP - delta) scale are rounded to bf16 for the P^T dO,
// dS^T Q and dS K products (the forward's one extra rounding, once more); everything else is
// fp32. dq, dk, dv are written, dk and dv summing the group.
#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/attention_tma.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

#define FA_BWD_WARPS 8   // 16 rows (dq) or keys (dk/dv) per warp
#define FA_BWD_BN 64     // keys per dq step, queries per dk/dv step
#define FA_BWD_STAGES 3  // K/V tiles (dq) or Q/dO tiles (dk/dv) in shared memory at once

// sum_d dO[d] O[d] of one row, by the 32 lanes of a warp: lane l takes D/32 consecutive
// channels in order, then a butterfly over the lanes (every lane gets the same bits).
template <int D>
__device__ __forceinline__ float fa_row_delta(const tr_bf16 *dout, const tr_bf16 *out,
                                              int lane) {
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 32; j++) {
        const int d = lane * (D / 32) + j;
        acc = __fmaf_rn(__bfloat162float(dout[d]), __bfloat162float(out[d]), acc);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    return acc;
}

#define FA_LOG2E 1.4426950408889634f

// P of a score s against the row's lse (both passes): 2^(s scale log2(e) - lse log2(e)).
__device__ __forceinline__ float fa_prob(float s, float sl2, float lse2) {
    return fa_ex2(__fsub_rn(__fmul_rn(s, sl2), lse2));
}
// dS = P (dP - delta) scale.
__device__ __forceinline__ float fa_dscore(float p, float dp, float delta, float scale) {
    return __fmul_rn(__fmul_rn(p, __fsub_rn(dp, delta)), scale);
}

// P and dS of a dK/dV tile, 16 keys by NT n8 tiles of queries (S^T, dP^T): s becomes P
// (rounded to bf16 later), dp becomes dS. lse2 and dl: the tile's queries' statistics (shared);
// with MASK, a query i the thread's key row r does not see (i < key[r] or i >= q_end) gets
// P = +0. The probability is computed either way and selected, so no lane branches.
template <int NT, bool MASK>
__device__ __forceinline__ void fa_dkv_probs(float (&s)[NT][4], float (&dp)[NT][4],
                                             const float *lse2, const float *dl, float sl2,
                                             float scale, int i0, const int (&key)[2],
                                             int q_end) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + n * 8 + 2 * t);
        const float2 d2 = *reinterpret_cast<const float2 *>(dl + n * 8 + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int e = 2 * r + c;
                float p = fa_prob(s[n][e], sl2, c ? l2.y : l2.x);
                if (MASK) {
                    const int i = i0 + n * 8 + 2 * t + c;
                    p = i >= key[r] && i < q_end ? p : 0.0f;
                }
                s[n][e] = p;
                dp[n][e] = fa_dscore(p, dp[n][e], c ? d2.y : d2.x, scale);
            }
    }
}

// P and dS of a dQ tile, 16 query rows by NT n8 tiles of keys: dp becomes dS. lse2, delta:
// the thread's two rows' statistics; with MASK, row r sees the tile's columns <= lim[r] (the
// others get P = +0, computed and not selected, so that no lane branches).
template <int NT, bool MASK>
__device__ __forceinline__ void fa_dq_probs(const float (&s)[NT][4], float (&dp)[NT][4],
                                            const float (&lse2)[2], const float (&delta)[2],
                                            const int (&lim)[2], float sl2, float scale) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int e = 2 * r + c;
                float p = fa_prob(s[n][e], sl2, lse2[r]);
                if (MASK) p = n * 8 + 2 * t + c <= lim[r] ? p : 0.0f;
                dp[n][e] = fa_dscore(p, dp[n][e], delta[r], scale);
            }
}

// fa_dq_probs for the warp's 16 rows from w0 against the tile it (of NT n8 tiles of keys):
// unmasked when every row sees the whole tile, as most do.
template <int NT>
__device__ __forceinline__ void fa_dq_warp_probs(const float (&s)[NT][4], float (&dp)[NT][4],
                                                 const float (&lse2)[2], const float (&delta)[2],
                                                 const fa_kv_iter &it, int w0, float sl2,
                                                 float scale) {
    constexpr int BN = NT * 8;
    const int g = (threadIdx.x & 31) >> 2;
    const int lo = max(w0, it.s), hi = min(w0 + 16, it.lim) - 1;
    if (lo == w0 && hi == w0 + 15 && it.p0 + BN - 1 <= w0 - it.s + it.pl) {
        const int lim[2] = {BN, BN};
        fa_dq_probs<NT, false>(s, dp, lse2, delta, lim, sl2, scale);
    } else {
        int lim[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int i = w0 + g + 8 * r;
            lim[r] = (i >= it.s && i < it.lim ? i - it.s + it.pl : -1) - it.p0;
        }
        fa_dq_probs<NT, true>(s, dp, lse2, delta, lim, sl2, scale);
    }
}

// The rows pass: a warp per FA_ROWS_PER_WARP (token, head) pairs w = t H + h, each row's
// loads issued before any sum (a lone row's two loads a warp left the copies latency-bound),
// writes delta[w] = sum_d dO O and lse2[w] = lse log2(e), the two row statistics both main
// passes use.
#define FA_ROWS_PER_WARP 4
template <int D>
__global__ void __launch_bounds__(256) fa_rows_kernel(const fa_bwd_args a) {
    const int64_t n = (int64_t)a.T * a.H;
    const int64_t w0 = (((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * FA_ROWS_PER_WARP;
    if (w0 >= n) return;
    const int lane = threadIdx.x & 31;
    float d[FA_ROWS_PER_WARP];
#pragma unroll
    for (int i = 0; i < FA_ROWS_PER_WARP; i++) {
        const size_t at = (size_t)min(w0 + i, n - 1) * D;   // dout, out contiguous [T, H D]
        d[i] = fa_row_delta<D>(a.dout + at, a.out + at, lane);
    }
    if (lane < FA_ROWS_PER_WARP && w0 + lane < n) {
        float mine = d[0];
#pragma unroll
        for (int i = 1; i < FA_ROWS_PER_WARP; i++)
            if (lane == i) mine = d[i];
        a.delta[w0 + lane] = mine;
        a.lse2[w0 + lane] = __fmul_rn(a.lse[w0 + lane], FA_LOG2E);
    }
}

// Tile y of the document-aligned tiles of BT tokens, in the order of the dK/dV pass: every
// document's first tile (in document order), then every second tile, and so on, so that the
// tiles seeing the most queries start first, whatever the layout (a plain order would start
// the heavy first tiles of later documents last, with only a wave or two of blocks). A shared
// prefix's tiles, which its dependents' queries make the heaviest, keep their levels: prompts
// are short, so those are the first ones anyway.
// Sets document e and tile o within it; false past the last tile. Every warp computes it
// alike, its lanes taking 32 documents at a time.
__device__ __forceinline__ bool fa_tile_by_level(const int32_t *ds, int n_docs, int BT, int y,
                                                 int &e, int &o) {
    const int lane = threadIdx.x & 31;
    for (o = 0;; o++) {
        unsigned any = 0;
        for (int d0 = 0; d0 < n_docs; d0 += 32) {
            const int d = d0 + lane;
            const int nt = d < n_docs ? (ds[d + 1] - ds[d] + BT - 1) / BT : 0;
            unsigned m = __ballot_sync(0xffffffffu, nt > o);
            any |= m;
            const int c = __popc(m);
            if (y < c) {
                for (int i = 0; i < y; i++) m &= m - 1;   // drop the y lowest documents
                e = d0 + __ffs(m) - 1;
                return true;
            }
            y -= c;
        }
        if (!any) return false;
    }
}

// A warp's 16 rows of dQ (from w0; rows from t1 on are not the block's) into a.dq.
template <int D>
__device__ __forceinline__ void fa_dq_store(const fa_bwd_args &a, const float (&dq)[D / 8][4],
                                            int w0, int t1, int h, int g, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = w0 + g + 8 * r;
        if (i >= t1) continue;
        tr_bf16 *o = a.dq + (size_t)i * a.ld + (size_t)h * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            fa_store2(o + n * 8, dq[n][2 * r], dq[n][2 * r + 1], a.st4 != 0);
    }
}

// The delta and lse log2(e) of rows i0 and i0 + 8 of head h, from the rows pass (a row past T
// reads the last one: its results are never stored).
__device__ __forceinline__ void fa_dq_row_stats(const fa_bwd_args &a, float (&delta)[2],
                                                float (&lse2)[2], int i0, int h) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const size_t at = (size_t)min(i0 + 8 * r, a.T - 1) * a.H + h;
        delta[r] = a.delta[at];
        lse2[r] = a.lse2[at];
    }
}

// dQ for 16 query rows per warp, FA_BWD_WARPS warps, one head.
template <int D>
__global__ void __launch_bounds__(FA_BWD_WARPS * 32, 1) fa_dq_kernel(const fa_bwd_args a) {
    constexpr int BQ = FA_BWD_WARPS * 16, BN = FA_BWD_BN, LDS = D + FA_PAD;
    constexpr int NTH = FA_BWD_WARPS * 32, NT = BN / 8, ST = FA_BWD_STAGES;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm), *dos = qs + BQ * LDS;
    tr_bf16 *ks = dos + BQ * LDS, *vs = ks + ST * BN * LDS;   // ST stages each
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BQ, t1 = min(t0 + BQ, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t ld = (size_t)a.ld, HD = (size_t)a.H * D;
    const bool vec = a.vec != 0;
    const tr_bf16 *kb = a.k + (size_t)kvh * D, *vb = a.v + (size_t)kvh * D;

    fa_load_run<D>(qs, BQ, a.q + (size_t)t0 * ld + (size_t)h * D, ld, t1 - t0, tid, NTH,
                     vec, a.q);
    fa_load_run<D>(dos, BQ, a.dout + (size_t)t0 * HD + (size_t)h * D, HD, t1 - t0, tid, NTH,
                     vec, a.dout);
    // it: the key tile multiplied next; group 0 holds the rows and the first tile
    fa_kv_stages<D, BN, NTH, ST> kv = {ks, vs, kb, vb, ld, vec, a.k, a.doc_start, a.prefix,
                                       a.n_docs, t1, tid, {}};
    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    kv.start(it);

    // the thread's two rows: delta and lse in log2 units, from the rows pass
    const int w0 = t0 + warp * 16;
    float delta[2], lse2[2];
    fa_dq_row_stats(a, delta, lse2, w0 + g, h);

    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    int stage = 0;
    while (it.e >= 0) {
        fa_cp_wait<ST - 2>();
        __syncthreads();   // tile `stage` landed; every warp is done with the previous stage
        kv.refill(fa_prev_stage<ST>(stage));
        const int lo = max(w0, it.s), hi = min(w0 + 16, it.lim) - 1;
        if (lo <= hi && it.p0 <= hi - it.s + it.pl) {
            const tr_bf16 *kt = ks + stage * BN * LDS, *vt = vs + stage * BN * LDS;
            float s[1][NT][4], dp[1][NT][4];
            fa_gemm_abt<D, 1, NT>(s, qs + warp * 16 * LDS, kt, LDS);
            fa_gemm_abt<D, 1, NT>(dp, dos + warp * 16 * LDS, vt, LDS);
            fa_dq_warp_probs<NT>(s[0], dp[0], lse2, delta, it, w0, a.sl2, a.scale);
            uint32_t da[1][BN / 16][4];
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) fa_acc_to_a(da[0][kk], dp[0], kk);
            fa_gemm_pv<D, 1, BN / 16>(reinterpret_cast<float(&)[1][D / 8][4]>(dq), da, kt, LDS);
        }
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();
    fa_dq_store<D>(a, dq, w0, t1, h, g, t);
}

// One key tile of a warpgroup's dQ on wgmma: S = Q K^T and dP = dO V^T issued together (q, d:
// the group's rows of Q and dO in swizzled tiles of BQ rows; k, v: the tile's keys), dS from
// the warp's probabilities (fa_dq_warp_probs), then dQ += dS K.
template <int D, int BQ>
__device__ __forceinline__ void fa_dq_wg_step(float (&dq)[D / 8][4], uint32_t q, uint32_t d,
                                              uint32_t k, uint32_t v, const float (&lse2)[2],
                                              const float (&delta)[2], const fa_kv_iter &it,
                                              int w0, const fa_bwd_args &a) {
    constexpr int BN = FA_BWD_BN, NT = BN / 8;
    float s[1][NT][4], dp[1][NT][4];
    wg_fence();
    wg_abt_issue<D, BQ>(s[0], q, k);
    wg_abt_issue<D, BQ>(dp[0], d, v);
    wg_commit();
    wg_wait<0>();
    wg_keep(s[0]);
    wg_keep(dp[0]);
    fa_dq_warp_probs<NT>(s[0], dp[0], lse2, delta, it, w0, a.sl2, a.scale);
    uint32_t da[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) fa_acc_to_a(da[kk], dp[0], kk);
    wg_pv<D, BN>(dq, da, k);
}

// The dQ pass on Hopper's warpgroup MMA (attention_wgmma.cuh): NWG warpgroups of 64 query rows
// a block, Q, dO and the K/V stages in 128-byte-swizzled shared tiles; S = Q K^T and
// dP = dO V^T issued together, dQ += dS K with dS's fragments from registers. The products are
// mma.sync's bit for bit (test_wgmma) and every step is fa_dq_kernel's, in its order, so dq is
// that kernel's. A warpgroup multiplies a tile when any of its rows sees it; a warp whose rows
// see none of it takes the masked path, where every P is +0 and dQ gains only zeros.
template <int D, int NWG, int MINB>
__global__ void __launch_bounds__(NWG * 128, MINB) fa_dq_wg_kernel(const fa_bwd_args a) {
    constexpr int BQ = NWG * 64, BN = FA_BWD_BN, NTH = NWG * 128;
    constexpr int ST = FA_BWD_STAGES;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    // swizzled tiles start on 1024-byte boundaries (the launch adds the slack)
    const uint32_t sm0 = (fa_smem(fa_sm) + 1023u) & ~1023u;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm + (sm0 - fa_smem(fa_sm)));
    tr_bf16 *dos = qs + BQ * D, *ks = dos + BQ * D, *vs = ks + ST * BN * D;   // ST stages each
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BQ, t1 = min(t0 + BQ, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2;
    const size_t ld = (size_t)a.ld, HD = (size_t)a.H * D;
    const bool vec = a.vec != 0;
    const tr_bf16 *kb = a.k + (size_t)kvh * D, *vb = a.v + (size_t)kvh * D;

    fa_load_run<D, true>(qs, BQ, a.q + (size_t)t0 * ld + (size_t)h * D, ld, t1 - t0, tid, NTH,
                     vec, a.q);
    fa_load_run<D, true>(dos, BQ, a.dout + (size_t)t0 * HD + (size_t)h * D, HD, t1 - t0, tid, NTH,
                     vec, a.dout);
    fa_kv_stages<D, BN, NTH, ST, true> kv = {ks, vs, kb, vb, ld, vec, a.k, a.doc_start,
                                             a.prefix, a.n_docs, t1, tid, {}};
    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    kv.start(it);

    const int w0 = t0 + warp * 16, g0 = t0 + wg * 64;   // the warp's and the group's first rows
    float delta[2], lse2[2];
    fa_dq_row_stats(a, delta, lse2, w0 + g, h);
    const uint32_t q_at = fa_smem(qs) + (uint32_t)wg * 64 * 128;
    const uint32_t do_at = fa_smem(dos) + (uint32_t)wg * 64 * 128;

    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    int stage = 0;
    while (it.e >= 0) {
        fa_cp_wait<ST - 2>();
        wg_proxy_fence();
        __syncthreads();   // tile `stage` landed; every warp is done with the previous stage
        kv.refill(fa_prev_stage<ST>(stage));
        const int glo = max(g0, it.s), ghi = min(g0 + 64, it.lim) - 1;
        if (glo <= ghi && it.p0 <= ghi - it.s + it.pl)
            fa_dq_wg_step<D, BQ>(dq, q_at, do_at, fa_smem(ks + stage * BN * D),
                                 fa_smem(vs + stage * BN * D), lse2, delta, it, w0, a);
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();
    fa_dq_store<D>(a, dq, w0, t1, h, g, t);
}

// The wgmma dQ pass with its key tiles brought by the tensor memory accelerator (fa_tma_kv,
// attention_tma.cuh), in ST stages, for layouts without shared prefixes and with 16-byte rows;
// every step is fa_dq_wg_kernel's, so dq is its bits (keys past a document are masked by
// position there as here, and the zeros they add to dQ leave its bits as zero rows do).
template <int D, int NWG, int MINB, int ST>
__global__ void __launch_bounds__(NWG * 128, MINB)
    fa_dq_tma_kernel(const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tv, const fa_bwd_args a) {
    constexpr int BQ = NWG * 64, BN = FA_BWD_BN, NTH = NWG * 128;
    using kv_t = fa_tma_kv<D, BN, ST>;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const uint32_t sm0 = (fa_smem(fa_sm) + 1023u) & ~1023u;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm + (sm0 - fa_smem(fa_sm)));
    tr_bf16 *dos = qs + BQ * D;
    const int h = blockIdx.x, kvh = h / (a.H / a.KVH);
    const int t0 = (int)(gridDim.y - 1 - blockIdx.y) * BQ, t1 = min(t0 + BQ, a.T);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2;
    const size_t ld = (size_t)a.ld, HD = (size_t)a.H * D;
    kv_t kv;
    kv.base = sm0 + 2 * BQ * D * sizeof(tr_bf16);
    // thread 0's source of copies
    auto src = [&] { return fa_tma_src{&tk, &tv, kvh, a.doc_start, a.prefix, a.n_docs, t1}; };

    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    if (tid == 0) kv.init(NWG * 4);
    fa_load_run<D, true>(qs, BQ, a.q + (size_t)t0 * ld + (size_t)h * D, ld, t1 - t0, tid, NTH,
                         true, a.q);
    fa_load_run<D, true>(dos, BQ, a.dout + (size_t)t0 * HD + (size_t)h * D, HD, t1 - t0, tid,
                         NTH, true, a.dout);
    fa_cp_commit();
    __syncthreads();   // the barriers are initialized
    if (tid == 0) kv.start(src(), it);

    const int w0 = t0 + warp * 16, g0 = t0 + wg * 64;   // the warp's and the group's first rows
    float delta[2], lse2[2];
    fa_dq_row_stats(a, delta, lse2, w0 + g, h);
    const uint32_t q_at = fa_smem(qs) + (uint32_t)wg * 64 * 128;
    const uint32_t do_at = fa_smem(dos) + (uint32_t)wg * 64 * 128;
    fa_cp_wait<0>();
    wg_proxy_fence();   // Q and dO, copied by every thread, are read by the tensor cores
    __syncthreads();

    float dq[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.0f;
    for (int j = 0; it.e >= 0; j++) {
        if (tid == 0) kv.refill(src(), j);
        const int glo = max(g0, it.s), ghi = min(g0 + 64, it.lim) - 1;
        kv.wait(j);
        if (glo <= ghi && it.p0 <= ghi - it.s + it.pl)
            fa_dq_wg_step<D, BQ>(dq, q_at, do_at, kv.k_at(j), kv.v_at(j), lse2, delta, it, w0,
                                 a);
        kv.release(j);
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
    }
    fa_dq_store<D>(a, dq, w0, t1, h, g, t);
}

// A warp's keys' rows of dK and dV (keys from k1 on are not the block's) into a.dk and a.dv,
// those asked for.
template <int D>
__device__ __forceinline__ void fa_dkv_store(const fa_bwd_args &a, const float (&dk)[D / 8][4],
                                             const float (&dv)[D / 8][4], const int (&key)[2],
                                             int k1, int kvh, int t) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (key[r] >= k1) continue;
        const size_t at = (size_t)key[r] * a.ld + (size_t)kvh * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            if (a.dk) fa_store2(a.dk + at + n * 8, dk[n][2 * r], dk[n][2 * r + 1], a.st4 != 0);
            if (a.dv) fa_store2(a.dv + at + n * 8, dv[n][2 * r], dv[n][2 * r + 1], a.st4 != 0);
        }
    }
}

// The query tiles a dK/dV block walks (its items): item j is head h0 + j / nq and query tile
// j % nq from key k0, loaded in order, each (head, tile) counted on from the last rather than
// divided out. load puts the next item's Q and dO rows (BQ each, padded or swizzled as SW
// says; rows past q_end are zeros) into its stage of stg and its lse2 and delta into lse_s and
// delta_s, by NTH threads.
template <int D, int BQ, int NTH, bool SW>
struct fa_dkv_items {
    tr_bf16 *stg;
    float *lse_s, *delta_s;
    int k0, q_end, nq;
    int h, q;   // the next item's head and query tile

    __device__ __forceinline__ void load(const fa_bwd_args &a, int stage, bool vec, int tid) {
        constexpr int ROW = SW ? D : D + FA_PAD;   // elements a row of a tile
        const size_t ld = (size_t)a.ld, HD = (size_t)a.H * D;
        const int hh = h, i0 = k0 + q * BQ;
        if (++q == nq) {
            q = 0;
            h++;
        }
        tr_bf16 *sq = stg + stage * 2 * BQ * ROW;
        if (vec) {
            const uint32_t at = fa_smem(sq);
            fa_cp_tile<D, BQ, NTH, SW>(at, a.q + (size_t)i0 * ld + (size_t)hh * D, ld,
                                       q_end - i0, a.q, tid);
            fa_cp_tile<D, BQ, NTH, SW>(at + BQ * ROW * (uint32_t)sizeof(tr_bf16),
                                       a.dout + (size_t)i0 * HD + (size_t)hh * D, HD,
                                       q_end - i0, a.dout, tid);
        } else {
            fa_load_run<D, SW>(sq, BQ, a.q + (size_t)i0 * ld + (size_t)hh * D, ld, q_end - i0,
                               tid, NTH, false, a.q);
            fa_load_run<D, SW>(sq + BQ * ROW, BQ, a.dout + (size_t)i0 * HD + (size_t)hh * D, HD,
                               q_end - i0, tid, NTH, false, a.dout);
        }
        for (int r = tid; r < 2 * BQ; r += NTH) {   // lse2 then delta, from the rows pass
            const int i = i0 + r % BQ;
            const float *src = r < BQ ? a.lse2 : a.delta;
            fa_cp4((r < BQ ? lse_s : delta_s) + stage * BQ + r % BQ,
                   i < q_end ? src + (size_t)i * a.H + hh : src, i < q_end);
        }
    }
};

// dK and dV for 16 keys per warp, FA_BWD_WARPS warps, one kv head: a tile of one document's
// keys, the group's heads in order, and for each the query tiles from the tile's first key to
// the document's end, in order; for a prefix document, on to the end of the documents naming
// it, whose rows see all of its keys.
template <int D>
__global__ void __launch_bounds__(FA_BWD_WARPS * 32, 1) fa_dkv_kernel(const fa_bwd_args a) {
    constexpr int BK = FA_BWD_WARPS * 16, BQ = FA_BWD_BN, LDS = D + FA_PAD;
    constexpr int NTH = FA_BWD_WARPS * 32, NT = BQ / 8, ST = FA_BWD_STAGES;
    constexpr int STAGE = 2 * BQ * LDS;   // Q and dO rows of one query tile
    extern __shared__ __align__(16) unsigned char fa_sm[];
    tr_bf16 *ks = reinterpret_cast<tr_bf16 *>(fa_sm), *vs = ks + BK * LDS;
    tr_bf16 *stg = vs + BK * LDS;                                      // ST stages
    float *lse_s = reinterpret_cast<float *>(stg + ST * STAGE);        // [ST][BQ], log2 units
    float *delta_s = lse_s + ST * BQ;                                  // [ST][BQ]
    int doc, lvl;
    if (!fa_tile_by_level(a.doc_start, a.n_docs, BK, (int)blockIdx.y, doc, lvl)) return;
    const int kvh = blockIdx.x, G = a.H / a.KVH;
    // the queries seeing the keys: the document's own from k0 on, then, for a prefix, all of
    // the documents naming it (later rows every one: the causal test below holds for them)
    const int q_end = fa_query_end(a.doc_start, a.prefix, a.n_docs, doc);
    const int k0 = a.doc_start[doc] + lvl * BK, k1 = min(k0 + BK, a.doc_start[doc + 1]);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const size_t ld = (size_t)a.ld;
    const bool vec = a.vec != 0;

    fa_load_run<D>(ks, BK, a.k + (size_t)k0 * ld + (size_t)kvh * D, ld, k1 - k0, tid, NTH,
                     vec, a.k);
    fa_load_run<D>(vs, BK, a.v + (size_t)k0 * ld + (size_t)kvh * D, ld, k1 - k0, tid, NTH,
                     vec, a.v);
    const int nq = (q_end - k0 + BQ - 1) / BQ, total = G * nq;
    fa_dkv_items<D, BQ, NTH, false> items = {stg, lse_s, delta_s, k0, q_end, nq, kvh * G, 0};
    // Group 0 holds K, V and item 0, group j item j; item j goes to stage j % ST.
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < total) items.load(a, s, vec, tid);
        fa_cp_commit();
    }

    // this thread's keys: rows g, g+8 of the warp's 16 (rows past k1 are zeros, never stored)
    const int wk0 = k0 + warp * 16;
    const int key[2] = {wk0 + g, wk0 + g + 8};
    const bool want_k = a.dk != nullptr, want_v = a.dv != nullptr;
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    int stage = 0, qt = 0;   // qt: the item's query tile
    for (int item = 0; item < total; item++) {
        fa_cp_wait<ST - 2>();
        __syncthreads();   // item's stage landed; every warp is done with the previous stage
        if (item + ST - 1 < total) items.load(a, fa_prev_stage<ST>(stage), vec, tid);
        fa_cp_commit();
        const tr_bf16 *sq = stg + stage * STAGE, *sdo = sq + BQ * LDS;
        const float *lse2 = lse_s + stage * BQ, *dl = delta_s + stage * BQ;
        const int i0 = k0 + qt * BQ;
        qt = qt + 1 == nq ? 0 : qt + 1;
        if (wk0 < k1 && i0 + BQ - 1 >= wk0) {
            float s[1][NT][4], dp[1][NT][4];   // S^T and dP^T: keys by queries
            fa_gemm_abt<D, 1, NT>(s, ks + warp * 16 * LDS, sq, LDS);
            fa_gemm_abt<D, 1, NT>(dp, vs + warp * 16 * LDS, sdo, LDS);
            // query tiles every key of the warp sees whole need no mask
            if (i0 >= wk0 + 15 && i0 + BQ <= q_end)
                fa_dkv_probs<NT, false>(s[0], dp[0], lse2, dl, a.sl2, a.scale, i0, key, q_end);
            else
                fa_dkv_probs<NT, true>(s[0], dp[0], lse2, dl, a.sl2, a.scale, i0, key, q_end);
            uint32_t fr[1][BQ / 16][4];
            if (want_v) {
#pragma unroll
                for (int kk = 0; kk < BQ / 16; kk++) fa_acc_to_a(fr[0][kk], s[0], kk);
                fa_gemm_pv<D, 1, BQ / 16>(reinterpret_cast<float(&)[1][D / 8][4]>(dv), fr, sdo,
                                          LDS);
            }
            if (want_k) {
#pragma unroll
                for (int kk = 0; kk < BQ / 16; kk++) fa_acc_to_a(fr[0][kk], dp[0], kk);
                fa_gemm_pv<D, 1, BQ / 16>(reinterpret_cast<float(&)[1][D / 8][4]>(dk), fr, sq, LDS);
            }
        }
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();
    fa_dkv_store<D>(a, dk, dv, key, k1, kvh, t);
}

// The dK/dV pass on Hopper's warpgroup MMA (attention_wgmma.cuh): two warpgroups a block of
// FA_BWD_WARPS * 16 keys, 64 each, K, V and the Q/dO stages in 128-byte-swizzled shared
// tiles; S^T = K Q^T and dP^T = V dO^T issued together, dV += P^T dO and dK += dS^T Q with P
// and dS from registers. The products are mma.sync's bit for bit (test_wgmma) and every step
// is fa_dkv_kernel's, in its order, so dk and dv are that kernel's. A warpgroup multiplies an
// item when any of its keys is seen by the tile's queries; a warp whose keys are not takes the
// masked path, where every P and dS is +0 and its sums gain only zeros.
template <int D>
__global__ void __launch_bounds__(FA_BWD_WARPS * 32, 1) fa_dkv_wg_kernel(const fa_bwd_args a) {
    constexpr int BK = FA_BWD_WARPS * 16, BQ = FA_BWD_BN;
    constexpr int NTH = FA_BWD_WARPS * 32, NT = BQ / 8, ST = FA_BWD_STAGES;
    constexpr int STAGE = 2 * BQ * D;   // Q and dO rows of one query tile
    static_assert(BK == 128 && BQ == 64, "two warpgroups of keys, a query tile of 64");
    extern __shared__ __align__(16) unsigned char fa_sm[];
    // swizzled tiles start on 1024-byte boundaries (the launch adds the slack)
    const uint32_t sm0 = (fa_smem(fa_sm) + 1023u) & ~1023u;
    tr_bf16 *ks = reinterpret_cast<tr_bf16 *>(fa_sm + (sm0 - fa_smem(fa_sm))), *vs = ks + BK * D;
    tr_bf16 *stg = vs + BK * D;                                        // ST stages
    float *lse_s = reinterpret_cast<float *>(stg + ST * STAGE);        // [ST][BQ], log2 units
    float *delta_s = lse_s + ST * BQ;                                  // [ST][BQ]
    int doc, lvl;
    if (!fa_tile_by_level(a.doc_start, a.n_docs, BK, (int)blockIdx.y, doc, lvl)) return;
    const int kvh = blockIdx.x, G = a.H / a.KVH;
    const int q_end = fa_query_end(a.doc_start, a.prefix, a.n_docs, doc);
    const int k0 = a.doc_start[doc] + lvl * BK, k1 = min(k0 + BK, a.doc_start[doc + 1]);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2;
    const size_t ld = (size_t)a.ld;
    const bool vec = a.vec != 0;

    fa_load_run<D, true>(ks, BK, a.k + (size_t)k0 * ld + (size_t)kvh * D, ld, k1 - k0, tid, NTH,
                     vec, a.k);
    fa_load_run<D, true>(vs, BK, a.v + (size_t)k0 * ld + (size_t)kvh * D, ld, k1 - k0, tid, NTH,
                     vec, a.v);
    const int nq = (q_end - k0 + BQ - 1) / BQ, total = G * nq;
    fa_dkv_items<D, BQ, NTH, true> items = {stg, lse_s, delta_s, k0, q_end, nq, kvh * G, 0};
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < total) items.load(a, s, vec, tid);
        fa_cp_commit();
    }

    const int wk0 = k0 + warp * 16, gk0 = k0 + wg * 64;   // the warp's and the group's keys
    const int key[2] = {wk0 + g, wk0 + g + 8};
    const bool want_k = a.dk != nullptr, want_v = a.dv != nullptr;
    const uint32_t k_at = fa_smem(ks) + (uint32_t)wg * 64 * 128;
    const uint32_t v_at = fa_smem(vs) + (uint32_t)wg * 64 * 128;
    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        dk[i][0] = dk[i][1] = dk[i][2] = dk[i][3] = 0.0f;
        dv[i][0] = dv[i][1] = dv[i][2] = dv[i][3] = 0.0f;
    }
    int stage = 0, qt = 0;
    for (int item = 0; item < total; item++) {
        fa_cp_wait<ST - 2>();
        wg_proxy_fence();
        __syncthreads();   // item's stage landed; every warp is done with the previous stage
        if (item + ST - 1 < total) items.load(a, fa_prev_stage<ST>(stage), vec, tid);
        fa_cp_commit();
        const tr_bf16 *sq = stg + stage * STAGE, *sdo = sq + BQ * D;
        const float *lse2 = lse_s + stage * BQ, *dl = delta_s + stage * BQ;
        const int i0 = k0 + qt * BQ;
        qt = qt + 1 == nq ? 0 : qt + 1;
        if (gk0 < k1 && i0 + BQ - 1 >= gk0) {
            float s[NT][4], dp[NT][4];   // S^T and dP^T: keys by queries
            wg_fence();
            wg_abt_issue<D, BK>(s, k_at, fa_smem(sq));
            wg_abt_issue<D, BK>(dp, v_at, fa_smem(sdo));
            wg_commit();
            wg_wait<0>();
            wg_keep(s);
            wg_keep(dp);
            // query tiles every key of the warp sees whole need no mask
            if (i0 >= wk0 + 15 && i0 + BQ <= q_end)
                fa_dkv_probs<NT, false>(s, dp, lse2, dl, a.sl2, a.scale, i0, key, q_end);
            else
                fa_dkv_probs<NT, true>(s, dp, lse2, dl, a.sl2, a.scale, i0, key, q_end);
            uint32_t fr[BQ / 16][4];
            if (want_v) {
#pragma unroll
                for (int kk = 0; kk < BQ / 16; kk++) fa_acc_to_a(fr[kk], s, kk);
                wg_pv<D, BQ>(dv, fr, fa_smem(sdo));
            }
            if (want_k) {
#pragma unroll
                for (int kk = 0; kk < BQ / 16; kk++) fa_acc_to_a(fr[kk], dp, kk);
                wg_pv<D, BQ>(dk, fr, fa_smem(sq));
            }
        }
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();
    fa_dkv_store<D>(a, dk, dv, key, k1, kvh, t);
}

// ---- launch (host) ----

template <int D, int NWG, int MINB>
static void fa_dq_wg_run(tr_backend *be, const fa_bwd_args &a) {
    constexpr int BQ = NWG * 64;
    const size_t shm =
        1024 + (size_t)(2 * BQ + 2 * FA_BWD_STAGES * FA_BWD_BN) * D * sizeof(tr_bf16);
    auto kernel = fa_dq_wg_kernel<D, NWG, MINB>;
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    // tiles in reverse: the last rows (most keys) first
    dim3 grid((unsigned)a.H, (unsigned)((a.T + BQ - 1) / BQ));
    kernel<<<grid, NWG * 128, shm, tr_cuda_stream(be)>>>(a);
    TR_CUDA_LAUNCHED(be, "attention_backward dq");
}

// The TMA dQ pass's launch: tensor maps of K and V in tiles of FA_BWD_BN keys, ST stages (four
// at D = 64; three at D = 128, where four do not fit beside Q and dO).
template <int D, int NWG, int MINB, int ST>
static void fa_dq_tma_run(tr_backend *be, const fa_bwd_args &a) {
    constexpr int BQ = NWG * 64;
    CUtensorMap tk, tv;
    const int64_t cols = (int64_t)a.KVH * D;
    if (tr_tma_map_bf16(be, &tk, a.k, cols, a.T, a.ld, FA_BWD_BN) ||
        tr_tma_map_bf16(be, &tv, a.v, cols, a.T, a.ld, FA_BWD_BN))
        return;
    const size_t shm = 1024 + (size_t)(2 * BQ + 2 * ST * FA_BWD_BN) * D * sizeof(tr_bf16) +
                       2 * ST * sizeof(uint64_t);
    auto kernel = fa_dq_tma_kernel<D, NWG, MINB, ST>;
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)a.H, (unsigned)((a.T + BQ - 1) / BQ));
    kernel<<<grid, NWG * 128, shm, tr_cuda_stream(be)>>>(tk, tv, a);
    TR_CUDA_LAUNCHED(be, "attention_backward dq");
}

template <int D>
static void fa_backward_run(tr_backend *be, const fa_bwd_args &a) {
    constexpr int LDS = D + FA_PAD, B16 = FA_BWD_WARPS * 16, ST = FA_BWD_STAGES;
    cudaStream_t st = tr_cuda_stream(be);
    const int64_t warps = ((int64_t)a.T * a.H + FA_ROWS_PER_WARP - 1) / FA_ROWS_PER_WARP;
    fa_rows_kernel<D><<<(unsigned)((warps + 7) / 8), 256, 0, st>>>(a);
    if (TR_CUDA_LAUNCHED(be, "attention_backward rows")) return;
#if TR_CUDA_WGMMA
    if ((a.dk || a.dv) && (tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_DKV)) {
        const size_t shm = 1024 + (size_t)(2 * B16 + ST * 2 * FA_BWD_BN) * D * sizeof(tr_bf16) +
                           (size_t)2 * ST * FA_BWD_BN * sizeof(float);
        if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_dkv_wg_kernel<D>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)shm)))
            return;
        dim3 grid((unsigned)a.KVH, (unsigned)((a.T + B16 - 1) / B16 + a.n_docs));
        fa_dkv_wg_kernel<D><<<grid, FA_BWD_WARPS * 32, shm, st>>>(a);
        if (TR_CUDA_LAUNCHED(be, "attention_backward dk/dv")) return;
    } else
#endif
    if (a.dk || a.dv) {
        const size_t shm = (size_t)(2 * B16 + ST * 2 * FA_BWD_BN) * LDS * sizeof(tr_bf16) +
                           (size_t)2 * ST * FA_BWD_BN * sizeof(float);
        if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_dkv_kernel<D>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)shm)))
            return;
        // at most this many document tiles; blocks past the last one return at once
        dim3 grid((unsigned)a.KVH, (unsigned)((a.T + B16 - 1) / B16 + a.n_docs));
        fa_dkv_kernel<D><<<grid, FA_BWD_WARPS * 32, shm, st>>>(a);
        if (TR_CUDA_LAUNCHED(be, "attention_backward dk/dv")) return;
    }
#if TR_CUDA_WGMMA
    if (a.dq && (tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_DQ)) {
        // measured on an H200 (bench_cuda attention) against one block of two or three
        // warpgroups an SM at D = 64 and of two at D = 128
        if ((tr_cuda_ctx_of(be)->wgmma & TR_CUDA_WG_DQ_TMA) && !a.prefix && a.vec) {
            if constexpr (D == 64) fa_dq_tma_run<D, 2, 2, 4>(be, a);
            else fa_dq_tma_run<D, 3, 1, 3>(be, a);
            return;
        }
        if constexpr (D == 64) fa_dq_wg_run<D, 2, 2>(be, a);
        else fa_dq_wg_run<D, 3, 1>(be, a);
        return;
    }
#endif
    if (a.dq) {
        const size_t shm = (size_t)(2 * B16 + ST * 2 * FA_BWD_BN) * LDS * sizeof(tr_bf16);
        if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_dq_kernel<D>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)shm)))
            return;
        // tiles in reverse: the last rows (most keys) first
        dim3 grid((unsigned)a.H, (unsigned)((a.T + B16 - 1) / B16));
        fa_dq_kernel<D><<<grid, FA_BWD_WARPS * 32, shm, st>>>(a);
        TR_CUDA_LAUNCHED(be, "attention_backward dq");
    }
}

void tr_fa_backward(tr_backend *be, const fa_bwd_args &a, int32_t D) {
    if (D == 64) fa_backward_run<64>(be, a);
    else fa_backward_run<128>(be, a);
}
