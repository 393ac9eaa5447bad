// Linear layers on the GPU through cuBLAS sgemm (pedantic fp32 math, set at init). Row-major
// X[R,C] is column-major X^T, so each row-major product is issued as its transpose. The bias
// is added after the product, and its gradient sums columns over rows in order, in double.
#include "kernels/cuda/cuda_ctx.cuh"

#define MM_THREADS 256

__global__ void bias_add_kernel(float *out, const float *bias, int32_t T, int32_t OC) {
    size_t n = (size_t)T * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % (size_t)OC];
}

__global__ void bias_fill_kernel(float *out, const float *bias, int32_t T, int32_t OC) {
    size_t n = (size_t)T * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = bias ? bias[i % (size_t)OC] : 0.0f;
}

// One thread per column: consecutive threads read consecutive floats of a row.
__global__ void dbias_kernel(float *dbias, const float *dout, int32_t T, int32_t OC) {
    int32_t o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    double acc = 0.0;
    for (int32_t t = 0; t < T; t++) acc += dout[(size_t)t * OC + o];
    dbias[o] += (float)acc;
}

void tr_cuda_matmul_forward(tr_backend *be, float *out, const float *in, const float *w,
                            const float *bias, int32_t T, int32_t IC, int32_t OC) {
    if (T <= 0 || OC <= 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    size_t n = (size_t)T * OC;
    if (IC == 0) {   // the product of empty rows is zero; do not rely on sgemm with k = 0
        bias_fill_kernel<<<tr_cuda_grid(n, MM_THREADS), MM_THREADS, 0, st>>>(out, bias, T, OC);
        TR_CUDA_LAUNCHED(be, "matmul bias_fill");
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    // out^T[OC,T] = w[OC,IC] @ in^T[IC,T]; w is stored as w^T[IC,OC] column-major.
    if (TR_CUBLAS_CHECK(be, cublasSgemm(tr_cuda_ctx_of(be)->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC,
                                        T, IC, &one, w, IC, in, IC, &zero, out, OC)))
        return;
    if (bias) {
        bias_add_kernel<<<tr_cuda_grid(n, MM_THREADS), MM_THREADS, 0, st>>>(out, bias, T, OC);
        TR_CUDA_LAUNCHED(be, "matmul bias_add");
    }
}

void tr_cuda_matmul_backward(tr_backend *be, float *din, float *dw, float *dbias,
                             const float *dout, const float *in, const float *w, int32_t T,
                             int32_t IC, int32_t OC) {
    if (T <= 0 || OC <= 0) return;
    cublasHandle_t h = tr_cuda_ctx_of(be)->blas;
    const float one = 1.0f;
    if (din && IC > 0) {
        // din^T[IC,T] += w^T[IC,OC] @ dout^T[OC,T]
        if (TR_CUBLAS_CHECK(be, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, IC, T, OC, &one, w, IC,
                                            dout, OC, &one, din, IC)))
            return;
    }
    if (dw && IC > 0) {
        // dw^T[IC,OC] += in^T[IC,T] @ dout[T,OC]
        if (TR_CUBLAS_CHECK(be, cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, T, &one, in, IC,
                                            dout, OC, &one, dw, IC)))
            return;
    }
    if (dbias) {
        dbias_kernel<<<(OC + MM_THREADS - 1) / MM_THREADS, MM_THREADS, 0, tr_cuda_stream(be)>>>(
            dbias, dout, T, OC);
        TR_CUDA_LAUNCHED(be, "matmul dbias");
    }
}
