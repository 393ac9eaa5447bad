// Unicode pieces of the tokenizer: UTF-8 validation and stepping, the per-code-point kind
// lookup over the generated tables (data/unicode_tables.c), the \s and \w classes Hugging Face
// applies around added tokens, lossy UTF-8 for decoding, and the NFC/NFD/NFKC/NFKD normalizers.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

size_t tr_tok_utf8_check(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < len) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            // Most text is ASCII: skip it eight bytes at a time.
            while (i + 8 <= len) {
                uint64_t w;
                memcpy(&w, s + i, 8);
                if (w & 0x8080808080808080ull) break;
                i += 8;
            }
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b == 0xE0) need = 2, lo = 0xA0;
        else if (b == 0xED) need = 2, hi = 0x9F;  // no surrogates
        else if (b >= 0xE1 && b <= 0xEF) need = 2;
        else if (b == 0xF0) need = 3, lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3) need = 3;
        else if (b == 0xF4) need = 3, hi = 0x8F;
        else return i;
        if (i + need >= len) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        i += need + 1;
    }
    return len;
}

int32_t tr_tok_utf8_next(const char *str, size_t len, size_t *n) {
    const uint8_t *s = (const uint8_t *)str;
    if (len == 0) {
        *n = 0;
        return -1;
    }
    uint8_t b = s[0];
    if (b < 0x80) {
        *n = 1;
        return b;
    }
    if (b < 0xE0 && len >= 2) {
        *n = 2;
        return (int32_t)(b & 0x1F) << 6 | (s[1] & 0x3F);
    }
    if (b < 0xF0 && len >= 3) {
        *n = 3;
        return (int32_t)(b & 0x0F) << 12 | (int32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    }
    if (len >= 4) {
        *n = 4;
        return (int32_t)(b & 0x07) << 18 | (int32_t)(s[1] & 0x3F) << 12 |
               (int32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    }
    *n = 1;
    return -1;
}

int32_t tr_tok_utf8_prev(const char *str, size_t len, size_t *n) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = len;
    while (i > 0 && len - i < 4) {
        i--;
        if ((s[i] & 0xC0) != 0x80) break;
    }
    size_t m;
    int32_t c = tr_tok_utf8_next(str + i, len - i, &m);
    *n = len - i;
    return c;
}

// ---- code point kinds ----

// A two-stage table (block index, then kinds within the block) expanded once per process
// from the generated runs: a binary search per character would cost about as much as the
// regex that reads the result.
uint16_t tr_tok_kind_stage1[0x110000 / TR_UNI_BLOCK];
uint8_t tr_tok_kind_stage2[TR_UNI_N_BLOCKS * TR_UNI_BLOCK];
static pthread_once_t kind_once = PTHREAD_ONCE_INIT;

static void kind_build(void) {
    enum { SLOTS = 1024 };  // open addressing over the distinct blocks, well under half full
    _Static_assert(2 * TR_UNI_N_BLOCKS < SLOTS, "more distinct blocks than hash slots");
    uint16_t slot[SLOTS] = {0};  // distinct block index + 1
    uint8_t blk[TR_UNI_BLOCK];
    size_t run = 0, n_blocks = 0;
    for (uint32_t b = 0; b < 0x110000 / TR_UNI_BLOCK; b++) {
        uint64_t h = 1469598103934665603ull;
        for (uint32_t k = 0; k < TR_UNI_BLOCK; k++) {
            uint32_t c = b * TR_UNI_BLOCK + k;
            while (run + 1 < TR_UNI_N_KIND_RUNS && tr_uni_kind_runs[run + 1] >> 8 <= c) run++;
            blk[k] = (uint8_t)tr_uni_kind_runs[run];
            h = (h ^ blk[k]) * 1099511628211ull;
        }
        size_t i = (size_t)(h >> 20) & (SLOTS - 1);
        while (slot[i] && memcmp(tr_tok_kind_stage2 + (size_t)(slot[i] - 1) * TR_UNI_BLOCK, blk,
                                 TR_UNI_BLOCK) != 0)
            i = (i + 1) & (SLOTS - 1);
        if (!slot[i]) {
            // The generator counted the distinct blocks; more can only mean mismatched files,
            // which test_unicode catches, so stay in bounds rather than trust them.
            if (n_blocks == TR_UNI_N_BLOCKS) {
                tr_tok_kind_stage1[b] = 0;
                continue;
            }
            memcpy(tr_tok_kind_stage2 + n_blocks * TR_UNI_BLOCK, blk, TR_UNI_BLOCK);
            slot[i] = (uint16_t)++n_blocks;
        }
        tr_tok_kind_stage1[b] = (uint16_t)(slot[i] - 1);
    }
}

void tr_tok_unicode_init(void) { pthread_once(&kind_once, kind_build); }

bool tr_tok_is_space(int32_t c) { return tr_tok_props(c) >> 5 & TR_UNI_SPACE; }

bool tr_tok_is_word(int32_t c) { return tr_tok_props(c) >> 5 & TR_UNI_WORD_ADDED; }

size_t tr_tok_utf8_lossy(const uint8_t *s, size_t len, char *out) {
    size_t i = 0, o = 0;
    while (i < len) {
        uint8_t b = s[i];
        if (b < 0x80) {
            out[o++] = (char)b;
            i++;
            continue;
        }
        size_t need = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b == 0xE0) need = 2, lo = 0xA0;
        else if (b == 0xED) need = 2, hi = 0x9F;
        else if (b >= 0xE1 && b <= 0xEF) need = 2;
        else if (b == 0xF0) need = 3, lo = 0x90;
        else if (b >= 0xF1 && b <= 0xF3) need = 3;
        else if (b == 0xF4) need = 3, hi = 0x8F;
        size_t j = i + 1, got = 0;
        if (need && j < len && s[j] >= lo && s[j] <= hi) {
            j++;
            got = 1;
            while (got < need && j < len && (s[j] & 0xC0) == 0x80) {
                j++;
                got++;
            }
        }
        if (need && got == need) {
            memcpy(out + o, s + i, j - i);
            o += j - i;
        } else {
            // One U+FFFD per maximal subpart of an ill-formed sequence.
            out[o++] = (char)0xEF;
            out[o++] = (char)0xBF;
            out[o++] = (char)0xBD;
        }
        i = j;
    }
    return o;
}

