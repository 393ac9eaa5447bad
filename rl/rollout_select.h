// Moving sequences between rollout batches: copying one sequence, and dynamic sampling's
// refill, which takes the groups that survived the filter into the step's batch until it
// holds the groups it needs.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "roles/rollout.h"

// Appends sequence i of src to dst under group id `group` (texts, logprobs, finish kept).
int tr_rollouts_copy_seq(tr_rollouts *dst, const tr_rollouts *src, int32_t i, int32_t group,
                         tr_err *err);

// Appends to dst, in src order, the sequences whose keep[i] is 1, group by group: a src group
// becomes dst group *n_groups (then *n_groups grows) while *n_groups < max_groups; the rest
// are left out. Per-sequence values travel along: dst_reward[dst->n] = reward[i] and
// dst_score likewise (either pair may be NULL; the dst arrays must hold the sequences of
// max_groups groups). Src sequences of one group must be contiguous (generate's order).
int tr_rollouts_take_groups(tr_rollouts *dst, int32_t *n_groups, int32_t max_groups,
                            float *dst_reward, float *dst_score, const tr_rollouts *src,
                            const float *reward, const float *score, const uint8_t *keep,
                            tr_err *err);
