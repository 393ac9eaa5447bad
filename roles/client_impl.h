// Internal to the client: the generic SPMD call that client_ops.c's typed calls are made of.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "roles/client.h"
#include "roles/msg.h"

typedef struct tr_call {
    const char *op;
    int32_t ranks;   // ranks to call, 0 .. ranks-1; 0 = the whole group
    int32_t stride;  // of those, only the multiples of stride (0 or 1: every one), e.g. the
                     // first rank of each tensor-parallel group
    // Writes rank r's complete request (tr_msg_begin_request(w, op, id, ...) and its args).
    void (*build)(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id);
    // Reads rank r's ok result; called in rank order once every rank has answered. May be NULL.
    int (*reply)(void *ctx, int32_t rank, const tr_msg_map *result, tr_err *err);
    void *ctx;
    // Send to every rank even when some cannot be reached, ignore dead peers and collect what
    // comes back within the timeout (shutdown): no error for unreachable ranks.
    bool best_effort;
} tr_call;

int tr_group_call(tr_group *g, const tr_call *c, tr_err *err);
// calls[i] on gs[i] for every i at once: every request is sent before any reply is awaited,
// so ops that complete only when several groups have them (communicators spanning groups)
// cannot deadlock. The groups share one router and the calls one best_effort; the first
// error ends the whole call.
int tr_group_call_many(tr_group *const *gs, const tr_call *calls, int n, tr_err *err);
// The same left in flight: start sends every request (the calls are copied; their ctx must
// live until finish) and registers the call in the groups' in-flight set; finish waits for
// the replies and runs the reply hooks; abandon forgets the call. Either ends it.
int tr_group_call_start(tr_group *const *gs, const tr_call *calls, int n, tr_inflight **out, tr_err *err);
int tr_group_call_finish(tr_inflight *f, tr_err *err);
void tr_group_call_abandon(tr_inflight *f);

// Rank r's contiguous share [first, first + count) of n items split over world ranks.
void tr_share(int64_t n, int32_t world, int32_t rank, int64_t *first, int64_t *count);

// Cuts n items whose token counts add up as cum[0..n] (cum[0] = 0) into `parts` contiguous
// ranges of near-equal tokens: part k holds items [bounds[k], bounds[k+1]); some may be empty.
void tr_split_tokens(const int64_t *cum, int64_t n, int32_t parts, int64_t *bounds);

// Reads a train reply's metrics map (absent keys stay 0).
int tr_train_metrics_get(const tr_msg_map *res, tr_train_metrics *m, tr_err *err);
