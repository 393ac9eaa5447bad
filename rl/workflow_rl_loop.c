// GRPO and PPO: one step loop. Per step: prompts -> generate (n per prompt, on the policy or
// the generator; with one_step_off the next step's batch starts sampling here) ->
// reward.score -> dynamic sampling's refill (grpo) -> reference.logprobs (KL) ->
// policy.logprobs (the behaviour logprobs, also measuring the rollout/training mismatch; or
// they are generation's, and a few sequences are recomputed to measure it) ->
// critic.values (ppo) -> advantages (group-relative, or GAE with the critic's values;
// truncated importance weights when the batch is off-policy) -> policy.train -> critic.train
// (ppo) -> weight sync; then eval, log and checkpoint as scheduled.
#include <math.h>
#include <string.h>

#include "engine/loss.h"
#include "rl/advantage.h"
#include "rl/advantage_shaping.h"
#include "rl/controller.h"
#include "rl/phase_timer.h"
#include "rl/rollout_select.h"
#include "rl/workflow_rl.h"

// Advantages of the batch into s->adv (and s->returns with a critic): the recipe's estimator
// over the padded layout, with the KL penalty folded into the rewards when the recipe places
// it there. *kl_reward gets that penalty's mean KL (NAN when the KL is not in the reward).
static int advantages(tr_run *run, tr_rl_step *s, bool critic, double *kl_reward, tr_err *err) {
    const tr_recipe_algorithm *al = &run->recipe->algorithm;
    const tr_rollouts *r = &s->batch;
    int32_t B = s->B, T = s->T;
    float *token_rewards = NULL, *values = NULL, *returns = NULL;
    *kl_reward = NAN;
    if (al->kl_coef > 0 && al->kl_placement == TR_KL_IN_REWARD) {
        tr_rl_to_padded(r, T, s->old_lp, s->pad_old_lp);
        tr_rl_to_padded(r, T, s->ref_lp, s->pad_ref_lp);
        *kl_reward = tr_kl_reward_penalty(al->kl_estimator, (float)al->kl_coef, s->pad_old_lp,
                                          s->pad_ref_lp, s->mask, (int64_t)B * T, s->pad_kl_rewards);
        token_rewards = s->pad_kl_rewards;
    }
    if (critic) {
        tr_rl_to_padded(r, T, s->values, s->pad_values);
        values = s->pad_values;
        returns = s->pad_returns;
    }
    tr_adv_cfg cfg = {al->advantage, al->norm_by_std, TR_ADV_GRPO_EPS, (float)al->gamma,
                      (float)al->lam};
    tr_adv_input in = {B, T, s->reward, r->group, s->n_groups, s->mask, values, token_rewards};
    if (tr_adv_compute(&cfg, &in, s->pad_adv, returns, err)) return tr_err_wrap(err, "advantages");
    tr_rl_from_padded(r, T, s->pad_adv, s->adv);
    if (critic) tr_rl_from_padded(r, T, s->pad_returns, s->returns);
    return 0;
}

// Prompts -> generate -> reward.score into s->batch. Dynamic sampling keeps only groups
// whose rewards differ and draws more prompts until the batch is full or max_resample extra
// rounds are spent; *rounds gets the rounds generated.
static int collect(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, bool dynamic,
                   tr_phase_timer *pt, int32_t *rounds, tr_err *err) {
    const int32_t P = (int32_t)run->recipe->train.prompts_per_step;
    int32_t round = 0;
    do {
        if (tr_rl_generate(run, s, train, step, round, err) ||
            (round == 0 && tr_rl_sample_ahead(run, s, train, step, err)))
            return -1;
        tr_phase_start(pt, "reward");
        if (tr_rl_step_reserve_gen(s, s->gen.n, err) ||
            tr_rl_score(run, &s->gen, s->n_generated, s->gen_score, s->gen_reward, s, err))
            return -1;
        tr_phase_stop(pt);
        int32_t kept_groups = P;
        if (dynamic) {
            if (tr_dynamic_sampling_filter(s->gen_reward, s->gen.group, s->gen.n, P, s->keep,
                                           &kept_groups, err))
                return -1;
        } else {
            memset(s->keep, 1, (size_t)s->gen.n);
        }
        if (tr_rollouts_take_groups(&s->batch, &s->n_groups, P, s->reward, s->score, &s->gen,
                                    s->gen_reward, s->gen_score, s->keep, err))
            return -1;
        round++;
    } while (dynamic && s->n_groups < P && round <= run->recipe->rollout.max_resample);
    tr_phase_add(pt, "generate", s->t_gen);
    *rounds = round;
    return 0;
}

static int log_critic(tr_run *run, const tr_train_metrics *cm, tr_err *err) {
    tr_metrics *m = &run->m;
    return tr_metrics_set(m, "critic/value_loss", cm->value_loss, err) ||
                   tr_metrics_set(m, "critic/clip_frac", cm->value_clip_frac, err) ||
                   tr_metrics_set(m, "critic/grad_norm", cm->grad_norm, err) ||
                   tr_metrics_set(m, "critic/value_mean", cm->value_mean, err)
               ? -1
               : 0;
}

