// Losses against hand computations of their published definitions (PPO clipped surrogate,
// DAPO clip-higher, dual clip, GSPO sequence ratio, Schulman's KL estimators, PPO2 value
// clipping, the four aggregation modes), every gradient against central finite differences
// of the loss itself, micro-batch additivity, and fully masked / empty batches.
#include <stdint.h>

#include "engine/loss.h"
#include "tests/test.h"

static tr_policy_loss_cfg base_cfg(void) {
    tr_policy_loss_cfg c = {.clip_low = 0.2f, .clip_high = 0.28f, .ratio = TR_RATIO_TOKEN,
                            .agg = TR_AGG_TOKEN_MEAN, .kl_est = TR_KL_K3};
    return c;
}

// One token with ratio r and advantage a: loss and dL/dlogp.
static double one_token(const tr_policy_loss_cfg *cfg, double r, float a, float *grad,
                        tr_policy_loss_out *out) {
    float lp = (float)log(r), old = 0.0f;
    uint8_t m = 1;
    tr_policy_loss_in in = {.B = 1, .T = 1, .mask = &m, .logp = &lp, .old_logp = &old, .adv = &a};
    tr_err err = {0};
    CHECK(tr_policy_loss(cfg, &in, out, grad, NULL, &err) == 0);
    return out->loss;
}

static void test_clipping(void) {
    tr_policy_loss_cfg cfg = base_cfg();
    tr_policy_loss_out o;
    float g;
    // L = max(-A r, -A clip(r, 1 - 0.2, 1 + 0.28)), dL/dlogp = dL/dr * r.
    // r = 1.5, A = +1: max(-1.5, -1.28) = -1.28, clipped (high), gradient 0.
    CHECK_NEAR(one_token(&cfg, 1.5, 1.0f, &g, &o), -1.28, 1e-6);
    CHECK(g == 0.0f && o.clip_frac == 1.0 && o.clip_frac_high == 1.0 && o.clip_frac_low == 0.0);
    // r = 1.5, A = -1: max(1.5, 1.28) = 1.5, unclipped, gradient -A r = 1.5.
    CHECK_NEAR(one_token(&cfg, 1.5, -1.0f, &g, &o), 1.5, 1e-6);
    CHECK_NEAR(g, 1.5, 1e-6);
    CHECK(o.clip_frac == 0.0);
    // r = 0.5, A = +1: max(-0.5, -0.8) = -0.5, unclipped, gradient -0.5.
    CHECK_NEAR(one_token(&cfg, 0.5, 1.0f, &g, &o), -0.5, 1e-6);
    CHECK_NEAR(g, -0.5, 1e-6);
    // r = 0.5, A = -1: max(0.5, 0.8) = 0.8, clipped (low), gradient 0.
    CHECK_NEAR(one_token(&cfg, 0.5, -1.0f, &g, &o), 0.8, 1e-6);
    CHECK(g == 0.0f && o.clip_frac_low == 1.0);
    // Clip-higher: r = 1.25, A = +1 stays unclipped under 1 + 0.28 (a symmetric 0.2 clips it).
    CHECK_NEAR(one_token(&cfg, 1.25, 1.0f, &g, &o), -1.25, 1e-6);
    CHECK_NEAR(g, -1.25, 1e-6);
    cfg.clip_high = 0.2f;
    CHECK_NEAR(one_token(&cfg, 1.25, 1.0f, &g, &o), -1.2, 1e-6);
    CHECK(g == 0.0f);
    // Dual clip c = 3 bounds negative-advantage losses by -c A = 3:
    // r = 5, A = -1: min(max(5, 1.2), 3) = 3, gradient 0; r = 2: min(2, 3) = 2, gradient 2.
    cfg.clip_dual = 3.0f;
    CHECK_NEAR(one_token(&cfg, 5.0, -1.0f, &g, &o), 3.0, 1e-6);
    CHECK(g == 0.0f && o.dual_clip_frac == 1.0);
    CHECK_NEAR(one_token(&cfg, 2.0, -1.0f, &g, &o), 2.0, 1e-6);
    CHECK_NEAR(g, 2.0, 1e-6);
    // ... and leaves positive advantages alone: r = 5, A = +1 -> -1.2 (ordinary clip).
    CHECK_NEAR(one_token(&cfg, 5.0, 1.0f, &g, &o), -1.2, 1e-6);
    // Without it, r = 5, A = -1 costs 5.
    cfg.clip_dual = 0.0f;
    CHECK_NEAR(one_token(&cfg, 5.0, -1.0f, &g, &o), 5.0, 1e-5);
    // approx_kl = r - 1 - log r (k3 of KL(old || new)): r = 2 -> 1 - ln 2 = 0.30685282.
    one_token(&cfg, 2.0, 1.0f, &g, &o);
    CHECK_NEAR(o.approx_kl, 1.0 - log(2.0), 1e-6);
    CHECK_NEAR(o.ratio_mean, 2.0, 1e-6);
    // Invalid settings are errors.
    tr_err err = {0};
    uint8_t m = 1;
    float lp = 0, a = 1;
    tr_policy_loss_in in = {.B = 1, .T = 1, .mask = &m, .logp = &lp, .old_logp = &lp, .adv = &a};
    cfg.clip_dual = 0.5f;
    CHECK(tr_policy_loss(&cfg, &in, &o, &g, NULL, &err) == -1 && strstr(err.msg, "dual") != NULL);
    cfg.clip_dual = 0.0f;
    cfg.kl_coef = 0.1f;
    CHECK(tr_policy_loss(&cfg, &in, &o, &g, NULL, &err) == -1 && strstr(err.msg, "reference") != NULL);
}

