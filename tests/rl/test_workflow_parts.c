// The workflow pieces that need no workers, against hand-worked cases: the eval and
// checkpoint schedules, dynamic sampling's filter and refill (DAPO: groups whose rewards are
// all equal are dropped, more prompts are drawn until the batch is full), step checkpoint
// directories (complete or absent, never half), the prompt loader's epochs, reward shaping's
// padded layout, and the SFT/pretrain row conversions through the public workflow helpers.
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/file.h"
#include "rl/advantage_shaping.h"
#include "rl/prompt_loader.h"
#include "rl/rollout_select.h"
#include "rl/run_ckpt.h"
#include "rl/workflow.h"
#include "rl/workflow_rl.h"
#include "tests/test.h"

static void test_schedules(void) {
    // eval_every 0: only before the first step and after the last.
    int n = 0;
    for (int64_t s = 0; s <= 25; s++) n += tr_run_eval_due(s, 25, 0);
    CHECK(n == 2 && tr_run_eval_due(0, 25, 0) && tr_run_eval_due(25, 25, 0));
    // eval_every 10 over 25 steps: 0, 10, 20, 25.
    int64_t want[] = {0, 10, 20, 25}, got[8];
    n = 0;
    for (int64_t s = 0; s <= 25; s++)
        if (tr_run_eval_due(s, 25, 10) && n < 8) got[n++] = s;
    CHECK(n == 4);
    for (int i = 0; i < 4 && i < n; i++) CHECK(got[i] == want[i]);
    // ... and 0, 5, 10 over 10 steps with every 5 (the last one is not repeated).
    n = 0;
    for (int64_t s = 0; s <= 10; s++) n += tr_run_eval_due(s, 10, 5);
    CHECK(n == 3);
    // Checkpoints: never at step 0; every save_every and at the end; 0 = only the end.
    CHECK(!tr_run_save_due(0, 10, 5) && tr_run_save_due(5, 10, 5) && tr_run_save_due(10, 10, 5));
    CHECK(!tr_run_save_due(3, 10, 5) && tr_run_save_due(7, 7, 5));
    n = 0;
    for (int64_t s = 0; s <= 10; s++) n += tr_run_save_due(s, 10, 0);
    CHECK(n == 1 && tr_run_save_due(10, 10, 0));
}

// A generation round of `groups` prompts x 4 samples; rewards[g*4 + j].
static void make_round(tr_rollouts *r, int32_t groups, int32_t base_token) {
    tr_err err = {0};
    tr_rollouts_clear(r);
    for (int32_t g = 0; g < groups; g++)
        for (int32_t j = 0; j < 4; j++) {
            int32_t prompt[2] = {base_token + g, 7};
            int32_t resp[3] = {100 + j, 101, 102};
            float lp[3] = {-0.5f, -0.25f, -0.125f};
            char text[32];
            snprintf(text, sizeof text, "g%d s%d", base_token + g, j);
            CHECK(tr_rollouts_append(r, g, j, prompt, 2, resp, lp, 1 + j % 3,
                                     j == 3 ? TR_FINISH_LENGTH : TR_FINISH_STOP, "p", text,
                                     "{\"answer\": \"1\"}", &err) == 0);
        }
}

