// The inline-PTX instructions under the flash-attention kernels (.cu files only): 16-byte
// asynchronous copies into shared memory, ldmatrix, the m16n8k16 bf16 MMA with fp32
// accumulation, exp2 and bf16 packing. Everything above them is plain CUDA C++.
//
// Fragments (PTX ISA, mma.m16n8k16): lane = 4 g + t. A (16x16) holds rows g and g+8, columns
// 2t, 2t+1 and 2t+8, 2t+9; B (16x8) holds k = 2t, 2t+1, 2t+8, 2t+9 of column g; the fp32
// C (16x8) holds c[0], c[1] at row g, columns 2t, 2t+1 and c[2], c[3] at row g+8.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t fa_smem(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16 bytes global -> shared without passing through L1; !valid writes 16 zero bytes (src is
// then not read but must still be a global address).
__device__ __forceinline__ void fa_cp16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
// The same to a 32-bit shared address, bytes 16 or 0 (0: 16 zero bytes, src not read): for
// loops that keep their shared addresses as offsets rather than pointers.
__device__ __forceinline__ void fa_cp16_at(uint32_t dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(bytes));
}
// 4 bytes (an fp32 statistic) global -> shared; !valid writes zero.
__device__ __forceinline__ void fa_cp4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(fa_smem(dst)),
                 "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void fa_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void fa_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i
// receives matrix i (transposed with _t).
// The _at forms take 32-bit shared addresses (loops that keep offsets, not pointers).
__device__ __forceinline__ void fa_ldsm4_at(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void fa_ldsm4(uint32_t r[4], const void *p) {
    fa_ldsm4_at(r, fa_smem(p));
}
// Two 8x8 b16 matrices: lanes 0..7 give the rows of matrix 0, lanes 8..15 those of matrix 1
// (the other lanes' addresses are not read, but are kept valid).
__device__ __forceinline__ void fa_ldsm2_at(uint32_t &r0, uint32_t &r1, uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}
__device__ __forceinline__ void fa_ldsm4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_smem(p)));
}

// c += a b (16x8x16, bf16 products, fp32 accumulation). Each output element depends only on
// its own row of a, its column of b and its own c.
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], uint32_t b0,
                                       uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x by the special-function unit (relative error about 2^-22; exact 1 at 0, +0 at -inf).
__device__ __forceinline__ float fa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Two fp32 values rounded to nearest-even bf16, lo in the low half (the lower column).
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Always 0, but opaque: an array indexed with it cannot be promoted to registers and stays in
// local memory (per-thread, cached), the place for state touched once per long stretch.
__device__ __forceinline__ int fa_opaque_zero() {
    int z;
    asm volatile("mov.u32 %0, 0;\n" : "=r"(z));
    return z;
}
