// Transport tests over ipc:// and tcp://127.0.0.1: request/reply round trips between a
// router and dealer threads, heartbeats that keep a busy worker alive, death detection of
// a stopped worker process (SIGSTOP) and of a vanished controller, and the I/O thread's
// handling of malformed, oversize, unregistered and badly introduced peers.
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "roles/transport.h"
#include "tests/test.h"

static char dir[256];

static void endpoint_in_dir(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "ipc://%s/%s", dir, name);
}

// ---- round trip with two worker threads ----

typedef struct worker_arg {
    const char *endpoint;
    int rank;
    int busy_ms;  // sleep this long before serving (without touching the transport)
    int rc;
    char err[TR_ERR_MSG_MAX + 16];
} worker_arg;

// Serves "echo" (doubles tensor x, returns rank) until "shutdown".
static void *echo_worker(void *p) {
    worker_arg *a = p;
    tr_dealer_opts o = {.endpoint = a->endpoint, .role = "policy", .rank = a->rank, .world = 2};
    tr_dealer *d;
    tr_err e;
    a->rc = -1;
    if (tr_dealer_init(&d, &o, &e)) {
        snprintf(a->err, sizeof a->err, "%s", e.msg);
        return NULL;
    }
    if (a->busy_ms) usleep((useconds_t)a->busy_ms * 1000);
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    for (int i = 0; i < 100; i++) {
        tr_wire_msg m;
        if (tr_dealer_recv(d, &m, 5000, &e)) {
            snprintf(a->err, sizeof a->err, "recv: %s", e.msg);
            break;
        }
        if (strcmp(m.msg.op, "shutdown") == 0) {
            tr_msg_begin_reply(&w, m.msg.id, 0);
            tr_dealer_send_writer(d, &w, &e);
            tr_wire_msg_free(&m);
            a->rc = 0;
            break;
        }
        tr_tensor_view t;
        float x[16];
        if (tr_msg_get_tensor(&m.msg.args, "x", &t, &e) ||
            tr_tensor_view_copy(&t, TR_DTYPE_F32, x, sizeof x, "x", &e)) {
            tr_dealer_send_error(d, m.msg.id, &e, &e);
        } else {
            for (int k = 0; k < t.numel; k++) x[k] *= 2;
            tr_msg_begin_reply(&w, m.msg.id, 2);
            tr_msg_put_int(&w, "rank", a->rank);
            tr_msg_put_tensor(&w, "y", TR_DTYPE_F32, t.ndim, t.shape, x);
            tr_dealer_send_writer(d, &w, &e);
        }
        tr_wire_msg_free(&m);
    }
    tr_msg_writer_free(&w);
    tr_dealer_free(d);
    return NULL;
}

