// The CUDA backend (NVIDIA Hopper, sm_90, bf16 or fp32): the tr_ops table of kernels/ops.h on
// one GPU, behind a C API so host code stays C11. Every pointer handed to an op is device memory,
// including the arrays inside tr_doc_layout (doc_start, pos), tr_kv_pages (pools) and the
// decode block_table / seq_len; the two structs themselves are host memory.
#pragma once
#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

// The tensor-core attention's softmax restarts every TR_CUDA_SOFTMAX_CHUNK positions of a
// row's context, the chunks folded in position order (attention_tile.cuh): a decode step
// splits its context at the same positions over its warps, and so equals the forward bit for
// bit. Shorter chunks give a decode step more warps; each edge costs the forward a fold (on
// an H200 at 128 positions: decode at batch 64, context 512, 26.8 -> 13.1 us; the 0.5B
// training forward's attention 0.417 -> 0.547 ms). 256 takes about half of each.
// TROUPE_CUDA_SOFTMAX_CHUNK (a multiple of 64 up to 4096) sets another for a process, whose
// training and generation then share it.
#define TR_CUDA_SOFTMAX_CHUNK 256

// Makes `device` current for the calling thread and creates the backend's stream and cuBLAS
// handle. precision sets be->act = be->wt: TR_BF16 (bf16 activations and working weights,
// cuBLASLt products with fp32 accumulation) or TR_F32 (fp32 everywhere, sgemm with pedantic
// math, never TF32). Ops run asynchronously on that stream, in call order; the calling
// thread must keep `device` current. Returns 0, or -1 with be->ops NULL: then
// tr_backend_cuda_status says why, and tr_backend_cuda_free releases what was made.
int tr_backend_cuda_init(tr_backend *be, int device, tr_dt precision, int batch_invariant);
void tr_backend_cuda_free(tr_backend *be);

// Ops return void, so the backend records the first CUDA or cuBLAS failure (launch or
// execution) and keeps it. This waits for the queued ops, then returns 0 if none failed, or
// -1 with the first failure's text (call site and CUDA message) copied into msg.
int tr_backend_cuda_status(tr_backend *be, char *msg, size_t cap);

// The backend's stream (a cudaStream_t) and device, for work queued in its order from outside
// the op table: NCCL collectives (engine/comm_nccl.c).
void *tr_backend_cuda_stream(tr_backend *be);
int tr_backend_cuda_device(tr_backend *be);

// The positions of a softmax chunk this backend's attention uses (TR_CUDA_SOFTMAX_CHUNK or
// the environment's).
int tr_backend_cuda_softmax_chunk(tr_backend *be);

// Makes every log-softmax and sample row take `ctas` blocks (1, 2 or 4; 0: as many as the
// launch's rows leave room for), for tests: the bits must not depend on it.
void tr_backend_cuda_force_row_ctas(tr_backend *be, int ctas);

// Turns the fused gate/up product and SwiGLU of a decode step on or off
// (TROUPE_CUDA_FUSED_SWIGLU=1 turns it on at start), for tests; and how many products have run
// fused so far.
void tr_backend_cuda_fused_swiglu(tr_backend *be, int on);
long tr_backend_cuda_fused_swiglu_runs(tr_backend *be);
// The prefetch op on (1; 2: evict-last lines) or off whatever TROUPE_CUDA_PREFETCH says (tests;
// -1 when its stream could not be made), and whether a prefetch waits to be joined.
int tr_backend_cuda_prefetch(tr_backend *be, int on);
long tr_backend_cuda_prefetch_pending(tr_backend *be);

