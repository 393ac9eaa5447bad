// The tensor-parallel collectives of a model: sums of partial activations and gradients over
// the group (or, with sequence parallelism, their reduce-scatters and the all-gathers of
// every rank's rows), the gradient sums of tensors several ranks hold (replicated key/value
// heads, QK-norm weights, sequence-parallel norms), and gathering every rank's slices back
// into whole HF tensors for checkpoints and tests. Collectives run in the same order on every
// rank of the group.
#include "engine/model_tp.h"

#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

static int need_comm(const tr_model *m, tr_err *err) {
    if (m->tp_comm) return 0;
    return tr_errf(err, TR_EINVAL, "model: tensor-parallel rank %d of %d has no communicator "
                   "(tr_model_set_tp_comm)", m->tp.rank, m->tp.size);
}

int tr_model_tp_sum(tr_model *m, float *buf, size_t n, tr_err *err) {
    if (m->tp.size < 2) return 0;
    if (need_comm(m, err) != 0) return -1;
    return tr_comm_all_reduce(m->tp_comm, buf, n, TR_COMM_F32, err);
}

int tr_model_tp_sum_act(tr_model *m, void *buf, size_t n, tr_err *err) {
    if (m->tp.size < 2) return 0;
    if (m->act == TR_F32) return tr_model_tp_sum(m, buf, n, err);
    float *red = m->acts.tp_red;
    if (!red) return tr_errf(err, TR_EINVAL, "model: no room to reduce a gradient (inference layout)");
    const tr_ops *op = m->be->ops;
    op->convert(m->be, red, TR_F32, buf, m->act, n);
    if (tr_model_tp_sum(m, red, n, err) != 0) return -1;
    op->convert(m->be, buf, m->act, red, TR_F32, n);
    return 0;
}

// Elements of each rank's rows of a [T, hidden] buffer.
static void sp_counts(const tr_model *m, int32_t T, size_t *counts) {
    for (int32_t r = 0; r < m->tp.size; r++)
        counts[r] = (size_t)(tr_tp_seq_begin(T, m->tp.size, r + 1) -
                             tr_tp_seq_begin(T, m->tp.size, r)) * (size_t)m->cfg.hidden_size;
}

static size_t sp_offset(const tr_model *m) {
    return (size_t)m->sp_row0 * (size_t)m->cfg.hidden_size;
}

int tr_model_sp_gather(tr_model *m, void *full, const void *rows, tr_dt dt, int32_t T,
                       tr_err *err) {
    if (need_comm(m, err) != 0) return -1;
    size_t counts[TR_COMM_MAX_RANKS], es = tr_dt_size(dt);
    sp_counts(m, T, counts);
    char *mine = (char *)full + sp_offset(m) * es;
    if (rows != mine && counts[m->tp.rank] > 0)
        m->be->ops->copy(m->be, mine, rows, counts[m->tp.rank] * es);
    return tr_comm_all_gather(m->tp_comm, full, counts, dt == TR_F32 ? TR_COMM_F32 : TR_COMM_BF16,
                              err);
}

int tr_model_sp_scatter(tr_model *m, float *buf, int32_t T, tr_err *err) {
    if (need_comm(m, err) != 0) return -1;
    size_t counts[TR_COMM_MAX_RANKS];
    sp_counts(m, T, counts);
    return tr_comm_reduce_scatter(m->tp_comm, buf, counts, TR_COMM_F32, err);
}

int tr_model_sp_scatter_act(tr_model *m, void *buf, int32_t T, tr_err *err) {
    if (m->act == TR_F32) return tr_model_sp_scatter(m, buf, T, err);
    float *red = m->acts.tp_red;
    if (!red) return tr_errf(err, TR_EINVAL, "model: no room to reduce a gradient (inference layout)");
    const tr_ops *op = m->be->ops;
    const size_t C = (size_t)m->cfg.hidden_size, off = sp_offset(m), mine = (size_t)m->sp_rows * C;
    op->convert(m->be, red, TR_F32, buf, m->act, (size_t)T * C);
    if (tr_model_sp_scatter(m, red, T, err) != 0) return -1;
    if (mine > 0)
        op->convert(m->be, (char *)buf + off * tr_dt_size(m->act), m->act, red + off, TR_F32, mine);
    return 0;
}

