// Protocol message tests: round trips of requests, replies and tensors, the writer's bytes
// against msgpack encoded by hand from the msgpack specification, and every decoder error
// path (truncation, wrong types, oversize, unknown version, lying headers).
#include <stdint.h>
#include <string.h>

#include "roles/msg.h"
#include "tests/test.h"

static bool has(const tr_err *e, const char *needle) { return strstr(e->msg, needle) != NULL; }

// Encodes with the writer and returns a malloc'd copy.
static uint8_t *finish_copy(tr_msg_writer *w, size_t *len) {
    const void *d;
    tr_err e;
    if (tr_msg_writer_finish(w, &d, len, &e)) {
        fprintf(stderr, "writer: %s\n", e.msg);
        return NULL;
    }
    uint8_t *c = malloc(*len);
    memcpy(c, d, *len);
    return c;
}

static void test_spec_bytes(void) {
    // {"v": 1, "op": "ping", "id": 7, "args": {"k": -1}} following the msgpack spec:
    // fixmap(4)=0x84, fixstr(n)=0xa0|n, positive fixint, negative fixint 0xff = -1.
    static const uint8_t want[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g',
                                   0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 'k', 0xff};
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_begin_request(&w, "ping", 7, 1);
    tr_msg_put_int(&w, "k", -1);
    size_t n;
    uint8_t *got = finish_copy(&w, &n);
    CHECK(got && n == sizeof want && memcmp(got, want, n) == 0);
    free(got);
    tr_msg_writer_free(&w);

    // A tensor {dtype: "i32", shape: [2], data: bin8(8 bytes)} as the spec lays it out.
    static const uint8_t tensor[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x02,
                                     0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 't', 0x83,
                                     0xa5, 'd', 't', 'y', 'p', 'e', 0xa3, 'i', '3', '2',
                                     0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0x02,
                                     0xa4, 'd', 'a', 't', 'a', 0xc4, 0x08, 1, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff};
    tr_msg m;
    tr_err e;
    CHECK(tr_msg_decode(&m, tensor, sizeof tensor, 1 << 20, &e) == 0);
    tr_tensor_view t;
    CHECK(tr_msg_get_tensor(&m.args, "t", &t, &e) == 0);
    int32_t v[2] = {0, 0};
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_I32, v, sizeof v, "t", &e) == 0);
    CHECK(t.ndim == 1 && t.shape[0] == 2 && t.numel == 2 && v[0] == 1 && v[1] == -2);
    // Zero copy: the view points into the buffer.
    CHECK((const uint8_t *)t.data == tensor + sizeof tensor - 8);
    tr_msg_free(&m);
}

