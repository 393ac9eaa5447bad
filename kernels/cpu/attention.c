// Causal grouped-query attention on the CPU: the training forward/backward over packed
// documents and the decode step over the paged KV cache. Forward and decode compute a query
// row with the same function (attn_row), keys in the same order and chunks, so a decoded
// token's output is bitwise the training forward's row. The backward works on gemm tiles.
// q, k, v are rows of stride ld (a fused [q;k;v] read in place) in the activation dtype;
// scores, softmax and sums are fp32, and every output is rounded once at its end.
// A document with a shared prefix (tr_doc_layout.prefix) reads the prefix's keys first and
// its own after them, in context order, so its rows have the unshared layout's bits; in the
// backward the prefix's keys also collect the gradients of every document that shares it.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/vec.h"

#define ATT_Q_ROWS 16     // query rows per forward task
#define ATT_CHUNK 64      // keys per online-softmax chunk (scores live on the stack)
#define ATT_TILE 64       // query and key rows per backward tile (two 16 KiB stack tiles)
// Channels of a bf16 output row (forward) or of an fp32 gradient tile (backward) held on the
// stack at once; a larger head dimension is done in passes that recompute the scores.
#define ATT_D_CHUNK 256

// The keys and values one query row may read, for one kv head: key j sits at k + slot(j).
typedef struct kv_rows {
    const void *k, *v;
    tr_dt t;
    size_t stride;              // elements between consecutive slots
    const int32_t *blocks;      // NULL: rows of a batch, as below; else paged through these
    int32_t block_size;
    // rows of a batch: keys 0..pre_n-1 are rows pre_first.., the rest rows first..
    int32_t first, pre_first, pre_n;
} kv_rows;

static inline size_t kv_slot(const kv_rows *s, int32_t j) {
    if (!s->blocks) {
        size_t row = (size_t)(j < s->pre_n ? s->pre_first + j : s->first + j - s->pre_n);
        return row * s->stride;
    }
    size_t slot = (size_t)s->blocks[j / s->block_size] * (size_t)s->block_size +
                  (size_t)(j % s->block_size);
    return slot * s->stride;
}

static inline float attn_scale(int32_t D) { return (float)(1.0 / sqrt((double)D)); }

// One query row over keys 0..n-1, online softmax in chunks of ATT_CHUNK keys: scores of a
// chunk, then a rescale of the running output if the maximum grew, then p-weighted values.
// The running output is channels [d0, d0 + dn) of the row, in acc; every channel is its own
// chain, so a row done in several passes of channels has the bits of one pass.
static void attn_row(float *acc, int32_t d0, int32_t dn, float *lse, const void *q,
                     const kv_rows *s, int32_t n, int32_t D, float scale) {
    const float *kf[ATT_CHUNK], *vf[ATT_CHUNK];
    const uint16_t *kh[ATT_CHUNK], *vh[ATT_CHUNK];
    const bool bf = s->t == TR_BF16;
    float sc[ATT_CHUNK];
    float m = -INFINITY;
    double l = 0.0;
    for (int32_t d = 0; d < dn; d++) acc[d] = 0.0f;
    for (int32_t c0 = 0; c0 < n; c0 += ATT_CHUNK) {
        int32_t cn = n - c0 < ATT_CHUNK ? n - c0 : ATT_CHUNK;
        for (int32_t j = 0; j < cn; j++) {
            size_t o = kv_slot(s, c0 + j);
            if (bf) {
                kh[j] = (const uint16_t *)s->k + o;
                vh[j] = (const uint16_t *)s->v + o + d0;
            } else {
                kf[j] = (const float *)s->k + o;
                vf[j] = (const float *)s->v + o + d0;
            }
        }
        if (bf) tr_vec_dots_bf16(sc, kh, cn, q, D);
        else tr_vec_dots(sc, kf, cn, q, D);
        float cm = -INFINITY;
        for (int32_t j = 0; j < cn; j++) {
            sc[j] *= scale;
            if (sc[j] > cm) cm = sc[j];
        }
        if (cm > m) {
            if (l > 0.0) {
                float r = expf(m - cm);
                tr_vec_scale(acc, r, dn);
                l *= r;
            }
            m = cm;
        }
        for (int32_t j = 0; j < cn; j++) {
            sc[j] = expf(sc[j] - m);
            l += sc[j];
        }
        if (bf) tr_vec_axpy_rows_bf16(acc, sc, vh, cn, dn);
        else tr_vec_axpy_rows(acc, sc, vf, cn, dn);
    }
    tr_vec_scale(acc, (float)(1.0 / l), dn);
    if (lse) *lse = (float)((double)m + log(l));
}

