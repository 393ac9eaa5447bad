// CURVE tests on tcp://127.0.0.1: key files round trip (and mismatched or misplaced secrets
// are refused), an authorized worker connects and exchanges messages, while a worker whose
// key is not authorized, one that expects another server key, and one without CURVE are
// all kept out.
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "engine/file.h"
#include "roles/curve.h"
#include "roles/transport.h"
#include "tests/test.h"

static char dir[256];

static const char *path_in(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", dir, name);
    return buf;
}

static void test_key_files(void) {
    char base[300], key[320], pub[320], p[320];
    tr_curve_keypair kp, back;
    tr_err e;
    CHECKF(tr_curve_keygen_files(path_in(base, sizeof base, "a"), &kp, &e) == 0, "%s", e.msg);
    snprintf(key, sizeof key, "%s.key", base);
    snprintf(pub, sizeof pub, "%s.pub", base);
    CHECK(tr_curve_key_valid(kp.public_key) && tr_curve_key_valid(kp.secret_key));
    // The public key is the Curve25519 public key of the secret one (libzmq derives it).
    char derived[41];
    CHECK(zmq_curve_public(derived, kp.secret_key) == 0 && strcmp(derived, kp.public_key) == 0);
    struct stat st;
    CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(stat(pub, &st) == 0 && (st.st_mode & 0777) == 0644);
    CHECK(tr_curve_key_read(key, &back, &e) == 0 && strcmp(back.public_key, kp.public_key) == 0 &&
          strcmp(back.secret_key, kp.secret_key) == 0);
    CHECK(tr_curve_key_read(pub, &back, &e) == 0 && strcmp(back.public_key, kp.public_key) == 0 &&
          back.secret_key[0] == '\0');

    // A secret that belongs to another public key.
    tr_curve_keypair other;
    CHECK(tr_curve_keypair_generate(&other, &e) == 0);
    char text[512];
    snprintf(text, sizeof text, "public-key = \"%s\"\nsecret-key = \"%s\"\n", kp.public_key, other.secret_key);
    CHECK(tr_file_write_atomic(path_in(p, sizeof p, "mixed.key"), text, strlen(text), &e) == 0);
    CHECK(tr_curve_key_read(p, &back, &e) == -1 && strstr(e.msg, "does not belong"));
    // Bad lines name file and line.
    snprintf(text, sizeof text, "# comment\n\npublic-key = \"%.39s\"\n", kp.public_key);
    CHECK(tr_file_write_atomic(p, text, strlen(text), &e) == 0);
    CHECK(tr_curve_key_read(p, &back, &e) == -1 && strstr(e.msg, "mixed.key:3:"));
    snprintf(text, sizeof text, "public-key \"%s\"\n", kp.public_key);
    CHECK(tr_file_write_atomic(p, text, strlen(text), &e) == 0);
    CHECK(tr_curve_key_read(p, &back, &e) == -1 && strstr(e.msg, ":1: expected '='"));
    CHECK(!tr_curve_key_valid("short"));
    CHECK(!tr_curve_key_valid("0000000000000000000000000000000000000 ~~"));

    // Authorized-keys files are concatenated public key files; secrets are refused.
    char a1[320], a2[320];
    tr_curve_keypair k2;
    CHECK(tr_curve_keygen_files(path_in(a1, sizeof a1, "b"), &k2, &e) == 0);
    char *t1 = NULL, *t2 = NULL;
    size_t n1, n2;
    snprintf(a1, sizeof a1, "%s/b.pub", dir);
    CHECK(tr_file_read(pub, &t1, &n1, &e) == 0 && tr_file_read(a1, &t2, &n2, &e) == 0);
    char both[1024];
    snprintf(both, sizeof both, "%s%s", t1 ? t1 : "", t2 ? t2 : "");
    free(t1);
    free(t2);
    CHECK(tr_file_write_atomic(path_in(a2, sizeof a2, "authorized"), both, strlen(both), &e) == 0);
    tr_curve_authorized auth;
    CHECK(tr_curve_authorized_read(a2, &auth, &e) == 0 && auth.n == 2);
    unsigned char raw[32];
    CHECK(zmq_z85_decode(raw, k2.public_key) != NULL && tr_curve_authorized_has(&auth, raw));
    CHECK(zmq_z85_decode(raw, other.public_key) != NULL && !tr_curve_authorized_has(&auth, raw));
    tr_curve_authorized_free(&auth);
    CHECK(tr_curve_authorized_read(key, &auth, &e) == -1 && strstr(e.msg, "secret key in an authorized-keys file"));
}

static int try_worker(const char *ep, const char *key, const char *server_key, tr_err *e, tr_dealer **out) {
    tr_dealer_opts o = {.endpoint = ep, .role = "policy", .rank = 0, .world = 1, .hello_timeout_ms = 1500,
                        .curve = {.key_file = key, .server_key_file = server_key}};
    return tr_dealer_init(out, &o, e);
}

