// Causal grouped-query attention on the CPU: the training forward/backward over packed
// documents and the decode step over the paged KV cache. Both paths compute a query row with
// the same function (attn_row), visiting keys in the same order with the same chunking, so a
// decoded token's output is bitwise the row the training forward computes for it.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"

#define ATT_Q_ROWS 16     // query rows per forward / dq task
#define ATT_K_ROWS 32     // key rows per dk/dv task
#define ATT_CHUNK 64      // keys per online-softmax chunk (scores live on the stack)

// The keys and values one query row may read, for one kv head: key j sits at k + slot(j).
typedef struct kv_rows {
    const float *k, *v;
    size_t stride;              // floats between consecutive slots
    const int32_t *blocks;      // NULL: slot j is row j; else paged through this block list
    int32_t block_size;
} kv_rows;

static inline size_t kv_slot(const kv_rows *s, int32_t j) {
    if (!s->blocks) return (size_t)j * s->stride;
    size_t slot = (size_t)s->blocks[j / s->block_size] * (size_t)s->block_size +
                  (size_t)(j % s->block_size);
    return slot * s->stride;
}

static inline float attn_scale(int32_t D) { return (float)(1.0 / sqrt((double)D)); }

// One query row over keys 0..n-1, online softmax in chunks of ATT_CHUNK keys: scores of a
// chunk, then a rescale of the running output if the maximum grew, then p-weighted values.
// The running output lives in out itself, so no scratch is needed for any D.
static void attn_row(float *out, float *lse, const float *q, const kv_rows *s, int32_t n,
                     int32_t D, float scale) {
    const float *kr[ATT_CHUNK], *vr[ATT_CHUNK];
    float sc[ATT_CHUNK];
    float m = -INFINITY;
    double l = 0.0;
    for (int32_t d = 0; d < D; d++) out[d] = 0.0f;
    for (int32_t c0 = 0; c0 < n; c0 += ATT_CHUNK) {
        int32_t cn = n - c0 < ATT_CHUNK ? n - c0 : ATT_CHUNK;
        for (int32_t j = 0; j < cn; j++) {
            size_t o = kv_slot(s, c0 + j);
            kr[j] = s->k + o;
            vr[j] = s->v + o;
        }
        tr_vec_dots(sc, kr, cn, q, D);
        float cm = -INFINITY;
        for (int32_t j = 0; j < cn; j++) {
            sc[j] *= scale;
            if (sc[j] > cm) cm = sc[j];
        }
        if (cm > m) {
            if (l > 0.0) {
                float r = expf(m - cm);
                tr_vec_scale(out, r, D);
                l *= r;
            }
            m = cm;
        }
        for (int32_t j = 0; j < cn; j++) {
            sc[j] = expf(sc[j] - m);
            l += sc[j];
        }
        tr_vec_axpy_rows(out, sc, vr, cn, D);
    }
    tr_vec_scale(out, (float)(1.0 / l), D);
    if (lse) *lse = (float)((double)m + log(l));
}

// sum_d dout[d] * out[d]: the softmax backward's row term, in double.
static inline float attn_row_delta(const float *dout, const float *out, int32_t D) {
    double acc = 0.0;
    for (int32_t d = 0; d < D; d++) acc += (double)dout[d] * out[d];
    return (float)acc;
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
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *out_in, *lse_in;
    const tr_doc_layout *docs;
    int32_t T, H, KVH, D;
    float scale;
    // decode
    const tr_kv_pages *kv;
    const int32_t *block_table, *seq_len;
    int32_t max_blocks;
} attn_job;

// Single-core time estimate for tr_cpu_run: ~4 flops per (query, key, channel) at ~8/ns.
static double attn_work_ns(const tr_doc_layout *docs, int32_t H, int32_t D) {
    double pairs = 0;
    for (int32_t d = 0; d < docs->n_docs; d++) {
        double len = docs->doc_start[d + 1] - docs->doc_start[d];
        pairs += 0.5 * len * (len + 1);
    }
    return 0.5 * pairs * H * D;
}