// A query row's output (D values at element out_off of out, dtype s->t): an fp32 row is its
// own accumulator; a bf16 row is accumulated on the stack and rounded once.
static void attn_row_out(void *out, size_t out_off, float *lse, const void *q,
                         const kv_rows *s, int32_t n, int32_t D, float scale) {
    if (s->t == TR_F32) {
        attn_row((float *)out + out_off, 0, D, lse, q, s, n, D, scale);
        return;
    }
    float acc[ATT_D_CHUNK];
    for (int32_t d0 = 0; d0 < D; d0 += ATT_D_CHUNK) {
        int32_t dn = D - d0 < ATT_D_CHUNK ? D - d0 : ATT_D_CHUNK;
        attn_row(acc, d0, dn, d0 == 0 ? lse : NULL, q, s, n, D, scale);
        tr_st_row(out, out_off + (size_t)d0, acc, dn, s->t);
    }
}

// sum_d dout[d] * out[d]: the softmax backward's row term, in double.
static inline float attn_row_delta(const void *dout, const void *out, size_t off, int32_t D,
                                   tr_dt t) {
    double acc = 0.0;
    for (int32_t d = 0; d < D; d++)
        acc += (double)tr_ld(dout, off + d, t) * tr_ld(out, off + d, t);
    return (float)acc;
}

// The shared prefix of document d: its first row and length (0: none).
static inline int32_t attn_prefix(const tr_doc_layout *docs, int32_t d, int32_t *first) {
    int32_t p = docs->prefix ? docs->prefix[d] : -1;
    *first = p >= 0 ? docs->doc_start[p] : 0;
    return p >= 0 ? docs->doc_start[p + 1] - docs->doc_start[p] : 0;
}

// Documents d+1.. that share document d as their prefix: the end of their run.
static inline int32_t attn_sharers_end(const tr_doc_layout *docs, int32_t d) {
    int32_t e = d + 1;
    while (docs->prefix && e < docs->n_docs && docs->prefix[e] == d) e++;
    return e;
}

// Index of the document holding token t (doc_start is sorted, n_docs + 1 entries).
static int32_t attn_doc_of(const tr_doc_layout *docs, int32_t t) {
    int32_t lo = 0, hi = docs->n_docs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (docs->doc_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef struct attn_job {
    void *out, *dq, *dk, *dv;
    float *lse;
    const void *q, *k, *v, *dout, *out_in;
    const float *lse_in;
    tr_dt t;   // the activation dtype of every q/k/v/out buffer
    size_t ld;    // row stride of q, k, v (and dq, dk, dv)
    const tr_doc_layout *docs;
    int32_t T, H, KVH, D;
    float scale;
    // decode
    const tr_kv_pages *kv;
    const int32_t *block_table, *seq_len;
    int32_t max_blocks;
    tr_gemm_isa isa;   // the backward's tile products run inside pool tasks
} attn_job;

// Single-core time estimate for tr_cpu_run: ~4 flops per (query, key, channel) at ~8/ns.
static double attn_work_ns(const tr_doc_layout *docs, int32_t H, int32_t D) {
    double pairs = 0;
    for (int32_t d = 0; d < docs->n_docs; d++) {
        int32_t pf;
        double len = docs->doc_start[d + 1] - docs->doc_start[d];
        pairs += 0.5 * len * (len + 1) + len * attn_prefix(docs, d, &pf);
    }
    return 0.5 * pairs * H * D;
}

static void attn_forward_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t h = task % j->H, t0 = (task / j->H) * ATT_Q_ROWS;
    int32_t t1 = t0 + ATT_Q_ROWS < j->T ? t0 + ATT_Q_ROWS : j->T;
    int32_t kvh = h / (j->H / j->KVH);
    int32_t d = attn_doc_of(j->docs, t0);
    size_t head = (size_t)kvh * j->D;
    kv_rows s = {.k = tr_at(j->k, head, j->t), .v = tr_at(j->v, head, j->t), .t = j->t,
                 .stride = j->ld};
    for (int32_t t = t0; t < t1; t++) {
        while (j->docs->doc_start[d + 1] <= t) d++;
        s.first = j->docs->doc_start[d];
        s.pre_n = attn_prefix(j->docs, d, &s.pre_first);
        size_t row = (size_t)t * j->H + h;
        const void *q = tr_at(j->q, (size_t)t * j->ld + (size_t)h * j->D, j->t);
        attn_row_out(j->out, row * j->D, j->lse + row, q, &s, s.pre_n + t - s.first + 1, j->D,
                     j->scale);
    }
}

void tr_cpu_attention_forward(tr_backend *be, void *out, float *lse, const void *q,
                              const void *k, const void *v, int32_t ld,
                              const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0) return;
    attn_job j = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .t = be->act,
                  .ld = (size_t)ld, .docs = docs, .T = T, .H = H, .KVH = KVH, .D = D,
                  .scale = attn_scale(D)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_Q_ROWS) * H, attn_forward_task, &j,
               attn_work_ns(docs, H, D));
}

