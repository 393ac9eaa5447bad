// The workflows a recipe runs (GRPO, PPO, SFT, pretraining) and what they share: the run
// (controller and role groups, tokenizer, metrics, resume state), the eval and checkpoint
// schedules, step checkpoints, the reward curve and the logging of one step. Each workflow
// is its step loop, reading top to bottom like DESIGN.md's pseudocode: GRPO and PPO share
// one (rl/workflow_rl_loop.c), SFT and pretraining have theirs (rl/workflow_<name>.c).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "engine/err.h"
#include "rl/metrics.h"
#include "rl/recipe.h"
#include "roles/client.h"

struct tr_controller;

typedef struct tr_workflow_opts {
    bool resume;          // continue from the last complete checkpoint in run_dir
    FILE *progress_out;   // NULL: stderr
} tr_workflow_opts;

// Runs r's workflow from its first (or, resuming, next) step to train.steps: starts the
// role workers, writes run_dir/resolved.yaml, metrics.jsonl and checkpoints, stops the
// workers. A fresh run refuses a run_dir that already holds a run.
int tr_workflow_run(const tr_recipe *r, const tr_workflow_opts *o, tr_err *err);

// A run in progress, as the workflows see it.
typedef struct tr_run {
    const tr_recipe *recipe;
    struct tr_controller *ctl;
    tr_group *policy, *reference, *critic, *reward;   // NULL when the recipe has no such role
    tr_group *generator;           // models.generator: generation on processes of its own
    tr_group *sampler;             // where generation runs: the generator, else the policy
    tr_tokenizer *tok;
    tr_chat_format chat;
    const tr_chat_format *chatp;   // &chat, or NULL for chat_format: none
    tr_metrics m;
    int64_t step;                  // steps completed (the resumed checkpoint's, or 0)
    int64_t data_cursor;           // prompts / rows / samples consumed by those steps
    bool resumed;
    FILE *samples;                 // run_dir/samples.jsonl when log.samples_every > 0
} tr_run;

// Evaluation runs before the first step (step 0), every `every` steps (0: no periodic
// ones) and after the last step; a resumed run does not repeat its checkpoint's step.
bool tr_run_eval_due(int64_t step, int64_t total, int64_t every);
// Checkpoints: every `every` steps (0: none in between) and after the last step.
bool tr_run_save_due(int64_t step, int64_t total, int64_t every);

// Saves every trained role (policy; critic for ppo) and the run state as checkpoint `step`.
int tr_run_checkpoint(tr_run *run, int64_t step, tr_err *err);
// Ends a step the same way in every workflow: throughput over `tokens` since t_step and
// time/step into the record, the record committed, run->step advanced, and the checkpoint
// written when one is due.
int tr_run_step_end(tr_run *run, int64_t step, double tokens, double t_step, tr_err *err);

// The workflows. Each runs steps run->step + 1 .. train.steps.
// GRPO and PPO (rl/workflow_rl_loop.c): the recipe's workflow picks the critic's branches.
int tr_workflow_rl(tr_run *run, tr_err *err);
int tr_workflow_sft(tr_run *run, tr_err *err);
int tr_workflow_pretrain(tr_run *run, tr_err *err);
