// Reads a Hugging Face tokenizer.json (engine/json) into a tr_tokenizer: the BPE model (vocab,
// merges in either serialized form), added tokens with HF's id assignment, normalizer,
// pre-tokenizer and decoder. Anything troupe does not implement is an error naming its key.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"
#include "engine/file.h"
#include "engine/json.h"

typedef struct lctx {
    const char *name;
    tr_err *err;
} lctx;

__attribute__((format(printf, 4, 5))) static int kerr(lctx *L, int code, const char *key,
                                                     const char *fmt, ...) {
    char msg[TR_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tr_errf(L->err, code, "%s: %s: %s", L->name, key, msg);
}

static const char *jtype(const tr_json *v) {
    if (!v) return "nothing";
    switch (v->type) {
    case TR_JSON_OBJECT: return "an object";
    case TR_JSON_ARRAY: return "an array";
    case TR_JSON_STRING: return "a string";
    case TR_JSON_NUMBER: return v->is_int ? "an integer" : "a number";
    case TR_JSON_BOOL: return "a boolean";
    case TR_JSON_NULL: return "null";
    }
    return "something else";
}

static int type_err(lctx *L, const char *key, const char *want, const tr_json *v) {
    return kerr(L, TR_EFORMAT, key, "expected %s, got %s", want, jtype(v));
}

// Optional boolean: missing or null gives def.
static int opt_bool(lctx *L, const tr_json *obj, const char *name, const char *prefix, bool def,
                    bool *out) {
    const tr_json *v = tr_json_get(obj, name);
    *out = def;
    if (tr_json_is_none(v)) return 0;
    if (!tr_json_is(v, TR_JSON_BOOL)) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        return type_err(L, key, "a boolean", v);
    }
    *out = v->boolean;
    return 0;
}

// Optional string: missing or null gives NULL.
static int opt_string(lctx *L, const tr_json *obj, const char *name, const char *prefix,
                      const char **s, size_t *len) {
    const tr_json *v = tr_json_get(obj, name);
    *s = NULL;
    *len = 0;
    if (tr_json_is_none(v)) return 0;
    if (!tr_json_is(v, TR_JSON_STRING)) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        return type_err(L, key, "a string", v);
    }
    *s = v->str;
    *len = v->len;
    return 0;
}

static int req_string(lctx *L, const tr_json *obj, const char *name, const char *prefix,
                      const char **s, size_t *len) {
    if (opt_string(L, obj, name, prefix, s, len)) return -1;
    if (!*s) {
        char key[256];
        snprintf(key, sizeof key, "%s.%s", prefix, name);
        return type_err(L, key, "a string", tr_json_get(obj, name));
    }
    return 0;
}

static int pool_add(tr_tokenizer *t, const char *s, size_t len, uint64_t *ref, tr_err *err) {
    if (t->str_pool_len + len + 1 > t->str_pool_cap) {
        size_t nc = t->str_pool_cap ? t->str_pool_cap : 1 << 16;
        while (nc < t->str_pool_len + len + 1) nc *= 2;
        if (nc > UINT32_MAX) return tr_errf(err, TR_ERANGE, "vocabulary strings exceed 4 GiB");
        char *np = realloc(t->str_pool, nc);
        if (!np) return tr_errf(err, TR_ENOMEM, "out of memory for vocabulary strings");
        t->str_pool = np;
        t->str_pool_cap = nc;
    }
    memcpy(t->str_pool + t->str_pool_len, s, len);
    t->str_pool[t->str_pool_len + len] = '\0';
    *ref = (uint64_t)t->str_pool_len << 32 | len;
    t->str_pool_len += len + 1;
    return 0;
}

// ---- normalizer ----