static void test_round_trip(void) {
    char ep[300];
    endpoint_in_dir(ep, sizeof ep, "rt.sock");
    tr_router_opts ro = {.endpoint = ep, .heartbeat_interval_ms = 50, .heartbeat_timeout_ms = 2000};
    tr_router *r;
    tr_err e;
    CHECKF(tr_router_init(&r, &ro, &e) == 0, "%s", e.msg);
    if (!r) return;
    CHECK(strcmp(tr_router_endpoint(r), ep) == 0);
    worker_arg args[2] = {{.endpoint = ep, .rank = 0}, {.endpoint = ep, .rank = 1, .busy_ms = 600}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, echo_worker, &args[i]);
    CHECKF(tr_router_wait_peers(r, "policy", 2, 5000, &e) == 0, "%s", e.msg);
    tr_peer peers[4];
    int np = 0;
    tr_router_peers(r, peers, 4, &np);
    CHECK(np == 2);
    for (int i = 0; i < np && i < 4; i++) {
        CHECK(peers[i].world == 2 && peers[i].pid == getpid() && peers[i].host[0] && !peers[i].dead);
        CHECK(strcmp(peers[i].role, "policy") == 0 && peers[i].protocol == TR_PROTOCOL_VERSION);
    }
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    float x[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    int64_t shape[2] = {2, 3};
    for (int rank = 0; rank < 2; rank++) {
        char peer[16];
        snprintf(peer, sizeof peer, "policy/%d", rank);
        tr_msg_begin_request(&w, "echo", 100 + (uint64_t)rank, 1);
        tr_msg_put_tensor(&w, "x", TR_DTYPE_F32, 2, shape, x);
        CHECKF(tr_router_send_writer(r, peer, &w, &e) == 0, "%s", e.msg);
    }
    // policy/1 is busy for 600 ms: much longer than the heartbeat interval, and it must
    // still look alive because its I/O thread keeps heartbeating.
    int got = 0, dead_events = 0;
    for (int i = 0; i < 40 && got < 2; i++) {
        tr_wire_msg m;
        if (tr_router_recv(r, &m, 250, &e)) {
            if (e.code == TR_EPEER) dead_events++;
            continue;
        }
        int64_t rank = -1;
        tr_tensor_view t;
        float y[6] = {0};
        CHECK(m.msg.kind == TR_MSG_REPLY && m.msg.ok);
        CHECK(tr_msg_get_int(&m.msg.args, "rank", &rank, &e) == 0 && m.msg.id == 100 + (uint64_t)rank);
        char want[16];
        snprintf(want, sizeof want, "policy/%d", (int)rank);
        CHECK(strcmp(m.peer, want) == 0);
        CHECK(tr_msg_get_tensor(&m.msg.args, "y", &t, &e) == 0 && t.ndim == 2 && t.shape[1] == 3);
        CHECK(tr_tensor_view_copy(&t, TR_DTYPE_F32, y, sizeof y, "y", &e) == 0);
        for (int k = 0; k < 6; k++) CHECK(y[k] == 2 * x[k]);
        tr_wire_msg_free(&m);
        got++;
    }
    CHECK(got == 2);
    CHECK(dead_events == 0);
    // An op with a bad argument comes back as an error reply naming op and key.
    tr_msg_begin_request(&w, "echo", 7, 1);
    tr_msg_put_str(&w, "x", "not a tensor");
    CHECK(tr_router_send_writer(r, "policy/0", &w, &e) == 0);
    tr_wire_msg m;
    CHECKF(tr_router_recv(r, &m, 5000, &e) == 0, "%s", e.msg);
    CHECK(m.msg.kind == TR_MSG_REPLY && !m.msg.ok && m.msg.id == 7 && m.msg.remote.code == TR_EINVAL);
    CHECKF(strstr(m.msg.remote.msg, "echo: args.x: expected tensor map, got str") != NULL, "%s", m.msg.remote.msg);
    tr_wire_msg_free(&m);
    // Unknown peers and oversize messages fail at the sender.
    CHECK(tr_router_send(r, "policy/9", "x", 1, &e) == -1 && e.code == TR_EPEER);
    for (int rank = 0; rank < 2; rank++) {
        char peer[16];
        snprintf(peer, sizeof peer, "policy/%d", rank);
        tr_msg_begin_request(&w, "shutdown", 200 + (uint64_t)rank, 0);
        CHECK(tr_router_send_writer(r, peer, &w, &e) == 0);
    }
    for (int i = 0; i < 2; i++) {
        CHECKF(tr_router_recv(r, &m, 5000, &e) == 0 && m.msg.ok, "%s", e.msg);
        tr_wire_msg_free(&m);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECKF(args[i].rc == 0, "worker %d: %s", i, args[i].err);
    }
    tr_transport_stats s;
    tr_router_stats(r, &s);
    CHECK(s.received == 5 && s.sent == 5 && s.heartbeats_received > 0 && s.heartbeats_sent > 0);
    CHECK(s.dropped_malformed == 0 && s.peers_dead == 0);
    tr_msg_writer_free(&w);
    tr_router_free(r);
}

// ---- death of a stopped worker process ----

static void test_worker_death(void) {
    char ep[300];
    endpoint_in_dir(ep, sizeof ep, "death.sock");
    tr_router_opts ro = {.endpoint = ep, .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 1000};
    tr_router *r;
    tr_err e;
    // The child is forked before this process has any ZeroMQ context.
    pid_t child = fork();
    if (child == 0) {
        tr_dealer_opts o = {.endpoint = ep, .role = "critic", .rank = 0, .world = 1, .hello_timeout_ms = 10000};
        tr_dealer *d;
        if (tr_dealer_init(&d, &o, &e)) _exit(3);
        for (int i = 0; i < 200; i++) {  // serve until stopped and killed, at most ~20 s
            tr_wire_msg m;
            if (tr_dealer_recv(d, &m, 100, &e) == 0) tr_wire_msg_free(&m);
        }
        tr_dealer_free(d);
        _exit(0);
    }
    CHECK(child > 0);
    if (child <= 0) return;
    CHECKF(tr_router_init(&r, &ro, &e) == 0, "%s", e.msg);
    if (!r) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        return;
    }
    CHECKF(tr_router_wait_peers(r, "critic", 1, 10000, &e) == 0, "%s", e.msg);
    // Alive for 2.5 timeouts: no death reported.
    tr_wire_msg m;
    int early = 0;
    for (int i = 0; i < 10; i++)
        if (tr_router_recv(r, &m, 250, &e) == -1 && e.code == TR_EPEER) early++;
    CHECK(early == 0);
    kill(child, SIGSTOP);
    int reported = 0;
    for (int i = 0; i < 40 && !reported; i++) {  // at most 10 s
        if (tr_router_recv(r, &m, 250, &e) == -1 && e.code == TR_EPEER) {
            reported = 1;
            CHECKF(strstr(e.msg, "critic/0") != NULL, "%s", e.msg);
        }
    }
    CHECK(reported);
    char dead[4][TR_PEER_ID_MAX];
    int nd = 0;
    tr_router_dead_peers(r, dead, 4, &nd);
    CHECK(nd == 1 && strcmp(dead[0], "critic/0") == 0);
    tr_router_dead_peers(r, dead, 4, &nd);
    CHECK(nd == 0);  // reported once
    CHECK(tr_router_send(r, "critic/0", "x", 1, &e) == -1 && e.code == TR_EPEER && strstr(e.msg, "dead"));
    tr_transport_stats s;
    tr_router_stats(r, &s);
    CHECK(s.peers_dead == 1);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    tr_router_free(r);
}

