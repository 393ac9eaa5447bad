// Advantages and losses against an independent float64 PyTorch implementation of the same
// published definitions, with gradients from autograd (tests/fixtures/rl/rl_reference.txt,
// made by tools/make_rl_fixtures.py): every aggregation, token and sequence ratios, the
// three KL estimators, dual clip, entropy, clipped and unclipped value loss, and the five
// advantage estimators on a batch with padding, an empty response and a group of one.
#include <stdint.h>

#include "engine/file.h"
#include "rl/advantage.h"
#include "engine/loss.h"
#include "tests/test.h"

enum { B = 6, T = 7, N = B * T, MAX_ARRAYS = 64 };

typedef struct named {
    char name[48];
    int n;
    double v[N];
} named;

static named inputs[MAX_ARRAYS];
static int n_inputs;

static const named *find(const char *name) {
    for (int i = 0; i < n_inputs; i++)
        if (!strcmp(inputs[i].name, name)) return &inputs[i];
    fprintf(stderr, "fixture lacks array %s\n", name);
    return NULL;
}

// Parses "array NAME COUNT v..." (after the first token was consumed) into a.
static int parse_array(char *save, named *a) {
    char *tok = strtok_r(NULL, " \n", &save);
    if (!tok) return -1;
    snprintf(a->name, sizeof a->name, "%s", tok);
    tok = strtok_r(NULL, " \n", &save);
    if (!tok) return -1;
    a->n = atoi(tok);
    if (a->n < 0 || a->n > N) return -1;
    for (int i = 0; i < a->n; i++) {
        tok = strtok_r(NULL, " \n", &save);
        if (!tok) return -1;
        a->v[i] = strtod(tok, NULL);
    }
    return 0;
}

static void to_float(const named *a, float *out) {
    for (int i = 0; i < a->n; i++) out[i] = (float)a->v[i];
}

// max |got - want| relative to max(max |want|, floor).
static double rel_err(const float *got, const double *want, int n, double floor) {
    double num = 0, den = floor;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d != d) return INFINITY;
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / den;
}

static float f_mask[N], f_logp[N], f_old[N], f_ref[N], f_adv[N], f_ent[N], f_val[N], f_oldv[N], f_ret[N];
static uint8_t mask[N];

static void check_advantages(void) {
    float seq_r[B], tok_r[N], adv[N], ret[N];
    int32_t group[B];
    const named *g = find("group"), *sr = find("seq_rewards"), *tr = find("token_rewards");
    if (!g || !sr || !tr) {
        CHECK(0);
        return;
    }
    for (int b = 0; b < B; b++) group[b] = (int32_t)g->v[b];
    to_float(sr, seq_r);
    to_float(tr, tok_r);
    tr_adv_input in = {.B = B, .T = T, .seq_rewards = seq_r, .group = group, .n_groups = 3, .mask = mask,
                       .values = f_val, .token_rewards = tok_r};
    struct {
        const char *name;
        tr_adv_cfg cfg;
    } cases[] = {
        {"adv_grpo", {.kind = TR_ADV_GRPO, .norm_by_std = true, .eps = TR_ADV_GRPO_EPS}},
        {"adv_drgrpo", {.kind = TR_ADV_GRPO, .norm_by_std = false, .eps = TR_ADV_GRPO_EPS}},
        {"adv_rloo", {.kind = TR_ADV_RLOO}},
        {"adv_reinforce_pp_baseline", {.kind = TR_ADV_REINFORCE_PP_BASELINE, .gamma = 0.99f}},
        {"adv_reinforce_pp", {.kind = TR_ADV_REINFORCE_PP, .gamma = 0.99f}},
        {"adv_gae", {.kind = TR_ADV_GAE, .gamma = 0.99f, .lam = 0.95f}},
    };
    tr_err err = {0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const named *want = find(cases[c].name);
        CHECK(want && want->n == N);
        if (!want) continue;
        int rc = tr_adv_compute(&cases[c].cfg, &in, adv, ret, &err);
        CHECKF(rc == 0, "%s: %s", cases[c].name, err.msg);
        double e = rel_err(adv, want->v, N, 1.0);
        CHECKF(e < 1e-6, "%s: relative error %g", cases[c].name, e);
        if (cases[c].cfg.kind == TR_ADV_GAE) {
            const named *wr = find("returns_gae");
            if (wr) {
                e = rel_err(ret, wr->v, N, 1.0);
                CHECKF(e < 1e-6, "returns_gae: relative error %g", e);
            }
        }
    }
}

