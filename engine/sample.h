// Token sampling from one row of logits: greedy, temperature, top-k and top-p (nucleus),
// applied in that order as transformers' logits warpers do (top-p measures mass on the
// temperature-scaled distribution renormalized over the top-k set). Tokens are ranked by
// probability, ties by lower id, so the kept set and the draw are deterministic in
// (logits, params, rng state). Each sample carries its own Philox stream.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "engine/rng.h"

typedef struct tr_sample_params {
    float temperature;   // 0: greedy (argmax, lowest id on ties; draws nothing)
    int32_t top_k;       // keep the k most likely tokens; 0: no limit
    float top_p;         // keep the fewest most likely tokens whose mass reaches top_p; 1: all
} tr_sample_params;

// Scratch for one vocabulary, allocated once; a sampler is used by one thread at a time.
typedef struct tr_token_sampler {
    int32_t vocab;
    double *w;        // [vocab] unnormalized probabilities exp((z - max) / T)
    int32_t *idx;     // [vocab] token ids, ranked in place
} tr_token_sampler;

int tr_token_sampler_init(tr_token_sampler *s, int32_t vocab, tr_err *err);
void tr_token_sampler_free(tr_token_sampler *s);

// temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1.
int tr_sample_params_check(const tr_sample_params *p, tr_err *err);

// Draws a token from logits[vocab]; one 53-bit uniform from rng unless greedy.
int32_t tr_sample(tr_token_sampler *s, const float *logits, const tr_sample_params *p, tr_rng *rng);

// The distribution tr_sample draws from: probs[vocab], 0 outside the kept set (greedy: a
// one-hot). Returns the size of the kept set.
int32_t tr_sample_probs(tr_token_sampler *s, const float *logits, const tr_sample_params *p,
                        double *probs);

// Uniform double in [0, 1) with 53 random bits (two 32-bit draws).
double tr_sample_uniform(tr_rng *rng);
