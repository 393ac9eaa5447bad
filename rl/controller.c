// Worker processes of a run: fork/exec of `troupe worker` per rank (or colocated set) with
// stderr into run_dir/logs/, or attach mode where workers started elsewhere say hello; the
// check that turns a dead or silent worker into an error with its log's last lines; and the
// shutdown ladder (shutdown op, SIGTERM, SIGKILL after a grace period, waitpid).
#include "rl/controller.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine/file.h"
#include "rl/controller_init.h"
#include "roles/curve.h"

#define POLL_MS 100
#define MAX_PROCS 256

typedef struct worker_proc {
    pid_t pid;                    // 0: attached (not ours) or reaped
    char name[96];                // "policy+reference/0"
    int roles[TR_RECIPE_N_ROLES];
    int n_roles;
    int32_t rank;
    char log[TR_RECIPE_PATH_MAX + 256];
    bool exited;
    int status;
} worker_proc;

struct tr_controller {
    tr_controller_opts o;
    bool attach;
    char run_dir[TR_RECIPE_PATH_MAX];
    char exe[4096];
    tr_router *router;
    tr_curve_opts wcurve;         // keys of the workers we fork (non-loopback endpoints)
    char key_paths[4][TR_RECIPE_PATH_MAX + 64];   // generated keys: what the curve opts point at
    bool has_group[TR_RECIPE_N_ROLES];
    tr_group groups[TR_RECIPE_N_ROLES];
    tr_role_info info[TR_RECIPE_N_ROLES];   // what each role's init reported
    tr_inflight_set inflight;     // calls the workflow left in flight, shared by every group
    worker_proc procs[MAX_PROCS];
    int n_procs;
    bool failed;
    tr_err fail_err;
    bool share_weights;           // the generator reads the policy's weights in place
    bool signals;
    struct sigaction old_int, old_term;
};

// The process's one interrupt request (SIGINT/SIGTERM), counted so a second one can cut the
// grace periods of the shutdown short.
static volatile sig_atomic_t interrupts;

static void on_signal(int sig) {
    (void)sig;
    if (interrupts < 100) interrupts++;
}

