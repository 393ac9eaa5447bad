// CUDA IPC for the CUDA backend: device memory one process allocates and exports as a handle,
// and another process on the same GPU maps from that handle, so a generator reads a trainer's
// working weights without a copy. A C API over the runtime (host code stays C11); every call
// is checked, and each function returns 0, or -1 with msg naming the failing call.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// The bytes of a CUDA IPC handle (cudaIpcMemHandle_t).
#define TR_CUDA_IPC_HANDLE_BYTES 64

// On `device`: bytes of zeroed device memory at *ptr and its handle (TR_CUDA_IPC_HANDLE_BYTES
// written to handle). Free it with tr_cuda_ipc_free once every other process has closed it.
int tr_cuda_ipc_alloc(int device, size_t bytes, void **ptr, void *handle, char *msg, size_t msg_len);
int tr_cuda_ipc_free(void *ptr, char *msg, size_t msg_len);
// Maps the memory of another process's handle on `device` (peer access enabled when the
// memory lives on another GPU) at *ptr; tr_cuda_ipc_close unmaps it.
int tr_cuda_ipc_open(int device, const void *handle, void **ptr, char *msg, size_t msg_len);
int tr_cuda_ipc_close(void *ptr, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
