// Whole-buffer ops for the optimizer step on the CPU: AdamW, the sum of squares behind
// gradient-norm clipping, scale and add. Elementwise work is split into fixed chunks; the sum
// of squares adds fixed blocks in double and then the block sums in order.
#include <math.h>

#include "kernels/cpu/cpu.h"

#define OPT_ELEMS_PER_TASK 16384
#define SUMSQ_MAX_BLOCKS 1024      // block partials live on the stack: no scratch

typedef struct opt_job {
    float *out, *p, *m, *v;
    const float *a, *b, *g;
    double *partial;
    size_t n, block;
    float s, lr, b1, b2, eps, wd, bc1, bc2;
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

static void add_task(void *arg, int32_t task) {
    const opt_job *j = arg;
    for (size_t i = opt_begin(j, task), e = opt_end(j, task); i < e; i++)
        j->out[i] = j->a[i] + j->b[i];
}

void tr_cpu_add(tr_backend *be, float *out, const float *a, const float *b, size_t n) {
    opt_job j = {.out = out, .a = a, .b = b, .n = n};
    tr_cpu_run(be, opt_tasks(&j, OPT_ELEMS_PER_TASK), add_task, &j, 0.5 * (double)n);
}

static void scale_task(void *arg, int32_t task) {
    const opt_job *j = arg;
    for (size_t i = opt_begin(j, task), e = opt_end(j, task); i < e; i++) j->p[i] *= j->s;
}

void tr_cpu_scale(tr_backend *be, float *x, float s, size_t n) {
    opt_job j = {.p = x, .s = s, .n = n};
    tr_cpu_run(be, opt_tasks(&j, OPT_ELEMS_PER_TASK), scale_task, &j, 0.3 * (double)n);
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

static void adamw_task(void *arg, int32_t task) {
    const opt_job *j = arg;
    float c1 = 1.0f - j->b1, c2 = 1.0f - j->b2;
    for (size_t i = opt_begin(j, task), e = opt_end(j, task); i < e; i++) {
        float g = j->g[i];
        float m = j->b1 * j->m[i] + c1 * g;
        float v = j->b2 * j->v[i] + c2 * (g * g);
        j->m[i] = m;
        j->v[i] = v;
        float mh = m / j->bc1, vh = v / j->bc2;
        j->p[i] -= j->lr * (mh / (sqrtf(vh) + j->eps) + j->wd * j->p[i]);
    }
}

void tr_cpu_adamw(tr_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, int32_t t) {
    opt_job j = {.p = p, .g = g, .m = m, .v = v, .n = n, .lr = lr, .b1 = b1, .b2 = b2,
                 .eps = eps, .wd = wd,
                 .bc1 = (float)(1.0 - pow((double)b1, (double)t)),
                 .bc2 = (float)(1.0 - pow((double)b2, (double)t))};
    tr_cpu_run(be, opt_tasks(&j, OPT_ELEMS_PER_TASK), adamw_task, &j, 2.0 * (double)n);
}