bool tr_controller_interrupted(void) {
    return interrupts > 0;
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// The last n lines of path, each indented, into out.
static void log_tail(const char *path, int n, char *out, size_t cap) {
    out[0] = '\0';
    char *text = NULL;
    size_t len = 0;
    if (tr_file_read(path, &text, &len, NULL) != 0) {
        snprintf(out, cap, "  (no log at %.300s)", path);
        return;
    }
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    size_t start = len;
    for (int lines = 0; start > 0; start--)
        if (text[start - 1] == '\n' && ++lines == n) break;
    size_t o = 0;
    for (size_t i = start; i < len && o + 4 < cap; i++) {
        if (i == start || text[i - 1] == '\n') {
            out[o++] = ' ';
            out[o++] = ' ';
        }
        out[o++] = text[i];
    }
    out[o] = '\0';
    if (len == 0) snprintf(out, cap, "  (the log %.300s is empty)", path);
    free(text);
}

static int fail(tr_controller *c, tr_err *err, const worker_proc *p, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

// Records the run's first failure (sticky), with the worker's log tail when known.
static int fail(tr_controller *c, tr_err *err, const worker_proc *p, int code, const char *fmt, ...) {
    if (!c->failed) {
        char what[512], tail[TR_ERR_MSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(what, sizeof what, fmt, ap);
        va_end(ap);
        if (p && p->log[0]) {
            log_tail(p->log, c->o.log_tail_lines, tail, sizeof tail);
            tr_errf(&c->fail_err, code, "%s; last lines of %s:\n%s", what, p->log, tail);
        } else {
            tr_errf(&c->fail_err, code, "%s", what);
        }
        c->failed = true;
    }
    if (err) *err = c->fail_err;
    return -1;
}

static void describe_status(int st, char *out, size_t cap) {
    if (WIFEXITED(st)) snprintf(out, cap, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) snprintf(out, cap, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else snprintf(out, cap, "ended (wait status %d)", st);
}

// The process hosting peer "<role>/<rank>".
static worker_proc *proc_of_peer(tr_controller *c, const char *peer) {
    for (int i = 0; i < c->n_procs; i++) {
        worker_proc *p = &c->procs[i];
        for (int k = 0; k < p->n_roles; k++) {
            char id[TR_PEER_ID_MAX];
            snprintf(id, sizeof id, "%s/%d", tr_recipe_role_names[p->roles[k]], p->rank);
            if (strcmp(id, peer) == 0) return p;
        }
    }
    return NULL;
}

int tr_controller_check(tr_controller *c, tr_err *err) {
    if (c->failed) {
        if (err) *err = c->fail_err;
        return -1;
    }
    if (interrupts > 0 && c->signals)
        return fail(c, err, NULL, TR_ECANCELED, "interrupted (SIGINT/SIGTERM): stopping the workers");
    for (int i = 0; i < c->n_procs; i++) {
        worker_proc *p = &c->procs[i];
        if (p->pid <= 0 || p->exited) continue;
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r != p->pid) continue;
        p->exited = true;
        p->status = st;
        char how[128];
        describe_status(st, how, sizeof how);
        return fail(c, err, p, TR_EPEER, "worker %s (pid %d) %s", p->name, (int)p->pid, how);
    }
    char ids[16][TR_PEER_ID_MAX];
    int n = 0;
    tr_router_dead_peers(c->router, ids, 16, &n);
    if (n > 0) {
        worker_proc *p = proc_of_peer(c, ids[0]);
        int timeout = c->o.heartbeat_timeout_ms;
        if (p && p->pid > 0)
            return fail(c, err, p, TR_EPEER, "worker %s (pid %d%s%s) has been silent for over %d ms: hung, stopped "
                        "or overloaded", p->name, (int)p->pid, p->n_roles > 1 ? ", hosting " : "",
                        p->n_roles > 1 ? ids[0] : "", timeout);
        return fail(c, err, p, TR_EPEER, "worker %s has been silent for over %d ms: hung, stopped, or its host "
                    "is unreachable", ids[0], timeout);
    }
    return 0;
}

static int check_hook(void *ctx, tr_err *err) {
    return tr_controller_check(ctx, err);
}

// ---- endpoints and keys ----

static int choose_endpoint(tr_controller *c, const tr_recipe *r, char *ep, size_t cap, tr_err *err) {
    if (r->placement.endpoint[0]) {
        snprintf(ep, cap, "%s", r->placement.endpoint);
        return 0;
    }
    if (c->attach)
        return tr_errf(err, TR_EINVAL, "placement.attach needs placement.endpoint: the address workers started "
                       "elsewhere connect to");
    // ipc:// in run_dir when the socket path fits (108 bytes on Linux), else loopback TCP.
    // The name carries the controller's pid: workers of an earlier controller of the same
    // run_dir (killed, their heartbeat timeout not yet run out) cannot join a resumed run.
    char abs[4096];
    if (realpath(c->run_dir, abs) && strlen(abs) + sizeof "/controller-4294967295.ipc" <= 100)
        snprintf(ep, cap, "ipc://%s/controller-%ld.ipc", abs, (long)getpid());
    else
        snprintf(ep, cap, "tcp://127.0.0.1:*");
    return 0;
}

// CURVE keys for a non-loopback endpoint, made once under run_dir/keys/ and reused (workers
// on other hosts get copies of worker.key and controller.pub).
static int setup_keys(tr_controller *c, tr_curve_opts *router_curve, tr_err *err) {
    if (c->o.curve.key_file) {
        *router_curve = c->o.curve;
        c->wcurve = c->o.worker_curve;
        if (!c->attach && (!c->wcurve.key_file || !c->wcurve.server_key_file))
            return tr_errf(err, TR_EINVAL, "CURVE keys given for the controller but not for the workers it starts "
                           "(worker_curve.key_file and server_key_file)");
        return 0;
    }
    char dir[TR_RECIPE_PATH_MAX + 16], base[TR_RECIPE_PATH_MAX + 64], path[TR_RECIPE_PATH_MAX + 128];
    snprintf(dir, sizeof dir, "%s/keys", c->run_dir);
    if (tr_mkdirs(dir, err)) return -1;
    tr_curve_keypair kp;
    const char *names[] = {"controller", "worker"};
    for (int i = 0; i < 2; i++) {
        snprintf(base, sizeof base, "%s/%s", dir, names[i]);
        snprintf(path, sizeof path, "%s.key", base);
        if (!tr_file_exists(path) && tr_curve_keygen_files(base, &kp, err)) return -1;
    }
    snprintf(path, sizeof path, "%s/authorized", dir);
    if (!tr_file_exists(path)) {
        char pub[TR_RECIPE_PATH_MAX + 64], *text;
        size_t len;
        snprintf(pub, sizeof pub, "%s/worker.pub", dir);
        if (tr_file_read(pub, &text, &len, err)) return -1;
        int rc = tr_file_write_atomic(path, text, len, err);
        free(text);
        if (rc) return -1;
    }
    static const char *const files[4] = {"controller.key", "authorized", "worker.key", "controller.pub"};
    for (int i = 0; i < 4; i++) snprintf(c->key_paths[i], sizeof c->key_paths[i], "%s/%s", dir, files[i]);
    *router_curve = (tr_curve_opts){.key_file = c->key_paths[0], .authorized_file = c->key_paths[1]};
    c->wcurve = (tr_curve_opts){.key_file = c->key_paths[2], .server_key_file = c->key_paths[3]};
    return 0;
}

// ---- processes ----

// One process per rank of every colocated set and of every other role.
static int plan_procs(tr_controller *c, const tr_recipe *r, const int32_t *world, tr_err *err) {
    bool placed[TR_RECIPE_N_ROLES] = {false};
    for (int g = 0; g <= r->placement.n_colocate; g++) {
        for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
            int set[TR_RECIPE_N_ROLES], n = 0;
            if (g < r->placement.n_colocate) {
                if (role > 0) break;
                for (int k = 0; k < r->placement.colocate_len[g]; k++) {
                    int x = r->placement.colocate[g][k];
                    if (world[x] > 0 && !placed[x]) set[n++] = x;
                }
            } else if (world[role] > 0 && !placed[role]) {
                set[n++] = role;
            }
            if (n == 0) continue;
            for (int k = 1; k < n; k++)
                if (world[set[k]] != world[set[0]])
                    return tr_errf(err, TR_EINVAL, "placement.colocate: %s has %d ranks and %s %d; colocated roles "
                                   "need the same data-parallel size", tr_recipe_role_names[set[0]], world[set[0]],
                                   tr_recipe_role_names[set[k]], world[set[k]]);
            for (int32_t rank = 0; rank < world[set[0]]; rank++) {
                if (c->n_procs == MAX_PROCS) return tr_errf(err, TR_ERANGE, "more than %d worker processes", MAX_PROCS);
                worker_proc *p = &c->procs[c->n_procs++];
                memset(p, 0, sizeof *p);
                p->n_roles = n;
                p->rank = rank;
                size_t o = 0;
                for (int k = 0; k < n; k++) {
                    p->roles[k] = set[k];
                    o += (size_t)snprintf(p->name + o, sizeof p->name - o, "%s%s", k ? "+" : "",
                                          tr_recipe_role_names[set[k]]);
                }
                char file[128];
                snprintf(file, sizeof file, "%s-%d.log", p->name, rank);
                snprintf(p->name + o, sizeof p->name - o, "/%d", rank);
                if (!c->attach) snprintf(p->log, sizeof p->log, "%s/logs/%s", c->run_dir, file);
            }
            for (int k = 0; k < n; k++) placed[set[k]] = true;
        }
    }
    return 0;
}

static int spawn(tr_controller *c, worker_proc *p, const char *endpoint, tr_err *err) {
    char roles[96], rank[16], world[16], ppid[24];
    snprintf(roles, sizeof roles, "%s", p->name);
    for (char *s = roles; *s; s++) {
        if (*s == '+') *s = ',';
        if (*s == '/') *s = '\0';
    }
    snprintf(rank, sizeof rank, "%d", p->rank);
    snprintf(world, sizeof world, "%d", c->groups[p->roles[0]].world);
    snprintf(ppid, sizeof ppid, "%d", (int)getpid());
    char *argv[20] = {c->exe, "worker", "--role", roles, "--connect", (char *)endpoint, "--rank", rank,
                      "--world", world, "--parent-pid", ppid};
    int k = 12;
    if (c->wcurve.key_file) {
        argv[k++] = "--curve-key";
        argv[k++] = (char *)c->wcurve.key_file;
        argv[k++] = "--server-key";
        argv[k++] = (char *)c->wcurve.server_key_file;
    }
    argv[k] = NULL;
    int logfd = open(p->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) return tr_errf(err, TR_EIO, "%s: cannot open: %s", p->log, strerror(errno));
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pid_t pid = fork();
    if (pid < 0) {
        close(logfd);
        if (nullfd >= 0) close(nullfd);
        return tr_errf(err, TR_EIO, "cannot fork worker %s: %s", p->name, strerror(errno));
    }
    if (pid == 0) {
        // Only async-signal-safe calls until exec. A process group of its own keeps the
        // terminal's Ctrl-C away: the controller orders the shutdown.
        setpgid(0, 0);
        if (nullfd >= 0) dup2(nullfd, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(c->exe, argv);
        static const char msg[] = "troupe controller: exec of the worker binary failed\n";
        ssize_t w = write(2, msg, sizeof msg - 1);
        (void)w;
        _exit(127);
    }
    close(logfd);
    if (nullfd >= 0) close(nullfd);
    p->pid = pid;
    return 0;
}

// Waits until every rank of every group has said hello.
static int wait_hellos(tr_controller *c, tr_err *err) {
    int timeout = c->o.start_timeout_ms;
    int64_t deadline = now_ms() + timeout;
    tr_peer *peers = malloc(sizeof(tr_peer) * MAX_PROCS * TR_RECIPE_N_ROLES);
    if (!peers) return tr_errf(err, TR_ENOMEM, "out of memory");
    int rc = 0;
    for (;;) {
        if (tr_controller_check(c, err)) {
            rc = -1;
            break;
        }
        int n = 0;
        tr_router_peers(c->router, peers, MAX_PROCS * TR_RECIPE_N_ROLES, &n);
        char missing[256] = "";
        size_t ml = 0;
        int n_missing = 0;
        worker_proc *first = NULL;
        for (int i = 0; i < c->n_procs; i++) {
            worker_proc *p = &c->procs[i];
            for (int k = 0; k < p->n_roles; k++) {
                char id[TR_PEER_ID_MAX];
                snprintf(id, sizeof id, "%s/%d", tr_recipe_role_names[p->roles[k]], p->rank);
                bool seen = false;
                for (int j = 0; j < n && !seen; j++) seen = strcmp(peers[j].id, id) == 0;
                if (seen) continue;
                if (!first) first = p;
                n_missing++;
                if (ml + 40 < sizeof missing) ml += (size_t)snprintf(missing + ml, sizeof missing - ml, "%s%s",
                                                                     ml ? ", " : "", id);
            }
        }
        if (n_missing == 0) break;
        if (now_ms() >= deadline) {
            rc = fail(c, err, first && first->pid > 0 ? first : NULL, TR_ETIMEOUT,
                      "%d worker%s did not say hello at %s within %d ms: %s", n_missing, n_missing > 1 ? "s" : "",
                      tr_router_endpoint(c->router), timeout, missing);
            break;
        }
        sleep_ms(POLL_MS);
    }
    free(peers);
    return rc;
}

// The tensor-parallel communicators of every group split over ranks, then the data-parallel
// ones of every group whose ranks train together, each kind formed for all groups at once,
// then the weight-sync one from the policy to the generator (roles/client.h).
static int form_comms(tr_controller *c, tr_err *err) {
    tr_group *gs[TR_RECIPE_N_ROLES];
    int n = 0;
    for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
        tr_group *g = &c->groups[role];
        if (c->has_group[role] && g->tp > 1) gs[n++] = g;
    }
    if (tr_groups_tp_comm_init(gs, n, c->o.start_timeout_ms, err)) return -1;
    n = 0;
    for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
        tr_group *g = &c->groups[role];
        if (c->has_group[role] && g->train && g->world / g->tp > 1) gs[n++] = g;
    }
    if (tr_groups_comm_init(gs, n, c->o.start_timeout_ms, err)) return -1;
    // Shared weights need no sync communicator: a sync only names a buffer.
    if (!c->has_group[TR_RECIPE_GENERATOR] || c->share_weights) return 0;
    return tr_groups_sync_comm_init(&c->groups[TR_RECIPE_POLICY], &c->groups[TR_RECIPE_GENERATOR],
                                    c->o.start_timeout_ms, err);
}

static void install_signals(tr_controller *c) {
    if (c->o.keep_signals) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    interrupts = 0;
    sigaction(SIGINT, &sa, &c->old_int);
    sigaction(SIGTERM, &sa, &c->old_term);
    c->signals = true;
}

static void restore_signals(tr_controller *c) {
    if (!c->signals) return;
    sigaction(SIGINT, &c->old_int, NULL);
    sigaction(SIGTERM, &c->old_term, NULL);
    c->signals = false;
}

int tr_controller_start(tr_controller **out, const tr_recipe *r, tr_err *err) {
    tr_controller_opts o = {0};
    return tr_controller_start_opts(out, r, &o, err);
}

int tr_controller_start_opts(tr_controller **out, const tr_recipe *r, const tr_controller_opts *opts,
                             tr_err *err) {
    *out = NULL;
    tr_controller *c = calloc(1, sizeof *c);
    if (!c) return tr_errf(err, TR_ENOMEM, "controller: out of memory");
    c->o = *opts;
    if (c->o.heartbeat_interval_ms <= 0) c->o.heartbeat_interval_ms = 500;
    if (c->o.heartbeat_timeout_ms <= 0) c->o.heartbeat_timeout_ms = 5000;
    if (c->o.grace_ms <= 0) c->o.grace_ms = 5000;
    if (c->o.log_tail_lines <= 0) c->o.log_tail_lines = 12;
    c->attach = r->placement.attach;
    c->share_weights = tr_recipe_generator_shares(r);
    if (c->o.start_timeout_ms <= 0) c->o.start_timeout_ms = c->attach ? 600000 : 60000;
    snprintf(c->run_dir, sizeof c->run_dir, "%s", r->run_dir);
    snprintf(c->exe, sizeof c->exe, "%s", opts->exe ? opts->exe : "/proc/self/exe");
    int32_t world[TR_RECIPE_N_ROLES] = {0};
    for (int role = 0; role < TR_RECIPE_REWARD; role++) {
        const tr_recipe_model *m = &r->models[role];
        if (!m->present) continue;
        world[role] = (int32_t)(m->parallel.tp * m->parallel.dp);
    }
    if (r->reward.present)
        world[TR_RECIPE_REWARD] = r->reward.kind == TR_RECIPE_REWARD_MODEL
                                      ? (int32_t)(r->reward.parallel.tp * r->reward.parallel.dp) : 1;
    if (r->generator.present)
        world[TR_RECIPE_GENERATOR] = (int32_t)(r->generator.parallel.tp * r->generator.parallel.dp);
    char logs[TR_RECIPE_PATH_MAX + 16], endpoint[TR_RECIPE_NAME_MAX + 64];
    snprintf(logs, sizeof logs, "%s/logs", c->run_dir);
    tr_curve_opts rcurve = {0};
    int rc = tr_mkdirs(logs, err);
    if (!rc) rc = choose_endpoint(c, r, endpoint, sizeof endpoint, err);
    if (!rc && !tr_endpoint_is_loopback(endpoint)) rc = setup_keys(c, &rcurve, err);
    tr_router_opts ro = {.endpoint = endpoint, .heartbeat_interval_ms = c->o.heartbeat_interval_ms,
                         .heartbeat_timeout_ms = c->o.heartbeat_timeout_ms, .curve = rcurve};
    if (!rc) rc = tr_router_init(&c->router, &ro, err);
    if (rc) {
        free(c);
        return tr_err_wrap(err, "controller");
    }
    for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
        if (world[role] < 1) continue;
        tr_group_init(&c->groups[role], c->router, tr_recipe_role_names[role], world[role]);
        c->groups[role].timeout_ms = c->o.call_timeout_ms > 0 ? c->o.call_timeout_ms : -1;
        c->groups[role].hooks = (tr_group_hooks){check_hook, c};
        c->groups[role].inflight = &c->inflight;
        c->has_group[role] = true;
    }
    install_signals(c);
    rc = plan_procs(c, r, world, err);
    for (int i = 0; i < c->n_procs && !rc && !c->attach; i++)
        rc = spawn(c, &c->procs[i], tr_router_endpoint(c->router), err);
    if (!rc) rc = wait_hellos(c, err);
    // The policy inits first: when the recipe leaves the micro-batch to its memory plan, every
    // other role takes the policy's choice, so that reference, critic and policy share one
    // micro-batch plan.
    int32_t planned = 0;
    for (int role = 0; role < TR_RECIPE_N_ROLES && !rc; role++) {
        if (!c->has_group[role]) continue;
        tr_role_setup s;
        tr_controller_role_setup(r, (enum tr_recipe_role)role, &s);
        if (s.a.max_tokens == 0 && planned > 0) s.a.max_tokens = planned;
        rc = tr_role_init(&c->groups[role], &s.a, &c->info[role], err);
        if (!rc && role == TR_RECIPE_POLICY && r->train.micro_batch_tokens == 0)
            planned = c->info[role].max_tokens;
    }
    if (!rc) rc = form_comms(c, err);
    if (rc) {
        tr_err keep = *err;
        tr_controller_stop(c, NULL);
        *err = keep;
        return tr_err_wrap(err, "starting the workers");
    }
    *out = c;
    return 0;
}