static void test_dynamic_sampling(void) {
    tr_err err = {0};
    tr_rollouts gen, batch;
    tr_rollouts_init(&gen);
    tr_rollouts_init(&batch);
    float reward[16], score[16], b_reward[12], b_score[12];
    uint8_t keep[16];
    int32_t kept, n_groups = 0;

    // Round 1: 4 groups; groups 0 and 2 all scored the same (no signal), 1 and 3 differ.
    make_round(&gen, 4, 10);
    float r1[16] = {1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0.5f, 0.5f, 0.5f, 1};
    for (int i = 0; i < 16; i++) {
        reward[i] = r1[i];
        score[i] = 10 + i;
    }
    CHECK(tr_dynamic_sampling_filter(reward, gen.group, gen.n, 4, keep, &kept, &err) == 0);
    CHECK(kept == 2);
    for (int i = 0; i < 16; i++) CHECK(keep[i] == (i / 4 == 1 || i / 4 == 3));
    CHECK(tr_rollouts_take_groups(&batch, &n_groups, 3, b_reward, b_score, &gen, reward, score,
                                  keep, &err) == 0);
    CHECK(n_groups == 2 && batch.n == 8);
    // Round 2: the batch needs one more group; of the two informative groups only the first
    // fits, the second is left out.
    make_round(&gen, 4, 20);
    float r2[16] = {0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 16; i++) {
        reward[i] = r2[i];
        score[i] = 20 + i;
    }
    CHECK(tr_dynamic_sampling_filter(reward, gen.group, gen.n, 4, keep, &kept, &err) == 0);
    CHECK(kept == 2);
    CHECK(tr_rollouts_take_groups(&batch, &n_groups, 3, b_reward, b_score, &gen, reward, score,
                                  keep, &err) == 0);
    CHECK(n_groups == 3 && batch.n == 12);
    // Batch: round-1 groups 1, 3 then round-2 group 1, renumbered 0, 1, 2, samples in order.
    int32_t src_prompt[3] = {11, 13, 21};
    float src_score[3] = {14, 22, 24};
    for (int32_t i = 0; i < batch.n; i++) {
        int32_t g = i / 4, j = i % 4;
        CHECK(batch.group[i] == g && batch.sample[i] == j);
        CHECK(batch.tokens[batch.offset[i]] == src_prompt[g]);
        CHECK(batch.response_len[i] == 1 + j % 3 && batch.prompt_len[i] == 2);
        CHECK(batch.finish[i] == (j == 3 ? TR_FINISH_LENGTH : TR_FINISH_STOP));
        CHECK(b_score[i] == src_score[g] + (float)j);
        CHECK(batch.gen_logprobs[batch.offset[i] + 2] == -0.5f);
        char text[32];
        snprintf(text, sizeof text, "g%d s%d", src_prompt[g], j);
        CHECK(batch.response_text[i] && strcmp(batch.response_text[i], text) == 0);
        CHECK(strcmp(batch.meta[i], "{\"answer\": \"1\"}") == 0);
    }
    CHECK_NEAR(b_reward[4], 0.5, 0);   // round-1 group 3, sample 0
    CHECK_NEAR(b_reward[8], 1.0, 0);   // round-2 group 1 = r2[4..8): 1 0 0 0
    CHECK_NEAR(b_reward[9], 0.0, 0);
    // A full batch takes nothing more.
    CHECK(tr_rollouts_take_groups(&batch, &n_groups, 3, b_reward, b_score, &gen, reward, score,
                                  keep, &err) == 0);
    CHECK(n_groups == 3 && batch.n == 12);
    tr_rollouts_free(&gen);
    tr_rollouts_free(&batch);
}

static void test_padded_layout(void) {
    tr_err err = {0};
    tr_rollouts r;
    tr_rollouts_init(&r);
    int32_t p[3] = {1, 2, 3}, a[2] = {4, 5}, b[4] = {6, 7, 8, 9};
    CHECK(tr_rollouts_append(&r, 0, 0, p, 3, a, NULL, 2, TR_FINISH_STOP, NULL, NULL, NULL, &err) == 0);
    CHECK(tr_rollouts_append(&r, 0, 1, p, 1, b, NULL, 4, TR_FINISH_STOP, NULL, NULL, NULL, &err) == 0);
    // tokens: [1 2 3 4 5 | 1 6 7 8 9]; per-token x = 10 * position.
    float x[10], pad[8], back[10];
    for (int i = 0; i < 10; i++) x[i] = 10.0f * i;
    uint8_t mask[8];
    tr_rl_mask(&r, 4, mask);
    uint8_t want_mask[8] = {1, 1, 0, 0, 1, 1, 1, 1};
    CHECK(memcmp(mask, want_mask, 8) == 0);
    tr_rl_to_padded(&r, 4, x, pad);
    float want_pad[8] = {30, 40, 0, 0, 60, 70, 80, 90};
    CHECK(memcmp(pad, want_pad, sizeof pad) == 0);
    tr_rl_from_padded(&r, 4, pad, back);
    float want_back[10] = {0, 0, 0, 30, 40, 0, 60, 70, 80, 90};
    CHECK(memcmp(back, want_back, sizeof back) == 0);
    CHECK_NEAR(tr_rl_response_mean(&r, x), (30 + 40 + 60 + 70 + 80 + 90) / 6.0, 1e-9);
    float y[10];
    memcpy(y, x, sizeof y);
    y[0] = 1000;   // prompt tokens do not count
    y[8] = 80.5f;
    CHECK_NEAR(tr_rl_max_abs_diff(&r, x, y), 0.5, 0);
    tr_rollouts_free(&r);
}

