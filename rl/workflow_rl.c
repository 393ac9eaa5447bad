// Pieces of the GRPO and PPO step loop (rl/workflow_rl_loop.c): buffers, reward shaping,
// padded layout, rollout and training metrics, and evaluation on the held-out prompts.
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/json.h"
#include "engine/rng.h"
#include "rl/advantage_shaping.h"
#include "rl/workflow_rl.h"
#include "roles/reward_rule.h"

void tr_rl_step_init(tr_rl_step *s) {
    memset(s, 0, sizeof *s);
    tr_rollouts_init(&s->gen);
    tr_rollouts_init(&s->batch);
    tr_rollouts_init(&s->ahead_gen);
    tr_rollouts_init(&s->check);
}

void tr_rl_step_free(tr_rl_step *s) {
    // A round still in flight is forgotten: its replies are dropped when they come.
    tr_generate_abandon(s->ahead);
    tr_prompt_draw_free(&s->ahead_draw);
    tr_rollouts_free(&s->ahead_gen);
    tr_prompt_draw_free(&s->draw);
    tr_rollouts_free(&s->gen);
    tr_rollouts_free(&s->batch);
    tr_rollouts_free(&s->check);
    free(s->check_lp);
    free(s->check_entropy);
    free(s->gen_score);
    free(s->gen_reward);
    free(s->keep);
    free(s->score);
    free(s->reward);
    free(s->old_lp);
    free(s->ref_lp);
    free(s->entropy);
    free(s->values);
    free(s->adv);
    free(s->returns);
    free(s->mask);
    free(s->pad_old_lp);
    free(s->pad_ref_lp);
    free(s->pad_values);
    free(s->pad_kl_rewards);
    free(s->pad_adv);
    free(s->pad_returns);
    memset(s, 0, sizeof *s);
}

void tr_rl_step_reset(tr_rl_step *s) {
    tr_rollouts_clear(&s->batch);
    s->n_groups = 0;
    s->n_generated = s->gen_tokens = s->n_truncated = 0;
    s->reward_sum = s->reward_sq = s->score_sum = 0;
    s->lag = 0;
    s->version = -1;
    s->t_gen = 0;
    memset(&s->gen_report, 0, sizeof s->gen_report);
}

static int grow_f(float **p, size_t n) {
    float *q = realloc(*p, (n ? n : 1) * sizeof *q);
    if (!q) return -1;
    *p = q;
    return 0;
}

int tr_rl_step_reserve_gen(tr_rl_step *s, int32_t n, tr_err *err) {
    uint8_t *k = realloc(s->keep, (size_t)(n ? n : 1));
    if (k) s->keep = k;
    if (!k || grow_f(&s->gen_score, (size_t)n) || grow_f(&s->gen_reward, (size_t)n))
        return tr_errf(err, TR_ENOMEM, "rollout scores: out of memory for %d sequences", n);
    return 0;
}

int tr_rl_step_reserve_batch(tr_rl_step *s, int32_t n, tr_err *err) {
    if (n <= s->cap_seqs) return 0;
    if (grow_f(&s->score, (size_t)n) || grow_f(&s->reward, (size_t)n))
        return tr_errf(err, TR_ENOMEM, "step batch: out of memory for %d sequences", n);
    s->cap_seqs = n;
    return 0;
}

