// Guarded mode of the CPU backend (TROUPE_CPU_GUARD=1), the CPU stand-in for a GPU's separate
// memory: backend allocations are PROT_NONE mappings (memory.c) that only an op opens, so a
// host read or write of engine memory outside a backend call faults, and every pointer an op
// is handed must lie in a backend allocation, as device pointers must on a GPU. Each entry
// below checks its pointers (the bytes each buffer spans, from the backend's activation and
// weight dtypes and the row strides), opens the memory, runs the real op and closes it again.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/cpu.h"
#include "kernels/decode_rows.h"

void tr_cpu_guard_fail(const char *op, const char *what, const void *p) {
    fprintf(stderr, "troupe: guarded CPU memory: %s: %s (%p)\n", op, what, p);
    abort();
}

static void guard_protect(tr_cpu_ctx *ctx, int prot) {
    for (int32_t i = 0; i < ctx->n_regions; i++)
        if (mprotect(ctx->regions[i].base, ctx->regions[i].bytes, prot) != 0)
            tr_cpu_guard_fail("mprotect", "cannot change a region's protection",
                              ctx->regions[i].base);
}

static void open_mem(tr_backend *be) {
    tr_cpu_ctx *ctx = be->ctx;
    if (ctx->guard_open++ == 0) guard_protect(ctx, PROT_READ | PROT_WRITE);
}

static void close_mem(tr_backend *be) {
    tr_cpu_ctx *ctx = be->ctx;
    if (--ctx->guard_open == 0) guard_protect(ctx, PROT_NONE);
}

// The region holding [p, p + bytes), or NULL.
static const tr_cpu_region *region_of(tr_backend *be, const void *p, size_t bytes) {
    tr_cpu_ctx *ctx = be->ctx;
    const char *c = p;
    for (int32_t i = 0; i < ctx->n_regions; i++) {
        const char *b = ctx->regions[i].base;
        if (c >= b && c + bytes <= b + ctx->regions[i].bytes) return &ctx->regions[i];
    }
    return NULL;
}

// dev: backend memory of at least `bytes` (NULL only when optional).
static void dev(tr_backend *be, const void *p, size_t bytes, int optional, const char *op,
                const char *arg) {
    if (!p && optional) return;
    if (!p || !region_of(be, p, bytes)) {
        char what[160];
        snprintf(what, sizeof what, "%s (%zu bytes) is not backend memory%s", arg, bytes,
                 p && region_of(be, p, 1) ? " in full (it runs past its allocation)" : "");
        tr_cpu_guard_fail(op, what, p);
    }
}

static void host(tr_backend *be, const void *p, const char *op, const char *arg) {
    if (region_of(be, p, 1)) {
        char what[160];
        snprintf(what, sizeof what, "%s must be host memory, not backend memory", arg);
        tr_cpu_guard_fail(op, what, p);
    }
}

#define F sizeof(float)
#define I sizeof(int32_t)

// Bytes of an activation (A) or working-weight (W) buffer of n elements.
static size_t A_(tr_backend *be, size_t n) { return n * tr_dt_size(be->act); }
static size_t W_(tr_backend *be, size_t n) { return n * tr_dt_size(be->wt); }

// Elements spanned by n rows of `width` elements, ld apart: the last row ends the view.
static size_t strided(int64_t n, int64_t ld, int64_t width) {
    return n > 0 && width > 0 ? (size_t)((n - 1) * ld + width) : 0;
}

// A row stride below the row's width would make rows overlap.
static void ld_ok(int64_t ld, int64_t width, const char *op) {
    if (ld < width) {
        char what[160];
        snprintf(what, sizeof what, "row stride ld = %lld is below the row width %lld",
                 (long long)ld, (long long)width);
        tr_cpu_guard_fail(op, what, NULL);
    }
}

static void docs_dev(tr_backend *be, const tr_doc_layout *d, const char *op) {
    host(be, d, op, "docs");
    dev(be, d->doc_start, (size_t)(d->n_docs + 1) * I, 0, op, "docs.doc_start");
    dev(be, d->pos, (size_t)d->n_tokens * I, 0, op, "docs.pos");
    if (d->prefix) dev(be, d->prefix, (size_t)d->n_docs * I, 0, op, "docs.prefix");
}

static void g_upload(tr_backend *be, void *dst, const void *src, size_t bytes) {
    dev(be, dst, bytes, 0, "upload", "dst");
    host(be, src, "upload", "src");
    open_mem(be);
    tr_cpu_upload(be, dst, src, bytes);
    close_mem(be);
}

static void g_download(tr_backend *be, void *dst, const void *src, size_t bytes) {
    dev(be, src, bytes, 0, "download", "src");
    host(be, dst, "download", "dst");
    open_mem(be);
    tr_cpu_upload(be, dst, src, bytes);
    close_mem(be);
}

static void g_copy(tr_backend *be, void *dst, const void *src, size_t bytes) {
    dev(be, dst, bytes, 0, "copy", "dst");
    dev(be, src, bytes, 0, "copy", "src");
    open_mem(be);
    tr_cpu_upload(be, dst, src, bytes);
    close_mem(be);
}

static void g_copy_2d(tr_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                      size_t row_bytes, size_t rows) {
    if (!rows || !row_bytes) return;
    ld_ok((int64_t)dst_pitch, (int64_t)row_bytes, "copy_2d");
    ld_ok((int64_t)src_pitch, (int64_t)row_bytes, "copy_2d");
    dev(be, dst, strided((int64_t)rows, (int64_t)dst_pitch, (int64_t)row_bytes), 0, "copy_2d", "dst");
    dev(be, src, strided((int64_t)rows, (int64_t)src_pitch, (int64_t)row_bytes), 0, "copy_2d", "src");
    open_mem(be);
    tr_cpu_copy_2d(be, dst, dst_pitch, src, src_pitch, row_bytes, rows);
    close_mem(be);
}

