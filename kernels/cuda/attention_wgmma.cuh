// Hopper's warpgroup MMA (wgmma, sm_90a) for flash attention (.cu files only): shared-memory
// matrix descriptors, the asynchronous products with their fences, and the two tile products
// of attention, S = Q K^T and O += P V, for the 64 query rows of one warpgroup (four warps);
// the dQ pass of the backward takes the same two shapes (S and dP = dO V^T, dQ += dS K).
//
// Why: mma.sync issues a 16x8x16 product per warp instruction, and the forward at D = 64 spent
// its issue slots on them, their operand loads and the softmax, latency-bound at 8 warps an
// SM. One wgmma multiplies 64 rows by up to 128 columns over k16, its B operand read from
// shared memory by the tensor cores themselves.
//
// Layouts (PTX ISA, "asynchronous warpgroup level matrix shared memory layout"): operands in
// shared memory use the 128-byte swizzle (fa_sm_off<D, true>): blocks of 64 columns, rows of
// 128 bytes, 16-byte piece j of row r at j ^ (r mod 8), every block 1024-byte aligned. The
// forward takes Q's fragments into registers (ldmatrix from that layout); the dQ pass reads Q
// and dO from shared memory, K-major as K. K is K-major (the reduction runs along its rows): the descriptor's stride byte offset is 1024 (eight rows), the leading one
// unused, and the k16 step kk starts 32 bytes further into the row (the swizzle applies to
// the address the hardware forms). V is MN-major for P V (its
// rows run along the reduction, keys): transposed B, stride 1024 bytes between groups of eight
// keys, leading offset the distance between blocks of 64 channels. The accumulator of an
// m64nN product gives warp w of the group rows 16w..16w+15 in the m16n8 C layout of mma.sync
// (attention_ptx.cuh), n8 tile after n8 tile, and P's A fragments from registers use the A
// layout of m16n8k16: the softmax code of attention_tile.cuh runs on them unchanged.
// Each product's k16 steps are issued in ascending order into one accumulator, as
// fa_gemm_abt and fa_gemm_pv add them.
#pragma once
#include <stdint.h>

#include "kernels/cuda/attention_mma.cuh"

// The descriptor of a 128-byte-swizzled operand at shared address addr (byte offsets lbo and
// sbo as above).
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)((lbo & 0x3FFFF) >> 4) << 16 |
           (uint64_t)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ASM(...) asm volatile(__VA_ARGS__)
#else
// Compiled for a device without wgmma: never launched there (tr_fa_forward picks mma.sync).
#define WG_ASM(...) __trap()
#endif

// Registers written by ordinary instructions are ready for a following wgmma.
__device__ __forceinline__ void wg_fence() { WG_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    WG_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    WG_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Shared memory this thread wrote (cp.async, st.shared) is visible to the tensor cores' reads
// once every writer has run this and then met at a barrier.
__device__ __forceinline__ void wg_proxy_fence() {
    WG_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The compiler may neither read nor reuse these registers across this point: after a wait, an
// accumulator or a register operand the tensor cores were still reading is settled here.
template <int N>
__device__ __forceinline__ void wg_keep(float (&d)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int N>
__device__ __forceinline__ void wg_keep(uint32_t (&a)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(a[j][e])::"memory");
}

#define WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define WG_D16(j) WG_D4(j), WG_D4(j + 1), WG_D4(j + 2), WG_D4(j + 3)
#define WG_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R32                                                                              \
    WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, " \
           "%31"
#define WG_R64                                                                              \
    WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
           "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, " \
           "%63"

// d (+)= A B, m64 x n64 (or n128) x k16, A and B from shared memory, both K-major; acc 0
// writes d = A B.
__device__ __forceinline__ void wg_mma_ss(float (&d)[8][4], uint64_t da, uint64_t db, int acc) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_R32
           "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
           : WG_D16(0), WG_D16(4)
           : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wg_mma_ss(float (&d)[16][4], uint64_t da, uint64_t db,
                                          int acc) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R64
           "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
           : WG_D16(0), WG_D16(4), WG_D16(8), WG_D16(12)
           : "l"(da), "l"(db), "r"(acc));
}
// d (+)= A B, m64 x n(8 NT) x k16, A from registers (m16n8k16 A fragments, a warp's 16 rows),
// B from shared memory, K-major (TB 0) or MN-major (TB 1: transposed); acc 0 writes d = A B.
template <int TB>
__device__ __forceinline__ void wg_mma_rs(float (&d)[4][4], const uint32_t (&a)[4], uint64_t db,
                                          int acc) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {" WG_R16
           "}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
           : WG_D16(0)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wg_mma_rs(float (&d)[8][4], const uint32_t (&a)[4], uint64_t db,
                                          int acc) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_R32
           "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
           : WG_D16(0), WG_D16(4)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wg_mma_rs(float (&d)[16][4], const uint32_t (&a)[4],
                                          uint64_t db, int acc) {
    WG_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
           "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_R64
           "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
           : WG_D16(0), WG_D16(4), WG_D16(8), WG_D16(12)
           : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
}

// The A fragments of the warp's 16 rows of a swizzled tile of QR rows at shared address q (the
// warpgroup's rows from row 64 wg), all D / 16 k16 blocks: Q held in registers for wg_qk.
template <int D, int QR>
__device__ __forceinline__ void wg_load_a(uint32_t (&a)[D / 16][4], uint32_t q, int row0) {
    const int lane = threadIdx.x & 31, r = row0 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        fa_ldsm4_at(a[kk], q + (uint32_t)fa_sm_off<D, true>(r, kk * 16 + (lane >> 4) * 8, QR));
}

// Issues s = Q K^T for the warpgroup's 64 query rows: q, the warp's rows of Q as A fragments
// (wg_load_a; the tensor cores then read only K from shared memory), and k, the shared address
// of a swizzled tile of BN keys; D channels in D / 16 k16 steps, ascending.
template <int D, int BN>
__device__ __forceinline__ void wg_qk_issue(float (&s)[BN / 8][4], uint32_t (&q)[D / 16][4],
                                            uint32_t k) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wg_mma_rs<0>(s, q[kk],
                     wg_desc(k + (uint32_t)(kk >> 2) * BN * 128 + (uint32_t)(kk & 3) * 32, 16, 1024),
                     kk > 0);
}
// The same, fenced, committed and waited for.
template <int D, int BN>
__device__ __forceinline__ void wg_qk(float (&s)[BN / 8][4], uint32_t (&q)[D / 16][4],
                                      uint32_t k) {
    wg_fence();
    wg_qk_issue<D, BN>(s, q, k);
    wg_commit();
    wg_wait<0>();
    wg_keep(s);
}