static void test_aggregation(void) {
    // logp = old (ratio 1): every token's loss is -A. Rows: [1, 2, 3] and [4, -, -].
    const float adv[6] = {1, 2, 3, 4, 100, 100};
    const float lp[6] = {-1, -2, -3, -1, -1, -1};
    const uint8_t m[6] = {1, 1, 1, 1, 0, 0};
    tr_policy_loss_in in = {.B = 2, .T = 3, .mask = m, .logp = lp, .old_logp = lp, .adv = adv};
    tr_loss_norm norm;
    tr_loss_norm_from_mask(m, 2, 3, 4.0, &norm);
    CHECK(norm.n_tokens == 4.0 && norm.n_seqs == 2.0 && norm.max_len == 4.0);
    in.norm = &norm;
    //   token-mean:              -(1+2+3+4)/4        = -2.5
    //   seq-mean-token-sum:      -(6 + 4)/2          = -5
    //   seq-mean-token-mean:     -(6/3 + 4/1)/2      = -3
    //   seq-mean-token-sum-norm: -(6/4 + 4/4)/2      = -1.25   (max_len 4)
    const double want[4] = {-2.5, -5.0, -3.0, -1.25};
    // dL/dlogp of token (b,t) = weight * (-A) * r: weights 1/4, 1/2, 1/(2 len_b), 1/(2*4).
    const double w[4][2] = {{0.25, 0.25}, {0.5, 0.5}, {1.0 / 6, 0.5}, {0.125, 0.125}};
    tr_policy_loss_cfg cfg = base_cfg();
    tr_err err = {0};
    for (int k = 0; k < 4; k++) {
        cfg.agg = (enum tr_loss_agg)k;
        tr_policy_loss_out o;
        float g[6];
        CHECK(tr_policy_loss(&cfg, &in, &o, g, NULL, &err) == 0);
        CHECKF(fabs(o.loss - want[k]) < 1e-9, "%s: %g vs %g", tr_loss_agg_names[k], o.loss, want[k]);
        CHECK_NEAR(g[1], -2.0 * w[k][0], 1e-7);
        CHECK_NEAR(g[3], -4.0 * w[k][1], 1e-7);
        CHECK(g[4] == 0.0f && g[5] == 0.0f);
        CHECK(o.n_tokens == 4);
    }
    // With kl_coef 0 but reference logprobs given, the KL is measured and left out of the
    // loss and gradient: ref = logp - 0.5 on every token, k3 = e^-0.5 - 1 + 0.5 = 0.10653066.
    const float ref[6] = {-1.5f, -2.5f, -3.5f, -1.5f, 0, 0};
    in.ref_logp = ref;
    cfg.agg = TR_AGG_TOKEN_MEAN;
    tr_policy_loss_out o;
    float g[6];
    CHECK(tr_policy_loss(&cfg, &in, &o, g, NULL, &err) == 0);
    CHECK_NEAR(o.kl, 0.10653066, 1e-7);
    CHECK(o.loss == -2.5 && g[1] == -0.5f);
}

