// Strict JSON parser (recursive descent into arena-allocated nodes that never move) and the
// buffer-based writer. The parser reads hostile bytes (safetensors headers of any file), so
// every read is bounds-checked against len and nesting is limited.
#include "engine/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------------------
// Arena: nodes and strings are bump-allocated from blocks that are never moved or resized,
// so pointers handed out while parsing stay valid for the document's lifetime.

struct tr_json_block {
    tr_json_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

static void *arena_alloc(tr_json_doc *doc, size_t size) {
    size = (size + 15) & ~(size_t)15;
    tr_json_block *b = doc->blocks;
    if (!b || b->cap - b->used < size) {
        size_t cap = b ? b->cap * 2 : 4096;
        if (cap > ((size_t)16 << 20)) cap = (size_t)16 << 20;
        if (cap < size) cap = size;
        tr_json_block *nb = malloc(sizeof *nb + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        doc->blocks = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += size;
    return p;
}

void tr_json_free(tr_json_doc *doc) {
    if (!doc) return;
    tr_json_block *b = doc->blocks;
    while (b) {
        tr_json_block *n = b->next;
        free(b);
        b = n;
    }
    doc->blocks = NULL;
    doc->root = NULL;
}

// ---------------------------------------------------------------------------------------
// Parser

typedef struct parser {
    const char *s;
    size_t len, pos;
    int32_t line;
    size_t line_start;
    const char *name;
    int max_depth;
    tr_json_doc *doc;
    tr_err *err;
} parser;

static int32_t col_at(const parser *p, size_t pos) {
    size_t c = pos - p->line_start + 1;
    return c > INT32_MAX ? INT32_MAX : (int32_t)c;
}

__attribute__((format(printf, 4, 5))) static int fail_at(parser *p, size_t pos, int code,
                                                         const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tr_errf(p->err, code, "%s:%d:%d: %s", p->name, p->line, col_at(p, pos), msg);
}

static const char *describe_byte(unsigned char c, char *buf, size_t n) {
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '\n') {
            p->pos++;
            p->line++;
            p->line_start = p->pos;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            p->pos++;
        } else {
            break;
        }
    }
}

static tr_json *new_node(parser *p, enum tr_json_type type, size_t pos) {
    tr_json *v = arena_alloc(p->doc, sizeof *v);
    if (!v) {
        tr_errf(p->err, TR_ENOMEM, "%s: out of memory parsing JSON", p->name);
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = type;
    v->line = p->line;
    v->col = col_at(p, pos);
    return v;
}

static int hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

// Length of the valid UTF-8 sequence at s[0..n), or 0 when invalid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint32_t min, cp;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
        cp = c & 0x1f;
        min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        cp = c & 0x0f;
        min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0;
    }
    if (n < need) return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return need;
}

