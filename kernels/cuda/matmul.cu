// Linear layers on the GPU. Row-major X[R,C] is column-major X^T, so each row-major product
// is issued as its transpose. fp32 backends run cuBLAS sgemm with pedantic math (true fp32
// products, never TF32); bf16 backends run cuBLASLt (gemm_lt.cu) on bf16 inputs with fp32
// accumulation, rounding a bf16 output once, after the bias (narrow heads in batch-invariant
// mode take a kernel of their own, below). Bias additions into fp32
// outputs and the bias gradient are kernels here, each element summed in a fixed order.
#include "kernels/cuda/colsum.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/gemm_lt.cuh"
#include "kernels/cuda/gemm_seqk.cuh"

#define MM_THREADS 256

// out[t, o] = bias[o] (0 without one) when fill, else out[t, o] += bias[o]; the sum in fp32
// and rounded once to out's type.
template <typename O, typename B>
__global__ void bias_kernel(O *out, const B *bias, int32_t T, int32_t OC, int fill) {
    size_t n = (size_t)T * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float b = bias ? tr_f32(bias[i % (size_t)OC]) : 0.0f;
        if (fill) tr_store(out + i, b);
        else tr_store(out + i, tr_f32(out[i]) + b);
    }
}

template <typename O, typename B>
static void bias_run(tr_backend *be, void *out, const void *bias, int32_t T, int32_t OC,
                     int fill) {
    size_t n = (size_t)T * OC;
    bias_kernel<O, B><<<tr_cuda_grid(n, MM_THREADS), MM_THREADS, 0, tr_cuda_stream(be)>>>(
        (O *)out, (const B *)bias, T, OC, fill);
    TR_CUDA_LAUNCHED(be, "matmul bias");
}

// The bias gradient's term: dout[t, o].
template <typename A>
struct dbias_term {
    const A *dout;
    int32_t OC;
    __device__ float operator()(int32_t t, int32_t o) const {
        return tr_f32(dout[(size_t)t * OC + o]);
    }
};

