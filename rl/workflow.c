// The run around every workflow: checks the run directory (fresh or resumed), writes the
// resolved recipe, loads the tokenizer and chat format, opens the metrics log, starts the
// role workers through the controller, restores the last checkpoint on --resume, runs the
// workflow and stops the workers. Also the eval/checkpoint schedules and step checkpoints.
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/file.h"
#include "rl/controller.h"
#include "rl/run_ckpt.h"
#include "rl/workflow.h"

// Roles whose weights change during the run, so a checkpoint must hold them.
static int trained_roles(const tr_run *run, tr_group **groups, const char **names) {
    int n = 0;
    groups[n] = run->policy;
    names[n++] = "policy";
    if (run->recipe->workflow == TR_RECIPE_PPO && run->critic) {
        groups[n] = run->critic;
        names[n++] = "critic";
    }
    return n;
}

int tr_run_checkpoint(tr_run *run, int64_t step, tr_err *err) {
    const char *run_dir = run->recipe->run_dir;
    char tmp[4096], dir[4200];
    if (tr_run_ckpt_begin(run_dir, step, tmp, sizeof tmp, err)) return -1;
    tr_group *groups[TR_RECIPE_N_ROLES];
    const char *names[TR_RECIPE_N_ROLES];
    int n = trained_roles(run, groups, names);
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/%s", tmp, names[i]);
        if (tr_role_save(groups[i], dir, err)) {
            // The half-written step goes; the previous checkpoint is what a resume takes.
            tr_err ignore;
            tr_remove_tree(tmp, &ignore);
            return tr_err_wrap(err, "checkpoint of step %" PRId64 ", %s", step, names[i]);
        }
    }
    tr_run_state st = {step, run->data_cursor, ""};
    snprintf(st.workflow, sizeof st.workflow, "%s", tr_recipe_workflow_names[run->recipe->workflow]);
    if (tr_run_ckpt_commit(run_dir, tmp, &st, err))
        return tr_err_wrap(err, "checkpoint of step %" PRId64, step);
    return 0;
}

// memory/<role>/<part> in GiB for every role with a model, as its init reported it, and the
// plan's choices: plan/<role>/micro_batch_tokens and plan/<role>/recompute (0 or 1).
static int log_role_setup(tr_run *run, tr_err *err) {
    char key[TR_METRICS_KEY_MAX];
    for (int role = 0; role < TR_RECIPE_N_ROLES; role++) {
        const tr_role_info *in = tr_controller_role_info(run->ctl, (enum tr_recipe_role)role);
        if (!in || in->n_params == 0) continue;
        const char *name = tr_recipe_role_names[role];
        for (int i = 0; i < TR_MEM_PARTS; i++) {
            snprintf(key, sizeof key, "memory/%s/%s", name, tr_mem_part_names[i]);
            if (tr_metrics_set(&run->m, key, (double)in->memory[i] / (1 << 30), err)) return -1;
        }
        snprintf(key, sizeof key, "plan/%s/micro_batch_tokens", name);
        if (tr_metrics_set(&run->m, key, in->max_tokens, err)) return -1;
        snprintf(key, sizeof key, "plan/%s/recompute", name);
        if (tr_metrics_set(&run->m, key, in->recompute, err)) return -1;
    }
    return 0;
}

int tr_run_step_end(tr_run *run, int64_t step, double tokens, double t_step, tr_err *err) {
    double dt = tr_metrics_now() - t_step;
    if (log_role_setup(run, err) || tr_metrics_set(&run->m, "throughput/tokens_per_s", tokens / dt, err) ||
        tr_metrics_set(&run->m, "time/step", dt, err) || tr_metrics_commit(&run->m, err))
        return -1;
    run->step = step;
    if (tr_run_save_due(step, run->recipe->train.steps, run->recipe->train.save_every) &&
        tr_run_checkpoint(run, step, err))
        return -1;
    return 0;
}

// tokenizer.json of the policy: in its checkpoint directory, or beside init.config.
static int tokenizer_path(const tr_recipe *r, char *out, size_t cap) {
    const tr_recipe_model *p = &r->models[TR_RECIPE_POLICY];
    if (p->path[0]) {
        snprintf(out, cap, "%s/tokenizer.json", p->path);
    } else {
        char cfg[TR_RECIPE_PATH_MAX];
        snprintf(cfg, sizeof cfg, "%s", p->init_config);
        snprintf(out, cap, "%s/tokenizer.json", dirname(cfg));
    }
    return tr_file_exists(out);
}

