// Internal to the CPU backend: its context (the thread pool) and the op functions that
// backend_cpu.c puts in the tr_ops table. Signatures mirror kernels/ops.h one for one; A and
// W buffers are in be->act and be->wt (kernels/cpu/dtype.h reads and writes them).
// Every op splits its work into tasks of a FIXED size that depends only on the op's
// arguments, never on the thread count, and reduces in a fixed order: bitwise reproducible.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#include "kernels/ops.h"

// One allocation of guarded mode: its own mapping, page-rounded.
typedef struct tr_cpu_region {
    void *base;
    size_t bytes;
} tr_cpu_region;

// A POSIX shared-memory segment mapped as backend memory (share.c).
typedef struct tr_cpu_shared {
    void *base;
    size_t bytes;
    char name[64];
    bool owner;                  // made it (and unlinks its name)
} tr_cpu_shared;

typedef struct tr_cpu_ctx {
    tr_pool *pool;
    tr_gemm_isa isa;   // the matrix product's micro-kernel, fixed at init
    // Guarded mode (kernels/cpu/guard.c): backend memory is PROT_NONE outside ops.
    bool guard;
    int32_t guard_open;          // depth of ops running; memory is accessible while > 0
    tr_cpu_region *regions;      // every live allocation
    int32_t n_regions, cap_regions;
    tr_cpu_shared *shared;       // mapped shared-memory segments
    int32_t n_shared, cap_shared;
    // A device failure injected by TROUPE_DEVICE_FAULT, the CPU's only kind: kept, as CUDA
    // keeps its first failure, so every later sync reports it too.
    bool failed;
    char msg[256];
} tr_cpu_ctx;

static inline tr_pool *tr_cpu_pool(tr_backend *be) { return ((tr_cpu_ctx *)be->ctx)->pool; }
static inline tr_gemm_isa tr_cpu_isa(tr_backend *be) { return ((tr_cpu_ctx *)be->ctx)->isa; }

// Waking the pool's workers costs ~10 us; a job estimated (ns on one core) below this runs
// its tasks in the calling thread instead. Same tasks either way, so the same bits.
#define TR_CPU_INLINE_NS 20000.0

static inline void tr_cpu_run(tr_backend *be, int32_t n_tasks, tr_pool_fn fn, void *arg,
                              double est_ns) {
    if (est_ns < TR_CPU_INLINE_NS) {
        for (int32_t t = 0; t < n_tasks; t++) fn(arg, t);
        return;
    }
    tr_pool_run(tr_cpu_pool(be), n_tasks, fn, arg);
}

static inline int32_t tr_cpu_ceil_div(int64_t a, int64_t b) { return (int32_t)((a + b - 1) / b); }

// Memory half (memory.c): host memory, memcpy copies, nothing to wait for.
void *tr_cpu_alloc(tr_backend *be, size_t bytes);
void tr_cpu_free(tr_backend *be, void *p);
void *tr_cpu_alloc_host(tr_backend *be, size_t bytes);
void tr_cpu_free_host(tr_backend *be, void *p);
void tr_cpu_upload(tr_backend *be, void *dst, const void *src, size_t bytes);
void tr_cpu_copy_2d(tr_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                    size_t row_bytes, size_t rows);
int tr_cpu_sync(tr_backend *be, const char *where, char *msg, size_t cap);
void tr_cpu_mem_info(tr_backend *be, size_t *free_bytes, size_t *total_bytes);
void tr_cpu_memory_free(tr_cpu_ctx *ctx);
// Guarded mode's table of backend memory: a mapping made elsewhere (shared memory) joins and
// leaves it here.
int tr_cpu_region_add(tr_cpu_ctx *ctx, void *p, size_t bytes);
void tr_cpu_region_remove(tr_cpu_ctx *ctx, void *p);

// Shared memory (share.c): a segment of bytes made here, its name written to name (cap bytes),
// or one another process made, opened by name (and unlinked: one opener each); NULL with msg.
// Release either with tr_cpu_share_release; segments left at backend free are released then.
void *tr_cpu_share_alloc(tr_backend *be, size_t bytes, char *name, size_t cap, char *msg, size_t msg_cap);
void *tr_cpu_share_open(tr_backend *be, const char *name, size_t bytes, char *msg, size_t msg_cap);
int tr_cpu_share_release(tr_backend *be, void *p, char *msg, size_t msg_cap);
void tr_cpu_share_free_all(tr_cpu_ctx *ctx);
// Guarded mode: the op table whose entries open the memory around the real op after checking
// that every pointer argument is backend memory; a violation prints what and aborts (it is
// a bug in the caller, never bad input).
extern const tr_ops tr_cpu_guarded_ops;
void tr_cpu_guard_fail(const char *op, const char *what, const void *p);

void tr_cpu_matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                           const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags);
void tr_cpu_matmul_forward_add(tr_backend *be, float *out, const float *x, const void *in,
                               const void *w, const void *bias, int32_t T, int32_t IC,
                               int32_t OC);
void tr_cpu_matmul_backward(tr_backend *be, void *din, float *dw, float *dbias,
                            const void *dout, const void *in, const void *w, int32_t T,
                            int32_t IC, int32_t OC);

