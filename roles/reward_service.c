// External reward service client. One REQ socket per client, recreated after a timeout:
// a REQ socket whose reply never came cannot send again, and a fresh socket also drops
// whatever was still queued for a hung service.
#include "roles/reward_service.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "roles/curve.h"
#include "roles/json_pack.h"
#include "roles/msg.h"

struct tr_reward_service {
    tr_reward_service_opts o;
    char endpoint[256];
    void *ctx, *sock;
    tr_curve_keypair own, server;
    bool curve;
    tr_msg_writer w;
    char *scratch;  // UTF-8 sanitizing buffer
    size_t scratch_cap;
    tr_reward_service_stats stats;
};

int tr_reward_service_policy_from_name(const char *name) {
    if (strcmp(name, "fail") == 0) return TR_REWARD_POLICY_FAIL;
    if (strcmp(name, "zero") == 0) return TR_REWARD_POLICY_ZERO;
    return -1;
}

static int zfail(tr_reward_service *s, tr_err *err, const char *what) {
    return tr_errf(err, TR_EIO, "reward service %s: %s: %s", s->endpoint, what, zmq_strerror(zmq_errno()));
}

static int open_socket(tr_reward_service *s, tr_err *err) {
    s->sock = zmq_socket(s->ctx, ZMQ_REQ);
    if (!s->sock) return zfail(s, err, "zmq_socket");
    int one = 1, zero = 0;
    // ZeroMQ drops a message over its cap without a word (the wait times out), so its cap is
    // twice max_reply_bytes: a reply between the two arrives and is refused naming its size.
    int64_t maxb = s->o.max_reply_bytes > (uint64_t)INT64_MAX / 2 ? -1 : (int64_t)(2 * s->o.max_reply_bytes);
    if (zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero) || zmq_setsockopt(s->sock, ZMQ_REQ_CORRELATE, &one, sizeof one) ||
        zmq_setsockopt(s->sock, ZMQ_REQ_RELAXED, &one, sizeof one) || zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxb, sizeof maxb))
        return zfail(s, err, "socket options");
    if (s->curve &&
        (zmq_setsockopt(s->sock, ZMQ_CURVE_SERVERKEY, s->server.public_key, TR_CURVE_KEY_LEN + 1) ||
         zmq_setsockopt(s->sock, ZMQ_CURVE_PUBLICKEY, s->own.public_key, TR_CURVE_KEY_LEN + 1) ||
         zmq_setsockopt(s->sock, ZMQ_CURVE_SECRETKEY, s->own.secret_key, TR_CURVE_KEY_LEN + 1)))
        return zfail(s, err, "CURVE keys");
    if (zmq_connect(s->sock, s->endpoint) != 0) return zfail(s, err, "connect");
    return 0;
}

static void close_socket(tr_reward_service *s) {
    if (s->sock) zmq_close(s->sock);
    s->sock = NULL;
}