int tr_rl_step_layout(tr_rl_step *s, tr_err *err) {
    const tr_rollouts *r = &s->batch;
    int32_t T = 1;
    for (int32_t i = 0; i < r->n; i++)
        if (r->response_len[i] > T) T = r->response_len[i];
    s->B = r->n;
    s->T = T;
    size_t nt = (size_t)(r->n_tokens > 0 ? r->n_tokens : 1);
    if ((int64_t)nt > s->cap_tokens) {
        if (grow_f(&s->old_lp, nt) || grow_f(&s->ref_lp, nt) || grow_f(&s->entropy, nt) ||
            grow_f(&s->values, nt) || grow_f(&s->adv, nt) || grow_f(&s->returns, nt))
            return tr_errf(err, TR_ENOMEM, "step batch: out of memory for %zu tokens", nt);
        s->cap_tokens = (int64_t)nt;
    }
    int64_t np = (int64_t)s->B * T;
    if (np > s->cap_pad) {
        uint8_t *m = realloc(s->mask, (size_t)np);
        if (m) s->mask = m;
        size_t n = (size_t)np;
        if (!m || grow_f(&s->pad_old_lp, n) || grow_f(&s->pad_ref_lp, n) || grow_f(&s->pad_values, n) ||
            grow_f(&s->pad_kl_rewards, n) || grow_f(&s->pad_adv, n) || grow_f(&s->pad_returns, n))
            return tr_errf(err, TR_ENOMEM, "step batch: out of memory for %d x %d", s->B, T);
        s->cap_pad = np;
    }
    tr_rl_mask(r, T, s->mask);
    memset(s->old_lp, 0, nt * sizeof(float));
    memset(s->ref_lp, 0, nt * sizeof(float));
    memset(s->entropy, 0, nt * sizeof(float));
    memset(s->values, 0, nt * sizeof(float));
    memset(s->adv, 0, nt * sizeof(float));
    memset(s->returns, 0, nt * sizeof(float));
    return 0;
}

tr_sampling tr_rl_sampling(const tr_recipe *r, int64_t step, int32_t round) {
    tr_sampling s;
    memset(&s, 0, sizeof s);
    s.n = (int32_t)r->rollout.n;
    s.max_new_tokens = (int32_t)r->rollout.max_new_tokens;
    s.min_new_tokens = (int32_t)r->rollout.min_new_tokens;
    s.extra_stop_ids = r->rollout.stop_ids.ids;
    s.n_extra_stop = r->rollout.stop_ids.n;
    s.temperature = (float)r->rollout.temperature;
    s.top_p = (float)r->rollout.top_p;
    s.top_k = (int32_t)r->rollout.top_k;
    s.seed = tr_rng_derive(tr_rng_derive((uint64_t)r->seed, (uint64_t)step), (uint64_t)round);
    return s;
}

// A rule's zero score is "missing" when the response holds nothing the rule could read as
// an answer, else "wrong".
static bool answer_missing(enum tr_recipe_reward_fn fn, const char *text) {
    if (!text) return true;
    size_t n = strlen(text);
    switch (fn) {
    case TR_RECIPE_FN_NUMERIC_MATCH: {
        double v;
        return tr_reward_last_number(text, n, &v) == 0;
    }
    case TR_RECIPE_FN_EXACT_MATCH:
        for (size_t i = 0; i < n; i++)
            if (!isspace((unsigned char)text[i])) return false;
        return true;
    case TR_RECIPE_FN_REGEX: return true;  // no match: nothing was extracted
    }
    return true;
}

double tr_rl_shape_reward(const tr_recipe *recipe, float score, const char *text, int32_t response_len) {
    const tr_recipe_reward *rw = &recipe->reward;
    const tr_recipe_rollout *ro = &recipe->rollout;
    double v;
    if (rw->kind == TR_RECIPE_REWARD_RULE)
        v = score >= 0.5f                        ? rw->curve.correct
            : answer_missing(rw->function, text) ? rw->curve.missing
                                                 : rw->curve.wrong;
    else
        v = rw->curve.scale * score + rw->curve.shift;
    return v + tr_overlong_penalty(response_len, (int32_t)ro->max_new_tokens,
                                   (int32_t)ro->overlong_buffer, (float)ro->overlong_penalty);
}