void tr_cpu_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                              const void *table, int32_t T, int32_t C);
void tr_cpu_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                               const int32_t *ids, int32_t T, int32_t C, void *scratch);
size_t tr_cpu_embedding_scratch_bytes(tr_backend *be, int32_t T);

void tr_cpu_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const float *in,
                            const void *w, float eps, int32_t T, int32_t C);
void tr_cpu_rmsnorm_backward(tr_backend *be, float *din, void *din_act, float *dw,
                             const void *dout, const float *in, const void *w,
                             const float *rstd, int32_t T, int32_t C);
void tr_cpu_head_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const void *in,
                                 const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                 int32_t ld);
void tr_cpu_head_rmsnorm_backward(tr_backend *be, void *din, float *dw, const void *dout,
                                  const void *in, const void *w, const float *rstd, int32_t T,
                                  int32_t H, int32_t D, int32_t ld);

void tr_cpu_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                         const float *inv_freq, int32_t T, int32_t H, int32_t D);
void tr_cpu_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D);
void tr_cpu_rope_kv_write(tr_backend *be, void *x, const void *v, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, const tr_kv_pages *kv,
                          const int32_t *slot);
void tr_cpu_attention_decode_rope(tr_backend *be, void *out, void *x, const void *v, int32_t ld,
                                  const int32_t *pos, const float *inv_freq,
                                  const tr_kv_pages *kv, const int32_t *slot,
                                  const int32_t *block_table, int32_t max_blocks,
                                  const int32_t *seq_len, int32_t B, int32_t H);

void tr_cpu_attention_forward(tr_backend *be, void *out, float *lse, const void *q,
                              const void *k, const void *v, int32_t ld,
                              const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D);
void tr_cpu_attention_backward(tr_backend *be, void *dq, void *dk, void *dv, const void *dout,
                               const void *out, const float *lse, const void *q, const void *k,
                               const void *v, int32_t ld, const tr_doc_layout *docs, int32_t H,
                               int32_t KVH, int32_t D);
void tr_cpu_attention_decode(tr_backend *be, void *out, const void *q, int32_t ld,
                             const tr_kv_pages *kv, const int32_t *block_table,
                             int32_t max_blocks, const int32_t *seq_len, int32_t B, int32_t H);
void tr_cpu_kv_write(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot, const void *k,
                     const void *v, int32_t ld, int32_t T);

void tr_cpu_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I);
void tr_cpu_swiglu_backward(tr_backend *be, void *dgu, const void *dout, const void *gu,
                            int32_t T, int32_t I);

void tr_cpu_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                               const void *logits, const int32_t *target, int32_t T,
                               int32_t V);
// One row of the forward over x[V] of dtype t: lse = max + log sum exp(x - max), entropy
// (when not NULL) in double; the sample op calls it too, so its logprobs are the forward's
// bits.
void tr_cpu_logsoftmax_row(const void *x, tr_dt t, int32_t V, double *lse, double *entropy);
void tr_cpu_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                const float *dentropy, const void *logits, const float *lse,
                                const int32_t *target, int32_t T, int32_t V);

void tr_cpu_logsoftmax_vp_stats(tr_backend *be, double *stats, const void *logits,
                                const int32_t *target, int32_t v0, int32_t T, int32_t V);
void tr_cpu_logsoftmax_vp_combine(tr_backend *be, float *logprob, float *entropy, float *lse,
                                  double *mean, const double *stats, const int32_t *target,
                                  int32_t R, int32_t T);
void tr_cpu_logsoftmax_vp_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                   const float *dentropy, const void *logits, const float *lse,
                                   const double *mean, const int32_t *target, int32_t v0,
                                   int32_t T, int32_t V);

void tr_cpu_sumsq(tr_backend *be, double *acc, const float *x, size_t n);
void tr_cpu_adamw(tr_backend *be, const tr_adamw_args *a);

void tr_cpu_fill(tr_backend *be, float *x, float value, size_t n);
void tr_cpu_add(tr_backend *be, float *out, const float *a, const float *b, size_t n);
void tr_cpu_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                        int32_t n, size_t row_bytes);
void tr_cpu_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                         int32_t n, size_t row_bytes);
void tr_cpu_decode_rows(tr_backend *be, const tr_decode_rows_args *a);
void tr_cpu_kv_copy_blocks(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                           const int32_t *dst, const int32_t *n_slots, int32_t n);
void tr_cpu_convert(tr_backend *be, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                    size_t n);

// Sampling (sample.c; the per-row arithmetic is kernels/cpu/sample.h's).
void tr_cpu_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                   const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                   int32_t *n_near);
size_t tr_cpu_sample_scratch_bytes(tr_backend *be, int32_t B, int32_t V);
void tr_cpu_sample_vp_top(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                          int32_t B, int32_t V, int32_t k, void *scratch);
void tr_cpu_sample_vp_scan(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                           const tr_sample_row *rows, const tr_sample_cand *cand,
                           const double *carry, const double *total, int32_t R, int32_t k,
                           int32_t v0, int32_t B, int32_t V);
void tr_cpu_sample_vp_pick(tr_backend *be, int32_t *ids, int32_t *n_near,
                           const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                           const tr_sample_row *rows, int32_t R, int32_t k, int32_t B, int32_t V,
                           void *scratch);
size_t tr_cpu_sample_vp_scratch_bytes(tr_backend *be, int32_t B, int32_t V, size_t n_cand);
