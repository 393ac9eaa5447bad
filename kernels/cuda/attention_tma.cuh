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

#include "kernels/cuda/attention_tile.cuh"
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

// ---- a walk's K/V tiles through ST stages ----

// The key tiles of a query tile's walk (fa_kv_iter, layouts without shared prefixes) in ST
// shared stages of a K and a V tile each (swizzled, 1024-byte aligned), for the wgmma
// forward and dQ pass: thread 0 copies tile j into stage j % ST, completing on that stage's
// `full` barrier; every warp waits on `full` for every tile, even one it skips, and then
// arrives on `empty`, so that its arrival always belongs to that tile's phase; thread 0 gives
// the stage of tile j - LAG its next tile (j - LAG + ST) once all have arrived: LAG is 2, or 1
// with two stages (a double buffer, refilled as soon as every warp is past the tile before;
// only for kernels that give a tile back within its own iteration). A tile's rows past
// its document are the next document's keys, or zeros past the tensor's end, which the
// kernels mask by position as they do a zero-filled tile's.
// What thread 0 copies from: the maps of K and V, the kv head (its columns in them) and the
// walk's layout (tr_doc_layout's doc_start and prefix, NULL here; rows up to t1). Built where
// thread 0 copies, from the kernel's parameters, so that no other thread holds it.
struct fa_tma_src {
    const CUtensorMap *tk, *tv;
    int kvh;
    const int32_t *ds, *pre;
    int n_docs, t1;
};

template <int D, int BN, int ST>
struct fa_tma_kv {
    static constexpr uint32_t TILE = BN * D * sizeof(tr_bf16);   // bytes of a K (or V) tile
    // shared, 1024-byte aligned: ST K tiles, ST V tiles, then ST `full` and ST `empty` barriers
    uint32_t base;
    static constexpr uint32_t V0 = ST * TILE, FULL = 2 * ST * TILE, EMPTY = FULL + ST * 8;
    static constexpr int LAG = ST > 2 ? 2 : 1;
    static_assert(ST >= 2, "a walk's tiles need two stages at least");

    // Thread 0's place in the walk: the next tile to copy, and its index. In shared memory, so
    // that no other thread gives it registers.
    struct walk_t {
        fa_kv_iter ahead;
        int issued;
    };
    __device__ __forceinline__ walk_t &walk() const {
        __shared__ walk_t w;
        return w;
    }

    __device__ __forceinline__ uint32_t k_at(int j) const {
        return base + (uint32_t)(j % ST) * TILE;
    }
    __device__ __forceinline__ uint32_t v_at(int j) const { return k_at(j) + V0; }
    __device__ __forceinline__ uint32_t full(int j) const {
        return base + FULL + (uint32_t)(j % ST) * 8;
    }
    __device__ __forceinline__ uint32_t empty(int j) const {
        return base + EMPTY + (uint32_t)(j % ST) * 8;
    }
    // Thread 0, before the block's first barrier: the barriers for `warps` readers.
    __device__ __forceinline__ void init(int warps) const {
#pragma unroll
        for (int s = 0; s < ST; s++) {
            tma_bar_init(full(s), 1);
            tma_bar_init(empty(s), (uint32_t)warps);
        }
        tma_bar_init_fence();
    }
    // Thread 0: the walk's next tile into its stage.
    __device__ __forceinline__ void copy(const fa_tma_src &src) const {
        walk_t &w = walk();
        const uint32_t bar = full(w.issued), k = k_at(w.issued);
        tma_bar_expect(bar, 2 * TILE);
        const int key0 = w.ahead.s + w.ahead.p0;
#pragma unroll
        for (int cb = 0; cb < D / 64; cb++) {
            const uint32_t at = k + (uint32_t)cb * BN * 128;
            tma_load_2d(at, src.tk, src.kvh * D + 64 * cb, key0, bar);
            tma_load_2d(at + V0, src.tv, src.kvh * D + 64 * cb, key0, bar);
        }
        fa_iter_next<BN>(w.ahead, src.ds, src.pre, src.n_docs, src.t1);
        w.issued++;
    }
    // Thread 0, after the barriers' initialization has been met: the walk's first ST tiles.
    __device__ __forceinline__ void start(const fa_tma_src &src, const fa_kv_iter &first) const {
        walk_t &w = walk();
        w.ahead = first;
        w.issued = 0;
        while (w.issued < ST && w.ahead.e >= 0) copy(src);
    }
    // Thread 0 at tile j of its own walk: the next tile into the stage of tile j - LAG.
    __device__ __forceinline__ void refill(const fa_tma_src &src, int j) const {
        if (j < LAG || walk().ahead.e < 0) return;
        tma_bar_wait(empty(j - LAG), (uint32_t)((j - LAG) / ST) & 1u);
        copy(src);
    }
    // Every thread: tile j has landed.
    __device__ __forceinline__ void wait(int j) const {
        tma_bar_wait(full(j), (uint32_t)(j / ST) & 1u);
    }
    // Every warp, once its products have read tile j: the stage is given back.
    __device__ __forceinline__ void release(int j) const {
        __syncwarp();
        if ((threadIdx.x & 31) == 0) tma_bar_arrive(empty(j));
    }
};

// ---- host: the tensor map ----

// A map over `rows` rows of `cols` bf16 values at base, rows `ld` elements apart, read in boxes
// of 64 columns by box_rows rows with the 128-byte swizzle. Returns 0, or -1 with the failure
// recorded in the backend (no driver entry point, or an argument the driver refuses: base and
// the row pitch must be 16-byte multiples).
int tr_tma_map_bf16(tr_backend *be, CUtensorMap *map, const void *base, int64_t cols,
                    int64_t rows, int64_t ld, int32_t box_rows);