// ---- stop ----

static bool all_reaped(tr_controller *c, int timeout_ms) {
    int64_t end = now_ms() + timeout_ms;
    for (;;) {
        bool all = true;
        for (int i = 0; i < c->n_procs; i++) {
            worker_proc *p = &c->procs[i];
            if (p->pid <= 0 || p->exited) continue;
            int st;
            pid_t r = waitpid(p->pid, &st, WNOHANG);
            if (r == p->pid || (r < 0 && errno == ECHILD)) {
                p->exited = true;
                p->status = st;
            } else {
                all = false;
            }
        }
        if (all) return true;
        if (now_ms() >= end || interrupts > 1) return false;
        sleep_ms(20);
    }
}

static void signal_all(tr_controller *c, int sig) {
    for (int i = 0; i < c->n_procs; i++) {
        worker_proc *p = &c->procs[i];
        if (p->pid > 0 && !p->exited) {
            kill(p->pid, sig);
            if (sig == SIGTERM) kill(p->pid, SIGCONT);  // a stopped worker must run to exit
        }
    }
}

int tr_controller_stop(tr_controller *c, tr_err *err) {
    if (!c) return 0;
    int grace = c->o.grace_ms;
    // The shutdown op: every live worker finishes its op and exits on its own.
    if (interrupts < 2) {
        for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
            if (!c->has_group[role]) continue;
            tr_group *g = &c->groups[role];
            g->hooks.check = NULL;
            g->timeout_ms = grace < 2000 ? grace : 2000;
            tr_err ignore;
            tr_group_shutdown(g, &ignore);
        }
    }
    bool clean = c->attach || all_reaped(c, grace);
    bool killed = false;
    char stuck[256] = "";
    size_t sl = 0;
    for (int i = 0; i < c->n_procs && !clean; i++)
        if (c->procs[i].pid > 0 && !c->procs[i].exited && sl + 40 < sizeof stuck)
            sl += (size_t)snprintf(stuck + sl, sizeof stuck - sl, "%s%s", sl ? ", " : "", c->procs[i].name);
    if (!clean) {
        signal_all(c, SIGTERM);
        if (!all_reaped(c, grace)) {
            signal_all(c, SIGKILL);
            killed = true;
            all_reaped(c, 60000);
        }
    }
    bool healthy = !c->failed;
    // The socket file of an ipc:// endpoint would outlive the router; each run names its
    // own (controller-<pid>.ipc), so remove it rather than let run_dir collect them.
    char ipc_path[4096] = "";
    const char *ep = c->router ? tr_router_endpoint(c->router) : NULL;
    if (ep && strncmp(ep, "ipc://", 6) == 0) snprintf(ipc_path, sizeof ipc_path, "%s", ep + 6);
    tr_router_free(c->router);
    if (ipc_path[0]) unlink(ipc_path);
    restore_signals(c);
    free(c);
    if (!clean && healthy && err)
        return tr_errf(err, TR_EPEER, "workers did not exit within %d ms of the shutdown op and were %s: %s", grace,
                       killed ? "killed" : "terminated", stuck);
    return 0;
}

