// RMSNorm on the GPU: the residual stream's norm (fp32 rows in, A rows out) and Qwen3's
// per-head norm over strided q/k rows (A in and out). A row's statistic is summed in double
// by RMS_THREADS virtual threads (thread v takes columns v, v + RMS_THREADS, ... in order)
// and tr_block_sum's fixed tree over them. At decode sizes a block plays a row's virtual
// threads, one each; over many rows a warp plays them, eight a lane, and repeats the tree
// warp by warp (rms_warp_sum), so a row's bits do not depend on which, nor on T
// (test_cuda_ops rmsnorm compares rows normalized alone and in a batch). The weight gradient sums
// every row of a column in double over fixed chunks of rows (the chunking depends on the
// shape only), then the chunks in order: no atomics, and many blocks even for short rows.
// Formulas are written with explicit _rn operations, so the compiler fuses nothing that
// kernels/cpu rounds separately.
#include "kernels/cuda/colsum.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define RMS_THREADS 256                 // a row's virtual threads
#define RMS_LANE_VTS (RMS_THREADS / 32)   // of them a lane plays in the warp-per-row kernels
#define HEAD_THREADS 128

// The terms of the two row sums, each one rounding (the same in every kernel).
template <typename X>
__device__ __forceinline__ double rms_sq_term(double acc, X x) {
    const double xc = tr_f32(x);
    return __fma_rn(xc, xc, acc);
}
template <typename X, typename G, typename A>
__device__ __forceinline__ double rms_dot_term(double acc, G g, A w, X x) {
    return __fma_rn(__dmul_rn((double)tr_f32(g), (double)tr_f32(w)), (double)tr_f32(x), acc);
}

// tr_block_sum over RMS_THREADS virtual threads, played by one warp: v[j] is virtual thread
// 32 j + lane's sum. Each virtual warp j takes the butterfly a real warp would, then the eight
// results the butterfly warp 0 takes over them (lanes past them adding 0.0), so the sum has
// tr_block_sum's bits; every lane gets it.
__device__ __forceinline__ double rms_warp_sum(double (&v)[RMS_LANE_VTS]) {
    const int lane = threadIdx.x & 31;
    double w0 = 0.0;
#pragma unroll
    for (int j = 0; j < RMS_LANE_VTS; j++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[j] += __shfl_xor_sync(0xffffffffu, v[j], o);
        if (lane == j) w0 = v[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) w0 += __shfl_xor_sync(0xffffffffu, w0, o);
    return w0;
}

// r = 1/sqrt(mean(x^2) + eps), the mean in double.
__device__ __forceinline__ float rms_rstd(double ss, int32_t C, float eps) {
    return (float)(1.0 / sqrt(ss / C + (double)eps));
}
// dx's coefficient of x: r^3 / C * sum_k g_k w_k x_k.
__device__ __forceinline__ float rms_coef(float rstd, double dot, int32_t C) {
    const double r = rstd;
    return (float)(r * r * r * dot / C);
}

// The element passes below take a thread's columns RMS_BATCH at a time, every load of a batch
// issued before its first store (a column past C loads the last one and stores nothing), so
// that a warp has many loads in flight rather than one column's at a time.
#define RMS_BATCH 8

// out = (x * r) * w. X: in's type, A: out's and w's. Columns c0, c0 + step, ...
template <typename X, typename A>
__device__ __forceinline__ void rms_scale(A *y, const X *x, const A *w, float r, int32_t C,
                                          int32_t c0, int32_t step) {
    for (int32_t c = c0; c < C; c += RMS_BATCH * step) {
        float xv[RMS_BATCH], wv[RMS_BATCH];
#pragma unroll
        for (int b = 0; b < RMS_BATCH; b++) {
            const int32_t k = min(c + b * step, C - 1);
            xv[b] = tr_f32(x[k]);
            wv[b] = tr_f32(w[k]);
        }
#pragma unroll
        for (int b = 0; b < RMS_BATCH; b++)
            if (c + b * step < C)
                tr_store(y + c + b * step, __fmul_rn(__fmul_rn(xv[b], r), wv[b]));
    }
}

// x as convert stores it (the bits tr_cuda_convert gives an fp32 value).
__device__ __forceinline__ void rms_store_converted(float *p, float x) { *p = x; }
__device__ __forceinline__ void rms_store_converted(tr_bf16 *p, float x) {
    *reinterpret_cast<uint16_t *>(p) = tr_bf16_bits(x);
}

// dx = r w g - coef x (g = dout), added into dx (F) when accumulate, else written (rounded once
// to dx's type); dx_act (accumulating only, or NULL) gets the new dx converted to A as well.
// Columns c0, c0 + step, ...
template <typename X, typename G, typename A>
__device__ __forceinline__ void rms_dx(X *dx, A *dx_act, const G *g, const X *x, const A *w,
                                       float rstd, float coef, int32_t C, bool accumulate,
                                       int32_t c0, int32_t step) {
    for (int32_t c = c0; c < C; c += RMS_BATCH * step) {
        float gv[RMS_BATCH], xv[RMS_BATCH], wv[RMS_BATCH], dv[RMS_BATCH];
#pragma unroll
        for (int b = 0; b < RMS_BATCH; b++) {
            const int32_t k = min(c + b * step, C - 1);
            gv[b] = tr_f32(g[k]);
            xv[b] = tr_f32(x[k]);
            wv[b] = tr_f32(w[k]);
            dv[b] = accumulate ? tr_f32(dx[k]) : 0.0f;
        }
#pragma unroll
        for (int b = 0; b < RMS_BATCH; b++) {
            const int32_t k = c + b * step;
            if (k >= C) break;
            const float a = __fmul_rn(__fmul_rn(rstd, wv[b]), gv[b]);
            const float d = __fsub_rn(a, __fmul_rn(coef, xv[b]));
            const float v = accumulate ? __fadd_rn(dv[b], d) : d;
            tr_store(dx + k, v);
            if (dx_act) rms_store_converted(dx_act + k, v);
        }
    }
}

// A row by a block of RMS_THREADS (HEAD_THREADS for the head norm: their own tree).
template <typename X, typename A>
__device__ void rms_row(A *y, float *rstd, const X *x, const A *w, float eps, int32_t C) {
    double ss = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) ss = rms_sq_term(ss, x[c]);
    float r = rms_rstd(tr_block_sum(ss), C, eps);
    if (threadIdx.x == 0) *rstd = r;
    rms_scale(y, x, w, r, C, threadIdx.x, blockDim.x);
}

