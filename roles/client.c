// The SPMD call underneath every typed call of client.h: one request per rank (same id),
// replies collected per rank while heartbeats and the owner's check hook watch for dead
// workers, an error reply turned into an error naming role/rank/op, and the ok replies
// handed over in rank order. Several groups' calls can be in flight together (they share the
// router; replies are told apart by peer and id), within one call or as calls left in flight
// (tr_group_call_start): a reply to one of those that arrives while another call collects is
// kept for it in the groups' in-flight set. Replies to earlier calls that gave up are
// dropped by id.
#include "roles/client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "roles/client_impl.h"

#define POLL_MS 100

int tr_group_init(tr_group *g, tr_router *router, const char *role, int32_t world) {
    memset(g, 0, sizeof *g);
    if (!router || !role || strlen(role) >= sizeof g->role || world < 1) return -1;
    g->router = router;
    snprintf(g->role, sizeof g->role, "%s", role);
    g->world = world;
    g->tp = 1;
    g->mini_batches = 1;
    g->timeout_ms = -1;
    return 0;
}

void tr_share(int64_t n, int32_t world, int32_t rank, int64_t *first, int64_t *count) {
    int64_t a = n * rank / world, b = n * (rank + 1) / world;
    *first = a;
    *count = b - a;
}

// The rank of peer in g ("<role>/<rank>"), or -1.
static int32_t peer_rank(const tr_group *g, const char *peer) {
    size_t rl = strlen(g->role);
    if (strncmp(peer, g->role, rl) != 0 || peer[rl] != '/') return -1;
    char *end;
    long r = strtol(peer + rl + 1, &end, 10);
    if (*end || end == peer + rl + 1 || r < 0 || r >= g->world) return -1;
    return (int32_t)r;
}

static int run_check(tr_group *g, tr_err *err) {
    return g->hooks.check ? g->hooks.check(g->hooks.ctx, err) : 0;
}

// One group's side of a call in flight: its request id and the replies so far (error
// replies included: one kept for a call left in flight is reported when that call finishes).
typedef struct pending {
    tr_group *g;
    const tr_call *c;
    int32_t ranks;
    uint64_t id;
    tr_wire_msg *rep;
    bool *got;
    int32_t n_got;
} pending;

static void pending_free(pending *p) {
    for (int32_t r = 0; p->got && r < p->ranks; r++)
        if (p->got[r]) tr_wire_msg_free(&p->rep[r]);
    free(p->rep);
    free(p->got);
}

// Sends the call's request to every rank; unreachable ranks of a best-effort call count as
// answered.
static int send_all(pending *p, tr_err *err) {
    tr_group *g = p->g;
    const tr_call *c = p->c;
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    int rc = 0;
    for (int32_t r = 0; r < p->ranks && !rc; r++) {
        if (p->got[r]) continue;   // not called (tr_call.stride)
        char peer[TR_PEER_ID_MAX];
        snprintf(peer, sizeof peer, "%s/%d", g->role, r);
        tr_msg_writer_reset(&w);
        c->build(c->ctx, r, p->ranks, &w, c->op, p->id);
        if (tr_router_send_writer(g->router, peer, &w, err)) {
            if (c->best_effort) {
                p->got[r] = true;  // nothing to wait for from this rank
                p->n_got++;
                continue;
            }
            if (run_check(g, err) == 0) tr_err_wrap(err, "%s: %s", peer, c->op);
            rc = -1;
        }
    }
    tr_msg_writer_free(&w);
    return rc;
}

static int timeout_error(const pending *ps, int n, tr_err *err) {
    char missing[256] = "";
    size_t len = 0;
    const pending *first = NULL;
    for (int i = 0; i < n; i++)
        for (int32_t r = 0; r < ps[i].ranks && len + 32 < sizeof missing; r++)
            if (!ps[i].got[r]) {
                if (!first) first = &ps[i];
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s/%d", len ? ", " : "",
                                        ps[i].g->role, r);
            }
    return tr_errf(err, TR_ETIMEOUT, "%s.%s: no reply from %s within %d ms", first->g->role, first->c->op, missing,
                   first->g->timeout_ms);
}

// The pending call a reply belongs to (by the peer's role and rank, and the id), or NULL.
// One group may appear several times (calls to different ranks of it, or two ops at once).
static pending *match(pending *ps, int n, const tr_wire_msg *m, int32_t *rank) {
    if (m->msg.kind != TR_MSG_REPLY) return NULL;
    for (int i = 0; i < n; i++) {
        int32_t r = peer_rank(ps[i].g, m->peer);
        if (r < 0 || m->msg.id != ps[i].id || r >= ps[i].ranks || ps[i].got[r]) continue;
        *rank = r;
        return &ps[i];
    }
    return NULL;
}

