// Attention against float64: causal GQA in documents (H/KVH = 1, 2, 4; documents of different
// lengths; T = 1; a head dimension past the kernels' 256-channel stack tiles), q, k and v read
// in place from fused [q;k;v] rows with a gap after them (stride ld), lse, dq/dk/dv written
// into the same fused layout and checked against central differences, 1/2/3-thread bit
// equality, kv_write filling a paged KV cache, and attention_decode over that cache (blocks
// scattered out of order, unused slots NaN, q rows of their own stride) reproducing the
// forward's rows bit for bit. The bf16 mode is the fp32 op on bf16-valued inputs with each
// output rounded once (lse the fp32 bits), and decodes the bf16 forward's rows bit for bit.
#include "tests/kernels/kernels_test.h"

typedef struct att_case {
    const char *name;
    int32_t n_docs;
    int32_t len[4];
    int32_t H, KVH, D;
    int32_t gap;        // elements after each fused [q;k;v] row
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

// A case's batch: documents, fused rows and their views.
typedef struct att_batch {
    int32_t doc_start[5], *pos;
    tr_doc_layout docs;
    int32_t T, H, KVH, D, ld;
    size_t nq, nk, nrow;        // q and k/v elements, fused elements (T * ld)
    size_t k_at, v_at;          // where k and v start in a fused row
} att_batch;

// Fills b in place: b->docs points into b itself.
static void make_batch(att_batch *b, const att_case *c) {
    *b = (att_batch){.H = c->H, .KVH = c->KVH, .D = c->D};
    for (int32_t d = 0; d < c->n_docs; d++) b->doc_start[d + 1] = b->doc_start[d] + c->len[d];
    b->T = b->doc_start[c->n_docs];
    b->pos = kt_malloc((size_t)b->T * sizeof(int32_t));
    for (int32_t d = 0; d < c->n_docs; d++)
        for (int32_t t = b->doc_start[d]; t < b->doc_start[d + 1]; t++)
            b->pos[t] = t - b->doc_start[d];
    b->docs = (tr_doc_layout){.n_tokens = b->T, .n_docs = c->n_docs,
                              .doc_start = b->doc_start, .pos = b->pos};
    b->ld = (c->H + 2 * c->KVH) * c->D + c->gap;
    b->nq = (size_t)b->T * c->H * c->D;
    b->nk = (size_t)b->T * c->KVH * c->D;
    b->nrow = (size_t)b->T * b->ld;
    b->k_at = (size_t)c->H * c->D;
    b->v_at = b->k_at + (size_t)c->KVH * c->D;
}

// width values at `at` of each fused row, as one contiguous array.
static float *part(const att_batch *b, const float *rows, size_t at, int32_t width) {
    float *y = kt_floats((size_t)b->T * width);
    for (int32_t t = 0; t < b->T; t++)
        memcpy(y + (size_t)t * width, rows + (size_t)t * b->ld + at, (size_t)width * sizeof(float));
    return y;
}

// Whether the gap after each fused row of x equals ref's.
static int gaps_kept(const att_batch *b, const void *x, const void *ref, size_t es) {
    size_t at = b->v_at + (size_t)b->KVH * b->D;
    for (int32_t t = 0; t < b->T; t++) {
        size_t o = ((size_t)t * b->ld + at) * es;
        if (memcmp((const char *)x + o, (const char *)ref + o, (b->ld - at) * es) != 0) return 0;
    }
    return 1;
}

// Forward (when out_in is NULL) and backward on the fused buffers of dtype t: out [T,H*D],
// lse, and dq/dk/dv written into drows (when not NULL). The backward reads out_in when given
// (the forward's output as the bf16 mode stored it) instead of the forward's out.
static void run(const att_batch *b, tr_dt t, int32_t threads, const void *rows, void *out,
                float *lse, const void *out_in, const void *dout, void *drows) {
    size_t es = tr_dt_size(t);
    tr_backend be;
    kt_backend(&be, threads, t);
    const char *r = rows;
    char *d = drows;
    if (!out_in)
        be.ops->attention_forward(&be, out, lse, r, r + b->k_at * es, r + b->v_at * es, b->ld,
                                  &b->docs, b->H, b->KVH, b->D);
    if (drows)
        be.ops->attention_backward(&be, d, d + b->k_at * es, d + b->v_at * es, dout,
                                   out_in ? out_in : out, lse, r, r + b->k_at * es,
                                   r + b->v_at * es, b->ld, &b->docs, b->H, b->KVH, b->D);
    tr_backend_cpu_free(&be);
}

// The documents' keys and values written with kv_write into a paged cache (checked against
// a plain copy of the layout, unused slots staying NaN), then every position of every
// document decoded from it, q rows at a stride of their own, and compared with the
// forward's output rows bit for bit.
static void check_decode(const att_case *c, const att_batch *b, tr_dt t, const void *rows,
                         const void *out, int32_t block_size, int32_t n_threads) {
    size_t es = tr_dt_size(t);
    int32_t KVH = c->KVH, D = c->D, H = c->H, B = c->n_docs;
    int32_t max_blocks = 0, used = 0;
    for (int32_t d = 0; d < B; d++) {
        int32_t nb = (c->len[d] + block_size - 1) / block_size;
        if (nb > max_blocks) max_blocks = nb;
        used += nb;
    }
    int32_t n_blocks = used + 3;   // spare blocks that stay NaN
    size_t slot_bytes = (size_t)KVH * D * es;
    size_t pool_bytes = (size_t)n_blocks * block_size * slot_bytes;
    size_t pool_elems = pool_bytes / es;
    char *kp = kt_poison(pool_elems, t), *vp = kt_poison(pool_elems, t);
    char *kw = kt_poison(pool_elems, t), *vw = kt_poison(pool_elems, t);
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
    int32_t *slot = kt_malloc((size_t)b->T * sizeof(int32_t));
    int32_t next = 0;
    for (int32_t d = 0; d < B; d++)
        for (int32_t j = 0; j < max_blocks; j++)
            table[(size_t)d * max_blocks + j] = j * block_size < c->len[d] ? perm[next++] : -1;
    for (int32_t d = 0; d < B; d++)
        for (int32_t p = 0; p < c->len[d]; p++) {
            int32_t blk = table[(size_t)d * max_blocks + p / block_size], tok = b->doc_start[d] + p;
            slot[tok] = blk * block_size + p % block_size;
            size_t src = ((size_t)tok * b->ld) * es;
            memcpy(kp + (size_t)slot[tok] * slot_bytes, (const char *)rows + src + b->k_at * es,
                   slot_bytes);
            memcpy(vp + (size_t)slot[tok] * slot_bytes, (const char *)rows + src + b->v_at * es,
                   slot_bytes);
        }
    tr_kv_pages kv = {.k_pool = kw, .v_pool = vw, .block_size = block_size,
                      .n_blocks = n_blocks, .n_kv_heads = KVH, .head_dim = D};

    tr_backend be;
    kt_backend(&be, n_threads, t);
    be.ops->kv_write(&be, &kv, slot, (const char *)rows + b->k_at * es,
                     (const char *)rows + b->v_at * es, b->ld, b->T);
    CHECKF(memcmp(kw, kp, pool_bytes) == 0 && memcmp(vw, vp, pool_bytes) == 0,
           "%s %s: kv_write (block_size %d) did not fill the slots as the layout says", c->name,
           tr_dt_name(t), block_size);
    size_t row = (size_t)H * D;
    int32_t ldq = H * D + 5;
    char *qb = kt_poison((size_t)B * ldq, t), *ob = kt_malloc((size_t)B * row * es);
    int32_t *bt = kt_malloc((size_t)B * max_blocks * sizeof(int32_t));
    int32_t *seq_len = kt_malloc((size_t)B * sizeof(int32_t));
    int32_t max_len = 0, mismatches = 0;
    for (int32_t d = 0; d < B; d++) max_len = c->len[d] > max_len ? c->len[d] : max_len;
    for (int32_t p = 0; p < max_len; p++) {
        int32_t nb = 0;
        int32_t which[4];
        for (int32_t d = 0; d < B; d++) {
            if (c->len[d] <= p) continue;
            memcpy(qb + (size_t)nb * ldq * es,
                   (const char *)rows + (size_t)(b->doc_start[d] + p) * b->ld * es, row * es);
            memcpy(bt + (size_t)nb * max_blocks, table + (size_t)d * max_blocks,
                   (size_t)max_blocks * sizeof(int32_t));
            seq_len[nb] = p + 1;
            which[nb++] = d;
        }
        be.ops->attention_decode(&be, ob, qb, ldq, &kv, bt, max_blocks, seq_len, nb, H);
        for (int32_t i = 0; i < nb; i++)
            if (memcmp(ob + (size_t)i * row * es,
                       (const char *)out + (size_t)(b->doc_start[which[i]] + p) * row * es,
                       row * es) != 0)
                mismatches++;
    }
    CHECKF(mismatches == 0, "%s %s: decode (block_size %d, %d threads) differs from forward "
           "in %d rows", c->name, tr_dt_name(t), block_size, n_threads, mismatches);
    tr_backend_cpu_free(&be);
    free(kp); free(vp); free(kw); free(vw); free(perm); free(table); free(slot); free(qb);
    free(ob); free(bt); free(seq_len);
}

// bf16: the fp32 op on the rounded inputs, each output rounded once (lse the fp32 bits), the
// same for 1, 2 and 3 threads, and decode equal to the bf16 forward. The backward's inputs
// include out, which the bf16 mode holds rounded: its reference is the fp32 backward given
// that rounded out, and dq, dk, dv (in their fused places) are that result rounded once.
static void check_bf16(const att_case *c, const att_batch *b, const float *rows,
                       const float *dout) {
    size_t n = b->nrow, nl = (size_t)b->T * b->H;
    float *rr = kt_round_all(kt_copy(rows, n), n), *dr = kt_round_all(kt_copy(dout, b->nq), b->nq);
    float *out = kt_floats(b->nq), *lse = kt_floats(nl);
    run(b, TR_F32, 2, rr, out, lse, NULL, NULL, NULL);
    uint16_t *r16 = kt_to(rr, n, TR_BF16), *d16 = kt_to(dr, b->nq, TR_BF16);
    uint16_t *dpoison = kt_poison(n, TR_BF16);
    uint16_t *o16[3], *g16[3];
    float *l16[3];
    for (int32_t k = 0; k < 3; k++) {
        o16[k] = kt_poison(b->nq, TR_BF16);
        g16[k] = kt_poison(n, TR_BF16);
        l16[k] = kt_fill(nl, NAN);
        run(b, TR_BF16, k + 1, r16, o16[k], l16[k], NULL, d16, g16[k]);
    }
    CHECKF(kt_is_rounded(o16[0], out, b->nq, "out"), "%s: bf16 out", c->name);
    CHECKF(kt_same_bits(l16[0], lse, nl), "%s: bf16 lse", c->name);
    float *out_r = kt_from(o16[0], b->nq, TR_BF16), *drows = kt_fill(n, 0);
    run(b, TR_F32, 2, rr, NULL, lse, out_r, dr, drows);
    int ok = 1;
    size_t width = b->v_at + (size_t)b->KVH * b->D;
    for (int32_t t = 0; t < b->T; t++)
        ok &= kt_is_rounded(g16[0] + (size_t)t * b->ld, drows + (size_t)t * b->ld, width, "dqkv");
    CHECKF(ok, "%s: bf16 dq/dk/dv", c->name);
    CHECKF(gaps_kept(b, g16[0], dpoison, 2), "%s: bf16 backward wrote into the gaps", c->name);
    for (int32_t k = 1; k < 3; k++)
        CHECKF(memcmp(o16[k], o16[0], b->nq * 2) == 0 && memcmp(g16[k], g16[0], n * 2) == 0 &&
                   kt_same_bits(l16[k], l16[0], nl),
               "%s: bf16 bits differ at %d threads", c->name, k + 1);
    check_decode(c, b, TR_BF16, r16, o16[0], 5, 1);
    check_decode(c, b, TR_BF16, r16, o16[0], 16, 3);
    for (int32_t k = 0; k < 3; k++) {
        free(o16[k]); free(g16[k]); free(l16[k]);
    }
    free(rr); free(dr); free(out); free(lse); free(drows); free(r16); free(d16); free(dpoison);
    free(out_r);
}

static void check_case(const att_case *c) {
    att_batch b;
    make_batch(&b, c);
    int32_t T = b.T, H = c->H, KVH = c->KVH, D = c->D;
    size_t nq = b.nq, nk = b.nk, n = b.nrow;
    float *rows = kt_floats(n);
    for (int32_t t = 0; t < T; t++)
        for (int32_t i = 0; i < b.ld; i++)
            rows[(size_t)t * b.ld + i] = (float)(((size_t)i < b.v_at ? 2.0 : 1.0) * kt_uniform());
    float *dout = kt_rand(nq, 1.0);
    float *q = part(&b, rows, 0, H * D), *k = part(&b, rows, b.k_at, KVH * D);
    float *v = part(&b, rows, b.v_at, KVH * D);
    double *qd = kt_to_double(q, nq), *kd = kt_to_double(k, nk), *vd = kt_to_double(v, nk);
    double *dd = kt_to_double(dout, nq);

    // dq, dk, dv are written: the fused gradient rows start as NaNs, gaps included
    float *out = kt_fill(nq, NAN), *lse = kt_fill((size_t)T * H, NAN), *drows = kt_fill(n, NAN);
    float *poison = kt_fill(n, NAN);
    run(&b, TR_F32, 2, rows, out, lse, NULL, dout, drows);
    double *ref = kt_malloc(nq * sizeof(double)), *lref = kt_malloc((size_t)T * H * sizeof(double));
    att_forward_ref(ref, lref, qd, kd, vd, b.doc_start, c->n_docs, H, KVH, D);
    double e = kt_rel_err_d(out, ref, nq);
    CHECKF(e < 1e-5, "%s: forward rel err %.3g", c->name, e);
    e = 0;
    for (size_t i = 0; i < (size_t)T * H; i++) e = fmax(e, fabs(lse[i] - lref[i]));
    CHECKF(e < 1e-5, "%s: lse max abs err %.3g", c->name, e);

    float *dq = part(&b, drows, 0, H * D), *dk = part(&b, drows, b.k_at, KVH * D);
    float *dv = part(&b, drows, b.v_at, KVH * D);
    att_ref r = {.q = qd, .k = kd, .v = vd, .dout = dd, .doc_start = b.doc_start,
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
    CHECKF(gaps_kept(&b, drows, poison, 4), "%s: backward wrote into the gaps", c->name);

    // the same bits whatever the gradient rows held, and for 1, 2 and 3 threads
    for (int32_t th = 1; th <= 3; th++) {
        float *o = kt_floats(nq), *l = kt_floats((size_t)T * H), *g = kt_rand(n, 1.0);
        float *g0 = kt_copy(g, n);
        run(&b, TR_F32, th, rows, o, l, NULL, dout, g);
        CHECKF(kt_same_bits(o, out, nq) && kt_same_bits(l, lse, (size_t)T * H),
               "%s: forward bits differ at %d threads", c->name, th);
        int same = gaps_kept(&b, g, g0, 4);
        for (int32_t t = 0; t < T; t++)
            same &= memcmp(g + (size_t)t * b.ld, drows + (size_t)t * b.ld,
                           (b.v_at + (size_t)KVH * D) * sizeof(float)) == 0;
        CHECKF(same, "%s: backward bits differ at %d threads (from other contents)", c->name, th);
        free(o); free(l); free(g); free(g0);
    }

    check_decode(c, &b, TR_F32, rows, out, 5, 1);
    check_decode(c, &b, TR_F32, rows, out, 16, 3);
    check_bf16(c, &b, rows, dout);

    free(b.pos); free(rows); free(dout); free(q); free(k); free(v); free(qd); free(kd);
    free(vd); free(dd); free(out); free(lse); free(drows); free(poison); free(ref); free(lref);
    free(dq); free(dk); free(dv);
}

int main(void) {
    kt_seed(5);
    static const att_case cases[] = {
        {"gqa2 three docs", 3, {5, 1, 9}, 4, 2, 8, 3, 100000},
        {"gqa4 two docs", 2, {4, 7}, 4, 1, 6, 0, 100000},
        {"mha single token", 1, {1}, 2, 2, 12, 1, 100000},
        {"mha odd D", 2, {6, 3}, 3, 3, 5, 2, 100000},
        {"gqa2 long docs", 3, {70, 3, 80}, 8, 4, 16, 0, 40},
        {"gqa4 D64", 2, {130, 20}, 4, 1, 64, 16, 20},
        {"gqa2 D300", 2, {70, 5}, 2, 1, 300, 4, 10},   // channels in two stack passes
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i]);
    return tr_test_summary("test_attention");
}
