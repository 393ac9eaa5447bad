// Decode-sized forward products out[T][OC] = x[T][IC] w[OC][IC]^T on tensor cores, each output
// reduced as cuBLASLt's unsplit Hopper kernels reduce it, so that a decode step can run them
// on the whole device without leaving the training forward's bits.
//
// Why: without split-K, cuBLASLt tiles a product by its output, in tiles made for thousands of
// tokens; at 64 tokens the 0.5B model's down projection (896 x 4864) runs on 28 CTAs and its
// QKV on 16, so a fifth of the SMs stream the weights. Split-K would fill the device but adds
// partial sums in another order (other bits). Here, too, only output tiles run in parallel,
// but small ones.
//
// Order (the whole contract): for each output, acc = 0; for kb = 0, 16, 32, ... ascending:
// acc = mma.m16n8k16(acc, w[o][kb..kb+15], x[t][kb..kb+15]) (bf16 products, fp32 accumulator);
// then out = acc, acc + bias[o] or acc + out_old, one fp32 addition, rounded once to out's
// type. cuBLASLt's Hopper kernels reduce in that chain of k16 blocks (every unsplit one gives
// the same bits, bench_cuda gemm_decode), so this kernel probably does too; plan_settle
// (gemm_lt.cu) runs it only where it compares equal bit for bit on the product's own data.
// The weights take the MMA's M role (m16) and the tokens its N role (n8), as in cuBLAS's
// column-major D = W X^T; an output is never split over k, summed in a second pass or added
// by atomics.
//
// Design. A CTA computes BM output channels x BN tokens with WM x WN warps; a warp holds
// MT x NT independent m16n8 accumulators (its (BM/WM) x (BN/WN) tile) and issues their MMAs
// of one k16 block back to back, so several chains' latencies overlap. Operands are staged
// through shared memory in k-tiles of 64 (four k16 blocks) by 16-byte cp.async.cg copies,
// ST stages deep (ST - 1 tiles in flight while one is multiplied, 80-110 KB, two CTAs an SM),
// rows padded by 16 bytes so that ldmatrix hits every bank once (FA_PAD). A weight tile is
// read from HBM once: the CTAs that share it differ only in their token tile, and blockIdx.x
// (the token tile) varies fastest, so they run together and the later ones hit L2; the token
// tile is read by all the CTA's warps from shared memory and by all CTAs through L2.
// Rows past OC or T and k past IC are zero-filled copies; a warp with no live rows or tokens
// skips its MMAs, and k16 blocks past IC are never multiplied (the chain has exactly IC / 16
// links).
//
// Which tile is fastest depends on the shape. The chain is a floor no tiling moves: IC / 16
// dependent MMAs (304 at IC = 4864, some 5 us at ~30 cycles each), so a long reduction wants
// many CTAs with few accumulators a warp, while a short one is bound by the weights' HBM bytes
// and the tokens' L2 traffic, which grows as OC T IC (1/BM + 1/BN): bigger tiles. Since every
// configuration computes the same bits, plan_settle times each (tr_gemm_seqk_cfg) and keeps
// the fastest. CTAs at T = 64 (0.5B: qkv 896->1152, o 896->896, gate/up 896->9728, down
// 4864->896; the 1.5B's 2048 / 1536 / 17920 / 1536):
//   tile BMxBN  warps  acc/warp  stages   qkv    o/down  gate/up  | 1.5B qkv  o/down  gate/up
//   128x64      4x2    2x4       4          9      7       76      |   16       12      140
//   64x64       2x2    2x4       6         18     14      152      |   32       24      280
//   32x64       2x2    1x4       8         36     28      304      |   64       48      560
//   64x32       2x2    2x2       8         36     28      304      |   64       48      560
//   16x64       1x4    1x2       8         72     56      608      |  128       96     1120
//   32x32       2x2    1x2       10        72     56      608      |  128       96     1120
//   64x16       4x1    1x2       8         72     56      608      |  128       96     1120
//   16x32       1x4    1x1       12       144    112     1216      |  256      192     2240
//   32x16       2x2    1x1       12       144    112     1216      |  256      192     2240
//   16x16       1x2    1x1       12       288    224     2432      |  512      384     4480
// (an H200 has 132 SMs). Tiles wider than the batch's tokens rounded up to 16 are refused:
// they would multiply zeros.
//
// Fused with SwiGLU (a.glu = I, the gate/up product of a decode step, whose output nothing but
// SwiGLU reads there): the kernel's rows are the weights' rows interleaved, each m16 tile's
// first eight the gate rows of eight channels and its last eight their up rows, so that a
// lane's accumulator holds gate (rows g) and up (rows g + 8) of one channel for the same two
// tokens. The epilogue rounds both to bf16, as the product's output would be, and writes
// SwiGLU of them (swiglu.cuh, the elementwise kernel's formula) to the [T][I] output: the bits
// of the product then swiglu_forward, without the gate/up output's write and read or the
// second launch. Each output's chain is the unfused kernel's.
#include <limits.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/gemm_seqk.cuh"
#include "kernels/cuda/swiglu.cuh"