int tr_rl_score(tr_run *run, const tr_rollouts *r, int64_t first, float *score, float *reward,
                tr_rl_step *s, tr_err *err) {
    int64_t failures = 0;
    if (r->n == 0) return 0;
    if (tr_reward_score(run->reward, r, first, score, &failures, err)) return -1;
    for (int32_t i = 0; i < r->n; i++) {
        if (!isfinite(score[i]))
            return tr_errf(err, TR_EPEER, "reward: sequence %d scored %g", i, (double)score[i]);
        // The response text tells a wrong answer from a missing one (rule rewards only).
        char *text = r->response_text ? r->response_text[i] : NULL, *decoded = NULL;
        if (!text && score[i] < 0.5f && run->recipe->reward.kind == TR_RECIPE_REWARD_RULE) {
            size_t len;
            const int32_t *resp = r->tokens + r->offset[i] + r->prompt_len[i];
            if (tr_tokenizer_decode(run->tok, resp, (size_t)r->response_len[i], &decoded, &len, err))
                return tr_err_wrap(err, "reward: decoding response %d", i);
            text = decoded;
        }
        double v = tr_rl_shape_reward(run->recipe, score[i], text, r->response_len[i]);
        free(decoded);
        reward[i] = (float)v;
        if (s) {
            s->n_generated++;
            s->gen_tokens += r->response_len[i];
            s->n_truncated += r->finish[i] == TR_FINISH_LENGTH;
            s->reward_sum += v;
            s->reward_sq += v * v;
            s->score_sum += score[i];
        }
    }
    // A step scores in several calls (rounds, eval chunks): its failures add up.
    if (failures > 0) {
        double before = tr_metrics_get(&run->m, "reward/failures");
        if (tr_metrics_set(&run->m, "reward/failures", (isnan(before) ? 0 : before) + (double)failures, err))
            return -1;
    }
    return 0;
}

void tr_rl_mask(const tr_rollouts *r, int32_t T, uint8_t *mask) {
    for (int32_t b = 0; b < r->n; b++)
        for (int32_t t = 0; t < T; t++) mask[(int64_t)b * T + t] = t < r->response_len[b];
}

void tr_rl_to_padded(const tr_rollouts *r, int32_t T, const float *tok, float *pad) {
    for (int32_t b = 0; b < r->n; b++) {
        const float *src = tok + r->offset[b] + r->prompt_len[b];
        for (int32_t t = 0; t < T; t++)
            pad[(int64_t)b * T + t] = t < r->response_len[b] ? src[t] : 0.0f;
    }
}

void tr_rl_from_padded(const tr_rollouts *r, int32_t T, const float *pad, float *tok) {
    for (int32_t b = 0; b < r->n; b++) {
        float *dst = tok + r->offset[b];
        for (int32_t t = 0; t < r->prompt_len[b]; t++) dst[t] = 0.0f;
        for (int32_t t = 0; t < r->response_len[b]; t++)
            dst[r->prompt_len[b] + t] = pad[(int64_t)b * T + t];
    }
}

double tr_rl_response_mean(const tr_rollouts *r, const float *x) {
    double sum = 0;
    int64_t n = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int64_t o = r->offset[i] + r->prompt_len[i];
        for (int32_t t = 0; t < r->response_len[i]; t++) sum += x[o + t];
        n += r->response_len[i];
    }
    return n ? sum / (double)n : NAN;
}

double tr_rl_max_abs_diff(const tr_rollouts *r, const float *a, const float *b) {
    double m = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int64_t o = r->offset[i] + r->prompt_len[i];
        for (int32_t t = 0; t < r->response_len[i]; t++) {
            double d = fabs((double)a[o + t] - (double)b[o + t]);
            if (!(d <= m)) m = d;  // NaN propagates
        }
    }
    return m;
}

// The sequences the policy recomputes when the old logprobs come from the rollout: k of the
// batch, spread evenly over it (so over its groups), as s->check.
static int pick_check(tr_rl_step *s, int32_t k, tr_err *err) {
    const tr_rollouts *r = &s->batch;
    tr_rollouts_clear(&s->check);
    for (int32_t j = 0; j < k; j++) {
        int32_t i = (int32_t)((int64_t)j * r->n / k);
        const int32_t *seq = r->tokens + r->offset[i];
        int32_t pl = r->prompt_len[i];
        if (tr_rollouts_append(&s->check, r->group[i], r->sample[i], seq, pl, seq + pl,
                               r->gen_logprobs + r->offset[i] + pl, r->response_len[i],
                               (enum tr_finish)r->finish[i], NULL, NULL, NULL, err))
            return -1;
    }
    size_t nt = (size_t)(s->check.n_tokens > 0 ? s->check.n_tokens : 1);
    if ((int64_t)nt > s->cap_check) {
        if (grow_f(&s->check_lp, nt) || grow_f(&s->check_entropy, nt))
            return tr_errf(err, TR_ENOMEM, "logprob check: out of memory for %zu tokens", nt);
        s->cap_check = (int64_t)nt;
    }
    return 0;
}

