// What the RL step loop (GRPO, PPO; rl/workflow_rl_loop.c) uses: the step's buffers, where rollouts come from (the
// policy, or the generator group fed by a weight sync, optionally one step ahead), rewards
// (the reward role's scores through the recipe's curve, plus the overlong penalty), the padded
// [B, T] response layout of rl/advantage.h and engine/loss.h, the per-step rollout metrics,
// and evaluation with greedy decoding on the held-out prompts.
#pragma once
#include <stdint.h>

#include "rl/phase_timer.h"
#include "rl/prompt_loader.h"
#include "rl/workflow.h"
#include "roles/rollout.h"

typedef struct tr_rl_step {
    tr_prompt_draw draw;
    tr_rollouts gen;          // one generation round
    float *gen_score, *gen_reward;   // [gen.n]
    uint8_t *keep;            // [gen.n]
    tr_rollouts batch;        // what the step trains on
    int32_t n_groups;
    float *score, *reward;    // [batch.n] raw score (rule: 1 right, 0 not) and shaped reward
    int32_t cap_seqs;
    // Per token of batch (aligned with batch.tokens).
    float *old_lp, *ref_lp, *entropy, *values, *adv, *returns;
    int64_t cap_tokens;
    // The padded layout: B = batch.n rows of T = longest response.
    int32_t B, T;
    uint8_t *mask;
    // The advantage estimator's inputs and outputs in that layout, [B*T] each.
    float *pad_old_lp, *pad_ref_lp, *pad_values, *pad_kl_rewards, *pad_adv, *pad_returns;
    int64_t cap_pad;
    // Generation statistics of the step (every round).
    int64_t n_generated, gen_tokens, n_truncated;
    double reward_sum, reward_sq, score_sum;
    // Where the batch came from (rl/workflow_gen.c): lag 0 when sampled with the policy's
    // current weights, 1 when sampled a step ahead with the weights before its last update;
    // version is the policy step those weights are from.
    int32_t lag;
    int64_t version;
    double t_gen;                   // seconds this step waited for generation
    // The next step's first round, sampled ahead on the generator (one_step_off).
    tr_generate_call *ahead;        // in flight
    int64_t ahead_step;             // the step it is for; 0: none
    bool ahead_ready;               // finished: its rollouts are in ahead_gen
    tr_prompt_draw ahead_draw;
    tr_rollouts ahead_gen;
    // Old logprobs from the rollout: the sequences the policy recomputes to measure the
    // rollout/training difference, and the metrics of the pass that gave the old logprobs.
    tr_rollouts check;
    float *check_lp, *check_entropy;   // [check.n_tokens]
    int64_t cap_check;
    double lp_diff, entropy_mean;      // NAN when nothing was recomputed
    int32_t lp_diff_seqs;              // sequences logprob_diff/max was measured on
    // The generation engines' statistics of the step's rounds (and of the round in flight).
    tr_gen_report gen_report, ahead_report;
} tr_rl_step;

void tr_rl_step_init(tr_rl_step *s);
void tr_rl_step_free(tr_rl_step *s);
// Empties the batch and the statistics for a new step.
void tr_rl_step_reset(tr_rl_step *s);
// Sizes the per-sequence arrays of a generation round (gen.n sequences).
int tr_rl_step_reserve_gen(tr_rl_step *s, int32_t n, tr_err *err);
// Sizes the batch's per-sequence (cap_seqs) arrays.
int tr_rl_step_reserve_batch(tr_rl_step *s, int32_t n, tr_err *err);
// Sizes the per-token arrays and the padded layout for the current batch.
int tr_rl_step_layout(tr_rl_step *s, tr_err *err);

// The sampling settings of the recipe for a training round (seed from step and round).
tr_sampling tr_rl_sampling(const tr_recipe *r, int64_t step, int32_t round);

// Round `round` of step: P prompts drawn at run->data_cursor (which advances) sampled into
// s->gen by run->sampler, or, for round 0 of a step sampled ahead, the rollouts that were;
// sets s->lag and s->version and adds the wait to s->t_gen.
int tr_rl_generate(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, int32_t round,
                   tr_err *err);
