// JSONL reading: blank lines, CRLF, a BOM, a final line without newline and a 3 MB line all
// read back exactly; malformed JSON, non-object lines, wrong field types and missing fields
// fail with FILE:LINE (and the column of the culprit) in the message.
#include "data/jsonl.h"
#include "engine/file.h"
#include "tests/test.h"

static const char *write_tmp(const char *dir, const char *name, const char *data, size_t n) {
    static char path[4][512];
    static int k;
    char *p = path[k++ % 4];
    snprintf(p, 512, "%s/%s", dir, name);
    tr_err err;
    CHECK(tr_file_write_atomic(p, data, n, &err) == 0);
    return p;
}

static void expect_error(const char *path, const char *want) {
    tr_jsonl r;
    tr_err err = {0};
    int rc = tr_jsonl_open(&r, path, &err);
    tr_json_doc doc;
    while (rc == 0) {
        rc = tr_jsonl_next(&r, &doc, &err);
        if (rc != 1) break;
        tr_json_free(&doc);
        rc = 0;
    }
    CHECKF(rc == -1, "%s: no error", path);
    CHECKF(strstr(err.msg, want) != NULL, "'%s' lacks '%s'", err.msg, want);
    if (r.f) tr_jsonl_close(&r);
}

int main(void) {
    const char *dir = tr_test_tmpdir();
    tr_err err = {0};

    // Good input with every line-ending quirk. The 3 MB line outgrows any fixed buffer.
    size_t big = 3u << 20;
    char *buf = malloc(big + 1024);
    if (!buf) return 1;
    size_t n = 0;
    n += (size_t)sprintf(buf + n, "\xEF\xBB\xBF{\"text\": \"bom\"}\n");      // line 1
    n += (size_t)sprintf(buf + n, "\n   \t\n");                             // lines 2-3 blank
    n += (size_t)sprintf(buf + n, "{\"text\": \"crlf\"}\r\n");              // line 4
    n += (size_t)sprintf(buf + n, "{\"text\": \"");                         // line 5: 3 MB
    memset(buf + n, 'x', big);
    n += big;
    n += (size_t)sprintf(buf + n, "\"}\n");
    n += (size_t)sprintf(buf + n, "\r\n");                                  // line 6 blank CRLF
    n += (size_t)sprintf(buf + n, "{\"text\": \"nul\\u0000in\"}\n");        // line 7
    n += (size_t)sprintf(buf + n, "{\"text\": \"last\", \"n\": 3}");       // line 8, no newline
    const char *good = write_tmp(dir, "good.jsonl", buf, n);
    tr_jsonl r;
    CHECK(tr_jsonl_open(&r, good, &err) == 0);
    CHECK(r.size == n);
    const char *want[5] = {"bom", "crlf", NULL, "nul", "last"};
    int64_t want_line[5] = {1, 4, 5, 7, 8};
    tr_json_doc doc;
    int k = 0;
    while (tr_jsonl_next(&r, &doc, &err) == 1) {
        const tr_json *o = doc.root;
        const char *s;
        size_t len;
        CHECKF(tr_jsonl_get_string(good, r.line, o, "text", true, &s, &len, &err) == 0, "%s", err.msg);
        if (k < 5) {
            CHECK(r.line == want_line[k]);
            if (k == 2) {
                CHECK(len == big && s[0] == 'x' && s[big - 1] == 'x');
            } else if (k == 3) {
                CHECK(len == 6 && memcmp(s, "nul\0in", 6) == 0);
            } else {
                CHECK(len == strlen(want[k]) && strcmp(s, want[k]) == 0);
            }
        }
        // An optional missing field is not an error; a wrong type always is.
        const char *none;
        CHECK(tr_jsonl_get_string(good, r.line, o, "absent", false, &none, NULL, &err) == 0 && !none);
        if (k == 4) {
            CHECK(tr_jsonl_get_string(good, r.line, o, "n", false, &none, NULL, &err) == -1);
            CHECKF(strstr(err.msg, "good.jsonl:8: field 'n' must be a string, got number"), "%s", err.msg);
            const tr_json *arr;
            CHECK(tr_jsonl_get_array(good, r.line, o, "text", true, &arr, &err) == -1);
            CHECKF(strstr(err.msg, ":8: field 'text' must be an array, got string"), "%s", err.msg);
            CHECK(tr_jsonl_get_string(good, r.line, o, "prompt", true, &none, NULL, &err) == -1);
            CHECKF(strstr(err.msg, ":8: missing field 'prompt'"), "%s", err.msg);
        }
        tr_json_free(&doc);
        k++;
    }
    CHECK(k == 5);
    CHECK(r.bytes_read == n);
    tr_jsonl_close(&r);
    free(buf);

    // Bad input: the message names the file, the line and (for syntax) the column.
    const char *bad1 = write_tmp(dir, "bad1.jsonl", "{\"a\": 1}\n\n{\"a\": 1,}\n", 20);
    expect_error(bad1, "bad1.jsonl:3:9: invalid JSON");
    const char *bad2 = write_tmp(dir, "bad2.jsonl", "{\"a\": 1}\n[1, 2]\n", 16);
    expect_error(bad2, "bad2.jsonl:2: expected a JSON object, got array");
    const char *bad3 = write_tmp(dir, "bad3.jsonl", "{\"a\": 1} {\"b\": 2}\n", 19);
    expect_error(bad3, "bad3.jsonl:1:");
    const char *bad4 = write_tmp(dir, "bad4.jsonl", "{\"a\": \"unterminated\n", 20);
    expect_error(bad4, "bad4.jsonl:1:");
    expect_error("/nonexistent/dir/x.jsonl", "/nonexistent/dir/x.jsonl: cannot open");
    // Reading from a memory stream (as the fuzz target does) reports the given name.
    FILE *f = fmemopen((void *)"\n\n{\"x\":}\n", 8, "r");
    CHECK(tr_jsonl_open_stream(&r, f, "mem.jsonl", &err) == 0);
    CHECK(tr_jsonl_next(&r, &doc, &err) == -1 && strstr(err.msg, "mem.jsonl:3:"));
    tr_jsonl_close(&r);
    fclose(f);
    return tr_test_summary("test_jsonl");
}
