// The CUDA backend: its tr_ops table with the memory half (cudaMalloc, pinned staging, copies
// on the backend's stream), the context behind it (stream, cuBLAS and cuBLASLt handles, the
// Lt workspace and plans, reduction scratch) and the first-error record that stands in for
// return codes, since ops return void.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/cuda_ctx.cuh"

// ---- memory half ----

// TROUPE_DEVICE_FAULT=oom picked this allocation (engine/device.c): it asks for more than any
// device holds, so that it fails in cudaMalloc itself, as a real shortage does.
#define FAULT_BYTES ((size_t)1 << 62)
#ifndef TR_CUDA_ARCH
#define TR_CUDA_ARCH "the build's target"   // kernels/cuda/meson.build defines it
#endif

// A failed cudaMalloc is an answer (not enough memory), not a fault of the stream: the error
// is cleared so that the next launch check does not report it as its own.
static void *cuda_alloc(tr_backend *be, size_t bytes) {
    void *p = NULL;
    if (tr_fault_take_alloc(&be->fault)) bytes = FAULT_BYTES;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_free(tr_backend *be, void *p) {
    if (p) TR_CUDA_CHECK(be, cudaFree(p));
}

static void *cuda_alloc_host(tr_backend *be, size_t bytes) {
    void *p = NULL;
    if (tr_fault_take_alloc(&be->fault)) bytes = FAULT_BYTES;
    if (cudaMallocHost(&p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_free_host(tr_backend *be, void *p) {
    if (p) TR_CUDA_CHECK(be, cudaFreeHost(p));
}

static void copy_async(tr_backend *be, void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind kind, const char *name) {
    if (!bytes) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (TR_CUDA_CHECK(be, cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream))) return;
    if (ctx->prof) tr_cuda_prof_mark(ctx, name, 0, 0, 0);
}

static void cuda_upload(tr_backend *be, void *dst, const void *src, size_t bytes) {
    copy_async(be, dst, src, bytes, cudaMemcpyHostToDevice, "upload");
}

static void cuda_download(tr_backend *be, void *dst, const void *src, size_t bytes) {
    copy_async(be, dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}

static void cuda_copy(tr_backend *be, void *dst, const void *src, size_t bytes) {
    copy_async(be, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
}

static void cuda_copy_2d(tr_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                         size_t row_bytes, size_t rows) {
    if (!rows || !row_bytes) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (TR_CUDA_CHECK(be, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                            cudaMemcpyDeviceToDevice, ctx->stream)))
        return;
    if (ctx->prof) tr_cuda_prof_mark(ctx, "copy_2d", 0, 0, 0);
}

// TROUPE_DEVICE_FAULT=error:WHERE at this sync point: a kernel writes where no allocation is,
// as a kernel bug would. The device faults for real, the context is lost as it is then, and
// the synchronize reports the fault like any other (tests/kernels/test_cuda_fault makes the
// same one); the message only adds that it was asked for.
// A nonzero value: zero would go to cudaMemsetAsync, which refuses the pointer at once
// ("invalid argument") instead of letting a kernel fault.
static void inject_fault(tr_backend *be) {
    tr_cuda_fill(be, (float *)(uintptr_t)0x1000, 1.0f, (size_t)1 << 20);
}

static int cuda_sync(tr_backend *be, const char *where, char *msg, size_t cap) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->failed && tr_fault_hit(&be->fault, TR_FAULT_ERROR, where)) inject_fault(be);
    if (!ctx->failed) tr_cuda_side_join(be);
    if (!ctx->failed) TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream));
    if (!ctx->failed) {
        if (cap) msg[0] = '\0';
        return 0;
    }
    const tr_fault *f = &be->fault;
    char note[sizeof f->spec + 64] = "";
    if (f->kind == TR_FAULT_ERROR && f->seen == f->n)
        snprintf(note, sizeof note, "; injected by TROUPE_DEVICE_FAULT=%s", f->spec);
    if (cap && ctx->sync_each_op)
        snprintf(msg, cap, "CUDA device %d, failing op: %s (reported at '%s'%s)", ctx->device,
                 ctx->msg, where, note);
    else if (cap)
        snprintf(msg, cap, "CUDA device %d, failure before the sync point '%s': %s (run with "
                 "TROUPE_SYNC_EACH_OP=1 to name the op%s)", ctx->device, where, ctx->msg, note);
    return -1;
}