// ---- death of the controller, seen from a worker ----

static void test_controller_death(void) {
    char ep[300];
    endpoint_in_dir(ep, sizeof ep, "ctl.sock");
    tr_router_opts ro = {.endpoint = ep, .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 1000};
    tr_router *r;
    tr_err e;
    CHECKF(tr_router_init(&r, &ro, &e) == 0, "%s", e.msg);
    if (!r) return;
    tr_dealer_opts o = {.endpoint = ep, .role = "reference", .rank = 0, .world = 1};
    tr_dealer *d;
    CHECKF(tr_dealer_init(&d, &o, &e) == 0, "%s", e.msg);
    if (!d) {
        tr_router_free(r);
        return;
    }
    tr_wire_msg m;
    CHECK(tr_dealer_recv(d, &m, 1500, &e) == -1 && e.code == TR_ETIMEOUT);  // alive, just quiet
    tr_router_free(r);
    int reported = 0;
    for (int i = 0; i < 20 && !reported; i++)
        if (tr_dealer_recv(d, &m, 500, &e) == -1 && e.code == TR_EPEER) reported = 1;
    CHECK(reported);
    CHECKF(strstr(e.msg, "controller") != NULL, "%s", e.msg);
    // Every later receive fails at once too, even one that would wait forever.
    CHECK(tr_dealer_recv(d, &m, -1, &e) == -1 && e.code == TR_EPEER);
    CHECK(tr_dealer_send(d, "x", 1, &e) == -1 && e.code == TR_EPEER);
    tr_dealer_free(d);
}

// ---- malformed, oversize and unknown peers ----

static void *raw_socket(void *ctx, const char *identity, const char *ep) {
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (identity) zmq_setsockopt(s, ZMQ_ROUTING_ID, identity, strlen(identity));
    zmq_connect(s, ep);
    return s;
}

static int raw_send_writer(void *s, tr_msg_writer *w) {
    const void *d;
    size_t n;
    int rc = tr_msg_writer_finish(w, &d, &n, NULL) == 0 && zmq_send(s, d, n, 0) == (int)n ? 0 : -1;
    tr_msg_writer_reset(w);
    return rc;
}

// Receives one reply on a raw socket, skipping heartbeats; -1 if none within timeout_ms.
static int raw_recv_reply(void *s, tr_msg *m, char *buf, size_t cap, int timeout_ms) {
    int64_t end = tr_now_ms() + timeout_ms;
    while (tr_now_ms() < end) {
        zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 50) <= 0) continue;
        int n = zmq_recv(s, buf, cap, 0);
        if (n < 0 || (size_t)n > cap) continue;
        tr_err e;
        if (tr_msg_decode(m, buf, (size_t)n, cap, &e) == 0 && m->kind == TR_MSG_REPLY) return 0;
        tr_msg_free(m);
    }
    return -1;
}

