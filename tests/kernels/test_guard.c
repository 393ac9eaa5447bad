// Guarded mode (kernels/cpu/guard.c) against every op of the table, in fp32 and bf16: each
// buffer sits at the very end of its backend allocation, so a size the guard computes too
// large (a wrong dtype size, a stride counted once too often) aborts, and the guarded op's
// results must be the bits the unguarded op gives on host copies. Then misuses the guard must
// stop, each in a child process that is expected to abort: buffers sized for the other
// precision, adding into a bf16 output, KV slots and blocks outside the pool or repeated,
// AdamW segments that do not tile the range, a row stride below the row width, a block copy
// running past its destination, decode rows patched out of order.
#include <signal.h>
#include <sys/wait.h>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/kernels_test.h"

static tr_backend hb, gb;   // unguarded (host arrays) and guarded (backend memory), same precision

// A buffer in both worlds: host contents h and a guarded copy d ending where its mapping ends.
typedef struct buf {
    void *h, *d, *base;
    size_t bytes;
} buf;

#define MAX_BUFS 16
static buf bufs[MAX_BUFS];
static int n_bufs;

static void *end_of_region(void *base, size_t bytes) {
    tr_cpu_ctx *ctx = gb.ctx;
    for (int32_t i = 0; i < ctx->n_regions; i++)
        if (ctx->regions[i].base == base) return (char *)base + ctx->regions[i].bytes - bytes;
    fprintf(stderr, "no region at %p\n", base);
    exit(1);
}

// A buffer of `bytes` holding init (random bytes when NULL).
static buf *mk(const void *init, size_t bytes) {
    buf *b = &bufs[n_bufs++];
    b->bytes = bytes;
    b->h = kt_malloc(bytes);
    if (init) memcpy(b->h, init, bytes);
    else
        for (size_t i = 0; i < bytes; i++)
            ((uint8_t *)b->h)[i] = (uint8_t)(kt_uniform() * 127.0 + 128);
    b->base = gb.ops->alloc(&gb, bytes ? bytes : 1);
    if (!b->base) exit(1);
    b->d = end_of_region(b->base, bytes);
    gb.ops->upload(&gb, b->d, b->h, bytes);
    return b;
}

// n values of dtype t: random fp32 of the given scale, rounded when t is bf16.
static buf *mk_vals(size_t n, tr_dt t, double scale) {
    float *x = kt_rand(n, scale);
    void *v = kt_to(x, n, t);
    buf *b = mk(v, n * tr_dt_size(t));
    free(x), free(v);
    return b;
}

static buf *mk_f(size_t n, double scale) { return mk_vals(n, TR_F32, scale); }

// Every buffer of the op: the guarded copy must hold the bytes the host copy holds; then all
// are freed for the next op.
static void done(const char *op) {
    char msg[256];
    CHECKF(gb.ops->sync(&gb, op, msg, sizeof msg) == 0, "%s: %s", op, msg);
    for (int i = 0; i < n_bufs; i++) {
        void *got = kt_malloc(bufs[i].bytes);
        gb.ops->download(&gb, got, bufs[i].d, bufs[i].bytes);
        CHECKF(memcmp(got, bufs[i].h, bufs[i].bytes) == 0, "%s (%s): guarded buffer %d differs",
               op, tr_dt_name(gb.act), i);
        free(got);
        gb.ops->free(&gb, bufs[i].base);
        free(bufs[i].h);
    }
    n_bufs = 0;
}

// Each op runs on hb (host arrays), then on gb (the guarded copies).
static tr_backend *next_be(tr_backend *be) { return be == &hb ? &gb : NULL; }

// The copies of the op's buffers, in the order they were made, that be works on.
static void **ptrs(const tr_backend *be) {
    static void *p[MAX_BUFS];
    for (int i = 0; i < n_bufs; i++) p[i] = be == &hb ? bufs[i].h : bufs[i].d;
    return p;
}