int tr_rl_old_logprobs(tr_run *run, tr_rl_step *s, tr_err *err) {
    const tr_rollouts *r = &s->batch;
    if (!tr_recipe_old_lp_from_rollout(run->recipe)) {
        if (tr_model_logprobs(run->policy, r, s->old_lp, s->entropy, err)) return -1;
        s->lp_diff = tr_rl_max_abs_diff(r, r->gen_logprobs, s->old_lp);
        s->lp_diff_seqs = r->n;
        s->entropy_mean = tr_rl_response_mean(r, s->entropy);
        return 0;
    }
    // Prompt entries are 0 in both.
    memcpy(s->old_lp, r->gen_logprobs, (size_t)r->n_tokens * sizeof(float));
    int64_t want = run->recipe->log.logprob_diff_sequences;
    int32_t k = want < r->n ? (int32_t)want : r->n;
    s->lp_diff = s->entropy_mean = NAN;
    s->lp_diff_seqs = k;
    if (k == 0) return 0;
    if (pick_check(s, k, err) ||
        tr_model_logprobs(run->policy, &s->check, s->check_lp, s->check_entropy, err))
        return -1;
    s->lp_diff = tr_rl_max_abs_diff(&s->check, s->check.gen_logprobs, s->check_lp);
    s->entropy_mean = tr_rl_response_mean(&s->check, s->check_entropy);
    return 0;
}

int tr_rl_eval(tr_run *run, tr_prompt_loader *eval, tr_err *err) {
    const int32_t chunk = 256;
    tr_prompt_draw d = {0};
    tr_rollouts r;
    tr_rollouts_init(&r);
    float *score = NULL, *reward = NULL;
    double acc = 0, rew = 0, len = 0;
    int rc = 0;
    tr_sampling smp = tr_rl_sampling(run->recipe, 0, 0);
    smp.n = 1;
    smp.temperature = 0.0f;
    smp.top_p = 1.0f;
    smp.top_k = 0;
    for (int64_t k = 0; k < eval->n && rc == 0; k += chunk) {
        int32_t cnt = (int32_t)(eval->n - k < chunk ? eval->n - k : chunk);
        tr_rollouts_clear(&r);
        if ((rc = tr_prompt_loader_draw(eval, k, cnt, &d, err))) break;
        if ((rc = tr_policy_generate(run->sampler, &d.batch, &smp, &r, err))) break;
        if (grow_f(&score, (size_t)r.n) || grow_f(&reward, (size_t)r.n)) {
            rc = tr_errf(err, TR_ENOMEM, "eval: out of memory");
            break;
        }
        if ((rc = tr_rl_score(run, &r, k, score, reward, NULL, err))) break;
        for (int32_t i = 0; i < r.n; i++) {
            acc += score[i];
            rew += reward[i];
            len += r.response_len[i];
        }
    }
    if (rc == 0) {
        double n = (double)eval->n;
        rc = tr_metrics_set(&run->m, "eval/accuracy", acc / n, err) ||
             tr_metrics_set(&run->m, "eval/reward", rew / n, err) ||
             tr_metrics_set(&run->m, "eval/response_len", len / n, err);
    } else {
        tr_err_wrap(err, "evaluation at step %" PRId64 " on %s", run->m.step, run->recipe->data.eval);
    }
    free(score);
    free(reward);
    tr_rollouts_free(&r);
    tr_prompt_draw_free(&d);
    return rc ? -1 : 0;
}

