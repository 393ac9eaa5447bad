// The SPMD call underneath every typed call of client.h: one request per rank (same id),
// replies collected per rank while heartbeats and the owner's check hook watch for dead
// workers, an error reply turned into an error naming role/rank/op, and the ok replies
// handed over in rank order. Replies to earlier calls that gave up are dropped by id.
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

static void free_replies(tr_wire_msg *rep, bool *got, int32_t n) {
    for (int32_t r = 0; r < n; r++)
        if (got[r]) tr_wire_msg_free(&rep[r]);
}

int tr_group_call(tr_group *g, const tr_call *c, tr_err *err) {
    int32_t ranks = c->ranks > 0 ? c->ranks : g->world;
    uint64_t id = ++g->next_id;
    tr_wire_msg *rep = calloc((size_t)ranks, sizeof *rep);
    bool *got = calloc((size_t)ranks, sizeof *got);
    if (!rep || !got) {
        free(rep);
        free(got);
        return tr_errf(err, TR_ENOMEM, "%s.%s: out of memory", g->role, c->op);
    }
    int rc = run_check(g, err);
    tr_msg_writer w;
    tr_msg_writer_init(&w);
    for (int32_t r = 0; r < ranks && !rc; r++) {
        char peer[TR_PEER_ID_MAX];
        snprintf(peer, sizeof peer, "%s/%d", g->role, r);
        tr_msg_writer_reset(&w);
        c->build(c->ctx, r, ranks, &w, c->op, id);
        if (tr_router_send_writer(g->router, peer, &w, err)) {
            if (c->best_effort) {
                got[r] = true;  // nothing to wait for from this rank
                continue;
            }
            if (run_check(g, err) == 0) tr_err_wrap(err, "%s: %s", peer, c->op);
            rc = -1;
        }
    }
    tr_msg_writer_free(&w);
    int32_t n_got = 0;
    for (int32_t r = 0; r < ranks; r++) n_got += got[r];
    int64_t deadline = g->timeout_ms >= 0 ? tr_now_ms() + g->timeout_ms : c->best_effort ? tr_now_ms() + 10000 : -1;
    while (!rc && n_got < ranks) {
        int wait = POLL_MS;
        if (deadline >= 0) {
            int64_t left = deadline - tr_now_ms();
            if (left <= 0 && c->best_effort) break;
            if (left <= 0) {
                char missing[256] = "";
                size_t len = 0;
                for (int32_t r = 0; r < ranks && len + 32 < sizeof missing; r++)
                    if (!got[r]) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%s/%d",
                                                         len ? ", " : "", g->role, r);
                rc = tr_errf(err, TR_ETIMEOUT, "%s.%s: no reply from %s within %d ms", g->role, c->op, missing,
                             g->timeout_ms);
                break;
            }
            if (left < wait) wait = (int)left;
        }
        tr_wire_msg m;
        tr_err e;
        tr_err_clear(&e);
        if (tr_router_recv(g->router, &m, wait, &e)) {
            if (c->best_effort) continue;
            // The hook's description of a dead worker (exit status, log) beats the transport's.
            if (run_check(g, err)) {
                rc = -1;
            } else if (e.code == TR_EPEER) {
                *err = e;
                rc = tr_err_wrap(err, "%s.%s", g->role, c->op);
            } else if (e.code != TR_ETIMEOUT && e.code != TR_ECANCELED && e.code != TR_EFORMAT &&
                       e.code != TR_ERANGE && e.code != TR_EUNSUPPORTED) {
                *err = e;
                rc = tr_err_wrap(err, "%s.%s", g->role, c->op);
            }
            continue;
        }
        int32_t r = peer_rank(g, m.peer);
        if (m.msg.kind != TR_MSG_REPLY || m.msg.id != id || r < 0 || r >= ranks || got[r]) {
            g->stale_replies++;
            tr_wire_msg_free(&m);
            continue;
        }
        if (!m.msg.ok) {
            // A worker names the op it ran; the wrap adds it only for replies that do not.
            tr_errf(err, m.msg.remote.code ? m.msg.remote.code : TR_EPEER, "%s", m.msg.remote.msg);
            tr_err_wrap(err, "%s", c->op);
            rc = tr_err_wrap(err, "%s", m.peer);
            tr_wire_msg_free(&m);
            break;
        }
        rep[r] = m;
        got[r] = true;
        n_got++;
    }
    for (int32_t r = 0; r < ranks && !rc; r++) {
        if (!rep[r].frame_) continue;  // best effort: no reply from this rank
        if (c->reply && c->reply(c->ctx, r, &rep[r].msg.args, err)) {
            tr_err_wrap(err, "%s/%d: %s: reply", g->role, r, c->op);
            rc = -1;
        }
    }
    free_replies(rep, got, ranks);
    free(rep);
    free(got);
    return rc;
}