template <typename X, typename G, typename A>
__device__ void rms_row_backward(X *dx, A *dx_act, const G *g, const X *x, const A *w,
                                 float rstd, int32_t C, bool accumulate) {
    double dot = 0.0;
    for (int32_t c = threadIdx.x; c < C; c += blockDim.x) dot = rms_dot_term(dot, g[c], w[c], x[c]);
    const float coef = rms_coef(rstd, tr_block_sum(dot), C);
    rms_dx(dx, dx_act, g, x, w, rstd, coef, C, accumulate, threadIdx.x, blockDim.x);
}

// Rows by warps, RMS_THREADS / 32 a block: lane l plays virtual threads 32 j + l, so column
// c = l + 32 m goes to j = m % 8, in ascending m (each virtual thread's columns in order).
// The row's sum of term(acc, c) over its C columns, tr_block_sum's bits; every lane gets it.
template <typename F>
__device__ __forceinline__ double rms_warp_row_sum(int32_t C, const F &term) {
    const int lane = threadIdx.x & 31;
    double v[RMS_LANE_VTS];
#pragma unroll
    for (int j = 0; j < RMS_LANE_VTS; j++) v[j] = 0.0;
    for (int32_t c0 = lane; c0 < C; c0 += RMS_THREADS)
#pragma unroll
        for (int j = 0; j < RMS_LANE_VTS; j++)
            if (c0 + 32 * j < C) v[j] = term(v[j], c0 + 32 * j);
    return rms_warp_sum(v);
}

// The warp's row of the launch (rows past T return at once, a whole warp at a time).
__device__ __forceinline__ int64_t rms_warp_row() {
    return ((int64_t)blockIdx.x * RMS_THREADS + threadIdx.x) >> 5;
}

template <typename A>
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_forward_warp_kernel(A *out, float *rstd, const float *in, const A *w, float eps,
                                int32_t T, int32_t C) {
    const int64_t row = rms_warp_row();
    if (row >= T) return;
    const float *x = in + row * C;
    const double ss = rms_warp_row_sum(C, [&](double acc, int32_t c) {
        return rms_sq_term(acc, x[c]);
    });
    const float r = rms_rstd(ss, C, eps);
    if ((threadIdx.x & 31) == 0) rstd[row] = r;
    rms_scale(out + row * C, x, w, r, C, threadIdx.x & 31, 32);
}

