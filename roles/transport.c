// The caller's side of an endpoint (transport_impl.h): send hands a message to the I/O
// thread over the inproc pipe, recv waits on that pipe for what the I/O thread forwards
// (messages, dead peers, its own failure). Router and dealer share it, so both report a
// dead peer, a failed I/O thread or a timeout the same way. Also the small helpers the
// other transport files share: the clock, ZeroMQ errors, role names.
#include "roles/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "roles/transport_impl.h"

int64_t tr_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tr_ep_zerr(tr_err *err, const char *what) {
    int e = zmq_errno();
    return tr_errf(err, e == ETERM ? TR_ECANCELED : TR_EIO, "%s: %s", what, zmq_strerror(e));
}

bool tr_ep_valid_role(const char *s, size_t n) {
    if (n == 0 || n >= TR_ROLE_NAME_MAX || s[0] < 'a' || s[0] > 'z') return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return false;
    return true;
}

// ---- caller side ----

int tr_ep_check(tr_endpoint *ep, tr_err *err) {
    pthread_mutex_lock(&ep->mu);
    int rc = 0;
    if (ep->io_failed) {
        if (err) *err = ep->io_err;
        rc = -1;
    }
    pthread_mutex_unlock(&ep->mu);
    return rc;
}

static void free_buffer(void *data, void *hint) {
    (void)hint;
    free(data);
}

// Sends data (len bytes); when owned is true data is a malloc'd buffer that ZeroMQ takes
// over without a copy (and frees), whatever the outcome.
static int ep_send_buf(tr_endpoint *ep, const char *peer, void *data, size_t len, bool owned, tr_err *err) {
    int rc = 0;
    if (tr_ep_check(ep, err)) rc = -1;
    if (!rc && len > ep->max_bytes)
        rc = tr_errf(err, TR_ERANGE, "message of %zu bytes to %s exceeds the maximum of %" PRIu64 " bytes", len,
                     peer[0] ? peer : "the controller", ep->max_bytes);
    pthread_mutex_lock(&ep->mu);
    if (rc) {
    } else if (ep->is_router) {
        peer_slot *s = tr_ep_find_peer(ep, peer);
        if (!s) rc = tr_errf(err, TR_EPEER, "peer %s has not said hello", peer);
        else if (s->p.dead) rc = tr_errf(err, TR_EPEER, "peer %s is dead (silent for over %d ms)", peer, ep->hb_timeout_ms);
    } else if (ep->controller_dead) {
        rc = tr_errf(err, TR_EPEER, "controller at %s is dead (silent for over %d ms)", ep->endpoint, ep->hb_timeout_ms);
    }
    if (!rc) ep->stats.sent++;
    pthread_mutex_unlock(&ep->mu);
    if (rc) {
        if (owned) free(data);
        return -1;
    }
    zmq_msg_t body;
    if (owned) {
        if (zmq_msg_init_data(&body, data, len, free_buffer, NULL) != 0) {
            free(data);
            return tr_ep_zerr(err, "zmq_msg_init_data");
        }
    } else {
        if (zmq_msg_init_size(&body, len) != 0) return tr_errf(err, TR_ENOMEM, "out of memory for a %zu-byte message", len);
        if (len) memcpy(zmq_msg_data(&body), data, len);
    }
    const char k = 'S';
    if (zmq_send(ep->pipe_app, &k, 1, ZMQ_SNDMORE) < 0 || zmq_send(ep->pipe_app, peer, strlen(peer), ZMQ_SNDMORE) < 0 ||
        zmq_msg_send(&body, ep->pipe_app, 0) < 0) {
        zmq_msg_close(&body);
        return tr_ep_zerr(err, "send to the transport thread");
    }
    return 0;
}

int tr_ep_send(tr_endpoint *ep, const char *peer, const void *data, size_t len, tr_err *err) {
    return ep_send_buf(ep, peer, (void *)data, len, false, err);
}

// Hands the writer's buffer to ZeroMQ (no copy of large tensors) and resets the writer.
int tr_ep_send_writer(tr_endpoint *ep, const char *peer, tr_msg_writer *w, tr_err *err) {
    const void *d;
    size_t n;
    if (tr_msg_writer_finish(w, &d, &n, err)) {
        tr_msg_writer_reset(w);
        return -1;
    }
    char *buf = msgpack_sbuffer_release(&w->buf);
    tr_msg_writer_reset(w);
    return ep_send_buf(ep, peer, buf, n, true, err);
}

