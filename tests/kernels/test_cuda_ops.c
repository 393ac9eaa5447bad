// The CUDA backend against the CPU backend (itself checked against float64 references and
// finite differences by the other kernel tests): every op on the same random inputs, outputs
// within 1e-4 of the output's scale, and the exact ones (embedding, fill, row gathers and
// scatters, KV block copies, bf16 casts) bit for bit; every CUDA op run twice gives the same
// bits; the paged decode step reproduces the CUDA training forward's rows bit for bit; the
// sampler draws the CPU's ids except in draws it counts as near. Exits 77 (skip) without a
// CUDA device. `test_cuda_ops SECTION` runs one section (as named in main), e.g. under
// compute-sanitizer, whose slowdown the whole test would not fit.
#include <stdint.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/kernels_test.h"

#define TOL 1e-4
#define MAX_BUFS 64

static tr_backend cpu_be, gpu_be;

// Buffers of one op run: device memory for the GPU backend, host copies for the CPU one (so
// the CPU op never writes into the caller's inputs either). Freed together by bufs_free.
static void *bufs[MAX_BUFS];
static int n_bufs;

static void die(const char *what, const char *msg) {
    fprintf(stderr, "test_cuda_ops: %s: %s\n", what, msg);
    exit(1);
}

static void *put(int gpu, const void *host, size_t bytes) {
    char msg[256];
    void *p;
    if (n_bufs == MAX_BUFS) die("put", "too many buffers");
    if (gpu) {
        if (tr_cuda_alloc(&p, bytes, msg, sizeof msg) != 0) die("alloc", msg);
        if (host && tr_cuda_copy_h2d(p, host, bytes, msg, sizeof msg) != 0) die("h2d", msg);
        if (!host && tr_cuda_zero(p, bytes, msg, sizeof msg) != 0) die("zero", msg);
    } else {
        p = kt_malloc(bytes);
        if (host) memcpy(p, host, bytes);
        else memset(p, 0, bytes);
    }
    bufs[n_bufs++] = p;
    return p;
}

static float *putf(int gpu, const float *host, size_t n) {
    return put(gpu, host, n * sizeof(float));
}
static int32_t *puti(int gpu, const int32_t *host, size_t n) {
    return put(gpu, host, n * sizeof(int32_t));
}

static void get(int gpu, void *host, const void *p, size_t bytes) {
    char msg[256];
    if (!gpu) {
        memcpy(host, p, bytes);
        return;
    }
    if (tr_backend_cuda_status(&gpu_be, msg, sizeof msg) != 0) die("cuda backend", msg);
    if (tr_cuda_copy_d2h(host, p, bytes, msg, sizeof msg) != 0) die("d2h", msg);
}
static void getf(int gpu, float *host, const float *p, size_t n) {
    get(gpu, host, p, n * sizeof(float));
}

static void bufs_free(int gpu) {
    for (int i = 0; i < n_bufs; i++) {
        if (gpu) tr_cuda_free(bufs[i]);
        else free(bufs[i]);
    }
    n_bufs = 0;
}

static tr_backend *be_of(int gpu) { return gpu ? &gpu_be : &cpu_be; }

// Runs op(gpu, outputs) on the CPU and twice on the GPU; compares each of the n_out output
// arrays (lengths len[i]) CPU vs GPU within TOL of the CPU output's scale, and GPU vs GPU
// bitwise. Outputs are written by op into out[i] (host arrays of len[i] floats).
typedef void (*op_fn)(int gpu, float **out, void *arg);

// exact: the op's contract fixes its arithmetic, so CUDA must also equal the CPU bitwise.
static void compare_ex(const char *name, op_fn op, void *arg, int n_out, const size_t *len,
                       int exact) {
    float *ref[8], *a[8], *b[8];
    for (int i = 0; i < n_out; i++) {
        ref[i] = kt_floats(len[i]);
        a[i] = kt_floats(len[i]);
        b[i] = kt_floats(len[i]);
    }
    op(0, ref, arg);
    op(1, a, arg);
    op(1, b, arg);
    for (int i = 0; i < n_out; i++) {
        double e = tr_test_rel_err(a[i], ref[i], len[i]);
        CHECKF(e <= TOL, "%s output %d: cuda vs cpu rel err %.3g", name, i, e);
        CHECKF(kt_same_bits(a[i], b[i], len[i]), "%s output %d: two cuda runs differ", name, i);
        if (exact)
            CHECKF(kt_same_bits(a[i], ref[i], len[i]), "%s output %d: cuda differs from cpu",
                   name, i);
        printf("  %-22s out %d: max err / scale %.2e%s\n", name, i, e,
               exact ? (kt_same_bits(a[i], ref[i], len[i]) ? ", bitwise" : ", NOT bitwise") : "");
        free(ref[i]);
        free(a[i]);
        free(b[i]);
    }
}

static void compare(const char *name, op_fn op, void *arg, int n_out, const size_t *len) {
    compare_ex(name, op, arg, n_out, len, 0);
}

// --- matmul ---------------------------------------------------------------------------------

typedef struct mm_arg {
    int32_t T, IC, OC;
    float *in, *w, *bias, *dout, *din0, *dw0, *db0;
} mm_arg;

static void mm_forward(int gpu, float **out, void *arg) {
    mm_arg *m = arg;
    float *o = putf(gpu, NULL, (size_t)m->T * m->OC), *in = putf(gpu, m->in, (size_t)m->T * m->IC);
    float *w = putf(gpu, m->w, (size_t)m->OC * m->IC), *bias = putf(gpu, m->bias, m->OC);
    be_of(gpu)->ops->matmul_forward(be_of(gpu), o, in, w, bias, m->T, m->IC, m->OC);
    getf(gpu, out[0], o, (size_t)m->T * m->OC);
    bufs_free(gpu);
}

static void mm_backward(int gpu, float **out, void *arg) {
    mm_arg *m = arg;
    size_t nin = (size_t)m->T * m->IC, nw = (size_t)m->OC * m->IC;
    float *in = putf(gpu, m->in, nin), *w = putf(gpu, m->w, nw);
    float *dout = putf(gpu, m->dout, (size_t)m->T * m->OC);
    float *din = putf(gpu, m->din0, nin), *dw = putf(gpu, m->dw0, nw);
    float *db = putf(gpu, m->db0, m->OC);
    be_of(gpu)->ops->matmul_backward(be_of(gpu), din, dw, db, dout, in, w, m->T, m->IC, m->OC);
    getf(gpu, out[0], din, nin);
    getf(gpu, out[1], dw, nw);
    getf(gpu, out[2], db, m->OC);
    bufs_free(gpu);
}