static int parse_normalizer(lctx *L, tr_tokenizer *t, const tr_json *v, const char *key) {
    if (tr_json_is_none(v)) return 0;
    if (!tr_json_is(v, TR_JSON_OBJECT)) return type_err(L, key, "an object or null", v);
    const char *type;
    size_t tlen;
    if (req_string(L, v, "type", key, &type, &tlen)) return -1;
    if (strcmp(type, "Sequence") == 0) {
        const tr_json *arr = tr_json_get(v, "normalizers");
        char k[256];
        snprintf(k, sizeof k, "%s.normalizers", key);
        if (!tr_json_is(arr, TR_JSON_ARRAY)) return type_err(L, k, "an array", arr);
        size_t i = 0;
        for (const tr_json *e = arr->child; e; e = e->next, i++) {
            snprintf(k, sizeof k, "%s.normalizers[%zu]", key, i);
            if (parse_normalizer(L, t, e, k)) return -1;
        }
        return 0;
    }
    int kind = strcmp(type, "NFC") == 0    ? TR_TOK_NFC
               : strcmp(type, "NFD") == 0  ? TR_TOK_NFD
               : strcmp(type, "NFKC") == 0 ? TR_TOK_NFKC
               : strcmp(type, "NFKD") == 0 ? TR_TOK_NFKD
                                           : -1;
    if (kind < 0)
        return kerr(L, TR_EUNSUPPORTED, key,
                    "unsupported normalizer type '%s' (supported: NFC, NFD, NFKC, NFKD, Sequence)",
                    type);
    if (t->n_norm == TR_TOK_MAX_NORM)
        return kerr(L, TR_EUNSUPPORTED, key, "more than %d normalizers", TR_TOK_MAX_NORM);
    t->norm[t->n_norm++] = kind;
    return 0;
}

// ---- pre-tokenizer ----

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int parse_pretok(lctx *L, tr_tokenizer *t, const tr_json *v, const char *key) {
    if (!tr_json_is(v, TR_JSON_OBJECT)) return type_err(L, key, "an object", v);
    const char *type;
    size_t tlen;
    if (req_string(L, v, "type", key, &type, &tlen)) return -1;
    char k[256];
    if (strcmp(type, "Sequence") == 0) {
        const tr_json *arr = tr_json_get(v, "pretokenizers");
        snprintf(k, sizeof k, "%s.pretokenizers", key);
        if (!tr_json_is(arr, TR_JSON_ARRAY)) return type_err(L, k, "an array", arr);
        size_t i = 0;
        for (const tr_json *e = arr->child; e; e = e->next, i++) {
            snprintf(k, sizeof k, "%s.pretokenizers[%zu]", key, i);
            if (parse_pretok(L, t, e, k)) return -1;
        }
        return 0;
    }
    bool split = strcmp(type, "Split") == 0, bytelevel = strcmp(type, "ByteLevel") == 0;
    if (!split && !bytelevel)
        return kerr(L, TR_EUNSUPPORTED, key,
                    "unsupported pre-tokenizer type '%s' (supported: Split, ByteLevel, Sequence)",
                    type);
    if (t->n_pretok == TR_TOK_MAX_PRETOK)
        return kerr(L, TR_EUNSUPPORTED, key, "more than %d pre-tokenizer steps", TR_TOK_MAX_PRETOK);
    tr_tok_pretok *p = &t->pretok[t->n_pretok++];
    memset(p, 0, sizeof *p);
    if (bytelevel) {
        p->kind = TR_TOK_BYTELEVEL;
        bool use_regex;
        if (opt_bool(L, v, "add_prefix_space", key, true, &p->add_prefix_space)) return -1;
        if (opt_bool(L, v, "use_regex", key, true, &use_regex)) return -1;
        if (use_regex) {
            snprintf(k, sizeof k, "%s.use_regex", key);
            if (tr_tok_regex_compile(p, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, false, k, L->err))
                return tr_err_wrap(L->err, "%s", L->name);
        }
        return 0;
    }
    p->kind = TR_TOK_SPLIT;
    const tr_json *pat = tr_json_get(v, "pattern");
    snprintf(k, sizeof k, "%s.pattern", key);
    if (!tr_json_is(pat, TR_JSON_OBJECT)) return type_err(L, k, "an object {\"Regex\": ...} or {\"String\": ...}", pat);
    const tr_json *re = tr_json_get(pat, "Regex"), *lit = tr_json_get(pat, "String");
    if ((re != NULL) == (lit != NULL))
        return kerr(L, TR_EFORMAT, k, "expected exactly one of \"Regex\" and \"String\"");
    snprintf(k, sizeof k, "%s.pattern.%s", key, re ? "Regex" : "String");
    const tr_json *ps = re ? re : lit;
    if (!tr_json_is(ps, TR_JSON_STRING)) return type_err(L, k, "a string", ps);
    if (tr_tok_regex_compile(p, ps->str, ps->len, lit != NULL, k,
                             L->err))
        return tr_err_wrap(L->err, "%s", L->name);
    const char *beh;
    size_t blen;
    if (req_string(L, v, "behavior", key, &beh, &blen)) return -1;
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    static const int kinds[] = {TR_TOK_REMOVED, TR_TOK_ISOLATED, TR_TOK_MERGED_PREV,
                                TR_TOK_MERGED_NEXT, TR_TOK_CONTIGUOUS};
    p->behavior = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(beh, names[i]) == 0) p->behavior = kinds[i];
    if (p->behavior < 0) {
        snprintf(k, sizeof k, "%s.behavior", key);
        return kerr(L, TR_EFORMAT, k,
                    "unknown behavior '%s' (Removed, Isolated, MergedWithPrevious, "
                    "MergedWithNext, Contiguous)",
                    beh);
    }
    return opt_bool(L, v, "invert", key, false, &p->invert);
}

