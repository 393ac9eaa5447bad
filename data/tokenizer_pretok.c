// Pre-tokenization: the Split steps (regex or literal pattern with HF's five delimiter
// behaviours and invert) and the ByteLevel step (prefix space, GPT-2 regex), run on one
// piece of text and handing every final piece to BPE. Patterns are Oniguruma syntax in
// tokenizer.json; PCRE2 runs them after their Unicode classes are rewritten from the
// generated tables (data/unicode_tables.c), so that no PCRE2 version's own tables decide.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

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

// ---- Unicode classes ----

// A class the generated tables answer: code points whose general category is in gc or that
// carry one of the flags.
typedef struct uclass {
    uint32_t gc;
    uint16_t flags;
} uclass;

static bool uclass_has(uclass u, uint16_t props) {
    return (u.gc >> (props & 31) & 1) || (props >> 5 & u.flags);
}

#define GC(x) (1u << TR_UNI_##x)
#define GC_LC (GC(LU) | GC(LL) | GC(LT))
#define GC_L (GC_LC | GC(LM) | GC(LO))
#define GC_M (GC(MN) | GC(MC) | GC(ME))
#define GC_N (GC(ND) | GC(NL) | GC(NO))
#define GC_P (GC(PC) | GC(PD) | GC(PS) | GC(PE) | GC(PI) | GC(PF) | GC(PO))
#define GC_S (GC(SM) | GC(SC) | GC(SK) | GC(SO))
#define GC_Z (GC(ZS) | GC(ZL) | GC(ZP))
#define GC_C (GC(CC) | GC(CF) | GC(CS) | GC(CO) | GC(CN))

// Oniguruma's names for the classes of \p{...}, compared without case, spaces, '_' and '-'.
// Other names (scripts, binary properties) are left to PCRE2.
static const struct {
    const char *name;
    uclass u;
} PROPS[] = {
    {"l", {GC_L, 0}}, {"letter", {GC_L, 0}}, {"lc", {GC_LC, 0}}, {"casedletter", {GC_LC, 0}},
    {"lu", {GC(LU), 0}}, {"uppercaseletter", {GC(LU), 0}}, {"ll", {GC(LL), 0}},
    {"lowercaseletter", {GC(LL), 0}}, {"lt", {GC(LT), 0}}, {"titlecaseletter", {GC(LT), 0}},
    {"lm", {GC(LM), 0}}, {"modifierletter", {GC(LM), 0}}, {"lo", {GC(LO), 0}},
    {"otherletter", {GC(LO), 0}}, {"m", {GC_M, 0}}, {"mark", {GC_M, 0}},
    {"combiningmark", {GC_M, 0}}, {"mn", {GC(MN), 0}}, {"nonspacingmark", {GC(MN), 0}},
    {"mc", {GC(MC), 0}}, {"spacingmark", {GC(MC), 0}}, {"me", {GC(ME), 0}},
    {"enclosingmark", {GC(ME), 0}}, {"n", {GC_N, 0}}, {"number", {GC_N, 0}},
    {"nd", {GC(ND), 0}}, {"decimalnumber", {GC(ND), 0}}, {"nl", {GC(NL), 0}},
    {"letternumber", {GC(NL), 0}}, {"no", {GC(NO), 0}}, {"othernumber", {GC(NO), 0}},
    {"p", {GC_P, 0}}, {"punctuation", {GC_P, 0}}, {"pc", {GC(PC), 0}},
    {"connectorpunctuation", {GC(PC), 0}}, {"pd", {GC(PD), 0}}, {"dashpunctuation", {GC(PD), 0}},
    {"ps", {GC(PS), 0}}, {"openpunctuation", {GC(PS), 0}}, {"pe", {GC(PE), 0}},
    {"closepunctuation", {GC(PE), 0}}, {"pi", {GC(PI), 0}}, {"initialpunctuation", {GC(PI), 0}},
    {"pf", {GC(PF), 0}}, {"finalpunctuation", {GC(PF), 0}}, {"po", {GC(PO), 0}},
    {"otherpunctuation", {GC(PO), 0}}, {"s", {GC_S, 0}}, {"symbol", {GC_S, 0}},
    {"sm", {GC(SM), 0}}, {"mathsymbol", {GC(SM), 0}}, {"sc", {GC(SC), 0}},
    {"currencysymbol", {GC(SC), 0}}, {"sk", {GC(SK), 0}}, {"modifiersymbol", {GC(SK), 0}},
    {"so", {GC(SO), 0}}, {"othersymbol", {GC(SO), 0}}, {"z", {GC_Z, 0}},
    {"separator", {GC_Z, 0}}, {"zs", {GC(ZS), 0}}, {"spaceseparator", {GC(ZS), 0}},
    {"zl", {GC(ZL), 0}}, {"lineseparator", {GC(ZL), 0}}, {"zp", {GC(ZP), 0}},
    {"paragraphseparator", {GC(ZP), 0}}, {"c", {GC_C, 0}}, {"other", {GC_C, 0}},
    {"cc", {GC(CC), 0}}, {"control", {GC(CC), 0}}, {"cf", {GC(CF), 0}}, {"format", {GC(CF), 0}},
    {"cs", {GC(CS), 0}}, {"surrogate", {GC(CS), 0}}, {"co", {GC(CO), 0}},
    {"privateuse", {GC(CO), 0}}, {"cn", {GC(CN), 0}}, {"unassigned", {GC(CN), 0}},
    {"any", {0xffffffffu, 0}}, {"space", {0, TR_UNI_SPACE}}, {"whitespace", {0, TR_UNI_SPACE}},
    {"word", {0, TR_UNI_WORD_ONIG}},
};

