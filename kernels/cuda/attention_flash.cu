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

#define FA_FWD_WARPS 4
#define FA_FWD_STAGES 3   // K/V tiles in shared memory at once (two blocks an SM fit either D)

// Folds the warp's state st (the current chunk) into the finished chunks (am, al, acc):
// to_state false stores the result in the accumulator and empties st (a chunk boundary);
// true leaves it in st with full row sums (the end).
template <int D, int MT>
__device__ __forceinline__ void fa_fold_acc(float (&am)[MT][2], float (&al)[MT][2], float *acc,
                                            fa_state<D, MT> &st, bool to_state) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const float lc = fa_quad_sum(st.l[mt][hi]);
            const fa_fold_t f = fa_fold_coef(am[mt][hi], st.m[mt][hi]);
            const float l = fa_fold(f, al[mt][hi], lc);
            const float m = fa_fold_max(f, am[mt][hi], st.m[mt][hi]);
#pragma unroll
            for (int n = 0; n < D / 8; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float &x = acc[(mt * (D / 8) + n) * 4 + 2 * hi + c];
                    const float r = fa_fold(f, x, st.o[mt][n][2 * hi + c]);
                    if (to_state) st.o[mt][n][2 * hi + c] = r;
                    else x = r;
                }
            if (to_state) {
                st.m[mt][hi] = m;
                st.l[mt][hi] = l;
            } else {
                am[mt][hi] = m;
                al[mt][hi] = l;
            }
        }
    if (!to_state) fa_reset(st);
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

    fa_load_rows<D>(
        qs, BM,
        [&](int r) -> const tr_bf16 * {
            return t0 + r < t1 ? a.q + (size_t)(t0 + r) * ld + (size_t)h * D : nullptr;
        },
        tid, NTH, vec, a.q);
    // it: the key tile taken next; group 0 holds the rows and the first tile
    fa_kv_stages<D, BN, NTH, ST> kv = {ks, vs, kb, vb, ld, vec, a.k, a.doc_start, a.prefix,
                                       a.n_docs, t1, tid, {}};
    fa_kv_iter it;
    fa_iter_first(it, a.doc_start, a.prefix, a.n_docs, t0, t1);
    kv.start(it);

    fa_state<D, MT> st;
    fa_reset(st);
    float am[MT][2], al[MT][2];
    float acc[MT * (D / 8) * 4];   // local memory: see fa_opaque_zero
    const int z = fa_opaque_zero();
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
        kv.refill((stage + ST - 1) % ST);
        // the warp's rows in this document: lo..hi, seeing positions up to hi - s + pl
        const int lo = max(w0, it.s), hi = min(w0 + 16 * MT, it.lim) - 1;
        if (lo <= hi && it.p0 <= hi - it.s + it.pl) {
            if (it.p0 > 0 && it.p0 % a.chunk == 0) {
                fa_fold_acc<D, MT>(am, al, acc + z, st, false);
                acc_used = true;
            }
            int last[MT][2];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int i = w0 + mt * 16 + g + 8 * r;
                    last[mt][r] = i >= it.s && i < it.lim ? i - it.s + it.pl : -1;
                }
            fa_tile<D, MT>(st, qs + warp * 16 * MT * LDS, ks + stage * BN * LDS,
                           vs + stage * BN * LDS, it.p0, last, a.sl2, true);
        }
        fa_iter_next<BN>(it, a.doc_start, a.prefix, a.n_docs, t1);
        stage = stage + 1 == ST ? 0 : stage + 1;
    }
    fa_cp_wait<0>();

    if (acc_used) {
        fa_fold_acc<D, MT>(am, al, acc + z, st, true);
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

void tr_fa_forward(tr_backend *be, const fa_fwd_args &a, int32_t D) {
    if (D == 64) fa_forward_run<64, 2>(be, a);
    else fa_forward_run<128, 2>(be, a);
}
