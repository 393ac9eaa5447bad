// Sampling arithmetic in double: weights exp((logit - max) / T), the kept set by rank, and
// one uniform draw walked along the kept set's cumulative weights. Ranking the whole
// vocabulary is avoided: top-k selects k tokens in linear time, and top-p selects and sorts a
// growing head of the ranking until it holds the nucleus.
#include "engine/sample.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

// Rank order: higher logit first, lower id on ties (a strict total order on ids).
static inline bool ranks_before(const float *lg, int32_t a, int32_t b) {
    return lg[a] > lg[b] || (lg[a] == lg[b] && a < b);
}

// Rearranges idx[0, n) so that idx[0, k) hold the k best-ranked ids (in no order):
// quickselect with a median-of-three pivot and Hoare partitioning.
static void select_top(const float *lg, int32_t *idx, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int32_t a = idx[lo], b = idx[mid], c = idx[hi], p;
        if (ranks_before(lg, a, b)) p = ranks_before(lg, b, c) ? b : ranks_before(lg, a, c) ? c : a;
        else p = ranks_before(lg, a, c) ? a : ranks_before(lg, b, c) ? c : b;
        int32_t i = lo, j = hi;
        while (i <= j) {
            while (ranks_before(lg, idx[i], p)) i++;
            while (ranks_before(lg, p, idx[j])) j--;
            if (i <= j) {
                int32_t t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
}

static int rank_cmp(const void *x, const void *y, void *ctx) {
    const float *lg = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return ranks_before(lg, a, b) ? -1 : ranks_before(lg, b, a) ? 1 : 0;
}

// idx[0, k) becomes the k best-ranked ids in rank order.
static void rank_head(const float *lg, int32_t *idx, int32_t n, int32_t k) {
    if (k < n) select_top(lg, idx, n, k);
    qsort_r(idx, (size_t)k, sizeof(int32_t), rank_cmp, (void *)lg);
}

// Fills s->w and the kept set; returns its size. When the set is ranked, *ranked is true and
// s->idx[0, n) lists it in rank order; otherwise the set is the whole vocabulary in id order.
// *total is the kept weight, summed in the order tr_sample walks it.
static int32_t prepare(tr_token_sampler *s, const float *lg, const tr_sample_params *p, bool *ranked,
                       double *total) {
    const int32_t V = s->vocab;
    float mx = lg[0];
    for (int32_t i = 1; i < V; i++)
        if (lg[i] > mx) mx = lg[i];
    double inv_t = 1.0 / (double)p->temperature;
    for (int32_t i = 0; i < V; i++) s->w[i] = exp(((double)lg[i] - (double)mx) * inv_t);
    bool use_k = p->top_k > 0 && p->top_k < V, use_p = p->top_p < 1.0f;
    *ranked = use_k || use_p;
    if (!*ranked) {
        double t = 0.0;
        for (int32_t i = 0; i < V; i++) t += s->w[i];
        *total = t;
        return V;
    }
    for (int32_t i = 0; i < V; i++) s->idx[i] = i;
    int32_t n = V;
    double mass = 0.0;   // weight of the candidate set the nucleus is measured against
    if (use_k) {
        n = p->top_k;
        rank_head(lg, s->idx, V, n);
        for (int32_t r = 0; r < n; r++) mass += s->w[s->idx[r]];
    } else {
        for (int32_t i = 0; i < V; i++) mass += s->w[i];
    }
    if (use_p) {
        // Keep rank r while the weight ranked before it is below top_p of the mass; grow the
        // sorted head (x8 each time) until the cut falls inside it.
        double limit = (double)p->top_p * mass;
        int32_t sorted = use_k ? n : 0, head = 256;
        for (;;) {
            if (!use_k) {
                if (head > V) head = V;
                if (head > sorted) {
                    rank_head(lg, s->idx, V, head);
                    sorted = head;
                }
            }
            double before = 0.0;
            int32_t r = 0;
            while (r < sorted && before < limit) before += s->w[s->idx[r++]];
            if (before >= limit || sorted == n) {
                n = r;
                break;
            }
            head *= 8;
        }
    }
    double t = 0.0;
    for (int32_t r = 0; r < n; r++) t += s->w[s->idx[r]];
    *total = t;
    return n;
}

static int32_t argmax(const float *lg, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    return best;
}

int32_t tr_sample(tr_token_sampler *s, const float *logits, const tr_sample_params *p, tr_rng *rng) {
    if (p->temperature == 0.0f) return argmax(logits, s->vocab);
    bool ranked;
    double total;
    int32_t n = prepare(s, logits, p, &ranked, &total);
    double target = tr_sample_uniform(rng) * total, cum = 0.0;
    for (int32_t r = 0; r < n; r++) {
        int32_t id = ranked ? s->idx[r] : r;
        cum += s->w[id];
        if (target < cum) return id;
    }
    // Rounding left target at the very top: the last kept token with weight.
    for (int32_t r = n - 1; r > 0; r--) {
        int32_t id = ranked ? s->idx[r] : r;
        if (s->w[id] > 0.0) return id;
    }
    return ranked ? s->idx[0] : 0;
}

int32_t tr_sample_probs(tr_token_sampler *s, const float *logits, const tr_sample_params *p,
                        double *probs) {
    const int32_t V = s->vocab;
    for (int32_t i = 0; i < V; i++) probs[i] = 0.0;
    if (p->temperature == 0.0f) {
        probs[argmax(logits, V)] = 1.0;
        return 1;
    }
    bool ranked;
    double total;
    int32_t n = prepare(s, logits, p, &ranked, &total);
    for (int32_t r = 0; r < n; r++) {
        int32_t id = ranked ? s->idx[r] : r;
        probs[id] = s->w[id] / total;
    }
    return n;
}
