// One optimizer step over micro-batches: zero gradients, forward/backward each micro-batch
// (gradient accumulation), clip by global norm, AdamW with a learning-rate schedule. The
// loss is normalized over the whole step, so splitting a batch differently changes nothing
// but rounding. The Adam moments live in two buffers with the parameters' layout. With a
// data-parallel communicator every rank steps on its own micro-batches and the gradients are
// summed over the ranks before the norm, so all ranks take the same update; each rank keeps
// the moments of one shard of the parameters (ZeRO-1). A tensor-parallel model (engine/tp.h)
// trains the same way: its ranks share every micro-batch, and the gradient norm adds each
// rank's shards once.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/comm.h"
#include "engine/err.h"
#include "engine/model.h"
#include "engine/rng.h"
#include "engine/schedule.h"

typedef struct tr_optim_cfg {
    double lr;                // peak learning rate (the schedule scales it)
    float beta1, beta2, eps;
    float weight_decay;
    bool decay_all;           // true: every tensor decays (torch AdamW(model.parameters()));
                              // false: 1-D tensors (norms, biases) do not (transformers Trainer)
    float max_grad_norm;      // clip the global gradient norm to this; <= 0: no clipping
    tr_lr_schedule schedule;
} tr_optim_cfg;

// How per-output losses become the step's loss L = sum_i w_i l_i / W over all outputs i of
// all micro-batches (outputs: tokens, or documents x num_labels for the score head).
enum tr_loss_kind {
    TR_LOSS_CROSS_ENTROPY,  // LM head: l_t = -logprob(targets[t])
    TR_LOSS_GRADIENT,       // the micro-batch gives dl_i/dout_i (and dl_t/dentropy_t)
    TR_LOSS_CALLBACK,       // a function computes l_i and its gradients from the outputs
};

enum tr_step_norm {
    TR_NORM_TOKEN_MEAN,     // W = sum of all weights of the step (or weight_total if > 0)
    TR_NORM_SUM,            // W = 1: the caller folded any normalization into the weights
};

typedef struct tr_micro_batch {
    const int32_t *ids;       // [T], T = docs.n_tokens
    tr_doc_layout docs;
    const int32_t *targets;   // LM head: [T] the token to score at t; < 0: none
    const float *weights;     // [n_out] loss mask/weights; NULL: 1 (LM: 1 where target >= 0)
    const float *dout;        // TR_LOSS_GRADIENT: [n_out] dl/dlogprob, dl/dvalue or dl/dscore
    const float *dentropy;    // TR_LOSS_GRADIENT, LM head: [T] dl/dentropy; NULL: 0
} tr_micro_batch;

// TR_LOSS_CALLBACK: given micro-batch `index` and its n head outputs (out: logprob, value or
// score; entropy for the LM head, else NULL), fills loss[i] = l_i, dout[i] = dl_i/dout_i and
// dentropy[i] (LM head only; may be left 0). Weights and normalization are applied after.
typedef int (*tr_loss_fn)(void *user, int32_t index, const tr_micro_batch *mb, int32_t n,
                          const float *out, const float *entropy, float *loss, float *dout,
                          float *dentropy, tr_err *err);

typedef struct tr_step_args {
    enum tr_loss_kind loss;
    enum tr_step_norm norm;
    double weight_total;      // TR_NORM_TOKEN_MEAN: W when > 0 (e.g. summed over ranks)
    tr_loss_fn loss_fn;
    void *user;
} tr_step_args;

typedef struct tr_step_result {
    double loss;              // L (0 for TR_LOSS_GRADIENT, where l_i is not known)
    double grad_norm;         // global norm before clipping
    double lr;                // learning rate the update used
    double weight_total;      // W
    int64_t step;             // updates completed, this one included
} tr_step_result;

