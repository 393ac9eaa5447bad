// Pretraining on Megatron indexed datasets: the sampler (data/sampler.h) serves windows of
// seq_len + 1 tokens from the train split of the weighted prefixes; each window becomes one
// row (inputs = its first seq_len tokens, targets = the next token inside the same document,
// attention and positions restarting at document starts). Per step: batch_size rows ->
// policy.train_sft; eval/loss on a fixed set of validation-split windows as scheduled.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/sampler.h"
#include "rl/workflow.h"
#include "rl/workflow_eval.h"

// Rows evaluated on the validation split (a fixed set, the same at every eval).
#define EVAL_ROWS 64

static int sampler_open(const tr_recipe *recipe, int32_t split, int64_t n_samples, tr_sampler *s,
                        tr_err *err) {
    const char *paths[TR_RECIPE_MAX_PREFIXES];
    double weights[TR_RECIPE_MAX_PREFIXES];
    for (int32_t i = 0; i < recipe->data.n_prefixes; i++) {
        paths[i] = recipe->data.prefixes[i].path;
        weights[i] = recipe->data.prefixes[i].weight;
    }
    tr_sampler_config cfg = {paths, weights, recipe->data.n_prefixes, recipe->data.split, split,
                             (int32_t)recipe->data.seq_len, (uint64_t)recipe->seed, n_samples};
    return tr_sampler_init(s, &cfg, err);
}

// Window -> row: ids, targets (-1 where the next token starts another document) and the
// document starts clipped to the row.
static void window_to_row(const int32_t *w, const int32_t *starts, int32_t n_docs, int32_t L,
                          int32_t *ids, int32_t *targets, int32_t *row_starts, int32_t *row_docs) {
    memcpy(ids, w, (size_t)L * sizeof(int32_t));
    for (int32_t t = 0; t < L; t++) targets[t] = w[t + 1];
    int32_t nd = 0;
    for (int32_t d = 0; d < n_docs; d++) {
        int32_t s0 = starts[d];
        if (s0 >= 1 && s0 <= L) targets[s0 - 1] = -1;
        if (s0 < L) row_starts[nd++] = s0;
    }
    row_starts[nd] = L;
    *row_docs = nd;
}

// eval/loss on the validation windows; a failure names the evaluation's step.
static int eval_loss(tr_run *run, int64_t n, const int64_t *off, const int32_t *ids, tr_err *err) {
    double nll;
    if (tr_eval_nll(run, n, off, ids, NULL, &nll, err))
        return tr_err_wrap(err, "evaluation at step %" PRId64 " on the validation split", run->m.step);
    return tr_metrics_set(&run->m, "eval/loss", nll, err);
}

int tr_workflow_pretrain(tr_run *run, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    const int32_t R = (int32_t)recipe->train.batch_size, L = (int32_t)recipe->data.seq_len;
    tr_sampler train = {0}, valid = {0};
    bool valid_open = false;
    int32_t *w = malloc((size_t)(L + 1) * sizeof *w);
    int32_t *starts = malloc((size_t)(L + 2) * sizeof *starts);
    int32_t *ids = malloc((size_t)R * L * sizeof *ids);
    int32_t *targets = malloc((size_t)R * L * sizeof *targets);
    int32_t *doc_start = malloc((size_t)R * (L + 1) * sizeof *doc_start);
    int32_t *n_docs = malloc((size_t)R * sizeof *n_docs);
    int32_t *ev_ids = NULL;
    int64_t *ev_off = NULL, n_eval = 0;
    int rc_ = -1;
    if (!w || !starts || !ids || !targets || !doc_start || !n_docs) {
        tr_errf(err, TR_ENOMEM, "pretrain: out of memory for %d rows of %d tokens", R, L);
        goto done;
    }
    if (sampler_open(recipe, TR_SPLIT_TRAIN, recipe->train.steps * R, &train, err))
        goto done;
    // The validation windows: taken once, evaluated as whole sequences (no document resets).
    {
        tr_err verr = {0};
        if (sampler_open(recipe, TR_SPLIT_VALID, EVAL_ROWS, &valid, &verr) == 0) {
            valid_open = true;
            n_eval = valid.n_samples < EVAL_ROWS ? valid.n_samples : EVAL_ROWS;
            ev_ids = malloc((size_t)(n_eval ? n_eval : 1) * (L + 1) * sizeof *ev_ids);
            ev_off = malloc((size_t)(n_eval + 1) * sizeof *ev_off);
            if (!ev_ids || !ev_off) {
                tr_errf(err, TR_ENOMEM, "pretrain: out of memory for validation rows");
                goto done;
            }
            ev_off[0] = 0;
            for (int64_t k = 0; k < n_eval; k++) {
                if (tr_sampler_get(&valid, k, ev_ids + k * (L + 1), NULL, NULL, err)) goto done;
                ev_off[k + 1] = (k + 1) * (L + 1);
            }
        }
        // An empty validation split (e.g. split "100,0,0") just means no eval/loss.
    }

    if (!run->resumed && n_eval > 0) {
        tr_metrics_begin(&run->m, 0);
        if (eval_loss(run, n_eval, ev_off, ev_ids, err) || tr_metrics_commit(&run->m, err)) goto done;
    }

    for (int64_t step = run->step + 1; step <= recipe->train.steps; step++) {
        double t_step = tr_metrics_now();
        tr_metrics_begin(&run->m, step);
        // batch_size windows from the sampler at the cursor.
        int64_t n_starts = 0;
        for (int32_t r = 0; r < R; r++) {
            int32_t nd;
            if (tr_sampler_get(&train, run->data_cursor + r, w, starts, &nd, err)) goto done;
            window_to_row(w, starts, nd, L, ids + (int64_t)r * L, targets + (int64_t)r * L,
                          doc_start + n_starts, &n_docs[r]);
            n_starts += n_docs[r] + 1;
        }
        run->data_cursor += R;
        // policy.train_sft: one optimizer step of token-mean cross entropy.
        tr_sft_batch b = {R, L, ids, targets, doc_start, n_docs};
        tr_train_metrics tm;
        double t0 = tr_metrics_now();
        if (tr_policy_train_sft(run->policy, &b, &tm, err)) goto done;
        double t_train = tr_metrics_now() - t0;
        if (tr_metrics_set(&run->m, "loss", tm.loss, err) ||
            tr_metrics_set(&run->m, "grad_norm", tm.grad_norm, err) ||
            tr_metrics_set(&run->m, "lr", tm.lr, err) ||
            tr_metrics_set(&run->m, "time/train", t_train, err))
            goto done;
        if (tr_run_eval_due(step, recipe->train.steps, recipe->train.eval_every) && n_eval > 0 &&
            eval_loss(run, n_eval, ev_off, ev_ids, err))
            goto done;
        if (tr_run_step_end(run, step, (double)R * L, t_step, err)) goto done;
    }
    rc_ = 0;
done:
    tr_sampler_free(&train);
    if (valid_open) tr_sampler_free(&valid);
    free(w);
    free(starts);
    free(ids);
    free(targets);
    free(doc_start);
    free(n_docs);
    free(ev_ids);
    free(ev_off);
    return rc_;
}
