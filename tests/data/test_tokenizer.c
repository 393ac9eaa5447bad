// Tokenizer against Hugging Face tokenizers: for every fixture tokenizer (tools/
// make_tokenizer_fixtures.py) the ids of every fixture text must equal HF's
// encode(text, add_special_tokens=False).ids, decode must equal HF's decode (lossy UTF-8
// included), added-token ids must be the ones HF wrote, and encoding from several threads at
// once must give the same ids.
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "engine/file.h"
#include "tests/test.h"

static const char *NAMES[] = {"qwen2",      "llama3",           "gpt2",         "split_removed",
                              "split_prev", "split_next",       "split_contiguous", "split_invert",
                              "split_empty", "unk",             "unk_fused",    "no_unk",
                              "onig_classes"};

typedef struct lines {
    json_t **v;
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
        json_error_t je;
        json_t *j = json_loadb(p, n, JSON_ALLOW_NUL, &je);
        if (!j) fprintf(stderr, "%s: bad line %zu: %s\n", rel, L.n + 1, je.text);
        if (L.n == cap) {
            cap = cap ? cap * 2 : 256;
            L.v = realloc(L.v, cap * sizeof *L.v);
        }
        L.v[L.n++] = j;
        p += n + 1;
    }
    free(data);
    return L;
}

static void free_lines(lines *L) {
    for (size_t i = 0; i < L->n; i++) json_decref(L->v[i]);
    free(L->v);
}

static size_t ids_of(const json_t *arr, int32_t **out) {
    size_t n = json_array_size(arr);
    *out = malloc((n + 1) * sizeof **out);
    for (size_t i = 0; i < n; i++) (*out)[i] = (int32_t)json_integer_value(json_array_get(arr, i));
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
            const json_t *t = json_object_get(j->texts->v[i], "text");
            int32_t *got, *want;
            size_t n;
            tr_err err = {0};
            size_t nw = ids_of(json_object_get(j->ids->v[i], "ids"), &want);
            if (tr_tokenizer_encode(j->tok, json_string_value(t), json_string_length(t), &got, &n, &err) ||
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
        const json_t *t = json_object_get(texts->v[i], "text");
        want_text[i] = json_string_value(t);
        want_len[i] = json_string_length(t);
    }
    for (size_t k = 0; k < dec.n; k++) {
        const json_t *line = json_object_get(dec.v[k], "line");
        const json_t *t = json_object_get(dec.v[k], "text");
        if (line && (size_t)json_integer_value(line) < texts->n) {
            want_text[json_integer_value(line)] = json_string_value(t);
            want_len[json_integer_value(line)] = json_string_length(t);
        }
    }

    int enc_bad = 0, dec_bad = 0, roundtrips = 0;
    for (size_t i = 0; i < texts->n && i < ids.n; i++) {
        const json_t *t = json_object_get(texts->v[i], "text");
        const char *s = json_string_value(t);
        size_t slen = json_string_length(t);
        int32_t *want, *got = NULL;
        size_t nw = ids_of(json_object_get(ids.v[i], "ids"), &want), n = 0;
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
        const json_t *arr = json_object_get(dec.v[k], "ids");
        if (!arr) continue;
        n_rand++;
        const json_t *t = json_object_get(dec.v[k], "text");
        int32_t *ids_r;
        size_t n = ids_of(arr, &ids_r);
        char *back = NULL;
        size_t blen = 0;
        rc = tr_tokenizer_decode(tok, ids_r, n, &back, &blen, &err);
        if (rc || blen != json_string_length(t) || memcmp(back, json_string_value(t), blen) != 0) {
            if (rand_bad++ < 3)
                fprintf(stderr, "%s: random decode %zu: want '%s' got '%s'\n", name, k,
                        json_string_value(t), rc ? err.msg : back);
        }
        free(back);
        free(ids_r);
    }
    CHECKF(n_rand >= 40 && rand_bad == 0, "%s: %d of %d random decodes differ", name, rand_bad, n_rand);

    // Added-token ids as HF wrote them, through token_id and id_to_token.
    json_error_t je;
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/%s.json", name);
    json_t *root = json_load_file(tr_test_src(rel), 0, &je);
    CHECK(root != NULL);
    const json_t *added = json_object_get(root, "added_tokens");
    int32_t max_id = -1;
    for (size_t k = 0; k < json_array_size(added); k++) {
        const json_t *a = json_array_get(added, k);
        const char *content = json_string_value(json_object_get(a, "content"));
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id"));
        if (id > max_id) max_id = id;
        CHECKF(tr_tokenizer_token_id(tok, content) == id, "%s: id of '%s'", name, content);
        size_t len = 0;
        const char *s = tr_tokenizer_id_to_token(tok, id, &len);
        // A normalized added token reads back normalized (HF's id_to_token does the same).
        if (!json_is_true(json_object_get(a, "normalized")))
            CHECKF(s && len == strlen(content) && memcmp(s, content, len) == 0, "%s: token %d", name, id);
        CHECK(tr_tokenizer_is_special(tok, id) == json_is_true(json_object_get(a, "special")));
    }
    const json_t *vocab = json_object_get(json_object_get(root, "model"), "vocab");
    const char *key;
    const json_t *val;
    int vocab_bad = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        if (json_integer_value(val) > max_id) max_id = (int32_t)json_integer_value(val);
        if (tr_tokenizer_token_id(tok, key) != json_integer_value(val)) vocab_bad++;
    }
    CHECKF(vocab_bad == 0, "%s: %d vocab entries with a different id", name, vocab_bad);
    CHECK(tr_tokenizer_vocab_size(tok) == max_id + 1);
    CHECK(tr_tokenizer_token_id(tok, "surely-not-a-token-\xe2\x82\xac") == -1);
    json_decref(root);

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
        const json_t *t = json_object_get(dec.v[k], "text");
        int32_t *ids;
        size_t n = ids_of(json_object_get(dec.v[k], "ids"), &ids);
        char *back = NULL;
        size_t blen = 0;
        rc = tr_tokenizer_decode(tok, ids, n, &back, &blen, &err);
        if (rc || blen != json_string_length(t) || memcmp(back, json_string_value(t), blen) != 0) {
            if (bad++ < 3)
                fprintf(stderr, "%s: decode %zu: want '%s' got '%s'\n", name, k, json_string_value(t),
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
