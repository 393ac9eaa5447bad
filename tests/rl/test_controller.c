// The controller with real worker processes (`troupe worker`), all on loopback:
//   - fork mode from a recipe (policy and reference colocated, rule reward apart): logs in
//     run_dir/logs, a generate -> score -> logprobs round trip whose reference logprobs equal
//     the generation's bit for bit;
//   - a worker killed with SIGKILL, and one stopped with SIGSTOP (hung), each reported within
//     10 s by the next call, naming role and rank and quoting its log;
//   - attach mode: workers started by hand before the controller join it;
//   - a worker whose controller is SIGKILLed exits by itself (heartbeat timeout), and workers
//     the controller forked die with it (PR_SET_PDEATHSIG);
//   - SIGINT to the controller: the run stops and no worker process is left;
//   - data-parallel communicators formed through the controller: two groups at once in the
//     same worker processes (policy and critic colocated, dp 2), and with attached workers.
// usage: test_controller TROUPE
#include <math.h>
#include <poll.h>
#include <stdint.h>

#include "rl/controller.h"
#include "tests/roles/proc_util.h"
#include "tests/test.h"

static const char *troupe, *tmp, *model;

static int load_recipe(tr_recipe *r, const char *run, const char *models, const char *extra) {
    char text[4096];
    snprintf(text, sizeof text,
             "workflow: grpo\n"
             "run_dir: %s/%s\n"
             "threads: 1\n"
             "models:\n"
             "  policy: {path: %s}\n"
             "%s"
             "  reward: {kind: rule, function: regex, pattern: \"[aeiou]\"}\n"
             "data: {train: %s/train.jsonl, chat_format: none, max_prompt_len: 16}\n"
             "rollout: {n: 2, max_new_tokens: 8}\n"
             "train: {steps: 1, prompts_per_step: 2, micro_batch_tokens: 256}\n"
             "%s",
             tmp, run, model, models, tmp, extra);
    tr_err err = {0};
    int rc = tr_recipe_parse(text, strlen(text), run, NULL, 0, r, &err);
    if (rc) fprintf(stderr, "recipe: %s\n", err.msg);
    return rc;
}

static tr_controller_opts opts(void) {
    tr_controller_opts o = {.exe = troupe, .grace_ms = 2000, .keep_signals = true};
    return o;
}

static void prompts(tr_prompt_batch *pb, int32_t *ids, int64_t *off) {
    int32_t a[] = {5, 17, 42, 9, 33, 101, 7};
    memcpy(ids, a, sizeof a);
    off[0] = 0;
    off[1] = 3;
    off[2] = 7;
    *pb = (tr_prompt_batch){.n = 2, .ids = ids, .offset = off};
}

// generate -> score -> reference logprobs; returns 0 when every call succeeded.
static int round_trip(tr_controller *c, bool reference, tr_err *err) {
    tr_group *pol = tr_controller_group(c, TR_RECIPE_POLICY), *rew = tr_controller_group(c, TR_RECIPE_REWARD);
    tr_group *ref = reference ? tr_controller_group(c, TR_RECIPE_REFERENCE) : pol;
    if (!pol || !rew || !ref) return tr_errf(err, TR_EINVAL, "missing group");
    int32_t ids[8];
    int64_t off[3];
    tr_prompt_batch pb;
    prompts(&pb, ids, off);
    tr_sampling s = {.n = 2, .max_new_tokens = 8, .temperature = 1.0f, .top_p = 1.0f, .seed = 5};
    tr_rollouts r;
    tr_rollouts_init(&r);
    float scores[4], *lp = NULL;
    int rc = tr_policy_generate(pol, &pb, &s, &r, err);
    if (!rc) rc = tr_reward_score(rew, &r, 0, scores, NULL, err);
    if (!rc) {
        lp = calloc((size_t)r.n_tokens, sizeof(float));
        rc = tr_model_logprobs(ref, &r, lp, NULL, err);
    }
    if (!rc) {
        double worst = 0;
        for (int64_t t = 0; t < r.n_tokens; t++) worst = fmax(worst, fabs((double)lp[t] - r.gen_logprobs[t]));
        CHECKF(worst == 0, "logprobs differ from the generation's by %.3g", worst);
        CHECK(r.n == 4);
        for (int i = 0; i < 4; i++) CHECK(scores[i] == 0.0f || scores[i] == 1.0f);
    }
    free(lp);
    tr_rollouts_free(&r);
    return rc;
}