static void cuda_mem_info(tr_backend *be, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    TR_CUDA_CHECK(be, cudaMemGetInfo(free_bytes, total_bytes));
}

static const tr_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .upload = cuda_upload,
    .download = cuda_download,
    .copy = cuda_copy,
    .copy_2d = cuda_copy_2d,
    .sync = cuda_sync,
    .mem_info = cuda_mem_info,
    .graph_begin = tr_cuda_graph_begin,
    .graph_end = tr_cuda_graph_end,
    .graph_launch = tr_cuda_graph_launch,
    .graph_free = tr_cuda_graph_free,
    .prefetch = tr_cuda_prefetch,
    .matmul_forward = tr_cuda_matmul_forward,
    .matmul_forward_add = tr_cuda_matmul_forward_add,
    .matmul_backward = tr_cuda_matmul_backward,
    .embedding_forward = tr_cuda_embedding_forward,
    .embedding_backward = tr_cuda_embedding_backward,
    .embedding_scratch_bytes = tr_cuda_embedding_scratch_bytes,
    .rmsnorm_forward = tr_cuda_rmsnorm_forward,
    .rmsnorm_backward = tr_cuda_rmsnorm_backward,
    .head_rmsnorm_forward = tr_cuda_head_rmsnorm_forward,
    .head_rmsnorm_backward = tr_cuda_head_rmsnorm_backward,
    .rope_forward = tr_cuda_rope_forward,
    .rope_backward = tr_cuda_rope_backward,
    .attention_forward = tr_cuda_attention_forward,
    .attention_backward = tr_cuda_attention_backward,
    .attention_decode = tr_cuda_attention_decode,
    .kv_write = tr_cuda_kv_write,
    .rope_kv_write = tr_cuda_rope_kv_write,
    .attention_decode_rope = tr_cuda_attention_decode_rope,
    .swiglu_forward = tr_cuda_swiglu_forward,
    .swiglu_backward = tr_cuda_swiglu_backward,
    .matmul_swiglu_forward = tr_cuda_matmul_swiglu_forward,
    .add = tr_cuda_add,
    .logsoftmax_forward = tr_cuda_logsoftmax_forward,
    .logsoftmax_backward = tr_cuda_logsoftmax_backward,
    .logsoftmax_vp_stats = tr_cuda_logsoftmax_vp_stats,
    .logsoftmax_vp_combine = tr_cuda_logsoftmax_vp_combine,
    .logsoftmax_vp_backward = tr_cuda_logsoftmax_vp_backward,
    .sumsq = tr_cuda_sumsq,
    .adamw = tr_cuda_adamw,
    .fill = tr_cuda_fill,
    .gather_rows = tr_cuda_gather_rows,
    .scatter_rows = tr_cuda_scatter_rows,
    .kv_copy_blocks = tr_cuda_kv_copy_blocks,
    .decode_rows = tr_cuda_decode_rows,
    .convert = tr_cuda_convert,
    .sample = tr_cuda_sample,
    .sample_scratch_bytes = tr_cuda_sample_scratch_bytes,
    .sample_vp_top = tr_cuda_sample_vp_top,
    .sample_vp_scan = tr_cuda_sample_vp_scan,
    .sample_vp_pick = tr_cuda_sample_vp_pick,
    .sample_vp_scratch_bytes = tr_cuda_sample_vp_scratch_bytes,
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

// Whether the environment sets name to exactly value (the knobs' on or off).
static bool env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}

// Nothing: a kernel whose attributes tell whether this build has an image for the device.
__global__ void tr_cuda_probe_kernel() {}

// True (recorded) when the kernels were compiled for another architecture than the device's:
// sm_90a code runs on Hopper only, and every launch would fail with a less helpful error.
static bool no_kernel_image(tr_cuda_ctx *ctx, int device) {
    cudaFuncAttributes fa;
    const cudaError_t e = cudaFuncGetAttributes(&fa, tr_cuda_probe_kernel);
    if (e == cudaSuccess) return false;
    cudaGetLastError();
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    char msg[200];
    snprintf(msg, sizeof msg,
             "the CUDA kernels were built for %s and device %d is sm_%d%d (%s): reconfigure "
             "with -Dgpu_arch=sm_%d%d",
             TR_CUDA_ARCH, device, major, minor, cudaGetErrorString(e), major, minor);
    tr_cuda_record(ctx, __FILE__, __LINE__, "tr_backend_cuda_init", msg);
    return true;
}

