// JSON reader and writer against RFC 8259: accepted and rejected inputs in the style of
// JSONTestSuite (y_/n_ cases), exact number readings, \u escapes and surrogate pairs as the
// RFC defines them (U+1F600 is F0 9F 98 80 in UTF-8), positions, and writer round trips
// whose float texts match Python's repr (the shortest round-tripping form); the data-file
// rules (repeated keys, \u0000, 64-bit integers, depth) and the data-layer output style.
#include "engine/json.h"
#include "tests/test.h"

static int parses(const char *text) {
    tr_json_doc doc;
    tr_err err = {0};
    int rc = tr_json_parse(&doc, text, strlen(text), "t.json", &err);
    if (rc == 0) tr_json_free(&doc);
    return rc == 0;
}

// Must fail, with "t.json:LINE:COL:" naming where.
static void check_reject(const char *text, const char *where) {
    tr_json_doc doc;
    tr_err err = {0};
    int rc = tr_json_parse(&doc, text, strlen(text), "t.json", &err);
    CHECKF(rc == -1, "accepted: %s", text);
    if (rc == 0) {
        tr_json_free(&doc);
        return;
    }
    CHECKF(strncmp(err.msg, where, strlen(where)) == 0, "'%s': message '%s' does not start with %s",
           text, err.msg, where);
}

