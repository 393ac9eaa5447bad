// The warpgroup-MMA tile products of the flash forward (attention_wgmma.cuh) against a host
// product and against the mma.sync products they replace (attention_mma.cuh): S = Q K^T and
// O = P V for one warpgroup's 64 rows, at D = 64 (64 keys a tile) and D = 128 (32 keys), from
// random bf16 operands copied into 128-byte-swizzled shared tiles. The host product (fp64 over
// the same bf16 values) bounds the error; mma.sync's result is compared bit for bit, since the
// decode step multiplies with mma.sync and its rows must equal the forward's. Q comes from
// registers (wg_load_a), K and V from shared memory. Skips (77) without an sm_90 device or a
// build without sm_90a.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/attention_tile.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

#define M 64

// q [M][D], k and v [BN][D], p [M][BN] bf16; s and s_ref [M][BN], o and o_ref [M][D] fp32:
// wgmma's results and mma.sync's.
template <int D>
__global__ void wg_check_kernel(const tr_bf16 *q, const tr_bf16 *k, const tr_bf16 *v,
                                const tr_bf16 *p, float *s, float *s_ref, float *o,
                                float *o_ref) {
    constexpr int BN = fa_bn<D>(), NT = BN / 8, LDS = D + FA_PAD;
    extern __shared__ __align__(16) unsigned char sm[];
    const uint32_t a0 = (fa_smem(sm) + 1023u) & ~1023u;
    tr_bf16 *qs = reinterpret_cast<tr_bf16 *>(sm + (a0 - fa_smem(sm)));
    tr_bf16 *ks = qs + M * D, *vs = ks + BN * D;
    tr_bf16 *qp = vs + BN * D, *kp = qp + M * LDS, *vp = kp + BN * LDS;   // padded copies
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    auto rows = [](const tr_bf16 *base) {
        return [base](int r) -> const tr_bf16 * { return base + (size_t)r * D; };
    };
    fa_load_rows<D, true>(qs, M, rows(q), tid, 128, true, q);
    fa_load_rows<D, true>(ks, BN, rows(k), tid, 128, true, k);
    fa_load_rows<D, true>(vs, BN, rows(v), tid, 128, true, v);
    fa_load_rows<D>(qp, M, rows(q), tid, 128, true, q);
    fa_load_rows<D>(kp, BN, rows(k), tid, 128, true, k);
    fa_load_rows<D>(vp, BN, rows(v), tid, 128, true, v);
    fa_cp_commit();
    fa_cp_wait<0>();
    wg_proxy_fence();
    __syncthreads();

    // P's A fragments for the warp's 16 rows, from global
    uint32_t pa[BN / 16][4];
    const uint32_t *p32 = reinterpret_cast<const uint32_t *>(p);
    for (int kk = 0; kk < BN / 16; kk++)
        for (int e = 0; e < 4; e++) {
            const int r = warp * 16 + g + 8 * (e & 1), c = kk * 16 + 2 * t + 8 * (e >> 1);
            pa[kk][e] = p32[(r * BN + c) / 2];
        }
    uint32_t pm[1][BN / 16][4];
    memcpy(pm[0], pa, sizeof pa);

    float sw[NT][4], sr[1][NT][4];
    uint32_t qf[D / 16][4];
    wg_load_a<D, M>(qf, fa_smem(qs), warp * 16);
    wg_qk<D, BN>(sw, qf, fa_smem(ks));
    fa_gemm_abt<D, 1, NT>(sr, qp + warp * 16 * LDS, kp, LDS);
    float ow[D / 8][4] = {}, orf[1][D / 8][4] = {};
    wg_pv<D, BN>(ow, pa, fa_smem(vs));
    fa_gemm_pv<D, 1, BN / 16>(orf, pm, vp, LDS);

    for (int j = 0; j < NT; j++)
        for (int e = 0; e < 4; e++) {
            const int r = warp * 16 + g + 8 * (e >> 1), c = 8 * j + 2 * t + (e & 1);
            s[r * BN + c] = sw[j][e];
            s_ref[r * BN + c] = sr[0][j][e];
        }
    for (int j = 0; j < D / 8; j++)
        for (int e = 0; e < 4; e++) {
            const int r = warp * 16 + g + 8 * (e >> 1), c = 8 * j + 2 * t + (e & 1);
            o[r * D + c] = ow[j][e];
            o_ref[r * D + c] = orf[0][j][e];
        }
}

