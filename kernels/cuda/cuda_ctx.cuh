// Internal to the CUDA backend (.cu files only): the backend context (stream, cuBLAS and
// cuBLASLt handles, the Lt workspace and plan cache, reduction scratch, first recorded error),
// the checks that record failures, deterministic block reductions, and the op functions each
// .cu file adds to the table in backend_cuda.cu.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/ops.h"

// sumsq adds at most this many fixed blocks; their partial sums live in the context.
#define TR_CUDA_SUMSQ_BLOCKS 1024
// Per-chunk partial sums of the norms' weight gradients (rmsnorm.cu), in the context.
#define TR_CUDA_NORM_PARTIALS ((size_t)1 << 19)
// Floats of row scratch made at init (bf16): the attention backward's two statistics of
// 524,288 (token, head) rows, 16K tokens of 32 heads; a larger batch grows it (tr_cuda_rows).
#define TR_CUDA_ROW_SCRATCH ((size_t)1 << 20)
// Floats of the split decode walk's published chunks (16 MB): a launch splits only where its
// rows' chunks fit (attention_decode.cu), e.g. one sequence of 32K positions over 8 KV heads
// at D = 128 (8.5 MB), or 64 of 4K over 2 at D = 64.
#define TR_CUDA_DECODE_PARTS ((size_t)4 << 20)
// cuBLASLt plans kept (one per GEMM shape); past this the oldest is replaced. A replaced plan
// is remade by the heuristic on its next use, which costs host time, so this is well above
// the shapes a model's step uses (about 12 a layer kind, the LM head's chunks, the decode
// batch sizes).
#define TR_CUDA_LT_PLANS 512
// cuBLASLt workspace, allocated once at init (the size NVIDIA advises for Hopper).
#define TR_CUDA_LT_WORKSPACE ((size_t)32 << 20)
// The n at which a batch-invariant product's algorithm is chosen, for every n. Decode runs
// the products at n = its batch, training at n = a micro-batch's tokens: the heuristic's
// choice at 8192 (large tiles) left the 0.5B shape's decode GEMMs at 512 rows on a few SMs
// (down_proj 52 us a call), while its choice at 1024 ran a GRPO step's generation in 1.10 s
// instead of 1.42 s with training unchanged (130.5K against 130.2K tokens/s, bench_decode_gpu
// and bench_train_gpu on an H200; 512: 1.05 s but training 1.1% slower).
#define TR_CUDA_ANY_N 1024

// What fixes a cuBLASLt product's algorithm: every field the heuristic sees. Compared with
// memcmp, so it is zeroed before it is filled (no stray padding bytes).
typedef struct tr_lt_key {
    int32_t ta, tb;                // cublasOperation_t of A and B
    int64_t m, n, k, lda, ldb, ldd;
    int32_t a_type, b_type, d_type;   // cudaDataType_t; C has D's type and layout
    int32_t bias;                  // 1: bias epilogue (bias of D's type)
    int32_t any_n;                 // 1: the algorithm is the one chosen at n = TR_CUDA_ANY_N
    int32_t split_k;               // 1: the reduction may be split (tr_lt_gemm.split_k)
    int32_t align_a, align_b, align_d, align_bias;   // bytes, powers of two up to 16
} tr_lt_key;

// A shape's descriptors and the one algorithm chosen for it, kept for the backend's life.
typedef struct tr_lt_plan {
    tr_lt_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    bool settled;   // a decode-sized product's algorithm was timed (gemm_lt.cu: plan_settle)
    int32_t seqk;   // 0: algo runs the product; c > 0: the sequential-k kernel (gemm_seqk.cu) in
                    // its configuration c - 1, settled on as of algo's bits (plan_settle)
    int32_t seqk_best;   // c > 0: the fastest configuration c - 1 of that kernel among those
                         // of algo's bits, whichever runs the product (0: none)
} tr_lt_plan;