typedef struct tr_trainer {
    tr_model *model;          // not owned; must be initialized with training = true
    tr_optim_cfg opt;
    float *adam_m, *adam_v;   // model->layout.total floats each
    int64_t step;             // updates completed; the schedule's position
    tr_rng rng;               // the training loop's random stream, saved with the state
    int32_t max_out;          // per-micro-batch head outputs the scratch below holds
    float *out, *entropy, *loss, *dout, *dentropy, *weights;  // [max_out] scratch
    double *dev_sumsq;        // one double of backend memory: the gradient's sum of squares
    tr_adamw_seg *dev_segs;   // backend memory: the weight-decay spans of this rank's shard
    int32_t n_segs;
    tr_comm *comm;            // data-parallel ranks (not owned), or NULL
    // ZeRO-1: this rank updates parameters [shard_begin, shard_end) of the flat layout and
    // keeps Adam moments for those only (adam_m[i] belongs to parameter shard_begin + i).
    int32_t shards, shard;    // ranks the optimizer is split over, and this one
    size_t shard_begin, shard_end;
    size_t *shard_counts;     // [shards] parameters per shard
    // Ranges [norm_spans[2i], norm_spans[2i+1]) of the flat layout whose gradients add to the
    // global norm on this rank: under tensor parallelism a tensor several ranks hold whole
    // counts on one of them (params.h's `counted`).
    size_t *norm_spans;
    int32_t n_norm_spans;
} tr_trainer;

// The parameters of shard `shard` of `shards` for a model of `total` floats: contiguous,
// multiples of 16 floats (64 bytes) apart but for the last.
size_t tr_trainer_shard_begin(size_t total, int32_t shards, int32_t shard);

int tr_trainer_init(tr_trainer *tr, tr_model *m, const tr_optim_cfg *opt, uint64_t seed,
                    tr_err *err);
// The same for rank `shard` of `shards` data-parallel ranks: the Adam moments of its shard only
// (ZeRO-1). tr_trainer_set_comm must then give it a communicator of that many ranks.
int tr_trainer_init_sharded(tr_trainer *tr, tr_model *m, const tr_optim_cfg *opt, uint64_t seed,
                            int32_t shards, int32_t shard, tr_err *err);
void tr_trainer_free(tr_trainer *tr);

// Makes the trainer one of comm's data-parallel ranks (before its first step; comm's world
// and rank are the trainer's shards and shard). Every rank then calls tr_train_step once per
// update, each with its own micro-batches (possibly none): the gradients are reduce-scattered
// over the ranks, each rank clips (by the global norm, from every shard's sum of squares) and
// updates its shard of the parameters, and the shards are all-gathered.
int tr_trainer_set_comm(tr_trainer *tr, tr_comm *comm, tr_err *err);
// Sums x[0..n) over the data-parallel ranks in place (rank order, so every rank gets the same
// bits); nothing to do without a communicator. For counts and metrics.
int tr_trainer_all_sum(tr_trainer *tr, double *x, int32_t n, tr_err *err);
// all[r * n + i] = rank r's x[i] for every rank r (all = x without a communicator).
int tr_trainer_all_gather(tr_trainer *tr, const double *x, int32_t n, double *all, tr_err *err);

// One update from n micro-batches. On error (bad input, a callback error, a non-finite
// gradient norm) parameters, moments and step are left as they were. With a communicator the
// weights W of token-mean are summed over the ranks (unless weight_total gives W), as are the
// gradients and the loss; an error on one rank aborts the communicator, so no rank waits for
// it, and every rank fails.
int tr_train_step(tr_trainer *tr, const tr_micro_batch *mbs, int32_t n, const tr_step_args *args,
                  tr_step_result *res, tr_err *err);

// Mean cross entropy of the LM over micro-batches without touching gradients: what
// tr_train_step with TR_LOSS_CROSS_ENTROPY reports, for evaluation.
int tr_eval_loss(tr_model *m, const tr_micro_batch *mbs, int32_t n, float *scratch,
                 double *loss, tr_err *err);
