// Recipe parsing: a full recipe lands in the expected struct; each kind of bad input gives
// an error with the exact file:line:column (1-based, libyaml marks) and the allowed keys or
// values; --set overrides (nested, lists, new mappings, wrong types, unknown keys); the
// resolved recipe round-trips (parse(emit(r)) == r) and is written atomically into run_dir.
#include <sys/stat.h>

#include "engine/file.h"
#include "rl/recipe.h"
#include "rl/workflow_rl.h"
#include "tests/test.h"

// Lines are numbered in the comments; errors below refer to them.
static const char *full =
    "workflow: ppo\n"                                         // 1
    "seed: 7\n"                                               // 2
    "run_dir: runs/full\n"                                    // 3
    "backend: cuda\n"                                         // 4
    "threads: 3\n"                                            // 5
    "models:\n"                                               // 6
    "  policy:\n"                                             // 7
    "    path: ckpt/policy\n"                                 // 8
    "    parallel: {tp: 1, dp: 2}\n"                          // 9
    "    devices: [1, 3]\n"                                   // 10
    "    optim: {lr: 2.5e-6, weight_decay: 0.05, betas: [0.9, 0.95], eps: 1.0e-7,\n"
    "            grad_clip: 0.5, schedule: cosine, warmup_steps: 12, min_lr_ratio: 0.1}\n"
    "  reference: {from: policy, parallel: {dp: 2}}\n"        // 13
    "  critic:\n"                                             // 14
    "    init: {config: cfg/critic.json, seed: 9}\n"          // 15
    "    optim: {lr: 1.0e-5}\n"                               // 16
    "  reward:\n"                                             // 17
    "    kind: service\n"                                     // 18
    "    endpoint: tcp://127.0.0.1:5555\n"                    // 19
    "    timeout_ms: 1500\n"                                  // 20
    "    retries: 4\n"                                        // 21
    "    max_batch: 32\n"                                     // 22
    "    on_failure: zero\n"                                  // 23
    "    curve: {scale: 2.0, shift: -1.0}\n"                  // 24
    "data:\n"                                                 // 25
    "  train: data/train.jsonl\n"                             // 26
    "  eval: data/eval.jsonl\n"                               // 27
    "  chat_format: llama3\n"                                 // 28
    "  prompt_key: question\n"                                // 29
    "  max_prompt_len: 100\n"                                 // 30
    "rollout: {n: 4, max_new_tokens: 50, temperature: 0.7, top_p: 0.9, top_k: 20,\n"
    "          dynamic_sampling: true, max_resample: 2, overlong: {buffer: 10, penalty: 0.5}, stop_ids: [9, 4]}\n"
    "algorithm:\n"                                            // 33
    "  gamma: 0.99\n"                                         // 34
    "  lam: 0.95\n"                                           // 35
    "  clip: {low: 0.1, high: 0.3, dual: 3}\n"                // 36
    "  ratio: sequence\n"                                     // 37
    "  kl: {coef: 0.01, estimator: k2, placement: reward}\n"  // 38
    "  entropy_coef: 0.001\n"                                 // 39
    "  value_clip: 0.2\n"                                     // 40
    "  loss_agg: seq-mean-token-sum-norm\n"                   // 41
    "  ppo_epochs: 2\n"                                       // 42
    "  mini_batches: 4\n"                                     // 43
    "train: {steps: 30, prompts_per_step: 8, micro_batch_tokens: 1000, eval_every: 5,\n"
    "        save_every: 10}\n"                               // 45
    "placement:\n"                                            // 46
    "  colocate: [[policy, reference]]\n"                     // 47
    "  endpoint: ipc:///tmp/troupe.sock\n"                    // 48
    "  attach: true\n"                                        // 49
    "log: {tensorboard: false, samples_every: 3, progress: false}\n";