// TROUPE_CUDA_PROFILE=1 (profile.cu): events queued after each launch, summed per op name
// (and GEMM shape) into at most TR_CUDA_PROF_ROWS rows.
#define TR_CUDA_PROF_EVENTS 4096
#define TR_CUDA_PROF_ROWS 256
typedef struct tr_cuda_prof_tag {
    const char *name;   // a string literal: rows are matched by pointer
    int64_t m, n, k;    // a GEMM's shape, else 0
    int idle;           // the device had finished all earlier work when this was queued
} tr_cuda_prof_tag;
typedef struct tr_cuda_prof_row {
    const char *name;
    int64_t m, n, k;
    double ms;
    long count, idle;
} tr_cuda_prof_row;
typedef struct tr_cuda_prof {
    cudaEvent_t ev[TR_CUDA_PROF_EVENTS];
    tr_cuda_prof_tag marks[TR_CUDA_PROF_EVENTS];   // marks[i]: the launch ev[i] follows
    int n;
    tr_cuda_prof_row rows[TR_CUDA_PROF_ROWS];
    int n_rows;
    double total_ms, t0, t1;   // t0, t1: host clock at the first and the last mark
    long plans_made;           // cuBLASLt plans made (the heuristic asked) and their host time
    double plan_ms;
} tr_cuda_prof;

typedef struct tr_cuda_ctx {
    int device;
    int sms;                // the device's multiprocessors (launch shapes that fill it)
    cudaStream_t stream;
    cublasHandle_t blas;    // fp32 products (pedantic sgemm)
    cublasLtHandle_t lt;    // bf16 products
    void *lt_ws;            // device, TR_CUDA_LT_WORKSPACE bytes
    tr_lt_plan plans[TR_CUDA_LT_PLANS];
    int32_t n_plans, next_plan;   // next_plan: the slot replaced when all are taken
    double *partial;        // device, TR_CUDA_SUMSQ_BLOCKS doubles
    double *norm_partial;   // device, TR_CUDA_NORM_PARTIALS doubles
    float *rows;            // device, n_rows floats of row scratch (tr_cuda_rows)
    size_t n_rows;
    int sync_each_op;       // TROUPE_SYNC_EACH_OP=1: every op waits and names itself on failure
    int no_graphs;          // TROUPE_CUDA_GRAPHS=0: graph_begin declines (ops run as queued)
    int32_t any_n_at;       // the n whose algorithm batch-invariant products take (gemm_lt.cu;
                            // TROUPE_CUDA_ANY_N for measuring another)
    int flash_attention;    // the tensor-core attention kernels; TROUPE_CUDA_FLASH_ATTENTION=0
                            // keeps the row kernels (attention.cu) for every head size
    int32_t softmax_chunk;  // TR_CUDA_SOFTMAX_CHUNK, or TROUPE_CUDA_SOFTMAX_CHUNK's
    int32_t row_ctas;       // blocks a log-softmax row takes; 0: by the launch's rows (tests
                            // force 1, 2 or 4: logsoftmax_row.cuh)
    int topk_select;        // top-k rows ranked by a select, not the sort (sample_topk.cuh);
                            // TROUPE_CUDA_TOPK_SELECT=0 or a test turns it off
    int no_seqk;            // TROUPE_CUDA_SEQK=0: plan_settle leaves gemm_seqk.cu out
    int fused_swiglu;       // TROUPE_CUDA_FUSED_SWIGLU=1: a decode step's gate/up product
                            // and SwiGLU in one kernel (matmul.cu)
    long fused_swiglu_runs; // products run so (tests check that the fused path ran)
    int wgmma;              // the flash-attention passes on warpgroup MMA (built for
                            // sm_90a): TR_CUDA_WG_* bits, TROUPE_CUDA_WGMMA's mask or
                            // TR_CUDA_WG_DEFAULT
    int pdl;                // TROUPE_CUDA_PDL=1: tr_cuda_launch's early starts
    void *tma_encode;       // the driver's cuTensorMapEncodeTiled, looked up at first use
                            // (attention_tma.cuh)
    int decode_coop;        // decode attention's shared-chunk kernel: -1 by rule, 0 never, 1
                            // wherever it runs (TROUPE_CUDA_DECODE_COOP=0|1;
                            // attention_decode.cu)
    int decode_rope;        // attention_decode_rope in one launch, else (TROUPE_CUDA_DECODE_ROPE=0)
                            // rope_kv_write and attention_decode in turn
    int decode_split;       // decode attention's split walk (attention_decode.cu): 0 never (the
                            // default until measured), 1 wherever it fits, 2 for grids under
                            // two blocks an SM (TROUPE_CUDA_DECODE_SPLIT=1|2)
    float *dec_parts;       // device, TR_CUDA_DECODE_PARTS floats: the split walk's chunks,
                            // made when decode_split is first set
    int no_lean_copies;     // TROUPE_CUDA_DECODE_LEAN=0: decode attention copies through its
                            // table of slot offsets at every block size (attention_decode.cu)
    int prefetch;           // TROUPE_CUDA_PREFETCH=1: the prefetch op's hints (prefetch.cu);
                            // 2: their lines marked evict-last
    cudaStream_t side;      // the prefetches' stream (made when prefetch is on), forked from
    cudaEvent_t side_fork, side_done;   // and joined back into `stream` by these events
    int side_pending;       // a prefetch is not yet joined (tr_cuda_side_join)
    tr_cuda_prof *prof;     // TROUPE_CUDA_PROFILE=1, else NULL
    int failed;
    char msg[512];
} tr_cuda_ctx;