static void test_matmul(int32_t T, int32_t IC, int32_t OC) {
    mm_arg m = {.T = T, .IC = IC, .OC = OC};
    m.in = kt_rand((size_t)T * IC, 1.0);
    m.w = kt_rand((size_t)OC * IC, 0.1);
    m.bias = kt_rand(OC, 1.0);
    m.dout = kt_rand((size_t)T * OC, 1.0);
    m.din0 = kt_rand((size_t)T * IC, 1.0);
    m.dw0 = kt_rand((size_t)OC * IC, 1.0);
    m.db0 = kt_rand(OC, 1.0);
    size_t lf[1] = {(size_t)T * OC}, lb[3] = {(size_t)T * IC, (size_t)OC * IC, (size_t)OC};
    compare("matmul_forward", mm_forward, &m, 1, lf);
    compare("matmul_backward", mm_backward, &m, 3, lb);
    free(m.in); free(m.w); free(m.bias); free(m.dout); free(m.din0); free(m.dw0); free(m.db0);
}

// --- embedding ------------------------------------------------------------------------------

typedef struct emb_arg {
    int32_t T, C, V;
    int32_t *ids;
    float *table, *dout, *dtable0;
} emb_arg;

static void emb_forward(int gpu, float **out, void *arg) {
    emb_arg *e = arg;
    float *o = putf(gpu, NULL, (size_t)e->T * e->C);
    float *table = putf(gpu, e->table, (size_t)e->V * e->C);
    int32_t *ids = puti(gpu, e->ids, e->T);
    be_of(gpu)->ops->embedding_forward(be_of(gpu), o, ids, table, e->T, e->C);
    getf(gpu, out[0], o, (size_t)e->T * e->C);
    bufs_free(gpu);
}

static void emb_backward(int gpu, float **out, void *arg) {
    emb_arg *e = arg;
    float *dt = putf(gpu, e->dtable0, (size_t)e->V * e->C);
    float *dout = putf(gpu, e->dout, (size_t)e->T * e->C);
    int32_t *ids = puti(gpu, e->ids, e->T);
    void *scratch = put(gpu, NULL, be_of(gpu)->ops->embedding_scratch_bytes(be_of(gpu), e->T));
    be_of(gpu)->ops->embedding_backward(be_of(gpu), dt, dout, ids, e->T, e->C, scratch);
    getf(gpu, out[0], dt, (size_t)e->V * e->C);
    bufs_free(gpu);
}

// ids: V ids drawn at random, then every `hot`-th token set to id 0 (a long run of one id);
// both backends must give the same bits (rows add their tokens in token order).
static void test_embedding(int32_t T, int32_t C, int32_t V, int32_t hot) {
    emb_arg e = {.T = T, .C = C, .V = V};
    e.ids = kt_malloc((size_t)e.T * sizeof(int32_t));
    for (int32_t t = 0; t < e.T; t++) e.ids[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * e.V) % e.V;
    for (int32_t t = 0; hot > 0 && t < e.T; t += hot) e.ids[t] = 0;
    e.ids[e.T - 1] = e.ids[0];   // the same id at the first and the last token
    e.table = kt_rand((size_t)e.V * e.C, 1.0);
    e.dout = kt_rand((size_t)e.T * e.C, 1.0);
    e.dtable0 = kt_rand((size_t)e.V * e.C, 1.0);
    size_t lf[1] = {(size_t)e.T * e.C}, lb[1] = {(size_t)e.V * e.C};
    compare_ex("embedding_forward", emb_forward, &e, 1, lf, 1);
    compare_ex("embedding_backward", emb_backward, &e, 1, lb, 1);
    free(e.ids); free(e.table); free(e.dout); free(e.dtable0);
}

// Scratch sized for T tokens must serve every smaller T (the model sizes it once).
static void test_embedding_scratch(void) {
    size_t prev = 0;
    int mono = 1;
    for (int32_t T = 1; T <= (1 << 20); T += T < 5000 ? 1 : T / 64) {
        size_t b = gpu_be.ops->embedding_scratch_bytes(&gpu_be, T);
        mono &= b >= prev && b >= 3 * (size_t)T * sizeof(int32_t);
        prev = b;
    }
    CHECKF(mono, "embedding_scratch_bytes is not monotone in T");
}

// --- rmsnorm --------------------------------------------------------------------------------

typedef struct rms_arg {
    int32_t T, C;
    float *in, *w, *dout, *din0, *dw0, *rstd;   // rstd: the CPU forward's, for the backward
} rms_arg;

static void rms_forward(int gpu, float **out, void *arg) {
    rms_arg *r = arg;
    size_t n = (size_t)r->T * r->C;
    float *o = putf(gpu, NULL, n), *rstd = putf(gpu, NULL, r->T);
    float *in = putf(gpu, r->in, n), *w = putf(gpu, r->w, r->C);
    be_of(gpu)->ops->rmsnorm_forward(be_of(gpu), o, rstd, in, w, 1e-5f, r->T, r->C);
    getf(gpu, out[0], o, n);
    getf(gpu, out[1], rstd, r->T);
    bufs_free(gpu);
}

// Both backends get the same saved rstd, so the backward alone is compared.
static void rms_backward(int gpu, float **out, void *arg) {
    rms_arg *r = arg;
    size_t n = (size_t)r->T * r->C;
    float *rstd = putf(gpu, r->rstd, r->T);
    float *in = putf(gpu, r->in, n), *w = putf(gpu, r->w, r->C);
    float *dout = putf(gpu, r->dout, n), *din = putf(gpu, r->din0, n);
    float *dw = putf(gpu, r->dw0, r->C);
    be_of(gpu)->ops->rmsnorm_backward(be_of(gpu), din, dw, dout, in, w, rstd, r->T, r->C);
    getf(gpu, out[0], din, n);
    getf(gpu, out[1], dw, r->C);
    bufs_free(gpu);
}

static void test_rmsnorm(void) {
    rms_arg r = {.T = 70, .C = 300};
    size_t n = (size_t)r.T * r.C;
    r.in = kt_rand(n, 2.0);
    r.w = kt_rand(r.C, 1.0);
    r.dout = kt_rand(n, 1.0);
    r.din0 = kt_rand(n, 1.0);
    r.dw0 = kt_rand(r.C, 1.0);
    r.rstd = kt_floats(r.T);
    float *tmp = kt_floats(n);
    cpu_be.ops->rmsnorm_forward(&cpu_be, tmp, r.rstd, r.in, r.w, 1e-5f, r.T, r.C);
    size_t lf[2] = {n, (size_t)r.T}, lb[2] = {n, (size_t)r.C};
    compare("rmsnorm_forward", rms_forward, &r, 2, lf);
    compare("rmsnorm_backward", rms_backward, &r, 2, lb);
    free(tmp); free(r.in); free(r.w); free(r.dout); free(r.din0); free(r.dw0); free(r.rstd);
}