// A call started by tr_group_call_start: its own copies of the calls, its groups' pending
// state, and its place in the in-flight set.
struct tr_inflight {
    tr_call *calls;
    pending *ps;
    int n;
    tr_inflight_set *set;          // NULL: not registered (a blocking call)
    tr_inflight *next;
};

// Keeps m for the in-flight call it answers; false when none does (a stale reply).
static bool park(tr_inflight_set *set, tr_wire_msg *m) {
    for (tr_inflight *f = set ? set->head : NULL; f; f = f->next) {
        int32_t r;
        pending *p = match(f->ps, f->n, m, &r);
        if (!p) continue;
        p->rep[r] = *m;
        p->got[r] = true;
        p->n_got++;
        return true;
    }
    return false;
}

// An error reply kept for this call while another collected: the first one, as collect()
// would have reported it on arrival.
static int kept_error(pending *ps, int n, tr_err *err) {
    for (int i = 0; i < n; i++)
        for (int32_t r = 0; r < ps[i].ranks; r++) {
            const tr_wire_msg *m = &ps[i].rep[r];
            if (!ps[i].got[r] || !m->frame_ || m->msg.ok) continue;
            tr_errf(err, m->msg.remote.code ? m->msg.remote.code : TR_EPEER, "%s", m->msg.remote.msg);
            tr_err_wrap(err, "%s", ps[i].c->op);
            return tr_err_wrap(err, "%s", m->peer);
        }
    return 0;
}

// A receive error: the hook's description of a dead worker (exit status, log) beats the
// transport's; harmless conditions (a timeout of the poll, a dropped malformed message) are
// not errors.
static int recv_error(pending *ps, const tr_err *e, bool best_effort, tr_err *err) {
    if (best_effort) return 0;
    if (run_check(ps[0].g, err)) return -1;
    if (e->code == TR_EPEER ||
        (e->code != TR_ETIMEOUT && e->code != TR_ECANCELED && e->code != TR_EFORMAT && e->code != TR_ERANGE &&
         e->code != TR_EUNSUPPORTED)) {
        *err = *e;
        return tr_err_wrap(err, "%s.%s", ps[0].g->role, ps[0].c->op);
    }
    return 0;
}

static int collect(pending *ps, int n, tr_err *err) {
    bool best_effort = ps[0].c->best_effort;
    int32_t left = 0;
    for (int i = 0; i < n; i++) left += ps[i].ranks - ps[i].n_got;
    tr_group *g = ps[0].g;
    int64_t deadline = g->timeout_ms >= 0 ? tr_now_ms() + g->timeout_ms : best_effort ? tr_now_ms() + 10000 : -1;
    while (left > 0) {
        int wait = POLL_MS;
        if (deadline >= 0) {
            int64_t ms = deadline - tr_now_ms();
            if (ms <= 0 && best_effort) return 0;
            if (ms <= 0) return timeout_error(ps, n, err);
            if (ms < wait) wait = (int)ms;
        }
        tr_wire_msg m;
        tr_err e;
        tr_err_clear(&e);
        if (tr_router_recv(g->router, &m, wait, &e)) {
            if (recv_error(ps, &e, best_effort, err)) return -1;
            continue;
        }
        int32_t r;
        pending *p = match(ps, n, &m, &r);
        if (!p) {
            if (!park(g->inflight, &m)) {
                g->stale_replies++;
                tr_wire_msg_free(&m);
            }
            continue;
        }
        if (!m.msg.ok) {
            // A worker names the op it ran; the wrap adds it only for replies that do not.
            tr_errf(err, m.msg.remote.code ? m.msg.remote.code : TR_EPEER, "%s", m.msg.remote.msg);
            tr_err_wrap(err, "%s", p->c->op);
            tr_err_wrap(err, "%s", m.peer);
            tr_wire_msg_free(&m);
            return -1;
        }
        p->rep[r] = m;
        p->got[r] = true;
        p->n_got++;
        left--;
    }
    return 0;
}

static void inflight_free(tr_inflight *f) {
    if (!f) return;
    if (f->set)
        for (tr_inflight **q = &f->set->head; *q; q = &(*q)->next)
            if (*q == f) {
                *q = f->next;
                break;
            }
    for (int i = 0; f->ps && i < f->n; i++) pending_free(&f->ps[i]);
    free(f->ps);
    free(f->calls);
    free(f);
}

