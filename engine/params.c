// The flat parameter layout: HF tensor names and shapes for the Llama family in compute
// order, each tensor or fused group ([q;k;v] weights, their biases, [gate;up]) starting on a
// 16-element boundary so SIMD and GPU loads stay aligned, and the struct of views into one
// buffer. Inside a group the HF tensors follow each other with no gap: the group is one
// matrix to a GEMM. A tensor-parallel rank's layout is the same walk over its own slices.
#include "engine/params.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TR_PARAM_ALIGN 16  // elements

typedef struct builder {
    tr_param_layout *layout;
    int32_t cap;
    size_t offset;
    bool first_rank;     // tensor-parallel rank 0: counts the tensors every rank holds
    tr_err *err;
} builder;

// Appends a tensor; with `packed` the next one starts right after it (a fused group's member).
static int add_to(builder *b, bool packed, int32_t ndim, int64_t d0, int64_t d1, const char *fmt,
                  int32_t layer) {
    tr_param_layout *l = b->layout;
    if (l->n_tensors == b->cap)
        return tr_errf(b->err, TR_ERANGE, "parameter layout: more tensors than planned");
    tr_tensor_desc *t = &l->tensors[l->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    t->numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    t->full[0] = t->shape[0];
    t->full[1] = t->shape[1];
    t->full_numel = t->numel;
    t->split = TR_SPLIT_NONE;
    t->counted = b->first_rank;
    t->offset = b->offset;
    size_t padded = packed ? t->numel
                           : (b->offset + t->numel + TR_PARAM_ALIGN - 1) / TR_PARAM_ALIGN * TR_PARAM_ALIGN -
                                 b->offset;
    if (b->offset > SIZE_MAX / 8 - padded)
        return tr_errf(b->err, TR_ERANGE, "parameter layout: model too large");
    b->offset += padded;
    l->n_tensors++;
    return 0;
}

static int add(builder *b, int32_t ndim, int64_t d0, int64_t d1, const char *fmt, int32_t layer) {
    return add_to(b, false, ndim, d0, d1, fmt, layer);
}

// The tensor just added is this rank's slice [begin, begin + its size) of dimension `dim`
// (0: rows, 1: columns) of a tensor `full` long there; every rank's slice counts in the norm.
static void shard(builder *b, int32_t dim, int64_t begin, int64_t full) {
    tr_tensor_desc *t = &b->layout->tensors[b->layout->n_tensors - 1];
    t->split = dim == 0 ? TR_SPLIT_ROWS : TR_SPLIT_COLS;
    t->begin = begin;
    t->full[dim] = full;
    t->full_numel = (size_t)t->full[0] * (size_t)(t->ndim == 2 ? t->full[1] : 1);
    t->counted = true;
}

// The tensor just added has its gradient summed over the ranks holding slot `slot` of
// `slots`; `counted` says whether this rank's copy adds to the norm.
static void grad_sum(builder *b, int32_t slots, int32_t slot, bool counted) {
    tr_tensor_desc *t = &b->layout->tensors[b->layout->n_tensors - 1];
    t->grad_slots = slots;
    t->grad_slot = slot;
    t->counted = counted;
}

// A norm of the residual stream: whole on every rank, and under sequence parallelism each
// rank's gradient covers its rows of the batch only, so the ranks sum theirs.
static int add_norm(builder *b, int64_t hidden, const char *fmt, int32_t layer, const tr_tp *tp) {
    int rc = add(b, 1, hidden, 0, fmt, layer);
    if (!rc && tp->sp) grad_sum(b, 1, 0, tp->rank == 0);
    return rc;
}

// A key/value projection (weight or bias) of this rank: its heads' rows; with replicated
// heads, the replicas sum their gradients and the first counts.
static int add_kv(builder *b, bool packed, int32_t ndim, int64_t hidden, const char *fmt,
                  int32_t layer, const tr_model_config *cfg, const tr_tp *tp) {
    int64_t hd = cfg->head_dim, rows = (int64_t)tp->n_kv_heads * hd;
    int rc = add_to(b, packed, ndim, rows, hidden, fmt, layer);
    if (rc || tp->size == 1) return rc;
    shard(b, 0, (int64_t)tp->kv_head0 * hd, (int64_t)cfg->n_kv_heads * hd);
    if (tp->kv_replicas > 1)
        grad_sum(b, cfg->n_kv_heads, tp->kv_head0, tp->rank % tp->kv_replicas == 0);
    return 0;
}

int tr_param_layout_init(tr_param_layout *layout, const tr_model_config *cfg, tr_err *err) {
    // The whole model: one rank, no divisibility to check.
    tr_tp tp = {.size = 1, .n_heads = cfg->n_heads, .n_kv_heads = cfg->n_kv_heads,
                .kv_replicas = 1, .inter = cfg->intermediate_size, .vocab = cfg->vocab_size};
    return tr_param_layout_init_tp(layout, cfg, &tp, err);
}

// One decoder layer's tensors for rank tp.
static int add_layer(builder *b, const tr_model_config *cfg, const tr_tp *tp, int32_t i) {
    const bool par = tp->size > 1;
    int64_t h = cfg->hidden_size, hd = cfg->head_dim;
    int64_t q = (int64_t)tp->n_heads * hd, q0 = (int64_t)tp->rank * q;
    int64_t q_full = (int64_t)cfg->n_heads * hd;
    int64_t inter = tp->inter, i0 = (int64_t)tp->rank * inter;
    int rc = add_norm(b, h, "model.layers.%d.input_layernorm.weight", i, tp);
    if (!rc && !(rc = add_to(b, true, 2, q, h, "model.layers.%d.self_attn.q_proj.weight", i)) && par)
        shard(b, 0, q0, q_full);
    if (!rc) rc = add_kv(b, true, 2, h, "model.layers.%d.self_attn.k_proj.weight", i, cfg, tp);
    if (!rc) rc = add_kv(b, false, 2, h, "model.layers.%d.self_attn.v_proj.weight", i, cfg, tp);
    if (!rc && cfg->attention_bias) {
        if (!(rc = add_to(b, true, 1, q, 0, "model.layers.%d.self_attn.q_proj.bias", i)) && par)
            shard(b, 0, q0, q_full);
        if (!rc) rc = add_kv(b, true, 1, 0, "model.layers.%d.self_attn.k_proj.bias", i, cfg, tp);
        if (!rc) rc = add_kv(b, false, 1, 0, "model.layers.%d.self_attn.v_proj.bias", i, cfg, tp);
    }
    if (!rc && !(rc = add(b, 2, h, q, "model.layers.%d.self_attn.o_proj.weight", i)) && par)
        shard(b, 1, q0, q_full);
    // The row-parallel bias is whole on every rank; rank 0 adds it (model.c).
    if (!rc && cfg->o_proj_bias) rc = add(b, 1, h, 0, "model.layers.%d.self_attn.o_proj.bias", i);
    for (int k = 0; k < 2 && !rc && cfg->qk_norm; k++) {
        rc = add(b, 1, hd, 0, k ? "model.layers.%d.self_attn.k_norm.weight"
                                : "model.layers.%d.self_attn.q_norm.weight", i);
        // Shared by every head, so each rank's gradient covers its heads only.
        if (!rc && par) grad_sum(b, 1, 0, tp->rank == 0);
    }
    if (!rc) rc = add_norm(b, h, "model.layers.%d.post_attention_layernorm.weight", i, tp);
    if (!rc && !(rc = add_to(b, true, 2, inter, h, "model.layers.%d.mlp.gate_proj.weight", i)) && par)
        shard(b, 0, i0, cfg->intermediate_size);
    if (!rc && !(rc = add(b, 2, inter, h, "model.layers.%d.mlp.up_proj.weight", i)) && par)
        shard(b, 0, i0, cfg->intermediate_size);
    if (!rc && !(rc = add(b, 2, h, inter, "model.layers.%d.mlp.down_proj.weight", i)) && par)
        shard(b, 1, i0, cfg->intermediate_size);
    return rc;
}

int tr_param_layout_init_tp(tr_param_layout *layout, const tr_model_config *cfg,
                            const tr_tp *tp, tr_err *err) {
    memset(layout, 0, sizeof *layout);
    if (cfg->vocab_size <= 0 || cfg->hidden_size <= 0 || cfg->intermediate_size <= 0 ||
        cfg->n_layers <= 0 || cfg->n_heads <= 0 || cfg->n_kv_heads <= 0 || cfg->head_dim <= 0)
        return tr_errf(err, TR_EINVAL, "parameter layout: config has non-positive sizes");
    if (cfg->head == TR_HEAD_SCORE && cfg->num_labels <= 0)
        return tr_errf(err, TR_EINVAL, "parameter layout: score head needs num_labels > 0");
    int32_t per_layer = 9 + (cfg->attention_bias ? 3 : 0) + (cfg->o_proj_bias ? 1 : 0) +
                        (cfg->qk_norm ? 2 : 0);
    if (cfg->n_layers > (INT32_MAX - 8) / per_layer)
        return tr_errf(err, TR_ERANGE, "parameter layout: %d layers is too many", cfg->n_layers);
    int32_t cap = 2 + cfg->n_layers * per_layer + 2;
    layout->tensors = calloc((size_t)cap, sizeof *layout->tensors);
    if (!layout->tensors)
        return tr_errf(err, TR_ENOMEM, "parameter layout: out of memory for %d tensors", cap);
    layout->tp = *tp;
    builder b = {.layout = layout, .cap = cap, .first_rank = tp->rank == 0, .err = err};
    const bool par = tp->size > 1;
    int64_t h = cfg->hidden_size;
    int rc = add(&b, 2, tp->vocab, h, "model.embed_tokens.weight", 0);
    if (!rc && par) shard(&b, 0, tp->vocab0, cfg->vocab_size);
    for (int32_t i = 0; i < cfg->n_layers && !rc; i++) rc = add_layer(&b, cfg, tp, i);
    if (!rc) rc = add_norm(&b, h, "model.norm.weight", 0, tp);
    if (!rc) {
        switch (cfg->head) {
        case TR_HEAD_LM:
            if (!cfg->tie_word_embeddings &&
                !(rc = add(&b, 2, tp->vocab, h, "lm_head.weight", 0)) && par)
                shard(&b, 0, tp->vocab0, cfg->vocab_size);
            break;
        case TR_HEAD_SCORE: rc = add(&b, 2, cfg->num_labels, h, "score.weight", 0); break;
        case TR_HEAD_VALUE:
            rc = add(&b, 2, 1, h, "score.weight", 0);
            if (!rc) rc = add(&b, 1, 1, 0, "score.bias", 0);
            break;
        }
    }
    if (rc) {
        tr_param_layout_free(layout);
        return -1;
    }
    layout->total = b.offset;
    return 0;
}

void tr_param_layout_free(tr_param_layout *layout) {
    if (!layout) return;
    free(layout->tensors);
    layout->tensors = NULL;
    layout->n_tensors = 0;
    layout->total = 0;
}

// Rows of the part are runs of `run` elements `stride` apart in the whole tensor, from `start`.
static void slice_geometry(const tr_tensor_desc *d, size_t *start, size_t *run, size_t *stride,
                           size_t *rows) {
    size_t cols = d->ndim == 2 ? (size_t)d->full[1] : 1;
    if (d->split == TR_SPLIT_COLS) {
        *start = (size_t)d->begin;
        *run = (size_t)d->shape[1];
        *stride = cols;
        *rows = (size_t)d->shape[0];
    } else {   // whole, or rows: one contiguous run
        *start = d->split == TR_SPLIT_ROWS ? (size_t)d->begin * cols : 0;
        *run = d->numel;
        *stride = d->numel;
        *rows = 1;
    }
}

void tr_tensor_slice(const tr_tensor_desc *d, const void *full, size_t es, void *part) {
    size_t start, run, stride, rows;
    slice_geometry(d, &start, &run, &stride, &rows);
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)part + r * run * es, (const char *)full + (start + r * stride) * es, run * es);
}

