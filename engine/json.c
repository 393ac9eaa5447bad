// Strict JSON parser: recursive descent into arena-allocated nodes that never move. It reads
// hostile bytes (safetensors headers of any file, data files), so every read is
// bounds-checked against len and nesting is limited.
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
    int64_t line;
    size_t line_start;
    const char *name;
    const char *what;     // before syntax error messages
    int max_depth;
    unsigned flags;
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
    return tr_errf(p->err, code, "%s:%lld:%d: %s%s", p->name, (long long)p->line, col_at(p, pos),
                   p->what, msg);
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
    v->line = p->line > INT32_MAX ? INT32_MAX : (int32_t)p->line;
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

size_t tr_json_utf8_len(const unsigned char *s, size_t n) {
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
static int parse_string(parser *p, bool is_key, const char **out, size_t *out_len) {
    bool no_nul = (p->flags & TR_JSON_NO_NUL) || (is_key && (p->flags & TR_JSON_NO_NUL_KEY));
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
                if (cp == 0 && no_nul)
                    return fail_at(p, i - 6, TR_EFORMAT, "\\u0000 is not allowed in %s",
                                   is_key ? "a key" : "a string");
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
        size_t k = tr_json_utf8_len((const unsigned char *)p->s + i, p->len - i);
        // A sequence may not swallow the closing quote: quote bytes are ASCII, never
        // continuation bytes, so tr_json_utf8_len already stops there.
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
        } else if (p->flags & TR_JSON_INT64) {
            return fail_at(p, start, TR_ERANGE, "integer %s outside the 64-bit range", buf);
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

// A repeated key under TR_JSON_DUP_LAST: the first member takes the later member's value
// (keeping its own key and place) and the later one leaves the list after prev.
static void take_value(tr_json *obj, tr_json *first, tr_json *prev, tr_json *later) {
    tr_json *next = first->next;
    const char *key = first->key;
    size_t key_len = first->key_len;
    *first = *later;
    first->next = next;
    first->key = key;
    first->key_len = key_len;
    prev->next = later->next;
    obj->count--;
}

static int dup_error(parser *p, const tr_json *dup) {
    return tr_errf(p->err, TR_EFORMAT, "%s:%d:%d: %sduplicate key '%s'", p->name, dup->line,
                   dup->col, p->what, dup->key);
}

// Finds repeated keys in an object: an error, or under TR_JSON_DUP_LAST the last value wins.
static int dups_small(parser *p, tr_json *obj) {
    bool last_wins = p->flags & TR_JSON_DUP_LAST;
    for (tr_json *a = obj->child; a; a = a->next) {
        tr_json *prev = a;
        for (tr_json *b = a->next; b;) {
            if (!key_eq(a, b)) {
                prev = b;
                b = b->next;
                continue;
            }
            if (!last_wins) return dup_error(p, b);
            take_value(obj, a, prev, b);
            b = prev->next;
        }
    }
    return 0;
}

// As dups_small, through a temporary hash table so hostile objects with many keys stay linear.
static int dups_hashed(parser *p, tr_json *obj) {
    size_t cap = 32;
    while (cap < (size_t)obj->count * 2) cap *= 2;
    tr_json **tab = calloc(cap, sizeof *tab);
    if (!tab) return tr_errf(p->err, TR_ENOMEM, "%s: out of memory parsing JSON", p->name);
    tr_json *prev = NULL;
    for (tr_json *a = obj->child; a;) {
        size_t h = (size_t)hash_bytes(a->key, a->key_len) & (cap - 1);
        while (tab[h] && !key_eq(tab[h], a)) h = (h + 1) & (cap - 1);
        if (!tab[h]) {
            tab[h] = a;
            prev = a;
            a = a->next;
            continue;
        }
        if (!(p->flags & TR_JSON_DUP_LAST)) {
            free(tab);
            return dup_error(p, a);
        }
        take_value(obj, tab[h], prev, a);  // prev is set: the first member is never a repeat
        a = prev->next;
    }
    free(tab);
    return 0;
}

static int check_duplicates(parser *p, tr_json *obj) {
    return obj->count <= 16 ? dups_small(p, obj) : dups_hashed(p, obj);
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
            if (parse_string(p, true, &key, &key_len)) return -1;
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
    if ((p->flags & TR_JSON_DEPTH_ALL) && depth >= p->max_depth && c != '{' && c != '[')
        return fail_at(p, p->pos, TR_EFORMAT, "nesting deeper than %d levels", p->max_depth);
    tr_json *v;
    switch (c) {
    case '{':
    case '[':
        if (!(v = new_node(p, c == '{' ? TR_JSON_OBJECT : TR_JSON_ARRAY, p->pos))) return -1;
        if (parse_container(p, depth, v, c == '{')) return -1;
        break;
    case '"':
        if (!(v = new_node(p, TR_JSON_STRING, p->pos))) return -1;
        if (parse_string(p, false, &v->str, &v->len)) return -1;
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

int tr_json_parse_opts(tr_json_doc *doc, const char *text, size_t len, const tr_json_opts *o,
                       tr_err *err) {
    doc->root = NULL;
    doc->blocks = NULL;
    parser p = {.s = text, .len = len, .line = o->line > 0 ? o->line : 1,
                .name = o->name ? o->name : "<json>", .what = o->what ? o->what : "",
                .max_depth = o->max_depth > 0 ? o->max_depth : TR_JSON_MAX_DEPTH,
                .flags = o->flags, .doc = doc, .err = err};
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
    tr_json_opts o = {.name = name};
    return tr_json_parse_opts(doc, text, len, &o, err);
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
