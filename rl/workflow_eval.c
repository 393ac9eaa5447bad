// Held-out NLL through the logprobs op: each sequence travels as a one-token "prompt" and
// the rest as its "response", so the op returns the logprob of every token after the first.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include "rl/workflow_eval.h"

int tr_eval_nll(tr_run *run, int64_t n, const int64_t *off, const int32_t *ids,
                const uint8_t *mask, double *nll, tr_err *err) {
    const int64_t chunk = 256;
    tr_rollouts r;
    tr_rollouts_init(&r);
    float *lp = NULL;
    int64_t cap = 0, count = 0;
    double sum = 0;
    int rc = 0;
    for (int64_t k = 0; k < n && rc == 0; k += chunk) {
        int64_t end = k + chunk < n ? k + chunk : n;
        tr_rollouts_clear(&r);
        for (int64_t i = k; i < end && rc == 0; i++) {
            int64_t len = off[i + 1] - off[i];
            if (len < 2) continue;
            rc = tr_rollouts_append(&r, (int32_t)(i - k), 0, ids + off[i], 1, ids + off[i] + 1,
                                    NULL, (int32_t)(len - 1), TR_FINISH_STOP, NULL, NULL, NULL, err);
        }
        if (rc || r.n == 0) continue;
        if (r.n_tokens > cap) {
            float *g = realloc(lp, (size_t)r.n_tokens * sizeof *g);
            if (!g) {
                rc = tr_errf(err, TR_ENOMEM, "eval: out of memory");
                break;
            }
            lp = g;
            cap = r.n_tokens;
        }
        if ((rc = tr_model_logprobs(run->policy, &r, lp, NULL, err))) break;
        for (int32_t j = 0, i = (int32_t)k; j < r.n; i++) {
            if (off[i + 1] - off[i] < 2) continue;  // skipped above
            for (int64_t t = 1; t < off[i + 1] - off[i]; t++)
                if (!mask || mask[off[i] + t]) {
                    sum -= lp[r.offset[j] + t];
                    count++;
                }
            j++;
        }
    }
    free(lp);
    tr_rollouts_free(&r);
    if (rc) return -1;
    *nll = count ? sum / (double)count : NAN;
    return 0;
}

int tr_eval_sft_loss(tr_run *run, const tr_sft_dataset *d, tr_err *err) {
    double nll;
    if (tr_eval_nll(run, d->n, d->off, d->ids, d->mask, &nll, err))
        return tr_err_wrap(err, "evaluation at step %" PRId64 " on %s", run->m.step, run->recipe->data.eval);
    return tr_metrics_set(&run->m, "eval/loss", nll, err);
}
