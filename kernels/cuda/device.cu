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