static void test_accept_reject(void) {
    // y_ cases: valid JSON.
    const char *good[] = {
        "{}", "[]", "0", "-0", "1e5", "1E+2", "-1.5e-3", "\"\"", "null", "true", "false",
        " [1, 2 ,3 ] ", "{\"a\":{\"b\":[{}]}}", "\"\\u00e9\\/\"", "[1.0e308]", "[-9223372036854775808]",
        "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\t\r\n[\n]\n", "[1e-400]",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECKF(parses(good[i]), "rejected valid JSON: %s", good[i]);
    // n_ cases: invalid per RFC 8259.
    check_reject("", "t.json:1:1:");
    check_reject("[1,]", "t.json:1:4:");           // trailing comma
    check_reject("{\"a\":1,}", "t.json:1:8:");
    check_reject("[01]", "t.json:1:2:");           // leading zero
    check_reject("[1.]", "t.json:1:2:");
    check_reject("[.5]", "t.json:1:2:");
    check_reject("[+1]", "t.json:1:2:");
    check_reject("[NaN]", "t.json:1:2:");
    check_reject("[Infinity]", "t.json:1:2:");
    check_reject("[1e400]", "t.json:1:2:");        // outside double range
    check_reject("{\"a\" 1}", "t.json:1:6:");
    check_reject("{a:1}", "t.json:1:2:");          // unquoted key
    check_reject("['a']", "t.json:1:2:");
    check_reject("[1] 2", "t.json:1:5:");          // two top-level values
    check_reject("[\"a\tb\"]", "t.json:1:4:");     // raw control character
    check_reject("[\"\\x41\"]", "t.json:1:3:");    // unknown escape
    check_reject("[\"\\u12G4\"]", "t.json:1:3:");
    check_reject("[\"\\ud800\"]", "t.json:1:3:");  // lone high surrogate
    check_reject("[\"\\udc00\"]", "t.json:1:3:");  // lone low surrogate
    check_reject("[\"\\ud800\\u0041\"]", "t.json:1:3:");
    check_reject("[\"\xc0\xaf\"]", "t.json:1:3:");  // overlong '/'
    check_reject("[\"\xed\xa0\x80\"]", "t.json:1:3:");  // UTF-8 encoded surrogate
    check_reject("[\"\xf4\x90\x80\x80\"]", "t.json:1:3:");  // above U+10FFFF
    check_reject("[\"\xe2\x82\"]", "t.json:1:3:");  // truncated sequence
    check_reject("[\"abc", "t.json:1:2:");         // unterminated
    check_reject("[tru]", "t.json:1:2:");
    check_reject("[1,\n  2,\n  x]", "t.json:3:3:");  // line and column of the culprit
    check_reject("{\"k\":1,\"k\":2}", "t.json:1:12:");  // duplicate key at its value
    check_reject("/* c */ 1", "t.json:1:1:");
    // Embedded NUL in the input is a control character / stray byte, never the end.
    tr_json_doc doc;
    tr_err err = {0};
    CHECK(tr_json_parse(&doc, "[1]\0", 4, "t.json", &err) == -1);
    CHECK(tr_json_parse(&doc, "[\"a\0\"]", 6, "t.json", &err) == -1);
}

static void test_depth(void) {
    char deep[300];
    for (int i = 0; i < 150; i++) {
        deep[i] = '[';
        deep[150 + i - 0] = ']';
    }
    tr_json_doc doc;
    tr_err err = {0};
    // 64 levels are allowed, 65 are not.
    CHECK(tr_json_parse(&doc, deep + 150 - 64, 128, "t.json", &err) == 0);
    tr_json_free(&doc);
    CHECK(tr_json_parse(&doc, deep + 150 - 65, 130, "t.json", &err) == -1);
    CHECK(strstr(err.msg, "nesting deeper than 64") != NULL);
    CHECK(tr_json_parse_opts(&doc, deep + 150 - 3, 6, &(tr_json_opts){.name = "t.json", .max_depth = 2}, &err) == -1);
    // 100k nested arrays: rejected without recursing that deep.
    size_t n = 100000;
    char *big = malloc(n);
    memset(big, '[', n);
    CHECK(tr_json_parse(&doc, big, n, "t.json", &err) == -1);
    free(big);
}

static void test_values(void) {
    const char *text =
        "{\n"
        "  \"int\": 9223372036854775807,\n"
        "  \"neg\": -9223372036854775808,\n"
        "  \"big\": 9223372036854775808,\n"
        "  \"real\": 0.1,\n"
        "  \"exp\": 1E-6,\n"
        "  \"str\": \"a\\\"b\\\\c\\n\\u00e9\\ud83d\\ude00\\u0000z\",\n"
        "  \"arr\": [true, false, null, -0],\n"
        "  \"z\": {}\n"
        "}";
    tr_json_doc doc;
    tr_err err = {0};
    CHECK(tr_json_parse(&doc, text, strlen(text), "v.json", &err) == 0);
    const tr_json *r = doc.root;
    CHECK(r->type == TR_JSON_OBJECT && r->count == 8);
    // Key order is document order.
    const char *order[] = {"int", "neg", "big", "real", "exp", "str", "arr", "z"};
    int k = 0;
    for (const tr_json *m = r->child; m; m = m->next, k++) CHECK(strcmp(m->key, order[k]) == 0);
    const tr_json *v = tr_json_get(r, "int");
    CHECK(v->is_int && v->inum == INT64_MAX && v->line == 2 && v->col == 10);
    v = tr_json_get(r, "neg");
    CHECK(v->is_int && v->inum == INT64_MIN);
    v = tr_json_get(r, "big");  // one past INT64_MAX: only the double reading
    CHECK(!v->is_int && v->num == 9223372036854775808.0);
    v = tr_json_get(r, "real");
    CHECK(!v->is_int && v->num == 0.1);
    CHECK(tr_json_get(r, "exp")->num == 1e-6);
    v = tr_json_get(r, "str");
    const char want[] = "a\"b\\c\n\xc3\xa9\xf0\x9f\x98\x80\0z";
    CHECK(v->len == sizeof want - 1 && memcmp(v->str, want, sizeof want) == 0);
    v = tr_json_get(r, "arr");
    CHECK(v->count == 4 && v->line == 8 && v->col == 10);
    CHECK(tr_json_at(v, 0)->type == TR_JSON_BOOL && tr_json_at(v, 0)->boolean);
    CHECK(tr_json_at(v, 1)->type == TR_JSON_BOOL && !tr_json_at(v, 1)->boolean);
    CHECK(tr_json_at(v, 2)->type == TR_JSON_NULL);
    CHECK(tr_json_at(v, 3)->is_int && tr_json_at(v, 3)->inum == 0 && signbit(tr_json_at(v, 3)->num));
    CHECK(tr_json_at(v, 4) == NULL && tr_json_at(v, -1) == NULL);
    CHECK(tr_json_get(r, "missing") == NULL && tr_json_get(v, "x") == NULL);
    CHECK(tr_json_get(r, "z")->type == TR_JSON_OBJECT && tr_json_get(r, "z")->count == 0);
    tr_json_free(&doc);

    // Many keys: duplicate detection goes through the hash path.
    char buf[8192];
    size_t n = 0;
    n += (size_t)snprintf(buf + n, sizeof buf - n, "{");
    for (int i = 0; i < 300; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "\"k%d\":%d,", i, i);
    n += (size_t)snprintf(buf + n, sizeof buf - n, "\"k299\":0}");
    CHECK(tr_json_parse(&doc, buf, n, "t.json", &err) == -1 && strstr(err.msg, "duplicate key 'k299'"));
    buf[n - 7] = '9';  // the last key becomes "k999"
    CHECK(tr_json_parse(&doc, buf, n, "t.json", &err) == 0);
    CHECK(doc.root->count == 301 && tr_json_get(doc.root, "k150")->inum == 150);
    tr_json_free(&doc);
}

static void test_writer(void) {
    tr_json_writer w;
    tr_json_writer_init(&w, 0);
    tr_json_begin_object(&w);
    tr_json_key(&w, "s");
    tr_json_string(&w, "q\"\\\n\x01\xc3\xa9");
    tr_json_key(&w, "a");
    tr_json_begin_array(&w);
    tr_json_int(&w, -3);
    tr_json_double(&w, 0.1);
    tr_json_double(&w, 1e-6);
    tr_json_double(&w, 500000.0);
    tr_json_double(&w, 1e100);
    tr_json_float(&w, 1e-6f);
    tr_json_float(&w, 1e-5f);
    tr_json_bool(&w, true);
    tr_json_null(&w);
    tr_json_uint(&w, UINT64_MAX);
    tr_json_end_array(&w);
    tr_json_key(&w, "e");
    tr_json_begin_object(&w);
    tr_json_end_object(&w);
    tr_json_end_object(&w);
    const char *out;
    size_t len;
    tr_err err = {0};
    CHECK(tr_json_writer_finish(&w, &out, &len, &err) == 0);
    // Python: json.dumps(..., separators=(',', ':')) with repr floats; 1e-06 as float32
    // reads back as the float nearest 1e-6 and is printed as Python prints 1e-06.
    const char *want = "{\"s\":\"q\\\"\\\\\\n\\u0001\xc3\xa9\",\"a\":[-3,0.1,1e-06,500000.0,"
                       "1e+100,1e-06,1e-05,true,null,18446744073709551615],\"e\":{}}";
    CHECKF(strcmp(out, want) == 0, "got %s", out);
    tr_json_doc doc;
    CHECK(tr_json_parse(&doc, out, len, "w.json", &err) == 0);
    CHECK(strcmp(tr_json_get(doc.root, "s")->str, "q\"\\\n\x01\xc3\xa9") == 0);
    tr_json_free(&doc);
    tr_json_writer_free(&w);

    // Indented output parses back; misuse is reported, never written.
    tr_json_writer_init(&w, 2);
    tr_json_begin_object(&w);
    tr_json_key(&w, "x");
    tr_json_begin_array(&w);
    tr_json_int(&w, 1);
    tr_json_int(&w, 2);
    tr_json_end_array(&w);
    tr_json_end_object(&w);
    CHECK(tr_json_writer_finish(&w, &out, &len, &err) == 0);
    CHECK(strcmp(out, "{\n  \"x\": [\n    1,\n    2\n  ]\n}") == 0);
    tr_json_writer_free(&w);

    tr_json_writer_init(&w, 0);
    tr_json_begin_object(&w);
    tr_json_int(&w, 1);  // no key
    tr_json_end_object(&w);
    CHECK(tr_json_writer_finish(&w, &out, &len, &err) == -1);
    tr_json_writer_free(&w);
    tr_json_writer_init(&w, 0);
    tr_json_begin_array(&w);
    tr_json_double(&w, NAN);
    tr_json_end_array(&w);
    CHECK(tr_json_writer_finish(&w, &out, &len, &err) == -1);
    tr_json_writer_free(&w);
    tr_json_writer_init(&w, 0);
    tr_json_begin_array(&w);
    CHECK(tr_json_writer_finish(&w, &out, &len, &err) == -1);  // unclosed
    tr_json_writer_free(&w);
}

// Parses with opts; returns 1 when accepted (the doc is left for the caller, who frees it).
static int parses_opts(tr_json_doc *doc, const char *text, unsigned flags, int max_depth,
                       tr_err *err) {
    tr_json_opts o = {.name = "d.jsonl", .line = 7, .max_depth = max_depth, .flags = flags,
                      .what = "invalid JSON: "};
    return tr_json_parse_opts(doc, text, strlen(text), &o, err) == 0;
}

static void test_data_rules(void) {
    tr_json_doc doc;
    tr_err err = {0};
    // Repeated keys: the last value in the first key's place, small and hashed objects alike.
    CHECK(parses_opts(&doc, "{\"a\":1,\"b\":2,\"a\":3,\"a\":[4]}", TR_JSON_DUP_LAST, 0, &err));
    const tr_json *r = doc.root;
    CHECK(r->count == 2 && strcmp(r->child->key, "a") == 0 && r->child->type == TR_JSON_ARRAY);
    CHECK(r->child->next == tr_json_get(r, "b") && tr_json_get(r, "b")->next == NULL);
    CHECK(tr_json_get(r, "a")->child->inum == 4);
    tr_json_free(&doc);
    char buf[8192];
    size_t n = (size_t)snprintf(buf, sizeof buf, "{");
    for (int i = 0; i < 40; i++) n += (size_t)snprintf(buf + n, sizeof buf - n, "\"k%d\":%d,", i % 20, i);
    snprintf(buf + n - 1, sizeof buf - n + 1, "}");
    CHECK(parses_opts(&doc, buf, TR_JSON_DUP_LAST, 0, &err) && doc.root->count == 20);
    int k = 0, ok = 1;
    for (const tr_json *m = doc.root->child; m; m = m->next, k++) ok &= m->inum == k + 20;
    CHECK(ok && k == 20);
    tr_json_free(&doc);
    CHECK(!parses_opts(&doc, "{\"a\":1,\"a\":2}", 0, 0, &err));
    CHECKF(strstr(err.msg, "d.jsonl:7:12: invalid JSON: duplicate key 'a'"), "%s", err.msg);

    // \u0000: in values unless NO_NUL, in keys unless NO_NUL_KEY (or NO_NUL).
    CHECK(parses_opts(&doc, "{\"a\":\"x\\u0000\"}", TR_JSON_NO_NUL_KEY, 0, &err));
    tr_json_free(&doc);
    CHECK(!parses_opts(&doc, "{\"a\":\"x\\u0000\"}", TR_JSON_NO_NUL, 0, &err));
    CHECK(!parses_opts(&doc, "{\"a\\u0000\":1}", TR_JSON_NO_NUL_KEY, 0, &err));
    CHECKF(strstr(err.msg, "d.jsonl:7:4: invalid JSON: \\u0000 is not allowed in a key"), "%s", err.msg);

    // Integers beyond int64 are errors under TR_JSON_INT64, doubles otherwise.
    CHECK(parses_opts(&doc, "[-9223372036854775808, 9223372036854775807]", TR_JSON_INT64, 0, &err));
    tr_json_free(&doc);
    CHECK(!parses_opts(&doc, "[9223372036854775808]", TR_JSON_INT64, 0, &err));
    CHECK(!parses_opts(&doc, "[-9223372036854775809]", TR_JSON_INT64, 0, &err));
    CHECK(parses_opts(&doc, "[9223372036854775808.0, 1e19]", TR_JSON_INT64, 0, &err));
    tr_json_free(&doc);

    // Depth: containers only by default; with DEPTH_ALL a scalar is a level too.
    CHECK(parses_opts(&doc, "[[1]]", 0, 2, &err));
    tr_json_free(&doc);
    CHECK(parses_opts(&doc, "[[]]", TR_JSON_DEPTH_ALL, 2, &err));
    tr_json_free(&doc);
    CHECK(!parses_opts(&doc, "[[1]]", TR_JSON_DEPTH_ALL, 2, &err));
    CHECKF(strstr(err.msg, "d.jsonl:7:3: invalid JSON: nesting deeper than 2 levels"), "%s", err.msg);
    CHECK(parses_opts(&doc, "1", TR_JSON_DEPTH_ALL, 1, &err));
    tr_json_free(&doc);
    // A deep document at the data limit: 2047 arrays around a scalar pass, 2048 do not.
    char *deep = malloc(2 * 2048 + 2);
    for (int depth = 2047; depth <= 2048 && deep; depth++) {
        memset(deep, '[', (size_t)depth);
        deep[depth] = '1';
        memset(deep + depth + 1, ']', (size_t)depth);
        deep[2 * depth + 1] = '\0';
        int got = parses_opts(&doc, deep, TR_JSON_DATA, TR_JSON_DATA_DEPTH, &err);
        CHECKF(got == (depth == 2047), "depth %d", depth);
        if (got) tr_json_free(&doc);
    }
    free(deep);
}

// The document w holds, checked against want.
static void check_out(tr_json_writer *w, const char *want) {
    const char *out;
    size_t len;
    tr_err err = {0};
    CHECKF(tr_json_writer_finish(w, &out, &len, &err) == 0, "%s", err.msg);
    if (!err.code) CHECKF(strcmp(out, want) == 0, "got %s, wanted %s", out, want);
}

static void test_writer_styles(void) {
    // A parsed document written back in the data style with Python's separators.
    const char *text = "{\"x\":0.1,\"y\":1e20,\"z\":1e-5,\"w\":100.0,\"v\":-0.0,"
                       "\"n\":[1,-0,true,null,{},[]],\"s\":\"\\u001b\\u007f\\u00e9\\ud83d\\ude00/\\u0000\"}";
    tr_json_doc doc;
    tr_err err = {0};
    CHECK(tr_json_parse(&doc, text, strlen(text), "t.json", &err) == 0);
    tr_json_writer w;
    tr_json_writer_init(&w, 0);
    w.flags = TR_JSON_W_DATA | TR_JSON_W_SPACED;
    tr_json_value(&w, doc.root);
    check_out(&w, "{\"x\": 0.10000000000000001, \"y\": 1e20, \"z\": 1.0000000000000001e-5, "
                  "\"w\": 100.0, \"v\": -0.0, \"n\": [1, 0, true, null, {}, []], "
                  "\"s\": \"\\u001B\x7f\xc3\xa9\xf0\x9f\x98\x80/\\u0000\"}");
    // The same, compact and ASCII-only, after a reset.
    tr_json_writer_reset(&w);
    w.flags = TR_JSON_W_DATA | TR_JSON_W_ASCII;
    tr_json_value(&w, tr_json_get(doc.root, "s"));
    check_out(&w, "\"\\u001B\x7f\\u00E9\\uD83D\\uDE00/\\u0000\"");
    tr_json_writer_reset(&w);
    tr_json_begin_object(&w);
    tr_json_key_n(&w, "k\0z", 3);
    tr_json_float(&w, 0.1f);
    tr_json_key(&w, "e");
    tr_json_double(&w, 1.5e-300);
    tr_json_end_object(&w);
    check_out(&w, "{\"k\\u0000z\":0.10000000149011612,\"e\":1.5000000000000001e-300}");
    // Invalid UTF-8 fails the document under TR_JSON_W_UTF8 (and only there).
    tr_json_writer_reset(&w);
    tr_json_string(&w, "a\xff");
    CHECK(tr_json_writer_finish(&w, &(const char *){0}, &(size_t){0}, &err) == -1 &&
          err.code == TR_EFORMAT);
    tr_json_writer_reset(&w);
    w.flags = 0;
    tr_json_string(&w, "a\xff\x1b");
    check_out(&w, "\"a\xff\\u001b\"");
    tr_json_writer_free(&w);
    tr_json_free(&doc);
}

int main(void) {
    test_accept_reject();
    test_data_rules();
    test_writer_styles();
    test_depth();
    test_values();
    test_writer();
    return tr_test_summary("test_json");
}
