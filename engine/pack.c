// The micro-batch packer (pack.h).
#include "engine/pack.h"

#include <stdlib.h>
#include <string.h>

int tr_pack_init(tr_pack *p, int32_t cap, tr_err *err) {
    memset(p, 0, sizeof *p);
    if (cap < 1) return tr_errf(err, TR_EINVAL, "pack: capacity %d tokens", cap);
    p->cap = cap;
    p->ids = malloc((size_t)cap * sizeof(int32_t));
    p->pos = malloc((size_t)cap * sizeof(int32_t));
    p->targets = malloc((size_t)cap * sizeof(int32_t));
    p->doc_start = malloc(((size_t)cap + 1) * sizeof(int32_t));
    p->prefix = malloc((size_t)cap * sizeof(int32_t));
    p->seq_doc = malloc((size_t)cap * sizeof(int32_t));
    if (!p->ids || !p->pos || !p->targets || !p->doc_start || !p->prefix || !p->seq_doc) {
        tr_pack_free(p);
        return tr_errf(err, TR_ENOMEM, "pack: out of memory for %d tokens", cap);
    }
    tr_pack_clear(p);
    return 0;
}

void tr_pack_free(tr_pack *p) {
    free(p->ids);
    free(p->pos);
    free(p->targets);
    free(p->doc_start);
    free(p->prefix);
    free(p->seq_doc);
    memset(p, 0, sizeof *p);
}

void tr_pack_clear(tr_pack *p) {
    p->doc_start[0] = 0;
    p->n_seqs = 0;
    p->prompt = -1;
    p->docs = (tr_doc_layout){.n_tokens = 0, .n_docs = 0, .doc_start = p->doc_start, .pos = p->pos};
}

// Appends a document: ids[0, n), positions from pos0, targets as given (NULL: the next token,
// `last` after the end), reading document `prefix` (-1: none) first.
static bool add_doc(tr_pack *p, const int32_t *ids, const int32_t *targets, int32_t n,
                    int32_t pos0, int32_t last, int32_t prefix) {
    int32_t t = p->docs.n_tokens;
    if (n < 1 || n > p->cap - t) return false;
    memcpy(p->ids + t, ids, (size_t)n * sizeof(int32_t));
    for (int32_t j = 0; j < n; j++) {
        p->pos[t + j] = pos0 + j;
        p->targets[t + j] = targets ? targets[j] : j + 1 < n ? ids[j + 1] : last;
    }
    p->prefix[p->docs.n_docs] = prefix;
    p->docs.n_tokens = t + n;
    p->doc_start[++p->docs.n_docs] = t + n;
    // the layout names prefixes only once a document has one
    if (prefix >= 0) p->docs.prefix = p->prefix;
    return true;
}

bool tr_pack_add(tr_pack *p, const int32_t *ids, const int32_t *targets, int32_t n) {
    if (!add_doc(p, ids, targets, n, 0, -1, -1)) return false;
    p->seq_doc[p->n_seqs++] = p->docs.n_docs - 1;
    p->prompt = -1;
    return true;
}

bool tr_pack_add_prompt(tr_pack *p, const int32_t *ids, int32_t n_prompt) {
    if (n_prompt < 2 || n_prompt > p->cap - p->docs.n_tokens) return false;
    if (!add_doc(p, ids, NULL, n_prompt - 1, 0, ids[n_prompt - 1], -1)) return false;
    p->prompt = p->docs.n_docs - 1;
    return true;
}

bool tr_pack_add_sharing(tr_pack *p, const int32_t *ids, int32_t n, int32_t n_prompt) {
    int32_t pl = n_prompt - 1;
    if (p->prompt < 0 || p->doc_start[p->prompt + 1] - p->doc_start[p->prompt] != pl)
        return false;
    if (!add_doc(p, ids + pl, NULL, n - pl, pl, -1, p->prompt)) return false;
    p->seq_doc[p->n_seqs++] = p->docs.n_docs - 1;
    return true;
}

int32_t tr_pack_row(const tr_pack *p, int32_t k, int32_t t) {
    int32_t d = p->seq_doc[k], f = p->prefix[d];
    if (f < 0) return p->doc_start[d] + t;
    int32_t pl = p->doc_start[f + 1] - p->doc_start[f];
    return t < pl ? p->doc_start[f] + t : p->doc_start[d] + t - pl;
}
