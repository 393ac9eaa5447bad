// Parameter layout: every weight of a model lives in one contiguous buffer; this file lists the
// tensors (Hugging Face names, shapes, offsets in elements) and builds the struct of views into
// a buffer. The same element offsets serve the fp32 masters, the working copy (bf16 on a GPU),
// the gradients and each Adam moment.
// The layout is the compute layout, not HF's: a layer's q, k and v projections are one
// [q; k; v] weight (and one bias), gate and up one [gate; up] weight, so each is one GEMM. HF
// tensors are sub-ranges of those (rows stack, so each stays contiguous), which is all that
// checkpoint I/O needs. Linear weights keep HF's [out_features, in_features] row-major layout.
// Under tensor parallelism each rank has a layout of its own: every tensor keeps its HF name
// and full shape and says which slice of it the rank holds (engine/tp.h decides the split).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"
#include "engine/tp.h"

#define TR_NAME_MAX 96

// How a tensor is split over tensor-parallel ranks.
enum tr_split {
    TR_SPLIT_NONE,   // every rank holds all of it (norms, heads other than the LM head)
    TR_SPLIT_ROWS,   // rows [begin, begin + shape[0]) of dim 0 (column-parallel outputs,
                     // vocabulary rows, their biases)
    TR_SPLIT_COLS,   // columns [begin, begin + shape[1]) of dim 1 (row-parallel inputs)
};

typedef struct tr_tensor_desc {
    char name[TR_NAME_MAX];   // HF name, e.g. "model.layers.3.self_attn.q_proj.weight"
    int32_t ndim;             // 1 or 2
    int64_t shape[2];         // this rank's part
    size_t offset;            // in elements, from the start of the buffer
    size_t numel;             // of this rank's part
    int64_t full[2];          // the HF tensor's shape (= shape without tensor parallelism)
    size_t full_numel;
    enum tr_split split;
    int64_t begin;            // the first row or column held (0 when not split)
    // Whether this rank's part adds to the global gradient norm: a tensor several ranks
    // hold whole (TR_SPLIT_NONE, or a replicated key/value head) counts on one of them.
    bool counted;
    // Gradients summed over tensor-parallel ranks after backward: the ranks with the same
    // slot of grad_slots add their gradients (a replicated key/value head's replicas, slot =
    // the head; the per-head QK-norm weights, which every rank's heads use, one slot; under
    // sequence parallelism the norms of the residual stream, each rank's rows, one slot).
    // grad_slots 0: the gradient is complete on each rank.
    int32_t grad_slots, grad_slot;
} tr_tensor_desc;

// Views are untyped: the same struct points into the working weights (the backend's W dtype)
// and into the fp32 gradients; tr_params_views takes the buffer's element size.
typedef struct tr_layer_params {
    void *attn_norm;                   // [hidden]                model.layers.i.input_layernorm.weight
    void *wqkv;                        // [n_heads*hd + 2*n_kv*hd, hidden]: q_proj, k_proj, v_proj rows
    void *bqkv;                        // [n_heads*hd + 2*n_kv*hd]; NULL unless attention_bias
    void *wo;                          // [hidden, n_heads*hd]
    void *bo;                          // [hidden]; NULL unless o_proj_bias
    void *q_norm, *k_norm;             // [head_dim] each; NULL unless qk_norm (Qwen3)
    void *mlp_norm;                    // [hidden]                post_attention_layernorm.weight
    void *w_gu;                        // [2*intermediate, hidden]: gate_proj, then up_proj rows
    void *w_down;                      // [hidden, intermediate]
} tr_layer_params;

typedef struct tr_params {
    void *embed;                       // [vocab, hidden]         model.embed_tokens.weight
    tr_layer_params *layers;           // n_layers entries (owned by tr_param_layout)
    void *final_norm;                  // [hidden]                model.norm.weight
    void *lm_head;                     // [vocab, hidden]; == embed when tied; NULL if no LM head
    void *score_w;                     // [num_labels or 1, hidden] score.weight; NULL for LM
    void *score_b;                     // [1] score.bias for the value head; else NULL
} tr_params;

typedef struct tr_param_layout {
    tr_tensor_desc *tensors;           // in HF order; tied lm_head is not listed separately
    int32_t n_tensors;
    size_t total;                      // elements in the buffer
    tr_tp tp;                          // the rank this layout is for (size 1: whole model)
} tr_param_layout;

// Lists the tensors of cfg's model (cfg->head picks the output head). Caller frees with
// tr_param_layout_free.
int tr_param_layout_init(tr_param_layout *layout, const tr_model_config *cfg, tr_err *err);
// The layout of tensor-parallel rank tp->rank: each fused group holds the rank's rows of its
// members ([q; k; v] of its heads, [gate; up] of its channels), still contiguous.
int tr_param_layout_init_tp(tr_param_layout *layout, const tr_model_config *cfg,
                            const tr_tp *tp, tr_err *err);
void tr_param_layout_free(tr_param_layout *layout);
// This rank's part of tensor d from the whole HF tensor `full` (row-major, elements of es
// bytes) into part (d->numel elements), and back: part into its place in full.
void tr_tensor_slice(const tr_tensor_desc *d, const void *full, size_t es, void *part);
void tr_tensor_unslice(const tr_tensor_desc *d, const void *part, size_t es, void *full);
// Finds a tensor by HF name; NULL if absent.
const tr_tensor_desc *tr_param_layout_find(const tr_param_layout *layout, const char *name);
// Points p's views into buf (layout->total elements of elem_size bytes). p->layers is
// malloc'd here; release it with tr_params_free_views.
int tr_params_views(tr_params *p, const tr_param_layout *layout, const tr_model_config *cfg,
                    void *buf, size_t elem_size, tr_err *err);
void tr_params_free_views(tr_params *p);