// Parses the string starting at the opening quote; the unescaped text goes to the arena.
static int parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = p->pos;  // at '"'
    size_t i = start + 1;
    // First pass: find the closing quote so the output can be sized (escapes only shrink).
    while (i < p->len && p->s[i] != '"') {
        if (p->s[i] == '\\') i++;
        i++;
    }
    if (i >= p->len) return fail_at(p, start, TR_EFORMAT, "unterminated string");
    size_t span = i - (start + 1);
    char *o = arena_alloc(p->doc, span + 1);
    if (!o) return tr_errf(p->err, TR_ENOMEM, "%s: out of memory parsing JSON", p->name);
    size_t n = 0;
    i = start + 1;
    while (p->s[i] != '"') {
        unsigned char c = (unsigned char)p->s[i];
        if (c < 0x20) {
            char d[16];
            return fail_at(p, i, TR_EFORMAT, "control character %s in string",
                           describe_byte(c, d, sizeof d));
        }
        if (c == '\\') {
            char e = p->s[i + 1];
            i += 2;
            switch (e) {
            case '"': o[n++] = '"'; break;
            case '\\': o[n++] = '\\'; break;
            case '/': o[n++] = '/'; break;
            case 'b': o[n++] = '\b'; break;
            case 'f': o[n++] = '\f'; break;
            case 'n': o[n++] = '\n'; break;
            case 'r': o[n++] = '\r'; break;
            case 't': o[n++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (p->len - i < 4 || hex4(p->s + i, &cp))
                    return fail_at(p, i - 2, TR_EFORMAT, "bad \\u escape");
                i += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                    return fail_at(p, i - 6, TR_EFORMAT, "lone low surrogate \\u%04x", cp);
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo;
                    if (p->len - i < 6 || p->s[i] != '\\' || p->s[i + 1] != 'u' ||
                        hex4(p->s + i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                        return fail_at(p, i - 6, TR_EFORMAT,
                                       "high surrogate \\u%04x not followed by a low one", cp);
                    i += 6;
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                n += put_utf8(o + n, cp);
                break;
            }
            default: {
                char d[16];
                return fail_at(p, i - 2, TR_EFORMAT, "bad escape \\%s",
                               describe_byte((unsigned char)e, d, sizeof d));
            }
            }
            continue;
        }
        size_t k = utf8_seq((const unsigned char *)p->s + i, p->len - i);
        // A sequence may not swallow the closing quote: quote bytes are ASCII, never
        // continuation bytes, so utf8_seq already stops there.
        if (k == 0) return fail_at(p, i, TR_EFORMAT, "invalid UTF-8 in string");
        memcpy(o + n, p->s + i, k);
        n += k;
        i += k;
    }
    o[n] = '\0';
    p->pos = i + 1;
    *out = o;
    *out_len = n;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *p, tr_json *v) {
    size_t start = p->pos, i = start;
    bool neg = false, integral = true;
    if (i < p->len && p->s[i] == '-') {
        neg = true;
        i++;
    }
    if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, start, TR_EFORMAT, "bad number");
    if (p->s[i] == '0') {
        i++;
        if (i < p->len && is_digit(p->s[i]))
            return fail_at(p, start, TR_EFORMAT, "number with a leading zero");
    } else {
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    size_t int_end = i;
    if (i < p->len && p->s[i] == '.') {
        integral = false;
        i++;
        if (i >= p->len || !is_digit(p->s[i]))
            return fail_at(p, start, TR_EFORMAT, "bad number: digits must follow '.'");
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = false;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->len || !is_digit(p->s[i]))
            return fail_at(p, start, TR_EFORMAT, "bad number: digits must follow the exponent");
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    char buf[512];
    size_t n = i - start;
    if (n >= sizeof buf) return fail_at(p, start, TR_EFORMAT, "number longer than 511 characters");
    memcpy(buf, p->s + start, n);
    buf[n] = '\0';
    errno = 0;
    double d = strtod(buf, NULL);
    if (isinf(d)) return fail_at(p, start, TR_ERANGE, "number %s out of double range", buf);
    v->num = d;
    if (integral) {
        // Accumulate negatively so INT64_MIN parses; overflow leaves is_int false.
        int64_t acc = 0;
        bool ok = true;
        for (size_t k = start + (neg ? 1 : 0); k < int_end; k++) {
            int digit = p->s[k] - '0';
            if (acc < (INT64_MIN + digit) / 10) {
                ok = false;
                break;
            }
            acc = acc * 10 - digit;
        }
        if (ok && !neg && acc == INT64_MIN) ok = false;
        if (ok) {
            v->is_int = true;
            v->inum = neg ? acc : -acc;
        }
    }
    p->pos = i;
    return 0;
}

static bool key_eq(const tr_json *a, const tr_json *b) {
    return a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

// Finds a repeated key in an object; large objects use a temporary hash table so hostile
// headers with many keys stay linear.
static int check_duplicates(parser *p, const tr_json *obj) {
    const tr_json *dup = NULL;
    if (obj->count <= 16) {
        for (const tr_json *a = obj->child; a && !dup; a = a->next)
            for (const tr_json *b = a->next; b; b = b->next)
                if (key_eq(a, b)) {
                    dup = b;
                    break;
                }
    } else {
        size_t cap = 32;
        while (cap < (size_t)obj->count * 2) cap *= 2;
        const tr_json **tab = calloc(cap, sizeof *tab);
        if (!tab) return tr_errf(p->err, TR_ENOMEM, "%s: out of memory parsing JSON", p->name);
        for (const tr_json *a = obj->child; a && !dup; a = a->next) {
            size_t h = (size_t)hash_bytes(a->key, a->key_len) & (cap - 1);
            while (tab[h]) {
                if (key_eq(tab[h], a)) {
                    dup = a;
                    break;
                }
                h = (h + 1) & (cap - 1);
            }
            tab[h] = a;
        }
        free(tab);
    }
    if (dup)
        return tr_errf(p->err, TR_EFORMAT, "%s:%d:%d: duplicate key '%s'", p->name, dup->line,
                       dup->col, dup->key);
    return 0;
}

static int parse_value(parser *p, int depth, tr_json **out);

static int parse_container(parser *p, int depth, tr_json *v, bool is_obj) {
    char close = is_obj ? '}' : ']';
    if (depth >= p->max_depth)
        return fail_at(p, p->pos, TR_EFORMAT, "nesting deeper than %d levels", p->max_depth);
    p->pos++;  // '{' or '['
    tr_json *last = NULL;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        const char *key = NULL;
        size_t key_len = 0;
        if (is_obj) {
            if (p->pos >= p->len) return fail_at(p, p->pos, TR_EFORMAT, "unexpected end of input");
            if (p->s[p->pos] != '"') {
                char d[16];
                return fail_at(p, p->pos, TR_EFORMAT, "expected a string key, got %s",
                               describe_byte((unsigned char)p->s[p->pos], d, sizeof d));
            }
            if (parse_string(p, &key, &key_len)) return -1;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':')
                return fail_at(p, p->pos, TR_EFORMAT, "expected ':' after key '%s'", key);
            p->pos++;
        }
        tr_json *item;
        if (parse_value(p, depth + 1, &item)) return -1;
        item->key = key;
        item->key_len = key_len;
        if (last)
            last->next = item;
        else
            v->child = item;
        last = item;
        if (v->count == INT32_MAX) return fail_at(p, p->pos, TR_ERANGE, "too many elements");
        v->count++;
        skip_ws(p);
        if (p->pos >= p->len) return fail_at(p, p->pos, TR_EFORMAT, "unexpected end of input");
        char c = p->s[p->pos];
        if (c == ',') {
            p->pos++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == close)
                return fail_at(p, p->pos, TR_EFORMAT, "trailing comma");
            continue;
        }
        if (c == close) {
            p->pos++;
            return is_obj ? check_duplicates(p, v) : 0;
        }
        char d[16];
        return fail_at(p, p->pos, TR_EFORMAT, "expected ',' or '%c', got %s", close,
                       describe_byte((unsigned char)c, d, sizeof d));
    }
}