// The backward recomputes probabilities tile by tile from the saved lse, FlashAttention-2
// style, with gemm products on ATT_TILE x ATT_TILE tiles (it need not match the forward's
// bits, only its own across thread counts). Two passes avoid racing writes: dq by query
// tiles, then dk and dv by key tiles, each recomputing S = Q K^T and dP = dO V^T. Each pass
// sums a gradient tile in fp32 on the stack and stores it once.
// With a query tile [i0, i1) and a key tile [k0, k1) of one document (causal) or of the
// query's shared prefix (every key seen), it fills p = softmax probabilities (0 above the
// diagonal) and ds = dS = p (dP - delta) * scale.
static void attn_tile_grads(const attn_job *j, int32_t h, int32_t i0, int32_t i1, int32_t k0,
                            int32_t k1, bool causal, const float *delta, float *p, float *ds) {
    int32_t D = j->D, g = h / (j->H / j->KVH), qn = i1 - i0, kn = k1 - k0;
    size_t q_off = (size_t)i0 * j->ld + (size_t)h * D, kv_off = (size_t)k0 * j->ld + (size_t)g * D;
    // p = Q K^T, ds = dO V^T: B(d, b) = K[b, d]
    tr_gemm s = {.M = qn, .N = kn, .K = D, .a = tr_at(j->q, q_off, j->t),
                 .a_rs = (ptrdiff_t)j->ld, .a_ks = 1, .a_t = j->t,
                 .b = tr_at(j->k, kv_off, j->t), .b_ks = 1, .b_cs = (ptrdiff_t)j->ld,
                 .b_t = j->t, .c = p, .ldc = kn, .c_t = TR_F32};
    tr_gemm_serial(j->isa, &s);
    s.a = tr_at(j->dout, ((size_t)i0 * j->H + h) * D, j->t);
    s.a_rs = (ptrdiff_t)j->H * D;
    s.b = tr_at(j->v, kv_off, j->t);
    s.c = ds;
    tr_gemm_serial(j->isa, &s);
    for (int32_t a = 0; a < qn; a++) {
        float lse = j->lse_in[(size_t)(i0 + a) * j->H + h];
        int32_t visible = causal ? i0 + a - k0 + 1 : kn;   // keys k0 .. i0+a
        if (visible > kn) visible = kn;
        float *pr = p + (size_t)a * kn, *dr = ds + (size_t)a * kn;
        for (int32_t b = 0; b < kn; b++) {
            float pb = b < visible ? expf(pr[b] * j->scale - lse) : 0.0f;
            pr[b] = pb;
            dr[b] = pb * (dr[b] - delta[a]) * j->scale;
        }
    }
}

static void attn_tile_delta(const attn_job *j, int32_t h, int32_t i0, int32_t i1, float *delta) {
    for (int32_t i = i0; i < i1; i++)
        delta[i - i0] = attn_row_delta(j->dout, j->out_in, ((size_t)i * j->H + h) * j->D, j->D,
                                       j->t);
}

// n rows of dn fp32 channels (tile rows ATT_D_CHUNK apart) into rows of stride ld of the
// gradient dst from element off: the tile's one rounding.
static void attn_store_tile(void *dst, size_t off, size_t ld, const float *tile, int32_t n,
                            int32_t dn, tr_dt t) {
    for (int32_t r = 0; r < n; r++)
        tr_st_row(dst, off + (size_t)r * ld, tile + (size_t)r * ATT_D_CHUNK, dn, t);
}

// dq[i0:i1] (+)= dS @ K[k0:k1] over channels [c0, c0 + cn): one link of the chain.
static void attn_dq_tile(const attn_job *j, int32_t h, int32_t i0, int32_t i1, int32_t k0,
                         int32_t k1, bool causal, int32_t c0, int32_t cn, bool first,
                         const float *delta, float *p, float *ds, float *dq) {
    int32_t g = h / (j->H / j->KVH);
    attn_tile_grads(j, h, i0, i1, k0, k1, causal, delta, p, ds);
    size_t k_off = (size_t)k0 * j->ld + (size_t)g * j->D + (size_t)c0;
    tr_gemm t = {.M = i1 - i0, .N = cn, .K = k1 - k0, .a = ds, .a_rs = k1 - k0, .a_ks = 1,
                 .a_t = TR_F32, .b = tr_at(j->k, k_off, j->t), .b_ks = (ptrdiff_t)j->ld,
                 .b_cs = 1, .b_t = j->t, .c = dq, .ldc = ATT_D_CHUNK, .c_t = TR_F32,
                 .accumulate = !first};
    tr_gemm_serial(j->isa, &t);
}

