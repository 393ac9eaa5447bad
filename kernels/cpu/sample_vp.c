// Vocab-parallel sampling on the CPU: a rank's best candidates of each row (the host
// sampler's ranking, kernels/cpu/sample.c), and the walk and the pick of kernels/sample_vp.h,
// whose weights are this library's exp as the single-rank op's are, so the ids are that op's
// bit for bit. Rows are split into at most SVP_TASKS tasks of consecutive rows.
#include "kernels/sample_vp.h"

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/sample.h"

#define SVP_TASKS 16

static int32_t svp_tasks(int32_t B) { return B < SVP_TASKS ? B : SVP_TASKS; }

static int32_t row_begin(int32_t B, int32_t n_tasks, int32_t task) {
    return (int32_t)((int64_t)B * task / n_tasks);
}

// Top: an index list of V per task; pick: each row's merge order (n_cand entries in all) and
// a near flag per row.
size_t tr_cpu_sample_vp_scratch_bytes(tr_backend *be, int32_t B, int32_t V, size_t n_cand) {
    (void)be;
    if (B <= 0) return 0;
    size_t top = V > 0 ? (size_t)svp_tasks(B) * (size_t)V * sizeof(int32_t) : 0;
    size_t pick = (n_cand + (size_t)B) * sizeof(int32_t);
    return top > pick ? top : pick;
}

typedef struct svp_job {
    tr_sample_cand *cand;
    const tr_sample_cand *cand_in;
    const float *logits;
    const tr_sample_row *rows;
    const double *carry, *total, *mass;
    double *sum;
    int32_t *hit, *ids, *scratch, *near;   // hit: the scan's output
    const int32_t *hits;                   // the pick's input: every rank's
    int32_t R, k, v0, B, V, n_tasks;
} svp_job;

static void top_task(void *arg, int32_t task) {
    const svp_job *j = arg;
    int32_t *idx = j->scratch + (size_t)task * (size_t)j->V;
    const int32_t kk = j->k < j->V ? j->k : j->V;
    const int32_t b1 = row_begin(j->B, j->n_tasks, task + 1);
    for (int32_t b = row_begin(j->B, j->n_tasks, task); b < b1; b++) {
        const float *lg = j->logits + (size_t)b * j->V;
        tr_sample_cand *out = j->cand + (size_t)b * j->k;
        for (int32_t i = 0; i < j->V; i++) idx[i] = i;
        tr_cpu_sample_rank_head(lg, idx, j->V, kk);
        for (int32_t r = 0; r < j->k; r++)
            out[r] = r < kk ? (tr_sample_cand){lg[idx[r]], j->v0 + idx[r]}
                            : (tr_sample_cand){-INFINITY, -1};
    }
}

void tr_cpu_sample_vp_top(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                          int32_t B, int32_t V, int32_t k, void *scratch) {
    if (B <= 0 || V <= 0 || k <= 0) return;
    svp_job j = {.cand = cand, .logits = logits, .scratch = scratch, .v0 = v0, .B = B, .V = V,
                 .k = k, .n_tasks = svp_tasks(B)};
    tr_cpu_run(be, j.n_tasks, top_task, &j, 20.0 * (double)B * V);
}

static void scan_task(void *arg, int32_t task) {
    const svp_job *j = arg;
    const int32_t b1 = row_begin(j->B, j->n_tasks, task + 1);
    for (int32_t b = row_begin(j->B, j->n_tasks, task); b < b1; b++) {
        if (j->rows[b].temperature == 0.0f) continue;
        float mx = tr_svp_max(j->cand_in, j->R, j->k, j->B, b);
        tr_svp_scan_row(j->logits + (size_t)b * j->V, j->V, j->v0, &j->rows[b], mx,
                        j->carry ? j->carry[b] : 0.0, j->total ? j->total[b] : 0.0, &j->sum[b],
                        j->hit ? j->hit + (size_t)b * 3 : NULL);
    }
}

void tr_cpu_sample_vp_scan(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                           const tr_sample_row *rows, const tr_sample_cand *cand,
                           const double *carry, const double *total, int32_t R, int32_t k,
                           int32_t v0, int32_t B, int32_t V) {
    if (B <= 0 || V <= 0) return;
    svp_job j = {.sum = sum, .hit = total ? hit : NULL, .logits = logits, .rows = rows,
                 .cand_in = cand, .carry = carry, .total = total, .R = R, .k = k, .v0 = v0,
                 .B = B, .V = V, .n_tasks = svp_tasks(B)};
    tr_cpu_run(be, j.n_tasks, scan_task, &j, 20.0 * (double)B * V);
}

static void pick_task(void *arg, int32_t task) {
    const svp_job *j = arg;
    const int32_t b1 = row_begin(j->B, j->n_tasks, task + 1);
    for (int32_t b = row_begin(j->B, j->n_tasks, task); b < b1; b++) {
        bool near = false;
        int32_t *order = j->scratch + (size_t)b * (size_t)j->R * (size_t)j->k;
        j->ids[b] = tr_svp_pick_row(j->cand_in, j->hits, j->mass, &j->rows[b], j->R, j->k, j->B, b,
                                    j->V, order, &near);
        j->near[b] = near;
    }
}

void tr_cpu_sample_vp_pick(tr_backend *be, int32_t *ids, int32_t *n_near,
                           const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                           const tr_sample_row *rows, int32_t R, int32_t k, int32_t B, int32_t V,
                           void *scratch) {
    if (B <= 0) return;
    // Each row's merge order, then a near flag per row, counted in row order afterwards.
    int32_t *order = scratch, *near = order + (size_t)R * (size_t)k * (size_t)B;
    svp_job j = {.ids = ids, .cand_in = cand, .hits = hit, .mass = mass, .rows = rows, .R = R,
                 .k = k, .B = B, .V = V, .scratch = order, .near = near, .n_tasks = svp_tasks(B)};
    tr_cpu_run(be, j.n_tasks, pick_task, &j, 50.0 * (double)B * R * k);
    int32_t count = 0;
    for (int32_t b = 0; b < B; b++) count += near[b];
    *n_near += count;
}