void tr_wire_msg_free(tr_wire_msg *m) {
    tr_msg_free(&m->msg);
    if (m->frame_) {
        zmq_msg_close(m->frame_);
        free(m->frame_);
    }
    m->frame_ = NULL;
    m->peer[0] = '\0';
}

int tr_ep_recv(tr_endpoint *ep, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    memset(m, 0, sizeof *m);
    msgpack_unpacked_init(&m->msg.unpacked_);
    if (tr_ep_check(ep, err)) return -1;
    if (!ep->is_router) {
        pthread_mutex_lock(&ep->mu);
        bool dead = ep->controller_dead;
        pthread_mutex_unlock(&ep->mu);
        if (dead)
            return tr_errf(err, TR_EPEER, "controller at %s is dead (silent for over %d ms)", ep->endpoint,
                           ep->hb_timeout_ms);
    }
    int64_t deadline = timeout_ms < 0 ? -1 : tr_now_ms() + timeout_ms;
    for (;;) {
        long wait = 1000;
        if (deadline >= 0) {
            int64_t left = deadline - tr_now_ms();
            wait = left <= 0 ? 0 : left < 1000 ? (long)left : 1000;
        }
        zmq_pollitem_t it = {ep->pipe_app, 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(&it, 1, wait);
        if (rc < 0) {
            if (zmq_errno() == EINTR) return tr_errf(err, TR_ECANCELED, "interrupted while waiting for a message");
            return tr_ep_zerr(err, "zmq_poll");
        }
        if (rc == 0 && tr_ep_check(ep, err)) return -1;
        if (rc == 0 && (deadline < 0 || tr_now_ms() < deadline)) continue;
        if (rc == 0) {
            if (!ep->is_router) {
                pthread_mutex_lock(&ep->mu);
                bool dead = ep->controller_dead;
                pthread_mutex_unlock(&ep->mu);
                if (dead)
                    return tr_errf(err, TR_EPEER, "controller at %s is dead (silent for over %d ms)", ep->endpoint,
                                   ep->hb_timeout_ms);
            }
            return tr_errf(err, TR_ETIMEOUT, "no message within %d ms", timeout_ms);
        }
        zmq_msg_t f[3];
        int n = 0, more = 1;
        while (more && n < 3) {
            zmq_msg_init(&f[n]);
            if (zmq_msg_recv(&f[n], ep->pipe_app, 0) < 0) {
                zmq_msg_close(&f[n]);
                for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
                return tr_ep_zerr(err, "receive from the transport thread");
            }
            more = zmq_msg_more(&f[n]);
            n++;
        }
        char kind = *(char *)zmq_msg_data(&f[0]);
        char peer[TR_PEER_ID_MAX] = "";
        if (n >= 2) {
            size_t pl = zmq_msg_size(&f[1]) < sizeof peer ? zmq_msg_size(&f[1]) : sizeof peer - 1;
            memcpy(peer, zmq_msg_data(&f[1]), pl);
            peer[pl] = '\0';
        }
        if (kind == 'E') {
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            tr_ep_check(ep, err);
            return -1;
        }
        if (kind == 'D') {
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            if (ep->is_router)
                return tr_errf(err, TR_EPEER, "peer %s is dead (silent for over %d ms)", peer, ep->hb_timeout_ms);
            return tr_errf(err, TR_EPEER, "controller at %s is dead (silent for over %d ms)", ep->endpoint,
                           ep->hb_timeout_ms);
        }
        if (kind != 'M' || n != 3) {
            for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
            return tr_errf(err, TR_EIO, "transport thread sent a bad frame");
        }
        zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        zmq_msg_t *body = malloc(sizeof *body);
        if (!body) {
            zmq_msg_close(&f[2]);
            return tr_errf(err, TR_ENOMEM, "out of memory receiving a message");
        }
        zmq_msg_init(body);
        zmq_msg_move(body, &f[2]);
        zmq_msg_close(&f[2]);
        m->frame_ = body;
        memcpy(m->peer, peer, sizeof peer);
        if (tr_msg_decode(&m->msg, zmq_msg_data(body), zmq_msg_size(body), ep->max_bytes, err)) {
            tr_wire_msg_free(m);
            return tr_err_wrap(err, "message from %s", peer[0] ? peer : "the controller");
        }
        return 0;
    }
}