static void test_round_trip(void) {
    float f32[6] = {1.5f, -2.25f, 0.f, 3e-8f, -1e30f, 7.f};
    uint16_t bf16[3] = {0x3f80, 0xc000, 0x7f80};  // 1, -2, +inf
    int32_t i32[4] = {INT32_MIN, -1, 0, INT32_MAX};
    int64_t i64[2] = {INT64_MIN, INT64_MAX};
    uint8_t u8[5] = {0, 1, 128, 254, 255};
    int64_t s23[2] = {2, 3}, s3[1] = {3}, s4[2] = {4, 1}, s2[1] = {2}, s5[3] = {5, 1, 1}, s0[2] = {0, 7};

    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_begin_request(&w, "generate", 123456789012345ull, 13);
    tr_msg_put_int(&w, "n", -42);
    tr_msg_put_uint(&w, "big", UINT64_MAX);
    tr_msg_put_float(&w, "temperature", 0.7);
    tr_msg_put_bool(&w, "greedy", true);
    tr_msg_put_str(&w, "name", "héllo");
    tr_msg_put_nil(&w, "nothing");
    tr_msg_put_tensor(&w, "f32", TR_DTYPE_F32, 2, s23, f32);
    tr_msg_put_tensor(&w, "bf16", TR_DTYPE_BF16, 1, s3, bf16);
    tr_msg_put_tensor(&w, "i32", TR_DTYPE_I32, 2, s4, i32);
    tr_msg_put_tensor(&w, "i64", TR_DTYPE_I64, 1, s2, i64);
    tr_msg_put_tensor(&w, "u8", TR_DTYPE_U8, 3, s5, u8);
    tr_msg_put_tensor(&w, "empty", TR_DTYPE_F32, 2, s0, NULL);
    tr_msg_put_map(&w, "opts", 2);
    tr_msg_put_int(&w, "top_k", 50);
    tr_msg_put_array(&w, "stops", 3);
    tr_msg_put_str(&w, NULL, "a");
    tr_msg_put_float(&w, NULL, 2.5);
    tr_msg_put_map(&w, NULL, 1);
    tr_msg_put_tensor(&w, "t", TR_DTYPE_I32, 1, s2, i32);
    size_t n;
    uint8_t *buf = finish_copy(&w, &n);
    tr_msg_writer_free(&w);
    CHECK(buf != NULL);
    if (!buf) return;

    tr_msg m;
    tr_err e;
    CHECKF(tr_msg_decode(&m, buf, n, n, &e) == 0, "%s", e.msg);
    CHECK(m.kind == TR_MSG_REQUEST && m.id == 123456789012345ull && strcmp(m.op, "generate") == 0);
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    tr_msg_str s;
    CHECK(tr_msg_get_int(&m.args, "n", &i, &e) == 0 && i == -42);
    CHECK(tr_msg_get_uint(&m.args, "big", &u, &e) == 0 && u == UINT64_MAX);
    CHECK(tr_msg_get_int(&m.args, "big", &i, &e) == -1);  // does not fit int64
    CHECK(tr_msg_get_float(&m.args, "temperature", &d, &e) == 0 && d == 0.7);
    CHECK(tr_msg_get_float(&m.args, "n", &d, &e) == 0 && d == -42.0);
    CHECK(tr_msg_get_bool(&m.args, "greedy", &b, &e) == 0 && b);
    CHECK(tr_msg_get_str(&m.args, "name", &s, &e) == 0 && s.len == 6 && memcmp(s.ptr, "héllo", 6) == 0);
    CHECK(s.ptr > (const char *)buf && s.ptr < (const char *)buf + n);  // a view, not a copy
    char name[8];
    CHECK(tr_msg_get_str_buf(&m.args, "name", name, sizeof name, &e) == 0 && strcmp(name, "héllo") == 0);
    CHECK(tr_msg_get_str_buf(&m.args, "name", name, 6, &e) == -1 && e.code == TR_ERANGE);
    CHECK(tr_msg_has(&m.args, "nothing") && !tr_msg_has(&m.args, "absent"));

    tr_tensor_view t;
    float gf[6];
    CHECK(tr_msg_get_tensor(&m.args, "f32", &t, &e) == 0 && t.ndim == 2 && t.shape[0] == 2 && t.shape[1] == 3);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_F32, gf, sizeof gf, "f32", &e) == 0 && memcmp(gf, f32, sizeof f32) == 0);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_I32, gf, sizeof gf, "f32", &e) == -1 && has(&e, "expected dtype i32"));
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_F32, gf, 8, "f32", &e) == -1 && e.code == TR_ERANGE);
    uint16_t gb[3];
    CHECK(tr_msg_get_tensor(&m.args, "bf16", &t, &e) == 0 && t.dtype == TR_DTYPE_BF16 && t.nbytes == 6);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_BF16, gb, sizeof gb, "bf16", &e) == 0 && memcmp(gb, bf16, 6) == 0);
    int32_t gi[4];
    CHECK(tr_msg_get_tensor(&m.args, "i32", &t, &e) == 0 && t.shape[0] == 4 && t.shape[1] == 1);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_I32, gi, sizeof gi, "i32", &e) == 0 && memcmp(gi, i32, 16) == 0);
    int64_t gl[2];
    CHECK(tr_msg_get_tensor(&m.args, "i64", &t, &e) == 0);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_I64, gl, sizeof gl, "i64", &e) == 0 && gl[0] == INT64_MIN && gl[1] == INT64_MAX);
    uint8_t gu[5];
    CHECK(tr_msg_get_tensor(&m.args, "u8", &t, &e) == 0 && t.ndim == 3 && t.numel == 5);
    CHECK(tr_tensor_view_copy(&t, TR_DTYPE_U8, gu, sizeof gu, "u8", &e) == 0 && memcmp(gu, u8, 5) == 0);
    CHECK(tr_msg_get_tensor(&m.args, "empty", &t, &e) == 0 && t.numel == 0 && t.nbytes == 0 && t.shape[1] == 7);

    tr_msg_map opts, inner;
    tr_msg_array stops;
    CHECK(tr_msg_get_map(&m.args, "opts", &opts, &e) == 0);
    CHECK(tr_msg_get_int(&opts, "top_k", &i, &e) == 0 && i == 50);
    CHECK(tr_msg_get_array(&opts, "stops", &stops, &e) == 0 && stops.n == 3);
    CHECK(tr_msg_array_str(&stops, 0, &s, &e) == 0 && s.len == 1 && s.ptr[0] == 'a');
    CHECK(tr_msg_array_float(&stops, 1, &d, &e) == 0 && d == 2.5);
    CHECK(tr_msg_array_map(&stops, 2, &inner, &e) == 0 && tr_msg_get_tensor(&inner, "t", &t, &e) == 0);
    CHECK(tr_msg_array_int(&stops, 0, &i, &e) == -1 && has(&e, "generate: args.opts.stops[0]: expected int, got str"));
    CHECK(tr_msg_array_int(&stops, 9, &i, &e) == -1 && e.code == TR_ERANGE);

    // Accessor errors name the op and the key path.
    CHECK(tr_msg_get_int(&m.args, "temperature", &i, &e) == -1 && has(&e, "generate: args.temperature: expected int, got float"));
    CHECK(tr_msg_get_str(&m.args, "n", &s, &e) == -1 && has(&e, "args.n: expected str, got int"));
    CHECK(tr_msg_get_float(&m.args, "missing", &d, &e) == -1 && has(&e, "generate: args.missing: missing"));
    CHECK(tr_msg_get_tensor(&m.args, "name", &t, &e) == -1 && has(&e, "args.name: expected tensor map, got str"));
    CHECK(tr_msg_get_bool(&opts, "top_k", &b, &e) == -1 && has(&e, "args.opts.top_k: expected bool"));
    i = 5;
    CHECK(tr_msg_get_int_opt(&m.args, "absent", &i, &e) == 0 && i == 5);
    CHECK(tr_msg_get_int_opt(&m.args, "name", &i, &e) == -1);
    d = 1.0;
    CHECK(tr_msg_get_float_opt(&m.args, "temperature", &d, &e) == 0 && d == 0.7);
    static const char *const only_some[] = {"n", "big", NULL};
    CHECK(tr_msg_check_keys(&m.args, only_some, &e) == -1 && has(&e, "unknown key 'temperature'"));
    tr_msg_free(&m);
    free(buf);
}

