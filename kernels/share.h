// Backend memory that two processes of one machine map at once: a trainer's working weights
// that a generator on the same device reads without a copy. On CUDA it is cudaMalloc'd memory
// exported as a CUDA IPC handle (kernels/cuda/ipc.h); on the CPU a POSIX shared-memory
// segment (kernels/cpu/share.c). Either way the handle is opaque bytes that travel in a
// control message, and the memory is the backend's like any allocation (ops take it).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#define TR_SHARE_HANDLE_MAX 96

typedef struct tr_share_handle {
    uint32_t len;                       // bytes used
    uint8_t bytes[TR_SHARE_HANDLE_MAX];
} tr_share_handle;

// bytes of zeroed backend memory that another process opens through *h; NULL with msg.
void *tr_share_alloc(tr_backend *be, size_t bytes, tr_share_handle *h, char *msg, size_t cap);
// Frees the memory tr_share_alloc made (on CUDA only after every opener has closed it).
int tr_share_free(tr_backend *be, void *p, char *msg, size_t cap);
// Maps another process's memory of `bytes` bytes from its handle; NULL with msg (a handle of
// the other backend, a size that does not match, memory already gone). One opener per handle.
void *tr_share_open(tr_backend *be, const tr_share_handle *h, size_t bytes, char *msg, size_t cap);
int tr_share_close(tr_backend *be, void *p, char *msg, size_t cap);
