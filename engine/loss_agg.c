// Loss aggregation: the per-token weights that turn per-token losses into one number for
// each of the four modes, with denominators shared by all micro-batches of a mini-batch.
#include "engine/loss.h"

#include <stddef.h>

const char *const tr_loss_agg_names[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm", NULL};
const char *const tr_ratio_mode_names[] = {"token", "sequence", NULL};

void tr_loss_norm_from_mask(const uint8_t *mask, int32_t B, int32_t T, double max_len,
                            tr_loss_norm *norm) {
    int64_t tokens = 0, seqs = 0;
    for (int32_t b = 0; b < B; b++) {
        int64_t len = 0;
        for (int32_t t = 0; t < T; t++) len += mask[(int64_t)b * T + t] != 0;
        tokens += len;
        seqs += len > 0;
    }
    norm->n_tokens = (double)tokens;
    norm->n_seqs = (double)seqs;
    norm->max_len = max_len;
}

double tr_loss_agg_weight(enum tr_loss_agg agg, const tr_loss_norm *norm, int64_t row_len) {
    double den = 0.0;
    switch (agg) {
    case TR_AGG_TOKEN_MEAN: den = norm->n_tokens; break;
    case TR_AGG_SEQ_MEAN_TOKEN_SUM: den = norm->n_seqs; break;
    case TR_AGG_SEQ_MEAN_TOKEN_MEAN: den = norm->n_seqs * (double)row_len; break;
    case TR_AGG_SEQ_MEAN_TOKEN_SUM_NORM: den = norm->n_seqs * norm->max_len; break;
    }
    return den > 0.0 ? 1.0 / den : 0.0;
}
