// Internal to the training state (train_state.c): the Adam moments of a ZeRO-1 trainer as
// one file per data-parallel shard plus a manifest, and the assembly of any shard range from
// them, so that a checkpoint loads on another number of ranks.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "engine/train.h"

#define TR_TRAIN_STATE_SHARDS "optim_shards.json"

// Every rank of the trainer's communicator calls it: each writes optim_shard_<rank>.safetensors
// into dir (which exists), then rank 0 writes the manifest once every shard is written.
int tr_train_shards_save(const tr_trainer *tr, const char *dir, tr_err *err);
// Fills m and v (host, the trainer's shard_end - shard_begin floats, zeroed) with the moments
// of the trainer's shard from dir's manifest and shard files, which must say step `step`.
int tr_train_shards_load(const tr_trainer *tr, const char *dir, int64_t step, float *m, float *v, tr_err *err);