static void test_replies(void) {
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_begin_reply(&w, 9, 1);
    tr_msg_put_float(&w, "loss", 1.25);
    size_t n;
    uint8_t *buf = finish_copy(&w, &n);
    tr_msg m;
    tr_err e;
    double d;
    CHECK(buf && tr_msg_decode(&m, buf, n, 1 << 20, &e) == 0);
    CHECK(m.kind == TR_MSG_REPLY && m.ok && m.id == 9 && tr_msg_get_float(&m.args, "loss", &d, &e) == 0 && d == 1.25);
    tr_msg_free(&m);
    free(buf);

    tr_msg_writer_reset(&w);
    tr_msg_put_error_reply(&w, 10, TR_ETIMEOUT, "policy/0: generate took too long");
    buf = finish_copy(&w, &n);
    CHECK(buf && tr_msg_decode(&m, buf, n, 1 << 20, &e) == 0);
    CHECK(m.kind == TR_MSG_REPLY && !m.ok && m.id == 10 && m.remote.code == TR_ETIMEOUT);
    CHECK(strcmp(m.remote.msg, "policy/0: generate took too long") == 0);
    tr_msg_free(&m);
    free(buf);

    // Unknown error code names map to TR_EPEER rather than failing the decode.
    static const uint8_t odd[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x03, 0xa2, 'o', 'k', 0xc2,
                                  0xa5, 'e', 'r', 'r', 'o', 'r', 0x82, 0xa4, 'c', 'o', 'd', 'e', 0xa3, 'z', 'z', 'z',
                                  0xa7, 'm', 'e', 's', 's', 'a', 'g', 'e', 0xa2, 'h', 'i'};
    CHECK(tr_msg_decode(&m, odd, sizeof odd, 1 << 20, &e) == 0 && m.remote.code == TR_EPEER && strcmp(m.remote.msg, "hi") == 0);
    tr_msg_free(&m);
    tr_msg_writer_free(&w);
}

