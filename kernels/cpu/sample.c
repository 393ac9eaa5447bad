// Sampling arithmetic on the CPU: the shared core of kernels/cpu/sample.h (engine/sample.c's
// host sampler calls the same functions) and the backend's sample op over B rows. Ranking the
// whole vocabulary is avoided: top-k selects k tokens in linear time, and top-p selects and
// sorts a growing head of the ranking until it holds the nucleus. Sums are in double.
#include "kernels/cpu/sample.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"
#include "kernels/philox.h"

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

void tr_cpu_sample_prepare(const float *lg, int32_t V, float temperature, int32_t top_k,
                           float top_p, double *w, int32_t *idx, tr_sample_set *set) {
    float mx = lg[0];
    for (int32_t i = 1; i < V; i++)
        if (lg[i] > mx) mx = lg[i];
    double inv_t = 1.0 / (double)temperature;
    for (int32_t i = 0; i < V; i++) w[i] = exp(((double)lg[i] - (double)mx) * inv_t);
    bool use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0f;
    set->ranked = use_k || use_p;
    set->cut_near = false;
    if (!set->ranked) {
        double t = 0.0;
        for (int32_t i = 0; i < V; i++) t += w[i];
        set->n = V;
        set->total = t;
        return;
    }
    for (int32_t i = 0; i < V; i++) idx[i] = i;
    int32_t n = V;
    double mass = 0.0;   // weight of the candidate set the nucleus is measured against
    if (use_k) {
        n = top_k;
        rank_head(lg, idx, V, n);
        for (int32_t r = 0; r < n; r++) mass += w[idx[r]];
    } else {
        for (int32_t i = 0; i < V; i++) mass += w[i];
    }
    if (use_p) {
        // Keep rank r while the weight ranked before it is below top_p of the mass; grow the
        // sorted head (x8 each time) until the cut falls inside it.
        double limit = (double)top_p * mass;
        int32_t sorted = use_k ? n : 0, head = 256;
        for (;;) {
            if (!use_k) {
                if (head > V) head = V;
                if (head > sorted) {
                    rank_head(lg, idx, V, head);
                    sorted = head;
                }
            }
            double before = 0.0, prev = 0.0;
            int32_t r = 0;
            while (r < sorted && before < limit) {
                prev = before;
                before += w[idx[r++]];
            }
            if (before >= limit || sorted == n) {
                // The cut sits where the prefix first reaches the limit; another rounding of
                // the prefix (or of the mass) near it would keep one token more or fewer.
                double tol = TR_SAMPLE_NEAR * mass;
                set->cut_near = fabs(before - limit) <= tol || (r >= 2 && limit - prev <= tol);
                n = r;
                break;
            }
            head *= 8;
        }
    }
    double t = 0.0;
    for (int32_t r = 0; r < n; r++) t += w[idx[r]];
    set->n = n;
    set->total = t;
}

int32_t tr_cpu_sample_argmax(const float *lg, int32_t V) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    return best;
}

int32_t tr_cpu_sample_pick(const double *w, const int32_t *idx, const tr_sample_set *set,
                           double u, bool *near) {
    double target = u * set->total, cum = 0.0, tol = TR_SAMPLE_NEAR * set->total;
    for (int32_t r = 0; r < set->n; r++) {
        int32_t id = set->ranked ? idx[r] : r;
        double before = cum;
        cum += w[id];
        if (target < cum) {
            *near = cum - target <= tol || (r > 0 && target - before <= tol);
            return id;
        }
    }
    // Rounding left target at the very top: the last kept token with weight.
    *near = true;
    for (int32_t r = set->n - 1; r > 0; r--) {
        int32_t id = set->ranked ? idx[r] : r;
        if (w[id] > 0.0) return id;
    }
    return set->ranked ? idx[0] : 0;
}

// ---- the backend op ----

