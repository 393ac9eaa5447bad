// LM, value and score heads over the final-norm output. The LM head never holds [T, vocab]
// logits whole: it runs logit_rows rows at a time through matmul + fused log-softmax over
// one buffer of the activation dtype, which its backward overwrites with d_logits; the
// backward recomputes a chunk's logits rather than keeping them (unless all T fit).
// Per-token inputs and outputs are host arrays; they cross to and from the model's backend
// copies (d_targets, d_out, ...) here, with one wait per forward for the outputs. Under
// tensor parallelism the LM head is vocab-parallel: each rank's logits are its vocabulary
// rows, and the log-softmax combines every rank's row statistics (a gather of 4 numbers per
// row); value and score heads are whole on every rank.
#include "engine/heads.h"

#include <string.h>

#include "engine/device.h"
#include "engine/model_tp.h"

static int need_head(const tr_model *m, enum tr_head head, const char *what, tr_err *err) {
    if (m->cfg.head != head)
        return tr_errf(err, TR_EINVAL, "%s: the model (%s) has no such head", what,
                       m->cfg.architecture[0] ? m->cfg.architecture : m->cfg.model_type);
    if (m->docs.n_tokens < 1)
        return tr_errf(err, TR_EINVAL, "%s: no forward pass has run", what);
    return 0;
}

// Row r of an activation-dtype [T, C] buffer.
static void *act_row(const tr_model *m, void *p, int32_t r, int32_t C) {
    return (char *)p + (size_t)r * C * tr_dt_size(m->act);
}

// The value/score projection's backward from d_head_out (fp32, [T, N]): the gradient in
// the activation dtype, then one GEMM writing d_lnf.
static void head_grad_backward(tr_model *m, int32_t N) {
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size;
    tr_acts *a = &m->acts;
    const tr_ops *op = m->be->ops;
    op->convert(m->be, a->d_head_out_a, m->act, a->d_head_out, TR_F32, (size_t)T * N);
    op->matmul_backward(m->be, a->d_lnf, m->g.score_w, m->g.score_b, a->d_head_out_a, a->lnf,
                        m->w.score_w, T, C, N);
}

// n rows of LM logits into out ([n, V] of the activation dtype) from rows x of lnf: the
// GEMM's output as transformers' bf16 autocast rounds it, which the log-softmax and the
// sampler read as it is (widening each value exactly).
static void lm_logits(tr_model *m, void *out, const void *x, int32_t n) {
    const int32_t C = m->cfg.hidden_size, V = m->tp.vocab;
    m->be->ops->matmul_forward(m->be, out, x, m->w.lm_head, NULL, n, C, V, 0);
}

// The vocab-parallel log-softmax of the n rows of local logits in acts.logits: this rank's
// statistics at its place among the ranks', gathered, and combined alike on every rank.
static int vp_logsoftmax(tr_model *m, float *logprob, float *entropy, float *lse, double *mean,
                         const int32_t *targets, int32_t n, tr_err *err) {
    const tr_ops *op = m->be->ops;
    tr_acts *a = &m->acts;
    size_t per = (size_t)n * 4;
    op->logsoftmax_vp_stats(m->be, a->vp_stats + (size_t)m->tp.rank * per, a->logits, targets,
                            m->tp.vocab0, n, m->tp.vocab);
    if (tr_model_tp_gather_f64(m, a->vp_stats, per, err) != 0) return -1;
    op->logsoftmax_vp_combine(m->be, logprob, entropy, lse, mean, a->vp_stats, targets,
                              m->tp.size, n);
    return 0;
}

int tr_lm_head_vp_logprob(tr_model *m, const int32_t *targets, int32_t n, float *logprob,
                          tr_err *err) {
    if (m->tp.size == 1 || n > m->logit_rows)
        return tr_errf(err, TR_EINVAL, "lm head: a vocab-parallel logprob of %d rows (tp %d, "
                       "%d logit rows)", n, m->tp.size, m->logit_rows);
    // lse goes to rows of the model's own that no later step reads before a forward.
    return vp_logsoftmax(m, logprob, NULL, m->acts.lse, NULL, targets, n, err);
}

