// Bad tokenizer.json input and bad arguments: a missing file, truncated or non-JSON text,
// wrong types, unknown model types and unsupported features must all fail with an error
// code and a message naming the file and the JSON key; forms HF accepts (no model.type,
// "#version" merge lines, dropout 0) must load and encode as the unmodified file does.
#include "data/tokenizer.h"
#include "engine/file.h"
#include "engine/json.h"
#include "tests/test.h"

#define FIXTURE "tests/fixtures/tokenizer/qwen2.json"

static const char *fixture_text;
static size_t fixture_len;

// Each case edits a fresh parse of the fixture in place (the tree is read-only to library
// code, but its nodes are plain structs); new values are parsed from snippets of JSON text
// into docs that live until the case is written out.
static tr_json_doc docs[8];
static int n_docs;

static tr_json *snippet(const char *json) {
    tr_err err = {0};
    CHECKF(n_docs < 8 && tr_json_parse(&docs[n_docs], json, strlen(json), "snippet", &err) == 0,
           "%s", err.msg);
    return (tr_json *)docs[n_docs++].root;
}

static tr_json *M(const tr_json *v) { return (tr_json *)v; }

// Gives v the snippet's value, keeping v's key and place.
static void set_value(const tr_json *v, const char *json) {
    tr_json *d = M(v), *src = snippet(json), *next = d->next;
    const char *key = d->key;
    size_t key_len = d->key_len;
    *d = *src;
    d->next = next;
    d->key = key;
    d->key_len = key_len;
}

// Links n into parent's list at index i (-1: at the end).
static void link_at(const tr_json *parent, int i, tr_json *n) {
    tr_json **at = &M(parent)->child;
    while (*at && i-- != 0) at = &(*at)->next;
    n->next = *at;
    *at = n;
    M(parent)->count++;
}

// Unlinks element i (or the member named key) from parent's list and returns it.
static tr_json *unlink_at(const tr_json *parent, int i, const char *key) {
    tr_json **at = &M(parent)->child;
    while (*at && (key ? strcmp((*at)->key, key) != 0 : i-- != 0)) at = &(*at)->next;
    tr_json *n = *at;
    if (n) {
        *at = n->next;
        M(parent)->count--;
    }
    return n;
}

static void set(const tr_json *obj, const char *key, const char *json) {
    const tr_json *v = tr_json_get(obj, key);
    if (v) {
        set_value(v, json);
        return;
    }
    tr_json *n = snippet(json);
    n->key = key;
    n->key_len = strlen(key);
    link_at(obj, -1, n);
}

static void insert(const tr_json *arr, int i, const char *json) { link_at(arr, i, snippet(json)); }

typedef void (*mutate_fn)(const tr_json *root);

// The fixture after mutate, as compact JSON text (caller frees).
static char *mutated(mutate_fn mutate) {
    n_docs = 0;
    tr_json_doc root;
    tr_err err = {0};
    CHECKF(tr_json_parse(&root, fixture_text, fixture_len, FIXTURE, &err) == 0, "%s", err.msg);
    mutate(root.root);
    tr_json_writer w;
    tr_json_writer_init(&w, 0);
    tr_json_value(&w, root.root);
    const char *out;
    size_t len;
    char *text = NULL;
    if (tr_json_writer_finish(&w, &out, &len, &err) == 0) text = strdup(out);
    CHECKF(text != NULL, "%s", err.msg);
    tr_json_writer_free(&w);
    tr_json_free(&root);
    for (int i = 0; i < n_docs; i++) tr_json_free(&docs[i]);
    return text ? text : strdup("");
}

