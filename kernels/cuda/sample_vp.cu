// Vocab-parallel sampling on the GPU, written for correctness before speed: a rank's lists
// are the heads of its rows fully sorted by (logit descending, id ascending) with CUB's stable
// segmented radix sort, as the sample op ranks; the walk and the pick are kernels/sample_vp.h's
// row functions, one thread per row, so their sums are sequential in the CPU's order (the
// walk of a rank's columns is then serial: its cost is the price of that order).
#include <limits.h>

#include "kernels/cuda/cub_sort.cuh"
#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/sample_vp.h"

#define SVP_THREADS 128

typedef struct svp_scratch {
    uint32_t *keys_in, *keys_out;
    int32_t *ids_in, *ids_out;   // ids_out: each row's column indices in rank order
    int32_t *begin, *end;        // [B] each row's segment
    void *temp;
    size_t temp_bytes, total;
} svp_scratch;

static size_t svp_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

static void *svp_at(void *base, size_t offset) {
    return base ? (void *)((char *)base + offset) : NULL;
}

// The sort's layout for B rows of V columns at base (NULL: sizes only). Returns -1 with the
// failure recorded when the rows exceed the sort's int range or CUB cannot size its storage.
static int svp_layout(tr_backend *be, int32_t B, int32_t V, void *base, svp_scratch *s) {
    size_t n = (size_t)B * (size_t)V;
    if (n > (size_t)INT_MAX) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "sample_vp_top",
                       "B * V logits exceed the segmented sort's int range");
        return -1;
    }
    s->temp_bytes = 0;
    if (TR_CUDA_CHECK(be, cub::DeviceSegmentedRadixSort::SortPairsDescending(
                              NULL, s->temp_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                              (const int32_t *)NULL, (int32_t *)NULL, (int)n, (int)B,
                              (const int32_t *)NULL, (const int32_t *)NULL, 0, 32,
                              tr_cuda_stream(be))))
        return -1;
    size_t arr = svp_align(n * sizeof(uint32_t)), seg = svp_align((size_t)B * sizeof(int32_t));
    s->keys_in = (uint32_t *)svp_at(base, 0);
    s->keys_out = (uint32_t *)svp_at(base, arr);
    s->ids_in = (int32_t *)svp_at(base, 2 * arr);
    s->ids_out = (int32_t *)svp_at(base, 3 * arr);
    s->begin = (int32_t *)svp_at(base, 4 * arr);
    s->end = (int32_t *)svp_at(base, 4 * arr + seg);
    s->temp = svp_at(base, 4 * arr + 2 * seg);
    s->total = 4 * arr + 2 * seg + svp_align(s->temp_bytes);
    return 0;
}

size_t tr_cuda_sample_vp_scratch_bytes(tr_backend *be, int32_t B, int32_t V, size_t n_cand) {
    if (B <= 0) return 0;
    svp_scratch s;
    size_t top = V > 0 && svp_layout(be, B, V, NULL, &s) == 0 ? s.total : 0;
    size_t pick = (n_cand + (size_t)B) * sizeof(int32_t);
    return top > pick ? top : pick;
}

// Unsigned key in the float's order; -0 is +0, so that ties of the two go to the lower id.
__device__ inline uint32_t svp_rank_key(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
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
            keys[base + i] = svp_rank_key(logits[base + i]);
            ids[base + i] = i;
        }
    }
}

// Each row's first k of the ranking as candidates; {-inf, -1} past its V columns.
__global__ void svp_lists_kernel(tr_sample_cand *cand, const float *logits, const int32_t *sorted,
                                 int32_t v0, int32_t B, int32_t V, int32_t k) {
    size_t n = (size_t)B * (size_t)k;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
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
    svp_scratch s;
    if (svp_layout(be, B, V, scratch, &s) != 0) return;
    cudaStream_t st = tr_cuda_stream(be);
    svp_keys_kernel<<<tr_cuda_grid((size_t)B, 1), SVP_THREADS, 0, st>>>(s.keys_in, s.ids_in, s.begin,
                                                                        s.end, logits, B, V);
    if (TR_CUDA_LAUNCHED(be, "sample_vp_top keys")) return;
    if (TR_CUDA_CHECK(be, cub::DeviceSegmentedRadixSort::SortPairsDescending(
                              s.temp, s.temp_bytes, s.keys_in, s.keys_out, s.ids_in, s.ids_out,
                              (int)((size_t)B * V), (int)B, s.begin, s.end, 0, 32, st)))
        return;
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
