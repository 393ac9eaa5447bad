// ROUTER and DEALER endpoints of the roles protocol. Each endpoint has its own ZeroMQ
// context (so each router can run its own CURVE authenticator) and an I/O thread that owns
// the network socket; the caller reaches it through an inproc PAIR pipe. Pipe frames are
// [kind][peer][body]: caller->I/O 'S' (send) and 'Q' (quit); I/O->caller 'M' (message),
// 'D' (peer dead) and 'E' (the I/O thread failed).
#include "roles/transport.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "roles/curve.h"

#define PIPE_ENDPOINT "inproc://troupe-transport-pipe"
#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define LINGER_MS 1000
#define DRAIN_BATCH 256  // messages handled per poll wakeup before heartbeats are checked again

typedef struct peer_slot {
    tr_peer p;
    bool dead_polled;  // reported by tr_router_dead_peers
} peer_slot;

typedef struct tr_endpoint {
    bool is_router;
    void *ctx, *sock, *pipe_app, *pipe_io, *zap;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;  // guards everything below that both threads touch
    pthread_cond_t cv;   // signalled when a peer registers
    peer_slot *peers;
    int n_peers, cap_peers;
    tr_transport_stats stats;
    bool io_failed;
    tr_err io_err;
    int hb_interval_ms, hb_timeout_ms;
    uint64_t max_bytes;
    char endpoint[256];
    tr_curve_authorized auth;
    // dealer side
    char id[TR_PEER_ID_MAX];
    int64_t controller_last_seen;
    bool controller_dead;
    // I/O thread only
    tr_msg_writer hb;  // the pre-encoded heartbeat
} tr_endpoint;

struct tr_router {
    tr_endpoint ep;
};

struct tr_dealer {
    tr_endpoint ep;
};

int64_t tr_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int zerr(tr_err *err, const char *what) {
    int e = zmq_errno();
    return tr_errf(err, e == ETERM ? TR_ECANCELED : TR_EIO, "%s: %s", what, zmq_strerror(e));
}

bool tr_endpoint_is_loopback(const char *e) {
    if (!e) return false;
    if (strncmp(e, "ipc://", 6) == 0 || strncmp(e, "inproc://", 9) == 0) return true;
    if (strncmp(e, "tcp://", 6) != 0) return false;
    const char *h = e + 6;
    if (strchr(h, ';')) return false;  // "source;destination" form
    const char *colon = strrchr(h, ':');
    size_t n = colon ? (size_t)(colon - h) : strlen(h);
    if (n == 9 && strncmp(h, "localhost", 9) == 0) return true;
    if (n == 5 && strncmp(h, "[::1]", 5) == 0) return true;
    if (n >= 4 && strncmp(h, "127.", 4) == 0) {
        for (size_t i = 4; i < n; i++)
            if (!((h[i] >= '0' && h[i] <= '9') || h[i] == '.')) return false;
        return true;
    }
    return false;
}

static bool valid_role(const char *s, size_t n) {
    if (n == 0 || n >= TR_ROLE_NAME_MAX || s[0] < 'a' || s[0] > 'z') return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return false;
    return true;
}

// ---- shared setup and teardown ----

static int set_int(void *s, int opt, int v, const char *name, tr_err *err) {
    if (zmq_setsockopt(s, opt, &v, sizeof v) != 0) return zerr(err, name);
    return 0;
}