static void test_gspo(void) {
    // One row, log ratios [0.1, -0.3, 0.5] (mean 0.1): s = exp(0.1) = 1.10517092 for every
    // token; A = 1, inside [0.8, 1.28]: per-token loss -s, token-mean -1.10517092.
    // dL/dlogp_t = sum_t' w (-A) * ds/dlogp_t = 3 * (1/3) * (-1) * s/3 = -0.36839030.
    const float lp[3] = {0.1f, -0.3f, 0.5f}, old[3] = {0, 0, 0}, adv[3] = {1, 1, 1};
    const uint8_t m[3] = {1, 1, 1};
    tr_policy_loss_in in = {.B = 1, .T = 3, .mask = m, .logp = lp, .old_logp = old, .adv = adv};
    tr_policy_loss_cfg cfg = base_cfg();
    cfg.ratio = TR_RATIO_SEQUENCE;
    tr_policy_loss_out o;
    float g[3];
    tr_err err = {0};
    CHECK(tr_policy_loss(&cfg, &in, &o, g, NULL, &err) == 0);
    CHECK_NEAR(o.loss, -exp(0.1), 1e-6);
    for (int t = 0; t < 3; t++) CHECK_NEAR(g[t], -exp(0.1) / 3, 1e-6);
    // The token ratio on the same data differs: -(e^0.1 + e^-0.3 + e^0.5)/3, with the last
    // token clipped at 1.28: -(1.10517092 + 0.74081822 + 1.28)/3 = -1.04199638.
    cfg.ratio = TR_RATIO_TOKEN;
    CHECK(tr_policy_loss(&cfg, &in, &o, g, NULL, &err) == 0);
    CHECK_NEAR(o.loss, -(exp(0.1) + exp(-0.3) + 1.28) / 3, 1e-6);
    CHECK(g[2] == 0.0f);
    // A row whose mean log ratio is 0.5: s = 1.64872 > 1.28 with A > 0 clips the whole row.
    const float lp2[3] = {0.5f, 0.5f, 0.5f};
    in.logp = lp2;
    cfg.ratio = TR_RATIO_SEQUENCE;
    CHECK(tr_policy_loss(&cfg, &in, &o, g, NULL, &err) == 0);
    CHECK_NEAR(o.loss, -1.28, 1e-6);
    CHECK(g[0] == 0.0f && g[1] == 0.0f && g[2] == 0.0f && o.clip_frac == 1.0);
}

