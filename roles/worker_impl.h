// Internal to the worker: the state of one hosted role and the op handlers that
// worker.c dispatches to (worker_model.c, worker_policy.c, worker_train.c, worker_reward.c,
// worker_comm.c, worker_sync.c, worker_share.c).
// Every handler reads the request args and writes a complete ok reply, or fails with err.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "engine/arena.h"
#include "engine/comm.h"
#include "engine/pack.h"
#include "engine/plan.h"
#include "engine/generate.h"
#include "engine/loss.h"
#include "engine/model.h"
#include "engine/train.h"
#include "engine/weight_share.h"
#include "roles/mb_plan.h"
#include "roles/msg.h"
#include "roles/reward_rule.h"
#include "roles/reward_service.h"
#include "roles/rollout.h"
#include "roles/transport.h"

enum tr_role_kind { TR_ROLE_POLICY, TR_ROLE_REFERENCE, TR_ROLE_CRITIC, TR_ROLE_REWARD, TR_ROLE_GENERATOR };
enum tr_reward_kind { TR_REWARD_KIND_RULE, TR_REWARD_KIND_SERVICE, TR_REWARD_KIND_MODEL };

typedef struct tr_worker tr_worker;

// Buffers of one micro-batch, sized for the model's max_tokens at init.
typedef struct tr_mb_buf {
    tr_pack pack;                                // the micro-batch being run
    int32_t *seq;                                // [max_tokens] sequence index of each document
    float *out, *entropy, *weights;
} tr_mb_buf;

typedef struct tr_role_ctx {
    tr_worker *w;
    enum tr_role_kind kind;
    char name[TR_ROLE_NAME_MAX];
    char id[TR_PEER_ID_MAX];          // "<role>/<rank>"
    tr_dealer *dealer;
    bool ready;                       // init succeeded
    // Where init took the weights (a checkpoint, or a config and seed), for another hosted
    // role initialised from the same source to copy them rather than load or draw them again
    // (empty: none may: a generator's, a converted head's); init_ops: the worker's op count
    // when init ended, so that the weights are init's while the count stays there.
    char init_src[2080];
    int64_t init_ops;
    // The group's parallel layout from init: rank = dp_rank * tp + tp_rank; sp: sequence
    // parallelism (tp > 1).
    int32_t tp, dp, dp_rank, tp_rank;
    bool sp;
    tr_comm *comm;                    // the data-parallel communicator (comm_* ops), or NULL
    char comm_id[TR_COMM_ID_MAX];     // dp rank 0: the id comm_id made
    // The tensor-parallel communicator (name "tp"): the ranks of this rank's model shard group,
    // which compute alike on the same data; its rank 0 answers with the results.
    tr_comm *tp_comm;
    char tp_comm_id[TR_COMM_ID_MAX];
    // The weight-sync communicator (name "sync"): the policy's dp rank 0 as its rank 0, the
    // generator's ranks after it; NULL where the recipe has no generator.
    tr_comm *sync_comm;
    char sync_comm_id[TR_COMM_ID_MAX];
    // Working weights shared with a generator process on the same device instead of a sync
    // communicator (engine/weight_share.h): the policy's share_buffers buffers of them, or
    // the generator's mapping of the policy's; share_buffers 0: not shared.
    int32_t share_buffers;
    bool has_wshare, has_wread;
    tr_wshare wshare;
    tr_wshare_reader wread;
    // The weight version: the policy optimizer step whose weights generation runs on. The
    // generator's comes with each sync (-1 before the first); the policy's is its trainer's.
    int64_t weight_version;
    int64_t prev_train_step;          // policy: the trainer's step before its last train op
                                      // (-1: none since init or load)

    bool has_model;
    tr_model model;
    tr_mb_buf mb;
    bool share_prompts;               // forward and train passes share each prompt (mb_plan.h)
    int32_t logit_rows;               // the LM head's chunk the plan must take (0: its own)
    bool has_trainer;
    tr_trainer trainer;
    bool has_gen;
    tr_generator gen;                 // the policy's or generator's, made at init with its KV pool
                                      // in the arena (not for a policy whose init says generate:
                                      // false: a generator group samples for it)
    int64_t kv_tokens, kv_want;       // init's KV request (exact, or wanted: the plan decides)
    int32_t min_tokens, max_tokens_want;   // init's bounds when the plan chooses max_tokens
    int recompute;                    // init's activation recompute (enum tr_recompute)
    int32_t max_seqs;
    int64_t memory_bytes;             // the plan's budget (0: the device's free memory)
    tr_plan plan;                     // this role's memory plan, made at init
    tr_arena_need need;               // this role's share of the worker arena's sizing rule

    tr_tokenizer *tok;
    bool has_chat;
    tr_chat_format chat;
    int32_t stop_ids[TR_MAX_EOS + 2];
    int32_t n_stop;
    char tokenizer_dir[1024];         // copied beside saved checkpoints
    bool save_bf16;                   // checkpoints hold bf16 weights (init's save_dtype)

    tr_policy_loss_cfg loss;
    float value_clip;
    int32_t ppo_epochs, mini_batches, max_len;

    enum tr_reward_kind reward_kind;
    tr_reward_rule *rule;
    tr_reward_service *service;
} tr_role_ctx;

