// Token embedding lookup and its backward on the GPU. The backward needs no atomics and no
// scratch: the block of a token that is the FIRST occurrence of its id owns that table row
// and adds the gradients of every occurrence, in token order, into it. Same float additions
// in the same order as kernels/cpu, so the same bits.
#include "kernels/cuda/cuda_ctx.cuh"

#define EMB_THREADS 256

__global__ void embedding_forward_kernel(float *out, const int32_t *ids, const float *table,
                                         int32_t C) {
    int32_t t = blockIdx.x;
    const float *src = table + (size_t)ids[t] * C;
    float *dst = out + (size_t)t * C;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

__global__ void embedding_backward_kernel(float *dtable, const float *dout, const int32_t *ids,
                                          int32_t T, int32_t C) {
    int32_t t = blockIdx.x, id = ids[t];
    int seen = 0;
    for (int32_t u = threadIdx.x; u < t && !seen; u += blockDim.x) seen = ids[u] == id;
    if (__syncthreads_or(seen)) return;   // an earlier token owns this row
    float *row = dtable + (size_t)id * C;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int32_t u = t; u < T; u++)
            if (ids[u] == id) acc += dout[(size_t)u * C + c];
        row[c] = acc;
    }
}

void tr_cuda_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                               const float *table, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    embedding_forward_kernel<<<T, EMB_THREADS, 0, tr_cuda_stream(be)>>>(out, ids, table, C);
    TR_CUDA_LAUNCHED(be, "embedding_forward");
}

void tr_cuda_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                                const int32_t *ids, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    embedding_backward_kernel<<<T, EMB_THREADS, 0, tr_cuda_stream(be)>>>(dtable, dout, ids, T,
                                                                        C);
    TR_CUDA_LAUNCHED(be, "embedding_backward");
}
