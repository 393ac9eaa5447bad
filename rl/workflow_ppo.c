// PPO with a critic: per step, prompts -> generate (policy or generator) -> reward.score ->
// reference.logprobs (KL, in the loss or as a per-token reward penalty) -> policy.logprobs
// (behaviour logprobs) -> critic.values -> GAE advantages and returns -> policy.train ->
// critic.train -> weight sync; then eval, log and checkpoint as scheduled.
#include <math.h>
#include <string.h>

#include "engine/loss.h"
#include "rl/advantage.h"
#include "rl/rollout_select.h"
#include "rl/workflow_rl.h"

// GAE (or the recipe's estimator) over the padded layout, with the critic's values and the
// KL penalty in the rewards when placed there; fills s->adv and s->returns. *kl_reward gets
// that penalty's mean KL (NAN when the KL is not in the reward).
static int advantages(tr_run *run, tr_rl_step *s, double *kl_reward, tr_err *err) {
    const tr_recipe_algorithm *al = &run->rc->algorithm;
    const tr_rollouts *r = &s->batch;
    int32_t B = s->B, T = s->T;
    float *token_rewards = NULL;
    *kl_reward = NAN;
    if (al->kl_coef > 0 && al->kl_placement == TR_KL_IN_REWARD) {
        tr_rl_to_padded(r, T, s->old_lp, s->p_a);
        tr_rl_to_padded(r, T, s->ref_lp, s->p_b);
        *kl_reward = tr_kl_reward_penalty(al->kl_estimator, (float)al->kl_coef, s->p_a, s->p_b,
                                          s->mask, (int64_t)B * T, s->p_c);
        token_rewards = s->p_c;
    }
    tr_rl_to_padded(r, T, s->values, s->p_a);
    tr_adv_cfg cfg = {al->advantage, al->norm_by_std, TR_ADV_GRPO_EPS, (float)al->gamma,
                      (float)al->lam};
    tr_adv_input in = {B, T, s->reward, r->group, s->n_groups, s->mask, s->p_a, token_rewards};
    if (tr_adv_compute(&cfg, &in, s->p_d, s->p_b, err)) return tr_err_wrap(err, "advantages");
    tr_rl_from_padded(r, T, s->p_d, s->adv);
    tr_rl_from_padded(r, T, s->p_b, s->returns);
    return 0;
}