static void forward_f32(tr_backend *be, float *out, const float *in, const float *w,
                        const float *bias, int32_t T, int32_t IC, int32_t OC, int acc) {
    if (IC == 0) {   // the product of empty rows is zero; do not rely on sgemm with k = 0
        if (bias || !acc) bias_run<float, float>(be, out, bias, T, OC, !acc);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    // out^T[OC,T] (+)= w[OC,IC] @ in^T[IC,T]; w is stored as w^T[IC,OC] column-major.
    if (TR_CUBLAS_CHECK(be, cublasSgemm(tr_cuda_ctx_of(be)->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC,
                                        T, IC, &one, w, IC, in, IC, acc ? &one : &zero, out,
                                        OC)))
        return;
    if (bias) bias_run<float, float>(be, out, bias, T, OC, 0);
}

// Narrow products (OC <= MM_NARROW: value and score heads) in batch-invariant mode: one warp
// a row, each output a fixed-order sum (lane l takes k = l, l + 32, ... in order, then a
// butterfly) plus the bias, then the accumulator, rounded once: the same bits for any T.
// cuBLASLt's algorithm chosen at n = TR_CUDA_ANY_N need not run m = 1 at another n, and a shape's own
// choice could reduce in another order.
#define MM_NARROW 16
template <typename O>
__global__ void narrow_forward_kernel(O *out, const tr_bf16 *in, const tr_bf16 *w,
                                      const tr_bf16 *bias, int32_t T, int32_t IC, int32_t OC,
                                      int acc) {
    const int32_t t = (int32_t)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (t >= T) return;
    const tr_bf16 *x = in + (size_t)t * IC;
    for (int32_t o = 0; o < OC; o++) {
        const tr_bf16 *wr = w + (size_t)o * IC;
        float s = 0.0f;
        for (int32_t k = lane; k < IC; k += 32) s = __fmaf_rn(tr_f32(x[k]), tr_f32(wr[k]), s);
        for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
        if (lane != 0) continue;
        if (bias) s = __fadd_rn(s, tr_f32(bias[o]));
        O *y = out + (size_t)t * OC + o;
        tr_store(y, acc ? __fadd_rn(tr_f32(*y), s) : s);
    }
}

static void narrow_forward(tr_backend *be, void *out, const void *in, const void *w,
                           const void *bias, int32_t T, int32_t IC, int32_t OC, int out_f32,
                           int acc) {
    size_t threads = (size_t)T * 32;
    unsigned grid = (unsigned)((threads + MM_THREADS - 1) / MM_THREADS);
    if (out_f32)
        narrow_forward_kernel<float><<<grid, MM_THREADS, 0, tr_cuda_stream(be)>>>(
            (float *)out, (const tr_bf16 *)in, (const tr_bf16 *)w, (const tr_bf16 *)bias, T, IC,
            OC, acc);
    else
        narrow_forward_kernel<tr_bf16><<<grid, MM_THREADS, 0, tr_cuda_stream(be)>>>(
            (tr_bf16 *)out, (const tr_bf16 *)in, (const tr_bf16 *)w, (const tr_bf16 *)bias, T,
            IC, OC, acc);
    TR_CUDA_LAUNCHED(be, "matmul narrow");
}

// The cuBLASLt product of a bf16 forward: out^T[OC, T] = w[OC, IC] . in^T[IC, T] (+ x) (+ bias),
// out bf16 or fp32. Its key (and so its plan) is the same wherever the product is issued.
static tr_lt_gemm fwd_gemm(const tr_backend *be, void *out, const float *x, const void *in,
                           const void *w, const void *bias, int32_t T, int32_t IC, int32_t OC,
                           int out_f32) {
    return (tr_lt_gemm){.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N, .m = OC, .n = T, .k = IC,
                        .a = w, .lda = IC, .a_type = CUDA_R_16BF,
                        .b = in, .ldb = IC, .b_type = CUDA_R_16BF,
                        .d = out, .ldd = OC, .d_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF,
                        .accumulate = x != NULL, .c = x, .bias = bias,
                        .any_n = be->batch_invariant != 0,
                        .split_k = !be->batch_invariant && T <= TR_LT_SPLIT_MAX_N,
                        .timed = T <= TR_LT_TIMED_MAX_N, .name = "gemm fwd"};
}

// bf16 in and w; out bf16, or fp32 with TR_MM_OUT_F32 (always with x: out = x + the
// product). A bf16 output takes its bias in the GEMM's epilogue (fp32 sum, one rounding); an
// fp32 output adds it afterwards, the same fp32 sum. cuBLASLt's bias vector has the output's
// type, which an fp32 output's bf16 bias lacks. cuBLASLt reads x as C and writes out as D;
// the other paths add into out, which starts as a copy of x.
static void forward_bf16(tr_backend *be, void *out, const float *x, const void *in,
                         const void *w, const void *bias, int32_t T, int32_t IC, int32_t OC,
                         int out_f32) {
    const int acc = x != NULL;
    const bool cuda_lt = IC > 0 && !(be->batch_invariant && OC <= MM_NARROW);
    if (acc && !cuda_lt && out != x &&
        TR_CUDA_CHECK(be, cudaMemcpyAsync(out, x, (size_t)T * OC * sizeof(float),
                                          cudaMemcpyDeviceToDevice, tr_cuda_stream(be))))
        return;
    if (IC == 0) {
        if (!bias && acc) return;
        if (out_f32) bias_run<float, tr_bf16>(be, out, bias, T, OC, !acc);
        else bias_run<tr_bf16, tr_bf16>(be, out, bias, T, OC, !acc);
        return;
    }
    if (!cuda_lt) {
        narrow_forward(be, out, in, w, bias, T, IC, OC, out_f32, acc);
        return;
    }
    const tr_lt_gemm g = fwd_gemm(be, out, x, in, w, out_f32 ? NULL : bias, T, IC, OC, out_f32);
    if (tr_lt_matmul(be, &g)) return;
    if (out_f32 && bias) bias_run<float, tr_bf16>(be, out, bias, T, OC, 0);
}

void tr_cuda_matmul_forward(tr_backend *be, void *out, const void *in, const void *w,
                            const void *bias, int32_t T, int32_t IC, int32_t OC, int32_t flags) {
    if (T <= 0 || OC <= 0) return;
    if (tr_cuda_bf16(be))
        forward_bf16(be, out, NULL, in, w, bias, T, IC, OC, (flags & TR_MM_OUT_F32) != 0);
    else
        forward_f32(be, (float *)out, (const float *)in, (const float *)w, (const float *)bias,
                    T, IC, OC, 0);
}

// A decode step's gate/up product and SwiGLU as one kernel (TROUPE_CUDA_FUSED_SWIGLU=1; off by
// default: a 0.5B decode step at batch 64 ran 5% slower with it, bench/RESULTS.md): the
// sequential-k kernel's fastest configuration of the plan's bits, SwiGLU in its epilogue
// (gemm_seqk.cu), so act gets the bits of the product then swiglu_forward. Only in the
// batch-invariant mode, where the plan is the unsplit chain that kernel computes, and only
// once the plan has settled on the product's own data (its first run outside a recording,
// which takes the two ops); everywhere else, and for more than TR_MM_FUSED_GLU_MAX_N rows,
// where the kernel is slower than cuBLASLt, the two ops. gu is then written; fused, it is not.
#define TR_MM_FUSED_GLU_MAX_N 64
void tr_cuda_matmul_swiglu_forward(tr_backend *be, void *act, void *gu, const void *in,
                                   const void *w, int32_t T, int32_t IC, int32_t I) {
    if (T <= 0 || I <= 0) return;
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (tr_cuda_bf16(be) && ctx->fused_swiglu && be->batch_invariant && IC > 0 &&
        T <= TR_MM_FUSED_GLU_MAX_N && 2 * I > MM_NARROW) {
        const tr_lt_gemm g = fwd_gemm(be, gu, NULL, in, w, NULL, T, IC, 2 * I, 0);
        const int cfg = tr_lt_seqk_best(be, &g);
        const int run = cfg < 0 ? 1 : tr_gemm_seqk_swiglu(be, &g, I, act, cfg);
        if (run < 0) return;
        if (run == 0) {
            ctx->fused_swiglu_runs++;
            TR_CUDA_LAUNCHED(be, "gemm fwd swiglu");
            return;
        }
    }
    tr_cuda_matmul_forward(be, gu, in, w, NULL, T, IC, 2 * I, 0);
    tr_cuda_swiglu_forward(be, act, gu, T, I);
}

void tr_cuda_matmul_forward_add(tr_backend *be, float *out, const float *x, const void *in,
                                const void *w, const void *bias, int32_t T, int32_t IC,
                                int32_t OC) {
    if (T <= 0 || OC <= 0) return;
    if (tr_cuda_bf16(be)) {
        forward_bf16(be, out, x, in, w, bias, T, IC, OC, 1);
        return;
    }
    // sgemm adds into its output only: out starts as x
    if (out != x && TR_CUDA_CHECK(be, cudaMemcpyAsync(out, x, (size_t)T * OC * sizeof(float),
                                                      cudaMemcpyDeviceToDevice,
                                                      tr_cuda_stream(be))))
        return;
    forward_f32(be, out, (const float *)in, (const float *)w, (const float *)bias, T, IC, OC,
                1);
}

void tr_cuda_matmul_backward(tr_backend *be, void *din, float *dw, float *dbias,
                             const void *dout, const void *in, const void *w, int32_t T,
                             int32_t IC, int32_t OC) {
    if (T <= 0 || IC < 0 || OC < 0) return;
    int bf16 = tr_cuda_bf16(be);
    size_t esize = bf16 ? sizeof(tr_bf16) : sizeof(float);
    if (din && IC > 0 && OC == 0) {   // written: an empty sum is zero
        if (TR_CUDA_CHECK(be, cudaMemsetAsync(din, 0, (size_t)T * IC * esize,
                                              tr_cuda_stream(be))) ||
            TR_CUDA_LAUNCHED(be, "matmul_backward din zero"))
            return;
    } else if (din && IC > 0) {
        // din^T[IC,T] = w^T[IC,OC] @ dout^T[OC,T]
        if (bf16) {
            tr_lt_gemm g = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N, .m = IC, .n = T, .k = OC,
                            .a = w, .lda = IC, .a_type = CUDA_R_16BF,
                            .b = dout, .ldb = OC, .b_type = CUDA_R_16BF,
                            .d = din, .ldd = IC, .d_type = CUDA_R_16BF,
                            .accumulate = false, .bias = NULL, .name = "gemm dgrad"};
            if (tr_lt_matmul(be, &g)) return;
        } else {
            const float one = 1.0f, zero = 0.0f;
            if (TR_CUBLAS_CHECK(be, cublasSgemm(tr_cuda_ctx_of(be)->blas, CUBLAS_OP_N,
                                                CUBLAS_OP_N, IC, T, OC, &one, (const float *)w,
                                                IC, (const float *)dout, OC, &zero,
                                                (float *)din, IC)))
                return;
        }
    }
    if (dw && IC > 0 && OC > 0) {
        // dw^T[IC,OC] += in^T[IC,T] @ dout[T,OC]: bf16 inputs into the fp32 gradient
        if (bf16) {
            tr_lt_gemm g = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_T, .m = IC, .n = OC, .k = T,
                            .a = in, .lda = IC, .a_type = CUDA_R_16BF,
                            .b = dout, .ldb = OC, .b_type = CUDA_R_16BF,
                            .d = dw, .ldd = IC, .d_type = CUDA_R_32F,
                            .accumulate = true, .bias = NULL, .name = "gemm wgrad"};
            if (tr_lt_matmul(be, &g)) return;
        } else {
            const float one = 1.0f;
            if (TR_CUBLAS_CHECK(be, cublasSgemm(tr_cuda_ctx_of(be)->blas, CUBLAS_OP_N,
                                                CUBLAS_OP_T, IC, OC, T, &one, (const float *)in,
                                                IC, (const float *)dout, OC, &one, dw, IC)))
                return;
        }
    }
    // Column sums over the tokens in chunks (colsum.cuh): a chain one token at a time, as
    // kernels/cpu adds them, would leave all but OC threads of the device idle.
    if (dbias && OC > 0) {
        if (bf16)
            tr_colsum(be, dbias, dbias_term<tr_bf16>{(const tr_bf16 *)dout, OC}, T, OC,
                      "launch matmul dbias", "launch matmul dbias total");
        else
            tr_colsum(be, dbias, dbias_term<float>{(const float *)dout, OC}, T, OC,
                      "launch matmul dbias", "launch matmul dbias total");
    }
}