// Sets up and sends the calls; registered in gs[0]'s in-flight set when `keep`.
static int start(tr_group *const *gs, const tr_call *calls, int n, bool keep, tr_inflight **out, tr_err *err) {
    *out = NULL;
    tr_inflight *f = calloc(1, sizeof *f);
    if (f) {
        f->n = n;
        f->ps = calloc((size_t)n, sizeof *f->ps);
        f->calls = malloc((size_t)n * sizeof *f->calls);
    }
    if (!f || !f->ps || !f->calls) {
        inflight_free(f);
        return tr_errf(err, TR_ENOMEM, "%s.%s: out of memory", gs[0]->role, calls[0].op);
    }
    memcpy(f->calls, calls, (size_t)n * sizeof *calls);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        pending *p = &f->ps[i];
        p->g = gs[i];
        p->c = &f->calls[i];
        p->ranks = calls[i].ranks > 0 ? calls[i].ranks : gs[i]->world;
        p->id = ++gs[i]->next_id;
        p->rep = calloc((size_t)p->ranks, sizeof *p->rep);
        p->got = calloc((size_t)p->ranks, sizeof *p->got);
        if (!p->rep || !p->got) rc = tr_errf(err, TR_ENOMEM, "%s.%s: out of memory", p->g->role, p->c->op);
        // Ranks the call skips count as answered, with no reply to hand over.
        for (int32_t r = 0; !rc && calls[i].stride > 1 && r < p->ranks; r++)
            if (r % calls[i].stride != 0) {
                p->got[r] = true;
                p->n_got++;
            }
        else if (gs[i]->router != gs[0]->router || calls[i].best_effort != calls[0].best_effort ||
                 gs[i]->inflight != gs[0]->inflight)
            rc = tr_errf(err, TR_EINVAL, "%s.%s: calls made together share one router, in-flight set and policy",
                         p->g->role, p->c->op);
    }
    if (!rc && keep && !gs[0]->inflight)
        rc = tr_errf(err, TR_EINVAL, "%s.%s: a call left in flight needs the groups' in-flight set", gs[0]->role,
                     calls[0].op);
    if (!rc) rc = run_check(gs[0], err);
    // Registered before anything is sent, so no reply can arrive unclaimed.
    if (!rc && keep) {
        f->set = gs[0]->inflight;
        f->next = f->set->head;
        f->set->head = f;
    }
    for (int i = 0; i < n && !rc; i++) rc = send_all(&f->ps[i], err);
    if (rc) {
        inflight_free(f);
        return -1;
    }
    *out = f;
    return 0;
}

// Waits for the rest of the replies, then hands them over in rank order, group by group.
static int finish(tr_inflight *f, tr_err *err) {
    pending *ps = f->ps;
    int n = f->n;
    int rc = kept_error(ps, n, err);
    if (!rc) rc = collect(ps, n, err);
    for (int i = 0; i < n && !rc; i++) {
        pending *p = &ps[i];
        for (int32_t r = 0; r < p->ranks && !rc; r++) {
            if (!p->rep[r].frame_) continue;  // best effort: no reply from this rank
            if (p->c->reply && p->c->reply(p->c->ctx, r, &p->rep[r].msg.args, err)) {
                tr_err_wrap(err, "%s/%d: %s: reply", p->g->role, r, p->c->op);
                rc = -1;
            }
        }
    }
    inflight_free(f);
    return rc;
}

int tr_group_call_many(tr_group *const *gs, const tr_call *calls, int n, tr_err *err) {
    if (n < 1) return 0;
    tr_inflight *f;
    if (start(gs, calls, n, false, &f, err)) return -1;
    return finish(f, err);
}

int tr_group_call_start(tr_group *const *gs, const tr_call *calls, int n, tr_inflight **out, tr_err *err) {
    *out = NULL;
    if (n < 1) return tr_errf(err, TR_EINVAL, "a call left in flight needs at least one group");
    return start(gs, calls, n, true, out, err);
}

int tr_group_call_finish(tr_inflight *f, tr_err *err) {
    return finish(f, err);
}

void tr_group_call_abandon(tr_inflight *f) {
    inflight_free(f);
}

int tr_group_call(tr_group *g, const tr_call *c, tr_err *err) {
    return tr_group_call_many(&g, c, 1, err);
}