int tr_reward_service_init(tr_reward_service **out, const tr_reward_service_opts *o, tr_err *err) {
    *out = NULL;
    if (!o->endpoint || !o->endpoint[0]) return tr_errf(err, TR_EINVAL, "reward service: no endpoint");
    if (strlen(o->endpoint) >= 256) return tr_errf(err, TR_EINVAL, "reward service: endpoint too long");
    if (o->timeout_ms < 0 || o->attempts < 0 || o->backoff_ms < 0 || o->backoff_max_ms < 0 || o->max_items < 0)
        return tr_errf(err, TR_EINVAL, "reward service %s: negative timeout, attempts, backoff or max_items", o->endpoint);
    if (o->policy != TR_REWARD_POLICY_FAIL && o->policy != TR_REWARD_POLICY_ZERO)
        return tr_errf(err, TR_EINVAL, "reward service %s: unknown failure policy %d", o->endpoint, o->policy);
    tr_reward_service *s = calloc(1, sizeof *s);
    if (!s) return tr_errf(err, TR_ENOMEM, "out of memory for a reward service client");
    s->o = *o;
    snprintf(s->endpoint, sizeof s->endpoint, "%s", o->endpoint);
    s->o.endpoint = s->endpoint;
    if (!s->o.timeout_ms) s->o.timeout_ms = 5000;
    if (!s->o.attempts) s->o.attempts = 3;
    if (!s->o.backoff_ms) s->o.backoff_ms = 100;
    if (!s->o.backoff_max_ms) s->o.backoff_max_ms = 5000;
    if (!s->o.max_items) s->o.max_items = 64;
    if (!s->o.max_reply_bytes) s->o.max_reply_bytes = (uint64_t)16 << 20;
    if (s->o.max_reply_bytes > (uint64_t)INT64_MAX) s->o.max_reply_bytes = (uint64_t)INT64_MAX;
    tr_msg_writer_init(&s->w);
    if (o->curve.key_file || o->curve.server_key_file) {
        if (!o->curve.key_file || !o->curve.server_key_file) {
            tr_errf(err, TR_EINVAL, "reward service %s: CURVE needs both curve.key_file and curve.server_key_file",
                    o->endpoint);
            goto fail;
        }
        if (tr_curve_key_read(o->curve.key_file, &s->own, err) || tr_curve_key_read(o->curve.server_key_file, &s->server, err))
            goto fail;
        if (!s->own.secret_key[0]) {
            tr_errf(err, TR_EINVAL, "%s: no secret-key (a key pair file is needed)", o->curve.key_file);
            goto fail;
        }
        s->curve = true;
    }
    // Copies of the caller's pointers would dangle; CURVE keys were read above.
    memset(&s->o.curve, 0, sizeof s->o.curve);
    s->ctx = zmq_ctx_new();
    if (!s->ctx) {
        zfail(s, err, "zmq_ctx_new");
        goto fail;
    }
    if (open_socket(s, err)) goto fail;
    *out = s;
    return 0;
fail:
    tr_reward_service_free(s);
    return -1;
}

void tr_reward_service_free(tr_reward_service *s) {
    if (!s) return;
    close_socket(s);
    if (s->ctx) {
        while (zmq_ctx_term(s->ctx) != 0 && zmq_errno() == EINTR) {
        }
    }
    tr_msg_writer_free(&s->w);
    memset(&s->own, 0, sizeof s->own);
    free(s->scratch);
    free(s);
}

void tr_reward_service_get_stats(const tr_reward_service *s, tr_reward_service_stats *out) { *out = s->stats; }

// Length of the valid UTF-8 sequence at p (1-4), or 0 if invalid (overlong, surrogate,
// beyond U+10FFFF, truncated).
static size_t utf8_seq(const unsigned char *p, size_t left) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t n;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0) n = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0) n = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0) n = 4, cp = c & 0x07, min = 0x10000;
    else return 0;
    if (n > left) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n;
}

