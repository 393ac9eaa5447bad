// RMSNorm on the GPU: out = in * rstd * w, one block per row with the row statistic summed
// in double by a fixed-order block reduction. The backward runs the input gradient by rows
// and the weight gradient by columns, each column summing all rows in order (no atomics).
#include "kernels/cuda/cuda_ctx.cuh"

#define RMS_THREADS 256

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *in, const float *w,
                                       float eps, int32_t C) {
    const float *x = in + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    double ss = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) ss += (double)x[c] * x[c];
    ss = tr_block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) y[c] = (x[c] * r) * w[c];
}

// din_c += r w_c g_c - x_c r^3 / C * sum_k g_k w_k x_k   (g = dout, r = rstd)
__global__ void rmsnorm_backward_din_kernel(float *din, const float *dout, const float *in,
                                            const float *w, const float *rstd, int32_t C) {
    const float *x = in + (size_t)blockIdx.x * C;
    const float *g = dout + (size_t)blockIdx.x * C;
    float *dx = din + (size_t)blockIdx.x * C;
    double dot = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dot += (double)g[c] * w[c] * x[c];
    dot = tr_block_sum(dot);
    double r = rstd[blockIdx.x];
    float coef = (float)(r * r * r * dot / C);
    float rf = (float)r;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dx[c] += rf * w[c] * g[c] - coef * x[c];
}

__global__ void rmsnorm_backward_dw_kernel(float *dw, const float *dout, const float *in,
                                           const float *rstd, int32_t T, int32_t C) {
    int32_t c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double acc = 0.0;
    for (int32_t t = 0; t < T; t++) {
        size_t i = (size_t)t * C + c;
        acc += (double)(dout[i] * (in[i] * rstd[t]));
    }
    dw[c] += (float)acc;
}

void tr_cuda_rmsnorm_forward(tr_backend *be, float *out, float *rstd, const float *in,
                             const float *w, float eps, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    rmsnorm_forward_kernel<<<T, RMS_THREADS, 0, tr_cuda_stream(be)>>>(out, rstd, in, w, eps, C);
    TR_CUDA_LAUNCHED(be, "rmsnorm_forward");
}

void tr_cuda_rmsnorm_backward(tr_backend *be, float *din, float *dw, const float *dout,
                              const float *in, const float *w, const float *rstd, int32_t T,
                              int32_t C) {
    if (T <= 0 || C <= 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    if (din) {
        rmsnorm_backward_din_kernel<<<T, RMS_THREADS, 0, st>>>(din, dout, in, w, rstd, C);
        if (TR_CUDA_LAUNCHED(be, "rmsnorm_backward din")) return;
    }
    if (dw) {
        rmsnorm_backward_dw_kernel<<<(C + RMS_THREADS - 1) / RMS_THREADS, RMS_THREADS, 0, st>>>(
            dw, dout, in, rstd, T, C);
        TR_CUDA_LAUNCHED(be, "rmsnorm_backward dw");
    }
}
