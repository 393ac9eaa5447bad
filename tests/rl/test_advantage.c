// Advantage estimators against hand computations of their published definitions:
// GRPO (DeepSeekMath, unbiased std), Dr.GRPO, RLOO (Ahmadian et al. 2024), REINFORCE++ and
// its baseline variant (Hu 2025, as in verl), GAE (Schulman et al. 2016) with PPO whitening;
// GAE also against a float64 brute-force sum of discounted TD errors. Edge cases: groups of
// one, all-equal rewards, fully masked rows, masked tokens inside a row.
#include <stdint.h>

#include "rl/advantage.h"
#include "rl/advantage_shaping.h"
#include "tests/test.h"

static void test_grpo(void) {
    tr_err err = {0};
    // Group 0 = {1, 2, 3} at positions 0, 2, 4; group 1 = {0, 0, 1, 1} at 1, 3, 5, 6.
    const float r[7] = {1, 0, 2, 0, 3, 1, 1};
    const int32_t g[7] = {0, 1, 0, 1, 0, 1, 1};
    float a[7];
    CHECK(tr_adv_grpo(r, g, 7, 2, true, TR_ADV_GRPO_EPS, a, &err) == 0);
    // Group 0: mean 2, unbiased var ((1)^2 + 0 + 1^2) / (3 - 1) = 1, std 1:
    //   A = (r - 2) / (1 + 1e-6) = -0.999999, 0, 0.999999.
    CHECK_NEAR(a[0], -1.0 / (1.0 + 1e-6), 1e-7);
    CHECK_NEAR(a[2], 0.0, 1e-7);
    CHECK_NEAR(a[4], 1.0 / (1.0 + 1e-6), 1e-7);
    // Group 1: mean 0.5, squared deviations 4 * 0.25 = 1, unbiased var 1/3, std 0.57735027:
    //   A = +-0.5 / (0.57735027 + 1e-6) = +-0.86602390 (the biased std 0.5 would give +-1).
    CHECK_NEAR(a[1], -0.5 / (sqrt(1.0 / 3.0) + 1e-6), 1e-6);
    CHECK_NEAR(a[3], -0.86602390, 1e-6);
    CHECK_NEAR(a[5], 0.86602390, 1e-6);
    CHECK_NEAR(a[6], 0.86602390, 1e-6);

    // Dr.GRPO: no std division, A = r - mean.
    CHECK(tr_adv_grpo(r, g, 7, 2, false, TR_ADV_GRPO_EPS, a, &err) == 0);
    const float drg[7] = {-1, -0.5f, 0, -0.5f, 1, 0.5f, 0.5f};
    CHECK(tr_test_max_abs_err(a, drg, 7) < 1e-7);

    // All-equal rewards: r - mean = 0 and std = 0, so 0 / (0 + eps) = 0, not NaN.
    const float same[3] = {2, 2, 2};
    const int32_t g0[3] = {0, 0, 0};
    CHECK(tr_adv_grpo(same, g0, 3, 1, true, TR_ADV_GRPO_EPS, a, &err) == 0);
    CHECK(a[0] == 0.0f && a[1] == 0.0f && a[2] == 0.0f);

    // A group of one has no baseline: 0 (torch.std of one element would be NaN).
    const float one[3] = {5, 1, 3};
    const int32_t gs[3] = {2, 0, 0};
    CHECK(tr_adv_grpo(one, gs, 3, 3, true, TR_ADV_GRPO_EPS, a, &err) == 0);
    CHECK(a[0] == 0.0f);
    // The other group {1, 3}: mean 2, unbiased std sqrt(2), A = -+1 / (1.41421356 + 1e-6).
    CHECK_NEAR(a[1], -1.0 / (sqrt(2.0) + 1e-6), 1e-6);
    CHECK_NEAR(a[2], 1.0 / (sqrt(2.0) + 1e-6), 1e-6);

    // Group ids outside [0, n_groups) are an error, not a write out of bounds.
    const int32_t bad[3] = {0, 3, 0};
    CHECK(tr_adv_grpo(one, bad, 3, 3, true, TR_ADV_GRPO_EPS, a, &err) == -1);
    CHECK(err.code == TR_ERANGE && strstr(err.msg, "response 1") != NULL);
}

