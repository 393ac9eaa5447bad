// Buffer ops on the GPU: fill, row gather and scatter by bytes, the KV cache's slot writes
// and all-layer block copy of copy-on-write, a decode step's row advance, and dtype
// conversion. Copies move 16-, 4- or
// 1-byte words, the widest that the pointers and sizes are aligned to; conversions use the
// same bit arithmetic as kernels/cpu, so every result is the CPU's, bit for bit.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/decode_rows.h"

#define MOVE_THREADS 256

__global__ void fill_kernel(float *x, float value, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = value;
}

void tr_cuda_fill(tr_backend *be, float *x, float value, size_t n) {
    if (n == 0) return;
    if (value == 0.0f && !signbit(value)) {   // +0 is all zero bytes: the copy engine's memset
        if (TR_CUDA_CHECK(be, cudaMemsetAsync(x, 0, n * sizeof(float), tr_cuda_stream(be))))
            return;
        TR_CUDA_LAUNCHED(be, "fill (memset)");
        return;
    }
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

// A thread a row (kernels/decode_rows.h): a few hundred rows, a few integers each.
__global__ void decode_rows_kernel(const tr_decode_rows_args a) {
    const int32_t r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < a.n) tr_decode_row(&a, r);
}

void tr_cuda_decode_rows(tr_backend *be, const tr_decode_rows_args *a) {
    if (a->n <= 0) return;
    decode_rows_kernel<<<(unsigned)((a->n + MOVE_THREADS - 1) / MOVE_THREADS), MOVE_THREADS, 0,
                         tr_cuda_stream(be)>>>(*a);
    TR_CUDA_LAUNCHED(be, "decode_rows");
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

// One block per token (grid-stride): row t of k and of v, rows of stride ld elements, into
// slot slot[t] of the pools, whose slots are `width` elements apart (a negative slot: a
// padding row, nothing written). Elements are moved as bits (E is a same-size integer type):
// the KV cache holds the A dtype unchanged.
template <typename E>
__global__ void kv_write_kernel(E *k_pool, E *v_pool, const int32_t *slot, const E *k,
                                const E *v, int32_t ld, int32_t width, int32_t T) {
    for (int32_t t = blockIdx.x; t < T; t += gridDim.x) {
        if (slot[t] < 0) continue;
        size_t to = (size_t)slot[t] * (size_t)width, from = (size_t)t * (size_t)ld;
        for (int32_t i = threadIdx.x; i < width; i += blockDim.x) {
            k_pool[to + i] = k[from + i];
            v_pool[to + i] = v[from + i];
        }
    }
}

void tr_cuda_kv_write(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot,
                      const void *k, const void *v, int32_t ld, int32_t T) {
    int32_t width = kv->n_kv_heads * kv->head_dim;
    if (T <= 0 || width <= 0) return;
    unsigned grid = tr_cuda_grid((size_t)T, 1);
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_dt_size(be->act) == 2)
        kv_write_kernel<uint16_t><<<grid, MOVE_THREADS, 0, st>>>(
            (uint16_t *)kv->k_pool, (uint16_t *)kv->v_pool, slot, (const uint16_t *)k,
            (const uint16_t *)v, ld, width, T);
    else
        kv_write_kernel<uint32_t><<<grid, MOVE_THREADS, 0, st>>>(
            (uint32_t *)kv->k_pool, (uint32_t *)kv->v_pool, slot, (const uint32_t *)k,
            (const uint32_t *)v, ld, width, T);
    TR_CUDA_LAUNCHED(be, "kv_write");
}

// fp16 bits to fp32, exactly: subnormals normalized, inf kept, a NaN's payload shifted into
// the top of fp32's (so its quiet bit stays the quiet bit).
__device__ inline float f32_of_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13));
    if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0) return __uint_as_float(sign);
    // subnormal: m * 2^-24, normalized so that the leading bit becomes the implicit one
    int32_t shift = __clz((int)m) - 21;   // leading zeros within the 10-bit field, plus one
    uint32_t mant = ((m << shift) & 0x3ffu) << 13;
    return __uint_as_float(sign | ((uint32_t)(113 - shift) << 23) | mant);
}

// in_t: 0 fp32, 1 bf16, 2 fp16 (tr_dt); out: fp32, or bf16 bits by convert's rule.
template <typename O>
__global__ void convert_kernel(O *out, const void *in, int32_t in_t, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float f;
        if (in_t == TR_F32) f = ((const float *)in)[i];
        else if (in_t == TR_BF16) f = __uint_as_float((uint32_t)((const uint16_t *)in)[i] << 16);
        else f = f32_of_f16(((const uint16_t *)in)[i]);
        if constexpr (sizeof(O) == 4) out[i] = f;
        else out[i] = tr_bf16_bits(f);
    }
}

void tr_cuda_convert(tr_backend *be, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                     size_t n) {
    if (n == 0) return;
    if ((out_t != TR_F32 && out_t != TR_BF16) ||
        (in_t != TR_F32 && in_t != TR_BF16 && in_t != TR_F16)) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "convert",
                       "out_t must be fp32 or bf16 and in_t fp32, bf16 or fp16");
        return;
    }
    cudaStream_t st = tr_cuda_stream(be);
    if (out_t == in_t) {
        if (TR_CUDA_CHECK(be, cudaMemcpyAsync(out, in, n * tr_dt_size(in_t),
                                              cudaMemcpyDeviceToDevice, st)))
            return;
        TR_CUDA_LAUNCHED(be, "convert (copy)");
        return;
    }
    unsigned grid = tr_cuda_grid(n, MOVE_THREADS);
    if (out_t == TR_F32)
        convert_kernel<float><<<grid, MOVE_THREADS, 0, st>>>((float *)out, in, in_t, n);
    else
        convert_kernel<uint16_t><<<grid, MOVE_THREADS, 0, st>>>((uint16_t *)out, in, in_t, n);
    TR_CUDA_LAUNCHED(be, "convert");
}