static void test_reward_shaping(void) {
    tr_err err = {0};
    tr_recipe *recipe = malloc(sizeof *recipe);
    CHECK(recipe && tr_recipe_defaults(recipe, &err) == 0);
    recipe->reward.kind = TR_RECIPE_REWARD_RULE;
    recipe->reward.function = TR_RECIPE_FN_NUMERIC_MATCH;
    recipe->reward.curve = (tr_recipe_curve){.correct = 1.0, .wrong = -0.5, .missing = -1.0,
                                             .scale = 2.0, .shift = -1.0};
    recipe->rollout.max_new_tokens = 10;
    recipe->rollout.overlong_buffer = 0;
    CHECK_NEAR(tr_rl_shape_reward(recipe, 1.0f, "so 41", 3), 1.0, 0);
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, "so 41", 3), -0.5, 0);     // an answer, wrong
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, "no idea", 3), -1.0, 0);   // no number at all
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, NULL, 0), -1.0, 0);
    recipe->reward.function = TR_RECIPE_FN_EXACT_MATCH;
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, " \n\t", 3), -1.0, 0);
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, "x", 1), -0.5, 0);
    recipe->reward.function = TR_RECIPE_FN_REGEX;                            // no match: missing
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.0f, "x", 1), -1.0, 0);
    // DAPO soft overlong punishment: zone of 4 before 10 tokens, full penalty 1.
    recipe->reward.function = TR_RECIPE_FN_NUMERIC_MATCH;
    recipe->rollout.overlong_buffer = 4;
    recipe->rollout.overlong_penalty = 1.0;
    CHECK_NEAR(tr_rl_shape_reward(recipe, 1.0f, "1", 6), 1.0, 1e-9);
    CHECK_NEAR(tr_rl_shape_reward(recipe, 1.0f, "1", 8), 1.0 - 0.5, 1e-6);
    CHECK_NEAR(tr_rl_shape_reward(recipe, 1.0f, "1", 10), 0.0, 1e-6);
    // Reward models and services: scale * score + shift.
    recipe->reward.kind = TR_RECIPE_REWARD_MODEL;
    recipe->rollout.overlong_buffer = 0;
    CHECK_NEAR(tr_rl_shape_reward(recipe, 0.25f, NULL, 3), -0.5, 1e-9);
    free(recipe);
}

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static void test_checkpoint_dirs(void) {
    tr_err err = {0};
    const char *run = tr_test_tmpdir();
    tr_run_state st;
    CHECK(tr_run_ckpt_find_last(run, &st, &err) == 0 && st.step == -1);
    char tmp[4096], path[4300];
    // A complete step 2 and step 10 (numeric, not lexical, order), then a half-written 12.
    int64_t steps[2] = {2, 10};
    for (int i = 0; i < 2; i++) {
        CHECK(tr_run_ckpt_begin(run, steps[i], tmp, sizeof tmp, &err) == 0);
        snprintf(path, sizeof path, "%s/policy", tmp);
        CHECK(tr_mkdirs(path, &err) == 0);
        snprintf(path, sizeof path, "%s/policy/config.json", tmp);
        CHECK(tr_file_write_atomic(path, "{}", 2, &err) == 0);
        tr_run_state s = {steps[i], 100 * steps[i], "grpo"};
        CHECK(tr_run_ckpt_commit(run, tmp, &s, &err) == 0);
        CHECK(!is_dir(tmp));
    }
    CHECK(tr_run_ckpt_begin(run, 12, tmp, sizeof tmp, &err) == 0);
    snprintf(path, sizeof path, "%s/checkpoints/step_9x", run);  // not a step name
    CHECK(tr_mkdirs(path, &err) == 0);
    CHECK(tr_run_ckpt_find_last(run, &st, &err) == 0);
    CHECK(st.step == 10 && st.data_cursor == 1000 && strcmp(st.workflow, "grpo") == 0);
    snprintf(path, sizeof path, "%s/checkpoints/step_10/policy/config.json", run);
    CHECK(tr_file_exists(path));
    // The interrupted save is cleaned away; complete steps stay.
    CHECK(tr_run_ckpt_clean(run, &err) == 0);
    CHECK(!is_dir(tmp));
    snprintf(path, sizeof path, "%s/checkpoints/step_2", run);
    CHECK(is_dir(path));
    // Re-saving a step replaces it whole.
    CHECK(tr_run_ckpt_begin(run, 10, tmp, sizeof tmp, &err) == 0);
    tr_run_state s = {10, 777, "grpo"};
    CHECK(tr_run_ckpt_commit(run, tmp, &s, &err) == 0);
    CHECK(tr_run_ckpt_find_last(run, &st, &err) == 0 && st.data_cursor == 777);
    snprintf(path, sizeof path, "%s/checkpoints/step_10/policy", run);
    CHECK(!is_dir(path));
    // A damaged state file is an error naming it, not a silent fallback.
    snprintf(path, sizeof path, "%s/checkpoints/step_10/run_state.json", run);
    CHECK(tr_file_write_atomic(path, "{\"step\": 3}", 11, &err) == 0);
    CHECK(tr_run_ckpt_find_last(run, &st, &err) == -1 && strstr(err.msg, "step_10") != NULL);
}

