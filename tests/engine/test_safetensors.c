// safetensors reader and writer against files written by the safetensors library (torch and
// numpy front ends) with the fp32 bit patterns torch converts them to (tools/
// make_io_fixtures.py), and against hostile files: every malformed case must fail with the
// file (and the tensor at fault) named, never crash.
#include "engine/json.h"
#include "engine/safetensors.h"
#include "engine/file.h"
#include "tests/test.h"

static char tmpdir[256];

static tr_json_doc load_json(const char *rel) {
    tr_json_doc doc = {0};
    char *text;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(tr_test_src(rel), &text, &len, &err) ||
        tr_json_parse(&doc, text, len, rel, &err)) {
        fprintf(stderr, "cannot load %s: %s\n", rel, err.msg);
        exit(1);
    }
    free(text);
    return doc;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static void test_dtypes_fixture(void) {
    tr_json_doc exp = load_json("tests/fixtures/io/dtypes.json");
    tr_st_file f;
    tr_err err = {0};
    CHECKF(tr_st_open(&f, tr_test_src("tests/fixtures/io/dtypes.safetensors"), &err) == 0, "%s",
           err.msg);
    CHECK(f.n_tensors == exp.root->count);
    CHECK(tr_st_metadata(&f, "format") && strcmp(tr_st_metadata(&f, "format"), "pt") == 0);
    CHECK(tr_st_metadata(&f, "producer") && strcmp(tr_st_metadata(&f, "producer"), "make_io_fixtures") == 0);
    CHECK(tr_st_metadata(&f, "absent") == NULL);
    for (const tr_json *e = exp.root->child; e; e = e->next) {
        const tr_st_tensor *t = tr_st_find(&f, e->key);
        CHECKF(t != NULL, "tensor %s not found", e->key);
        if (!t) continue;
        const tr_json *shape = tr_json_get(e, "shape");
        CHECK(t->ndim == shape->count);
        for (int32_t d = 0; d < t->ndim; d++) CHECK(t->shape[d] == tr_json_at(shape, d)->inum);
        const tr_json *bits = tr_json_get(e, "f32_bits");
        if (bits) {
            float *x = malloc((t->numel + 1) * sizeof *x);
            CHECKF(tr_st_read_f32(&f, t, x, &err) == 0, "%s", err.msg);
            CHECK((int64_t)t->numel == bits->count);
            int32_t i = 0;
            for (const tr_json *b = bits->child; b && i < (int32_t)t->numel; b = b->next, i++)
                CHECKF(f32_bits(x[i]) == (uint32_t)b->inum, "%s[%d]: %08x vs torch %08x", e->key, i,
                       f32_bits(x[i]), (uint32_t)b->inum);
            free(x);
            int64_t dummy[8];
            CHECK(t->numel > 8 || tr_st_read_i64(&f, t, dummy, &err) == -1);  // floats are not ints
        } else {
            const tr_json *vals = tr_json_get(e, "values");
            int64_t *v = malloc(t->numel * sizeof *v);
            CHECKF(tr_st_read_i64(&f, t, v, &err) == 0, "%s", err.msg);
            int32_t i = 0;
            for (const tr_json *s = vals->child; s; s = s->next, i++)
                CHECKF(v[i] == strtoll(s->str, NULL, 10), "%s[%d]", e->key, i);
            // Integer tensors are not silently read as floats.
            float *x = malloc(t->numel * sizeof *x);
            CHECK(tr_st_read_f32(&f, t, x, &err) == -1);
            CHECK(strstr(err.msg, "dtypes.safetensors") && strstr(err.msg, e->key));
            free(x);
            free(v);
        }
    }
    // fp32 -> bf16 rounding against torch's conversion of the same values.
    const tr_st_tensor *src = tr_st_find(&f, "bf16_src"), *dst = tr_st_find(&f, "bf16_of_src");
    CHECK(src && dst && src->numel == dst->numel);
    if (src && dst) {
        float *x = malloc(src->numel * sizeof *x);
        CHECK(tr_st_read_f32(&f, src, x, &err) == 0);
        int mismatches = 0;
        for (uint64_t i = 0; i < src->numel; i++) {
            uint16_t want;
            memcpy(&want, dst->data + 2 * i, 2);
            uint16_t got = tr_f32_to_bf16(x[i]);
            if (isnan(x[i]))  // torch's NaN payload depends on its code path; NaN must stay NaN
                CHECK(isnan(tr_bf16_to_f32(got)) && isnan(tr_bf16_to_f32(want)));
            else if (got != want)
                mismatches++;
        }
        CHECKF(mismatches == 0, "%d bf16 roundings differ from torch", mismatches);
        free(x);
    }
    tr_st_close(&f);
    tr_json_free(&exp);

    // numpy front end.
    exp = load_json("tests/fixtures/io/numpy_f32.json");
    CHECK(tr_st_open(&f, tr_test_src("tests/fixtures/io/numpy_f32.safetensors"), &err) == 0);
    const tr_st_tensor *a = tr_st_find(&f, "a");
    CHECK(a && a->dtype == TR_ST_F32 && a->ndim == 2 && a->shape[0] == 3 && a->shape[1] == 4);
    float x[12];
    CHECK(a && tr_st_read_f32(&f, a, x, &err) == 0);
    int32_t i = 0;
    for (const tr_json *v = tr_json_get(exp.root, "a")->child; v; v = v->next, i++)
        CHECK(x[i] == (float)v->num);
    CHECK(tr_st_find(&f, "b") && tr_st_find(&f, "c") == NULL);
    tr_st_close(&f);
    tr_json_free(&exp);
}

