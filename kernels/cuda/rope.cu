// Rotary position embedding (HF rotate_half layout) on the GPU, in place on H heads of D
// values in rows of stride ld (a fused [q;k;v] row is rotated where it lies): one thread per
// (token, frequency) pair, over every head, so that each cos and sin (taken in double) is
// computed once for all of a token's heads; at decode sizes one per head. The angle is the fp32 product pos * inv_freq as
// transformers computes it; cos and sin are taken in double and rounded, as kernels/cpu does,
// and the rotation is fp32 with explicit roundings (no fused multiply-add), rounded once to
// x's type.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define ROPE_THREADS 256
#define ROPE_PAIRS_SPLIT 65536   // (token, frequency) pairs below which heads split too

// Thread i takes pair (token, frequency) i / HG and heads [h0, h1) of group i % HG.
template <typename A>
__global__ void rope_kernel(A *x, int32_t ld, const int32_t *pos, const float *inv_freq,
                            int32_t T, int32_t H, int32_t D, int32_t HG, float sign) {
    int32_t half = D / 2, per = (H + HG - 1) / HG;
    size_t n = (size_t)T * half * HG;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int32_t g = (int32_t)(i % HG), f = (int32_t)(i / HG % half), t = (int32_t)(i / HG / half);
        float angle = __fmul_rn((float)pos[t], inv_freq[f]);
        float cs = (float)cos((double)angle), sn = sign * (float)sin((double)angle);
        A *row = x + (size_t)t * ld + f;
        int32_t h1 = (g + 1) * per < H ? (g + 1) * per : H;
        for (int32_t h = g * per; h < h1; h++) {
            A *x1 = row + (size_t)h * D, *x2 = x1 + half;
            float a = tr_f32(*x1), b = tr_f32(*x2);
            tr_store(x1, __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
            tr_store(x2, __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
        }
    }
}

static void rope_run(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                     const float *inv_freq, int32_t T, int32_t H, int32_t D, float sign) {
    size_t n = (size_t)T * (D / 2);
    if (T <= 0 || H <= 0 || n == 0) return;
    // A decode step's few rows give too few (token, frequency) pairs to fill the device: a
    // thread a head then (each recomputes the pair's cos and sin; the values are the same).
    int32_t HG = n < ROPE_PAIRS_SPLIT ? H : 1;
    n *= (size_t)HG;
    unsigned grid = tr_cuda_grid(n, ROPE_THREADS);
    cudaStream_t st = tr_cuda_stream(be);
    if (tr_cuda_bf16(be))
        rope_kernel<tr_bf16><<<grid, ROPE_THREADS, 0, st>>>((tr_bf16 *)x, ld, pos, inv_freq, T,
                                                            H, D, HG, sign);
    else
        rope_kernel<float><<<grid, ROPE_THREADS, 0, st>>>((float *)x, ld, pos, inv_freq, T, H, D,
                                                          HG, sign);
    TR_CUDA_LAUNCHED(be, "rope");
}

void tr_cuda_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, x, ld, pos, inv_freq, T, H, D, 1.0f);
}

// The transpose rotation (angle -> -angle).
void tr_cuda_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                           const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, dx, ld, pos, inv_freq, T, H, D, -1.0f);
}