// Fails a call on group g after the fault; returns the ms until the error, with err filled.
static long long time_to_error(tr_controller *c, enum tr_recipe_role role, tr_err *err) {
    long long t0 = tp_now_ms();
    int32_t ids[8];
    int64_t off[3];
    tr_prompt_batch pb;
    prompts(&pb, ids, off);
    tr_rollouts r;
    tr_rollouts_init(&r);
    int32_t toks[4] = {5, 6, 7, 8};
    tr_rollouts_append(&r, 0, 0, toks, 2, toks + 2, NULL, 2, TR_FINISH_STOP, NULL, "x", NULL, err);
    float out[4];
    int rc = 0;
    // Calls until one fails (the first may be answered before the fault is seen) or 20 s pass.
    while (rc == 0 && tp_now_ms() - t0 < 20000) {
        if (role == TR_RECIPE_REWARD) rc = tr_reward_score(tr_controller_group(c, role), &r, 0, out, NULL, err);
        else rc = tr_model_logprobs(tr_controller_group(c, role), &r, out, NULL, err);
    }
    tr_rollouts_free(&r);
    return rc ? tp_now_ms() - t0 : -1;
}

static void test_sigkill(void) {
    tr_recipe *r = malloc(sizeof *r);
    CHECK(r && load_recipe(r, "run-kill", "  reference: {from: policy}\n",
                           "placement: {colocate: [[policy, reference]]}\n") == 0);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    int rc = tr_controller_start_opts(&c, r, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) {
        free(r);
        return;
    }
    char log[2048];
    snprintf(log, sizeof log, "%s/run-kill/logs/policy+reference-0.log", tmp);
    CHECKF(tp_file_has(log, "[policy/0] connected to") && tp_file_has(log, "[reference/0] init:"), "%s", log);
    snprintf(log, sizeof log, "%s/run-kill/logs/reward-0.log", tmp);
    CHECKF(tp_file_has(log, "[reward/0] init:"), "%s", log);
    CHECKF(round_trip(c, true, &err) == 0, "%s", err.msg);
    int64_t pids[4];
    const char *names[4];
    int n = tr_controller_workers(c, pids, names, 4);
    CHECK(n == 2);
    int64_t reward_pid = 0;
    for (int i = 0; i < n && i < 4; i++)
        if (strcmp(names[i], "reward/0") == 0) reward_pid = pids[i];
    CHECK(reward_pid > 0);
    kill((pid_t)reward_pid, SIGKILL);
    long long ms = time_to_error(c, TR_RECIPE_REWARD, &err);
    CHECKF(ms >= 0 && ms < 10000, "killed worker reported after %lld ms", ms);
    CHECKF(strstr(err.msg, "reward/0") && strstr(err.msg, "signal 9") && strstr(err.msg, "connected to"), "%s",
           err.msg);
    printf("SIGKILL reported after %lld ms: %.200s...\n", ms, err.msg);
    // The failure sticks; the other workers are still shut down cleanly.
    CHECK(tr_controller_check(c, &err) != 0 && strstr(err.msg, "reward/0"));
    CHECK(tr_controller_stop(c, &err) == 0);
    for (int i = 0; i < n; i++) CHECK(tp_gone((pid_t)pids[i]));
    free(r);
}