// The prefetch op's stream and its fork and join events (prefetch.cu).
static int side_make(tr_backend *be) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (ctx->side) return 0;
    if (TR_CUDA_CHECK(be, cudaEventCreateWithFlags(&ctx->side_fork, cudaEventDisableTiming)) ||
        TR_CUDA_CHECK(be, cudaEventCreateWithFlags(&ctx->side_done, cudaEventDisableTiming)) ||
        TR_CUDA_CHECK(be, cudaStreamCreateWithFlags(&ctx->side, cudaStreamNonBlocking)))
        return -1;
    return 0;
}

// Decode attention's split walk on (its chunks' memory made at the first use) or off.
// Returns the mode before, or -1 when the memory could not be made.
static int dec_split_set(tr_backend *be, int mode) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    const int was = ctx->decode_split;
    if (mode && !ctx->dec_parts &&
        TR_CUDA_CHECK(be, cudaMalloc((void **)&ctx->dec_parts,
                                     TR_CUDA_DECODE_PARTS * sizeof(float))))
        return -1;
    ctx->decode_split = mode == 1 || mode == 2 ? mode : 0;
    return was;
}

// The context is kept even when init fails, so that status can tell why.

extern "C" int tr_backend_cuda_init(tr_backend *be, int device, tr_dt precision,
                                    int batch_invariant) {
    be->ops = NULL;
    be->ctx = NULL;
    be->n_threads = 1;
    be->act = be->wt = precision;
    be->batch_invariant = 0;
    memset(&be->fault, 0, sizeof be->fault);
    tr_cuda_ctx *ctx = (tr_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return -1;
    be->ctx = ctx;
    if (precision != TR_F32 && precision != TR_BF16) {
        tr_cuda_record(ctx, __FILE__, __LINE__, "tr_backend_cuda_init",
                       "precision must be fp32 or bf16");
        return -1;
    }
    ctx->device = device;
    ctx->sync_each_op = env_is("TROUPE_SYNC_EACH_OP", "1");
    ctx->no_graphs = env_is("TROUPE_CUDA_GRAPHS", "0");
    const char *any_n = getenv("TROUPE_CUDA_ANY_N");
    ctx->any_n_at = any_n && atoi(any_n) > 0 ? atoi(any_n) : TR_CUDA_ANY_N;
    ctx->flash_attention = !env_is("TROUPE_CUDA_FLASH_ATTENTION", "0");
    ctx->pdl = env_is("TROUPE_CUDA_PDL", "1");
    ctx->no_seqk = env_is("TROUPE_CUDA_SEQK", "0");
    ctx->fused_swiglu = env_is("TROUPE_CUDA_FUSED_SWIGLU", "1");
    ctx->prefetch = env_is("TROUPE_CUDA_PREFETCH", "1")   ? 1
                    : env_is("TROUPE_CUDA_PREFETCH", "2") ? 2
                                                          : 0;
    const char *wg = getenv("TROUPE_CUDA_WGMMA");   // 0: none; a mask of TR_CUDA_WG_*
    ctx->wgmma = wg && *wg ? atoi(wg) & TR_CUDA_WG_MASK : TR_CUDA_WG_DEFAULT;
    ctx->no_lean_copies = env_is("TROUPE_CUDA_DECODE_LEAN", "0");
    ctx->decode_rope = !env_is("TROUPE_CUDA_DECODE_ROPE", "0");
    ctx->decode_coop = env_is("TROUPE_CUDA_DECODE_COOP", "0")   ? 0
                       : env_is("TROUPE_CUDA_DECODE_COOP", "1") ? 1
                                                                : -1;
    ctx->topk_select = !env_is("TROUPE_CUDA_TOPK_SELECT", "0");
    const int split = env_is("TROUPE_CUDA_DECODE_SPLIT", "1")   ? 1
                      : env_is("TROUPE_CUDA_DECODE_SPLIT", "2") ? 2
                                                                : 0;
    const char *chunk = getenv("TROUPE_CUDA_SOFTMAX_CHUNK");
    ctx->softmax_chunk = TR_CUDA_SOFTMAX_CHUNK;
    if (chunk) {
        char *end = NULL;
        long c = strtol(chunk, &end, 10);
        if (end == chunk || *end || c < 64 || c > 4096 || c % 64) {
            tr_cuda_record(ctx, __FILE__, __LINE__, "TROUPE_CUDA_SOFTMAX_CHUNK",
                           "must be a multiple of 64 from 64 to 4096");
            return -1;
        }
        ctx->softmax_chunk = (int32_t)c;
    }
    // The bf16 forward products pick their kernel without regard to T (gemm_lt.cu); sgemm
    // cannot be told to, so fp32 is not batch-invariant. -1: TROUPE_CUDA_BATCH_INVARIANT's
    // say, on unless it is 0.
    if (batch_invariant < 0) {
        batch_invariant = !env_is("TROUPE_CUDA_BATCH_INVARIANT", "0");
    }
    be->batch_invariant = precision == TR_BF16 && batch_invariant;
    if (TR_CUDA_CHECK(be, cudaSetDevice(device))) return -1;
    if (TR_CUDA_CHECK(be, cudaDeviceGetAttribute(&ctx->sms, cudaDevAttrMultiProcessorCount, device)))
        return -1;
    if (no_kernel_image(ctx, device)) return -1;
    if (TR_CUDA_CHECK(be, cudaStreamCreate(&ctx->stream))) return -1;
    if (ctx->prefetch && side_make(be) != 0) return -1;
    if (split && precision == TR_BF16 && dec_split_set(be, split) < 0) return -1;
    if (env_is("TROUPE_CUDA_PROFILE", "1") && tr_cuda_prof_init(ctx)) {
        tr_cuda_record(ctx, __FILE__, __LINE__, "TROUPE_CUDA_PROFILE", "no memory for events");
        return -1;
    }
    if (TR_CUBLAS_CHECK(be, cublasCreate(&ctx->blas))) return -1;
    if (TR_CUBLAS_CHECK(be, cublasSetStream(ctx->blas, ctx->stream))) return -1;
    // Pedantic math: true fp32 products, never TF32, even under NVIDIA_TF32_OVERRIDE.
    if (TR_CUBLAS_CHECK(be, cublasSetMathMode(ctx->blas, CUBLAS_PEDANTIC_MATH))) return -1;
    if (precision == TR_BF16) {   // only bf16 products go through cuBLASLt
        if (TR_CUBLAS_CHECK(be, cublasLtCreate(&ctx->lt))) return -1;
        if (TR_CUDA_CHECK(be, cudaMalloc(&ctx->lt_ws, TR_CUDA_LT_WORKSPACE))) return -1;
    }
    if (TR_CUDA_CHECK(be, cudaMalloc((void **)&ctx->partial,
                                     TR_CUDA_SUMSQ_BLOCKS * sizeof(double))))
        return -1;
    if (TR_CUDA_CHECK(be, cudaMalloc((void **)&ctx->norm_partial,
                                     TR_CUDA_NORM_PARTIALS * sizeof(double))))
        return -1;
    // only the bf16 attention backward takes row scratch; made here so that a recorded graph
    // never has to
    if (precision == TR_BF16 && !tr_cuda_rows(be, TR_CUDA_ROW_SCRATCH)) return -1;
    be->ops = &cuda_ops;
    return 0;
}

float *tr_cuda_rows(tr_backend *be, size_t n) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (n <= ctx->n_rows) return ctx->rows;
    if (ctx->rows) {   // queued kernels may still read the old scratch
        if (TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream))) return NULL;
        if (TR_CUDA_CHECK(be, cudaFree(ctx->rows))) return NULL;
        ctx->rows = NULL;
        ctx->n_rows = 0;
    }
    if (TR_CUDA_CHECK(be, cudaMalloc((void **)&ctx->rows, n * sizeof(float)))) return NULL;
    ctx->n_rows = n;
    return ctx->rows;
}