// Loads the fixture after mutate and checks the failure: code and substrings of the message.
static void expect_fail(const char *what, mutate_fn mutate, int code, const char *key,
                        const char *also) {
    char *text = mutated(mutate);
    tr_tokenizer *tok = NULL;
    tr_err err = {0};
    int rc = tr_tokenizer_load_json(&tok, text, strlen(text), "bad.json", &err);
    CHECKF(rc == -1 && tok == NULL, "%s: loaded", what);
    CHECKF(err.code == code, "%s: code %s, wanted %s (%s)", what, tr_err_code_name(err.code),
           tr_err_code_name(code), err.msg);
    CHECKF(strncmp(err.msg, "bad.json: ", 10) == 0, "%s: message does not name the file: %s", what,
           err.msg);
    CHECKF(strstr(err.msg, key) != NULL, "%s: message does not name %s: %s", what, key, err.msg);
    if (also) CHECKF(strstr(err.msg, also) != NULL, "%s: no '%s' in: %s", what, also, err.msg);
    tr_tokenizer_free(tok);
    free(text);
}

static const tr_json *model(const tr_json *r) { return tr_json_get(r, "model"); }
static const tr_json *pretoks(const tr_json *r) {
    return tr_json_get(tr_json_get(r, "pre_tokenizer"), "pretokenizers");
}
static const tr_json *split0(const tr_json *r) { return tr_json_at(pretoks(r), 0); }

static void m_top_array(const tr_json *r) {
    M(r)->child = NULL;
    M(r)->count = 0;
    set(r, "model", "[]");
}
static void m_unigram(const tr_json *r) { set(model(r), "type", "\"Unigram\""); }
static void m_type_int(const tr_json *r) { set(model(r), "type", "5"); }
static void m_no_model(const tr_json *r) { unlink_at(r, 0, "model"); }
static void m_vocab_array(const tr_json *r) { set(model(r), "vocab", "[]"); }
static void m_vocab_str(const tr_json *r) { set(tr_json_get(model(r), "vocab"), "Troupe", "\"x\""); }
static void m_vocab_neg(const tr_json *r) { set(tr_json_get(model(r), "vocab"), "Troupe", "-1"); }
static void m_merges_obj(const tr_json *r) { set(model(r), "merges", "{}"); }
static void m_merge_int(const tr_json *r) { set_value(tr_json_at(tr_json_get(model(r), "merges"), 3), "7"); }
static void m_merge_spaces(const tr_json *r) {
    set_value(tr_json_at(tr_json_get(model(r), "merges"), 0), "\"a b c\"");
}
static void m_merge_unknown(const tr_json *r) {
    set_value(tr_json_at(tr_json_get(model(r), "merges"), 0), "\"zzzq a\"");
}
static void m_merge_triple(const tr_json *r) {
    set_value(tr_json_at(tr_json_get(model(r), "merges"), 2), "[\"a\", \"b\", \"c\"]");
}
static void m_lstrip_str(const tr_json *r) {
    set(tr_json_at(tr_json_get(r, "added_tokens"), 1), "lstrip", "\"yes\"");
}
static void m_no_content(const tr_json *r) {
    unlink_at(tr_json_at(tr_json_get(r, "added_tokens"), 0), 0, "content");
}
static void m_added_obj(const tr_json *r) { set(r, "added_tokens", "{}"); }
static void m_lowercase(const tr_json *r) { set(r, "normalizer", "{\"type\": \"Lowercase\"}"); }
static void m_regex_int(const tr_json *r) { set(tr_json_get(split0(r), "pattern"), "Regex", "5"); }
static void m_regex_bad(const tr_json *r) { set(tr_json_get(split0(r), "pattern"), "Regex", "\"(ab\""); }
static void m_behavior(const tr_json *r) { set(split0(r), "behavior", "\"Sideways\""); }
static void m_no_pretok(const tr_json *r) { set(r, "pre_tokenizer", "null"); }
static void m_bytelevel_first(const tr_json *r) { link_at(pretoks(r), -1, unlink_at(pretoks(r), 0, NULL)); }
static void m_metaspace(const tr_json *r) { insert(pretoks(r), 1, "{\"type\": \"Metaspace\"}"); }
static void m_decoder(const tr_json *r) { set(r, "decoder", "{\"type\": \"WordPiece\"}"); }
static void m_truncation(const tr_json *r) { set(r, "truncation", "{\"max_length\": 512}"); }
static void m_byte_fallback(const tr_json *r) { set(model(r), "byte_fallback", "true"); }
static void m_dropout(const tr_json *r) { set(model(r), "dropout", "0.1"); }
static void m_version(const tr_json *r) { set(r, "version", "\"2.0\""); }
static void m_prefix(const tr_json *r) { set(model(r), "continuing_subword_prefix", "\"##\""); }
static void m_no_type(const tr_json *r) { unlink_at(model(r), 0, "type"); }
static void m_version_line(const tr_json *r) { insert(tr_json_get(model(r), "merges"), 0, "\"#version: 0.2\""); }
static void m_dropout_zero(const tr_json *r) { set(model(r), "dropout", "0.0"); }