// ---- normalizers ----

// HF's normalizers compose and decompose by the Unicode 9.0.0 data of the generated tables;
// Hangul syllables are computed (UAX #15 section 3.12), as everyone does.
enum {
    HANGUL_S = 0xAC00, HANGUL_L = 0x1100, HANGUL_V = 0x1161, HANGUL_T = 0x11A7,
    N_L = 19, N_V = 21, N_T = 28, N_S = N_L * N_V * N_T,
};

static uint32_t ccc_of(uint32_t c) {
    size_t lo = 0, hi = TR_UNI_N_CCC_RUNS;  // last run starting at or before c
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (tr_uni_ccc_runs[mid] >> 8 <= c) lo = mid;
        else hi = mid;
    }
    return tr_uni_ccc_runs[lo] & 0xff;
}

static const tr_uni_decomp *decomp_find(const tr_uni_decomp *t, size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (t[mid].cp < c) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && t[lo].cp == c ? &t[lo] : NULL;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a - HANGUL_L < N_L && b - HANGUL_V < N_V)
        return HANGUL_S + ((a - HANGUL_L) * N_V + (b - HANGUL_V)) * N_T;
    if (a - HANGUL_S < N_S && (a - HANGUL_S) % N_T == 0 && b - HANGUL_T - 1 < N_T - 1)
        return a + (b - HANGUL_T);
    size_t lo = 0, hi = TR_UNI_N_COMPS;
    uint64_t key = (uint64_t)a << 32 | b;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        uint64_t k = (uint64_t)tr_uni_comps[mid][0] << 32 | tr_uni_comps[mid][1];
        if (k < key) lo = mid + 1;
        else hi = mid;
    }
    if (lo < TR_UNI_N_COMPS && tr_uni_comps[lo][0] == a && tr_uni_comps[lo][1] == b)
        return tr_uni_comps[lo][2];
    return 0;
}

// Code points of the stretch being normalized, each with its combining class in bits 24..31.
typedef struct cpbuf {
    uint32_t *v;
    size_t n, cap;
} cpbuf;

typedef struct obuf {
    char *p;
    size_t n, cap;
} obuf;

