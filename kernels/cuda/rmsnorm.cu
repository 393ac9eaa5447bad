// RMSNorm on the GPU: the residual stream's norm (fp32 rows in, A rows out) and Qwen3's
// per-head norm over strided q/k rows (A in and out). One block per normalized row, its
// statistic summed in double by a fixed-order block reduction. The weight gradient sums
// every row of a column in double over fixed chunks of rows (the chunking depends on the
// shape only), then the chunks in order: no atomics, and many blocks even for short rows.
// Formulas are written with explicit _rn operations, so the compiler fuses nothing that
// kernels/cpu rounds separately.
#include "kernels/cuda/colsum.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define RMS_THREADS 256
#define HEAD_THREADS 128

// out = (x * r) * w, r = 1/sqrt(mean(x^2) + eps) with the mean in double. X: in's type,
// A: out's and w's.
template <typename X, typename A>
__device__ void rms_row(A *y, float *rstd, const X *x, const A *w, float eps, int32_t C) {
    double ss = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) {
        double xc = tr_f32(x[c]);
        ss += xc * xc;
    }
    ss = tr_block_sum(ss);
    float r = (float)(1.0 / sqrt(ss / C + (double)eps));
    if (threadIdx.x == 0) *rstd = r;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x)
        tr_store(y + c, __fmul_rn(__fmul_rn(tr_f32(x[c]), r), tr_f32(w[c])));
}

// dx = r w g - x r^3 / C * sum_k g_k w_k x_k (g = dout), added into dx (F) when X is float
// and accumulate, else written (rounded once to dx's type).
template <typename X, typename G, typename A>
__device__ void rms_row_backward(X *dx, const G *g, const X *x, const A *w, float rstd,
                                 int32_t C, bool accumulate) {
    double dot = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x)
        dot += (double)tr_f32(g[c]) * tr_f32(w[c]) * tr_f32(x[c]);
    dot = tr_block_sum(dot);
    double r = rstd;
    float coef = (float)(r * r * r * dot / C);
    float rf = rstd;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) {
        float a = __fmul_rn(__fmul_rn(rf, tr_f32(w[c])), tr_f32(g[c]));
        float d = __fsub_rn(a, __fmul_rn(coef, tr_f32(x[c])));
        tr_store(dx + c, accumulate ? __fadd_rn(tr_f32(dx[c]), d) : d);
    }
}

template <typename A>
__global__ void rmsnorm_forward_kernel(A *out, float *rstd, const float *in, const A *w,
                                       float eps, int32_t C) {
    tr_pdl_wait();
    tr_pdl_release();
    size_t row = (size_t)blockIdx.x * C;
    rms_row(out + row, rstd + blockIdx.x, in + row, w, eps, C);
}

template <typename A>
__global__ void rmsnorm_backward_din_kernel(float *din, const A *dout, const float *in,
                                            const A *w, const float *rstd, int32_t C) {
    size_t row = (size_t)blockIdx.x * C;
    rms_row_backward(din + row, dout + row, in + row, w, rstd[blockIdx.x], C, true);
}

// Row r of T*H rows of `width` values: token r / H, head r % H, at (r / H) * ld + (r % H) *
// width (H = 1, ld = width: plain rows).
__device__ inline size_t norm_row_at(int32_t r, int32_t H, int32_t ld, int32_t width) {
    return (size_t)(r / H) * (size_t)ld + (size_t)(r % H) * (size_t)width;
}

template <typename A>
__global__ void head_rmsnorm_forward_kernel(A *out, float *rstd, const A *in, const A *w,
                                            float eps, int32_t H, int32_t D, int32_t ld) {
    size_t at = norm_row_at(blockIdx.x, H, ld, D);
    rms_row(out + at, rstd + blockIdx.x, in + at, w, eps, D);
}

template <typename A>
__global__ void head_rmsnorm_backward_din_kernel(A *din, const A *dout, const A *in, const A *w,
                                                 const float *rstd, int32_t H, int32_t D,
                                                 int32_t ld) {
    size_t at = norm_row_at(blockIdx.x, H, ld, D);
    rms_row_backward(din + at, dout + at, in + at, w, rstd[blockIdx.x], D, false);
}

// The weight gradient's term: g * (x * r) of row r's column c.
template <typename G, typename X>
struct norm_dw_term {
    const G *dout;
    const X *in;
    const float *rstd;
    int32_t H, ld, width;
    __device__ float operator()(int32_t r, int32_t c) const {
        size_t o = norm_row_at(r, H, ld, width) + c;
        return __fmul_rn(tr_f32(dout[o]), __fmul_rn(tr_f32(in[o]), rstd[r]));
    }
};

