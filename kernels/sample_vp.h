// Vocab-parallel sampling's arithmetic for one row, as static inline functions for C and for
// CUDA device code (as kernels/philox.h), so that both backends' sample_vp_scan and
// sample_vp_pick take the same steps: the walk of one rank's columns in id order, the merge
// of every rank's candidates into rank order, and over them the single-rank sampler's draw
// (kernels/cpu/sample.c: weights, top-k, top-p's cut, the total and the walk of one uniform)
// with its sums in its order. On the CPU the weights are its exp's, so the ids are the
// single-rank op's bit for bit.
#pragma once
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "kernels/philox.h"

#if defined(__CUDACC__)
#define TR_SVP_FN static inline __host__ __device__
#else
#define TR_SVP_FN static inline
#endif

// Ranks a merge follows: the communicator's limit.
#define TR_SVP_MAX_RANKS 256

// Rank order: the higher logit first, the lower id on ties (a strict total order on ids).
TR_SVP_FN bool tr_svp_before(tr_sample_cand a, tr_sample_cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Index of rank r's j-th candidate of row b in the gathered lists ([R][B][k]).
TR_SVP_FN size_t tr_svp_at(int32_t B, int32_t k, int32_t r, int32_t b, int32_t j) {
    return ((size_t)r * (size_t)B + (size_t)b) * (size_t)k + (size_t)j;
}

// The row's draw u in [0, 1): the next two words of its Philox stream, as sample takes them.
TR_SVP_FN double tr_svp_uniform(const tr_sample_row *row) {
    uint64_t counter = row->counter;
    int32_t used = row->used;
    uint32_t x = tr_philox_next(row->seed, &counter, &used);
    uint32_t y = tr_philox_next(row->seed, &counter, &used);
    return tr_philox_uniform53(x, y);
}

// The highest logit of row b: the best of the ranks' first candidates.
TR_SVP_FN float tr_svp_max(const tr_sample_cand *cand, int32_t R, int32_t k, int32_t B, int32_t b) {
    float mx = cand[tr_svp_at(B, k, 0, b, 0)].logit;
    for (int32_t r = 1; r < R; r++) {
        float x = cand[tr_svp_at(B, k, r, b, 0)].logit;
        if (x > mx) mx = x;
    }
    return mx;
}

// sample_vp_scan for one row x[V] of the columns from v0 (temperature > 0): *sum = carry +
// the weights in id order; with total > 0 also hit[3] as ops.h describes.
TR_SVP_FN void tr_svp_scan_row(const float *x, int32_t V, int32_t v0, const tr_sample_row *row,
                               float mx, double carry, double total, double *sum, int32_t *hit) {
    const double inv_t = 1.0 / (double)row->temperature, m = (double)mx;
    const double target = total > 0.0 ? tr_svp_uniform(row) * total : 0.0;
    const double tol = TR_SAMPLE_NEAR * total;
    double cum = carry;
    int32_t id = -1, near = 0, last = -1;
    for (int32_t i = 0; i < V; i++) {
        double w = exp(((double)x[i] - m) * inv_t), before = cum;
        cum += w;
        if (total > 0.0 && id < 0 && target < cum) {
            id = v0 + i;
            near = cum - target <= tol || (id > 0 && target - before <= tol);
        }
        if (w > 0.0 && v0 + i > 0) last = v0 + i;
    }
    *sum = cum;
    if (total > 0.0) {
        hit[0] = id;
        hit[1] = near;
        hit[2] = last;
    }
}

// Merges row b's lists (each rank's in rank order, absent entries last) into order[] (indices
// into cand) in rank order; returns how many. *trusted: how many of them lead the whole row's
// ranking for sure: all when every rank sent all its columns (a list with an absent entry),
// else those up to the best of the full lists' last entries, since a token a rank left out
// ranks below its list's last.
TR_SVP_FN int32_t tr_svp_merge(const tr_sample_cand *cand, int32_t R, int32_t k, int32_t B,
                               int32_t b, int32_t *order, int32_t *trusted) {
    int32_t pos[TR_SVP_MAX_RANKS], bound = -1;
    for (int32_t r = 0; r < R; r++) {
        pos[r] = 0;
        tr_sample_cand last = cand[tr_svp_at(B, k, r, b, k - 1)];
        if (last.id >= 0 && (bound < 0 || tr_svp_before(last, cand[tr_svp_at(B, k, bound, b, k - 1)])))
            bound = r;
    }
    int32_t n = 0;
    *trusted = 0;
    for (;;) {
        int32_t best = -1;
        for (int32_t r = 0; r < R; r++) {
            if (pos[r] == k) continue;
            tr_sample_cand c = cand[tr_svp_at(B, k, r, b, pos[r])];
            if (c.id >= 0 && (best < 0 || tr_svp_before(c, cand[tr_svp_at(B, k, best, b, pos[best])])))
                best = r;
        }
        if (best < 0) break;
        order[n++] = (int32_t)tr_svp_at(B, k, best, b, pos[best]);
        if (best == bound && pos[best] == k - 1) *trusted = n;
        pos[best]++;
    }
    if (bound < 0) *trusted = n;
    return n;
}

// The weight of merged entry j: exp((x - mx) / temperature) as sample computes it.
TR_SVP_FN double tr_svp_weight(const tr_sample_cand *cand, const int32_t *order, int32_t j,
                               double mx, double inv_t) {
    return exp(((double)cand[order[j]].logit - mx) * inv_t);
}

// The draw of a row top-k or top-p ranks (temperature > 0), from its merged candidates
// order[0, n) of which the first `trusted` lead the row: tr_cpu_sample_prepare's kept set
// (top-k, then top-p over the top-k set's mass, or over mass, the whole row's weight, without
// top-k), then tr_cpu_sample_pick's walk, each sum over the same weights in the same order.
// Returns the id, or -1 when top-p's cut lies past the trusted candidates.
TR_SVP_FN int32_t tr_svp_draw_ranked(const tr_sample_cand *cand, const int32_t *order,
                                     int32_t n, int32_t trusted, const tr_sample_row *row,
                                     int32_t V, double mass, bool *near) {
    const double mx = (double)cand[order[0]].logit, inv_t = 1.0 / (double)row->temperature;
    const bool use_k = row->top_k > 0 && row->top_k < V, use_p = row->top_p < 1.0f;
    int32_t kept = use_k ? row->top_k : V;
    bool cut_near = false;
    if (use_k) {
        mass = 0.0;
        for (int32_t j = 0; j < kept; j++) mass += tr_svp_weight(cand, order, j, mx, inv_t);
    }
    if (use_p) {
        // Keep rank r while the weight ranked before it is below top_p of the mass.
        const double limit = (double)row->top_p * mass, tol = TR_SAMPLE_NEAR * mass;
        const int32_t sorted = use_k ? kept : trusted;
        double before = 0.0, prev = 0.0;
        int32_t r = 0;
        while (r < sorted && before < limit) {
            prev = before;
            before += tr_svp_weight(cand, order, r++, mx, inv_t);
        }
        // Without top-k the single-rank sampler's head is the whole row only when every
        // token is here (trusted == V); short of that the cut must fall inside it.
        if (!(before >= limit || sorted == kept)) return -1;
        cut_near = fabs(before - limit) <= tol || (r >= 2 && limit - prev <= tol);
        kept = r;
    }
    if (kept > n) kept = n;   // (never: the lists hold the top-k and the nucleus)
    double total = 0.0;
    for (int32_t j = 0; j < kept; j++) total += tr_svp_weight(cand, order, j, mx, inv_t);
    const double target = tr_svp_uniform(row) * total, tol = TR_SAMPLE_NEAR * total;
    double cum = 0.0;
    for (int32_t j = 0; j < kept; j++) {
        double before = cum;
        cum += tr_svp_weight(cand, order, j, mx, inv_t);
        if (target < cum) {
            *near = cut_near || cum - target <= tol || (j > 0 && target - before <= tol);
            return cand[order[j]].id;
        }
    }
    // Rounding left the target at the very top: the last kept token with weight.
    *near = true;
    for (int32_t j = kept - 1; j > 0; j--)
        if (tr_svp_weight(cand, order, j, mx, inv_t) > 0.0) return cand[order[j]].id;
    return cand[order[0]].id;
}

// sample_vp_pick for row b; order: scratch of R * k entries. *near as sample counts it.
TR_SVP_FN int32_t tr_svp_pick_row(const tr_sample_cand *cand, const int32_t *hit,
                                  const double *mass, const tr_sample_row *row, int32_t R,
                                  int32_t k, int32_t B, int32_t b, int32_t V, int32_t *order,
                                  bool *near) {
    *near = false;
    if (row->temperature == 0.0f) {   // greedy: the highest logit, the lowest id on ties
        tr_sample_cand best = cand[tr_svp_at(B, k, 0, b, 0)];
        for (int32_t r = 1; r < R; r++) {
            tr_sample_cand c = cand[tr_svp_at(B, k, r, b, 0)];
            if (tr_svp_before(c, best)) best = c;
        }
        return best.id;
    }
    if (!(row->top_k > 0 && row->top_k < V) && !(row->top_p < 1.0f)) {
        // The whole row in id order: the first rank whose walk reached the target.
        int32_t last = 0;
        for (int32_t r = 0; r < R; r++) {
            const int32_t *h = hit + ((size_t)r * (size_t)B + (size_t)b) * 3;
            if (h[0] >= 0) {
                *near = h[1] != 0;
                return h[0];
            }
            if (h[2] > last) last = h[2];
        }
        *near = true;   // rounding left the target at the very top
        return last;
    }
    int32_t trusted, n = tr_svp_merge(cand, R, k, B, b, order, &trusted);
    return tr_svp_draw_ranked(cand, order, n, trusted, row, V, mass ? mass[b] : 0.0, near);
}