static void test_f16(void) {
    // IEEE binary16 reference values: 1.0, the largest normal, the smallest subnormal, NaN.
    CHECK(tr_f16_to_f32(0x3c00) == 1.0f);
    CHECK(tr_f16_to_f32(0x7bff) == 65504.0f);
    CHECK(tr_f16_to_f32(0x0001) == 0x1p-24f);
    CHECK(tr_f16_to_f32(0x0400) == 0x1p-14f);
    CHECK(tr_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    CHECK(isinf(tr_f16_to_f32(0xfc00)) && tr_f16_to_f32(0xfc00) < 0);
    CHECK(isnan(tr_f16_to_f32(0x7e00)));
    CHECK(signbit(tr_f16_to_f32(0x8000)) && tr_f16_to_f32(0x8000) == 0.0f);
    // bf16: round to nearest even at exact ties.
    CHECK(tr_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80);
    CHECK(tr_f32_to_bf16(1.0f + 0x1p-7f + 0x1p-8f) == 0x3f82);
}

// Writes an 8-byte length, the header text, and `data_len` bytes of data.
static const char *make_file(const char *name, uint64_t hlen_field, const char *header,
                             size_t data_len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_len;
    unsigned char *buf = calloc(1, total);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (unsigned char)i;
    tr_err err = {0};
    if (tr_file_write_atomic(path, buf, total, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(buf);
    return path;
}

// A file whose header length field is right, must fail with the name and `needle` in the
// message.
static void check_bad(const char *name, const char *header, size_t data_len, const char *needle) {
    const char *path = make_file(name, strlen(header), header, data_len);
    tr_st_file f;
    tr_err err = {0};
    int rc = tr_st_open(&f, path, &err);
    CHECKF(rc == -1, "%s was accepted", name);
    if (rc == 0) {
        tr_st_close(&f);
        return;
    }
    CHECKF(strstr(err.msg, name) != NULL, "%s: file not named: %s", name, err.msg);
    CHECKF(!needle || strstr(err.msg, needle) != NULL, "%s: '%s' not in: %s", name, needle, err.msg);
}

static void test_bad_files(void) {
    tr_st_file f;
    tr_err err = {0};
    CHECK(tr_st_open(&f, "/nonexistent/x.safetensors", &err) == -1);
    CHECK(err.code == TR_EIO && strstr(err.msg, "/nonexistent/x.safetensors"));
    CHECK(tr_st_open(&f, tmpdir, &err) == -1);  // a directory

    const char *p = make_file("empty.safetensors", 0, "", 0);
    char path[512];
    snprintf(path, sizeof path, "%s", p);
    CHECK(truncate(path, 0) == 0);
    CHECK(tr_st_open(&f, path, &err) == -1 && strstr(err.msg, "empty.safetensors") &&
          strstr(err.msg, "too short"));
    CHECK(truncate(path, 5) == 0);
    CHECK(tr_st_open(&f, path, &err) == -1 && strstr(err.msg, "too short"));

    // Header length field larger than the file, and absurdly large.
    p = make_file("hlen_big.safetensors", 1000, "{}", 0);
    CHECK(tr_st_open(&f, p, &err) == -1 && strstr(err.msg, "hlen_big") &&
          strstr(err.msg, "larger than the file"));
    p = make_file("hlen_huge.safetensors", UINT64_MAX - 3, "{}", 0);
    CHECK(tr_st_open(&f, p, &err) == -1 && strstr(err.msg, "exceeds"));
    p = make_file("hlen_zero.safetensors", 0, "{}", 0);
    CHECK(tr_st_open(&f, p, &err) == -1 && strstr(err.msg, "hlen_zero"));

    // Truncated copy of a real file: the last tensor's data runs past the end.
    char *data;
    size_t len;
    CHECK(tr_file_read(tr_test_src("tests/fixtures/io/numpy_f32.safetensors"), &data, &len, &err) == 0);
    snprintf(path, sizeof path, "%s/trunc.safetensors", tmpdir);
    CHECK(tr_file_write_atomic(path, data, len - 2, &err) == 0);
    CHECK(tr_st_open(&f, path, &err) == -1);
    CHECKF(strstr(err.msg, "trunc.safetensors") && strstr(err.msg, "'b'") &&
           strstr(err.msg, "truncated"), "%s", err.msg);
    // Same file cut inside the header.
    CHECK(tr_file_write_atomic(path, data, 30, &err) == 0);
    CHECK(tr_st_open(&f, path, &err) == -1 && strstr(err.msg, "trunc.safetensors"));
    free(data);

    // BF16 data at an even and at an odd address (no padding after the header): the bytes
    // 00 01 02 03 are the little-endian bf16 values 0x0100 and 0x0302.
    const char *hdrs[2] = {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}} ",
                           "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}  "};
    for (int k = 0; k < 2; k++) {
        const char *bp = make_file("bf16_align.safetensors", strlen(hdrs[k]), hdrs[k], 4);
        CHECK(tr_st_open(&f, bp, &err) == 0);
        CHECK(((uintptr_t)f.tensors[0].data % 2) == (uintptr_t)k);
        float v[2];
        CHECK(tr_st_read_f32(&f, &f.tensors[0], v, &err) == 0);
        CHECK(f32_bits(v[0]) == 0x01000000u && f32_bits(v[1]) == 0x03020000u);
        tr_st_close(&f);
    }

    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    const char *pp = make_file("good.safetensors", strlen(ok), ok, 8);
    CHECK(tr_st_open(&f, pp, &err) == 0);
    tr_st_close(&f);

    check_bad("notjson.safetensors", "{\"a\":", 0, "header");
    check_bad("notobj.safetensors", "{\"a\":[1]}", 0, "'a'");
    check_bad("array.safetensors", "[1,2]", 0, "'{'");
    check_bad("lies_size.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,8]}}", 8, "'w'");
    check_bad("lies_past_end.safetensors",
              "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "'w'");
    check_bad("overlap.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap");
    check_bad("overlap_same.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "overlap");
    check_bad("gap.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}", 16, "'b'");
    check_bad("trailing.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "after the last");
    check_bad("dtype.safetensors",
              "{\"a\":{\"dtype\":\"F31\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'F31'");
    check_bad("dtype_num.safetensors",
              "{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'a'");
    check_bad("neg_shape.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "'a'");
    check_bad("frac_shape.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "'a'");
    check_bad("offsets3.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", 8, "'a'");
    check_bad("backwards.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "'a'");
    check_bad("missing.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    check_bad("dims.safetensors",
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "'a'");
    check_bad("overflow.safetensors",
              "{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}",
              8, "'a'");
    check_bad("overflow2.safetensors",
              "{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}", 0,
              "'a'");
    check_bad("dup.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "duplicate");
    check_bad("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, "__metadata__");
    check_bad("meta2.safetensors", "{\"__metadata__\":[]}", 0, "__metadata__");
    check_bad("bigoffset.safetensors",
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,0]}}", 0,
              "'a'");
}

static void test_write(void) {
    float a[6] = {1.0f, -2.5f, 3.14159265f, 1e-30f, 1.00390625f, 65504.0f};  // 1+2^-8 is a tie
    float b[1] = {-0.0f};
    float c[1];
    tr_st_entry e[3] = {
        {.name = "layer.a", .ndim = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .ndim = 1, .shape = {1}, .data = b},
        {.name = "zero", .ndim = 2, .shape = {0, 5}, .data = c},
    };
    const char *meta[] = {"format", "pt"};
    char path[512];
    tr_err err = {0};
    for (int bf = 0; bf < 2; bf++) {
        enum tr_st_dtype dt = bf ? TR_ST_BF16 : TR_ST_F32;
        snprintf(path, sizeof path, "%s/w%d.safetensors", tmpdir, bf);
        CHECKF(tr_st_save(path, e, 3, dt, meta, 1, &err) == 0, "%s", err.msg);
        char *data;
        size_t len;
        CHECK(tr_file_read(path, &data, &len, &err) == 0);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | (unsigned char)data[i];
        CHECK((8 + hl) % 8 == 0);  // data section 8-byte aligned
        CHECK(len == 8 + hl + 7 * (bf ? 2 : 4));
        free(data);
        tr_st_file f;
        CHECKF(tr_st_open(&f, path, &err) == 0, "%s", err.msg);
        CHECK(f.n_tensors == 3 && strcmp(tr_st_metadata(&f, "format"), "pt") == 0);
        CHECK(strcmp(f.tensors[0].name, "layer.a") == 0);  // header order kept
        const tr_st_tensor *t = tr_st_find(&f, "layer.a");
        CHECK(t && t->dtype == dt && t->shape[0] == 2 && t->shape[1] == 3);
        float x[6];
        CHECK(tr_st_read_f32(&f, t, x, &err) == 0);
        for (int i = 0; i < 6; i++) {
            float want = bf ? tr_bf16_to_f32(tr_f32_to_bf16(a[i])) : a[i];
            CHECK(f32_bits(x[i]) == f32_bits(want));
        }
        if (bf) CHECK(x[4] == 1.0f && x[2] == 3.140625f);  // tie to even; 3.14159 -> 3.140625
        CHECK(tr_st_read_f32(&f, tr_st_find(&f, "b"), x, &err) == 0 && signbit(x[0]));
        CHECK(tr_st_find(&f, "zero")->numel == 0);
        tr_st_close(&f);
    }
    // Refused: other dtypes, duplicate names, the reserved name; nothing is left behind.
    snprintf(path, sizeof path, "%s/refused.safetensors", tmpdir);
    CHECK(tr_st_save(path, e, 3, TR_ST_F16, meta, 1, &err) == -1);
    tr_st_entry dup[2] = {e[1], e[1]};
    CHECK(tr_st_save(path, dup, 2, TR_ST_F32, NULL, 0, &err) == -1 && strstr(err.msg, "'b'"));
    tr_st_entry bad = {.name = "__metadata__", .ndim = 1, .shape = {1}, .data = b};
    CHECK(tr_st_save(path, &bad, 1, TR_ST_F32, NULL, 0, &err) == -1);
    CHECK(!tr_file_exists(path));
    snprintf(path, sizeof path, "%s/no/such/dir/x.safetensors", tmpdir);
    CHECK(tr_st_save(path, e, 1, TR_ST_F32, NULL, 0, &err) == -1 && strstr(err.msg, "no/such"));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", tr_test_tmpdir());
    test_dtypes_fixture();
    test_f16();
    test_bad_files();
    test_write();
    int rc = tr_test_summary("test_safetensors");
    if (rc == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return rc;
}
