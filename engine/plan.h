// The memory plan of a role: how much backend memory its weights, gradients, optimizer state,
// activation arena and KV cache take, and how large a KV cache (and how many sequences
// decoding together) the memory left over allows. Workers and commands size the generator
// from it instead of fixed caps, and refuse at start-up when even the fixed part does not fit.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"
#include "kernels/ops.h"

// Activation recompute (tr_model_opts.recompute): auto turns it on only where a training
// micro-batch's activations would not fit otherwise.
enum tr_recompute { TR_RECOMPUTE_AUTO, TR_RECOMPUTE_OFF, TR_RECOMPUTE_ON };
// Their names in that order, NULL-terminated ("auto", "off", "on"), and a name's value
// (-1: none of them), for recipes, init messages and the command line alike.
extern const char *const tr_recompute_names[];
int tr_recompute_parse(const char *name);

// Largest micro-batch the plan chooses: past it the GEMMs are as wide as the device needs,
// so more tokens per forward only take memory from the KV cache.
#define TR_PLAN_MAX_TOKENS 16384

typedef struct tr_plan_req {
    const tr_model_config *cfg;
    // Rows per forward (a micro-batch or a generation pass); 0: the plan chooses (tr_plan
    // .max_tokens says how), between min_tokens (a sequence that must fit in one forward)
    // and max_tokens_want (the tokens there are to take: a step's), both 0 when not known.
    int32_t max_tokens;
    int32_t min_tokens, max_tokens_want;
    int recompute;             // enum tr_recompute
    bool training;             // gradients and Adam moments beside the weights
    int32_t optim_shards;      // ZeRO-1: the moments of 1/optim_shards of the weights (0: 1)
    bool generate;             // a KV cache
    int32_t block_size;        // KV block size (0: 16)
    int64_t kv_tokens;         // > 0: exactly this KV capacity; 0: what fits, up to kv_want
    int64_t kv_want;           // KV tokens that would hold every sequence at once
    int32_t max_seqs;          // > 0: exactly; 0: max_seqs_want, at most max_tokens rows
    int32_t max_seqs_want;
    size_t budget;             // bytes the role may take; 0: the backend's free memory
    int32_t tp_size, tp_rank;  // tensor parallelism: the plan of this rank's shard (0: 1)
    int32_t logit_rows;        // > 0: exactly this LM-head chunk; 0: from the memory left
    bool sequence_parallel;    // with tp_size > 1: activations of sequence parallelism
    // Working weights shared with another process (engine/weight_share.h): a trainer holds
    // share_buffers copies of them apart from its masters; a reader holds none of its own.
    int32_t share_buffers;
    bool share_reader;
} tr_plan_req;

typedef struct tr_plan {
    // Tokens per forward: the request's, or when it left them to the plan the largest of
    // max_tokens_want (at most TR_PLAN_MAX_TOKENS), halved while a training micro-batch's
    // activations take more than half of the memory left after the fixed parts (the other
    // half stays for the KV cache and the roles beside this one on the device), first
    // without recompute and then, when even min_tokens needs it, with.
    int32_t max_tokens;
    bool recompute;                 // training activations with recompute (tr_model_opts)
    size_t weights, grads, optim;   // bytes (optim: both Adam moments)
    size_t masters, work;           // weights = fp32 masters + the narrower working copy
    size_t arena_train, arena_forward, kv;
    size_t arena;                   // max(train, forward + kv): what the arena holds
    size_t total, budget, reserve;  // total = weights + grads + optim + arena
    int64_t kv_tokens;
    int32_t max_seqs;
    // Rows of LM-head logits a chunk holds (tr_model_opts.logit_rows; the arena sizes above
    // count it): up to max_tokens, as many as an eighth of the memory left after the fixed
    // parts and one micro-batch's activations allows, and never fewer than the model's own
    // default. Wide chunks keep the LM head's GEMMs wide (its input-gradient product has only
    // hidden x rows outputs to spread over the device, and no split-K) and, when every row
    // fits, spare the backward its recompute of the logits.
    int32_t logit_rows;
} tr_plan;

// Fills p. Fails (TR_ENOMEM, naming every part and the budget) when weights, gradients,
// optimizer and the activations of one forward (with recompute, where allowed) exceed the
// budget less a reserve for the backend's own work, or when an exact kv_tokens does not fit.
int tr_plan_make(tr_backend *be, const tr_plan_req *req, tr_plan *p, tr_err *err);
// One line per part, for `troupe info` and worker logs.
void tr_plan_format(const tr_plan *p, char *buf, size_t cap);
