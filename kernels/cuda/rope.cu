// Rotary position embedding (HF rotate_half layout) on the GPU, in place on H heads of D
// values in rows of stride ld (a fused [q;k;v] row is rotated where it lies): one thread per
// (token, frequency) pair, over every head, so that each cos and sin (taken in double) is
// computed once for all of a token's heads; at decode sizes one per head. The angle is the
// fp32 product pos * inv_freq as transformers computes it; cos and sin are taken in double and
// rounded, as kernels/cpu does, and the rotation is fp32 with explicit roundings (no fused
// multiply-add), rounded once to x's type. Generation's rope_kv_write is the same pass, whose
// threads of k's heads also store the rotated values and v's same columns into the KV cache:
// one launch where there were two, the same bits.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define ROPE_THREADS 256
#define ROPE_PAIRS_SPLIT 65536   // (token, frequency) pairs below which heads split too

// Where rope_kv_write puts a row's rotated k and its v: heads at and past hq are k's, written
// with v's to slot[t] of the pools (rows of (H - hq) * D), nothing for a negative slot.
template <typename A>
struct rope_kv {
    A *k_pool, *v_pool;
    const A *v;
    const int32_t *slot;
    int32_t hq;
};

// Thread i takes pair (token, frequency) i / HG and heads [h0, h1) of group i % HG.
template <typename A, bool KV>
__global__ void rope_kernel(A *x, int32_t ld, const int32_t *pos, const float *inv_freq,
                            int32_t T, int32_t H, int32_t D, int32_t HG, float sign,
                            rope_kv<A> kv) {
    int32_t half = D / 2, per = (H + HG - 1) / HG;
    size_t n = (size_t)T * half * HG;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int32_t g = (int32_t)(i % HG), f = (int32_t)(i / HG % half), t = (int32_t)(i / HG / half);
        float angle = __fmul_rn((float)pos[t], inv_freq[f]);
        float cs = (float)cos((double)angle), sn = sign * (float)sin((double)angle);
        A *row = x + (size_t)t * ld + f;
        int32_t h1 = (g + 1) * per < H ? (g + 1) * per : H;
        int32_t s = KV ? kv.slot[t] : -1;
        for (int32_t h = g * per; h < h1; h++) {
            A *x1 = row + (size_t)h * D, *x2 = x1 + half;
            float a = tr_f32(*x1), b = tr_f32(*x2);
            tr_store(x1, __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn)));
            tr_store(x2, __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn)));
            if (KV && h >= kv.hq && s >= 0) {   // the values as stored, moved as they are
                size_t to = ((size_t)s * (H - kv.hq) + (h - kv.hq)) * D + f;
                const A *vr = kv.v + (size_t)t * ld + (size_t)(h - kv.hq) * D + f;
                kv.k_pool[to] = *x1;
                kv.k_pool[to + half] = *x2;
                kv.v_pool[to] = vr[0];
                kv.v_pool[to + half] = vr[half];
            }
        }
    }
}

template <typename A>
static void rope_launch(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                        const float *inv_freq, int32_t T, int32_t H, int32_t D, float sign,
                        const tr_kv_pages *pages, const void *v, const int32_t *slot,
                        int32_t hq) {
    size_t n = (size_t)T * (D / 2);
    // A decode step's few rows give too few (token, frequency) pairs to fill the device: a
    // thread a head then (each recomputes the pair's cos and sin; the values are the same).
    int32_t HG = n < ROPE_PAIRS_SPLIT ? H : 1;
    n *= (size_t)HG;
    unsigned grid = tr_cuda_grid(n, ROPE_THREADS);
    cudaStream_t st = tr_cuda_stream(be);
    rope_kv<A> kv = {NULL, NULL, NULL, NULL, H};
    if (pages) {
        kv = {(A *)pages->k_pool, (A *)pages->v_pool, (const A *)v, slot, hq};
        rope_kernel<A, true><<<grid, ROPE_THREADS, 0, st>>>((A *)x, ld, pos, inv_freq, T, H, D,
                                                             HG, sign, kv);
        TR_CUDA_LAUNCHED(be, "rope_kv_write");
        return;
    }
    rope_kernel<A, false><<<grid, ROPE_THREADS, 0, st>>>((A *)x, ld, pos, inv_freq, T, H, D, HG,
                                                          sign, kv);
    TR_CUDA_LAUNCHED(be, "rope");
}

// pages NULL: the rotation alone; else rope_kv_write's (H counts q's heads and k's, hq q's).
static void rope_run(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                     const float *inv_freq, int32_t T, int32_t H, int32_t D, float sign,
                     const tr_kv_pages *pages, const void *v, const int32_t *slot, int32_t hq) {
    if (T <= 0 || H <= 0 || D / 2 == 0) return;
    if (tr_cuda_bf16(be))
        rope_launch<tr_bf16>(be, x, ld, pos, inv_freq, T, H, D, sign, pages, v, slot, hq);
    else
        rope_launch<float>(be, x, ld, pos, inv_freq, T, H, D, sign, pages, v, slot, hq);
}

void tr_cuda_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, x, ld, pos, inv_freq, T, H, D, 1.0f, NULL, NULL, NULL, H);
}

// The transpose rotation (angle -> -angle).
void tr_cuda_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                           const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, dx, ld, pos, inv_freq, T, H, D, -1.0f, NULL, NULL, NULL, H);
}

void tr_cuda_rope_kv_write(tr_backend *be, void *x, const void *v, int32_t ld,
                           const int32_t *pos, const float *inv_freq, int32_t T, int32_t H,
                           const tr_kv_pages *kv, const int32_t *slot) {
    rope_run(be, x, ld, pos, inv_freq, T, H + kv->n_kv_heads, kv->head_dim, 1.0f, kv, v, slot,
             H);
}
