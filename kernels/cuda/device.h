// CUDA device discovery and error text for the CUDA backend: a C API over the runtime so
// that host code (C11) never includes CUDA headers. Returns 0 or a negative value on error,
// with a message in msg (when msg_len > 0) naming the failing call.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tr_cuda_device_info {
    char name[256];
    int32_t major, minor;          // compute capability
    int32_t n_sms;
    uint64_t total_mem;            // bytes
    uint64_t free_mem;             // bytes, at query time
} tr_cuda_device_info;

// Number of visible CUDA devices; 0 when there is no driver or no device (not an error).
int tr_cuda_device_count(void);
// Fills info for device `index`; returns 0, or -1 with msg set.
int tr_cuda_device_query(int index, tr_cuda_device_info *info, char *msg, size_t msg_len);

// Device memory on the current device, for tests, benchmarks and the engine's buffers.
// Copies are synchronous with respect to the host and ordered after every op already queued
// by a backend on that device. Each returns 0, or -1 with msg set.
int tr_cuda_alloc(void **ptr, size_t bytes, char *msg, size_t msg_len);
void tr_cuda_free(void *ptr);
int tr_cuda_copy_h2d(void *dst, const void *src, size_t bytes, char *msg, size_t msg_len);
int tr_cuda_copy_d2h(void *dst, const void *src, size_t bytes, char *msg, size_t msg_len);
int tr_cuda_zero(void *ptr, size_t bytes, char *msg, size_t msg_len);
// Waits for all work on the current device.
int tr_cuda_sync(char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
