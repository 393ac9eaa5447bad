// Attention against float64: causal GQA in documents (H/KVH = 1, 2, 4; documents of different
// lengths; T = 1; a head dimension past the kernels' 256-channel stack tiles), q, k and v read
// in place from fused [q;k;v] rows with a gap after them (stride ld), lse, dq/dk/dv written
// into the same fused layout and checked against central differences, 1/2/3-thread bit
// equality, kv_write filling a paged KV cache, and attention_decode over that cache (blocks
// scattered out of order, unused slots NaN, q rows of their own stride) reproducing the
// forward's rows bit for bit. The bf16 mode is the fp32 op on bf16-valued inputs with each
// output rounded once (lse the fp32 bits), and decodes the bf16 forward's rows bit for bit.
// A shared prefix (n documents reading one prompt's keys) gives the rows of the unshared
// layout (the prompt copied before each) bit for bit, and its gradients: the prompt's dk/dv
// the sum over the copies.
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
#define ATT_MAX_DOCS 12

typedef struct att_batch {
    int32_t doc_start[ATT_MAX_DOCS + 1], prefix[ATT_MAX_DOCS], *pos;
    tr_doc_layout docs;
    int32_t T, H, KVH, D, ld;
    size_t nq, nk, nrow;        // q and k/v elements, fused elements (T * ld)
    size_t k_at, v_at;          // where k and v start in a fused row
} att_batch;

// Fills b in place (b->docs points into b itself): documents of len[d] tokens, prefix[d]
// their shared prefixes (NULL: none).
static void make_docs(att_batch *b, int32_t n_docs, const int32_t *len, const int32_t *prefix,
                      int32_t H, int32_t KVH, int32_t D, int32_t gap) {
    *b = (att_batch){.H = H, .KVH = KVH, .D = D};
    for (int32_t d = 0; d < n_docs; d++) b->doc_start[d + 1] = b->doc_start[d] + len[d];
    b->T = b->doc_start[n_docs];
    b->pos = kt_malloc((size_t)b->T * sizeof(int32_t));
    for (int32_t d = 0; d < n_docs; d++) {
        int32_t p = prefix ? prefix[d] : -1;
        b->prefix[d] = p;
        for (int32_t t = b->doc_start[d]; t < b->doc_start[d + 1]; t++)
            b->pos[t] = t - b->doc_start[d] + (p >= 0 ? len[p] : 0);
    }
    b->docs = (tr_doc_layout){.n_tokens = b->T, .n_docs = n_docs, .doc_start = b->doc_start,
                              .pos = b->pos, .prefix = prefix ? b->prefix : NULL};
    b->ld = (H + 2 * KVH) * D + gap;
    b->nq = (size_t)b->T * H * D;
    b->nk = (size_t)b->T * KVH * D;
    b->nrow = (size_t)b->T * b->ld;
    b->k_at = (size_t)H * D;
    b->v_at = b->k_at + (size_t)KVH * D;
}