// Ranks the sampler's top-k rows (k up to 1,024) by a select instead of sorting whole rows
// (the default; TROUPE_CUDA_TOPK_SELECT=0 clears it at start); the draws are the same either way.
void tr_backend_cuda_topk_select(tr_backend *be, int on);
// Decode attention's kernel: 1 the shared-chunk kernel wherever it runs (the backend's default
// softmax chunk, blocks of a power of two and aligned slots), 0 the per-warp walk, -1 the
// rule (the default: the shared chunk for grids under two blocks an SM and contexts up to
// 2,048 positions); TROUPE_CUDA_DECODE_COOP=0 or 1 sets it at start. Both give the same bits.
// Sets it and returns the one before.
int tr_backend_cuda_decode_coop(tr_backend *be, int mode);
// Decode attention's split walk: 1 wherever it fits, 2 for grids under two blocks an SM, 0
// never (the default; TROUPE_CUDA_DECODE_SPLIT=1 or 2 sets it at start). The walk then
// runs a block a chunk of a row's context, each publishing its chunk, and a second launch folds
// each row's chunks in position order: the same bits, with many blocks for a few long
// sequences. Where the shared-chunk kernel runs, it runs instead. Sets it and returns the one
// before (-1: its memory could not be made).
int tr_backend_cuda_decode_split(tr_backend *be, int mode);
// attention_decode_rope in one launch (1, the default) or as rope_kv_write and
// attention_decode in turn (0; TROUPE_CUDA_DECODE_ROPE=0 sets it at start): the same bits.
// Sets it and returns the one before.
int tr_backend_cuda_decode_rope(tr_backend *be, int on);
// The flash-attention passes that run on Hopper's warpgroup MMA rather than on their
// mma.sync kernels, which give the same bits: a mask of TR_CUDA_WG_* (TR_CUDA_WG_DEFAULT by
// default; TROUPE_CUDA_WGMMA=N sets N at start, 0 none). TR_CUDA_WG_FWD_PIPE makes the wgmma
// forward overlap its softmax with its products (attention_flash.cu, PIPE), the same bits
// again; TR_CUDA_WG_FWD_TMA brings the wgmma forward's key tiles by the tensor memory
// accelerator (fa_forward_tma_kernel) where a layout has no shared prefixes, and
// TR_CUDA_WG_DQ_TMA the dQ pass's (fa_dq_tma_kernel); TR_CUDA_WG_FWD_WIDE makes the TMA forward
// at D = 128 walk tiles of 64 keys, two softmax tiles each (fa_wide_tile, the same bits
// again), and TR_CUDA_WG_FWD_WIDE64 at D = 64 tiles of 128; TR_CUDA_WG_FWD_SMACC keeps the
// wide TMA forward's chunk accumulator in shared memory, at D = 128 in place of two of its
// four K/V stages (the same bits). The default has both TMA passes, the wide tiles and the
// shared accumulator: measured on an H200 the TMA copies take 6-14% off the forward and dQ, on
// an H100 the wide tiles 23-24% off the dense forward at D = 128 and 4% off packed rows at
// D = 64, and the shared accumulator 3-6% off the forward at both (bench/RESULTS.md). Sets it and returns the one before, which is 0 in a build
// without the wgmma kernels (a target other than sm_90a).
enum {
    TR_CUDA_WG_FWD = 1,
    TR_CUDA_WG_DQ = 2,
    TR_CUDA_WG_DKV = 4,
    TR_CUDA_WG_ALL = 7,
    TR_CUDA_WG_FWD_PIPE = 8,
    TR_CUDA_WG_FWD_TMA = 16,
    TR_CUDA_WG_DQ_TMA = 32,
    TR_CUDA_WG_FWD_WIDE = 64,
    TR_CUDA_WG_FWD_WIDE64 = 128,
    TR_CUDA_WG_FWD_SMACC = 256,
    TR_CUDA_WG_DEFAULT = 503,
    TR_CUDA_WG_MASK = 511,
};
int tr_backend_cuda_wgmma(tr_backend *be, int mask);

// With TROUPE_CUDA_PROFILE=1: forgets what the profile has summed so far (a benchmark calls it
// after its warm-up, so the table shows the steady state). Without it: nothing.
void tr_backend_cuda_profile_reset(tr_backend *be);

// Times every algorithm the cuBLASLt heuristic offers without split-K for one bf16 product
// D[m,n] = op(A)[m,k] op(B)[k,n] (ta, tb: 0 N, 1 T; D fp32 or bf16, added into or not, with a
// bias epilogue or not), each from a cold L2, one printed line each, the backend's choice
// marked. For
// studying the backend's fixed choice (bench_cuda gemm). Returns 0, or -1 (bf16 backends only).
int tr_backend_cuda_gemm_probe(tr_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k,
                               int d_f32, int accumulate, int bias, const char *label);

// A decode step's forward product out[T, OC] = x[T, IC] w[OC, IC]^T (+ bias) (bf16 out, or
// fp32 added into) on random data: the batch-invariant mode's plan timed, then each
// configuration of the sequential-k kernel (kernels/cuda/gemm_seqk.cu) that takes the shape
// and every cuBLASLt candidate of the shape itself, whole and split, each timed with the count
// of outputs whose bits differ from the batch-invariant plan's (bench_cuda gemm_decode).
// Returns 0 or -1.
int tr_backend_cuda_gemm_decode_probe(tr_backend *be, int64_t T, int64_t IC, int64_t OC,
                                      int out_f32, int accumulate, int bias, const char *label);

// The sequential-k kernel (kernels/cuda/gemm_seqk.cu) on one forward product out[T, OC] =
// x[T, IC] w[OC, IC]^T (+ bias, bf16 out only) (+ out when accumulate; not with bias), on
// device buffers (x, w bf16; out, ref, bias bf16, or fp32 with out_f32): ref by the batch-
// invariant mode's cuBLASLt plan (the training forward's algorithm), then out by the kernel
// in configuration cfg (0 .. tr_backend_cuda_seqk_configs() - 1; -1: its default for the
// shape). Both hold what is added to on entry. Returns 0, 1 when the kernel does not take the
// product or the configuration (out untouched, ref written), or -1 with the failure recorded
// (bf16 backends only). For test_cuda_ops, which compares both with a float64 reference and
// counts the outputs whose bits differ.
int tr_backend_cuda_seqk_check(tr_backend *be, void *out, void *ref, const void *x,
                               const void *w, const void *bias, int64_t T, int64_t IC,
                               int64_t OC, int out_f32, int accumulate, int cfg);
int tr_backend_cuda_seqk_configs(void);
// The configuration's tile, warps and stages in words (a string literal).
const char *tr_backend_cuda_seqk_name(int cfg);

#ifdef __cplusplus
}
#endif
