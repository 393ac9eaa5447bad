// SwiGLU gating on the CPU: out = silu(gate) * up, elementwise, and its backward.
// silu(x) = x * sigmoid(x) with sigmoid = 1 / (1 + exp(-x)) in fp32, as torch computes it.
#include <math.h>

#include "kernels/cpu/cpu.h"

#define ELEM_PER_TASK 16384

typedef struct swiglu_job {
    float *out, *dgate, *dup;
    const float *gate, *up, *dout;
    size_t n;
} swiglu_job;

static void swiglu_forward_task(void *arg, int32_t task) {
    const swiglu_job *j = arg;
    size_t i0 = (size_t)task * ELEM_PER_TASK;
    size_t i1 = i0 + ELEM_PER_TASK < j->n ? i0 + ELEM_PER_TASK : j->n;
    for (size_t i = i0; i < i1; i++) {
        float g = j->gate[i];
        float sig = 1.0f / (1.0f + expf(-g));
        j->out[i] = g * sig * j->up[i];
    }
}

void tr_cpu_swiglu_forward(tr_backend *be, float *out, const float *gate, const float *up,
                           size_t n) {
    swiglu_job j = {.out = out, .gate = gate, .up = up, .n = n};
    tr_cpu_run(be, tr_cpu_ceil_div((int64_t)n, ELEM_PER_TASK), swiglu_forward_task, &j,
               2.0 * (double)n);
}

// d silu(g)/dg = sig * (1 + g * (1 - sig))
static void swiglu_backward_task(void *arg, int32_t task) {
    const swiglu_job *j = arg;
    size_t i0 = (size_t)task * ELEM_PER_TASK;
    size_t i1 = i0 + ELEM_PER_TASK < j->n ? i0 + ELEM_PER_TASK : j->n;
    for (size_t i = i0; i < i1; i++) {
        float g = j->gate[i], u = j->up[i], go = j->dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        float silu = g * sig;
        if (j->dgate) j->dgate[i] += go * u * (sig * (1.0f + g * (1.0f - sig)));
        if (j->dup) j->dup[i] += go * silu;
    }
}

void tr_cpu_swiglu_backward(tr_backend *be, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, size_t n) {
    swiglu_job j = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up, .n = n};
    tr_cpu_run(be, tr_cpu_ceil_div((int64_t)n, ELEM_PER_TASK), swiglu_backward_task, &j,
               3.0 * (double)n);
}
