// The elementwise fp32 add on the CPU: out = a + b, one rounding per element, in fixed
// chunks of elements (the same bits for any thread count). Sequence parallelism's residual
// stream takes a row-parallel projection's sum through it.
#include "kernels/cpu/cpu.h"

#define ADD_ELEMS_PER_TASK 65536

typedef struct add_job {
    float *out;
    const float *a, *b;
    size_t n;
} add_job;

static void add_task(void *arg, int32_t task) {
    const add_job *j = arg;
    size_t i0 = (size_t)task * ADD_ELEMS_PER_TASK;
    size_t i1 = i0 + ADD_ELEMS_PER_TASK < j->n ? i0 + ADD_ELEMS_PER_TASK : j->n;
    for (size_t i = i0; i < i1; i++) j->out[i] = j->a[i] + j->b[i];
}

void tr_cpu_add(tr_backend *be, float *out, const float *a, const float *b, size_t n) {
    add_job j = {.out = out, .a = a, .b = b, .n = n};
    tr_cpu_run(be, tr_cpu_ceil_div((int64_t)n, ADD_ELEMS_PER_TASK), add_task, &j, 0.2 * (double)n);
}