static void put_hello(tr_msg_writer *w, const char *role, int rank, int protocol) {
    tr_msg_begin_request(w, "hello", 1, 6);
    tr_msg_put_str(w, "role", role);
    tr_msg_put_int(w, "rank", rank);
    tr_msg_put_int(w, "world", 4);
    tr_msg_put_int(w, "pid", 1);
    tr_msg_put_int(w, "protocol", protocol);
    tr_msg_put_str(w, "host", "test");
}

static void test_bad_peers(void) {
    char ep[300];
    endpoint_in_dir(ep, sizeof ep, "bad.sock");
    tr_router_opts ro = {.endpoint = ep, .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 5000,
                         .max_message_bytes = 4096};
    tr_router *r;
    tr_err e;
    CHECKF(tr_router_init(&r, &ro, &e) == 0, "%s", e.msg);
    if (!r) return;
    void *ctx = zmq_ctx_new();
    static char buf[1 << 16];
    tr_msg m;
    tr_msg_writer w;
    tr_msg_writer_init(&w);

    // Hello with another protocol version, and with an identity that is not role/rank.
    void *v2 = raw_socket(ctx, "policy/0", ep);
    put_hello(&w, "policy", 0, 1);
    raw_send_writer(v2, &w);
    CHECK(raw_recv_reply(v2, &m, buf, sizeof buf, 3000) == 0 && !m.ok && m.remote.code == TR_EUNSUPPORTED &&
          strstr(m.remote.msg, "protocol 1"));
    tr_msg_free(&m);
    zmq_close(v2);
    void *liar = raw_socket(ctx, "policy/1", ep);
    put_hello(&w, "critic", 1, TR_PROTOCOL_VERSION);
    raw_send_writer(liar, &w);
    CHECK(raw_recv_reply(liar, &m, buf, sizeof buf, 3000) == 0 && !m.ok && strstr(m.remote.msg, "is not 'critic/1'"));
    tr_msg_free(&m);
    zmq_close(liar);

    // A peer that never said hello is ignored (no reply) and counted.
    void *ghost = raw_socket(ctx, "ghost/0", ep);
    tr_msg_begin_request(&w, "generate", 5, 0);
    raw_send_writer(ghost, &w);
    CHECK(raw_recv_reply(ghost, &m, buf, sizeof buf, 300) == -1);
    zmq_close(ghost);

    // A registered peer sending garbage, a future version, and an oversize request.
    void *s = raw_socket(ctx, "policy/2", ep);
    put_hello(&w, "policy", 2, TR_PROTOCOL_VERSION);
    raw_send_writer(s, &w);
    CHECK(raw_recv_reply(s, &m, buf, sizeof buf, 3000) == 0 && m.ok);
    uint64_t maxb = 0;
    CHECK(tr_msg_get_uint(&m.args, "max_message_bytes", &maxb, &e) == 0 && maxb == 4096);
    tr_msg_free(&m);
    zmq_send(s, "not msgpack", 11, 0);
    zmq_send(s, "a", 1, ZMQ_SNDMORE);  // two frames: the protocol has one
    zmq_send(s, "b", 1, 0);
    static const uint8_t v9[] = {0x84, 0xa1, 'v', 0x09, 0xa2, 'o', 'p', 0xa1, 'x',
                                 0xa2, 'i', 'd', 0x0b, 0xa4, 'a', 'r', 'g', 's', 0x80};
    zmq_send(s, v9, sizeof v9, 0);
    CHECK(raw_recv_reply(s, &m, buf, sizeof buf, 3000) == 0 && !m.ok && m.id == 11 && m.remote.code == TR_EUNSUPPORTED);
    tr_msg_free(&m);
    static uint8_t big[6000];
    tr_msg_begin_request(&w, "train", 12, 1);
    tr_msg_put_bin(&w, "blob", big, sizeof big);
    raw_send_writer(s, &w);
    CHECK(raw_recv_reply(s, &m, buf, sizeof buf, 3000) == 0 && !m.ok && m.id == 12 && m.remote.code == TR_ERANGE &&
          strstr(m.remote.msg, "exceeds the maximum of 4096"));
    tr_msg_free(&m);
    // Beyond twice the maximum ZeroMQ cuts the connection; the router carries on.
    static uint8_t huge[9000];
    zmq_send(s, huge, sizeof huge, 0);
    // A good request afterwards still arrives (the DEALER reconnects by itself).
    int delivered = 0;
    for (int i = 0; i < 20 && !delivered; i++) {
        tr_msg_begin_request(&w, "ping", 13, 0);
        raw_send_writer(s, &w);
        tr_wire_msg wm;
        if (tr_router_recv(r, &wm, 250, &e) == 0) {
            delivered = strcmp(wm.peer, "policy/2") == 0 && wm.msg.id == 13;
            tr_wire_msg_free(&wm);
        }
    }
    CHECK(delivered);
    tr_transport_stats st;
    tr_router_stats(r, &st);
    CHECKF(st.dropped_malformed == 3, "%llu", (unsigned long long)st.dropped_malformed);  // text, 2 frames, v9
    CHECK(st.dropped_oversize == 1);
    CHECK(st.dropped_unknown_peer == 1);
    CHECK(st.error_replies == 4);  // v2 hello, liar hello, v9, oversize
    // The router's own send refuses oversize messages.
    CHECK(tr_router_send(r, "policy/2", big, sizeof big, &e) == -1 && e.code == TR_ERANGE);
    zmq_close(s);
    zmq_ctx_term(ctx);
    tr_msg_writer_free(&w);
    tr_router_free(r);
}

