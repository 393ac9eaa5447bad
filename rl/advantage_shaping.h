// Reward shaping applied before the advantage: DAPO's soft overlong punishment and its
// dynamic-sampling filter, which drops prompt groups whose responses all scored the same
// (they carry no group-relative signal).
#pragma once
#include <stdint.h>

#include "engine/err.h"

// DAPO soft overlong punishment for a response of `len` tokens when at most max_len may be
// generated and the last `buffer` tokens before max_len are the punishment zone:
//   0                                       if len <= max_len - buffer
//   -factor * (len - (max_len - buffer)) / buffer   inside the zone
//   -factor                                 if len >= max_len
// buffer == 0 disables it (returns 0).
float tr_overlong_penalty(int32_t len, int32_t max_len, int32_t buffer, float factor);

// keep[i] = 1 for responses whose group has at least two distinct rewards, 0 otherwise
// (groups of one are dropped too: they have no comparison). Returns the number of groups
// kept in *n_kept_groups; group ids are in [0, n_groups).
int tr_dynamic_sampling_filter(const float *rewards, const int32_t *group, int32_t n,
                               int32_t n_groups, uint8_t *keep, int32_t *n_kept_groups,
                               tr_err *err);