#define SQ_BK 64                 // k per pipeline stage: four k16 blocks
#define SQ_LDS (SQ_BK + FA_PAD)  // shared row stride in elements (144 bytes)

typedef struct sq_args {
    const tr_bf16 *w;   // [m][lda]
    const tr_bf16 *x;   // [n][ldb]
    void *d;            // [n][ldd], O
    const void *bias;   // [m], O, or NULL
    int64_t lda, ldb, ldd;
    int32_t m, n, k;
    int32_t accumulate;
    int32_t glu;        // I: fused with SwiGLU (m = 2I rows interleaved, d [n][I] bf16); 0: not
} sq_args;

// The weight row of the kernel's row kr when fused with SwiGLU: m16 tile kr / 16 covers
// channels 8 (kr / 16) .. + 7, its rows 0-7 their gate rows and 8-15 their up rows (I + ...).
__device__ __forceinline__ int sq_glu_row(int kr, int I) {
    return ((kr & 8) ? I : 0) + ((kr >> 4) << 3) + (kr & 7);
}

template <int BM, int BN, int ST>
constexpr size_t sq_shared_bytes() {
    return (size_t)ST * (BM + BN) * SQ_LDS * sizeof(tr_bf16);
}

// The main loop works on 32-bit shared addresses (fa_cp16_at, fa_ldsm4_at) computed once a
// thread and advanced, so that a k-tile costs its copies and MMAs and little else (Nsight
// Compute: a version that recomputed every address issued 165 instructions a k-tile for a
// warp's 4 MMAs, and with one warp a scheduler that issue was the whole kernel's time).