static void test_curve_endpoint(void) {
    char server[300], client[300], rogue[300], auth_path[300], skey[320], spub[320], ckey[320], cpub[320],
        rkey[320], rpub[320];
    tr_curve_keypair kp;
    tr_err e;
    CHECK(tr_curve_keygen_files(path_in(server, sizeof server, "server"), &kp, &e) == 0);
    CHECK(tr_curve_keygen_files(path_in(client, sizeof client, "client"), &kp, &e) == 0);
    CHECK(tr_curve_keygen_files(path_in(rogue, sizeof rogue, "rogue"), &kp, &e) == 0);
    snprintf(skey, sizeof skey, "%s.key", server);
    snprintf(spub, sizeof spub, "%s.pub", server);
    snprintf(ckey, sizeof ckey, "%s.key", client);
    snprintf(cpub, sizeof cpub, "%s.pub", client);
    snprintf(rkey, sizeof rkey, "%s.key", rogue);
    snprintf(rpub, sizeof rpub, "%s.pub", rogue);
    char *text;
    size_t n;
    CHECK(tr_file_read(cpub, &text, &n, &e) == 0);
    CHECK(tr_file_write_atomic(path_in(auth_path, sizeof auth_path, "workers.authorized"), text, n, &e) == 0);
    free(text);

    tr_router_opts ro = {.endpoint = "tcp://127.0.0.1:*", .heartbeat_interval_ms = 100, .heartbeat_timeout_ms = 3000,
                         .curve = {.key_file = skey, .authorized_file = auth_path}};
    tr_router *r;
    CHECKF(tr_router_init(&r, &ro, &e) == 0, "%s", e.msg);
    if (!r) return;
    const char *ep = tr_router_endpoint(r);
    CHECK(strncmp(ep, "tcp://127.0.0.1:", 16) == 0);

    // Authorized: hello, a request and its reply.
    tr_dealer *d = NULL;
    CHECKF(try_worker(ep, ckey, spub, &e, &d) == 0, "%s", e.msg);
    if (d) {
        tr_msg_writer w;
        tr_msg_writer_init(&w);
        tr_msg_begin_request(&w, "values", 3, 1);
        tr_msg_put_str(&w, "secret", "over CURVE");
        CHECK(tr_router_send_writer(r, "policy/0", &w, &e) == 0);
        tr_wire_msg m;
        tr_msg_str s;
        CHECKF(tr_dealer_recv(d, &m, 3000, &e) == 0, "%s", e.msg);
        CHECK(m.msg.id == 3 && tr_msg_get_str(&m.msg.args, "secret", &s, &e) == 0 && s.len == 10 &&
              memcmp(s.ptr, "over CURVE", 10) == 0);
        tr_wire_msg_free(&m);
        tr_msg_begin_reply(&w, 3, 0);
        CHECK(tr_dealer_send_writer(d, &w, &e) == 0);
        CHECKF(tr_router_recv(r, &m, 3000, &e) == 0 && m.msg.ok && m.msg.id == 3, "%s", e.msg);
        tr_wire_msg_free(&m);
        tr_msg_writer_free(&w);
        tr_dealer_free(d);
    }
    tr_transport_stats st;
    tr_router_stats(r, &st);
    CHECK(st.auth_rejected == 0);

    // A key pair the controller does not list: the authenticator refuses it.
    d = NULL;
    CHECK(try_worker(ep, rkey, spub, &e, &d) == -1 && e.code == TR_ETIMEOUT && d == NULL);
    tr_router_stats(r, &st);
    CHECK(st.auth_rejected >= 1);
    // The right client key, but the worker trusts another server key: the handshake fails.
    CHECK(try_worker(ep, ckey, rpub, &e, &d) == -1 && e.code == TR_ETIMEOUT);
    // No CURVE at all against a CURVE router (loopback, so the worker may try).
    CHECK(try_worker(ep, NULL, NULL, &e, &d) == -1 && e.code == TR_ETIMEOUT);
    // Half a configuration is an error before connecting.
    CHECK(try_worker(ep, ckey, NULL, &e, &d) == -1 && strstr(e.msg, "needs both"));
    int np = 0;
    tr_peer peers[4];
    tr_router_peers(r, peers, 4, &np);
    CHECK(np == 1);  // only the authorized worker ever registered
    tr_router_free(r);

    // A router with keys but no authorized list is refused.
    ro.curve.authorized_file = NULL;
    CHECK(tr_router_init(&r, &ro, &e) == -1 && strstr(e.msg, "authorized_file"));
}

// The key file example in docs/protocol.md is a real pair in the format the reader takes.
static void test_documented_example(void) {
    char *doc;
    size_t n;
    tr_err e;
    CHECKF(tr_file_read(tr_test_src("docs/protocol.md"), &doc, &n, &e) == 0, "%s", e.msg);
    if (!doc) return;
    char *pub = strstr(doc, "public-key = \"");
    char *sec = pub ? strstr(pub, "secret-key = \"") : NULL;
    CHECK(pub && sec);
    if (pub && sec) {
        char *end = strchr(sec, '\n');
        char p[320];
        if (end) *end = '\0';
        CHECK(tr_file_write_atomic(path_in(p, sizeof p, "doc.key"), pub, strlen(pub), &e) == 0);
        tr_curve_keypair kp;
        CHECKF(tr_curve_key_read(p, &kp, &e) == 0, "%s", e.msg);
    }
    free(doc);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    test_key_files();
    test_curve_endpoint();
    test_documented_example();
    int rc = tr_test_summary("test_curve");
    if (rc == 0) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
