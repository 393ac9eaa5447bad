// Rotary position embedding (HF rotate_half layout) on the GPU, in place on [T, H, D]: one
// thread per (token, head, frequency) pair. The angle is the fp32 product pos * inv_freq as
// transformers computes it; cos and sin are taken in double and rounded, as kernels/cpu does.
#include "kernels/cuda/cuda_ctx.cuh"

#define ROPE_THREADS 256

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int32_t T,
                            int32_t H, int32_t D, float sign) {
    int32_t half = D / 2;
    size_t n = (size_t)T * H * half;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int32_t f = (int32_t)(i % half);
        size_t row = i / half;   // t * H + h
        int32_t t = (int32_t)(row / H);
        float angle = __fmul_rn((float)pos[t], inv_freq[f]);
        float cs = (float)cos((double)angle), sn = sign * (float)sin((double)angle);
        float *x1 = x + row * D + f, *x2 = x1 + half;
        float a = *x1, b = *x2;
        *x1 = a * cs - b * sn;
        *x2 = b * cs + a * sn;
    }
}

static void rope_run(tr_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                     int32_t T, int32_t H, int32_t D, float sign) {
    size_t n = (size_t)T * H * (D / 2);
    if (T <= 0 || n == 0) return;
    rope_kernel<<<tr_cuda_grid(n, ROPE_THREADS), ROPE_THREADS, 0, tr_cuda_stream(be)>>>(
        x, pos, inv_freq, T, H, D, sign);
    TR_CUDA_LAUNCHED(be, "rope");
}

void tr_cuda_rope_forward(tr_backend *be, float *x, const int32_t *pos, const float *inv_freq,
                          int32_t T, int32_t H, int32_t D) {
    rope_run(be, x, pos, inv_freq, T, H, D, 1.0f);
}

// The transpose rotation (angle -> -angle).
void tr_cuda_rope_backward(tr_backend *be, float *dx, const int32_t *pos,
                           const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, dx, pos, inv_freq, T, H, D, -1.0f);
}