static void g_matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                             const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags) {
    const char *op = "matmul_forward";
    if (flags & ~TR_MM_OUT_F32) tr_cpu_guard_fail(op, "unknown flags", out);
    size_t nout = (size_t)T * OC;
    dev(be, out, flags & TR_MM_OUT_F32 ? nout * F : A_(be, nout), 0, op, "out");
    dev(be, in, A_(be, (size_t)T * IC), 0, op, "in");
    dev(be, w, W_(be, (size_t)OC * IC), 0, op, "w");
    dev(be, bias, W_(be, (size_t)OC), 1, op, "bias");
    open_mem(be);
    tr_cpu_matmul_forward(be, out, in, w, bias, T, IC, OC, flags);
    close_mem(be);
}

static void g_matmul_forward_add(tr_backend *be, float *out, const float *x, const void *in,
                                 const void *w, const void *bias, int32_t T, int32_t IC,
                                 int32_t OC) {
    const char *op = "matmul_forward_add";
    size_t nout = (size_t)T * OC;
    if (out != x && out < x + nout && x < out + nout)
        tr_cpu_guard_fail(op, "out overlaps x without being x", out);
    dev(be, out, nout * F, 0, op, "out");
    dev(be, x, nout * F, 0, op, "x");
    dev(be, in, A_(be, (size_t)T * IC), 0, op, "in");
    dev(be, w, W_(be, (size_t)OC * IC), 0, op, "w");
    dev(be, bias, W_(be, (size_t)OC), 1, op, "bias");
    open_mem(be);
    tr_cpu_matmul_forward_add(be, out, x, in, w, bias, T, IC, OC);
    close_mem(be);
}

static void g_matmul_backward(tr_backend *be, void *din, float *dw, float *dbias,
                              const void *dout, const void *in, const void *w, int32_t T,
                              int32_t IC, int32_t OC) {
    const char *op = "matmul_backward";
    dev(be, din, A_(be, (size_t)T * IC), 1, op, "din");
    dev(be, dw, (size_t)OC * IC * F, 1, op, "dw");
    dev(be, dbias, (size_t)OC * F, 1, op, "dbias");
    dev(be, dout, A_(be, (size_t)T * OC), 0, op, "dout");
    dev(be, in, A_(be, (size_t)T * IC), !dw, op, "in");   // read only for dw
    dev(be, w, W_(be, (size_t)OC * IC), !din, op, "w");   // read only for din
    open_mem(be);
    tr_cpu_matmul_backward(be, din, dw, dbias, dout, in, w, T, IC, OC);
    close_mem(be);
}

static void g_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                                const void *table, int32_t T, int32_t C) {
    const char *op = "embedding_forward";
    dev(be, out, (size_t)T * C * F, 0, op, "out");
    dev(be, ids, (size_t)T * I, 0, op, "ids");
    dev(be, table, W_(be, 1), 0, op, "table");
    open_mem(be);
    tr_cpu_embedding_forward(be, out, ids, table, T, C);
    close_mem(be);
}

static void g_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                                 const int32_t *ids, int32_t T, int32_t C, void *scratch) {
    const char *op = "embedding_backward";
    dev(be, dtable, F, 0, op, "dtable");
    dev(be, dout, (size_t)T * C * F, 0, op, "dout");
    dev(be, ids, (size_t)T * I, 0, op, "ids");
    dev(be, scratch, tr_cpu_embedding_scratch_bytes(be, T), 1, op, "scratch");
    open_mem(be);
    tr_cpu_embedding_backward(be, dtable, dout, ids, T, C, scratch);
    close_mem(be);
}

static void g_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const float *in,
                              const void *w, float eps, int32_t T, int32_t C) {
    const char *op = "rmsnorm_forward";
    dev(be, out, A_(be, (size_t)T * C), 0, op, "out");
    dev(be, rstd, (size_t)T * F, 0, op, "rstd");
    dev(be, in, (size_t)T * C * F, 0, op, "in");
    dev(be, w, W_(be, (size_t)C), 0, op, "w");
    open_mem(be);
    tr_cpu_rmsnorm_forward(be, out, rstd, in, w, eps, T, C);
    close_mem(be);
}

static void g_rmsnorm_backward(tr_backend *be, float *din, void *din_act, float *dw,
                               const void *dout, const float *in, const void *w,
                               const float *rstd, int32_t T, int32_t C) {
    const char *op = "rmsnorm_backward";
    dev(be, din, (size_t)T * C * F, 0, op, "din");
    dev(be, din_act, A_(be, (size_t)T * C), 1, op, "din_act");
    dev(be, dw, (size_t)C * F, 1, op, "dw");
    dev(be, dout, A_(be, (size_t)T * C), 0, op, "dout");
    dev(be, in, (size_t)T * C * F, 0, op, "in");
    dev(be, w, W_(be, (size_t)C), 0, op, "w");
    dev(be, rstd, (size_t)T * F, 0, op, "rstd");
    open_mem(be);
    tr_cpu_rmsnorm_backward(be, din, din_act, dw, dout, in, w, rstd, T, C);
    close_mem(be);
}

