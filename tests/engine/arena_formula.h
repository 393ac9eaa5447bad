// The documented memory formulas, written out from the layout comments (engine/model.c's
// arena layout, engine/kvcache.h's pool, engine/arena.h's sizing rule) rather than taken from
// the engine, so the tests check that the engine allocates what the documentation says.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"

static inline size_t af_r16(size_t n) { return (n + 15) / 16 * 16; }

// Rows of LM logits held at once by default: as many as fit in 32 MiB, 1..T.
static inline size_t af_logit_rows(const tr_model_config *c, size_t T) {
    size_t r = (size_t)(32u << 20) / 4 / (size_t)c->vocab_size;
    if (r < 1) r = 1;
    return r > T ? T : r;
}

// Activation floats for T tokens, every region rounded up to 16 floats:
//   residual (L+1 or 2) x TC; per layer set (L or 1): ln1 TC, rstd T, q TQ, k, v TK, att TQ,
//   lse TH, res_mid TC, ln2 TC, rstd T, gate, up, act TI, and with QK-norm q_raw TQ, k_raw TK,
//   q_rstd TH, k_rstd TG; lnf TC, rstd T, scratch TC; LM logits RV + lse T (else head_out
//   TN); training: d_res, d_ln TC, d_q, d_att TQ, d_k, d_v TK, d_gate, d_up, d_act TI,
//   d_k_raw TK with QK-norm, d_logits RV (else d_head_out TN).
static inline size_t af_acts_floats(const tr_model_config *c, size_t T, bool training) {
    size_t C = (size_t)c->hidden_size, Q = (size_t)c->n_heads * c->head_dim;
    size_t K = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate_size;
    size_t H = (size_t)c->n_heads, V = (size_t)c->vocab_size, L = (size_t)c->n_layers;
    size_t G = (size_t)c->n_kv_heads;
    size_t N = c->head == TR_HEAD_SCORE ? (size_t)c->num_labels : 1;
    size_t R = af_logit_rows(c, T);
    bool lm = c->head == TR_HEAD_LM;
    size_t layer = 3 * af_r16(T * C) + 2 * af_r16(T) + 2 * af_r16(T * Q) + 2 * af_r16(T * K) +
                   af_r16(T * H) + 3 * af_r16(T * I);
    if (c->qk_norm) layer += af_r16(T * Q) + af_r16(T * K) + af_r16(T * H) + af_r16(T * G);
    size_t n = (training ? L + 1 : 2) * af_r16(T * C) + (training ? L : 1) * layer;
    n += 2 * af_r16(T * C) + af_r16(T);
    n += lm ? af_r16(R * V) + af_r16(T) : af_r16(T * N);
    if (training)
        n += 2 * af_r16(T * C) + 2 * af_r16(T * Q) + 2 * af_r16(T * K) + 3 * af_r16(T * I) +
             (c->qk_norm ? af_r16(T * K) : 0) + (lm ? af_r16(R * V) : af_r16(T * N));
    return n;
}

// K and V pools of ceil(kv_tokens / bs) blocks, each rounded up to 16 floats.
static inline size_t af_kv_floats(const tr_model_config *c, size_t kv_tokens, size_t bs) {
    size_t blocks = (kv_tokens + bs - 1) / bs;
    return 2 * af_r16((size_t)c->n_layers * blocks * bs * (size_t)c->n_kv_heads * c->head_dim);
}

// One role: max(train, forward + kv); train 0 when it does not train, kv 0 without generation.
static inline size_t af_need(size_t train, size_t forward, size_t kv) {
    return train > forward + kv ? train : forward + kv;
}
