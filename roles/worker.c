// The worker's serve loop: connect one DEALER per hosted role (retrying hello until the
// controller answers), then take requests from every dealer in turn, dispatch each to its
// role's op handler and reply. A failing op is an error reply, never the end of the worker;
// the loop ends on a shutdown op, on the caller's stop flag (SIGTERM) and when the
// controller has been silent past the heartbeat timeout.
#include "roles/worker.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "roles/worker_impl.h"

#define HELLO_ATTEMPT_MS 2000
#define POLL_MS 200   // how often a quiet worker checks that the controller is alive

void tr_worker_logf(tr_role_ctx *role, const char *fmt, ...) {
    tr_worker *w = role->w;
    if (!w->log) return;
    char line[TR_ERR_MSG_MAX + 128];
    int n = snprintf(line, sizeof line, "[%s] ", role->id);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    w->log(w->log_ctx, line);
}

static int role_kind(const char *name, enum tr_role_kind *k) {
    static const char *const names[] = {"policy", "reference", "critic", "reward", "generator"};
    for (int i = 0; i < 5; i++)
        if (strcmp(name, names[i]) == 0) {
            *k = (enum tr_role_kind)i;
            return 0;
        }
    return -1;
}

static bool stopped(const tr_worker_opts *o) {
    return o->stop && *o->stop;
}

// Says hello until the controller answers or the connect timeout passes.
static int connect_role(tr_role_ctx *role, const tr_worker_opts *o, tr_err *err) {
    int total = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 60000;
    int64_t deadline = tr_now_ms() + total;
    bool logged = false;
    for (;;) {
        int64_t left = deadline - tr_now_ms();
        tr_dealer_opts d = {.endpoint = o->endpoint, .role = role->name, .rank = o->rank, .world = o->world,
                            .hello_timeout_ms = (int)(left < HELLO_ATTEMPT_MS ? (left > 100 ? left : 100)
                                                                                : HELLO_ATTEMPT_MS),
                            .curve = o->curve};
        if (tr_dealer_init(&role->dealer, &d, err) == 0) return 0;
        if (stopped(o)) return 0;  // the serve loop sees the flag and exits cleanly
        if (err->code != TR_ETIMEOUT && err->code != TR_ECANCELED) return -1;
        if (tr_now_ms() >= deadline)
            return tr_errf(err, TR_ETIMEOUT, "%s: no controller answered at %s within %d ms", role->id, o->endpoint,
                           total);
        if (!logged) tr_worker_logf(role, "waiting for the controller at %s", o->endpoint);
        logged = true;
    }
}

static bool op_allowed(enum tr_role_kind k, const char *op) {
    // Every role can form a communicator; the training roles, and the policy and generator
    // for the weight sync, use one today.
    if (strcmp(op, "comm_id") == 0 || strcmp(op, "comm_join") == 0 || strcmp(op, "comm_ready") == 0) return true;
    static const char *const policy[] = {"generate", "logprobs", "train", "train_sft", "save", "load",
                                         "sync_weights", NULL};
    static const char *const reference[] = {"logprobs", NULL};
    static const char *const critic[] = {"values", "train", "save", "load", NULL};
    static const char *const reward[] = {"score", NULL};
    static const char *const generator[] = {"generate", "sync_weights", NULL};
    const char *const *ops = k == TR_ROLE_POLICY ? policy : k == TR_ROLE_REFERENCE ? reference
                           : k == TR_ROLE_CRITIC ? critic : k == TR_ROLE_GENERATOR ? generator : reward;
    for (int i = 0; ops[i]; i++)
        if (strcmp(ops[i], op) == 0) return true;
    return false;
}

static int run_op(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    const char *op = req->op;
    if (strcmp(op, "generate") == 0) return tr_worker_op_generate(role, req, rep, err);
    if (strcmp(op, "logprobs") == 0) return tr_worker_op_logprobs(role, req, rep, err);
    if (strcmp(op, "values") == 0) return tr_worker_op_values(role, req, rep, err);
    if (strcmp(op, "train") == 0) return tr_worker_op_train(role, req, rep, err);
    if (strcmp(op, "train_sft") == 0) return tr_worker_op_train_sft(role, req, rep, err);
    if (strcmp(op, "save") == 0) return tr_worker_op_save(role, req, rep, err);
    if (strcmp(op, "load") == 0) return tr_worker_op_load(role, req, rep, err);
    if (strcmp(op, "sync_weights") == 0) return tr_worker_op_sync_weights(role, req, rep, err);
    if (strcmp(op, "score") == 0) return tr_worker_op_score(role, req, rep, err);
    if (strcmp(op, "comm_id") == 0) return tr_worker_op_comm_id(role, req, rep, err);
    if (strcmp(op, "comm_join") == 0) return tr_worker_op_comm_join(role, req, rep, err);
    if (strcmp(op, "comm_ready") == 0) return tr_worker_op_comm_ready(role, req, rep, err);
    return tr_errf(err, TR_EUNSUPPORTED, "unknown op '%s'", op);
}