int tr_lm_head_forward(tr_model *m, const int32_t *targets, float *logprob, float *entropy,
                       tr_err *err) {
    if (need_head(m, TR_HEAD_LM, "lm head", err) != 0) return -1;
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    for (int32_t t = 0; t < T; t++)
        if (targets[t] >= V)
            return tr_errf(err, TR_ERANGE, "lm head: target of token %d is id %d, outside the "
                           "vocabulary [0, %d)", t, targets[t], V);
    const tr_ops *op = m->be->ops;
    tr_acts *a = &m->acts;
    const int32_t R = m->logit_rows;
    op->upload(m->be, m->d_targets, targets, (size_t)T * sizeof(int32_t));
    for (int32_t r0 = 0; r0 < T; r0 += R) {
        int32_t n = T - r0 < R ? T - r0 : R;
        lm_logits(m, a->logits, act_row(m, a->lnf, r0, C), n);
        float *lp = logprob ? m->d_out + r0 : NULL, *ent = entropy ? m->d_entropy + r0 : NULL;
        if (m->tp.size == 1) {
            op->logsoftmax_forward(m->be, lp, ent, a->lse + r0, a->logits, m->d_targets + r0, n, V);
        } else if (vp_logsoftmax(m, lp, ent, a->lse + r0, a->vp_mean ? a->vp_mean + r0 : NULL,
                                 m->d_targets + r0, n, err) != 0) {
            return tr_err_wrap(err, "lm head");
        }
    }
    m->logits_cached = T <= R;
    if (logprob) op->download(m->be, logprob, m->d_out, (size_t)T * sizeof(float));
    if (entropy) op->download(m->be, entropy, m->d_entropy, (size_t)T * sizeof(float));
    return tr_dev_sync(m->be, "lm head", err);
}

void tr_lm_head_backward(tr_model *m, const int32_t *targets, const float *dlogprob,
                         const float *dentropy) {
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, V = m->tp.vocab;
    const tr_ops *op = m->be->ops;
    tr_acts *a = &m->acts;
    const int32_t R = m->logit_rows;
    op->upload(m->be, m->d_targets, targets, (size_t)T * sizeof(int32_t));
    if (dlogprob) op->upload(m->be, m->d_dout, dlogprob, (size_t)T * sizeof(float));
    if (dentropy) op->upload(m->be, m->d_dentropy, dentropy, (size_t)T * sizeof(float));
    // Each chunk writes its own rows of d_lnf. d_logits go over the chunk's logits in place.
    for (int32_t r0 = 0; r0 < T; r0 += R) {
        int32_t n = T - r0 < R ? T - r0 : R;
        const void *x = act_row(m, a->lnf, r0, C);
        if (!m->logits_cached) lm_logits(m, a->logits, x, n);
        const float *glp = dlogprob ? m->d_dout + r0 : NULL;
        const float *gent = dentropy ? m->d_dentropy + r0 : NULL;
        if (m->tp.size == 1)
            op->logsoftmax_backward(m->be, a->logits, glp, gent, a->logits, a->lse + r0,
                                    m->d_targets + r0, n, V);
        else   // this rank's columns; d_lnf gets its part, summed in tr_model_backward
            op->logsoftmax_vp_backward(m->be, a->logits, glp, gent, a->logits, a->lse + r0,
                                       a->vp_mean + r0, m->d_targets + r0, m->tp.vocab0, n, V);
        op->matmul_backward(m->be, act_row(m, a->d_lnf, r0, C), m->g.lm_head, NULL, a->logits,
                            x, m->w.lm_head, n, C, V);
    }
    m->logits_cached = false;
}

static int check_rows(const tr_model *m, int32_t row0, int32_t n, int32_t max, tr_err *err) {
    if (need_head(m, TR_HEAD_LM, "lm head logits", err) != 0) return -1;
    if (row0 < 0 || n < 0 || row0 + n > m->docs.n_tokens)
        return tr_errf(err, TR_ERANGE, "lm head logits: rows %d..%d of a %d-token batch", row0,
                       row0 + n, m->docs.n_tokens);
    if (n > max)
        return tr_errf(err, TR_ERANGE, "lm head logits: %d rows at once, the model holds %d",
                       n, max);
    return 0;
}

int tr_lm_head_chunk_logits(tr_model *m, int32_t row0, int32_t n, tr_err *err) {
    if (check_rows(m, row0, n, m->logit_rows, err) != 0) return -1;
    lm_logits(m, m->acts.logits, act_row(m, m->acts.lnf, row0, m->cfg.hidden_size), n);
    m->logits_cached = false;
    return 0;
}