static void g_head_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const void *in,
                                   const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                   int32_t ld) {
    const char *op = "head_rmsnorm_forward";
    size_t rows = A_(be, strided(T, ld, (int64_t)H * D));
    ld_ok(ld, (int64_t)H * D, op);
    dev(be, out, rows, 0, op, "out");
    dev(be, rstd, (size_t)T * H * F, 0, op, "rstd");
    dev(be, in, rows, 0, op, "in");
    dev(be, w, W_(be, (size_t)D), 0, op, "w");
    open_mem(be);
    tr_cpu_head_rmsnorm_forward(be, out, rstd, in, w, eps, T, H, D, ld);
    close_mem(be);
}

static void g_head_rmsnorm_backward(tr_backend *be, void *din, float *dw, const void *dout,
                                    const void *in, const void *w, const float *rstd,
                                    int32_t T, int32_t H, int32_t D, int32_t ld) {
    const char *op = "head_rmsnorm_backward";
    size_t rows = A_(be, strided(T, ld, (int64_t)H * D));
    ld_ok(ld, (int64_t)H * D, op);
    dev(be, din, rows, 1, op, "din");
    dev(be, dw, (size_t)D * F, 1, op, "dw");
    dev(be, dout, rows, 0, op, "dout");
    dev(be, in, rows, 0, op, "in");
    dev(be, w, W_(be, (size_t)D), 0, op, "w");
    dev(be, rstd, (size_t)T * H * F, 0, op, "rstd");
    open_mem(be);
    tr_cpu_head_rmsnorm_backward(be, din, dw, dout, in, w, rstd, T, H, D, ld);
    close_mem(be);
}

static void g_rope(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                   const float *inv_freq, int32_t T, int32_t H, int32_t D, int backward) {
    const char *op = backward ? "rope_backward" : "rope_forward";
    ld_ok(ld, (int64_t)H * D, op);
    dev(be, x, A_(be, strided(T, ld, (int64_t)H * D)), 0, op, "x");
    dev(be, pos, (size_t)T * I, 0, op, "pos");
    dev(be, inv_freq, (size_t)(D / 2) * F, 0, op, "inv_freq");
    open_mem(be);
    if (backward) tr_cpu_rope_backward(be, x, ld, pos, inv_freq, T, H, D);
    else tr_cpu_rope_forward(be, x, ld, pos, inv_freq, T, H, D);
    close_mem(be);
}

static void g_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                           const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    g_rope(be, x, ld, pos, inv_freq, T, H, D, 0);
}

static void g_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                            const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    g_rope(be, dx, ld, pos, inv_freq, T, H, D, 1);
}

static void g_attention_forward(tr_backend *be, void *out, float *lse, const void *q,
                                const void *k, const void *v, int32_t ld,
                                const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    const char *op = "attention_forward";
    docs_dev(be, docs, op);
    int64_t T = docs->n_tokens;
    ld_ok(ld, (int64_t)H * D, op);
    dev(be, out, A_(be, (size_t)T * H * D), 0, op, "out");
    dev(be, lse, (size_t)T * H * F, 0, op, "lse");
    dev(be, q, A_(be, strided(T, ld, (int64_t)H * D)), 0, op, "q");
    dev(be, k, A_(be, strided(T, ld, (int64_t)KVH * D)), 0, op, "k");
    dev(be, v, A_(be, strided(T, ld, (int64_t)KVH * D)), 0, op, "v");
    open_mem(be);
    tr_cpu_attention_forward(be, out, lse, q, k, v, ld, docs, H, KVH, D);
    close_mem(be);
}

static void g_attention_backward(tr_backend *be, void *dq, void *dk, void *dv,
                                 const void *dout, const void *out, const float *lse,
                                 const void *q, const void *k, const void *v, int32_t ld,
                                 const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    const char *op = "attention_backward";
    docs_dev(be, docs, op);
    int64_t T = docs->n_tokens;
    size_t qrows = A_(be, strided(T, ld, (int64_t)H * D));
    size_t kvrows = A_(be, strided(T, ld, (int64_t)KVH * D));
    ld_ok(ld, (int64_t)H * D, op);
    dev(be, dq, qrows, 1, op, "dq");
    dev(be, dk, kvrows, 1, op, "dk");
    dev(be, dv, kvrows, 1, op, "dv");
    dev(be, dout, A_(be, (size_t)T * H * D), 0, op, "dout");
    dev(be, out, A_(be, (size_t)T * H * D), 0, op, "out");
    dev(be, lse, (size_t)T * H * F, 0, op, "lse");
    dev(be, q, qrows, 0, op, "q");
    dev(be, k, kvrows, 0, op, "k");
    dev(be, v, kvrows, 0, op, "v");
    open_mem(be);
    tr_cpu_attention_backward(be, dq, dk, dv, dout, out, lse, q, k, v, ld, docs, H, KVH, D);
    close_mem(be);
}

static void kv_pages_dev(tr_backend *be, const tr_kv_pages *kv, const char *op) {
    host(be, kv, op, "kv");
    size_t pool = A_(be, (size_t)kv->n_blocks * kv->block_size * kv->n_kv_heads * kv->head_dim);
    dev(be, kv->k_pool, pool, 0, op, "kv.k_pool");
    dev(be, kv->v_pool, pool, 0, op, "kv.v_pool");
}

