// TensorBoard event encoding against bytes written by TensorBoard's own protobuf classes and
// RecordWriter (tools/make_tfevents_fixture.py), CRC-32C against its published check value,
// and the file writer's records read back frame by frame.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/file.h"
#include "rl/tfevents.h"
#include "tests/test.h"

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// Appends the framed event to out.
static void add(uint8_t *out, size_t *n, const uint8_t *ev, int64_t len) {
    CHECK(len > 0);
    if (len <= 0) return;
    int64_t f = tr_tfevents_frame(out + *n, 65536 - *n, ev, (size_t)len);
    CHECK(f == len + 16);
    if (f > 0) *n += (size_t)f;
}

static void test_crc(void) {
    // CRC-32C check value (RFC 3720 B.4, and the "123456789" catalogue entry).
    CHECK(tr_crc32c("123456789", 9) == 0xE3069283u);
    uint8_t zeros[32] = {0};
    CHECK(tr_crc32c(zeros, 32) == 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
    uint8_t ones[32];
    memset(ones, 0xFF, 32);
    CHECK(tr_crc32c(ones, 32) == 0x62A8AB43u);   // RFC 3720 B.4: 32 bytes of 0xFF
}

static void test_fixture(void) {
    char *want;
    size_t want_n;
    tr_err err = {0};
    if (tr_file_read(tr_test_src("tests/fixtures/rl/tfevents.bin"), &want, &want_n, &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    char long_tag[256] = "long/";
    memset(long_tag + 5, 'x', 200);
    long_tag[205] = '\0';
    uint8_t *out = malloc(65536), ev[4096];
    size_t n = 0;
    add(out, &n, ev, tr_tfevents_encode_version(ev, sizeof ev, 1700000000.25));
    const char *t1[] = {"reward/mean", "eval/accuracy"};
    const double v1[] = {0.0, 0.375};
    add(out, &n, ev, tr_tfevents_encode_scalars(ev, sizeof ev, 1700000001.5, 0, t1, v1, 2));
    const char *t2[] = {"loss", "lr", long_tag};
    const double v2[] = {-1.25e-3, 1e-4, 3.0};
    add(out, &n, ev, tr_tfevents_encode_scalars(ev, sizeof ev, 1700000002.75, 7, t2, v2, 3));
    add(out, &n, ev, tr_tfevents_encode_session_start(ev, sizeof ev, 1700000003.0, 5));
    const char *t3[] = {"time/train"};
    const double v3[] = {12.5};
    add(out, &n, ev, tr_tfevents_encode_scalars(ev, sizeof ev, 1700000004.0, 300, t3, v3, 1));
    CHECKF(n == want_n, "%zu bytes vs %zu", n, want_n);
    CHECK(n == want_n && memcmp(out, want, n) == 0);
    for (size_t i = 0; i < n && i < want_n; i++)
        if (out[i] != (uint8_t)want[i]) {
            CHECKF(0, "first difference at byte %zu", i);
            break;
        }
    // A buffer one byte short is refused, not overrun.
    int64_t full = tr_tfevents_encode_scalars(ev, sizeof ev, 1.0, 7, t2, v2, 3);
    CHECK(tr_tfevents_encode_scalars(ev, (size_t)full - 1, 1.0, 7, t2, v2, 3) == -1);
    free(out);
    free(want);
}

static void test_writer(void) {
    const char *dir = tr_test_tmpdir();
    char tb[512];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    tr_tfevents w;
    tr_err err = {0};
    CHECK(tr_tfevents_open(&w, tb, 1700000000.0, &err) == 0);
    const char *tags[] = {"a", "b", "nan"};
    const double vals[] = {1.0, 2.0, NAN};
    CHECK(tr_tfevents_scalars(&w, 1700000001.0, 3, tags, vals, 3, &err) == 0);
    CHECK(tr_tfevents_flush(&w, &err) == 0);
    char path[4096];
    snprintf(path, sizeof path, "%s", w.path);
    tr_tfevents_close(&w);
    CHECK(strstr(path, "/events.out.tfevents.1700000000.") != NULL);
    char *data;
    size_t len;
    CHECK(tr_file_read(path, &data, &len, &err) == 0);
    // Walk the records: each frame's CRCs must hold; the second record equals the encoder's
    // output for the finite values only.
    uint8_t ev[256];
    int64_t ev_n[2] = {tr_tfevents_encode_version(ev, sizeof ev, 1700000000.0), 0};
    int records = 0;
    size_t off = 0;
    while (off + 12 <= len) {
        const uint8_t *p = (const uint8_t *)data + off;
        uint64_t n = le64(p);
        CHECK(le32(p + 8) == tr_crc32c_masked(p, 8));
        CHECK(off + 16 + n <= len);
        if (off + 16 + n > len) break;
        CHECK(le32(p + 12 + n) == tr_crc32c_masked(p + 12, n));
        if (records == 0) CHECK((int64_t)n == ev_n[0] && memcmp(p + 12, ev, n) == 0);
        if (records == 1) {
            int64_t k = tr_tfevents_encode_scalars(ev, sizeof ev, 1700000001.0, 3, tags, vals, 2);
            CHECK((int64_t)n == k && memcmp(p + 12, ev, n) == 0);
        }
        records++;
        off += 16 + n;
    }
    CHECK(records == 2 && off == len);
    free(data);
}

int main(void) {
    test_crc();
    test_fixture();
    test_writer();
    return tr_test_summary("test_tfevents");
}