// dq for one query tile of one head, split at document edges; key tiles in context order
// (the shared prefix's, then the document's own).
static void attn_backward_dq_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t h = task % j->H, t0 = (task / j->H) * ATT_TILE;
    int32_t t1 = t0 + ATT_TILE < j->T ? t0 + ATT_TILE : j->T;
    int32_t D = j->D;
    float p[ATT_TILE * ATT_TILE], ds[ATT_TILE * ATT_TILE], delta[ATT_TILE];
    float dq[ATT_TILE * ATT_D_CHUNK];
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t i0 = t0; i0 < t1;) {
        while (j->docs->doc_start[d + 1] <= i0) d++;
        int32_t start = j->docs->doc_start[d], end = j->docs->doc_start[d + 1], pf;
        int32_t pn = attn_prefix(j->docs, d, &pf);
        int32_t i1 = end < t1 ? end : t1;
        attn_tile_delta(j, h, i0, i1, delta);
        for (int32_t c0 = 0; c0 < D; c0 += ATT_D_CHUNK) {
            int32_t cn = D - c0 < ATT_D_CHUNK ? D - c0 : ATT_D_CHUNK;
            bool first = true;
            for (int32_t k0 = pf; k0 < pf + pn; k0 += ATT_TILE, first = false)
                attn_dq_tile(j, h, i0, i1, k0, k0 + ATT_TILE < pf + pn ? k0 + ATT_TILE : pf + pn,
                             false, c0, cn, first, delta, p, ds, dq);
            for (int32_t k0 = start; k0 < i1; k0 += ATT_TILE, first = false)
                attn_dq_tile(j, h, i0, i1, k0, k0 + ATT_TILE < i1 ? k0 + ATT_TILE : i1, true, c0,
                             cn, first, delta, p, ds, dq);
            attn_store_tile(j->dq, (size_t)i0 * j->ld + (size_t)h * D + (size_t)c0, j->ld, dq,
                            i1 - i0, cn, j->t);
        }
        i0 = i1;
    }
}

// dv[k0:k1] (+)= P^T @ dO[i0:i1]; dk[k0:k1] (+)= dS^T @ Q[i0:i1] over channels [c0, c0 + cn),
// for the query tiles of [q0, q1) in order: links of the chains.
static void attn_dkv_tiles(const attn_job *j, int32_t h, int32_t q0, int32_t q1, int32_t k0,
                           int32_t k1, bool causal, int32_t c0, int32_t cn, bool *first,
                           float *delta, float *p, float *ds, float *dk, float *dv) {
    int32_t D = j->D, kn = k1 - k0;
    for (int32_t i0 = q0; i0 < q1; i0 += ATT_TILE) {
        int32_t i1 = i0 + ATT_TILE < q1 ? i0 + ATT_TILE : q1, qn = i1 - i0;
        attn_tile_delta(j, h, i0, i1, delta);
        attn_tile_grads(j, h, i0, i1, k0, k1, causal, delta, p, ds);
        // A(b, a) = p[a, b]
        size_t o_off = ((size_t)i0 * j->H + h) * D + (size_t)c0;
        size_t q_off = (size_t)i0 * j->ld + (size_t)h * D + (size_t)c0;
        tr_gemm t = {.M = kn, .N = cn, .K = qn, .a = p, .a_rs = 1, .a_ks = kn, .a_t = TR_F32,
                     .b = tr_at(j->dout, o_off, j->t), .b_ks = (ptrdiff_t)j->H * D, .b_cs = 1,
                     .b_t = j->t, .c = dv, .ldc = ATT_D_CHUNK, .c_t = TR_F32,
                     .accumulate = !*first};
        if (j->dv) tr_gemm_serial(j->isa, &t);
        t.a = ds;
        t.b = tr_at(j->q, q_off, j->t);
        t.b_ks = (ptrdiff_t)j->ld;
        t.c = dk;
        if (j->dk) tr_gemm_serial(j->isa, &t);
        *first = false;
    }
}