// Rows are split into at most SAMPLE_TASKS tasks of consecutive rows, each with its own
// weight and index scratch of V entries: the scratch does not grow with B. bf16 logits are
// widened a row at a time into the task's fp32 row, exactly, so the arithmetic below (shared
// with the host sampler) sees the values an fp32 row of them holds.
#define SAMPLE_TASKS 16

typedef struct sample_job {
    int32_t *ids;
    float *logprob;
    const void *logits;
    tr_dt t;             // of logits: the activation dtype
    const tr_sample_row *rows;
    int32_t B, V, n_tasks;
    double *w;           // [n_tasks][V]
    int32_t *idx;        // [n_tasks][V]
    float *row;          // [n_tasks][V] the widened row (bf16 logits only)
    int32_t *near;       // [B] 1 for a near draw
} sample_job;

static int32_t sample_tasks(int32_t B) { return B < SAMPLE_TASKS ? B : SAMPLE_TASKS; }

size_t tr_cpu_sample_scratch_bytes(tr_backend *be, int32_t B, int32_t V) {
    if (B <= 0 || V <= 0) return 0;
    size_t per = (size_t)sample_tasks(B) * (size_t)V;
    size_t row = be->act == TR_F32 ? 0 : sizeof(float);
    return per * (sizeof(double) + sizeof(int32_t) + row) + (size_t)B * sizeof(int32_t);
}

static void sample_task(void *arg, int32_t task) {
    const sample_job *j = arg;
    int32_t b0 = (int32_t)((int64_t)j->B * task / j->n_tasks);
    int32_t b1 = (int32_t)((int64_t)j->B * (task + 1) / j->n_tasks);
    double *w = j->w + (size_t)task * j->V;
    int32_t *idx = j->idx + (size_t)task * j->V;
    for (int32_t b = b0; b < b1; b++) {
        const float *lg;
        if (j->t == TR_F32) {
            lg = (const float *)j->logits + (size_t)b * j->V;
        } else {
            float *wide = j->row + (size_t)task * j->V;
            tr_ld_row(wide, j->logits, (size_t)b * j->V, j->V, j->t);
            lg = wide;
        }
        const tr_sample_row *row = &j->rows[b];
        double lse;
        tr_cpu_logsoftmax_row(lg, TR_F32, j->V, &lse, NULL);
        int32_t id;
        bool near = false;
        if (row->temperature == 0.0f) {
            id = tr_cpu_sample_argmax(lg, j->V);
        } else {
            tr_sample_set set;
            tr_cpu_sample_prepare(lg, j->V, row->temperature, row->top_k, row->top_p, w, idx,
                                  &set);
            uint64_t counter = row->counter;
            int32_t used = row->used;
            uint32_t x = tr_philox_next(row->seed, &counter, &used);
            uint32_t y = tr_philox_next(row->seed, &counter, &used);
            id = tr_cpu_sample_pick(w, idx, &set, tr_philox_uniform53(x, y), &near);
            near = near || set.cut_near;
        }
        j->ids[b] = id;
        j->logprob[b] = (float)((double)lg[id] - lse);
        j->near[b] = near;
    }
}

void tr_cpu_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                   const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                   int32_t *n_near) {
    (void)ranked;   // each task ranks its own rows as they need
    if (B <= 0 || V <= 0) return;
    sample_job j = {.ids = ids, .logprob = logprob, .logits = logits, .t = be->act,
                    .rows = rows, .B = B, .V = V, .n_tasks = sample_tasks(B)};
    size_t per = (size_t)j.n_tasks * (size_t)V;
    j.w = scratch;
    j.idx = (int32_t *)(j.w + per);
    j.row = (float *)(j.idx + per);
    j.near = (int32_t *)(j.row + (be->act == TR_F32 ? 0 : per));
    tr_cpu_run(be, j.n_tasks, sample_task, &j, 30.0 * (double)B * V);
    int32_t count = 0;
    for (int32_t b = 0; b < B; b++) count += j.near[b];
    *n_near += count;
}

void tr_cpu_sample_rank_head(const float *lg, int32_t *idx, int32_t n, int32_t k) {
    rank_head(lg, idx, n, k);
}
