// Whole-buffer ops for the optimizer step on the CPU: the sum of squares behind gradient-norm
// clipping and the fused AdamW step that applies the clip itself, reading the sum of squares
// from backend memory, so the host never waits between the two. Elementwise work is split
// into fixed chunks; the sum of squares adds fixed blocks in double and then the block sums
// in order.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define OPT_ELEMS_PER_TASK 16384
#define SUMSQ_MAX_BLOCKS 1024      // block partials live on the stack: no scratch

typedef struct opt_job {
    const float *a;
    double *partial;
    size_t n, block;
} opt_job;

static size_t opt_begin(const opt_job *j, int32_t task) { return (size_t)task * j->block; }
static size_t opt_end(const opt_job *j, int32_t task) {
    size_t e = (size_t)task * j->block + j->block;
    return e < j->n ? e : j->n;
}

static int32_t opt_tasks(opt_job *j, size_t block) {
    j->block = block;
    return (int32_t)((j->n + block - 1) / block);
}

static void sumsq_task(void *arg, int32_t task) {
    const opt_job *j = arg;
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    size_t i = opt_begin(j, task), e = opt_end(j, task);
    for (; i + 4 <= e; i += 4)
        for (int32_t l = 0; l < 4; l++) acc[l] += (double)j->a[i + l] * j->a[i + l];
    for (; i < e; i++) acc[0] += (double)j->a[i] * j->a[i];
    j->partial[task] = (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

void tr_cpu_sumsq(tr_backend *be, double *acc, const float *x, size_t n) {
    double partial[SUMSQ_MAX_BLOCKS];
    opt_job j = {.a = x, .n = n, .partial = partial};
    // Block size depends on n only; grown past OPT_ELEMS_PER_TASK for buffers so large that
    // the partials would not fit the stack array.
    size_t block = OPT_ELEMS_PER_TASK;
    if (n > block * SUMSQ_MAX_BLOCKS) block = (n + SUMSQ_MAX_BLOCKS - 1) / SUMSQ_MAX_BLOCKS;
    int32_t n_blocks = opt_tasks(&j, block);
    tr_cpu_run(be, n_blocks, sumsq_task, &j, 0.5 * (double)n);
    double total = 0.0;
    for (int32_t b = 0; b < n_blocks; b++) total += partial[b];
    *acc += total;
}

typedef struct adamw_job {
    const tr_adamw_args *a;
    float clip, bc1, bc2;
} adamw_job;

// The segment holding element i (segments tile [0, n) in order).
static int32_t adamw_seg_of(const tr_adamw_args *a, size_t i) {
    int32_t lo = 0, hi = a->n_segs - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (a->segs[mid].begin <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// The formula of the old per-tensor kernel, with g' = clip * g (rounded to fp32) in place
// of g: with clip 1 the product is g itself, so an unclipped step has its bits.
static void adamw_task(void *arg, int32_t task) {
    const adamw_job *j = arg;
    const tr_adamw_args *a = j->a;
    float c1 = 1.0f - a->b1, c2 = 1.0f - a->b2;
    size_t i = (size_t)task * OPT_ELEMS_PER_TASK;
    size_t e = i + OPT_ELEMS_PER_TASK < a->n ? i + OPT_ELEMS_PER_TASK : a->n;
    for (int32_t s = adamw_seg_of(a, i); i < e && s < a->n_segs; s++) {
        size_t se = a->segs[s].end < e ? (size_t)a->segs[s].end : e;
        float wd = a->segs[s].wd;
        for (; i < se; i++) {
            float g = a->g[i] * j->clip;
            float m = a->b1 * a->m[i] + c1 * g;
            float v = a->b2 * a->v[i] + c2 * (g * g);
            a->m[i] = m;
            a->v[i] = v;
            float mh = m / j->bc1, vh = v / j->bc2;
            a->p[i] -= a->lr * (mh / (sqrtf(vh) + a->eps) + wd * a->p[i]);
            if (a->work) tr_st(a->work, i, a->p[i], a->wt);
        }
    }
}

void tr_cpu_adamw(tr_backend *be, const tr_adamw_args *a) {
    double ss = *a->sumsq;
    if (!isfinite(ss) || a->n == 0 || a->n_segs <= 0) return;   // a skipped step writes nothing
    // c = min(1, max_norm / (norm + 1e-6)) in double, used as the fp32 factor it rounds to
    double c = a->max_norm > 0 ? (double)a->max_norm / (sqrt(ss) + 1e-6) : 1.0;
    adamw_job j = {.a = a, .clip = c < 1.0 ? (float)c : 1.0f,
                   .bc1 = (float)(1.0 - pow((double)a->b1, (double)a->t)),
                   .bc2 = (float)(1.0 - pow((double)a->b2, (double)a->t))};
    tr_cpu_run(be, tr_cpu_ceil_div((int64_t)a->n, OPT_ELEMS_PER_TASK), adamw_task, &j,
               2.0 * (double)a->n);
}