static bool prop_lookup(const char *s, size_t n, uclass *u) {
    char name[40];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == ' ' || ch == '_' || ch == '-') continue;
        if (k + 1 == sizeof name) return false;
        name[k++] = (char)(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    }
    name[k] = '\0';
    for (size_t i = 0; i < sizeof PROPS / sizeof PROPS[0]; i++)
        if (strcmp(name, PROPS[i].name) == 0) {
            *u = PROPS[i].u;
            return true;
        }
    return false;
}

// ---- pattern rewriting ----
//
// Every Unicode class of a pattern (\p{..}, \s, \w, \d and their negations, and the \w in
// \b) becomes an explicit character class. Listing all of Unicode's letters makes PCRE2's
// class test a long scan of ranges, five times slower on non-Latin text, so where nothing
// else in the pattern tells non-ASCII characters apart, the pattern runs on a shadow of the
// text instead: each non-ASCII character is replaced by a representative of its partition
// (the characters every class of the pattern treats alike), with the same UTF-8 length so
// offsets carry over, and the classes list only ASCII and representatives. The
// representatives come from ranges without case mappings (U+0600.., U+E000.., U+F0000..);
// U+017F and U+212A, which match 's' and 'k' without case, stand for themselves. Patterns
// with non-ASCII literals, back references or classes left to PCRE2 run on the text itself
// with the full lists ("direct").

#define MAX_ATOMS 64

typedef struct rw {
    const char *pat;
    size_t len;
    buf *out;  // NULL while scanning
    // found by the scan
    uclass atoms[MAX_ATOMS];
    int n_atoms;
    bool too_many, non_ascii, backref, foreign;
    // used while writing
    bool shadow;
    int n_parts;
    uint16_t part_props[TR_UNI_N_KINDS];  // the props of one kind of each partition
} rw;

static void emit(rw *r, const char *s, size_t n) {
    if (r->out) put(r->out, s, n);
}

static void atom_use(rw *r, uclass u) {
    for (int i = 0; i < r->n_atoms; i++)
        if (r->atoms[i].gc == u.gc && r->atoms[i].flags == u.flags) return;
    if (r->n_atoms == MAX_ATOMS) {
        r->too_many = true;
        return;
    }
    r->atoms[r->n_atoms++] = u;
}

typedef struct ranges {
    buf *b;
    uint32_t lo, hi;
    bool open, any;
} ranges;

static void ranges_flush(ranges *g) {
    if (!g->open) return;
    char t[32];
    if (g->lo == g->hi) snprintf(t, sizeof t, "\\x{%X}", (unsigned)g->lo);
    else snprintf(t, sizeof t, "\\x{%X}-\\x{%X}", (unsigned)g->lo, (unsigned)g->hi);
    puts_(g->b, t);
    g->open = false;
    g->any = true;
}

static void ranges_add(ranges *g, uint32_t lo, uint32_t hi) {
    if (g->open && lo == g->hi + 1) {
        g->hi = hi;
        return;
    }
    ranges_flush(g);
    g->lo = lo;
    g->hi = hi;
    g->open = true;
}