static void g_attention_decode(tr_backend *be, void *out, const void *q, int32_t ld,
                               const tr_kv_pages *kv, const int32_t *block_table,
                               int32_t max_blocks, const int32_t *seq_len, int32_t B,
                               int32_t H) {
    const char *op = "attention_decode";
    kv_pages_dev(be, kv, op);
    int64_t HD = (int64_t)H * kv->head_dim;
    size_t nb = (size_t)(B > 0 ? B : 0);
    ld_ok(ld, HD, op);
    dev(be, out, A_(be, nb * (size_t)HD), 0, op, "out");
    dev(be, q, A_(be, strided(B, ld, HD)), 0, op, "q");
    dev(be, seq_len, nb * I, 0, op, "seq_len");
    open_mem(be);
    // Row b reads entries b * max_blocks + j for the blocks its length covers: within its own
    // row of the table, or, with max_blocks 0 (a prefill's rows sharing one sequence's table),
    // within that one table. The table must hold the furthest entry any row reads.
    size_t furthest = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t n = seq_len[b], used = (n + kv->block_size - 1) / kv->block_size;
        if (n < 0 || (max_blocks > 0 && used > max_blocks)) {
            char what[160];
            snprintf(what, sizeof what, "sequence %d has %d tokens, more than %d blocks hold",
                     b, n, max_blocks);
            tr_cpu_guard_fail(op, what, seq_len);
        }
        size_t end = (size_t)b * (size_t)max_blocks + (size_t)used;
        if (end > furthest) furthest = end;
    }
    dev(be, block_table, furthest * I, 0, op, "block_table");
    // On a GPU a block id outside the pool reads another allocation or faults.
    for (int32_t b = 0; b < B; b++) {
        int32_t n = seq_len[b], used = (n + kv->block_size - 1) / kv->block_size;
        for (int32_t i = 0; i < used; i++) {
            int32_t blk = block_table[(size_t)b * max_blocks + i];
            if (blk < 0 || blk >= kv->n_blocks) {
                char what[160];
                snprintf(what, sizeof what, "sequence %d's block %d is %d, outside a pool of "
                         "%d blocks", b, i, blk, kv->n_blocks);
                tr_cpu_guard_fail(op, what, block_table);
            }
        }
    }
    tr_cpu_attention_decode(be, out, q, ld, kv, block_table, max_blocks, seq_len, B, H);
    close_mem(be);
}

static void distinct(const int32_t *idx, int32_t n, const char *op);

static void g_kv_write(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot,
                       const void *k, const void *v, int32_t ld, int32_t T) {
    const char *op = "kv_write";
    kv_pages_dev(be, kv, op);
    int64_t width = (int64_t)kv->n_kv_heads * kv->head_dim;
    ld_ok(ld, width, op);
    size_t nt = (size_t)(T > 0 ? T : 0);
    dev(be, slot, nt * I, T <= 0, op, "slot");
    dev(be, k, A_(be, strided(T, ld, width)), T <= 0, op, "k");
    dev(be, v, A_(be, strided(T, ld, width)), T <= 0, op, "v");
    open_mem(be);
    int64_t n_slots = (int64_t)kv->n_blocks * kv->block_size;
    int32_t padding = 0;
    for (int32_t t = 0; t < T; t++) {
        if (slot[t] < 0) padding++;   // writes nothing
        if (slot[t] < -1 || slot[t] >= n_slots) {
            char what[160];
            snprintf(what, sizeof what, "slot[%d] = %d is outside a pool of %lld slots", t,
                     slot[t], (long long)n_slots);
            tr_cpu_guard_fail(op, what, slot);
        }
    }
    // Padding rows (-1) may repeat; written slots may not.
    if (T > 1 && padding < 2) distinct(slot, T, op);
    tr_cpu_kv_write(be, kv, slot, k, v, ld, T);
    close_mem(be);
}

// Checked as the two ops it equals, each under its own name.
static void g_rope_kv_write(tr_backend *be, void *x, const void *v, int32_t ld,
                            const int32_t *pos, const float *inv_freq, int32_t T, int32_t H,
                            const tr_kv_pages *kv, const int32_t *slot) {
    const int32_t D = kv->head_dim;
    g_rope(be, x, ld, pos, inv_freq, T, H + kv->n_kv_heads, D, 0);
    g_kv_write(be, kv, slot, (const char *)x + (size_t)H * D * tr_dt_size(be->act), v, ld, T);
}

// Checked as the two ops it equals, each under its own name.
static void g_attention_decode_rope(tr_backend *be, void *out, void *x, const void *v,
                                    int32_t ld, const int32_t *pos, const float *inv_freq,
                                    const tr_kv_pages *kv, const int32_t *slot,
                                    const int32_t *block_table, int32_t max_blocks,
                                    const int32_t *seq_len, int32_t B, int32_t H) {
    g_rope_kv_write(be, x, v, ld, pos, inv_freq, B, H, kv, slot);
    g_attention_decode(be, out, x, ld, kv, block_table, max_blocks, seq_len, B, H);
}

static void g_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t n) {
    const char *op = "swiglu_forward";
    dev(be, out, A_(be, (size_t)T * n), 0, op, "out");
    dev(be, gu, A_(be, (size_t)T * 2 * n), 0, op, "gu");
    open_mem(be);
    tr_cpu_swiglu_forward(be, out, gu, T, n);
    close_mem(be);
}

static void g_swiglu_backward(tr_backend *be, void *dgu, const void *dout, const void *gu,
                              int32_t T, int32_t n) {
    const char *op = "swiglu_backward";
    dev(be, dgu, A_(be, (size_t)T * 2 * n), 0, op, "dgu");
    dev(be, dout, A_(be, (size_t)T * n), 0, op, "dout");
    dev(be, gu, A_(be, (size_t)T * 2 * n), 0, op, "gu");
    open_mem(be);
    tr_cpu_swiglu_backward(be, dgu, dout, gu, T, n);
    close_mem(be);
}

