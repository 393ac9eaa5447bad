// LM, value and score heads over the final-norm output. The LM head never holds [T, vocab]
// logits whole: it runs logit_rows rows at a time through matmul + fused log-softmax, and
// its backward recomputes a chunk's logits rather than keeping them (unless all T fit).
#include "engine/heads.h"

#include <string.h>

static int need_head(const tr_model *m, enum tr_head head, const char *what, tr_err *err) {
    if (m->cfg.head != head)
        return tr_errf(err, TR_EINVAL, "%s: the model (%s) has no such head", what,
                       m->cfg.architecture[0] ? m->cfg.architecture : m->cfg.model_type);
    if (m->docs.n_tokens < 1)
        return tr_errf(err, TR_EINVAL, "%s: no forward pass has run", what);
    return 0;
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
    for (int32_t r0 = 0; r0 < T; r0 += R) {
        int32_t n = T - r0 < R ? T - r0 : R;
        op->matmul_forward(m->be, a->logits, a->lnf + (size_t)r0 * C, m->w.lm_head, NULL, n, C,
                           V);
        op->logsoftmax_forward(m->be, logprob ? logprob + r0 : NULL,
                               entropy ? entropy + r0 : NULL, a->lse + r0, a->logits,
                               targets + r0, n, V);
    }
    m->logits_cached = T <= R;
    return 0;
}

void tr_lm_head_backward(tr_model *m, const int32_t *targets, const float *dlogprob,
                         const float *dentropy) {
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, V = m->cfg.vocab_size;
    const tr_ops *op = m->be->ops;
    tr_acts *a = &m->acts;
    const int32_t R = m->logit_rows;
    memset(a->d_lnf, 0, (size_t)T * C * sizeof(float));
    for (int32_t r0 = 0; r0 < T; r0 += R) {
        int32_t n = T - r0 < R ? T - r0 : R;
        const float *x = a->lnf + (size_t)r0 * C;
        if (!m->logits_cached) op->matmul_forward(m->be, a->logits, x, m->w.lm_head, NULL, n, C, V);
        op->logsoftmax_backward(m->be, a->d_logits, dlogprob ? dlogprob + r0 : NULL,
                                dentropy ? dentropy + r0 : NULL, a->logits, a->lse + r0,
                                targets + r0, n, V);
        op->matmul_backward(m->be, a->d_lnf + (size_t)r0 * C, m->g.lm_head, NULL, a->d_logits,
                            x, m->w.lm_head, n, C, V);
    }
}

int tr_lm_head_logits(tr_model *m, int32_t row0, int32_t n, float *out, tr_err *err) {
    if (need_head(m, TR_HEAD_LM, "lm head logits", err) != 0) return -1;
    if (row0 < 0 || n < 0 || row0 + n > m->docs.n_tokens)
        return tr_errf(err, TR_ERANGE, "lm head logits: rows %d..%d of a %d-token batch", row0,
                       row0 + n, m->docs.n_tokens);
    const int32_t C = m->cfg.hidden_size;
    m->be->ops->matmul_forward(m->be, out, m->acts.lnf + (size_t)row0 * C, m->w.lm_head, NULL,
                               n, C, m->cfg.vocab_size);
    return 0;
}

int tr_value_head_forward(tr_model *m, float *values, tr_err *err) {
    if (need_head(m, TR_HEAD_VALUE, "value head", err) != 0) return -1;
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size;
    m->be->ops->matmul_forward(m->be, m->acts.head_out, m->acts.lnf, m->w.score_w, m->w.score_b,
                               T, C, 1);
    memcpy(values, m->acts.head_out, (size_t)T * sizeof(float));
    return 0;
}

void tr_value_head_backward(tr_model *m, const float *dvalues) {
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size;
    tr_acts *a = &m->acts;
    memcpy(a->d_head_out, dvalues, (size_t)T * sizeof(float));
    memset(a->d_lnf, 0, (size_t)T * C * sizeof(float));
    m->be->ops->matmul_backward(m->be, a->d_lnf, m->g.score_w, m->g.score_b, a->d_head_out,
                                a->lnf, m->w.score_w, T, C, 1);
}

int32_t tr_score_head_token(const tr_model *m, int32_t d) {
    int32_t s = m->docs.doc_start[d], e = m->docs.doc_start[d + 1];
    int32_t pad = m->cfg.pad_token_id;
    if (pad < 0) return e - 1;
    for (int32_t t = e - 1; t >= s; t--)
        if (m->ids[t] != pad) return t;
    return s;  // all pad: transformers' argmax over an all-zero mask picks the first token
}

// The projection runs over every token (num_labels is tiny next to the trunk) so that both
// passes stay plain matmuls; only the picked rows reach the scores.
int tr_score_head_forward(tr_model *m, float *scores, tr_err *err) {
    if (need_head(m, TR_HEAD_SCORE, "score head", err) != 0) return -1;
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, N = m->cfg.num_labels;
    m->be->ops->matmul_forward(m->be, m->acts.head_out, m->acts.lnf, m->w.score_w, m->w.score_b,
                               T, C, N);
    for (int32_t d = 0; d < m->docs.n_docs; d++) {
        int32_t t = tr_score_head_token(m, d);
        memcpy(scores + (size_t)d * N, m->acts.head_out + (size_t)t * N, (size_t)N * sizeof(float));
    }
    return 0;
}

void tr_score_head_backward(tr_model *m, const float *dscores) {
    const int32_t T = m->docs.n_tokens, C = m->cfg.hidden_size, N = m->cfg.num_labels;
    tr_acts *a = &m->acts;
    memset(a->d_head_out, 0, (size_t)T * N * sizeof(float));
    for (int32_t d = 0; d < m->docs.n_docs; d++) {
        int32_t t = tr_score_head_token(m, d);
        memcpy(a->d_head_out + (size_t)t * N, dscores + (size_t)d * N, (size_t)N * sizeof(float));
    }
    memset(a->d_lnf, 0, (size_t)T * C * sizeof(float));
    m->be->ops->matmul_backward(m->be, a->d_lnf, m->g.score_w, m->g.score_b, a->d_head_out,
                                a->lnf, m->w.score_w, T, C, N);
}
