// The host token sampler: parameter checks, scratch for one vocabulary, and the draw. The
// arithmetic (weights exp((logit - max) / T) in double, the kept set by rank, the walk of one
// uniform along the kept set's cumulative weights) is kernels/cpu/sample.h's, which the CPU
// backend's sample op runs too, so the host and that op draw the same ids.
#include "engine/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/sample.h"
#include "kernels/philox.h"

int tr_token_sampler_init(tr_token_sampler *s, int32_t vocab, tr_err *err) {
    memset(s, 0, sizeof *s);
    if (vocab < 1) return tr_errf(err, TR_EINVAL, "sampler: vocabulary of %d tokens", vocab);
    s->vocab = vocab;
    s->w = malloc((size_t)vocab * sizeof(double));
    s->idx = malloc((size_t)vocab * sizeof(int32_t));
    if (!s->w || !s->idx) {
        tr_token_sampler_free(s);
        return tr_errf(err, TR_ENOMEM, "sampler: out of memory for a %d-token vocabulary",
                       vocab);
    }
    return 0;
}

void tr_token_sampler_free(tr_token_sampler *s) {
    free(s->w);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

int tr_sample_params_check(const tr_sample_params *p, tr_err *err) {
    if (!(p->temperature >= 0.0f) || isinf(p->temperature))
        return tr_errf(err, TR_EINVAL, "temperature must be a finite number >= 0, got %g",
                       (double)p->temperature);
    if (p->top_k < 0) return tr_errf(err, TR_EINVAL, "top_k must be >= 0, got %d", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return tr_errf(err, TR_EINVAL, "top_p must be in (0, 1], got %g", (double)p->top_p);
    return 0;
}

double tr_sample_uniform(tr_rng *rng) {
    uint32_t a = tr_rng_u32(rng), b = tr_rng_u32(rng);
    return tr_philox_uniform53(a, b);
}

int32_t tr_sample(tr_token_sampler *s, const float *logits, const tr_sample_params *p, tr_rng *rng) {
    if (p->temperature == 0.0f) return tr_cpu_sample_argmax(logits, s->vocab);
    tr_sample_set set;
    tr_cpu_sample_prepare(logits, s->vocab, p->temperature, p->top_k, p->top_p, s->w, s->idx,
                          &set);
    bool near;   // a host draw has no other backend's draw to differ from
    return tr_cpu_sample_pick(s->w, s->idx, &set, tr_sample_uniform(rng), &near);
}

int32_t tr_sample_probs(tr_token_sampler *s, const float *logits, const tr_sample_params *p,
                        double *probs) {
    const int32_t V = s->vocab;
    for (int32_t i = 0; i < V; i++) probs[i] = 0.0;
    if (p->temperature == 0.0f) {
        probs[tr_cpu_sample_argmax(logits, V)] = 1.0;
        return 1;
    }
    tr_sample_set set;
    tr_cpu_sample_prepare(logits, V, p->temperature, p->top_k, p->top_p, s->w, s->idx, &set);
    for (int32_t r = 0; r < set.n; r++) {
        int32_t id = set.ranked ? s->idx[r] : r;
        probs[id] = s->w[id] / set.total;
    }
    return set.n;
}
