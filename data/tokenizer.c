// Encode and decode, HF tokenizers' pipeline order: added tokens are cut out of the raw text,
// each remaining piece is normalized, normalized added tokens are cut out of that, then the
// pre-tokenizer steps split and byte-map it and BPE turns words into ids. Decode maps ids
// back through the byte-level table and repairs invalid UTF-8 as Rust's from_utf8_lossy.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

static void ctx_free(tr_tok_ctx *c) {
    pcre2_match_data_free(c->md);
    for (int i = 0; i <= TR_TOK_MAX_PRETOK; i++) free(c->levels[i].v);
    free(c->raw.v);
    free(c->shadow);
    free(c->prefix);
    free(c->sym);
    free(c->heap);
    free(c->ids);
}

static int encode_normalized(tr_tok_ctx *c, const char *s, size_t len, tr_tok_segs *segs) {
    const tr_tokenizer *t = c->tok;
    char *norm;
    size_t nlen;
    bool owned;
    if (tr_tok_normalize(t->norm, t->n_norm, s, len, &norm, &nlen, &owned, c->err)) return -1;
    int rc = 0;
    if (t->trie_norm.n > 1) {
        rc = tr_tok_added_split(t, &t->trie_norm, norm, nlen, segs, c->err);
        for (size_t k = 0; rc == 0 && k < segs->n; k++) {
            const tr_tok_seg *g = &segs->v[k];
            if (g->token >= 0) rc = tr_tok_push_id(c, t->added[g->token].id);
            else rc = tr_tok_pretokenize(c, 0, norm + g->start, g->end - g->start);
        }
    } else {
        rc = tr_tok_pretokenize(c, 0, norm, nlen);
    }
    if (owned) free(norm);
    return rc;
}

int tr_tokenizer_encode(const tr_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                        size_t *n, tr_err *err) {
    *ids = NULL;
    *n = 0;
    size_t bad = tr_tok_utf8_check(text, len);
    if (bad < len) return tr_errf(err, TR_EINVAL, "text is not valid UTF-8 at byte %zu", bad);
    tr_tok_ctx c = {.tok = tok, .err = err};
    tr_tok_segs outer = {0}, inner = {0};
    int rc = 0;
    // Match data is per call: encode runs on many threads over one tokenizer.
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md) rc = tr_errf(err, TR_ENOMEM, "out of memory");
    if (rc == 0 && tok->trie_raw.n > 1) {
        rc = tr_tok_added_split(tok, &tok->trie_raw, text, len, &outer, err);
        for (size_t k = 0; rc == 0 && k < outer.n; k++) {
            const tr_tok_seg *g = &outer.v[k];
            if (g->token >= 0) rc = tr_tok_push_id(&c, tok->added[g->token].id);
            else rc = encode_normalized(&c, text + g->start, g->end - g->start, &inner);
        }
    } else if (rc == 0 && len > 0) {
        rc = encode_normalized(&c, text, len, &inner);
    }
    free(outer.v);
    free(inner.v);
    if (rc == 0 && !c.ids) {
        c.ids = malloc(sizeof *c.ids);  // empty result: still a pointer the caller frees
        if (!c.ids) rc = tr_errf(err, TR_ENOMEM, "out of memory");
    }
    if (rc) {
        ctx_free(&c);
        return -1;
    }
    *ids = c.ids;
    *n = c.n_ids;
    c.ids = NULL;
    ctx_free(&c);
    return 0;
}

int tr_tokenizer_decode(const tr_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                        size_t *len, tr_err *err) {
    *text = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || tok->id_str[id] == UINT64_MAX)
            return tr_errf(err, TR_ERANGE, "id %d at position %zu is not in the vocabulary (size %d)",
                           (int)id, i, (int)tok->n_ids);
        uint64_t r = tok->decoder_bytelevel ? tok->id_bytes[id] : tok->id_str[id];
        total += (size_t)(r & 0xffffffffu) + 1;
    }
    if (!tok->decoder_bytelevel) {
        // No decoder: HF joins the token strings with spaces.
        char *out = malloc(total + 1);
        if (!out) return tr_errf(err, TR_ENOMEM, "out of memory decoding %zu ids", n);
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = tok->id_str[ids[i]];
            if (i) out[o++] = ' ';
            memcpy(out + o, tok->str_pool + (r >> 32), r & 0xffffffffu);
            o += r & 0xffffffffu;
        }
        out[o] = '\0';
        *text = out;
        if (len) *len = o;
        return 0;
    }
    uint8_t *raw = malloc(total + 1);
    char *out = total <= (SIZE_MAX - 1) / 3 ? malloc(3 * total + 1) : NULL;
    if (!raw || !out) {
        free(raw);
        free(out);
        return tr_errf(err, TR_ENOMEM, "out of memory decoding %zu ids", n);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = tok->id_bytes[ids[i]];
        memcpy(raw + o, tok->bytes_pool + (r >> 32), r & 0xffffffffu);
        o += r & 0xffffffffu;
    }
    size_t m = tr_tok_utf8_lossy(raw, o, out);
    out[m] = '\0';
    free(raw);
    *text = out;
    if (len) *len = m;
    return 0;
}

int32_t tr_tokenizer_token_id(const tr_tokenizer *tok, const char *token) {
    size_t len = strlen(token);
    int32_t id = tr_tok_strmap_get(&tok->added_vocab, token, len);
    return id >= 0 ? id : tr_tok_strmap_get(&tok->model_vocab, token, len);
}

int32_t tr_tokenizer_vocab_size(const tr_tokenizer *tok) { return tok->n_ids; }

const char *tr_tokenizer_id_to_token(const tr_tokenizer *tok, int32_t id, size_t *len) {
    if (id < 0 || id >= tok->n_ids || tok->id_str[id] == UINT64_MAX) return NULL;
    if (len) *len = tok->id_str[id] & 0xffffffffu;
    return tok->str_pool + (tok->id_str[id] >> 32);
}

bool tr_tokenizer_is_special(const tr_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->special[id];
}