static void test_writer_errors(void) {
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    const void *d;
    size_t n;
    tr_err e;
    tr_msg_begin_request(&w, "x", 1, 2);
    tr_msg_put_int(&w, "a", 1);
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1 && has(&e, "1 of 2"));  // one arg missing
    tr_msg_writer_reset(&w);
    tr_msg_begin_request(&w, "x", 1, 1);
    tr_msg_put_int(&w, NULL, 1);  // no key inside a map
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1);
    tr_msg_writer_reset(&w);
    tr_msg_begin_request(&w, "x", 1, 1);
    tr_msg_put_array(&w, "a", 1);
    tr_msg_put_int(&w, "k", 1);  // key inside an array
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1 && has(&e, "inside an array"));
    tr_msg_writer_reset(&w);
    tr_msg_begin_request(&w, "x", 1, 0);
    tr_msg_put_int(&w, "extra", 1);  // beyond the declared count
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1);
    tr_msg_writer_reset(&w);
    tr_msg_begin_request(&w, "Bad-Op", 1, 0);
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1 && has(&e, "not a valid op name"));
    tr_msg_writer_reset(&w);
    int64_t neg[1] = {-1};
    tr_msg_begin_request(&w, "x", 1, 1);
    tr_msg_put_tensor(&w, "t", TR_DTYPE_F32, 1, neg, NULL);
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1 && has(&e, "negative or huge shape"));
    tr_msg_writer_reset(&w);
    CHECK(tr_msg_writer_finish(&w, &d, &n, &e) == -1);  // empty
    tr_msg_writer_free(&w);
}

// Expects decoding to fail with code and a message containing needle.
static void expect_fail(const uint8_t *b, size_t n, uint64_t max, int code, const char *needle, int line) {
    tr_msg m;
    tr_err e;
    tr_err_clear(&e);
    int rc = tr_msg_decode(&m, b, n, max, &e);
    tr_test_checks++;
    if (rc != -1 || e.code != code || (needle && !has(&e, needle))) {
        tr_test_failures++;
        fprintf(stderr, "%s:%d: expected failure %s '%s', got rc %d code %s '%s'\n", __FILE__, line,
                tr_err_code_name(code), needle ? needle : "", rc, tr_err_code_name(e.code), e.msg);
    }
    tr_msg_free(&m);
}
#define FAIL(bytes, code, needle) expect_fail(bytes, sizeof bytes, 1 << 20, code, needle, __LINE__)