// Writes the members of u (or of its complement) as class items; false when there are none.
static bool class_items(const rw *r, uclass u, bool neg, buf *b) {
    ranges g = {.b = b};
    if (r->shadow) {
        for (uint32_t c = 0; c < 0x80; c++)
            if (uclass_has(u, tr_tok_props((int32_t)c)) != neg) ranges_add(&g, c, c);
        static const uint32_t bases[] = {0x600, 0xE000, 0xF0000};
        for (int k = 0; k < 3; k++) {
            if (k == 0 && uclass_has(u, tr_tok_props(0x17F)) != neg) ranges_add(&g, 0x17F, 0x17F);
            if (k == 1 && uclass_has(u, tr_tok_props(0x212A)) != neg)
                ranges_add(&g, 0x212A, 0x212A);
            for (int p = 0; p < r->n_parts; p++)
                if (uclass_has(u, r->part_props[p]) != neg)
                    ranges_add(&g, bases[k] + (uint32_t)p, bases[k] + (uint32_t)p);
        }
    } else {
        for (size_t i = 0; i < TR_UNI_N_KIND_RUNS; i++) {
            uint32_t lo = tr_uni_kind_runs[i] >> 8;
            uint32_t hi =
                i + 1 < TR_UNI_N_KIND_RUNS ? (tr_uni_kind_runs[i + 1] >> 8) - 1 : 0x10FFFF;
            if (uclass_has(u, tr_uni_kind_props[tr_uni_kind_runs[i] & 0xff]) == neg) continue;
            // PCRE2 refuses surrogates in UTF mode, and valid text has none.
            if (lo < 0xD800 && hi >= 0xD800) ranges_add(&g, lo, 0xD7FF);
            if (hi > 0xDFFF && lo <= 0xDFFF) ranges_add(&g, 0xE000, hi);
            if (hi < 0xD800 || lo > 0xDFFF) ranges_add(&g, lo, hi);
        }
    }
    ranges_flush(&g);
    return g.any;
}

// A Unicode class at the current position: scanned, or written out as a bracket (outside a
// class; inside (?-i:...) where case folding would widen it) or as items (inside one).
static void emit_class(rw *r, uclass u, bool neg, bool in_class, bool caseless) {
    if (!r->out) {
        atom_use(r, u);
        return;
    }
    if (in_class) {
        class_items(r, u, neg, r->out);
        return;
    }
    buf items = {0};
    bool any = class_items(r, u, neg, &items);
    if (items.oom) r->out->oom = true;
    if (!any) {
        puts_(r->out, "(?!)");  // the empty class matches nothing
    } else {
        puts_(r->out, caseless ? "(?-i:[" : "[");
        put(r->out, items.p, items.n);
        puts_(r->out, caseless ? "])" : "]");
    }
    free(items.p);
}

static int hexval(char h) {
    return h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
}

// \p{name}, \P{name}, \p{^name} at pat[i]: a class from the tables when Oniguruma knows the
// name, else copied for PCRE2 to read; *last is the index of its '}'. false for \pL and the
// like, which stay PCRE2's.
static bool rw_prop_escape(rw *r, size_t i, bool in_class, bool caseless, size_t *last) {
    const char *p = r->pat;
    size_t n = r->len;
    char e = p[i + 1];
    const char *close = i + 2 < n && p[i + 2] == '{' ? memchr(p + i + 3, '}', n - i - 3) : NULL;
    if (!close) {
        r->foreign = true;  // \pL and the like: PCRE2's reading
        return false;
    }
    size_t a = i + 3, b = (size_t)(close - p);
    bool neg = e == 'P';
    if (a < b && p[a] == '^') {
        neg = !neg;
        a++;
    }
    *last = b;
    uclass u = {0, 0};
    if (!prop_lookup(p + a, b - a, &u)) {
        r->foreign = true;
        emit(r, p + i, b - i + 1);
        return true;
    }
    emit_class(r, u, neg, in_class, caseless);
    return true;
}

// \s \w \d, their negations and \p{..} at pat[i]: a Unicode class, scanned or written;
// *last is the index of the escape's last character. false for any other escape.
static bool rw_class_escape(rw *r, size_t i, bool in_class, bool caseless, size_t *last) {
    char e = r->pat[i + 1];
    uclass u = {0, 0};
    bool neg = false;
    switch (e) {
    case 's': case 'S': u.flags = TR_UNI_SPACE; neg = e == 'S'; break;
    case 'w': case 'W': u.flags = TR_UNI_WORD_ONIG; neg = e == 'W'; break;
    case 'd': case 'D': u.gc = GC(ND); neg = e == 'D'; break;
    case 'p': case 'P': return rw_prop_escape(r, i, in_class, caseless, last);
    default: return false;
    }
    emit_class(r, u, neg, in_class, caseless);
    *last = i + 1;
    return true;
}

