// The documented memory formulas, written out from the layout comments (engine/model.c's
// arena layout, engine/kvcache.h's pool, engine/arena.h's sizing rule) rather than taken from
// the engine, so the tests check that the engine allocates what the documentation says.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"

// Bytes rounded up to 64.
static inline size_t af_r64(size_t n) { return (n + 63) / 64 * 64; }

// Rows of LM logits held at once by default: as many as fit in 32 MiB, 1..T.
static inline size_t af_logit_rows(const tr_model_config *c, size_t T) {
    size_t r = (size_t)(32u << 20) / 4 / (size_t)c->vocab_size;
    if (r < 1) r = 1;
    return r > T ? T : r;
}

// Activation bytes for T tokens with a-byte activations (fp32 regions f = 4 bytes a value),
// every region rounded up to 64 bytes (QKV = Q + 2K), of one tensor-parallel rank of tp (c is
// its config: its heads and intermediate size; V its vocabulary rows), with sequence
// parallelism when sp; tp 1 is the whole model. Ts = ceil(T / tp) under sp, else T:
//   residual f (L+1 training, 2 inference with sp, else 1) x TsC; per layer set (L or 1):
//   ln1 a TsC, rstd f Ts, qkv a T*QKV, att a TQ, lse f TH, res_mid f TsC (inference without
//   sp: the residual buffer itself), ln2 a TsC, rstd f Ts, gu a 2TI, act a TI, and with
//   QK-norm qkv_n a T*QKV, q_rstd f TH, k_rstd f TG; lnf a TC, rstd f Ts; LM logits a RV, lse
//   f T (else head_out f TN); training: d_res f TsC, d_res_a a TC unless a = f without sp,
//   d_ln a TC, d_qkv a T*QKV, d_att a TQ, d_gu a 2TI, d_act a TI, d_qkv_n a T*QKV with
//   QK-norm, and with a value or score head d_head_out f TN + a TN (the LM head's d_logits
//   overwrite its logits); tp > 1: LM vp_stats 8 * tp*R*4 and, training, vp_mean 8T; sp:
//   sp_ln a TC and sp_red f TC, else tp_red f TC when training with a != f.
static inline size_t af_acts_bytes_tp(const tr_model_config *c, size_t V, size_t T, bool training,
                                      size_t a, size_t tp, bool sp) {
    const size_t f = 4;
    size_t C = (size_t)c->hidden_size, Q = (size_t)c->n_heads * c->head_dim;
    size_t K = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate_size;
    size_t QKV = Q + 2 * K;
    size_t H = (size_t)c->n_heads, L = (size_t)c->n_layers;
    size_t G = (size_t)c->n_kv_heads;
    size_t N = c->head == TR_HEAD_SCORE ? (size_t)c->num_labels : 1;
    tr_model_config local_vocab = *c;
    local_vocab.vocab_size = (int32_t)V;
    size_t R = af_logit_rows(&local_vocab, T);
    size_t Ts = sp ? (T + tp - 1) / tp : T;
    bool lm = c->head == TR_HEAD_LM;
    size_t layer = 2 * af_r64(a * Ts * C) + 2 * af_r64(f * Ts) + af_r64(a * T * QKV) +
                   af_r64(a * T * Q) + af_r64(f * T * H) + af_r64(f * Ts * C) +
                   af_r64(a * 2 * T * I) + af_r64(a * T * I);
    if (c->qk_norm) layer += af_r64(a * T * QKV) + af_r64(f * T * H) + af_r64(f * T * G);
    // inference without sp: the one residual buffer is the layer set's res_mid (in layer)
    size_t n = training ? (L + 1) * af_r64(f * Ts * C) + L * layer
               : sp     ? 2 * af_r64(f * Ts * C) + layer
                        : layer;
    n += af_r64(a * T * C) + af_r64(f * Ts);
    n += lm ? af_r64(a * R * V) + af_r64(f * T) : af_r64(f * T * N);
    if (training)
        n += af_r64(f * Ts * C) + (a != f || sp ? af_r64(a * T * C) : 0) + af_r64(a * T * C) +
             af_r64(a * T * QKV) + af_r64(a * T * Q) + af_r64(a * 2 * T * I) + af_r64(a * T * I) +
             (c->qk_norm ? af_r64(a * T * QKV) : 0) +
             (lm ? 0 : af_r64(f * T * N) + af_r64(a * T * N));
    if (tp > 1) {
        if (lm) n += af_r64(8 * tp * R * 4) + (training ? af_r64(8 * T) : 0);
        if (sp) n += af_r64(a * T * C) + af_r64(f * T * C);
        else if (training && a != f) n += af_r64(f * T * C);
    }
    return n;
}

// The whole model's activation bytes (one rank).
static inline size_t af_acts_bytes(const tr_model_config *c, size_t T, bool training, size_t a) {
    return af_acts_bytes_tp(c, (size_t)c->vocab_size, T, training, a, 1, false);
}

// K and V pools of ceil(kv_tokens / bs) blocks of a-byte values, each rounded up to 64 bytes.
static inline size_t af_kv_bytes(const tr_model_config *c, size_t kv_tokens, size_t bs, size_t a) {
    size_t blocks = (kv_tokens + bs - 1) / bs;
    return 2 * af_r64(a * (size_t)c->n_layers * blocks * bs * (size_t)c->n_kv_heads * c->head_dim);
}

// One role: max(train, forward + kv); train 0 when it does not train, kv 0 without generation.
static inline size_t af_need(size_t train, size_t forward, size_t kv) {
    return train > forward + kv ? train : forward + kv;
}