int tr_workflow_ppo(tr_run *run, tr_err *err) {
    const tr_recipe *rc = run->rc;
    const int32_t P = (int32_t)rc->train.prompts_per_step;
    const bool kl = rc->algorithm.kl_coef > 0;
    tr_prompt_loader train = {0}, eval = {0};
    bool has_eval = rc->data.eval[0] != '\0';
    tr_rl_step s;
    tr_rl_step_init(&s);
    int rc_ = -1;
    int32_t max_prompt = (int32_t)rc->data.max_prompt_len;
    if (tr_prompt_loader_init(&train, rc->data.train, run->chatp, run->tok, max_prompt, true,
                              (uint64_t)rc->seed, err) ||
        (has_eval && tr_prompt_loader_init(&eval, rc->data.eval, run->chatp, run->tok, max_prompt,
                                           false, 0, err)))
        goto done;

    // The generator starts from the policy's weights (a resumed run's, once loaded).
    if (tr_rl_sync(run, &s, false, err)) goto done;
    if (!run->resumed && has_eval) {
        tr_metrics_begin(&run->m, 0);
        if (tr_rl_eval(run, &eval, err) || tr_metrics_commit(&run->m, err)) goto done;
    }

    for (int64_t step = run->step + 1; step <= rc->train.steps; step++) {
        double t_step = tr_metrics_now(), t0;
        tr_metrics_begin(&run->m, step);
        tr_rl_step_reset(&s);
        if (tr_rl_step_reserve_batch(&s, P * (int32_t)rc->rollout.n, err)) goto done;

        // prompts -> generate (the policy or the generator; with one_step_off the next step's
        // batch starts sampling now)
        if (tr_rl_generate(run, &s, &train, step, 0, err) || tr_rl_sample_ahead(run, &s, &train, step, err))
            goto done;
        double t_gen = s.t_gen;

        // reward.score
        t0 = tr_metrics_now();
        if (tr_rl_step_reserve_gen(&s, s.gen.n, err) ||
            tr_rl_score(run, &s.gen, s.gen_score, s.gen_reward, &s, err))
            goto done;
        double t_reward = tr_metrics_now() - t0;
        memset(s.keep, 1, (size_t)s.gen.n);
        if (tr_rollouts_take_groups(&s.batch, &s.n_groups, P, s.reward, s.score, &s.gen,
                                    s.gen_reward, s.gen_score, s.keep, err) ||
            tr_rl_step_layout(&s, err))
            goto done;

        // reference.logprobs (KL) and the behaviour logprobs on the training path.
        double t_ref = 0;
        if (kl) {
            t0 = tr_metrics_now();
            if (tr_model_logprobs(run->reference, &s.batch, s.ref_lp, NULL, err)) goto done;
            t_ref = tr_metrics_now() - t0;
        }
        t0 = tr_metrics_now();
        if (tr_model_logprobs(run->policy, &s.batch, s.old_lp, s.entropy, err)) goto done;
        double t_old = tr_metrics_now() - t0;

        // critic.values -> GAE advantages and returns
        t0 = tr_metrics_now();
        if (tr_critic_values(run->critic, &s.batch, s.values, err)) goto done;
        double t_critic = tr_metrics_now() - t0;
        double kl_reward;
        if (advantages(run, &s, &kl_reward, err) || tr_rl_off_policy(run, &s, err)) goto done;

        // policy.train, then critic.train towards the returns (values at rollout as the
        // clip centre).
        tr_train_batch tb = {&s.batch, s.adv, s.old_lp,
                             kl && rc->algorithm.kl_placement == TR_KL_IN_LOSS ? s.ref_lp : NULL,
                             s.returns, s.values, s.lag};
        tr_train_metrics tm, cm;
        t0 = tr_metrics_now();
        if (tr_policy_train(run->policy, &tb, &tm, err)) goto done;
        double t_train = tr_metrics_now() - t0 + t_old;
        t0 = tr_metrics_now();
        if (tr_critic_train(run->critic, &tb, &cm, err)) goto done;
        t_critic += tr_metrics_now() - t0;
        if (tr_rl_sync(run, &s, true, err)) goto done;

        if (tr_rl_log_rollouts(run, &s, err) || tr_rl_log_train(run, &s, &tm, kl, kl_reward, err) ||
            tr_rl_log_staleness(run, &s, tm.step, tm.steps, err) ||
            tr_metrics_set(&run->m, "critic/value_loss", cm.value_loss, err) ||
            tr_metrics_set(&run->m, "critic/clip_frac", cm.value_clip_frac, err) ||
            tr_metrics_set(&run->m, "critic/grad_norm", cm.grad_norm, err) ||
            tr_metrics_set(&run->m, "critic/value_mean", cm.value_mean, err) ||
            tr_metrics_set(&run->m, "time/generate", t_gen, err) ||
            tr_metrics_set(&run->m, "time/reward", t_reward, err) ||
            (kl && tr_metrics_set(&run->m, "time/reference", t_ref, err)) ||
            tr_metrics_set(&run->m, "time/critic", t_critic, err) ||
            tr_metrics_set(&run->m, "time/train", t_train, err) ||
            tr_rl_log_samples(run, step, &s, err))
            goto done;
        if (tr_run_eval_due(step, rc->train.steps, rc->train.eval_every) && has_eval &&
            tr_rl_eval(run, &eval, err))
            goto done;
        if (tr_run_step_end(run, step, (double)s.batch.n_tokens, t_step, err)) goto done;
    }
    rc_ = 0;
done:
    tr_rl_step_free(&s);
    tr_prompt_loader_free(&train);
    if (has_eval) tr_prompt_loader_free(&eval);
    return rc_;
}
