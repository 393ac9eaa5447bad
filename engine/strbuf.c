// Growing text buffer; doubles its capacity so appends are amortized O(1).
#include "engine/strbuf.h"

#include <stdlib.h>
#include <string.h>

int tr_strbuf_put(tr_strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *g = realloc(b->s, cap);
        if (!g) return -1;
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
    return 0;
}

int tr_strbuf_str(tr_strbuf *b, const char *s) { return tr_strbuf_put(b, s, strlen(s)); }

void tr_strbuf_free(tr_strbuf *b) {
    free(b->s);
    b->s = NULL;
    b->len = b->cap = 0;
}