// ---- model ----

static int parse_vocab(lctx *L, tr_tokenizer *t, const tr_json *vocab, int32_t *max_id) {
    size_t n = (size_t)vocab->count;
    if (n > TR_TOK_MAX_ID)
        return kerr(L, TR_ERANGE, "model.vocab", "%zu entries (at most %d)", n, TR_TOK_MAX_ID);
    t->model_vocab_count = (uint32_t)n;
    if (tr_tok_strmap_init(&t->model_vocab, (uint32_t)n, L->err) ||
        tr_tok_strmap_init(&t->bpe_vocab, (uint32_t)n, L->err))
        return -1;
    uint8_t *bytes = NULL;
    size_t bytes_cap = 0;
    for (const tr_json *v = vocab->child; v; v = v->next) {
        const char *tok = v->key;
        size_t tlen = v->key_len;
        if (!tr_json_is_int(v) || v->inum < 0 || v->inum >= TR_TOK_MAX_ID) {
            free(bytes);
            char key[300];
            snprintf(key, sizeof key, "model.vocab[\"%.200s\"]", tok);
            if (!tr_json_is_int(v)) return type_err(L, key, "an integer id", v);
            return kerr(L, TR_ERANGE, key, "id %lld out of range [0, %d)", (long long)v->inum,
                        TR_TOK_MAX_ID);
        }
        int32_t id = (int32_t)v->inum;
        if (id > *max_id) *max_id = id;
        if (tr_tok_strmap_put(&t->model_vocab, tok, tlen, id, L->err)) {
            free(bytes);
            return -1;
        }
        if (tlen > bytes_cap) {
            uint8_t *nb = realloc(bytes, tlen);
            if (!nb) {
                free(bytes);
                return tr_errf(L->err, TR_ENOMEM, "out of memory");
            }
            bytes = nb;
            bytes_cap = tlen;
        }
        long nb = tr_tok_bytelevel_unmap(tok, tlen, bytes);
        if (nb > 0 && tr_tok_strmap_put(&t->bpe_vocab, bytes, (size_t)nb, id, L->err)) {
            free(bytes);
            return -1;
        }
    }
    free(bytes);
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_ids[b] = tr_tok_strmap_get(&t->bpe_vocab, &byte, 1);
    }
    return 0;
}

static int merge_part_id(lctx *L, tr_tokenizer *t, const char *s, size_t len, size_t i,
                         int32_t *id) {
    *id = tr_tok_strmap_get(&t->model_vocab, s, len);
    if (*id < 0) {
        char key[64];
        snprintf(key, sizeof key, "model.merges[%zu]", i);
        return kerr(L, TR_EFORMAT, key, "token '%.*s' is not in model.vocab",
                    (int)(len > 200 ? 200 : len), s);
    }
    return 0;
}