// one_step_off: starts step + 1's first round on the generator (the prompts after this
// step's) and returns; tr_rl_sync collects it. Nothing to do after the last step or without
// the pipeline.
int tr_rl_sample_ahead(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, tr_err *err);
// After the policy's optimizer steps: waits for a round sampled ahead (the generator takes one
// op at a time), then sends the weights to the generator and logs time/sync and sync/*
// (seconds, gb_per_s, bytes) when log is set; a policy that generates itself has nothing to
// send. Also the run's first sync (log false), before step 0's eval.
int tr_rl_sync(tr_run *run, tr_rl_step *s, bool log, tr_err *err);
// The batch's advantages once they are computed: with one_step_off weighted by the
// truncated importance weights against the sampling logprobs (rl/off_policy.h), tis/* logged.
int tr_rl_off_policy(tr_run *run, tr_rl_step *s, tr_err *err);
// With a generator: off_policy/staleness (s->lag, in steps) and off_policy/version_lag (in
// optimizer steps, from the weights that sampled the batch to those its update started from);
// tm_step is the policy's optimizer step after the update, steps the updates it took.
int tr_rl_log_staleness(tr_run *run, const tr_rl_step *s, int64_t tm_step, int64_t steps, tr_err *err);

// The reward of one response: a rule's score through the curve (1 -> correct; 0 -> missing
// when text holds nothing the rule could read as an answer, else wrong), a model's or
// service's through scale * score + shift; plus the DAPO overlong penalty of its length.
double tr_rl_shape_reward(const tr_recipe *recipe, float score, const char *text, int32_t response_len);
// Scores r with the reward role: score[i] the role's score, reward[i] the recipe's curve of
// it (rule: correct / wrong / missing; model, service: scale * score + shift) plus the
// overlong penalty. Counts the round into the step's statistics when s is not NULL, and adds
// the items a failing service scored 0 to the step's reward/failures. Errors number the
// sequences from first (r's place in what is scored as a whole: the eval set, the step).
int tr_rl_score(tr_run *run, const tr_rollouts *r, int64_t first, float *score, float *reward,
                tr_rl_step *s, tr_err *err);

// Ragged per-token array (aligned with r->tokens) <-> padded [B, T] over responses.
void tr_rl_to_padded(const tr_rollouts *r, int32_t T, const float *tok, float *pad);
void tr_rl_from_padded(const tr_rollouts *r, int32_t T, const float *pad, float *tok);
// mask[b*T + t] = 1 for t < response_len[b].
void tr_rl_mask(const tr_rollouts *r, int32_t T, uint8_t *mask);
// Mean of x over the response tokens (NAN when there are none).
double tr_rl_response_mean(const tr_rollouts *r, const float *x);
// max |a - b| over the response tokens.
double tr_rl_max_abs_diff(const tr_rollouts *r, const float *a, const float *b);
// The batch's old (behaviour) logprobs into s->old_lp, by a policy.logprobs pass or, when
// algorithm.old_logprobs resolves to rollout, from what generation reported; either way
// s->lp_diff gets the largest rollout/training difference over the s->lp_diff_seqs
// sequences recomputed (all of them, or log.logprob_diff_sequences spread over the batch),
// and s->entropy_mean their mean response-token entropy.
int tr_rl_old_logprobs(tr_run *run, tr_rl_step *s, tr_err *err);

// Greedy generation over every eval prompt, scored by the reward role: sets eval/accuracy
// (mean score), eval/reward (mean shaped reward) and eval/response_len in run->m. A failure
// names the evaluation's step (run->m's record) and the prompt's index in the eval set.
int tr_rl_eval(tr_run *run, tr_prompt_loader *eval, tr_err *err);

// Step metrics common to GRPO and PPO: rewards and response lengths; training metrics with
// kl (from the loss, the reward penalty kl_reward, or null without KL), entropy and
// logprob_diff/max (generation vs training-path logprobs). Phase timings go through
// rl/phase_timer.h.
int tr_rl_log_rollouts(tr_run *run, const tr_rl_step *s, tr_err *err);
// The device peak the rates are measured against: dense bf16 TFLOP/s (flops) or memory GB/s;
// log.peak_* when set, else the backend's (cuda: an H200's as measured), 0 for none.
double tr_rl_peak(const tr_recipe *recipe, bool flops);
// Tokens per second of each phase the step ran (generate: the sampled tokens; reference and
// train: every token of the batch, train once per epoch), the policy's training TFLOP/s and,
// against the device's peak, utilization/train_mfu.
int tr_rl_log_rates(tr_run *run, const tr_rl_step *s, const tr_phase_timer *pt, const tr_train_metrics *tm,
                    tr_err *err);
int tr_rl_log_train(tr_run *run, const tr_rl_step *s, const tr_train_metrics *tm, bool kl,
                    double kl_reward, tr_err *err);
// Writes a few of the batch's rollouts to run_dir/samples.jsonl when log.samples_every says so.
int tr_rl_log_samples(tr_run *run, int64_t step, const tr_rl_step *s, tr_err *err);
