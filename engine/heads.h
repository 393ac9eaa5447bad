// The output heads on the trunk's final-norm output (model->acts.lnf): the LM head (next-token
// logprob and entropy), the value head (one scalar per token, the critic) and the score head
// (one score per document at its last non-pad token, the reward model). Each backward takes
// the gradient of the loss w.r.t. the head's outputs and writes acts.d_lnf, after which
// tr_model_backward carries it through the trunk.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "engine/model.h"

// LM head. targets[t] is the token whose logprob is wanted at t (the next token of the same
// document; < 0 where there is none: logprob 0, excluded from gradients). Fills logprob[t]
// and entropy[t] (either may be NULL). Logits are computed model->logit_rows rows at a time.
int tr_lm_head_forward(tr_model *m, const int32_t *targets, float *logprob, float *entropy,
                       tr_err *err);
// dlogprob[t] = dLoss/dlogprob[t], dentropy[t] = dLoss/dentropy[t] (either may be NULL).
// Recomputes a chunk's logits unless the forward held them all.
void tr_lm_head_backward(tr_model *m, const int32_t *targets, const float *dlogprob,
                         const float *dentropy);
// Logits of rows [row0, row0 + n) of the last forward (n <= logit_rows) into acts.logits in
// the activation dtype, as the log-softmax and the sample op read them; under tensor
// parallelism this rank's columns only, [n, tp.vocab].
int tr_lm_head_chunk_logits(tr_model *m, int32_t row0, int32_t n, tr_err *err);
// The same rows widened to fp32 into out[n, vocab] (backend memory; this rank's columns
// only under tensor parallelism, out[n, tp.vocab]), for callers that want the numbers. With
// fp32 activations the GEMM writes out itself and n may exceed logit_rows; otherwise the
// rows pass through acts.logits.
int tr_lm_head_logits(tr_model *m, int32_t row0, int32_t n, float *out, tr_err *err);
// Tensor parallelism: logprob[i] (backend memory) of targets[i] (backend memory) under the
// n rows of local logits in acts.logits, by the vocab-parallel log-softmax the forward uses,
// so a sampled token's logprob has the training path's bits; collective.
int tr_lm_head_vp_logprob(tr_model *m, const int32_t *targets, int32_t n, float *logprob,
                          tr_err *err);

// Value head: values[t] = score.weight . lnf[t] + score.bias, for every token.
int tr_value_head_forward(tr_model *m, float *values, tr_err *err);
void tr_value_head_backward(tr_model *m, const float *dvalues);

// Score head: scores[d * num_labels + j] for each document d, read at the document's last
// token whose id is not pad_token_id (its first token if all are pad; its last token when
// the config has no pad id), as transformers' *ForSequenceClassification does.
int tr_score_head_forward(tr_model *m, float *scores, tr_err *err);
void tr_score_head_backward(tr_model *m, const float *dscores);
// The token index (in the micro-batch) the score of document d is read at.
int32_t tr_score_head_token(const tr_model *m, int32_t d);
