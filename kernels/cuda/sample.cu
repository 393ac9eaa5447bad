// Token sampling on the GPU, written for correctness before speed: the rows that top-k or
// top-p rank are fully sorted by (logit descending, id ascending) with CUB's stable
// segmented radix sort, then one block per row takes the host sampler's steps (kernels/cpu/
// sample.c) in the same order: weights exp((z - max) / T) in double, the top-k set, top-p's
// cut, the total, and the walk of one Philox uniform, all prefix sums in rank order by a
// fixed-shape block scan. Sums group differently from the host's sequential ones, so a draw
// within TR_SAMPLE_NEAR of a boundary may pick a neighbouring id; those are counted. Logits
// are the activation dtype (float or bf16), widened exactly where they are read.
#include <limits.h>

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/logsoftmax_row.cuh"
#include "kernels/cuda/rank_sort.cuh"
#include "kernels/philox.h"

// The block shape of logsoftmax_forward, so that the logprobs are its bits.
#define SMP_THREADS TR_LSM_THREADS

size_t tr_cuda_sample_scratch_bytes(tr_backend *be, int32_t B, int32_t V) {
    tr_rank_sort s;
    if (B <= 0 || V <= 0 || tr_rank_sort_layout(be, "sample", B, V, NULL, &s) != 0) return 0;
    return s.total;
}

// ---- ranking ----

__device__ inline bool smp_use_k(const tr_sample_row &r, int32_t V) {
    return r.top_k > 0 && r.top_k < V;
}

__device__ inline bool smp_ranked(const tr_sample_row &r, int32_t V) {
    return r.temperature != 0.0f && (smp_use_k(r, V) || r.top_p < 1.0f);
}

// Keys and ids (0..V-1, so the stable descending sort leaves ties in id order) of the ranked
// rows, and every row's segment.
template <typename A>
__global__ void sample_keys_kernel(uint32_t *keys, int32_t *ids, int32_t *begin, int32_t *end,
                                   const A *logits, const tr_sample_row *rows, int32_t B,
                                   int32_t V) {
    for (int32_t b = blockIdx.x; b < B; b += gridDim.x) {
        bool ranked = smp_ranked(rows[b], V);
        size_t base = (size_t)b * V;
        if (threadIdx.x == 0) {
            begin[b] = (int32_t)base;
            end[b] = (int32_t)(ranked ? base + V : base);
        }
        if (!ranked) continue;
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            keys[base + i] = tr_rank_key(tr_f32(logits[base + i]));
            ids[base + i] = i;
        }
    }
}

// ---- block-wide steps of one row (every thread of the block calls each) ----

