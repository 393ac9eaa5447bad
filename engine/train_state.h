// Training state beside a Hugging Face checkpoint directory, so a run resumes exactly (on
// another number of data-parallel ranks too):
// optim_exp_avg.safetensors and optim_exp_avg_sq.safetensors (the Adam moments, F32, under
// the HF parameter names, as torch calls them) and trainer_state.json (step = schedule
// position, RNG stream, the optimizer settings the moments were made with).
#pragma once

#include "engine/err.h"
#include "engine/train.h"

#define TR_TRAIN_STATE_JSON "trainer_state.json"
#define TR_TRAIN_STATE_EXP_AVG "optim_exp_avg.safetensors"
#define TR_TRAIN_STATE_EXP_AVG_SQ "optim_exp_avg_sq.safetensors"

// Writes the three files into dir (which must exist), each atomically; trainer_state.json
// goes last and the moment files carry its step, so a crash between files is detected on load.
// A trainer sharded over data-parallel ranks (ZeRO-1) writes optim_shard_<r>.safetensors per
// rank and the manifest optim_shards.json instead of the two moment files; every rank calls it
// and rank 0 writes the manifest and trainer_state.json once every shard is written. A
// tensor-parallel trainer (with or without data parallelism) writes the two files of whole
// tensors, gathered from every rank (every rank calls it; the moments pass through the
// model's gradient buffer, which is left zeroed).
int tr_train_state_save(const tr_trainer *tr, const char *dir, tr_err *err);
// Restores moments, step and RNG stream into tr (set up for the same model). Tensor names
// and shapes must match the model's layout; errors name the file and tensor. On error tr is
// unchanged. Either format loads into a trainer of any number of shards: each rank takes its
// own range from the whole tensors or from the shards that hold it.
int tr_train_state_load(tr_trainer *tr, const char *dir, tr_err *err);
