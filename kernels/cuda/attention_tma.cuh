// Hopper's tensor memory accelerator (TMA) and shared-memory barriers for the flash kernels
// (.cu files only, sm_90a): a 2-D tensor map over rows of bf16 (made on the host through the
// driver's entry point, so nothing links libcuda), one thread's bulk copy of a box of it into
// shared memory, and the mbarrier operations a pipeline of such copies waits on.
//
// Why: with cp.async every thread of a block copies its share of each key tile (address
// arithmetic, a wait and a block barrier every tile: a quarter of the wgmma forward's
// instructions, Nsight Compute on an H200). A tensor copy is one instruction of one thread,
// its completion counted in bytes on an mbarrier that the readers wait on, and the readers
// give a stage back by arriving on another: no block barrier in the loop.
//
// A box of 64 bf16 columns (128 bytes) lands with CU_TENSOR_MAP_SWIZZLE_128B in the layout the
// wgmma descriptors read (fa_sm_off<D, true>: 16-byte piece j of row r at j ^ (r mod 8), the
// destination 1024-byte aligned), so a tile of D = 128 is two boxes, one a block of 64
// channels. Rows past the tensor's end arrive as zeros.
#pragma once
#include <cuda.h>
#include <stdint.h>

#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cuda_ctx.cuh"

// ---- device: mbarriers and the bulk tensor copy ----

__device__ __forceinline__ void tma_bar_init(uint32_t bar, uint32_t count) {
    WG_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Initialized barriers are visible to the async proxy (the copies that complete on them);
// every thread then meets at a block barrier before any uses them.
__device__ __forceinline__ void tma_bar_init_fence() {
    WG_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// This thread's arrival, announcing `bytes` more that copies will complete on the barrier.
__device__ __forceinline__ void tma_bar_expect(uint32_t bar, uint32_t bytes) {
    WG_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
           : "memory");
}
__device__ __forceinline__ void tma_bar_arrive(uint32_t bar) {
    WG_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of parity `phase` has completed.
__device__ __forceinline__ void tma_bar_wait(uint32_t bar, uint32_t phase) {
    uint32_t done = 0;
    while (!done)
        WG_ASM("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(phase)
               : "memory");
}
// The box of map at (column c0, row r0) into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int32_t c0,
                                            int32_t r0, uint32_t bar) {
    WG_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
           " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
           "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0), "r"(bar)
           : "memory");
}

// ---- host: the tensor map ----

// A map over `rows` rows of `cols` bf16 values at base, rows `ld` elements apart, read in boxes
// of 64 columns by box_rows rows with the 128-byte swizzle. Returns 0, or -1 with the failure
// recorded in the backend (no driver entry point, or an argument the driver refuses: base and
// the row pitch must be 16-byte multiples).
int tr_tma_map_bf16(tr_backend *be, CUtensorMap *map, const void *base, int64_t cols,
                    int64_t rows, int64_t ld, int32_t box_rows);