static void test_decode_errors(void) {
    // A valid request to cut and bend: {"v":1,"op":"ping","id":7,"args":{"k":-1}}.
    static const uint8_t ok[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g',
                                 0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 'k', 0xff};
    tr_msg m;
    tr_err e;
    CHECK(tr_msg_decode(&m, ok, sizeof ok, 1 << 20, &e) == 0);
    tr_msg_free(&m);
    // Every proper prefix is truncated, and must be rejected.
    int prefix_failures = 0;
    for (size_t n = 0; n < sizeof ok; n++) {
        if (tr_msg_decode(&m, ok, n, 1 << 20, &e) == 0 || e.code != TR_EFORMAT) prefix_failures++;
        tr_msg_free(&m);
    }
    CHECK(prefix_failures == 0);

    // Oversize: the id is still reported so the receiver can answer.
    CHECK(tr_msg_decode(&m, ok, sizeof ok, 10, &e) == -1 && e.code == TR_ERANGE && m.has_id && m.id == 7 &&
          strcmp(m.op, "ping") == 0);
    tr_msg_free(&m);

    static const uint8_t v1[] = {0x84, 0xa1, 'v', 0x01, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g',
                                 0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(v1, TR_EUNSUPPORTED, "protocol version 1");
    CHECK(tr_msg_decode(&m, v1, sizeof v1, 1 << 20, &e) == -1 && m.has_id && m.id == 7);
    tr_msg_free(&m);
    static const uint8_t no_v[] = {0x83, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g', 0xa2, 'i', 'd', 0x07,
                                   0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(no_v, TR_EFORMAT, "no protocol version");
    static const uint8_t v_str[] = {0x84, 0xa1, 'v', 0xa1, '1', 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g',
                                    0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(v_str, TR_EFORMAT, "'v' is a str");
    static const uint8_t id_neg[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa4, 'p', 'i', 'n', 'g',
                                     0xa2, 'i', 'd', 0xff, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(id_neg, TR_EFORMAT, "'id' is a int");
    static const uint8_t op_int[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0x05,
                                     0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(op_int, TR_EFORMAT, "'op' is a int");
    static const uint8_t op_bad[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa2, 'P', '!',
                                     0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(op_bad, TR_EFORMAT, "not a valid op name");
    static const uint8_t args_arr[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x',
                                       0xa2, 'i', 'd', 0x07, 0xa4, 'a', 'r', 'g', 's', 0x90};
    FAIL(args_arr, TR_EFORMAT, "args: expected map, got array");
    static const uint8_t no_args[] = {0x83, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x07};
    FAIL(no_args, TR_EFORMAT, "no 'args'");
    static const uint8_t extra[] = {0x85, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x07,
                                    0xa4, 'a', 'r', 'g', 's', 0x80, 0xa1, 'z', 0xc0};
    FAIL(extra, TR_EINVAL, "unknown key 'z'");
    static const uint8_t dup[] = {0x85, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x07,
                                  0xa4, 'a', 'r', 'g', 's', 0x80, 0xa1, 'v', 0x02};
    FAIL(dup, TR_EFORMAT, "duplicate key 'v'");
    static const uint8_t id0[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x',
                                  0xa2, 'i', 'd', 0x00, 0xa4, 'a', 'r', 'g', 's', 0x80};
    FAIL(id0, TR_EFORMAT, "reserved for heartbeats");
    static const uint8_t both[] = {0x85, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x07,
                                   0xa4, 'a', 'r', 'g', 's', 0x80, 0xa2, 'o', 'k', 0xc3};
    FAIL(both, TR_EFORMAT, "both 'op'");
    static const uint8_t neither[] = {0x82, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x07};
    FAIL(neither, TR_EFORMAT, "neither");
    static const uint8_t ok_str[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x07, 0xa2, 'o', 'k', 0xa1, 'y',
                                     0xa6, 'r', 'e', 's', 'u', 'l', 't', 0x80};
    FAIL(ok_str, TR_EFORMAT, "'ok' is a str");
    static const uint8_t ok_no_result[] = {0x83, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x07, 0xa2, 'o', 'k', 0xc3};
    FAIL(ok_no_result, TR_EFORMAT, "no 'result'");
    static const uint8_t err_no_error[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x07, 0xa2, 'o', 'k', 0xc2,
                                           0xa6, 'r', 'e', 's', 'u', 'l', 't', 0x80};
    FAIL(err_no_error, TR_EFORMAT, "carries a 'result'");
    static const uint8_t err_code_int[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'i', 'd', 0x03, 0xa2, 'o', 'k', 0xc2,
                                           0xa5, 'e', 'r', 'r', 'o', 'r', 0x82, 0xa4, 'c', 'o', 'd', 'e', 0x01,
                                           0xa7, 'm', 'e', 's', 's', 'a', 'g', 'e', 0xa0};
    FAIL(err_code_int, TR_EINVAL, "error.code: expected str");

    // Not msgpack at all, or not a map.
    static const uint8_t text[] = {'h', 'e', 'l', 'l', 'o'};
    FAIL(text, TR_EFORMAT, "trailing bytes");
    static const uint8_t arr[] = {0x91, 0x01};
    FAIL(arr, TR_EFORMAT, "expected a map");
    static const uint8_t c1[] = {0xc1};
    FAIL(c1, TR_EFORMAT, "0xc1");
    static const uint8_t ext[] = {0xd4, 0x01, 0x00};
    FAIL(ext, TR_EFORMAT, "ext type");
    static const uint8_t intkey[] = {0x81, 0x01, 0x02};
    FAIL(intkey, TR_EFORMAT, "not a string");
    FAIL(((const uint8_t[]){0x81}), TR_EFORMAT, "declares 2 elements");
    // Lying headers: a 2^32-1 element array/map in 5 bytes must be refused before any allocation.
    static const uint8_t huge_arr[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    FAIL(huge_arr, TR_EFORMAT, "declares 4294967295 elements");
    static const uint8_t huge_map[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xc0};
    FAIL(huge_map, TR_EFORMAT, "declares 8589934590 elements");
    static const uint8_t huge_str[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
    FAIL(huge_str, TR_EFORMAT, "truncated msgpack");
    FAIL(((const uint8_t[]){0xcb, 0, 0}), TR_EFORMAT, "truncated");
    // Deep nesting: 40 nested single-element arrays.
    uint8_t deep[41];
    memset(deep, 0x91, 40);
    deep[40] = 0x00;
    expect_fail(deep, sizeof deep, 1 << 20, TR_ERANGE, "nesting deeper", __LINE__);
    expect_fail(ok, 0, 1 << 20, TR_EFORMAT, "empty", __LINE__);
}

static void tensor_case(const uint8_t *t, size_t tn, const char *needle, int line) {
    // Wraps the tensor bytes as args.t of a request and reads it back.
    uint8_t buf[256];
    static const uint8_t head[] = {0x84, 0xa1, 'v', 0x02, 0xa2, 'o', 'p', 0xa1, 'x', 0xa2, 'i', 'd', 0x02,
                                   0xa4, 'a', 'r', 'g', 's', 0x81, 0xa1, 't'};
    memcpy(buf, head, sizeof head);
    memcpy(buf + sizeof head, t, tn);
    tr_msg m;
    tr_err e;
    tr_tensor_view v;
    tr_test_checks++;
    int rc = tr_msg_decode(&m, buf, sizeof head + tn, 1 << 20, &e);
    if (rc == 0) rc = tr_msg_get_tensor(&m.args, "t", &v, &e) == 0 ? 1 : 0;
    else rc = 2;
    if (rc != 0 || !has(&e, needle)) {
        tr_test_failures++;
        fprintf(stderr, "%s:%d: tensor case: rc %d '%s', wanted '%s'\n", __FILE__, line, rc, e.msg, needle);
    }
    tr_msg_free(&m);
}
#define TENSOR(bytes, needle) tensor_case(bytes, sizeof bytes, needle, __LINE__)

static void test_tensor_errors(void) {
    static const uint8_t bad_dtype[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa3, 'f', '6', '4',
                                        0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0x01, 0xa4, 'd', 'a', 't', 'a', 0xc4, 0x08,
                                        0, 0, 0, 0, 0, 0, 0, 0};
    TENSOR(bad_dtype, "unknown dtype 'f64'");
    static const uint8_t short_data[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa3, 'f', '3', '2',
                                         0xa5, 's', 'h', 'a', 'p', 'e', 0x92, 0x02, 0x02, 0xa4, 'd', 'a', 't', 'a',
                                         0xc4, 0x08, 0, 0, 0, 0, 0, 0, 0, 0};
    TENSOR(short_data, "8 bytes, shape and dtype need 16");
    static const uint8_t data_str[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'u', '8',
                                       0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0x01, 0xa4, 'd', 'a', 't', 'a', 0xa1, 'x'};
    TENSOR(data_str, "data: expected bin, got str");
    static const uint8_t neg_dim[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'u', '8',
                                      0xa5, 's', 'h', 'a', 'p', 'e', 0x91, 0xff, 0xa4, 'd', 'a', 't', 'a', 0xc4, 0x00};
    TENSOR(neg_dim, "shape[0]: expected a size");
    static const uint8_t dims9[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'u', '8',
                                    0xa5, 's', 'h', 'a', 'p', 'e', 0x99, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                    0xa4, 'd', 'a', 't', 'a', 0xc4, 0x01, 0};
    TENSOR(dims9, "9 dimensions");
    static const uint8_t missing[] = {0x82, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'u', '8',
                                      0xa4, 'd', 'a', 't', 'a', 0xc4, 0x01, 0};
    TENSOR(missing, "exactly {dtype, shape, data}");
    // 2^24 * 2^24 * 2^24 elements overflows the 2^48 element bound.
    static const uint8_t overflow[] = {0x83, 0xa5, 'd', 't', 'y', 'p', 'e', 0xa2, 'u', '8',
                                       0xa5, 's', 'h', 'a', 'p', 'e', 0x93,
                                       0xce, 0x01, 0, 0, 0, 0xce, 0x01, 0, 0, 0, 0xce, 0x01, 0, 0, 0,
                                       0xa4, 'd', 'a', 't', 'a', 0xc4, 0x00};
    TENSOR(overflow, "more than 2^48 elements");
}

int main(void) {
    test_spec_bytes();
    test_round_trip();
    test_replies();
    test_writer_errors();
    test_decode_errors();
    test_tensor_errors();
    return tr_test_summary("test_msg");
}