extern "C" void tr_backend_cuda_free(tr_backend *be) {
    if (!be || !be->ctx) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    // Teardown errors have nobody left to report to; each release is still attempted.
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->side) {
        cudaStreamSynchronize(ctx->side);
        cudaStreamDestroy(ctx->side);
    }
    if (ctx->side_fork) cudaEventDestroy(ctx->side_fork);
    if (ctx->side_done) cudaEventDestroy(ctx->side_done);
    tr_cuda_prof_free(ctx);
    if (ctx->partial) cudaFree(ctx->partial);
    if (ctx->norm_partial) cudaFree(ctx->norm_partial);
    if (ctx->rows) cudaFree(ctx->rows);
    if (ctx->dec_parts) cudaFree(ctx->dec_parts);
    tr_cuda_lt_plans_free(ctx);
    if (ctx->lt_ws) cudaFree(ctx->lt_ws);
    if (ctx->lt) cublasLtDestroy(ctx->lt);
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
    if (!ctx->failed && ctx->stream) tr_cuda_side_join(be);
    if (!ctx->failed && ctx->stream) TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream));
    if (!ctx->failed) return 0;
    if (cap) snprintf(msg, cap, "%s", ctx->msg);
    return -1;
}

extern "C" void *tr_backend_cuda_stream(tr_backend *be) {
    return be && be->ctx ? (void *)tr_cuda_stream(be) : NULL;
}