static int ep_init(tr_endpoint *ep, bool is_router, uint64_t max_bytes, tr_err *err) {
    memset(ep, 0, sizeof *ep);
    ep->is_router = is_router;
    ep->max_bytes = max_bytes ? max_bytes : TR_MSG_MAX_BYTES_DEFAULT;
    if (pthread_mutex_init(&ep->mu, NULL) != 0) return tr_errf(err, TR_ENOMEM, "cannot create a mutex");
    if (pthread_cond_init(&ep->cv, NULL) != 0) {
        pthread_mutex_destroy(&ep->mu);
        return tr_errf(err, TR_ENOMEM, "cannot create a condition variable");
    }
    tr_msg_writer_init(&ep->hb);
    tr_msg_begin_request(&ep->hb, "heartbeat", 0, 0);
    const void *d;
    size_t n;
    if (tr_msg_writer_finish(&ep->hb, &d, &n, err)) return -1;
    ep->ctx = zmq_ctx_new();
    if (!ep->ctx) return zerr(err, "zmq_ctx_new");
    ep->sock = zmq_socket(ep->ctx, is_router ? ZMQ_ROUTER : ZMQ_DEALER);
    if (!ep->sock) return zerr(err, "zmq_socket");
    // At the controller, messages beyond twice the limit are cut at the wire by ZeroMQ
    // (which drops the connection); those in between reach the I/O thread, are counted and
    // answered. A worker learns the limit only from the hello reply, after its connection
    // exists, and has no peer but the controller it was pointed at: no wire cap there.
    int64_t wire_cap = !is_router || ep->max_bytes > (uint64_t)INT64_MAX / 2 ? -1 : (int64_t)(ep->max_bytes * 2);
    if (zmq_setsockopt(ep->sock, ZMQ_MAXMSGSIZE, &wire_cap, sizeof wire_cap) != 0) return zerr(err, "ZMQ_MAXMSGSIZE");
    if (set_int(ep->sock, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM", err) || set_int(ep->sock, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", err) ||
        set_int(ep->sock, ZMQ_LINGER, LINGER_MS, "ZMQ_LINGER", err))
        return -1;
    ep->pipe_io = zmq_socket(ep->ctx, ZMQ_PAIR);
    ep->pipe_app = zmq_socket(ep->ctx, ZMQ_PAIR);
    if (!ep->pipe_io || !ep->pipe_app) return zerr(err, "zmq_socket (pipe)");
    if (set_int(ep->pipe_io, ZMQ_SNDHWM, 0, "pipe ZMQ_SNDHWM", err) ||
        set_int(ep->pipe_io, ZMQ_RCVHWM, 0, "pipe ZMQ_RCVHWM", err) ||
        set_int(ep->pipe_app, ZMQ_SNDHWM, 0, "pipe ZMQ_SNDHWM", err) ||
        set_int(ep->pipe_app, ZMQ_RCVHWM, 0, "pipe ZMQ_RCVHWM", err) ||
        set_int(ep->pipe_io, ZMQ_LINGER, 0, "pipe ZMQ_LINGER", err) ||
        set_int(ep->pipe_app, ZMQ_LINGER, 0, "pipe ZMQ_LINGER", err))
        return -1;
    if (zmq_bind(ep->pipe_io, PIPE_ENDPOINT) != 0) return zerr(err, "bind " PIPE_ENDPOINT);
    if (zmq_connect(ep->pipe_app, PIPE_ENDPOINT) != 0) return zerr(err, "connect " PIPE_ENDPOINT);
    return 0;
}

static void close_sock(void **s) {
    if (*s) zmq_close(*s);
    *s = NULL;
}

static void ep_free(tr_endpoint *ep) {
    if (ep->thread_started) {
        const char q = 'Q';
        // Should the pipe refuse the quit command, shutting the context down makes every
        // blocking call of the I/O thread fail with ETERM, which ends it as well.
        if (zmq_send(ep->pipe_app, &q, 1, ZMQ_DONTWAIT) < 0) zmq_ctx_shutdown(ep->ctx);
        pthread_join(ep->thread, NULL);
    } else {
        close_sock(&ep->sock);
        close_sock(&ep->pipe_io);
        close_sock(&ep->zap);
    }
    close_sock(&ep->pipe_app);
    if (ep->ctx) {
        while (zmq_ctx_term(ep->ctx) != 0 && zmq_errno() == EINTR) {
        }
    }
    tr_curve_authorized_free(&ep->auth);
    tr_msg_writer_free(&ep->hb);
    free(ep->peers);
    pthread_cond_destroy(&ep->cv);
    pthread_mutex_destroy(&ep->mu);
}

// ---- CURVE ----