static int cp_push(cpbuf *b, uint32_t c, tr_err *err) {
    if (b->n == b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        uint32_t *nv = realloc(b->v, nc * sizeof *nv);
        if (!nv) return tr_errf(err, TR_ENOMEM, "out of memory normalizing text");
        b->v = nv;
        b->cap = nc;
    }
    // Most code points are NFD-inert, which implies class 0: no search for them.
    uint32_t cc = tr_tok_props((int32_t)c) >> 5 & TR_UNI_NFD_INERT ? 0 : ccc_of(c);
    b->v[b->n++] = cc << 24 | c;
    return 0;
}

static int obuf_put(obuf *b, const char *s, size_t n, tr_err *err) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return tr_errf(err, TR_ENOMEM, "out of memory normalizing text");
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static int decompose(cpbuf *b, uint32_t c, bool compat, tr_err *err) {
    if (c - HANGUL_S < N_S) {
        uint32_t s = c - HANGUL_S;
        if (cp_push(b, HANGUL_L + s / (N_V * N_T), err) ||
            cp_push(b, HANGUL_V + s % (N_V * N_T) / N_T, err))
            return -1;
        return s % N_T ? cp_push(b, HANGUL_T + s % N_T, err) : 0;
    }
    const tr_uni_decomp *d = compat ? decomp_find(tr_uni_compat, TR_UNI_N_COMPAT, c) : NULL;
    if (!d) d = decomp_find(tr_uni_canon, TR_UNI_N_CANON, c);
    if (!d) return cp_push(b, c, err);
    for (uint16_t k = 0; k < d->len; k++)
        if (cp_push(b, tr_uni_decomp_cps[d->off + k], err)) return -1;
    return 0;
}

// Stable sort of each run of non-starters by combining class (canonical ordering): insertion
// for short runs, counting by class for long ones, which a string of marks could otherwise
// make quadratic. tmp holds n code points.
static void reorder(uint32_t *v, size_t n, uint32_t *tmp) {
    size_t i = 0;
    while (i < n) {
        if (v[i] >> 24 == 0) {
            i++;
            continue;
        }
        size_t a = i;
        while (i < n && v[i] >> 24 != 0) i++;
        if (i - a <= 16) {
            for (size_t k = a + 1; k < i; k++) {
                uint32_t x = v[k], cc = x >> 24;
                size_t j = k;
                while (j > a && v[j - 1] >> 24 > cc) {
                    v[j] = v[j - 1];
                    j--;
                }
                v[j] = x;
            }
            continue;
        }
        size_t count[257] = {0};
        for (size_t k = a; k < i; k++) count[(v[k] >> 24) + 1]++;
        for (int c = 1; c < 257; c++) count[c] += count[c - 1];
        for (size_t k = a; k < i; k++) tmp[count[v[k] >> 24]++] = v[k];
        memcpy(v + a, tmp, (i - a) * sizeof *v);
    }
}

// Canonical composition in place: a mark joins the last starter unless something between
// them blocks it (a starter, or a mark of the same or a higher class). Returns the new length.
static size_t compose(uint32_t *v, size_t n) {
    size_t starter = 0, out = 1;
    uint32_t last_cc = v[0] >> 24;
    bool have_starter = last_cc == 0;
    if (!have_starter) last_cc = 256;  // nothing before a leading mark composes with it
    for (size_t i = 1; i < n; i++) {
        uint32_t c = v[i] & 0xffffff, cc = v[i] >> 24, comp;
        if (have_starter && (last_cc < cc || last_cc == 0) &&
            (comp = compose_pair(v[starter] & 0xffffff, c)) != 0) {
            v[starter] = ccc_of(comp) << 24 | comp;
            continue;
        }
        if (cc == 0) {
            starter = out;
            have_starter = true;
        }
        last_cc = cc;
        v[out++] = v[i];
    }
    return out;
}