// Lends the worker arena to the op's role for the op's duration: generate lays out the
// policy's inference activations and KV blocks (fresh block tables), train/train_sft the
// training activations, logprobs/values/score the inference activations. One op at a time
// runs in a worker, so each phase finds the region idle and owns all of it.
static int begin_phase(tr_role_ctx *role, const char *op, bool *lent, tr_err *err) {
    tr_arena *a = &role->w->arena;
    int r;
    *lent = false;
    if (strcmp(op, "generate") == 0 && role->has_gen)
        r = tr_arena_begin_generate(a, &role->gen, err);
    else if ((strcmp(op, "train") == 0 || strcmp(op, "train_sft") == 0) && role->has_trainer)
        r = tr_arena_begin_train(a, &role->model, err);
    else if ((strcmp(op, "logprobs") == 0 || strcmp(op, "values") == 0 || strcmp(op, "score") == 0) &&
             role->has_model)
        r = tr_arena_begin_forward(a, &role->model, err);
    else
        return 0;
    if (r) return tr_err_wrap(err, "%s", op);
    *lent = true;
    return 0;
}

static int dispatch(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, bool *shutdown, tr_err *err) {
    const char *op = req->op;
    if (strcmp(op, "shutdown") == 0) {
        *shutdown = true;
        tr_msg_begin_reply(rep, req->id, 0);
        return 0;
    }
    if (strcmp(op, "init") == 0) {
        if (role->ready) return tr_errf(err, TR_EINVAL, "init: %s is already initialized", role->id);
        if (tr_worker_op_init(role, req, rep, err)) {
            tr_role_ctx_free(role);
            return -1;
        }
        role->ready = true;
        role->init_ops = role->w->ops;
        return 0;
    }
    role->w->ops++;   // any other op may change a hosted role's weights
    if (!op_allowed(role->kind, op)) return tr_errf(err, TR_EUNSUPPORTED, "the %s role has no op '%s'", role->name, op);
    if (!role->ready) return tr_errf(err, TR_EINVAL, "%s before init", op);
    bool lent = false;
    if (begin_phase(role, op, &lent, err)) return -1;
    int r = run_op(role, req, rep, err);
    if (lent) tr_arena_end(&role->w->arena);
    return r;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Handles one request; -1 only when the reply cannot be sent (the controller is gone).
static int serve_one(tr_role_ctx *role, tr_wire_msg *m, bool *shutdown, tr_err *err) {
    if (m->msg.kind != TR_MSG_REQUEST) return 0;  // replies are never addressed to workers
    tr_msg_writer rep;
    tr_msg_writer_init(&rep);
    tr_err e;
    tr_err_clear(&e);
    double t0 = now_s();
    int rc_op = dispatch(role, &m->msg, &rep, shutdown, &e);
    int rc = 0;
    if (rc_op == 0) {
        const void *d;
        size_t n;
        if (tr_msg_writer_finish(&rep, &d, &n, &e)) rc_op = -1;
        else rc = tr_dealer_send(role->dealer, d, n, err);
    }
    if (rc_op) {
        // The reply names the op once, however deep the handler named it already.
        tr_err_wrap(&e, "%s", m->msg.op);
        tr_worker_logf(role, "failed: %s", e.msg);
        rc = tr_dealer_send_error(role->dealer, m->msg.id, &e, err);
    } else if (strcmp(m->msg.op, "shutdown") != 0) {
        tr_worker_logf(role, "%s: done in %.3f s", m->msg.op, now_s() - t0);
    }
    tr_msg_writer_free(&rep);
    return rc;
}

static void free_worker(tr_worker *w) {
    for (int i = 0; i < w->n_roles; i++) {
        tr_role_ctx_free(&w->roles[i]);
        tr_dealer_free(w->roles[i].dealer);
        w->roles[i].dealer = NULL;
    }
    tr_arena_free(&w->arena);
    if (w->has_backend) tr_backend_free(&w->be);
    w->has_backend = false;
}

int tr_worker_run(const tr_worker_opts *o, tr_err *err) {
    if (o->n_roles < 1 || o->n_roles > TR_WORKER_MAX_ROLES)
        return tr_errf(err, TR_EINVAL, "worker: %d roles (1..%d)", o->n_roles, TR_WORKER_MAX_ROLES);
    tr_worker *w = calloc(1, sizeof *w);
    if (!w) return tr_errf(err, TR_ENOMEM, "worker: out of memory");
    w->rank = o->rank;
    w->world = o->world;
    w->stop = o->stop;
    w->log = o->log;
    w->log_ctx = o->log_ctx;
    int rc = 0;
    for (int i = 0; i < o->n_roles && !rc; i++) {
        tr_role_ctx *r = &w->roles[i];
        r->w = w;
        if (role_kind(o->roles[i], &r->kind)) {
            rc = tr_errf(err, TR_EINVAL, "worker: unknown role '%s' (policy, reference, critic, reward, generator)",
                         o->roles[i]);
            break;
        }
        for (int j = 0; j < i; j++)
            if (strcmp(o->roles[j], o->roles[i]) == 0)
                rc = tr_errf(err, TR_EINVAL, "worker: role '%s' given twice", o->roles[i]);
        snprintf(r->name, sizeof r->name, "%s", o->roles[i]);
        snprintf(r->id, sizeof r->id, "%s/%d", r->name, o->rank);
        w->n_roles = i + 1;
    }
    for (int i = 0; i < w->n_roles && !rc && !stopped(o); i++) {
        rc = connect_role(&w->roles[i], o, err);
        if (!rc && w->roles[i].dealer) tr_worker_logf(&w->roles[i], "connected to %s", o->endpoint);
    }
    // A process hosting several roles exits once every role was told to shut down.
    bool shut[TR_WORKER_MAX_ROLES] = {false};
    int n_shut = 0;
    bool shutdown = false;
    while (!rc && !shutdown && !stopped(o)) {
        // One wait on the sockets of every role still serving: a request is served as soon as
        // it arrives, whichever role it is for. On a quiet interval each role's receive runs
        // anyway (without waiting), which is where a silent controller is noticed.
        tr_dealer *live[TR_WORKER_MAX_ROLES];
        int live_role[TR_WORKER_MAX_ROLES], n_live = 0;
        for (int i = 0; i < w->n_roles; i++)
            if (!shut[i]) {
                live[n_live] = w->roles[i].dealer;
                live_role[n_live++] = i;
            }
        tr_err e;
        tr_err_clear(&e);
        int ready = tr_dealer_wait_any(live, n_live, POLL_MS, &e);
        if (ready >= 0) ready = live_role[ready];
        if (ready < 0 && e.code == TR_ECANCELED) continue;
        if (ready < 0 && e.code != TR_OK) {
            *err = e;
            rc = tr_err_wrap(err, "%s", w->roles[0].id);
            break;
        }
        for (int i = 0; i < w->n_roles && !rc && !shutdown; i++) {
            tr_role_ctx *r = &w->roles[i];
            if (shut[i] || (ready >= 0 && ready != i)) continue;
            tr_wire_msg m;
            tr_err_clear(&e);
            if (tr_dealer_recv(r->dealer, &m, 0, &e)) {
                if (e.code == TR_EPEER) {
                    tr_worker_logf(r, "exiting: %s", e.msg);
                    *err = e;
                    rc = tr_err_wrap(err, "%s", r->id);
                } else if (e.code != TR_ETIMEOUT && e.code != TR_ECANCELED) {
                    tr_worker_logf(r, "dropped a message: %s", e.msg);
                }
                continue;
            }
            if (serve_one(r, &m, &shut[i], err)) {
                tr_worker_logf(r, "exiting: cannot reply: %s", err->msg);
                rc = tr_err_wrap(err, "%s", r->id);
            }
            tr_wire_msg_free(&m);
            if (shut[i] && ++n_shut == w->n_roles) shutdown = true;
        }
    }
    if (!rc) tr_worker_logf(&w->roles[0], "exiting: %s", shutdown ? "shutdown requested" : "stop signal");
    free_worker(w);
    free(w);
    return rc;
}