static void g_add(tr_backend *be, float *out, const float *a, const float *b, size_t n) {
    dev(be, out, n * F, 0, "add", "out");
    dev(be, a, n * F, 0, "add", "a");
    dev(be, b, n * F, 0, "add", "b");
    open_mem(be);
    tr_cpu_add(be, out, a, b, n);
    close_mem(be);
}

static void g_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                                 const void *logits, const int32_t *target, int32_t T,
                                 int32_t V) {
    const char *op = "logsoftmax_forward";
    dev(be, logprob, (size_t)T * F, 1, op, "logprob");
    dev(be, entropy, (size_t)T * F, 1, op, "entropy");
    dev(be, lse, (size_t)T * F, 0, op, "lse");
    dev(be, logits, A_(be, (size_t)T * V), 0, op, "logits");
    dev(be, target, (size_t)T * I, 0, op, "target");
    open_mem(be);
    tr_cpu_logsoftmax_forward(be, logprob, entropy, lse, logits, target, T, V);
    close_mem(be);
}

static void g_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                  const float *dentropy, const void *logits, const float *lse,
                                  const int32_t *target, int32_t T, int32_t V) {
    const char *op = "logsoftmax_backward";
    dev(be, dlogits, A_(be, (size_t)T * V), 0, op, "dlogits");
    dev(be, dlogprob, (size_t)T * F, 1, op, "dlogprob");
    dev(be, dentropy, (size_t)T * F, 1, op, "dentropy");
    dev(be, logits, A_(be, (size_t)T * V), 0, op, "logits");
    dev(be, lse, (size_t)T * F, 0, op, "lse");
    dev(be, target, (size_t)T * I, 0, op, "target");
    open_mem(be);
    tr_cpu_logsoftmax_backward(be, dlogits, dlogprob, dentropy, logits, lse, target, T, V);
    close_mem(be);
}

static void g_logsoftmax_vp_stats(tr_backend *be, double *stats, const void *logits,
                                  const int32_t *target, int32_t v0, int32_t T, int32_t V) {
    const char *op = "logsoftmax_vp_stats";
    dev(be, stats, (size_t)T * 4 * sizeof(double), 0, op, "stats");
    dev(be, logits, A_(be, (size_t)T * V), 0, op, "logits");
    dev(be, target, (size_t)T * I, 0, op, "target");
    open_mem(be);
    tr_cpu_logsoftmax_vp_stats(be, stats, logits, target, v0, T, V);
    close_mem(be);
}

static void g_logsoftmax_vp_combine(tr_backend *be, float *logprob, float *entropy, float *lse,
                                    double *mean, const double *stats, const int32_t *target,
                                    int32_t R, int32_t T) {
    const char *op = "logsoftmax_vp_combine";
    dev(be, logprob, (size_t)T * F, 1, op, "logprob");
    dev(be, entropy, (size_t)T * F, 1, op, "entropy");
    dev(be, lse, (size_t)T * F, 0, op, "lse");
    dev(be, mean, (size_t)T * sizeof(double), 1, op, "mean");
    dev(be, stats, (size_t)R * T * 4 * sizeof(double), 0, op, "stats");
    dev(be, target, (size_t)T * I, 0, op, "target");
    open_mem(be);
    tr_cpu_logsoftmax_vp_combine(be, logprob, entropy, lse, mean, stats, target, R, T);
    close_mem(be);
}

static void g_logsoftmax_vp_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                     const float *dentropy, const void *logits,
                                     const float *lse, const double *mean,
                                     const int32_t *target, int32_t v0, int32_t T, int32_t V) {
    const char *op = "logsoftmax_vp_backward";
    dev(be, dlogits, A_(be, (size_t)T * V), 0, op, "dlogits");
    dev(be, dlogprob, (size_t)T * F, 1, op, "dlogprob");
    dev(be, dentropy, (size_t)T * F, 1, op, "dentropy");
    dev(be, logits, A_(be, (size_t)T * V), 0, op, "logits");
    dev(be, lse, (size_t)T * F, 0, op, "lse");
    dev(be, mean, (size_t)T * sizeof(double), !dentropy, op, "mean");
    dev(be, target, (size_t)T * I, 0, op, "target");
    open_mem(be);
    tr_cpu_logsoftmax_vp_backward(be, dlogits, dlogprob, dentropy, logits, lse, mean, target,
                                  v0, T, V);
    close_mem(be);
}

static void g_sumsq(tr_backend *be, double *acc, const float *x, size_t n) {
    dev(be, acc, sizeof(double), 0, "sumsq", "acc");
    dev(be, x, n * F, 0, "sumsq", "x");
    open_mem(be);
    tr_cpu_sumsq(be, acc, x, n);
    close_mem(be);
}