static int setup_curve_server(tr_endpoint *ep, const tr_curve_opts *c, const char *endpoint, tr_err *err) {
    if (!c->key_file) {
        if (tr_endpoint_is_loopback(endpoint)) return 0;
        return tr_errf(err, TR_EINVAL, "%s is not a loopback endpoint: CURVE keys are required (curve.key_file and "
                       "curve.authorized_file)", endpoint);
    }
    if (!c->authorized_file)
        return tr_errf(err, TR_EINVAL, "%s: CURVE needs curve.authorized_file (the worker public keys)", endpoint);
    tr_curve_keypair kp;
    if (tr_curve_key_read(c->key_file, &kp, err)) return -1;
    if (!kp.secret_key[0]) return tr_errf(err, TR_EINVAL, "%s: no secret-key (a key pair file is needed)", c->key_file);
    if (tr_curve_authorized_read(c->authorized_file, &ep->auth, err)) return -1;
    // The authenticator must exist before the first connection arrives.
    ep->zap = zmq_socket(ep->ctx, ZMQ_REP);
    if (!ep->zap) return zerr(err, "zmq_socket (ZAP)");
    if (set_int(ep->zap, ZMQ_LINGER, 0, "ZAP ZMQ_LINGER", err)) return -1;
    if (zmq_bind(ep->zap, ZAP_ENDPOINT) != 0) return zerr(err, "bind " ZAP_ENDPOINT);
    if (set_int(ep->sock, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER", err)) return -1;
    if (zmq_setsockopt(ep->sock, ZMQ_CURVE_SECRETKEY, kp.secret_key, TR_CURVE_KEY_LEN + 1) != 0)
        return zerr(err, "ZMQ_CURVE_SECRETKEY");
    if (zmq_setsockopt(ep->sock, ZMQ_ZAP_DOMAIN, "troupe", 6) != 0) return zerr(err, "ZMQ_ZAP_DOMAIN");
    memset(&kp, 0, sizeof kp);
    return 0;
}

static int setup_curve_client(void *sock, const tr_curve_opts *c, const char *endpoint, tr_err *err) {
    if (!c->key_file && !c->server_key_file) {
        if (tr_endpoint_is_loopback(endpoint)) return 0;
        return tr_errf(err, TR_EINVAL, "%s is not a loopback endpoint: CURVE keys are required (curve.key_file and "
                       "curve.server_key_file)", endpoint);
    }
    if (!c->key_file || !c->server_key_file)
        return tr_errf(err, TR_EINVAL, "%s: CURVE needs both curve.key_file and curve.server_key_file", endpoint);
    tr_curve_keypair own, server;
    if (tr_curve_key_read(c->key_file, &own, err) || tr_curve_key_read(c->server_key_file, &server, err)) return -1;
    if (!own.secret_key[0]) return tr_errf(err, TR_EINVAL, "%s: no secret-key (a key pair file is needed)", c->key_file);
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server.public_key, TR_CURVE_KEY_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, own.public_key, TR_CURVE_KEY_LEN + 1) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, own.secret_key, TR_CURVE_KEY_LEN + 1) != 0) {
        memset(&own, 0, sizeof own);
        return zerr(err, "CURVE client keys");
    }
    memset(&own, 0, sizeof own);
    return 0;
}

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

// ---- I/O thread ----