static void each_op(void) {
    tr_dt A = gb.act;
    size_t as = tr_dt_size(A);
    const int32_t T = 9, IC = 40, OC = 33, C = 24, H = 4, KVH = 2, D = 8, V = 50, I = 20;
    buf *x[MAX_BUFS];

    // matmul: each output mode
    for (int f32 = 0; f32 < 2; f32++) {
        x[0] = f32 ? mk_f((size_t)T * OC, 1.0) : mk_vals((size_t)T * OC, A, 1.0);
        x[1] = mk_vals((size_t)T * IC, A, 1.0);
        x[2] = mk_vals((size_t)OC * IC, A, 0.5);
        x[3] = mk_vals(OC, A, 1.0);
        for (tr_backend *be = &hb; be; be = next_be(be)) {
            void **p = ptrs(be);
            be->ops->matmul_forward(be, p[0], p[1], p[2], p[3], T, IC, OC,
                                    f32 ? TR_MM_OUT_F32 : 0);
        }
        done("matmul_forward");
    }
    // added into the residual stream: from x[1] into x[0], then x[1] in place
    x[0] = mk_f((size_t)T * OC, 1.0), x[1] = mk_f((size_t)T * OC, 1.0);
    x[2] = mk_vals((size_t)T * IC, A, 1.0), x[3] = mk_vals((size_t)OC * IC, A, 0.5);
    x[4] = mk_vals(OC, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->matmul_forward_add(be, p[0], p[1], p[2], p[3], p[4], T, IC, OC);
        be->ops->matmul_forward_add(be, p[1], p[1], p[2], p[3], p[4], T, IC, OC);
    }
    done("matmul_forward_add");
    x[0] = mk_vals((size_t)T * IC, A, 1.0), x[1] = mk_f((size_t)OC * IC, 1.0);
    x[2] = mk_f(OC, 1.0), x[3] = mk_vals((size_t)T * OC, A, 1.0);
    x[4] = mk_vals((size_t)T * IC, A, 1.0), x[5] = mk_vals((size_t)OC * IC, A, 0.5);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->matmul_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], T,
                                 IC, OC);
    }
    done("matmul_backward");

    // embedding
    int32_t ids[9] = {3, 1, 4, 1, 5, 9, 2, 6, 5};
    x[0] = mk_f((size_t)T * C, 1.0), x[1] = mk(ids, sizeof ids);
    x[2] = mk_vals((size_t)10 * C, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->embedding_forward(be, p[0], p[1], p[2], T, C);
    }
    done("embedding_forward");

    // rmsnorm and head_rmsnorm (rows of stride ld)
    x[0] = mk_vals((size_t)T * C, A, 1.0), x[1] = mk_f(T, 1.0), x[2] = mk_f((size_t)T * C, 2.0);
    x[3] = mk_vals(C, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->rmsnorm_forward(be, p[0], p[1], p[2], p[3], 1e-6f, T, C);
    }
    done("rmsnorm_forward");
    float rstd[64];
    for (int i = 0; i < 64; i++) rstd[i] = 0.5f + 0.01f * (float)i;
    x[0] = mk_f((size_t)T * C, 1.0), x[1] = mk_f(C, 1.0), x[2] = mk_vals((size_t)T * C, A, 1.0);
    x[3] = mk_f((size_t)T * C, 1.0), x[4] = mk_vals(C, A, 1.0), x[5] = mk(rstd, T * 4);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->rmsnorm_backward(be, p[0], NULL, p[1], p[2], p[3], p[4], p[5], T, C);
    }
    done("rmsnorm_backward");
    int32_t ld = H * D + 5;
    size_t rows = (size_t)(T - 1) * ld + (size_t)H * D;   // the last row ends the view
    x[0] = mk_vals(rows, A, 1.0), x[1] = mk_f((size_t)T * H, 1.0), x[2] = mk_vals(rows, A, 2.0);
    x[3] = mk_vals(D, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->head_rmsnorm_forward(be, p[0], p[1], p[2], p[3], 1e-6f, T, H, D, ld);
    }
    done("head_rmsnorm_forward");
    x[0] = mk_vals(rows, A, 1.0), x[1] = mk_f(D, 1.0), x[2] = mk_vals(rows, A, 1.0);
    x[3] = mk_vals(rows, A, 1.0), x[4] = mk_vals(D, A, 1.0), x[5] = mk(rstd, (size_t)T * H * 4);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->head_rmsnorm_backward(be, p[0], p[1], p[2], p[3], p[4], p[5],
                                       T, H, D, ld);
    }
    done("head_rmsnorm_backward");

    // rope on strided rows
    int32_t pos[9] = {0, 1, 2, 3, 0, 1, 2, 3, 4};
    float inv[4] = {1.0f, 0.1f, 0.01f, 0.001f};
    for (int back = 0; back < 2; back++) {
        x[0] = mk_vals(rows, A, 1.0), x[1] = mk(pos, sizeof pos), x[2] = mk(inv, sizeof inv);
        for (tr_backend *be = &hb; be; be = next_be(be)) {
            void **p = ptrs(be);
            if (back) be->ops->rope_backward(be, p[0], ld, p[1], p[2], T, H, D);
            else be->ops->rope_forward(be, p[0], ld, p[1], p[2], T, H, D);
        }
        done(back ? "rope_backward" : "rope_forward");
    }

    // attention over fused [q;k;v] rows with no gap: v's last row ends the buffer
    int32_t qkv_ld = (H + 2 * KVH) * D, ds[3] = {0, 4, 9};
    size_t nf = (size_t)T * qkv_ld, kat = (size_t)H * D * as, vat = (size_t)(H + KVH) * D * as;
    x[0] = mk_vals((size_t)T * H * D, A, 1.0), x[1] = mk_f((size_t)T * H, 1.0);
    x[2] = mk_vals(nf, A, 2.0), x[3] = mk(ds, sizeof ds), x[4] = mk(pos, sizeof pos);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_doc_layout docs = {.n_tokens = T, .n_docs = 2, .doc_start = p[3], .pos = p[4]};
        char *r = p[2];
        be->ops->attention_forward(be, p[0], p[1], r, r + kat, r + vat, qkv_ld, &docs, H,
                                   KVH, D);
    }
    buf *att_out = x[0], *att_lse = x[1], *att_rows = x[2];
    void *out_h = kt_malloc(att_out->bytes), *lse_h = kt_copy(att_lse->h, T * H);
    void *rows_h = kt_malloc(att_rows->bytes);
    memcpy(out_h, att_out->h, att_out->bytes), memcpy(rows_h, att_rows->h, att_rows->bytes);
    done("attention_forward");
    x[0] = mk_vals(nf, A, 1.0), x[1] = mk_vals((size_t)T * H * D, A, 1.0);
    x[2] = mk(out_h, (size_t)T * H * D * as), x[3] = mk(lse_h, (size_t)T * H * 4);
    x[4] = mk(rows_h, nf * as), x[5] = mk(ds, sizeof ds), x[6] = mk(pos, sizeof pos);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_doc_layout docs = {.n_tokens = T, .n_docs = 2, .doc_start = p[5], .pos = p[6]};
        char *g = p[0], *r = p[4];
        be->ops->attention_backward(be, g, g + kat, g + vat, p[1], p[2], p[3], r,
                                    r + kat, r + vat, qkv_ld, &docs, H, KVH, D);
    }
    done("attention_backward");
    free(out_h), free(lse_h), free(rows_h);

    // kv_write of the fused rows' k and v, then a decode over the pool
    const int32_t bs = 4, nb = 5;
    size_t pool = (size_t)nb * bs * KVH * D;
    int32_t slots[9] = {19, 0, 5, 6, 7, 12, 1, 2, 3}, table[6] = {1, 0, 3, 4, 2, 1};
    int32_t seq_len[2] = {7, 5};
    x[0] = mk_vals(pool, A, 1.0), x[1] = mk_vals(pool, A, 1.0), x[2] = mk(slots, sizeof slots);
    x[3] = mk_vals(nf, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_kv_pages kv = {.k_pool = p[0], .v_pool = p[1], .block_size = bs,
                          .n_blocks = nb, .n_kv_heads = KVH, .head_dim = D};
        char *r = p[3];
        be->ops->kv_write(be, &kv, p[2], r + kat, r + vat, qkv_ld, T);
    }
    done("kv_write");
    // the same rows rotated and written in one op (pos and inv_freq: rope's above)
    x[0] = mk_vals(pool, A, 1.0), x[1] = mk_vals(pool, A, 1.0), x[2] = mk(slots, sizeof slots);
    x[3] = mk_vals(nf, A, 1.0), x[4] = mk(pos, sizeof pos), x[5] = mk(inv, sizeof inv);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_kv_pages kv = {.k_pool = p[0], .v_pool = p[1], .block_size = bs,
                          .n_blocks = nb, .n_kv_heads = KVH, .head_dim = D};
        char *r = p[3];
        be->ops->rope_kv_write(be, r, r + vat, qkv_ld, p[4], p[5], T, H, &kv, p[2]);
    }
    done("rope_kv_write");
    int32_t qld = H * D + 3;
    x[0] = mk_vals(pool, A, 1.0), x[1] = mk_vals(pool, A, 1.0), x[2] = mk(table, sizeof table);
    x[3] = mk(seq_len, sizeof seq_len), x[4] = mk_vals((size_t)qld + (size_t)H * D, A, 1.0);
    x[5] = mk_vals((size_t)2 * H * D, A, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_kv_pages kv = {.k_pool = p[0], .v_pool = p[1], .block_size = bs,
                          .n_blocks = nb, .n_kv_heads = KVH, .head_dim = D};
        be->ops->attention_decode(be, p[5], p[4], qld, &kv, p[2], 3, p[3], 2, H);
    }
    done("attention_decode");

    // swiglu
    x[0] = mk_vals((size_t)T * I, A, 1.0), x[1] = mk_vals((size_t)T * 2 * I, A, 3.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->swiglu_forward(be, p[0], p[1], T, I);
    }
    done("swiglu_forward");
    x[0] = mk_vals((size_t)T * 2 * I, A, 1.0), x[1] = mk_vals((size_t)T * I, A, 1.0);
    x[2] = mk_vals((size_t)T * 2 * I, A, 3.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->swiglu_backward(be, p[0], p[1], p[2], T, I);
    }
    done("swiglu_backward");

    // add, in place as the residual stream takes it
    x[0] = mk_f((size_t)T * C, 1.0), x[1] = mk_f((size_t)T * C, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->add(be, p[0], p[0], p[1], (size_t)T * C);
    }
    done("add");

    // logsoftmax
    int32_t target[9] = {0, 49, -1, 7, 8, 9, 10, 11, 12};
    float lse_v[9];
    size_t lb = (size_t)T * V * as;   // logits are A
    x[0] = mk_f(T, 1.0), x[1] = mk_f(T, 1.0), x[2] = mk_f(T, 1.0);
    x[3] = mk_vals((size_t)T * V, A, 3.0), x[4] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_forward(be, p[0], p[1], p[2], p[3], p[4], T, V);
    }
    memcpy(lse_v, x[2]->h, sizeof lse_v);
    void *logits = kt_malloc(lb);
    memcpy(logits, x[3]->h, lb);
    done("logsoftmax_forward");
    x[0] = mk_vals((size_t)T * V, A, 1.0), x[1] = mk_f(T, 1.0), x[2] = mk_f(T, 1.0);
    x[3] = mk(logits, lb), x[4] = mk(lse_v, sizeof lse_v);
    x[5] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_backward(be, p[0], p[1], p[2], p[3], p[4], p[5],
                                     T, V);
    }
    done("logsoftmax_backward");
    // in place: dlogits written over the logits
    x[0] = mk(logits, lb), x[1] = mk_f(T, 1.0), x[2] = mk_f(T, 1.0);
    x[3] = mk(lse_v, sizeof lse_v), x[4] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_backward(be, p[0], p[1], p[2], p[0], p[3], p[4], T, V);
    }
    done("logsoftmax_backward in place");
    // Vocab-parallel: this rank's statistics (columns 20.. of a wider vocabulary), the
    // combination of two ranks', and the backward over its columns.
    double stats[2 * 9 * 4];
    x[0] = mk(NULL, sizeof stats / 2), x[1] = mk(logits, lb);
    x[2] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_vp_stats(be, p[0], p[1], p[2], 20, T, V);
    }
    memcpy(stats, x[0]->h, sizeof stats / 2);
    memcpy(stats + 9 * 4, x[0]->h, sizeof stats / 2);
    done("logsoftmax_vp_stats");
    double mean_v[9];
    x[0] = mk_f(T, 1.0), x[1] = mk_f(T, 1.0), x[2] = mk_f(T, 1.0), x[3] = mk(NULL, sizeof mean_v);
    x[4] = mk(stats, sizeof stats), x[5] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_vp_combine(be, p[0], p[1], p[2], p[3], p[4], p[5], 2, T);
    }
    memcpy(lse_v, x[2]->h, sizeof lse_v);
    memcpy(mean_v, x[3]->h, sizeof mean_v);
    done("logsoftmax_vp_combine");
    x[0] = mk_vals((size_t)T * V, A, 1.0), x[1] = mk_f(T, 1.0), x[2] = mk_f(T, 1.0);
    x[3] = mk(logits, lb), x[4] = mk(lse_v, sizeof lse_v);
    x[5] = mk(mean_v, sizeof mean_v), x[6] = mk(target, sizeof target);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->logsoftmax_vp_backward(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], 20, T, V);
    }
    done("logsoftmax_vp_backward");
    free(logits);

    // sumsq, then adamw reading it, with segments and a working copy of dtype W
    size_t n = 1000;
    double zero = 0.0;
    tr_adamw_seg segs[2] = {{0, 300, 0.1f, 0}, {300, n, 0.0f, 0}};
    x[0] = mk(&zero, sizeof zero), x[1] = mk_f(n, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->sumsq(be, p[0], p[1], n);
    }
    double ss;
    memcpy(&ss, x[0]->h, sizeof ss);
    done("sumsq");
    x[0] = mk_f(n, 1.0), x[1] = mk_vals(n, gb.wt, 1.0), x[2] = mk_f(n, 1.0);
    x[3] = mk_f(n, 0.1), x[4] = mk_vals(n, TR_F32, 0.0), x[5] = mk(segs, sizeof segs);
    x[6] = mk(&ss, sizeof ss);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        tr_adamw_args a = {.p = p[0], .work = p[1], .g = p[2], .m = p[3],
                           .v = p[4], .n = n, .segs = p[5], .n_segs = 2, .sumsq = p[6],
                           .max_norm = 1.0f, .lr = 1e-3f, .b1 = 0.9f, .b2 = 0.99f,
                           .eps = 1e-8f, .t = 2, .wt = gb.wt};
        be->ops->adamw(be, &a);
    }
    done("adamw");

    // copy_2d: 5 rows of 12 bytes out of rows 20 apart into rows 16 apart, both views ending
    // where their buffers end
    x[0] = mk(NULL, 4 * 16 + 12), x[1] = mk(NULL, 4 * 20 + 12);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->copy_2d(be, p[0], 16, p[1], 20, 12, 5);
    }
    done("copy_2d");

    // fill and convert (every pair of dtypes it takes)
    x[0] = mk_f(77, 1.0);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->fill(be, p[0], 0.5f, 77);
    }
    done("fill");
    static const tr_dt outs[] = {TR_F32, TR_BF16}, ins[] = {TR_F32, TR_BF16, TR_F16};
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 3; i++) {
            x[0] = mk(NULL, 77 * tr_dt_size(outs[o]));
            x[1] = mk(NULL, 77 * tr_dt_size(ins[i]));
            for (tr_backend *be = &hb; be; be = next_be(be)) {
                void **p = ptrs(be);
                be->ops->convert(be, p[0], outs[o], p[1], ins[i], 77);
            }
            done("convert");
        }

    // a decode step's rows: 5 rows of tables 3 blocks of 4 wide, rows 1 and 4 patched (4 as
    // padding), the rest continuing; embedding rows of the vocabulary slice [10, 40)
    {
        const int32_t pos[5] = {3, 7, 0, 10, 2}, drawn[5] = {5, 12, 39, 40, 9};
        const int32_t patch[7] = {2, 1, 33, 6, 4, 0, -1};
        int32_t tables[15];
        for (int32_t i = 0; i < 15; i++) tables[i] = 2 * i + 1;
        const size_t R = sizeof pos;   // a row's ints
        x[0] = mk(NULL, R), x[1] = mk(pos, R), x[2] = mk(NULL, R), x[3] = mk(NULL, R);
        x[4] = mk(NULL, R + sizeof(int32_t)), x[5] = mk(NULL, R), x[6] = mk(drawn, R);
        x[7] = mk(patch, sizeof patch), x[8] = mk(tables, sizeof tables);
        for (tr_backend *be = &hb; be; be = next_be(be)) {
            void **p = ptrs(be);
            be->ops->decode_rows(be, &(tr_decode_rows_args){
                                         .ids = p[0], .pos = p[1], .slot = p[2], .len = p[3],
                                         .doc_start = p[4], .emb_ids = p[5], .drawn = p[6],
                                         .patch = p[7], .tables = p[8], .w = 3, .bs = 4, .n = 5,
                                         .v0 = 10, .V = 30});
        }
        done("decode_rows");
    }

    // vocab-parallel sampling: this rank's lists of 4 (columns 20.. of a 2-rank vocabulary
    // of 100), its walk from a carried sum, and the pick over both ranks' (the same lists)
    enum { K = 4, R = 2 };
    tr_sample_row srows[9];
    for (int32_t b = 0; b < T; b++)
        srows[b] = (tr_sample_row){.temperature = b % 3 ? 1.0f : 0.0f, .top_k = b % 3 == 2 ? 3 : 0,
                                   .top_p = b % 4 == 1 ? 0.5f : 1.0f, .seed = (uint64_t)b, .used = 4};
    float *slg = kt_rand((size_t)T * V, 3.0);
    tr_sample_cand lists[R * 9 * K];
    x[0] = mk(NULL, sizeof lists / R), x[1] = mk(slg, (size_t)T * V * 4);
    x[2] = mk(NULL, gb.ops->sample_vp_scratch_bytes(&gb, T, V, 0));
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->sample_vp_top(be, p[0], p[1], 20, T, V, K, p[2]);
    }
    memcpy(lists, x[0]->h, sizeof lists / R);
    memcpy(lists + T * K, x[0]->h, sizeof lists / R);
    done("sample_vp_top");
    double carry[9], total[9];
    int32_t hits[R * 9 * 3];
    for (int32_t b = 0; b < T; b++) carry[b] = 2.0, total[b] = 40.0;
    x[0] = mk(NULL, sizeof carry), x[1] = mk(NULL, sizeof hits / R), x[2] = mk(slg, (size_t)T * V * 4);
    x[3] = mk(srows, sizeof srows), x[4] = mk(lists, sizeof lists), x[5] = mk(carry, sizeof carry);
    x[6] = mk(total, sizeof total);
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->sample_vp_scan(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], R, K, 20, T, V);
    }
    memcpy(hits, x[1]->h, sizeof hits / R);
    memcpy(hits + T * 3, x[1]->h, sizeof hits / R);
    done("sample_vp_scan");
    int32_t no_near = 0;
    x[0] = mk(NULL, (size_t)T * I), x[1] = mk(&no_near, sizeof no_near), x[2] = mk(lists, sizeof lists);
    x[3] = mk(hits, sizeof hits), x[4] = mk(total, sizeof total), x[5] = mk(srows, sizeof srows);
    x[6] = mk(NULL, gb.ops->sample_vp_scratch_bytes(&gb, T, 0, (size_t)R * T * K));
    for (tr_backend *be = &hb; be; be = next_be(be)) {
        void **p = ptrs(be);
        be->ops->sample_vp_pick(be, p[0], p[1], p[2], p[3], p[4], p[5], R, K, T, 100, p[6]);
    }
    done("sample_vp_pick");
    free(slg);
}

