// JSON writer: appends values to a growing buffer, placing commas, separators, quotes,
// escapes and indentation, in the style the writer's flags choose.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/json.h"

void tr_json_writer_init(tr_json_writer *w, int32_t indent) {
    memset(w, 0, sizeof *w);
    w->indent = indent < 0 ? 0 : indent;
    w->first[0] = true;
}

void tr_json_writer_reset(tr_json_writer *w) {
    w->len = 0;
    if (w->buf) w->buf[0] = '\0';
    w->depth = 0;
    w->first[0] = true;
    w->after_key = false;
    w->done = false;
    w->failed = TR_OK;
}

void tr_json_writer_free(tr_json_writer *w) {
    free(w->buf);
    w->buf = NULL;
    w->len = w->cap = 0;
}

static void put(tr_json_writer *w, const char *s, size_t n) {
    if (w->failed) return;
    if (w->cap - w->len < n + 1) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap - w->len < n + 1) {
            if (cap > SIZE_MAX / 2) {
                w->failed = TR_ENOMEM;
                return;
            }
            cap *= 2;
        }
        char *nb = realloc(w->buf, cap);
        if (!nb) {
            w->failed = TR_ENOMEM;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

static void newline_indent(tr_json_writer *w) {
    if (!w->indent) return;
    put(w, "\n", 1);
    for (int32_t i = 0; i < w->depth * w->indent; i++) put(w, " ", 1);
}

static bool spaced(const tr_json_writer *w) { return !w->indent && (w->flags & TR_JSON_W_SPACED); }

// The separator before an element or member, then the line break of indented output.
static void put_comma(tr_json_writer *w) {
    if (!w->first[w->depth]) put(w, ", ", spaced(w) ? 2 : 1);
    w->first[w->depth] = false;
    newline_indent(w);
}

// Everything a value needs before it: a comma, a newline, or nothing after a key.
static void before_value(tr_json_writer *w) {
    if (w->failed) return;
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->depth == 0) {
        if (w->done) w->failed = TR_EINVAL;  // a second top-level value
        return;
    }
    if (w->is_obj[w->depth]) {
        w->failed = TR_EINVAL;  // object member without a key
        return;
    }
    put_comma(w);
}

static void after_value(tr_json_writer *w) {
    if (w->depth == 0) w->done = true;
}

static void begin(tr_json_writer *w, bool obj) {
    before_value(w);
    if (w->failed) return;
    if (w->depth >= TR_JSON_DATA_DEPTH) {
        w->failed = TR_ERANGE;
        return;
    }
    put(w, obj ? "{" : "[", 1);
    w->depth++;
    w->first[w->depth] = true;
    w->is_obj[w->depth] = obj;
}

static void end(tr_json_writer *w, bool obj) {
    if (w->failed) return;
    if (w->depth == 0 || w->is_obj[w->depth] != obj || w->after_key) {
        w->failed = TR_EINVAL;
        return;
    }
    bool empty = w->first[w->depth];
    w->depth--;
    if (!empty) newline_indent(w);
    put(w, obj ? "}" : "]", 1);
    after_value(w);
}

void tr_json_begin_object(tr_json_writer *w) { begin(w, true); }
void tr_json_end_object(tr_json_writer *w) { end(w, true); }
void tr_json_begin_array(tr_json_writer *w) { begin(w, false); }
void tr_json_end_array(tr_json_writer *w) { end(w, false); }

// \uXXXX for one code point, a surrogate pair above U+FFFF.
static void put_u_escape(tr_json_writer *w, uint32_t cp) {
    const char *fmt = (w->flags & TR_JSON_W_UPPER) ? "\\u%04X" : "\\u%04x";
    char esc[16];
    if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(esc, sizeof esc, fmt, (unsigned)(0xd800 | (cp >> 10)));
        put(w, esc, 6);
        cp = 0xdc00 | (cp & 0x3ff);
    }
    snprintf(esc, sizeof esc, fmt, (unsigned)cp);
    put(w, esc, 6);
}

