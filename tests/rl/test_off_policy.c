// Truncated importance weights (rl/off_policy.h) against hand-worked cases: two sequences
// whose response tokens have p_old / p_behaviour of 1, 1.5, 3 (truncated to the cap 2) and
// 0.5; the advantages are scaled by exactly those weights, prompt tokens are left alone, a
// ratio of 1 leaves an advantage's bits unchanged, and the statistics count what was cut.
// Rollout versions: -1 until set, carried by the copy dynamic sampling and the trainer's
// shares use.
#include <math.h>

#include "rl/off_policy.h"
#include "rl/rollout_select.h"
#include "tests/test.h"

static void test_tis(void) {
    tr_rollouts r;
    tr_rollouts_init(&r);
    tr_err err = {0};
    int32_t p[2] = {3, 4}, a[3] = {5, 6, 7};
    CHECK(tr_rollouts_append(&r, 0, 0, p, 2, a, NULL, 3, TR_FINISH_STOP, NULL, NULL, NULL, &err) == 0);
    CHECK(tr_rollouts_append(&r, 0, 1, p, 2, a, NULL, 1, TR_FINISH_LENGTH, NULL, NULL, NULL, &err) == 0);
    // Tokens: seq 0 = prompt 2 + response 3 (t 0..4), seq 1 = prompt 2 + response 1 (t 5..7).
    float old_lp[8] = {9, 9, -1.0f, -0.5f, -2.0f, 9, 9, -3.0f};
    float beh_lp[8] = {0, 0, -1.0f, -0.5f - (float)log(1.5), -2.0f - (float)log(3.0), 0, 0, -3.0f + (float)log(2.0)};
    float adv[8] = {7, 7, 0.25f, -1.0f, 2.0f, 7, 7, -4.0f};
    tr_tis_stats st;
    tr_tis_weight(&r, old_lp, beh_lp, 2.0, adv, &st);
    CHECK(adv[0] == 7 && adv[1] == 7 && adv[5] == 7 && adv[6] == 7);  // prompt tokens
    CHECK(adv[2] == 0.25f);                                           // ratio 1: the same bits
    CHECK_NEAR(adv[3], -1.5, 1e-6);
    CHECK_NEAR(adv[4], 4.0, 1e-6);                                    // 3 cut to the cap 2
    CHECK_NEAR(adv[7], -2.0, 1e-6);
    CHECK(st.tokens == 4);
    CHECK_NEAR(st.weight_mean, (1.0 + 1.5 + 2.0 + 0.5) / 4, 1e-6);
    CHECK_NEAR(st.clip_frac, 0.25, 1e-12);
    CHECK_NEAR(st.ratio_max, 3.0, 1e-6);
    tr_rollouts_free(&r);
}

static void test_versions(void) {
    tr_rollouts r, d;
    tr_rollouts_init(&r);
    tr_rollouts_init(&d);
    tr_err err = {0};
    int32_t p[1] = {3}, a[1] = {5};
    for (int i = 0; i < 3; i++)
        CHECK(tr_rollouts_append(&r, i, 0, p, 1, a, NULL, 1, TR_FINISH_STOP, NULL, NULL, NULL, &err) == 0);
    CHECK(r.version[0] == -1 && r.version[2] == -1);
    r.version[1] = 17;
    CHECK(tr_rollouts_copy_seq(&d, &r, 1, 0, &err) == 0 && tr_rollouts_copy_seq(&d, &r, 0, 1, &err) == 0);
    CHECK(d.n == 2 && d.version[0] == 17 && d.version[1] == -1);
    tr_rollouts_free(&r);
    tr_rollouts_free(&d);
}

int main(void) {
    test_tis();
    test_versions();
    return tr_test_summary("test_off_policy");
}