static int parse_merges(lctx *L, tr_tokenizer *t, const tr_json *merges) {
    size_t n = (size_t)merges->count;
    if (tr_tok_pairmap_init(&t->merges, n, L->err)) return -1;
    char *cat = NULL;
    size_t cat_cap = 0;
    int rc = 0;
    size_t i = 0;
    for (const tr_json *m = merges->child; m && rc == 0; m = m->next, i++) {
        char key[64];
        snprintf(key, sizeof key, "model.merges[%zu]", i);
        const char *a, *b;
        size_t alen, blen;
        const tr_json *m0 = tr_json_is(m, TR_JSON_ARRAY) ? m->child : NULL;
        const tr_json *m1 = m0 ? m0->next : NULL;
        if (m->type == TR_JSON_STRING) {
            // "a b": exactly one space, as HF's legacy merges format.
            const char *s = m->str;
            size_t len = m->len;
            if (len >= 8 && memcmp(s, "#version", 8) == 0) continue;
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s))) {
                rc = kerr(L, TR_EFORMAT, key, "expected \"left right\" with one space, got '%.*s'",
                          (int)(len > 200 ? 200 : len), s);
                break;
            }
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = len - alen - 1;
        } else if (m0 && m->count == 2 && tr_json_is(m0, TR_JSON_STRING) &&
                   tr_json_is(m1, TR_JSON_STRING)) {
            a = m0->str;
            alen = m0->len;
            b = m1->str;
            blen = m1->len;
        } else {
            rc = type_err(L, key, "a string \"left right\" or a pair [left, right]", m);
            break;
        }
        int32_t ida, idb, idm;
        if (merge_part_id(L, t, a, alen, i, &ida) || merge_part_id(L, t, b, blen, i, &idb)) {
            rc = -1;
            break;
        }
        if (alen + blen > cat_cap) {
            size_t nc = (alen + blen) * 2;
            char *nb = realloc(cat, nc);
            if (!nb) {
                rc = tr_errf(L->err, TR_ENOMEM, "out of memory");
                break;
            }
            cat = nb;
            cat_cap = nc;
        }
        memcpy(cat, a, alen);
        memcpy(cat + alen, b, blen);
        if (merge_part_id(L, t, cat, alen + blen, i, &idm)) {
            rc = -1;
            break;
        }
        tr_tok_pairmap_put(&t->merges, ida, idb, (uint32_t)i, idm);
    }
    free(cat);
    return rc;
}

static int parse_model(lctx *L, tr_tokenizer *t, const tr_json *model, int32_t *max_id) {
    if (!tr_json_is(model, TR_JSON_OBJECT)) return type_err(L, "model", "an object", model);
    const char *type;
    size_t tlen;
    if (opt_string(L, model, "type", "model", &type, &tlen)) return -1;
    const tr_json *vocab = tr_json_get(model, "vocab");
    const tr_json *merges = tr_json_get(model, "merges");
    if (type && strcmp(type, "BPE") != 0)
        return kerr(L, TR_EUNSUPPORTED, "model.type",
                    "unsupported model type '%s' (only BPE is supported)", type);
    if (!type && !merges)
        return kerr(L, TR_EUNSUPPORTED, "model.type",
                    "missing, and no model.merges: only BPE models are supported");
    if (!tr_json_is(vocab, TR_JSON_OBJECT)) return type_err(L, "model.vocab", "an object", vocab);
    if (!tr_json_is(merges, TR_JSON_ARRAY)) return type_err(L, "model.merges", "an array", merges);

    const tr_json *dropout = tr_json_get(model, "dropout");
    if (dropout && dropout->type != TR_JSON_NULL) {
        if (dropout->type != TR_JSON_NUMBER)
            return type_err(L, "model.dropout", "a number or null", dropout);
        if (dropout->num != 0.0)
            return kerr(L, TR_EUNSUPPORTED, "model.dropout",
                        "BPE dropout %g is not supported (random merges)", dropout->num);
    }
    const char *s;
    size_t slen;
    if (opt_string(L, model, "continuing_subword_prefix", "model", &s, &slen)) return -1;
    if (s && slen)
        return kerr(L, TR_EUNSUPPORTED, "model.continuing_subword_prefix", "'%s' is not supported", s);
    if (opt_string(L, model, "end_of_word_suffix", "model", &s, &slen)) return -1;
    if (s && slen)
        return kerr(L, TR_EUNSUPPORTED, "model.end_of_word_suffix", "'%s' is not supported", s);
    bool byte_fallback;
    if (opt_bool(L, model, "byte_fallback", "model", false, &byte_fallback) ||
        opt_bool(L, model, "fuse_unk", "model", false, &t->fuse_unk) ||
        opt_bool(L, model, "ignore_merges", "model", false, &t->ignore_merges))
        return -1;
    if (byte_fallback)
        return kerr(L, TR_EUNSUPPORTED, "model.byte_fallback",
                    "true is not supported (byte-level BPE needs no byte fallback)");
    if (parse_vocab(L, t, vocab, max_id) || parse_merges(L, t, merges)) return -1;
    if (opt_string(L, model, "unk_token", "model", &s, &slen)) return -1;
    t->unk_id = -1;
    if (s) {
        t->unk_token = strdup(s);
        if (!t->unk_token) return tr_errf(L->err, TR_ENOMEM, "out of memory");
        t->unk_id = tr_tok_strmap_get(&t->model_vocab, s, slen);
        t->unk_missing = t->unk_id < 0;
    }
    return 0;
}

