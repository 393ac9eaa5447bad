// The CUDA backend: its tr_ops table, the context behind it (stream, cuBLAS handle, sumsq
// scratch) and the first-error record that stands in for return codes, since ops return void.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_ctx.cuh"

static const tr_ops cuda_ops = {
    "cuda",
    tr_cuda_matmul_forward,
    tr_cuda_matmul_backward,
    tr_cuda_embedding_forward,
    tr_cuda_embedding_backward,
    tr_cuda_rmsnorm_forward,
    tr_cuda_rmsnorm_backward,
    tr_cuda_rope_forward,
    tr_cuda_rope_backward,
    tr_cuda_attention_forward,
    tr_cuda_attention_backward,
    tr_cuda_attention_decode,
    tr_cuda_swiglu_forward,
    tr_cuda_swiglu_backward,
    tr_cuda_add,
    tr_cuda_logsoftmax_forward,
    tr_cuda_logsoftmax_backward,
    tr_cuda_sumsq,
    tr_cuda_scale,
    tr_cuda_adamw,
};

int tr_cuda_record(tr_cuda_ctx *ctx, const char *file, int line, const char *what,
                   const char *detail) {
    if (!ctx->failed) {
        ctx->failed = 1;
        snprintf(ctx->msg, sizeof ctx->msg, "%s:%d: %s: %s", file, line, what,
                 detail ? detail : "failed");
    }
    return -1;
}

// The context is kept even when init fails, so that status can tell why.
extern "C" int tr_backend_cuda_init(tr_backend *be, int device) {
    be->ops = NULL;
    be->ctx = NULL;
    be->n_threads = 1;
    tr_cuda_ctx *ctx = (tr_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return -1;
    ctx->device = device;
    be->ctx = ctx;
    if (TR_CUDA_CHECK(be, cudaSetDevice(device))) return -1;
    if (TR_CUDA_CHECK(be, cudaStreamCreate(&ctx->stream))) return -1;
    if (TR_CUBLAS_CHECK(be, cublasCreate(&ctx->blas))) return -1;
    if (TR_CUBLAS_CHECK(be, cublasSetStream(ctx->blas, ctx->stream))) return -1;
    // Pedantic math: true fp32 products, never TF32, even under NVIDIA_TF32_OVERRIDE.
    if (TR_CUBLAS_CHECK(be, cublasSetMathMode(ctx->blas, CUBLAS_PEDANTIC_MATH))) return -1;
    if (TR_CUDA_CHECK(be, cudaMalloc((void **)&ctx->partial,
                                     TR_CUDA_SUMSQ_BLOCKS * sizeof(double))))
        return -1;
    if (TR_CUDA_CHECK(be, cudaMallocHost((void **)&ctx->partial_host,
                                         TR_CUDA_SUMSQ_BLOCKS * sizeof(double))))
        return -1;
    be->ops = &cuda_ops;
    return 0;
}

extern "C" void tr_backend_cuda_free(tr_backend *be) {
    if (!be || !be->ctx) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    // Teardown errors have nobody left to report to; each release is still attempted.
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->partial_host) cudaFreeHost(ctx->partial_host);
    if (ctx->partial) cudaFree(ctx->partial);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
    be->ctx = NULL;
    be->ops = NULL;
}

extern "C" int tr_backend_cuda_status(tr_backend *be, char *msg, size_t cap) {
    if (!be || !be->ctx) {
        if (cap) snprintf(msg, cap, "CUDA backend not initialized (out of memory)");
        return -1;
    }
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->failed && ctx->stream) TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream));
    if (!ctx->failed) return 0;
    if (cap) snprintf(msg, cap, "%s", ctx->msg);
    return -1;
}