static void test_kl_estimators(void) {
    float d;
    // logp = -1, ref = -1.5, logr = -0.5:
    //   k1 = 0.5, d/dlogp = 1;  k2 = 0.125, d = -logr = 0.5;
    //   k3 = e^-0.5 - 1 + 0.5 = 0.10653066, d = 1 - e^-0.5 = 0.39346934.
    CHECK_NEAR(tr_kl_estimate(TR_KL_K1, -1.0f, -1.5f, &d), 0.5, 1e-7);
    CHECK_NEAR(d, 1.0, 1e-7);
    CHECK_NEAR(tr_kl_estimate(TR_KL_K2, -1.0f, -1.5f, &d), 0.125, 1e-7);
    CHECK_NEAR(d, 0.5, 1e-7);
    CHECK_NEAR(tr_kl_estimate(TR_KL_K3, -1.0f, -1.5f, &d), 0.10653066, 1e-7);
    CHECK_NEAR(d, 0.39346934, 1e-7);
    // k3 clamp: logr = 5 gives e^5 - 6 = 142.4, clamped to 10 with zero gradient.
    CHECK(tr_kl_estimate(TR_KL_K3, 0.0f, 5.0f, &d) == 10.0f && d == 0.0f);
    // Schulman's note: k1 and k3 are unbiased for KL(p || q) under samples of p. Exact
    // expectation over a 3-outcome distribution vs sum p log(p/q).
    const double p[3] = {0.5, 0.3, 0.2}, q[3] = {0.2, 0.5, 0.3};
    double kl = 0, e1 = 0, e3 = 0, e2 = 0;
    for (int i = 0; i < 3; i++) {
        kl += p[i] * log(p[i] / q[i]);
        e1 += p[i] * tr_kl_estimate(TR_KL_K1, (float)log(p[i]), (float)log(q[i]), NULL);
        e2 += p[i] * tr_kl_estimate(TR_KL_K2, (float)log(p[i]), (float)log(q[i]), NULL);
        e3 += p[i] * tr_kl_estimate(TR_KL_K3, (float)log(p[i]), (float)log(q[i]), NULL);
    }
    CHECK_NEAR(e1, kl, 1e-6);
    CHECK_NEAR(e3, kl, 1e-6);
    CHECK(fabs(e2 - kl) > 1e-3);  // k2 is biased (0.5 E[logr^2])

    // KL in the reward: penalty = -coef * k1 on valid tokens; mean k1 = (0.5 + 0.25)/2.
    const float lp[3] = {-1.0f, -2.0f, -1.0f}, ref[3] = {-1.5f, -2.25f, 0.0f};
    const uint8_t m[3] = {1, 1, 0};
    float pen[3];
    double mean = tr_kl_reward_penalty(TR_KL_K1, 0.1f, lp, ref, m, 3, pen);
    CHECK_NEAR(mean, 0.375, 1e-7);
    CHECK_NEAR(pen[0], -0.05, 1e-7);
    CHECK_NEAR(pen[1], -0.025, 1e-7);
    CHECK(pen[2] == 0.0f);
}

static void test_value_loss(void) {
    // l = 1/2 max((v-R)^2, (vc-R)^2), vc = old + clamp(v - old, -0.2, 0.2), old = 1:
    //   v 1.5, R 2: vc 1.2; 0.125 vs 0.32 -> 0.32 clipped, gradient 0 (clamp active)
    //   v 1.1, R 0: vc 1.1; tie 0.605 -> gradient v - R = 1.1
    //   v 0.5, R 2: vc 0.8; 1.125 vs 0.72 -> 1.125, gradient -1.5
    //   v 1.5, R 0: vc 1.2; 1.125 vs 0.72 -> 1.125, gradient 1.5
    //   v 0.5, R 0: vc 0.8; 0.125 vs 0.32 -> 0.32 clipped, gradient 0
    // token-mean: (0.32 + 0.605 + 1.125 + 1.125 + 0.32)/5 = 0.699; gradients / 5.
    const float v[6] = {1.5f, 1.1f, 0.5f, 1.5f, 0.5f, 3.0f}, old[6] = {1, 1, 1, 1, 1, 1};
    const float R[6] = {2, 0, 2, 0, 0, 0};
    const uint8_t m[6] = {1, 1, 1, 1, 1, 0};
    tr_value_loss_in in = {.B = 1, .T = 6, .mask = m, .values = v, .old_values = old, .returns = R};
    tr_value_loss_out o;
    float g[6];
    tr_err err = {0};
    CHECK(tr_value_loss(0.2f, TR_AGG_TOKEN_MEAN, &in, &o, g, &err) == 0);
    CHECK_NEAR(o.loss, 0.699, 1e-6);
    const float wg[6] = {0, 1.1f / 5, -1.5f / 5, 1.5f / 5, 0, 0};
    CHECK(tr_test_max_abs_err(g, wg, 6) < 1e-6);
    CHECK_NEAR(o.clip_frac, 0.4, 1e-12);
    CHECK_NEAR(o.value_mean, 1.02, 1e-6);  // (1.5 + 1.1 + 0.5 + 1.5 + 0.5)/5
    // clip 0: plain 1/2 (v - R)^2: (0.125 + 0.605 + 1.125 + 1.125 + 0.125)/5 = 0.621.
    CHECK(tr_value_loss(0.0f, TR_AGG_TOKEN_MEAN, &in, &o, g, &err) == 0);
    CHECK_NEAR(o.loss, 0.621, 1e-6);
    CHECK_NEAR(g[0], -0.5 / 5, 1e-7);
}

