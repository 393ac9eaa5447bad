// Unicode pieces the tokenizer needs beyond PCRE2: UTF-8 validation and stepping, the \s and
// \w classes Hugging Face applies around added tokens, lossy UTF-8 for decoding, and the
// NFC/NFD/NFKC/NFKD normalizers (through utf8proc).
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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

bool tr_tok_is_space(int32_t c) {
    if (c < 0x80) return (c >= 9 && c <= 13) || c == ' ';
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool tr_tok_is_word(int32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
               c == '_';
    if (c == 0x200C || c == 0x200D) return true;  // Join_Control
    // Other_Alphabetic symbols (circled and squared Latin letters).
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
        (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
        return true;
    utf8proc_category_t cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NL) ||
           cat == UTF8PROC_CATEGORY_PC;
}

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

static int map_nf(int form, const char *s, size_t len, char **out, size_t *out_len, tr_err *err) {
    int opt = UTF8PROC_STABLE;
    switch (form) {
    case TR_TOK_NFC: opt |= UTF8PROC_COMPOSE; break;
    case TR_TOK_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case TR_TOK_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case TR_TOK_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)opt);
    if (n < 0) {
        free(dst);
        return tr_errf(err, n == UTF8PROC_ERROR_NOMEM ? TR_ENOMEM : TR_EINVAL,
                       "normalizing text: %s", utf8proc_errmsg(n));
    }
    *out = (char *)dst;
    *out_len = (size_t)n;
    return 0;
}

// True when NFC can split text right before c: c is a starter that nothing before it
// composes with, and NFC leaves c itself alone (UAX #15's NFC_Quick_Check=Yes, ccc=0).
static bool nfc_boundary(int32_t c) {
    if (c < 0x300 || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3))
        return true;  // Latin-1 and Latin Extended, CJK ideographs, Hangul syllables
    if ((c >= 0x1161 && c <= 0x1175) || (c >= 0x11A8 && c <= 0x11C2)) return false;  // Hangul V, T
    const utf8proc_property_t *p = utf8proc_get_property(c);
    if (p->combining_class != 0 || p->category == UTF8PROC_CATEGORY_MN ||
        p->category == UTF8PROC_CATEGORY_MC || p->category == UTF8PROC_CATEGORY_ME)
        return false;
    if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;
    // A precomposed character: stable when composing its decomposition gives it back
    // (not for singletons like U+212B or composition exclusions like U+0958).
    utf8proc_int32_t buf[16];
    int boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(c, buf, 16, UTF8PROC_DECOMPOSE | UTF8PROC_STABLE,
                                                 &boundclass);
    if (n <= 0 || n > 16) return false;
    n = utf8proc_normalize_utf32(buf, n, UTF8PROC_COMPOSE | UTF8PROC_STABLE);
    return n == 1 && buf[0] == c;
}

typedef struct obuf {
    char *p;
    size_t n, cap;
} obuf;

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

// NFC chunk by chunk: only the stretches around characters that are not boundaries go
// through utf8proc, and nothing is copied while the text is already NFC.
static int nfc_chunks(const char *s, size_t len, char **out, size_t *out_len, bool *owned,
                      tr_err *err) {
    obuf b = {0};
    size_t i = 0, last_boundary = 0, copied = 0;
    while (i < len) {
        size_t n;
        int32_t c = (uint8_t)s[i] < 0x80 ? (int32_t)(uint8_t)s[i] : tr_tok_utf8_next(s + i, len - i, &n);
        if (c < 0x80) n = 1;
        if (nfc_boundary(c)) {
            last_boundary = i;
            i += n;
            continue;
        }
        size_t start = last_boundary, end = i + n;
        while (end < len) {
            size_t m;
            int32_t d = tr_tok_utf8_next(s + end, len - end, &m);
            if (nfc_boundary(d)) break;
            end += m;
        }
        char *norm;
        size_t nlen;
        if (map_nf(TR_TOK_NFC, s + start, end - start, &norm, &nlen, err)) {
            free(b.p);
            return -1;
        }
        if (b.p || nlen != end - start || memcmp(norm, s + start, nlen) != 0) {
            if (obuf_put(&b, s + copied, start - copied, err) || obuf_put(&b, norm, nlen, err)) {
                free(norm);
                free(b.p);
                return -1;
            }
            copied = end;
        }
        free(norm);
        i = end;
        last_boundary = end;
    }
    if (b.p) {
        if (obuf_put(&b, s + copied, len - copied, err)) {
            free(b.p);
            return -1;
        }
        *out = b.p;
        *out_len = b.n;
        *owned = true;
    }
    return 0;
}

int tr_tok_normalize(const int *steps, int n_steps, const char *s, size_t len, char **out,
                     size_t *out_len, bool *owned, tr_err *err) {
    *out = (char *)s;
    *out_len = len;
    *owned = false;
    if (n_steps == 0) return 0;
    // ASCII is unchanged by every normal form.
    size_t i = 0;
    while (i < len && (uint8_t)s[i] < 0x80) i++;
    if (i == len) return 0;
    if (n_steps == 1 && steps[0] == TR_TOK_NFC) return nfc_chunks(s, len, out, out_len, owned, err);
    for (int k = 0; k < n_steps; k++) {
        char *next;
        size_t nlen;
        int rc = map_nf(steps[k], *out, *out_len, &next, &nlen, err);
        if (*owned) free(*out);
        *owned = false;
        if (rc) {
            *out = (char *)s;
            *out_len = len;
            return -1;
        }
        *out = next;
        *out_len = nlen;
        *owned = true;
    }
    return 0;
}
