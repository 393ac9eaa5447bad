// A misbehaving reward service for the client tests. Correct answers score every item 0.5
// (so they differ from the zero policy's 0); the MODE decides how it misbehaves:
//   hang          receives requests, never answers
//   crash_after=N answers N requests, then exits without answering the next
//   wrong_count   answers one score too few
//   not_msgpack   answers bytes that are not msgpack
//   nan           answers NaN for the first item
//   wrong_type    answers scores as strings
//   error         answers {"error": "model not loaded"}
//   flaky         answers garbage to the first request, then correctly
//   slow_first    answers the first request late (after SLOW_MS), then promptly
//   two_frames    answers with two frames
//   big           answers correctly with 24 MiB of padding (over the client's 16 MiB cap)
// usage: fake_reward_service ENDPOINT MODE   (prints "listening on ..." once bound; stops
// on SIGTERM, and on its own after 60 s so a lost test cannot leave it behind)
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "roles/msg.h"

#define SLOW_MS 1500

static int count_items(const void *buf, size_t len) {
    if (tr_msg_check_msgpack(buf, len, NULL)) return -1;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int n = -1;
    if (msgpack_unpack_next(&u, buf, len, &off) == MSGPACK_UNPACK_SUCCESS) {
        tr_msg_map m;
        tr_msg_array a;
        if (tr_msg_map_wrap(&m, &u.data, "score", "request", NULL) == 0 && tr_msg_get_array(&m, "items", &a, NULL) == 0)
            n = (int)a.n;
    }
    msgpack_unpacked_destroy(&u);
    return n;
}

static void send_writer(void *sock, tr_msg_writer *w) {
    const void *d;
    size_t n;
    if (tr_msg_writer_finish(w, &d, &n, NULL) == 0) zmq_send(sock, d, n, 0);
    tr_msg_writer_reset(w);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fake_reward_service ENDPOINT MODE\n");
        return 2;
    }
    const char *mode = argv[2];
    int crash_after = -1;
    if (strncmp(mode, "crash_after=", 12) == 0) crash_after = atoi(mode + 12);
    alarm(60);
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_REP);
    if (zmq_bind(sock, argv[1]) != 0) {
        fprintf(stderr, "fake_reward_service: bind %s: %s\n", argv[1], zmq_strerror(zmq_errno()));
        return 1;
    }
    printf("listening on %s\n", argv[1]);
    fflush(stdout);
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    for (int served = 0;; served++) {
        char buf[1 << 16];
        int len = zmq_recv(sock, buf, sizeof buf, 0);
        if (len < 0) break;
        if (len > (int)sizeof buf) len = (int)sizeof buf;
        int n = count_items(buf, (size_t)len);
        if (strcmp(mode, "hang") == 0) {
            pause();  // until SIGTERM or the alarm
            break;
        }
        if (served == crash_after) _exit(1);
        if (strcmp(mode, "slow_first") == 0 && served == 0) usleep(SLOW_MS * 1000);
        bool garbage = strcmp(mode, "flaky") == 0 && served == 0;
        if (strcmp(mode, "not_msgpack") == 0 || garbage) {
            zmq_send(sock, "\xc1 this is not msgpack", 21, 0);
            continue;
        }
        if (strcmp(mode, "two_frames") == 0) {
            zmq_send(sock, "\x80", 1, ZMQ_SNDMORE);
            zmq_send(sock, "\x80", 1, 0);
            continue;
        }
        if (strcmp(mode, "error") == 0) {
            tr_msg_put_map(&w, NULL, 1);
            tr_msg_put_str(&w, "error", "model not loaded");
            send_writer(sock, &w);
            continue;
        }
        int k = n < 0 ? 0 : n;
        if (strcmp(mode, "wrong_count") == 0 && k > 0) k--;
        bool big = strcmp(mode, "big") == 0;
        tr_msg_put_map(&w, NULL, big ? 2 : 1);
        if (big) {
            size_t pad_len = (size_t)24 << 20;
            char *pad = malloc(pad_len + 1);
            if (!pad) return 1;
            memset(pad, 'x', pad_len);
            pad[pad_len] = '\0';
            tr_msg_put_str(&w, "pad", pad);
            free(pad);
        }
        tr_msg_put_array(&w, "scores", (uint32_t)k);
        for (int i = 0; i < k; i++) {
            if (strcmp(mode, "nan") == 0 && i == 0) tr_msg_put_float(&w, NULL, 0.0 / 0.0);
            else if (strcmp(mode, "wrong_type") == 0) tr_msg_put_str(&w, NULL, "0.5");
            else tr_msg_put_float(&w, NULL, 0.5);
        }
        send_writer(sock, &w);
    }
    tr_msg_writer_free(&w);
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return 0;
}
