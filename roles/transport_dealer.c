// A worker rank's end, tr_dealer (transport.h): connects a DEALER named "<role>/<rank>" and
// says hello before the I/O thread starts, since the reply carries the heartbeat settings and
// message limit the thread then runs with.
#include "roles/transport.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "roles/transport_impl.h"

struct tr_dealer {
    tr_endpoint ep;
};

static int dealer_hello(tr_endpoint *ep, const tr_dealer_opts *o, tr_err *err) {
    char host[TR_HOST_NAME_MAX] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_begin_request(&w, "hello", 1, 6);
    tr_msg_put_str(&w, "role", o->role);
    tr_msg_put_int(&w, "rank", o->rank);
    tr_msg_put_int(&w, "world", o->world);
    tr_msg_put_int(&w, "pid", (int64_t)getpid());
    tr_msg_put_int(&w, "protocol", TR_PROTOCOL_VERSION);
    tr_msg_put_str(&w, "host", host);
    const void *d;
    size_t n;
    int rc = tr_msg_writer_finish(&w, &d, &n, err);
    if (!rc && zmq_send(ep->sock, d, n, 0) < 0) rc = tr_ep_zerr(err, "send hello");
    tr_msg_writer_free(&w);
    if (rc) return -1;
    int timeout = o->hello_timeout_ms > 0 ? o->hello_timeout_ms : TR_HEARTBEAT_TIMEOUT_MS_DEFAULT;
    int64_t deadline = tr_now_ms() + timeout;
    for (;;) {
        int64_t left = deadline - tr_now_ms();
        if (left <= 0)
            return tr_errf(err, TR_ETIMEOUT, "no hello reply from the controller at %s within %d ms (not running, or "
                           "CURVE keys not accepted?)", ep->endpoint, timeout);
        zmq_pollitem_t it = {ep->sock, 0, ZMQ_POLLIN, 0};
        int prc = zmq_poll(&it, 1, (long)left);
        if (prc < 0) {
            if (zmq_errno() == EINTR) return tr_errf(err, TR_ECANCELED, "interrupted while waiting for the hello reply");
            return tr_ep_zerr(err, "zmq_poll");
        }
        if (prc == 0) continue;
        zmq_msg_t body;
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, ep->sock, 0) < 0) {
            zmq_msg_close(&body);
            return tr_ep_zerr(err, "receive hello reply");
        }
        if (zmq_msg_more(&body)) {
            tr_ep_drain_more(ep->sock);
            zmq_msg_close(&body);
            continue;
        }
        tr_msg m;
        tr_err e;
        int drc = tr_msg_decode(&m, zmq_msg_data(&body), zmq_msg_size(&body), ep->max_bytes, &e);
        if (drc || m.kind != TR_MSG_REPLY || m.id != 1) {  // heartbeats or strays before the reply
            tr_msg_free(&m);
            zmq_msg_close(&body);
            continue;
        }
        if (!m.ok) {
            tr_errf(err, m.remote.code, "controller at %s refused hello: %s", ep->endpoint, m.remote.msg);
            tr_msg_free(&m);
            zmq_msg_close(&body);
            return -1;
        }
        int64_t ivl = 0, to = 0;
        uint64_t proto = 0, maxb = 0;
        rc = tr_msg_get_uint(&m.args, "protocol", &proto, err);
        if (!rc) rc = tr_msg_get_int(&m.args, "heartbeat_interval_ms", &ivl, err);
        if (!rc) rc = tr_msg_get_int(&m.args, "heartbeat_timeout_ms", &to, err);
        if (!rc) rc = tr_msg_get_uint(&m.args, "max_message_bytes", &maxb, err);
        if (!rc && (proto != TR_PROTOCOL_VERSION || ivl <= 0 || to <= ivl || to > INT32_MAX || maxb == 0))
            rc = tr_errf(err, TR_EFORMAT, "hello reply: bad settings (protocol %" PRIu64 ", heartbeat %" PRId64
                         "/%" PRId64 " ms, max %" PRIu64 " bytes)", proto, ivl, to, maxb);
        tr_msg_free(&m);
        zmq_msg_close(&body);
        if (rc) return tr_err_wrap(err, "controller at %s", ep->endpoint);
        ep->hb_interval_ms = (int)ivl;
        ep->hb_timeout_ms = (int)to;
        ep->max_bytes = maxb;
        ep->controller_last_seen = tr_now_ms();
        return 0;
    }
}