static void test_sigstop(void) {
    tr_recipe *r = malloc(sizeof *r);
    CHECK(r && load_recipe(r, "run-stop", "  reference: {from: policy}\n", "") == 0);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    int rc = tr_controller_start_opts(&c, r, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) {
        free(r);
        return;
    }
    int64_t pids[4];
    const char *names[4];
    int n = tr_controller_workers(c, pids, names, 4);
    CHECK(n == 3);
    int64_t ref_pid = 0;
    for (int i = 0; i < n && i < 4; i++)
        if (strcmp(names[i], "reference/0") == 0) ref_pid = pids[i];
    CHECK(ref_pid > 0);
    kill((pid_t)ref_pid, SIGSTOP);
    long long ms = time_to_error(c, TR_RECIPE_REFERENCE, &err);
    CHECKF(ms >= 0 && ms < 10000, "hung worker reported after %lld ms", ms);
    CHECKF(strstr(err.msg, "reference/0") && strstr(err.msg, "silent"), "%s", err.msg);
    printf("SIGSTOP reported after %lld ms: %.160s...\n", ms, err.msg);
    CHECK(tr_controller_stop(c, &err) == 0);  // SIGTERM + SIGCONT end the stopped one
    for (int i = 0; i < n; i++) CHECK(tp_gone((pid_t)pids[i]));
    free(r);
}

