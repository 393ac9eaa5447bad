// Tensor maps for the TMA copies of attention_tma.cuh: the driver's cuTensorMapEncodeTiled,
// reached through the runtime's entry-point lookup (the library links the CUDA runtime, never
// libcuda), once per backend.
#include <cudaTypedefs.h>

#include "kernels/cuda/attention_tma.cuh"
#include "kernels/cuda/cuda_ctx.cuh"

int tr_tma_map_bf16(tr_backend *be, CUtensorMap *map, const void *base, int64_t cols,
                    int64_t rows, int64_t ld, int32_t box_rows) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->tma_encode) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        void *fn = NULL;
        if (TR_CUDA_CHECK(be, cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn,
                                                               12000, cudaEnableDefault, &q)))
            return -1;
        if (q != cudaDriverEntryPointSuccess || !fn)
            return tr_cuda_record(ctx, __FILE__, __LINE__, "cuTensorMapEncodeTiled",
                                  "not in this driver");
        ctx->tma_encode = fn;
    }
    const cuuint64_t dim[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t pitch[1] = {(cuuint64_t)ld * sizeof(uint16_t)};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, step[2] = {1, 1};
    const CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)ctx->tma_encode)(
        map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dim, pitch, box,
        step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        char what[96];
        snprintf(what, sizeof what, "cuTensorMapEncodeTiled: error %d", (int)r);
        return tr_cuda_record(ctx, __FILE__, __LINE__, what, "a tensor map of K or V");
    }
    return 0;
}
