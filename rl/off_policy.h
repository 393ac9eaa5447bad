// Truncated importance sampling (TIS) for rollouts sampled by older weights than the ones
// the policy's loss is centred on (the one-step-off pipeline): each response token's
// advantage is weighted by w = min(p_old / p_behaviour, cap), where p_old is the policy's
// probability of the token under its weights before the update (the PPO ratio's centre) and
// p_behaviour the sampler's (the generation logprobs). The clipped surrogate is linear in the
// advantage with w >= 0, so weighting the advantage is weighting the per-token PPO loss, as
// decoupled PPO and verl's TIS do; the KL and entropy terms are left unweighted.
#pragma once
#include <stdint.h>

#include "roles/rollout.h"

typedef struct tr_tis_stats {
    double weight_mean;    // mean w over response tokens (after truncation)
    double ratio_max;      // largest p_old / p_behaviour before truncation
    double clip_frac;      // fraction of response tokens whose ratio exceeded cap
    int64_t tokens;        // response tokens
} tr_tis_stats;

// adv[t] *= min(exp(old_lp[t] - behav_lp[t]), cap) on every response token of r (arrays
// aligned with r->tokens); prompt tokens are left alone. cap >= 1.
void tr_tis_weight(const tr_rollouts *r, const float *old_lp, const float *behav_lp, double cap,
                   float *adv, tr_tis_stats *st);
