// Decode attention over the paged KV cache, bf16 path, on the flash forward's arithmetic: one
// block per (sequence, kv head, group of up to 16 of its query heads), whose query heads are
// the rows of the forward's MMA tile, so each KV block is read once for the whole group. The
// context is split into softmax chunks (a.chunk positions), fixed by the position in the
// sequence and not by the batch; the block's warps take chunks in turn, each streaming its
// tiles through its own cp.async stages, and warp 0 folds the finished chunks in position order, exactly as
// the forward folds a long row's chunks. So out row b is bitwise attention_forward's row of
// the same token (attention_tile.cuh says why). Positions at and past seq_len[b] are zeros in
// shared memory, whatever the cache holds there. A block holds all of its chunks because the
// op has no scratch memory for partial results between blocks; so one long sequence alone
// runs on only KVH blocks, well under the memory bandwidth (batches of 64 and more fill it).
#include <stdlib.h>

#include "kernels/cuda/attention_flash.cuh"
#include "kernels/cuda/attention_tile.cuh"

#define FA_DEC_MAX_WARPS 4

// One published chunk: m[16], l[16] (full row sums), o[16][D] fp32.
template <int D>
constexpr int fa_dec_slot_floats() { return 32 + 16 * D; }

template <int D, int NST>
__global__ void __launch_bounds__(FA_DEC_MAX_WARPS * 32) fa_decode_kernel(const fa_dec_args a) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD;
    extern __shared__ __align__(16) unsigned char fa_sm[];
    const int W = (int)(blockDim.x >> 5), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(fa_sm);
    tr_bf16 *wst = qs + (16 + warp * NST * 2 * BN) * LDS;   // this warp's stages: K then V
    float *slots = reinterpret_cast<float *>(qs + (16 + W * NST * 2 * BN) * LDS);
    long long *offs = reinterpret_cast<long long *>(slots + W * fa_dec_slot_floats<D>()) +
                      warp * BN;   // this warp's slot offsets of the tile being loaded
    tr_pdl_wait();
    tr_pdl_release();
    const int b = blockIdx.y, kvh = blockIdx.x / a.n_hg, hg = blockIdx.x % a.n_hg;
    const int G = a.H / a.KVH, h0 = kvh * G + hg * 16, nrows = min(16, G - hg * 16);
    const tr_bf16 *qrow = a.q + (size_t)b * (size_t)a.ld;
    tr_bf16 *orow = a.out + ((size_t)b * a.H + h0) * D;

    fa_load_rows<D>(
        qs, 16,
        [&](int r) -> const tr_bf16 * { return r < nrows ? qrow + (size_t)(h0 + r) * D : nullptr; },
        tid, (int)blockDim.x, a.vecq != 0, a.q);
    fa_cp_commit();
    const int n = a.seq_len[b];
    if (n <= 0) {   // no keys: zeros, as the row kernel gives
        for (int i = tid; i < nrows * D; i += blockDim.x) orow[i] = __float2bfloat16_rn(0.0f);
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

    for (int c0 = 0; c0 < nch; c0 += W) {
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
            if (nch > 1) {   // publish the chunk for the fold
                float *sl = slots + warp * fa_dec_slot_floats<D>();
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
        if (nch > 1) {
            __syncthreads();
            if (warp == 0) {
                for (int j = 0; j < W && c0 + j < nch; j++) {   // chunks in position order
                    const float *sl = slots + j * fa_dec_slot_floats<D>();
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const float mc = sl[g + 8 * r], lc = sl[16 + g + 8 * r];
                        const fa_fold_t f = fa_fold_coef(am[r], mc);
                        al[r] = fa_fold(f, al[r], lc);
                        am[r] = fa_fold_max(f, am[r], mc);
#pragma unroll
                        for (int i = 0; i < D / 8; i++)
#pragma unroll
                            for (int cc = 0; cc < 2; cc++) {
                                const float c = sl[32 + (g + 8 * r) * D + i * 8 + 2 * t + cc];
                                ao[i][2 * r + cc] = fa_fold(f, ao[i][2 * r + cc], c);
                            }
                    }
                }
            }
            __syncthreads();   // the slots are rewritten by the next turn
        }
    }

    if (warp != 0) return;
    if (nch == 1) {   // warp 0 ran the only chunk: its state is the row
#pragma unroll
        for (int r = 0; r < 2; r++) al[r] = fa_quad_sum(st.l[0][r]);
#pragma unroll
        for (int i = 0; i < D / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) ao[i][e] = st.o[0][i][e];
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = g + 8 * r;
        if (row >= nrows) continue;
        const float inv = fa_inv(al[r]);
        tr_bf16 *o = orow + (size_t)row * D + 2 * t;
#pragma unroll
        for (int i = 0; i < D / 8; i++)
            fa_store2(o + i * 8, fa_out(ao[i][2 * r], inv), fa_out(ao[i][2 * r + 1], inv),
                      a.out4 != 0);
    }
}

// ---- launch (host) ----

template <int D, int NST>
static size_t fa_dec_shared(int W) {
    constexpr int BN = fa_bn<D>(), LDS = D + FA_PAD;
    return (size_t)(16 + W * NST * 2 * BN) * LDS * sizeof(tr_bf16) +
           (size_t)W * fa_dec_slot_floats<D>() * sizeof(float) +
           (size_t)W * BN * sizeof(long long);
}

template <int D, int NST>
static void fa_decode_run(tr_backend *be, const fa_dec_args &a, int32_t B, int W) {
    const size_t shm = fa_dec_shared<D, NST>(W);
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(fa_decode_kernel<D, NST>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)(a.KVH * a.n_hg), (unsigned)B);
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, true, fa_decode_kernel<D, NST>, grid,
                                         dim3((unsigned)(32 * W)), shm, a)))
        return;
    TR_CUDA_LAUNCHED(be, "attention_decode");
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
static void fa_decode_dispatch(tr_backend *be, const fa_dec_args &a, int32_t B, int W, int nst) {
    if (nst == 1) fa_decode_run<D, 1>(be, a, B, W);
    else if (nst == 2) fa_decode_run<D, 2>(be, a, B, W);
    else fa_decode_run<D, 4>(be, a, B, W);
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

void tr_fa_decode(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx) {
    int W = fa_dec_warps(be, a, B, max_ctx);
    int nst = fa_dec_stages(be, a, B, W);
    if (a.D == 64) fa_decode_dispatch<64>(be, a, B, W, nst);
    else fa_decode_dispatch<128>(be, a, B, W, nst);
}