static uint32_t utf8_decode(const unsigned char *s, size_t k) {
    static const unsigned char lead_mask[] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    uint32_t cp = s[0] & lead_mask[k];
    for (size_t i = 1; i < k; i++) cp = (cp << 6) | (s[i] & 0x3f);
    return cp;
}

// A multi-byte character at s[i..n): its length, with its escape written under
// TR_JSON_W_ASCII (after the pending run); 0 when the UTF-8 is invalid.
static size_t put_multibyte(tr_json_writer *w, const char *s, size_t i, size_t n, size_t *run) {
    size_t k = tr_json_utf8_len((const unsigned char *)s + i, n - i);
    if (k && (w->flags & TR_JSON_W_ASCII)) {
        put(w, s + *run, i - *run);
        put_u_escape(w, utf8_decode((const unsigned char *)s + i, k));
        *run = i + k;
    }
    return k;
}

// The string in quotes: '"', '\\' and control characters escaped (short forms where JSON has
// them), multi-byte characters checked and escaped as the flags ask.
static void put_quoted(tr_json_writer *w, const char *s, size_t n) {
    bool check = w->flags & (TR_JSON_W_ASCII | TR_JSON_W_UTF8);
    put(w, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80 && check) {
            size_t k = put_multibyte(w, s, i, n, &run);
            if (!k) {
                if (!w->failed) w->failed = TR_EFORMAT;
                return;
            }
            i += k;
            continue;
        }
        i++;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(w, s + run, i - 1 - run);
        run = i;
        switch (c) {
        case '"': put(w, "\\\"", 2); break;
        case '\\': put(w, "\\\\", 2); break;
        case '\n': put(w, "\\n", 2); break;
        case '\r': put(w, "\\r", 2); break;
        case '\t': put(w, "\\t", 2); break;
        case '\b': put(w, "\\b", 2); break;
        case '\f': put(w, "\\f", 2); break;
        default: put_u_escape(w, c);
        }
    }
    put(w, s + run, n - run);
    put(w, "\"", 1);
}

void tr_json_key_n(tr_json_writer *w, const char *key, size_t n) {
    if (w->failed) return;
    if (w->depth == 0 || !w->is_obj[w->depth] || w->after_key) {
        w->failed = TR_EINVAL;
        return;
    }
    put_comma(w);
    put_quoted(w, key, n);
    put(w, ": ", w->indent || spaced(w) ? 2 : 1);
    w->after_key = true;
}

void tr_json_key(tr_json_writer *w, const char *key) { tr_json_key_n(w, key, strlen(key)); }

void tr_json_string_n(tr_json_writer *w, const char *s, size_t n) {
    before_value(w);
    put_quoted(w, s, n);
    after_value(w);
}

void tr_json_string(tr_json_writer *w, const char *s) { tr_json_string_n(w, s, strlen(s)); }

void tr_json_int(tr_json_writer *w, int64_t v) {
    char b[32];
    int n = snprintf(b, sizeof b, "%lld", (long long)v);
    before_value(w);
    put(w, b, (size_t)n);
    after_value(w);
}

void tr_json_uint(tr_json_writer *w, uint64_t v) {
    char b[32];
    int n = snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    before_value(w);
    put(w, b, (size_t)n);
    after_value(w);
}

// Python's repr layout for the shortest digits: fixed notation for exponents in [-4, 16),
// scientific otherwise, and always a '.' or an exponent so the value reads back as a float.
static void put_real(tr_json_writer *w, double v, int digits) {
    char b[48];
    snprintf(b, sizeof b, "%.*e", digits - 1, v);
    int e = atoi(strchr(b, 'e') + 1);
    if (e >= -4 && e < 16) snprintf(b, sizeof b, "%.*f", digits - 1 - e > 0 ? digits - 1 - e : 0, v);
    before_value(w);
    put(w, b, strlen(b));
    if (!strpbrk(b, ".e")) put(w, ".0", 2);
    after_value(w);
}

