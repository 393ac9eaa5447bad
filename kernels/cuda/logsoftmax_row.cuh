// One row of the fused log-softmax on the GPU, shared by logsoftmax_forward and sample: both
// run it in blocks of TR_LSM_THREADS threads, so the reductions have the same shape and the
// sample op's logprobs are the forward's bits.
#pragma once
#include "kernels/cuda/cuda_ctx.cuh"

#define TR_LSM_THREADS 256

// The row's maximum m, S = sum e and Sx = sum e (x - m) with e = exp(x - m), sums in double.
struct tr_lsm_stats {
    float m;
    double s, sx;
};

// Every thread of the block calls; every thread gets the statistics.
__device__ inline tr_lsm_stats tr_lsm_row(const float *x, int32_t V) {
    float m = -INFINITY;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) m = fmaxf(m, x[i]);
    m = tr_block_max(m);
    double s = 0.0, sx = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        float z = x[i] - m;
        double e = expf(z);
        s += e;
        sx += e * z;
    }
    tr_lsm_stats st;
    st.m = m;
    st.s = tr_block_sum(s);
    st.sx = tr_block_sum(sx);
    return st;
}

// log-sum-exp of the row, and the log-probability of token id, as the forward rounds them.
__device__ inline double tr_lsm_lse(const tr_lsm_stats &st) { return (double)st.m + log(st.s); }
__device__ inline float tr_lsm_logprob(const float *x, int32_t id, double lse) {
    return (float)((double)x[id] - lse);
}