static void make_batch(att_batch *b, const att_case *c) {
    make_docs(b, c->n_docs, c->len, NULL, c->H, c->KVH, c->D, c->gap);
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

// A prompt of n_pre tokens shared by n_dep documents of dep[i] tokens, and a document after
// them of n_after tokens: against the unshared layout (the prompt copied before each), the
// forward rows are the same bits in fp32 and bf16 (so the ones decode reproduces), dq and
// the documents' own dk/dv agree, and the prompt's dk/dv are the sum over its copies. The
// backward gives the same bits for 1, 2 and 3 threads.
static void check_prefix(const char *name, int32_t n_pre, int32_t n_dep, const int32_t *dep,
                         int32_t n_after, int32_t H, int32_t KVH, int32_t D) {
    int32_t len[ATT_MAX_DOCS], pre[ATT_MAX_DOCS], ulen[ATT_MAX_DOCS];
    int32_t n = n_dep + 2, un = n_dep + 1;
    len[0] = n_pre;
    pre[0] = -1;
    for (int32_t i = 0; i < n_dep; i++) {
        len[1 + i] = dep[i];
        pre[1 + i] = 0;
        ulen[i] = n_pre + dep[i];
    }
    len[n - 1] = ulen[un - 1] = n_after;
    pre[n - 1] = -1;
    att_batch s, u;
    make_docs(&s, n, len, pre, H, KVH, D, 3);
    make_docs(&u, un, ulen, NULL, H, KVH, D, 3);
    // u's row of s's token t in copy c (the prompt's rows have n_dep copies; others one)
    int32_t *urow = kt_malloc((size_t)s.T * n_dep * sizeof(int32_t));
    for (int32_t c = 0; c < n_dep; c++)
        for (int32_t t = 0; t < s.T; t++) {
            int32_t d = 0;
            while (s.doc_start[d + 1] <= t) d++;
            int32_t o = t - s.doc_start[d];
            urow[(size_t)t * n_dep + c] = d == 0       ? u.doc_start[c] + o
                                          : d < n - 1 ? u.doc_start[d - 1] + n_pre + o
                                                      : u.doc_start[un - 1] + o;
        }
    float *rows = kt_floats(s.nrow), *urows = kt_floats(u.nrow);
    for (size_t i = 0; i < s.nrow; i++) rows[i] = (float)(2.0 * kt_uniform());
    float *dout = kt_rand(s.nq, 1.0), *udout = kt_fill(u.nq, 0.0f);
    size_t hd = (size_t)H * D;
    for (int32_t t = 0; t < s.T; t++)
        for (int32_t c = 0; c < n_dep; c++) {
            int32_t r = urow[(size_t)t * n_dep + c];
            memcpy(urows + (size_t)r * u.ld, rows + (size_t)t * s.ld, (size_t)s.ld * sizeof(float));
            // the loss weighs each prompt row once: on its first copy
            if (c == 0 || t >= s.doc_start[1])
                memcpy(udout + (size_t)r * hd, dout + (size_t)t * hd, hd * sizeof(float));
        }
    for (int32_t prec = 0; prec < 2; prec++) {
        tr_dt dt = prec ? TR_BF16 : TR_F32;
        size_t es = tr_dt_size(dt);
        void *r1 = prec ? (void *)kt_to(rows, s.nrow, dt) : kt_copy(rows, s.nrow);
        void *r2 = prec ? (void *)kt_to(urows, u.nrow, dt) : kt_copy(urows, u.nrow);
        char *o1 = kt_malloc(s.nq * es), *o2 = kt_malloc(u.nq * es);
        float *l1 = kt_floats((size_t)s.T * H), *l2 = kt_floats((size_t)u.T * H);
        run(&s, dt, 2, r1, o1, l1, NULL, NULL, NULL);
        run(&u, dt, 2, r2, o2, l2, NULL, NULL, NULL);
        int32_t bad = 0;
        for (int32_t t = 0; t < s.T; t++) {
            int32_t r = urow[(size_t)t * n_dep];
            bad += memcmp(o1 + (size_t)t * hd * es, o2 + (size_t)r * hd * es, hd * es) != 0 ||
                   !kt_same_bits(l1 + (size_t)t * H, l2 + (size_t)r * H, (size_t)H);
        }
        CHECKF(bad == 0, "%s %s: %d forward rows differ from the unshared layout's", name,
               tr_dt_name(dt), bad);
        free(r1); free(r2); free(o1); free(o2); free(l1); free(l2);
    }
    // fp32 backward: against the unshared layout, copies summed
    float *out = kt_floats(s.nq), *lse = kt_floats((size_t)s.T * H), *g = kt_fill(s.nrow, NAN);
    float *uout = kt_floats(u.nq), *ulse = kt_floats((size_t)u.T * H), *ug = kt_fill(u.nrow, 0);
    run(&s, TR_F32, 2, rows, out, lse, NULL, dout, g);
    run(&u, TR_F32, 2, urows, uout, ulse, NULL, udout, ug);
    float *want = kt_fill(s.nrow, 0.0f);
    size_t width = s.v_at + (size_t)KVH * D;
    for (int32_t t = 0; t < s.T; t++)
        for (int32_t c = 0; c < n_dep; c++) {
            const float *src = ug + (size_t)urow[(size_t)t * n_dep + c] * u.ld;
            float *dst = want + (size_t)t * s.ld;
            int copies = t < s.doc_start[1];   // the prompt: dk, dv summed, dq on copy 0
            if (!copies && c > 0) break;
            for (size_t i = 0; i < width; i++)
                if (c == 0 || i >= s.k_at) dst[i] += src[i];
        }
    double e = 0, scale = 0;
    for (int32_t t = 0; t < s.T; t++)
        for (size_t i = 0; i < width; i++) {
            size_t at = (size_t)t * s.ld + i;
            e = fmax(e, fabs((double)g[at] - want[at]));
            scale = fmax(scale, fabs(want[at]));
        }
    CHECKF(e <= 1e-5 * scale, "%s: dq/dk/dv vs the unshared layout %.3g of %.3g", name, e, scale);
    for (int32_t th = 1; th <= 3; th += 2) {
        float *o = kt_floats(s.nq), *l = kt_floats((size_t)s.T * H), *g2 = kt_fill(s.nrow, NAN);
        run(&s, TR_F32, th, rows, o, l, NULL, dout, g2);
        int same = 1;
        for (int32_t t = 0; t < s.T; t++)
            same &= memcmp(g2 + (size_t)t * s.ld, g + (size_t)t * s.ld, width * sizeof(float)) == 0;
        CHECKF(same && kt_same_bits(o, out, s.nq), "%s: bits differ at %d threads", name, th);
        free(o); free(l); free(g2);
    }
    printf("  %s: %d rows as the unshared layout's; gradients %.2g of scale\n", name, s.T,
           scale > 0 ? e / scale : 0.0);
    free(urow); free(rows); free(urows); free(dout); free(udout); free(out); free(lse); free(g);
    free(uout); free(ulse); free(ug); free(want); free(s.pos); free(u.pos);
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
    check_prefix("prefix 5 x3", 5, 3, (const int32_t[]){1, 4, 9}, 6, 4, 2, 8);
    // tiles of 64 keys and query rows straddle the prompt's end and the documents' starts
    check_prefix("prefix 70 x2 D16", 70, 2, (const int32_t[]){90, 3}, 20, 4, 1, 16);
    check_prefix("prefix 64 x4 D64", 64, 4, (const int32_t[]){64, 1, 65, 129}, 1, 2, 2, 64);
    return tr_test_summary("test_attention");
}
