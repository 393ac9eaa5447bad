// Packing documents into one micro-batch, the one place that lays a batch out: documents end
// to end, RoPE positions restarting at each document, and targets the next token of the same
// document (-1 at its end) unless the caller gives them (SFT's loss mask). The samples of one
// prompt can share it: the prompt's tokens but its last are packed once as a prefix document
// (tr_doc_layout.prefix), and each sample is a document of the rest (the prompt's last token,
// which predicts the sample's first, then the sample) reading the prefix before its own
// tokens, so each sample's rows are those of its unshared document, bit for bit. The arrays
// are host memory; tr_model_forward uploads them to the backend in one place.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "kernels/ops.h"

typedef struct tr_pack {
    int32_t cap;                  // tokens it holds at most
    int32_t *ids, *pos, *targets; // [cap]
    int32_t *doc_start;           // [cap + 1]
    int32_t *prefix;              // [cap] each document's prefix document, -1: none
    int32_t *seq_doc;             // [cap] the document of each sequence added
    int32_t n_seqs;
    int32_t prompt;               // the current prompt's prefix document (-1: none)
    tr_doc_layout docs;           // the documents so far (n_tokens, n_docs over the arrays)
} tr_pack;

int tr_pack_init(tr_pack *p, int32_t cap, tr_err *err);
void tr_pack_free(tr_pack *p);
// Empties it (capacity and arrays kept).
void tr_pack_clear(tr_pack *p);
// Appends ids[0, n) as a sequence of its own document; targets NULL: each token's next one
// in the document, -1 at its end. Returns false, adding nothing, when fewer than n tokens of
// room are left.
bool tr_pack_add(tr_pack *p, const int32_t *ids, const int32_t *targets, int32_t n);
// Starts a prompt: tokens [0, n_prompt - 1) of ids (n_prompt >= 2) as a prefix document whose
// targets are the next tokens (ids[n_prompt - 1] the last one's). False, adding nothing, when
// it and one more token do not fit.
bool tr_pack_add_prompt(tr_pack *p, const int32_t *ids, int32_t n_prompt);
// Appends sequence ids[0, n) whose first n_prompt tokens are the current prompt's (the
// caller's word; n > n_prompt - 1): a document of tokens [n_prompt - 1, n) reading the
// prompt's document first. False, adding nothing, when they do not fit.
bool tr_pack_add_sharing(tr_pack *p, const int32_t *ids, int32_t n, int32_t n_prompt);
// The row holding token t of sequence k (k < n_seqs, t within the sequence).
int32_t tr_pack_row(const tr_pack *p, int32_t k, int32_t t);
// Tokens sequences of n tokens take: alone, or sharing a prompt of n_prompt tokens (each
// then takes n - n_prompt + 1, and the prompt n_prompt - 1 once).
static inline int32_t tr_pack_cost(int32_t n, int32_t n_prompt) {
    return n_prompt >= 2 ? n - n_prompt + 1 : n;
}