static void test_prompt_loader(void) {
    tr_err err = {0};
    const char *dir = tr_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    // 6 prompts; "one two three four five six seven" is too long for max_prompt_len 5.
    const char *lines =
        "{\"prompt\": \"a\", \"answer\": \"0\"}\n{\"prompt\": \"b c\"}\n"
        "{\"prompt\": \"one two three four five six seven\"}\n{\"prompt\": \"d\"}\n"
        "{\"prompt\": \"e\"}\n{\"prompt\": \"f\"}\n";
    CHECK(tr_file_write_atomic(path, lines, strlen(lines), &err) == 0);
    tr_tokenizer *tok;
    if (tr_tokenizer_load(&tok, tr_test_src("tests/fixtures/tokenizer/qwen2.json"), &err)) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    tr_prompt_loader l;
    CHECK(tr_prompt_loader_init(&l, path, NULL, tok, 5, true, 42, &err) == 0);
    CHECK(l.n == 5 && l.n_skipped == 1);
    // Every epoch serves each usable prompt once; epochs differ in order; draws repeat.
    int64_t first[5];
    int differs = 0;
    for (int64_t e = 0; e < 4; e++) {
        int seen[5] = {0};
        for (int64_t j = 0; j < 5; j++) {
            int64_t i = tr_prompt_loader_index(&l, e * 5 + j);
            CHECK(i >= 0 && i < 5);
            if (i >= 0 && i < 5) seen[i]++;
            if (e == 0) first[j] = i;
            else differs += first[j] != i;
        }
        for (int i = 0; i < 5; i++) CHECK(seen[i] == 1);
    }
    CHECK(differs > 0);
    int64_t again = tr_prompt_loader_index(&l, 7);
    tr_prompt_loader_index(&l, 0);
    CHECK(tr_prompt_loader_index(&l, 7) == again);
    // A draw across the epoch boundary: texts, meta and ids of the prompts served.
    tr_prompt_draw d = {0};
    CHECK(tr_prompt_loader_draw(&l, 3, 4, &d, &err) == 0);
    CHECK(d.batch.n == 4 && d.batch.offset[0] == 0);
    for (int32_t i = 0; i < 4; i++) {
        int64_t p = tr_prompt_loader_index(&l, 3 + i);
        const tr_prompt *pr = &l.set.items[l.item[p]];
        CHECK(d.batch.group[i] == i && d.batch.text[i] == pr->text);
        int32_t *ids;
        size_t n;
        CHECK(tr_tokenizer_encode(tok, pr->text, strlen(pr->text), &ids, &n, &err) == 0);
        CHECK(d.batch.offset[i + 1] - d.batch.offset[i] == (int64_t)n);
        CHECK(memcmp(d.batch.ids + d.batch.offset[i], ids, n * sizeof(int32_t)) == 0);
        free(ids);
        if (strcmp(pr->text, "a") == 0) CHECK(strcmp(d.batch.meta[i], "{\"answer\": \"0\"}") == 0);
    }
    tr_prompt_draw_free(&d);
    tr_prompt_loader_free(&l);
    // Nothing usable is an error naming the file.
    const char *long_lines = "{\"prompt\": \"b c\"}\n{\"prompt\": \"one two\"}\n";
    CHECK(tr_file_write_atomic(path, long_lines, strlen(long_lines), &err) == 0);
    CHECK(tr_prompt_loader_init(&l, path, NULL, tok, 1, true, 1, &err) == -1);
    CHECK(strstr(err.msg, "p.jsonl") != NULL && strstr(err.msg, "max_prompt_len") != NULL);
    tr_tokenizer_free(tok);
}

int main(void) {
    test_schedules();
    test_dynamic_sampling();
    test_padded_layout();
    test_reward_shaping();
    test_checkpoint_dirs();
    test_prompt_loader();
    return tr_test_summary("test_workflow_parts");
}