static int parse_literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail_at(p, p->pos, TR_EFORMAT, "invalid literal (expected %s)", word);
    p->pos += n;
    return 0;
}

static int parse_value(parser *p, int depth, tr_json **out) {
    skip_ws(p);
    if (p->pos >= p->len) return fail_at(p, p->pos, TR_EFORMAT, "unexpected end of input");
    char c = p->s[p->pos];
    tr_json *v;
    switch (c) {
    case '{':
    case '[':
        if (!(v = new_node(p, c == '{' ? TR_JSON_OBJECT : TR_JSON_ARRAY, p->pos))) return -1;
        if (parse_container(p, depth, v, c == '{')) return -1;
        break;
    case '"':
        if (!(v = new_node(p, TR_JSON_STRING, p->pos))) return -1;
        if (parse_string(p, &v->str, &v->len)) return -1;
        break;
    case 't':
    case 'f':
        if (!(v = new_node(p, TR_JSON_BOOL, p->pos))) return -1;
        if (parse_literal(p, c == 't' ? "true" : "false")) return -1;
        v->boolean = c == 't';
        break;
    case 'n':
        if (!(v = new_node(p, TR_JSON_NULL, p->pos))) return -1;
        if (parse_literal(p, "null")) return -1;
        break;
    default:
        if (c == '-' || is_digit(c)) {
            if (!(v = new_node(p, TR_JSON_NUMBER, p->pos))) return -1;
            if (parse_number(p, v)) return -1;
            break;
        }
        char d[16];
        return fail_at(p, p->pos, TR_EFORMAT, "unexpected %s",
                       describe_byte((unsigned char)c, d, sizeof d));
    }
    *out = v;
    return 0;
}

int tr_json_parse_depth(tr_json_doc *doc, const char *text, size_t len, const char *name,
                        int max_depth, tr_err *err) {
    doc->root = NULL;
    doc->blocks = NULL;
    parser p = {.s = text, .len = len, .line = 1, .name = name ? name : "<json>",
                .max_depth = max_depth, .doc = doc, .err = err};
    if (len && !text) return tr_errf(err, TR_EINVAL, "%s: no text", p.name);
    tr_json *root;
    if (parse_value(&p, 0, &root)) {
        tr_json_free(doc);
        return -1;
    }
    skip_ws(&p);
    if (p.pos < p.len) {
        char d[16];
        fail_at(&p, p.pos, TR_EFORMAT, "unexpected %s after the JSON value",
                describe_byte((unsigned char)p.s[p.pos], d, sizeof d));
        tr_json_free(doc);
        return -1;
    }
    doc->root = root;
    return 0;
}