template <int BM, int BN, int WM, int WN, int ST, typename O, bool GLU>
__global__ void __launch_bounds__(WM * WN * 32) sq_kernel(const sq_args a) {
    constexpr int NTH = WM * WN * 32, CPR = SQ_BK / 8;   // threads; 16-byte pieces a row
    constexpr int MT = BM / WM / 16, NT = BN / WN / 8;   // m16 and n8 tiles a warp
    constexpr int ROWS = BM + BN, LOADS = ROWS * CPR / NTH;
    constexpr uint32_t ROWB = SQ_LDS * sizeof(tr_bf16);             // a shared row's bytes
    constexpr uint32_t STAGEB = ROWS * ROWB, ALLB = ST * STAGEB;    // a stage's, all stages'
    static_assert(MT >= 1 && NT >= 1 && BM == WM * MT * 16 && BN == WN * NT * 8, "warp tiles");
    static_assert(NT == 1 || NT % 2 == 0, "n8 tiles are loaded in pairs");
    static_assert(ROWS * CPR % NTH == 0 && ST >= 2, "copies");
    extern __shared__ __align__(16) unsigned char sq_sm[];
    // ST stages, each [BM weight rows + BN token rows][SQ_LDS]
    const uint32_t sm0 = fa_smem(sq_sm);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wm = warp / WN, wn = warp % WN;
    const int n0 = (int)blockIdx.x * BN, m0 = (int)blockIdx.y * BM;
    const int KT = (a.k + SQ_BK - 1) / SQ_BK;

    // The thread's copies of a k-tile: piece j is row r (weights m0.. for r < BM, then tokens
    // n0..), columns c..c+7 of the tile, the same for every k-tile but for k0. Each group of
    // eight threads copies one row's 128 bytes (coalesced), and a warp's four rows are all
    // weights or all tokens (BM is a multiple of 16). Rows past m or n copy nothing (zeros).
    const tr_bf16 *src[LOADS];
    uint32_t dst[LOADS], bytes[LOADS];
    int col[LOADS];
#pragma unroll
    for (int j = 0; j < LOADS; j++) {
        const int i = tid + j * NTH, r = i / CPR, c = (i % CPR) * 8;
        const bool ok = r < BM ? m0 + r < a.m : n0 + r - BM < a.n;
        const int wr = GLU ? sq_glu_row(m0 + r, a.glu) : m0 + r;
        src[j] = !ok ? a.w
                 : r < BM ? a.w + (size_t)wr * (size_t)a.lda + c
                          : a.x + (size_t)(n0 + r - BM) * (size_t)a.ldb + c;
        dst[j] = sm0 + (uint32_t)r * ROWB + (uint32_t)c * sizeof(tr_bf16);
        bytes[j] = ok ? 16u : 0u;
        col[j] = c;
    }
    // k-tile kt into the stage at byte offset off (a row that copies nothing reads from w's
    // first row, always an address: k0 < k <= lda); in the last, partial k-tile a piece past k
    // copies nothing either (k % 16 == 0: a piece is all in or all out)
    auto load = [&](int kt, uint32_t off) {
        const int k0 = kt * SQ_BK;
        if (k0 + SQ_BK <= a.k) {
#pragma unroll
            for (int j = 0; j < LOADS; j++) fa_cp16_at(dst[j] + off, src[j] + k0, bytes[j]);
            return;
        }
#pragma unroll
        for (int j = 0; j < LOADS; j++) {
            const bool in = k0 + col[j] < a.k;
            fa_cp16_at(dst[j] + off, in ? src[j] + k0 : a.w, in ? bytes[j] : 0u);
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;
    // a warp whose rows are all past m or whose tokens are all past n multiplies nothing
    const bool live = m0 + wm * MT * 16 < a.m && n0 + wn * NT * 8 < a.n;

    // The warp's fragment addresses in stage 0 at k 0: A (fa_lda's rows and halves) for each
    // m16 tile, B (fa_ldb's, or fa_ldsm2_at's for a single n8 tile) for each pair of n8 tiles.
    uint32_t a_at[MT], b_at[NT == 1 ? 1 : NT / 2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        a_at[mt] = sm0 + (uint32_t)((wm * MT + mt) * 16 + (lane & 15)) * ROWB +
                   (uint32_t)(lane >> 4) * 16u;
    if constexpr (NT == 1) {
        b_at[0] = sm0 + (uint32_t)(BM + wn * 8 + (lane & 7)) * ROWB +
                  (uint32_t)((lane >> 3) & 1) * 16u;
    } else {
        const int mi = lane >> 3;
#pragma unroll
        for (int np = 0; np < NT / 2; np++)
            b_at[np] = sm0 + (uint32_t)(BM + wn * NT * 8 + np * 16 + (mi >> 1) * 8 + (lane & 7)) *
                                 ROWB +
                       (uint32_t)(mi & 1) * 16u;
    }
    // k16 block kb of the stage at byte offset off: every accumulator's next link
    auto mma_block = [&](uint32_t off, int kb) {
        const uint32_t ko = off + (uint32_t)kb * 32u;   // 16 bf16 columns
        uint32_t af[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) fa_ldsm4_at(af[mt], a_at[mt] + ko);
        if constexpr (NT == 1) {
            uint32_t b0, b1;
            fa_ldsm2_at(b0, b1, b_at[0] + ko);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) fa_mma(acc[mt][0], af[mt], b0, b1);
        } else {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t bf[4];
                fa_ldsm4_at(bf, b_at[np] + ko);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    fa_mma(acc[mt][2 * np], af[mt], bf[0], bf[1]);
                    fa_mma(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
                }
            }
        }
    };

    // One group committed per stage, empty ones included, so that group kt is k-tile kt and
    // waiting until ST - 2 are pending means k-tile kt has landed.
    uint32_t rd = 0, wr = 0;   // byte offsets of the stage read next and the one filled next
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < KT) load(s, wr);
        fa_cp_commit();
        wr += STAGEB;
    }