static void test_full(void) {
    tr_recipe r;
    tr_err err = {0};
    int rc = tr_recipe_parse(full, strlen(full), "full.yaml", NULL, 0, &r, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(r.workflow == TR_RECIPE_PPO && r.seed == 7 && !strcmp(r.run_dir, "runs/full"));
    CHECK(r.backend == TR_RECIPE_CUDA && r.threads == 3);
    const tr_recipe_model *p = &r.models[TR_RECIPE_POLICY];
    CHECK(p->present && !strcmp(p->path, "ckpt/policy") && !p->has_init && p->from == TR_RECIPE_FROM_NONE);
    CHECK(p->parallel.tp == 1 && p->parallel.dp == 2 && p->devices.n == 2 && p->devices.ids[1] == 3);
    CHECK(p->optim.lr == 2.5e-6 && p->optim.weight_decay == 0.05 && p->optim.betas[0] == 0.9 &&
          p->optim.betas[1] == 0.95 && p->optim.eps == 1.0e-7 && p->optim.grad_clip == 0.5);
    CHECK(p->optim.schedule == TR_RECIPE_SCHED_COSINE && p->optim.warmup_steps == 12 &&
          p->optim.min_lr_ratio == 0.1);
    const tr_recipe_model *ref = &r.models[TR_RECIPE_REFERENCE];
    CHECK(ref->present && ref->from == TR_RECIPE_FROM_POLICY && !ref->path[0]);
    CHECK(ref->optim.lr == 1.0e-6);  // defaults fill the roles too
    const tr_recipe_model *c = &r.models[TR_RECIPE_CRITIC];
    CHECK(c->present && c->has_init && !strcmp(c->init_config, "cfg/critic.json") && c->init_seed == 9);
    CHECK(c->optim.lr == 1.0e-5 && c->optim.betas[1] == 0.999 && c->parallel.tp == 1);
    const tr_recipe_reward *rw = &r.reward;
    CHECK(rw->present && rw->kind == TR_RECIPE_REWARD_SERVICE && !strcmp(rw->endpoint, "tcp://127.0.0.1:5555"));
    CHECK(rw->timeout_ms == 1500 && rw->retries == 4 && rw->max_batch == 32);
    CHECK(rw->on_failure == TR_RECIPE_ON_FAILURE_ZERO && rw->curve.scale == 2.0 && rw->curve.shift == -1.0);
    CHECK(rw->curve.correct == 1.0 && rw->curve.wrong == 0.0);
    CHECK(!strcmp(r.data.train, "data/train.jsonl") && !strcmp(r.data.eval, "data/eval.jsonl"));
    CHECK(r.data.chat_format == TR_RECIPE_CHAT_LLAMA3 && !strcmp(r.data.prompt_key, "question"));
    CHECK(r.data.max_prompt_len == 100 && r.data.n_prefixes == 0 && !strcmp(r.data.split, "969,30,1"));
    CHECK(r.rollout.n == 4 && r.rollout.max_new_tokens == 50 && r.rollout.temperature == 0.7);
    CHECK(r.rollout.top_p == 0.9 && r.rollout.top_k == 20 && r.rollout.dynamic_sampling);
    CHECK(r.rollout.max_resample == 2 && r.rollout.overlong_buffer == 10 && r.rollout.overlong_penalty == 0.5);
    CHECK(r.rollout.stop_ids.n == 2 && r.rollout.stop_ids.ids[0] == 9 && r.rollout.stop_ids.ids[1] == 4);
    const tr_recipe_algorithm *a = &r.algorithm;
    CHECK(a->advantage == TR_ADV_GAE);  // not written: the ppo default
    CHECK(a->norm_by_std && a->gamma == 0.99 && a->lam == 0.95);
    CHECK(a->clip_low == 0.1 && a->clip_high == 0.3 && a->clip_dual == 3.0 && a->ratio == TR_RATIO_SEQUENCE);
    CHECK(a->kl_coef == 0.01 && a->kl_estimator == TR_KL_K2 && a->kl_placement == TR_KL_IN_REWARD);
    CHECK(a->entropy_coef == 0.001 && a->value_clip == 0.2 && a->loss_agg == TR_AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    CHECK(a->ppo_epochs == 2 && a->mini_batches == 4);
    CHECK(r.train.steps == 30 && r.train.prompts_per_step == 8 && r.train.batch_size == 16);
    CHECK(r.train.micro_batch_tokens == 1000 && r.train.eval_every == 5 && r.train.save_every == 10);
    CHECK(r.train.max_len == 150);  // resolved: max_prompt_len 100 + max_new_tokens 50
    CHECK(r.placement.n_colocate == 1 && r.placement.colocate_len[0] == 2);
    CHECK(r.placement.colocate[0][0] == TR_RECIPE_POLICY && r.placement.colocate[0][1] == TR_RECIPE_REFERENCE);
    CHECK(!strcmp(r.placement.endpoint, "ipc:///tmp/troupe.sock") && r.placement.attach);
    CHECK(!r.log.tensorboard && r.log.samples_every == 3 && !r.log.progress);
}

// A small valid recipe; the bad cases below change one line of it.
#define L1 "workflow: grpo\n"
#define L2 "run_dir: runs/t\n"
#define L3 "models:\n"
#define L4 "  policy:\n"
#define L5 "    path: m\n"
#define L6 "  reward: {kind: rule}\n"
#define L7 "data: {train: t.jsonl}\n"
#define L8 "train:\n"
#define L9 "  steps: 10\n"

// The error message must equal want exactly.
static void expect_error(const char *text, const char *const *sets, int n_sets, const char *want) {
    tr_recipe r;
    tr_err err = {0};
    int rc = tr_recipe_parse(text, strlen(text), "bad.yaml", sets, n_sets, &r, &err);
    CHECKF(rc == -1, "accepted, wanted: %s", want);
    CHECKF(rc == -1 && !strcmp(err.msg, want), "\n  got:    %s\n  wanted: %s", err.msg, want);
}

static void test_errors(void) {
    tr_recipe r;
    tr_err err = {0};
    const char *ok = L1 L2 L3 L4 L5 L6 L7 L8 L9;
    CHECKF(tr_recipe_parse(ok, strlen(ok), "ok.yaml", NULL, 0, &r, &err) == 0, "%s", err.msg);
    const char *qwen3[] = {"data.chat_format=qwen3", "data.enable_thinking=false"};
    CHECKF(tr_recipe_parse(ok, strlen(ok), "ok.yaml", qwen3, 1, &r, &err) == 0, "%s", err.msg);
    CHECK(r.data.chat_format == TR_RECIPE_CHAT_QWEN3 && r.data.enable_thinking &&
          !strcmp(tr_recipe_chat_names[r.data.chat_format], "qwen3"));
    CHECKF(tr_recipe_parse(ok, strlen(ok), "ok.yaml", qwen3, 2, &r, &err) == 0, "%s", err.msg);
    CHECK(r.data.chat_format == TR_RECIPE_CHAT_QWEN3 && !r.data.enable_thinking);
    expect_error(ok, qwen3 + 1, 1, "--set data.enable_thinking=false: data.enable_thinking: false "
                 "applies to chat_format qwen3 only (chatml has no think blocks)");

    // Unknown keys: the key's own position, the allowed keys and the nearest one.
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "  stepz: 3\n",
                 NULL, 0,
                 "bad.yaml:10:3: train.stepz: unknown key; allowed keys: steps, prompts_per_step, batch_size, "
                 "micro_batch_tokens, recompute, logit_rows, eval_every, save_every, save_dtype, max_len (did you mean 'steps'?)");
    expect_error(L1 L2 L3 L4 L5 "    optimizer: {lr: 1}\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:6:5: models.policy.optimizer: unknown key; allowed keys: path, init, from, "
                 "parallel, devices, optim (did you mean 'optim'?)");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "zzz: 1\n", NULL, 0,
                 "bad.yaml:10:1: zzz: unknown key; allowed keys: workflow, seed, run_dir, backend, precision, batch_invariant, share_prompts, threads, memory_gb, "
                 "models, data, rollout, algorithm, train, placement, log");
    // Wrong types, pointing at the value.
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 "  steps: ten\n", NULL, 0,
                 "bad.yaml:9:10: train.steps: expected an integer, got 'ten'");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 "  steps: \"10\"\n", NULL, 0,
                 "bad.yaml:9:10: train.steps: expected an integer, got the quoted string '10'");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 "  steps: 1.5\n", NULL, 0,
                 "bad.yaml:9:10: train.steps: expected an integer, got '1.5'");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "rollout: {temperature: [1]}\n", NULL, 0,
                 "bad.yaml:10:24: rollout.temperature: expected a number, got a list");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "log: {tensorboard: yes}\n", NULL, 0,
                 "bad.yaml:10:20: log.tensorboard: expected true or false, got 'yes'");
    expect_error(L1 L2 L3 L4 L5 L6 "data: [a]\n" L8 L9, NULL, 0,
                 "bad.yaml:7:7: data: expected a mapping, got a list");
    // Bad enum values list what is allowed.
    expect_error("workflow: gpro\n" L2 L3 L4 L5 L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:1:11: workflow: 'gpro' is not one of: grpo, ppo, sft, pretrain (did you mean 'grpo'?)");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "algorithm: {loss_agg: mean}\n", NULL, 0,
                 "bad.yaml:10:23: algorithm.loss_agg: 'mean' is not one of: token-mean, seq-mean-token-sum, "
                 "seq-mean-token-mean, seq-mean-token-sum-norm");
    // Impossible values.
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 "  steps: -5\n", NULL, 0,
                 "bad.yaml:9:10: train.steps: -5 is out of range: must be >= 1");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "rollout: {top_p: 0}\n", NULL, 0,
                 "bad.yaml:10:18: rollout.top_p: 0 is out of range: must be in (0, 1]");
    expect_error(L1 L2 L3 L4 L5 "    optim: {betas: [0.9, 1.0]}\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:6:26: models.policy.optim.betas[1]: 1 is out of range: must be in [0, 1)");
    // Missing required keys point at the mapping that should hold them.
    expect_error(L2 L3 L4 L5 L6 L7 L8 L9, NULL, 0, "bad.yaml:1:1: workflow: required key missing");
    expect_error(L1 L2 L3 L4 L5 L6 L7 "train: {batch_size: 4}\n", NULL, 0,
                 "bad.yaml:8:8: train.steps: required key missing");
    expect_error(L1 L2 L3 L6 L7 L8 L9, NULL, 0, "bad.yaml:4:3: models.policy: required key missing");
    // YAML itself: syntax errors and duplicate keys.
    expect_error(L1 L2 "  oops: [\n", NULL, 0,
                 "bad.yaml:3:7: YAML syntax error: mapping values are not allowed in this context");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "seed: 1\nseed: 2\n", NULL, 0,
                 "bad.yaml:11:1: duplicate key 'seed' (first at line 10)");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "---\nseed: 2\n", NULL, 0,
                 "bad.yaml:11:1: a recipe is a single YAML document; a second one starts here");
    expect_error("a: &x [*x]\n", NULL, 0, "bad.yaml:1:4: nesting deeper than 64 (a recursive alias?)");
    expect_error("", NULL, 0,
                 "bad.yaml: the recipe is empty (it needs at least workflow, run_dir, models.policy, train.steps)");

    // Rules across keys.
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "algorithm: {kl: {coef: 0.1}}\n", NULL, 0,
                 "bad.yaml:10:24: algorithm.kl.coef: a KL term needs models.reference (e.g. reference: {from: policy})");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "algorithm: {advantage: gae}\n", NULL, 0,
                 "bad.yaml:10:24: algorithm.advantage: gae needs models.critic (e.g. critic: {from: policy})");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "rollout: {n: 1}\n", NULL, 0,
                 "bad.yaml:10:14: rollout.n: advantage grpo compares responses within a group: needs n >= 2, got 1");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "algorithm: {clip: {dual: 0.5}}\n", NULL, 0,
                 "bad.yaml:10:26: algorithm.clip.dual: 0.5: the dual clip must be 0 (off) or > 1");
    expect_error(L1 L2 L3 L4 L5 "    init: {config: c.json}\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:5:5: models.policy: give only one of path, init");
    expect_error(L1 L2 L3 L4 L5 "    devices: [0, 1]\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:6:14: models.policy.devices: 2 devices for tp 1 x dp 1 = 1 ranks");
    expect_error(L1 L2 L3 L4 L5 "    parallel: {tp: 2, dp: 2}\n    devices: [0, 1]\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:7:14: models.policy.devices: 2 devices for tp 2 x dp 2 = 4 ranks");
    expect_error(L1 L2 L3 L4 L5 "    parallel: {sequence_parallel: true}\n" L6 L7 L8 L9, NULL, 0,
                 "bad.yaml:6:35: models.policy.parallel.sequence_parallel: true needs parallel.tp 2 or more "
                 "(it splits along the sequence what the tensor-parallel ranks would each hold whole)");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "placement: {colocate: [[policy, critic]]}\n", NULL, 0,
                 "bad.yaml:10:23: placement.colocate: role critic is not defined under models");
    expect_error(L1 L2 L3 L4 L5 "  reward: {kind: service, endpoint: localhost:5555}\n" L7 L8 L9, NULL, 0,
                 "bad.yaml:6:37: models.reward.endpoint: 'localhost:5555' is not a ZeroMQ endpoint (tcp://, ipc://, inproc://)");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "  max_len: 100\n", NULL, 0,
                 "bad.yaml:10:12: train.max_len: 100 is shorter than the longest row (768)");
    expect_error(L1 L2 L3 L4 L5 L6 "data: {train: \"\"}\n" L8 L9, NULL, 0,
                 "bad.yaml:7:15: data.train: workflow grpo needs a prompt set (JSONL)");
    expect_error("workflow: pretrain\n" L2 L3 L4 L5 L8 L9, NULL, 0,
                 "bad.yaml:1:1: data.prefixes: workflow pretrain needs indexed datasets: [{path: PREFIX, weight: 1.0}]");

    // Rules the workers or the controller used to find only once a run had started.
    expect_error("workflow: sft\n" L2 L3 L4 L5 "data: {train: t.jsonl}\n" L8 L9 "algorithm: {clip: {dual: 0.5}}\n", NULL, 0,
                 "bad.yaml:9:26: algorithm.clip.dual: 0.5: the dual clip must be 0 (off) or > 1");
    expect_error("workflow: sft\n" L2 L3 L4 L5 "data: {train: t.jsonl, chat_format: none}\n" L8 L9, NULL, 0,
                 "bad.yaml:6:37: data.chat_format: workflow sft renders conversations through a chat format "
                 "(chatml, llama3 or qwen3), not none");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "placement: {attach: true}\n", NULL, 0,
                 "bad.yaml:10:21: placement.attach: needs placement.endpoint: the address workers started "
                 "elsewhere connect to");
    expect_error(L1 L2 L3 L4 L5 "    parallel: {dp: 2}\n  reference: {from: policy}\n" L6 L7 L8 L9
                 "placement: {colocate: [[policy, reference]]}\n", NULL, 0,
                 "bad.yaml:12:23: placement.colocate: policy has parallel.dp 2 and reference 1; colocated roles "
                 "need the same data-parallel size");
    expect_error(L1 L2 L3 L4 L5 "  reward: {kind: rule, function: regex, pattern: \"(ab\"}\n" L7 L8 L9, NULL, 0,
                 "bad.yaml:6:50: models.reward.pattern: reward rule regex: pattern at offset 3: missing closing "
                 "parenthesis");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "  prompts_per_step: 40000\nrollout: {n: 65536}\n", NULL, 0,
                 "bad.yaml:10:21: train.prompts_per_step: prompts_per_step x rollout.n is more than 2147483647 "
                 "responses per step");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 "  steps: 9223372036854775807\nalgorithm: {mini_batches: 2}\n", NULL, 0,
                 "bad.yaml:9:10: train.steps: train.steps x algorithm.ppo_epochs x algorithm.mini_batches "
                 "optimizer steps overflow");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "rollout: {max_new_tokens: 8, min_new_tokens: 9}\n", NULL, 0,
                 "bad.yaml:10:46: rollout.min_new_tokens: 9 is more than rollout.max_new_tokens (8)");
    // Upper bounds are the workers' limits.
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "  micro_batch_tokens: 16777217\n", NULL, 0,
                 "bad.yaml:10:23: train.micro_batch_tokens: 16777217 is out of range: must be in [0, 16777216]");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "threads: 5000\n", NULL, 0,
                 "bad.yaml:10:10: threads: 5000 is out of range: must be in [0, 4096]");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "algorithm: {ppo_epochs: 1001}\n", NULL, 0,
                 "bad.yaml:10:25: algorithm.ppo_epochs: 1001 is out of range: must be in [1, 1000]");
    // A warmup longer than the run is no error (the schedule cuts it to the run).
    const char *warm = L1 L2 L3 "  policy: {path: m, optim: {schedule: cosine, warmup_steps: 50}}\n" L6 L7 L8 "  steps: 3\n";
    CHECKF(tr_recipe_parse(warm, strlen(warm), "ok.yaml", NULL, 0, &r, &err) == 0, "%s", err.msg);
}

