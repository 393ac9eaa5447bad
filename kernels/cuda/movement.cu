// Buffer ops on the GPU: fill, row gather and scatter by bytes, the all-layer KV block copy
// of copy-on-write, and the fp32 <-> bf16 casts. Copies move 16-, 4- or 1-byte words, the
// widest that the pointers and sizes are aligned to; the casts use the same bit arithmetic
// as kernels/cpu, so every result is the CPU's, bit for bit.
#include "kernels/cuda/cuda_ctx.cuh"

#define MOVE_THREADS 256

__global__ void fill_kernel(float *x, float value, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

void tr_cuda_fill(tr_backend *be, float *x, float value, size_t n) {
    if (n == 0) return;
    fill_kernel<<<tr_cuda_grid(n, MOVE_THREADS), MOVE_THREADS, 0, tr_cuda_stream(be)>>>(x, value,
                                                                                      n);
    TR_CUDA_LAUNCHED(be, "fill");
}

// Word size for copies of `bytes` between dst and src (and every offset a multiple of
// `stride`): 16 or 4 when all of them are aligned to it, else 1.
static int word_bytes(const void *dst, const void *src, size_t bytes, size_t stride) {
    uintptr_t a = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes | (uintptr_t)stride;
    return a % 16 == 0 ? 16 : a % 4 == 0 ? 4 : 1;
}

// One block per row (grid-stride over rows), threads over the row's words.
template <typename W>
__global__ void rows_kernel(W *dst, const W *src, const int32_t *idx, int32_t n,
                            size_t row_words, int scatter) {
    for (int32_t r = blockIdx.x; r < n; r += gridDim.x) {
        size_t d = scatter ? (size_t)idx[r] : (size_t)r;
        size_t s = scatter ? (size_t)r : (size_t)idx[r];
        W *to = dst + d * row_words;
        const W *from = src + s * row_words;
        for (size_t w = threadIdx.x; w < row_words; w += blockDim.x) to[w] = from[w];
    }
}

template <typename W>
static void rows_launch(tr_backend *be, void *dst, const void *src, const int32_t *idx,
                        int32_t n, size_t row_bytes, int scatter) {
    rows_kernel<W><<<tr_cuda_grid((size_t)n, 1), MOVE_THREADS, 0, tr_cuda_stream(be)>>>(
        (W *)dst, (const W *)src, idx, n, row_bytes / sizeof(W), scatter);
}

static void rows_run(tr_backend *be, void *dst, const void *src, const int32_t *idx, int32_t n,
                     size_t row_bytes, int scatter) {
    if (n <= 0 || row_bytes == 0) return;
    switch (word_bytes(dst, src, row_bytes, row_bytes)) {
    case 16: rows_launch<uint4>(be, dst, src, idx, n, row_bytes, scatter); break;
    case 4: rows_launch<uint32_t>(be, dst, src, idx, n, row_bytes, scatter); break;
    default: rows_launch<uint8_t>(be, dst, src, idx, n, row_bytes, scatter); break;
    }
    if (scatter) TR_CUDA_LAUNCHED(be, "scatter_rows");
    else TR_CUDA_LAUNCHED(be, "gather_rows");
}

void tr_cuda_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                         int32_t n, size_t row_bytes) {
    rows_run(be, out, src, idx, n, row_bytes, 0);
}

void tr_cuda_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                          int32_t n, size_t row_bytes) {
    rows_run(be, dst, rows, idx, n, row_bytes, 1);
}

// One block per (pair, layer, K or V) copy, grid-stride over all of them; threads over the
// copied slots' words. Word counts are in W units: block and slot sizes divide by sizeof(W).
template <typename W>
__global__ void kv_copy_kernel(W *k, W *v, size_t layer_words, int32_t n_layers,
                               size_t block_words, size_t slot_words, const int32_t *src,
                               const int32_t *dst, const int32_t *n_slots, int32_t n) {
    size_t n_copies = (size_t)n * n_layers * 2;
    for (size_t c = blockIdx.x; c < n_copies; c += gridDim.x) {
        size_t i = c / ((size_t)n_layers * 2), l = c / 2 % n_layers;
        W *pool = (c % 2 ? v : k) + l * layer_words;
        const W *from = pool + (size_t)src[i] * block_words;
        W *to = pool + (size_t)dst[i] * block_words;
        size_t words = (size_t)n_slots[i] * slot_words;
        for (size_t w = threadIdx.x; w < words; w += blockDim.x) to[w] = from[w];
    }
}

template <typename W>
static void kv_copy_launch(tr_backend *be, const tr_kv_pool *p, const int32_t *src,
                           const int32_t *dst, const int32_t *n_slots, int32_t n) {
    size_t n_copies = (size_t)n * p->n_layers * 2;
    kv_copy_kernel<W><<<tr_cuda_grid(n_copies, 1), MOVE_THREADS, 0, tr_cuda_stream(be)>>>(
        (W *)p->k, (W *)p->v, p->layer_bytes / sizeof(W), p->n_layers,
        (size_t)p->block_size * p->slot_bytes / sizeof(W), p->slot_bytes / sizeof(W), src, dst,
        n_slots, n);
}

void tr_cuda_kv_copy_blocks(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                            const int32_t *dst, const int32_t *n_slots, int32_t n) {
    if (n <= 0 || pool->n_layers <= 0 || pool->slot_bytes == 0) return;
    int wk = word_bytes(pool->k, pool->v, pool->slot_bytes, pool->layer_bytes);
    switch (wk) {
    case 16: kv_copy_launch<uint4>(be, pool, src, dst, n_slots, n); break;
    case 4: kv_copy_launch<uint32_t>(be, pool, src, dst, n_slots, n); break;
    default: kv_copy_launch<uint8_t>(be, pool, src, dst, n_slots, n); break;
    }
    TR_CUDA_LAUNCHED(be, "kv_copy_blocks");
}

// Round to nearest even by adding 0x7fff plus the lowest kept bit; NaNs are truncated (and
// made quiet only when no payload bit is left), as kernels/cpu/movement.c does.
__device__ inline uint16_t bf16_of(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void to_bf16_kernel(uint16_t *out, const float *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bf16_of(in[i]);
}

__global__ void to_f32_kernel(float *out, const uint16_t *in, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

void tr_cuda_cast_f32_bf16(tr_backend *be, uint16_t *out, const float *in, size_t n) {
    if (n == 0) return;
    to_bf16_kernel<<<tr_cuda_grid(n, MOVE_THREADS), MOVE_THREADS, 0, tr_cuda_stream(be)>>>(
        out, in, n);
    TR_CUDA_LAUNCHED(be, "cast_f32_bf16");
}

void tr_cuda_cast_bf16_f32(tr_backend *be, float *out, const uint16_t *in, size_t n) {
    if (n == 0) return;
    to_f32_kernel<<<tr_cuda_grid(n, MOVE_THREADS), MOVE_THREADS, 0, tr_cuda_stream(be)>>>(
        out, in, n);
    TR_CUDA_LAUNCHED(be, "cast_bf16_f32");
}