// \b or \B (e) outside a class: a word boundary by Oniguruma's \w, written as lookarounds.
static void rw_word_boundary(rw *r, char e) {
    if (!r->out) {
        atom_use(r, (uclass){0, TR_UNI_WORD_ONIG});
        return;
    }
    buf w = {0};
    puts_(&w, "[");
    class_items(r, (uclass){0, TR_UNI_WORD_ONIG}, false, &w);
    puts_(&w, "]");
    if (w.oom) r->out->oom = true;
    const char *parts[] = {"(?:(?<=", "", e == 'b' ? ")(?!" : ")(?=", "",
                           e == 'b' ? ")|(?<!" : ")|(?<!", "", e == 'b' ? ")(?=" : ")(?!",
                           "", "))"};
    for (int k = 0; k < 9; k++) puts_(r->out, k % 2 ? (w.p ? w.p : "") : parts[k]);
    free(w.p);
}

// \uHHHH (Ruby) at pat[i] becomes \x{HHHH}; false when four hex digits do not follow.
static bool rw_ruby_u(rw *r, size_t i) {
    const char *p = r->pat;
    if (i + 6 > r->len) return false;
    int v = 0;
    bool hex = true;
    for (size_t k = 2; hex && k < 6; k++) {
        int h = hexval(p[i + k]);
        hex = h >= 0;
        v = v * 16 + h;
    }
    if (!hex) return false;
    if (v >= 0x80) r->non_ascii = true;
    emit(r, "\\x{", 3);
    emit(r, p + i + 2, 4);
    emit(r, "}", 1);
    return true;
}

// \xHH or \x{H..} at pat[i] is copied as it is; its value only says whether the pattern
// names a character above ASCII.
static void rw_note_hex(rw *r, size_t i) {
    const char *p = r->pat;
    size_t n = r->len;
    size_t k = i + 2;
    uint32_t v = 0;
    if (k < n && p[k] == '{') {
        for (k++; k < n && hexval(p[k]) >= 0; k++)
            if (v < 0x110000) v = v * 16 + (uint32_t)hexval(p[k]);
    } else {
        for (int d = 0; d < 2 && k < n && hexval(p[k]) >= 0; d++, k++)
            v = v * 16 + (uint32_t)hexval(p[k]);
    }
    if (v >= 0x80) r->non_ascii = true;
}

// One escape at pat[i] == '\\'; returns the index of its last character.
static size_t rw_escape(rw *r, size_t i, bool in_class, bool caseless) {
    const char *p = r->pat;
    char e = p[i + 1];
    size_t last;
    if (rw_class_escape(r, i, in_class, caseless, &last)) return last;
    switch (e) {
    case 'h': case 'H':  // Oniguruma's \h is a hex digit (PCRE2's is horizontal space)
        if (!in_class) emit(r, e == 'h' ? "[0-9a-fA-F]" : "[^0-9a-fA-F]", e == 'h' ? 11 : 12);
        else if (e == 'h') emit(r, "0-9a-fA-F", 9);
        else emit(r, "\\x{0}-\\x{2F}\\x{3A}-\\x{40}\\x{47}-\\x{60}\\x{67}-\\x{10FFFF}", 50);
        return i + 1;
    case 'v':  // a vertical tab (PCRE2's \v is all vertical space)
        emit(r, "\\x{0B}", 6);
        return i + 1;
    case 'b': case 'B':
        if (in_class) break;  // backspace
        rw_word_boundary(r, e);
        return i + 1;
    case 'u':
        if (rw_ruby_u(r, i)) return i + 5;
        break;
    case 'x':
        rw_note_hex(r, i);
        break;
    case '0':
        r->non_ascii = true;  // an octal code, possibly above ASCII: not worth decoding
        break;
    case '1': case '2': case '3': case '4': case '5': case '6': case '7': case '8': case '9':
    case 'k': case 'g':
        if (!in_class) r->backref = true;  // equal text would differ from equal shadows
        break;
    case 'R': case 'X':
        r->foreign = true;  // line breaks and grapheme clusters by PCRE2's tables
        break;
    default:
        if ((uint8_t)e >= 0x80) r->non_ascii = true;
    }
    emit(r, p + i, 2);
    return i + 1;
}

