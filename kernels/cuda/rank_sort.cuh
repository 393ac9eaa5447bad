// The ranking both GPU samplers use (sample, sample_vp_top): rows of logits sorted by
// (logit descending, id ascending) with CUB's stable segmented radix sort over unsigned keys
// in the floats' order, each row a segment; the scratch it takes and its layout.
#pragma once
#include <limits.h>

#include "kernels/cuda/cub_sort.cuh"
#include "kernels/cuda/cuda_ctx.cuh"

// The sort's keys and ids in and out, each row's segment, CUB's storage.
typedef struct tr_rank_sort {
    uint32_t *keys_in, *keys_out;
    int32_t *ids_in, *ids_out;   // ids_out: each sorted row's ids in rank order
    int32_t *begin, *end;        // [B] each row's segment (empty: a row left unsorted)
    void *temp;
    size_t temp_bytes, total;
} tr_rank_sort;

static inline size_t tr_rank_sort_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

static inline void *tr_rank_sort_at(void *base, size_t offset) {
    return base ? (void *)((char *)base + offset) : NULL;
}

// The layout for B rows of V logits at base (NULL: sizes only). Returns -1 with the failure
// recorded (naming op) when the rows exceed the sort's int range or CUB cannot size its
// storage.
static inline int tr_rank_sort_layout(tr_backend *be, const char *op, int32_t B, int32_t V,
                                      void *base, tr_rank_sort *s) {
    size_t n = (size_t)B * (size_t)V;
    if (n > (size_t)INT_MAX) {
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, op,
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
    size_t arr = tr_rank_sort_align(n * sizeof(uint32_t));
    size_t seg = tr_rank_sort_align((size_t)B * sizeof(int32_t));
    s->keys_in = (uint32_t *)tr_rank_sort_at(base, 0);
    s->keys_out = (uint32_t *)tr_rank_sort_at(base, arr);
    s->ids_in = (int32_t *)tr_rank_sort_at(base, 2 * arr);
    s->ids_out = (int32_t *)tr_rank_sort_at(base, 3 * arr);
    s->begin = (int32_t *)tr_rank_sort_at(base, 4 * arr);
    s->end = (int32_t *)tr_rank_sort_at(base, 4 * arr + seg);
    s->temp = tr_rank_sort_at(base, 4 * arr + 2 * seg);
    s->total = 4 * arr + 2 * seg + tr_rank_sort_align(s->temp_bytes);
    return 0;
}

// Sorts the B rows' segments (keys descending; stable, so equal keys keep their id order).
static inline int tr_rank_sort_run(tr_backend *be, tr_rank_sort *s, int32_t B, int32_t V) {
    return TR_CUDA_CHECK(be, cub::DeviceSegmentedRadixSort::SortPairsDescending(
                                 s->temp, s->temp_bytes, s->keys_in, s->keys_out, s->ids_in,
                                 s->ids_out, (int)((size_t)B * V), (int)B, s->begin, s->end, 0,
                                 32, tr_cuda_stream(be)));
}

// Unsigned key in the float's order; -0 is +0, whose ties then go to the lower id.
__device__ inline uint32_t tr_rank_key(float x) {
    uint32_t u = __float_as_uint(x);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