// --- rope -----------------------------------------------------------------------------------

typedef struct rope_arg {
    int32_t T, H, D;
    float *x, *inv_freq;
    int32_t *pos;
} rope_arg;

static void rope_op(int gpu, float **out, void *arg, int backward) {
    rope_arg *r = arg;
    size_t n = (size_t)r->T * r->H * r->D;
    float *x = putf(gpu, r->x, n), *f = putf(gpu, r->inv_freq, r->D / 2);
    int32_t *pos = puti(gpu, r->pos, r->T);
    if (backward) be_of(gpu)->ops->rope_backward(be_of(gpu), x, pos, f, r->T, r->H, r->D);
    else be_of(gpu)->ops->rope_forward(be_of(gpu), x, pos, f, r->T, r->H, r->D);
    getf(gpu, out[0], x, n);
    bufs_free(gpu);
}
static void rope_fwd(int gpu, float **out, void *arg) { rope_op(gpu, out, arg, 0); }
static void rope_bwd(int gpu, float **out, void *arg) { rope_op(gpu, out, arg, 1); }

static void test_rope(void) {
    rope_arg r = {.T = 90, .H = 3, .D = 64};
    size_t n = (size_t)r.T * r.H * r.D;
    r.x = kt_rand(n, 1.0);
    r.inv_freq = kt_floats(r.D / 2);
    for (int32_t i = 0; i < r.D / 2; i++) r.inv_freq[i] = (float)pow(10000.0, -2.0 * i / r.D);
    r.pos = kt_malloc((size_t)r.T * sizeof(int32_t));
    for (int32_t t = 0; t < r.T; t++) r.pos[t] = t < 40 ? t : 1000 + 37 * t;   // large angles too
    size_t l[1] = {n};
    compare("rope_forward", rope_fwd, &r, 1, l);
    compare("rope_backward", rope_bwd, &r, 1, l);
    free(r.x); free(r.inv_freq); free(r.pos);
}

// --- attention ------------------------------------------------------------------------------

typedef struct att_arg {
    int32_t T, H, KVH, D, n_docs;
    int32_t *doc_start, *pos;
    float *q, *k, *v, *dout, *dq0, *dk0, *dv0;
    float *out, *lse;   // the CPU forward's, input to the backward on both backends
} att_arg;

static tr_doc_layout att_docs(int gpu, const att_arg *a) {
    tr_doc_layout d = {.n_tokens = a->T, .n_docs = a->n_docs,
                       .doc_start = puti(gpu, a->doc_start, a->n_docs + 1),
                       .pos = puti(gpu, a->pos, a->T)};
    return d;
}

static void att_forward(int gpu, float **out, void *arg) {
    att_arg *a = arg;
    size_t nq = (size_t)a->T * a->H * a->D, nk = (size_t)a->T * a->KVH * a->D;
    tr_doc_layout docs = att_docs(gpu, a);
    float *q = putf(gpu, a->q, nq), *k = putf(gpu, a->k, nk), *v = putf(gpu, a->v, nk);
    float *o = putf(gpu, NULL, nq), *lse = putf(gpu, NULL, (size_t)a->T * a->H);
    be_of(gpu)->ops->attention_forward(be_of(gpu), o, lse, q, k, v, &docs, a->H, a->KVH, a->D);
    getf(gpu, out[0], o, nq);
    getf(gpu, out[1], lse, (size_t)a->T * a->H);
    bufs_free(gpu);
}

static void att_backward(int gpu, float **out, void *arg) {
    att_arg *a = arg;
    size_t nq = (size_t)a->T * a->H * a->D, nk = (size_t)a->T * a->KVH * a->D;
    tr_doc_layout docs = att_docs(gpu, a);
    float *q = putf(gpu, a->q, nq), *k = putf(gpu, a->k, nk), *v = putf(gpu, a->v, nk);
    float *o = putf(gpu, a->out, nq), *lse = putf(gpu, a->lse, (size_t)a->T * a->H);
    float *dout = putf(gpu, a->dout, nq), *dq = putf(gpu, a->dq0, nq);
    float *dk = putf(gpu, a->dk0, nk), *dv = putf(gpu, a->dv0, nk);
    be_of(gpu)->ops->attention_backward(be_of(gpu), dq, dk, dv, dout, o, lse, q, k, v, &docs,
                                        a->H, a->KVH, a->D);
    getf(gpu, out[0], dq, nq);
    getf(gpu, out[1], dk, nk);
    getf(gpu, out[2], dv, nk);
    bufs_free(gpu);
}

// Decode of chosen tokens over a paged cache built from the same k, v: each sequence holds
// its document's keys up to the token, in 16-slot blocks placed in a scattered order.
// Returns in out[0] the decode rows on backend `gpu`.
typedef struct dec_arg {
    const att_arg *a;
    int32_t B, max_blocks, n_blocks, block_size;
    int32_t *tok, *seq_len, *table;
    float *kp, *vp, *qd;
} dec_arg;

static void dec_build(dec_arg *d, const att_arg *a, const int32_t *tok, int32_t B) {
    d->a = a;
    d->B = B;
    d->block_size = 16;
    d->tok = kt_malloc((size_t)B * sizeof(int32_t));
    d->seq_len = kt_malloc((size_t)B * sizeof(int32_t));
    d->max_blocks = 0;
    for (int32_t b = 0; b < B; b++) {
        int32_t t = tok[b], doc = 0;
        while (a->doc_start[doc + 1] <= t) doc++;
        d->tok[b] = t;
        d->seq_len[b] = t - a->doc_start[doc] + 1;
        int32_t nb = (d->seq_len[b] + d->block_size - 1) / d->block_size;
        if (nb > d->max_blocks) d->max_blocks = nb;
    }
    d->n_blocks = B * d->max_blocks;
    size_t slot_f = (size_t)a->KVH * a->D, pool = (size_t)d->n_blocks * d->block_size * slot_f;
    d->kp = kt_rand(pool, 1.0);   // unused slots hold noise that must never be read
    d->vp = kt_rand(pool, 1.0);
    d->table = kt_malloc((size_t)d->n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < d->n_blocks; i++) d->table[i] = i;
    for (int32_t i = d->n_blocks - 1; i > 0; i--) {   // Fisher-Yates: a scattered permutation
        int32_t r = (int32_t)((kt_uniform() + 1.0) * 0.5 * (i + 1)), tmp = d->table[i];
        if (r > i) r = i;
        d->table[i] = d->table[r];
        d->table[r] = tmp;
    }
    d->qd = kt_floats((size_t)B * a->H * a->D);
    for (int32_t b = 0; b < B; b++) {
        int32_t start = d->tok[b] - d->seq_len[b] + 1;
        for (int32_t j = 0; j < d->seq_len[b]; j++) {
            int32_t blk = d->table[b * d->max_blocks + j / d->block_size];
            size_t dst = ((size_t)blk * d->block_size + j % d->block_size) * slot_f;
            size_t src = (size_t)(start + j) * slot_f;
            memcpy(d->kp + dst, a->k + src, slot_f * sizeof(float));
            memcpy(d->vp + dst, a->v + src, slot_f * sizeof(float));
        }
        memcpy(d->qd + (size_t)b * a->H * a->D, a->q + (size_t)d->tok[b] * a->H * a->D,
               (size_t)a->H * a->D * sizeof(float));
    }
}