static kv_rows attn_doc_rows(const attn_job *j, const float *k, const float *v, int32_t start,
                             int32_t kvh) {
    size_t stride = (size_t)j->KVH * j->D;
    kv_rows s = {.k = k + (size_t)start * stride + (size_t)kvh * j->D,
                 .v = v + (size_t)start * stride + (size_t)kvh * j->D,
                 .stride = stride, .blocks = NULL, .block_size = 0};
    return s;
}

static void attn_forward_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t h = task % j->H, t0 = (task / j->H) * ATT_Q_ROWS;
    int32_t t1 = t0 + ATT_Q_ROWS < j->T ? t0 + ATT_Q_ROWS : j->T;
    int32_t kvh = h / (j->H / j->KVH);
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t t = t0; t < t1; t++) {
        while (j->docs->doc_start[d + 1] <= t) d++;
        int32_t start = j->docs->doc_start[d];
        kv_rows s = attn_doc_rows(j, j->k, j->v, start, kvh);
        size_t row = (size_t)t * j->H + h;
        attn_row(j->out + row * j->D, j->lse + row, j->q + row * j->D, &s, t - start + 1, j->D,
                 j->scale);
    }
}

void tr_cpu_attention_forward(tr_backend *be, float *out, float *lse, const float *q,
                              const float *k, const float *v, const tr_doc_layout *docs,
                              int32_t H, int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0) return;
    attn_job j = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .docs = docs, .T = T, .H = H,
                  .KVH = KVH, .D = D, .scale = attn_scale(D)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_Q_ROWS) * H, attn_forward_task, &j,
               attn_work_ns(docs, H, D));
}

// dq for a block of query rows of one head: p and dp recomputed per chunk of keys, in order.
static void attn_backward_dq_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t h = task % j->H, t0 = (task / j->H) * ATT_Q_ROWS;
    int32_t t1 = t0 + ATT_Q_ROWS < j->T ? t0 + ATT_Q_ROWS : j->T;
    int32_t kvh = h / (j->H / j->KVH), D = j->D;
    const float *kr[ATT_CHUNK], *vr[ATT_CHUNK];
    float p[ATT_CHUNK], ds[ATT_CHUNK];
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t t = t0; t < t1; t++) {
        while (j->docs->doc_start[d + 1] <= t) d++;
        int32_t start = j->docs->doc_start[d], n = t - start + 1;
        kv_rows s = attn_doc_rows(j, j->k, j->v, start, kvh);
        size_t row = (size_t)t * j->H + h;
        const float *q = j->q + row * D, *go = j->dout + row * D;
        float *dq = j->dq + row * D;
        float lse = j->lse_in[row];
        float delta = attn_row_delta(go, j->out_in + row * D, D);
        for (int32_t c0 = 0; c0 < n; c0 += ATT_CHUNK) {
            int32_t cn = n - c0 < ATT_CHUNK ? n - c0 : ATT_CHUNK;
            for (int32_t i = 0; i < cn; i++) {
                size_t o = kv_slot(&s, c0 + i);
                kr[i] = s.k + o;
                vr[i] = s.v + o;
            }
            tr_vec_dots(p, kr, cn, q, D);
            tr_vec_dots(ds, vr, cn, go, D);
            for (int32_t i = 0; i < cn; i++) {
                p[i] = expf(p[i] * j->scale - lse);
                ds[i] = p[i] * (ds[i] - delta) * j->scale;
            }
            tr_vec_axpy_rows(dq, ds, kr, cn, D);
        }
    }
}