static void test_rloo(void) {
    tr_err err = {0};
    const float r[7] = {1, 0, 2, 0, 3, 1, 1};
    const int32_t g[7] = {0, 1, 0, 1, 0, 1, 1};
    float a[7];
    CHECK(tr_adv_rloo(r, g, 7, 2, a, &err) == 0);
    // Group 0 {1,2,3}: 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5.
    // Group 1 {0,0,1,1}: 0 - (0+1+1)/3 = -2/3, 1 - (0+0+1)/3 = 2/3.
    const float want[7] = {-1.5f, -2.0f / 3, 0, -2.0f / 3, 1.5f, 2.0f / 3, 2.0f / 3};
    CHECK(tr_test_max_abs_err(a, want, 7) < 1e-6);
    const float one[1] = {7};
    const int32_t g0[1] = {0};
    CHECK(tr_adv_rloo(one, g0, 1, 1, a, &err) == 0);
    CHECK(a[0] == 0.0f);
}

static void test_returns_and_whiten(void) {
    // G_t = r_t + gamma G_{t+1}, gamma 0.5: row 0 rewards [1, 0, 2] -> G = [1.5, 1, 2];
    // row 1 [1, (masked), 2] -> the masked token is no step: G = [1 + 0.5*2, 0, 2] = [2, 0, 2].
    const float r[6] = {1, 0, 2, 1, 9, 2};
    const uint8_t m[6] = {1, 1, 1, 1, 0, 1};
    float G[6];
    tr_adv_discounted_returns(r, m, 2, 3, 0.5f, G);
    const float want[6] = {1.5f, 1, 2, 2, 0, 2};
    CHECK(tr_test_max_abs_err(G, want, 6) == 0.0);

    // Whitening: valid {1, 2, 3}: mean 2, unbiased var 1 -> (x - 2) / sqrt(1 + 1e-8).
    float x[4] = {1, 2, 100, 3};
    const uint8_t mx[4] = {1, 1, 0, 1};
    tr_adv_whiten(x, mx, 4);
    CHECK_NEAR(x[0], -1.0 / sqrt(1.0 + 1e-8), 1e-7);
    CHECK(x[1] == 0.0f && x[2] == 0.0f);
    CHECK_NEAR(x[3], 1.0 / sqrt(1.0 + 1e-8), 1e-7);
    // One valid entry: var defined as 0, (x - mean) = 0. None: all zero, no NaN.
    float y[2] = {4, 5};
    const uint8_t my[2] = {0, 1};
    tr_adv_whiten(y, my, 2);
    CHECK(y[0] == 0.0f && y[1] == 0.0f);
    const uint8_t mz[2] = {0, 0};
    float z[2] = {4, 5};
    tr_adv_whiten(z, mz, 2);
    CHECK(z[0] == 0.0f && z[1] == 0.0f);
}

static void test_reinforce_pp(void) {
    tr_err err = {0};
    // B=2, T=3; row 1 has two valid tokens. Outcome rewards [1, 0]; per-token extra rewards
    // (a KL penalty) [[-0.1, 0, -0.1], [0, -0.2, -]]; gamma 1.
    // Token rewards: row 0 [-0.1, 0, -0.1 + 1] -> returns [0.8, 0.9, 0.9];
    //                row 1 [0, -0.2]           -> returns [-0.2, -0.2].
    // Batch whitening over the 5 valid tokens: mean 2.2/5 = 0.44, squared deviations
    // 0.1296 + 0.2116 + 0.2116 + 0.4096 + 0.4096 = 1.372, unbiased var 1.372/4 = 0.343.
    const float R[2] = {1, 0};
    const float extra[6] = {-0.1f, 0, -0.1f, 0, -0.2f, 5};
    const uint8_t m[6] = {1, 1, 1, 1, 1, 0};
    const int32_t g[2] = {0, 1};
    tr_adv_input in = {.B = 2, .T = 3, .seq_rewards = R, .group = g, .n_groups = 2, .mask = m,
                       .token_rewards = extra};
    tr_adv_cfg cfg = {.kind = TR_ADV_REINFORCE_PP, .gamma = 1.0f};
    float a[6], ret[6];
    CHECK(tr_adv_compute(&cfg, &in, a, ret, &err) == 0);
    double s = sqrt(0.343 + 1e-8);
    const float want[6] = {(float)(0.36 / s), (float)(0.46 / s), (float)(0.46 / s),
                           (float)(-0.64 / s), (float)(-0.64 / s), 0};
    CHECKF(tr_test_max_abs_err(a, want, 6) < 2e-6, "err %g", tr_test_max_abs_err(a, want, 6));
    CHECK(tr_test_max_abs_err(ret, a, 6) == 0.0);
}

