// Advantage estimators (GRPO, Dr.GRPO, RLOO, REINFORCE++, REINFORCE++-baseline, GAE).
// Statistics accumulate in double and use two passes (mean, then squared deviations) so
// that rewards with a large common offset keep their small differences.
#include "rl/advantage.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Per-group count, mean and sum of squared deviations.
typedef struct group_stats {
    int64_t *count;
    double *mean;
    double *m2;
} group_stats;

static void group_stats_free(group_stats *s) {
    free(s->count);
    free(s->mean);
    free(s->m2);
}

static int group_stats_init(group_stats *s, const float *r, const int32_t *group, int32_t n,
                            int32_t n_groups, tr_err *err) {
    memset(s, 0, sizeof *s);
    if (n < 0 || n_groups < 0) return tr_errf(err, TR_EINVAL, "advantage: negative batch size");
    for (int32_t i = 0; i < n; i++)
        if (group[i] < 0 || group[i] >= n_groups)
            return tr_errf(err, TR_ERANGE, "advantage: response %d has group id %d, outside [0, %d)",
                           (int)i, (int)group[i], (int)n_groups);
    size_t g = n_groups > 0 ? (size_t)n_groups : 1;
    s->count = calloc(g, sizeof *s->count);
    s->mean = calloc(g, sizeof *s->mean);
    s->m2 = calloc(g, sizeof *s->m2);
    if (!s->count || !s->mean || !s->m2) {
        group_stats_free(s);
        return tr_errf(err, TR_ENOMEM, "advantage: out of memory for %d groups", (int)n_groups);
    }
    for (int32_t i = 0; i < n; i++) {
        s->count[group[i]]++;
        s->mean[group[i]] += r[i];
    }
    for (int32_t k = 0; k < n_groups; k++)
        if (s->count[k] > 0) s->mean[k] /= (double)s->count[k];
    for (int32_t i = 0; i < n; i++) {
        double d = r[i] - s->mean[group[i]];
        s->m2[group[i]] += d * d;
    }
    return 0;
}

int tr_adv_grpo(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                bool norm_by_std, float eps, float *seq_adv, tr_err *err) {
    group_stats s;
    if (group_stats_init(&s, rewards, group, n, n_groups, err) != 0) return -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t g = group[i];
        if (s.count[g] < 2) {
            seq_adv[i] = 0.0f;
            continue;
        }
        double a = rewards[i] - s.mean[g];
        if (norm_by_std) a /= sqrt(s.m2[g] / (double)(s.count[g] - 1)) + (double)eps;
        seq_adv[i] = (float)a;
    }
    group_stats_free(&s);
    return 0;
}

int tr_adv_rloo(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                float *seq_adv, tr_err *err) {
    group_stats s;
    if (group_stats_init(&s, rewards, group, n, n_groups, err) != 0) return -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t g = group[i];
        double k = (double)s.count[g];
        // r_i - (k*mean - r_i)/(k-1) = k/(k-1) * (r_i - mean)
        seq_adv[i] = s.count[g] < 2 ? 0.0f : (float)(k / (k - 1.0) * (rewards[i] - s.mean[g]));
    }
    group_stats_free(&s);
    return 0;
}

int tr_adv_group_center(const float *rewards, const int32_t *group, int32_t n, int32_t n_groups,
                        float *seq_adv, tr_err *err) {
    group_stats s;
    if (group_stats_init(&s, rewards, group, n, n_groups, err) != 0) return -1;
    for (int32_t i = 0; i < n; i++)
        seq_adv[i] = s.count[group[i]] < 2 ? 0.0f : (float)(rewards[i] - s.mean[group[i]]);
    group_stats_free(&s);
    return 0;
}

void tr_adv_broadcast(const float *seq_adv, const uint8_t *mask, int32_t B, int32_t T, float *adv) {
    for (int32_t b = 0; b < B; b++)
        for (int32_t t = 0; t < T; t++) {
            int64_t i = (int64_t)b * T + t;
            adv[i] = mask[i] ? seq_adv[b] : 0.0f;
        }
}

void tr_adv_place_rewards(const float *seq_rewards, const float *extra, const uint8_t *mask,
                          int32_t B, int32_t T, float *token_rewards) {
    for (int32_t b = 0; b < B; b++) {
        int32_t last = -1;
        for (int32_t t = 0; t < T; t++) {
            int64_t i = (int64_t)b * T + t;
            token_rewards[i] = mask[i] && extra ? extra[i] : 0.0f;
            if (mask[i]) last = t;
        }
        if (last >= 0) token_rewards[(int64_t)b * T + last] += seq_rewards[b];
    }
}

void tr_adv_discounted_returns(const float *token_rewards, const uint8_t *mask, int32_t B,
                               int32_t T, float gamma, float *returns) {
    for (int32_t b = 0; b < B; b++) {
        double g = 0.0;
        for (int32_t t = T - 1; t >= 0; t--) {
            int64_t i = (int64_t)b * T + t;
            if (!mask[i]) {
                returns[i] = 0.0f;
                continue;
            }
            g = token_rewards[i] + (double)gamma * g;
            returns[i] = (float)g;
        }
    }
}

