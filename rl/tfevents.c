// TensorBoard event files: the protobuf wire format of Event / Summary / SessionLog for the
// few fields troupe writes (fields in number order, as protobuf serializers emit them), and
// TFRecord framing with masked CRC-32C.
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "engine/file.h"
#include "rl/tfevents.h"

// Reflected CRC-32C, polynomial 0x82F63B78, bit by bit: events are a few hundred bytes, and
// a table would be global state to initialise.
uint32_t tr_crc32c(const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

uint32_t tr_crc32c_masked(const void *data, size_t n) {
    uint32_t c = tr_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

// A bounded output cursor: every put checks room and marks overflow instead of writing.
typedef struct pb {
    uint8_t *p;
    size_t n, cap;
    bool over;
} pb;

static void put(pb *b, const void *src, size_t n) {
    if (b->over || b->cap - b->n < n) {
        b->over = true;
        return;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_byte(pb *b, uint8_t v) { put(b, &v, 1); }

static void put_varint(pb *b, uint64_t v) {
    while (v >= 0x80) {
        put_byte(b, (uint8_t)(v | 0x80));
        v >>= 7;
    }
    put_byte(b, (uint8_t)v);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void put_le(pb *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) put_byte(b, (uint8_t)(v >> (8 * i)));
}

static void put_double(pb *b, double d) {
    uint64_t u;
    memcpy(&u, &d, 8);
    put_le(b, u, 8);
}

// Event fields 1 (wall_time, double) and 2 (step, int64); proto3 leaves out zeros.
static void put_event_head(pb *b, double wall_time, int64_t step) {
    if (wall_time != 0) {
        put_byte(b, 0x09);
        put_double(b, wall_time);
    }
    if (step != 0) {
        put_byte(b, 0x10);
        put_varint(b, (uint64_t)step);
    }
}

static int64_t done(const pb *b) { return b->over ? -1 : (int64_t)b->n; }

int64_t tr_tfevents_encode_version(uint8_t *buf, size_t cap, double wall_time) {
    static const char version[] = "brain.Event:2";
    pb b = {buf, 0, cap, false};
    put_event_head(&b, wall_time, 0);
    put_byte(&b, 0x1a);
    put_varint(&b, sizeof version - 1);
    put(&b, version, sizeof version - 1);
    return done(&b);
}

int64_t tr_tfevents_encode_scalars(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                                   const char *const *tags, const double *values, int n) {
    pb b = {buf, 0, cap, false};
    put_event_head(&b, wall_time, step);
    // Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value = 2 }.
    size_t summary_len = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i])) continue;
        size_t tl = strlen(tags[i]);
        size_t vl = 1 + varint_len(tl) + tl + 1 + 4;
        summary_len += 1 + varint_len(vl) + vl;
    }
    put_byte(&b, 0x2a);
    put_varint(&b, summary_len);
    for (int i = 0; i < n; i++) {
        if (!isfinite(values[i])) continue;
        size_t tl = strlen(tags[i]);
        size_t vl = 1 + varint_len(tl) + tl + 1 + 4;
        put_byte(&b, 0x0a);
        put_varint(&b, vl);
        put_byte(&b, 0x0a);
        put_varint(&b, tl);
        put(&b, tags[i], tl);
        put_byte(&b, 0x15);
        float f = (float)values[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        put_le(&b, u, 4);
    }
    return done(&b);
}

int64_t tr_tfevents_encode_session_start(uint8_t *buf, size_t cap, double wall_time,
                                         int64_t step) {
    pb b = {buf, 0, cap, false};
    put_event_head(&b, wall_time, step);
    // Event.session_log (field 7) = SessionLog { status = START (1) }.
    put_byte(&b, 0x3a);
    put_byte(&b, 2);
    put_byte(&b, 0x08);
    put_byte(&b, 0x01);
    return done(&b);
}

int64_t tr_tfevents_frame(uint8_t *buf, size_t cap, const uint8_t *data, size_t n) {
    pb b = {buf, 0, cap, false};
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    put(&b, len, 8);
    put_le(&b, tr_crc32c_masked(len, 8), 4);
    put(&b, data, n);
    put_le(&b, tr_crc32c_masked(data, n), 4);
    return done(&b);
}

static int write_record(tr_tfevents *w, const uint8_t *data, int64_t n, tr_err *err) {
    if (n < 0) return tr_errf(err, TR_ERANGE, "%s: event larger than the encoder's buffer", w->path);
    uint8_t frame[8192 + 16];
    int64_t fn = tr_tfevents_frame(frame, sizeof frame, data, (size_t)n);
    if (fn < 0 || fwrite(frame, 1, (size_t)fn, w->f) != (size_t)fn)
        return tr_errf(err, TR_EIO, "%s: write failed: %s", w->path, strerror(errno));
    return 0;
}

int tr_tfevents_open(tr_tfevents *w, const char *dir, double wall_time, tr_err *err) {
    memset(w, 0, sizeof *w);
    if (tr_mkdirs(dir, err)) return -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    int len = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%lld", dir,
                       (long long)wall_time, host, (long long)getpid());
    if (len < 0 || (size_t)len >= sizeof w->path)
        return tr_errf(err, TR_ERANGE, "%s: TensorBoard directory path too long", dir);
    // A resumed run in the same second gets the same name from the same pid only if it is
    // the same process; append rather than clobber in that case.
    w->f = fopen(w->path, "ab");
    if (!w->f) return tr_errf(err, TR_EIO, "%s: cannot create: %s", w->path, strerror(errno));
    uint8_t ev[64];
    if (write_record(w, ev, tr_tfevents_encode_version(ev, sizeof ev, wall_time), err) ||
        tr_tfevents_flush(w, err)) {
        tr_tfevents_close(w);
        return -1;
    }
    return 0;
}

int tr_tfevents_scalars(tr_tfevents *w, double wall_time, int64_t step, const char *const *tags,
                        const double *values, int n, tr_err *err) {
    uint8_t ev[8192];
    return write_record(w, ev, tr_tfevents_encode_scalars(ev, sizeof ev, wall_time, step, tags,
                                                          values, n), err);
}

int tr_tfevents_session_start(tr_tfevents *w, double wall_time, int64_t step, tr_err *err) {
    uint8_t ev[64];
    return write_record(w, ev, tr_tfevents_encode_session_start(ev, sizeof ev, wall_time, step),
                        err);
}

int tr_tfevents_flush(tr_tfevents *w, tr_err *err) {
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
        return tr_errf(err, TR_EIO, "%s: flush failed: %s", w->path, strerror(errno));
    return 0;
}

void tr_tfevents_close(tr_tfevents *w) {
    if (w->f) fclose(w->f);
    w->f = NULL;
}
