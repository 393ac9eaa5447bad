// Vocab-parallel sampling (sample_tp.h): the exchange around the backend's sample_vp ops.
//
// Per group of rows, every rank sends its k best candidates of each row (all-gather). From
// them alone greedy takes the highest logit, and top-k the k best of the merged lists, which
// hold the whole row's top k (a token outside a rank's list ranks below k of that rank's).
// Rows that walk the whole vocabulary in id order (no cut; and top-p without top-k, whose
// nucleus is measured against the whole row's mass) need the single-rank sampler's running
// sum, a sequential double sum over the ids: rank 0 sums its columns and broadcasts the sum,
// rank 1 continues from it, and so on, so that every partial sum is the single-rank one and
// the draw falls where it falls there (the lowest rank whose walk passes the target holds
// the id). Partial sums taken apart and added afterwards would round differently and could
// pick a neighbouring id; R small broadcasts per group are the price of the same ids. A
// top-p nucleus is then cut on the merged lists as far as they lead the whole row for sure;
// a cut past that asks again for that row alone with lists eight times as long, up to every
// column (the only case that gathers a whole row's vocabulary, one row at a time).
#include "engine/sample_tp.h"

#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

// The list a row starts with: one candidate (its maximum) unless a cut ranks it: top-k's k,
// top-p's first 256 (the single-rank sampler's first head).
static int32_t first_want(const tr_sample_tp *s, const tr_sample_row *r) {
    const int32_t V = s->model->cfg.vocab_size;
    int32_t want = 1;
    if (r->temperature > 0.0f && r->top_k > 0 && r->top_k < V) want = r->top_k;
    else if (r->temperature > 0.0f && r->top_p < 1.0f) want = 256;
    return want < s->k_max ? want : s->k_max;
}

// Whether a row's draw walks the whole vocabulary (needs the ranks' running sums).
static bool walks(const tr_sample_tp *s, const tr_sample_row *r) {
    return r->temperature > 0.0f && !(r->top_k > 0 && r->top_k < s->model->cfg.vocab_size);
}

int tr_sample_tp_init(tr_sample_tp *s, tr_model *m, int32_t rows, tr_err *err) {
    memset(s, 0, sizeof *s);
    const int32_t R = m->tp.size, V = m->cfg.vocab_size;
    if (R < 2)
        return tr_errf(err, TR_EINVAL, "vocab-parallel sampling: the model is not a tensor-parallel "
                       "rank (tp %d)", R);
    s->model = m;
    s->rows = rows;
    s->k_max = tr_tp_vocab_begin(V, R, R) - tr_tp_vocab_begin(V, R, R - 1) + 1;
    size_t per_row = (size_t)(s->k_max > 256 ? s->k_max : 256);
    s->cap = (size_t)R * ((size_t)rows * 256 > per_row ? (size_t)rows * 256 : per_row);
    const size_t nr = (size_t)rows, al = 64;
    size_t sizes[4] = {s->cap * sizeof(tr_sample_cand), (size_t)R * nr * sizeof(double),
                       nr * sizeof(double), (size_t)R * nr * 3 * sizeof(int32_t)};
    size_t off[4], total = 0;
    for (int i = 0; i < 4; i++) {
        off[i] = total;
        total += (sizes[i] + al - 1) / al * al;
    }
    tr_backend *be = m->be;
    size_t scratch = be->ops->sample_vp_scratch_bytes(be, rows, m->tp.vocab, s->cap);
    s->want = malloc(nr * sizeof(int32_t));
    s->ids = malloc(nr * sizeof(int32_t));
    if (!s->want || !s->ids) {
        tr_sample_tp_free(s);
        return tr_errf(err, TR_ENOMEM, "vocab-parallel sampling: out of memory for %d rows", rows);
    }
    s->dev = tr_dev_alloc(be, total, "vocab-parallel sampling", err);
    s->scratch = s->dev ? tr_dev_alloc(be, scratch ? scratch : 4, "vocab-parallel sampling scratch", err)
                        : NULL;
    if (s->scratch && m->act != TR_F32)
        s->wide = tr_dev_alloc(be, nr * (size_t)m->tp.vocab * sizeof(float),
                               "vocab-parallel sampling logits", err);
    if (!s->scratch || (m->act != TR_F32 && !s->wide)) {
        tr_sample_tp_free(s);
        return -1;
    }
    char *d = s->dev;
    s->cand = (tr_sample_cand *)(d + off[0]);
    s->sums = (double *)(d + off[1]);
    s->walk_sum = (double *)(d + off[2]);
    s->hits = (int32_t *)(d + off[3]);
    return 0;
}

void tr_sample_tp_free(tr_sample_tp *s) {
    if (s->model) {
        tr_dev_free(s->model->be, s->dev);
        tr_dev_free(s->model->be, s->scratch);
        tr_dev_free(s->model->be, s->wide);
    }
    free(s->want);
    free(s->ids);
    memset(s, 0, sizeof *s);
}

// Every rank's n values of `words` 4-byte words each (candidates, hits: moved, never added)
// gathered in rank order into buf, this rank's already at its place.
static int gather_words(tr_sample_tp *s, void *buf, size_t words, tr_err *err) {
    size_t counts[TR_COMM_MAX_RANKS];
    for (int32_t r = 0; r < s->model->tp.size; r++) counts[r] = words;
    return tr_comm_all_gather(s->model->tp_comm, buf, counts, TR_COMM_F32, err);
}