// dk, dv for one key tile of one kv head, split at document edges: the group's heads in
// order, and for each the query tiles that see the keys, in order: the document's own from
// the tile on, then, for a shared prefix, those of every document sharing it.
static void attn_backward_dkv_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t g = task % j->KVH, t0 = (task / j->KVH) * ATT_TILE;
    int32_t t1 = t0 + ATT_TILE < j->T ? t0 + ATT_TILE : j->T;
    int32_t D = j->D, group = j->H / j->KVH;
    float p[ATT_TILE * ATT_TILE], ds[ATT_TILE * ATT_TILE], delta[ATT_TILE];
    float dk[ATT_TILE * ATT_D_CHUNK], dv[ATT_TILE * ATT_D_CHUNK];
    const int32_t *ds_ = j->docs->doc_start;
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t k0 = t0; k0 < t1;) {
        while (ds_[d + 1] <= k0) d++;
        int32_t end = ds_[d + 1], sharers = attn_sharers_end(j->docs, d);
        int32_t k1 = end < t1 ? end : t1, kn = k1 - k0;
        for (int32_t c0 = 0; c0 < D; c0 += ATT_D_CHUNK) {
            int32_t cn = D - c0 < ATT_D_CHUNK ? D - c0 : ATT_D_CHUNK;
            bool first = true;
            for (int32_t h = g * group; h < (g + 1) * group; h++) {
                attn_dkv_tiles(j, h, k0, end, k0, k1, true, c0, cn, &first, delta, p, ds, dk,
                               dv);
                for (int32_t e = d + 1; e < sharers; e++)
                    attn_dkv_tiles(j, h, ds_[e], ds_[e + 1], k0, k1, false, c0, cn, &first,
                                   delta, p, ds, dk, dv);
            }
            size_t kv_off = (size_t)k0 * j->ld + (size_t)g * D + (size_t)c0;
            if (j->dv) attn_store_tile(j->dv, kv_off, j->ld, dv, kn, cn, j->t);
            if (j->dk) attn_store_tile(j->dk, kv_off, j->ld, dk, kn, cn, j->t);
        }
        k0 = k1;
    }
}

void tr_cpu_attention_backward(tr_backend *be, void *dq, void *dk, void *dv, const void *dout,
                               const void *out, const float *lse, const void *q, const void *k,
                               const void *v, int32_t ld, const tr_doc_layout *docs, int32_t H,
                               int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0) return;
    attn_job j = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out_in = out, .lse_in = lse,
                  .q = q, .k = k, .v = v, .t = be->act, .ld = (size_t)ld, .docs = docs, .T = T,
                  .H = H, .KVH = KVH, .D = D, .scale = attn_scale(D), .isa = tr_cpu_isa(be)};
    // gemm tiles run ~4x faster than the forward's row loops
    double work = 0.4 * attn_work_ns(docs, H, D);
    if (dq) tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_TILE) * H, attn_backward_dq_task, &j, work);
    if (dk || dv)
        tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_TILE) * KVH, attn_backward_dkv_task, &j, work);
}

static void attn_decode_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    const tr_kv_pages *kv = j->kv;
    int32_t b = task / j->H, h = task % j->H;
    int32_t D = kv->head_dim, kvh = h / (j->H / kv->n_kv_heads);
    size_t head = (size_t)kvh * D;
    kv_rows s = {.k = tr_at(kv->k_pool, head, j->t), .v = tr_at(kv->v_pool, head, j->t),
                 .t = j->t, .stride = (size_t)kv->n_kv_heads * D,
                 .blocks = j->block_table + (size_t)b * j->max_blocks,
                 .block_size = kv->block_size};
    const void *q = tr_at(j->q, (size_t)b * j->ld + (size_t)h * D, j->t);
    attn_row_out(j->out, ((size_t)b * j->H + h) * D, NULL, q, &s, j->seq_len[b], D, j->scale);
}

void tr_cpu_attention_decode(tr_backend *be, void *out, const void *q, int32_t ld,
                             const tr_kv_pages *kv, const int32_t *block_table,
                             int32_t max_blocks, const int32_t *seq_len, int32_t B, int32_t H) {
    if (B <= 0) return;
    attn_job j = {.out = out, .q = q, .t = be->act, .ld = (size_t)ld, .kv = kv,
                  .block_table = block_table, .max_blocks = max_blocks, .seq_len = seq_len,
                  .H = H, .scale = attn_scale(kv->head_dim)};
    double work = 0;   // ~4 flops per key and channel at ~8 flops/ns
    for (int32_t b = 0; b < B; b++) work += 0.5 * seq_len[b] * H * kv->head_dim;
    tr_cpu_run(be, B * H, attn_decode_task, &j, work);
}