// ---- added tokens ----

// The flags HF keeps per added token, used to tell repeated entries apart.
static bool same_added(const tr_tok_added *a, const char *content, size_t len, const tr_tok_added *f) {
    return a->len == len && memcmp(a->content, content, len) == 0 &&
           a->single_word == f->single_word && a->lstrip == f->lstrip && a->rstrip == f->rstrip &&
           a->normalized == f->normalized && a->special == f->special;
}

// What parse_added keeps while it reads the list; freed when it returns.
typedef struct added_scratch {
    tr_tok_strmap special_set;  // contents of the entries marked special
    tr_tok_strmap rec_of_id;    // id -> index into t->added
    // Entries of HF's special_tokens and added_tokens lists, in order; they feed the tries.
    size_t *special_list, *added_list;
    size_t n_special, n_plain;
    tr_tok_added *flags;  // each entry as written in the file
    int64_t max_added;    // highest id given to an added token so far, or -1
} added_scratch;

static void added_scratch_free(added_scratch *s) {
    free(s->special_list);
    free(s->added_list);
    free(s->flags);
    tr_tok_strmap_free(&s->special_set);
    tr_tok_strmap_free(&s->rec_of_id);
}

// The maps and lists for n entries, and t->added to hold the records.
static int added_scratch_init(lctx *L, tr_tokenizer *t, added_scratch *s, size_t n) {
    memset(s, 0, sizeof *s);
    s->max_added = -1;
    if (tr_tok_strmap_init(&s->special_set, (uint32_t)n, L->err)) return -1;
    if (tr_tok_strmap_init(&s->rec_of_id, (uint32_t)n, L->err)) return -1;
    s->special_list = malloc((n + 1) * sizeof *s->special_list);
    s->added_list = malloc((n + 1) * sizeof *s->added_list);
    s->flags = calloc(n + 1, sizeof *s->flags);
    t->added = calloc(n + 1, sizeof *t->added);
    if (!s->special_list || !s->added_list || !s->flags || !t->added)
        return tr_errf(L->err, TR_ENOMEM, "out of memory for %zu added tokens", n);
    return 0;
}

// One entry's content and flags into f; its "id" only has to be an integer.
static int read_added(lctx *L, const tr_json *e, const char *key, tr_tok_added *f) {
    if (!tr_json_is(e, TR_JSON_OBJECT)) return type_err(L, key, "an object", e);
    const tr_json *idv = tr_json_get(e, "id");
    if (!tr_json_is_int(idv)) {
        char k2[80];
        snprintf(k2, sizeof k2, "%s.id", key);
        return type_err(L, k2, "an integer", idv);
    }
    const char *content;
    size_t clen;
    if (req_string(L, e, "content", key, &content, &clen) ||
        opt_bool(L, e, "special", key, false, &f->special) ||
        opt_bool(L, e, "single_word", key, false, &f->single_word) ||
        opt_bool(L, e, "lstrip", key, false, &f->lstrip) ||
        opt_bool(L, e, "rstrip", key, false, &f->rstrip) ||
        opt_bool(L, e, "normalized", key, !f->special, &f->normalized))
        return -1;
    f->content = (char *)content;
    f->len = clen;
    return 0;
}

// The id HF gives entry f: the one its content already has as an added token or in the
// model's vocabulary, else the next after the vocabulary. *repeat: the same entry (content
// and flags) came before and changes nothing.
static int added_id(lctx *L, const tr_tokenizer *t, const added_scratch *s, const tr_tok_added *f,
                    const char *key, int32_t *id, bool *repeat) {
    *repeat = false;
    *id = tr_tok_strmap_get(&t->added_vocab, f->content, f->len);
    if (*id >= 0) {
        int32_t r = tr_tok_strmap_get(&s->rec_of_id, id, sizeof *id);
        if (r >= 0 && same_added(&t->added[r], f->content, f->len, f)) {
            *repeat = true;
            return 0;
        }
    }
    if (*id < 0) *id = tr_tok_strmap_get(&t->model_vocab, f->content, f->len);
    if (*id < 0) {
        int64_t vs = t->model_vocab_count;
        int64_t max_added = s->max_added;
        int64_t nid = max_added < 0 ? vs : (max_added >= vs || vs == 0 ? max_added + 1 : vs);
        if (nid >= TR_TOK_MAX_ID)
            return kerr(L, TR_ERANGE, key, "id %lld out of range", (long long)nid);
        *id = (int32_t)nid;
    }
    return 0;
}

