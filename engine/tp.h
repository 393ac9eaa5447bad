// Tensor-parallel shape of one rank: which query heads, key/value heads, intermediate
// channels and vocabulary rows it holds when a model is split over `size` ranks Megatron's
// way (column-parallel [q;k;v] and [gate;up], row-parallel o_proj and down_proj,
// vocab-parallel embedding and LM head), and with sequence parallelism which rows of a batch
// it holds between those blocks. A size of 1 is the whole model.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"

typedef struct tr_tp {
    int32_t size, rank;
    int32_t n_heads;       // query heads of this rank: n_heads / size
    int32_t n_kv_heads;    // key/value heads it holds (1 when they are replicated)
    int32_t kv_head0;      // the first of them, in the model's numbering
    int32_t kv_replicas;   // ranks holding each key/value head: size / n_kv_heads when the
                           // model has fewer key/value heads than ranks, else 1
    int32_t inter;         // intermediate channels: intermediate_size / size
    int32_t vocab, vocab0; // rows [vocab0, vocab0 + vocab) of the embedding and LM head
    bool sp;               // sequence parallelism (size > 1 only): the residual stream and
                           // the norms hold this rank's rows of a batch (tr_tp_seq_begin),
                           // not all of them; set by the caller after tr_tp_init
} tr_tp;

// The shape of rank `rank` of `size`. Errors (naming the numbers) when size does not divide
// the query heads or the intermediate size, or when the key/value heads can be neither split
// evenly over the ranks nor replicated (size a multiple of them), or the vocabulary has
// fewer rows than ranks.
int tr_tp_init(tr_tp *tp, const tr_model_config *cfg, int32_t size, int32_t rank, tr_err *err);

// The first vocabulary row of rank r of size: rows are split as evenly as they go.
int32_t tr_tp_vocab_begin(int32_t vocab, int32_t size, int32_t r);
// Sequence parallelism: the first of a T-row batch's rows that rank r of size holds, split
// as the vocabulary is. When size does not divide T the parts differ by one row (the later
// ranks' are the longer), and a rank holds none when T < size.
int32_t tr_tp_seq_begin(int32_t T, int32_t size, int32_t r);
// The largest part tr_tp_seq_begin gives any rank of a batch of at most T rows.
int32_t tr_tp_seq_max_rows(int32_t T, int32_t size);

// cfg with the attention heads and intermediate size of this rank: what per-layer shapes
// (KV cache, activations) are computed from. The vocabulary stays the model's: token ids are
// global.
tr_model_config tr_tp_local_config(const tr_model_config *cfg, const tr_tp *tp);