template <typename A>
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_backward_din_warp_kernel(float *din, A *din_act, const A *dout, const float *in,
                                     const A *w, const float *rstd, int32_t T, int32_t C) {
    const int64_t row = rms_warp_row();
    if (row >= T) return;
    const float *x = in + row * C;
    const A *g = dout + row * C;
    const double dot = rms_warp_row_sum(C, [&](double acc, int32_t c) {
        return rms_dot_term(acc, g[c], w[c], x[c]);
    });
    const float r = rstd[row];
    rms_dx(din + row * C, din_act ? din_act + row * C : din_act, g, x, w, r,
           rms_coef(r, dot, C), C, true, threadIdx.x & 31, 32);
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
__global__ void rmsnorm_backward_din_kernel(float *din, A *din_act, const A *dout,
                                            const float *in, const A *w, const float *rstd,
                                            int32_t C) {
    size_t row = (size_t)blockIdx.x * C;
    rms_row_backward(din + row, din_act ? din_act + row : din_act, dout + row, in + row, w,
                     rstd[blockIdx.x], C, true);
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
    rms_row_backward(din + at, (A *)NULL, dout + at, in + at, w, rstd[blockIdx.x], D, false);
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

// Rows per warp-per-row block; below TR_CUDA_DECODE_ROWS rows a block takes each row, so that
// a decode step's few rows still spread over the device.
#define RMS_WARP_ROWS (RMS_THREADS / 32)

template <typename A>
static void rmsnorm_forward_run(tr_backend *be, void *out, float *rstd, const float *in,
                                const void *w, float eps, int32_t T, int32_t C) {
    if (T > TR_CUDA_DECODE_ROWS) {
        rmsnorm_forward_warp_kernel<A>
            <<<(unsigned)((T + RMS_WARP_ROWS - 1) / RMS_WARP_ROWS), RMS_THREADS, 0,
               tr_cuda_stream(be)>>>((A *)out, rstd, in, (const A *)w, eps, T, C);
        TR_CUDA_LAUNCHED(be, "rmsnorm_forward");
        return;
    }
    // a decode step's: it may start early (TROUPE_CUDA_PDL)
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, true, rmsnorm_forward_kernel<A>, dim3((unsigned)T),
                                         dim3(RMS_THREADS), 0, (A *)out, rstd, in, (const A *)w,
                                         eps, C)))
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
static void rmsnorm_backward_run(tr_backend *be, float *din, void *din_act, float *dw,
                                 const void *dout, const float *in, const void *w,
                                 const float *rstd, int32_t T, int32_t C) {
    if (din && T > TR_CUDA_DECODE_ROWS) {
        rmsnorm_backward_din_warp_kernel<A>
            <<<(unsigned)((T + RMS_WARP_ROWS - 1) / RMS_WARP_ROWS), RMS_THREADS, 0,
               tr_cuda_stream(be)>>>(din, (A *)din_act, (const A *)dout, in, (const A *)w,
                                     rstd, T, C);
        if (TR_CUDA_LAUNCHED(be, "rmsnorm_backward din")) return;
    } else if (din) {
        rmsnorm_backward_din_kernel<A><<<T, RMS_THREADS, 0, tr_cuda_stream(be)>>>(
            din, (A *)din_act, (const A *)dout, in, (const A *)w, rstd, C);
        if (TR_CUDA_LAUNCHED(be, "rmsnorm_backward din")) return;
    }
    if (dw) norm_dw<A, float>(be, dw, (const A *)dout, in, rstd, T, 1, C, C);
}

void tr_cuda_rmsnorm_backward(tr_backend *be, float *din, void *din_act, float *dw,
                              const void *dout, const float *in, const void *w,
                              const float *rstd, int32_t T, int32_t C) {
    if (T <= 0 || C <= 0) return;
    if (tr_cuda_bf16(be))
        rmsnorm_backward_run<tr_bf16>(be, din, din_act, dw, dout, in, w, rstd, T, C);
    else
        rmsnorm_backward_run<float>(be, din, din_act, dw, dout, in, w, rstd, T, C);
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

