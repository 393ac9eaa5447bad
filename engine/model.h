// The engine's transformer: a Llama-family decoder (RMSNorm, GQA attention with RoPE and, for
// Qwen3, a per-head RMSNorm of q and k, SwiGLU) written once against the backend op table.
// Parameters, gradients and activations each live in one buffer sized at init; forward and
// backward allocate nothing. The activation buffer
// may be the caller's (a worker arena, engine/arena.h), over which the views are laid out
// again for each phase. The trunk ends at the final RMSNorm; heads.h turns its output into
// logprobs, values or scores. Under tensor parallelism (engine/tp.h) a model is one rank's
// shard: its heads, channels and vocabulary rows, with the all-reduces Megatron places; with
// sequence parallelism the residual stream and the norms hold the rank's rows of the batch,
// and reduce-scatters and all-gathers take the all-reduces' place.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/comm.h"
#include "engine/config.h"
#include "engine/err.h"
#include "engine/params.h"
#include "engine/tp.h"
#include "kernels/ops.h"

// Saved activations of one decoder layer; rows are tokens, views into the arena. A: the
// backend's activation dtype (void *), F: fp32 (ops.h). Under sequence parallelism the
// buffers marked [Ts, ..] hold the rank's rows of the batch (tr_model's sp_rows), the rest
// all T rows.
typedef struct tr_layer_acts {
    void *ln1;         // A [Ts, C] input_layernorm output
    float *ln1_rstd;   // F [Ts]
    void *qkv;         // A [T, QKV] the fused projection's output (QKV = Q + 2K); q and k
                       // get RoPE in place (without QK-norm: what attention saw)
    void *qkv_n;       // A [T, QKV] QK-norm only: q and k after the per-head norm and RoPE
                       // (v columns unused), the projection's raw rows staying in qkv
    float *q_rstd;     // F [T, H] per-head norm statistics (QK-norm only)
    float *k_rstd;     // F [T, KVH]
    void *q, *k, *v;   // what attention reads: rows of stride QKV inside qkv / qkv_n
    void *att;         // A [T, Q] attention output, before o_proj
    float *att_lse;    // F [T, H]
    float *res_mid;    // F [Ts, C] residual stream after the attention block
    void *ln2;         // A [Ts, C] post_attention_layernorm output
    float *ln2_rstd;   // F [Ts]
    void *gu;          // A [T, 2I] the fused [gate; up] projection's output
    void *act;         // A [T, I] silu(gate) * up
} tr_layer_acts;

typedef struct tr_acts {
    float **residual;      // F [Ts, C], n_layers + 1 pointers: [l] is layer l's input, [L] the
                           // last output
    tr_layer_acts *layers; // n_layers entries (all alias one set in the inference layout)
    void *lnf;             // A [T, C] final norm output: the input of every head (under
                           // sequence parallelism gathered from every rank's rows)
    float *lnf_rstd;       // F [Ts]
    void *logits;          // A [logit_rows, V] one chunk of LM-head logits as the GEMM rounds
                           // them (as transformers' autocast does), which the log-softmax and
                           // the sampler read; the backward overwrites them with d_logits
                           // (LM head only)
    float *lse;            // F [T] log-sum-exp of each token's logits (LM head only)
    float *head_out;       // F [T, num_labels] value/score projection of every token
    // Backward scratch (training layout only), reused by every layer. Activation gradients
    // are written by their one producer; only the residual stream's gradient accumulates.
    float *d_res;          // F [Ts, C] gradient of the residual stream
    void *d_res_a;         // A [T, C] d_res in the activation dtype, the o_proj/down_proj
                           // GEMMs' input (d_res itself when A is fp32; under sequence
                           // parallelism every rank's rows gathered)
    void *d_lnf;           // A [T, C] gradient of lnf, written by the head backward functions
    void *d_ln;            // A [T, C] gradient of a norm output (aliases d_lnf: never both live)
    void *d_qkv;           // A [T, QKV] gradient of the fused projection's output
    void *d_qkv_n;         // A [T, QKV] QK-norm only: gradient of q and k after the norm
    void *d_att;           // A [T, Q]
    void *d_gu, *d_act;    // A [T, 2I], [T, I]
    float *d_head_out;     // F [T, num_labels] the heads' output gradient as uploaded
    void *d_head_out_a;    // A [T, num_labels] the same in the activation dtype
    // Tensor parallelism only (NULL otherwise):
    double *vp_stats;      // [tp, logit_rows, 4] every rank's vocab-parallel log-softmax
                           // statistics of one chunk, gathered (LM head)
    double *vp_mean;       // [T] E_p[logits] of each row, for the backward (LM head, training)
    float *tp_red;         // F [T, C] an activation gradient widened for its all-reduce
                           // (training, A not fp32; sp_red under sequence parallelism)
    // Sequence parallelism only (NULL otherwise):
    void *sp_ln;           // A [T, C] a norm's output gathered from every rank's rows: the
                           // input of a column-parallel projection, forward and backward
    float *sp_red;         // F [T, C] a row-parallel projection's (or the embedding's) parts
                           // before their reduce-scatter; in backward the residual gradient
                           // gathered for the embedding's
} tr_acts;