static inline tr_cuda_ctx *tr_cuda_ctx_of(tr_backend *be) { return (tr_cuda_ctx *)be->ctx; }
static inline cudaStream_t tr_cuda_stream(tr_backend *be) { return tr_cuda_ctx_of(be)->stream; }

// Records the first failure; later ones are consequences and are dropped. Returns 0 on
// success so that callers can stop early: `if (tr_cuda_check(...)) return;`.
int tr_cuda_record(tr_cuda_ctx *ctx, const char *file, int line, const char *what,
                   const char *detail);
static inline int tr_cuda_check_rt(tr_backend *be, cudaError_t e, const char *file, int line,
                                   const char *what) {
    if (e == cudaSuccess) return 0;
    return tr_cuda_record(tr_cuda_ctx_of(be), file, line, what, cudaGetErrorString(e));
}
static inline int tr_cuda_check_blas(tr_backend *be, cublasStatus_t s, const char *file,
                                     int line, const char *what) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (s != CUBLAS_STATUS_SUCCESS)
        return tr_cuda_record(ctx, file, line, what, cublasGetStatusString(s));
    if (!ctx->sync_each_op || !ctx->stream) return 0;
    return tr_cuda_check_rt(be, cudaStreamSynchronize(ctx->stream), file, line, what);
}
#define TR_CUDA_CHECK(be, call) tr_cuda_check_rt((be), (call), __FILE__, __LINE__, #call)
#define TR_CUBLAS_CHECK(be, call) tr_cuda_check_blas((be), (call), __FILE__, __LINE__, #call)
// At least n floats of the context's row scratch, grown (after the stream's queued work) when
// it holds fewer; NULL, with the failure recorded, when there is no memory. The memory is the
// caller's until its next op: ops on the stream take it in turn.
float *tr_cuda_rows(tr_backend *be, size_t n);
// graph.cu: the graph_* ops.
int tr_cuda_graph_begin(tr_backend *be);
int tr_cuda_graph_end(tr_backend *be, void **exec);
int tr_cuda_graph_launch(tr_backend *be, void *exec);
void tr_cuda_graph_free(tr_backend *be, void *exec);

int tr_cuda_prof_init(tr_cuda_ctx *ctx);
void tr_cuda_prof_mark(tr_cuda_ctx *ctx, const char *name, int64_t m, int64_t n, int64_t k);
void tr_cuda_prof_free(tr_cuda_ctx *ctx);   // prints the table

// After a kernel launch: bad configurations are reported here, faults at the next sync (or
// right here, naming the kernel, when every op syncs).
static inline int tr_cuda_launched(tr_backend *be, const char *file, int line, const char *name) {
    if (tr_cuda_check_rt(be, cudaGetLastError(), file, line, name)) return -1;
    if (tr_cuda_ctx_of(be)->prof) tr_cuda_prof_mark(tr_cuda_ctx_of(be), name, 0, 0, 0);
    if (!tr_cuda_ctx_of(be)->sync_each_op) return 0;
    return tr_cuda_check_rt(be, cudaStreamSynchronize(tr_cuda_stream(be)), file, line, name);
}
#define TR_CUDA_LAUNCHED(be, name) tr_cuda_launched((be), __FILE__, __LINE__, "launch " name)