static void dec_free(dec_arg *d) {
    free(d->tok); free(d->seq_len); free(d->table); free(d->kp); free(d->vp); free(d->qd);
}

static void dec_run(int gpu, float **out, void *arg) {
    dec_arg *d = arg;
    const att_arg *a = d->a;
    size_t pool = (size_t)d->n_blocks * d->block_size * a->KVH * a->D;
    size_t nq = (size_t)d->B * a->H * a->D;
    tr_kv_pages kv = {.k_pool = putf(gpu, d->kp, pool), .v_pool = putf(gpu, d->vp, pool),
                      .block_size = d->block_size, .n_blocks = d->n_blocks,
                      .n_kv_heads = a->KVH, .head_dim = a->D};
    int32_t *table = puti(gpu, d->table, d->n_blocks), *seq_len = puti(gpu, d->seq_len, d->B);
    float *q = putf(gpu, d->qd, nq), *o = putf(gpu, NULL, nq);
    be_of(gpu)->ops->attention_decode(be_of(gpu), o, q, &kv, table, d->max_blocks, seq_len,
                                      d->B, a->H);
    getf(gpu, out[0], o, nq);
    bufs_free(gpu);
}

static void test_attention(int32_t T, int32_t n_docs, const int32_t *doc_start, int32_t H,
                           int32_t KVH, int32_t D) {
    att_arg a = {.T = T, .H = H, .KVH = KVH, .D = D, .n_docs = n_docs};
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    a.doc_start = kt_malloc((size_t)(n_docs + 1) * sizeof(int32_t));
    memcpy(a.doc_start, doc_start, (size_t)(n_docs + 1) * sizeof(int32_t));
    a.pos = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t d = 0; d < n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++) a.pos[t] = t - doc_start[d];
    a.q = kt_rand(nq, 2.0);
    a.k = kt_rand(nk, 2.0);
    a.v = kt_rand(nk, 1.0);
    a.dout = kt_rand(nq, 1.0);
    a.dq0 = kt_rand(nq, 1.0);
    a.dk0 = kt_rand(nk, 1.0);
    a.dv0 = kt_rand(nk, 1.0);
    a.out = kt_floats(nq);
    a.lse = kt_floats((size_t)T * H);
    tr_doc_layout docs = {.n_tokens = T, .n_docs = n_docs, .doc_start = a.doc_start,
                          .pos = a.pos};
    cpu_be.ops->attention_forward(&cpu_be, a.out, a.lse, a.q, a.k, a.v, &docs, H, KVH, D);
    size_t lf[2] = {nq, (size_t)T * H}, lb[3] = {nq, nk, nk};
    compare("attention_forward", att_forward, &a, 2, lf);
    compare("attention_backward", att_backward, &a, 3, lb);

    // decode: the last token, a token past the first 128-key chunk, a document's first token
    int32_t tok[3] = {T - 1, doc_start[n_docs - 1] + (T - doc_start[n_docs - 1]) / 2,
                      doc_start[n_docs - 1]};
    dec_arg d;
    dec_build(&d, &a, tok, 3);
    size_t ld[1] = {(size_t)3 * H * D};
    compare("attention_decode", dec_run, &d, 1, ld);
    float *fwd[2] = {kt_floats(nq), kt_floats((size_t)T * H)}, *dec[1] = {kt_floats(ld[0])};
    att_forward(1, fwd, &a);
    dec_run(1, dec, &d);
    for (int32_t b = 0; b < 3; b++)
        CHECKF(kt_same_bits(dec[0] + (size_t)b * H * D, fwd[0] + (size_t)tok[b] * H * D,
                            (size_t)H * D),
               "attention_decode row of token %d differs from the cuda forward's", tok[b]);
    free(fwd[0]); free(fwd[1]); free(dec[0]);
    dec_free(&d);
    free(a.doc_start); free(a.pos); free(a.q); free(a.k); free(a.v); free(a.dout);
    free(a.dq0); free(a.dk0); free(a.dv0); free(a.out); free(a.lse);
}

// --- elementwise and optimizer ----------------------------------------------------------------

typedef struct ew_arg {
    size_t n;
    float *a, *b, *c, *d0, *e0;
} ew_arg;

static void swiglu_fwd(int gpu, float **out, void *arg) {
    ew_arg *e = arg;
    float *o = putf(gpu, NULL, e->n), *g = putf(gpu, e->a, e->n), *u = putf(gpu, e->b, e->n);
    be_of(gpu)->ops->swiglu_forward(be_of(gpu), o, g, u, e->n);
    getf(gpu, out[0], o, e->n);
    bufs_free(gpu);
}

static void swiglu_bwd(int gpu, float **out, void *arg) {
    ew_arg *e = arg;
    float *g = putf(gpu, e->a, e->n), *u = putf(gpu, e->b, e->n), *go = putf(gpu, e->c, e->n);
    float *dg = putf(gpu, e->d0, e->n), *du = putf(gpu, e->e0, e->n);
    be_of(gpu)->ops->swiglu_backward(be_of(gpu), dg, du, go, g, u, e->n);
    getf(gpu, out[0], dg, e->n);
    getf(gpu, out[1], du, e->n);
    bufs_free(gpu);
}

// add (out aliasing a, as the residual stream uses it) then scale
static void add_scale(int gpu, float **out, void *arg) {
    ew_arg *e = arg;
    float *a = putf(gpu, e->a, e->n), *b = putf(gpu, e->b, e->n);
    be_of(gpu)->ops->add(be_of(gpu), a, a, b, e->n);
    getf(gpu, out[0], a, e->n);
    be_of(gpu)->ops->scale(be_of(gpu), a, -0.37f, e->n);
    getf(gpu, out[1], a, e->n);
    bufs_free(gpu);
}

