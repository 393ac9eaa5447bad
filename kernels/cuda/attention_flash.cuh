// The tensor-core attention kernels of the bf16 path (attention_flash.cu forward,
// attention_flash_bwd.cu backward, attention_decode.cu decode), as attention.cu dispatches
// them: argument blocks and launchers. Other head dimensions and the fp32 path keep
// attention.cu's row kernels, for the forward and decode alike, so the two always agree.
// doc_start and prefix are tr_doc_layout's device arrays (prefix NULL: no shared prefixes).
#pragma once
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"

// Head dimensions with tensor-core kernels (forward, backward and decode).
static inline bool tr_fa_supported(int32_t D) { return D == 64 || D == 128; }

// log2(e) / sqrt(D): scores times this are the exponents of exp2 (double, then one rounding).
static inline float tr_fa_scale_log2(int32_t D) {
    return (float)(1.4426950408889634 / sqrt((double)D));
}

struct fa_fwd_args {
    tr_bf16 *out;
    float *lse;
    const tr_bf16 *q, *k, *v;
    const int32_t *doc_start;
    const int32_t *prefix;   // tr_doc_layout.prefix (NULL: none)
    int32_t n_docs, T, H, KVH, ld;
    float sl2;
    int32_t vec;    // q, k, v rows 16-byte aligned (ld a multiple of 8, aligned bases)
    int32_t out4;   // out 4-byte aligned
    int32_t chunk;  // softmax chunk positions (tr_cuda_ctx.softmax_chunk)
};

struct fa_bwd_args {
    tr_bf16 *dq, *dk, *dv;
    const tr_bf16 *dout, *out, *q, *k, *v;
    const float *lse;
    const int32_t *doc_start;
    const int32_t *prefix;   // tr_doc_layout.prefix (NULL: none)
    int32_t n_docs, T, H, KVH, ld;
    float scale, sl2;
    int32_t vec;      // every row read is 16-byte aligned
    int32_t st4;      // dq, dk, dv rows 4-byte aligned (even ld)
    float *delta;     // [T, H] rowsum(dO * O), written by the backward's first pass
    float *lse2;      // [T, H] lse log2(e), the same
};

struct fa_dec_args {
    tr_bf16 *out;
    const tr_bf16 *q, *kp, *vp;
    const int32_t *table, *seq_len;
    int32_t ld, block_size, KVH, H, D, max_blocks, n_hg;
    float sl2;
    int32_t vecq, veckv;   // q rows, K/V pool slots 16-byte aligned
    int32_t out4;          // out 4-byte aligned
    int32_t chunk;         // softmax chunk positions (tr_cuda_ctx.softmax_chunk)
    int32_t bs_log2;       // log2(block_size) when it is a power of two, else -1
    // attention_decode_rope (x non-NULL, one block per sequence and kv head): the block
    // rotates its query heads of x's row (q above is x) and the kv head's key at pos, writes
    // them back, and puts the key and v's row into slot's place of the pools first
    tr_bf16 *x;
    const tr_bf16 *v;
    const int32_t *pos, *slot;
    const float *inv_freq;
    // the split walk (part non-NULL): block z takes chunks z W .. z W + W - 1 of its rows and
    // publishes each at part[((b gridDim.x + blockIdx.x) part_chunks + c) slot floats]
    float *part;
    int32_t part_chunks;
};

void tr_fa_forward(tr_backend *be, const fa_fwd_args &a, int32_t D);
void tr_fa_backward(tr_backend *be, const fa_bwd_args &a, int32_t D);
void tr_fa_decode(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx);
// Whether tr_fa_decode splits a's launch (the split walk), which cannot rotate in its launch
// (attention_decode_rope then runs rope_kv_write first).
bool tr_fa_decode_splits(tr_backend *be, const fa_dec_args &a, int32_t B, int32_t max_ctx);