// Programmatic dependent launch, for a decode step's chain of small kernels: a kernel launched
// with `early` (tr_cuda_launch, when the backend has it on) may be scheduled while the kernel
// before it still runs, and its blocks wait in tr_pdl_wait, at their very start, until that
// kernel has finished and its writes are visible; so it reads nothing early, and only the
// launch's latency overlaps. tr_pdl_release lets the next kernel do the same as soon as this
// one starts. Both are no-ops in a kernel launched plainly. Off unless TROUPE_CUDA_PDL=1: in
// replayed decode graphs it measured within noise of plain launches (H200, 0.5B shape: +0.8%
// tokens/s at 64 rows, -1% at 256), and the same bits.
__device__ __forceinline__ void tr_pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void tr_pdl_release() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// A launch with what <<<>>> cannot say: blocks in clusters of `cluster` (1: none), and the
// early start above.
template <typename... P, typename... A>
static cudaError_t tr_cuda_launch_ex(cudaStream_t st, int cluster, bool early,
                                     void (*kernel)(P...), dim3 grid, dim3 block, size_t shm,
                                     A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = shm;
    cfg.stream = st;
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cluster;
        at[n].val.clusterDim.y = at[n].val.clusterDim.z = 1;
        n++;
    }
    if (early) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, (P)args...);
}

// On the backend's stream, starting early where asked and the backend has it on.
template <typename... P, typename... A>
static cudaError_t tr_cuda_launch(tr_backend *be, bool early, void (*kernel)(P...), dim3 grid,
                                  dim3 block, size_t shm, A... args) {
    return tr_cuda_launch_ex(tr_cuda_stream(be), 1, early && tr_cuda_ctx_of(be)->pdl, kernel,
                             grid, block, shm, args...);
}

// Rows up to which a launch counts as a decode step's (the early start, tr_cuda_launch).
#define TR_CUDA_DECODE_ROWS 512

// Grid size for elementwise kernels over n items with a grid-stride loop.
static inline unsigned tr_cuda_grid(size_t n, unsigned threads) {
    size_t g = (n + threads - 1) / threads;
    return g > 65535u * 16u ? 65535u * 16u : (unsigned)(g ? g : 1);
}

// Block reductions in a fixed order (warp butterfly, then warp 0 over the warp results), so
// the same inputs give the same bits on every run. blockDim.x must be a multiple of 32; every
// thread of the block must call, and every thread gets the result.
struct tr_op_sum {
    template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct tr_op_max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ inline T tr_block_reduce(T v, Op op, T identity) {
    __shared__ T buf[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();   // buf may still be read by a previous call
    if (lane == 0) buf[warp] = v;
    __syncthreads();
    if (warp == 0) {
        int nw = (int)(blockDim.x >> 5);
        v = lane < nw ? buf[lane] : identity;
        for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) buf[0] = v;
    }
    __syncthreads();
    return buf[0];
}

__device__ inline double tr_block_sum(double v) { return tr_block_reduce(v, tr_op_sum(), 0.0); }
__device__ inline float tr_block_max(float v) {
    return tr_block_reduce(v, tr_op_max(), -INFINITY);
}

// Op functions, signatures as in kernels/ops.h.
void tr_cuda_matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                            const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags);
void tr_cuda_matmul_forward_add(tr_backend *be, float *out, const float *x, const void *in,
                                const void *w, const void *bias, int32_t T, int32_t IC,
                                int32_t OC);
void tr_cuda_matmul_backward(tr_backend *be, void *din, float *dw, float *dbias,
                             const void *dout, const void *in, const void *w, int32_t T,
                             int32_t IC, int32_t OC);
void tr_cuda_lt_plans_free(tr_cuda_ctx *ctx);
void tr_cuda_prefetch(tr_backend *be, const void *p, size_t bytes);
// Makes the stream wait for the prefetches queued beside it, if any are not joined yet:
// before a recording begins or ends (a capture must take in every fork it made, and not a
// fork made before it), and before the stream is waited for.
int tr_cuda_side_join(tr_backend *be);
void tr_cuda_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                               const void *table, int32_t T, int32_t C);
void tr_cuda_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                                const int32_t *ids, int32_t T, int32_t C, void *scratch);
size_t tr_cuda_embedding_scratch_bytes(tr_backend *be, int32_t T);
void tr_cuda_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const float *in,
                             const void *w, float eps, int32_t T, int32_t C);
void tr_cuda_rmsnorm_backward(tr_backend *be, float *din, void *din_act, float *dw,
                              const void *dout, const float *in, const void *w,
                              const float *rstd, int32_t T, int32_t C);
void tr_cuda_head_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const void *in,
                                  const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                  int32_t ld);
void tr_cuda_head_rmsnorm_backward(tr_backend *be, void *din, float *dw, const void *dout,
                                   const void *in, const void *w, const float *rstd, int32_t T,
                                   int32_t H, int32_t D, int32_t ld);
