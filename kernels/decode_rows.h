// A decode step's row advance (the decode_rows op, kernels/ops.h) as static inline functions
// for C and for CUDA device code (as kernels/philox.h), so that both backends take the same
// steps: the patch list read into a row's place, then the row's id, position, attended
// length, cache slot, document start and (tensor parallelism) embedding row. The host then
// sends only the rows that changed.
#pragma once
#include <stdint.h>

#include "kernels/ops.h"

#if defined(__CUDACC__)
#define TR_DR_FN static inline __host__ __device__
#else
#define TR_DR_FN static inline
#endif

// Where row r appears in patch ({k, then k triples (row, id, position)}, rows ascending):
// its triple's index, or -1, by bisection (after a prefill pass every row is in it).
TR_DR_FN int32_t tr_decode_patch_of(const int32_t *patch, int32_t r) {
    int32_t lo = 0, hi = patch[0];
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2, row = patch[1 + 3 * mid];
        if (row == r) return mid;
        if (row < r) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

// Row r of a decode step (see tr_decode_rows_args).
TR_DR_FN void tr_decode_row(const tr_decode_rows_args *a, int32_t r) {
    const int32_t k = tr_decode_patch_of(a->patch, r);
    int32_t id = k < 0 ? a->drawn[r] : a->patch[2 + 3 * k];
    int32_t p = k < 0 ? a->pos[r] + 1 : a->patch[3 + 3 * k];
    const int pad = p < 0;
    if (pad) {
        id = 0;
        p = 0;
    }
    a->ids[r] = id;
    a->pos[r] = p;
    a->len[r] = p + 1;
    a->slot[r] = pad ? -1 : a->tables[(int64_t)r * a->w + p / a->bs] * a->bs + p % a->bs;
    a->doc_start[r] = r;
    if (r == a->n - 1) a->doc_start[a->n] = a->n;
    if (a->emb_ids) a->emb_ids[r] = id - a->v0 >= 0 && id - a->v0 < a->V ? id - a->v0 : -1;
}
