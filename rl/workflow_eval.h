// Held-out losses for the supervised workflows, computed with the policy's logprobs op:
// the mean negative log-likelihood of the trained tokens of each sequence.
#pragma once
#include <stdint.h>

#include "data/sft.h"
#include "rl/workflow.h"

// Mean NLL over the tokens t > 0 of each sequence i (ids[off[i] .. off[i+1])) with mask[t]
// set (mask NULL: every token after the first). Sequences are sent in chunks.
int tr_eval_nll(tr_run *run, int64_t n, const int64_t *off, const int32_t *ids,
                const uint8_t *mask, double *nll, tr_err *err);
// eval/loss on an SFT dataset (the assistant tokens), set in run->m.
int tr_eval_sft_loss(tr_run *run, const tr_sft_dataset *d, tr_err *err);
