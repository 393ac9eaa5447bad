// The CPU backend: its tr_ops table and the context behind it (a thread pool and the matrix
// product's micro-kernel, chosen once from what the processor has). TROUPE_CPU_GUARD=1 in
// the environment selects guarded memory (guard.c) for every CPU backend of the process.
// Precision bf16 stores activations and working weights as bf16 and computes in fp32, the
// rounding points of the CUDA backend's mixed precision, so CI can run that path on a CPU.
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
    .copy_2d = tr_cpu_copy_2d,
    .sync = tr_cpu_sync,
    .mem_info = tr_cpu_mem_info,
    .matmul_forward = tr_cpu_matmul_forward,
    .matmul_forward_add = tr_cpu_matmul_forward_add,
    .matmul_backward = tr_cpu_matmul_backward,
    .embedding_forward = tr_cpu_embedding_forward,
    .embedding_backward = tr_cpu_embedding_backward,
    .embedding_scratch_bytes = tr_cpu_embedding_scratch_bytes,
    .rmsnorm_forward = tr_cpu_rmsnorm_forward,
    .rmsnorm_backward = tr_cpu_rmsnorm_backward,
    .head_rmsnorm_forward = tr_cpu_head_rmsnorm_forward,
    .head_rmsnorm_backward = tr_cpu_head_rmsnorm_backward,
    .rope_forward = tr_cpu_rope_forward,
    .rope_backward = tr_cpu_rope_backward,
    .attention_forward = tr_cpu_attention_forward,
    .attention_backward = tr_cpu_attention_backward,
    .attention_decode = tr_cpu_attention_decode,
    .kv_write = tr_cpu_kv_write,
    .rope_kv_write = tr_cpu_rope_kv_write,
    .attention_decode_rope = tr_cpu_attention_decode_rope,
    .swiglu_forward = tr_cpu_swiglu_forward,
    .swiglu_backward = tr_cpu_swiglu_backward,
    .add = tr_cpu_add,
    .logsoftmax_forward = tr_cpu_logsoftmax_forward,
    .logsoftmax_backward = tr_cpu_logsoftmax_backward,
    .logsoftmax_vp_stats = tr_cpu_logsoftmax_vp_stats,
    .logsoftmax_vp_combine = tr_cpu_logsoftmax_vp_combine,
    .logsoftmax_vp_backward = tr_cpu_logsoftmax_vp_backward,
    .sumsq = tr_cpu_sumsq,
    .adamw = tr_cpu_adamw,
    .fill = tr_cpu_fill,
    .gather_rows = tr_cpu_gather_rows,
    .scatter_rows = tr_cpu_scatter_rows,
    .kv_copy_blocks = tr_cpu_kv_copy_blocks,
    .decode_rows = tr_cpu_decode_rows,
    .convert = tr_cpu_convert,
    .sample = tr_cpu_sample,
    .sample_scratch_bytes = tr_cpu_sample_scratch_bytes,
    .sample_vp_top = tr_cpu_sample_vp_top,
    .sample_vp_scan = tr_cpu_sample_vp_scan,
    .sample_vp_pick = tr_cpu_sample_vp_pick,
    .sample_vp_scratch_bytes = tr_cpu_sample_vp_scratch_bytes,
};

// Memory: no op allocates and the context holds no scratch. Kernels work in their outputs
// or in fixed-size stack buffers whose size does not grow with the arguments: at most a gemm
// block's packed panels of B (32 KiB) and A (192 KiB) and its fp32 tile for a bf16 or added
// result (96 KiB), inside an attention backward task with its 64 x 64 float tiles (32 KiB)
// and fp32 gradient tiles of 64 rows x 256 channels (128 KiB): about 0.5 MiB, well inside a
// thread's default stack (8 MiB). So nothing needs sizing before a step.
// One thread at a time may call the ops of one backend.
int tr_backend_cpu_init(tr_backend *be, int32_t n_threads, tr_dt precision) {
    be->ops = NULL;
    be->ctx = NULL;
    be->n_threads = 0;
    be->act = be->wt = TR_F32;
    memset(&be->fault, 0, sizeof be->fault);
    if (n_threads < 0 || (precision != TR_F32 && precision != TR_BF16)) return -1;
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
    be->act = be->wt = precision;
    be->batch_invariant = 1;   // fixed work splits, every product a k-ordered chain
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