// "%.17g" with a ".0" when it reads as an integer, and the exponent without '+' or leading
// zeros (1e20, 1.0000000000000001e-5).
static void put_g17(tr_json_writer *w, double v) {
    char b[48];
    snprintf(b, sizeof b, "%.17g", v);
    if (!strpbrk(b, ".e")) strcat(b, ".0");
    char *e = strchr(b, 'e');
    if (e) {
        char *to = e + 1 + (e[1] == '-'), *from = e + 2;  // after the sign, past '+' or '-'
        while (*from == '0' && from[1]) from++;
        memmove(to, from, strlen(from) + 1);
    }
    before_value(w);
    put(w, b, strlen(b));
    after_value(w);
}

void tr_json_double(tr_json_writer *w, double v) {
    if (!isfinite(v)) {
        if (!w->failed) w->failed = TR_EINVAL;
        return;
    }
    if (w->flags & TR_JSON_W_G17) {
        put_g17(w, v);
        return;
    }
    char b[48];
    int digits = 17;
    for (int p = 1; p < 17; p++) {
        snprintf(b, sizeof b, "%.*e", p - 1, v);
        if (strtod(b, NULL) == v) {
            digits = p;
            break;
        }
    }
    put_real(w, v, digits);
}

void tr_json_float(tr_json_writer *w, float v) {
    if (!isfinite(v) || (w->flags & TR_JSON_W_G17)) {
        tr_json_double(w, (double)v);
        return;
    }
    char b[48];
    int digits = 9;
    for (int p = 1; p < 9; p++) {
        snprintf(b, sizeof b, "%.*e", p - 1, (double)v);
        if ((float)strtod(b, NULL) == v) {
            digits = p;
            break;
        }
    }
    // Print the short decimal, not the float's exact binary value widened to double.
    snprintf(b, sizeof b, "%.*e", digits - 1, (double)v);
    put_real(w, strtod(b, NULL), digits);
}

void tr_json_bool(tr_json_writer *w, bool v) {
    before_value(w);
    put(w, v ? "true" : "false", v ? 4 : 5);
    after_value(w);
}

void tr_json_null(tr_json_writer *w) {
    before_value(w);
    put(w, "null", 4);
    after_value(w);
}

void tr_json_value(tr_json_writer *w, const tr_json *v) {
    switch (v->type) {
    case TR_JSON_NULL: tr_json_null(w); break;
    case TR_JSON_BOOL: tr_json_bool(w, v->boolean); break;
    case TR_JSON_NUMBER:
        if (v->is_int)
            tr_json_int(w, v->inum);
        else
            tr_json_double(w, v->num);
        break;
    case TR_JSON_STRING: tr_json_string_n(w, v->str, v->len); break;
    case TR_JSON_ARRAY:
        tr_json_begin_array(w);
        for (const tr_json *e = v->child; e && !w->failed; e = e->next) tr_json_value(w, e);
        tr_json_end_array(w);
        break;
    case TR_JSON_OBJECT:
        tr_json_begin_object(w);
        for (const tr_json *m = v->child; m && !w->failed; m = m->next) {
            tr_json_key_n(w, m->key, m->key_len);
            tr_json_value(w, m);
        }
        tr_json_end_object(w);
        break;
    }
}

void tr_json_raw(tr_json_writer *w, const char *s, size_t n) { put(w, s, n); }

int tr_json_writer_finish(tr_json_writer *w, const char **out, size_t *len, tr_err *err) {
    if (w->failed == TR_ENOMEM) return tr_errf(err, TR_ENOMEM, "out of memory writing JSON");
    if (w->failed == TR_EINVAL)
        return tr_errf(err, TR_EINVAL, "JSON writer misused (non-finite number, missing key or "
                                       "unbalanced nesting)");
    if (w->failed == TR_EFORMAT) return tr_errf(err, TR_EFORMAT, "invalid UTF-8 in a JSON string");
    if (w->failed) return tr_errf(err, w->failed, "JSON writer: nesting too deep");
    if (w->depth != 0 || !w->done || w->after_key)
        return tr_errf(err, TR_EINVAL, "JSON writer: document not complete");
    put(w, "", 0);  // makes sure buf exists and is terminated
    if (w->failed) return tr_errf(err, TR_ENOMEM, "out of memory writing JSON");
    *out = w->buf;
    *len = w->len;
    return 0;
}
