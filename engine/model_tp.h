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
// Sequence parallelism, over [T, hidden] buffers whose row r belongs to the rank whose part
// of the batch holds it (tr_tp_seq_begin):
// full (dtype dt: fp32 or the activation dtype) gets every rank's rows, this rank's copied in
// from `rows` first (nothing is copied when rows already is their place in full).
int tr_model_sp_gather(tr_model *m, void *full, const void *rows, tr_dt dt, int32_t T,
                       tr_err *err);
// buf (fp32) summed over the group, each rank receiving the sums of its rows at their place
// (the other rows are left undefined).
int tr_model_sp_scatter(tr_model *m, float *buf, int32_t T, tr_err *err);
// The same in the activation dtype: summed in fp32 (acts.tp_red) and this rank's rows rounded
// once back into buf.
int tr_model_sp_scatter_act(tr_model *m, void *buf, int32_t T, tr_err *err);
// Every rank's n elements at buf + rank * n (fp64), gathered into place on every rank.
int tr_model_tp_gather_f64(tr_model *m, double *buf, size_t n, tr_err *err);
// Saves the whole model from every rank's shards: collective, rank 0 writes (model.h).
int tr_model_save_gathered(tr_model *m, const char *dir, const tr_ckpt_save_opts *opts,
                           tr_err *err);
