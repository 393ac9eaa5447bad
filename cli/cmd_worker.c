// `troupe worker`: one role worker process (or several colocated roles in one process),
// started by the controller (fork/exec with --parent-pid) or by hand / srun / a container
// (attaching to the controller's endpoint). Owns what is per process: signal handlers,
// PR_SET_PDEATHSIG, and stderr log lines prefixed with role/rank.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/err.h"
#include "roles/worker.h"

static const char *CMD = "worker";

// The process's one stop request: set by SIGTERM, read by the serve loop between ops.
static volatile sig_atomic_t stop_requested;

static void on_term(int sig) {
    (void)sig;
    stop_requested = 1;
}

static void log_line(void *ctx, const char *line) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L, line);
    fflush(stderr);
}

// Splits "policy,reference" into o->roles (pointing into buf).
static int split_roles(char *buf, tr_worker_opts *o) {
    o->n_roles = 0;
    static const char *const known[] = {"policy", "reference", "critic", "reward", "generator"};
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        bool ok = false;
        for (int i = 0; i < 5; i++) ok = ok || strcmp(t, known[i]) == 0;
        for (int i = 0; i < o->n_roles; i++) ok = ok && strcmp(t, o->roles[i]) != 0;
        if (!ok || o->n_roles == TR_WORKER_MAX_ROLES) return -1;
        o->roles[o->n_roles++] = t;
    }
    return o->n_roles > 0 ? 0 : -1;
}

int tr_cmd_worker(int argc, char **argv) {
    const char *roles = NULL, *endpoint = NULL, *key = NULL, *server_key = NULL;
    long rank = 0, world = 1, parent = 0, connect_timeout = 60000;
    tr_arg table[] = {
        {"role", TR_ARG_STR, &roles, "ROLE[,ROLE...]",
         "policy, reference, critic, reward or generator; several (comma-separated) share one process", true,
         false},
        {"connect", TR_ARG_STR, &endpoint, "ENDPOINT", "the controller's ZeroMQ endpoint", true, false},
        {"rank", TR_ARG_INT, &rank, "R", "this process's rank in its role groups (default 0)", false, false},
        {"world", TR_ARG_INT, &world, "W", "ranks in each role group (default 1)", false, false},
        {"curve-key", TR_ARG_STR, &key, "FILE", "own CURVE key pair (non-loopback endpoints)", false, false},
        {"server-key", TR_ARG_STR, &server_key, "FILE", "the controller's CURVE public key", false, false},
        {"connect-timeout-ms", TR_ARG_INT, &connect_timeout, "MS",
         "keep trying to reach the controller this long (default 60000)", false, false},
        {"parent-pid", TR_ARG_INT, &parent, "PID",
         "exit when this process (the controller that forked us) dies", false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    bool help;
    int rc = tr_args_parse(CMD, argc, argv, table, NULL, 0, NULL, &help);
    if (rc) return rc;
    if (help) {
        tr_args_usage(CMD, "--role ROLE[,ROLE...] --connect ENDPOINT [--rank R --world W]",
                      "Hosts role workers for a controller (troupe run). Exits on the controller's\n"
                      "shutdown op, on SIGTERM, and when the controller is silent past its heartbeat\n"
                      "timeout. Log lines go to stderr, prefixed with [role/rank].",
                      table);
        return 0;
    }
    if (world < 1 || world > 65536 || rank < 0 || rank >= world || connect_timeout < 1 ||
        connect_timeout > 86400000 || parent < 0) {
        fprintf(stderr, "troupe %s: need 0 <= --rank < --world <= 65536 and --connect-timeout-ms in 1..86400000\n",
                CMD);
        return 2;
    }
    char role_buf[256];
    tr_worker_opts o = {0};
    snprintf(role_buf, sizeof role_buf, "%s", roles);
    if (strlen(roles) >= sizeof role_buf || split_roles(role_buf, &o)) {
        fprintf(stderr, "troupe %s: --role takes 1 to %d different comma-separated roles among policy, reference, "
                "critic, reward, generator (got '%s')\n", CMD, TR_WORKER_MAX_ROLES, roles);
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    if (parent > 0) {
        // Forked by a controller: it orders the shutdown (Ctrl-C reaches it, not us), and its
        // death ends us even if it could not say so.
        signal(SIGINT, SIG_IGN);
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != (pid_t)parent) {
            fprintf(stderr, "troupe %s: the controller (pid %ld) is already gone\n", CMD, parent);
            return 1;
        }
    } else {
        sigaction(SIGINT, &sa, NULL);
    }
    // NCCL's NVLink multicast (NVLS) needs fabric and driver support that many machines lack,
    // and where it fails a communicator hangs instead of reporting: off for every worker.
    if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0) {
        fprintf(stderr, "troupe %s: cannot set NCCL_NVLS_ENABLE: %s\n", CMD, strerror(errno));
        return 1;
    }
    o.endpoint = endpoint;
    o.rank = (int32_t)rank;
    o.world = (int32_t)world;
    o.curve.key_file = key;
    o.curve.server_key_file = server_key;
    o.connect_timeout_ms = (int)connect_timeout;
    o.stop = &stop_requested;
    o.log = log_line;
    tr_err err = {0};
    if (tr_worker_run(&o, &err)) return tr_cli_fail(CMD, &err);
    return 0;
}
