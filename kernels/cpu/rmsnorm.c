// RMSNorm on the CPU: out = in * rstd * w (Llama/HF order: normalize, then scale by w), over
// the residual stream's rows (rmsnorm) or over each head of strided q/k rows (head_rmsnorm,
// Qwen3's q_norm/k_norm): one row code for both, a row being D values at t*ld + h*D.
// Row statistics are summed in double. The backward runs two fixed splits: input gradients by
// blocks of tokens, weight gradients by blocks of channels summing all rows in order.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define RMS_TOKENS_PER_TASK 16
#define RMS_COLS_PER_TASK 64

// Rows (t, h), t < T, h < H, of D values at t*ld + h*D; statistics at rstd[t*H + h].
typedef struct rms_job {
    void *out, *din;
    void *din_act;   // with din_add, or NULL: the updated din rounded to out_t as well
    float *rstd, *dw;
    const void *in, *w, *dout;
    const float *rstd_in;
    tr_dt in_t, out_t, w_t, dout_t;
    bool din_add;   // din += (the fp32 residual gradient) instead of din = (A)
    float eps;
    int32_t T, H, D, ld;
} rms_job;

static inline size_t rms_row(const rms_job *j, int32_t t, int32_t h) {
    return (size_t)t * j->ld + (size_t)h * j->D;
}

static void rms_forward_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t t0 = task * RMS_TOKENS_PER_TASK;
    int32_t t1 = t0 + RMS_TOKENS_PER_TASK < j->T ? t0 + RMS_TOKENS_PER_TASK : j->T;
    for (int32_t t = t0; t < t1; t++)
        for (int32_t h = 0; h < j->H; h++) {
            size_t o = rms_row(j, t, h);
            double ss = 0.0;
            for (int32_t c = 0; c < j->D; c++) {
                float x = tr_ld(j->in, o + c, j->in_t);
                ss += (double)x * x;
            }
            float r = (float)(1.0 / sqrt(ss / j->D + (double)j->eps));
            j->rstd[(size_t)t * j->H + h] = r;
            for (int32_t c = 0; c < j->D; c++) {
                float x = tr_ld(j->in, o + c, j->in_t);
                tr_st(j->out, o + c, (x * r) * tr_ld(j->w, (size_t)c, j->w_t), j->out_t);
            }
        }
}

static void rms_forward(tr_backend *be, rms_job *j) {
    tr_cpu_run(be, tr_cpu_ceil_div(j->T, RMS_TOKENS_PER_TASK), rms_forward_task, j,
               2.0 * j->T * j->H * j->D);
}

void tr_cpu_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const float *in,
                            const void *w, float eps, int32_t T, int32_t C) {
    rms_job j = {.out = out, .rstd = rstd, .in = in, .w = w, .in_t = TR_F32,
                 .out_t = be->act, .w_t = be->wt, .eps = eps, .T = T, .H = 1, .D = C, .ld = C};
    rms_forward(be, &j);
}

void tr_cpu_head_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const void *in,
                                 const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                 int32_t ld) {
    rms_job j = {.out = out, .rstd = rstd, .in = in, .w = w, .in_t = be->act,
                 .out_t = be->act, .w_t = be->wt, .eps = eps, .T = T, .H = H, .D = D, .ld = ld};
    rms_forward(be, &j);
}

// din_c (+)= r w_c g_c - x_c r^3 / D * sum_k g_k w_k x_k   (g = dout, r = rstd)
static void rms_backward_din_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t t0 = task * RMS_TOKENS_PER_TASK;
    int32_t t1 = t0 + RMS_TOKENS_PER_TASK < j->T ? t0 + RMS_TOKENS_PER_TASK : j->T;
    for (int32_t t = t0; t < t1; t++)
        for (int32_t h = 0; h < j->H; h++) {
            size_t o = rms_row(j, t, h);
            double dot = 0.0;
            for (int32_t c = 0; c < j->D; c++)
                dot += (double)tr_ld(j->dout, o + c, j->dout_t) * tr_ld(j->w, (size_t)c, j->w_t) *
                       tr_ld(j->in, o + c, j->in_t);
            double r = j->rstd_in[(size_t)t * j->H + h];
            float coef = (float)(r * r * r * dot / j->D);
            float rf = (float)r;
            for (int32_t c = 0; c < j->D; c++) {
                float g = tr_ld(j->dout, o + c, j->dout_t), x = tr_ld(j->in, o + c, j->in_t);
                float d = rf * tr_ld(j->w, (size_t)c, j->w_t) * g - coef * x;
                if (!j->din_add) {
                    tr_st(j->din, o + c, d, j->out_t);
                    continue;
                }
                float *dr = (float *)j->din + o + c;
                *dr += d;
                if (j->din_act) tr_st(j->din_act, o + c, *dr, j->out_t);
            }
        }
}

static void rms_backward_dw_task(void *arg, int32_t task) {
    const rms_job *j = arg;
    int32_t c0 = task * RMS_COLS_PER_TASK;
    int32_t cn = j->D - c0 < RMS_COLS_PER_TASK ? j->D - c0 : RMS_COLS_PER_TASK;
    double acc[RMS_COLS_PER_TASK];
    for (int32_t i = 0; i < cn; i++) acc[i] = 0.0;
    for (int32_t t = 0; t < j->T; t++)
        for (int32_t h = 0; h < j->H; h++) {
            size_t o = rms_row(j, t, h) + (size_t)c0;
            float r = j->rstd_in[(size_t)t * j->H + h];
            for (int32_t i = 0; i < cn; i++) {
                float g = tr_ld(j->dout, o + i, j->dout_t), x = tr_ld(j->in, o + i, j->in_t);
                acc[i] += (double)(g * (x * r));
            }
        }
    for (int32_t i = 0; i < cn; i++) j->dw[c0 + i] += (float)acc[i];
}

// dw first: it reads dout and in, which a written din may share memory with (in place).
static void rms_backward(tr_backend *be, rms_job *j) {
    double work = 2.0 * j->T * j->H * j->D;
    if (j->dw && j->T > 0)
        tr_cpu_run(be, tr_cpu_ceil_div(j->D, RMS_COLS_PER_TASK), rms_backward_dw_task, j, work);
    if (j->din)
        tr_cpu_run(be, tr_cpu_ceil_div(j->T, RMS_TOKENS_PER_TASK), rms_backward_din_task, j,
                   work);
}

void tr_cpu_rmsnorm_backward(tr_backend *be, float *din, void *din_act, float *dw,
                             const void *dout, const float *in, const void *w,
                             const float *rstd, int32_t T, int32_t C) {
    rms_job j = {.din = din, .din_act = din_act, .dw = dw, .dout = dout, .in = in, .w = w,
                 .rstd_in = rstd, .in_t = TR_F32, .out_t = be->act, .w_t = be->wt,
                 .dout_t = be->act, .din_add = true, .T = T, .H = 1, .D = C, .ld = C};
    rms_backward(be, &j);
}

void tr_cpu_head_rmsnorm_backward(tr_backend *be, void *din, float *dw, const void *dout,
                                  const void *in, const void *w, const float *rstd, int32_t T,
                                  int32_t H, int32_t D, int32_t ld) {
    rms_job j = {.din = din, .dw = dw, .dout = dout, .in = in, .w = w, .rstd_in = rstd,
                 .in_t = be->act, .out_t = be->act, .w_t = be->wt, .dout_t = be->act,
                 .din_add = false, .T = T, .H = H, .D = D, .ld = ld};
    rms_backward(be, &j);
}