static void test_attach(void) {
    char ep[600], extra[800];
    snprintf(ep, sizeof ep, "ipc://%s/attach.ipc", tmp);
    snprintf(extra, sizeof extra, "placement: {attach: true, endpoint: \"%s\"}\n", ep);
    tr_recipe *r = malloc(sizeof *r);
    CHECK(r && load_recipe(r, "run-attach", "", extra) == 0);
    // Workers come up first (as srun or a container would start them) and wait for hello.
    char *pa[] = {(char *)troupe, "worker", "--role", "policy", "--connect", ep, NULL};
    char *ra[] = {(char *)troupe, "worker", "--role", "reward", "--connect", ep, NULL};
    char la[700], lr[700];
    snprintf(la, sizeof la, "%s/attach-policy.log", tmp);
    snprintf(lr, sizeof lr, "%s/attach-reward.log", tmp);
    pid_t p1 = tp_spawn(pa, la), p2 = tp_spawn(ra, lr);
    tp_sleep_ms(300);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    o.start_timeout_ms = 30000;
    int rc = tr_controller_start_opts(&c, r, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (!rc) {
        CHECK(tr_controller_workers(c, NULL, NULL, 0) == 0);  // none of ours
        CHECKF(round_trip(c, false, &err) == 0, "%s", err.msg);
        CHECK(tr_controller_stop(c, &err) == 0);
    }
    int s1 = -1, s2 = -1;
    CHECK(tp_wait(p1, 10000, &s1) && WIFEXITED(s1) && WEXITSTATUS(s1) == 0);
    CHECK(tp_wait(p2, 10000, &s2) && WIFEXITED(s2) && WEXITSTATUS(s2) == 0);
    CHECK(tp_file_has(la, "waiting for the controller") || tp_file_has(la, "connected to"));
    tp_reap(p1);
    tp_reap(p2);
    free(r);
}

// A PPO recipe whose policy and critic (dp 2) share their worker processes.
static int load_ppo_dp(tr_recipe *r, const char *run, const char *extra) {
    char text[4096];
    snprintf(text, sizeof text,
             "workflow: ppo\n"
             "run_dir: %s/%s\n"
             "threads: 1\n"
             "models:\n"
             "  policy: {path: %s, parallel: {dp: 2}}\n"
             "  critic: {from: policy, parallel: {dp: 2}}\n"
             "  reward: {kind: rule, function: regex, pattern: \"[aeiou]\"}\n"
             "data: {train: %s/train.jsonl, chat_format: none, max_prompt_len: 16}\n"
             "algorithm: {kl: {coef: 0.0}}\n"
             "rollout: {n: 1, max_new_tokens: 8}\n"
             "train: {steps: 1, prompts_per_step: 2, micro_batch_tokens: 256}\n"
             "%s",
             tmp, run, model, tmp, extra);
    tr_err err = {0};
    int rc = tr_recipe_parse(text, strlen(text), run, NULL, 0, r, &err);
    if (rc) fprintf(stderr, "recipe: %s\n", err.msg);
    return rc;
}

static void test_comm_colocated(void) {
    tr_recipe *r = malloc(sizeof *r);
    CHECK(r && load_ppo_dp(r, "run-comm", "placement: {colocate: [[policy, critic]]}\n") == 0);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    long long t0 = tp_now_ms();
    int rc = tr_controller_start_opts(&c, r, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) {
        free(r);
        return;
    }
    printf("two dp groups in two shared processes started in %lld ms\n", tp_now_ms() - t0);
    CHECK(tr_controller_workers(c, NULL, NULL, 0) == 3);
    for (int rank = 0; rank < 2; rank++) {
        char log[2048], want[64];
        snprintf(log, sizeof log, "%s/run-comm/logs/policy+critic-%d.log", tmp, rank);
        for (int k = 0; k < 2; k++) {
            snprintf(want, sizeof want, "[%s/%d] comm_ready: dp rank %d of 2 (shm)", k ? "critic" : "policy", rank, rank);
            CHECKF(tp_file_has(log, want), "%s: no '%s'", log, want);
        }
    }
    CHECK(tr_controller_stop(c, &err) == 0);
    free(r);
}

static void test_comm_attach(void) {
    char ep[600], extra[800];
    snprintf(ep, sizeof ep, "ipc://%s/attach-dp.ipc", tmp);
    snprintf(extra, sizeof extra, "placement: {attach: true, endpoint: \"%s\"}\n", ep);
    tr_recipe *r = malloc(sizeof *r);
    CHECK(r && load_recipe(r, "run-attach-dp", "", extra) == 0);
    if (!r) return;
    r->models[TR_RECIPE_POLICY].parallel.dp = 2;
    char *p0[] = {(char *)troupe, "worker", "--role", "policy", "--connect", ep, "--rank", "0", "--world", "2", NULL};
    char *p1[] = {(char *)troupe, "worker", "--role", "policy", "--connect", ep, "--rank", "1", "--world", "2", NULL};
    char *ra[] = {(char *)troupe, "worker", "--role", "reward", "--connect", ep, NULL};
    char l0[700], l1[700], lr[700];
    snprintf(l0, sizeof l0, "%s/attach-dp-0.log", tmp);
    snprintf(l1, sizeof l1, "%s/attach-dp-1.log", tmp);
    snprintf(lr, sizeof lr, "%s/attach-dp-reward.log", tmp);
    pid_t w0 = tp_spawn(p0, l0), w1 = tp_spawn(p1, l1), w2 = tp_spawn(ra, lr);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    o.start_timeout_ms = 30000;
    int rc = tr_controller_start_opts(&c, r, &o, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (!rc) {
        CHECK(tp_file_has(l1, "[policy/1] comm_ready: dp rank 1 of 2 (shm)"));
        CHECKF(round_trip(c, false, &err) == 0, "%s", err.msg);
        CHECK(tr_controller_stop(c, &err) == 0);
    }
    int st;
    CHECK(tp_wait(w0, 10000, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(tp_wait(w1, 10000, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(tp_wait(w2, 10000, &st) && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    tp_reap(w0);
    tp_reap(w1);
    tp_reap(w2);
    free(r);
}

// Runs a controller in a child process; the child writes its workers' pids (0-terminated)
// to fd, then waits: for SIGINT when `interruptible` (and exits 0 after a clean stop), else
// forever. Returns the child's pid.
static pid_t controller_child(const char *run, const char *extra, bool interruptible, int fd) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    tr_recipe *r = malloc(sizeof *r);
    if (!r || load_recipe(r, run, "", extra) != 0) _exit(3);
    tr_controller *c = NULL;
    tr_err err = {0};
    tr_controller_opts o = opts();
    o.keep_signals = !interruptible;
    if (tr_controller_start_opts(&c, r, &o, &err) != 0) {
        fprintf(stderr, "child controller: %s\n", err.msg);
        _exit(4);
    }
    int64_t pids[8] = {0};
    int n = tr_controller_workers(c, pids, NULL, 7);
    if (write(fd, pids, sizeof pids) != (ssize_t)sizeof pids) _exit(5);
    close(fd);
    (void)n;
    while (tr_controller_check(c, &err) == 0) tp_sleep_ms(50);
    bool cancelled = err.code == TR_ECANCELED;
    int rc = tr_controller_stop(c, &err);
    _exit(cancelled && rc == 0 ? 0 : 6);
}

static int read_pids(int fd, int64_t *pids) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) return -1;
    ssize_t n = read(fd, pids, 8 * sizeof(int64_t));
    return n == 8 * (ssize_t)sizeof(int64_t) ? 0 : -1;
}

static bool all_gone(const int64_t *pids, int timeout_ms) {
    long long end = tp_now_ms() + timeout_ms;
    for (;;) {
        bool gone = true;
        for (int i = 0; i < 8 && pids[i]; i++) gone = gone && tp_gone((pid_t)pids[i]);
        if (gone) return true;
        if (tp_now_ms() > end) return false;
        tp_sleep_ms(50);
    }
}

static void test_ctrl_c(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t child = controller_child("run-ctrlc", "", true, fds[1]);
    close(fds[1]);
    int64_t pids[8] = {0};
    CHECK(read_pids(fds[0], pids) == 0);
    close(fds[0]);
    CHECK(pids[0] > 0 && pids[1] > 0);
    kill(child, SIGINT);
    int st = -1;
    CHECK(tp_wait(child, 20000, &st));
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "controller child status %d", st);
    CHECK(all_gone(pids, 5000));
    tp_reap(child);
    for (int i = 0; i < 8; i++)
        if (pids[i]) tp_reap((pid_t)pids[i]);
}

// A controller killed outright: its forked workers die with it (PR_SET_PDEATHSIG), and a
// worker started by hand notices the silence and exits (heartbeat timeout).
static void test_controller_killed(void) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t child = controller_child("run-killed", "", false, fds[1]);
    close(fds[1]);
    int64_t pids[8] = {0};
    CHECK(read_pids(fds[0], pids) == 0);
    close(fds[0]);
    kill(child, SIGKILL);
    tp_wait(child, 5000, NULL);
    CHECK(all_gone(pids, 5000));

    char ep[600], extra[800], log[700];
    snprintf(ep, sizeof ep, "ipc://%s/killed.ipc", tmp);
    snprintf(extra, sizeof extra, "placement: {attach: true, endpoint: \"%s\"}\n", ep);
    snprintf(log, sizeof log, "%s/orphan-policy.log", tmp);
    char *pa[] = {(char *)troupe, "worker", "--role", "policy", "--connect", ep, NULL};
    char *ra[] = {(char *)troupe, "worker", "--role", "reward", "--connect", ep, NULL};
    pid_t w1 = tp_spawn(pa, log), w2 = tp_spawn(ra, NULL);
    CHECK(pipe(fds) == 0);
    child = controller_child("run-orphan", extra, false, fds[1]);
    close(fds[1]);
    CHECK(read_pids(fds[0], pids) == 0);  // started: both workers said hello and are initialized
    close(fds[0]);
    long long t0 = tp_now_ms();
    kill(child, SIGKILL);
    tp_wait(child, 5000, NULL);
    int s1 = -1;
    CHECK(tp_wait(w1, 15000, &s1) && WIFEXITED(s1) && WEXITSTATUS(s1) == 1);
    CHECK(tp_wait(w2, 15000, NULL));
    printf("attached worker exited %lld ms after its controller was killed\n", tp_now_ms() - t0);
    CHECK(tp_file_has(log, "is dead"));
    tp_reap(w1);
    tp_reap(w2);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_controller TROUPE\n");
        return 2;
    }
    troupe = argv[1];
    static char dir[256], md[1024];
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    tmp = dir;
    const char *m = tp_model_dir(getenv("TROUPE_SOURCE_ROOT") ? getenv("TROUPE_SOURCE_ROOT") : ".", tmp, "qwen2");
    CHECK(m != NULL);
    if (!m) return tr_test_summary("test_controller");
    snprintf(md, sizeof md, "%s", m);
    model = md;
    // The cases that fork a controller child run first, before this process has any ZeroMQ
    // context of its own.
    test_ctrl_c();
    test_controller_killed();
    test_sigkill();
    test_sigstop();
    test_attach();
    test_comm_colocated();
    test_comm_attach();
    if (tr_test_failures == 0) tp_rmtree(tmp);
    return tr_test_summary("test_controller");
}
