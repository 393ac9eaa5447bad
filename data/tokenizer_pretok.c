// Pre-tokenization: the Split steps (regex or literal pattern with HF's five delimiter
// behaviours and invert) and the ByteLevel step (prefix space, GPT-2 regex), run on one
// piece of text and handing every final piece to BPE. Patterns are Oniguruma syntax in
// tokenizer.json; PCRE2 runs them after the few escapes whose meaning differs are rewritten.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

// Oniguruma's \s is Unicode White_Space (PCRE2's also takes U+180E); its \w is Alphabetic,
// marks, decimal digits and connector punctuation plus, from its Latin-1 table, the
// superscript digits and vulgar fractions (PCRE2 10.42's \w is letters, numbers and '_');
// its \h is a hex digit (PCRE2's is horizontal space).
static const char SPACE_SET[] =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
static const char WORD_SET[] =
    "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}";
static const char HEX_SET[] = "0-9a-fA-F";

typedef struct buf {
    char *p;
    size_t n, cap;
    bool oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

// Rewrites the Oniguruma escapes that PCRE2 reads differently; everything else is copied.
static int translate(const char *pat, size_t len, buf *out) {
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < len; i++) {
        char ch = pat[i];
        if (ch == '\\' && i + 1 < len) {
            char e = pat[i + 1];
            const char *set = e == 's' || e == 'S' ? SPACE_SET
                              : e == 'w' || e == 'W' ? WORD_SET
                              : e == 'h' || e == 'H' ? HEX_SET
                                                     : NULL;
            bool neg = e == 'S' || e == 'W' || e == 'H';
            if (set && !in_class) {
                puts_(out, neg ? "[^" : "[");
                puts_(out, set);
                puts_(out, "]");
                i++;
                continue;
            }
            if (set && in_class && !neg) {
                puts_(out, set);
                i++;
                continue;
            }
            if ((e == 'b' || e == 'B') && !in_class) {
                // Word boundaries by Oniguruma's \w as well.
                char w[sizeof WORD_SET + 2], tmp[4 * sizeof WORD_SET + 64];
                snprintf(w, sizeof w, "[%s]", WORD_SET);
                snprintf(tmp, sizeof tmp,
                         e == 'b' ? "(?:(?<=%s)(?!%s)|(?<!%s)(?=%s))" : "(?:(?<=%s)(?=%s)|(?<!%s)(?!%s))",
                         w, w, w, w);
                puts_(out, tmp);
                i++;
                continue;
            }
            if (e == 'u' && i + 6 <= len) {
                // \uHHHH (Ruby) -> \x{HHHH}
                bool hex = true;
                for (size_t k = 2; hex && k < 6; k++) {
                    char h = pat[i + k];
                    hex = (h >= '0' && h <= '9') || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
                }
                if (hex) {
                    puts_(out, "\\x{");
                    put(out, pat + i + 2, 4);
                    puts_(out, "}");
                    i += 5;
                    continue;
                }
            }
            put(out, pat + i, 2);
            i++;
            continue;
        }
        if (!in_class && ch == '[') {
            in_class = true;
            class_start = i;
        } else if (in_class && ch == '[' && i + 1 < len && pat[i + 1] == ':') {
            // POSIX class [:name:] inside a bracket: copy through its closing ":]".
            const char *end = NULL;
            for (size_t k = i + 2; k + 1 < len; k++)
                if (pat[k] == ':' && pat[k + 1] == ']') {
                    end = pat + k;
                    break;
                }
            if (end) {
                size_t n = (size_t)(end - (pat + i)) + 2;
                put(out, pat + i, n);
                i += n - 1;
                continue;
            }
        } else if (in_class && ch == ']') {
            // A ']' right after '[' or '[^' is a literal.
            size_t first = class_start + 1;
            if (first < len && pat[first] == '^') first++;
            if (i != first) in_class = false;
        }
        put(out, &ch, 1);
    }
    return out->oom ? -1 : 0;
}

int tr_tok_regex_compile(pcre2_code **re, const char *pat, size_t len, bool literal,
                         const char *key, tr_err *err) {
    *re = NULL;
    buf b = {0};
    uint32_t opt = PCRE2_UTF;
    if (literal) {
        opt |= PCRE2_LITERAL;  // UCP is refused with LITERAL, and a literal needs no classes
        put(&b, pat, len);
    } else {
        opt |= PCRE2_UCP | PCRE2_MULTILINE;  // Oniguruma's ^ and $ match at line breaks
        translate(pat, len, &b);
    }
    if (b.oom) {
        free(b.p);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory", key);
    }
    int code;
    PCRE2_SIZE off;
    // Oniguruma's newline is LF only, whatever PCRE2 was built with.
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        free(b.p);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory", key);
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, opt, &code, &off, cc);
    pcre2_compile_context_free(cc);
    if (!*re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        int r = tr_errf(err, TR_EINVAL, "%s: bad pattern at offset %zu of '%s': %s", key,
                        (size_t)off, b.p ? b.p : "", (const char *)msg);
        free(b.p);
        return r;
    }
    free(b.p);
    // JIT is an optimization: without it (unsupported CPU, no executable memory) the
    // interpreter gives the same matches.
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);
    return 0;
}

