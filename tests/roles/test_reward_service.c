// Reward service client tests against real service processes on ipc:// endpoints: the C
// example service (good path, batch splitting, tricky numbers), and fake_reward_service
// hanging, crashing mid-run and answering garbage, each under the fail and zero policies.
// usage: test_reward_service EXAMPLE_SERVICE FAKE_SERVICE
//        test_reward_service --python PYTHON SCRIPT   (good path against the Python example;
//                                                     skipped without pyzmq and msgpack)
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "roles/reward_service.h"
#include "tests/test.h"

static char dir[256];
static int n_endpoints;

typedef struct service {
    pid_t pid;
    char endpoint[300];
} service;

// Starts argv (with the endpoint appended at position ep_pos) and waits for "listening on".
static int start_service(service *s, const char *const *argv_in, int argc_in, int ep_pos) {
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s/svc%d.sock", dir, n_endpoints++);
    char *argv[8];
    for (int i = 0, j = 0; i <= argc_in && j < 7; i++) {
        if (i == ep_pos) argv[j++] = s->endpoint;
        if (i < argc_in) argv[j++] = (char *)argv_in[i];
        argv[j] = NULL;
    }
    int fds[2];
    if (pipe(fds) != 0) return -1;
    s->pid = fork();
    if (s->pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    char line[512];
    size_t n = 0;
    int ok = 0;
    while (n < sizeof line - 1) {
        struct pollfd p = {fds[0], POLLIN, 0};
        if (poll(&p, 1, 10000) <= 0) break;
        ssize_t r = read(fds[0], line + n, sizeof line - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        line[n] = '\0';
        if (strchr(line, '\n')) {
            ok = strncmp(line, "listening on", 12) == 0;
            break;
        }
    }
    close(fds[0]);
    if (!ok) {
        fprintf(stderr, "service %s did not start: '%s'\n", argv[0], line);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
        return -1;
    }
    return 0;
}

// Stops the service; returns its exit status (-1 if it had to be killed).
static int stop_service(service *s) {
    if (s->pid <= 0) return -1;
    int st = 0;
    pid_t r = waitpid(s->pid, &st, WNOHANG);
    if (r == 0) {
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 50 && (r = waitpid(s->pid, &st, WNOHANG)) == 0; i++) usleep(100000);
        if (r == 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, &st, 0);
            s->pid = 0;
            return -1;
        }
    }
    s->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

static const char *fake_path;

static int start_fake(service *s, const char *mode) {
    const char *argv[] = {fake_path, mode};
    return start_service(s, argv, 2, 1);  // fake_reward_service ENDPOINT MODE
}

static tr_reward_service *client(const char *endpoint, int policy, int max_items, int timeout_ms) {
    tr_reward_service_opts o = {.endpoint = endpoint, .timeout_ms = timeout_ms, .attempts = 3, .backoff_ms = 20,
                                .backoff_max_ms = 40, .max_items = max_items, .policy = policy};
    tr_reward_service *c = NULL;
    tr_err e;
    if (tr_reward_service_init(&c, &o, &e)) fprintf(stderr, "client: %s\n", e.msg);
    return c;
}

// The good path: hand-worked expected scores for the numeric rule.
static void good_path(const char *const *argv, int argc, int ep_pos) {
    service svc;
    CHECK(start_service(&svc, argv, argc, ep_pos) == 0);
    if (!svc.pid) return;
    static const tr_reward_item items[] = {
        {"What is 999+1?", "999 + 1 = 1,000", "{\"answer\": 1000}"},
        {"Halve -7", "That gives -3.5", "{\"answer\": \"-3.5\"}"},
        {"3 of 4?", "the fraction is 3/4", "{\"answer\": 0.75, \"source\": {\"set\": \"x\", \"ids\": [1, 2]}}"},
        {"Count", "I cannot count", "{\"answer\": 4}"},
        {"Sum", "first 3, then 5, so 8", "{\"answer\": 8}"},
        {"Sum", "first 8, then 3", "{\"answer\": 8}"},
        {"GSM8K style", "... so she has 72 clips", "{\"answer\": \"48 + 24 = 72\\n#### 72\"}"},
        {"Bytes", "\xff\xfe broken utf-8 then 12 \xc3", "{\"answer\": 12, \"note\": null, \"ok\": true}"},
        {"No meta", "42", "{\"answer\": \"42\"}"},
    };
    static const float want[] = {1, 1, 1, 0, 1, 0, 1, 1, 1};
    int n = (int)(sizeof items / sizeof items[0]);
    float scores[16];
    tr_reward_service *c = client(svc.endpoint, TR_REWARD_POLICY_FAIL, 4, 5000);
    tr_err e;
    CHECK(c != NULL);
    if (c) {
        CHECKF(tr_reward_service_score(c, items, n, 0, scores, &e) == 0, "%s", e.msg);
        for (int i = 0; i < n; i++) CHECKF(scores[i] == want[i], "item %d: %g, want %g", i, scores[i], want[i]);
        tr_reward_service_stats st;
        tr_reward_service_get_stats(c, &st);
        CHECK(st.requests == 3 && st.items_scored == (uint64_t)n);  // 4 + 4 + 1 items
        CHECK(st.retries == 0 && st.timeouts == 0 && st.garbage == 0 && st.items_failed == 0);
        // Zero items is a no-op.
        CHECK(tr_reward_service_score(c, items, 0, 0, scores, &e) == 0);
        // A malformed meta is a data error under any policy, naming the item.
        tr_reward_item bad = {"p", "1", "{\"answer\": 1,}"};
        CHECK(tr_reward_service_score(c, &bad, 1, 0, scores, &e) == -1 && strstr(e.msg, "item 0 meta"));
        bad.meta_json = "[1]";
        CHECK(tr_reward_service_score(c, &bad, 1, 0, scores, &e) == -1 && strstr(e.msg, "not an object"));
        tr_reward_service_free(c);
    }
    int st = stop_service(&svc);
    CHECKF(st == 0, "service exit status %d", st);  // clean exit on SIGTERM
}

static const tr_reward_item four[] = {
    {"a", "1", "{\"answer\": 1}"}, {"b", "2", "{\"answer\": 2}"},
    {"c", "3", "{\"answer\": 3}"}, {"d", "4", "{\"answer\": 4}"},
};

// Runs one misbehaving mode under both policies. fail_text must appear in the fail-policy
// error; want_zero are the zero-policy scores; timeouts/garbage the expected counters.
static void bad_case(const char *mode, int max_items, int timeout_ms, const char *fail_text, const float *want_zero,
                     uint64_t timeouts, uint64_t garbage, int line) {
    for (int policy = 0; policy < 2; policy++) {
        service svc;
        CHECK(start_fake(&svc, mode) == 0);
        if (!svc.pid) continue;
        tr_reward_service *c = client(svc.endpoint, policy, max_items, timeout_ms);
        float scores[4] = {-1, -1, -1, -1};
        tr_err e;
        tr_err_clear(&e);
        int rc = c ? tr_reward_service_score(c, four, 4, 0, scores, &e) : -2;
        tr_reward_service_stats st = {0};
        if (c) tr_reward_service_get_stats(c, &st);
        tr_test_checks++;
        bool ok;
        if (policy == TR_REWARD_POLICY_FAIL) {
            ok = rc == -1 && strstr(e.msg, fail_text) && strstr(e.msg, svc.endpoint) && strstr(e.msg, "3 attempts");
        } else {
            ok = rc == 0;
            for (int i = 0; i < 4; i++) ok = ok && scores[i] == want_zero[i];
            int failed = 0;
            for (int i = 0; i < 4; i++) failed += want_zero[i] == 0;
            ok = ok && st.items_failed == (uint64_t)failed;
        }
        ok = ok && st.timeouts == timeouts && st.garbage + st.service_errors == garbage && st.reconnects == timeouts;
        if (!ok) {
            tr_test_failures++;
            fprintf(stderr,
                    "%s:%d: mode %s policy %s: rc %d '%s' scores %g %g %g %g timeouts %llu garbage %llu "
                    "errors %llu failed %llu\n",
                    __FILE__, line, mode, policy ? "zero" : "fail", rc, e.msg, scores[0], scores[1], scores[2],
                    scores[3], (unsigned long long)st.timeouts, (unsigned long long)st.garbage,
                    (unsigned long long)st.service_errors, (unsigned long long)st.items_failed);
        }
        tr_reward_service_free(c);
        stop_service(&svc);
    }
}

static void test_bad_services(void) {
    static const float zeros[4] = {0, 0, 0, 0};
    static const float half_then_zero[4] = {0.5f, 0.5f, 0, 0};
    // Hangs: every attempt times out (3 per batch); one batch of 4, so the zero policy
    // waits for it once.
    bad_case("hang", 4, 300, "no reply within 300 ms", zeros, 3, 0, __LINE__);
    // Crashes after the first batch: the second batch times out. The first reply must come
    // within the timeout, hence a longer one than for the hang.
    bad_case("crash_after=1", 2, 600, "no reply within 600 ms", half_then_zero, 3, 0, __LINE__);
    // Garbage comes at once; the long timeout only guards against a slow machine.
    bad_case("wrong_count", 4, 3000, "3 scores for 4 items", zeros, 0, 3, __LINE__);
    bad_case("not_msgpack", 4, 3000, "reply is not msgpack", zeros, 0, 3, __LINE__);
    bad_case("nan", 4, 3000, "score 0 is NaN", zeros, 0, 3, __LINE__);
    bad_case("wrong_type", 4, 3000, "expected float, got str", zeros, 0, 3, __LINE__);
    bad_case("error", 4, 3000, "service error: model not loaded", zeros, 0, 3, __LINE__);
    bad_case("two_frames", 4, 3000, "reply of 2 frames", zeros, 0, 3, __LINE__);
    // Over max_reply_bytes (16 MiB): the error names the size and the cap, not a timeout.
    bad_case("big", 4, 3000, "bytes is over max_reply_bytes (16777216)", zeros, 0, 3, __LINE__);
}

static void test_recovery(void) {
    // Garbage once, then good: the retry succeeds.
    service svc;
    tr_err e;
    float scores[4];
    tr_reward_service_stats st;
    CHECK(start_fake(&svc, "flaky") == 0);
    tr_reward_service *c = client(svc.endpoint, TR_REWARD_POLICY_FAIL, 4, 2000);
    CHECKF(c && tr_reward_service_score(c, four, 4, 0, scores, &e) == 0, "%s", e.msg);
    tr_reward_service_get_stats(c, &st);
    CHECK(scores[0] == 0.5f && scores[3] == 0.5f && st.garbage == 1 && st.retries == 1 && st.requests == 2);
    tr_reward_service_free(c);
    stop_service(&svc);
    // A late first reply: timeout, fresh socket, retry answered; the late reply is not mistaken for it.
    // The service wakes at 1500 ms: 500 ms after the first timeout (1000 ms), 500 ms before
    // the retry's (sent at ~1020 ms).
    CHECK(start_fake(&svc, "slow_first") == 0);
    c = client(svc.endpoint, TR_REWARD_POLICY_FAIL, 4, 1000);
    CHECKF(c && tr_reward_service_score(c, four, 4, 0, scores, &e) == 0, "%s", e.msg);
    tr_reward_service_get_stats(c, &st);
    CHECK(scores[0] == 0.5f && st.timeouts == 1 && st.reconnects == 1 && st.items_scored == 4);
    tr_reward_service_free(c);
    stop_service(&svc);
    // Options are checked.
    tr_reward_service_opts o = {.endpoint = "ipc:///x", .policy = 7};
    CHECK(tr_reward_service_init(&c, &o, &e) == -1 && strstr(e.msg, "policy"));
    o.policy = TR_REWARD_POLICY_ZERO;
    o.timeout_ms = -1;
    CHECK(tr_reward_service_init(&c, &o, &e) == -1);
    CHECK(tr_reward_service_policy_from_name("zero") == TR_REWARD_POLICY_ZERO);
    CHECK(tr_reward_service_policy_from_name("fail") == TR_REWARD_POLICY_FAIL);
    CHECK(tr_reward_service_policy_from_name("retry") == -1);
}

static void cleanup(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    if (argc == 4 && strcmp(argv[1], "--python") == 0) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' -c 'import zmq, msgpack' 2>/dev/null", argv[2]);
        if (system(cmd) != 0) {
            printf("SKIP: %s has no pyzmq/msgpack\n", argv[2]);
            cleanup();
            return 77;
        }
        const char *pargv[] = {argv[2], argv[3]};
        good_path(pargv, 2, 2);  // python3 SCRIPT ENDPOINT
    } else if (argc == 3) {
        fake_path = argv[2];
        const char *cargv[] = {argv[1]};
        good_path(cargv, 1, 1);  // reward_service ENDPOINT
        test_bad_services();
        test_recovery();
    } else {
        fprintf(stderr, "usage: test_reward_service EXAMPLE_SERVICE FAKE_SERVICE | --python PYTHON SCRIPT\n");
        return 2;
    }
    int rc = tr_test_summary("test_reward_service");
    if (rc == 0) cleanup();
    return rc;
}
