// Forward products with few rows (a decode step: one token per sequence), bf16 in and fp32
// accumulation on tensor cores. cuBLASLt's kernels without split-K give an output block to
// one SM: a 64-row product of the 0.5B shape's down projection (896 outputs) ran on 7 of 132
// SMs, at a ninth of the memory bandwidth. Here a block is NW warps of 16 outputs each over
// TN rows, and the outputs are spread over as many blocks as fill the device; the operand
// tiles stream through shared memory by cp.async, STAGES deep.
//
// Each output is the same chain cuBLASLt's kernels compute: m16n8k16 MMAs over the k16 blocks
// in ascending order into one fp32 accumulator from zero, then the epilogue (the accumulated
// output added, then the bias, each a rounded fp32 addition; a bf16 output rounded once at the
// end). So in the batch-invariant mode a decode row keeps the bits the training forward gives
// the same token: test_cuda_ops checks the outputs against the cuBLASLt path bit for bit.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/gemm_small.h"

#define GS_KT 64                 // k columns a stage
#define GS_LDS (GS_KT + FA_PAD)  // padded shared row
#define GS_STAGES 4

struct gs_args {
    void *out;
    const tr_bf16 *x, *w, *bias;
    int32_t T, K, M;
    int out_f32, acc;
};

// Block: NW warps x 16 outputs, TN = 16 MT rows. Stage s holds x rows [TN][GS_LDS] then
// w rows [16 NW][GS_LDS].
template <int MT, int NW>
__global__ void __launch_bounds__(NW * 32) gs_kernel(const gs_args a) {
    constexpr int TN = 16 * MT, FB = 16 * NW, ROWS = TN + FB;
    extern __shared__ __align__(16) unsigned char gs_sm[];
    tr_bf16 *sm = reinterpret_cast<tr_bf16 *>(gs_sm);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int f0 = blockIdx.x * FB, t0 = blockIdx.y * TN;
    const int nk = (a.K + GS_KT - 1) / GS_KT;

    auto load = [&](int kt) {
        tr_bf16 *st = sm + (kt % GS_STAGES) * ROWS * GS_LDS;
        const int k0 = kt * GS_KT;
        for (int i = tid; i < ROWS * (GS_KT / 8); i += NW * 32) {
            const int r = i / (GS_KT / 8), c = (i % (GS_KT / 8)) * 8;
            const bool xr = r < TN;
            const int row = xr ? t0 + r : f0 + (r - TN);
            const bool ok = (xr ? row < a.T : row < a.M) && k0 + c < a.K;
            const tr_bf16 *src = (xr ? a.x : a.w) + (ok ? (size_t)row * a.K + k0 + c : 0);
            fa_cp16(st + r * GS_LDS + c, src, ok);
        }
    };

    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][n][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < GS_STAGES - 1; s++) {
        if (s < nk) load(s);
        fa_cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        fa_cp_wait<GS_STAGES - 2>();
        __syncthreads();   // stage kt is in; every warp is done with stage kt - 1
        if (kt + GS_STAGES - 1 < nk) load(kt + GS_STAGES - 1);
        fa_cp_commit();
        const tr_bf16 *xs = sm + (kt % GS_STAGES) * ROWS * GS_LDS;
        const tr_bf16 *ws = xs + TN * GS_LDS + warp * 16 * GS_LDS;
#pragma unroll
        for (int kk = 0; kk < GS_KT / 16; kk++) {
            uint32_t bf[4];
            fa_ldb(bf, ws, GS_LDS, 0, kk * 16);
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                uint32_t af[4];
                fa_lda(af, xs + mt * 16 * GS_LDS, GS_LDS, kk * 16);
                fa_mma(acc[mt][0], af, bf[0], bf[1]);
                fa_mma(acc[mt][1], af, bf[2], bf[3]);
            }
        }
    }
    fa_cp_wait<0>();

    // thread (g, t) holds rows g and g + 8 of each m16 tile, outputs 2t and 2t + 1 of each n8
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int hi = 0; hi < 2; hi++) {
            const int row = t0 + mt * 16 + g + 8 * hi;
            if (row >= a.T) continue;
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int f = f0 + warp * 16 + n * 8 + 2 * t + c;
                    if (f >= a.M) continue;
                    float v = acc[mt][n][2 * hi + c];
                    const size_t o = (size_t)row * a.M + f;
                    if (a.out_f32) {
                        float *y = static_cast<float *>(a.out) + o;
                        if (a.acc) v = __fadd_rn(v, *y);
                        if (a.bias) v = __fadd_rn(v, tr_f32(a.bias[f]));
                        *y = v;
                    } else {
                        if (a.bias) v = __fadd_rn(v, tr_f32(a.bias[f]));
                        static_cast<tr_bf16 *>(a.out)[o] = __float2bfloat16_rn(v);
                    }
                }
        }
}

