// Creating and destroying an endpoint (transport_impl.h): its context, network socket and
// inproc pipe, and CURVE on the network socket (keys, and the ZAP socket a router's
// authenticator listens on). CURVE setup lives here rather than with the I/O thread because
// it must be complete before the socket binds or connects, which happens before the thread
// starts; the thread only answers the ZAP requests (transport_io.c).
#include "roles/transport.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "roles/curve.h"
#include "roles/transport_impl.h"

// ---- setup and teardown ----

int tr_ep_set_int(void *s, int opt, int v, const char *name, tr_err *err) {
    if (zmq_setsockopt(s, opt, &v, sizeof v) != 0) return tr_ep_zerr(err, name);
    return 0;
}

int tr_ep_init(tr_endpoint *ep, bool is_router, uint64_t max_bytes, tr_err *err) {
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
    if (!ep->ctx) return tr_ep_zerr(err, "zmq_ctx_new");
    ep->sock = zmq_socket(ep->ctx, is_router ? ZMQ_ROUTER : ZMQ_DEALER);
    if (!ep->sock) return tr_ep_zerr(err, "zmq_socket");
    // At the controller, messages beyond twice the limit are cut at the wire by ZeroMQ
    // (which drops the connection); those in between reach the I/O thread, are counted and
    // answered. A worker learns the limit only from the hello reply, after its connection
    // exists, and has no peer but the controller it was pointed at: no wire cap there.
    int64_t wire_cap = !is_router || ep->max_bytes > (uint64_t)INT64_MAX / 2 ? -1 : (int64_t)(ep->max_bytes * 2);
    if (zmq_setsockopt(ep->sock, ZMQ_MAXMSGSIZE, &wire_cap, sizeof wire_cap) != 0) return tr_ep_zerr(err, "ZMQ_MAXMSGSIZE");
    if (tr_ep_set_int(ep->sock, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM", err) || tr_ep_set_int(ep->sock, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", err) ||
        tr_ep_set_int(ep->sock, ZMQ_LINGER, LINGER_MS, "ZMQ_LINGER", err))
        return -1;
    ep->pipe_io = zmq_socket(ep->ctx, ZMQ_PAIR);
    ep->pipe_app = zmq_socket(ep->ctx, ZMQ_PAIR);
    if (!ep->pipe_io || !ep->pipe_app) return tr_ep_zerr(err, "zmq_socket (pipe)");
    if (tr_ep_set_int(ep->pipe_io, ZMQ_SNDHWM, 0, "pipe ZMQ_SNDHWM", err) ||
        tr_ep_set_int(ep->pipe_io, ZMQ_RCVHWM, 0, "pipe ZMQ_RCVHWM", err) ||
        tr_ep_set_int(ep->pipe_app, ZMQ_SNDHWM, 0, "pipe ZMQ_SNDHWM", err) ||
        tr_ep_set_int(ep->pipe_app, ZMQ_RCVHWM, 0, "pipe ZMQ_RCVHWM", err) ||
        tr_ep_set_int(ep->pipe_io, ZMQ_LINGER, 0, "pipe ZMQ_LINGER", err) ||
        tr_ep_set_int(ep->pipe_app, ZMQ_LINGER, 0, "pipe ZMQ_LINGER", err))
        return -1;
    if (zmq_bind(ep->pipe_io, PIPE_ENDPOINT) != 0) return tr_ep_zerr(err, "bind " PIPE_ENDPOINT);
    if (zmq_connect(ep->pipe_app, PIPE_ENDPOINT) != 0) return tr_ep_zerr(err, "connect " PIPE_ENDPOINT);
    return 0;
}

void tr_ep_close_sock(void **s) {
    if (*s) zmq_close(*s);
    *s = NULL;
}

void tr_ep_free(tr_endpoint *ep) {
    if (ep->thread_started) {
        const char q = 'Q';
        // Should the pipe refuse the quit command, shutting the context down makes every
        // blocking call of the I/O thread fail with ETERM, which ends it as well.
        if (zmq_send(ep->pipe_app, &q, 1, ZMQ_DONTWAIT) < 0) zmq_ctx_shutdown(ep->ctx);
        pthread_join(ep->thread, NULL);
    } else {
        tr_ep_close_sock(&ep->sock);
        tr_ep_close_sock(&ep->pipe_io);
        tr_ep_close_sock(&ep->zap);
    }
    tr_ep_close_sock(&ep->pipe_app);
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

int tr_ep_setup_curve_server(tr_endpoint *ep, const tr_curve_opts *c, const char *endpoint, tr_err *err) {
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
    if (!ep->zap) return tr_ep_zerr(err, "zmq_socket (ZAP)");
    if (tr_ep_set_int(ep->zap, ZMQ_LINGER, 0, "ZAP ZMQ_LINGER", err)) return -1;
    if (zmq_bind(ep->zap, ZAP_ENDPOINT) != 0) return tr_ep_zerr(err, "bind " ZAP_ENDPOINT);
    if (tr_ep_set_int(ep->sock, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER", err)) return -1;
    if (zmq_setsockopt(ep->sock, ZMQ_CURVE_SECRETKEY, kp.secret_key, TR_CURVE_KEY_LEN + 1) != 0)
        return tr_ep_zerr(err, "ZMQ_CURVE_SECRETKEY");
    if (zmq_setsockopt(ep->sock, ZMQ_ZAP_DOMAIN, "troupe", 6) != 0) return tr_ep_zerr(err, "ZMQ_ZAP_DOMAIN");
    memset(&kp, 0, sizeof kp);
    return 0;
}

int tr_ep_setup_curve_client(void *sock, const tr_curve_opts *c, const char *endpoint, tr_err *err) {
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
        return tr_ep_zerr(err, "CURVE client keys");
    }
    memset(&own, 0, sizeof own);
    return 0;
}