extern "C" int tr_backend_cuda_device(tr_backend *be) {
    return be && be->ctx ? tr_cuda_ctx_of(be)->device : -1;
}

extern "C" void tr_backend_cuda_force_row_ctas(tr_backend *be, int ctas) {
    if (be && be->ctx)
        tr_cuda_ctx_of(be)->row_ctas = ctas == 1 || ctas == 2 || ctas == 4 ? ctas : 0;
}

extern "C" void tr_backend_cuda_fused_swiglu(tr_backend *be, int on) {
    if (be && be->ctx) tr_cuda_ctx_of(be)->fused_swiglu = on != 0;
}

extern "C" int tr_backend_cuda_prefetch(tr_backend *be, int on) {
    if (!be || !be->ctx) return -1;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (on && side_make(be) != 0) return -1;
    ctx->prefetch = on == 2 ? 2 : on != 0;
    return 0;
}

extern "C" long tr_backend_cuda_prefetch_pending(tr_backend *be) {
    return be && be->ctx ? tr_cuda_ctx_of(be)->side_pending : 0;
}

extern "C" long tr_backend_cuda_fused_swiglu_runs(tr_backend *be) {
    return be && be->ctx ? tr_cuda_ctx_of(be)->fused_swiglu_runs : 0;
}

extern "C" void tr_backend_cuda_topk_select(tr_backend *be, int on) {
    if (be && be->ctx) tr_cuda_ctx_of(be)->topk_select = on != 0;
}

extern "C" int tr_backend_cuda_decode_rope(tr_backend *be, int on) {
    if (!be || !be->ctx) return 0;
    const int was = tr_cuda_ctx_of(be)->decode_rope;
    tr_cuda_ctx_of(be)->decode_rope = on != 0;
    return was;
}

extern "C" int tr_backend_cuda_decode_coop(tr_backend *be, int mode) {
    if (!be || !be->ctx) return -1;
    const int was = tr_cuda_ctx_of(be)->decode_coop;
    tr_cuda_ctx_of(be)->decode_coop = mode == 0 || mode == 1 ? mode : -1;
    return was;
}

extern "C" int tr_backend_cuda_decode_split(tr_backend *be, int mode) {
    if (!be || !be->ctx) return -1;
    return dec_split_set(be, mode);
}

extern "C" int tr_backend_cuda_wgmma(tr_backend *be, int mask) {
    if (!be || !be->ctx) return 0;
    const int was = TR_CUDA_WGMMA ? tr_cuda_ctx_of(be)->wgmma : 0;
    tr_cuda_ctx_of(be)->wgmma = mask & TR_CUDA_WG_MASK;
    return was;
}

extern "C" int tr_backend_cuda_softmax_chunk(tr_backend *be) {
    return be && be->ctx ? tr_cuda_ctx_of(be)->softmax_chunk : TR_CUDA_SOFTMAX_CHUNK;
}
