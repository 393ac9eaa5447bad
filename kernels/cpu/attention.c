// Causal grouped-query attention on the CPU: the training forward/backward over packed
// documents and the decode step over the paged KV cache. Forward and decode compute a query
// row with the same function (attn_row), keys in the same order and chunks, so a decoded
// token's output is bitwise the training forward's row. The backward works on gemm tiles.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/vec.h"

#define ATT_Q_ROWS 16     // query rows per forward task
#define ATT_CHUNK 64      // keys per online-softmax chunk (scores live on the stack)
#define ATT_TILE 64       // query and key rows per backward tile (two 16 KiB stack tiles)

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
    tr_gemm_isa isa;   // the backward's tile products run inside pool tasks
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

// The backward recomputes probabilities tile by tile from the saved lse, FlashAttention-2
// style, with gemm products on ATT_TILE x ATT_TILE tiles (it need not match the forward's
// bits, only its own across thread counts). Two passes avoid racing writes: dq by query
// tiles, then dk and dv by key tiles, each recomputing S = Q K^T and dP = dO V^T.
// With a query tile [i0, i1) and a key tile [k0, k1) of one document, it fills
// p = softmax probabilities (0 above the diagonal) and ds = dS = p (dP - delta) * scale.
static void attn_tile_grads(const attn_job *j, int32_t h, int32_t i0, int32_t i1, int32_t k0,
                            int32_t k1, const float *delta, float *p, float *ds) {
    int32_t D = j->D, g = h / (j->H / j->KVH), qn = i1 - i0, kn = k1 - k0;
    int32_t ldq = j->H * D, ldk = j->KVH * D;
    const float *q = j->q + ((size_t)i0 * j->H + h) * D;
    const float *go = j->dout + ((size_t)i0 * j->H + h) * D;
    const float *k = j->k + ((size_t)k0 * j->KVH + g) * D;
    const float *v = j->v + ((size_t)k0 * j->KVH + g) * D;
    // p = Q K^T, ds = dO V^T: B(d, b) = K[b, d]
    tr_gemm s = {.M = qn, .N = kn, .K = D, .a = q, .a_rs = ldq, .a_ks = 1, .b = k, .b_ks = 1,
                 .b_cs = ldk, .c = p, .ldc = kn};
    tr_gemm_serial(j->isa, &s);
    s.a = go;
    s.b = v;
    s.c = ds;
    tr_gemm_serial(j->isa, &s);
    for (int32_t a = 0; a < qn; a++) {
        float lse = j->lse_in[(size_t)(i0 + a) * j->H + h];
        int32_t visible = i0 + a - k0 + 1;   // keys k0 .. i0+a
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
    for (int32_t i = i0; i < i1; i++) {
        size_t row = ((size_t)i * j->H + h) * j->D;
        delta[i - i0] = attn_row_delta(j->dout + row, j->out_in + row, j->D);
    }
}

// dq for one query tile of one head, split at document edges; key tiles in order.
static void attn_backward_dq_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t h = task % j->H, t0 = (task / j->H) * ATT_TILE;
    int32_t t1 = t0 + ATT_TILE < j->T ? t0 + ATT_TILE : j->T;
    int32_t D = j->D, g = h / (j->H / j->KVH);
    float p[ATT_TILE * ATT_TILE], ds[ATT_TILE * ATT_TILE], delta[ATT_TILE];
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t i0 = t0; i0 < t1;) {
        while (j->docs->doc_start[d + 1] <= i0) d++;
        int32_t start = j->docs->doc_start[d], end = j->docs->doc_start[d + 1];
        int32_t i1 = end < t1 ? end : t1;
        attn_tile_delta(j, h, i0, i1, delta);
        for (int32_t k0 = start; k0 < i1; k0 += ATT_TILE) {
            int32_t k1 = k0 + ATT_TILE < i1 ? k0 + ATT_TILE : i1;
            attn_tile_grads(j, h, i0, i1, k0, k1, delta, p, ds);
            // dq[i0:i1] += dS @ K[k0:k1]
            tr_gemm dq = {.M = i1 - i0, .N = D, .K = k1 - k0, .a = ds, .a_rs = k1 - k0,
                          .a_ks = 1, .b = j->k + ((size_t)k0 * j->KVH + g) * D,
                          .b_ks = j->KVH * D, .b_cs = 1,
                          .c = j->dq + ((size_t)i0 * j->H + h) * D, .ldc = j->H * D,
                          .accumulate = true};
            tr_gemm_serial(j->isa, &dq);
        }
        i0 = i1;
    }
}

// dk, dv for one key tile of one kv head, split at document edges: the group's heads in
// order, then the query tiles that see the keys, in order.
static void attn_backward_dkv_task(void *arg, int32_t task) {
    const attn_job *j = arg;
    int32_t g = task % j->KVH, t0 = (task / j->KVH) * ATT_TILE;
    int32_t t1 = t0 + ATT_TILE < j->T ? t0 + ATT_TILE : j->T;
    int32_t D = j->D, group = j->H / j->KVH;
    float p[ATT_TILE * ATT_TILE], ds[ATT_TILE * ATT_TILE], delta[ATT_TILE];
    int32_t d = attn_doc_of(j->docs, t0);
    for (int32_t k0 = t0; k0 < t1;) {
        while (j->docs->doc_start[d + 1] <= k0) d++;
        int32_t end = j->docs->doc_start[d + 1];
        int32_t k1 = end < t1 ? end : t1, kn = k1 - k0;
        size_t kv_off = ((size_t)k0 * j->KVH + g) * D;
        for (int32_t h = g * group; h < (g + 1) * group; h++) {
            for (int32_t i0 = k0; i0 < end; i0 += ATT_TILE) {
                int32_t i1 = i0 + ATT_TILE < end ? i0 + ATT_TILE : end, qn = i1 - i0;
                size_t q_off = ((size_t)i0 * j->H + h) * D;
                attn_tile_delta(j, h, i0, i1, delta);
                attn_tile_grads(j, h, i0, i1, k0, k1, delta, p, ds);
                // dv[k0:k1] += P^T @ dO[i0:i1]; dk[k0:k1] += dS^T @ Q[i0:i1]: A(b, a) = p[a, b]
                tr_gemm t = {.M = kn, .N = D, .K = qn, .a = p, .a_rs = 1, .a_ks = kn,
                             .b = j->dout + q_off, .b_ks = j->H * D, .b_cs = 1,
                             .c = j->dv + kv_off, .ldc = j->KVH * D, .accumulate = true};
                if (j->dv) tr_gemm_serial(j->isa, &t);
                t.a = ds;
                t.b = j->q + q_off;
                t.c = j->dk + kv_off;
                if (j->dk) tr_gemm_serial(j->isa, &t);
            }
        }
        k0 = k1;
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
                  .scale = attn_scale(D), .isa = tr_cpu_isa(be)};
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