// three AdamW steps with weight decay
static void adamw_steps(int gpu, float **out, void *arg) {
    ew_arg *e = arg;
    float *p = putf(gpu, e->a, e->n), *g = putf(gpu, e->b, e->n);
    float *m = putf(gpu, NULL, e->n), *v = putf(gpu, NULL, e->n);
    for (int32_t t = 1; t <= 3; t++)
        be_of(gpu)->ops->adamw(be_of(gpu), p, g, m, v, e->n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    getf(gpu, out[0], p, e->n);
    getf(gpu, out[1], m, e->n);
    getf(gpu, out[2], v, e->n);
    bufs_free(gpu);
}

static void test_elementwise(size_t n) {
    ew_arg e = {.n = n};
    e.a = kt_rand(n, 6.0);
    e.b = kt_rand(n, 1.0);
    e.c = kt_rand(n, 1.0);
    e.d0 = kt_rand(n, 1.0);
    e.e0 = kt_rand(n, 1.0);
    size_t l1[1] = {n}, l2[2] = {n, n}, l3[3] = {n, n, n};
    compare("swiglu_forward", swiglu_fwd, &e, 1, l1);
    compare("swiglu_backward", swiglu_bwd, &e, 2, l2);
    compare("add, scale", add_scale, &e, 2, l2);
    compare("adamw", adamw_steps, &e, 3, l3);
    free(e.a); free(e.b); free(e.c); free(e.d0); free(e.e0);
}

// sumsq over sizes below one block, across several, and past the block-count cap: into a
// device double holding 0 (twice: the same bits) and one holding 0.5, which must end as the
// single rounding of 0.5 + the first. CPU and CUDA order the additions inside a block
// differently (4 lanes vs a 256-thread tree), so they agree to rounding, not bitwise: for
// random positive terms that is about sqrt(16384) * 2^-53 ~ 1e-14 relative, while a lost or
// repeated block partial (at least 1/1024 of the sum) is far above 1e-12.
static void test_sumsq(void) {
    static const size_t sizes[] = {1, 1000, 16384 * 5 + 17, (size_t)16384 * 1024 + 4099};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        float *x = kt_rand(n, 3.0);
        double want = 0.0, a, b, c, zero = 0.0, half = 0.5;
        cpu_be.ops->sumsq(&cpu_be, &want, x, n);
        float *dx = putf(1, x, n);
        double *acc_a = put(1, &zero, sizeof zero), *acc_b = put(1, &zero, sizeof zero);
        double *acc_c = put(1, &half, sizeof half);
        gpu_be.ops->sumsq(&gpu_be, acc_a, dx, n);
        gpu_be.ops->sumsq(&gpu_be, acc_b, dx, n);
        gpu_be.ops->sumsq(&gpu_be, acc_c, dx, n);
        get(1, &a, acc_a, sizeof a);
        get(1, &b, acc_b, sizeof b);
        get(1, &c, acc_c, sizeof c);
        bufs_free(1);
        double rel = fabs(a - want) / want;
        CHECKF(rel <= 1e-12, "sumsq n=%zu: cuda %.17g cpu %.17g", n, a, want);
        CHECKF(memcmp(&a, &b, sizeof a) == 0, "sumsq n=%zu: two cuda runs differ", n);
        CHECKF(c == 0.5 + a, "sumsq n=%zu into 0.5: %.17g, want %.17g", n, c, 0.5 + a);
        printf("  sumsq n=%-10zu rel err %.2e\n", n, rel);
        free(x);
    }
}

// --- logsoftmax -------------------------------------------------------------------------------

typedef struct lsm_arg {
    int32_t T, V;
    int32_t *target;
    float *logits, *dlogprob, *dentropy, *lse;   // lse: the CPU forward's, for the backward
} lsm_arg;

static void lsm_fwd(int gpu, float **out, void *arg) {
    lsm_arg *l = arg;
    float *x = putf(gpu, l->logits, (size_t)l->T * l->V);
    int32_t *tg = puti(gpu, l->target, l->T);
    float *lp = putf(gpu, NULL, l->T), *ent = putf(gpu, NULL, l->T), *lse = putf(gpu, NULL, l->T);
    be_of(gpu)->ops->logsoftmax_forward(be_of(gpu), lp, ent, lse, x, tg, l->T, l->V);
    getf(gpu, out[0], lp, l->T);
    getf(gpu, out[1], ent, l->T);
    getf(gpu, out[2], lse, l->T);
    bufs_free(gpu);
}

static void lsm_bwd(int gpu, float **out, void *arg) {
    lsm_arg *l = arg;
    size_t n = (size_t)l->T * l->V;
    float *x = putf(gpu, l->logits, n), *lse = putf(gpu, l->lse, l->T);
    int32_t *tg = puti(gpu, l->target, l->T);
    float *glp = putf(gpu, l->dlogprob, l->T), *gent = putf(gpu, l->dentropy, l->T);
    float *dx = putf(gpu, NULL, n);
    be_of(gpu)->ops->logsoftmax_backward(be_of(gpu), dx, glp, gent, x, lse, tg, l->T, l->V);
    getf(gpu, out[0], dx, n);
    be_of(gpu)->ops->logsoftmax_backward(be_of(gpu), dx, glp, NULL, x, lse, tg, l->T, l->V);
    getf(gpu, out[1], dx, n);
    bufs_free(gpu);
}

static void test_logsoftmax(int32_t T, int32_t V) {
    lsm_arg l = {.T = T, .V = V};
    size_t n = (size_t)T * V;
    l.logits = kt_rand(n, 8.0);
    l.target = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) l.target[t] = t % 5 == 4 ? -1 : (t * 7919) % V;
    l.dlogprob = kt_rand(T, 1.0);
    l.dentropy = kt_rand(T, 1.0);
    l.lse = kt_floats(T);
    cpu_be.ops->logsoftmax_forward(&cpu_be, NULL, NULL, l.lse, l.logits, l.target, T, V);
    size_t lf[3] = {(size_t)T, (size_t)T, (size_t)T}, lb[2] = {n, n};
    compare("logsoftmax_forward", lsm_fwd, &l, 3, lf);
    compare("logsoftmax_backward", lsm_bwd, &l, 2, lb);
    free(l.logits); free(l.target); free(l.dlogprob); free(l.dentropy); free(l.lse);
}

// --- buffers: fill, rows, KV block copies, casts (exact ops: CUDA equals CPU bitwise) -------

