// Fused log-softmax over vocabulary rows on the GPU, over logits of the activation dtype, one
// cluster of 1 to 4 blocks a row (as many as keep the device busy; the bits do not depend on
// it: logsoftmax_row.cuh): the maximum, then sum e and sum e*(x - m) in double over each
// chunk's fp32 sums (fixed-order reductions) give lse, entropy and the target's
// log-probability. The backward writes dlogits (A: rounded once) from dlogprob and dentropy,
// possibly over the logits themselves: each thread reads a chunk before it writes that chunk,
// and a pass that reads the whole row first (the entropy term's mean) ends at the row's barrier.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/logsoftmax_row.cuh"

template <typename A>
__global__ void logsoftmax_forward_kernel(float *logprob, float *entropy, float *lse,
                                          const A *logits, const int32_t *target, int32_t V) {
    int32_t t = tr_lsm_row_first();
    const A *x = logits + (size_t)t * V;
    tr_lsm_stats st = tr_lsm_row(x, V);
    if (tr_lsm_vt(0) != 0) return;
    // entropy = log S - sum e (x-m) / S with e = exp(x - m), S = sum e
    double l = tr_lsm_lse(st);
    lse[t] = (float)l;
    if (entropy) entropy[t] = (float)(log(st.s) - st.sx / st.s);
    if (logprob) {
        int32_t tg = target[t];
        logprob[t] = tg < 0 ? 0.0f : tr_lsm_logprob(x, tg, l);
    }
}

// E_p[x] of a row with p = exp(x - l), normalized by sum p so the rounding of the saved lse
// cancels; in double because x - E_p[x] cancels for peaked rows. Every thread of the
// row's cluster calls.
template <typename A>
__device__ double lsm_mean(const A *x, int32_t V, float l) {
    tr_lsm_pair s[TR_LSM_UMAX] = {};
#pragma unroll 1
    for (int32_t u = 0; u < tr_lsm_uses(); u++) {
        tr_lsm_pair acc = {0.0, 0.0};
        tr_lsm_each(tr_lsm_row_src(x, V), tr_lsm_vt(u), TR_LSM_VT, tr_lsm_chunks(V),
                    [&](int32_t, int32_t n, const float *v) {
#pragma unroll
                        for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
                            if (k < n) {
                                double p = expf(v[k] - l);
                                acc.a += p;
                                acc.b += p * v[k];
                            }
                        }
                    });
        s[u] = acc;
    }
    const tr_lsm_pair r = tr_lsm_reduce(s, tr_lsm_op_pair());
    return r.b / r.a;
}

// dlogits of one row: d_i = -glp p_i - gent p_i (x_i - mean), plus glp at column tg (added to
// the fp32 value before the one rounding). Thread by thread, chunk c is loaded before chunk c
// is stored (the loads ahead are of the thread's later chunks), so dx may be x.
template <typename A>
__device__ void lsm_write_row(A *dx, const A *x, int32_t V, float l, float glp, float gent,
                              double mean, int32_t tg) {
    const bool vec_d = tr_lsm_aligned(dx);
#pragma unroll 1
    for (int32_t u = 0; u < tr_lsm_uses(); u++)
        tr_lsm_each(tr_lsm_row_src(x, V), tr_lsm_vt(u), TR_LSM_VT, tr_lsm_chunks(V),
                    [&](int32_t c, int32_t n, const float *v) {
                        float g[TR_LSM_CHUNK];
#pragma unroll
                        for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
                            float p = expf(v[k] - l);
                            float d = -glp * p - gent * p * (float)((double)v[k] - mean);
                            if (c * TR_LSM_CHUNK + k == tg && glp != 0.0f) d += glp;
                            g[k] = d;
                        }
                        tr_lsm_store(dx, c, n, vec_d, g);
                    });
}

// With p = exp(x - lse): d logprob/dx = onehot - p; dH/dx_i = -p_i (x_i - sum_k p_k x_k).
template <typename A>
__global__ void logsoftmax_backward_kernel(A *dlogits, const float *dlogprob,
                                           const float *dentropy, const A *logits,
                                           const float *lse, const int32_t *target, int32_t V) {
    int32_t t = tr_lsm_row_first();
    const A *x = logits + (size_t)t * V;
    float l = lse[t];
    int32_t tg = target[t];
    float glp = (dlogprob && tg >= 0) ? dlogprob[t] : 0.0f;
    float gent = dentropy ? dentropy[t] : 0.0f;
    // gent is uniform over the row: every thread takes the same branch.
    double mean = gent != 0.0f ? lsm_mean(x, V, l) : 0.0;
    lsm_write_row(dlogits + (size_t)t * V, x, V, l, glp, gent, mean, tg);
}

// A row kernel over T rows (tr_lsm_ctas_for blocks each), staged through dynamic shared
// memory when they are few (tr_lsm_stage_bytes).
template <typename... P, typename... A>
static void lsm_launch(tr_backend *be, void (*kernel)(P...), int32_t T, A... args) {
    const tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    const int C = tr_lsm_ctas_for(ctx, T);
    const size_t dyn = tr_lsm_stage_bytes((long)T * C, ctx->sms);
    if (dyn && TR_CUDA_CHECK(be, cudaFuncSetAttribute(kernel,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      (int)dyn)))
        return;
    TR_CUDA_CHECK(be, tr_lsm_launch(kernel, T, C, dyn, tr_cuda_stream(be), args...));
}

