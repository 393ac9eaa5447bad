// The two ends of the roles protocol (docs/protocol.md): the controller binds a ZeroMQ
// ROUTER (tr_router), every worker rank connects a DEALER named "<role>/<rank>" (tr_dealer).
// Each end runs an I/O thread that owns the socket, so heartbeats keep flowing while the
// caller computes; the caller's send/recv talk to that thread. The I/O thread answers
// hello and heartbeat messages itself, drops and counts malformed or oversize messages
// (with an error reply when the request id is readable) and marks peers dead after the
// heartbeat timeout.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "roles/msg.h"

#define TR_PEER_ID_MAX 48     // "<role>/<rank>"
#define TR_ROLE_NAME_MAX 24   // [a-z][a-z0-9_]*
#define TR_HOST_NAME_MAX 64
#define TR_HEARTBEAT_INTERVAL_MS_DEFAULT 1000
#define TR_HEARTBEAT_TIMEOUT_MS_DEFAULT 10000
#define TR_ROUTER_ENDPOINT_DEFAULT "tcp://127.0.0.1:*"

typedef struct tr_transport_stats {
    uint64_t sent, received;                  // application messages (not heartbeats)
    uint64_t heartbeats_sent, heartbeats_received;
    uint64_t dropped_malformed;               // not msgpack, bad fields, wrong frame count
    uint64_t dropped_oversize;                // larger than max_message_bytes
    uint64_t dropped_unknown_peer;            // from peers without an accepted hello (router)
    uint64_t error_replies;                   // sent by the I/O thread for dropped requests
    uint64_t send_failures;                   // refused by ZeroMQ (peer gone) after queuing
    uint64_t auth_rejected;                   // CURVE clients whose key is not authorized
    uint64_t peers_dead;
} tr_transport_stats;

// CURVE settings. Required for endpoints that are not loopback (tcp://127.x, tcp://[::1],
// tcp://localhost, ipc://, inproc://); optional otherwise.
typedef struct tr_curve_opts {
    const char *key_file;          // own key pair (public + secret), see roles/curve.h
    const char *authorized_file;   // router: the client public keys it accepts
    const char *server_key_file;   // dealer: the router's public key
} tr_curve_opts;

typedef struct tr_router_opts {
    const char *endpoint;             // bind address; default TR_ROUTER_ENDPOINT_DEFAULT
    int heartbeat_interval_ms;        // 0 = default; sent to workers in the hello reply
    int heartbeat_timeout_ms;         // 0 = default; a peer silent this long is dead
    uint64_t max_message_bytes;       // 0 = TR_MSG_MAX_BYTES_DEFAULT
    tr_curve_opts curve;
} tr_router_opts;

typedef struct tr_dealer_opts {
    const char *endpoint;             // the controller's endpoint
    const char *role;                 // "policy", "reference", "critic", "reward", ...
    int32_t rank, world;              // this rank of the role group, and the group's size
    int hello_timeout_ms;             // 0 = 10000: how long tr_dealer_init waits for the hello reply
    uint64_t max_message_bytes;       // 0 = default; until the hello reply brings the controller's
    tr_curve_opts curve;
} tr_dealer_opts;

// A peer as the router knows it from its hello.
typedef struct tr_peer {
    char id[TR_PEER_ID_MAX];
    char role[TR_ROLE_NAME_MAX];
    int32_t rank, world;
    int64_t pid;
    char host[TR_HOST_NAME_MAX];
    uint32_t protocol;
    bool dead;
    int64_t last_seen_ms;   // CLOCK_MONOTONIC milliseconds
} tr_peer;

// A received application message: msg is decoded, with views into the frame this owns.
typedef struct tr_wire_msg {
    char peer[TR_PEER_ID_MAX];  // sender ("<role>/<rank>"); empty on the dealer side
    tr_msg msg;
    void *frame_;
} tr_wire_msg;

void tr_wire_msg_free(tr_wire_msg *m);

typedef struct tr_router tr_router;

int tr_router_init(tr_router **out, const tr_router_opts *opts, tr_err *err);
void tr_router_free(tr_router *r);
// The bound endpoint with the real port (for "tcp://127.0.0.1:*").
const char *tr_router_endpoint(const tr_router *r);
// Queues data for peer. Fails at once if the peer never said hello, is dead, or the
// message is larger than max_message_bytes. Never blocks.
int tr_router_send(tr_router *r, const char *peer, const void *data, size_t len, tr_err *err);
// Finishes the writer's message and sends it without copying it (ZeroMQ takes over the
// writer's buffer); the writer is reset and can build the next message.
int tr_router_send_writer(tr_router *r, const char *peer, tr_msg_writer *w, tr_err *err);
// Waits up to timeout_ms (-1 = forever) for the next application message. Fails with
// TR_ETIMEOUT when none came, and with TR_EPEER (naming it) once for every peer that died.
int tr_router_recv(tr_router *r, tr_wire_msg *m, int timeout_ms, tr_err *err);
// Waits until n peers with the given role (NULL = any) have said hello.
int tr_router_wait_peers(tr_router *r, const char *role, int n, int timeout_ms, tr_err *err);
// Copies up to max peers into out; *n is the number known.
void tr_router_peers(tr_router *r, tr_peer *out, int max, int *n);
// Peers that died since the last call (each reported once here, independently of recv).
void tr_router_dead_peers(tr_router *r, char (*ids)[TR_PEER_ID_MAX], int max, int *n);
void tr_router_stats(tr_router *r, tr_transport_stats *s);

typedef struct tr_dealer tr_dealer;

// Connects, says hello and waits for the controller's reply (which sets the heartbeat
// interval, timeout and maximum message size).
int tr_dealer_init(tr_dealer **out, const tr_dealer_opts *opts, tr_err *err);
void tr_dealer_free(tr_dealer *d);
int tr_dealer_send(tr_dealer *d, const void *data, size_t len, tr_err *err);
int tr_dealer_send_writer(tr_dealer *d, tr_msg_writer *w, tr_err *err);
// Like tr_router_recv; fails with TR_EPEER once the controller has been silent for the timeout.
int tr_dealer_recv(tr_dealer *d, tr_wire_msg *m, int timeout_ms, tr_err *err);
// Waits up to timeout_ms (-1: no limit) until one of the n dealers has a message: the index of
// the first that has, or -1 when none had within the time (or on a failed poll, recorded in
// err). A process hosting several roles waits on all of their sockets at once with it, so
// that no role's request waits out another role's poll interval.
#define TR_DEALER_WAIT_MAX 8
int tr_dealer_wait_any(tr_dealer *const *ds, int n, int timeout_ms, tr_err *err);
void tr_dealer_stats(tr_dealer *d, tr_transport_stats *s);
// Replies to a request: error replies name the op, ok replies are built by the caller.
int tr_dealer_send_error(tr_dealer *d, uint64_t id, const tr_err *e, tr_err *err);

// True for tcp://127.x.y.z, tcp://[::1], tcp://localhost, ipc:// and inproc:// endpoints.
bool tr_endpoint_is_loopback(const char *endpoint);
int64_t tr_now_ms(void);