struct smp_op_min {
    __device__ int32_t operator()(int32_t a, int32_t b) const { return a < b ? a : b; }
};
struct smp_op_max {
    __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

// Greedy: the highest logit, the lowest id on ties (a total order, so any combining order
// finds the same winner: the row is read in the log-softmax's chunks).
__device__ inline void smp_better(float &bv, int32_t &bi, float v, int32_t i) {
    if (i != INT_MAX && (bi == INT_MAX || v > bv || (v == bv && i < bi))) {
        bv = v;
        bi = i;
    }
}

template <typename A>
__device__ int32_t smp_argmax(const A *x, int32_t V) {
    __shared__ float wv[32];
    __shared__ int32_t wi[32];
    float bv = -INFINITY;
    int32_t bi = INT_MAX;
    const bool vec = tr_lsm_aligned(x);
    float chunk[TR_LSM_CHUNK];
    for (int32_t c = threadIdx.x; c < tr_lsm_chunks(V); c += blockDim.x) {
        int32_t n = tr_lsm_load(x, V, c, vec, chunk);
#pragma unroll
        for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
            if (k < n) smp_better(bv, bi, chunk[k], c * TR_LSM_CHUNK + k);
    }
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(0xffffffffu, bv, o);
        int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
        smp_better(bv, bi, v, i);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    __syncthreads();
    if (lane == 0) {
        wv[warp] = bv;
        wi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? wv[lane] : -INFINITY;
        bi = lane < nw ? wi[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float v = __shfl_xor_sync(0xffffffffu, bv, o);
            int32_t i = __shfl_xor_sync(0xffffffffu, bi, o);
            smp_better(bv, bi, v, i);
        }
        if (lane == 0) wi[0] = bi;
    }
    __syncthreads();
    int32_t best = wi[0];
    __syncthreads();   // wi is reused by the next call
    return best;
}

// Inclusive scan of one value per thread in a fixed shape: shuffles within each warp, then
// warp 0 scans the warp totals. The same inputs give the same sums on every run.
__device__ inline double smp_block_scan(double v) {
    __shared__ double warp_sums[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    for (int o = 1; o < 32; o <<= 1) {
        double t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();   // warp_sums may still be read by the previous call
    if (lane == 31) warp_sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = lane < nw ? warp_sums[lane] : 0.0;
        for (int o = 1; o < 32; o <<= 1) {
            double u = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) t += u;
        }
        if (lane < nw) warp_sums[lane] = t;
    }
    __syncthreads();
    return warp > 0 ? v + warp_sums[warp - 1] : v;
}

// The kept weights in walk order: rank r is id order[r], or id r when order is NULL.
template <typename A>
struct smp_walk {
    const A *x;
    const int32_t *order;
    double mx, inv_t;
};

template <typename A>
__device__ inline int32_t smp_id(const smp_walk<A> &w, int32_t r) {
    return w.order ? w.order[r] : r;
}

template <typename A>
__device__ inline double smp_weight(const smp_walk<A> &w, int32_t r) {
    return exp(((double)tr_f32(w.x[smp_id(w, r)]) - w.mx) * w.inv_t);
}

// The first rank r < n whose inclusive prefix sum cum satisfies pred (r = n when none), that
// prefix (the whole sum when none) and the one before it (0 before rank 0). Chunks of one
// weight per thread, each chunk's sums carried on from the last sum of the chunk before.
struct smp_hit {
    int32_t r;
    double cum, before;
};

template <typename A, typename Pred>
__device__ smp_hit smp_scan_find(const smp_walk<A> &w, int32_t n, Pred pred) {
    __shared__ double cums[SMP_THREADS];
    smp_hit h = {n, 0.0, 0.0};
    double carry = 0.0;
    for (int32_t c0 = 0; c0 < n; c0 += blockDim.x) {
        int32_t r = c0 + (int32_t)threadIdx.x;
        double cum = carry + smp_block_scan(r < n ? smp_weight(w, r) : 0.0);
        cums[threadIdx.x] = cum;
        int32_t hit = (r < n && pred(cum)) ? r : INT_MAX;
        hit = tr_block_reduce(hit, smp_op_min(), (int32_t)INT_MAX);   // also publishes cums
        if (hit != INT_MAX) {
            h.r = hit;
            h.cum = cums[hit - c0];
            h.before = hit > c0 ? cums[hit - c0 - 1] : carry;
            break;
        }
        int32_t last = (n - c0 < (int32_t)blockDim.x ? n - c0 : (int32_t)blockDim.x) - 1;
        h.cum = cums[last];
        h.before = last > 0 ? cums[last - 1] : carry;
        carry = h.cum;
        __syncthreads();   // every thread has read cums before the next chunk writes it
    }
    __syncthreads();
    return h;
}

// The host sampler's draw for a row with temperature > 0 (kernels/cpu/sample.c, step by
// step); *near as the contract defines it. sorted: the row's ids in rank order when ranked.
template <typename A>
__device__ int32_t smp_draw(const A *x, int32_t V, const tr_sample_row &row, float mx,
                            const int32_t *sorted, bool *near) {
    bool use_k = smp_use_k(row, V), use_p = row.top_p < 1.0f;
    smp_walk<A> w = {x, use_k || use_p ? sorted : NULL, (double)mx,
                     1.0 / (double)row.temperature};
    int32_t n = use_k ? row.top_k : V;
    auto never = [](double) { return false; };
    bool cut_near = false;
    smp_hit h;
    if (use_p) {
        // the nucleus is measured against top-k's mass, else the whole row's (id order)
        double mass;
        if (use_k) {
            mass = smp_scan_find(w, n, never).cum;
        } else {
            double part = 0.0;
            for (int32_t i = threadIdx.x; i < V; i += blockDim.x)
                part += exp(((double)tr_f32(x[i]) - w.mx) * w.inv_t);
            mass = tr_block_sum(part);
        }
        double limit = (double)row.top_p * mass, tol = TR_SAMPLE_NEAR * mass;
        h = smp_scan_find(w, n, [limit](double cum) { return cum >= limit; });
        int32_t kept = h.r < n ? h.r + 1 : n;
        cut_near = fabs(h.cum - limit) <= tol || (kept >= 2 && limit - h.before <= tol);
        n = kept;
    } else {
        h = smp_scan_find(w, n, never);
    }
    double total = h.cum;   // the kept prefix, as the walk below sums it
    uint64_t counter = row.counter;
    int32_t used = row.used;
    uint32_t a = tr_philox_next(row.seed, &counter, &used);
    uint32_t b = tr_philox_next(row.seed, &counter, &used);
    double target = tr_philox_uniform53(a, b) * total, tol = TR_SAMPLE_NEAR * total;
    smp_hit d = smp_scan_find(w, n, [target](double cum) { return target < cum; });
    if (d.r < n) {
        *near = cut_near || d.cum - target <= tol || (d.r > 0 && target - d.before <= tol);
        return smp_id(w, d.r);
    }
    // Rounding left the target at the very top: the last kept rank with weight, else rank 0.
    *near = true;
    int32_t last = 0;
    for (int32_t r = 1 + threadIdx.x; r < n; r += blockDim.x)
        if (smp_weight(w, r) > 0.0) last = r;
    last = tr_block_reduce(last, smp_op_max(), (int32_t)0);
    return smp_id(w, last);
}

// One block of SMP_THREADS per row (grid-stride over rows).
template <typename A>
__global__ void sample_draw_kernel(int32_t *ids, float *logprob, int32_t *n_near,
                                   const A *logits, const tr_sample_row *rows,
                                   const int32_t *sorted, int32_t B, int32_t V) {
    for (int32_t b = blockIdx.x; b < B; b += gridDim.x) {
        const A *x = logits + (size_t)b * V;
        tr_sample_row row = rows[b];
        tr_lsm_stats st = tr_lsm_row(x, V);
        bool near = false;
        int32_t id = row.temperature == 0.0f
                         ? smp_argmax(x, V)
                         : smp_draw(x, V, row, st.m, sorted + (size_t)b * V, &near);
        if (threadIdx.x == 0) {
            ids[b] = id;
            logprob[b] = tr_lsm_logprob(x, id, tr_lsm_lse(st));
            if (near) atomicAdd((int *)n_near, 1);   // an integer count: order-free
        }
    }
}

// The two launches around the sort, for logits of type A.
template <typename A>
static void sample_run(tr_backend *be, tr_rank_sort &s, int32_t *ids, float *logprob,
                       const A *logits, const tr_sample_row *rows, int32_t B, int32_t V,
                       int32_t *n_near) {
    cudaStream_t st = tr_cuda_stream(be);
    unsigned grid = tr_cuda_grid((size_t)B, 1);
    sample_keys_kernel<A><<<grid, SMP_THREADS, 0, st>>>(s.keys_in, s.ids_in, s.begin, s.end,
                                                        logits, rows, B, V);
    if (TR_CUDA_LAUNCHED(be, "sample keys")) return;
    // Stable: equal keys keep the id order they came in.
    if (tr_rank_sort_run(be, &s, B, V)) return;
    sample_draw_kernel<A><<<grid, SMP_THREADS, 0, st>>>(ids, logprob, n_near, logits, rows,
                                                        s.ids_out, B, V);
    TR_CUDA_LAUNCHED(be, "sample");
}

void tr_cuda_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                    const tr_sample_row *rows, int32_t B, int32_t V, void *scratch,
                    int32_t *n_near) {
    if (B <= 0 || V <= 0) return;
    if (!scratch) {   // CUB would only size its storage and sort nothing
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "sample", "no scratch");
        return;
    }
    tr_rank_sort s;
    if (tr_rank_sort_layout(be, "sample", B, V, scratch, &s) != 0) return;
    if (tr_cuda_bf16(be))
        sample_run(be, s, ids, logprob, (const tr_bf16 *)logits, rows, B, V, n_near);
    else
        sample_run(be, s, ids, logprob, (const float *)logits, rows, B, V, n_near);
}