struct tr_worker {
    int32_t rank, world;
    const volatile sig_atomic_t *stop;  // the process's stop request: ends blocked collectives
    bool has_backend;
    tr_backend be;
    int32_t threads, device;
    // Activations and KV cache of every hosted role: one region, grown while roles are
    // initialised and lent to one op at a time (engine/arena.h).
    tr_arena arena;
    size_t separate_bytes;            // what the hosted roles' own buffers would have taken
    tr_role_ctx roles[4];
    int n_roles;
    int64_t ops;                      // requests other than init handled, by any hosted role
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
};

void tr_worker_logf(tr_role_ctx *role, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// worker_model.c: init (model, tokenizer, trainer), the shared forward ops, and teardown.
int tr_worker_op_init(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_logprobs(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_values(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
void tr_role_ctx_free(tr_role_ctx *role);
// Sequences [s0, s1) of r into mb.pack as documents, as many as fit max_tokens starting at
// s0; returns the number taken (>= 1), or -1 when sequence s0 alone is longer than max_tokens.
int32_t tr_mb_fill(tr_role_ctx *role, const tr_rollouts *r, int32_t s0, int32_t s1, tr_err *err);
// Reads rollouts (lengths and tokens, ids checked against the vocabulary) from args.
int tr_worker_get_rollouts(tr_role_ctx *role, const tr_msg_map *args, tr_rollouts *r, tr_err *err);
// The head output row that predicts token t of a sequence starting at row o: o + t - 1.
// Tokens with t < max(prompt_len, 1) have no prediction in the sequence (0 is reported).
static inline int32_t tr_first_scored(int32_t prompt_len) { return prompt_len > 1 ? prompt_len : 1; }

// worker_policy.c
int tr_worker_op_generate(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_save(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_load(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);

// worker_train.c: policy train (RL), train_sft, critic train.
int tr_worker_op_train(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_train_sft(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);

// worker_model.c: the tensor-parallel group's agreement on the generator's KV pool and batch,
// once its communicator is ready.
int tr_worker_tp_agree(tr_role_ctx *role, tr_err *err);

// worker_comm.c: the communicators' bootstrap.
int tr_worker_op_comm_id(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_comm_join(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
int tr_worker_op_comm_ready(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);

// worker_sync.c: sync_weights, the policy sending its weights to the generator's ranks.
int tr_worker_op_sync_weights(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);

// worker_share.c: weights shared with a generator on the same device. After the model is made
// (with external_work when share_buffers > 0): the policy's buffers, or the generator's reader.
int tr_worker_share_init(tr_role_ctx *role, tr_err *err);
void tr_worker_share_free(tr_role_ctx *role);
// Before an op writes the policy's working weights (train, train_sft, load): with two
// buffers, the one generation may be reading is left alone.
int tr_worker_begin_write(tr_role_ctx *role, tr_err *err);
// sync_weights when the weights are shared: the policy publishes its buffer, the generator
// maps the one the controller forwards from it.
int tr_worker_share_sync(tr_role_ctx *role, const tr_msg *req, bool verify, tr_msg_writer *rep, tr_err *err);
// The version generate stamps on its rollouts.
int64_t tr_worker_weight_version(const tr_role_ctx *role);

// worker_reward.c
int tr_worker_reward_init(tr_role_ctx *role, const tr_msg_map *reward, tr_err *err);
int tr_worker_op_score(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err);
