// Attention against float64: causal GQA in documents (H/KVH = 1, 2, 4; documents of different
// lengths; T = 1), lse, dq/dk/dv against central differences, accumulation, 1/2/3-thread bit
// equality, and attention_decode over a paged KV cache (blocks scattered out of order, unused
// slots NaN) reproducing the forward's rows bit for bit.
#include "tests/kernels/kernels_test.h"

typedef struct att_case {
    const char *name;
    int32_t n_docs;
    int32_t len[4];
    int32_t H, KVH, D;
    size_t fd_checks;   // elements per tensor checked by finite differences
} att_case;

typedef struct att_ref {
    double *q, *k, *v;
    const double *dout;
    const int32_t *doc_start;
    int32_t n_docs, T, H, KVH, D;
} att_ref;

static void att_forward_ref(double *out, double *lse, const double *q, const double *k,
                            const double *v, const int32_t *doc_start, int32_t n_docs,
                            int32_t H, int32_t KVH, int32_t D) {
    double scale = 1.0 / sqrt((double)D);
    for (int32_t d = 0; d < n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++)
            for (int32_t h = 0; h < H; h++) {
                int32_t g = h / (H / KVH), n = t - doc_start[d] + 1;
                const double *qr = q + ((size_t)t * H + h) * D;
                double *s = kt_malloc((size_t)n * sizeof(double));
                double m = -INFINITY, sum = 0;
                for (int32_t j = 0; j < n; j++) {
                    const double *kr = k + ((size_t)(doc_start[d] + j) * KVH + g) * D;
                    double dot = 0;
                    for (int32_t i = 0; i < D; i++) dot += qr[i] * kr[i];
                    s[j] = dot * scale;
                    if (s[j] > m) m = s[j];
                }
                for (int32_t j = 0; j < n; j++) sum += exp(s[j] - m);
                double *o = out + ((size_t)t * H + h) * D;
                for (int32_t i = 0; i < D; i++) o[i] = 0;
                for (int32_t j = 0; j < n; j++) {
                    const double *vr = v + ((size_t)(doc_start[d] + j) * KVH + g) * D;
                    double p = exp(s[j] - m) / sum;
                    for (int32_t i = 0; i < D; i++) o[i] += p * vr[i];
                }
                if (lse) lse[(size_t)t * H + h] = m + log(sum);
                free(s);
            }
}

static double att_loss(void *arg) {
    att_ref *r = arg;
    size_t n = (size_t)r->T * r->H * r->D;
    double *out = kt_malloc(n * sizeof(double));
    att_forward_ref(out, NULL, r->q, r->k, r->v, r->doc_start, r->n_docs, r->H, r->KVH, r->D);
    double L = 0;
    for (size_t i = 0; i < n; i++) L += r->dout[i] * out[i];
    free(out);
    return L;
}

