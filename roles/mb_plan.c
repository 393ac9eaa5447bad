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

// Adds sequence s to pk: sharing the current prompt when `shared` (the prompt's length) is
// set, starting it first when `start`. False when it does not fit.
static bool add_seq(tr_pack *pk, const tr_rollouts *r, int32_t s, int32_t shared, bool start) {
    const int32_t *ids = r->tokens + r->offset[s];
    int32_t n = seq_len(r, s);
    if (!shared) return tr_pack_add(pk, ids, NULL, n);
    if (start && (pk->cap - pk->docs.n_tokens < shared - 1 + tr_pack_cost(n, shared) ||
                  !tr_pack_add_prompt(pk, ids, shared)))
        return false;
    return tr_pack_add_sharing(pk, ids, n, shared);
}

int tr_mb_plan_build(const tr_rollouts *r, int32_t s0, int32_t s1, int32_t max_tokens, bool share,
                     tr_mb_plan *p, tr_err *err) {
    memset(p, 0, sizeof *p);
    int32_t ns = s1 - s0;
    p->packs = calloc((size_t)ns + 1, sizeof *p->packs);
    p->seq0 = malloc(((size_t)ns + 1) * sizeof *p->seq0);
    if (!p->packs || !p->seq0) return tr_errf(err, TR_ENOMEM, "micro-batches: out of memory");
    tr_pack *pk = NULL;
    for (int32_t s = s0; s < s1; s++) {
        // the prompt s shares with s - 1, or with s + 1 when it starts a group
        int32_t with_prev = s > s0 ? shares_prompt(r, s) : 0;
        int32_t shared = !share ? 0 : with_prev ? with_prev : s + 1 < s1 ? shares_prompt(r, s + 1) : 0;
        if (pk && add_seq(pk, r, s, shared, !with_prev)) continue;
        int32_t n = seq_len(r, s);
        if (n > max_tokens)
            return tr_errf(err, TR_ERANGE, "sequence %d has %d tokens; this worker's forward takes %d", s, n,
                           max_tokens);
        int64_t left = r->offset[s1] - r->offset[s];   // no micro-batch needs more
        pk = &p->packs[p->n];
        if (tr_pack_init(pk, (int32_t)(left < max_tokens ? left : max_tokens), err))
            return tr_err_wrap(err, "micro-batches");
        p->seq0[p->n++] = s;
        if (!add_seq(pk, r, s, shared, true) && !add_seq(pk, r, s, 0, true))
            return tr_errf(err, TR_ERANGE, "sequence %d does not fit a micro-batch of %d tokens", s, max_tokens);
    }
    p->seq0[p->n] = s1;
    for (int32_t i = 0; i < p->n; i++) p->tokens += p->packs[i].docs.n_tokens;
    return 0;
}

void tr_mb_plan_free(tr_mb_plan *p) {
    for (int32_t i = 0; p->packs && i < p->n; i++) tr_pack_free(&p->packs[i]);
    free(p->packs);
    free(p->seq0);
    memset(p, 0, sizeof *p);
}