static void g_adamw(tr_backend *be, const tr_adamw_args *a) {
    const char *op = "adamw";
    host(be, a, op, "args");
    if (a->wt != TR_F32 && a->wt != TR_BF16) tr_cpu_guard_fail(op, "wt is not fp32 or bf16", a);
    size_t n = a->n, n_segs = (size_t)(a->n_segs > 0 ? a->n_segs : 0);
    if (n > 0 && n_segs == 0) tr_cpu_guard_fail(op, "no segments for a non-empty range", a);
    dev(be, a->p, n * F, 0, op, "p");
    dev(be, a->g, n * F, 0, op, "g");
    dev(be, a->m, n * F, 0, op, "m");
    dev(be, a->v, n * F, 0, op, "v");
    dev(be, a->work, n * tr_dt_size(a->wt), 1, op, "work");
    dev(be, a->segs, n_segs * sizeof(tr_adamw_seg), n == 0, op, "segs");
    dev(be, a->sumsq, sizeof(double), 0, op, "sumsq");
    open_mem(be);
    // The segments tile [0, n) in order: each starts where the last ended.
    uint64_t at = 0;
    for (size_t s = 0; s < n_segs; s++) {
        if (a->segs[s].begin != at || a->segs[s].end < a->segs[s].begin) {
            char what[160];
            snprintf(what, sizeof what, "segment %zu [%llu, %llu) does not start at %llu", s,
                     (unsigned long long)a->segs[s].begin, (unsigned long long)a->segs[s].end,
                     (unsigned long long)at);
            tr_cpu_guard_fail(op, what, a->segs);
        }
        at = a->segs[s].end;
    }
    if (n > 0 && at != n) {
        char what[160];
        snprintf(what, sizeof what, "segments end at %llu, not at n = %zu",
                 (unsigned long long)at, n);
        tr_cpu_guard_fail(op, what, a->segs);
    }
    tr_cpu_adamw(be, a);
    close_mem(be);
}

static void g_fill(tr_backend *be, float *x, float value, size_t n) {
    dev(be, x, n * F, 0, "fill", "x");
    open_mem(be);
    tr_cpu_fill(be, x, value, n);
    close_mem(be);
}

// With the memory open: every row idx[r] of base lies inside base's allocation, as it must
// on a GPU, where a row past the buffer is another allocation's memory or a fault.
static void rows_in(tr_backend *be, const void *base, const int32_t *idx, int32_t n,
                    size_t row_bytes, const char *op, const char *arg) {
    const tr_cpu_region *reg = region_of(be, base, 1);
    const char *end = (const char *)reg->base + reg->bytes;
    for (int32_t r = 0; r < n; r++)
        if (idx[r] < 0 || (size_t)(end - (const char *)base) / row_bytes <= (size_t)idx[r]) {
            char what[160];
            snprintf(what, sizeof what, "%s row %d (idx[%d]) lies outside its allocation", arg,
                     idx[r], r);
            tr_cpu_guard_fail(op, what, base);
        }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// With the memory open: scatter's targets are distinct, since on a GPU two rows written to
// one place land in any order.
static void distinct(const int32_t *idx, int32_t n, const char *op) {
    int32_t *s = malloc((size_t)n * sizeof *s);
    if (!s) tr_cpu_guard_fail(op, "no host memory to check idx for repeats", idx);
    memcpy(s, idx, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_i32);
    for (int32_t r = 1; r < n; r++)
        if (s[r] == s[r - 1]) {
            char what[160];
            snprintf(what, sizeof what, "idx repeats row %d", s[r]);
            free(s);
            tr_cpu_guard_fail(op, what, idx);
        }
    free(s);
}

static void g_rows(tr_backend *be, void *to, const void *from, const int32_t *idx, int32_t n,
                   size_t row_bytes, int scatter) {
    const char *op = scatter ? "scatter_rows" : "gather_rows";
    size_t all = (size_t)(n > 0 ? n : 0) * row_bytes, one = n > 0 ? row_bytes : 0;
    dev(be, to, scatter ? one : all, n <= 0, op, scatter ? "dst" : "out");
    dev(be, from, scatter ? all : one, n <= 0, op, scatter ? "rows" : "src");
    dev(be, idx, (size_t)(n > 0 ? n : 0) * I, n <= 0, op, "idx");
    open_mem(be);
    if (n > 0 && row_bytes > 0) rows_in(be, scatter ? to : from, idx, n, row_bytes, op,
                               scatter ? "dst" : "src");
    if (scatter && n > 1) distinct(idx, n, op);
    if (scatter) tr_cpu_scatter_rows(be, to, from, idx, n, row_bytes);
    else tr_cpu_gather_rows(be, to, from, idx, n, row_bytes);
    close_mem(be);
}

static void g_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                          int32_t n, size_t row_bytes) {
    g_rows(be, out, src, idx, n, row_bytes, 0);
}

static void g_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                           int32_t n, size_t row_bytes) {
    g_rows(be, dst, rows, idx, n, row_bytes, 1);
}

