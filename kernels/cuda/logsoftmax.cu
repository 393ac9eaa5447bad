// Fused log-softmax over vocabulary rows on the GPU, one block per row: the maximum, then
// sum e and sum e*(x - m) in double (fixed-order block reductions) give lse, entropy and the
// target's log-probability. The backward writes dlogits (A: rounded once) from dlogprob and
// dentropy.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/logsoftmax_row.cuh"

#define LSM_THREADS TR_LSM_THREADS

__global__ void logsoftmax_forward_kernel(float *logprob, float *entropy, float *lse,
                                          const float *logits, const int32_t *target,
                                          int32_t V) {
    int32_t t = blockIdx.x;
    const float *x = logits + (size_t)t * V;
    tr_lsm_stats st = tr_lsm_row(x, V);
    if (threadIdx.x != 0) return;
    // entropy = log S - sum e (x-m) / S with e = exp(x - m), S = sum e
    double l = tr_lsm_lse(st);
    lse[t] = (float)l;
    if (entropy) entropy[t] = (float)(log(st.s) - st.sx / st.s);
    if (logprob) {
        int32_t tg = target[t];
        logprob[t] = tg < 0 ? 0.0f : tr_lsm_logprob(x, tg, l);
    }
}

// With p = exp(x - lse): d logprob/dx = onehot - p; dH/dx_i = -p_i (x_i - sum_k p_k x_k),
// where E_p[x] is normalized by sum p so the rounding of the saved lse cancels.
template <typename A>
__global__ void logsoftmax_backward_kernel(A *dlogits, const float *dlogprob,
                                           const float *dentropy, const float *logits,
                                           const float *lse, const int32_t *target, int32_t V) {
    int32_t t = blockIdx.x;
    const float *x = logits + (size_t)t * V;
    A *dx = dlogits + (size_t)t * V;
    float l = lse[t];
    int32_t tg = target[t];
    float glp = (dlogprob && tg >= 0) ? dlogprob[t] : 0.0f;
    float gent = dentropy ? dentropy[t] : 0.0f;
    double mean = 0.0;
    if (gent != 0.0f) {   // uniform over the block: every thread takes the same branch
        double sp = 0.0, spx = 0.0;
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            double p = expf(x[i] - l);
            sp += p;
            spx += p * x[i];
        }
        sp = tr_block_sum(sp);
        spx = tr_block_sum(spx);
        mean = spx / sp;
    }
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        float p = expf(x[i] - l);
        float d = -glp * p - gent * p * (float)((double)x[i] - mean);
        if (i == tg) d += glp;
        tr_store(dx + i, d);
    }
}

void tr_cuda_logsoftmax_forward(tr_backend *be, float *logprob, float *entropy, float *lse,
                                const float *logits, const int32_t *target, int32_t T,
                                int32_t V) {
    if (T <= 0 || V <= 0) return;
    logsoftmax_forward_kernel<<<T, LSM_THREADS, 0, tr_cuda_stream(be)>>>(logprob, entropy, lse,
                                                                        logits, target, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_forward");
}

void tr_cuda_logsoftmax_backward(tr_backend *be, void *dlogits, const float *dlogprob,
                                 const float *dentropy, const float *logits, const float *lse,
                                 const int32_t *target, int32_t T, int32_t V) {
    if (T <= 0 || V <= 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_cuda_bf16(be))
        logsoftmax_backward_kernel<tr_bf16><<<T, LSM_THREADS, 0, st>>>(
            (tr_bf16 *)dlogits, dlogprob, dentropy, logits, lse, target, V);
    else
        logsoftmax_backward_kernel<float><<<T, LSM_THREADS, 0, st>>>(
            (float *)dlogits, dlogprob, dentropy, logits, lse, target, V);
    TR_CUDA_LAUNCHED(be, "logsoftmax_backward");
}