// Entry i (f) as the record of id: a new record, or the one of an earlier entry with the
// same id, overwritten as HF's later entry wins.
static int store_added(lctx *L, tr_tokenizer *t, added_scratch *s, const tr_tok_added *f,
                       int32_t id, size_t i) {
    if (tr_tok_strmap_put(&t->added_vocab, f->content, f->len, id, L->err)) return -1;
    int32_t r = tr_tok_strmap_get(&s->rec_of_id, &id, sizeof id);
    if (r < 0) {
        r = t->n_added++;
        if (tr_tok_strmap_put(&s->rec_of_id, &id, sizeof id, r, L->err)) return -1;
    } else {
        free(t->added[r].content);
    }
    tr_tok_added *a = &t->added[r];
    *a = *f;
    a->id = id;
    a->content = malloc(f->len + 1);
    if (!a->content) return tr_errf(L->err, TR_ENOMEM, "out of memory");
    memcpy(a->content, f->content, f->len);
    a->content[f->len] = '\0';
    if (tr_tok_strmap_get(&s->special_set, f->content, f->len) < 0) s->added_list[s->n_plain++] = i;
    return 0;
}

// Entry e, the i-th of the list: read, noted as special, given its id and stored.
static int add_entry(lctx *L, tr_tokenizer *t, added_scratch *s, const tr_json *e, size_t i,
                     int32_t *max_id) {
    char key[64];
    snprintf(key, sizeof key, "added_tokens[%zu]", i);
    tr_tok_added *f = &s->flags[i];
    if (read_added(L, e, key, f)) return -1;
    if (f->len == 0) return 0;
    if (f->special && tr_tok_strmap_get(&s->special_set, f->content, f->len) < 0) {
        s->special_list[s->n_special++] = i;
        if (tr_tok_strmap_put(&s->special_set, f->content, f->len, 1, L->err)) return -1;
    }
    int32_t id;
    bool repeat;
    if (added_id(L, t, s, f, key, &id, &repeat)) return -1;
    if (repeat) return 0;
    if (id > s->max_added) s->max_added = id;
    if (id > *max_id) *max_id = id;
    return store_added(L, t, s, f, id, i);
}

// Fills the tries encode finds added tokens with: special entries first, then the others,
// each in file order; a normalized token goes in by its normalized text.
static int build_added_tries(lctx *L, tr_tokenizer *t, const added_scratch *s) {
    if (tr_tok_trie_init(&t->trie_raw, L->err) || tr_tok_trie_init(&t->trie_norm, L->err))
        return -1;
    for (size_t k = 0; k < s->n_special + s->n_plain; k++) {
        const tr_tok_added *f =
            &s->flags[k < s->n_special ? s->special_list[k] : s->added_list[k - s->n_special]];
        int32_t id = tr_tok_strmap_get(&t->added_vocab, f->content, f->len);
        int32_t r = tr_tok_strmap_get(&s->rec_of_id, &id, sizeof id);
        if (!f->normalized) {
            if (tr_tok_trie_add(&t->trie_raw, f->content, f->len, r, L->err)) return -1;
            continue;
        }
        char *norm;
        size_t nlen;
        bool owned;
        if (tr_tok_normalize(t->norm, t->n_norm, f->content, f->len, &norm, &nlen, &owned, L->err))
            return -1;
        int rc = tr_tok_trie_add(&t->trie_norm, norm, nlen, r, L->err);
        if (owned) free(norm);
        if (rc) return -1;
    }
    return 0;
}

// Follows HF's AddedVocabulary::add_tokens, one token at a time in file order: a token
// already in the vocabulary keeps that id, a new one gets the next id after the model's
// vocabulary; the "id" written in the file is only checked for type, as HF only warns.
static int parse_added(lctx *L, tr_tokenizer *t, const tr_json *arr, int32_t *max_id) {
    if (tr_json_is_none(arr)) return 0;
    if (!tr_json_is(arr, TR_JSON_ARRAY)) return type_err(L, "added_tokens", "an array", arr);
    size_t n = (size_t)arr->count;
    if (n > TR_TOK_MAX_ID) return kerr(L, TR_ERANGE, "added_tokens", "too many entries (%zu)", n);
    if (tr_tok_strmap_init(&t->added_vocab, (uint32_t)n, L->err)) return -1;
    added_scratch s;
    int rc = added_scratch_init(L, t, &s, n);
    size_t i = 0;
    for (const tr_json *e = arr->child; e && rc == 0; e = e->next, i++)
        rc = add_entry(L, t, &s, e, i, max_id);
    // Special-ness is by content, as HF's special_tokens_set.
    for (int32_t r = 0; rc == 0 && r < t->n_added; r++) {
        tr_tok_added *a = &t->added[r];
        a->special = tr_tok_strmap_get(&s.special_set, a->content, a->len) >= 0;
    }
    if (rc == 0) rc = build_added_tries(L, t, &s);
    added_scratch_free(&s);
    return rc;
}

