// A decode step's row advance (the decode_rows op, kernels/ops.h) as static inline functions
// for C and for CUDA device code (as kernels/philox.h), so that both backends take the same
// steps: the patch list read into a row's place, then the row's id, position, attended
// length, cache slot and document start. The host then sends only the rows that changed.
#pragma once
#include <stdint.h>

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

// Row r of a decode step of n rows (see decode_rows).
TR_DR_FN void tr_decode_row(int32_t *ids, int32_t *pos, int32_t *slot, int32_t *len,
                            int32_t *doc_start, const int32_t *drawn, const int32_t *patch,
                            const int32_t *tables, int32_t w, int32_t bs, int32_t n, int32_t r) {
    const int32_t k = tr_decode_patch_of(patch, r);
    int32_t id = k < 0 ? drawn[r] : patch[2 + 3 * k];
    int32_t p = k < 0 ? pos[r] + 1 : patch[3 + 3 * k];
    const int pad = p < 0;
    if (pad) {
        id = 0;
        p = 0;
    }
    ids[r] = id;
    pos[r] = p;
    len[r] = p + 1;
    slot[r] = pad ? -1 : tables[(int64_t)r * w + p / bs] * bs + p % bs;
    doc_start[r] = r;
    if (r == n - 1) doc_start[n] = n;
}
