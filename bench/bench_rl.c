// Speed of the RL algorithm code on one step's worth of tokens (2048 responses x 1024
// tokens, 80% valid): advantages, policy loss with gradients, value loss. These run on the
// controller's CPU between rollout and training, so they must stay far below a step's
// time. Run by hand: build-*/bench/bench_rl. Best of a few repetitions, ns per token.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rl/advantage.h"
#include "engine/loss.h"

enum { B = 2048, T = 1024, GROUP = 16, REPS = 3 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint32_t rng = 777;
static float uniform(float lo, float hi) {
    rng = rng * 1664525u + 1013904223u;
    return lo + (hi - lo) * (float)(rng >> 8) / 16777216.0f;
}

static void report(const char *what, double best) {
    printf("%-40s %8.2f ms  %6.2f ns/token\n", what, best * 1e3, best * 1e9 / ((double)B * T));
}

int main(void) {
    size_t n = (size_t)B * T;
    float *logp = malloc(n * sizeof(float)), *old = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
    float *adv = malloc(n * sizeof(float)), *ent = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float));
    float *ge = malloc(n * sizeof(float)), *val = malloc(n * sizeof(float)), *ret = malloc(n * sizeof(float));
    float *rewards = malloc(B * sizeof(float));
    int32_t *group = malloc(B * sizeof(int32_t));
    uint8_t *mask = malloc(n);
    if (!logp || !old || !ref || !adv || !ent || !g || !ge || !val || !ret || !rewards || !group || !mask) {
        fprintf(stderr, "bench_rl: out of memory\n");
        return 1;
    }
    for (int32_t b = 0; b < B; b++) {
        int32_t len = (int32_t)uniform(0.6f * T, (float)T);
        rewards[b] = uniform(0, 1) < 0.5f ? 1.0f : 0.0f;
        group[b] = b / GROUP;
        for (int32_t t = 0; t < T; t++) {
            size_t i = (size_t)b * T + t;
            mask[i] = t < len;
            old[i] = uniform(-4, -0.01f);
            logp[i] = old[i] + uniform(-0.3f, 0.3f);
            ref[i] = old[i] + uniform(-0.3f, 0.3f);
            ent[i] = uniform(0, 3);
            val[i] = uniform(-1, 1);
        }
    }
    tr_err err = {0};
    tr_adv_input in = {.B = B, .T = T, .seq_rewards = rewards, .group = group, .n_groups = B / GROUP,
                       .mask = mask, .values = val};
    const struct {
        const char *name;
        tr_adv_cfg cfg;
    } advs[] = {{"advantage grpo", {.kind = TR_ADV_GRPO, .norm_by_std = true, .eps = TR_ADV_GRPO_EPS}},
                {"advantage reinforce_pp", {.kind = TR_ADV_REINFORCE_PP, .gamma = 1.0f}},
                {"advantage gae (+ whitening)", {.kind = TR_ADV_GAE, .gamma = 1.0f, .lam = 0.95f}}};
    for (size_t c = 0; c < sizeof advs / sizeof advs[0]; c++) {
        double best = 1e30;
        for (int r = 0; r < REPS; r++) {
            double t0 = now_s();
            if (tr_adv_compute(&advs[c].cfg, &in, adv, ret, &err)) {
                fprintf(stderr, "bench_rl: %s\n", err.msg);
                return 1;
            }
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        report(advs[c].name, best);
    }
    tr_loss_norm norm;
    tr_loss_norm_from_mask(mask, B, T, T, &norm);
    for (int ratio = 0; ratio < 2; ratio++) {
        tr_policy_loss_cfg cfg = {.clip_low = 0.2f, .clip_high = 0.28f, .clip_dual = 3.0f,
                                  .ratio = (enum tr_ratio_mode)ratio, .agg = TR_AGG_TOKEN_MEAN,
                                  .kl_coef = 0.001f, .kl_est = TR_KL_K3, .entropy_coef = 0.001f};
        tr_policy_loss_in pin = {.B = B, .T = T, .mask = mask, .logp = logp, .old_logp = old, .adv = adv,
                                 .ref_logp = ref, .entropy = ent, .norm = &norm};
        tr_policy_loss_out out;
        double best = 1e30;
        for (int r = 0; r < REPS; r++) {
            double t0 = now_s();
            if (tr_policy_loss(&cfg, &pin, &out, g, ge, &err)) {
                fprintf(stderr, "bench_rl: %s\n", err.msg);
                return 1;
            }
            double dt = now_s() - t0;
            if (dt < best) best = dt;
        }
        report(ratio ? "policy loss, sequence ratio, k3, entropy" : "policy loss, token ratio, k3, entropy", best);
    }
    tr_value_loss_in vin = {.B = B, .T = T, .mask = mask, .values = val, .old_values = old, .returns = ret,
                            .norm = &norm};
    tr_value_loss_out vout;
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        if (tr_value_loss(0.2f, TR_AGG_TOKEN_MEAN, &vin, &vout, g, &err)) return 1;
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    report("value loss, clipped", best);
    free(logp), free(old), free(ref), free(adv), free(ent), free(g), free(ge), free(val), free(ret);
    free(rewards), free(group), free(mask);
    return 0;
}
