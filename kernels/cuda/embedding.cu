// Token embedding lookup and its backward on the GPU. The backward needs no atomics: token
// indices are sorted by id with a stable radix sort (so each id's tokens stay in token
// order), then the block of each id's first sorted position owns that table row and adds its
// tokens' gradients into it in that order. Same float additions in the same order as
// kernels/cpu, so the same bits; a radix sort plus O(T C) additions instead of a scan of all
// earlier tokens per token. A negative id (signed keys sort it first) reads zeros and takes
// no gradient.
#include "kernels/cuda/cub_sort.cuh"

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define EMB_THREADS 256

// The table is W (bf16 or fp32), the rows fp32: the widening is exact.
template <typename W>
__global__ void embedding_forward_kernel(float *out, const int32_t *ids, const W *table,
                                         int32_t C) {
    int32_t t = blockIdx.x, id = ids[t];
    float *dst = out + (size_t)t * C;
    if (id < 0) {   // a row another tensor-parallel rank holds
        for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = 0.0f;
        return;
    }
    const W *src = table + (size_t)id * C;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = tr_f32(src[c]);
}

// Scratch: sorted ids, token indices before and after the sort, then CUB's temporary storage.
static size_t emb_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

typedef struct emb_scratch {
    int32_t *keys_out, *toks_in, *toks_out;
    void *temp;
    size_t temp_bytes;
    size_t total;
} emb_scratch;

// The layout for T tokens; with base NULL only the sizes. Returns -1 when CUB cannot say how
// much temporary storage it needs (the failure is recorded).
static int emb_layout(tr_backend *be, int32_t T, void *base, emb_scratch *s) {
    size_t arr = emb_align((size_t)T * sizeof(int32_t));
    s->temp_bytes = 0;
    if (TR_CUDA_CHECK(be, cub::DeviceRadixSort::SortPairs(
                              NULL, s->temp_bytes, (const int32_t *)NULL, (int32_t *)NULL,
                              (const int32_t *)NULL, (int32_t *)NULL, (int)T, 0, 32,
                              tr_cuda_stream(be))))
        return -1;
    char *p = (char *)base;
    s->keys_out = (int32_t *)p;
    s->toks_in = (int32_t *)(p ? p + arr : NULL);
    s->toks_out = (int32_t *)(p ? p + 2 * arr : NULL);
    s->temp = p ? p + 3 * arr : NULL;
    s->total = 3 * arr + emb_align(s->temp_bytes);
    return 0;
}

size_t tr_cuda_embedding_scratch_bytes(tr_backend *be, int32_t T) {
    emb_scratch s;
    if (T <= 0 || emb_layout(be, T, NULL, &s) != 0) return 0;
    return s.total;
}

__global__ void emb_iota_kernel(int32_t *toks, int32_t T) {
    for (int32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < T; t += gridDim.x * blockDim.x)
        toks[t] = t;
}

// Block (r, y) handles sorted position r and the y-th blockDim.x columns, when r is the first
// position of its id; it adds the id's tokens toks[r], toks[r+1], ... (token order) to the row.
__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int32_t *keys,
                                          const int32_t *toks, int32_t T, int32_t C) {
    for (int32_t r = blockIdx.x; r < T; r += gridDim.x) {
        int32_t id = keys[r];
        // Negative ids (other tensor-parallel ranks' rows) take no gradient.
        if (id < 0 || (r > 0 && keys[r - 1] == id)) continue;   // uniform over the block
        float *row = dtable + (size_t)id * C;
        for (int32_t c = blockIdx.y * blockDim.x + threadIdx.x; c < C;
             c += gridDim.y * blockDim.x) {
            float acc = row[c];
            for (int32_t u = r; u < T && keys[u] == id; u++)
                acc += dout[(size_t)toks[u] * C + c];
            row[c] = acc;
        }
    }
}

void tr_cuda_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                               const void *table, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_cuda_bf16(be))
        embedding_forward_kernel<tr_bf16><<<T, EMB_THREADS, 0, st>>>(out, ids,
                                                                     (const tr_bf16 *)table, C);
    else
        embedding_forward_kernel<float><<<T, EMB_THREADS, 0, st>>>(out, ids,
                                                                   (const float *)table, C);
    TR_CUDA_LAUNCHED(be, "embedding_forward");
}

void tr_cuda_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                                const int32_t *ids, int32_t T, int32_t C, void *scratch) {
    if (T <= 0 || C <= 0) return;
    if (!scratch) {   // CUB would only size its storage and sort nothing
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "embedding_backward",
                       "no scratch (embedding_scratch_bytes is not 0 on cuda)");
        return;
    }
    cudaStream_t st = tr_cuda_stream(be);
    emb_scratch s;
    if (emb_layout(be, T, scratch, &s) != 0) return;
    emb_iota_kernel<<<tr_cuda_grid((size_t)T, EMB_THREADS), EMB_THREADS, 0, st>>>(s.toks_in, T);
    if (TR_CUDA_LAUNCHED(be, "embedding_backward iota")) return;
    // Radix sort is stable: equal ids keep their token order.
    if (TR_CUDA_CHECK(be, cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, ids, s.keys_out,
                                                          s.toks_in, s.toks_out, (int)T, 0, 32,
                                                          st)))
        return;
    unsigned col_blocks = (unsigned)((C + EMB_THREADS - 1) / EMB_THREADS);
    dim3 grid(tr_cuda_grid((size_t)T, 1), col_blocks < 65535u ? col_blocks : 65535u);
    embedding_backward_kernel<<<grid, EMB_THREADS, 0, st>>>(dtable, dout, s.keys_out, s.toks_out,
                                                            T, C);
    TR_CUDA_LAUNCHED(be, "embedding_backward");
}
