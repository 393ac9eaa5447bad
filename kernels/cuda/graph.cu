// CUDA graphs of the backend's stream: the ops queued between begin and end are recorded
// instead of run, and the instantiated graph replays the same launches with one call. Used to
// measure what launching costs (bench_train_gpu: the backward queued op by op against its
// graph), so the engine need not hold graphs to know whether it would gain from them.
#include <stdlib.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_ctx.cuh"

extern "C" int tr_backend_cuda_graph_begin(tr_backend *be) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    // Profiling queries events between launches, which a capture does not allow.
    if (ctx->prof || ctx->sync_each_op) {
        tr_cuda_record(ctx, __FILE__, __LINE__, "graph capture",
                       "not with TROUPE_CUDA_PROFILE or TROUPE_SYNC_EACH_OP");
        return -1;
    }
    return TR_CUDA_CHECK(be, cudaStreamBeginCapture(ctx->stream,
                                                    cudaStreamCaptureModeThreadLocal)) ? -1 : 0;
}

extern "C" int tr_backend_cuda_graph_end(tr_backend *be, void **exec) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    *exec = NULL;
    if (TR_CUDA_CHECK(be, cudaStreamEndCapture(ctx->stream, &g))) return -1;
    int rc = TR_CUDA_CHECK(be, cudaGraphInstantiate(&x, g, 0)) ? -1 : 0;
    cudaGraphDestroy(g);
    *exec = x;
    return rc;
}

extern "C" int tr_backend_cuda_graph_launch(tr_backend *be, void *exec) {
    return TR_CUDA_CHECK(be, cudaGraphLaunch((cudaGraphExec_t)exec, tr_cuda_stream(be))) ? -1
                                                                                         : 0;
}

extern "C" void tr_backend_cuda_graph_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