static void same_bytes(const char *name, const void *cpu, const void *gpu, size_t bytes) {
    CHECKF(memcmp(cpu, gpu, bytes) == 0, "%s: cuda differs from cpu", name);
    printf("  %-22s %zu bytes, bitwise equal: %s\n", name, bytes,
           memcmp(cpu, gpu, bytes) == 0 ? "yes" : "NO");
}

static uint8_t *rand_bytes(size_t n) {
    uint8_t *b = kt_malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((kt_uniform() + 1.0) * 128.0);
    return b;
}

// fill of an inner range: both ends are left alone
static void fill_run(int gpu, void *out, const float *x, size_t n) {
    float *d = putf(gpu, x, n);
    be_of(gpu)->ops->fill(be_of(gpu), d + 3, -2.5f, n - 7);
    get(gpu, out, d, n * sizeof(float));
    bufs_free(gpu);
}

typedef struct rows_arg {
    int32_t n_src, n, n_scatter;
    size_t row_bytes, shift;   // shift: bytes the source starts past its allocation's start
    uint8_t *src, *dst0;
    int32_t *gidx, *sidx;
} rows_arg;

// gather then scatter of the gathered rows; out: the gathered rows, then dst
static void rows_run(int gpu, uint8_t *out, const rows_arg *r) {
    size_t sb = (size_t)r->n_src * r->row_bytes, ob = (size_t)r->n * r->row_bytes;
    uint8_t *src = (uint8_t *)put(gpu, NULL, sb + r->shift) + r->shift;
    if (gpu) {
        char msg[256];
        if (tr_cuda_copy_h2d(src, r->src, sb, msg, sizeof msg) != 0) die("h2d", msg);
    } else {
        memcpy(src, r->src, sb);
    }
    uint8_t *o = put(gpu, NULL, ob), *dst = put(gpu, r->dst0, sb);
    int32_t *gidx = puti(gpu, r->gidx, r->n), *sidx = puti(gpu, r->sidx, r->n_scatter);
    be_of(gpu)->ops->gather_rows(be_of(gpu), o, src, gidx, r->n, r->row_bytes);
    be_of(gpu)->ops->scatter_rows(be_of(gpu), dst, o, sidx, r->n_scatter, r->row_bytes);
    get(gpu, out, o, ob);
    get(gpu, out + ob, dst, sb);
    bufs_free(gpu);
}

static void test_rows(int32_t n_src, int32_t n, size_t row_bytes, size_t shift) {
    rows_arg r = {.n_src = n_src, .n = n, .row_bytes = row_bytes, .shift = shift,
                  .n_scatter = n < n_src ? n : n_src};
    size_t sb = (size_t)n_src * row_bytes, ob = (size_t)n * row_bytes;
    r.src = rand_bytes(sb);
    r.dst0 = rand_bytes(sb);
    r.gidx = kt_malloc((size_t)n * sizeof(int32_t));
    r.sidx = kt_malloc((size_t)n_src * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) r.gidx[i] = (int32_t)((kt_uniform() + 1.0) * 0.5 * n_src) % n_src;
    for (int32_t i = 0; i < n_src; i++) r.sidx[i] = n_src - 1 - i;
    uint8_t *a = kt_malloc(ob + sb), *b = kt_malloc(ob + sb);
    rows_run(0, a, &r);
    rows_run(1, b, &r);
    char name[64];
    snprintf(name, sizeof name, "rows %zu B +%zu", row_bytes, shift);
    same_bytes(name, a, b, ob + sb);
    free(r.src); free(r.dst0); free(r.gidx); free(r.sidx); free(a); free(b);
}

// all-layer copy-on-write over a pool of L x NB blocks of BS slots of `slot` bytes
static void kv_copy_run(int gpu, uint8_t *out, int32_t L, int32_t NB, int32_t BS, size_t slot,
                        const uint8_t *k, const uint8_t *v, const int32_t *src,
                        const int32_t *dst, const int32_t *ns, int32_t n) {
    size_t layer = (size_t)NB * BS * slot, bytes = (size_t)L * layer;
    tr_kv_pool pool = {.k = put(gpu, k, bytes), .v = put(gpu, v, bytes), .layer_bytes = layer,
                       .n_layers = L, .block_size = BS, .slot_bytes = slot};
    int32_t *ds = puti(gpu, src, n), *dd = puti(gpu, dst, n), *dn = puti(gpu, ns, n);
    be_of(gpu)->ops->kv_copy_blocks(be_of(gpu), &pool, ds, dd, dn, n);
    get(gpu, out, pool.k, bytes);
    get(gpu, out + bytes, pool.v, bytes);
    bufs_free(gpu);
}

static void test_kv_copy(size_t slot) {
    const int32_t L = 3, NB = 12, BS = 16, n = 5;   // no pair writes a block another reads
    static const int32_t src[] = {0, 7, 2, 3, 0}, dst[] = {4, 5, 6, 8, 11};
    static const int32_t ns[] = {16, 1, 0, 9, 15};
    size_t bytes = (size_t)L * NB * BS * slot;
    uint8_t *k = rand_bytes(bytes), *v = rand_bytes(bytes);
    uint8_t *a = kt_malloc(2 * bytes), *b = kt_malloc(2 * bytes);
    kv_copy_run(0, a, L, NB, BS, slot, k, v, src, dst, ns, n);
    kv_copy_run(1, b, L, NB, BS, slot, k, v, src, dst, ns, n);
    char name[64];
    snprintf(name, sizeof name, "kv_copy_blocks %zu B", slot);
    same_bytes(name, a, b, 2 * bytes);
    free(k); free(v); free(a); free(b);
}

// every bf16 pattern to fp32; fp32 ties, their neighbours and random patterns to bf16
static void casts_run(int gpu, uint8_t *out, const uint16_t *h, size_t nh, const float *f,
                      size_t nf) {
    uint16_t *dh = put(gpu, h, nh * 2), *df_out = put(gpu, NULL, nf * 2);
    float *dh_out = putf(gpu, NULL, nh), *df = putf(gpu, f, nf);
    be_of(gpu)->ops->cast_bf16_f32(be_of(gpu), dh_out, dh, nh);
    be_of(gpu)->ops->cast_f32_bf16(be_of(gpu), df_out, df, nf);
    get(gpu, out, dh_out, nh * sizeof(float));
    get(gpu, out + nh * sizeof(float), df_out, nf * 2);
    bufs_free(gpu);
}