void tr_cuda_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D);
void tr_cuda_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                           const float *inv_freq, int32_t T, int32_t H, int32_t D);
void tr_cuda_rope_kv_write(tr_backend *be, void *x, const void *v, int32_t ld,
                           const int32_t *pos, const float *inv_freq, int32_t T, int32_t H,
                           const tr_kv_pages *kv, const int32_t *slot);
void tr_cuda_attention_forward(tr_backend *be, void *out, float *lse, const void *q,
                               const void *k, const void *v, int32_t ld,
                               const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
void tr_cuda_attention_backward(tr_backend *be, void *dq, void *dk, void *dv,
                                const void *dout, const void *out, const float *lse,
                                const void *q, const void *k, const void *v, int32_t ld,
                                const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
void tr_cuda_attention_decode(tr_backend *be, void *out, const void *q, int32_t ld,
                              const tr_kv_pages *kv, const int32_t *block_table,
                              int32_t max_blocks, const int32_t *seq_len, int32_t B, int32_t H);
void tr_cuda_attention_decode_rope(tr_backend *be, void *out, void *x, const void *v, int32_t ld,
                                   const int32_t *pos, const float *inv_freq,
                                   const tr_kv_pages *kv, const int32_t *slot,
                                   const int32_t *block_table, int32_t max_blocks,
                                   const int32_t *seq_len, int32_t B, int32_t H);
void tr_cuda_kv_write(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot,
                      const void *k, const void *v, int32_t ld, int32_t T);
void tr_cuda_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I);
void tr_cuda_matmul_swiglu_forward(tr_backend *be, void *act, void *gu, const void *in,
                                   const void *w, int32_t T, int32_t IC, int32_t I);
void tr_cuda_swiglu_backward(tr_backend *be, void *dgu, const void *dout, const void *gu,
                             int32_t T, int32_t I);
void tr_cuda_add(tr_backend *be, float *out, const float *a, const float *b, size_t n);
void tr_cuda_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                                const void *logits, const int32_t *target, int32_t T,
                                int32_t V);
void tr_cuda_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                 const float *dentropy, const void *logits, const float *lse,
                                 const int32_t *target, int32_t T, int32_t V);
void tr_cuda_logsoftmax_vp_stats(tr_backend *be, double *stats, const void *logits,
                                 const int32_t *target, int32_t v0, int32_t T, int32_t V);
void tr_cuda_logsoftmax_vp_combine(tr_backend *be, float *logprob, float *entropy, float *lse,
                                   double *mean, const double *stats, const int32_t *target,
                                   int32_t R, int32_t T);
void tr_cuda_logsoftmax_vp_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                    const float *dentropy, const void *logits,
                                    const float *lse, const double *mean,
                                    const int32_t *target, int32_t v0, int32_t T, int32_t V);
void tr_cuda_sumsq(tr_backend *be, double *acc, const float *x, size_t n);
void tr_cuda_adamw(tr_backend *be, const tr_adamw_args *a);
void tr_cuda_fill(tr_backend *be, float *x, float value, size_t n);
void tr_cuda_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                         int32_t n, size_t row_bytes);
void tr_cuda_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                          int32_t n, size_t row_bytes);
void tr_cuda_decode_rows(tr_backend *be, const tr_decode_rows_args *a);
void tr_cuda_kv_copy_blocks(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                            const int32_t *dst, const int32_t *n_slots, int32_t n);
void tr_cuda_convert(tr_backend *be, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                     size_t n);
void tr_cuda_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                    const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                    int32_t *n_near);
size_t tr_cuda_sample_scratch_bytes(tr_backend *be, int32_t B, int32_t V);
void tr_cuda_sample_vp_top(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                           int32_t B, int32_t V, int32_t k, void *scratch);
void tr_cuda_sample_vp_scan(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                            const tr_sample_row *rows, const tr_sample_cand *cand,
                            const double *carry, const double *total, int32_t R, int32_t k,
                            int32_t v0, int32_t B, int32_t V);
void tr_cuda_sample_vp_pick(tr_backend *be, int32_t *ids, int32_t *n_near,
                            const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                            const tr_sample_row *rows, int32_t R, int32_t k, int32_t B, int32_t V,
                            void *scratch);
size_t tr_cuda_sample_vp_scratch_bytes(tr_backend *be, int32_t B, int32_t V, size_t n_cand);
