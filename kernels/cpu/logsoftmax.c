// Fused log-softmax over vocabulary rows on the CPU: the target's log-probability, the
// entropy and the log-sum-exp in one pass pair, sums in double; and the backward that writes
// dlogits (in the activation dtype, each element rounded once) from dlogprob and dentropy,
// over the logits themselves when the caller passes one buffer for both. Logits are read in
// the activation dtype and widened exactly, so a bf16 row gives the bits of its fp32 copy.
// Rows with target < 0 (padding, prompt) give logprob 0 and take no gradient through it.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define LSM_ELEMS_PER_TASK 32768   // rows per task = max(1, this / V)

typedef struct lsm_job {
    float *logprob, *entropy, *lse;
    void *dlogits;
    const void *logits;
    tr_dt t;   // of logits and dlogits: the activation dtype
    const float *dlogprob, *dentropy, *lse_in;
    const int32_t *target;
    int32_t T, V, rows_per_task;
} lsm_job;

// The row's maximum m, s = sum e and sx = sum e (x - m) with e = exp(x - m), sums in double
// in column order.
static void lsm_stats(const void *x, tr_dt t, int32_t V, float *m_out, double *s_out,
                      double *sx_out) {
    float m = -INFINITY;
    for (int32_t i = 0; i < V; i++) {
        float v = tr_ld(x, (size_t)i, t);
        m = v > m ? v : m;
    }
    double s = 0.0, sx = 0.0;
    for (int32_t i = 0; i < V; i++) {
        float z = tr_ld(x, (size_t)i, t) - m;
        double e = expf(z);
        s += e;
        sx += e * z;
    }
    *m_out = m;
    *s_out = s;
    *sx_out = sx;
}

void tr_cpu_logsoftmax_row(const void *x, tr_dt t, int32_t V, double *lse, double *entropy) {
    float m;
    double s, sx;
    lsm_stats(x, t, V, &m, &s, &sx);
    // entropy = log S - sum e (x-m) / S
    double log_s = log(s);
    *lse = (double)m + log_s;
    if (entropy) *entropy = log_s - sx / s;
}

static void lsm_forward_task(void *arg, int32_t task) {
    const lsm_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        const void *x = tr_at(j->logits, (size_t)t * j->V, j->t);
        double lse, entropy;
        tr_cpu_logsoftmax_row(x, j->t, j->V, &lse, &entropy);
        j->lse[t] = (float)lse;
        if (j->entropy) j->entropy[t] = (float)entropy;
        if (j->logprob) {
            int32_t tg = j->target[t];
            j->logprob[t] = tg < 0 ? 0.0f : (float)((double)tr_ld(x, (size_t)tg, j->t) - lse);
        }
    }
}

static int32_t lsm_rows_per_task(int32_t V) {
    return V >= LSM_ELEMS_PER_TASK ? 1 : LSM_ELEMS_PER_TASK / (V > 0 ? V : 1);
}

void tr_cpu_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                               const void *logits, const int32_t *target, int32_t T,
                               int32_t V) {
    lsm_job j = {.logprob = logprob, .entropy = entropy, .lse = lse, .logits = logits,
                 .t = be->act, .target = target, .T = T, .V = V,
                 .rows_per_task = lsm_rows_per_task(V)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), lsm_forward_task, &j, 3.0 * T * V);
}

// One row of dlogits: d_i = -glp p_i - gent p_i (x_i - mean) (+ glp at column tg), each
// rounded once; the target's glp is added to its fp32 value before that rounding. Column i
// is read just before it is written, so d may be x itself.
static void lsm_write_row(void *d, const void *x, tr_dt t, int32_t V, float lse, float glp,
                          float gent, double mean, int32_t tg) {
    for (int32_t i = 0; i < V; i++) {
        float xi = tr_ld(x, (size_t)i, t);
        float p = expf(xi - lse);
        float g = -glp * p - gent * p * (float)((double)xi - mean);
        if (i == tg && glp != 0.0f) g += glp;
        tr_st(d, (size_t)i, g, t);
    }
}

// With p = exp(x - lse): d logprob/dx = onehot - p; dH/dx_i = -p_i (x_i - sum_k p_k x_k).
static void lsm_backward_task(void *arg, int32_t task) {
    const lsm_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        const void *x = tr_at(j->logits, (size_t)t * j->V, j->t);
        float lse = j->lse_in[t];
        int32_t tg = j->target[t];
        float glp = (j->dlogprob && tg >= 0) ? j->dlogprob[t] : 0.0f;
        float gent = j->dentropy ? j->dentropy[t] : 0.0f;
        // E_p[x], recomputed from the logits and normalized by sum p so that the rounding of
        // the saved lse cancels; kept in double because x - E_p[x] cancels for peaked rows.
        double mean = 0.0;
        if (gent != 0.0f) {
            double sp = 0.0, spx = 0.0;
            for (int32_t i = 0; i < j->V; i++) {
                float xi = tr_ld(x, (size_t)i, j->t);
                double p = expf(xi - lse);
                sp += p;
                spx += p * xi;
            }
            mean = spx / sp;
        }
        lsm_write_row(tr_at_mut(j->dlogits, (size_t)t * j->V, j->t), x, j->t, j->V, lse, glp,
                      gent, mean, tg);
    }
}

void tr_cpu_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                const float *dentropy, const void *logits, const float *lse,
                                const int32_t *target, int32_t T, int32_t V) {
    lsm_job j = {.dlogits = dlogits, .dlogprob = dlogprob, .dentropy = dentropy,
                 .logits = logits, .t = be->act, .lse_in = lse, .target = target, .T = T,
                 .V = V, .rows_per_task = lsm_rows_per_task(V)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), lsm_backward_task, &j, 4.0 * T * V);
}