void tr_adv_gae(const float *token_rewards, const float *values, const uint8_t *mask, int32_t B,
                int32_t T, float gamma, float lam, float *adv, float *returns) {
    for (int32_t b = 0; b < B; b++) {
        double next_value = 0.0, next_adv = 0.0;  // terminal: nothing after the last valid token
        for (int32_t t = T - 1; t >= 0; t--) {
            int64_t i = (int64_t)b * T + t;
            if (!mask[i]) {
                adv[i] = 0.0f;
                if (returns) returns[i] = 0.0f;
                continue;
            }
            double delta = token_rewards[i] + (double)gamma * next_value - values[i];
            double a = delta + (double)gamma * (double)lam * next_adv;
            adv[i] = (float)a;
            if (returns) returns[i] = (float)(a + values[i]);
            next_value = values[i];
            next_adv = a;
        }
    }
}

void tr_adv_whiten(float *x, const uint8_t *mask, int64_t n) {
    double sum = 0.0;
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++)
        if (mask[i]) {
            sum += x[i];
            cnt++;
        }
    if (cnt == 0) {
        for (int64_t i = 0; i < n; i++) x[i] = 0.0f;
        return;
    }
    double mean = sum / (double)cnt, m2 = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (mask[i]) m2 += ((double)x[i] - mean) * ((double)x[i] - mean);
    double var = cnt > 1 ? m2 / (double)(cnt - 1) : 0.0;
    double inv = 1.0 / sqrt(var + TR_ADV_WHITEN_EPS);
    for (int64_t i = 0; i < n; i++) x[i] = mask[i] ? (float)(((double)x[i] - mean) * inv) : 0.0f;
}

// Outcome reward plus the sum of the row's per-token rewards: the score group estimators use.
static void sequence_scores(const tr_adv_input *in, float *scores) {
    for (int32_t b = 0; b < in->B; b++) {
        double s = in->seq_rewards[b];
        if (in->token_rewards)
            for (int32_t t = 0; t < in->T; t++) {
                int64_t i = (int64_t)b * in->T + t;
                if (in->mask[i]) s += in->token_rewards[i];
            }
        scores[b] = (float)s;
    }
}

int tr_adv_compute(const tr_adv_cfg *cfg, const tr_adv_input *in, float *adv, float *returns,
                   tr_err *err) {
    if (in->B < 0 || in->T < 0) return tr_errf(err, TR_EINVAL, "advantage: negative batch shape");
    int64_t n = (int64_t)in->B * in->T;
    switch (cfg->kind) {
    case TR_ADV_GRPO:
    case TR_ADV_RLOO:
    case TR_ADV_REINFORCE_PP_BASELINE: {
        float *scores = malloc(((size_t)in->B + 1) * 2 * sizeof(float));
        if (!scores) return tr_errf(err, TR_ENOMEM, "advantage: out of memory for %d responses", (int)in->B);
        float *seq_adv = scores + in->B + 1;
        sequence_scores(in, scores);
        int rc;
        if (cfg->kind == TR_ADV_GRPO)
            rc = tr_adv_grpo(scores, in->group, in->B, in->n_groups, cfg->norm_by_std, cfg->eps,
                             seq_adv, err);
        else if (cfg->kind == TR_ADV_RLOO)
            rc = tr_adv_rloo(scores, in->group, in->B, in->n_groups, seq_adv, err);
        else
            rc = tr_adv_group_center(scores, in->group, in->B, in->n_groups, seq_adv, err);
        if (rc == 0) {
            tr_adv_broadcast(seq_adv, in->mask, in->B, in->T, adv);
            if (cfg->kind == TR_ADV_REINFORCE_PP_BASELINE) tr_adv_whiten(adv, in->mask, n);
        }
        free(scores);
        if (rc != 0) return -1;
        break;
    }
    case TR_ADV_REINFORCE_PP:
        tr_adv_place_rewards(in->seq_rewards, in->token_rewards, in->mask, in->B, in->T, adv);
        tr_adv_discounted_returns(adv, in->mask, in->B, in->T, cfg->gamma, adv);
        tr_adv_whiten(adv, in->mask, n);
        break;
    case TR_ADV_GAE: {
        if (!in->values) return tr_errf(err, TR_EINVAL, "advantage gae: critic values are missing");
        if (!returns) return tr_errf(err, TR_EINVAL, "advantage gae: a returns buffer is required");
        // returns doubles as the token-reward scratch: tr_adv_gae reads r_t before writing it.
        tr_adv_place_rewards(in->seq_rewards, in->token_rewards, in->mask, in->B, in->T, returns);
        tr_adv_gae(returns, in->values, in->mask, in->B, in->T, cfg->gamma, cfg->lam, adv, returns);
        tr_adv_whiten(adv, in->mask, n);
        return 0;
    }
    default:
        return tr_errf(err, TR_EINVAL, "advantage: unknown estimator %d", (int)cfg->kind);
    }
    if (returns && returns != adv) memcpy(returns, adv, (size_t)n * sizeof(float));
    return 0;
}

const char *const tr_adv_kind_names[] = {"grpo", "gae", "rloo", "reinforce_pp",
                                         "reinforce_pp_baseline", NULL};

const char *tr_adv_kind_name(enum tr_adv_kind kind) {
    if ((int)kind < 0 || (int)kind > TR_ADV_REINFORCE_PP_BASELINE) return "unknown";
    return tr_adv_kind_names[kind];
}