// Rewrites (or, with r->out NULL, scans) the whole pattern.
static void rw_run(rw *r) {
    const char *p = r->pat;
    size_t n = r->len;
    bool in_class = false, caseless = false;
    size_t class_first = 0;
    enum { MAX_DEPTH = 256 };
    bool saved[MAX_DEPTH];  // caseless at each open group
    int depth = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if ((uint8_t)ch >= 0x80) {
            r->non_ascii = true;
            emit(r, &ch, 1);
            continue;
        }
        if (ch == '\\' && i + 1 < n) {
            i = rw_escape(r, i, in_class, caseless);
            continue;
        }
        if (in_class) {
            if (ch == '[' && i + 1 < n && p[i + 1] == ':') {
                // A POSIX class [:name:]: PCRE2's reading, copied through its ":]".
                for (size_t k = i + 2; k + 1 < n; k++)
                    if (p[k] == ':' && p[k + 1] == ']') {
                        r->foreign = true;
                        emit(r, p + i, k + 2 - i);
                        i = k + 1;
                        break;
                    }
                if (p[i] == ']') continue;
            } else if (ch == ']' && i != class_first) {
                in_class = false;
            }
            emit(r, &ch, 1);
            continue;
        }
        if (ch == '[') {
            in_class = true;
            class_first = i + 1;
            if (class_first < n && p[class_first] == '^') {
                emit(r, "[^", 2);
                i++;
                class_first++;
                continue;
            }
        } else if (ch == '(') {
            if (depth < MAX_DEPTH) saved[depth] = caseless;
            depth++;
            if (i + 1 < n && p[i + 1] == '?') {
                // Inline options (?i) (?-i) (?i:...) (?mi-x:...): follow the i flag.
                size_t k = i + 2;
                bool on = true, ci = caseless;
                while (k < n && (p[k] == '-' || (p[k] >= 'a' && p[k] <= 'z'))) {
                    if (p[k] == '-') on = false;
                    else if (p[k] == 'i') ci = on;
                    k++;
                }
                if (k < n && k > i + 2 && (p[k] == ')' || p[k] == ':')) {
                    caseless = ci;
                    if (p[k] == ')') depth--;  // options for the rest of the enclosing group
                }
            }
        } else if (ch == ')') {
            if (depth > 0) {
                depth--;
                if (depth < MAX_DEPTH) caseless = saved[depth];
            }
        }
        emit(r, &ch, 1);
    }
}

// Splits the kinds into partitions: kinds that every class of the pattern treats alike.
static void make_partitions(rw *r, uint8_t *part_of_kind) {
    uint64_t sig[TR_UNI_N_KINDS], part_sig[TR_UNI_N_KINDS];
    r->n_parts = 0;
    for (int k = 0; k < TR_UNI_N_KINDS; k++) {
        sig[k] = 0;
        for (int a = 0; a < r->n_atoms; a++)
            if (uclass_has(r->atoms[a], tr_uni_kind_props[k])) sig[k] |= 1ull << a;
        int p = 0;
        while (p < r->n_parts && part_sig[p] != sig[k]) p++;
        if (p == r->n_parts) {
            part_sig[p] = sig[k];
            r->part_props[p] = tr_uni_kind_props[k];
            r->n_parts++;
        }
        part_of_kind[k] = (uint8_t)p;
    }
}

