// Vocab-parallel sampling: generation's draws under tensor parallelism, where each rank holds
// its vocabulary columns of the rows' logits. The ranks draw the ids the single-rank sample op
// would draw from the whole rows with the same streams, exchanging only short summaries: each
// rank's best candidates of every row (enough for greedy, top-k and a top-p nucleus), and for
// the draws that walk the whole vocabulary (plain temperature, top-p's mass) each rank's sum
// of its columns' weights, passed from rank to rank so that the sum is the single-rank one's.
// All buffers are sized at init for the model's logit rows; a draw allocates nothing.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "engine/model.h"

typedef struct tr_sample_tp {
    tr_model *model;          // not owned: its tensor-parallel group and acts.logits
    int32_t rows;             // rows per draw at most
    int32_t k_max;            // the longest list a rank sends: the most columns a rank holds
                              // plus one, so that a list that holds them all shows it
    size_t cap;               // candidates the gathered lists may take (R x rows x k)
    void *dev;                // backend memory for the arrays below
    tr_sample_cand *cand;     // [R][rows][k] every rank's lists, gathered
    double *sums;             // [R][rows] the running sums at each rank's columns' end
    double *walk_sum;         // [rows] the walk's own sums (the chain's, again)
    int32_t *hits;            // [R][rows][3] every rank's walk, gathered
    void *scratch;            // the ops' (sample_vp_scratch_bytes)
    float *wide;              // [rows][tp.vocab] the rank's logits widened to fp32 for the
                              // sample_vp ops (exactly); NULL with fp32 activations
    int32_t *want;            // host [rows]: each row's list length (top-p's grows)
    int32_t *ids;             // host [rows]: the picks, read to find rows to ask again
} tr_sample_tp;

// For model m of tensor-parallel size > 1, drawing up to `rows` rows; the model's
// communicator is needed by the first draw, not before.
int tr_sample_tp_init(tr_sample_tp *s, tr_model *m, int32_t rows, tr_err *err);
void tr_sample_tp_free(tr_sample_tp *s);

// Collective: ids[n] (backend memory) drawn from the n rows of this rank's logits in
// m->acts.logits with the parameters and streams of rows[n] (backend memory; host_rows the
// same on the host), exactly as the sample op draws from whole rows; *n_near (backend memory)
// += the near draws. Every rank gets the same ids.
int tr_sample_tp_draw(tr_sample_tp *s, int32_t *ids, const tr_sample_row *rows,
                      const tr_sample_row *host_rows, int32_t n, int32_t *n_near, tr_err *err);