static void test_reinforce_pp_baseline(void) {
    tr_err err = {0};
    // Rewards [1, 0 | 1, 1], groups [0, 0, 1, 1]: minus the group mean -> [0.5, -0.5, 0, 0].
    // Row lengths 2, 1, 3, 0 (row 3 is an empty response: it still counts in its group's
    // mean but has no tokens). Token values 0.5, 0.5, -0.5, 0, 0, 0: mean 1/12, squared
    // deviations 2 (5/12)^2 + (7/12)^2 + 3 (1/12)^2 = 102/144, unbiased var 102/720.
    const float R[4] = {1, 0, 1, 1};
    const int32_t g[4] = {0, 0, 1, 1};
    const uint8_t m[12] = {1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0};
    tr_adv_input in = {.B = 4, .T = 3, .seq_rewards = R, .group = g, .n_groups = 2, .mask = m};
    tr_adv_cfg cfg = {.kind = TR_ADV_REINFORCE_PP_BASELINE, .gamma = 1.0f};
    float a[12];
    CHECK(tr_adv_compute(&cfg, &in, a, NULL, &err) == 0);
    double s = sqrt(102.0 / 720.0 + 1e-8);
    const float want[12] = {(float)(5.0 / 12 / s), (float)(5.0 / 12 / s), 0, (float)(-7.0 / 12 / s), 0, 0,
                            (float)(-1.0 / 12 / s), (float)(-1.0 / 12 / s), (float)(-1.0 / 12 / s), 0, 0, 0};
    CHECKF(tr_test_max_abs_err(a, want, 12) < 2e-6, "err %g", tr_test_max_abs_err(a, want, 12));
}