static void g_decode_rows(tr_backend *be, const tr_decode_rows_args *a) {
    const char *op = "decode_rows";
    const int32_t n = a->n, w = a->w, bs = a->bs;
    size_t rows = (size_t)(n > 0 ? n : 0) * I;
    dev(be, a->ids, rows, n <= 0, op, "ids");
    dev(be, a->pos, rows, n <= 0, op, "pos");
    dev(be, a->slot, rows, n <= 0, op, "slot");
    dev(be, a->len, rows, n <= 0, op, "len");
    dev(be, a->doc_start, rows + I, n <= 0, op, "doc_start");
    dev(be, a->emb_ids, rows, 1, op, "emb_ids");
    dev(be, a->drawn, rows, n <= 0, op, "drawn");
    dev(be, a->patch, I, n <= 0, op, "patch");
    dev(be, a->tables, rows * (size_t)(w > 0 ? w : 0), n <= 0, op, "tables");
    if (n <= 0) return;
    char what[160];
    if (w < 1 || bs < 1) {
        snprintf(what, sizeof what, "tables %d blocks wide of %d slots", w, bs);
        tr_cpu_guard_fail(op, what, a->tables);
    }
    open_mem(be);
    const int32_t *patch = a->patch;
    if (patch[0] < 0 || patch[0] > n) {
        snprintf(what, sizeof what, "%d patched rows of %d", patch[0], n);
        tr_cpu_guard_fail(op, what, patch);
    }
    dev(be, patch, (1 + 3 * (size_t)patch[0]) * I, 0, op, "patch");
    for (int32_t k = 0; k < patch[0]; k++) {
        int32_t r = patch[1 + 3 * k], prev = k > 0 ? patch[3 * k - 2] : -1;
        if (r <= prev || r >= n) {
            snprintf(what, sizeof what, "patch %d names row %d (rows ascending, under %d)", k,
                     r, n);
            tr_cpu_guard_fail(op, what, patch);
        }
    }
    // every row's position lands within its table row
    for (int32_t r = 0; r < n; r++) {
        int32_t k = tr_decode_patch_of(patch, r);
        int64_t p = k < 0 ? (int64_t)a->pos[r] + 1 : patch[3 + 3 * k];
        if (p < -1 || p / bs >= w) {
            snprintf(what, sizeof what, "row %d at position %lld, past a table of %d blocks of "
                     "%d", r, (long long)p, w, bs);
            tr_cpu_guard_fail(op, what, a->pos);
        }
    }
    tr_cpu_decode_rows(be, a);
    close_mem(be);
}

static void g_kv_copy_blocks(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                             const int32_t *dst, const int32_t *n_slots, int32_t n) {
    const char *op = "kv_copy_blocks";
    size_t pool_bytes = pool->layer_bytes * (size_t)pool->n_layers;
    size_t ni = (size_t)(n > 0 ? n : 0) * I;
    dev(be, pool->k, pool_bytes, 0, op, "pool.k");
    dev(be, pool->v, pool_bytes, 0, op, "pool.v");
    dev(be, src, ni, n <= 0, op, "src");
    dev(be, dst, ni, n <= 0, op, "dst");
    dev(be, n_slots, ni, n <= 0, op, "n_slots");
    open_mem(be);
    size_t block_bytes = (size_t)pool->block_size * pool->slot_bytes;
    size_t n_blocks = block_bytes ? pool->layer_bytes / block_bytes : 0;
    for (int32_t i = 0; i < n; i++)
        if (src[i] < 0 || (size_t)src[i] >= n_blocks || dst[i] < 0 ||
            (size_t)dst[i] >= n_blocks || n_slots[i] < 0 || n_slots[i] > pool->block_size) {
            char what[160];
            snprintf(what, sizeof what, "pair %d (block %d -> %d, %d slots) is outside a "
                     "pool of %zu blocks of %d slots", i, src[i], dst[i], n_slots[i], n_blocks,
                     pool->block_size);
            tr_cpu_guard_fail(op, what, pool->k);
        }
    // On a GPU the pairs run in any order: a block written by one pair and read or written
    // by another gives whichever order ran.
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < n; j++)
            if (j != i && (dst[i] == src[j] || dst[i] == dst[j])) {
                char what[160];
                snprintf(what, sizeof what, "pair %d writes block %d, which pair %d %s", i,
                         dst[i], j, dst[i] == src[j] ? "reads" : "writes too");
                tr_cpu_guard_fail(op, what, pool->k);
            }
    tr_cpu_kv_copy_blocks(be, pool, src, dst, n_slots, n);
    close_mem(be);
}

static void g_convert(tr_backend *be, void *out, tr_dt out_t, const void *in,
                      tr_dt in_t, size_t n) {
    const char *op = "convert";
    if (out_t != TR_F32 && out_t != TR_BF16)
        tr_cpu_guard_fail(op, "out_t is not fp32 or bf16", out);
    if (in_t != TR_F32 && in_t != TR_BF16 && in_t != TR_F16)
        tr_cpu_guard_fail(op, "in_t is not a dtype", in);
    dev(be, out, n * tr_dt_size(out_t), 0, op, "out");
    dev(be, in, n * tr_dt_size(in_t), 0, op, "in");
    open_mem(be);
    tr_cpu_convert(be, out, out_t, in, in_t, n);
    close_mem(be);
}

static void g_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                     const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                     int32_t *n_near) {
    const char *op = "sample";
    size_t nb = (size_t)(B > 0 ? B : 0);
    dev(be, ids, nb * I, 0, op, "ids");
    dev(be, logprob, nb * F, 0, op, "logprob");
    dev(be, logits, A_(be, nb * (size_t)(V > 0 ? V : 0)), 0, op, "logits");
    dev(be, rows, nb * sizeof(tr_sample_row), 0, op, "rows");
    dev(be, scratch, tr_cpu_sample_scratch_bytes(be, B, V), 0, op, "scratch");
    dev(be, n_near, I, 0, op, "n_near");
    open_mem(be);
    // a backend that trusts the hint would skip a row's ranking (rows is readable only now)
    for (int32_t b = 0; b < B && !ranked; b++)
        if (tr_sample_row_ranked(&rows[b], V))
            tr_cpu_guard_fail(op, "ranked false for a ranked row", rows + b);
    tr_cpu_sample(be, ids, logprob, logits, rows, B, V, ranked, scratch, n_near);
    close_mem(be);
}

// Vocab-parallel sampling: R ranks' lists of k candidates per row, gathered.
static size_t cand_bytes(int32_t R, int32_t B, int32_t k) {
    return (size_t)(R > 0 ? R : 0) * (size_t)(B > 0 ? B : 0) * (size_t)(k > 0 ? k : 0) *
           sizeof(tr_sample_cand);
}

