// Roles transport and reward benchmark: request/reply latency of a small op between a
// router and a dealer thread, bandwidth of a large f32 tensor echoed both ways (encode,
// send, decode, copy out), and numeric_match rule throughput.
// usage: bench_transport [ipc|tcp] [tensor_mib]
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "roles/reward_rule.h"
#include "roles/transport.h"

typedef struct {
    const char *endpoint;
    int ok;
} worker_arg;

// Echoes every request's "x" tensor (when present) until "shutdown".
static void *worker(void *p) {
    worker_arg *a = p;
    tr_dealer_opts o = {.endpoint = a->endpoint, .role = "policy", .rank = 0, .world = 1};
    tr_dealer *d;
    tr_err e;
    if (tr_dealer_init(&d, &o, &e)) {
        fprintf(stderr, "worker: %s\n", e.msg);
        return NULL;
    }
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    for (;;) {
        tr_wire_msg m;
        if (tr_dealer_recv(d, &m, 10000, &e)) break;
        bool stop = strcmp(m.msg.op, "shutdown") == 0;
        tr_tensor_view t;
        if (!stop && tr_msg_has(&m.msg.args, "x") && tr_msg_get_tensor(&m.msg.args, "x", &t, &e) == 0) {
            tr_msg_begin_reply(&w, m.msg.id, 1);
            tr_msg_put_tensor(&w, "y", t.dtype, t.ndim, t.shape, t.data);
        } else {
            tr_msg_begin_reply(&w, m.msg.id, 0);
        }
        tr_dealer_send_writer(d, &w, &e);
        tr_wire_msg_free(&m);
        if (stop) {
            a->ok = 1;
            break;
        }
    }
    tr_msg_writer_free(&w);
    tr_dealer_free(d);
    return NULL;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *kind = argc > 1 ? argv[1] : "ipc";
    int mib = argc > 2 ? atoi(argv[2]) : 64;
    char ep[128];
    if (strcmp(kind, "tcp") == 0) snprintf(ep, sizeof ep, "tcp://127.0.0.1:*");
    else snprintf(ep, sizeof ep, "ipc:///tmp/troupe-bench-%d.sock", (int)getpid());
    tr_router_opts ro = {.endpoint = ep};
    tr_router *r;
    tr_err e;
    if (tr_router_init(&r, &ro, &e)) {
        fprintf(stderr, "router: %s\n", e.msg);
        return 1;
    }
    worker_arg a = {.endpoint = tr_router_endpoint(r)};
    pthread_t th;
    pthread_create(&th, NULL, worker, &a);
    if (tr_router_wait_peers(r, "policy", 1, 10000, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    enum { N_SMALL = 2000 };
    int64_t *lat = malloc(N_SMALL * sizeof *lat);
    uint64_t id = 1;
    for (int i = 0; i < N_SMALL; i++) {
        int64_t t0 = 0;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = ts.tv_sec * 1000000000LL + ts.tv_nsec;
        tr_msg_begin_request(&w, "ping", id++, 1);
        tr_msg_put_int(&w, "i", i);
        tr_wire_msg m;
        if (tr_router_send_writer(r, "policy/0", &w, &e) || tr_router_recv(r, &m, 5000, &e)) {
            fprintf(stderr, "small: %s\n", e.msg);
            return 1;
        }
        tr_wire_msg_free(&m);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        lat[i] = ts.tv_sec * 1000000000LL + ts.tv_nsec - t0;
    }
    qsort(lat, N_SMALL, sizeof *lat, cmp_i64);
    printf("%s small request/reply: median %.1f us, p99 %.1f us (%d round trips)\n", kind, lat[N_SMALL / 2] / 1e3,
           lat[N_SMALL * 99 / 100] / 1e3, N_SMALL);

    int64_t numel = (int64_t)mib << 18;  // MiB of f32
    float *x = malloc((size_t)numel * sizeof *x), *y = malloc((size_t)numel * sizeof *y);
    for (int64_t i = 0; i < numel; i++) x[i] = (float)i;
    int reps = 5;
    double t0 = now_s();
    for (int k = 0; k < reps; k++) {
        tr_msg_begin_request(&w, "echo", id++, 1);
        tr_msg_put_tensor(&w, "x", TR_DTYPE_F32, 1, &numel, x);
        tr_wire_msg m;
        tr_tensor_view t;
        if (tr_router_send_writer(r, "policy/0", &w, &e) || tr_router_recv(r, &m, 30000, &e) ||
            tr_msg_get_tensor(&m.msg.args, "y", &t, &e) ||
            tr_tensor_view_copy(&t, TR_DTYPE_F32, y, (size_t)numel * sizeof *y, "y", &e)) {
            fprintf(stderr, "tensor: %s\n", e.msg);
            return 1;
        }
        tr_wire_msg_free(&m);
    }
    double dt = now_s() - t0;
    if (memcmp(x, y, (size_t)numel * sizeof *x) != 0) fprintf(stderr, "tensor echo differs\n");
    printf("%s %d MiB f32 tensor echo: %.1f ms per round trip, %.2f GB/s each way\n", kind, mib, dt / reps * 1e3,
           2.0 * reps * (double)numel * 4 / dt / 1e9 / 2);
    tr_msg_begin_request(&w, "shutdown", id++, 0);
    tr_router_send_writer(r, "policy/0", &w, &e);
    tr_wire_msg m;
    if (tr_router_recv(r, &m, 5000, &e) == 0) tr_wire_msg_free(&m);
    pthread_join(th, NULL);
    tr_router_free(r);
    tr_msg_writer_free(&w);

    // numeric_match over GSM8K-like responses (~300 bytes, answer at the end).
    tr_reward_rule *rule;
    tr_reward_rule_opts o = {.kind = TR_REWARD_RULE_NUMERIC};
    if (tr_reward_rule_init(&rule, &o, &e)) return 1;
    char resp[512];
    snprintf(resp, sizeof resp,
             "Natalia sold 48/2 = 24 clips in May. Natalia sold 48 + 24 = 72 clips altogether in April and May. "
             "She then gave 3 of them away and bought 1,000 beads for $12.50, which does not change the count of "
             "clips she sold, so the number we want is still the total from April and May. The answer is 72.");
    int n_rule = 200000;
    float s = 0, total = 0;
    t0 = now_s();
    for (int i = 0; i < n_rule; i++) {
        tr_reward_rule_score_answer(rule, resp, strlen(resp), "72", 2, &s, &e);
        total += s;
    }
    dt = now_s() - t0;
    printf("numeric_match: %.2f M responses/s (%zu bytes each, score sum %.0f)\n", n_rule / dt / 1e6, strlen(resp),
           total);
    tr_reward_rule_free(rule);
    free(lat);
    free(x);
    free(y);
    return a.ok ? 0 : 1;
}