// Whether fn(arg) aborts in a child process (its stderr, the guard's message, discarded).
static int aborts(void (*fn)(void)) {
    fflush(stdout), fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

// The misuses, on the guarded backend gb (its precision as each names).
// An A output of 8 x 16 elements given `bytes` at the end of its allocation.
static void rmsnorm_out_bytes(size_t bytes) {
    void *out = gb.ops->alloc(&gb, bytes), *rstd = gb.ops->alloc(&gb, 8 * 4);
    void *in = gb.ops->alloc(&gb, 8 * 16 * 4), *w = gb.ops->alloc(&gb, 16 * 4);
    gb.ops->rmsnorm_forward(&gb, end_of_region(out, bytes), rstd, in, w, 1e-6f, 8, 16);
}

static void bad_out_short(void) { rmsnorm_out_bytes((8 * 16 - 1) * tr_dt_size(gb.act)); }
static void bad_out_bf16(void) { rmsnorm_out_bytes(8 * 16 * 2); }   // fp32 mode: too small

static void bad_logits_bf16(void) {   // fp32 mode: logits sized for bf16
    void *lp = gb.ops->alloc(&gb, 4 * 4), *lse = gb.ops->alloc(&gb, 4 * 4);
    int32_t *tg = gb.ops->alloc(&gb, 4 * 4);
    void *x = gb.ops->alloc(&gb, 4 * 16 * 2);
    gb.ops->logsoftmax_forward(&gb, lp, NULL, lse, end_of_region(x, 4 * 16 * 2), tg, 4, 16);
}

static void bad_f32_out(void) {   // TR_MM_OUT_F32 into a buffer sized for bf16
    void *out = gb.ops->alloc(&gb, 4 * 8 * 2), *in = gb.ops->alloc(&gb, 4 * 8 * 4);
    void *w = gb.ops->alloc(&gb, 8 * 8 * 4);
    gb.ops->matmul_forward(&gb, end_of_region(out, 4 * 8 * 2), in, w, NULL, 4, 8, 8,
                           TR_MM_OUT_F32);
}

static void bad_add_overlap(void) {   // out a row past x: neither x nor apart from it
    float *x = gb.ops->alloc(&gb, 5 * 8 * 4);
    void *in = gb.ops->alloc(&gb, 4 * 8 * 4), *w = gb.ops->alloc(&gb, 8 * 8 * 4);
    gb.ops->matmul_forward_add(&gb, x + 8, x, in, w, NULL, 4, 8, 8);
}

static void bad_ranked(void) {   // a top-k row drawn as if no row ranked
    const int32_t V = 16;
    tr_sample_row row = {.temperature = 1.0f, .top_k = 4, .top_p = 1.0f, .seed = 1};
    tr_sample_row *rows = gb.ops->alloc(&gb, sizeof row);
    gb.ops->upload(&gb, rows, &row, sizeof row);
    void *logits = gb.ops->alloc(&gb, V * 4), *ids = gb.ops->alloc(&gb, 4);
    void *lp = gb.ops->alloc(&gb, 4), *near = gb.ops->alloc(&gb, 4);
    void *scratch = gb.ops->alloc(&gb, gb.ops->sample_scratch_bytes(&gb, 1, V));
    gb.ops->sample(&gb, ids, lp, logits, rows, 1, V, false, scratch, near);
}

static void kv_write_slots(const int32_t *slots) {
    tr_kv_pages kv = {.k_pool = gb.ops->alloc(&gb, 64 * 8), .v_pool = gb.ops->alloc(&gb, 64 * 8),
                      .block_size = 4, .n_blocks = 4, .n_kv_heads = 1, .head_dim = 2};
    int32_t *s = gb.ops->alloc(&gb, 8);
    gb.ops->upload(&gb, s, slots, 8);
    void *k = gb.ops->alloc(&gb, 64), *v = gb.ops->alloc(&gb, 64);
    gb.ops->kv_write(&gb, &kv, s, k, v, 2, 2);
}

static void bad_slot(void) { kv_write_slots((const int32_t[]){3, 16}); }
static void repeated_slot(void) { kv_write_slots((const int32_t[]){5, 5}); }

static void bad_block(void) {   // a decode block id past the pool
    tr_kv_pages kv = {.k_pool = gb.ops->alloc(&gb, 256), .v_pool = gb.ops->alloc(&gb, 256),
                      .block_size = 4, .n_blocks = 4, .n_kv_heads = 1, .head_dim = 2};
    int32_t table[2] = {0, 4}, len = 6;
    int32_t *t = gb.ops->alloc(&gb, 8), *l = gb.ops->alloc(&gb, 4);
    gb.ops->upload(&gb, t, table, 8);
    gb.ops->upload(&gb, l, &len, 4);
    void *q = gb.ops->alloc(&gb, 64), *out = gb.ops->alloc(&gb, 64);
    gb.ops->attention_decode(&gb, out, q, 2, &kv, t, 2, l, 1, 1);
}

static void bad_patch_order(void) {   // decode rows patched out of order
    const int32_t patch[7] = {2, 3, 1, 0, 1, 1, 0}, zeros[4] = {0, 0, 0, 0};
    int32_t *b[8];
    for (int i = 0; i < 8; i++) b[i] = gb.ops->alloc(&gb, 4 * sizeof(int32_t));
    int32_t *pt = gb.ops->alloc(&gb, sizeof patch);
    gb.ops->upload(&gb, pt, patch, sizeof patch);
    gb.ops->upload(&gb, b[1], zeros, sizeof zeros);
    gb.ops->upload(&gb, b[7], zeros, sizeof zeros);
    gb.ops->decode_rows(&gb, &(tr_decode_rows_args){.ids = b[0], .pos = b[1], .slot = b[2],
                                                    .len = b[3], .doc_start = b[4],
                                                    .drawn = b[5], .patch = pt, .tables = b[7],
                                                    .w = 1, .bs = 16, .n = 4});
}

static void bad_segments(void) {   // a hole between the segments
    tr_adamw_seg segs[2] = {{0, 10, 0.1f, 0}, {12, 20, 0.0f, 0}};
    double ss = 1.0;
    void *s = gb.ops->alloc(&gb, sizeof segs), *d = gb.ops->alloc(&gb, 8);
    gb.ops->upload(&gb, s, segs, sizeof segs);
    gb.ops->upload(&gb, d, &ss, 8);
    tr_adamw_args a = {.p = gb.ops->alloc(&gb, 80), .g = gb.ops->alloc(&gb, 80),
                       .m = gb.ops->alloc(&gb, 80), .v = gb.ops->alloc(&gb, 80), .n = 20,
                       .segs = s, .n_segs = 2, .sumsq = d, .lr = 1e-3f, .b1 = 0.9f,
                       .b2 = 0.99f, .eps = 1e-8f, .t = 1, .wt = TR_F32};
    gb.ops->adamw(&gb, &a);
}

static void bad_ld(void) {   // rows of 2 heads of 8 at a stride of 12
    void *x = gb.ops->alloc(&gb, 1024), *r = gb.ops->alloc(&gb, 64), *w = gb.ops->alloc(&gb, 64);
    gb.ops->head_rmsnorm_forward(&gb, x, r, x, w, 1e-6f, 4, 2, 8, 12);
}

static void bad_copy_2d(void) {   // 3 rows of 8 bytes 10 apart need 28 bytes, not 27
    void *src = gb.ops->alloc(&gb, 28), *dst = gb.ops->alloc(&gb, 27);
    gb.ops->copy_2d(&gb, end_of_region(dst, 27), 10, src, 10, 8, 3);
}

static void init_pair(tr_dt p) {
    unsetenv("TROUPE_CPU_GUARD");
    kt_backend(&hb, 2, p);
    setenv("TROUPE_CPU_GUARD", "1", 1);
    if (tr_backend_cpu_init(&gb, 2, p) != 0 || !((tr_cpu_ctx *)gb.ctx)->guard) {
        fprintf(stderr, "no guarded backend\n");
        exit(1);
    }
    unsetenv("TROUPE_CPU_GUARD");
}

int main(void) {
    kt_seed(31);
    static const tr_dt precisions[] = {TR_F32, TR_BF16};
    for (int i = 0; i < 2; i++) {
        init_pair(precisions[i]);
        each_op();
        const char *p = tr_dt_name(precisions[i]);
        CHECKF(aborts(bad_out_short), "%s: an A output one element short passed", p);
        if (precisions[i] == TR_F32) {
            CHECKF(aborts(bad_out_bf16), "fp32: an A output of bf16 size passed");
            CHECKF(aborts(bad_logits_bf16), "fp32: logits of bf16 size passed");
        }
        CHECKF(aborts(bad_f32_out), "%s: TR_MM_OUT_F32 into a bf16-sized buffer passed", p);
        CHECKF(aborts(bad_add_overlap), "%s: matmul_forward_add into a shifted x passed", p);
        CHECKF(aborts(bad_slot), "%s: a KV slot outside the pool passed", p);
        CHECKF(aborts(repeated_slot), "%s: a repeated KV slot passed", p);
        CHECKF(aborts(bad_block), "%s: a decode block outside the pool passed", p);
        CHECKF(aborts(bad_segments), "%s: AdamW segments with a hole passed", p);
        CHECKF(aborts(bad_patch_order), "%s: decode rows patched out of order passed", p);
        CHECKF(aborts(bad_ld), "%s: a row stride below the row width passed", p);
        CHECKF(aborts(bad_copy_2d), "%s: copy_2d past the end of its destination passed", p);
        CHECKF(aborts(bad_ranked), "%s: a ranked row drawn with ranked false passed", p);
        tr_backend_cpu_free(&hb);
        tr_backend_cpu_free(&gb);
    }
    return tr_test_summary("test_guard");
}
