// `troupe run RECIPE [--set KEY=VALUE]... [--resume]`: reads and checks the recipe, then runs
// its workflow (GRPO, PPO, SFT or pretraining) with the role workers it describes. Progress
// goes to stderr; metrics, checkpoints and the resolved recipe go into run_dir.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/err.h"
#include "rl/recipe.h"
#include "rl/workflow.h"

static const char *CMD = "run";

int tr_cmd_run(int argc, char **argv) {
    tr_str_list sets = {0};
    bool resume = false, help = false;
    tr_arg table[] = {
        {"set", TR_ARG_STR_LIST, &sets, "KEY=VALUE",
         "override a recipe key (repeatable), e.g. --set train.steps=10", false, false},
        {"resume", TR_ARG_FLAG, &resume, NULL,
         "continue the run in run_dir from its last complete checkpoint", false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    const char *pos[2];
    int n_pos = 0;
    int rc = tr_args_parse(CMD, argc, argv, table, pos, 2, &n_pos, &help);
    if (rc) return rc;
    if (help) {
        tr_args_usage(CMD, "RECIPE [--set KEY=VALUE]... [--resume]",
                      "Runs the workflow of a YAML recipe (grpo, ppo, sft, pretrain): starts the role\n"
                      "workers, trains for train.steps steps, evaluates and checkpoints as scheduled.\n"
                      "run_dir receives resolved.yaml (the recipe as run), metrics.jsonl (one JSON\n"
                      "object per step), tensorboard/ (with log.tensorboard) and\n"
                      "checkpoints/step_N/<role>/ (Hugging Face directories with training state).\n"
                      "A fresh run refuses a run_dir that holds an earlier run; --resume continues it.",
                      table);
        return 0;
    }
    if (n_pos != 1) {
        fprintf(stderr, "troupe %s: expected one RECIPE file, got %d arguments (see troupe %s --help)\n",
                CMD, n_pos, CMD);
        return 2;
    }
    tr_recipe *r = malloc(sizeof *r);
    if (!r) {
        fprintf(stderr, "troupe %s: out of memory\n", CMD);
        return 1;
    }
    tr_err err = {0};
    if (tr_recipe_load(pos[0], sets.items, sets.n, r, &err)) {
        free(r);
        return tr_cli_fail(CMD, &err);
    }
    tr_workflow_opts o = {resume, NULL};
    rc = tr_workflow_run(r, &o, &err);
    if (rc == 0)
        fprintf(stderr, "troupe %s: done; metrics in %s/metrics.jsonl, checkpoints in %s/checkpoints\n",
                CMD, r->run_dir, r->run_dir);
    free(r);
    return rc ? tr_cli_fail(CMD, &err) : 0;
}