// Decode every position of every document from a paged cache holding the documents' keys and
// values, and compare with the forward's output rows bit for bit.
static void check_decode(const att_case *c, const tr_doc_layout *docs, const float *q,
                         const float *k, const float *v, const float *out, int32_t block_size,
                         int32_t n_threads) {
    int32_t KVH = c->KVH, D = c->D, H = c->H, B = c->n_docs;
    int32_t max_blocks = 0, used = 0;
    for (int32_t d = 0; d < B; d++) {
        int32_t nb = (c->len[d] + block_size - 1) / block_size;
        if (nb > max_blocks) max_blocks = nb;
        used += nb;
    }
    int32_t n_blocks = used + 3;   // spare blocks that stay NaN
    size_t block_floats = (size_t)block_size * KVH * D;
    float *kp = kt_fill((size_t)n_blocks * block_floats, NAN);
    float *vp = kt_fill((size_t)n_blocks * block_floats, NAN);
    // a shuffled list of block ids, handed out in order: sequences get non-contiguous blocks
    int32_t *perm = kt_malloc((size_t)n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)((kt_uniform() + 1.0) * 0.5 * (i + 1)) % (i + 1);
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    int32_t *table = kt_malloc((size_t)B * max_blocks * sizeof(int32_t));
    int32_t next = 0;
    for (int32_t d = 0; d < B; d++)
        for (int32_t j = 0; j < max_blocks; j++)
            table[(size_t)d * max_blocks + j] =
                j * block_size < c->len[d] ? perm[next++] : -1;
    for (int32_t d = 0; d < B; d++)
        for (int32_t p = 0; p < c->len[d]; p++) {
            int32_t blk = table[(size_t)d * max_blocks + p / block_size];
            size_t dst = ((size_t)blk * block_size + p % block_size) * KVH * D;
            size_t src = (size_t)(docs->doc_start[d] + p) * KVH * D;
            memcpy(kp + dst, k + src, (size_t)KVH * D * sizeof(float));
            memcpy(vp + dst, v + src, (size_t)KVH * D * sizeof(float));
        }
    tr_kv_pages kv = {.k_pool = kp, .v_pool = vp, .block_size = block_size,
                      .n_blocks = n_blocks, .n_kv_heads = KVH, .head_dim = D};

    tr_backend be;
    kt_backend(&be, n_threads);
    size_t row = (size_t)H * D;
    float *qb = kt_floats((size_t)B * row), *ob = kt_floats((size_t)B * row);
    int32_t *bt = kt_malloc((size_t)B * max_blocks * sizeof(int32_t));
    int32_t *seq_len = kt_malloc((size_t)B * sizeof(int32_t));
    int32_t max_len = 0, mismatches = 0;
    for (int32_t d = 0; d < B; d++) max_len = c->len[d] > max_len ? c->len[d] : max_len;
    for (int32_t p = 0; p < max_len; p++) {
        int32_t nb = 0;
        int32_t which[4];
        for (int32_t d = 0; d < B; d++) {
            if (c->len[d] <= p) continue;
            memcpy(qb + nb * row, q + (size_t)(docs->doc_start[d] + p) * row, row * sizeof(float));
            memcpy(bt + (size_t)nb * max_blocks, table + (size_t)d * max_blocks,
                   (size_t)max_blocks * sizeof(int32_t));
            seq_len[nb] = p + 1;
            which[nb++] = d;
        }
        be.ops->attention_decode(&be, ob, qb, &kv, bt, max_blocks, seq_len, nb, H);
        for (int32_t b = 0; b < nb; b++)
            if (!kt_same_bits(ob + b * row, out + (size_t)(docs->doc_start[which[b]] + p) * row,
                              row))
                mismatches++;
    }
    CHECKF(mismatches == 0, "%s: decode (block_size %d, %d threads) differs from forward in %d rows",
           c->name, block_size, n_threads, mismatches);
    tr_backend_cpu_free(&be);
    free(kp); free(vp); free(perm); free(table); free(qb); free(ob); free(bt); free(seq_len);
}