static int match_at(tr_tok_ctx *c, const pcre2_code *re, const char *s, size_t len, size_t at,
                    size_t *ms, size_t *me, bool *found) {
    // The text was checked as UTF-8 once in encode; the JIT entry point skips the rest of
    // pcre2_match's per-call checks.
    size_t jit_size = 0;
    pcre2_pattern_info(re, PCRE2_INFO_JITSIZE, &jit_size);
    int rc = jit_size ? pcre2_jit_match(re, (PCRE2_SPTR)s, len, at, 0, c->md, NULL)
                      : pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK, c->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, (PCRE2_SPTR)s, len, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH) {
        *found = false;
        return 0;
    }
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return tr_errf(c->err, TR_EINVAL, "pre-tokenizer regex failed on %zu bytes: %s", len,
                       (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    *ms = ov[0];
    *me = ov[1];
    *found = true;
    return 0;
}

// Covers s with segments: regex matches (token 1) and the text between them (token 0), as
// HF's Pattern::find_matches over the onig crate's find_iter (which skips an empty match
// that touches the previous match's end).
static int find_matches(tr_tok_ctx *c, const pcre2_code *re, const char *s, size_t len,
                        tr_tok_segs *out) {
    out->n = 0;
    size_t prev = 0, at = 0, last_end = 0;
    bool have_last = false;
    while (at <= len) {
        size_t ms, me;
        bool found;
        if (match_at(c, re, s, len, at, &ms, &me, &found)) return -1;
        if (!found) break;
        if (ms == me && have_last && last_end == me) {
            if (at >= len) break;
            size_t n;
            tr_tok_utf8_next(s + at, len - at, &n);
            at += n;
            continue;
        }
        at = me;
        have_last = true;
        last_end = me;
        if (prev != ms && tr_tok_segs_push(out, prev, ms, 0, c->err)) return -1;
        if (tr_tok_segs_push(out, ms, me, 1, c->err)) return -1;
        prev = me;
    }
    if (prev != len && tr_tok_segs_push(out, prev, len, 0, c->err)) return -1;
    return 0;
}

// Turns matches into the pieces HF's NormalizedString::split keeps for a behaviour.
static int apply_behavior(tr_tok_ctx *c, const tr_tok_segs *m, int behavior, bool invert,
                          tr_tok_segs *out) {
    out->n = 0;
    bool prev_match = false;
    if (behavior == TR_TOK_MERGED_NEXT) {
        // Walks backwards: a match joins the piece that follows it.
        for (size_t k = m->n; k-- > 0;) {
            bool is_match = (m->v[k].token != 0) != invert;
            if (is_match && !prev_match && out->n > 0) {
                out->v[out->n - 1].start = m->v[k].start;
            } else if (tr_tok_segs_push(out, m->v[k].start, m->v[k].end, 0, c->err)) {
                return -1;
            }
            prev_match = is_match;
        }
        for (size_t a = 0, b = out->n; b-- > a + 1; a++) {
            tr_tok_seg t = out->v[a];
            out->v[a] = out->v[b];
            out->v[b] = t;
        }
        return 0;
    }
    for (size_t k = 0; k < m->n; k++) {
        bool is_match = (m->v[k].token != 0) != invert;
        size_t s = m->v[k].start, e = m->v[k].end;
        bool extend = false;
        switch (behavior) {
        case TR_TOK_REMOVED:
            if (is_match) continue;
            break;
        case TR_TOK_ISOLATED: break;
        case TR_TOK_CONTIGUOUS: extend = is_match == prev_match && out->n > 0; break;
        case TR_TOK_MERGED_PREV: extend = is_match && !prev_match && out->n > 0; break;
        }
        prev_match = is_match;
        if (extend) out->v[out->n - 1].end = e;
        else if (tr_tok_segs_push(out, s, e, 0, c->err)) return -1;
    }
    return 0;
}

static int bytelevel_step(tr_tok_ctx *c, const tr_tok_pretok *p, const char *s, size_t len) {
    if (p->add_prefix_space && s[0] != ' ') {
        if (len + 1 > c->prefix_cap) {
            size_t nc = c->prefix_cap ? c->prefix_cap : 256;
            while (nc < len + 1) nc *= 2;
            char *np = realloc(c->prefix, nc);
            if (!np) return tr_errf(c->err, TR_ENOMEM, "out of memory");
            c->prefix = np;
            c->prefix_cap = nc;
        }
        c->prefix[0] = ' ';
        memcpy(c->prefix + 1, s, len);
        s = c->prefix;
        len++;
    }
    if (!p->re) return tr_tok_bpe(c, (const uint8_t *)s, len);
    if (find_matches(c, p->re, s, len, &c->raw)) return -1;
    for (size_t k = 0; k < c->raw.n; k++) {
        const tr_tok_seg *g = &c->raw.v[k];
        if (g->end > g->start && tr_tok_bpe(c, (const uint8_t *)s + g->start, g->end - g->start))
            return -1;
    }
    return 0;
}

int tr_tok_pretokenize(tr_tok_ctx *c, int step, const char *s, size_t len) {
    if (len == 0) return 0;
    if (step >= c->tok->n_pretok) return tr_tok_bpe(c, (const uint8_t *)s, len);
    const tr_tok_pretok *p = &c->tok->pretok[step];
    if (p->kind == TR_TOK_BYTELEVEL) return bytelevel_step(c, p, s, len);
    tr_tok_segs *out = &c->levels[step];
    if (find_matches(c, p->re, s, len, &c->raw)) return -1;
    if (apply_behavior(c, &c->raw, p->behavior, p->invert, out)) return -1;
    for (size_t k = 0; k < out->n; k++) {
        // Deeper steps reuse c->raw and later levels, never this one.
        size_t a = out->v[k].start, b = out->v[k].end;
        if (b > a && tr_tok_pretokenize(c, step + 1, s + a, b - a)) return -1;
    }
    return 0;
}