static void test_buffers(void) {
    size_t n = 100003;
    float *x = kt_rand(n, 1.0);
    uint8_t *a = kt_malloc(n * sizeof(float)), *b = kt_malloc(n * sizeof(float));
    fill_run(0, a, x, n);
    fill_run(1, b, x, n);
    same_bytes("fill", a, b, n * sizeof(float));
    free(x); free(a); free(b);

    test_rows(300, 500, 64, 0);     // 16-byte words
    test_rows(300, 500, 64, 4);     // misaligned source: 4-byte words
    test_rows(300, 500, 20, 0);     // 4-byte words
    test_rows(300, 500, 7, 0);      // bytes
    test_rows(40, 30, 70000, 0);    // long rows
    test_kv_copy(2 * 64 * sizeof(float));
    test_kv_copy(12);
    test_kv_copy(6);

    const size_t nh = 65536, nr = (size_t)1 << 20, nf = 3 * nh + nr;
    uint16_t *h = kt_malloc(nh * sizeof(uint16_t));
    uint32_t *f = kt_malloc(nf * sizeof(uint32_t));
    for (size_t i = 0; i < nh; i++) h[i] = (uint16_t)i;
    for (size_t i = 0; i < nh; i++) {   // NaN patterns included: the payload rule too
        f[3 * i] = (uint32_t)i << 16 | 0x8000u;
        f[3 * i + 1] = (uint32_t)i << 16 | 0x7fffu;
        f[3 * i + 2] = (uint32_t)i << 16 | 0x0001u;
    }
    for (size_t i = 0; i < nr; i++) {
        uint32_t hi = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        uint32_t lo = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        f[3 * nh + i] = hi << 16 | lo;
    }
    size_t bytes = nh * sizeof(float) + nf * 2;
    a = kt_malloc(bytes);
    b = kt_malloc(bytes);
    casts_run(0, a, h, nh, (const float *)f, nf);
    casts_run(1, b, h, nh, (const float *)f, nf);
    same_bytes("cast bf16<->f32", a, b, bytes);
    free(h); free(f); free(a); free(b);
}

// --- sampling ---------------------------------------------------------------------------------

typedef struct smp_arg {
    int32_t B, V;
    float *logits;
    tr_sample_row *rows;
} smp_arg;

typedef struct smp_out {
    int32_t *ids, n_near;
    float *lp, *lp_lsm;   // the op's logprobs; logsoftmax_forward's for the drawn ids
} smp_out;

// sample over rows [b0, b0 + nb) on one backend, n_near counted from 0; then that backend's
// logsoftmax_forward with the drawn ids as targets.
static void smp_run(int gpu, const smp_arg *s, int32_t b0, int32_t nb, smp_out *o) {
    tr_backend *be = be_of(gpu);
    float *x = putf(gpu, s->logits + (size_t)b0 * s->V, (size_t)nb * s->V);
    tr_sample_row *rows = put(gpu, s->rows + b0, (size_t)nb * sizeof(tr_sample_row));
    int32_t zero = 0, *ids = puti(gpu, NULL, nb), *n_near = puti(gpu, &zero, 1);
    float *lp = putf(gpu, NULL, nb), *lp_lsm = putf(gpu, NULL, nb), *lse = putf(gpu, NULL, nb);
    void *scratch = put(gpu, NULL, be->ops->sample_scratch_bytes(be, nb, s->V));
    be->ops->sample(be, ids, lp, x, rows, nb, s->V, scratch, n_near);
    be->ops->logsoftmax_forward(be, lp_lsm, NULL, lse, x, ids, nb, s->V);
    get(gpu, o->ids, ids, (size_t)nb * sizeof(int32_t));
    get(gpu, &o->n_near, n_near, sizeof(int32_t));
    getf(gpu, o->lp, lp, nb);
    getf(gpu, o->lp_lsm, lp_lsm, nb);
    bufs_free(gpu);
}

static void smp_out_alloc(smp_out *o, int32_t B) {
    o->ids = kt_malloc((size_t)B * sizeof(int32_t));
    o->lp = kt_floats(B);
    o->lp_lsm = kt_floats(B);
}

static void smp_out_free(smp_out *o) { free(o->ids); free(o->lp); free(o->lp_lsm); }

enum { SMP_RANDOM, SMP_TIED, SMP_ZEROS, SMP_EQUAL };

