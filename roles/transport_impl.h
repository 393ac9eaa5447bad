// Internal to the transport: the endpoint that tr_router and tr_dealer each wrap, and what
// its files share. transport_setup.c creates and frees an endpoint (sockets, pipe, CURVE),
// transport_io.c runs its I/O thread, transport.c is the caller's side of the pipe, and
// transport_router.c and transport_dealer.c hold the public functions of each end.
// Each endpoint has its own ZeroMQ context (so each router can run its own CURVE
// authenticator) and an I/O thread that owns the network socket; the caller reaches it
// through an inproc PAIR pipe. Pipe frames are [kind][peer][body]: caller->I/O 'S' (send)
// and 'Q' (quit); I/O->caller 'M' (message), 'D' (peer dead) and 'E' (the I/O thread failed).
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "roles/curve.h"
#include "roles/transport.h"

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

// ---- transport.c ----

// err from zmq_errno(): TR_ECANCELED once the context is shut down (ETERM), else TR_EIO.
int tr_ep_zerr(tr_err *err, const char *what);
// [a-z][a-z0-9_]*, shorter than TR_ROLE_NAME_MAX: checked by the dealer before it says hello
// and by the router's I/O thread when one arrives.
bool tr_ep_valid_role(const char *s, size_t n);
// Once the I/O thread has failed: its error into err, and -1.
int tr_ep_check(tr_endpoint *ep, tr_err *err);
int tr_ep_send(tr_endpoint *ep, const char *peer, const void *data, size_t len, tr_err *err);
int tr_ep_send_writer(tr_endpoint *ep, const char *peer, tr_msg_writer *w, tr_err *err);
int tr_ep_recv(tr_endpoint *ep, tr_wire_msg *m, int timeout_ms, tr_err *err);

// ---- transport_setup.c ----

int tr_ep_set_int(void *s, int opt, int v, const char *name, tr_err *err);
// Context, network socket (ROUTER or DEALER) and pipe; binding and CURVE are the caller's.
int tr_ep_init(tr_endpoint *ep, bool is_router, uint64_t max_bytes, tr_err *err);
void tr_ep_close_sock(void **s);
// Stops the I/O thread (if started) and frees everything; the init functions' failure paths
// call it on a partly set-up endpoint.
void tr_ep_free(tr_endpoint *ep);
int tr_ep_setup_curve_server(tr_endpoint *ep, const tr_curve_opts *c, const char *endpoint, tr_err *err);
int tr_ep_setup_curve_client(void *sock, const tr_curve_opts *c, const char *endpoint, tr_err *err);

// ---- transport_io.c ----

// The caller holds ep->mu.
peer_slot *tr_ep_find_peer(tr_endpoint *ep, const char *id);
void tr_ep_drain_more(void *sock);
// Starts the I/O thread; from then on only it touches the network socket.
int tr_ep_start(tr_endpoint *ep, tr_err *err);
