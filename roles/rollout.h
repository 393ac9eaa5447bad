// A batch of rollouts in flat buffers: each sequence is its prompt followed by its response,
// and every per-token array is aligned with `tokens` (entry t describes tokens[t]; prompt
// entries are 0). This is what travels between controller and workers for generate,
// logprobs, values, score and train, and what the RL algorithms read.
#pragma once
#include <stdint.h>

#include "engine/err.h"

enum tr_finish { TR_FINISH_STOP = 0, TR_FINISH_LENGTH = 1 };

typedef struct tr_rollouts {
    int32_t n;               // sequences
    int32_t cap_seqs;
    int64_t n_tokens;        // offset[n]
    int64_t cap_tokens;
    int32_t *group;          // [n] index of the prompt (GRPO group) within the step
    int32_t *sample;         // [n] sample index within the group
    int32_t *prompt_len;     // [n]
    int32_t *response_len;   // [n]
    uint8_t *finish;         // [n] enum tr_finish
    int64_t *offset;         // [n + 1] start of sequence i in the token arrays
    int32_t *tokens;         // [n_tokens] prompt then response ids
    float *gen_logprobs;     // [n_tokens] logprob of tokens[t] when it was sampled (0 on prompt)
    char **prompt_text;      // [n] optional (NULL entries allowed): for rewards and logs
    char **response_text;    // [n] optional
    char **meta;             // [n] JSON object text handed to the reward ("{}" when none)
    int64_t *version;        // [n] weight version that sampled it (the policy's optimizer step
                             // whose weights generated it); -1 unknown
} tr_rollouts;

void tr_rollouts_init(tr_rollouts *r);
void tr_rollouts_free(tr_rollouts *r);
void tr_rollouts_clear(tr_rollouts *r);
// Appends one sequence (copies every buffer; texts may be NULL; gen_lp may be NULL -> 0);
// its version is -1 (unknown) until the caller sets r->version[r->n - 1].
int tr_rollouts_append(tr_rollouts *r, int32_t group, int32_t sample, const int32_t *prompt,
                       int32_t prompt_len, const int32_t *response, const float *gen_lp,
                       int32_t response_len, enum tr_finish finish, const char *prompt_text,
                       const char *response_text, const char *meta, tr_err *err);
// Per-token response mask: 1 on response tokens, 0 on prompt tokens ([n_tokens]).
void tr_rollouts_response_mask(const tr_rollouts *r, uint8_t *mask);