// Deterministic pseudo-random numbers in [lo, hi).
static uint32_t rng_state = 2024;
static float uniform(float lo, float hi) {
    rng_state = rng_state * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)((rng_state >> 8) & 0xffff) / 65536.0f;
}

enum { FB = 4, FT = 6 };

// Central differences of the policy loss in each logp and entropy, against the analytic
// gradient. Inputs are drawn away from the clip kinks (more than 10 h in ratio), so the
// loss is smooth within +-h of every point.
static void fd_policy(const tr_policy_loss_cfg *cfg, const char *what) {
    float lp[FB * FT], old[FB * FT], adv[FB * FT], ref[FB * FT], ent[FB * FT];
    uint8_t m[FB * FT];
    const int lens[FB] = {6, 2, 0, 4};
    for (int b = 0; b < FB; b++)
        for (int t = 0; t < FT; t++) {
            int i = b * FT + t;
            m[i] = t < lens[b];
            old[i] = uniform(-3.0f, -0.5f);
            for (;;) {
                // Sequence ratios average the row's log ratios; keep them well inside the clip.
                float span = cfg->ratio == TR_RATIO_SEQUENCE ? 0.12f : 0.35f;
                float lr = uniform(-span, span);
                double r = exp(lr);
                if (fabs(r - (1.0 - cfg->clip_low)) > 0.02 && fabs(r - (1.0 + cfg->clip_high)) > 0.02 &&
                    fabs(r - cfg->clip_dual) > 0.02) {
                    lp[i] = old[i] + lr;
                    break;
                }
            }
            adv[i] = uniform(-1.5f, 1.5f);
            ref[i] = lp[i] + uniform(-0.5f, 0.5f);
            ent[i] = uniform(0.1f, 2.0f);
        }
    tr_loss_norm norm;
    tr_loss_norm_from_mask(m, FB, FT, 8.0, &norm);
    tr_policy_loss_in in = {.B = FB, .T = FT, .mask = m, .logp = lp, .old_logp = old, .adv = adv,
                            .ref_logp = ref, .entropy = ent, .norm = &norm};
    tr_policy_loss_out o;
    float g[FB * FT], ge[FB * FT], g2[FB * FT], ge2[FB * FT];
    tr_err err = {0};
    CHECK(tr_policy_loss(cfg, &in, &o, g, ge, &err) == 0);
    if (cfg->ratio == TR_RATIO_SEQUENCE) {
        // The sequence ratio must stay off the kinks too: for this data each row's geometric
        // mean ratio is well inside the clip range; check instead of assuming.
        for (int b = 0; b < FB; b++) {
            if (!lens[b]) continue;
            double s = 0;
            for (int t = 0; t < lens[b]; t++) s += lp[b * FT + t] - old[b * FT + t];
            double r = exp(s / lens[b]);
            CHECKF(fabs(r - 1.0 + cfg->clip_low) > 0.01 && fabs(r - 1.0 - cfg->clip_high) > 0.01,
                   "%s: row %d ratio %g near a clip bound", what, b, r);
        }
    }
    const float h = 1e-3f;
    double worst = 0, scale = 0;
    int nonzero = 0;
    for (int i = 0; i < FB * FT; i++) {
        float save = lp[i];
        tr_policy_loss_out op, om;
        lp[i] = save + h;
        tr_policy_loss(cfg, &in, &op, g2, ge2, &err);
        lp[i] = save - h;
        tr_policy_loss(cfg, &in, &om, g2, ge2, &err);
        double fd = (op.loss - om.loss) / ((double)(save + h) - (double)(save - h));
        lp[i] = save;
        if (fabs(fd - g[i]) > worst) worst = fabs(fd - g[i]);
        if (fabs(g[i]) > scale) scale = fabs(g[i]);
        nonzero += g[i] != 0.0f;
        save = ent[i];
        ent[i] = save + h;
        tr_policy_loss(cfg, &in, &op, g2, ge2, &err);
        ent[i] = save - h;
        tr_policy_loss(cfg, &in, &om, g2, ge2, &err);
        fd = (op.loss - om.loss) / ((double)(save + h) - (double)(save - h));
        ent[i] = save;
        if (fabs(fd - ge[i]) > worst) worst = fabs(fd - ge[i]);
    }
    CHECKF(worst <= 1e-5 * scale, "%s: finite-difference error %g (scale %g)", what,
           worst, scale);
    CHECKF(nonzero >= 6, "%s: only %d nonzero gradients", what, nonzero);
    // Masked tokens and the empty row get exactly zero gradient.
    for (int t = 0; t < FT; t++) CHECK(g[2 * FT + t] == 0.0f && ge[2 * FT + t] == 0.0f);
}

