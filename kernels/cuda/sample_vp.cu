// Vocab-parallel sampling on the GPU, written for correctness before speed: a rank's lists
// are the heads of its rows fully sorted by (logit descending, id ascending) as the sample op
// ranks them (kernels/cuda/rank_sort.cuh); the walk and the pick are kernels/sample_vp.h's
// row functions, one thread per row, so their sums are sequential in the CPU's order (the
// walk of a rank's columns is then serial: its cost is the price of that order).
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/rank_sort.cuh"
#include "kernels/sample_vp.h"

#define SVP_THREADS 128

size_t tr_cuda_sample_vp_scratch_bytes(tr_backend *be, int32_t B, int32_t V, size_t n_cand) {
    if (B <= 0) return 0;
    tr_rank_sort s;
    size_t top = 0;
    if (V > 0 && tr_rank_sort_layout(be, "sample_vp_top", B, V, NULL, &s) == 0) top = s.total;
    size_t pick = (n_cand + (size_t)B) * sizeof(int32_t);
    return top > pick ? top : pick;
}

// Keys and column indices (0..V-1: the stable descending sort leaves ties in id order) and
// each row's segment.
__global__ void svp_keys_kernel(uint32_t *keys, int32_t *ids, int32_t *begin, int32_t *end,
                                const float *logits, int32_t B, int32_t V) {
    for (int32_t b = blockIdx.x; b < B; b += gridDim.x) {
        size_t base = (size_t)b * V;
        if (threadIdx.x == 0) {
            begin[b] = (int32_t)base;
            end[b] = (int32_t)(base + V);
        }
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            keys[base + i] = tr_rank_key(logits[base + i]);
            ids[base + i] = i;
        }
    }
}

// Each row's first k of the ranking as candidates; {-inf, -1} past its V columns.
__global__ void svp_lists_kernel(tr_sample_cand *cand, const float *logits, const int32_t *sorted,
                                 int32_t v0, int32_t B, int32_t V, int32_t k) {
    size_t n = (size_t)B * (size_t)k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t b = i / (size_t)k, j = i % (size_t)k;
        tr_sample_cand c = {-INFINITY, -1};
        if (j < (size_t)V) {
            int32_t col = sorted[b * V + j];
            c.logit = logits[b * V + col];
            c.id = v0 + col;
        }
        cand[i] = c;
    }
}

void tr_cuda_sample_vp_top(tr_backend *be, tr_sample_cand *cand, const float *logits, int32_t v0,
                           int32_t B, int32_t V, int32_t k, void *scratch) {
    if (B <= 0 || V <= 0 || k <= 0) return;
    if (!scratch) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "sample_vp_top", "no scratch");
        return;
    }
    tr_rank_sort s;
    if (tr_rank_sort_layout(be, "sample_vp_top", B, V, scratch, &s) != 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    svp_keys_kernel<<<tr_cuda_grid((size_t)B, 1), SVP_THREADS, 0, st>>>(s.keys_in, s.ids_in, s.begin,
                                                                        s.end, logits, B, V);
    if (TR_CUDA_LAUNCHED(be, "sample_vp_top keys")) return;
    if (tr_rank_sort_run(be, &s, B, V)) return;
    size_t n = (size_t)B * (size_t)k;
    svp_lists_kernel<<<tr_cuda_grid(n, SVP_THREADS), SVP_THREADS, 0, st>>>(cand, logits, s.ids_out, v0,
                                                                           B, V, k);
    TR_CUDA_LAUNCHED(be, "sample_vp_top");
}

__global__ void svp_scan_kernel(double *sum, int32_t *hit, const float *logits,
                                const tr_sample_row *rows, const tr_sample_cand *cand,
                                const double *carry, const double *total, int32_t R, int32_t k,
                                int32_t v0, int32_t B, int32_t V) {
    for (int32_t b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
        if (rows[b].temperature == 0.0f) continue;
        tr_svp_scan_row(logits + (size_t)b * V, V, v0, &rows[b], tr_svp_max(cand, R, k, B, b),
                        carry ? carry[b] : 0.0, total ? total[b] : 0.0, &sum[b],
                        total ? hit + (size_t)b * 3 : NULL);
    }
}

void tr_cuda_sample_vp_scan(tr_backend *be, double *sum, int32_t *hit, const float *logits,
                            const tr_sample_row *rows, const tr_sample_cand *cand,
                            const double *carry, const double *total, int32_t R, int32_t k,
                            int32_t v0, int32_t B, int32_t V) {
    if (B <= 0 || V <= 0) return;
    svp_scan_kernel<<<tr_cuda_grid((size_t)B, SVP_THREADS), SVP_THREADS, 0, tr_cuda_stream(be)>>>(
        sum, hit, logits, rows, cand, carry, total, R, k, v0, B, V);
    TR_CUDA_LAUNCHED(be, "sample_vp_scan");
}

__global__ void svp_pick_kernel(int32_t *ids, int32_t *n_near, const tr_sample_cand *cand,
                                const int32_t *hit, const double *mass, const tr_sample_row *rows,
                                int32_t R, int32_t k, int32_t B, int32_t V, int32_t *order) {
    for (int32_t b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
        bool near = false;
        ids[b] = tr_svp_pick_row(cand, hit, mass, &rows[b], R, k, B, b, V,
                                 order + (size_t)b * R * k, &near);
        if (near) atomicAdd((int *)n_near, 1);   // an integer count: order-free
    }
}

void tr_cuda_sample_vp_pick(tr_backend *be, int32_t *ids, int32_t *n_near,
                            const tr_sample_cand *cand, const int32_t *hit, const double *mass,
                            const tr_sample_row *rows, int32_t R, int32_t k, int32_t B, int32_t V,
                            void *scratch) {
    if (B <= 0) return;
    if (!scratch) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "sample_vp_pick", "no scratch");
        return;
    }
    svp_pick_kernel<<<tr_cuda_grid((size_t)B, SVP_THREADS), SVP_THREADS, 0, tr_cuda_stream(be)>>>(
        ids, n_near, cand, hit, mass, rows, R, k, B, V, (int32_t *)scratch);
    TR_CUDA_LAUNCHED(be, "sample_vp_pick");
}