typedef struct tr_model {
    tr_model_config cfg;
    tr_tp tp;                   // this rank's tensor-parallel shape (size 1: the whole model)
    tr_model_config lcfg;       // cfg with this rank's heads and intermediate size
    tr_comm *tp_comm;           // the tensor-parallel group (not owned); NULL at size 1
    tr_param_layout layout;     // this rank's tensors
    tr_backend *be;             // not owned
    tr_dt act, wt;           // the backend's activation and working-weight dtypes
    // Backend memory (device memory on a GPU): host code never reads or writes these but
    // through the backend (ops, upload/download), which guarded CPU mode enforces.
    float *params;              // fp32 masters, layout.total; NULL for a model that never
                                // trains when its working weights are not fp32
    void *work;                 // working weights (dtype wt) the passes read; == params
                                // when wt is fp32, unless they are external
    bool external_work;         // work is the caller's (tr_model_bind_work), never freed here
    float *grads;               // layout.total floats, NULL unless training
    tr_params w;                // views into work
    tr_params g;                // views into grads (all NULL unless training; fp32)
    float *inv_freq;            // [head_dim / 2] RoPE inverse frequencies, computed once
    bool training;              // gradients allocated: the training layout is possible
    int32_t max_tokens;         // tokens per forward (one micro-batch), fixed at init
    int32_t logit_rows;         // LM-head logits are computed this many rows at a time
    int32_t qkv_ld;             // QKV = (n_heads + 2 n_kv_heads) * head_dim: row stride of qkv
    int32_t sp_row0, sp_rows;   // sequence parallelism: the current batch's rows this rank
                                // holds outside the tensor-parallel blocks (tr_tp_seq_begin)
    void *arena;                // activations, arena_bytes bytes
    size_t arena_bytes;
    bool owns_arena;            // false: the caller's buffer (opts.acts), never freed here
    bool acts_training;         // acts is the training layout (every layer kept for backward,
                                // or with recompute the residual stream only)
    bool recompute;             // training keeps one layer set; backward reruns each layer
    int32_t layer_held;         // with recompute: the layer whose activations the set holds
                                // (-1: none, or not known to be the current batch's)
    tr_acts acts;
    // Set once a worker arena holds the activation memory (tr_arena_adopt, tr_arena_begin_*):
    // forwards then run only in the arena phase the views were laid out in.
    const struct tr_arena *shared;
    uint64_t shared_epoch;
    // The current batch. Host copies for bookkeeping (checks, score-head rows) ...
    int32_t *ids;               // [max_tokens]
    int32_t *pos;               // [max_tokens]
    int32_t *doc_start;         // [max_tokens + 1]
    int32_t *prefix;            // [max_tokens] each document's shared prefix (-1: none)
    tr_doc_layout host_docs;    // over the host arrays; n_tokens 0 before forward
    int32_t *host_rows;         // [max_tokens] row indices on their way to the backend
    int32_t *emb_ids;           // [max_tokens] ids as rows of this rank's embedding (-1: a
                                // row of another tensor-parallel rank)
    // ... and their backend copies, which the ops read; docs points at them.
    void *io;                   // one allocation holding the d_* arrays
    int32_t *d_ids, *d_pos, *d_doc_start, *d_prefix, *d_emb_ids;
    tr_doc_layout docs;
    // Head inputs and outputs in backend memory ([max_tokens * head outputs per token]):
    // targets, logprob/value/score, entropy, and the loss gradients w.r.t. them.
    int32_t *d_targets;
    float *d_out, *d_entropy, *d_dout, *d_dentropy;
    bool logits_cached;         // acts.logits holds all T rows of the current forward (until
                                // the LM head's backward writes d_logits over them)
    void *emb_scratch;          // backend memory for embedding_backward (training; NULL if 0)
    float *grad_sum;            // backend memory for tr_model_reduce_grads (grad_sum_n floats)
    size_t grad_sum_n;
} tr_model;