// Issues d = A B^T for the warpgroup's 64 rows, A and B both swizzled in shared memory: a, the
// address of the group's first row in a tile of AR rows, b, a tile of BR rows (64, or 128);
// D channels in D / 16 k16 steps, ascending. The caller fences, commits and waits (two
// products can share one wait).
template <int D, int AR, int BR = 64>
__device__ __forceinline__ void wg_abt_issue(float (&d)[BR / 8][4], uint32_t a, uint32_t b) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t col = (uint32_t)(kk & 3) * 32;   // bytes into the 128-byte rows
        wg_mma_ss(d, wg_desc(a + (uint32_t)(kk >> 2) * AR * 128 + col, 16, 1024),
                  wg_desc(b + (uint32_t)(kk >> 2) * BR * 128 + col, 16, 1024), kk > 0);
    }
}

// Issues o += P V for the warpgroup's rows: p, the bf16 probabilities as A fragments (K16 k16
// blocks of keys), and v, the first of those keys in a swizzled tile of R keys by D channels
// (R * 128 bytes between its blocks of 64 channels); keys ascending.
template <int D, int K16, int R>
__device__ __forceinline__ void wg_pv_part_issue(float (&o)[D / 8][4], uint32_t (&p)[K16][4],
                                                 uint32_t v) {
#pragma unroll
    for (int kk = 0; kk < K16; kk++)
        wg_mma_rs<1>(o, p[kk], wg_desc(v + (uint32_t)kk * 16 * 128, R * 128, 1024), 1);
}
// The same over a whole tile of BN keys.
template <int D, int BN>
__device__ __forceinline__ void wg_pv_issue(float (&o)[D / 8][4], uint32_t (&p)[BN / 16][4],
                                            uint32_t v) {
    wg_pv_part_issue<D, BN / 16, BN>(o, p, v);
}
// The same, fenced, committed and waited for.
template <int D, int K16, int R>
__device__ __forceinline__ void wg_pv_part(float (&o)[D / 8][4], uint32_t (&p)[K16][4],
                                           uint32_t v) {
    wg_fence();
    wg_pv_part_issue<D, K16, R>(o, p, v);
    wg_commit();
    wg_wait<0>();
    wg_keep(o);
    wg_keep(p);
}
template <int D, int BN>
__device__ __forceinline__ void wg_pv(float (&o)[D / 8][4], uint32_t (&p)[BN / 16][4],
                                      uint32_t v) {
    wg_pv_part<D, BN / 16, BN>(o, p, v);
}

// Whether pred holds for any thread of the calling thread's warpgroup, every thread of which
// calls it: a reduction over named barrier 1 + the group's index (so that the groups of a
// block do not wait for each other). Barrier 0 is the block's.
__device__ __forceinline__ bool wg_any(bool pred) {
    uint32_t r = 0;
    WG_ASM("{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, 128, q;\n"
           "selp.u32 %0, 1, 0, p;\n}\n"
           : "=r"(r)
           : "r"((uint32_t)pred), "r"(1u + (threadIdx.x >> 7))
           : "memory");
    return r != 0;
}
