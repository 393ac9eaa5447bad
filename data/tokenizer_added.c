// Added tokens (special or not) are cut out of the text before normalization and
// pre-tokenization, as Hugging Face's AddedVocabulary does: leftmost-longest matches over a
// byte trie, then the single_word, lstrip and rstrip rules of each token.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

int tr_tok_trie_init(tr_tok_trie *t, tr_err *err) {
    memset(t, 0, sizeof *t);
    t->cap = 64;
    t->nodes = malloc((size_t)t->cap * sizeof *t->nodes);
    if (!t->nodes) return tr_errf(err, TR_ENOMEM, "out of memory for added tokens");
    t->nodes[0] = (tr_tok_trie_node){.child = -1, .sibling = -1, .token = -1};
    t->n = 1;
    return 0;
}

void tr_tok_trie_free(tr_tok_trie *t) {
    free(t->nodes);
    memset(t, 0, sizeof *t);
}

static int32_t trie_child(const tr_tok_trie *t, int32_t node, uint8_t b) {
    for (int32_t c = t->nodes[node].child; c >= 0; c = t->nodes[c].sibling)
        if (t->nodes[c].byte == b) return c;
    return -1;
}

int tr_tok_trie_add(tr_tok_trie *t, const char *s, size_t len, int32_t token, tr_err *err) {
    if (len == 0) return 0;
    int32_t node = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        int32_t c = trie_child(t, node, b);
        if (c < 0) {
            if (t->n == t->cap) {
                if (t->cap > INT32_MAX / 2) return tr_errf(err, TR_ERANGE, "added tokens too long");
                tr_tok_trie_node *nn = realloc(t->nodes, (size_t)t->cap * 2 * sizeof *nn);
                if (!nn) return tr_errf(err, TR_ENOMEM, "out of memory for added tokens");
                t->nodes = nn;
                t->cap *= 2;
            }
            c = t->n++;
            t->nodes[c] = (tr_tok_trie_node){.child = -1, .sibling = t->nodes[node].child,
                                             .token = -1, .byte = b};
            t->nodes[node].child = c;
        }
        node = c;
    }
    if (t->nodes[node].token < 0) t->nodes[node].token = token;
    uint8_t b0 = (uint8_t)s[0];
    if (!t->first[b0]) {
        t->first[b0] = 1;
        if (t->n_firsts < 3) t->firsts[t->n_firsts] = b0;
        if (t->n_firsts < 4) t->n_firsts++;
    }
    return 0;
}

int tr_tok_segs_push(tr_tok_segs *s, size_t start, size_t end, int32_t token, tr_err *err) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        tr_tok_seg *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return tr_errf(err, TR_ENOMEM, "out of memory splitting text");
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = (tr_tok_seg){.start = start, .end = end, .token = token};
    return 0;
}

// Longest token of the trie that starts at s[0]; *end gets its length.
static int32_t longest_at(const tr_tok_trie *t, const char *s, size_t len, size_t *end) {
    int32_t best = -1, node = 0;
    for (size_t i = 0; i < len; i++) {
        node = trie_child(t, node, (uint8_t)s[i]);
        if (node < 0) break;
        if (t->nodes[node].token >= 0) {
            best = t->nodes[node].token;
            *end = i + 1;
        }
    }
    return best;
}

int tr_tok_added_split(const tr_tokenizer *tok, const tr_tok_trie *trie, const char *s,
                       size_t len, tr_tok_segs *out, tr_err *err) {
    out->n = 0;
    size_t start_offset = 0, pos = 0;
    while (pos < len) {
        if (trie->n_firsts <= 3) {
            // Jump to the nearest byte a token can start with.
            size_t next = len;
            for (int k = 0; k < trie->n_firsts; k++) {
                const char *p = memchr(s + pos, trie->firsts[k], next - pos);
                if (p) next = (size_t)(p - s);
            }
            pos = next;
            if (pos == len) break;
        } else if (!trie->first[(uint8_t)s[pos]]) {
            pos++;
            continue;
        }
        size_t mlen = 0;
        int32_t t = longest_at(trie, s + pos, len - pos, &mlen);
        if (t < 0) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + mlen;
        pos = stop;  // matches never overlap, even when one is discarded below
        const tr_tok_added *a = &tok->added[t];
        if (a->single_word) {
            size_t n;
            bool word_before = start > 0 && tr_tok_is_word(tr_tok_utf8_prev(s, start, &n));
            bool word_after = stop < len && tr_tok_is_word(tr_tok_utf8_next(s + stop, len - stop, &n));
            if (word_before || word_after) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t n;
                if (!tr_tok_is_space(tr_tok_utf8_prev(s, ns, &n))) break;
                ns -= n;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                size_t n;
                if (!tr_tok_is_space(tr_tok_utf8_next(s + stop, len - stop, &n))) break;
                stop += n;
            }
        }
        if (start_offset < start && tr_tok_segs_push(out, start_offset, start, -1, err)) return -1;
        if (tr_tok_segs_push(out, start, stop, t, err)) return -1;
        start_offset = stop;
    }
    if (start_offset < len && tr_tok_segs_push(out, start_offset, len, -1, err)) return -1;
    return 0;
}