#pragma unroll 1
    for (int kt = 0; kt < KT; kt++) {
        fa_cp_wait<ST - 2>();
        // k-tile kt is visible to all warps, and all are done with kt - 1, whose stage the
        // copies below reuse
        __syncthreads();
        // The first block's links go out before the copies are issued: the chains, not the
        // copies, are the critical path, and an MMA in flight hides the copies' issue.
        if (live) mma_block(rd, 0);
        if (kt + ST - 1 < KT) load(kt + ST - 1, wr);
        fa_cp_commit();
        wr = wr + STAGEB == ALLB ? 0u : wr + STAGEB;
        if (live) {
            if (kt * SQ_BK + SQ_BK <= a.k) {
#pragma unroll
                for (int kb = 1; kb < SQ_BK / 16; kb++) mma_block(rd, kb);
            } else {   // the last, partial k-tile: its k16 blocks below k
                const int nkb = (a.k - kt * SQ_BK) / 16;   // at least 1
#pragma unroll
                for (int kb = 1; kb < SQ_BK / 16; kb++)
                    if (kb < nkb) mma_block(rd, kb);
            }
        }
        rd = rd + STAGEB == ALLB ? 0u : rd + STAGEB;
    }
    fa_cp_wait<0>();   // only empty groups remain; none is left behind at exit

// Epilogue: c[e] is output channel g (+8 for e >= 2), token 2t (+1 for odd e) of the
    // accumulator's tile; out is [token][ldd], so the eight lanes of one t write eight
    // consecutive channels of one token (a 32-byte sector in fp32).
    const int g = lane >> 2, t = lane & 3;
    O *d = static_cast<O *>(a.d);
    if constexpr (GLU) {   // c[0..1] gate and c[2..3] up of channel ch, tokens 2t and 2t + 1
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int ch = ((m0 + (wm * MT + mt) * 16) >> 1) + g;
                    const int tok = n0 + (wn * NT + nt) * 8 + 2 * t + e;
                    if (ch >= a.glu || tok >= a.n) continue;
                    const float gv = tr_f32(__float2bfloat16_rn(acc[mt][nt][e]));
                    const float uv = tr_f32(__float2bfloat16_rn(acc[mt][nt][e + 2]));
                    tr_store(d + (size_t)tok * (size_t)a.ldd + ch, ew_swiglu(gv, uv));
                }
        return;
    }
    const O *bias = static_cast<const O *>(a.bias);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int o = m0 + (wm * MT + mt) * 16 + g + (e >> 1) * 8;
                const int tok = n0 + (wn * NT + nt) * 8 + 2 * t + (e & 1);
                if (o >= a.m || tok >= a.n) continue;
                O *p = d + (size_t)tok * (size_t)a.ldd + o;
                float v = acc[mt][nt][e];
                if (a.accumulate) v = __fadd_rn(v, tr_f32(*p));
                else if (bias) v = __fadd_rn(v, tr_f32(bias[o]));
                tr_store(p, v);
            }
}

// ---- configurations and launch (host) ----

typedef int (*sq_launch_fn)(tr_backend *be, const sq_args &a, bool f32);

