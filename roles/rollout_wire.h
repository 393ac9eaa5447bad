// Rollout batches on the wire (docs/protocol.md, "Rollouts"): a msgpack map of tensors
// {n, prompt_len, response_len, tokens, [group, sample, finish], [gen_logprobs],
// [prompt_text, response_text, meta], [version]}, and per-token float arrays aligned with its tokens.
// A range of sequences can be sent, so the controller hands each DP rank its share.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "roles/msg.h"
#include "roles/rollout.h"

// Parts beyond the always-present lengths and tokens.
enum {
    TR_RO_IDS = 1,       // group, sample, finish
    TR_RO_LOGPROBS = 2,  // gen_logprobs
    TR_RO_TEXT = 4,      // prompt_text, response_text (str or nil), meta (str)
    TR_RO_VERSION = 8,   // version: the weight version each sequence was sampled with
    TR_RO_ALL = 15,
};

// Puts sequences [first, first + count) of r as a map under key.
void tr_rollouts_put(tr_msg_writer *w, const char *key, const tr_rollouts *r, int32_t first,
                     int32_t count, unsigned parts);
// Appends the sequences of the map under key to out. Lengths are checked against each other
// and against max_seq_len (> 0: a longer sequence is an error naming it); absent parts leave
// their fields at 0 / NULL ("{}" for meta, -1 for version).
int tr_rollouts_get(const tr_msg_map *m, const char *key, int64_t max_seq_len, tr_rollouts *out,
                    tr_err *err);

// The slice of a per-token array x (aligned with r->tokens) for sequences [first, first+count).
void tr_token_floats_put(tr_msg_writer *w, const char *key, const tr_rollouts *r, int32_t first,
                         int32_t count, const float *x);
// Reads an f32 tensor of exactly n elements into out.
int tr_token_floats_get(const tr_msg_map *m, const char *key, int64_t n, float *out, tr_err *err);