// ---- ids -> strings ----

static int build_id_tables(lctx *L, tr_tokenizer *t, int32_t max_id) {
    t->n_ids = max_id + 1;
    t->id_str = malloc((size_t)(t->n_ids ? t->n_ids : 1) * sizeof *t->id_str);
    t->id_bytes = malloc((size_t)(t->n_ids ? t->n_ids : 1) * sizeof *t->id_bytes);
    if (!t->id_str || !t->id_bytes) return tr_errf(L->err, TR_ENOMEM, "out of memory for %d ids", t->n_ids);
    t->special = calloc((size_t)(t->n_ids ? t->n_ids : 1), 1);
    if (!t->special) return tr_errf(L->err, TR_ENOMEM, "out of memory for %d ids", t->n_ids);
    for (int32_t i = 0; i < t->n_ids; i++) t->id_str[i] = t->id_bytes[i] = UINT64_MAX;
    for (int32_t r = 0; r < t->n_added; r++) t->special[t->added[r].id] = t->added[r].special;
    const tr_tok_strmap *m = &t->model_vocab;
    for (uint32_t i = 0; i < m->n; i++) {
        const tr_tok_strmap_entry *e = &m->entries[i];
        if (pool_add(t, m->pool + e->off, e->len, &t->id_str[e->val], L->err)) return -1;
    }
    // Added tokens win over the vocabulary; a normalized one reads as its normalized text,
    // which is what HF hands to the decoder.
    for (int32_t r = 0; r < t->n_added; r++) {
        const tr_tok_added *a = &t->added[r];
        char *s = a->content;
        size_t len = a->len;
        bool owned = false;
        if (a->normalized &&
            tr_tok_normalize(t->norm, t->n_norm, a->content, a->len, &s, &len, &owned, L->err))
            return -1;
        int rc = pool_add(t, s, len, &t->id_str[a->id], L->err);
        if (owned) free(s);
        if (rc) return -1;
    }
    // What the ByteLevel decoder emits per id: the bytes behind the byte-level characters, or
    // the token text itself when it has characters outside that alphabet.
    t->bytes_pool = malloc(t->str_pool_len + 1);
    if (!t->bytes_pool) return tr_errf(L->err, TR_ENOMEM, "out of memory for decode tables");
    for (int32_t i = 0; i < t->n_ids; i++) {
        uint64_t r = t->id_str[i];
        if (r == UINT64_MAX) continue;
        const char *s = t->str_pool + (r >> 32);
        size_t len = r & 0xffffffffu;
        long nb = tr_tok_bytelevel_unmap(s, len, t->bytes_pool + t->bytes_pool_len);
        if (nb < 0) {
            memcpy(t->bytes_pool + t->bytes_pool_len, s, len);
            nb = (long)len;
        }
        t->id_bytes[i] = (uint64_t)t->bytes_pool_len << 32 | (uint64_t)nb;
        t->bytes_pool_len += (size_t)nb;
    }
    return 0;
}

// ---- top level ----