struct tr_arena;
struct tr_ckpt_save_opts;

typedef struct tr_model_opts {
    int32_t max_tokens;   // tokens per micro-batch (packed documents included)
    bool training;        // allocate gradients and backward scratch
    int32_t logit_rows;   // rows of LM logits held at once; 0 = as many as fit in 32 MiB
    // Activation memory of the caller's (64-byte aligned, acts_bytes >= what
    // tr_model_arena_bytes gives for these options), never freed by the model; NULL: the
    // model allocates its own.
    void *acts;
    size_t acts_bytes;
    // Tensor parallelism: this rank of tp_size (0 or 1: the whole model). The layout, the
    // weights loaded and the activations are the rank's; tr_model_set_tp_comm gives it the
    // group before the first forward.
    int32_t tp_size, tp_rank;
    // Sequence parallelism (tp_size > 1; ignored at 1): the residual stream, the norms and
    // their saved activations hold the rank's rows of each batch only.
    bool sequence_parallel;
    // The working weights are the caller's, bound with tr_model_bind_work before the model is
    // loaded or run (memory another process shares, engine/weight_share.h): none is allocated,
    // and fp32 masters only when training, apart from the working weights even in fp32.
    bool external_work;
    // Activation recompute (training only): the training layout keeps the residual stream
    // and one layer's activations; the backward of each layer first runs that layer's
    // forward again. Costs about one more forward per step and saves about L-1 of the L
    // layer sets (tr_model_arena_bytes). Gradients are the same bits: every op is
    // deterministic, so the recomputed activations are the forward's.
    bool recompute;
} tr_model_opts;

// Allocates parameters (zeroed: fp32 masters when training or when the backend's working
// weights are fp32, and the working copy), gradients when training, and the activation arena
// for cfg's model (or lays the views over opts->acts). Weights are then loaded
// (tr_model_load) or drawn (tr_model_init_weights).
int tr_model_init(tr_model *m, const tr_model_config *cfg, tr_backend *be,
                  const tr_model_opts *opts, tr_err *err);
void tr_model_free(tr_model *m);
// The tensor-parallel group of a model set up with tp_size > 1 (comm's world and rank are
// the model's); every forward and backward runs collectives on it from then on.
int tr_model_set_tp_comm(tr_model *m, tr_comm *comm, tr_err *err);
// Bytes of activation arena tr_model_init allocates for these options on a backend whose
// activation dtype is act (see model.c).
size_t tr_model_arena_bytes(const tr_model_config *cfg, const tr_model_opts *opts, tr_dt act);
// The LM head's rows a chunk for these options: opts->logit_rows, or the default (as many as
// fit in 32 MiB of fp32 logits), at most max_tokens.
int32_t tr_model_logit_rows(const tr_model_config *cfg, const tr_model_opts *opts);
// Bytes of m's activations in the training layout (every layer's activations and the
// backward scratch) or the inference layout (one layer set, no backward), for its max_tokens
// and logit_rows.
size_t tr_model_acts_bytes(const tr_model *m, bool training);
// Lays the activation views out over base (bytes bytes, 64-byte aligned) in the training
// or inference layout, for a model whose activations are the caller's (opts.acts). Nothing
// is allocated or copied: what base held is overwritten by the next forward. The training
// layout needs a model set up for training.
int tr_model_bind_acts(tr_model *m, void *base, size_t bytes, bool training, tr_err *err);

// Reads the Hugging Face checkpoint DIR (config.json and weights) into a new model.
int tr_model_load(tr_model *m, const char *dir, tr_backend *be, const tr_model_opts *opts,
                  tr_err *err);
// Loads DIR's weights into the model's existing buffers (backbone: only model.*, heads left
// as they are; see tr_checkpoint_load_backbone), through pinned host staging.
int tr_model_load_weights(tr_model *m, const char *dir, bool backbone, tr_err *err);
// Saves the weights as an HF checkpoint directory (tr_checkpoint_save), through staging.
// Under tensor parallelism every rank of the group calls it: the shards are gathered into
// plain HF tensors and rank 0 writes them.
int tr_model_save(tr_model *m, const char *dir, const struct tr_ckpt_save_opts *opts,
                  tr_err *err);
