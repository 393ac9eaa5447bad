// The micro-batch plan of a forward or train pass over rollouts, one rule for the policy's
// and the reference's logprobs, the critic's values and the RL train op. Units (a sequence,
// or with share the consecutive samples of one prompt, which share it: engine/pack.h) are
// packed first-fit in decreasing order of their tokens into micro-batches of at most
// max_tokens, so that micro-batches come out full and few whatever the lengths; units of
// equal size keep their order. A group too large for one micro-batch is cut into parts that
// each carry the prompt. The prompt is then computed once per part instead of once per
// sample, and every sample's rows keep their bits.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/pack.h"
#include "roles/rollout.h"

typedef struct tr_mb_plan {
    tr_pack *packs;   // [n]
    int32_t *seqs;    // the planned sequences in plan order: micro-batch i holds
    int32_t *first;   // seqs[first[i] .. first[i + 1]), as its pack's sequences 0, 1, ...
    int32_t n;
    int32_t s0, s1;   // the sequences planned: [s0, s1)
    int64_t tokens;   // packed over all micro-batches
} tr_mb_plan;

// Plans sequences [s0, s1) of r. A sequence longer than max_tokens is an error naming it.
int tr_mb_plan_build(const tr_rollouts *r, int32_t s0, int32_t s1, int32_t max_tokens, bool share,
                     tr_mb_plan *p, tr_err *err);
void tr_mb_plan_free(tr_mb_plan *p);
