// The prefetch op: weights brought into L2 ahead of the products that read them, on a stream
// beside the backend's, so that a decode step's memory-bound products at a few rows read L2
// rather than wait on HBM. A product at 64 rows streams its weights at about a third of the
// memory's bandwidth (bench/RESULTS.md: gate/up 17.4 MB in 18 us on an H100), bound by the
// latency of its few blocks' loads rather than by the bytes; the steps between the products
// (norms, RoPE, attention at short contexts, SwiGLU) leave HBM mostly idle. A prefetch moves
// no result: it is a hint to the memory system (cp.async.bulk.prefetch.L2), and the products
// read the same bytes either way.
//
// The fork and join: the side stream waits for the main stream's point of the call (so a
// recording takes the prefetch in as a branch of the graph), runs one small kernel that
// issues the bulk prefetches and exits without waiting for them, and the main stream waits for
// that kernel only at the next prefetch, a recording's begin or end, or a sync: never in the
// middle of a step's chain of kernels.
#include "kernels/cuda/cuda_ctx.cuh"

#define PF_CHUNK (32u << 10)   // bytes a bulk prefetch (16-byte multiples)
#define PF_THREADS 128

// last: the lines are marked to be evicted after others (TROUPE_CUDA_PREFETCH=2), so that the
// KV cache's and the activations' traffic in between does not push them out first.
__global__ void prefetch_l2_kernel(const char *p, size_t bytes, bool last) {
    const size_t n = (bytes + PF_CHUNK - 1) / PF_CHUNK;
#if __CUDA_ARCH__ >= 900
    uint64_t policy = 0;
    if (last) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
#endif
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t off = i * PF_CHUNK;
        const uint32_t len = (uint32_t)(bytes - off < PF_CHUNK ? bytes - off : PF_CHUNK);
#if __CUDA_ARCH__ >= 900
        if (last)
            asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(
                             p + off),
                         "r"(len), "l"(policy)
                         : "memory");
        else
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(len)
                         : "memory");
#else
        for (uint32_t b = 0; b < len; b += 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off + b) : "memory");
#endif
    }
}

int tr_cuda_side_join(tr_backend *be) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->side_pending) return 0;
    ctx->side_pending = 0;
    return TR_CUDA_CHECK(be, cudaStreamWaitEvent(ctx->stream, ctx->side_done, 0)) ? -1 : 0;
}

void tr_cuda_prefetch(tr_backend *be, const void *p, size_t bytes) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    // The profile's events and the debug mode's syncs time and check the stream's ops one by
    // one; a branch beside them would only blur that.
    if (!ctx->prefetch || !ctx->side || ctx->prof || ctx->sync_each_op || ctx->failed || !p)
        return;
    // whole 16-byte pieces from a 16-byte boundary (a weight's arena offset is aligned; a
    // stray edge is left to the product)
    const uintptr_t a = ((uintptr_t)p + 15u) & ~(uintptr_t)15u;
    if (bytes <= a - (uintptr_t)p) return;
    bytes = (bytes - (a - (uintptr_t)p)) & ~(size_t)15u;
    if (!bytes) return;
    if (tr_cuda_side_join(be) != 0 ||
        TR_CUDA_CHECK(be, cudaEventRecord(ctx->side_fork, ctx->stream)) ||
        TR_CUDA_CHECK(be, cudaStreamWaitEvent(ctx->side, ctx->side_fork, 0)))
        return;
    const size_t chunks = (bytes + PF_CHUNK - 1) / PF_CHUNK;
    size_t blocks = (chunks + PF_THREADS - 1) / PF_THREADS;
    if (blocks > 16) blocks = 16;
    prefetch_l2_kernel<<<(unsigned)blocks, PF_THREADS, 0, ctx->side>>>((const char *)a, bytes,
                                                                       ctx->prefetch == 2);
    if (TR_CUDA_CHECK(be, cudaGetLastError()) ||
        TR_CUDA_CHECK(be, cudaEventRecord(ctx->side_done, ctx->side)))
        return;
    ctx->side_pending = 1;
}