// The parameters (or gradients) of the whole model in the layout of tr_param_layout_init
// (one rank's), gathered from every tensor-parallel rank: collective, full
// (tr_param_layout_init's total floats) written on rank 0 and on every rank that passes one.
// Without tensor parallelism this is tr_model_read_params / _grads.
int tr_model_gather_full(tr_model *m, bool grads, float *full, tr_err *err);
// The parameters (fp32 masters; a model without masters converts its working weights) or
// the gradients to or from host memory (layout.total floats), waiting for the copy; writing
// refreshes the working weights. For tests, checkpoints and tools, never a step's hot path.
int tr_model_read_params(tr_model *m, float *host, tr_err *err);
int tr_model_write_params(tr_model *m, const float *host, tr_err *err);
int tr_model_read_grads(tr_model *m, float *host, tr_err *err);
// dst's weights become src's, on the device: the same bits as loading dst from the source
// src was loaded from (or drawing it with the same seed), as long as src has not changed
// since. Both models lay out the same tensors, slices and offsets; dst's fp32 masters, if
// it has them, come only from src's (its working weights alone cannot give them back), and
// dst's working weights are src's rounded as a load rounds them.
bool tr_model_can_copy_weights(const tr_model *dst, const tr_model *src);
int tr_model_copy_weights(tr_model *dst, const tr_model *src, tr_err *err);
// Rounds the fp32 masters into the working weights (nothing when they are the same buffer),
// after anything but AdamW (which writes both) changed the masters.
int tr_model_refresh_work(tr_model *m, tr_err *err);
// A model made with external_work: its working weights are now work (layout.total elements of
// the backend's wt, backend memory), which the passes read and AdamW writes from here on.
int tr_model_bind_work(tr_model *m, void *work, tr_err *err);

// transformers' default init: normal(0, std) for embeddings and linear weights, ones for
// norms, zero biases; deterministic in seed (Philox). Drawn on the host, then uploaded.
int tr_model_init_weights(tr_model *m, uint64_t seed, float std, tr_err *err);

// Runs the trunk over one micro-batch: ids[docs->n_tokens] packed into docs. Checks ids
// against the vocabulary and the layout's consistency; errors name the token index.
int tr_model_forward(tr_model *m, const int32_t *ids, const tr_doc_layout *docs, tr_err *err);
// Generation's entry into the same trunk: T rows, row t being token ids[t] at RoPE position
// pos[t], with attention left to attend(), which runs once per layer after la->q, la->k and
// la->v hold the layer's rows (stride m->qkv_ld; k's heads follow q's), and must apply RoPE
// to q and k (at m->d_pos, by m->inv_freq) and fill la->att. tr_model_forward is this
// with causal attention over packed documents, so both paths share every other step. The
// heads then read rows [0, T); there is no backward for such a pass.
typedef void (*tr_attend_fn)(void *ctx, tr_model *m, int32_t layer, tr_layer_acts *la,
                             int32_t T);
int tr_model_forward_rows(tr_model *m, const int32_t *ids, const int32_t *pos, int32_t T,
                          tr_attend_fn attend, void *ctx, tr_err *err);
// The same for rows the device writes, in two halves, so that the device half can be
// recorded once and replayed (a CUDA graph of a decode step, engine/generate.c): prepare
// checks T and sets the sizes the heads use; queue queues the trunk over T rows whose d_ids,
// d_pos, d_doc_start (and under tensor parallelism d_emb_ids) the caller's ops wrote first
// (the decode_rows op).
int tr_model_rows_prepare(tr_model *m, int32_t T, tr_err *err);
int tr_model_rows_queue(tr_model *m, int32_t T, tr_attend_fn attend, void *ctx, tr_err *err);
// Back-propagates acts.d_lnf (written by a head's backward) through the trunk of the last
// forward, accumulating into the gradient buffer. Only for models set up with training whose
// views are in the training layout (acts_training). Fails only on a tensor-parallel
// collective.
int tr_model_backward(tr_model *m, tr_err *err);
void tr_model_zero_grad(tr_model *m);
// Tensor parallelism: sums the gradients ranks share (replicated key/value heads, the QK-norm
// weights; params.h's grad_slots) over the group, once after a step's last backward, so every
// rank holds its tensors' whole gradient. Nothing to do at size 1.
int tr_model_reduce_grads(tr_model *m, tr_err *err);

// Number of parameters of the whole model (tied embeddings counted once).
size_t tr_model_n_params(const tr_model *m);
// Floating-point operations of one forward of the whole model (every tensor-parallel rank's
// part) over the host layout docs: 2 per multiply-add of the projections and the head, and
// 4 H D per (query, key) pair of attention, each query over its context (a shared prefix's
// keys included). A training step's forward and backward are 3 times this, the usual
// 6N + 6 L S d per token counted over the keys each query actually sees.
double tr_model_forward_flops(const tr_model_config *cfg, const tr_doc_layout *docs);
