// The sampling arithmetic of one row of logits, shared by the engine's host sampler
// (engine/sample.c) and the CPU backend's sample op, so that both draw the same ids: the
// weights and the kept set (temperature, top-k, top-p), the walk of one uniform along the
// kept set's cumulative weights, and the greedy argmax. Plain C over caller-owned scratch.
#pragma once
#include <stdbool.h>
#include <stdint.h>

// The set a draw picks from.
typedef struct tr_sample_set {
    int32_t n;        // tokens kept
    bool ranked;      // idx[0, n) lists them in rank order; false: all V ids in id order
    double total;     // their weight, summed in the order the draw walks them
    bool cut_near;    // top-p's cut lies within TR_SAMPLE_NEAR of the mass of its limit
} tr_sample_set;

// Fills w[V] with exp((lg[i] - max) / temperature) in double (temperature > 0) and the kept
// set after top_k (0 or >= V: none) and top_p (1: none), ranked by logit descending, lower
// id on ties; idx[V] is scratch that ends holding the ranked set.
void tr_cpu_sample_prepare(const float *lg, int32_t V, float temperature, int32_t top_k,
                           float top_p, double *w, int32_t *idx, tr_sample_set *set);
// The kept id at uniform u in [0, 1): the first whose cumulative weight exceeds u * total.
// *near: that target lies within TR_SAMPLE_NEAR * total of a boundary of the chosen id.
int32_t tr_cpu_sample_pick(const double *w, const int32_t *idx, const tr_sample_set *set,
                           double u, bool *near);
// Greedy: the highest logit, the lowest id on ties.
int32_t tr_cpu_sample_argmax(const float *lg, int32_t V);
// idx[0, k) becomes the k best-ranked of the ids in idx[0, n), in rank order (a linear-time
// selection, then a sort of those k): a rank's candidates in vocab-parallel sampling.
void tr_cpu_sample_rank_head(const float *lg, int32_t *idx, int32_t n, int32_t k);