int tr_tok_regex_compile(tr_tok_pretok *pt, const char *pat, size_t len, bool literal,
                         const char *key, tr_err *err) {
    pt->re = NULL;
    pt->shadow = pt->jit = false;
    buf b = {0};
    uint32_t opt = PCRE2_UTF;
    if (literal) {
        opt |= PCRE2_LITERAL;  // UCP is refused with LITERAL, and a literal needs no classes
        put(&b, pat, len);
    } else {
        opt |= PCRE2_UCP | PCRE2_MULTILINE;  // Oniguruma's ^ and $ match at line breaks
        rw r = {.pat = pat, .len = len};
        rw_run(&r);
        r.shadow = r.n_atoms > 0 && !r.too_many && !r.non_ascii && !r.backref && !r.foreign;
        if (r.shadow) make_partitions(&r, pt->shadow_part);
        r.out = &b;
        rw_run(&r);
        pt->shadow = r.shadow;
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
    pt->re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, opt, &code, &off, cc);
    pcre2_compile_context_free(cc);
    if (!pt->re) {
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
    pt->jit = pcre2_jit_compile(pt->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

static int match_at(tr_tok_ctx *c, const tr_tok_pretok *p, const char *s, size_t len, size_t at,
                    size_t *ms, size_t *me, bool *found) {
    // The text was checked as UTF-8 once in encode; the JIT entry point skips the rest of
    // pcre2_match's per-call checks.
    const pcre2_code *re = p->re;
    int rc = p->jit ? pcre2_jit_match(re, (PCRE2_SPTR)s, len, at, 0, c->md, NULL)
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

// The text p's regex reads: s itself, or its shadow (see the pattern rewriting above) when
// the pattern has one and s is not all ASCII. NULL when out of memory.
static const char *shadow_of(tr_tok_ctx *c, const tr_tok_pretok *p, const char *s, size_t len) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i + 8 <= len) {
        uint64_t w;
        memcpy(&w, u + i, 8);
        if (w & 0x8080808080808080ull) break;
        i += 8;
    }
    while (i < len && u[i] < 0x80) i++;
    if (i == len) return s;
    if (len > c->shadow_cap) {
        size_t nc = c->shadow_cap ? c->shadow_cap : 256;
        while (nc < len) nc *= 2;
        char *np = realloc(c->shadow, nc);
        if (!np) {
            tr_errf(c->err, TR_ENOMEM, "out of memory");
            return NULL;
        }
        c->shadow = np;
        c->shadow_cap = nc;
    }
    uint8_t *o = (uint8_t *)c->shadow;
    memcpy(o, u, i);
    while (i < len) {
        uint8_t b = u[i];
        if (b < 0x80) {
            o[i++] = b;
            continue;
        }
        uint32_t ch, n;
        if (b < 0xE0) {
            ch = (uint32_t)(b & 0x1F) << 6 | (u[i + 1] & 0x3F);
            n = 2;
        } else if (b < 0xF0) {
            ch = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(u[i + 1] & 0x3F) << 6 | (u[i + 2] & 0x3F);
            n = 3;
        } else {
            ch = (uint32_t)(b & 0x07) << 18 | (uint32_t)(u[i + 1] & 0x3F) << 12 |
                 (uint32_t)(u[i + 2] & 0x3F) << 6 | (u[i + 3] & 0x3F);
            n = 4;
        }
        uint8_t part = p->shadow_part[tr_tok_kind((int32_t)ch)];
        if (ch == 0x17F || ch == 0x212A) {
            memcpy(o + i, u + i, n);
        } else if (n == 2) {  // U+0600 + part
            o[i] = (uint8_t)(0xD8 + (part >> 6));
            o[i + 1] = (uint8_t)(0x80 | (part & 0x3F));
        } else if (n == 3) {  // U+E000 + part
            o[i] = 0xEE;
            o[i + 1] = (uint8_t)(0x80 | part >> 6);
            o[i + 2] = (uint8_t)(0x80 | (part & 0x3F));
        } else {  // U+F0000 + part
            o[i] = 0xF3;
            o[i + 1] = 0xB0;
            o[i + 2] = (uint8_t)(0x80 | part >> 6);
            o[i + 3] = (uint8_t)(0x80 | (part & 0x3F));
        }
        i += n;
    }
    return c->shadow;
}

// Covers s with segments: regex matches (token 1) and the text between them (token 0), as
// HF's Pattern::find_matches over the onig crate's find_iter (which skips an empty match
// that touches the previous match's end).
static int find_matches(tr_tok_ctx *c, const tr_tok_pretok *p, const char *s, size_t len,
                        tr_tok_segs *out) {
    out->n = 0;
    const char *subject = p->shadow ? shadow_of(c, p, s, len) : s;
    if (!subject) return -1;
    size_t prev = 0, at = 0, last_end = 0;
    bool have_last = false;
    while (at <= len) {
        size_t ms, me;
        bool found;
        if (match_at(c, p, subject, len, at, &ms, &me, &found)) return -1;
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
    if (find_matches(c, p, s, len, &c->raw)) return -1;
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
    if (find_matches(c, p, s, len, &c->raw)) return -1;
    if (apply_behavior(c, &c->raw, p->behavior, p->invert, out)) return -1;
    for (size_t k = 0; k < out->n; k++) {
        // Deeper steps reuse c->raw and later levels, never this one.
        size_t a = out->v[k].start, b = out->v[k].end;
        if (b > a && tr_tok_pretokenize(c, step + 1, s + a, b - a)) return -1;
    }
    return 0;
}