static void test_finite_differences(void) {
    for (int agg = 0; agg < 4; agg++)
        for (int ratio = 0; ratio < 2; ratio++)
            for (int kl = 0; kl < 3; kl++) {
                tr_policy_loss_cfg cfg = base_cfg();
                cfg.agg = (enum tr_loss_agg)agg;
                cfg.ratio = (enum tr_ratio_mode)ratio;
                cfg.kl_est = (enum tr_kl_est)kl;
                cfg.kl_coef = 0.3f;
                cfg.entropy_coef = 0.01f;
                cfg.clip_dual = ratio == 0 && kl == 1 ? 1.2f : 0.0f;  // also exercise the dual bound
                char what[128];
                snprintf(what, sizeof what, "agg %s ratio %s kl %s", tr_loss_agg_names[agg],
                         tr_ratio_mode_names[ratio], tr_kl_est_names[kl]);
                fd_policy(&cfg, what);
            }

    // Value loss: points with |v - old| away from the clip (0.2) by more than h.
    float v[FB * FT], old[FB * FT], R[FB * FT], g[FB * FT], g2[FB * FT];
    uint8_t m[FB * FT];
    for (int i = 0; i < FB * FT; i++) {
        m[i] = i % 5 != 3;
        old[i] = uniform(-1, 1);
        float d = uniform(0.02f, 0.5f);
        if (fabsf(d - 0.2f) < 0.02f) d += 0.05f;
        v[i] = old[i] + (i % 2 ? d : -d);
        R[i] = uniform(-1.5f, 1.5f);
    }
    for (int agg = 0; agg < 4; agg++) {
        tr_loss_norm norm;
        tr_loss_norm_from_mask(m, FB, FT, 8.0, &norm);
        tr_value_loss_in in = {.B = FB, .T = FT, .mask = m, .values = v, .old_values = old,
                               .returns = R, .norm = &norm};
        tr_value_loss_out o, op, om;
        tr_err err = {0};
        CHECK(tr_value_loss(0.2f, (enum tr_loss_agg)agg, &in, &o, g, &err) == 0);
        CHECK(o.clip_frac > 0.0 && o.clip_frac < 1.0);  // both branches are exercised
        double worst = 0;
        const float h = 1e-3f;
        for (int i = 0; i < FB * FT; i++) {
            float save = v[i];
            v[i] = save + h;
            tr_value_loss(0.2f, (enum tr_loss_agg)agg, &in, &op, g2, &err);
            v[i] = save - h;
            tr_value_loss(0.2f, (enum tr_loss_agg)agg, &in, &om, g2, &err);
            v[i] = save;
            double fd = (op.loss - om.loss) / ((double)(save + h) - (double)(save - h));
            if (fabs(fd - g[i]) > worst) worst = fabs(fd - g[i]);
        }
        CHECKF(worst < 1e-5, "value loss %s: finite-difference error %g", tr_loss_agg_names[agg], worst);
    }
}