size_t tr_tok_utf8_put(uint32_t c, char *o) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | (c >> 6 & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | (c >> 12 & 0x3F));
    o[2] = (char)(0x80 | (c >> 6 & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

typedef struct nf_scratch {
    cpbuf cps;
    uint32_t *tmp;  // as many code points as cps can hold, for reorder
    size_t tmp_cap;
    obuf chunk;  // one normalized stretch
    obuf out;    // the whole result, once something changed
} nf_scratch;

// Normalizes s[0..len) (valid UTF-8) into x->chunk.
static int nf_stretch(int form, const char *s, size_t len, nf_scratch *x, tr_err *err) {
    bool compat = form == TR_TOK_NFKC || form == TR_TOK_NFKD;
    x->cps.n = 0;
    for (size_t i = 0; i < len;) {
        size_t n;
        int32_t c = tr_tok_utf8_next(s + i, len - i, &n);
        if (decompose(&x->cps, (uint32_t)c, compat, err)) return -1;
        i += n;
    }
    if (x->tmp_cap < x->cps.cap) {
        uint32_t *nt = realloc(x->tmp, x->cps.cap * sizeof *nt);
        if (!nt) return tr_errf(err, TR_ENOMEM, "out of memory normalizing text");
        x->tmp = nt;
        x->tmp_cap = x->cps.cap;
    }
    reorder(x->cps.v, x->cps.n, x->tmp);
    size_t n = x->cps.n;
    if (n && (form == TR_TOK_NFC || form == TR_TOK_NFKC)) n = compose(x->cps.v, n);
    x->chunk.n = 0;
    for (size_t k = 0; k < n; k++) {
        char u[4];
        if (obuf_put(&x->chunk, u, tr_tok_utf8_put(x->cps.v[k] & 0xffffff, u), err)) return -1;
    }
    return 0;
}

static uint16_t inert_flag(int form) {
    switch (form) {
    case TR_TOK_NFC: return TR_UNI_NFC_INERT;
    case TR_TOK_NFD: return TR_UNI_NFD_INERT;
    case TR_TOK_NFKC: return TR_UNI_NFKC_INERT;
    default: return TR_UNI_NFKD_INERT;
    }
}

// One normal form over s: the text is cut right before inert code points (the form leaves
// them alone and nothing before them reaches across), only the stretches between go through
// the tables, and nothing is copied while the text is already normalized. *changed says
// whether x->out holds a different result.
static int nf_apply(int form, const char *s, size_t len, nf_scratch *x, bool *changed,
                    tr_err *err) {
    uint16_t inert = inert_flag(form);
    size_t i = 0, last_inert = 0, copied = 0;
    *changed = false;
    x->out.n = 0;
    while (i < len) {
        if ((uint8_t)s[i] < 0x80) {  // ASCII is inert in every form
            while (i < len && (uint8_t)s[i] < 0x80) i++;
            last_inert = i - 1;
            continue;
        }
        size_t n;
        int32_t c = tr_tok_utf8_next(s + i, len - i, &n);
        if (tr_tok_props(c) >> 5 & inert) {
            last_inert = i;
            i += n;
            continue;
        }
        // The stretch runs from the last inert code point (a mark may compose with it) to
        // the next one.
        size_t start = last_inert, end = i + n;
        while (end < len) {
            size_t m;
            int32_t d = tr_tok_utf8_next(s + end, len - end, &m);
            if (d < 0x80 || tr_tok_props(d) >> 5 & inert) break;
            end += m;
        }
        if (start < copied) start = copied;
        if (nf_stretch(form, s + start, end - start, x, err)) return -1;
        if (x->chunk.n != end - start || memcmp(x->chunk.p, s + start, end - start) != 0) {
            if (obuf_put(&x->out, s + copied, start - copied, err) ||
                obuf_put(&x->out, x->chunk.p, x->chunk.n, err))
                return -1;
            copied = end;
            *changed = true;
        }
        i = end;
        last_inert = end;
    }
    if (*changed && obuf_put(&x->out, s + copied, len - copied, err)) return -1;
    return 0;
}

int tr_tok_normalize(const int *steps, int n_steps, const char *s, size_t len, char **out,
                     size_t *out_len, bool *owned, tr_err *err) {
    *out = (char *)s;
    *out_len = len;
    *owned = false;
    if (n_steps == 0) return 0;
    size_t i = 0;
    while (i < len && (uint8_t)s[i] < 0x80) i++;
    if (i == len) return 0;
    nf_scratch x = {0};
    int rc = 0;
    for (int k = 0; k < n_steps && rc == 0; k++) {
        bool changed;
        rc = nf_apply(steps[k], *out, *out_len, &x, &changed, err);
        if (rc || !changed) continue;
        if (*owned) free(*out);
        // The result moves out of the scratch and becomes the next step's input.
        *out = x.out.p;
        *out_len = x.out.n;
        *owned = true;
        x.out = (obuf){0};
    }
    free(x.cps.v);
    free(x.tmp);
    free(x.chunk.p);
    free(x.out.p);
    if (rc && *owned) {
        free(*out);
        *out = (char *)s;
        *out_len = len;
        *owned = false;
    }
    return rc;
}