template <typename G, typename X>
static void norm_dw(tr_backend *be, float *dw, const G *dout, const X *in, const float *rstd,
                    int32_t rows, int32_t H, int32_t ld, int32_t width) {
    norm_dw_term<G, X> f = {dout, in, rstd, H, ld, width};
    tr_colsum(be, dw, f, rows, width, "launch rmsnorm dw", "launch rmsnorm dw total");
}

template <typename A>
static void rmsnorm_forward_run(tr_backend *be, void *out, float *rstd, const float *in,
                                const void *w, float eps, int32_t T, int32_t C) {
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, T <= TR_CUDA_DECODE_ROWS, rmsnorm_forward_kernel<A>,
                                         dim3((unsigned)T), dim3(RMS_THREADS), 0, (A *)out, rstd,
                                         in, (const A *)w, eps, C)))
        return;
    TR_CUDA_LAUNCHED(be, "rmsnorm_forward");
}

void tr_cuda_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const float *in,
                             const void *w, float eps, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    if (tr_cuda_bf16(be)) rmsnorm_forward_run<tr_bf16>(be, out, rstd, in, w, eps, T, C);
    else rmsnorm_forward_run<float>(be, out, rstd, in, w, eps, T, C);
}

template <typename A>
static void rmsnorm_backward_run(tr_backend *be, float *din, float *dw, const void *dout,
                                 const float *in, const void *w, const float *rstd, int32_t T,
                                 int32_t C) {
    if (din) {
        rmsnorm_backward_din_kernel<A><<<T, RMS_THREADS, 0, tr_cuda_stream(be)>>>(
            din, (const A *)dout, in, (const A *)w, rstd, C);
        if (TR_CUDA_LAUNCHED(be, "rmsnorm_backward din")) return;
    }
    if (dw) norm_dw<A, float>(be, dw, (const A *)dout, in, rstd, T, 1, C, C);
}

void tr_cuda_rmsnorm_backward(tr_backend *be, float *din, float *dw, const void *dout,
                              const float *in, const void *w, const float *rstd, int32_t T,
                              int32_t C) {
    if (T <= 0 || C <= 0) return;
    if (tr_cuda_bf16(be)) rmsnorm_backward_run<tr_bf16>(be, din, dw, dout, in, w, rstd, T, C);
    else rmsnorm_backward_run<float>(be, din, dw, dout, in, w, rstd, T, C);
}

template <typename A>
static void head_forward_run(tr_backend *be, void *out, float *rstd, const void *in,
                             const void *w, float eps, int32_t T, int32_t H, int32_t D,
                             int32_t ld) {
    head_rmsnorm_forward_kernel<A><<<(unsigned)((int64_t)T * H), HEAD_THREADS, 0,
                                     tr_cuda_stream(be)>>>((A *)out, rstd, (const A *)in,
                                                           (const A *)w, eps, H, D, ld);
    TR_CUDA_LAUNCHED(be, "head_rmsnorm_forward");
}

void tr_cuda_head_rmsnorm_forward(tr_backend *be, void *out, float *rstd, const void *in,
                                  const void *w, float eps, int32_t T, int32_t H, int32_t D,
                                  int32_t ld) {
    if (T <= 0 || H <= 0 || D <= 0) return;
    if (tr_cuda_bf16(be)) head_forward_run<tr_bf16>(be, out, rstd, in, w, eps, T, H, D, ld);
    else head_forward_run<float>(be, out, rstd, in, w, eps, T, H, D, ld);
}

template <typename A>
static void head_backward_run(tr_backend *be, void *din, float *dw, const void *dout,
                              const void *in, const void *w, const float *rstd, int32_t T,
                              int32_t H, int32_t D, int32_t ld) {
    if (din) {
        head_rmsnorm_backward_din_kernel<A><<<(unsigned)((int64_t)T * H), HEAD_THREADS, 0,
                                              tr_cuda_stream(be)>>>(
            (A *)din, (const A *)dout, (const A *)in, (const A *)w, rstd, H, D, ld);
        if (TR_CUDA_LAUNCHED(be, "head_rmsnorm_backward din")) return;
    }
    if (dw) norm_dw<A, A>(be, dw, (const A *)dout, (const A *)in, rstd, T * H, H, ld, D);
}

void tr_cuda_head_rmsnorm_backward(tr_backend *be, void *din, float *dw, const void *dout,
                                   const void *in, const void *w, const float *rstd, int32_t T,
                                   int32_t H, int32_t D, int32_t ld) {
    if (T <= 0 || H <= 0 || D <= 0) return;
    if (tr_cuda_bf16(be))
        head_backward_run<tr_bf16>(be, din, dw, dout, in, w, rstd, T, H, D, ld);
    else
        head_backward_run<float>(be, din, dw, dout, in, w, rstd, T, H, D, ld);
}