template <int BM, int BN, int WM, int WN, int ST, typename O, bool GLU>
static int sq_launch_t(tr_backend *be, const sq_args &a) {
    constexpr size_t shm = sq_shared_bytes<BM, BN, ST>();
    static_assert(shm <= 113 * 1024, "two CTAs an SM");
    auto kernel = sq_kernel<BM, BN, WM, WN, ST, O, GLU>;
    // above the 48 KB default: set at every launch, as the attention kernels do (a recording
    // may hold the launch; the attribute is not a stream operation)
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)) ||
        // all of L1 as shared memory (the copies bypass L1), so that two CTAs fit an SM
        TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel,
                                               cudaFuncAttributePreferredSharedMemoryCarveout,
                                               (int)cudaSharedmemCarveoutMaxShared)))
        return -1;
    dim3 grid((unsigned)((a.n + BN - 1) / BN), (unsigned)((a.m + BM - 1) / BM));
    kernel<<<grid, WM * WN * 32, shm, tr_cuda_stream(be)>>>(a);
    // gemm_lt.cu marks the profile with the product's name and shape, as for cuBLASLt
    if (TR_CUDA_CHECK(be, cudaGetLastError())) return -1;
    if (tr_cuda_ctx_of(be)->sync_each_op &&
        TR_CUDA_CHECK(be, cudaStreamSynchronize(tr_cuda_stream(be))))
        return -1;
    return 0;
}

template <int BM, int BN, int WM, int WN, int ST>
static int sq_launch(tr_backend *be, const sq_args &a, bool f32) {
    if (a.glu) return sq_launch_t<BM, BN, WM, WN, ST, tr_bf16, true>(be, a);
    return f32 ? sq_launch_t<BM, BN, WM, WN, ST, float, false>(be, a)
               : sq_launch_t<BM, BN, WM, WN, ST, tr_bf16, false>(be, a);
}

typedef struct sq_config {
    int bm, bn;
    sq_launch_fn launch;
    const char *name;
} sq_config;

// Largest tile first (the default's order). Stages fill about 80-110 KB: enough copies in
// flight to cover HBM's latency at the chain's pace, and two CTAs an SM.
static const sq_config sq_configs[TR_SEQK_CONFIGS] = {
    {128, 64, sq_launch<128, 64, 4, 2, 4>, "tile 128x64 warps 4x2 stages 4"},
    {64, 64, sq_launch<64, 64, 2, 2, 6>, "tile  64x64 warps 2x2 stages 6"},
    {32, 64, sq_launch<32, 64, 2, 2, 8>, "tile  32x64 warps 2x2 stages 8"},
    {64, 32, sq_launch<64, 32, 2, 2, 8>, "tile  64x32 warps 2x2 stages 8"},
    {16, 64, sq_launch<16, 64, 1, 4, 8>, "tile  16x64 warps 1x4 stages 8"},
    {32, 32, sq_launch<32, 32, 2, 2, 10>, "tile  32x32 warps 2x2 stages 10"},
    {64, 16, sq_launch<64, 16, 4, 1, 8>, "tile  64x16 warps 4x1 stages 8"},
    {16, 32, sq_launch<16, 32, 1, 4, 12>, "tile  16x32 warps 1x4 stages 12"},
    {32, 16, sq_launch<32, 16, 2, 2, 12>, "tile  32x16 warps 2x2 stages 12"},
    {16, 16, sq_launch<16, 16, 1, 2, 12>, "tile  16x16 warps 1x2 stages 12"},
};

const char *tr_gemm_seqk_name(int cfg) {
    return cfg >= 0 && cfg < TR_SEQK_CONFIGS ? sq_configs[cfg].name : "none";
}

static bool sq_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