double tr_rl_peak(const tr_recipe *recipe, bool flops) {
    double set = flops ? recipe->log.peak_tflops : recipe->log.peak_gbps;
    if (set > 0) return set;
    return recipe->backend == TR_RECIPE_CUDA ? (flops ? 790.0 : 4300.0) : 0.0;
}

// value / seconds under key, when the phase ran.
static int log_rate(tr_metrics *m, const char *key, double value, double seconds, tr_err *err) {
    return seconds > 0 ? tr_metrics_set(m, key, value / seconds, err) : 0;
}

int tr_rl_log_rates(tr_run *run, const tr_rl_step *s, const tr_phase_timer *pt, const tr_train_metrics *tm,
                    tr_err *err) {
    tr_metrics *m = &run->m;
    double tokens = (double)s->batch.n_tokens, t_train = tr_phase_seconds(pt, "train");
    double peak = tr_rl_peak(run->recipe, true);
    return log_rate(m, "throughput/generate_tokens_per_s", (double)s->gen_tokens, tr_phase_seconds(pt, "generate"),
                    err) ||
                   log_rate(m, "throughput/reference_tokens_per_s", tokens, tr_phase_seconds(pt, "reference"), err) ||
                   log_rate(m, "throughput/train_tokens_per_s", tokens * (double)run->recipe->algorithm.ppo_epochs,
                            t_train, err) ||
                   log_rate(m, "throughput/train_tflops", tm->flops / 1e12, t_train, err) ||
                   (peak > 0 && log_rate(m, "utilization/train_mfu", tm->flops / 1e12 / peak, t_train, err))
               ? -1
               : 0;
}

int tr_rl_log_rollouts(tr_run *run, const tr_rl_step *s, tr_err *err) {
    tr_metrics *m = &run->m;
    double n = s->n_generated > 0 ? (double)s->n_generated : NAN;
    double mean = s->reward_sum / n;
    double var = s->n_generated > 1 ? (s->reward_sq - n * mean * mean) / (n - 1) : 0.0;
    if (var < 0) var = 0;
    const tr_gen_report *g = &s->gen_report;
    if (tr_metrics_set(m, "gen/prefill_tokens", (double)g->prefill_tokens, err) ||
        tr_metrics_set(m, "gen/decode_tokens", (double)g->decode_tokens, err) ||
        tr_metrics_set(m, "gen/decode_steps", (double)g->decode_steps, err) ||
        tr_metrics_set(m, "gen/batch_occupancy",
                       g->decode_steps ? (double)g->decode_tokens / (double)g->decode_steps : NAN, err) ||
        tr_metrics_set(m, "gen/peak_seqs", (double)g->peak_seqs, err) ||
        tr_metrics_set(m, "gen/peak_kv_blocks", (double)g->peak_blocks, err) ||
        tr_metrics_set(m, "gen/waits", (double)g->waits, err) ||
        tr_metrics_set(m, "gen/graph_steps", (double)g->graph_steps, err) ||
        tr_metrics_set(m, "gen/padded_rows", (double)g->padded_rows, err) ||
        tr_metrics_set(m, "gen/table_entries", (double)g->table_entries, err) ||
        tr_metrics_set(m, "gen/table_rewrites", (double)g->table_rewrites, err) ||
        tr_metrics_set(m, "gen/rows_sent", (double)g->rows_sent, err) ||
        tr_metrics_set(m, "time/decode_host_us",
                       g->decode_steps ? 1e6 * g->host_seconds / (double)g->decode_steps : NAN, err) ||
        tr_metrics_set(m, "throughput/decode_gbps", g->decode_seconds > 0 ? g->decode_bytes / g->decode_seconds / 1e9 : NAN,
                       err))
        return -1;
    double peak = tr_rl_peak(run->recipe, false);
    if (peak > 0 && g->decode_seconds > 0 &&
        tr_metrics_set(m, "utilization/decode_roofline", g->decode_bytes / g->decode_seconds / 1e9 / peak, err))
        return -1;
    return tr_metrics_set(m, "reward/mean", mean, err) ||
                   tr_metrics_set(m, "reward/std", sqrt(var), err) ||
                   tr_metrics_set(m, "score/mean", s->score_sum / n, err) ||
                   tr_metrics_set(m, "response_len/mean", (double)s->gen_tokens / n, err) ||
                   tr_metrics_set(m, "response_len/clip_ratio", (double)s->n_truncated / n, err)
               ? -1
               : 0;
}

