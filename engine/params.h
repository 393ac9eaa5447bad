// Parameter layout: every weight of a model lives in one contiguous float buffer; this file
// lists the tensors (Hugging Face names, shapes, offsets) and builds the struct of views into
// that buffer. The same layout serves gradients and each Adam moment (same offsets).
// Linear weights keep HF's [out_features, in_features] row-major layout.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"

#define TR_NAME_MAX 96

typedef struct tr_tensor_desc {
    char name[TR_NAME_MAX];   // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
    int32_t ndim;             // 1 or 2
    int64_t shape[2];
    size_t offset;            // in floats, from the start of the buffer
    size_t numel;
} tr_tensor_desc;

typedef struct tr_layer_params {
    float *attn_norm;                  // [hidden]                model.layers.i.input_layernorm.weight
    float *wq, *wk, *wv;               // [n_heads*hd, hidden], [n_kv*hd, hidden] x2
    float *bq, *bk, *bv;               // NULL unless attention_bias
    float *wo;                         // [hidden, n_heads*hd]
    float *bo;                         // [hidden]; NULL unless o_proj_bias
    float *q_norm, *k_norm;            // [head_dim] each; NULL unless qk_norm (Qwen3)
    float *mlp_norm;                   // [hidden]                post_attention_layernorm.weight
    float *w_gate, *w_up;              // [intermediate, hidden]
    float *w_down;                     // [hidden, intermediate]
} tr_layer_params;

typedef struct tr_params {
    float *embed;                      // [vocab, hidden]         model.embed_tokens.weight
    tr_layer_params *layers;           // n_layers entries (owned by tr_param_layout)
    float *final_norm;                 // [hidden]                model.norm.weight
    float *lm_head;                    // [vocab, hidden]; == embed when tied; NULL if no LM head
    float *score_w;                    // [num_labels or 1, hidden] score.weight; NULL for LM
    float *score_b;                    // [1] score.bias for the value head; else NULL
} tr_params;

typedef struct tr_param_layout {
    tr_tensor_desc *tensors;           // in HF order; tied lm_head is not listed separately
    int32_t n_tensors;
    size_t total;                      // floats in the buffer
} tr_param_layout;

// Lists the tensors of cfg's model (cfg->head picks the output head). Caller frees with
// tr_param_layout_free.
int tr_param_layout_init(tr_param_layout *layout, const tr_model_config *cfg, tr_err *err);
void tr_param_layout_free(tr_param_layout *layout);
// Finds a tensor by HF name; NULL if absent.
const tr_tensor_desc *tr_param_layout_find(const tr_param_layout *layout, const char *name);
// Points p's views into buf (which holds layout->total floats). p->layers is malloc'd here;
// release it with tr_params_free_views.
int tr_params_views(tr_params *p, const tr_param_layout *layout, const tr_model_config *cfg,
                    float *buf, tr_err *err);
void tr_params_free_views(tr_params *p);