static void test_overrides(void) {
    const char *ok = L1 L2 L3 L4 L5 L6 L7 L8 L9;
    tr_recipe r;
    tr_err err = {0};
    const char *sets[] = {
        "algorithm.clip.low=0.1",                 // nested, existing mapping absent in the file
        "train.steps=25",                         // replaces a value from the file
        "models.policy.optim.betas=[0.8, 0.9]",   // a list
        "models.reference={from: policy}",        // a new role as a flow mapping
        "algorithm.kl.coef=0.02",                 // valid only because of the line above
        "models.reward.pattern=#(\\d+)",          // literal: '#' is not a YAML comment here
        "run_dir='runs/q x'",                     // a quoted string
        "placement.colocate=[[policy, reference]]",
    };
    int rc = tr_recipe_parse(ok, strlen(ok), "ok.yaml", sets, 8, &r, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(r.algorithm.clip_low == 0.1 && r.algorithm.clip_high == 0.2);
    CHECK(r.train.steps == 25);
    CHECK(r.models[TR_RECIPE_POLICY].optim.betas[0] == 0.8 && r.models[TR_RECIPE_POLICY].optim.betas[1] == 0.9);
    CHECK(r.models[TR_RECIPE_REFERENCE].present && r.models[TR_RECIPE_REFERENCE].from == TR_RECIPE_FROM_POLICY);
    CHECK(r.algorithm.kl_coef == 0.02);
    CHECK(!strcmp(r.reward.pattern, "#(\\d+)"));
    CHECK(!strcmp(r.run_dir, "runs/q x"));
    CHECK(r.placement.n_colocate == 1);
    // Later overrides win.
    const char *twice[] = {"seed=3", "seed=4"};
    CHECK(tr_recipe_parse(ok, strlen(ok), "ok.yaml", twice, 2, &r, &err) == 0 && r.seed == 4);

    // Errors name the override.
    const char *s1[] = {"train.steps=many"};
    expect_error(ok, s1, 1, "--set train.steps=many: train.steps: expected an integer, got 'many'");
    const char *s2[] = {"algorithm.clip.lowe=0.1"};
    expect_error(ok, s2, 1, "--set algorithm.clip.lowe=0.1: algorithm.clip.lowe: unknown key; allowed keys: "
                            "low, high, dual (did you mean 'low'?)");
    const char *s3[] = {"models.policy.optim.betas=[0.9]"};
    expect_error(ok, s3, 1, "--set models.policy.optim.betas=[0.9]: models.policy.optim.betas: expected a list "
                            "of 2 numbers, got 1 items");
    const char *s4[] = {"train.steps.x=1"};
    expect_error(ok, s4, 1, "--set train.steps.x=1: 'train.steps' is a value (bad.yaml:9:10), not a mapping");
    const char *s5[] = {"train.steps"};
    expect_error(ok, s5, 1, "--set train.steps: expected KEY=VALUE (e.g. train.steps=10)");
    const char *s6[] = {"rollout.n=1"};
    expect_error(ok, s6, 1, "--set rollout.n=1: rollout.n: advantage grpo compares responses within a group: "
                            "needs n >= 2, got 1");
    const char *s7[] = {"workflow=sfx"};
    expect_error(ok, s7, 1, "--set workflow=sfx: workflow: 'sfx' is not one of: grpo, ppo, sft, pretrain "
                            "(did you mean 'sft'?)");
    const char *s8[] = {"models.policy.devices=[0, 1"};
    expect_error(ok, s8, 1, "--set models.policy.devices=[0, 1: YAML syntax error: did not find expected ',' "
                            "or ']' while parsing a flow sequence");
    // A recipe made only of overrides.
    const char *only[] = {"workflow=sft", "run_dir=r", "models.policy.path=m", "data.train=d.jsonl",
                          "train.steps=3"};
    CHECK(tr_recipe_parse("", 0, "empty.yaml", only, 5, &r, &err) == 0);
    CHECK(r.workflow == TR_RECIPE_SFT && r.train.max_len == 2048);
}

static void test_round_trip(void) {
    tr_recipe a, b;
    tr_err err = {0};
    CHECK(tr_recipe_parse(full, strlen(full), "full.yaml", NULL, 0, &a, &err) == 0);
    char *y1, *y2;
    size_t n1, n2;
    CHECK(tr_recipe_emit(&a, &y1, &n1, &err) == 0);
    int rc = tr_recipe_parse(y1, n1, "resolved.yaml", NULL, 0, &b, &err);
    CHECKF(rc == 0, "%s", err.msg);
    char key[256];
    CHECKF(tr_recipe_diff(&a, &b, key, sizeof key) == 0, "differs at %s", key);
    CHECK(tr_recipe_emit(&b, &y2, &n2, &err) == 0);
    CHECK(n1 == n2 && !strcmp(y1, y2));
    free(y2);
    // diff finds a change, and names it.
    b.algorithm.clip_high = 0.31;
    CHECK(tr_recipe_diff(&a, &b, key, sizeof key) == 1 && !strcmp(key, "algorithm.clip.high"));
    b = a;
    b.models[TR_RECIPE_CRITIC].init_seed = 10;
    CHECK(tr_recipe_diff(&a, &b, key, sizeof key) == 1 && !strcmp(key, "models.critic.init.seed"));

    // Values that need care in YAML: quotes, backslashes, a '#', a colon, numbers that only
    // round-trip with 17 digits, a negative zero, a pretrain prefix list.
    const char *sets[] = {"workflow=pretrain", "run_dir=\"we\\\"ird: #dir\\\\x\"",
                          "data.prefixes=[{path: a/b, weight: 0.1}, {path: 'c d', weight: 3}]",
                          "models.policy.optim.lr=0.30000000000000004", "models.reward.curve.shift=-0.0",
                          "data.split=\"1,0,0\"", "train.max_len=0", "train.micro_batch_tokens=4096"};
    tr_recipe c, d;
    rc = tr_recipe_parse(y1, n1, "resolved.yaml", sets, 8, &c, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(!strcmp(c.run_dir, "we\"ird: #dir\\x") && c.data.n_prefixes == 2 && c.data.prefixes[1].weight == 3.0);
    CHECK(c.models[TR_RECIPE_POLICY].optim.lr == 0.1 + 0.2);
    free(y1);
    CHECK(tr_recipe_emit(&c, &y1, &n1, &err) == 0);
    rc = tr_recipe_parse(y1, n1, "resolved.yaml", NULL, 0, &d, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECKF(tr_recipe_diff(&c, &d, key, sizeof key) == 0, "differs at %s", key);
    CHECK(signbit(d.reward.curve.shift));
    free(y1);

    // Written into run_dir atomically (the directory is created), and it loads back.
    const char *dir = tr_test_tmpdir();
    char run_dir[512], path[600];
    snprintf(run_dir, sizeof run_dir, "%s/runs/one", dir);
    snprintf(a.run_dir, sizeof a.run_dir, "%s", run_dir);
    CHECK(tr_recipe_write_resolved(&a, &err) == 0);
    snprintf(path, sizeof path, "%s/resolved.yaml", run_dir);
    rc = tr_recipe_load(path, NULL, 0, &b, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECKF(tr_recipe_diff(&a, &b, key, sizeof key) == 0, "differs at %s", key);
    CHECK(tr_recipe_load("/nonexistent/recipe.yaml", NULL, 0, &b, &err) == -1 && err.code == TR_EIO);
}

// models.generator: replicas and parallel.dp are one number, a tp of its own is taken, the
// layout and backend are checked at load, the pipeline refuses dynamic sampling, and the
// section round-trips.
// Where algorithm.old_logprobs: auto takes the ratio's old logprobs from generation: where the
// backend reports the training path's bits (cpu; cuda in bf16 with batch_invariant) and the
// sampler runs the policy's layout and weights (no generator, or one at the policy's tp that is
// not a step off). rollout and recompute say so whatever the rest.
static void test_old_logprobs(void) {
    static const struct {
        const char *sets[3];
        bool rollout;
    } cases[] = {
        {{NULL}, true},
        {{"backend=cuda"}, true},
        {{"backend=cuda", "precision=fp32"}, false},
        {{"backend=cuda", "batch_invariant=false"}, false},
        {{"backend=cpu", "batch_invariant=false"}, true},
        {{"models.generator={replicas: 2}"}, true},
        {{"models.generator={parallel: {tp: 2}}"}, false},
        {{"models.generator={one_step_off: true}"}, false},
        {{"algorithm.old_logprobs=recompute"}, false},
        {{"backend=cuda", "precision=fp32", "algorithm.old_logprobs=rollout"}, true},
    };
    const char *base = L1 L2 L3 L4 L5 L6 L7 L8 L9;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = 0;
        while (n < 3 && cases[i].sets[n]) n++;
        tr_recipe r;
        tr_err err = {0};
        int rc = tr_recipe_parse(base, strlen(base), "ok.yaml", cases[i].sets, n, &r, &err);
        CHECKF(rc == 0, "case %zu: %s", i, err.msg);
        if (rc == 0)
            CHECKF(tr_recipe_old_lp_from_rollout(&r) == cases[i].rollout, "case %zu: from the rollout %d, want %d",
                   i, tr_recipe_old_lp_from_rollout(&r), cases[i].rollout);
    }
}

static void test_generator(void) {
    tr_recipe r, b;
    tr_err err = {0};
    const char *base = L1 L2 L3 L4 L5 L6 L7 L8 L9;
    const char *two[] = {"models.generator={replicas: 2, one_step_off: true, sync_bucket_mb: 8}",
                         "algorithm.tis_cap=3"};
    int rc = tr_recipe_parse(base, strlen(base), "gen.yaml", two, 2, &r, &err);
    CHECKF(rc == 0, "%s", err.msg);
    const tr_recipe_generator *g = &r.generator;
    CHECK(g->present && g->parallel.dp == 2 && g->replicas == 2 && g->parallel.tp == 1 && g->one_step_off);
    CHECK(g->sync_bucket_mb == 8 && !g->verify_sync && g->backend == TR_RECIPE_GEN_BACKEND_RUN);
    CHECK(r.algorithm.tis_cap == 3.0);
    char *y;
    size_t n;
    char key[256];
    CHECK(tr_recipe_emit(&r, &y, &n, &err) == 0);
    rc = tr_recipe_parse(y, n, "resolved.yaml", NULL, 0, &b, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECKF(tr_recipe_diff(&r, &b, key, sizeof key) == 0, "differs at %s", key);
    free(y);
    const char *dp[] = {"models.generator={parallel: {dp: 3}}"};
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", dp, 1, &r, &err);
    CHECKF(rc == 0 && r.generator.replicas == 3 && r.generator.parallel.dp == 3, "%s", err.msg);
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", NULL, 0, &r, &err);
    CHECK(rc == 0 && !r.generator.present && r.algorithm.tis_cap == 2.0);

    // A layout of its own: the sync reshards between the policy's tp and the generator's.
    const char *tp[] = {"models.generator={replicas: 2, parallel: {tp: 2}}", "models.policy.parallel.tp=4"};
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", tp, 2, &r, &err);
    CHECKF(rc == 0 && r.generator.parallel.tp == 2 && r.generator.parallel.dp == 2 &&
           r.models[TR_RECIPE_POLICY].parallel.tp == 4, "%s", err.msg);

    // Shared weights: yes on the CPU (shared memory); auto only on CUDA, where generator rank
    // r sits on policy rank r's device at the policy's tp.
    CHECK(!tr_recipe_generator_shares(&r));
    const char *yes[] = {"models.generator={replicas: 2, share_weights: yes}", "models.policy.parallel.dp=2"};
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", yes, 2, &r, &err);
    CHECKF(rc == 0 && tr_recipe_generator_shares(&r), "%s", err.msg);
    const char *cuda[] = {"backend=cuda", "models.generator={}"};
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", cuda, 2, &r, &err);
    CHECKF(rc == 0 && tr_recipe_generator_shares(&r), "%s", err.msg);   // both on device 0
    const char *apart[] = {"backend=cuda", "models.generator={devices: [1]}"};
    rc = tr_recipe_parse(base, strlen(base), "gen.yaml", apart, 2, &r, &err);
    CHECKF(rc == 0 && !tr_recipe_generator_shares(&r), "%s", err.msg);

    const char *gen = L1 L2 L3 L4 L5 L6;
    char text[512];
    snprintf(text, sizeof text, "%s  generator: {parallel: {tp: 2}, share_weights: yes}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:7:49: models.generator.share_weights: yes, but generator rank r reads policy "
                 "rank r's weights: the generator needs the policy's tp (1, not 2), at most its 1 ranks");
    snprintf(text, sizeof text, "backend: cuda\n%s  generator: {devices: [0], share_weights: no}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:8:24: models.generator.devices: generator rank 0 and policy rank 0 are both "
                 "on device 0: a copying sync cannot join two processes on one GPU; give the generator devices of its "
                 "own, or share the weights (share_weights: auto shares when generator rank r is on policy rank r's "
                 "device at the policy's tp)");
    snprintf(text, sizeof text, "%s  generator: {replicas: 2, parallel: {tp: 2}, devices: [0, 1]}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:7:56: models.generator.devices: 2 devices for tp 2 x dp 2 = 4 ranks");
    snprintf(text, sizeof text, "%s  generator: {replicas: 2, parallel: {dp: 3}}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:7:25: models.generator.replicas: 2, but parallel.dp says 3: give one of them");
    snprintf(text, sizeof text, "%s  generator: {replicas: 2, devices: [0]}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:7:37: models.generator.devices: 1 devices for tp 1 x dp 2 = 2 ranks");
    snprintf(text, sizeof text, "%s  generator: {backend: cuda}\n" L7 L8 L9, gen);
    expect_error(text, NULL, 0, "bad.yaml:7:24: models.generator.backend: cuda, but the policy runs on cpu: the weight "
                 "sync's communicator spans both, so they share one backend (run: the recipe's)");
    snprintf(text, sizeof text, "%s  generator: {one_step_off: true}\n" L7 L8 L9 "rollout: {dynamic_sampling: true}\n",
             gen);
    expect_error(text, NULL, 0, "bad.yaml:7:29: models.generator.one_step_off: cannot go with rollout.dynamic_sampling: "
                 "a batch sampled a step ahead cannot draw more prompts within its step");
    snprintf(text, sizeof text, "%s  generator: {}\n" L7 L8 L9 "placement: {colocate: [[policy, generator]]}\n", gen);
    expect_error(text, NULL, 0, "bad.yaml:11:23: placement.colocate: the generator runs in processes of its own (to "
                 "generate in the policy's process, leave models.generator out)");
    expect_error("workflow: sft\n" L2 L3 L4 L5 "  generator: {}\n" "data: {train: t.jsonl}\n" L8 L9, NULL, 0,
                 "bad.yaml:6:14: models.generator: workflow sft does not generate (grpo and ppo do)");
    snprintf(text, sizeof text, "%s  generator: {one_step_off: true}\n" L7 L8 L9 "algorithm: {old_logprobs: rollout}\n",
             gen);
    expect_error(text, NULL, 0, "bad.yaml:11:27: algorithm.old_logprobs: rollout cannot go with "
                 "models.generator.one_step_off: those rollouts come from the previous step's weights, and the "
                 "ratio's old logprobs must be the current policy's");
    expect_error(base, (const char *const[]){"algorithm.tis_cap=0.5"}, 1,
                 "--set algorithm.tis_cap=0.5: algorithm.tis_cap: 0.5 is out of range: must be >= 1");
}

// rollout.stop_ids: distinct ids kept in the recipe's order, hundreds of them through --set,
// reaching the sampling settings every generate call sends; repeats, negative ids, a scalar
// and more ids than the recipe holds are errors naming the item.
static void test_stop_ids(void) {
    const char *ok = L1 L2 L3 L4 L5 L6 L7 L8 L9;
    tr_recipe r;
    tr_err err = {0};
    CHECK(tr_recipe_parse(ok, strlen(ok), "ok.yaml", NULL, 0, &r, &err) == 0 && r.rollout.stop_ids.n == 0);
    CHECK(tr_rl_sampling(&r, 1, 0).n_extra_stop == 0);
    // One id in 256 of a 151,936-id vocabulary (the GPU benchmark's realistic lengths), listed
    // from the top down.
    enum { N = 594 };
    char *set = malloc(32 + (size_t)N * 8);
    CHECK(set != NULL);
    if (!set) return;
    size_t len = (size_t)sprintf(set, "rollout.stop_ids=[");
    for (int i = N - 1; i >= 0; i--) len += (size_t)sprintf(set + len, "%d%s", 91 + 256 * i, i ? ", " : "]");
    const char *sets[] = {set};
    int rc = tr_recipe_parse(ok, strlen(ok), "ok.yaml", sets, 1, &r, &err);
    CHECKF(rc == 0, "%s", err.msg);
    CHECK(r.rollout.stop_ids.n == N && r.rollout.stop_ids.ids[0] == 91 + 256 * (N - 1) &&
          r.rollout.stop_ids.ids[N - 1] == 91);
    tr_sampling s = tr_rl_sampling(&r, 1, 0);
    CHECK(s.n_extra_stop == N && s.extra_stop_ids == r.rollout.stop_ids.ids);
    // The resolved recipe keeps them.
    char *y;
    size_t ny;
    tr_recipe b;
    CHECK(tr_recipe_emit(&r, &y, &ny, &err) == 0);
    CHECK(tr_recipe_parse(y, ny, "resolved.yaml", NULL, 0, &b, &err) == 0 && tr_recipe_diff(&r, &b, NULL, 0) == 0);
    free(y);
    // More than the recipe holds.
    free(set);
    set = malloc(32 + (size_t)(TR_RECIPE_MAX_STOP_IDS + 1) * 8);
    CHECK(set != NULL);
    if (!set) return;
    len = (size_t)sprintf(set, "rollout.stop_ids=[");
    for (int i = 0; i <= TR_RECIPE_MAX_STOP_IDS; i++)
        len += (size_t)sprintf(set + len, "%d%s", i, i < TR_RECIPE_MAX_STOP_IDS ? ", " : "]");
    sets[0] = set;
    CHECK(tr_recipe_parse(ok, strlen(ok), "ok.yaml", sets, 1, &r, &err) == -1 &&
          strstr(err.msg, "rollout.stop_ids: 8193 ids, at most 8192") != NULL);
    free(set);
    const char *twice[] = {"rollout.stop_ids=[5, 7, 5]"};
    expect_error(ok, twice, 1, "--set rollout.stop_ids=[5, 7, 5]: rollout.stop_ids[2]: id 5 is listed twice "
                               "(first at [0])");
    const char *neg[] = {"rollout.stop_ids=[3, -1]"};
    expect_error(ok, neg, 1, "--set rollout.stop_ids=[3, -1]: rollout.stop_ids[1]: -1 is out of range: must be in "
                             "[0, 2147483647]");
    const char *scalar[] = {"rollout.stop_ids=7"};
    expect_error(ok, scalar, 1, "--set rollout.stop_ids=7: rollout.stop_ids: expected a list of token ids, got '7'");
    expect_error(L1 L2 L3 L4 L5 L6 L7 L8 L9 "rollout:\n  stop_ids: [1, x]\n", NULL, 0,
                 "bad.yaml:11:17: rollout.stop_ids[1]: expected an integer, got 'x'");
}

static void test_defaults(void) {
    tr_recipe r;
    tr_err err = {0};
    CHECK(tr_recipe_defaults(&r, &err) == 0);
    CHECK(!r.models[TR_RECIPE_POLICY].present && !r.reward.present);
    CHECK(r.seed == 1 && r.backend == TR_RECIPE_CPU && r.rollout.n == 8 && r.rollout.top_p == 1.0);
    CHECK(r.algorithm.clip_low == 0.2 && r.algorithm.clip_high == 0.2 && r.algorithm.norm_by_std);
    CHECK(r.algorithm.kl_estimator == TR_KL_K3 && r.algorithm.loss_agg == TR_AGG_TOKEN_MEAN);
    CHECK(r.models[TR_RECIPE_CRITIC].optim.betas[1] == 0.999 && r.reward.timeout_ms == 30000);
    CHECK(!strcmp(r.data.prompt_key, "prompt") && r.data.pack && r.log.tensorboard);
}

int main(void) {
    test_full();
    test_errors();
    test_overrides();
    test_round_trip();
    test_old_logprobs();
    test_generator();
    test_stop_ids();
    test_defaults();
    return tr_test_summary("test_recipe");
}
