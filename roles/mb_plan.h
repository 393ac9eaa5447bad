// The micro-batch plan of a forward or train pass over rollouts, one rule for the policy's
// and the reference's logprobs, the critic's values and the RL train op: sequences in order,
// packed into micro-batches of at most max_tokens tokens. With share, consecutive samples of
// one prompt (equal prompt tokens) share it (engine/pack.h): the prompt's tokens are computed
// once per micro-batch instead of once per sample, and every sample's rows keep their bits.
// A group that does not fit one micro-batch continues in the next with the prompt again.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/pack.h"
#include "roles/rollout.h"

typedef struct tr_mb_plan {
    tr_pack *packs;   // [n]; pack i holds sequences seq0[i] .. seq0[i + 1] - 1 in order
    int32_t *seq0;    // [n + 1]
    int32_t n;
    int64_t tokens;   // packed over all micro-batches
} tr_mb_plan;

// Plans sequences [s0, s1) of r. A sequence longer than max_tokens is an error naming it.
int tr_mb_plan_build(const tr_rollouts *r, int32_t s0, int32_t s1, int32_t max_tokens, bool share,
                     tr_mb_plan *p, tr_err *err);
void tr_mb_plan_free(tr_mb_plan *p);
// The row of micro-batch i holding token t of its k-th sequence.
static inline int32_t tr_mb_plan_row(const tr_mb_plan *p, int32_t i, int32_t k, int32_t t) {
    return tr_pack_row(&p->packs[i], k, t);
}