int main(void) {
    char *text;
    size_t len;
    tr_err err = {0};
    int rc = tr_file_read(tr_test_src("tests/fixtures/rl/rl_reference.txt"), &text, &len, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return tr_test_summary("test_rl_reference");

    // "array" lines before the first case are inputs; each case line is followed by its
    // expected gradients.
    int n_policy = 0, n_value = 0;
    bool inputs_done = false;
    char *line_save = NULL;
    named *grad_a = malloc(sizeof *grad_a), *grad_b = malloc(sizeof *grad_b);
    if (!grad_a || !grad_b) return 1;
    char *pending = NULL;  // the case line whose arrays are being read
    int pending_arrays = 0;
    char case_line[512] = "";
    for (char *line = strtok_r(text, "\n", &line_save); line; line = strtok_r(NULL, "\n", &line_save)) {
        if (line[0] == '#') continue;
        char *save;
        char *kind = strtok_r(line, " ", &save);
        if (!kind) continue;
        if (!strcmp(kind, "array")) {
            if (!inputs_done) {
                CHECK(n_inputs < MAX_ARRAYS);
                if (n_inputs >= MAX_ARRAYS || parse_array(save, &inputs[n_inputs])) {
                    CHECK(0);
                    break;
                }
                n_inputs++;
                continue;
            }
            named *dst = pending_arrays == 0 ? grad_a : grad_b;
            CHECK(parse_array(save, dst) == 0);
            pending_arrays++;
        } else {
            if (!inputs_done) {
                inputs_done = true;
                const named *m = find("mask"), *lp = find("logp"), *old = find("old_logp"), *ref = find("ref_logp");
                const named *adv = find("adv"), *ent = find("entropy"), *val = find("values");
                const named *oldv = find("old_values"), *ret = find("returns");
                if (!m || !lp || !old || !ref || !adv || !ent || !val || !oldv || !ret) {
                    CHECK(0);
                    break;
                }
                to_float(m, f_mask);
                for (int i = 0; i < N; i++) mask[i] = f_mask[i] != 0.0f;
                to_float(lp, f_logp);
                to_float(old, f_old);
                to_float(ref, f_ref);
                to_float(adv, f_adv);
                to_float(ent, f_ent);
                to_float(val, f_val);
                to_float(oldv, f_oldv);
                to_float(ret, f_ret);
                check_advantages();
            }
            snprintf(case_line, sizeof case_line, "%s %s", kind, save);
            pending = case_line;
            pending_arrays = 0;
        }
        // A case is complete once its arrays are read: policy has two, value one.
        if (pending && !strncmp(pending, "policy", 6) && pending_arrays == 2) {
            int agg, ratio, est;
            double kl_coef, ent_coef, low, high, dual, max_len, want;
            CHECK(sscanf(pending, "policy %d %d %d %lf %lf %lf %lf %lf %lf %lf", &agg, &ratio, &est, &kl_coef,
                         &ent_coef, &low, &high, &dual, &max_len, &want) == 10);
            tr_policy_loss_cfg cfg = {.clip_low = (float)low, .clip_high = (float)high, .clip_dual = (float)dual,
                                      .ratio = (enum tr_ratio_mode)ratio, .agg = (enum tr_loss_agg)agg,
                                      .kl_coef = (float)kl_coef, .kl_est = (enum tr_kl_est)est,
                                      .entropy_coef = (float)ent_coef};
            tr_loss_norm norm;
            tr_loss_norm_from_mask(mask, B, T, max_len, &norm);
            tr_policy_loss_in in = {.B = B, .T = T, .mask = mask, .logp = f_logp, .old_logp = f_old, .adv = f_adv,
                                    .ref_logp = f_ref, .entropy = f_ent, .norm = &norm};
            tr_policy_loss_out out;
            float gl[N], ge[N];
            CHECK(tr_policy_loss(&cfg, &in, &out, gl, ge, &err) == 0);
            double e_loss = fabs(out.loss - want) / fmax(fabs(want), 1e-3);
            double e_gl = rel_err(gl, grad_a->v, N, 1e-3), e_ge = rel_err(ge, grad_b->v, N, 1e-3);
            CHECKF(e_loss < 5e-7 && e_gl < 5e-7 && e_ge < 5e-7, "%s: loss %.9g vs %.9g (rel %g), grad_logp rel %g, "
                   "grad_entropy rel %g", pending, out.loss, want, e_loss, e_gl, e_ge);
            n_policy++;
            pending = NULL;
        } else if (pending && !strncmp(pending, "value", 5) && pending_arrays == 1) {
            int agg;
            double clip, want;
            CHECK(sscanf(pending, "value %d %lf %lf", &agg, &clip, &want) == 3);
            tr_loss_norm norm;
            tr_loss_norm_from_mask(mask, B, T, 8.0, &norm);
            tr_value_loss_in in = {.B = B, .T = T, .mask = mask, .values = f_val, .old_values = f_oldv,
                                   .returns = f_ret, .norm = &norm};
            tr_value_loss_out out;
            float gv[N];
            CHECK(tr_value_loss((float)clip, (enum tr_loss_agg)agg, &in, &out, gv, &err) == 0);
            double e_loss = fabs(out.loss - want) / fmax(fabs(want), 1e-3), e_gv = rel_err(gv, grad_a->v, N, 1e-3);
            CHECKF(e_loss < 5e-7 && e_gv < 5e-7, "%s: loss %.9g vs %.9g, grad rel %g", pending, out.loss, want, e_gv);
            n_value++;
            pending = NULL;
        }
    }
    CHECKF(n_policy == 56 && n_value == 8, "read %d policy and %d value cases", n_policy, n_value);
    free(grad_a);
    free(grad_b);
    free(text);
    return tr_test_summary("test_rl_reference");
}
