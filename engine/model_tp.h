// Internal to the model (model.c, heads.c, model_tp.c): the collectives of a tensor-parallel
// rank over its group, each a no-op at size 1.
#pragma once
#include "engine/checkpoint.h"
#include "engine/model.h"

// buf[n] (fp32, backend memory) summed over the group in place.
int tr_model_tp_sum(tr_model *m, float *buf, size_t n, tr_err *err);
// buf[n] in the activation dtype summed over the group: in fp32 (acts.tp_red) and rounded
// once back when the activation dtype is narrower.
int tr_model_tp_sum_act(tr_model *m, void *buf, size_t n, tr_err *err);
// Every rank's n elements at buf + rank * n (fp64), gathered into place on every rank.
int tr_model_tp_gather_f64(tr_model *m, double *buf, size_t n, tr_err *err);
// Saves the whole model from every rank's shards: collective, rank 0 writes (model.h).
int tr_model_save_gathered(tr_model *m, const char *dir, const tr_ckpt_save_opts *opts,
                           tr_err *err);