int tr_model_tp_gather_f64(tr_model *m, double *buf, size_t n, tr_err *err) {
    if (m->tp.size < 2) return 0;
    if (need_comm(m, err) != 0) return -1;
    size_t counts[TR_COMM_MAX_RANKS];
    for (int32_t r = 0; r < m->tp.size; r++) counts[r] = n;
    return tr_comm_all_gather(m->tp_comm, buf, counts, TR_COMM_F64, err);
}

int tr_model_reduce_grads(tr_model *m, tr_err *err) {
    if (m->tp.size < 2 || m->grad_sum_n == 0) return 0;
    const tr_ops *op = m->be->ops;
    // Each shared tensor has grad_slots places; a rank adds its gradient at its slot and
    // zeros elsewhere, so the sum at a slot is over the ranks holding that slot.
    op->fill(m->be, m->grad_sum, 0.0f, m->grad_sum_n);
    size_t off = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        const tr_tensor_desc *d = &m->layout.tensors[i];
        if (!d->grad_slots) continue;
        op->copy(m->be, m->grad_sum + off + (size_t)d->grad_slot * d->numel, m->grads + d->offset,
                 d->numel * sizeof(float));
        off += (size_t)d->grad_slots * d->numel;
    }
    if (tr_model_tp_sum(m, m->grad_sum, m->grad_sum_n, err) != 0)
        return tr_err_wrap(err, "summing shared gradients");
    off = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        const tr_tensor_desc *d = &m->layout.tensors[i];
        if (!d->grad_slots) continue;
        op->copy(m->be, m->grads + d->offset, m->grad_sum + off + (size_t)d->grad_slot * d->numel,
                 d->numel * sizeof(float));
        off += (size_t)d->grad_slots * d->numel;
    }
    return tr_dev_sync(m->be, "summing shared gradients", err);
}

// Every rank's layout, for where each rank's slice of a tensor goes.
typedef struct gather_ctx {
    tr_param_layout whole;
    tr_param_layout *ranks;
    float *dev;          // backend scratch: one tensor's slices of every rank
    float *host;         // their host copy (rank 0, or a rank that wants the result)
    size_t cap;          // floats in each
} gather_ctx;

static void gather_free(tr_model *m, gather_ctx *g) {
    for (int32_t r = 0; g->ranks && r < m->tp.size; r++) tr_param_layout_free(&g->ranks[r]);
    free(g->ranks);
    tr_param_layout_free(&g->whole);
    tr_dev_free(m->be, g->dev);
    tr_dev_free_host(m->be, g->host);
}

static int gather_init(tr_model *m, gather_ctx *g, bool want, tr_err *err) {
    memset(g, 0, sizeof *g);
    if (tr_param_layout_init(&g->whole, &m->cfg, err) != 0) return -1;
    g->ranks = calloc((size_t)m->tp.size, sizeof *g->ranks);
    if (!g->ranks) return tr_errf(err, TR_ENOMEM, "gathering tensor-parallel shards: out of memory");
    for (int32_t r = 0; r < m->tp.size; r++) {
        tr_tp tp;
        if (tr_tp_init(&tp, &m->cfg, m->tp.size, r, err) != 0 ||
            tr_param_layout_init_tp(&g->ranks[r], &m->cfg, &tp, err) != 0)
            return -1;
    }
    for (int32_t i = 0; i < g->whole.n_tensors; i++) {
        size_t sum = 0;
        for (int32_t r = 0; r < m->tp.size; r++) sum += g->ranks[r].tensors[i].numel;
        if (sum > g->cap) g->cap = sum;
    }
    g->dev = tr_dev_alloc(m->be, g->cap * sizeof(float), "gathering tensor-parallel shards", err);
    if (!g->dev) return -1;
    if (want && !(g->host = tr_dev_alloc_host(m->be, g->cap * sizeof(float),
                                              "gathering tensor-parallel shards", err)))
        return -1;
    return 0;
}

