// The controller's end, tr_router (transport.h): binds the ROUTER socket, with CURVE where
// the endpoint is not loopback, and reads the peer table the I/O thread keeps from hellos
// and heartbeats.
#include "roles/transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "roles/transport_impl.h"

struct tr_router {
    tr_endpoint ep;
};

int tr_router_init(tr_router **out, const tr_router_opts *o, tr_err *err) {
    *out = NULL;
    tr_router *r = calloc(1, sizeof *r);
    if (!r) return tr_errf(err, TR_ENOMEM, "out of memory for a router");
    tr_endpoint *ep = &r->ep;
    const char *endpoint = o->endpoint ? o->endpoint : TR_ROUTER_ENDPOINT_DEFAULT;
    if (tr_ep_init(ep, true, o->max_message_bytes, err)) goto fail;
    ep->hb_interval_ms = o->heartbeat_interval_ms > 0 ? o->heartbeat_interval_ms : TR_HEARTBEAT_INTERVAL_MS_DEFAULT;
    ep->hb_timeout_ms = o->heartbeat_timeout_ms > 0 ? o->heartbeat_timeout_ms : TR_HEARTBEAT_TIMEOUT_MS_DEFAULT;
    if (ep->hb_timeout_ms <= ep->hb_interval_ms) {
        tr_errf(err, TR_EINVAL, "heartbeat timeout %d ms must exceed the interval %d ms", ep->hb_timeout_ms,
                ep->hb_interval_ms);
        goto fail;
    }
    if (tr_ep_set_int(ep->sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY", err) ||
        tr_ep_set_int(ep->sock, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER", err))
        goto fail;
    if (tr_ep_setup_curve_server(ep, &o->curve, endpoint, err)) goto fail;
    if (zmq_bind(ep->sock, endpoint) != 0) {
        tr_ep_zerr(err, "bind");
        tr_err_wrap(err, "controller endpoint %s", endpoint);
        goto fail;
    }
    size_t n = sizeof ep->endpoint;
    if (zmq_getsockopt(ep->sock, ZMQ_LAST_ENDPOINT, ep->endpoint, &n) != 0) {
        tr_ep_zerr(err, "ZMQ_LAST_ENDPOINT");
        goto fail;
    }
    if (tr_ep_start(ep, err)) goto fail;
    *out = r;
    return 0;
fail:
    tr_router_free(r);
    return -1;
}

void tr_router_free(tr_router *r) {
    if (!r) return;
    tr_ep_free(&r->ep);
    free(r);
}

const char *tr_router_endpoint(const tr_router *r) { return r->ep.endpoint; }

int tr_router_send(tr_router *r, const char *peer, const void *data, size_t len, tr_err *err) {
    return tr_ep_send(&r->ep, peer, data, len, err);
}

int tr_router_send_writer(tr_router *r, const char *peer, tr_msg_writer *w, tr_err *err) {
    return tr_ep_send_writer(&r->ep, peer, w, err);
}

int tr_router_recv(tr_router *r, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    return tr_ep_recv(&r->ep, m, timeout_ms, err);
}

static int count_role(tr_endpoint *ep, const char *role) {
    int k = 0;
    for (int i = 0; i < ep->n_peers; i++)
        if (!ep->peers[i].p.dead && (!role || strcmp(ep->peers[i].p.role, role) == 0)) k++;
    return k;
}

int tr_router_wait_peers(tr_router *r, const char *role, int n, int timeout_ms, tr_err *err) {
    tr_endpoint *ep = &r->ep;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ep->mu);
    int have = count_role(ep, role);
    while (have < n && !ep->io_failed) {
        if (pthread_cond_timedwait(&ep->cv, &ep->mu, &until) == ETIMEDOUT) break;
        have = count_role(ep, role);
    }
    pthread_mutex_unlock(&ep->mu);
    if (tr_ep_check(ep, err)) return -1;
    if (have < n)
        return tr_errf(err, TR_ETIMEOUT, "%d of %d %s workers said hello at %s within %d ms", have, n,
                       role ? role : "", ep->endpoint, timeout_ms);
    return 0;
}

void tr_router_peers(tr_router *r, tr_peer *out, int max, int *n) {
    tr_endpoint *ep = &r->ep;
    pthread_mutex_lock(&ep->mu);
    for (int i = 0; i < ep->n_peers && i < max; i++) out[i] = ep->peers[i].p;
    *n = ep->n_peers;
    pthread_mutex_unlock(&ep->mu);
}

void tr_router_dead_peers(tr_router *r, char (*ids)[TR_PEER_ID_MAX], int max, int *n) {
    tr_endpoint *ep = &r->ep;
    *n = 0;
    pthread_mutex_lock(&ep->mu);
    for (int i = 0; i < ep->n_peers && *n < max; i++) {
        peer_slot *s = &ep->peers[i];
        if (s->p.dead && !s->dead_polled) {
            s->dead_polled = true;
            memcpy(ids[(*n)++], s->p.id, TR_PEER_ID_MAX);
        }
    }
    pthread_mutex_unlock(&ep->mu);
}

void tr_router_stats(tr_router *r, tr_transport_stats *s) {
    pthread_mutex_lock(&r->ep.mu);
    *s = r->ep.stats;
    pthread_mutex_unlock(&r->ep.mu);
}