static void expect_same(const char *what, mutate_fn mutate, const tr_tokenizer *ref) {
    char *text = mutated(mutate);
    tr_tokenizer *tok = NULL;
    tr_err err = {0};
    int rc = tr_tokenizer_load_json(&tok, text, strlen(text), "ok.json", &err);
    CHECKF(rc == 0, "%s: %s", what, err.msg);
    const char *s = "It's 12345 caf\xc3\xa9s <|im_start|>\n\n  x";
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    if (rc == 0) {
        CHECK(tr_tokenizer_encode(ref, s, strlen(s), &a, &na, &err) == 0);
        CHECK(tr_tokenizer_encode(tok, s, strlen(s), &b, &nb, &err) == 0);
        CHECKF(na == nb && na > 0 && memcmp(a, b, na * sizeof *a) == 0, "%s: ids differ", what);
    }
    free(a);
    free(b);
    free(text);
    tr_tokenizer_free(tok);
}

int main(void) {
    tr_err err = {0};
    tr_tokenizer *tok = NULL;

    // Missing file: I/O error naming the path.
    CHECK(tr_tokenizer_load(&tok, "/nonexistent/dir/tokenizer.json", &err) == -1 && !tok);
    CHECK(err.code == TR_EIO);
    CHECKF(strstr(err.msg, "/nonexistent/dir/tokenizer.json") != NULL, "%s", err.msg);

    char *data = NULL;
    size_t len = 0;
    CHECKF(tr_file_read(tr_test_src(FIXTURE), &data, &len, &err) == 0, "%s", err.msg);
    if (!data) return tr_test_summary("test_tokenizer_errors");

    // Truncated JSON at many points: a format error with line and column.
    for (int k = 0; k < 12; k++) {
        size_t cut = k == 0 ? 0 : len * (size_t)k / 12;
        tr_err e2 = {0};
        CHECK(tr_tokenizer_load_json(&tok, data, cut, "cut.json", &e2) == -1 && !tok);
        CHECKF(e2.code == TR_EFORMAT && strstr(e2.msg, "cut.json:1:") && strstr(e2.msg, "invalid JSON"),
               "cut at %zu: %s", cut, e2.msg);
    }
    CHECK(tr_tokenizer_load_json(&tok, "not json", 8, "x.json", &err) == -1 && err.code == TR_EFORMAT);

    fixture_text = data;
    fixture_len = len;

    expect_fail("top-level model array", m_top_array, TR_EFORMAT, "model", "expected an object");
    expect_fail("unknown model type", m_unigram, TR_EUNSUPPORTED, "model.type", "Unigram");
    expect_fail("model type not a string", m_type_int, TR_EFORMAT, "model.type", "expected a string");
    expect_fail("no model", m_no_model, TR_EFORMAT, "model", "got nothing");
    expect_fail("vocab array", m_vocab_array, TR_EFORMAT, "model.vocab", "expected an object");
    expect_fail("vocab string id", m_vocab_str, TR_EFORMAT, "model.vocab[\"Troupe\"]", "integer");
    expect_fail("vocab negative id", m_vocab_neg, TR_ERANGE, "model.vocab[\"Troupe\"]", "-1");
    expect_fail("merges object", m_merges_obj, TR_EFORMAT, "model.merges", "expected an array");
    expect_fail("merge integer", m_merge_int, TR_EFORMAT, "model.merges[3]", "got an integer");
    expect_fail("merge with two spaces", m_merge_spaces, TR_EFORMAT, "model.merges[0]", "one space");
    expect_fail("merge not in vocab", m_merge_unknown, TR_EFORMAT, "model.merges[0]", "'zzzq'");
    expect_fail("merge triple", m_merge_triple, TR_EFORMAT, "model.merges[2]", "pair");
    expect_fail("lstrip string", m_lstrip_str, TR_EFORMAT, "added_tokens[1].lstrip", "boolean");
    expect_fail("no content", m_no_content, TR_EFORMAT, "added_tokens[0].content", "string");
    expect_fail("added_tokens object", m_added_obj, TR_EFORMAT, "added_tokens", "an array");
    expect_fail("Lowercase normalizer", m_lowercase, TR_EUNSUPPORTED, "normalizer", "Lowercase");
    expect_fail("regex integer", m_regex_int, TR_EFORMAT, "pre_tokenizer.pretokenizers[0].pattern.Regex",
                "a string");
    expect_fail("bad regex", m_regex_bad, TR_EINVAL, "pre_tokenizer.pretokenizers[0].pattern.Regex",
                "bad pattern");
    expect_fail("bad behavior", m_behavior, TR_EFORMAT, "pre_tokenizer.pretokenizers[0].behavior",
                "Sideways");
    expect_fail("no pre-tokenizer", m_no_pretok, TR_EUNSUPPORTED, "pre_tokenizer", "ByteLevel");
    expect_fail("ByteLevel not last", m_bytelevel_first, TR_EUNSUPPORTED, "pre_tokenizer", "last");
    expect_fail("Metaspace", m_metaspace, TR_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1]", "Metaspace");
    expect_fail("WordPiece decoder", m_decoder, TR_EUNSUPPORTED, "decoder.type", "WordPiece");
    expect_fail("truncation", m_truncation, TR_EUNSUPPORTED, "truncation", "null");
    expect_fail("byte_fallback", m_byte_fallback, TR_EUNSUPPORTED, "model.byte_fallback", NULL);
    expect_fail("dropout", m_dropout, TR_EUNSUPPORTED, "model.dropout", NULL);
    expect_fail("version", m_version, TR_EUNSUPPORTED, "version", "2.0");
    expect_fail("subword prefix", m_prefix, TR_EUNSUPPORTED, "model.continuing_subword_prefix", "##");

    tr_tokenizer *ref = NULL;
    CHECKF(tr_tokenizer_load_json(&ref, data, len, FIXTURE, &err) == 0, "%s", err.msg);
    if (ref) {
        expect_same("no model.type", m_no_type, ref);
        expect_same("#version merge line", m_version_line, ref);
        expect_same("dropout 0", m_dropout_zero, ref);

        // Encode refuses invalid UTF-8 and names the offset; decode refuses unknown ids.
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tr_tokenizer_encode(ref, "abc\xff", 4, &ids, &n, &err) == -1 && ids == NULL);
        CHECKF(err.code == TR_EINVAL && strstr(err.msg, "byte 3"), "%s", err.msg);
        CHECK(tr_tokenizer_encode(ref, "a\xed\xa0\x80", 4, &ids, &n, &err) == -1);  // surrogate
        CHECK(tr_tokenizer_encode(ref, "\xc3", 1, &ids, &n, &err) == -1);           // cut short
        int32_t bad[] = {5, tr_tokenizer_vocab_size(ref)};
        char *text = NULL;
        CHECK(tr_tokenizer_decode(ref, bad, 2, &text, NULL, &err) == -1 && text == NULL);
        CHECKF(err.code == TR_ERANGE && strstr(err.msg, "position 1"), "%s", err.msg);
        bad[1] = -1;
        CHECK(tr_tokenizer_decode(ref, bad, 2, &text, NULL, &err) == -1 && err.code == TR_ERANGE);
        // Empty input: no ids, and an empty string back.
        CHECK(tr_tokenizer_encode(ref, "", 0, &ids, &n, &err) == 0 && n == 0 && ids != NULL);
        free(ids);
        size_t tl = 99;
        CHECK(tr_tokenizer_decode(ref, NULL, 0, &text, &tl, &err) == 0 && tl == 0 && text[0] == '\0');
        free(text);
        tr_tokenizer_free(ref);
    }
    free(data);
    return tr_test_summary("test_tokenizer_errors");
}
