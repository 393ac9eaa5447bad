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
    if (!p->ids || !p->pos || !p->targets || !p->doc_start) {
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
    memset(p, 0, sizeof *p);
}

void tr_pack_clear(tr_pack *p) {
    p->doc_start[0] = 0;
    p->docs = (tr_doc_layout){.n_tokens = 0, .n_docs = 0, .doc_start = p->doc_start, .pos = p->pos};
}

bool tr_pack_add(tr_pack *p, const int32_t *ids, const int32_t *targets, int32_t n) {
    int32_t t = p->docs.n_tokens;
    if (n < 1 || n > p->cap - t) return false;
    memcpy(p->ids + t, ids, (size_t)n * sizeof(int32_t));
    for (int32_t j = 0; j < n; j++) {
        p->pos[t + j] = j;
        p->targets[t + j] = targets ? targets[j] : j + 1 < n ? ids[j + 1] : -1;
    }
    p->docs.n_tokens = t + n;
    p->doc_start[++p->docs.n_docs] = t + n;
    return true;
}
