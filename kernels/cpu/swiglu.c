// SwiGLU gating on the CPU over the fused [gate; up] projection: row t of gu holds gate in
// columns [0, I) and up in [I, 2I); out = silu(gate) * up, and its backward into the same
// fused layout, so one matmul_backward takes both halves' gradient at once.
// silu(x) = x * sigmoid(x) with sigmoid = 1 / (1 + exp(-x)) in fp32, as torch computes it;
// each result is rounded once into the activation dtype.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define SWIGLU_ELEMS_PER_TASK 16384   // rows per task = max(1, this / I)

typedef struct swiglu_job {
    void *out, *dgu;
    const void *gu, *dout;
    tr_dt t;
    int32_t T, I, rows_per_task;
} swiglu_job;

static void swiglu_forward_task(void *arg, int32_t task) {
    const swiglu_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        size_t gate = (size_t)t * 2 * j->I, up = gate + (size_t)j->I, o = (size_t)t * j->I;
        for (int32_t i = 0; i < j->I; i++) {
            float g = tr_ld(j->gu, gate + i, j->t);
            float sig = 1.0f / (1.0f + expf(-g));
            tr_st(j->out, o + i, g * sig * tr_ld(j->gu, up + i, j->t), j->t);
        }
    }
}

static int32_t swiglu_rows_per_task(int32_t I) {
    return I >= SWIGLU_ELEMS_PER_TASK ? 1 : SWIGLU_ELEMS_PER_TASK / (I > 0 ? I : 1);
}

void tr_cpu_swiglu_forward(tr_backend *be, void *out, const void *gu, int32_t T, int32_t I) {
    swiglu_job j = {.out = out, .gu = gu, .t = be->act, .T = T, .I = I,
                    .rows_per_task = swiglu_rows_per_task(I)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), swiglu_forward_task, &j,
               2.0 * T * I);
}

// d silu(g)/dg = sig * (1 + g * (1 - sig))
static void swiglu_backward_task(void *arg, int32_t task) {
    const swiglu_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        size_t gate = (size_t)t * 2 * j->I, up = gate + (size_t)j->I, o = (size_t)t * j->I;
        for (int32_t i = 0; i < j->I; i++) {
            float g = tr_ld(j->gu, gate + i, j->t), u = tr_ld(j->gu, up + i, j->t);
            float go = tr_ld(j->dout, o + i, j->t);
            float sig = 1.0f / (1.0f + expf(-g));
            float silu = g * sig;
            tr_st(j->dgu, gate + i, go * u * (sig * (1.0f + g * (1.0f - sig))), j->t);
            tr_st(j->dgu, up + i, go * silu, j->t);
        }
    }
}

void tr_cpu_swiglu_backward(tr_backend *be, void *dgu, const void *dout, const void *gu,
                            int32_t T, int32_t I) {
    swiglu_job j = {.dgu = dgu, .dout = dout, .gu = gu, .t = be->act, .T = T, .I = I,
                    .rows_per_task = swiglu_rows_per_task(I)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), swiglu_backward_task, &j,
               3.0 * T * I);
}
