// A growing, always NUL-terminated text buffer for building output lines (JSONL writers).
#pragma once
#include <stddef.h>

typedef struct tr_strbuf {
    char *s;
    size_t len, cap;
} tr_strbuf;

// Appends n bytes; returns -1 (buffer unchanged) when memory runs out.
int tr_strbuf_put(tr_strbuf *b, const char *s, size_t n);
int tr_strbuf_str(tr_strbuf *b, const char *s);
void tr_strbuf_free(tr_strbuf *b);
