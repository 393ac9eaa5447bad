// The I/O thread of an endpoint (transport_impl.h), the only user of its network socket once
// started: it polls the network, the caller's pipe and (router with CURVE) the ZAP socket;
// answers hello and takes heartbeats itself; sends heartbeats every interval and marks peers silent
// past the timeout dead; forwards everything else to the caller over the pipe and sends what
// the caller queues there. Doing this on its own thread keeps heartbeats flowing while the
// caller computes.
#include "roles/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "roles/curve.h"
#include "roles/transport_impl.h"

// One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism,
// credentials. Only CURVE clients whose public key is listed get "200".
static void handle_zap(tr_endpoint *ep) {
    zmq_msg_t f[8];
    int n = 0, more = 1;
    while (more && n < 8) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], ep->zap, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[n]);
            break;
        }
        more = zmq_msg_more(&f[n]);
        n++;
    }
    while (more) {  // too many frames: drain the rest
        zmq_msg_t x;
        zmq_msg_init(&x);
        if (zmq_msg_recv(&x, ep->zap, ZMQ_DONTWAIT) < 0) more = 0;
        else more = zmq_msg_more(&x);
        zmq_msg_close(&x);
    }
    // The REP socket must answer even a malformed request, or it stops taking new ones.
    bool ok = n >= 7 && zmq_msg_size(&f[5]) == 5 && memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
              zmq_msg_size(&f[6]) == 32 && tr_curve_authorized_has(&ep->auth, zmq_msg_data(&f[6]));
    const char *text = ok ? "OK" : n < 7 ? "malformed ZAP request" : "public key not authorized";
    const void *reqid = n >= 2 ? zmq_msg_data(&f[1]) : "";
    size_t reqid_len = n >= 2 ? zmq_msg_size(&f[1]) : 0;
    bool sent = zmq_send(ep->zap, "1.0", 3, ZMQ_SNDMORE) >= 0 && zmq_send(ep->zap, reqid, reqid_len, ZMQ_SNDMORE) >= 0 &&
                zmq_send(ep->zap, ok ? "200" : "400", 3, ZMQ_SNDMORE) >= 0 &&
                zmq_send(ep->zap, text, strlen(text), ZMQ_SNDMORE) >= 0 && zmq_send(ep->zap, "", 0, ZMQ_SNDMORE) >= 0 &&
                zmq_send(ep->zap, "", 0, 0) >= 0;
    pthread_mutex_lock(&ep->mu);
    if (!ok) ep->stats.auth_rejected++;
    if (!sent) ep->stats.send_failures++;  // the handshake then times out on the client side
    pthread_mutex_unlock(&ep->mu);
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

peer_slot *tr_ep_find_peer(tr_endpoint *ep, const char *id) {
    for (int i = 0; i < ep->n_peers; i++)
        if (strcmp(ep->peers[i].p.id, id) == 0) return &ep->peers[i];
    return NULL;
}

// Sends [kind][peer][body] to the caller; body (may be NULL) is moved.
static int pipe_push(tr_endpoint *ep, char kind, const char *peer, zmq_msg_t *body) {
    if (zmq_send(ep->pipe_io, &kind, 1, ZMQ_SNDMORE) < 0) return -1;
    if (zmq_send(ep->pipe_io, peer, strlen(peer), ZMQ_SNDMORE) < 0) return -1;
    if (body) return zmq_msg_send(body, ep->pipe_io, 0) < 0 ? -1 : 0;
    return zmq_send(ep->pipe_io, "", 0, 0) < 0 ? -1 : 0;
}

