// Rotary position embedding (HF rotate_half layout) on the GPU, in place on H heads of D
// values in rows of stride ld (a fused [q;k;v] row is rotated where it lies). A block takes a
// few tokens: its threads first compute each (token, frequency) pair's cos and sin once into
// shared memory, then rotate every head's pair from there, so the trigonometry is done once
// a pair (not once a head) and no thread waits on it more than once. The angle is the fp32
// product pos * inv_freq as transformers computes it; cos and sin are taken in double and
// rounded, as kernels/cpu does, and the rotation is fp32 with explicit roundings (no fused
// multiply-add), rounded once to x's type. Generation's rope_kv_write is the same pass, whose
// threads of k's heads also store the rotated values and v's same columns into the KV cache:
// one launch where there were two, the same bits.
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

#define ROPE_THREADS 256
#define ROPE_MAX_HALF 256   // D / 2 at most (head dims to 512)
#define ROPE_TOKENS 8       // tokens a block, where the batch has enough of them
#define ROPE_FEW 2048       // fewer tokens than this: one a block, for more blocks
#define ROPE_UNROLL 4       // tokens whose loads a thread has in flight at once

// Where rope_kv_write puts a row's rotated k and its v: heads at and past hq are k's, written
// with v's to slot[t] of the pools (rows of (H - hq) * D), nothing for a negative slot.
template <typename A>
struct rope_kv {
    A *k_pool, *v_pool;
    const A *v;
    const int32_t *slot;
    int32_t hq;
};

// Tokens [blockIdx.x * TT, + TT): their pairs' cos and sin, then every (head, frequency)
// rotation of each token, consecutive threads on consecutive frequencies of a head. HALF
// is D / 2 where the launch knows it (32 and 64: the division by it a shift), else 0 (read
// from D); a flat index over tokens, heads and frequencies cost three divisions an element.
template <typename A, bool KV, int HALF>
__global__ void __launch_bounds__(ROPE_THREADS)
rope_kernel(A *x, int32_t ld, const int32_t *pos, const float *inv_freq, int32_t T, int32_t H,
            int32_t D, int32_t TT, float sign, rope_kv<A> kv) {
    extern __shared__ float rope_cs[];   // [TT][half] cos, then [TT][half] sin
    tr_pdl_wait();
    tr_pdl_release();
    const int32_t half = HALF ? HALF : D / 2, t0 = (int32_t)blockIdx.x * TT;
    const int32_t nt = T - t0 < TT ? T - t0 : TT;
    float *cs = rope_cs, *sn = rope_cs + TT * half;
    for (int32_t i = threadIdx.x; i < nt * half; i += blockDim.x) {
        const int32_t t = i / half, f = i % half;
        float angle = __fmul_rn((float)pos[t0 + t], inv_freq[f]);
        cs[i] = (float)cos((double)angle);
        sn[i] = sign * (float)sin((double)angle);
    }
    __syncthreads();
    const int32_t per_t = H * half;
    // A thread's (head, frequency) pairs in turn, each over the block's tokens ROPE_UNROLL at
    // a time, the loads of those tokens issued before the first store.
    for (int32_t j = threadIdx.x; j < per_t; j += blockDim.x) {
        const int32_t h = j / half, f = j % half;
        for (int32_t t = 0; t < nt; t += ROPE_UNROLL) {
            float a[ROPE_UNROLL], b[ROPE_UNROLL];
#pragma unroll
            for (int u = 0; u < ROPE_UNROLL; u++) {
                const A *x1 = x + (size_t)(t0 + min(t + u, nt - 1)) * ld + (size_t)h * D + f;
                a[u] = tr_f32(x1[0]);
                b[u] = tr_f32(x1[half]);
            }
#pragma unroll
            for (int u = 0; u < ROPE_UNROLL; u++) {
                const int32_t tu = t + u;
                if (tu >= nt) break;
                const float c = cs[tu * half + f], s = sn[tu * half + f];
                A *x1 = x + (size_t)(t0 + tu) * ld + (size_t)h * D + f, *x2 = x1 + half;
                tr_store(x1, __fsub_rn(__fmul_rn(a[u], c), __fmul_rn(b[u], s)));
                tr_store(x2, __fadd_rn(__fmul_rn(b[u], c), __fmul_rn(a[u], s)));
                const int32_t sl = KV ? kv.slot[t0 + tu] : -1;
                if (KV && h >= kv.hq && sl >= 0) {   // the values as stored, moved as they are
                    size_t to = ((size_t)sl * (H - kv.hq) + (h - kv.hq)) * D + f;
                    const A *vr = kv.v + (size_t)(t0 + tu) * ld + (size_t)(h - kv.hq) * D + f;
                    kv.k_pool[to] = *x1;
                    kv.k_pool[to + half] = *x2;
                    kv.v_pool[to] = vr[0];
                    kv.v_pool[to + half] = vr[half];
                }
            }
        }
    }
}

template <typename A>
static void rope_launch(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                        const float *inv_freq, int32_t T, int32_t H, int32_t D, float sign,
                        const tr_kv_pages *pages, const void *v, const int32_t *slot,
                        int32_t hq) {
    if (D / 2 > ROPE_MAX_HALF) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "rope", "head dim over 512");
        return;
    }
    // A decode step's few tokens take a block each, so that they spread over the device.
    const int32_t TT = T < ROPE_FEW ? 1 : ROPE_TOKENS;
    const unsigned grid = (unsigned)((T + TT - 1) / TT);
    const size_t shm = (size_t)2 * TT * (D / 2) * sizeof(float);
    rope_kv<A> kv = {NULL, NULL, NULL, NULL, H};
    if (pages) kv = {(A *)pages->k_pool, (A *)pages->v_pool, (const A *)v, slot, hq};
    void (*kernel)(A *, int32_t, const int32_t *, const float *, int32_t, int32_t, int32_t,
                   int32_t, float, rope_kv<A>) =
        D == 64    ? (pages ? rope_kernel<A, true, 32> : rope_kernel<A, false, 32>)
        : D == 128 ? (pages ? rope_kernel<A, true, 64> : rope_kernel<A, false, 64>)
                   : (pages ? rope_kernel<A, true, 0> : rope_kernel<A, false, 0>);
    if (TR_CUDA_CHECK(be, tr_cuda_launch(be, T <= TR_CUDA_DECODE_ROWS, kernel, dim3(grid),
                                         dim3(ROPE_THREADS), shm, (A *)x, ld, pos, inv_freq, T,
                                         H, D, TT, sign, kv)))
        return;
    if (pages) TR_CUDA_LAUNCHED(be, "rope_kv_write");
    else TR_CUDA_LAUNCHED(be, "rope");
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