// ---- vocab-parallel: per-rank statistics, their combination, the backward ----

typedef struct vp_job {
    double *stats, *mean;
    const double *stats_in;
    float *logprob, *entropy, *lse;
    void *dlogits;
    const void *logits;
    tr_dt t;   // of logits and dlogits
    const float *dlogprob, *dentropy, *lse_in;
    const double *mean_in;
    const int32_t *target;
    int32_t v0, R, T, V, rows_per_task;
} vp_job;

// The statistics of tr_cpu_logsoftmax_row, so one rank's combine into logsoftmax_forward's
// bits.
static void vp_stats_task(void *arg, int32_t task) {
    const vp_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        const void *x = tr_at(j->logits, (size_t)t * j->V, j->t);
        float m;
        double s, sx;
        lsm_stats(x, j->t, j->V, &m, &s, &sx);
        int32_t tg = j->target[t] - j->v0;
        double *o = j->stats + (size_t)t * 4;
        o[0] = m;
        o[1] = s;
        o[2] = sx;
        o[3] = tg >= 0 && tg < j->V ? (double)tr_ld(x, (size_t)tg, j->t) : 0.0;
    }
}

void tr_cpu_logsoftmax_vp_stats(tr_backend *be, double *stats, const void *logits,
                                const int32_t *target, int32_t v0, int32_t T, int32_t V) {
    vp_job j = {.stats = stats, .logits = logits, .t = be->act, .target = target, .v0 = v0,
                .T = T, .V = V, .rows_per_task = lsm_rows_per_task(V)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), vp_stats_task, &j, 3.0 * T * V);
}

typedef struct vp_result {
    double lse, entropy, mean, logprob;
} vp_result;

static void vp_row(const double *stats, int32_t R, int32_t T, int32_t t, int32_t target,
                   vp_result *out) {
    double M = -INFINITY;
    for (int32_t r = 0; r < R; r++) {
        double m = stats[((size_t)r * T + t) * 4];
        M = m > M ? m : M;
    }
    // Each rank's sums rescaled from its max to the row's: e^(x-M) = e^(x-m) e^(m-M) and
    // (x - M) = (x - m) + (m - M).
    double S = 0.0, SX = 0.0, xt = 0.0;
    for (int32_t r = 0; r < R; r++) {
        const double *st = stats + ((size_t)r * T + t) * 4;
        double d = st[0] - M, k = exp(d);
        S += st[1] * k;
        SX += (st[2] + d * st[1]) * k;
        xt += st[3];
    }
    double log_s = log(S);
    out->lse = M + log_s;
    out->entropy = log_s - SX / S;
    out->mean = M + SX / S;
    out->logprob = target < 0 ? 0.0 : xt - out->lse;
}

static void vp_combine_task(void *arg, int32_t task) {
    const vp_job *j = arg;
    int32_t t0 = task * 256, t1 = t0 + 256 < j->T ? t0 + 256 : j->T;
    for (int32_t t = t0; t < t1; t++) {
        vp_result r;
        vp_row(j->stats_in, j->R, j->T, t, j->target[t], &r);
        j->lse[t] = (float)r.lse;
        if (j->entropy) j->entropy[t] = (float)r.entropy;
        if (j->logprob) j->logprob[t] = (float)r.logprob;
        if (j->mean) j->mean[t] = r.mean;
    }
}

void tr_cpu_logsoftmax_vp_combine(tr_backend *be, float *logprob, float *entropy, float *lse,
                                  double *mean, const double *stats, const int32_t *target,
                                  int32_t R, int32_t T) {
    vp_job j = {.logprob = logprob, .entropy = entropy, .lse = lse, .mean = mean,
                .stats_in = stats, .target = target, .R = R, .T = T};
    tr_cpu_run(be, tr_cpu_ceil_div(T, 256), vp_combine_task, &j, 8.0 * T * R);
}

static void vp_backward_task(void *arg, int32_t task) {
    const vp_job *j = arg;
    int32_t t0 = task * j->rows_per_task;
    int32_t t1 = t0 + j->rows_per_task < j->T ? t0 + j->rows_per_task : j->T;
    for (int32_t t = t0; t < t1; t++) {
        size_t o = (size_t)t * j->V;
        int32_t tg = j->target[t];
        float glp = (j->dlogprob && tg >= 0) ? j->dlogprob[t] : 0.0f;
        float gent = j->dentropy ? j->dentropy[t] : 0.0f;
        double mean = gent != 0.0f ? j->mean_in[t] : 0.0;
        lsm_write_row(tr_at_mut(j->dlogits, o, j->t), tr_at(j->logits, o, j->t), j->t, j->V,
                      j->lse_in[t], glp, gent, mean, tg - j->v0);
    }
}

void tr_cpu_logsoftmax_vp_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                   const float *dentropy, const void *logits, const float *lse,
                                   const double *mean, const int32_t *target, int32_t v0,
                                   int32_t T, int32_t V) {
    vp_job j = {.dlogits = dlogits, .dlogprob = dlogprob, .dentropy = dentropy,
                .logits = logits, .t = be->act, .lse_in = lse, .mean_in = mean,
                .target = target, .v0 = v0, .T = T, .V = V,
                .rows_per_task = lsm_rows_per_task(V)};
    tr_cpu_run(be, tr_cpu_ceil_div(T, j.rows_per_task), vp_backward_task, &j, 3.0 * T * V);
}
