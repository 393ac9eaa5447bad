// Tokenizer against Hugging Face tokenizers: for every fixture tokenizer (tools/
// make_tokenizer_fixtures.py) the ids of every fixture text must equal HF's
// encode(text, add_special_tokens=False).ids, decode must equal HF's decode (lossy UTF-8
// included), added-token ids must be the ones HF wrote, and encoding from several threads at
// once must give the same ids.
#include <pthread.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "engine/file.h"
#include "tests/json_get.h"
#include "tests/test.h"

static const char *NAMES[] = {"qwen2",      "llama3",           "gpt2",         "split_removed",
                              "split_prev", "split_next",       "split_contiguous", "split_invert",
                              "split_empty", "unk",             "unk_fused",    "no_unk",
                              "onig_classes"};

typedef struct lines {
    tr_json_doc *docs;
    const tr_json **v;
    size_t n;
} lines;

static lines read_jsonl(const char *rel) {
    lines L = {0};
    char *data;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(tr_test_src(rel), &data, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return L;
    }
    size_t cap = 0;
    char *p = data;
    while (p < data + len) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        if (L.n == cap) {
            cap = cap ? cap * 2 : 256;
            L.v = realloc(L.v, cap * sizeof *L.v);
            L.docs = realloc(L.docs, cap * sizeof *L.docs);
        }
        if (tj_parse(&L.docs[L.n], p, n, rel, &err))
            fprintf(stderr, "%s: bad line %zu: %s\n", rel, L.n + 1, err.msg);
        L.v[L.n] = L.docs[L.n].root;
        L.n++;
        p += n + 1;
    }
    free(data);
    return L;
}

static void free_lines(lines *L) {
    for (size_t i = 0; i < L->n; i++) tr_json_free(&L->docs[i]);
    free(L->docs);
    free(L->v);
}