// Keys a resumed run may change: how long it runs and what it logs.
static int check_resume_recipe(const tr_recipe *r, tr_err *err) {
    char path[TR_RECIPE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/resolved.yaml", r->run_dir);
    if (!tr_file_exists(path)) return 0;
    tr_recipe *old = malloc(sizeof *old);
    if (!old) return tr_errf(err, TR_ENOMEM, "out of memory");
    if (tr_recipe_load(path, NULL, 0, old, err)) {
        free(old);
        return tr_err_wrap(err, "--resume: reading the run's recipe");
    }
    old->train.steps = r->train.steps;
    old->train.eval_every = r->train.eval_every;
    old->train.save_every = r->train.save_every;
    old->log = r->log;
    // Checkpoints hold whole weights (gathered from tensor-parallel shards) and whole or
    // sharded optimizer moments, so a run resumes on another number of data-parallel or
    // tensor-parallel ranks (and other devices).
    for (int role = 0; role < TR_RECIPE_REWARD; role++) {
        old->models[role].parallel.dp = r->models[role].parallel.dp;
        old->models[role].parallel.tp = r->models[role].parallel.tp;
        old->models[role].parallel.sequence_parallel = r->models[role].parallel.sequence_parallel;
        old->models[role].devices = r->models[role].devices;
    }
    old->reward.parallel.dp = r->reward.parallel.dp;
    old->reward.parallel.tp = r->reward.parallel.tp;
    old->reward.parallel.sequence_parallel = r->reward.parallel.sequence_parallel;
    old->reward.devices = r->reward.devices;
    // Where generation runs does not change what is sampled; the pipeline does.
    old->generator.parallel.dp = r->generator.parallel.dp;
    old->generator.replicas = r->generator.replicas;
    old->generator.devices = r->generator.devices;
    old->generator.verify_sync = r->generator.verify_sync;
    char key[256];
    int d = tr_recipe_diff(old, r, key, sizeof key);
    free(old);
    if (d)
        return tr_errf(err, TR_EINVAL, "--resume: %s differs from the run's %s (only train.steps, "
                       "train.eval_every, train.save_every, log.*, the parallel.tp, parallel.dp, "
                       "parallel.sequence_parallel and devices of models and the generator's replicas "
                       "and verify_sync may change on resume)", key, path);
    return 0;
}

// Fresh or resumed: a fresh run never writes over an earlier one; a resumed one starts after
// the step of its last checkpoint, with the same workflow and a compatible recipe.
static int prepare_run_dir(tr_run *run, const tr_workflow_opts *o, tr_err *err) {
    const tr_recipe *r = run->recipe;
    const char *run_dir = r->run_dir;
    tr_run_state st;
    if (tr_run_ckpt_find_last(run_dir, &st, err)) return -1;
    if (o->resume) {
        if (st.step >= 0 && strcmp(st.workflow, tr_recipe_workflow_names[r->workflow]) != 0)
            return tr_errf(err, TR_EINVAL, "--resume: %s holds a %s run, the recipe is %s", run_dir,
                           st.workflow, tr_recipe_workflow_names[r->workflow]);
        if (check_resume_recipe(r, err) || tr_run_ckpt_clean(run_dir, err)) return -1;
        if (st.step >= 0) {
            run->step = st.step;
            run->data_cursor = st.data_cursor;
            run->resumed = true;
        }
    } else {
        // An earlier run that logged a step or saved a checkpoint is kept; one that failed
        // before its first record (a wrong path in the recipe) may be started over.
        char path[TR_RECIPE_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
        struct stat sb;
        if (st.step >= 0 || (stat(path, &sb) == 0 && sb.st_size > 0))
            return tr_errf(err, TR_EINVAL, "%s holds an earlier run: continue it with --resume, or "
                           "choose another run_dir (--set run_dir=...)", run_dir);
    }
    if (run->resumed && run->step >= r->train.steps)
        return tr_errf(err, TR_EINVAL, "--resume: the run already completed step %" PRId64 " of %"
                       PRId64 " (raise train.steps to continue)", run->step, r->train.steps);
    return 0;
}

// Tokenizer and chat format (pretraining works on ids and may have none).
static int load_tokenizer(tr_run *run, tr_err *err) {
    const tr_recipe *r = run->recipe;
    char path[TR_RECIPE_PATH_MAX + 64];
    if (tokenizer_path(r, path, sizeof path)) {
        if (tr_tokenizer_load(&run->tok, path, err)) return -1;
    } else if (r->workflow != TR_RECIPE_PRETRAIN) {
        return tr_errf(err, TR_EINVAL, "%s: not found (the policy's tokenizer.json is needed to "
                       "encode prompts and conversations)", path);
    }
    if (run->tok && r->data.chat_format != TR_RECIPE_CHAT_NONE) {
        if (tr_chat_format_init(&run->chat, tr_recipe_chat_names[r->data.chat_format], run->tok,
                                err))
            return -1;
        run->chat.enable_thinking = r->data.enable_thinking;
        run->chatp = &run->chat;
    }
    return 0;
}

// The metrics log, and samples.jsonl (appended to on resume) when samples are logged.
// *metrics_open says whether the log needs closing, also when this fails.
static int open_logs(tr_run *run, const tr_workflow_opts *o, bool *metrics_open, tr_err *err) {
    const tr_recipe *r = run->recipe;
    tr_metrics_opts mo = {r->run_dir, tr_recipe_workflow_names[r->workflow], r->train.steps,
                          run->resumed ? run->step : -1, r->log.tensorboard, r->log.progress,
                          o->progress_out};
    if (tr_metrics_open(&run->m, &mo, err)) return -1;
    *metrics_open = true;
    if (r->log.samples_every > 0) {
        char path[TR_RECIPE_PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/samples.jsonl", r->run_dir);
        run->samples = fopen(path, run->resumed ? "a" : "w");
        if (!run->samples)
            return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    }
    return 0;
}

// The role workers; a resumed run loads its trained roles from the checkpoint.
static int start_roles(tr_run *run, tr_err *err) {
    if (tr_controller_start(&run->ctl, run->recipe, err)) return -1;
    run->policy = tr_controller_group(run->ctl, TR_RECIPE_POLICY);
    run->reference = tr_controller_group(run->ctl, TR_RECIPE_REFERENCE);
    run->critic = tr_controller_group(run->ctl, TR_RECIPE_CRITIC);
    run->reward = tr_controller_group(run->ctl, TR_RECIPE_REWARD);
    run->generator = tr_controller_group(run->ctl, TR_RECIPE_GENERATOR);
    run->sampler = run->generator ? run->generator : run->policy;
    if (!run->resumed) return 0;
    char ck[4096], dir[4200];
    if (tr_run_ckpt_path(run->recipe->run_dir, run->step, ck, sizeof ck, err)) return -1;
    tr_group *groups[TR_RECIPE_N_ROLES];
    const char *names[TR_RECIPE_N_ROLES];
    int n = trained_roles(run, groups, names);
    for (int i = 0; i < n; i++) {
        snprintf(dir, sizeof dir, "%s/%s", ck, names[i]);
        if (tr_role_load(groups[i], dir, err)) return tr_err_wrap(err, "--resume: loading %s", dir);
    }
    return 0;
}

int tr_workflow_run(const tr_recipe *r, const tr_workflow_opts *o, tr_err *err) {
    tr_run run;
    memset(&run, 0, sizeof run);
    run.recipe = r;
    if (prepare_run_dir(&run, o, err)) return -1;
    int rc = -1;
    bool metrics_open = false;
    if (load_tokenizer(&run, err) || tr_recipe_write_resolved(r, err) ||
        open_logs(&run, o, &metrics_open, err) || start_roles(&run, err))
        goto done;

    switch (r->workflow) {
    case TR_RECIPE_GRPO:
    case TR_RECIPE_PPO: rc = tr_workflow_rl(&run, err); break;
    case TR_RECIPE_SFT: rc = tr_workflow_sft(&run, err); break;
    case TR_RECIPE_PRETRAIN: rc = tr_workflow_pretrain(&run, err); break;
    }
    // A failure inside a step names it; one before the first step, or in the step-0
    // evaluation (which names itself), is no step's.
    if (rc && run.m.step > run.step) tr_err_wrap(err, "step %" PRId64, run.m.step);

done:
    if (run.ctl) {
        tr_err serr = {0};
        if (tr_controller_stop(run.ctl, &serr) && rc == 0) {
            *err = serr;
            rc = -1;
        }
    }
    if (run.samples) fclose(run.samples);
    if (metrics_open) tr_metrics_close(&run.m);
    tr_tokenizer_free(run.tok);
    return rc;
}
