// Pretraining sampler over Megatron indexed datasets, after Megatron's GPTDataset: each
// prefix's documents are split train/valid/test by ratio, shuffled per epoch (document
// order), cut into windows of seq_len + 1 tokens that run across document boundaries
// (consecutive windows share one token), and the windows of each epoch are shuffled. Several
// prefixes are blended by weight. Sample k is a pure function of (config, k): resuming at
// sample k reproduces the same stream.
#pragma once
#include <stdint.h>

#include "data/indexed.h"
#include "engine/err.h"

enum { TR_SPLIT_TRAIN = 0, TR_SPLIT_VALID = 1, TR_SPLIT_TEST = 2 };

typedef struct tr_sampler_config {
    const char *const *prefixes;   // n_prefixes dataset prefixes
    const double *weights;         // blend weights (any positive scale); NULL = equal
    int32_t n_prefixes;
    const char *split;             // "969,30,1" (train,valid,test by documents); NULL = all train
    int32_t split_index;           // TR_SPLIT_*
    int32_t seq_len;               // a sample holds seq_len + 1 tokens
    uint64_t seed;
    int64_t n_samples;             // samples the caller will draw (sets how many epochs)
} tr_sampler_config;

// One prefix restricted to one split.
typedef struct tr_sampler_part {
    tr_indexed ds;
    int64_t doc_begin, doc_end;    // documents of the split
    int64_t tokens_per_epoch;
    int32_t n_epochs;
    int64_t n_samples;             // samples this part provides
    int64_t *doc_order;            // [n_epochs * n_docs] document ids, one shuffle per epoch
    int64_t *sample_pos;           // [n_samples] start: index into doc_order ...
    int32_t *sample_off;           // ... and token offset inside that document
    int64_t *order;                // [n_samples] window index per draw, shuffled per epoch
} tr_sampler_part;

typedef struct tr_sampler {
    int32_t seq_len;
    int64_t n_samples;
    int32_t n_parts;
    tr_sampler_part *parts;
    int32_t *blend_part;           // [n_samples] which part serves draw k
    int64_t *blend_index;          // [n_samples] that part's draw number
    int64_t next;                  // cursor for tr_sampler_next
} tr_sampler;

// Parses "969,30,1" (or with '/') into fractions summing to 1 (missing entries are 0).
int tr_split_parse(const char *split, double frac[3], tr_err *err);
// Megatron's document bounds per split: idx[0] = 0, idx[3] = n_docs.
void tr_split_bounds(const double frac[3], int64_t n_docs, int64_t idx[4]);

int tr_sampler_init(tr_sampler *s, const tr_sampler_config *cfg, tr_err *err);
void tr_sampler_free(tr_sampler *s);

// Tokens of sample k (k < n_samples) into out[seq_len + 1]. When doc_start is not NULL it
// receives where documents begin inside the window, as tr_doc_layout expects: doc_start[0]
// = 0, ..., doc_start[*n_docs] = seq_len + 1 (room for seq_len + 2 entries).
int tr_sampler_get(const tr_sampler *s, int64_t k, int32_t *out, int32_t *doc_start,
                   int32_t *n_docs, tr_err *err);
// Draws at the cursor: 1 with a sample, 0 when n_samples are used up, -1 on error.
int tr_sampler_next(tr_sampler *s, int32_t *out, tr_err *err);
// Moves the cursor (resume after k samples were consumed).
void tr_sampler_seek(tr_sampler *s, int64_t k);