// B rows over every parameter combination (greedy, temperatures, top-k below, at and past V,
// top-p), each row with its own stream position. CUDA draws the CPU's ids except in draws it
// counts as near (each mismatched row, drawn alone, must count 1), and near draws are rare;
// its logprobs are its logsoftmax_forward's bits; two CUDA runs agree bitwise; a row drawn
// alone equals the batch's. `expect_near`: draws the rows are built to make near.
static void test_sample(int32_t B, int32_t V, int kind, uint64_t salt, float top_p_all,
                        int32_t expect_near) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    smp_arg s = {.B = B, .V = V, .logits = kt_floats((size_t)B * V),
                 .rows = kt_malloc((size_t)B * sizeof(tr_sample_row))};
    for (int32_t b = 0; b < B; b++) {
        float *lg = s.logits + (size_t)b * V;
        for (int32_t i = 0; i < V; i++) {
            double x = 4.0 * kt_uniform();
            lg[i] = kind == SMP_TIED ? (float)(floor(x * 2.0) / 2.0)
                    : kind == SMP_ZEROS ? (i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : (float)(x - 4.5))
                    : kind == SMP_EQUAL ? 0.5f
                                        : (float)x;
        }
        uint64_t c = salt + (uint64_t)b * 13;
        s.rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                    .top_p = top_ps[c / 24 % 4],
                                    .seed = 0x9e3779b97f4a7c15ull * (salt + 1) + (uint64_t)b,
                                    .counter = (uint64_t)(b * 37 % 1000), .used = 4};
        if (b % 3 == 1) s.rows[b].used = 1 + b % 3;   // inside a block (counter >= 1)
        if (s.rows[b].used < 4 && s.rows[b].counter == 0) s.rows[b].counter = 1;
        if (top_p_all > 0.0f) {
            s.rows[b].temperature = 1.0f;
            s.rows[b].top_k = 0;
            s.rows[b].top_p = top_p_all;
        }
    }
    smp_out cpu, g1, g2, alone;
    smp_out_alloc(&cpu, B);
    smp_out_alloc(&g1, B);
    smp_out_alloc(&g2, B);
    smp_out_alloc(&alone, 1);
    smp_run(0, &s, 0, B, &cpu);
    smp_run(1, &s, 0, B, &g1);
    smp_run(1, &s, 0, B, &g2);
    CHECKF(memcmp(g1.ids, g2.ids, (size_t)B * sizeof(int32_t)) == 0 &&
           kt_same_bits(g1.lp, g2.lp, B) && g1.n_near == g2.n_near,
           "sample B=%d V=%d: two cuda runs differ", B, V);
    CHECKF(kt_same_bits(g1.lp, g1.lp_lsm, B),
           "sample B=%d V=%d: logprobs are not cuda logsoftmax_forward's", B, V);
    int32_t mismatched = 0, uncounted = 0, batch_alone = 1;
    for (int32_t b = 0; b < B; b++) {
        smp_run(1, &s, b, 1, &alone);
        batch_alone &= alone.ids[0] == g1.ids[b] && kt_same_bits(alone.lp, &g1.lp[b], 1);
        if (cpu.ids[b] == g1.ids[b]) continue;
        mismatched++;
        uncounted += alone.n_near != 1;
        printf("  sample row %d: cpu %d, cuda %d (near on cuda: %d)\n", b, cpu.ids[b],
               g1.ids[b], alone.n_near);
    }
    CHECKF(batch_alone, "sample B=%d V=%d: rows drawn alone differ from the batch", B, V);
    CHECKF(uncounted == 0, "sample B=%d V=%d: %d of %d differing draws not counted near", B, V,
           uncounted, mismatched);
    CHECKF(g1.n_near >= mismatched && g1.n_near >= expect_near,
           "sample B=%d V=%d: n_near %d below %d mismatches or %d built near draws", B, V,
           g1.n_near, mismatched, expect_near);
    // A uniform target falls within 1e-12 of the total of one of the kept set's boundaries
    // with probability at most 2e-12 * V per draw (< 1e-6 here): even 2 extra near draws are
    // wildly unlikely, so more means the count or the sums are wrong.
    CHECKF(g1.n_near <= expect_near + 2, "sample B=%d V=%d: %d near draws", B, V, g1.n_near);
    // the same id's logprob on both backends: logsoftmax rounding apart, TOL as above
    float *lc = kt_floats(B), *lg = kt_floats(B);
    int32_t m = 0;
    for (int32_t b = 0; b < B; b++)
        if (cpu.ids[b] == g1.ids[b]) {
            lc[m] = cpu.lp[b];
            lg[m++] = g1.lp[b];
        }
    double e = tr_test_rel_err(lg, lc, (size_t)m);
    CHECKF(e <= TOL, "sample B=%d V=%d: logprob rel err %.3g", B, V, e);
    printf("  sample B=%-3d V=%-6d ids differing %d, near cpu %d cuda %d, logprob err %.2e\n",
           B, V, mismatched, cpu.n_near, g1.n_near, e);
    free(lc); free(lg);
    smp_out_free(&cpu); smp_out_free(&g1); smp_out_free(&g2); smp_out_free(&alone);
    free(s.logits); free(s.rows);
}

// Scratch sized for B rows must serve fewer (callers size it once for their largest batch).
static void test_sample_scratch(void) {
    int mono = 1;
    static const int32_t vs[] = {1, 1000, 152064};
    for (int i = 0; i < 3; i++) {
        size_t prev = 0;
        for (int32_t B = 1; B <= 512; B++) {
            size_t b = gpu_be.ops->sample_scratch_bytes(&gpu_be, B, vs[i]);
            mono &= b >= prev;
            prev = b;
        }
    }
    CHECKF(mono, "sample_scratch_bytes is not monotone in B");
}

static int section(const char *only, const char *name) {
    return !only || strcmp(only, name) == 0;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    int n_dev = tr_cuda_device_count();
    if (n_dev == 0) {
        printf("test_cuda_ops: no CUDA device, skipped\n");
        return 77;
    }
    char msg[512];
    tr_cuda_device_info info;
    if (tr_cuda_device_query(0, &info, msg, sizeof msg) != 0) die("device", msg);
    printf("device 0: %s, sm_%d%d, %d SMs\n", info.name, info.major, info.minor, info.n_sms);
    kt_backend(&cpu_be, 2);
    if (tr_backend_cuda_init(&gpu_be, 0) != 0) {
        tr_backend_cuda_status(&gpu_be, msg, sizeof msg);
        die("tr_backend_cuda_init", msg);
    }
    kt_seed(14);
    if (section(only, "matmul")) {
        test_matmul(70, 96, 130);      // odd sizes: no tile divides them
        test_matmul(256, 512, 256);
        test_matmul(1, 33, 8);
    }
    if (section(only, "embedding")) {
        test_embedding(300, 96, 50, 0);
        test_embedding(1, 33, 5, 0);
        test_embedding(5000, 600, 7, 0);        // long runs; three column blocks
        test_embedding(4096, 64, 100000, 3);    // mostly distinct ids, one on every third token
        test_embedding_scratch();
    }
    if (section(only, "rmsnorm")) test_rmsnorm();
    if (section(only, "rope")) test_rope();
    if (section(only, "attention")) {
        test_attention(300, 3, (const int32_t[]){0, 37, 38, 300}, 4, 2, 64);
        test_attention(160, 1, (const int32_t[]){0, 160}, 8, 2, 128);
        test_attention(50, 2, (const int32_t[]){0, 20, 50}, 3, 3, 24);   // MHA, D below a warp
    }
    if (section(only, "elementwise")) test_elementwise(100003);
    if (section(only, "sumsq")) test_sumsq();
    if (section(only, "logsoftmax")) {
        test_logsoftmax(40, 3001);
        test_logsoftmax(3, 100);
    }
    if (section(only, "buffers")) test_buffers();
    if (section(only, "sample")) {
        test_sample(96, 1000, SMP_RANDOM, 0, 0.0f, 0);
        test_sample(96, 1000, SMP_TIED, 1, 0.0f, 0);
        test_sample(96, 257, SMP_ZEROS, 2, 0.0f, 0);
        test_sample(96, 5, SMP_TIED, 3, 0.0f, 0);
        test_sample(96, 3000, SMP_RANDOM, 4, 0.0f, 0);
        test_sample(4, 1000, SMP_EQUAL, 6, 0.5f, 4);       // the cut meets top_p's limit exactly
        test_sample_scratch();
    }
    if (section(only, "sample_vocab"))   // apart: slow under compute-sanitizer
        test_sample(24, 152064, SMP_RANDOM, 5, 0.0f, 0);   // a real vocabulary
    CHECKF(tr_backend_cuda_status(&gpu_be, msg, sizeof msg) == 0, "cuda backend: %s", msg);
    tr_backend_cuda_free(&gpu_be);
    tr_backend_cpu_free(&cpu_be);
    return tr_test_summary("test_cuda_ops");
}
