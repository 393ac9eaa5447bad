// Bad tokenizer.json input and bad arguments: a missing file, truncated or non-JSON text,
// wrong types, unknown model types and unsupported features must all fail with an error
// code and a message naming the file and the JSON key; forms HF accepts (no model.type,
// "#version" merge lines, dropout 0) must load and encode as the unmodified file does.
#include <jansson.h>

#include "data/tokenizer.h"
#include "engine/file.h"
#include "tests/test.h"

#define FIXTURE "tests/fixtures/tokenizer/qwen2.json"

static json_t *base;

typedef void (*mutate_fn)(json_t *root);

// Loads the fixture after mutate and checks the failure: code and substrings of the message.
static void expect_fail(const char *what, mutate_fn mutate, int code, const char *key,
                        const char *also) {
    json_t *root = json_deep_copy(base);
    mutate(root);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
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

static json_t *model(json_t *r) { return json_object_get(r, "model"); }
static json_t *split0(json_t *r) {
    return json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 0);
}

static void m_top_array(json_t *r) { json_object_clear(r); json_object_set_new(r, "model", json_array()); }
static void m_unigram(json_t *r) { json_object_set_new(model(r), "type", json_string("Unigram")); }
static void m_type_int(json_t *r) { json_object_set_new(model(r), "type", json_integer(5)); }
static void m_no_model(json_t *r) { json_object_del(r, "model"); }
static void m_vocab_array(json_t *r) { json_object_set_new(model(r), "vocab", json_array()); }
static void m_vocab_str(json_t *r) {
    json_object_set_new(json_object_get(model(r), "vocab"), "Troupe", json_string("x"));
}
static void m_vocab_neg(json_t *r) {
    json_object_set_new(json_object_get(model(r), "vocab"), "Troupe", json_integer(-1));
}
static void m_merges_obj(json_t *r) { json_object_set_new(model(r), "merges", json_object()); }
static void m_merge_int(json_t *r) {
    json_array_set_new(json_object_get(model(r), "merges"), 3, json_integer(7));
}
static void m_merge_spaces(json_t *r) {
    json_array_set_new(json_object_get(model(r), "merges"), 0, json_string("a b c"));
}
static void m_merge_unknown(json_t *r) {
    json_array_set_new(json_object_get(model(r), "merges"), 0, json_string("zzzq a"));
}
static void m_merge_triple(json_t *r) {
    json_t *t = json_pack("[sss]", "a", "b", "c");
    json_array_set_new(json_object_get(model(r), "merges"), 2, t);
}
static void m_lstrip_str(json_t *r) {
    json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 1), "lstrip",
                        json_string("yes"));
}
static void m_no_content(json_t *r) {
    json_object_del(json_array_get(json_object_get(r, "added_tokens"), 0), "content");
}
static void m_added_obj(json_t *r) { json_object_set_new(r, "added_tokens", json_object()); }
static void m_lowercase(json_t *r) {
    json_object_set_new(r, "normalizer", json_pack("{ss}", "type", "Lowercase"));
}
static void m_regex_int(json_t *r) {
    json_object_set_new(json_object_get(split0(r), "pattern"), "Regex", json_integer(5));
}
static void m_regex_bad(json_t *r) {
    json_object_set_new(json_object_get(split0(r), "pattern"), "Regex", json_string("(ab"));
}
static void m_behavior(json_t *r) { json_object_set_new(split0(r), "behavior", json_string("Sideways")); }
static void m_no_pretok(json_t *r) { json_object_set_new(r, "pre_tokenizer", json_null()); }
static void m_bytelevel_first(json_t *r) {
    json_t *seq = json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers");
    json_t *split = json_incref(json_array_get(seq, 0));
    json_array_remove(seq, 0);
    json_array_append_new(seq, split);
}
static void m_metaspace(json_t *r) {
    json_t *seq = json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers");
    json_array_insert_new(seq, 1, json_pack("{ss}", "type", "Metaspace"));
}
static void m_decoder(json_t *r) { json_object_set_new(r, "decoder", json_pack("{ss}", "type", "WordPiece")); }
static void m_truncation(json_t *r) {
    json_object_set_new(r, "truncation", json_pack("{si}", "max_length", 512));
}
static void m_byte_fallback(json_t *r) { json_object_set_new(model(r), "byte_fallback", json_true()); }
static void m_dropout(json_t *r) { json_object_set_new(model(r), "dropout", json_real(0.1)); }
static void m_version(json_t *r) { json_object_set_new(r, "version", json_string("2.0")); }
static void m_prefix(json_t *r) {
    json_object_set_new(model(r), "continuing_subword_prefix", json_string("##"));
}

// Accepted variations: the same ids as the unmodified fixture.
static void m_no_type(json_t *r) { json_object_del(model(r), "type"); }
static void m_version_line(json_t *r) {
    json_array_insert_new(json_object_get(model(r), "merges"), 0, json_string("#version: 0.2"));
}
static void m_dropout_zero(json_t *r) { json_object_set_new(model(r), "dropout", json_real(0.0)); }

static void expect_same(const char *what, mutate_fn mutate, const tr_tokenizer *ref) {
    json_t *root = json_deep_copy(base);
    mutate(root);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
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

    json_error_t je;
    base = json_loadb(data, len, 0, &je);
    CHECK(base != NULL);

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
    json_decref(base);
    free(data);
    return tr_test_summary("test_tokenizer_errors");
}
