// Packing documents into one micro-batch, the one place that lays a batch out: documents end
// to end, RoPE positions restarting at each document, and targets the next token of the same
// document (-1 at its end) unless the caller gives them (SFT's loss mask). The arrays are
// host memory; tr_model_forward uploads them to the backend in one place.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "kernels/ops.h"

typedef struct tr_pack {
    int32_t cap;                  // tokens it holds at most
    int32_t *ids, *pos, *targets; // [cap]
    int32_t *doc_start;           // [cap + 1]
    tr_doc_layout docs;           // the documents so far (n_tokens, n_docs over the arrays)
} tr_pack;

int tr_pack_init(tr_pack *p, int32_t cap, tr_err *err);
void tr_pack_free(tr_pack *p);
// Empties it (capacity and arrays kept).
void tr_pack_clear(tr_pack *p);
// Appends ids[0, n) as a document; targets NULL: each token's next one in the document, -1 at
// its end. Returns false, adding nothing, when fewer than n tokens of room are left.
bool tr_pack_add(tr_pack *p, const int32_t *ids, const int32_t *targets, int32_t n);