// ---- accessors ----

const tr_role_info *tr_controller_role_info(const tr_controller *c, enum tr_recipe_role role) {
    return role >= 0 && role < TR_RECIPE_N_ROLES && c->has_group[role] ? &c->info[role] : NULL;
}

tr_group *tr_controller_group(tr_controller *c, enum tr_recipe_role role) {
    if (!c || (int)role < 0 || role >= TR_RECIPE_N_ROLES || !c->has_group[role]) return NULL;
    return &c->groups[role];
}

tr_group *tr_controller_group_named(tr_controller *c, const char *role) {
    for (int i = 0; i < TR_RECIPE_N_ROLES; i++)
        if (strcmp(tr_recipe_role_names[i], role) == 0) return tr_controller_group(c, (enum tr_recipe_role)i);
    return NULL;
}

const char *tr_controller_endpoint(const tr_controller *c) {
    return tr_router_endpoint(c->router);
}

int tr_controller_workers(const tr_controller *c, int64_t *pids, const char **names, int max) {
    int n = 0;
    for (int i = 0; i < c->n_procs; i++) {
        if (c->procs[i].pid <= 0) continue;
        if (n < max) {
            if (pids) pids[n] = c->procs[i].pid;
            if (names) names[n] = c->procs[i].name;
        }
        n++;
    }
    return n;
}