static void g_sample_vp_top(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                            int32_t B, int32_t V, int32_t k, void *scratch) {
    const char *op = "sample_vp_top";
    size_t nb = (size_t)(B > 0 ? B : 0);
    dev(be, cand, cand_bytes(1, B, k), 0, op, "cand");
    dev(be, logits, nb * (size_t)(V > 0 ? V : 0) * F, 0, op, "logits");
    dev(be, scratch, tr_cpu_sample_vp_scratch_bytes(be, B, V, 0), 0, op, "scratch");
    open_mem(be);
    tr_cpu_sample_vp_top(be, cand, logits, v0, B, V, k, scratch);
    close_mem(be);
}

static void g_sample_vp_scan(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                             const tr_sample_row *rows, const tr_sample_cand *cand,
                             const double *carry, const double *total, int32_t R, int32_t k,
                             int32_t v0, int32_t B, int32_t V) {
    const char *op = "sample_vp_scan";
    size_t nb = (size_t)(B > 0 ? B : 0);
    dev(be, sum, nb * sizeof(double), 0, op, "sum");
    if (total) dev(be, hit, nb * 3 * I, 0, op, "hit");
    dev(be, logits, nb * (size_t)(V > 0 ? V : 0) * F, 0, op, "logits");
    dev(be, rows, nb * sizeof(tr_sample_row), 0, op, "rows");
    dev(be, cand, cand_bytes(R, B, k), 0, op, "cand");
    dev(be, carry, nb * sizeof(double), 1, op, "carry");
    dev(be, total, nb * sizeof(double), 1, op, "total");
    open_mem(be);
    tr_cpu_sample_vp_scan(be, sum, hit, logits, rows, cand, carry, total, R, k, v0, B, V);
    close_mem(be);
}

static void g_sample_vp_pick(tr_backend *be, int32_t *ids, int32_t *n_near,
                             const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                             const tr_sample_row *rows, int32_t R, int32_t k, int32_t B,
                             int32_t V, void *scratch) {
    const char *op = "sample_vp_pick";
    size_t nb = (size_t)(B > 0 ? B : 0), n_cand = cand_bytes(R, B, k) / sizeof(tr_sample_cand);
    dev(be, ids, nb * I, 0, op, "ids");
    dev(be, n_near, I, 0, op, "n_near");
    dev(be, cand, cand_bytes(R, B, k), 0, op, "cand");
    dev(be, hit, (size_t)(R > 0 ? R : 0) * nb * 3 * I, 1, op, "hit");
    dev(be, mass, nb * sizeof(double), 1, op, "mass");
    dev(be, rows, nb * sizeof(tr_sample_row), 0, op, "rows");
    dev(be, scratch, tr_cpu_sample_vp_scratch_bytes(be, B, 0, n_cand), 0, op, "scratch");
    open_mem(be);
    tr_cpu_sample_vp_pick(be, ids, n_near, cand, hit, mass, rows, R, k, B, V, scratch);
    close_mem(be);
}

const tr_ops tr_cpu_guarded_ops = {
    .name = "cpu",
    .alloc = tr_cpu_alloc,
    .free = tr_cpu_free,
    .alloc_host = tr_cpu_alloc_host,
    .free_host = tr_cpu_free_host,
    .upload = g_upload,
    .download = g_download,
    .copy = g_copy,
    .copy_2d = g_copy_2d,
    .sync = tr_cpu_sync,
    .mem_info = tr_cpu_mem_info,
    .matmul_forward = g_matmul_forward,
    .matmul_forward_add = g_matmul_forward_add,
    .matmul_backward = g_matmul_backward,
    .embedding_forward = g_embedding_forward,
    .embedding_backward = g_embedding_backward,
    .embedding_scratch_bytes = tr_cpu_embedding_scratch_bytes,
    .rmsnorm_forward = g_rmsnorm_forward,
    .rmsnorm_backward = g_rmsnorm_backward,
    .head_rmsnorm_forward = g_head_rmsnorm_forward,
    .head_rmsnorm_backward = g_head_rmsnorm_backward,
    .rope_forward = g_rope_forward,
    .rope_backward = g_rope_backward,
    .attention_forward = g_attention_forward,
    .attention_backward = g_attention_backward,
    .attention_decode = g_attention_decode,
    .kv_write = g_kv_write,
    .rope_kv_write = g_rope_kv_write,
    .attention_decode_rope = g_attention_decode_rope,
    .swiglu_forward = g_swiglu_forward,
    .swiglu_backward = g_swiglu_backward,
    .add = g_add,
    .logsoftmax_forward = g_logsoftmax_forward,
    .logsoftmax_backward = g_logsoftmax_backward,
    .logsoftmax_vp_stats = g_logsoftmax_vp_stats,
    .logsoftmax_vp_combine = g_logsoftmax_vp_combine,
    .logsoftmax_vp_backward = g_logsoftmax_vp_backward,
    .sumsq = g_sumsq,
    .adamw = g_adamw,
    .fill = g_fill,
    .gather_rows = g_gather_rows,
    .scatter_rows = g_scatter_rows,
    .kv_copy_blocks = g_kv_copy_blocks,
    .decode_rows = g_decode_rows,
    .convert = g_convert,
    .sample = g_sample,
    .sample_scratch_bytes = tr_cpu_sample_scratch_bytes,
    .sample_vp_top = g_sample_vp_top,
    .sample_vp_scan = g_sample_vp_scan,
    .sample_vp_pick = g_sample_vp_pick,
    .sample_vp_scratch_bytes = tr_cpu_sample_vp_scratch_bytes,
};
