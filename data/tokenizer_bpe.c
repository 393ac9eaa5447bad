// Byte-level BPE of one pre-tokenized word: start from one symbol per byte and apply merges
// lowest rank first, leftmost on ties, which is the order of Hugging Face's Word::merge_all.
// Short words merge in a packed array, long ones with a binary heap over a linked list; both
// sit behind the whole-word vocabulary lookup (ignore_merges) and the shared word cache.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

int tr_tok_push_id(tr_tok_ctx *c, int32_t id) {
    if (c->n_ids == c->cap_ids) {
        size_t nc = c->cap_ids ? c->cap_ids * 2 : 256;
        int32_t *n = realloc(c->ids, nc * sizeof *n);
        if (!n) return tr_errf(c->err, TR_ENOMEM, "out of memory for %zu ids", nc);
        c->ids = n;
        c->cap_ids = nc;
    }
    c->ids[c->n_ids++] = id;
    return 0;
}

static bool merge_less(const tr_tok_merge *a, const tr_tok_merge *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(tr_tok_merge *h, size_t *n, tr_tok_merge m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static tr_tok_merge heap_pop(tr_tok_merge *h, size_t *n) {
    tr_tok_merge top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        size_t m = l + 1 < *n && merge_less(&h[l + 1], &h[l]) ? l + 1 : l;
        if (!merge_less(&h[m], &last)) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static int reserve(tr_tok_ctx *c, size_t len) {
    if (len > c->sym_cap) {
        size_t nc = c->sym_cap ? c->sym_cap : 64;
        while (nc < len) nc *= 2;
        tr_tok_symbol *s = realloc(c->sym, nc * sizeof *s);
        if (!s) return tr_errf(c->err, TR_ENOMEM, "out of memory for a word of %zu bytes", len);
        c->sym = s;
        c->sym_cap = nc;
    }
    // Each merge pushes at most two pairs, so a word of len symbols needs < 3 * len slots.
    if (3 * len > c->heap_cap) {
        size_t nc = c->heap_cap ? c->heap_cap : 192;
        while (nc < 3 * len) nc *= 2;
        tr_tok_merge *h = realloc(c->heap, nc * sizeof *h);
        if (!h) return tr_errf(c->err, TR_ENOMEM, "out of memory for a word of %zu bytes", len);
        c->heap = h;
        c->heap_cap = nc;
    }
    return 0;
}

static void add_symbol(tr_tok_symbol *sym, size_t *n, int32_t id, uint32_t len) {
    int32_t i = (int32_t)*n;
    if (i > 0) sym[i - 1].next = i;
    sym[i] = (tr_tok_symbol){.id = id, .prev = i - 1, .next = -1, .len = len};
    (*n)++;
}

// Short words: keep the symbols in a packed array with the rank of each adjacent pair and
// merge the lowest (leftmost on ties) until none is left. Same order as the heap below, less
// bookkeeping; the heap wins once words get long.
#define BPE_SCAN_MAX 64

static int merge_scan(tr_tok_ctx *c, tr_tok_symbol *sym, size_t n) {
    const tr_tokenizer *t = c->tok;
    int32_t id[BPE_SCAN_MAX], merged[BPE_SCAN_MAX];
    uint32_t rank[BPE_SCAN_MAX];
    for (size_t i = 0; i < n; i++) id[i] = sym[i].id;
    for (size_t i = 0; i + 1 < n; i++) {
        const tr_tok_pair_slot *m = tr_tok_pairmap_get(&t->merges, id[i], id[i + 1]);
        rank[i] = m ? m->rank : UINT32_MAX;
        merged[i] = m ? m->id : -1;
    }
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        id[best] = merged[best];
        for (size_t i = best + 1; i + 1 < n; i++) {
            id[i] = id[i + 1];
            rank[i] = rank[i + 1];
            merged[i] = merged[i + 1];
        }
        n--;
        for (size_t i = best ? best - 1 : 0; i <= best && i + 1 < n; i++) {
            const tr_tok_pair_slot *m = tr_tok_pairmap_get(&t->merges, id[i], id[i + 1]);
            rank[i] = m ? m->rank : UINT32_MAX;
            merged[i] = m ? m->id : -1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (tr_tok_push_id(c, id[i])) return -1;
    return 0;
}

static int merge_word(tr_tok_ctx *c, const uint8_t *w, size_t len) {
    const tr_tokenizer *t = c->tok;
    if (len > INT32_MAX / 4) return tr_errf(c->err, TR_ERANGE, "word of %zu bytes is too long", len);
    if (reserve(c, len)) return -1;

    // One symbol per byte; bytes without a token become unk (fused when fuse_unk) or vanish.
    tr_tok_symbol *sym = c->sym;
    size_t n = 0;
    int32_t unk_len = 0;
    for (size_t i = 0; i < len; i++) {
        int32_t id = t->byte_ids[w[i]];
        if (id >= 0) {
            if (unk_len) add_symbol(sym, &n, t->unk_id, (uint32_t)unk_len);
            unk_len = 0;
            add_symbol(sym, &n, id, 1);
            continue;
        }
        if (!t->unk_token) continue;
        if (t->unk_missing)
            return tr_errf(c->err, TR_EINVAL, "unk_token '%s' is not in model.vocab", t->unk_token);
        if (unk_len && !t->fuse_unk) {
            add_symbol(sym, &n, t->unk_id, (uint32_t)unk_len);
            unk_len = 0;
        }
        unk_len += 1;
    }
    if (unk_len) add_symbol(sym, &n, t->unk_id, (uint32_t)unk_len);

    if (n <= BPE_SCAN_MAX) return merge_scan(c, sym, n);

    tr_tok_merge *heap = c->heap;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tr_tok_pair_slot *m = tr_tok_pairmap_get(&t->merges, sym[i].id, sym[i + 1].id);
        if (m) heap_push(heap, &nh, (tr_tok_merge){.rank = m->rank, .pos = (uint32_t)i, .id = m->id});
    }
    while (nh) {
        tr_tok_merge top = heap_pop(heap, &nh);
        tr_tok_symbol *cur = &sym[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t next_pos = cur->next;
        tr_tok_symbol right = sym[next_pos];
        // Skip entries made stale by earlier merges around this position.
        const tr_tok_pair_slot *m = tr_tok_pairmap_get(&t->merges, cur->id, right.id);
        if (!m || m->id != top.id) continue;
        cur->id = top.id;
        cur->len += right.len;
        cur->next = right.next;
        sym[next_pos].len = 0;
        if (right.next >= 0) sym[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const tr_tok_pair_slot *p = tr_tok_pairmap_get(&t->merges, sym[cur->prev].id, cur->id);
            if (p)
                heap_push(heap, &nh,
                          (tr_tok_merge){.rank = p->rank, .pos = (uint32_t)cur->prev, .id = p->id});
        }
        if (cur->next >= 0) {
            const tr_tok_pair_slot *p = tr_tok_pairmap_get(&t->merges, cur->id, sym[cur->next].id);
            if (p) heap_push(heap, &nh, (tr_tok_merge){.rank = p->rank, .pos = top.pos, .id = p->id});
        }
    }
    for (size_t i = 0; i < n; i++)
        if (sym[i].len && tr_tok_push_id(c, sym[i].id)) return -1;
    return 0;
}

int tr_tok_bpe(tr_tok_ctx *c, const uint8_t *w, size_t len) {
    const tr_tokenizer *t = c->tok;
    if (len == 0) return 0;
    if (t->ignore_merges || len == 1) {
        int32_t id = len == 1 ? t->byte_ids[w[0]] : tr_tok_strmap_get(&t->bpe_vocab, w, len);
        if (id >= 0) return tr_tok_push_id(c, id);
    }
    int32_t cached[TR_TOK_CACHE_IDS];
    size_t n_cached;
    if (tr_tok_cache_get(&t->cache, w, len, cached, &n_cached)) {
        for (size_t i = 0; i < n_cached; i++)
            if (tr_tok_push_id(c, cached[i])) return -1;
        return 0;
    }
    size_t first = c->n_ids;
    if (merge_word(c, w, len)) return -1;
    if (c->n_ids > first) tr_tok_cache_put(&t->cache, w, len, c->ids + first, c->n_ids - first);
    return 0;
}