static void test_gae(void) {
    tr_err err = {0};
    // One row, mask [1,1,1,0], values [0.5, 0.4, 0.6, -], outcome reward 1 on t=2,
    // gamma 0.9, lambda 0.8 (gamma*lambda 0.72):
    //   t=2: delta = 1 + 0.9*0 - 0.6 = 0.4                A = 0.4
    //   t=1: delta = 0 + 0.9*0.6 - 0.4 = 0.14             A = 0.14 + 0.72*0.4 = 0.428
    //   t=0: delta = 0 + 0.9*0.4 - 0.5 = -0.14            A = -0.14 + 0.72*0.428 = 0.16816
    //   returns = A + V = [0.66816, 0.828, 1.0]
    const float V[4] = {0.5f, 0.4f, 0.6f, 9.0f};
    const uint8_t m[4] = {1, 1, 1, 0};
    float r[4], a[4], ret[4];
    const float R[1] = {1};
    tr_adv_place_rewards(R, NULL, m, 1, 4, r);
    CHECK(r[0] == 0 && r[1] == 0 && r[2] == 1 && r[3] == 0);
    tr_adv_gae(r, V, m, 1, 4, 0.9f, 0.8f, a, ret);
    const float wa[4] = {0.16816f, 0.428f, 0.4f, 0}, wr[4] = {0.66816f, 0.828f, 1.0f, 0};
    CHECK(tr_test_max_abs_err(a, wa, 4) < 1e-6);
    CHECK(tr_test_max_abs_err(ret, wr, 4) < 1e-6);
    // gamma = lambda = 1: A_t = (sum of future rewards) - V_t, so every return is 1.
    tr_adv_gae(r, V, m, 1, 4, 1.0f, 1.0f, a, ret);
    const float mc[4] = {0.5f, 0.6f, 0.4f, 0};
    CHECK(tr_test_max_abs_err(a, mc, 4) < 1e-6);
    CHECK(fabs(ret[0] - 1.0) < 1e-6 && fabs(ret[1] - 1.0) < 1e-6 && fabs(ret[2] - 1.0) < 1e-6);
    // A masked token inside the row is skipped: mask [1,0,1], V [0.5, -, 0.6]:
    //   t=2: A = 1 - 0.6 = 0.4;  t=0: delta = 0.9*0.6 - 0.5 = 0.04, A = 0.04 + 0.72*0.4 = 0.328.
    const float V2[3] = {0.5f, 7.0f, 0.6f};
    const uint8_t m2[3] = {1, 0, 1};
    float r2[3], a2[3], ret2[3];
    tr_adv_place_rewards(R, NULL, m2, 1, 3, r2);
    tr_adv_gae(r2, V2, m2, 1, 3, 0.9f, 0.8f, a2, ret2);
    CHECK_NEAR(a2[0], 0.328, 1e-6);
    CHECK(a2[1] == 0.0f && ret2[1] == 0.0f);
    CHECK_NEAR(a2[2], 0.4, 1e-6);

    // Against the float64 definition A_t = sum_l (gamma lambda)^l delta_{t+l} on random rows,
    // then tr_adv_compute's PPO whitening against a float64 whitening of that.
    enum { B = 5, T = 7 };
    float vals[B * T], tokr[B * T], seqr[B], adv[B * T], rets[B * T];
    uint8_t mask[B * T];
    int32_t grp[B];
    uint32_t s = 12345;
    for (int i = 0; i < B * T; i++) {
        s = s * 1664525u + 1013904223u;
        vals[i] = (float)((s >> 8) % 2000) / 1000.0f - 1.0f;
        s = s * 1664525u + 1013904223u;
        tokr[i] = (float)((s >> 8) % 200) / 1000.0f - 0.1f;
    }
    const int lens[B] = {7, 3, 0, 1, 5};
    for (int b = 0; b < B; b++) {
        seqr[b] = (float)b - 1.5f;
        grp[b] = 0;
        for (int t = 0; t < T; t++) mask[b * T + t] = t < lens[b];
    }
    tr_adv_input in = {.B = B, .T = T, .seq_rewards = seqr, .group = grp, .n_groups = 1,
                       .mask = mask, .values = vals, .token_rewards = tokr};
    tr_adv_cfg cfg = {.kind = TR_ADV_GAE, .gamma = 0.95f, .lam = 0.9f};
    CHECK(tr_adv_compute(&cfg, &in, adv, rets, &err) == 0);
    double ref[B * T], sum = 0, cnt = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            ref[b * T + t] = 0;
            if (t >= lens[b]) continue;
            double A = 0, f = 1;
            for (int u = t; u < lens[b]; u++, f *= 0.95 * 0.9) {
                double rew = (double)tokr[b * T + u] + (u == lens[b] - 1 ? seqr[b] : 0.0);
                double vnext = u + 1 < lens[b] ? vals[b * T + u + 1] : 0.0;
                A += f * (rew + 0.95 * vnext - vals[b * T + u]);
            }
            ref[b * T + t] = A;
            CHECK_NEAR(rets[b * T + t], A + vals[b * T + t], 1e-5);
            sum += A;
            cnt++;
        }
    double mean = sum / cnt, ss = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < lens[b]; t++) ss += (ref[b * T + t] - mean) * (ref[b * T + t] - mean);
    double sd = sqrt(ss / (cnt - 1) + 1e-8);
    double worst = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            double want = t < lens[b] ? (ref[b * T + t] - mean) / sd : 0.0;
            if (fabs(adv[b * T + t] - want) > worst) worst = fabs(adv[b * T + t] - want);
        }
    CHECKF(worst < 1e-5, "gae whitened max err %g", worst);
    in.values = NULL;
    CHECK(tr_adv_compute(&cfg, &in, adv, rets, &err) == -1 && strstr(err.msg, "values") != NULL);
}

