// Model configuration read from a Hugging Face config.json: the Llama family (Llama 2/3,
// Qwen2/2.5, Qwen3 dense, Mistral) and the heads troupe puts on it. One struct, filled once, read-only
// afterwards; the parser (config.c) validates every field and names the file and key on error.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

enum tr_arch { TR_ARCH_LLAMA, TR_ARCH_QWEN2, TR_ARCH_MISTRAL, TR_ARCH_QWEN3 };

// Which output the model has, from config.json "architectures":
//   *ForCausalLM             -> TR_HEAD_LM    (lm_head.weight, or tied to embed_tokens)
//   *ForSequenceClassification -> TR_HEAD_SCORE (score.weight [num_labels, hidden], no bias;
//                               read at the last non-pad token: the reward model)
//   *ForTokenClassification  -> TR_HEAD_VALUE (score.weight [1, hidden] + score.bias [1];
//                               one scalar per token: the critic)
enum tr_head { TR_HEAD_LM, TR_HEAD_SCORE, TR_HEAD_VALUE };

enum tr_rope_type { TR_ROPE_DEFAULT, TR_ROPE_LLAMA3, TR_ROPE_LINEAR };

#define TR_MAX_EOS 8

typedef struct tr_model_config {
    enum tr_arch arch;
    enum tr_head head;
    char model_type[32];      // "llama", "qwen2", "mistral", "qwen3"
    char architecture[64];    // e.g. "Qwen2ForCausalLM"; written back on save
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;
    int32_t n_layers;         // num_hidden_layers
    int32_t n_heads;          // num_attention_heads
    int32_t n_kv_heads;       // num_key_value_heads (defaults to n_heads)
    int32_t head_dim;         // "head_dim" when given, else hidden_size / n_heads (qwen3: 128)
    int32_t max_position_embeddings;
    float rms_norm_eps;
    bool attention_bias;      // q/k/v projections carry a bias (Qwen2: always; Llama: key)
    bool o_proj_bias;         // o_proj carries a bias too: Llama's and Qwen3's attention_bias
                              // covers all four projections, Qwen2's fixed biases stop at v_proj
    bool qk_norm;             // Qwen3: an RMSNorm over each head of q and k (weights of
                              // head_dim, rms_norm_eps) after the projections, before RoPE
    bool tie_word_embeddings;
    int32_t num_labels;       // score head outputs (1 for reward models)
    // RoPE: classic top-level rope_theta/rope_scaling or the newer rope_parameters.
    double rope_theta;
    enum tr_rope_type rope_type;
    double rope_factor;               // llama3 and linear
    double rope_low_freq_factor;      // llama3
    double rope_high_freq_factor;     // llama3
    int32_t rope_original_max_pos;    // llama3 original_max_position_embeddings
    // Token ids (-1 when absent).
    int32_t bos_token_id;
    int32_t pad_token_id;
    int32_t eos_token_ids[TR_MAX_EOS];
    int32_t n_eos;
    char torch_dtype[16];     // as found ("bfloat16", "float32", ...); informational
} tr_model_config;

// Parses DIR/config.json (path is the file itself). Errors name the file and key.
int tr_config_load(const char *path, tr_model_config *cfg, tr_err *err);
// Parses config.json text already in memory; `name` is used in error messages.
int tr_config_parse(const char *json, size_t len, const char *name, tr_model_config *cfg,
                    tr_err *err);
// Writes a config.json that transformers loads back into the same model (atomic write).
int tr_config_save(const char *path, const tr_model_config *cfg, tr_err *err);
// Fills the RoPE inverse frequencies for the config (head_dim/2 values), applying llama3
// or linear scaling exactly as transformers' rope init functions do.
void tr_config_rope_inv_freq(const tr_model_config *cfg, double *inv_freq);