// Splitting a mini-batch into micro-batches that share the mini-batch denominators gives
// losses that add up to the whole and identical gradients, for every aggregation.
static void test_micro_batches(void) {
    enum { B = 4, T = 5 };
    float lp[B * T], old[B * T], adv[B * T], g[B * T], gm[B * T];
    uint8_t m[B * T];
    const int lens[B] = {5, 1, 3, 2};
    for (int i = 0; i < B * T; i++) {
        m[i] = i % T < lens[i / T];
        old[i] = uniform(-2, -0.1f);
        lp[i] = old[i] + uniform(-0.1f, 0.1f);
        adv[i] = uniform(-1, 1);
    }
    tr_loss_norm norm;
    tr_loss_norm_from_mask(m, B, T, 6.0, &norm);
    tr_err err = {0};
    for (int agg = 0; agg < 4; agg++) {
        tr_policy_loss_cfg cfg = base_cfg();
        cfg.agg = (enum tr_loss_agg)agg;
        tr_policy_loss_in in = {.B = B, .T = T, .mask = m, .logp = lp, .old_logp = old, .adv = adv,
                                .norm = &norm};
        tr_policy_loss_out whole, a, b;
        CHECK(tr_policy_loss(&cfg, &in, &whole, g, NULL, &err) == 0);
        tr_policy_loss_in first = in, second = in;
        first.B = 1;
        second.B = B - 1;
        second.mask = m + T;
        second.logp = lp + T;
        second.old_logp = old + T;
        second.adv = adv + T;
        CHECK(tr_policy_loss(&cfg, &first, &a, gm, NULL, &err) == 0);
        CHECK(tr_policy_loss(&cfg, &second, &b, gm + T, NULL, &err) == 0);
        CHECK_NEAR(a.loss + b.loss, whole.loss, 1e-9);
        CHECK(tr_test_max_abs_err(g, gm, B * T) == 0.0);
    }
}

static void test_empty(void) {
    // Fully masked and zero-row batches: loss 0, metrics 0, gradients 0, no NaN.
    const float x[4] = {-1, -2, -3, -4};
    const uint8_t none[4] = {0, 0, 0, 0};
    tr_policy_loss_cfg cfg = base_cfg();
    cfg.kl_coef = 0.1f;
    cfg.entropy_coef = 0.1f;
    tr_err err = {0};
    for (int agg = 0; agg < 4; agg++)
        for (int ratio = 0; ratio < 2; ratio++) {
            cfg.agg = (enum tr_loss_agg)agg;
            cfg.ratio = (enum tr_ratio_mode)ratio;
            tr_policy_loss_in in = {.B = 2, .T = 2, .mask = none, .logp = x, .old_logp = x, .adv = x,
                                    .ref_logp = x, .entropy = x};
            tr_policy_loss_out o;
            float g[4] = {9, 9, 9, 9}, ge[4] = {9, 9, 9, 9};
            CHECK(tr_policy_loss(&cfg, &in, &o, g, ge, &err) == 0);
            CHECK(o.loss == 0.0 && o.clip_frac == 0.0 && o.approx_kl == 0.0 && o.n_tokens == 0);
            CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0 && ge[3] == 0);
            in.B = 0;
            CHECK(tr_policy_loss(&cfg, &in, &o, g, ge, &err) == 0 && o.loss == 0.0);
        }
    tr_value_loss_in vin = {.B = 2, .T = 2, .mask = none, .values = x, .old_values = x, .returns = x};
    tr_value_loss_out vo;
    float gv[4];
    CHECK(tr_value_loss(0.2f, TR_AGG_SEQ_MEAN_TOKEN_MEAN, &vin, &vo, gv, &err) == 0);
    CHECK(vo.loss == 0.0 && gv[0] == 0.0f && vo.n_tokens == 0);
}

int main(void) {
    test_clipping();
    test_aggregation();
    test_gspo();
    test_kl_estimators();
    test_value_loss();
    test_finite_differences();
    test_micro_batches();
    test_empty();
    return tr_test_summary("test_loss");
}
