// Resharding: putting the weights of one tensor-parallel layout of a model into another (a
// trainer at tp a feeding a generator at tp b). Every tensor of a layout keeps its HF name,
// full shape and split (params.h), so what a receiving rank holds of a sending rank's part of
// a tensor is one block of rows and columns of the full tensor: one copy_2d moves it.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/params.h"
#include "kernels/ops.h"

// A hash of the tensors' names, dimensions and full shapes: the same for every tp of one
// model, different for another model, so two ranks can tell they hold the same model.
uint64_t tr_reshard_fingerprint(const tr_param_layout *l);

// The elements [off, off + n) of a buffer laid out as src (a sending rank's), held at part
// (backend memory): each element of a tensor src counts (params.h: every element of the
// model is counted on exactly one rank of a group) goes where dst holds it in dst_buf, by
// copy_2d in the backend's stream order. es: bytes per element of both buffers. src and dst
// must be layouts of one model (equal fingerprints).
void tr_reshard_range(tr_backend *be, const tr_param_layout *src, const void *part, size_t off, size_t n,
                      const tr_param_layout *dst, void *dst_buf, size_t es);

// Where a layout's part of tensor d lies in the full tensor, as rows [r0, r1) and columns
// [c0, c1) of it; a 1-D tensor is one row. The part is stored row-major, c1 - c0 wide.
typedef struct tr_rect {
    int64_t r0, r1, c0, c1;
} tr_rect;
tr_rect tr_reshard_part(const tr_tensor_desc *d);
// Columns of the full tensor (its row length in the rect view).
int64_t tr_reshard_full_cols(const tr_tensor_desc *d);