// dk, dv for a block of key rows of one kv head: every query of the group's heads that sees
// them, heads in order, then queries in order (taken in chunks whose softmax terms are kept
// on the stack). Split at document edges inside the block.
static void attn_backward_dkv_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t kvh = task % j->KVH, j0 = (task / j->KVH) * ATT_K_ROWS;
    int32_t j1 = j0 + ATT_K_ROWS < j->T ? j0 + ATT_K_ROWS : j->T;
    int32_t group = j->H / j->KVH, D = j->D;
    size_t kv_stride = (size_t)j->KVH * D;
    const float *qr[ATT_CHUNK], *gr[ATT_CHUNK];
    float lse[ATT_CHUNK], delta[ATT_CHUNK], p[ATT_CHUNK], ds[ATT_CHUNK];
    int32_t d = attn_doc_of(j->docs, j0);
    for (int32_t a = j0; a < j1;) {
        while (j->docs->doc_start[d + 1] <= a) d++;
        int32_t end = j->docs->doc_start[d + 1];
        int32_t b = end < j1 ? end : j1;
        for (int32_t h = kvh * group; h < (kvh + 1) * group; h++) {
            for (int32_t i0 = a; i0 < end; i0 += ATT_CHUNK) {
                int32_t i1 = i0 + ATT_CHUNK < end ? i0 + ATT_CHUNK : end;
                for (int32_t i = i0; i < i1; i++) {
                    size_t row = (size_t)i * j->H + h;
                    qr[i - i0] = j->q + row * D;
                    gr[i - i0] = j->dout + row * D;
                    lse[i - i0] = j->lse_in[row];
                    delta[i - i0] = attn_row_delta(gr[i - i0], j->out_in + row * D, D);
                }
                for (int32_t key = a; key < b && key < i1; key++) {
                    int32_t off = key > i0 ? key - i0 : 0, nq = i1 - i0 - off;
                    size_t o = (size_t)key * kv_stride + (size_t)kvh * D;
                    tr_vec_dots(p, qr + off, nq, j->k + o, D);
                    tr_vec_dots(ds, gr + off, nq, j->v + o, D);
                    for (int32_t i = 0; i < nq; i++) {
                        p[i] = expf(p[i] * j->scale - lse[off + i]);
                        ds[i] = p[i] * (ds[i] - delta[off + i]) * j->scale;
                    }
                    if (j->dv) tr_vec_axpy_rows(j->dv + o, p, gr + off, nq, D);
                    if (j->dk) tr_vec_axpy_rows(j->dk + o, ds, qr + off, nq, D);
                }
            }
        }
        a = b;
    }
}

void tr_cpu_attention_backward(tr_backend *be, float *dq, float *dk, float *dv,
                               const float *dout, const float *out, const float *lse,
                               const float *q, const float *k, const float *v,
                               const tr_doc_layout *docs, int32_t H, int32_t KVH, int32_t D) {
    int32_t T = docs->n_tokens;
    if (T <= 0) return;
    attn_job j = {.dq = dq, .dk = dk, .dv = dv, .dout = dout, .out_in = out, .lse_in = lse,
                  .q = q, .k = k, .v = v, .docs = docs, .T = T, .H = H, .KVH = KVH, .D = D,
                  .scale = attn_scale(D)};
    if (dq)
        tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_Q_ROWS) * H, attn_backward_dq_task, &j,
                   1.5 * attn_work_ns(docs, H, D));
    if (dk || dv)
        tr_cpu_run(be, tr_cpu_ceil_div(T, ATT_K_ROWS) * KVH, attn_backward_dkv_task, &j,
                   2.0 * attn_work_ns(docs, H, D));
}

static void attn_decode_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    const tr_kv_pages *kv = j->kv;
    int32_t b = task / j->H, h = task % j->H;
    int32_t D = kv->head_dim, kvh = h / (j->H / kv->n_kv_heads);
    size_t stride = (size_t)kv->n_kv_heads * D;
    kv_rows s = {.k = kv->k_pool + (size_t)kvh * D, .v = kv->v_pool + (size_t)kvh * D,
                 .stride = stride, .blocks = j->block_table + (size_t)b * j->max_blocks,
                 .block_size = kv->block_size};
    size_t row = (size_t)b * j->H + h;
    attn_row(j->out + row * D, NULL, j->q + row * D, &s, j->seq_len[b], D, j->scale);
}

void tr_cpu_attention_decode(tr_backend *be, float *out, const float *q, const tr_kv_pages *kv,
                             const int32_t *block_table, int32_t max_blocks,
                             const int32_t *seq_len, int32_t B, int32_t H) {
    if (B <= 0) return;
    attn_job j = {.out = out, .q = q, .kv = kv, .block_table = block_table,
                  .max_blocks = max_blocks, .seq_len = seq_len, .H = H,
                  .scale = attn_scale(kv->head_dim)};
    double work = 0;   // ~4 flops per key and channel at ~8 flops/ns
    for (int32_t b = 0; b < B; b++) work += 0.5 * seq_len[b] * H * kv->head_dim;
    tr_cpu_run(be, B * H, attn_decode_task, &j, work);
}