static void check_case(const att_case *c) {
    int32_t doc_start[5] = {0};
    for (int32_t d = 0; d < c->n_docs; d++) doc_start[d + 1] = doc_start[d] + c->len[d];
    int32_t T = doc_start[c->n_docs], H = c->H, KVH = c->KVH, D = c->D;
    int32_t *pos = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t d = 0; d < c->n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++) pos[t] = t - doc_start[d];
    tr_doc_layout docs = {.n_tokens = T, .n_docs = c->n_docs, .doc_start = doc_start, .pos = pos};
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    float *q = kt_rand(nq, 2.0), *k = kt_rand(nk, 2.0), *v = kt_rand(nk, 1.0);
    float *dout = kt_rand(nq, 1.0);
    double *qd = kt_to_double(q, nq), *kd = kt_to_double(k, nk), *vd = kt_to_double(v, nk);
    double *dd = kt_to_double(dout, nq);

    tr_backend be;
    kt_backend(&be, 2);
    float *out = kt_fill(nq, NAN), *lse = kt_fill((size_t)T * H, NAN);
    be.ops->attention_forward(&be, out, lse, q, k, v, &docs, H, KVH, D);
    double *ref = kt_malloc(nq * sizeof(double)), *lref = kt_malloc((size_t)T * H * sizeof(double));
    att_forward_ref(ref, lref, qd, kd, vd, doc_start, c->n_docs, H, KVH, D);
    double e = kt_rel_err_d(out, ref, nq);
    CHECKF(e < 1e-5, "%s: forward rel err %.3g", c->name, e);
    e = 0;
    for (size_t i = 0; i < (size_t)T * H; i++) e = fmax(e, fabs(lse[i] - lref[i]));
    CHECKF(e < 1e-5, "%s: lse max abs err %.3g", c->name, e);

    float *dq = kt_fill(nq, 0), *dk = kt_fill(nk, 0), *dv = kt_fill(nk, 0);
    be.ops->attention_backward(&be, dq, dk, dv, dout, out, lse, q, k, v, &docs, H, KVH, D);
    att_ref r = {.q = qd, .k = kd, .v = vd, .dout = dd, .doc_start = doc_start,
                 .n_docs = c->n_docs, .T = T, .H = H, .KVH = KVH, .D = D};
    // With one key per query the softmax is constant and dq, dk are exactly zero: measure
    // them against the scale of dv (the gradient of the same loss, of order 1) instead.
    double floor = T == 1 ? 1.0 : 1e-30;
    e = kt_fd_rel_err_ex(qd, nq, dq, att_loss, &r, c->fd_checks, floor, 1e-5);
    CHECKF(e < 1e-5, "%s: dq vs finite differences %.3g", c->name, e);
    e = kt_fd_rel_err_ex(kd, nk, dk, att_loss, &r, c->fd_checks, floor, 1e-5);
    CHECKF(e < 1e-5, "%s: dk vs finite differences %.3g", c->name, e);
    e = kt_fd_rel_err(vd, nk, dv, att_loss, &r, c->fd_checks);
    CHECKF(e < 1e-5, "%s: dv vs finite differences %.3g", c->name, e);

    float *dq0 = kt_rand(nq, 1.0), *dk0 = kt_rand(nk, 1.0), *dv0 = kt_rand(nk, 1.0);
    float *dq2 = kt_copy(dq0, nq), *dk2 = kt_copy(dk0, nk), *dv2 = kt_copy(dv0, nk);
    be.ops->attention_backward(&be, dq2, dk2, dv2, dout, out, lse, q, k, v, &docs, H, KVH, D);
    CHECKF(kt_accum_err(dq2, dq0, dq, nq) < 1e-5, "%s: dq accumulates", c->name);
    CHECKF(kt_accum_err(dk2, dk0, dk, nk) < 1e-5, "%s: dk accumulates", c->name);
    CHECKF(kt_accum_err(dv2, dv0, dv, nk) < 1e-5, "%s: dv accumulates", c->name);
    tr_backend_cpu_free(&be);

    for (int32_t n = 1; n <= 3; n++) {
        float *o = kt_floats(nq), *l = kt_floats((size_t)T * H);
        float *gq = kt_copy(dq0, nq), *gk = kt_copy(dk0, nk), *gv = kt_copy(dv0, nk);
        kt_backend(&be, n);
        be.ops->attention_forward(&be, o, l, q, k, v, &docs, H, KVH, D);
        be.ops->attention_backward(&be, gq, gk, gv, dout, o, l, q, k, v, &docs, H, KVH, D);
        tr_backend_cpu_free(&be);
        CHECKF(kt_same_bits(o, out, nq) && kt_same_bits(l, lse, (size_t)T * H),
               "%s: forward bits differ at %d threads", c->name, n);
        CHECKF(kt_same_bits(gq, dq2, nq) && kt_same_bits(gk, dk2, nk) && kt_same_bits(gv, dv2, nk),
               "%s: backward bits differ at %d threads", c->name, n);
        free(o); free(l); free(gq); free(gk); free(gv);
    }

    check_decode(c, &docs, q, k, v, out, 5, 1);
    check_decode(c, &docs, q, k, v, out, 16, 3);

    free(pos); free(q); free(k); free(v); free(dout); free(qd); free(kd); free(vd); free(dd);
    free(out); free(lse); free(ref); free(lref); free(dq); free(dk); free(dv);
    free(dq0); free(dk0); free(dv0); free(dq2); free(dk2); free(dv2);
}

int main(void) {
    kt_seed(5);
    static const att_case cases[] = {
        {"gqa2 three docs", 3, {5, 1, 9}, 4, 2, 8, 100000},
        {"gqa4 two docs", 2, {4, 7}, 4, 1, 6, 100000},
        {"mha single token", 1, {1}, 2, 2, 12, 100000},
        {"mha odd D", 2, {6, 3}, 3, 3, 5, 100000},
        {"gqa2 long docs", 3, {70, 3, 80}, 8, 4, 16, 40},
        {"gqa4 D64", 2, {130, 20}, 4, 1, 64, 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    return tr_test_summary("test_attention");
}