void tr_tensor_unslice(const tr_tensor_desc *d, const void *part, size_t es, void *full) {
    size_t start, run, stride, rows;
    slice_geometry(d, &start, &run, &stride, &rows);
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)full + (start + r * stride) * es, (const char *)part + r * run * es, run * es);
}

const tr_tensor_desc *tr_param_layout_find(const tr_param_layout *layout, const char *name) {
    for (int32_t i = 0; i < layout->n_tensors; i++)
        if (strcmp(layout->tensors[i].name, name) == 0) return &layout->tensors[i];
    return NULL;
}

static char *view(const tr_param_layout *layout, char *buf, size_t es, const char *fmt,
                  int32_t layer) {
    char name[TR_NAME_MAX];
    snprintf(name, sizeof name, fmt, layer);
    const tr_tensor_desc *t = tr_param_layout_find(layout, name);
    return t ? buf + t->offset * es : NULL;
}

// The next tensor's view; a fused group's first member stands for the group, and the views
// skip its other members.
static void *next_view(const tr_tensor_desc **t, const tr_tensor_desc *end, char *buf, size_t es,
                       int32_t members) {
    if (*t + members > end) return NULL;
    void *p = buf + (*t)->offset * es;
    *t += members;
    return p;
}

int tr_params_views(tr_params *p, const tr_param_layout *layout, const tr_model_config *cfg,
                    void *buf_, size_t es, tr_err *err) {
    memset(p, 0, sizeof *p);
    char *buf = buf_;
    p->layers = calloc((size_t)cfg->n_layers, sizeof *p->layers);
    if (!p->layers) return tr_errf(err, TR_ENOMEM, "parameter views: out of memory");
    // Walk the layout in order rather than searching by name for every view.
    const tr_tensor_desc *t = layout->tensors;
    const tr_tensor_desc *end = t + layout->n_tensors;
    p->embed = next_view(&t, end, buf, es, 1);
    for (int32_t i = 0; i < cfg->n_layers; i++) {
        tr_layer_params *L = &p->layers[i];
        L->attn_norm = next_view(&t, end, buf, es, 1);
        L->wqkv = next_view(&t, end, buf, es, 3);
        if (cfg->attention_bias) L->bqkv = next_view(&t, end, buf, es, 3);
        L->wo = next_view(&t, end, buf, es, 1);
        if (cfg->o_proj_bias) L->bo = next_view(&t, end, buf, es, 1);
        if (cfg->qk_norm) {
            L->q_norm = next_view(&t, end, buf, es, 1);
            L->k_norm = next_view(&t, end, buf, es, 1);
        }
        L->mlp_norm = next_view(&t, end, buf, es, 1);
        L->w_gu = next_view(&t, end, buf, es, 2);
        L->w_down = next_view(&t, end, buf, es, 1);
    }
    p->final_norm = next_view(&t, end, buf, es, 1);
    if (cfg->head == TR_HEAD_LM) {
        p->lm_head = cfg->tie_word_embeddings ? p->embed : next_view(&t, end, buf, es, 1);
    } else {
        p->score_w = next_view(&t, end, buf, es, 1);
        if (cfg->head == TR_HEAD_VALUE) p->score_b = next_view(&t, end, buf, es, 1);
    }
    // The layout must have been built for this config: same count, names where we look.
    int32_t used = (int32_t)(t - layout->tensors);
    int32_t last = cfg->n_layers - 1;
    if (used != layout->n_tensors || !p->final_norm ||
        p->layers[last].w_down != view(layout, buf, es, "model.layers.%d.mlp.down_proj.weight", last) ||
        p->layers[last].w_gu != view(layout, buf, es, "model.layers.%d.mlp.gate_proj.weight", last)) {
        tr_params_free_views(p);
        return tr_errf(err, TR_EINVAL, "parameter views: layout does not match the config");
    }
    return 0;
}
void tr_params_free_views(tr_params *p) {
    if (!p) return;
    free(p->layers);
    memset(p, 0, sizeof *p);
}
