// The elementwise fp32 add on the GPU: out = a + b with one rounding per element (__fadd_rn,
// so nothing is fused), the CPU's bits. Sequence parallelism's residual stream takes a
// row-parallel projection's sum through it.
#include "kernels/cuda/cuda_ctx.cuh"

#define ADD_THREADS 256

__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __fadd_rn(a[i], b[i]);
}

void tr_cuda_add(tr_backend *be, float *out, const float *a, const float *b, size_t n) {
    if (n == 0) return;
    add_kernel<<<tr_cuda_grid(n, ADD_THREADS), ADD_THREADS, 0, tr_cuda_stream(be)>>>(out, a, b, n);
    TR_CUDA_LAUNCHED(be, "add");
}
