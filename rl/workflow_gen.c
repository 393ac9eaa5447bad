// Where an RL step's rollouts come from and how the weights get there. Without a generator the
// policy samples on its own weights and a sync has nothing to move. With models.generator the
// generator group samples (its replicas each a token-balanced share) and gets the policy's
// weights after every update; the trainer checks that each rollout's weight version is the
// one the pipeline implies. With one_step_off the generator samples step k+1's batch while the
// policy trains on step k's: that batch is one update old (staleness 1), so its advantages are
// weighted by truncated importance weights against the sampling logprobs.
#include <math.h>
#include <string.h>

#include "rl/off_policy.h"
#include "rl/workflow_rl.h"

// Every sequence of a round was sampled by the same weights; their version, or -1 when the
// round is empty.
static int round_version(const tr_rollouts *r, int64_t *version, tr_err *err) {
    *version = r->n ? r->version[0] : -1;
    for (int32_t i = 1; i < r->n; i++)
        if (r->version[i] != *version)
            return tr_errf(err, TR_EPEER, "generate: sequence %d was sampled with the weights of step %lld, sequence 0 "
                           "with those of step %lld: the generator's replicas hold different weights", i,
                           (long long)r->version[i], (long long)*version);
    return 0;
}

static int finish_ahead(tr_rl_step *s, tr_err *err) {
    tr_generate_call *call = s->ahead;
    s->ahead = NULL;
    if (tr_generate_finish(call, err)) return tr_err_wrap(err, "sampling step %lld ahead", (long long)s->ahead_step);
    s->ahead_ready = true;
    return 0;
}

int tr_rl_generate(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, int32_t round,
                   tr_err *err) {
    const int32_t P = (int32_t)run->recipe->train.prompts_per_step;
    double t0 = tr_metrics_now();
    tr_rollouts_clear(&s->gen);
    int32_t lag = 0;
    if (round == 0 && s->ahead_step == step) {
        if (s->ahead && finish_ahead(s, err)) return -1;
        tr_rollouts t = s->gen;
        s->gen = s->ahead_gen;
        s->ahead_gen = t;
        s->ahead_step = 0;
        s->ahead_ready = false;
        lag = 1;
        s->gen_report = s->ahead_report;
    } else {
        tr_sampling smp = tr_rl_sampling(run->recipe, step, round);
        smp.report = &s->gen_report;
        if (tr_prompt_loader_draw(train, run->data_cursor, P, &s->draw, err) ||
            tr_policy_generate(run->sampler, &s->draw.batch, &smp, &s->gen, err))
            return -1;
    }
    run->data_cursor += P;
    s->t_gen += tr_metrics_now() - t0;
    int64_t version;
    if (round_version(&s->gen, &version, err)) return -1;
    if (round == 0) {
        s->lag = lag;
        s->version = version;
    } else if (version != s->version) {
        return tr_errf(err, TR_EPEER, "generate: round %d was sampled with the weights of step %lld, round 0 with "
                       "those of step %lld", round, (long long)version, (long long)s->version);
    }
    return 0;
}

int tr_rl_sample_ahead(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    if (!run->generator || !recipe->generator.one_step_off || step >= recipe->train.steps) return 0;
    // The prompts the next step would draw: this step's were drawn already.
    tr_sampling smp = tr_rl_sampling(recipe, step + 1, 0);
    memset(&s->ahead_report, 0, sizeof s->ahead_report);
    smp.report = &s->ahead_report;
    tr_rollouts_clear(&s->ahead_gen);
    if (tr_prompt_loader_draw(train, run->data_cursor, (int32_t)recipe->train.prompts_per_step, &s->ahead_draw, err) ||
        tr_generate_start(run->generator, &s->ahead_draw.batch, &smp, &s->ahead_gen, &s->ahead, err))
        return tr_err_wrap(err, "sampling step %lld ahead", (long long)(step + 1));
    s->ahead_step = step + 1;
    s->ahead_ready = false;
    return 0;
}

int tr_rl_sync(tr_run *run, tr_rl_step *s, bool log, tr_err *err) {
    tr_metrics *m = &run->m;
    double t0 = tr_metrics_now();
    if (s && s->ahead) {
        if (finish_ahead(s, err)) return -1;
        if (log && tr_metrics_set(m, "time/wait_generate", tr_metrics_now() - t0, err)) return -1;
        t0 = tr_metrics_now();
    }
    if (!run->generator) {
        bool synced;
        if (tr_policy_sync_weights(run->policy, &synced, err)) return -1;
        return log ? tr_metrics_set(m, "time/sync", tr_metrics_now() - t0, err) : 0;
    }
    const tr_recipe_generator *g = &run->recipe->generator;
    tr_sync_stats st;
    bool shares = tr_recipe_generator_shares(run->recipe);
    if (shares ? tr_weights_share_sync(run->policy, run->generator, g->verify_sync, &st, err)
               : tr_weights_sync(run->policy, run->generator, g->sync_bucket_mb << 20, g->verify_sync, &st, err))
        return tr_err_wrap(err, "weight sync to the generator");
    if (!log) return 0;
    return tr_metrics_set(m, "time/sync", tr_metrics_now() - t0, err) ||
                   tr_metrics_set(m, "sync/seconds", st.seconds, err) ||
                   tr_metrics_set(m, "sync/gb_per_s", st.seconds > 0 ? (double)st.bytes / st.seconds * 1e-9 : NAN,
                                  err) ||
                   tr_metrics_set(m, "sync/bytes", (double)st.bytes, err)
               ? -1
               : 0;
}

int tr_rl_off_policy(tr_run *run, tr_rl_step *s, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    if (!run->generator || !recipe->generator.one_step_off) return 0;
    tr_tis_stats st;
    tr_tis_weight(&s->batch, s->old_lp, s->batch.gen_logprobs, recipe->algorithm.tis_cap, s->adv, &st);
    return tr_metrics_set(&run->m, "tis/weight_mean", st.weight_mean, err) ||
                   tr_metrics_set(&run->m, "tis/clip_frac", st.clip_frac, err) ||
                   tr_metrics_set(&run->m, "tis/ratio_max", st.ratio_max, err)
               ? -1
               : 0;
}

int tr_rl_log_staleness(tr_run *run, const tr_rl_step *s, int64_t tm_step, int64_t steps, tr_err *err) {
    if (!run->generator) return 0;
    // In optimizer steps: from the weights that sampled the batch to those its update started from.
    return tr_metrics_set(&run->m, "off_policy/staleness", s->lag, err) ||
                   tr_metrics_set(&run->m, "off_policy/version_lag", (double)(tm_step - steps - s->version), err)
               ? -1
               : 0;
}