static void test_compute_group_kinds(void) {
    tr_err err = {0};
    // GRPO through tr_adv_compute: the score is the outcome reward plus the row's per-token
    // rewards: [1 + (-0.5), 0 + 0] = [0.5, 0] -> group {0.5, 0}: mean 0.25, unbiased std
    // sqrt(2 * 0.0625 / 1) = 0.35355339 -> A = +-0.25 / (0.35355339 + 1e-6).
    const float R[2] = {1, 0};
    const float extra[4] = {-0.25f, -0.25f, 3, 0};
    const uint8_t m[4] = {1, 1, 0, 1};
    const int32_t g[2] = {0, 0};
    tr_adv_input in = {.B = 2, .T = 2, .seq_rewards = R, .group = g, .n_groups = 1, .mask = m,
                       .token_rewards = extra};
    tr_adv_cfg cfg = {.kind = TR_ADV_GRPO, .norm_by_std = true, .eps = TR_ADV_GRPO_EPS};
    float a[4], ret[4];
    CHECK(tr_adv_compute(&cfg, &in, a, ret, &err) == 0);
    double A = 0.25 / (sqrt(0.125) + 1e-6);
    const float want[4] = {(float)A, (float)A, 0, (float)-A};
    CHECK(tr_test_max_abs_err(a, want, 4) < 1e-6);
    CHECK(tr_test_max_abs_err(ret, a, 4) == 0.0);
    // RLOO on the same scores: 0.5 - 0 = 0.5 and 0 - 0.5 = -0.5.
    cfg.kind = TR_ADV_RLOO;
    CHECK(tr_adv_compute(&cfg, &in, a, NULL, &err) == 0);
    CHECK(a[0] == 0.5f && a[1] == 0.5f && a[2] == 0.0f && a[3] == -0.5f);
    // A fully masked batch: every advantage 0, no NaN.
    const uint8_t none[4] = {0, 0, 0, 0};
    in.mask = none;
    for (int k = 0; k <= TR_ADV_REINFORCE_PP_BASELINE; k++) {
        if (k == TR_ADV_GAE) continue;
        cfg.kind = (enum tr_adv_kind)k;
        CHECK(tr_adv_compute(&cfg, &in, a, ret, &err) == 0);
        CHECK(a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == 0);
    }
    CHECK(strcmp(tr_adv_kind_name(TR_ADV_REINFORCE_PP_BASELINE), "reinforce_pp_baseline") == 0);
}

static void test_shaping(void) {
    tr_err err = {0};
    // DAPO: max 20 tokens, buffer 4 -> free up to 16, then -(len - 16)/4, -1 from 20 on.
    CHECK(tr_overlong_penalty(10, 20, 4, 1.0f) == 0.0f);
    CHECK(tr_overlong_penalty(16, 20, 4, 1.0f) == 0.0f);
    CHECK_NEAR(tr_overlong_penalty(17, 20, 4, 1.0f), -0.25, 1e-7);
    CHECK_NEAR(tr_overlong_penalty(18, 20, 4, 0.5f), -0.25, 1e-7);
    CHECK_NEAR(tr_overlong_penalty(20, 20, 4, 1.0f), -1.0, 1e-7);
    CHECK_NEAR(tr_overlong_penalty(25, 20, 4, 1.0f), -1.0, 1e-7);
    CHECK(tr_overlong_penalty(25, 20, 0, 1.0f) == 0.0f);

    // Groups: {1,1} all equal, {0,1} mixed, {0.5,0.5} all equal, {3} alone.
    const float r[7] = {1, 1, 0, 1, 0.5f, 0.5f, 3};
    const int32_t g[7] = {0, 0, 1, 1, 2, 2, 3};
    uint8_t keep[7];
    int32_t kept = -1;
    CHECK(tr_dynamic_sampling_filter(r, g, 7, 4, keep, &kept, &err) == 0);
    const uint8_t want[7] = {0, 0, 1, 1, 0, 0, 0};
    CHECK(memcmp(keep, want, 7) == 0);
    CHECK(kept == 1);
    const int32_t bad[1] = {-1};
    CHECK(tr_dynamic_sampling_filter(r, bad, 1, 4, keep, &kept, &err) == -1);
}

int main(void) {
    test_grpo();
    test_rloo();
    test_returns_and_whiten();
    test_reinforce_pp();
    test_reinforce_pp_baseline();
    test_gae();
    test_compute_group_kinds();
    test_shaping();
    return tr_test_summary("test_advantage");
}