static int parse_root(lctx *L, tr_tokenizer *t, const tr_json *root) {
    if (!tr_json_is(root, TR_JSON_OBJECT)) return type_err(L, "(top level)", "an object", root);
    const char *ver;
    size_t vlen;
    if (opt_string(L, root, "version", "tokenizer", &ver, &vlen)) return -1;
    if (ver && strcmp(ver, "1.0") != 0)
        return kerr(L, TR_EUNSUPPORTED, "version", "unknown tokenizer version '%s'", ver);
    static const char *unsupported_if_set[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const tr_json *v = tr_json_get(root, unsupported_if_set[i]);
        if (v && v->type != TR_JSON_NULL)
            return kerr(L, TR_EUNSUPPORTED, unsupported_if_set[i],
                        "must be null (troupe cuts and pads sequences itself)");
    }
    int32_t max_id = -1;
    if (parse_model(L, t, tr_json_get(root, "model"), &max_id)) return -1;
    if (parse_normalizer(L, t, tr_json_get(root, "normalizer"), "normalizer")) return -1;

    const tr_json *pt = tr_json_get(root, "pre_tokenizer");
    if (tr_json_is_none(pt))
        return kerr(L, TR_EUNSUPPORTED, "pre_tokenizer",
                    "missing; troupe supports byte-level BPE, which needs a ByteLevel pre-tokenizer");
    if (parse_pretok(L, t, pt, "pre_tokenizer")) return -1;
    for (int i = 0; i < t->n_pretok; i++)
        if ((t->pretok[i].kind == TR_TOK_BYTELEVEL) != (i == t->n_pretok - 1))
            return kerr(L, TR_EUNSUPPORTED, "pre_tokenizer",
                        "troupe supports byte-level BPE: exactly one ByteLevel step, as the last step");

    const tr_json *dec = tr_json_get(root, "decoder");
    if (dec && dec->type != TR_JSON_NULL) {
        if (!tr_json_is(dec, TR_JSON_OBJECT)) return type_err(L, "decoder", "an object or null", dec);
        const char *type;
        size_t tlen;
        if (req_string(L, dec, "type", "decoder", &type, &tlen)) return -1;
        if (strcmp(type, "ByteLevel") != 0)
            return kerr(L, TR_EUNSUPPORTED, "decoder.type",
                        "unsupported decoder '%s' (only ByteLevel)", type);
        t->decoder_bytelevel = true;
    }
    // The post-processor only adds tokens when add_special_tokens is true, which encode
    // never asks for, and trims offsets, which troupe does not report.
    const tr_json *pp = tr_json_get(root, "post_processor");
    if (pp && pp->type != TR_JSON_NULL && !tr_json_is(pp, TR_JSON_OBJECT))
        return type_err(L, "post_processor", "an object or null", pp);
    if (parse_added(L, t, tr_json_get(root, "added_tokens"), &max_id)) return -1;
    if (!t->trie_raw.nodes && (tr_tok_trie_init(&t->trie_raw, L->err) ||
                               tr_tok_trie_init(&t->trie_norm, L->err)))
        return -1;
    if (build_id_tables(L, t, max_id)) return -1;
    return tr_tok_cache_init(&t->cache, L->err);
}

int tr_tokenizer_load_json(tr_tokenizer **out, const char *json, size_t len, const char *name,
                           tr_err *err) {
    *out = NULL;
    tr_tok_unicode_init();
    lctx L = {.name = name ? name : "tokenizer.json", .err = err};
    // tokenizer.json files have always been read with repeated keys keeping the last value.
    tr_json_opts o = {.name = L.name, .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_DUP_LAST, .what = "invalid JSON: "};
    tr_json_doc doc;
    if (tr_json_parse_opts(&doc, json, len, &o, err)) return -1;
    tr_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        tr_json_free(&doc);
        return tr_errf(err, TR_ENOMEM, "out of memory loading %s", L.name);
    }
    t->unk_id = -1;
    int rc = parse_root(&L, t, doc.root);
    tr_json_free(&doc);
    if (rc) {
        tr_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int tr_tokenizer_load(tr_tokenizer **tok, const char *path, tr_err *err) {
    *tok = NULL;
    char *data;
    size_t len;
    if (tr_file_read(path, &data, &len, err)) return tr_err_wrap(err, "loading tokenizer");
    int rc = tr_tokenizer_load_json(tok, data, len, path, err);
    free(data);
    return rc;
}

void tr_tokenizer_free(tr_tokenizer *t) {
    if (!t) return;
    tr_tok_strmap_free(&t->bpe_vocab);
    tr_tok_strmap_free(&t->model_vocab);
    tr_tok_strmap_free(&t->added_vocab);
    tr_tok_pairmap_free(&t->merges);
    free(t->unk_token);
    free(t->id_str);
    free(t->str_pool);
    free(t->id_bytes);
    free(t->bytes_pool);
    free(t->special);
    for (int32_t r = 0; r < t->n_added; r++) free(t->added[r].content);
    free(t->added);
    tr_tok_trie_free(&t->trie_raw);
    tr_tok_trie_free(&t->trie_norm);
    tr_tok_cache_free(&t->cache);
    for (int i = 0; i < t->n_pretok; i++) pcre2_code_free(t->pretok[i].re);
    free(t);
}