void tr_cuda_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                                const void *logits, const int32_t *target, int32_t T,
                                int32_t V) {
    if (T <= 0 || V <= 0) return;
    if (tr_cuda_bf16(be))
        lsm_launch(be, logsoftmax_forward_kernel<tr_bf16>, T, logprob, entropy, lse,
                   (const tr_bf16 *)logits, target, V);
    else
        lsm_launch(be, logsoftmax_forward_kernel<float>, T, logprob, entropy, lse,
                   (const float *)logits, target, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_forward");
}

void tr_cuda_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                 const float *dentropy, const void *logits, const float *lse,
                                 const int32_t *target, int32_t T, int32_t V) {
    if (T <= 0 || V <= 0) return;
    if (tr_cuda_bf16(be))
        lsm_launch(be, logsoftmax_backward_kernel<tr_bf16>, T, (tr_bf16 *)dlogits, dlogprob,
                   dentropy, (const tr_bf16 *)logits, lse, target, V);
    else
        lsm_launch(be, logsoftmax_backward_kernel<float>, T, (float *)dlogits, dlogprob,
                   dentropy, (const float *)logits, lse, target, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_backward");
}

// ---- vocab-parallel: per-rank statistics, their combination, the backward ----

// One cluster per row: the row routine of logsoftmax_forward over this rank's columns.
template <typename A>
__global__ void logsoftmax_vp_stats_kernel(double *stats, const A *logits,
                                           const int32_t *target, int32_t v0, int32_t V) {
    int32_t t = tr_lsm_row_first();
    const A *x = logits + (size_t)t * V;
    tr_lsm_stats st = tr_lsm_row(x, V);
    if (tr_lsm_vt(0) != 0) return;
    int32_t tg = target[t] - v0;
    double *o = stats + (size_t)t * 4;
    o[0] = st.m;
    o[1] = st.s;
    o[2] = st.sx;
    o[3] = tg >= 0 && tg < V ? (double)tr_f32(x[tg]) : 0.0;
}

// One thread per row; the ranks in order, as kernels/cpu combines them.
__global__ void logsoftmax_vp_combine_kernel(float *logprob, float *entropy, float *lse,
                                             double *mean, const double *stats,
                                             const int32_t *target, int32_t R, int32_t T) {
    int32_t t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    double M = -INFINITY;
    for (int32_t r = 0; r < R; r++) M = fmax(M, stats[((size_t)r * T + t) * 4]);
    double S = 0.0, SX = 0.0, xt = 0.0;
    for (int32_t r = 0; r < R; r++) {
        const double *st = stats + ((size_t)r * T + t) * 4;
        double d = st[0] - M, k = exp(d);
        S += st[1] * k;
        SX += (st[2] + d * st[1]) * k;
        xt += st[3];
    }
    double log_s = log(S), l = M + log_s;
    lse[t] = (float)l;
    if (entropy) entropy[t] = (float)(log_s - SX / S);
    if (mean) mean[t] = M + SX / S;
    if (logprob) logprob[t] = target[t] < 0 ? 0.0f : (float)(xt - l);
}

template <typename A>
__global__ void logsoftmax_vp_backward_kernel(A *dlogits, const float *dlogprob,
                                              const float *dentropy, const A *logits,
                                              const float *lse, const double *mean_in,
                                              const int32_t *target, int32_t v0, int32_t V) {
    int32_t t = tr_lsm_row_first();
    int32_t tg = target[t];
    float glp = (dlogprob && tg >= 0) ? dlogprob[t] : 0.0f;
    float gent = dentropy ? dentropy[t] : 0.0f;
    double mean = gent != 0.0f ? mean_in[t] : 0.0;
    lsm_write_row(dlogits + (size_t)t * V, logits + (size_t)t * V, V, lse[t], glp, gent, mean,
                  tg - v0);
}

void tr_cuda_logsoftmax_vp_stats(tr_backend *be, double *stats, const void *logits,
                                 const int32_t *target, int32_t v0, int32_t T, int32_t V) {
    if (T <= 0 || V <= 0) return;
    if (tr_cuda_bf16(be))
        lsm_launch(be, logsoftmax_vp_stats_kernel<tr_bf16>, T, stats, (const tr_bf16 *)logits,
                   target, v0, V);
    else
        lsm_launch(be, logsoftmax_vp_stats_kernel<float>, T, stats, (const float *)logits,
                   target, v0, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_vp_stats");
}

void tr_cuda_logsoftmax_vp_combine(tr_backend *be, float *logprob, float *entropy, float *lse,
                                   double *mean, const double *stats, const int32_t *target,
                                   int32_t R, int32_t T) {
    if (T <= 0 || R <= 0) return;
    logsoftmax_vp_combine_kernel<<<tr_cuda_grid((size_t)T, 128), 128, 0, tr_cuda_stream(be)>>>(
        logprob, entropy, lse, mean, stats, target, R, T);
    TR_CUDA_LAUNCHED(be, "logsoftmax_vp_combine");
}

void tr_cuda_logsoftmax_vp_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                    const float *dentropy, const void *logits,
                                    const float *lse, const double *mean,
                                    const int32_t *target, int32_t v0, int32_t T, int32_t V) {
    if (T <= 0 || V <= 0) return;
    if (tr_cuda_bf16(be))
        lsm_launch(be, logsoftmax_vp_backward_kernel<tr_bf16>, T, (tr_bf16 *)dlogits, dlogprob,
                   dentropy, (const tr_bf16 *)logits, lse, mean, target, v0, V);
    else
        lsm_launch(be, logsoftmax_vp_backward_kernel<float>, T, (float *)dlogits, dlogprob,
                   dentropy, (const float *)logits, lse, mean, target, v0, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_vp_backward");
}