int tr_json_parse(tr_json_doc *doc, const char *text, size_t len, const char *name,
                  tr_err *err) {
    return tr_json_parse_depth(doc, text, len, name, TR_JSON_MAX_DEPTH, err);
}

const tr_json *tr_json_get(const tr_json *obj, const char *key) {
    if (!obj || obj->type != TR_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const tr_json *m = obj->child; m; m = m->next)
        if (m->key_len == n && memcmp(m->key, key, n) == 0) return m;
    return NULL;
}

const tr_json *tr_json_at(const tr_json *arr, int32_t i) {
    if (!arr || arr->type != TR_JSON_ARRAY || i < 0) return NULL;
    const tr_json *e = arr->child;
    while (e && i-- > 0) e = e->next;
    return e;
}

const char *tr_json_type_name(enum tr_json_type type) {
    switch (type) {
    case TR_JSON_NULL: return "null";
    case TR_JSON_BOOL: return "boolean";
    case TR_JSON_NUMBER: return "number";
    case TR_JSON_STRING: return "string";
    case TR_JSON_ARRAY: return "array";
    case TR_JSON_OBJECT: return "object";
    }
    return "unknown";
}

// ---------------------------------------------------------------------------------------
// Writer

void tr_json_writer_init(tr_json_writer *w, int32_t indent) {
    memset(w, 0, sizeof *w);
    w->indent = indent < 0 ? 0 : indent;
    w->first[0] = true;
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
    if (!w->first[w->depth]) put(w, ",", 1);
    w->first[w->depth] = false;
    newline_indent(w);
}

static void after_value(tr_json_writer *w) {
    if (w->depth == 0) w->done = true;
}

static void begin(tr_json_writer *w, bool obj) {
    before_value(w);
    if (w->failed) return;
    if (w->depth >= TR_JSON_MAX_DEPTH) {
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

static void put_quoted(tr_json_writer *w, const char *s, size_t n) {
    put(w, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        put(w, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': put(w, "\\\"", 2); break;
        case '\\': put(w, "\\\\", 2); break;
        case '\n': put(w, "\\n", 2); break;
        case '\r': put(w, "\\r", 2); break;
        case '\t': put(w, "\\t", 2); break;
        case '\b': put(w, "\\b", 2); break;
        case '\f': put(w, "\\f", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(w, esc, 6);
        }
    }
    put(w, s + run, n - run);
    put(w, "\"", 1);
}

void tr_json_key(tr_json_writer *w, const char *key) {
    if (w->failed) return;
    if (w->depth == 0 || !w->is_obj[w->depth] || w->after_key) {
        w->failed = TR_EINVAL;
        return;
    }
    if (!w->first[w->depth]) put(w, ",", 1);
    w->first[w->depth] = false;
    newline_indent(w);
    put_quoted(w, key, strlen(key));
    put(w, w->indent ? ": " : ":", w->indent ? 2 : 1);
    w->after_key = true;
}

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

void tr_json_double(tr_json_writer *w, double v) {
    if (!isfinite(v)) {
        if (!w->failed) w->failed = TR_EINVAL;
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
    if (!isfinite(v)) {
        if (!w->failed) w->failed = TR_EINVAL;
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

void tr_json_raw(tr_json_writer *w, const char *s, size_t n) { put(w, s, n); }

int tr_json_writer_finish(tr_json_writer *w, const char **out, size_t *len, tr_err *err) {
    if (w->failed == TR_ENOMEM) return tr_errf(err, TR_ENOMEM, "out of memory writing JSON");
    if (w->failed == TR_EINVAL)
        return tr_errf(err, TR_EINVAL, "JSON writer misused (non-finite number, missing key or "
                                       "unbalanced nesting)");
    if (w->failed) return tr_errf(err, w->failed, "JSON writer: nesting too deep");
    if (w->depth != 0 || !w->done || w->after_key)
        return tr_errf(err, TR_EINVAL, "JSON writer: document not complete");
    put(w, "", 0);  // makes sure buf exists and is terminated
    if (w->failed) return tr_errf(err, TR_ENOMEM, "out of memory writing JSON");
    *out = w->buf;
    *len = w->len;
    return 0;
}