int tr_lm_head_logits(tr_model *m, int32_t row0, int32_t n, float *out, tr_err *err) {
    // fp32 activations: the GEMM writes out itself, any number of rows.
    if (m->act == TR_F32) {
        if (check_rows(m, row0, n, n, err) != 0) return -1;
        lm_logits(m, out, act_row(m, m->acts.lnf, row0, m->cfg.hidden_size), n);
        return 0;
    }
    if (tr_lm_head_chunk_logits(m, row0, n, err) != 0) return -1;
    m->be->ops->convert(m->be, out, TR_F32, m->acts.logits, m->act, (size_t)n * m->tp.vocab);
    return 0;
}

int tr_value_head_forward(tr_model *m, float *values, tr_err *err) {
    if (need_head(m, TR_HEAD_VALUE, "value head", err) != 0) return -1;
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size;
    m->be->ops->matmul_forward(m->be, m->acts.head_out, m->acts.lnf, m->w.score_w, m->w.score_b,
                               T, C, 1, TR_MM_OUT_F32);
    return tr_dev_download_sync(m->be, values, m->acts.head_out, (size_t)T * sizeof(float),
                                "value head", err);
}

void tr_value_head_backward(tr_model *m, const float *dvalues) {
    const int32_t T = m->docs.n_tokens;
    m->be->ops->upload(m->be, m->acts.d_head_out, dvalues, (size_t)T * sizeof(float));
    head_grad_backward(m, 1);
}

int32_t tr_score_head_token(const tr_model *m, int32_t d) {
    int32_t s = m->host_docs.doc_start[d], e = m->host_docs.doc_start[d + 1];
    int32_t pad = m->cfg.pad_token_id;
    if (pad < 0) return e - 1;
    for (int32_t t = e - 1; t >= s; t--)
        if (m->ids[t] != pad) return t;
    return s;  // all pad: transformers' argmax over an all-zero mask picks the first token
}

// Row index of each document's score token, in host memory for the gather and scatter below.
static void score_rows(const tr_model *m, int32_t *rows) {
    for (int32_t d = 0; d < m->docs.n_docs; d++) rows[d] = tr_score_head_token(m, d);
}

// The projection runs over every token (num_labels is tiny next to the trunk) so that both
// passes stay plain matmuls; only the picked rows reach the scores.
int tr_score_head_forward(tr_model *m, float *scores, tr_err *err) {
    if (need_head(m, TR_HEAD_SCORE, "score head", err) != 0) return -1;
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, N = m->cfg.num_labels;
    const tr_ops *op = m->be->ops;
    op->matmul_forward(m->be, m->acts.head_out, m->acts.lnf, m->w.score_w, m->w.score_b, T, C, N,
                       TR_MM_OUT_F32);
    // The token rows go to d_targets (free until an LM head would need it).
    score_rows(m, m->host_rows);
    op->upload(m->be, m->d_targets, m->host_rows, (size_t)m->docs.n_docs * sizeof(int32_t));
    op->gather_rows(m->be, m->d_out, m->acts.head_out, m->d_targets, m->docs.n_docs,
                    (size_t)N * sizeof(float));
    return tr_dev_download_sync(m->be, scores, m->d_out,
                                (size_t)m->docs.n_docs * N * sizeof(float), "score head", err);
}

void tr_score_head_backward(tr_model *m, const float *dscores) {
    const int32_t T = m->docs.n_tokens, N = m->cfg.num_labels;
    const tr_ops *op = m->be->ops;
    tr_acts *a = &m->acts;
    score_rows(m, m->host_rows);
    op->upload(m->be, m->d_targets, m->host_rows, (size_t)m->docs.n_docs * sizeof(int32_t));
    op->upload(m->be, m->d_dout, dscores, (size_t)m->docs.n_docs * N * sizeof(float));
    op->fill(m->be, a->d_head_out, 0.0f, (size_t)T * N);
    op->scatter_rows(m->be, a->d_head_out, m->d_dout, m->d_targets, m->docs.n_docs,
                     (size_t)N * sizeof(float));
    head_grad_backward(m, N);
}