// Packs text as a msgpack str, replacing invalid UTF-8 with U+FFFD so that services whose
// msgpack library decodes str as UTF-8 (Python's does) accept every response.
static int put_text(tr_reward_service *s, const char *key, const char *text, tr_err *err) {
    const unsigned char *p = (const unsigned char *)(text ? text : "");
    size_t len = strlen((const char *)p), i = 0;
    while (i < len) {
        size_t k = utf8_seq(p + i, len - i);
        if (!k) break;
        i += k;
    }
    if (i == len) {
        tr_msg_put_strn(&s->w, key, (const char *)p, len);
        return 0;
    }
    if (len > (SIZE_MAX - 1) / 3) return tr_errf(err, TR_ENOMEM, "reward service: text too long");
    size_t need = 3 * len + 1;
    if (need > s->scratch_cap) {
        char *b = realloc(s->scratch, need);
        if (!b) return tr_errf(err, TR_ENOMEM, "reward service: out of memory sanitizing text");
        s->scratch = b;
        s->scratch_cap = need;
    }
    size_t o = 0;
    for (i = 0; i < len;) {
        size_t k = utf8_seq(p + i, len - i);
        if (k) {
            memcpy(s->scratch + o, p + i, k);
            o += k;
            i += k;
        } else {
            memcpy(s->scratch + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    tr_msg_put_strn(&s->w, key, s->scratch, o);
    return 0;
}

static int build_request(tr_reward_service *s, const tr_reward_item *items, int n, int64_t first, tr_err *err) {
    tr_msg_writer_reset(&s->w);
    tr_msg_put_map(&s->w, NULL, 2);
    tr_msg_put_str(&s->w, "op", "score");
    tr_msg_put_array(&s->w, "items", (uint32_t)n);
    for (int i = 0; i < n; i++) {
        tr_msg_put_map(&s->w, NULL, 3);
        if (put_text(s, "prompt", items[i].prompt, err) || put_text(s, "response", items[i].response, err)) return -1;
        if (items[i].meta_json) {
            if (tr_json_pack_object(&s->w, "meta", items[i].meta_json, err))
                return tr_err_wrap(err, "reward service %s: item %" PRId64 " meta", s->endpoint, first + i);
        } else {
            tr_msg_put_map(&s->w, "meta", 0);
        }
    }
    return 0;
}

// Checks a reply and copies its scores; -1 with a description of the garbage.
static int parse_reply(const void *buf, size_t len, int n, float *scores, bool *service_error,
                       tr_err *err) {
    *service_error = false;
    if (tr_msg_check_msgpack(buf, len, err)) return tr_err_wrap(err, "reply is not msgpack");
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc = 0;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        rc = tr_errf(err, TR_EFORMAT, "reply is not msgpack");
        goto out;
    }
    tr_msg_map m;
    if (tr_msg_map_wrap(&m, &u.data, "score", "reply", err)) {
        rc = -1;
        goto out;
    }
    if (!tr_msg_has(&m, "scores") && tr_msg_has(&m, "error")) {
        char msg[512];
        *service_error = true;
        if (tr_msg_get_str_buf(&m, "error", msg, sizeof msg, err)) snprintf(msg, sizeof msg, "(unreadable error)");
        rc = tr_errf(err, TR_EPEER, "service error: %s", msg);
        goto out;
    }
    tr_msg_array a;
    if (tr_msg_get_array(&m, "scores", &a, err)) {
        rc = -1;
        goto out;
    }
    if (a.n != (uint32_t)n) {
        rc = tr_errf(err, TR_EFORMAT, "%u scores for %d items", a.n, n);
        goto out;
    }
    for (int i = 0; i < n; i++) {
        double v;
        if (tr_msg_array_float(&a, (uint32_t)i, &v, err)) {
            rc = -1;
            goto out;
        }
        if (!isfinite(v)) {
            rc = tr_errf(err, TR_EFORMAT, "score %d is %s", i, isnan(v) ? "NaN" : "infinite");
            goto out;
        }
        scores[i] = (float)v;
    }
out:
    msgpack_unpacked_destroy(&u);
    return rc;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

// Receives the whole reply (all frames) into a zmq message; 0 = got one, 1 = timed out.
static int wait_reply(tr_reward_service *s, zmq_msg_t *reply, int *frames, tr_err *err) {
    int64_t deadline = tr_now_ms() + s->o.timeout_ms;
    for (;;) {
        int64_t left = deadline - tr_now_ms();
        if (left <= 0) return 1;
        zmq_pollitem_t it = {s->sock, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, (long)left);
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            return zfail(s, err, "zmq_poll");
        }
        if (rc == 0) continue;
        *frames = 0;
        int more = 1;
        while (more) {
            zmq_msg_t f;
            zmq_msg_init(&f);
            if (zmq_msg_recv(&f, s->sock, 0) < 0) {
                zmq_msg_close(&f);
                return zfail(s, err, "receive");
            }
            more = zmq_msg_more(&f);
            if (*frames == 0) zmq_msg_move(reply, &f);
            zmq_msg_close(&f);
            (*frames)++;
        }
        return 0;
    }
}

// One batch through all attempts. Returns 0 with scores, or -1 with what went wrong last.
static int score_batch(tr_reward_service *s, int64_t first, int n, float *scores, tr_err *err) {
    const void *req;
    size_t req_len;
    if (tr_msg_writer_finish(&s->w, &req, &req_len, err)) return -2;
    int backoff = s->o.backoff_ms;
    for (int attempt = 0; attempt < s->o.attempts; attempt++) {
        if (attempt > 0) {
            s->stats.retries++;
            sleep_ms(backoff);
            backoff = backoff > s->o.backoff_max_ms / 2 ? s->o.backoff_max_ms : 2 * backoff;
        }
        if (!s->sock && open_socket(s, err)) return -2;
        s->stats.requests++;
        if (zmq_send(s->sock, req, req_len, 0) != (int)req_len) {
            zfail(s, err, "send");
            close_socket(s);
            s->stats.reconnects++;
            continue;
        }
        zmq_msg_t reply;
        zmq_msg_init(&reply);
        int frames = 0;
        int rc = wait_reply(s, &reply, &frames, err);
        if (rc < 0) {
            zmq_msg_close(&reply);
            close_socket(s);
            s->stats.reconnects++;
            continue;
        }
        if (rc == 1) {
            zmq_msg_close(&reply);
            s->stats.timeouts++;
            tr_errf(err, TR_ETIMEOUT, "no reply within %d ms (ZeroMQ drops replies over %" PRIu64 " bytes unread)",
                    s->o.timeout_ms, 2 * s->o.max_reply_bytes);
            // The REQ socket still waits for that reply: start over on a new one.
            close_socket(s);
            s->stats.reconnects++;
            continue;
        }
        bool service_error = false;
        if (frames != 1) {
            tr_errf(err, TR_EFORMAT, "reply of %d frames (one expected)", frames);
            rc = -1;
        } else if (zmq_msg_size(&reply) > s->o.max_reply_bytes) {
            tr_errf(err, TR_ERANGE, "reply of %zu bytes is over max_reply_bytes (%" PRIu64 ")", zmq_msg_size(&reply),
                    s->o.max_reply_bytes);
            rc = -1;
        } else {
            rc = parse_reply(zmq_msg_data(&reply), zmq_msg_size(&reply), n, scores, &service_error, err);
        }
        zmq_msg_close(&reply);
        if (rc == 0) {
            s->stats.items_scored += (uint64_t)n;
            return 0;
        }
        if (service_error) s->stats.service_errors++;
        else s->stats.garbage++;
    }
    return tr_err_wrap(err, "reward service %s: items %" PRId64 "..%" PRId64 ": %d attempts failed, the last",
                       s->endpoint, first, first + n - 1, s->o.attempts);
}

int tr_reward_service_score(tr_reward_service *s, const tr_reward_item *items, int n, int64_t base,
                            float *scores, tr_err *err) {
    if (n < 0) return tr_errf(err, TR_EINVAL, "reward service %s: negative item count", s->endpoint);
    for (int first = 0; first < n; first += s->o.max_items) {
        int k = n - first < s->o.max_items ? n - first : s->o.max_items;
        if (build_request(s, items + first, k, base + first, err)) return -1;
        int rc = score_batch(s, base + first, k, scores + first, err);
        if (rc == -2) return -1;
        if (rc == 0) continue;
        if (s->o.policy == TR_REWARD_POLICY_FAIL) return -1;
        for (int i = 0; i < k; i++) scores[first + i] = 0.0f;
        s->stats.items_failed += (uint64_t)k;
    }
    return 0;
}
