// Checkpoints of a run: run_dir/checkpoints/step_<N>/<role>/ (Hugging Face directory plus
// training state, written by the role's save op) and step_<N>/run_state.json (where the
// workflow stood). A step is built under step_<N>.tmp and renamed into place after every
// role and the state are written, so a step directory is always complete; --resume takes
// the highest complete one.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

#define TR_RUN_STATE_FILE "run_state.json"

// Where the workflow stood after step `step` (what --resume needs besides the roles' files).
typedef struct tr_run_state {
    int64_t step;           // training steps completed
    int64_t data_cursor;    // prompts (grpo/ppo), rows (sft) or samples (pretrain) consumed
    char workflow[16];
} tr_run_state;

// run_dir/checkpoints/step_<step> into out.
int tr_run_ckpt_path(const char *run_dir, int64_t step, char *out, size_t cap, tr_err *err);
// Creates an empty run_dir/checkpoints/step_<step>.tmp (removing leftovers of a failed
// save of the same step) and returns its path in tmp; roles save into tmp/<role>.
int tr_run_ckpt_begin(const char *run_dir, int64_t step, char *tmp, size_t cap, tr_err *err);
// Writes tmp/run_state.json and renames tmp to step_<st->step>. An existing step directory
// of the same number (an earlier run of the same step) is replaced only after the new one
// is complete.
int tr_run_ckpt_commit(const char *run_dir, const char *tmp, const tr_run_state *st, tr_err *err);
// The highest step with a complete checkpoint (-1 when there is none); *st filled from it.
int tr_run_ckpt_find_last(const char *run_dir, tr_run_state *st, tr_err *err);
// Reads and validates dir/run_state.json.
int tr_run_state_read(const char *dir, tr_run_state *st, tr_err *err);
// Removes run_dir/checkpoints/step_*.tmp directories left by interrupted saves.
int tr_run_ckpt_clean(const char *run_dir, tr_err *err);
// Recursive removal of a directory tree (no symlinks followed).
int tr_remove_tree(const char *path, tr_err *err);
