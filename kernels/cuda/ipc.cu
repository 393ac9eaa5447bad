// CUDA IPC (ipc.h): cudaMalloc'd memory exported with cudaIpcGetMemHandle and mapped in another
// process with cudaIpcOpenMemHandle. The exporter zeroes the memory and waits for it, so an
// opener never sees what the allocation held before.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/ipc.h"

static_assert(sizeof(cudaIpcMemHandle_t) == TR_CUDA_IPC_HANDLE_BYTES, "CUDA IPC handle size");

static int fail(cudaError_t e, const char *what, char *msg, size_t msg_len) {
    cudaGetLastError();   // not sticky: the next call of this thread must not report it again
    if (msg_len) snprintf(msg, msg_len, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

extern "C" int tr_cuda_ipc_alloc(int device, size_t bytes, void **ptr, void *handle, char *msg, size_t msg_len) {
    *ptr = NULL;
    cudaIpcMemHandle_t h;
    void *p = NULL;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return fail(e, "cudaSetDevice", msg, msg_len);
    if ((e = cudaMalloc(&p, bytes ? bytes : 1)) != cudaSuccess) return fail(e, "cudaMalloc (shared weights)", msg, msg_len);
    if ((e = cudaMemset(p, 0, bytes)) != cudaSuccess || (e = cudaDeviceSynchronize()) != cudaSuccess ||
        (e = cudaIpcGetMemHandle(&h, p)) != cudaSuccess) {
        fail(e, "zeroing and exporting shared weights (cudaMemset, cudaIpcGetMemHandle)", msg, msg_len);
        cudaFree(p);
        return -1;
    }
    memcpy(handle, &h, sizeof h);
    *ptr = p;
    return 0;
}

extern "C" int tr_cuda_ipc_free(void *ptr, char *msg, size_t msg_len) {
    cudaError_t e = ptr ? cudaFree(ptr) : cudaSuccess;
    return e == cudaSuccess ? 0 : fail(e, "cudaFree (shared weights)", msg, msg_len);
}

extern "C" int tr_cuda_ipc_open(int device, const void *handle, void **ptr, char *msg, size_t msg_len) {
    *ptr = NULL;
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return fail(e, "cudaSetDevice", msg, msg_len);
    if ((e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
        *ptr = NULL;
        return fail(e, "cudaIpcOpenMemHandle (another process's weights)", msg, msg_len);
    }
    return 0;
}

extern "C" int tr_cuda_ipc_close(void *ptr, char *msg, size_t msg_len) {
    cudaError_t e = ptr ? cudaIpcCloseMemHandle(ptr) : cudaSuccess;
    return e == cudaSuccess ? 0 : fail(e, "cudaIpcCloseMemHandle", msg, msg_len);
}
