// CUDA device discovery (see device.h). Every runtime call is checked; a machine without a
// driver reports zero devices instead of failing.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/device.h"

extern "C" int tr_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return n;
}

extern "C" int tr_cuda_device_query(int index, tr_cuda_device_info *info, char *msg,
                                    size_t msg_len) {
    memset(info, 0, sizeof *info);
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, index);
    if (e != cudaSuccess) {
        if (msg_len) snprintf(msg, msg_len, "cudaGetDeviceProperties(%d): %s", index,
                              cudaGetErrorString(e));
        return -1;
    }
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->major = prop.major;
    info->minor = prop.minor;
    info->n_sms = prop.multiProcessorCount;
    int prev = 0;
    if ((e = cudaGetDevice(&prev)) != cudaSuccess || (e = cudaSetDevice(index)) != cudaSuccess) {
        if (msg_len) snprintf(msg, msg_len, "cudaSetDevice(%d): %s", index, cudaGetErrorString(e));
        return -1;
    }
    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b);
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        if (msg_len) snprintf(msg, msg_len, "cudaMemGetInfo(%d): %s", index, cudaGetErrorString(e));
        return -1;
    }
    info->total_mem = total_b;
    info->free_mem = free_b;
    return 0;
}

static int cuda_fail(cudaError_t e, const char *what, size_t bytes, char *msg, size_t msg_len) {
    if (msg_len) snprintf(msg, msg_len, "%s (%zu bytes): %s", what, bytes, cudaGetErrorString(e));
    return -1;
}

extern "C" int tr_cuda_alloc(void **ptr, size_t bytes, char *msg, size_t msg_len) {
    *ptr = NULL;
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        return cuda_fail(e, "cudaMalloc", bytes, msg, msg_len);
    }
    return 0;
}

extern "C" void tr_cuda_free(void *ptr) {
    if (ptr) cudaFree(ptr);   // a failure here has no one to report to
}

// cudaMemcpy on the legacy default stream waits for the backends' (blocking) streams.
extern "C" int tr_cuda_copy_h2d(void *dst, const void *src, size_t bytes, char *msg,
                                size_t msg_len) {
    if (bytes == 0) return 0;
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy host to device", bytes, msg, msg_len);
}

extern "C" int tr_cuda_copy_d2h(void *dst, const void *src, size_t bytes, char *msg,
                                size_t msg_len) {
    if (bytes == 0) return 0;
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy device to host", bytes, msg, msg_len);
}

extern "C" int tr_cuda_zero(void *ptr, size_t bytes, char *msg, size_t msg_len) {
    if (bytes == 0) return 0;
    cudaError_t e = cudaMemset(ptr, 0, bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemset", bytes, msg, msg_len);
}

extern "C" int tr_cuda_sync(char *msg, size_t msg_len) {
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaDeviceSynchronize", 0, msg, msg_len);
}