static peer_slot *find_peer(tr_endpoint *ep, const char *id) {
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
    if (!rc && !valid_role(p.role, strlen(p.role))) rc = tr_errf(&e, TR_EINVAL, "hello: invalid role '%s'", p.role);
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
    peer_slot *s = find_peer(ep, peer);
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
static void drain_more(void *sock) {
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
            drain_more(ep->sock);
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
        drain_more(ep->sock);
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
            peer_slot *ps = find_peer(ep, peer);
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
            peer_slot *ps = find_peer(ep, peer);
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
        if (is_hb && (forward || !ep->is_router || find_peer(ep, peer))) ep->stats.heartbeats_received++;
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
        zerr(&ep->io_err, what);
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
    if (dead_peer) (void)set_int(ep->sock, ZMQ_LINGER, 0, "ZMQ_LINGER", NULL);  // best effort while closing
    close_sock(&ep->sock);
    close_sock(&ep->zap);
    close_sock(&ep->pipe_io);
    return NULL;
}

static int ep_start(tr_endpoint *ep, tr_err *err) {
    if (pthread_create(&ep->thread, NULL, io_main, ep) != 0)
        return tr_errf(err, TR_ENOMEM, "cannot start the transport I/O thread");
    ep->thread_started = true;
    return 0;
}

// ---- caller side ----

static int ep_check(tr_endpoint *ep, tr_err *err) {
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
    if (ep_check(ep, err)) rc = -1;
    if (!rc && len > ep->max_bytes)
        rc = tr_errf(err, TR_ERANGE, "message of %zu bytes to %s exceeds the maximum of %" PRIu64 " bytes", len,
                     peer[0] ? peer : "the controller", ep->max_bytes);
    pthread_mutex_lock(&ep->mu);
    if (rc) {
    } else if (ep->is_router) {
        peer_slot *s = find_peer(ep, peer);
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
            return zerr(err, "zmq_msg_init_data");
        }
    } else {
        if (zmq_msg_init_size(&body, len) != 0) return tr_errf(err, TR_ENOMEM, "out of memory for a %zu-byte message", len);
        if (len) memcpy(zmq_msg_data(&body), data, len);
    }
    const char k = 'S';
    if (zmq_send(ep->pipe_app, &k, 1, ZMQ_SNDMORE) < 0 || zmq_send(ep->pipe_app, peer, strlen(peer), ZMQ_SNDMORE) < 0 ||
        zmq_msg_send(&body, ep->pipe_app, 0) < 0) {
        zmq_msg_close(&body);
        return zerr(err, "send to the transport thread");
    }
    return 0;
}

static int ep_send(tr_endpoint *ep, const char *peer, const void *data, size_t len, tr_err *err) {
    return ep_send_buf(ep, peer, (void *)data, len, false, err);
}