template <int MT, int NW>
static size_t gs_shared() {
    return (size_t)GS_STAGES * (16 * MT + 16 * NW) * GS_LDS * sizeof(tr_bf16);
}

template <int MT, int NW>
static void gs_launch(tr_backend *be, const gs_args &a) {
    const size_t shm = gs_shared<MT, NW>();
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(gs_kernel<MT, NW>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)shm)))
        return;
    dim3 grid((unsigned)((a.M + 16 * NW - 1) / (16 * NW)), (unsigned)((a.T + 16 * MT - 1) / (16 * MT)));
    gs_kernel<MT, NW><<<grid, NW * 32, shm, tr_cuda_stream(be)>>>(a);
    // as tr_lt_matmul marks its products: keyed by shape in TROUPE_CUDA_PROFILE's table
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (TR_CUDA_CHECK(be, cudaGetLastError())) return;
    if (ctx->prof) tr_cuda_prof_mark(ctx, "gemm small", a.M, a.T, a.K);
    if (ctx->sync_each_op) TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream));
}

template <int MT>
static void gs_dispatch_nw(tr_backend *be, const gs_args &a, int nw) {
    if (nw == 1) gs_launch<MT, 1>(be, a);
    else if (nw == 2) gs_launch<MT, 2>(be, a);
    else gs_launch<MT, 4>(be, a);
}

static void gs_dispatch(tr_backend *be, const gs_args &a, tr_gs_shape s) {
    if (s.mt == 1) gs_dispatch_nw<1>(be, a, s.nw);
    else if (s.mt == 2) gs_dispatch_nw<2>(be, a, s.nw);
    else gs_dispatch_nw<4>(be, a, s.nw);
}

// Row tiles as tall as the rows need (up to 64); then the widest blocks (most warps sharing
// each x tile, the least traffic) that still give every SM two blocks, else one warp a block
// and shorter row tiles until they do. A function of the shape and the device alone.
tr_gs_shape tr_cuda_gemm_small_shape(tr_backend *be, int32_t T, int32_t M) {
    const long want = 2L * tr_cuda_ctx_of(be)->sms;
    tr_gs_shape s = {T > 32 ? 4 : T > 16 ? 2 : 1, 4};
    auto blocks = [&](tr_gs_shape c) {
        return (long)((M + 16 * c.nw - 1) / (16 * c.nw)) * ((T + 16 * c.mt - 1) / (16 * c.mt));
    };
    while (s.nw > 1 && blocks(s) < want) s.nw /= 2;
    while (s.mt > 1 && blocks(s) < want) s.mt /= 2;
    return s;
}

int tr_cuda_gemm_small_fits(tr_backend *be, const void *out, const void *in, const void *w,
                            int32_t T, int32_t IC, int32_t OC, int out_f32, int acc) {
    if (!tr_cuda_ctx_of(be)->small_gemm || T <= 0 || T > TR_GS_MAX_ROWS || IC <= 0 || OC <= 0 ||
        (acc && !out_f32))
        return 0;
    // 16-byte rows for cp.async: IC a multiple of 8 and 16-byte aligned operands
    uintptr_t al = (uintptr_t)in | (uintptr_t)w;
    return IC % 8 == 0 && al % 16 == 0 && (uintptr_t)out % 4 == 0;
}

