// JSON to msgpack: the bytes for a small object against msgpack encoded by hand from the
// specification, every JSON type read back through the accessors, and error reporting.
#include <string.h>

#include "roles/json_pack.h"
#include "tests/test.h"

int main(void) {
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_err e;
    const void *d;
    size_t n;
    // {"a": [1, -2, 1.5, "x", true, false, null], "b": {}} in key order.
    CHECK(tr_json_pack(&w, NULL, "{\"a\": [1, -2, 1.5, \"x\", true, false, null], \"b\": {}}", &e) == 0);
    static const uint8_t want[] = {0x82, 0xa1, 'a', 0x97, 0x01, 0xfe, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0,
                                   0xa1, 'x', 0xc3, 0xc2, 0xc0, 0xa1, 'b', 0x80};
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == 0 && n == sizeof want && memcmp(d, want, n) == 0);

    // Inside a request, read back with the accessors.
    tr_msg_writer_reset(&w);
    tr_msg_begin_request(&w, "score", 1, 1);
    CHECK(tr_json_pack(&w, "meta", "{\"answer\": \"72\", \"n\": 9007199254740993, \"u\": \"\\u00e9\\ud83d\\ude00\"}", &e) == 0);
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == 0);
    tr_msg m;
    CHECK(tr_msg_decode(&m, d, n, 1 << 20, &e) == 0);
    tr_msg_map meta;
    tr_msg_str s;
    int64_t i;
    CHECK(tr_msg_get_map(&m.args, "meta", &meta, &e) == 0);
    CHECK(tr_msg_get_str(&meta, "answer", &s, &e) == 0 && s.len == 2 && memcmp(s.ptr, "72", 2) == 0);
    CHECK(tr_msg_get_int(&meta, "n", &i, &e) == 0 && i == 9007199254740993LL);  // 2^53 + 1 stays exact
    CHECK(tr_msg_get_str(&meta, "u", &s, &e) == 0 && s.len == 6 && memcmp(s.ptr, "\xc3\xa9\xf0\x9f\x98\x80", 6) == 0);
    tr_msg_free(&m);

    // Errors: bad JSON names line and column; duplicate keys; nesting beyond the writer's depth.
    tr_msg_writer_reset(&w);
    CHECK(tr_json_pack(&w, NULL, "{\n  \"a\": tru\n}", &e) == -1 && e.code == TR_EFORMAT && strstr(e.msg, "JSON:2:8:"));
    tr_msg_writer_reset(&w);
    CHECK(tr_json_pack(&w, NULL, "{\"a\": 1, \"a\": 2}", &e) == -1 && strstr(e.msg, "duplicate"));
    tr_msg_writer_reset(&w);
    char deep[128];
    memset(deep, '[', 40);
    memset(deep + 40, ']', 40);
    deep[80] = '\0';
    CHECK(tr_json_pack(&w, NULL, deep, &e) == -1 && strstr(e.msg, "too deep"));
    tr_msg_writer_reset(&w);
    CHECK(tr_json_pack_object(&w, NULL, "[1, 2]", &e) == -1 && strstr(e.msg, "not an object"));
    tr_msg_writer_reset(&w);
    CHECK(tr_json_pack_object(&w, NULL, " {\"k\": 1} ", &e) == 0);
    tr_msg_writer_free(&w);
    return tr_test_summary("test_json_pack");
}