// Hands the writer's buffer to ZeroMQ (no copy of large tensors) and resets the writer.
static int ep_send_writer(tr_endpoint *ep, const char *peer, tr_msg_writer *w, tr_err *err) {
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

static int ep_recv(tr_endpoint *ep, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    memset(m, 0, sizeof *m);
    msgpack_unpacked_init(&m->msg.unpacked_);
    if (ep_check(ep, err)) return -1;
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
            return zerr(err, "zmq_poll");
        }
        if (rc == 0 && ep_check(ep, err)) return -1;
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
                return zerr(err, "receive from the transport thread");
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
            ep_check(ep, err);
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

// ---- router ----

int tr_router_init(tr_router **out, const tr_router_opts *o, tr_err *err) {
    *out = NULL;
    tr_router *r = calloc(1, sizeof *r);
    if (!r) return tr_errf(err, TR_ENOMEM, "out of memory for a router");
    tr_endpoint *ep = &r->ep;
    const char *endpoint = o->endpoint ? o->endpoint : TR_ROUTER_ENDPOINT_DEFAULT;
    if (ep_init(ep, true, o->max_message_bytes, err)) goto fail;
    ep->hb_interval_ms = o->heartbeat_interval_ms > 0 ? o->heartbeat_interval_ms : TR_HEARTBEAT_INTERVAL_MS_DEFAULT;
    ep->hb_timeout_ms = o->heartbeat_timeout_ms > 0 ? o->heartbeat_timeout_ms : TR_HEARTBEAT_TIMEOUT_MS_DEFAULT;
    if (ep->hb_timeout_ms <= ep->hb_interval_ms) {
        tr_errf(err, TR_EINVAL, "heartbeat timeout %d ms must exceed the interval %d ms", ep->hb_timeout_ms,
                ep->hb_interval_ms);
        goto fail;
    }
    if (set_int(ep->sock, ZMQ_ROUTER_MANDATORY, 1, "ZMQ_ROUTER_MANDATORY", err) ||
        set_int(ep->sock, ZMQ_ROUTER_HANDOVER, 1, "ZMQ_ROUTER_HANDOVER", err))
        goto fail;
    if (setup_curve_server(ep, &o->curve, endpoint, err)) goto fail;
    if (zmq_bind(ep->sock, endpoint) != 0) {
        zerr(err, "bind");
        tr_err_wrap(err, "controller endpoint %s", endpoint);
        goto fail;
    }
    size_t n = sizeof ep->endpoint;
    if (zmq_getsockopt(ep->sock, ZMQ_LAST_ENDPOINT, ep->endpoint, &n) != 0) {
        zerr(err, "ZMQ_LAST_ENDPOINT");
        goto fail;
    }
    if (ep_start(ep, err)) goto fail;
    *out = r;
    return 0;
fail:
    tr_router_free(r);
    return -1;
}

void tr_router_free(tr_router *r) {
    if (!r) return;
    ep_free(&r->ep);
    free(r);
}

const char *tr_router_endpoint(const tr_router *r) { return r->ep.endpoint; }

int tr_router_send(tr_router *r, const char *peer, const void *data, size_t len, tr_err *err) {
    return ep_send(&r->ep, peer, data, len, err);
}

int tr_router_send_writer(tr_router *r, const char *peer, tr_msg_writer *w, tr_err *err) {
    return ep_send_writer(&r->ep, peer, w, err);
}

int tr_router_recv(tr_router *r, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    return ep_recv(&r->ep, m, timeout_ms, err);
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
    if (ep_check(ep, err)) return -1;
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

// ---- dealer ----

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
    if (!rc && zmq_send(ep->sock, d, n, 0) < 0) rc = zerr(err, "send hello");
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
            return zerr(err, "zmq_poll");
        }
        if (prc == 0) continue;
        zmq_msg_t body;
        zmq_msg_init(&body);
        if (zmq_msg_recv(&body, ep->sock, 0) < 0) {
            zmq_msg_close(&body);
            return zerr(err, "receive hello reply");
        }
        if (zmq_msg_more(&body)) {
            drain_more(ep->sock);
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
    if (!o->role || !valid_role(o->role, strlen(o->role)))
        return tr_errf(err, TR_EINVAL, "worker: invalid role '%s' (lowercase letters, digits, '_')", o->role ? o->role : "");
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world)
        return tr_errf(err, TR_EINVAL, "worker %s: rank %d is outside a world of %d", o->role, o->rank, o->world);
    tr_dealer *d = calloc(1, sizeof *d);
    if (!d) return tr_errf(err, TR_ENOMEM, "out of memory for a dealer");
    tr_endpoint *ep = &d->ep;
    if (ep_init(ep, false, o->max_message_bytes, err)) goto fail;
    snprintf(ep->endpoint, sizeof ep->endpoint, "%s", o->endpoint);
    snprintf(ep->id, sizeof ep->id, "%s/%d", o->role, o->rank);
    if (zmq_setsockopt(ep->sock, ZMQ_ROUTING_ID, ep->id, strlen(ep->id)) != 0) {
        zerr(err, "ZMQ_ROUTING_ID");
        goto fail;
    }
    if (setup_curve_client(ep->sock, &o->curve, o->endpoint, err)) goto fail;
    if (zmq_connect(ep->sock, o->endpoint) != 0) {
        zerr(err, "connect");
        tr_err_wrap(err, "controller endpoint %s", o->endpoint);
        goto fail;
    }
    if (dealer_hello(ep, o, err)) goto fail;
    if (ep_start(ep, err)) goto fail;
    *out = d;
    return 0;
fail:
    // Nothing worth delivering is queued; do not wait for an absent controller.
    if (ep->sock) (void)set_int(ep->sock, ZMQ_LINGER, 0, "ZMQ_LINGER", NULL);  // best effort while closing
    tr_dealer_free(d);
    return -1;
}

void tr_dealer_free(tr_dealer *d) {
    if (!d) return;
    ep_free(&d->ep);
    free(d);
}

int tr_dealer_send(tr_dealer *d, const void *data, size_t len, tr_err *err) {
    return ep_send(&d->ep, "", data, len, err);
}

int tr_dealer_send_writer(tr_dealer *d, tr_msg_writer *w, tr_err *err) {
    return ep_send_writer(&d->ep, "", w, err);
}

int tr_dealer_recv(tr_dealer *d, tr_wire_msg *m, int timeout_ms, tr_err *err) {
    return ep_recv(&d->ep, m, timeout_ms, err);
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
        else zerr(err, "zmq_poll");
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
