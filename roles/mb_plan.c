// The micro-batch plan (mb_plan.h).
#include "roles/mb_plan.h"

#include <stdlib.h>
#include <string.h>

static int32_t seq_len(const tr_rollouts *r, int32_t s) { return (int32_t)(r->offset[s + 1] - r->offset[s]); }

// The prompt tokens sequence s shares with sequence s - 1 (0: none): equal prompts of at
// least two tokens, each sequence longer than its prompt's shared part.
static int32_t shares_prompt(const tr_rollouts *r, int32_t s) {
    int32_t p = r->prompt_len[s];
    if (p < 2 || r->prompt_len[s - 1] != p || seq_len(r, s) < p || seq_len(r, s - 1) < p) return 0;
    return memcmp(r->tokens + r->offset[s], r->tokens + r->offset[s - 1], (size_t)p * sizeof(int32_t)) == 0
               ? p
               : 0;
}

// Sequences [s, s + count) packed together: sharing a prompt of `shared` tokens (0: none,
// count 1), `tokens` in all; `bin` is the micro-batch it went to.
typedef struct unit {
    int32_t s, count, shared, bin;
    int64_t tokens;
} unit;

// Largest first; equal sizes in sequence order.
static int by_size(const void *a, const void *b) {
    const unit *x = a, *y = b;
    if (x->tokens != y->tokens) return x->tokens > y->tokens ? -1 : 1;
    return (x->s > y->s) - (x->s < y->s);
}

// The units of [s0, s1): groups cut where the next sample would pass max_tokens. *n units.
static int make_units(const tr_rollouts *r, int32_t s0, int32_t s1, int32_t max_tokens, bool share, unit *u,
                      int32_t *n, tr_err *err) {
    *n = 0;
    for (int32_t s = s0; s < s1; s++) {
        int32_t len = seq_len(r, s);
        if (len > max_tokens)
            return tr_errf(err, TR_ERANGE, "sequence %d has %d tokens; this worker's forward takes %d", s, len,
                           max_tokens);
        int32_t with_prev = share && s > s0 ? shares_prompt(r, s) : 0;
        unit *last = *n > 0 ? &u[*n - 1] : NULL;
        if (with_prev && last && last->shared == with_prev && last->s + last->count == s &&
            last->tokens + tr_pack_cost(len, with_prev) <= max_tokens) {
            last->count++;
            last->tokens += tr_pack_cost(len, with_prev);
            continue;
        }
        // a new unit: sharing with the next sequence (or the previous, past a cut)
        int32_t shared = !share ? 0 : with_prev ? with_prev : s + 1 < s1 ? shares_prompt(r, s + 1) : 0;
        u[(*n)++] = (unit){.s = s, .count = 1, .shared = shared,
                           .tokens = shared ? shared - 1 + tr_pack_cost(len, shared) : len};
    }
    return 0;
}

// Appends unit x's sequences to pk (which has room) and to the plan's order.
static void pack_unit(tr_pack *pk, const tr_rollouts *r, const unit *x, int32_t *order, int32_t *n_order) {
    const int32_t *first = r->tokens + r->offset[x->s];
    if (x->shared) tr_pack_add_prompt(pk, first, x->shared);
    for (int32_t s = x->s; s < x->s + x->count; s++) {
        const int32_t *ids = r->tokens + r->offset[s];
        if (x->shared) tr_pack_add_sharing(pk, ids, seq_len(r, s), x->shared);
        else tr_pack_add(pk, ids, NULL, seq_len(r, s));
        order[(*n_order)++] = s;
    }
}

int tr_mb_plan_build(const tr_rollouts *r, int32_t s0, int32_t s1, int32_t max_tokens, bool share,
                     tr_mb_plan *p, tr_err *err) {
    memset(p, 0, sizeof *p);
    p->s0 = s0;
    p->s1 = s1;
    size_t ns = (size_t)(s1 - s0);
    unit *u = malloc((ns + 1) * sizeof *u);
    int64_t *room = malloc((ns + 1) * sizeof *room);   // tokens each micro-batch has left
    p->packs = calloc(ns + 1, sizeof *p->packs);
    p->seqs = malloc((ns + 1) * sizeof *p->seqs);
    p->first = malloc((ns + 2) * sizeof *p->first);
    int32_t n_units = 0;
    int rc = !u || !room || !p->packs || !p->seqs || !p->first ? tr_errf(err, TR_ENOMEM, "micro-batches: out of memory")
                                                               : make_units(r, s0, s1, max_tokens, share, u, &n_units, err);
    if (!rc) {
        qsort(u, (size_t)n_units, sizeof *u, by_size);
        for (int32_t i = 0; i < n_units; i++) {   // first fit
            int32_t b = 0;
            while (b < p->n && room[b] < u[i].tokens) b++;
            if (b == p->n) room[p->n++] = max_tokens;
            room[b] -= u[i].tokens;
            u[i].bin = b;
        }
    }
    int32_t n_order = 0;
    for (int32_t b = 0; b < p->n && !rc; b++) {
        rc = tr_pack_init(&p->packs[b], (int32_t)(max_tokens - room[b]), err);
        p->first[b] = n_order;
        for (int32_t i = 0; i < n_units && !rc; i++)
            if (u[i].bin == b) pack_unit(&p->packs[b], r, &u[i], p->seqs, &n_order);
        if (!rc) p->tokens += p->packs[b].docs.n_tokens;
    }
    p->first[p->n] = n_order;
    free(u);
    free(room);
    if (rc) tr_mb_plan_free(p);
    return rc ? tr_err_wrap(err, "micro-batches") : 0;
}

void tr_mb_plan_free(tr_mb_plan *p) {
    for (int32_t i = 0; p->packs && i < p->n; i++) tr_pack_free(&p->packs[i]);
    free(p->packs);
    free(p->seqs);
    free(p->first);
    memset(p, 0, sizeof *p);
}