int tr_rl_log_train(tr_run *run, const tr_rl_step *s, const tr_train_metrics *tm, bool kl,
                    double kl_reward, tr_err *err) {
    tr_metrics *m = &run->m;
    // kl: the loss term's when KL is in the loss, the reward penalty's when it is in the
    // reward (kl_reward not NaN), null when there is no KL at all. Entropy over the response
    // tokens of the batch, from the behaviour pass.
    double kl_v = !kl ? NAN : !isnan(kl_reward) ? kl_reward : tm->kl;
    return tr_metrics_set(m, "loss", tm->loss, err) || tr_metrics_set(m, "pg_loss", tm->pg_loss, err) ||
                   tr_metrics_set(m, "kl", kl_v, err) ||
                   tr_metrics_set(m, "entropy", s->entropy_mean, err) ||
                   tr_metrics_set(m, "clip_frac", tm->clip_frac, err) ||
                   tr_metrics_set(m, "approx_kl", tm->approx_kl, err) ||
                   tr_metrics_set(m, "grad_norm", tm->grad_norm, err) ||
                   tr_metrics_set(m, "lr", tm->lr, err) ||
                   tr_metrics_set(m, "logprob_diff/max", s->lp_diff, err) ||
                   tr_metrics_set(m, "logprob_diff/sequences", s->lp_diff_seqs, err)
               ? -1
               : 0;
}

int tr_rl_log_samples(tr_run *run, int64_t step, const tr_rl_step *s, tr_err *err) {
    int64_t every = run->recipe->log.samples_every;
    if (!run->samples || every <= 0 || step % every != 0) return 0;
    int32_t shown = 0, last_group = -1;
    tr_json_writer w;
    tr_json_writer_init(&w, 0);
    w.flags = TR_JSON_W_DATA | TR_JSON_W_ASCII;
    int rc = 0;
    for (int32_t i = 0; i < s->batch.n && shown < 4 && rc == 0; i++) {
        if (s->batch.group[i] == last_group) continue;
        last_group = s->batch.group[i];
        const tr_rollouts *r = &s->batch;
        char *resp = r->response_text ? r->response_text[i] : NULL, *decoded = NULL;
        size_t len;
        if (!resp) {
            if (tr_tokenizer_decode(run->tok, r->tokens + r->offset[i] + r->prompt_len[i],
                                    (size_t)r->response_len[i], &decoded, &len, err)) {
                rc = -1;
                break;
            }
            resp = decoded;
        }
        tr_json_writer_reset(&w);
        tr_json_begin_object(&w);
        tr_json_key(&w, "step");
        tr_json_int(&w, step);
        tr_json_key(&w, "prompt");
        tr_json_string(&w, r->prompt_text && r->prompt_text[i] ? r->prompt_text[i] : "");
        tr_json_key(&w, "response");
        tr_json_string(&w, resp);
        tr_json_key(&w, "reward");
        tr_json_double(&w, (double)s->reward[i]);
        tr_json_key(&w, "score");
        tr_json_double(&w, (double)s->score[i]);
        tr_json_end_object(&w);
        free(decoded);
        const char *out;
        size_t n;
        // Invalid UTF-8 in a cut-off response (or a non-finite reward): not worth failing
        // the step.
        if (tr_json_writer_finish(&w, &out, &n, NULL)) continue;
        if (fwrite(out, 1, n, run->samples) != n || fputc('\n', run->samples) == EOF)
            rc = tr_errf(err, TR_EIO, "samples.jsonl: write failed");
        shown++;
    }
    tr_json_writer_free(&w);
    if (rc) return -1;
    fflush(run->samples);
    return 0;
}