static void net_send(tr_endpoint *ep, const char *peer, const void *data, size_t len) {
    int rc = 0;
    if (ep->is_router) rc = zmq_send(ep->sock, peer, strlen(peer), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    if (rc >= 0) rc = zmq_send(ep->sock, data, len, ZMQ_DONTWAIT);
    if (rc < 0) {
        pthread_mutex_lock(&ep->mu);
        ep->stats.send_failures++;
        pthread_mutex_unlock(&ep->mu);
    }
}

static void send_error_reply(tr_endpoint *ep, const char *peer, uint64_t id, int code, const char *msg) {
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_put_error_reply(&w, id, code, msg);
    const void *d;
    size_t n;
    if (tr_msg_writer_finish(&w, &d, &n, NULL) == 0) {
        net_send(ep, peer, d, n);
        pthread_mutex_lock(&ep->mu);
        ep->stats.error_replies++;
        pthread_mutex_unlock(&ep->mu);
    }
    tr_msg_writer_free(&w);
}

static void handle_hello(tr_endpoint *ep, const char *peer, const tr_msg *m) {
    tr_err e;
    tr_err_clear(&e);
    static const char *const keys[] = {"role", "rank", "world", "pid", "protocol", "host", NULL};
    tr_peer p;
    memset(&p, 0, sizeof p);
    int64_t rank, world, pid, protocol;
    int rc = tr_msg_check_keys(&m->args, keys, &e);
    if (!rc) rc = tr_msg_get_int(&m->args, "protocol", &protocol, &e);
    if (!rc && protocol != TR_PROTOCOL_VERSION) {
        rc = tr_errf(&e, TR_EUNSUPPORTED, "hello: worker speaks protocol %" PRId64 ", the controller speaks %d",
                     protocol, TR_PROTOCOL_VERSION);
    }
    if (!rc) rc = tr_msg_get_str_buf(&m->args, "role", p.role, sizeof p.role, &e);
    if (!rc) rc = tr_msg_get_int(&m->args, "rank", &rank, &e);
    if (!rc) rc = tr_msg_get_int(&m->args, "world", &world, &e);
    if (!rc) rc = tr_msg_get_int(&m->args, "pid", &pid, &e);
    if (!rc) rc = tr_msg_get_str_buf(&m->args, "host", p.host, sizeof p.host, &e);
    if (!rc && !tr_ep_valid_role(p.role, strlen(p.role))) rc = tr_errf(&e, TR_EINVAL, "hello: invalid role '%s'", p.role);
    if (!rc && (world < 1 || world > INT32_MAX || rank < 0 || rank >= world))
        rc = tr_errf(&e, TR_EINVAL, "hello: rank %" PRId64 " is outside a world of %" PRId64, rank, world);
    if (!rc) {
        snprintf(p.id, sizeof p.id, "%s/%" PRId64, p.role, rank);
        if (strcmp(p.id, peer) != 0)
            rc = tr_errf(&e, TR_EINVAL, "hello: socket identity '%s' is not '%s'", peer, p.id);
    }
    if (rc) {
        send_error_reply(ep, peer, m->id, e.code, e.msg);
        return;
    }
    p.rank = (int32_t)rank;
    p.world = (int32_t)world;
    p.pid = pid;
    p.protocol = (uint32_t)protocol;
    p.last_seen_ms = tr_now_ms();
    pthread_mutex_lock(&ep->mu);
    peer_slot *s = tr_ep_find_peer(ep, peer);
    if (!s && ep->n_peers == ep->cap_peers) {
        int cap = ep->cap_peers ? 2 * ep->cap_peers : 16;
        peer_slot *np = realloc(ep->peers, (size_t)cap * sizeof *np);
        if (np) {
            ep->peers = np;
            ep->cap_peers = cap;
        }
    }
    if (!s && ep->n_peers < ep->cap_peers) s = &ep->peers[ep->n_peers++];
    if (s) {
        s->p = p;
        s->dead_polled = false;
        pthread_cond_broadcast(&ep->cv);
    }
    pthread_mutex_unlock(&ep->mu);
    if (!s) {
        send_error_reply(ep, peer, m->id, TR_ENOMEM, "hello: controller out of memory for its peer table");
        return;
    }
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    tr_msg_begin_reply(&w, m->id, 4);
    tr_msg_put_uint(&w, "protocol", TR_PROTOCOL_VERSION);
    tr_msg_put_int(&w, "heartbeat_interval_ms", ep->hb_interval_ms);
    tr_msg_put_int(&w, "heartbeat_timeout_ms", ep->hb_timeout_ms);
    tr_msg_put_uint(&w, "max_message_bytes", ep->max_bytes);
    const void *d;
    size_t n;
    if (tr_msg_writer_finish(&w, &d, &n, NULL) == 0) net_send(ep, peer, d, n);
    tr_msg_writer_free(&w);
}

static void count(tr_endpoint *ep, uint64_t *field) {
    pthread_mutex_lock(&ep->mu);
    (*field)++;
    pthread_mutex_unlock(&ep->mu);
}

// Receives the rest of a multipart message that has the wrong shape.
void tr_ep_drain_more(void *sock) {
    int more = 1;
    while (more) {
        zmq_msg_t x;
        zmq_msg_init(&x);
        if (zmq_msg_recv(&x, sock, ZMQ_DONTWAIT) < 0) more = 0;
        else more = zmq_msg_more(&x);
        zmq_msg_close(&x);
    }
}

// Handles one message from the network; returns -1 when the socket has nothing more.
static int handle_net(tr_endpoint *ep) {
    char peer[TR_PEER_ID_MAX] = "";
    zmq_msg_t body;
    if (ep->is_router) {
        zmq_msg_t idf;
        zmq_msg_init(&idf);
        if (zmq_msg_recv(&idf, ep->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&idf);
            return -1;
        }
        size_t n = zmq_msg_size(&idf);
        bool printable = n > 0 && n < sizeof peer;
        const char *s = zmq_msg_data(&idf);
        for (size_t i = 0; printable && i < n; i++) printable = s[i] > 32 && s[i] < 127;
        if (printable) {
            memcpy(peer, s, n);
            peer[n] = '\0';
        }
        zmq_msg_close(&idf);
        if (!printable) {  // auto-generated identity: not a troupe worker
            tr_ep_drain_more(ep->sock);
            count(ep, &ep->stats.dropped_unknown_peer);
            return 0;
        }
    }
    zmq_msg_init(&body);
    if (zmq_msg_recv(&body, ep->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&body);
        if (ep->is_router) count(ep, &ep->stats.dropped_malformed);  // identity without a body
        return ep->is_router ? 0 : -1;
    }
    if (zmq_msg_more(&body)) {
        tr_ep_drain_more(ep->sock);
        zmq_msg_close(&body);
        count(ep, &ep->stats.dropped_malformed);
        return 0;
    }
    tr_msg m;
    tr_err e;
    tr_err_clear(&e);
    size_t len = zmq_msg_size(&body);
    if (tr_msg_decode(&m, zmq_msg_data(&body), len, ep->max_bytes, &e)) {
        bool oversize = len > ep->max_bytes && e.code == TR_ERANGE;
        count(ep, oversize ? &ep->stats.dropped_oversize : &ep->stats.dropped_malformed);
        bool known = !ep->is_router || strcmp(m.op, "hello") == 0;
        if (ep->is_router && !known) {
            pthread_mutex_lock(&ep->mu);
            peer_slot *ps = tr_ep_find_peer(ep, peer);
            known = ps && !ps->p.dead;
            pthread_mutex_unlock(&ep->mu);
        }
        if (m.has_id && m.op[0] && m.id != 0 && known) send_error_reply(ep, peer, m.id, e.code, e.msg);
        tr_msg_free(&m);
        zmq_msg_close(&body);
        return 0;
    }
    int64_t now = tr_now_ms();
    bool is_hb = m.kind == TR_MSG_REQUEST && strcmp(m.op, "heartbeat") == 0;
    bool forward = false;
    if (ep->is_router && m.kind == TR_MSG_REQUEST && strcmp(m.op, "hello") == 0) {
        handle_hello(ep, peer, &m);
    } else {
        pthread_mutex_lock(&ep->mu);
        if (ep->is_router) {
            peer_slot *ps = tr_ep_find_peer(ep, peer);
            if (ps && !ps->p.dead) {
                ps->p.last_seen_ms = now;
                forward = !is_hb;
            } else {
                ep->stats.dropped_unknown_peer++;
            }
        } else {
            ep->controller_last_seen = now;
            forward = !is_hb;
        }
        if (is_hb && (forward || !ep->is_router || tr_ep_find_peer(ep, peer))) ep->stats.heartbeats_received++;
        if (forward) ep->stats.received++;
        pthread_mutex_unlock(&ep->mu);
    }
    tr_msg_free(&m);
    if (forward) {
        if (pipe_push(ep, 'M', peer, &body)) {
            zmq_msg_close(&body);
            return -2;
        }
    }
    zmq_msg_close(&body);
    return 0;
}

static void send_heartbeats(tr_endpoint *ep, int64_t now) {
    const void *d = ep->hb.buf.data;
    size_t n = ep->hb.buf.size;
    if (!ep->is_router) {
        if (!ep->controller_dead) {
            net_send(ep, "", d, n);
            count(ep, &ep->stats.heartbeats_sent);
        }
        return;
    }
    pthread_mutex_lock(&ep->mu);
    int np = ep->n_peers;
    pthread_mutex_unlock(&ep->mu);
    for (int i = 0; i < np; i++) {
        char id[TR_PEER_ID_MAX];
        bool alive;
        pthread_mutex_lock(&ep->mu);
        alive = !ep->peers[i].p.dead;
        memcpy(id, ep->peers[i].p.id, sizeof id);
        pthread_mutex_unlock(&ep->mu);
        if (!alive) continue;
        // A gone peer makes ROUTER_MANDATORY fail the send; the timeout reports it.
        if (zmq_send(ep->sock, id, strlen(id), ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
            zmq_send(ep->sock, d, n, ZMQ_DONTWAIT) >= 0)
            count(ep, &ep->stats.heartbeats_sent);
    }
    (void)now;
}

// Marks peers silent for longer than the timeout as dead and tells the caller.
static int check_deaths(tr_endpoint *ep, int64_t now) {
    char dead[64][TR_PEER_ID_MAX];
    int nd = 0;
    pthread_mutex_lock(&ep->mu);
    if (ep->is_router) {
        for (int i = 0; i < ep->n_peers && nd < 64; i++) {
            tr_peer *p = &ep->peers[i].p;
            if (!p->dead && now - p->last_seen_ms > ep->hb_timeout_ms) {
                p->dead = true;
                ep->stats.peers_dead++;
                memcpy(dead[nd++], p->id, TR_PEER_ID_MAX);
            }
        }
    } else if (!ep->controller_dead && now - ep->controller_last_seen > ep->hb_timeout_ms) {
        ep->controller_dead = true;
        ep->stats.peers_dead++;
        snprintf(dead[nd++], TR_PEER_ID_MAX, "controller");
    }
    pthread_mutex_unlock(&ep->mu);
    for (int i = 0; i < nd; i++)
        if (pipe_push(ep, 'D', dead[i], NULL)) return -1;
    return 0;
}

static void io_fail(tr_endpoint *ep, const char *what) {
    pthread_mutex_lock(&ep->mu);
    if (!ep->io_failed) {
        ep->io_failed = true;
        tr_ep_zerr(&ep->io_err, what);
    }
    pthread_mutex_unlock(&ep->mu);
    const char k = 'E';
    // Wakes a waiting caller; should the pipe be broken, the caller's wait loop finds
    // io_failed on its next one-second slice.
    (void)zmq_send(ep->pipe_io, &k, 1, ZMQ_DONTWAIT);
}

// Handles one command from the caller; returns 1 on quit, -1 when the pipe has nothing.
static int handle_pipe(tr_endpoint *ep) {
    zmq_msg_t f[3];
    int n = 0, more = 1;
    while (more && n < 3) {
        zmq_msg_init(&f[n]);
        if (zmq_msg_recv(&f[n], ep->pipe_io, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&f[n]);
            if (n == 0) return -1;
            break;
        }
        more = zmq_msg_more(&f[n]);
        n++;
    }
    int rc = 0;
    char kind = zmq_msg_size(&f[0]) == 1 ? *(char *)zmq_msg_data(&f[0]) : 0;
    if (kind == 'Q') {
        rc = 1;
    } else if (kind == 'S' && n == 3) {
        char peer[TR_PEER_ID_MAX];
        size_t pl = zmq_msg_size(&f[1]) < sizeof peer ? zmq_msg_size(&f[1]) : sizeof peer - 1;
        memcpy(peer, zmq_msg_data(&f[1]), pl);
        peer[pl] = '\0';
        int s = 0;
        if (ep->is_router) s = zmq_send(ep->sock, peer, pl, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        if (s >= 0) s = zmq_msg_send(&f[2], ep->sock, ZMQ_DONTWAIT);
        if (s < 0) count(ep, &ep->stats.send_failures);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
    return rc;
}

static void *io_main(void *arg) {
    tr_endpoint *ep = arg;
    int64_t next_hb = tr_now_ms();
    for (;;) {
        int64_t now = tr_now_ms();
        if (now >= next_hb) {
            send_heartbeats(ep, now);
            if (check_deaths(ep, now)) {
                io_fail(ep, "pipe to the caller");
                break;
            }
            next_hb = now + ep->hb_interval_ms;
        }
        zmq_pollitem_t items[3] = {
            {ep->pipe_io, 0, ZMQ_POLLIN, 0},
            {ep->sock, 0, ZMQ_POLLIN, 0},
            {ep->zap, 0, ZMQ_POLLIN, 0},
        };
        int rc = zmq_poll(items, ep->zap ? 3 : 2, (long)(next_hb - now));
        if (rc < 0) {
            if (zmq_errno() == EINTR) continue;
            io_fail(ep, "zmq_poll");
            break;
        }
        if (ep->zap && (items[2].revents & ZMQ_POLLIN)) handle_zap(ep);
        bool quit = false;
        if (items[0].revents & ZMQ_POLLIN) {
            for (int i = 0; i < DRAIN_BATCH; i++) {
                int r = handle_pipe(ep);
                if (r < 0) break;
                if (r == 1) {
                    quit = true;
                    break;
                }
            }
        }
        if (quit) break;
        if (items[1].revents & ZMQ_POLLIN) {
            int r = 0;
            for (int i = 0; i < DRAIN_BATCH && r != -1; i++) {
                r = handle_net(ep);
                if (r == -2) break;
            }
            if (r == -2) {
                io_fail(ep, "pipe to the caller");
                break;
            }
        }
    }
    // A dead peer will never take the queued messages: do not linger for it.
    bool dead_peer = !ep->is_router && ep->controller_dead;
    if (dead_peer) (void)tr_ep_set_int(ep->sock, ZMQ_LINGER, 0, "ZMQ_LINGER", NULL);  // best effort while closing
    tr_ep_close_sock(&ep->sock);
    tr_ep_close_sock(&ep->zap);
    tr_ep_close_sock(&ep->pipe_io);
    return NULL;
}

int tr_ep_start(tr_endpoint *ep, tr_err *err) {
    if (pthread_create(&ep->thread, NULL, io_main, ep) != 0)
        return tr_errf(err, TR_ENOMEM, "cannot start the transport I/O thread");
    ep->thread_started = true;
    return 0;
}
