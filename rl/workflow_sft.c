// Supervised fine-tuning: conversations rendered through the chat format (loss on the
// assistant turns), packed once into rows of data.max_len tokens with document boundaries;
// every epoch visits the rows in an order shuffled by (seed, epoch). Per step: batch_size
// rows -> policy.train_sft; eval/loss on the held-out conversations as scheduled.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/sft.h"
#include "data/shuffle.h"
#include "engine/rng.h"
#include "rl/workflow.h"
#include "rl/workflow_eval.h"

typedef struct sft_rows {
    tr_sft_packing pack;
    int64_t *order;        // [pack.n_rows] the rows of order_epoch
    int64_t order_epoch;
    tr_sft_row row;
    int32_t *ids, *targets, *doc_start, *n_docs;   // one step's rows, back to back
} sft_rows;

static void sft_rows_free(sft_rows *s) {
    tr_sft_packing_free(&s->pack);
    tr_sft_row_free(&s->row);
    free(s->order);
    free(s->ids);
    free(s->targets);
    free(s->doc_start);
    free(s->n_docs);
}

// Row served by draw k.
static int64_t row_of(sft_rows *s, uint64_t seed, int64_t k) {
    int64_t n = s->pack.n_rows, epoch = k / n;
    if (epoch != s->order_epoch) {
        for (int64_t i = 0; i < n; i++) s->order[i] = i;
        tr_shuffle_i64(s->order, n, tr_rng_derive(seed, (uint64_t)epoch));
        s->order_epoch = epoch;
    }
    return s->order[k % n];
}

int tr_workflow_sft(tr_run *run, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    const int32_t R = (int32_t)recipe->train.batch_size, L = (int32_t)recipe->data.max_len;
    const uint64_t seed = (uint64_t)recipe->seed;
    tr_sft_dataset train = {0}, eval = {0};
    sft_rows s = {0};
    s.order_epoch = -1;
    bool has_eval = recipe->data.eval[0] != '\0';
    int rc_ = -1;
    if (!run->chatp) {
        tr_errf(err, TR_EINVAL, "data.chat_format: sft renders conversations through a chat "
                "format (chatml or llama3), not none");
        goto done;
    }
    int32_t pad = run->chat.eos >= 0 ? run->chat.eos : 0;
    if (tr_sft_load(&train, recipe->data.train, run->chatp, L, TR_SFT_TRUNCATE, err) ||
        (has_eval && tr_sft_load(&eval, recipe->data.eval, run->chatp, L, TR_SFT_TRUNCATE, err)) ||
        tr_sft_pack(&s.pack, &train, L, recipe->data.pack, seed, err) ||
        tr_sft_row_init(&s.row, L, err))
        goto done;
    if (s.pack.n_rows == 0) {
        tr_errf(err, TR_EINVAL, "%s: no conversation with a trained token", recipe->data.train);
        goto done;
    }
    s.order = malloc((size_t)s.pack.n_rows * sizeof *s.order);
    s.ids = malloc((size_t)R * L * sizeof *s.ids);
    s.targets = malloc((size_t)R * L * sizeof *s.targets);
    s.doc_start = malloc((size_t)R * (L + 2) * sizeof *s.doc_start);
    s.n_docs = malloc((size_t)R * sizeof *s.n_docs);
    if (!s.order || !s.ids || !s.targets || !s.doc_start || !s.n_docs) {
        tr_errf(err, TR_ENOMEM, "sft: out of memory for %d rows of %d tokens", R, L);
        goto done;
    }

    if (!run->resumed && has_eval) {
        tr_metrics_begin(&run->m, 0);
        if (tr_eval_sft_loss(run, &eval, err) || tr_metrics_commit(&run->m, err)) goto done;
    }

    for (int64_t step = run->step + 1; step <= recipe->train.steps; step++) {
        double t_step = tr_metrics_now();
        tr_metrics_begin(&run->m, step);
        // batch_size packed rows, each with its documents.
        int64_t n_starts = 0, tokens = 0;
        for (int32_t r = 0; r < R; r++) {
            if (tr_sft_row_fill(&train, &s.pack, row_of(&s, seed, run->data_cursor + r), pad,
                                &s.row, err))
                goto done;
            memcpy(s.ids + (int64_t)r * L, s.row.ids, (size_t)L * sizeof(int32_t));
            memcpy(s.targets + (int64_t)r * L, s.row.targets, (size_t)L * sizeof(int32_t));
            memcpy(s.doc_start + n_starts, s.row.doc_start,
                   (size_t)(s.row.n_docs + 1) * sizeof(int32_t));
            n_starts += s.row.n_docs + 1;
            s.n_docs[r] = s.row.n_docs;
            for (int32_t t = 0; t < L; t++) tokens += s.row.targets[t] >= 0;
        }
        run->data_cursor += R;
        // policy.train_sft: one optimizer step of token-mean cross entropy.
        tr_sft_batch b = {R, L, s.ids, s.targets, s.doc_start, s.n_docs};
        tr_train_metrics tm;
        double t0 = tr_metrics_now();
        if (tr_policy_train_sft(run->policy, &b, &tm, err)) goto done;
        double t_train = tr_metrics_now() - t0;
        if (tr_metrics_set(&run->m, "loss", tm.loss, err) ||
            tr_metrics_set(&run->m, "grad_norm", tm.grad_norm, err) ||
            tr_metrics_set(&run->m, "lr", tm.lr, err) ||
            tr_metrics_set(&run->m, "tokens", (double)tokens, err) ||
            tr_metrics_set(&run->m, "epoch", (double)(run->data_cursor - 1) / (double)s.pack.n_rows, err) ||
            tr_metrics_set(&run->m, "time/train", t_train, err))
            goto done;
        if (tr_run_eval_due(step, recipe->train.steps, recipe->train.eval_every) && has_eval &&
            tr_eval_sft_loss(run, &eval, err))
            goto done;
        if (tr_run_step_end(run, step, (double)R * L, t_step, err)) goto done;
    }
    rc_ = 0;
done:
    sft_rows_free(&s);
    tr_sft_free(&train);
    if (has_eval) tr_sft_free(&eval);
    return rc_;
}
