// CUDA graphs of the backend's stream (the graph_* ops of kernels/ops.h): the ops queued
// between begin and end are recorded instead of run, and the instantiated graph replays the
// same launches with one call. Generation replays a decode step's graph (engine/generate.c);
// bench_train_gpu measures what launching costs (the backward queued op by op against its
// graph).
#include <stdlib.h>

#include "kernels/cuda/cuda_ctx.cuh"

int tr_cuda_graph_begin(tr_backend *be) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    // Profiling queries events between launches, and the debug mode syncs after each op,
    // which a capture does not allow.
    if (ctx->prof || ctx->sync_each_op || ctx->no_graphs || ctx->failed) return 1;
    if (tr_cuda_side_join(be) != 0) return -1;
    return TR_CUDA_CHECK(be, cudaStreamBeginCapture(ctx->stream,
                                                    cudaStreamCaptureModeThreadLocal)) ? -1 : 0;
}

int tr_cuda_graph_end(tr_backend *be, void **exec) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    *exec = NULL;
    // the prefetches recorded as branches join the graph before it closes (a failed join
    // still ends the capture, so that the stream is left usable)
    tr_cuda_side_join(be);
    if (TR_CUDA_CHECK(be, cudaStreamEndCapture(ctx->stream, &g))) return -1;
    int rc = TR_CUDA_CHECK(be, cudaGraphInstantiate(&x, g, 0)) ? -1 : 0;
    cudaGraphDestroy(g);
    *exec = x;
    return rc;
}

int tr_cuda_graph_launch(tr_backend *be, void *exec) {
    return TR_CUDA_CHECK(be, cudaGraphLaunch((cudaGraphExec_t)exec, tr_cuda_stream(be))) ? -1 : 0;
}

void tr_cuda_graph_free(tr_backend *be, void *exec) {
    (void)be;
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
