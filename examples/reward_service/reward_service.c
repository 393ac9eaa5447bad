// Example reward service in C, speaking troupe's reward service protocol (docs/protocol.md):
// a REP socket receives {"op": "score", "items": [{"prompt", "response", "meta"}]} and
// answers {"scores": [...]}: 1.0 when the last number in the response equals meta.answer,
// else 0.0. Malformed requests get {"error": "..."} (a REP socket must answer every request).
//
//   reward_service ENDPOINT        e.g. reward_service tcp://127.0.0.1:5555
//
// It prints "listening on ENDPOINT" once bound and stops on SIGINT or SIGTERM.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "roles/msg.h"
#include "roles/reward_rule.h"

static volatile sig_atomic_t stop;

static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

// The answer as a number: a msgpack number, or the last number in a string.
static int answer_value(const tr_msg_map *meta, double *out, tr_err *err) {
    if (tr_msg_get_float(meta, "answer", out, NULL) == 0) return 0;
    tr_msg_str s;
    if (tr_msg_get_str(meta, "answer", &s, err)) return -1;
    if (!tr_reward_last_number(s.ptr, s.len, out))
        return tr_errf(err, TR_EINVAL, "meta.answer '%.*s' holds no number", (int)(s.len > 40 ? 40 : s.len), s.ptr);
    return 0;
}

// Scores one request into w; -1 with err for a malformed request.
static int score_request(const void *buf, size_t len, tr_msg_writer *w, tr_err *err) {
    if (tr_msg_check_msgpack(buf, len, err)) return -1;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc = -1;
    tr_msg_map req;
    tr_msg_str op;
    tr_msg_array items;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        tr_errf(err, TR_EFORMAT, "request is not msgpack");
        goto out;
    }
    if (tr_msg_map_wrap(&req, &u.data, "score", "request", err) || tr_msg_get_str(&req, "op", &op, err) ||
        tr_msg_get_array(&req, "items", &items, err))
        goto out;
    if (op.len != 5 || memcmp(op.ptr, "score", 5) != 0) {
        tr_errf(err, TR_EUNSUPPORTED, "unknown op '%.*s'", (int)(op.len > 32 ? 32 : op.len), op.ptr);
        goto out;
    }
    tr_msg_put_map(w, NULL, 1);
    tr_msg_put_array(w, "scores", items.n);
    for (uint32_t i = 0; i < items.n; i++) {
        tr_msg_map item, meta;
        tr_msg_str resp;
        double want, got;
        if (tr_msg_array_map(&items, i, &item, err) || tr_msg_get_str(&item, "response", &resp, err) ||
            tr_msg_get_map(&item, "meta", &meta, err) || answer_value(&meta, &want, err))
            goto out;
        bool hit = tr_reward_last_number(resp.ptr, resp.len, &got) && tr_reward_numbers_equal(got, want, 1e-9);
        tr_msg_put_float(w, NULL, hit ? 1.0 : 0.0);
    }
    rc = 0;
out:
    msgpack_unpacked_destroy(&u);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: reward_service ENDPOINT   (e.g. tcp://127.0.0.1:5555)\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_REP) : NULL;
    if (!sock || zmq_bind(sock, argv[1]) != 0) {
        fprintf(stderr, "reward_service: cannot bind %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        if (ctx) zmq_ctx_term(ctx);
        return 1;
    }
    // A signal that lands while ZeroMQ is busy (not blocked in poll) does not interrupt the
    // next receive, so the receive wakes up by itself to look at the stop flag.
    int wake_ms = 200;
    if (zmq_setsockopt(sock, ZMQ_RCVTIMEO, &wake_ms, sizeof wake_ms) != 0) {
        fprintf(stderr, "reward_service: ZMQ_RCVTIMEO: %s\n", zmq_strerror(zmq_errno()));
        zmq_close(sock);
        zmq_ctx_term(ctx);
        return 1;
    }
    char ep[256];
    size_t n = sizeof ep;
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &n) != 0) snprintf(ep, sizeof ep, "%s", argv[1]);
    printf("listening on %s\n", ep);
    fflush(stdout);
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    int status = 0;
    while (!stop) {
        zmq_msg_t req;
        zmq_msg_init(&req);
        if (zmq_msg_recv(&req, sock, 0) < 0) {
            zmq_msg_close(&req);
            if (zmq_errno() == EINTR || zmq_errno() == EAGAIN) continue;
            fprintf(stderr, "reward_service: receive: %s\n", zmq_strerror(zmq_errno()));
            status = 1;
            break;
        }
        // A request of several frames is malformed; its other frames are read and ignored.
        int more = zmq_msg_more(&req);
        while (more) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            more = zmq_msg_recv(&x, sock, 0) >= 0 && zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        tr_err err;
        tr_msg_writer_reset(&w);
        if (score_request(zmq_msg_data(&req), zmq_msg_size(&req), &w, &err)) {
            tr_msg_writer_reset(&w);
            tr_msg_put_map(&w, NULL, 1);
            tr_msg_put_str(&w, "error", err.msg);
        }
        zmq_msg_close(&req);
        const void *d;
        size_t len;
        if (tr_msg_writer_finish(&w, &d, &len, &err)) {
            fprintf(stderr, "reward_service: reply: %s\n", err.msg);
            status = 1;
            break;
        }
        if (zmq_send(sock, d, len, 0) < 0) {
            if (zmq_errno() == EINTR) continue;
            fprintf(stderr, "reward_service: send: %s\n", zmq_strerror(zmq_errno()));
            status = 1;
            break;
        }
    }
    tr_msg_writer_free(&w);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return status;
}
