// Backend memory as the engine uses it: allocations whose failure names what they were for
// and how much the device had free, zeroing through the backend's fill, and the sync point
// that turns any earlier device failure into a tr_err naming where it surfaced.
#pragma once
#include <stddef.h>

#include "engine/err.h"
#include "kernels/ops.h"

// bytes of backend memory (device memory on a GPU) for `what`; NULL with err set (TR_ENOMEM,
// naming the bytes asked for and free) when there is not enough, or when
// TROUPE_DEVICE_FAULT=oom:... names this allocation (kernels/fault.h; pinned host ones too).
void *tr_dev_alloc(tr_backend *be, size_t bytes, const char *what, tr_err *err);
// The same, zero-filled (floats: bytes must be a multiple of 4).
void *tr_dev_zalloc(tr_backend *be, size_t bytes, const char *what, tr_err *err);
void tr_dev_free(tr_backend *be, void *p);
// Pinned host memory for staging transfers.
void *tr_dev_alloc_host(tr_backend *be, size_t bytes, const char *what, tr_err *err);
void tr_dev_free_host(tr_backend *be, void *p);
// Waits for the backend; a failure of anything queued so far becomes TR_EDEVICE, with
// `where` (the sync point) in the message.
int tr_dev_sync(tr_backend *be, const char *where, tr_err *err);
// Host -> backend and back, waiting for the copy (for set-up and I/O paths, not hot loops).
int tr_dev_upload_sync(tr_backend *be, void *dst, const void *src, size_t bytes,
                       const char *where, tr_err *err);
int tr_dev_download_sync(tr_backend *be, void *dst, const void *src, size_t bytes,
                         const char *where, tr_err *err);
// n fp32 values of host memory into dst, of dtype t in backend memory, converted on the device
// (through a bounded device scratch when t is not fp32); waits.
int tr_dev_upload_as(tr_backend *be, void *dst, tr_dt t, const float *src, size_t n,
                     const char *where, tr_err *err);
// n values of dtype t in backend memory into host fp32 (exact), waiting.
int tr_dev_download_as_f32(tr_backend *be, float *dst, const void *src, tr_dt t, size_t n,
                           const char *where, tr_err *err);