int tr_dealer_init(tr_dealer **out, const tr_dealer_opts *o, tr_err *err) {
    *out = NULL;
    if (!o->endpoint) return tr_errf(err, TR_EINVAL, "worker: no controller endpoint");
    if (!o->role || !tr_ep_valid_role(o->role, strlen(o->role)))
        return tr_errf(err, TR_EINVAL, "worker: invalid role '%s' (lowercase letters, digits, '_')", o->role ? o->role : "");
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return tr_errf(err, TR_EINVAL, "worker %s: rank %d is outside a world of %d", o->role, o->rank, o->world);
    tr_dealer *d = calloc(1, sizeof *d);
    if (!d) return tr_errf(err, TR_ENOMEM, "out of memory for a dealer");
    tr_endpoint *ep = &d->ep;
    if (tr_ep_init(ep, false, o->max_message_bytes, err)) goto fail;
    snprintf(ep->endpoint, sizeof ep->endpoint, "%s", o->endpoint);
    snprintf(ep->id, sizeof ep->id, "%s/%d", o->role, o->rank);
    if (zmq_setsockopt(ep->sock, ZMQ_ROUTING_ID, ep->id, strlen(ep->id)) != 0) {
        tr_ep_zerr(err, "ZMQ_ROUTING_ID");
        goto fail;
    }
    if (tr_ep_setup_curve_client(ep->sock, &o->curve, o->endpoint, err)) goto fail;
    if (zmq_connect(ep->sock, o->endpoint) != 0) {
        tr_ep_zerr(err, "connect");
        tr_err_wrap(err, "controller endpoint %s", o->endpoint);
        goto fail;
    }
    if (dealer_hello(ep, o, err)) goto fail;
    if (tr_ep_start(ep, err)) goto fail;
    *out = d;
    return 0;
fail:
    // Nothing worth delivering is queued; do not wait for an absent controller.
    if (ep->sock) (void)tr_ep_set_int(ep->sock, ZMQ_LINGER, 0, "ZMQ_LINGER", NULL);  // best effort while closing
    tr_dealer_free(d);
    return -1;
}

void tr_dealer_free(tr_dealer *d) {
    if (!d) return;
    tr_ep_free(&d->ep);
    free(d);
}

int tr_dealer_send(tr_dealer *d, const void *data, size_t len, tr_err *err) {
    return tr_ep_send(&d->ep, "", data, len, err);
}

int tr_dealer_send_writer(tr_dealer *d, tr_msg_writer *w, tr_err *err) {
    return tr_ep_send_writer(&d->ep, "", w, err);
}

int tr_dealer_recv(tr_dealer *d, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    return tr_ep_recv(&d->ep, m, timeout_ms, err);
}

int tr_dealer_wait_any(tr_dealer *const *ds, int n, int timeout_ms, tr_err *err) {
    zmq_pollitem_t items[TR_DEALER_WAIT_MAX];
    if (n <= 0 || n > TR_DEALER_WAIT_MAX) {
        tr_errf(err, TR_EINVAL, "tr_dealer_wait_any: %d dealers (1 to %d)", n, TR_DEALER_WAIT_MAX);
        return -1;
    }
    for (int i = 0; i < n; i++) items[i] = (zmq_pollitem_t){ds[i]->ep.pipe_app, 0, ZMQ_POLLIN, 0};
    int rc = zmq_poll(items, n, (long)timeout_ms);
    if (rc < 0) {
        if (zmq_errno() == EINTR) tr_errf(err, TR_ECANCELED, "interrupted while waiting for a message");
        else tr_ep_zerr(err, "zmq_poll");
        return -1;
    }
    for (int i = 0; i < n && rc > 0; i++)
        if (items[i].revents & ZMQ_POLLIN) return i;
    return -1;
}

void tr_dealer_stats(tr_dealer *d, tr_transport_stats *s) {
    pthread_mutex_lock(&d->ep.mu);
    *s = d->ep.stats;
    pthread_mutex_unlock(&d->ep.mu);
}

int tr_dealer_send_error(tr_dealer *d, uint64_t id, const tr_err *e, tr_err *err) {
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_put_error_reply(&w, id, e->code, e->msg);
    int rc = tr_dealer_send_writer(d, &w, err);
    tr_msg_writer_free(&w);
    return rc;
}