static size_t ids_of(const tr_json *arr, int32_t **out) {
    size_t n = tj_size(arr);
    *out = malloc((n + 1) * sizeof **out);
    size_t i = 0;
    for (const tr_json *v = n ? arr->child : NULL; v; v = v->next) (*out)[i++] = (int32_t)tj_int(v);
    return n;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

typedef struct job {
    const tr_tokenizer *tok;
    const lines *texts;
    const lines *ids;
    int start;
    int mismatches;
} job;

static void *encode_all(void *arg) {
    job *j = arg;
    for (int round = 0; round < 3; round++) {
        for (size_t i = (size_t)j->start; i < j->texts->n; i++) {
            const tr_json *t = tr_json_get(j->texts->v[i], "text");
            int32_t *got, *want;
            size_t n;
            tr_err err = {0};
            size_t nw = ids_of(tr_json_get(j->ids->v[i], "ids"), &want);
            if (tr_tokenizer_encode(j->tok, tj_str(t), tj_len(t), &got, &n, &err) ||
                n != nw || memcmp(got, want, n * sizeof *got) != 0)
                j->mismatches++;
            free(got);
            free(want);
        }
    }
    return NULL;
}

static void check_tokenizer(const char *name, const lines *texts) {
    char path[4200], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.json", name);
    snprintf(path, sizeof path, "%s", tr_test_src(rel));
    tr_tokenizer *tok = NULL;
    tr_err err = {0};
    int rc = tr_tokenizer_load(&tok, path, &err);
    CHECKF(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;

    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.ids.jsonl", name);
    lines ids = read_jsonl(rel);
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.decode.jsonl", name);
    lines dec = read_jsonl(rel);
    CHECKF(ids.n == texts->n, "%s: %zu id lines for %zu texts", name, ids.n, texts->n);

    // Expected decode of each text's ids: the text itself unless HF's differs.
    const char **want_text = calloc(texts->n, sizeof *want_text);
    size_t *want_len = calloc(texts->n, sizeof *want_len);
    for (size_t i = 0; i < texts->n; i++) {
        const tr_json *t = tr_json_get(texts->v[i], "text");
        want_text[i] = tj_str(t);
        want_len[i] = tj_len(t);
    }
    for (size_t k = 0; k < dec.n; k++) {
        const tr_json *line = tr_json_get(dec.v[k], "line");
        const tr_json *t = tr_json_get(dec.v[k], "text");
        if (line && (size_t)tj_int(line) < texts->n) {
            want_text[tj_int(line)] = tj_str(t);
            want_len[tj_int(line)] = tj_len(t);
        }
    }

    int enc_bad = 0, dec_bad = 0, roundtrips = 0;
    for (size_t i = 0; i < texts->n && i < ids.n; i++) {
        const tr_json *t = tr_json_get(texts->v[i], "text");
        const char *s = tj_str(t);
        size_t slen = tj_len(t);
        int32_t *want, *got = NULL;
        size_t nw = ids_of(tr_json_get(ids.v[i], "ids"), &want), n = 0;
        rc = tr_tokenizer_encode(tok, s, slen, &got, &n, &err);
        if (rc || n != nw || memcmp(got, want, n * sizeof *got) != 0) {
            if (enc_bad++ < 5) {
                fprintf(stderr, "%s: text %zu '%.60s' (%zu bytes): %s\n", name, i, s, slen,
                        rc ? err.msg : "ids differ");
                print_ids("want", want, nw);
                if (!rc) print_ids("got ", got, n);
            }
        }
        char *back = NULL;
        size_t blen = 0;
        rc = tr_tokenizer_decode(tok, want, nw, &back, &blen, &err);
        if (rc || blen != want_len[i] || memcmp(back, want_text[i], blen) != 0) {
            if (dec_bad++ < 5)
                fprintf(stderr, "%s: decode of text %zu: %s\n  want '%.80s'\n  got  '%.80s'\n", name,
                        i, rc ? err.msg : "differs", want_text[i], rc ? "" : back);
        }
        // Round trip where HF's own decode gives the text back.
        if (rc == 0 && want_text[i] == s) {
            char *rt = NULL;
            size_t rlen = 0;
            roundtrips++;
            if (got && tr_tokenizer_decode(tok, got, n, &rt, &rlen, &err) == 0)
                CHECKF(rlen == slen && memcmp(rt, s, slen) == 0, "%s: round trip of text %zu", name, i);
            free(rt);
        }
        free(back);
        free(got);
        free(want);
    }
    CHECKF(enc_bad == 0, "%s: %d of %zu texts encode differently from HF", name, enc_bad, texts->n);
    CHECKF(dec_bad == 0, "%s: %d of %zu decodes differ from HF", name, dec_bad, texts->n);
    CHECKF(roundtrips > 0, "%s: no round trips checked", name);

    // Random id sequences (invalid UTF-8 in the middle included).
    int rand_bad = 0, n_rand = 0;
    for (size_t k = 0; k < dec.n; k++) {
        const tr_json *arr = tr_json_get(dec.v[k], "ids");
        if (!arr) continue;
        n_rand++;
        const tr_json *t = tr_json_get(dec.v[k], "text");
        int32_t *ids_r;
        size_t n = ids_of(arr, &ids_r);
        char *back = NULL;
        size_t blen = 0;
        rc = tr_tokenizer_decode(tok, ids_r, n, &back, &blen, &err);
        if (rc || blen != tj_len(t) || memcmp(back, tj_str(t), blen) != 0) {
            if (rand_bad++ < 3)
                fprintf(stderr, "%s: random decode %zu: want '%s' got '%s'\n", name, k,
                        tj_str(t), rc ? err.msg : back);
        }
        free(back);
        free(ids_r);
    }
    CHECKF(n_rand >= 40 && rand_bad == 0, "%s: %d of %d random decodes differ", name, rand_bad, n_rand);

    // Added-token ids as HF wrote them, through token_id and id_to_token.
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.json", name);
    tr_json_doc doc;
    CHECKF(tj_load(&doc, tr_test_src(rel), &err) == 0, "%s", err.msg);
    const tr_json *root = doc.root;
    const tr_json *added = tr_json_get(root, "added_tokens");
    int32_t max_id = -1;
    for (size_t k = 0; k < tj_size(added); k++) {
        const tr_json *a = tj_at(added, k);
        const char *content = tj_str(tr_json_get(a, "content"));
        int32_t id = (int32_t)tj_int(tr_json_get(a, "id"));
        if (id > max_id) max_id = id;
        CHECKF(tr_tokenizer_token_id(tok, content) == id, "%s: id of '%s'", name, content);
        size_t len = 0;
        const char *s = tr_tokenizer_id_to_token(tok, id, &len);
        // A normalized added token reads back normalized (HF's id_to_token does the same).
        if (!tj_true(tr_json_get(a, "normalized")))
            CHECKF(s && len == strlen(content) && memcmp(s, content, len) == 0, "%s: token %d", name, id);
        CHECK(tr_tokenizer_is_special(tok, id) == tj_true(tr_json_get(a, "special")));
    }
    const tr_json *vocab = tr_json_get(tr_json_get(root, "model"), "vocab");
    const char *key;
    const tr_json *val;
    int vocab_bad = 0;
    for (val = vocab ? vocab->child : NULL; val; val = val->next) {
        key = val->key;
        if (tj_int(val) > max_id) max_id = (int32_t)tj_int(val);
        if (tr_tokenizer_token_id(tok, key) != tj_int(val)) vocab_bad++;
    }
    CHECKF(vocab_bad == 0, "%s: %d vocab entries with a different id", name, vocab_bad);
    CHECK(tr_tokenizer_vocab_size(tok) == max_id + 1);
    CHECK(tr_tokenizer_token_id(tok, "surely-not-a-token-\xe2\x82\xac") == -1);
    tr_json_free(&doc);

    // The same tokenizer from four threads at once.
    if (strcmp(name, "qwen2") == 0 || strcmp(name, "llama3") == 0) {
        pthread_t th[4];
        job jobs[4];
        for (int k = 0; k < 4; k++) {
            jobs[k] = (job){.tok = tok, .texts = texts, .ids = &ids, .start = k * 13};
            pthread_create(&th[k], NULL, encode_all, &jobs[k]);
        }
        int bad = 0;
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            bad += jobs[k].mismatches;
        }
        CHECKF(bad == 0, "%s: %d mismatches when encoding from 4 threads", name, bad);
    }

    free(want_text);
    free(want_len);
    free_lines(&ids);
    free_lines(&dec);
    tr_tokenizer_free(tok);
}

// A tokenizer without a decoder: HF joins the token strings with spaces.
static void check_decode_only(const char *name) {
    char path[4200], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.json", name);
    snprintf(path, sizeof path, "%s", tr_test_src(rel));
    tr_tokenizer *tok = NULL;
    tr_err err = {0};
    int rc = tr_tokenizer_load(&tok, path, &err);
    CHECKF(rc == 0, "%s: %s", name, err.msg);
    if (rc) return;
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.decode.jsonl", name);
    lines dec = read_jsonl(rel);
    int bad = 0;
    for (size_t k = 0; k < dec.n; k++) {
        const tr_json *t = tr_json_get(dec.v[k], "text");
        int32_t *ids;
        size_t n = ids_of(tr_json_get(dec.v[k], "ids"), &ids);
        char *back = NULL;
        size_t blen = 0;
        rc = tr_tokenizer_decode(tok, ids, n, &back, &blen, &err);
        if (rc || blen != tj_len(t) || memcmp(back, tj_str(t), blen) != 0) {
            if (bad++ < 3)
                fprintf(stderr, "%s: decode %zu: want '%s' got '%s'\n", name, k, tj_str(t),
                        rc ? err.msg : back);
        }
        free(back);
        free(ids);
    }
    CHECKF(dec.n >= 60 && bad == 0, "%s: %d of %zu decodes differ", name, bad, dec.n);
    free_lines(&dec);
    tr_tokenizer_free(tok);
}

int main(void) {
    lines texts = read_jsonl("tests/fixtures/tokenizer/texts.jsonl");
    CHECKF(texts.n > 200, "%zu texts", texts.n);
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) check_tokenizer(NAMES[i], &texts);
    check_decode_only("no_decoder");
    free_lines(&texts);
    return tr_test_summary("test_tokenizer");
}