// Tensor i: every rank's slice into g->dev (rank order), then into full when it is given.
static int gather_tensor(tr_model *m, gather_ctx *g, int32_t i, bool grads, float *full,
                         tr_err *err) {
    const int32_t R = m->tp.size;
    size_t counts[TR_COMM_MAX_RANKS] = {0}, at = 0, mine = 0;
    for (int32_t r = 0; r < R; r++) {
        counts[r] = g->ranks[r].tensors[i].numel;
        if (r == m->tp.rank) mine = at;
        at += counts[r];
    }
    const tr_tensor_desc *d = &m->layout.tensors[i];
    const tr_ops *op = m->be->ops;
    if (grads) op->copy(m->be, g->dev + mine, m->grads + d->offset, d->numel * sizeof(float));
    else if (m->params) op->copy(m->be, g->dev + mine, m->params + d->offset, d->numel * sizeof(float));
    else op->convert(m->be, g->dev + mine, TR_F32,
                     (const char *)m->work + d->offset * tr_dt_size(m->wt), m->wt, d->numel);
    if (tr_comm_all_gather(m->tp_comm, g->dev, counts, TR_COMM_F32, err) != 0) return -1;
    if (!full) return 0;
    if (tr_dev_download_sync(m->be, g->host, g->dev, at * sizeof(float), "gathering shards", err))
        return -1;
    // Ranks holding the same part (whole tensors, replicated heads) hold the same values;
    // the lowest rank's is kept.
    for (int32_t r = R - 1; r >= 0; r--) {
        at -= counts[r];
        tr_tensor_unslice(&g->ranks[r].tensors[i], g->host + at, sizeof(float),
                          full + g->whole.tensors[i].offset);
    }
    return 0;
}

int tr_model_gather_full(tr_model *m, bool grads, float *full, tr_err *err) {
    if (grads && !m->grads)
        return tr_errf(err, TR_EINVAL, "model: no gradients (not set up for training)");
    if (m->tp.size < 2) {
        if (!full) return 0;
        return grads ? tr_model_read_grads(m, full, err) : tr_model_read_params(m, full, err);
    }
    if (need_comm(m, err) != 0) return -1;
    gather_ctx g;
    int rc = gather_init(m, &g, full != NULL, err);
    if (!rc && full) memset(full, 0, g.whole.total * sizeof(float));
    for (int32_t i = 0; !rc && i < g.whole.n_tensors; i++) rc = gather_tensor(m, &g, i, grads, full, err);
    gather_free(m, &g);
    if (rc) {
        tr_comm_abort(m->tp_comm, err->msg);
        return tr_err_wrap(err, "gathering tensor-parallel shards");
    }
    return 0;
}

int tr_model_save_gathered(tr_model *m, const char *dir, const tr_ckpt_save_opts *opts,
                           tr_err *err) {
    tr_param_layout whole;
    if (tr_param_layout_init(&whole, &m->cfg, err) != 0) return -1;
    float *full = NULL;
    if (m->tp.rank == 0 &&
        !(full = tr_dev_alloc_host(m->be, whole.total * sizeof(float), "checkpoint staging", err))) {
        tr_param_layout_free(&whole);
        if (m->tp_comm) tr_comm_abort(m->tp_comm, err->msg);
        return -1;
    }
    int rc = tr_model_gather_full(m, false, full, err);
    if (!rc && full) rc = tr_checkpoint_save(dir, &m->cfg, &whole, full, opts, err);
    tr_dev_free_host(m->be, full);
    tr_param_layout_free(&whole);
    return rc;
}
