// RMSNorm on the CPU: out = in * rstd * w (Llama/HF order: normalize, then scale by w).
// Row statistics are summed in double. The backward runs two fixed splits: input gradients by
// blocks of rows, weight gradients by blocks of channels summing all rows in order.
#include <math.h>

#include "kernels/cpu/cpu.h"

#define RMS_ROWS_PER_TASK 16
#define RMS_COLS_PER_TASK 64

typedef struct rms_job {
    float *out, *rstd, *din, *dw;
    const float *in, *w, *dout, *rstd_in;
    float eps;
    int32_t T, C;
} rms_job;

static void rms_forward_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t t0 = task * RMS_ROWS_PER_TASK;
    int32_t t1 = t0 + RMS_ROWS_PER_TASK < j->T ? t0 + RMS_ROWS_PER_TASK : j->T;
    for (int32_t t = t0; t < t1; t++) {
        const float *x = j->in + (size_t)t * j->C;
        float *y = j->out + (size_t)t * j->C;
        double ss = 0.0;
        for (int32_t c = 0; c < j->C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / j->C + (double)j->eps));
        j->rstd[t] = r;
        for (int32_t c = 0; c < j->C; c++) y[c] = (x[c] * r) * j->w[c];
    }
}

void tr_cpu_rmsnorm_forward(tr_backend *be, float *out, float *rstd, const float *in,
                            const float *w, float eps, int32_t T, int32_t C) {
    rms_job j = {.out = out, .rstd = rstd, .in = in, .w = w, .eps = eps, .T = T, .C = C};
    tr_cpu_run(be, tr_cpu_ceil_div(T, RMS_ROWS_PER_TASK), rms_forward_task, &j, 2.0 * T * C);
}

// din_c += r w_c g_c - x_c r^3 / C * sum_k g_k w_k x_k   (g = dout, r = rstd)
static void rms_backward_din_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t t0 = task * RMS_ROWS_PER_TASK;
    int32_t t1 = t0 + RMS_ROWS_PER_TASK < j->T ? t0 + RMS_ROWS_PER_TASK : j->T;
    for (int32_t t = t0; t < t1; t++) {
        const float *x = j->in + (size_t)t * j->C;
        const float *g = j->dout + (size_t)t * j->C;
        float *dx = j->din + (size_t)t * j->C;
        double dot = 0.0;
        for (int32_t c = 0; c < j->C; c++) dot += (double)g[c] * j->w[c] * x[c];
        double r = j->rstd_in[t];
        float coef = (float)(r * r * r * dot / j->C);
        float rf = (float)r;
        for (int32_t c = 0; c < j->C; c++) dx[c] += rf * j->w[c] * g[c] - coef * x[c];
    }
}

static void rms_backward_dw_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t c0 = task * RMS_COLS_PER_TASK;
    int32_t cn = j->C - c0 < RMS_COLS_PER_TASK ? j->C - c0 : RMS_COLS_PER_TASK;
    double acc[RMS_COLS_PER_TASK];
    for (int32_t i = 0; i < cn; i++) acc[i] = 0.0;
    for (int32_t t = 0; t < j->T; t++) {
        const float *x = j->in + (size_t)t * j->C + c0;
        const float *g = j->dout + (size_t)t * j->C + c0;
        float r = j->rstd_in[t];
        for (int32_t i = 0; i < cn; i++) acc[i] += (double)(g[i] * (x[i] * r));
    }
    for (int32_t i = 0; i < cn; i++) j->dw[c0 + i] += (float)acc[i];
}

void tr_cpu_rmsnorm_backward(tr_backend *be, float *din, float *dw, const float *dout,
                             const float *in, const float *w, const float *rstd, int32_t T,
                             int32_t C) {
    rms_job j = {.din = din, .dw = dw, .dout = dout, .in = in, .w = w, .rstd_in = rstd,
                 .T = T, .C = C};
    if (din)
        tr_cpu_run(be, tr_cpu_ceil_div(T, RMS_ROWS_PER_TASK), rms_backward_din_task, &j,
                   2.0 * T * C);
    if (dw && T > 0)
        tr_cpu_run(be, tr_cpu_ceil_div(C, RMS_COLS_PER_TASK), rms_backward_dw_task, &j,
                   2.0 * T * C);
}
