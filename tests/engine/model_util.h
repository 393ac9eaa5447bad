// Helpers shared by the model tests: packing sequences into one micro-batch (positions
// restart per document, targets are the next token of the same document) and reading the
// tensors of a fixture's expected.safetensors.
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