void tr_cuda_gemm_small(tr_backend *be, void *out, const void *in, const void *w,
                        const void *bias, int32_t T, int32_t IC, int32_t OC, int out_f32,
                        int acc, tr_gs_shape s) {
    gs_args a = {out, (const tr_bf16 *)in, (const tr_bf16 *)w, (const tr_bf16 *)bias,
                 T, IC, OC, out_f32, acc};
    if (s.mt == 0) s = tr_cuda_gemm_small_shape(be, T, OC);
    gs_dispatch(be, a, s);
}

// ---- the small kernel against the cuBLASLt path (bench_cuda gemm_small, test_cuda_ops) ----

// Uniform values in [-1, 1) as bf16 bits (a fixed LCG: the same data on every run).
static void gs_fill(uint16_t *h, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = (float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

// One run of the product into d (with reset, from d0 first when accumulating): the cuBLASLt
// path (small 0) or the small kernel in shape s.
static void gs_probe_run(tr_backend *be, void *d, const void *d0, size_t db, const void *x,
                         const void *w, const void *bias, int32_t T, int32_t IC, int32_t OC,
                         int out_f32, int acc, int small, tr_gs_shape s, int reset) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (acc && reset && TR_CUDA_CHECK(be, cudaMemcpyAsync(d, d0, (size_t)T * OC * db,
                                                 cudaMemcpyDeviceToDevice, ctx->stream)))
        return;
    if (small) {
        tr_cuda_gemm_small(be, d, x, w, bias, T, IC, OC, out_f32, acc, s);
        return;
    }
    int keep = ctx->small_gemm;
    ctx->small_gemm = 0;
    tr_cuda_matmul_forward(be, d, x, w, bias, T, IC, OC,
                           (out_f32 ? TR_MM_OUT_F32 : 0) | (acc ? TR_MM_ACCUMULATE : 0));
    ctx->small_gemm = keep;
}

extern "C" int tr_backend_cuda_small_gemm_probe(tr_backend *be, int32_t T, int32_t IC,
                                                int32_t OC, int out_f32, int acc, int bias,
                                                const char *label, int verbose,
                                                int64_t *mismatches) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    *mismatches = -1;
    if (!tr_cuda_bf16(be) || T <= 0 || IC <= 0 || OC <= 0) return -1;
    const size_t db = out_f32 ? 4 : 2, nd = (size_t)T * OC;
    const size_t nx = (size_t)T * IC, nw = (size_t)OC * IC;
    uint16_t *h = (uint16_t *)malloc((nx > nw ? nx : nw) * sizeof(uint16_t) + nd * 4);
    unsigned char *ref = (unsigned char *)malloc(nd * db), *got = (unsigned char *)malloc(nd * db);
    void *x = NULL, *w = NULL, *bv = NULL, *d = NULL, *d0 = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = -1;
    if (!h || !ref || !got) goto out;
    if (TR_CUDA_CHECK(be, cudaMalloc(&x, nx * 2)) || TR_CUDA_CHECK(be, cudaMalloc(&w, nw * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&bv, (size_t)OC * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&d, nd * db)) || TR_CUDA_CHECK(be, cudaMalloc(&d0, nd * db)) ||
        TR_CUDA_CHECK(be, cudaEventCreate(&e0)) || TR_CUDA_CHECK(be, cudaEventCreate(&e1)))
        goto out;
    gs_fill(h, nx, 1);
    if (TR_CUDA_CHECK(be, cudaMemcpy(x, h, nx * 2, cudaMemcpyHostToDevice))) goto out;
    gs_fill(h, nw, 2);
    if (TR_CUDA_CHECK(be, cudaMemcpy(w, h, nw * 2, cudaMemcpyHostToDevice))) goto out;
    gs_fill(h, (size_t)OC, 3);
    if (TR_CUDA_CHECK(be, cudaMemcpy(bv, h, (size_t)OC * 2, cudaMemcpyHostToDevice))) goto out;
    {   // the accumulated output: fp32 values of the bf16 pattern, 16 times larger
        float *f = (float *)(h + (nx > nw ? nx : nw));
        gs_fill(h, nd, 4);
        for (size_t i = 0; i < nd; i++) {
            uint32_t u = (uint32_t)h[i] << 16;
            memcpy(&f[i], &u, 4);
            f[i] *= 16.0f;
        }
        if (TR_CUDA_CHECK(be, cudaMemcpy(d0, f, nd * db, cudaMemcpyHostToDevice))) goto out;
    }
    {
        const void *b = bias ? bv : NULL;
        const tr_gs_shape def = tr_cuda_gemm_small_shape(be, T, OC);
        // the cuBLASLt path first (the reference), then every shape, the default last
        tr_gs_shape shapes[10] = {{0, 0}};
        int n = 1;
        for (int mt = 1; mt <= 4; mt *= 2)
            for (int nw2 = 1; nw2 <= 4; nw2 *= 2)
                if (!(mt == def.mt && nw2 == def.nw)) shapes[n++] = {mt, nw2};
        shapes[n++] = def;
        int64_t bad_default = 0;
        for (int i = 0; i < n; i++) {
            const int small = i > 0;
            float ms = 0.0f;
            for (int r = 0; r < 13; r++) {
                if (r == 3 && TR_CUDA_CHECK(be, cudaEventRecord(e0, ctx->stream))) goto out;
                gs_probe_run(be, d, d0, db, x, w, b, T, IC, OC, out_f32, acc, small, shapes[i], 0);
            }
            if (TR_CUDA_CHECK(be, cudaEventRecord(e1, ctx->stream)) ||
                TR_CUDA_CHECK(be, cudaEventSynchronize(e1)) ||
                TR_CUDA_CHECK(be, cudaEventElapsedTime(&ms, e0, e1)))
                goto out;
            // the timed runs accumulated; one more from d0 gives the output to compare
            gs_probe_run(be, d, d0, db, x, w, b, T, IC, OC, out_f32, acc, small, shapes[i], 1);
            if (TR_CUDA_CHECK(be, cudaMemcpy(small ? got : ref, d, nd * db,
                                             cudaMemcpyDeviceToHost)))
                goto out;
            int64_t bad = 0;
            if (small)
                for (size_t j = 0; j < nd; j++) bad += memcmp(got + j * db, ref + j * db, db) != 0;
            if (i == n - 1) bad_default = bad;
            ms /= 10.0f;
            // bytes: the weights, the rows in and out once (an accumulated output twice)
            double bytes = 2.0 * ((double)nw + (double)nx) + (double)db * (double)nd * (acc ? 2 : 1);
            if (verbose)
                printf("  %-10s T=%-4d IC=%-5d OC=%-6d %-16s %8.2f us %6.0f GB/s  %s\n", label, T,
                       IC, OC,
                       small ? (i == n - 1 ? "small (default)" : "small") : "cuBLASLt",
                       1e3 * ms, 1e-6 * bytes / ms, small ? "" : "(reference)");
            if (verbose && small)
                printf("  %-10s   shape mt=%d nw=%d: %lld of %zu outputs differ from cuBLASLt's\n",
                       label, shapes[i].mt, shapes[i].nw, (long long)bad, nd);
        }
        *mismatches = bad_default;
        rc = 0;
    }
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(x);
    cudaFree(w);
    cudaFree(bv);
    cudaFree(d);
    cudaFree(d0);
    free(h);
    free(ref);
    free(got);
    return ctx->failed ? -1 : rc;
}
