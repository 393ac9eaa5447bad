// Top-k rows ranked without sorting the row: the sampler's walk reads a top-k row's first k
// positions of rank order only (sample.cu), so for k up to TR_TOPK_MAX one block finds them
// by a radix select and sorts just those. The select reads the row's keys (tr_rank_key, the
// sort's) four times, a byte of the k-th largest key a pass from the top (a histogram of the
// keys that share the bytes found so far); then one pass collects the keys above it and, of
// the keys equal to it, the lowest ids (each thread's contiguous ids counted, an ordered scan
// of the counts), and a bitonic sort of the k orders them by (key descending, id ascending):
// the first k of the stable segmented sort, entry for entry. A segmented radix sort of 64
// rows of 151,936 took 1.4 ms, the select 0.53 ms (H200, bench_cuda sample). Whether a row is
// selected (tr_cuda_ctx.topk_select, on unless TROUPE_CUDA_TOPK_SELECT=0) changes no draw:
// test_cuda_ops sample compares both.
#pragma once
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/rank_sort.cuh"

#define TR_TOPK_MAX 1024      // the largest k selected; larger ones are sorted whole
#define TR_TOPK_THREADS 512

__device__ inline bool tr_topk_selected(const tr_sample_row &r, int32_t V, bool on) {
    return on && r.temperature != 0.0f && r.top_k > 0 && r.top_k < V && r.top_k <= TR_TOPK_MAX;
}

// (key, id) as one word that orders as rank order does when compared descending: the key
// above, the id's complement below (a lower id ranks first among equal keys).
__device__ __forceinline__ unsigned long long tr_topk_word(uint32_t key, int32_t id) {
    return (unsigned long long)key << 32 | (uint32_t)~(uint32_t)id;
}

// The byte at `shift` of the k-th largest key among those matching pre under mask, and how
// many of rank k's keys remain to take below the bytes found (remain: on entry the rank
// among the matching keys). Every thread calls; every thread gets both.
template <typename A>
__device__ void tr_topk_digit(const A *x, int32_t V, uint32_t pre, uint32_t mask, int shift,
                              int32_t *remain, uint32_t *digit) {
    __shared__ uint32_t hist[256];
    __shared__ uint32_t s_digit;
    __shared__ int32_t s_remain;
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        // A warp's lanes of one byte add once (the top byte of a row's keys is often one
        // value for all of them): counts, in any order.
        const uint32_t key = tr_rank_key(tr_f32(x[i]));
        const bool in = (key & mask) == pre;
        const uint32_t bin = (key >> shift) & 255u;
        const unsigned grp = __match_any_sync(__activemask(), in ? bin : 0xffffffffu);
        if (in && (int)(threadIdx.x & 31) == __ffs(grp) - 1) atomicAdd(&hist[bin], __popc(grp));
    }
    __syncthreads();
    if (threadIdx.x < 32) {   // the bytes from 255 down, eight a lane
        const int lane = threadIdx.x;
        uint32_t c[8], tot = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            c[j] = hist[255 - (lane * 8 + j)];
            tot += c[j];
        }
        uint32_t inc = tot;   // the lanes' inclusive sums, in descending byte order
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t t = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += t;
        }
        const uint32_t want = (uint32_t)*remain;
        uint32_t cum = inc - tot;
        if (cum < want && want <= inc) {
#pragma unroll
            for (int j = 0; j < 8; j++) {
                if (cum + c[j] >= want) {
                    s_digit = 255u - (uint32_t)(lane * 8 + j);
                    s_remain = (int32_t)(want - cum);
                    break;
                }
                cum += c[j];
            }
        }
    }
    __syncthreads();
    *digit = s_digit;
    *remain = s_remain;
    __syncthreads();   // hist and the results are rewritten by the next call
}

// Sorts buf[0, P) descending (P a power of two up to TR_TOPK_MAX).
__device__ void tr_topk_bitonic(unsigned long long *buf, int32_t P) {
    for (int32_t size = 2; size <= P; size <<= 1)
        for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
            for (int32_t i = threadIdx.x; i < P / 2; i += blockDim.x) {
                const int32_t lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool down = (lo & size) == 0;   // this run's direction (the last: down)
                const unsigned long long a = buf[lo], b = buf[hi];
                if ((a < b) == down) {
                    buf[lo] = b;
                    buf[hi] = a;
                }
            }
            __syncthreads();
        }
}

// One block per row (grid-stride); rows not selected are left alone. Writes a selected row's
// first k keys and ids in rank order where the sort would (keys_out, ids_out at b * V).
template <typename A>
__global__ void __launch_bounds__(TR_TOPK_THREADS)
sample_topk_kernel(uint32_t *keys_out, int32_t *ids_out, const A *logits,
                   const tr_sample_row *rows, int32_t B, int32_t V) {
    __shared__ unsigned long long buf[TR_TOPK_MAX];
    __shared__ int32_t ties[TR_TOPK_THREADS];
    __shared__ int32_t s_n;
    const int32_t tid = threadIdx.x, nth = blockDim.x;
    for (int32_t b = blockIdx.x; b < B; b += gridDim.x) {
        const tr_sample_row row = rows[b];
        if (!tr_topk_selected(row, V, true)) continue;
        const A *x = logits + (size_t)b * V;
        const int32_t k = row.top_k;
        uint32_t pre = 0, mask = 0;
        int32_t remain = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            uint32_t d;
            tr_topk_digit(x, V, pre, mask, shift, &remain, &d);
            pre |= d << shift;
            mask |= 255u << shift;
        }
        // pre: the k-th largest key; k - remain keys are above it, and the remain lowest ids
        // of those equal to it complete the set
        if (tid == 0) s_n = 0;
        const int32_t per = (V + nth - 1) / nth;
        const int32_t i0 = min(V, tid * per), i1 = min(V, i0 + per);
        int32_t eq = 0;
        __syncthreads();
        for (int32_t i = i0; i < i1; i++) {
            const uint32_t key = tr_rank_key(tr_f32(x[i]));
            if (key > pre) buf[atomicAdd(&s_n, 1)] = tr_topk_word(key, i);   // slots: any order
            else if (key == pre) eq++;
        }
        ties[tid] = eq;
        __syncthreads();
        for (int32_t o = 1; o < nth; o <<= 1) {   // inclusive sums of the threads' ties
            const int32_t t = tid >= o ? ties[tid - o] : 0;
            __syncthreads();
            ties[tid] += t;
            __syncthreads();
        }
        int32_t rank = ties[tid] - eq;   // ties at lower ids
        for (int32_t i = i0; i < i1 && rank < remain; i++)
            if (tr_rank_key(tr_f32(x[i])) == pre) {
                buf[atomicAdd(&s_n, 1)] = tr_topk_word(pre, i);
                rank++;
            }
        __syncthreads();   // s_n == k
        int32_t P = 1;
        while (P < k) P <<= 1;
        for (int32_t i = k + tid; i < P; i += nth) buf[i] = 0;   // below every entry
        __syncthreads();
        tr_topk_bitonic(buf, P);
        const size_t base = (size_t)b * V;
        for (int32_t i = tid; i < k; i += nth) {
            keys_out[base + i] = (uint32_t)(buf[i] >> 32);
            ids_out[base + i] = (int32_t)~(uint32_t)buf[i];
        }
        __syncthreads();   // buf and ties are the next row's
    }
}