// The running sums of rows [0, n) of logits at the end of each rank's columns, passed on from
// rank to rank (sums[r][n] on every rank), then each rank's walk to its rows' targets,
// gathered into hits.
static int chain_walk(tr_sample_tp *s, const float *logits, const tr_sample_row *rows, int32_t n,
                      int32_t k, tr_err *err) {
    tr_model *m = s->model;
    const tr_ops *op = m->be->ops;
    const int32_t R = m->tp.size, me = m->tp.rank, Vl = m->tp.vocab, v0 = m->tp.vocab0;
    for (int32_t r = 0; r < R; r++) {
        double *sum = s->sums + (size_t)r * n;
        if (r == me)
            op->sample_vp_scan(m->be, sum, NULL, logits, rows, s->cand, r ? sum - n : NULL, NULL, R,
                               k, v0, n, Vl);
        if (tr_comm_broadcast(m->tp_comm, sum, (size_t)n, TR_COMM_F64, r, err) != 0) return -1;
    }
    op->sample_vp_scan(m->be, s->walk_sum, s->hits + (size_t)me * n * 3, logits, rows, s->cand,
                       me ? s->sums + (size_t)(me - 1) * n : NULL, s->sums + (size_t)(R - 1) * n, R, k,
                       v0, n, Vl);
    return gather_words(s, s->hits, (size_t)n * 3, err);
}

// Rows [b0, b0 + n) with lists of k: ids[b0 ..] (-1 for a top-p row whose cut lies past the
// lists), read back into s->ids.
static int draw_group(tr_sample_tp *s, int32_t *ids, const tr_sample_row *rows,
                      const tr_sample_row *host_rows, int32_t b0, int32_t n, int32_t k,
                      int32_t *n_near, tr_err *err) {
    tr_model *m = s->model;
    const tr_ops *op = m->be->ops;
    const int32_t R = m->tp.size;
    const float *logits = (s->wide ? s->wide : (const float *)m->acts.logits) +
                          (size_t)b0 * m->tp.vocab;
    op->sample_vp_top(m->be, s->cand + (size_t)m->tp.rank * n * k, logits, m->tp.vocab0, n,
                      m->tp.vocab, k, s->scratch);
    if (gather_words(s, s->cand, (size_t)n * k * 2, err) != 0) return -1;
    bool walk = false;
    for (int32_t b = 0; b < n; b++) walk |= walks(s, &host_rows[b0 + b]);
    if (walk && chain_walk(s, logits, rows + b0, n, k, err) != 0) return -1;
    op->sample_vp_pick(m->be, ids + b0, n_near, s->cand, walk ? s->hits : NULL,
                       walk ? s->sums + (size_t)(R - 1) * n : NULL, rows + b0, R, k, n,
                       m->cfg.vocab_size, s->scratch);
    return tr_dev_download_sync(m->be, s->ids + b0, ids + b0, (size_t)n * sizeof(int32_t),
                                "vocab-parallel sampling", err);
}

int tr_sample_tp_draw(tr_sample_tp *s, int32_t *ids, const tr_sample_row *rows,
                      const tr_sample_row *host_rows, int32_t n, int32_t *n_near, tr_err *err) {
    if (n > s->rows)
        return tr_errf(err, TR_ERANGE, "vocab-parallel sampling: %d rows, set up for %d", n, s->rows);
    if (!s->model->tp_comm)
        return tr_errf(err, TR_EINVAL, "vocab-parallel sampling: tensor-parallel rank %d of %d has no "
                       "communicator (tr_model_set_tp_comm)", s->model->tp.rank, s->model->tp.size);
    const size_t R = (size_t)s->model->tp.size;
    if (s->wide)   // the ops read fp32; widening is exact, so the draws are the same
        s->model->be->ops->convert(s->model->be, s->wide, TR_F32, s->model->acts.logits,
                                   s->model->act, (size_t)n * (size_t)s->model->tp.vocab);
    for (int32_t b = 0; b < n; b++) s->want[b] = first_want(s, &host_rows[b]);
    // Groups of consecutive rows whose lists fit the gathered buffer at the longest of them.
    for (int32_t b0 = 0, b1; b0 < n; b0 = b1) {
        int32_t k = s->want[b0];
        for (b1 = b0 + 1; b1 < n; b1++) {
            int32_t kk = s->want[b1] > k ? s->want[b1] : k;
            if (R * (size_t)(b1 + 1 - b0) * (size_t)kk > s->cap) break;
            k = kk;
        }
        if (draw_group(s, ids, rows, host_rows, b0, b1 - b0, k, n_near, err) != 0) goto fail;
    }
    // A top-p cut past the lists: that row again alone, its lists eight times as long. At
    // k_max every list holds all its rank's columns, and the cut is always inside.
    for (int32_t b = 0; b < n; b++) {
        while (s->ids[b] < 0) {
            if (s->want[b] == s->k_max) {
                tr_errf(err, TR_EINVAL, "vocab-parallel sampling: row %d has no top-p cut even "
                        "in every rank's whole columns", b);
                goto fail;
            }
            s->want[b] = s->want[b] * 8 < s->k_max ? s->want[b] * 8 : s->k_max;
            if (draw_group(s, ids, rows, host_rows, b, 1, s->want[b], n_near, err) != 0) goto fail;
        }
    }
    return 0;
fail:
    tr_comm_abort(s->model->tp_comm, err->msg);
    return tr_err_wrap(err, "vocab-parallel sampling");
}