// The update on the collected batch: reference and behaviour logprobs, the critic's values,
// advantages, policy.train (ppo_epochs x mini_batches optimizer steps, refused by the trainer
// unless its weights are the ones the pipeline implies), critic.train towards the returns
// (values at rollout as the clip centre), the weight sync, and the training metrics.
static int update(tr_run *run, tr_rl_step *s, int64_t step, bool critic, tr_phase_timer *pt,
                  tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    const bool kl = recipe->algorithm.kl_coef > 0;
    if (tr_rl_step_layout(s, err)) return -1;
    if (kl) {
        tr_phase_start(pt, "reference");
        if (tr_model_logprobs(run->reference, &s->batch, s->ref_lp, NULL, err)) return -1;
    }
    // The behaviour logprobs on the training path should equal what generation reported;
    // the largest difference is logged. Their time counts as training.
    tr_phase_start(pt, "train");
    if (tr_rl_old_logprobs(run, s, err)) return -1;
    if (critic) {
        tr_phase_start(pt, "critic");
        if (tr_critic_values(run->critic, &s->batch, s->values, err)) return -1;
    }
    tr_phase_stop(pt);
    double kl_reward;
    if (advantages(run, s, critic, &kl_reward, err) || tr_rl_off_policy(run, s, err)) return -1;

    tr_train_batch tb = {&s->batch, s->adv, s->old_lp,
                         kl && recipe->algorithm.kl_placement == TR_KL_IN_LOSS ? s->ref_lp : NULL,
                         critic ? s->returns : NULL, critic ? s->values : NULL, s->lag};
    tr_train_metrics tm, cm;
    tr_phase_start(pt, "train");
    if (tr_policy_train(run->policy, &tb, &tm, err)) return -1;
    if (critic) {
        tr_phase_start(pt, "critic");
        if (tr_critic_train(run->critic, &tb, &cm, err)) return -1;
    }
    tr_phase_stop(pt);
    if (tr_rl_sync(run, s, true, err)) return -1;
    return tr_rl_log_train(run, s, &tm, kl, kl_reward, err) || tr_rl_log_rates(run, s, pt, &tm, err) ||
                   tr_rl_log_staleness(run, s, tm.step, tm.steps, err) ||
                   (critic && log_critic(run, &cm, err)) || tr_rl_log_samples(run, step, s, err)
               ? -1
               : 0;
}

// One step: collect, log the rollouts, update (skipped when dynamic sampling kept no group).
static int rl_step(tr_run *run, tr_rl_step *s, tr_prompt_loader *train, int64_t step, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    const bool critic = recipe->workflow == TR_RECIPE_PPO;
    const bool dynamic = !critic && recipe->rollout.dynamic_sampling;
    tr_phase_timer pt;
    tr_phase_init(&pt);
    tr_rl_step_reset(s);
    int32_t rounds;
    if (tr_rl_step_reserve_batch(s, (int32_t)(recipe->train.prompts_per_step * recipe->rollout.n), err) ||
        collect(run, s, train, step, dynamic, &pt, &rounds, err) || tr_rl_log_rollouts(run, s, err) ||
        (dynamic && (tr_metrics_set(&run->m, "dynamic/groups", s->n_groups, err) ||
                     tr_metrics_set(&run->m, "dynamic/rounds", rounds, err))))
        return -1;
    if (s->n_groups > 0 && update(run, s, step, critic, &pt, err)) return -1;
    return tr_phase_log(&pt, &run->m, err);
}

// rollout.stop_ids against the vocabulary the policy loaded: its config is the workers' to
// read, so the recipe could only check the ids' form.
static int check_stop_ids(const tr_run *run, tr_err *err) {
    const tr_recipe_token_ids *s = &run->recipe->rollout.stop_ids;
    const tr_role_info *in = tr_controller_role_info(run->ctl, TR_RECIPE_POLICY);
    if (!in || in->vocab_size <= 0) return 0;
    for (int32_t i = 0; i < s->n; i++)
        if (s->ids[i] >= in->vocab_size)
            return tr_errf(err, TR_ERANGE, "rollout.stop_ids[%d]: %d is outside the policy's vocabulary [0, %d)",
                           (int)i, (int)s->ids[i], (int)in->vocab_size);
    return 0;
}

int tr_workflow_rl(tr_run *run, tr_err *err) {
    const tr_recipe *recipe = run->recipe;
    if (check_stop_ids(run, err)) return -1;
    tr_prompt_loader train = {0}, eval = {0};
    bool has_eval = recipe->data.eval[0] != '\0';
    tr_rl_step s;
    tr_rl_step_init(&s);
    int rc_ = -1;
    int32_t max_prompt = (int32_t)recipe->data.max_prompt_len;
    if (tr_prompt_loader_init(&train, recipe->data.train, run->chatp, run->tok, max_prompt, true,
                              (uint64_t)recipe->seed, err) ||
        (has_eval && tr_prompt_loader_init(&eval, recipe->data.eval, run->chatp, run->tok, max_prompt,
                                           false, 0, err)))
        goto done;

    // The generator starts from the policy's weights (a resumed run's, once loaded).
    if (tr_rl_sync(run, &s, false, err)) goto done;
    if (!run->resumed && has_eval) {  // step 0: the starting policy's accuracy
        tr_metrics_begin(&run->m, 0);
        if (tr_rl_eval(run, &eval, err) || tr_metrics_commit(&run->m, err)) goto done;
    }
    for (int64_t step = run->step + 1; step <= recipe->train.steps; step++) {
        double t_step = tr_metrics_now();
        tr_metrics_begin(&run->m, step);
        if (rl_step(run, &s, &train, step, err)) goto done;
        if (tr_run_eval_due(step, recipe->train.steps, recipe->train.eval_every) && has_eval &&
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