static float bf(tr_bf16 x) { return __bfloat162float(x); }

// Compares got [rows][cols] with the fp64 product (relative to the row's sum of |terms|) and
// with mma's bit for bit; returns the failures.
static int compare(const char *what, int D, const float *got, const float *mma,
                   const double *want, const double *mag, int rows, int cols) {
    double worst = 0;
    long differ = 0;
    int bad_at = -1;
    for (int i = 0; i < rows * cols; i++) {
        const double e = fabs(got[i] - want[i]) / (mag[i] > 0 ? mag[i] : 1);
        if (e > worst) worst = e, bad_at = i;
        differ += memcmp(&got[i], &mma[i], sizeof(float)) != 0;
    }
    const int ok = worst < 1e-5, same = differ == 0;
    printf("  D=%3d %-8s max rel err %.2e%s, against mma.sync: %s (%ld of %d differ)\n", D, what,
           worst, ok ? "" : " FAIL", same ? "bitwise" : "DIFFER", differ, rows * cols);
    if (!ok && bad_at >= 0)
        printf("    worst at row %d col %d: %g want %g\n", bad_at / cols, bad_at % cols,
               got[bad_at], want[bad_at]);
    return !ok + !same;
}

template <int D>
static int run(unsigned seed) {
    constexpr int BN = fa_bn<D>();
    const size_t nq = M * D, nk = BN * D, np = M * BN;
    tr_bf16 *h = (tr_bf16 *)malloc((nq + 2 * nk + np) * sizeof(tr_bf16));
    if (!h) return 1;
    srand(seed);
    for (size_t i = 0; i < nq + 2 * nk + np; i++)
        h[i] = __float2bfloat16((float)rand() / RAND_MAX * 2.0f - 1.0f);
    const tr_bf16 *hq = h, *hk = h + nq, *hv = hk + nk, *hp = hv + nk;
    tr_bf16 *d = NULL;
    float *f = NULL;
    const size_t nf = 2 * np + 2 * nq;
    if (cudaMalloc(&d, (nq + 2 * nk + np) * sizeof(tr_bf16)) != cudaSuccess ||
        cudaMalloc(&f, nf * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc failed\n");
        return 1;
    }
    cudaMemcpy(d, h, (nq + 2 * nk + np) * sizeof(tr_bf16), cudaMemcpyHostToDevice);
    const size_t shm = 1024 + (M + 2 * BN) * D * 2 + (M + 2 * BN) * (D + FA_PAD) * 2;
    cudaFuncSetAttribute(wg_check_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)shm);
    wg_check_kernel<D><<<1, 128, shm>>>(d, d + nq, d + nq + nk, d + nq + 2 * nk, f, f + np,
                                        f + 2 * np, f + 2 * np + nq);
    float *r = (float *)malloc(nf * sizeof(float));
    double *want = (double *)calloc(2 * (np + nq), sizeof(double));
    if (!r || !want) return 1;
    const cudaError_t e = cudaMemcpy(r, f, nf * sizeof(float), cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "D=%d: %s\n", D, cudaGetErrorString(e));
        return 1;
    }
    double *ws = want, *ms = want + np, *wo = want + 2 * np, *mo = wo + nq;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < BN; j++)
            for (int c = 0; c < D; c++) {
                const double x = (double)bf(hq[i * D + c]) * bf(hk[j * D + c]);
                ws[i * BN + j] += x;
                ms[i * BN + j] += fabs(x);
            }
    for (int i = 0; i < M; i++)
        for (int c = 0; c < D; c++)
            for (int j = 0; j < BN; j++) {
                const double x = (double)bf(hp[i * BN + j]) * bf(hv[j * D + c]);
                wo[i * D + c] += x;
                mo[i * D + c] += fabs(x);
            }
    int fails = compare("Q K^T", D, r, r + np, ws, ms, M, BN);
    fails += compare("P V", D, r + 2 * np, r + 2 * np + nq, wo, mo, M, D);
    cudaFree(d);
    cudaFree(f);
    free(h);
    free(r);
    free(want);
    return fails;
}

int main(void) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        major != 9 || !TR_CUDA_WGMMA) {
        printf("test_wgmma: no sm_90 device, or built without sm_90a: skipped\n");
        return 77;
    }
    int fails = 0;
    for (unsigned seed = 1; seed <= 3; seed++) fails += run<64>(seed) + run<128>(seed);
    printf("test_wgmma: %s\n", fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