// The product as the kernel takes it, or false (see gemm_seqk.cuh).
static bool sq_args_of(const tr_lt_gemm *g, sq_args *a) {
    const bool f32 = g->d_type == CUDA_R_32F;
    if (g->ta != CUBLAS_OP_T || g->tb != CUBLAS_OP_N || g->a_type != CUDA_R_16BF ||
        g->b_type != CUDA_R_16BF || (!f32 && g->d_type != CUDA_R_16BF))
        return false;
    if (g->m <= 0 || g->n <= 0 || g->k <= 0 || g->m > INT_MAX || g->n > INT_MAX ||
        g->k > INT_MAX || g->m % 16 != 0 || g->k % 16 != 0)
        return false;
    // 16-byte copies of whole rows: aligned bases and leading dimensions of 8 elements
    if (!sq_aligned16(g->a) || !sq_aligned16(g->b) || g->lda % 8 != 0 || g->ldb % 8 != 0 ||
        g->lda < g->k || g->ldb < g->k || g->ldd < g->m)
        return false;
    const uintptr_t esize = f32 ? 4 : 2;   // element stores and bias loads
    if ((uintptr_t)g->d % esize != 0 || (g->bias && (uintptr_t)g->bias % esize != 0))
        return false;
    // which of the two additions comes first is not known for cuBLASLt's epilogue
    if (g->bias && g->accumulate) return false;
    a->w = (const tr_bf16 *)g->a;
    a->x = (const tr_bf16 *)g->b;
    a->d = g->d;
    a->bias = g->bias;
    a->lda = g->lda;
    a->ldb = g->ldb;
    a->ldd = g->ldd;
    a->m = (int32_t)g->m;
    a->n = (int32_t)g->n;
    a->k = (int32_t)g->k;
    a->accumulate = g->accumulate;
    a->glu = 0;
    return true;
}

// A tile no wider than the tokens rounded up to 16, whose grid fits.
static bool sq_fits(const sq_config *c, const sq_args *a) {
    const int32_t cap = a->n <= 16 ? 16 : a->n <= 32 ? 32 : 64;
    return c->bn <= cap && (a->m + c->bm - 1) / c->bm <= 65535;
}

// The default: the largest tile whose grid gives every SM a CTA, else the one with the most
// CTAs. plan_settle times them all; this serves direct calls.
static int sq_default(tr_backend *be, const sq_args *a) {
    const long sms = tr_cuda_ctx_of(be)->sms;
    int best = -1;
    long best_ctas = 0;
    for (int c = 0; c < TR_SEQK_CONFIGS; c++) {
        const sq_config *q = &sq_configs[c];
        if (!sq_fits(q, a)) continue;
        const long ctas = (long)((a->n + q->bn - 1) / q->bn) * ((a->m + q->bm - 1) / q->bm);
        if (ctas >= sms) return c;
        if (ctas > best_ctas) {
            best = c;
            best_ctas = ctas;
        }
    }
    return best;
}

int tr_gemm_seqk_cfg(tr_backend *be, const tr_lt_gemm *g, int cfg) {
    sq_args a;
    if (!sq_args_of(g, &a)) return 1;
    if (cfg < 0) cfg = sq_default(be, &a);
    if (cfg < 0 || cfg >= TR_SEQK_CONFIGS || !sq_fits(&sq_configs[cfg], &a)) return 1;
    return sq_configs[cfg].launch(be, a, g->d_type == CUDA_R_32F);
}

int tr_gemm_seqk_swiglu(tr_backend *be, const tr_lt_gemm *g, int32_t I, void *act, int cfg) {
    sq_args a;
    if (I <= 0 || I % 8 != 0 || g->m != 2 * (int64_t)I || g->d_type != CUDA_R_16BF || g->bias ||
        g->accumulate || ((uintptr_t)act & 1u) || !sq_args_of(g, &a))
        return 1;
    if (cfg < 0 || cfg >= TR_SEQK_CONFIGS || !sq_fits(&sq_configs[cfg], &a)) return 1;
    a.d = act;
    a.ldd = I;
    a.glu = I;
    return sq_configs[cfg].launch(be, a, false);
}