static void test_endpoints(void) {
    CHECK(tr_endpoint_is_loopback("tcp://127.0.0.1:5555"));
    CHECK(tr_endpoint_is_loopback("tcp://127.0.0.1:*"));
    CHECK(tr_endpoint_is_loopback("tcp://localhost:1"));
    CHECK(tr_endpoint_is_loopback("tcp://[::1]:1"));
    CHECK(tr_endpoint_is_loopback("ipc:///tmp/x"));
    CHECK(!tr_endpoint_is_loopback("tcp://0.0.0.0:5555"));
    CHECK(!tr_endpoint_is_loopback("tcp://*:5555"));
    CHECK(!tr_endpoint_is_loopback("tcp://10.0.0.1:5555"));
    CHECK(!tr_endpoint_is_loopback("tcp://127.0.0.1.evil.com:1"));
    CHECK(!tr_endpoint_is_loopback("tcp://eth0;127.0.0.1:1"));
    CHECK(!tr_endpoint_is_loopback(NULL));
    // A non-loopback bind without CURVE keys is refused before anything is bound.
    tr_router_opts ro = {.endpoint = "tcp://*:0"};
    tr_router *r;
    tr_err e;
    CHECK(tr_router_init(&r, &ro, &e) == -1 && strstr(e.msg, "not a loopback endpoint") && r == NULL);
    tr_dealer_opts o = {.endpoint = "tcp://10.1.2.3:5555", .role = "policy", .rank = 0, .world = 1};
    tr_dealer *d;
    CHECK(tr_dealer_init(&d, &o, &e) == -1 && strstr(e.msg, "not a loopback endpoint"));
    o.endpoint = "ipc:///nonexistent";
    o.role = "Policy";
    CHECK(tr_dealer_init(&d, &o, &e) == -1 && strstr(e.msg, "invalid role"));
    o.role = "policy";
    o.rank = 2;
    o.world = 2;
    CHECK(tr_dealer_init(&d, &o, &e) == -1 && strstr(e.msg, "outside a world of 2"));
    // Nobody listening: the hello times out.
    o.rank = 0;
    o.hello_timeout_ms = 300;
    char ep[300];
    endpoint_in_dir(ep, sizeof ep, "nobody.sock");
    o.endpoint = ep;
    CHECK(tr_dealer_init(&d, &o, &e) == -1 && e.code == TR_ETIMEOUT);
    ro.endpoint = ep;
    ro.heartbeat_interval_ms = 500;
    ro.heartbeat_timeout_ms = 400;
    CHECK(tr_router_init(&r, &ro, &e) == -1 && strstr(e.msg, "must exceed the interval"));
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    test_worker_death();  // first: it forks before any ZeroMQ context exists
    test_round_trip();
    test_controller_death();
    test_bad_peers();
    test_endpoints();
    int rc = tr_test_summary("test_transport");
    if (rc == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
