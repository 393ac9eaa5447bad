// Helpers shared by the model tests: packing sequences into one micro-batch (positions
// restart per document, targets are the next token of the same document) and reading the
// tensors of a fixture's expected.safetensors.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/heads.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "kernels/ops.h"

typedef struct packed_batch {
    int32_t n_tokens, n_docs;
    int32_t ids[512], targets[512], pos[512], doc_start[65];
    tr_doc_layout docs;
} packed_batch;

// Packs n_docs sequences given as lens[] over ids[] (concatenated).
static inline void pack_batch(packed_batch *b, const int32_t *ids, const int32_t *lens,
                              int32_t n_docs) {
    memset(b, 0, sizeof *b);
    int32_t t = 0;
    for (int32_t d = 0; d < n_docs; d++) {
        b->doc_start[d] = t;
        for (int32_t i = 0; i < lens[d]; i++, t++) {
            b->ids[t] = ids[t];
            b->pos[t] = i;
            b->targets[t] = i + 1 < lens[d] ? ids[t + 1] : -1;
        }
    }
    b->doc_start[n_docs] = t;
    b->n_tokens = t;
    b->n_docs = n_docs;
    b->docs.n_tokens = t;
    b->docs.n_docs = n_docs;
    b->docs.doc_start = b->doc_start;
    b->docs.pos = b->pos;
}

// The training path's logprobs of prompt (P tokens) + tokens (n), a forward of one document
// on train (a model of >= P + n <= 128 rows), against what generation reported for them (lp):
// the largest difference (NAN when the forward failed); *bitwise += the equal ones.
static inline double gen_vs_training(tr_model *train, const int32_t *prompt, int32_t P,
                                     const int32_t *tokens, const float *lp, int32_t n,
                                     int64_t *bitwise) {
    int32_t ids[128], lens[1] = {P + n};
    if (P + n > 128) return NAN;
    for (int32_t t = 0; t < P; t++) ids[t] = prompt[t];
    for (int32_t t = 0; t < n; t++) ids[P + t] = tokens[t];
    packed_batch b;
    pack_batch(&b, ids, lens, 1);
    float out[128];
    tr_err err = {0};
    if (tr_model_forward(train, b.ids, &b.docs, &err) != 0 ||
        tr_lm_head_forward(train, b.targets, out, NULL, &err) != 0) {
        fprintf(stderr, "gen_vs_training: %s\n", err.msg);
        return NAN;
    }
    double worst = 0;
    for (int32_t t = 0; t < n; t++) {
        double d = fabs((double)out[P - 1 + t] - (double)lp[t]);
        if (!(d <= worst)) worst = d;
        *bitwise += out[P - 1 + t] == lp[t];
    }
    return worst;
}

// Reads tensor `name` of f as floats into a malloc'd array (NULL if absent or not float).
static inline float *st_floats(const tr_st_file *f, const char *name, size_t *n) {
    const tr_st_tensor *t = tr_st_find(f, name);
    if (!t) return NULL;
    float *out = malloc((t->numel ? t->numel : 1) * sizeof(float));
    tr_err err = {0};
    if (!out || tr_st_read_f32(f, t, out, &err) != 0) {
        free(out);
        return NULL;
    }
    if (n) *n = t->numel;
    return out;
}

// Reads an integer tensor of f into a malloc'd int32 array.
static inline int32_t *st_ints(const tr_st_file *f, const char *name, size_t *n) {
    const tr_st_tensor *t = tr_st_find(f, name);
    if (!t) return NULL;
    int64_t *tmp = malloc((t->numel ? t->numel : 1) * sizeof(int64_t));
    int32_t *out = malloc((t->numel ? t->numel : 1) * sizeof(int32_t));
    tr_err err = {0};
    if (!tmp || !out || tr_st_read_i64(f, t, tmp, &err) != 0) {
        free(tmp);
        free(out);
        return NULL;
    }
    for (uint64_t i = 0; i < t->numel; i++) out[i] = (int32_t)tmp[i];
    free(tmp);
    if (n) *n = t->numel;
    return out;
}
