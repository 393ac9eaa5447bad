// The CPU backend: its tr_ops table and the context behind it (a thread pool and the matrix
// product's micro-kernel, chosen once from what the processor has). TROUPE_CPU_GUARD=1 in
// the environment selects guarded memory (guard.c) for every CPU backend of the process.
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

static const tr_ops cpu_ops = {
    .name = "cpu",
    .alloc = tr_cpu_alloc,
    .free = tr_cpu_free,
    .alloc_host = tr_cpu_alloc_host,
    .free_host = tr_cpu_free_host,
    .upload = tr_cpu_upload,
    .download = tr_cpu_upload,
    .copy = tr_cpu_upload,
    .sync = tr_cpu_sync,
    .mem_info = tr_cpu_mem_info,
    .matmul_forward = tr_cpu_matmul_forward,
    .matmul_backward = tr_cpu_matmul_backward,
    .embedding_forward = tr_cpu_embedding_forward,
    .embedding_backward = tr_cpu_embedding_backward,
    .embedding_scratch_bytes = tr_cpu_embedding_scratch_bytes,
    .rmsnorm_forward = tr_cpu_rmsnorm_forward,
    .rmsnorm_backward = tr_cpu_rmsnorm_backward,
    .rope_forward = tr_cpu_rope_forward,
    .rope_backward = tr_cpu_rope_backward,
    .attention_forward = tr_cpu_attention_forward,
    .attention_backward = tr_cpu_attention_backward,
    .attention_decode = tr_cpu_attention_decode,
    .swiglu_forward = tr_cpu_swiglu_forward,
    .swiglu_backward = tr_cpu_swiglu_backward,
    .add = tr_cpu_add,
    .logsoftmax_forward = tr_cpu_logsoftmax_forward,
    .logsoftmax_backward = tr_cpu_logsoftmax_backward,
    .sumsq = tr_cpu_sumsq,
    .scale = tr_cpu_scale,
    .adamw = tr_cpu_adamw,
    .fill = tr_cpu_fill,
    .gather_rows = tr_cpu_gather_rows,
    .scatter_rows = tr_cpu_scatter_rows,
    .kv_copy_blocks = tr_cpu_kv_copy_blocks,
    .cast_f32_bf16 = tr_cpu_cast_f32_bf16,
    .cast_bf16_f32 = tr_cpu_cast_bf16_f32,
    .sample = tr_cpu_sample,
    .sample_scratch_bytes = tr_cpu_sample_scratch_bytes,
};

// Memory: no op allocates and the context holds no scratch. Kernels work in their outputs
// (attention keeps its running output row in out) or in fixed-size stack buffers whose size
// does not grow with the arguments: at most a gemm block's packed panels of B (32 KiB) and A
// (192 KiB) inside an attention backward task with its two 64 x 64 float tiles (32 KiB),
// well inside a thread's default stack (8 MiB). So nothing needs sizing before a step.
// One thread at a time may call the ops of one backend.
int tr_backend_cpu_init(tr_backend *be, int32_t n_threads) {
    be->ops = NULL;
    be->ctx = NULL;
    be->n_threads = 0;
    if (n_threads < 0) return -1;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int32_t)n : 1;
    }
    tr_cpu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return -1;
    if (tr_pool_init(&ctx->pool, n_threads) != 0) {
        free(ctx);
        return -1;
    }
    ctx->isa = tr_gemm_isa_detect();
    const char *guard = getenv("TROUPE_CPU_GUARD");
    ctx->guard = guard && strcmp(guard, "1") == 0;
    be->ops = ctx->guard ? &tr_cpu_guarded_ops : &cpu_ops;
    be->ctx = ctx;
    be->n_threads = n_threads;
    return 0;
}

void tr_backend_cpu_free(tr_backend *be) {
    if (!be || !be->ctx) return;
    tr_cpu_ctx *ctx = be->ctx;
    tr_pool_free(ctx->pool);
    tr_cpu_memory_free(ctx);
    free(ctx);
    be->ctx = NULL;
    be->ops = NULL;
}
