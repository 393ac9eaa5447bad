// The memory plan (engine/plan.c) against its rules, with explicit budgets so that the
// numbers do not depend on the machine:
//  - the fixed parts are the layout's bytes (fp32 masters, gradients, two Adam moments) and
//    the arena is tr_model_arena_bytes for the plan's logit rows;
//  - the LM head's chunk widens to an eighth of the memory left after the fixed parts and
//    one micro-batch's activations (a row's price is the difference of two arena sizes),
//    up to max_tokens, never below the model's default; a given chunk, a tensor-parallel
//    rank and a model without an LM head keep theirs;
//  - a budget that cannot hold the fixed parts is an error naming them; the KV cache of a
//    generating role is whole blocks and the total stays within the budget;
//  - left to the plan, the tokens per forward are the wanted tokens (at most
//    TR_PLAN_MAX_TOKENS), halved down to the minimum while the activations take more than
//    half of what the fixed parts leave, first without recompute and then with it.
#include <stdio.h>
#include <string.h>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/params.h"
#include "engine/plan.h"
#include "tests/backend_test.h"
#include "tests/test.h"

// A large vocabulary, so that the default chunk (32 MiB of fp32 logits: 83 rows) is well
// below the micro-batch.
static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 100000,"
    " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";

#define T_MAX 1024

static size_t arena_for(tr_backend *be, const tr_model_config *cfg, int32_t rows, bool training) {
    tr_model_opts mo = {.max_tokens = T_MAX, .training = training, .logit_rows = rows};
    return tr_model_arena_bytes(cfg, &mo, be->act);
}

// What the rule gives for a budget, computed here from the arena formula.
static int32_t expected_rows(tr_backend *be, const tr_model_config *cfg, const tr_plan *p,
                             int32_t def) {
    size_t usable = p->budget - p->reserve;
    size_t fixed = p->weights + p->grads + p->optim;
    size_t spare = usable - fixed - arena_for(be, cfg, def, true);
    size_t row = arena_for(be, cfg, 2, true) - arena_for(be, cfg, 1, true);
    size_t fit = spare / 8 / row;
    if (fit <= (size_t)def) return def;
    return fit < T_MAX ? (int32_t)fit : T_MAX;
}

static void check_widening(tr_backend *be, const tr_model_config *cfg) {
    tr_model_opts dmo = {.max_tokens = T_MAX, .training = true};
    const int32_t def = tr_model_logit_rows(cfg, &dmo);
    CHECKF(def == 83, "default rows %d (32 MiB / 4 / 100000)", def);
    const size_t train_def = arena_for(be, cfg, def, true);
    tr_param_layout lay;
    tr_err err = {0};
    CHECK(tr_param_layout_init(&lay, cfg, &err) == 0);
    const size_t pbytes = lay.total * sizeof(float);
    tr_param_layout_free(&lay);
    // Budgets of the fixed parts, one micro-batch's activations and the backend's reserve
    // (256 MiB between 1 and 8 GiB), plus a spare: room for every row, for some, for none.
    const size_t base = 4 * pbytes + train_def + ((size_t)256 << 20);
    const size_t budgets[3] = {(size_t)64 << 30, base + ((size_t)2 << 30), base + ((size_t)100 << 20)};
    tr_plan p[3];
    for (int i = 0; i < 3; i++) {
        tr_plan_req req = {.cfg = cfg, .max_tokens = T_MAX, .training = true, .budget = budgets[i]};
        CHECKF(tr_plan_make(be, &req, &p[i], &err) == 0, "budget %zu: %s", budgets[i], err.msg);
        CHECK(p[i].masters == pbytes && p[i].grads == pbytes && p[i].optim == 2 * pbytes);
        int32_t want = expected_rows(be, cfg, &p[i], def);
        CHECKF(p[i].logit_rows == want, "budget %.0f MiB: %d logit rows, the rule gives %d",
               (double)budgets[i] / (1 << 20), p[i].logit_rows, want);
        CHECKF(p[i].arena_train == arena_for(be, cfg, p[i].logit_rows, true),
               "the arena is sized for the plan's rows");
        CHECK(p[i].total <= p[i].budget - p[i].reserve);
        printf("  budget %8.1f MiB: LM head %4d rows a chunk (arena %.1f MiB)\n",
               (double)budgets[i] / (1 << 20), p[i].logit_rows, (double)p[i].arena / (1 << 20));
    }
    CHECKF(p[0].logit_rows == T_MAX, "every row: %d", p[0].logit_rows);
    CHECKF(p[1].logit_rows > def && p[1].logit_rows < T_MAX, "some rows: %d", p[1].logit_rows);
    CHECKF(p[2].logit_rows == def, "the default: %d", p[2].logit_rows);
}

static void check_kept(tr_backend *be, const tr_model_config *cfg) {
    tr_err err = {0};
    tr_plan p;
    tr_plan_req req = {.cfg = cfg, .max_tokens = T_MAX, .training = true,
                       .budget = (size_t)64 << 30, .logit_rows = 100};
    CHECK(tr_plan_make(be, &req, &p, &err) == 0 && p.logit_rows == 100);
    CHECK(p.arena_train == arena_for(be, cfg, 100, true));
    // Tensor-parallel ranks keep the default: each plans from its own device's room.
    req.logit_rows = 0;
    req.tp_size = 2;
    req.tp_rank = 1;
    tr_model_opts rank = {.max_tokens = T_MAX, .training = true, .tp_size = 2, .tp_rank = 1};
    int32_t def = tr_model_logit_rows(cfg, &rank);   // the rank's half of the vocabulary
    CHECKF(tr_plan_make(be, &req, &p, &err) == 0 && p.logit_rows == def && def == 167,
           "%s (rows %d, default %d)", err.msg, p.logit_rows, def);
}

static void check_errors_and_kv(tr_backend *be, const tr_model_config *cfg) {
    tr_err err = {0};
    tr_plan p;
    tr_plan_req req = {.cfg = cfg, .max_tokens = T_MAX, .training = true, .budget = 1 << 20};
    CHECK(tr_plan_make(be, &req, &p, &err) != 0 && err.code == TR_ENOMEM);
    CHECKF(strstr(err.msg, "weights") && strstr(err.msg, "optimizer"), "%s", err.msg);
    // A generating role: whole KV blocks in what is left, within the budget.
    req = (tr_plan_req){.cfg = cfg, .max_tokens = T_MAX, .generate = true, .block_size = 16,
                        .kv_want = 1 << 20, .budget = (size_t)512 << 20};
    CHECKF(tr_plan_make(be, &req, &p, &err) == 0, "%s", err.msg);
    CHECK(p.kv_tokens > 0 && p.kv_tokens % 16 == 0 && p.kv_tokens < (1 << 20));
    CHECK(p.total <= p.budget - p.reserve);
    CHECK(p.logit_rows >= 83 && p.logit_rows <= T_MAX);
}

// Eight layers and a small vocabulary: the layer sets dominate the training arena, so that
// recompute more than halves it.
static const char DEEP[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 1000,"
    " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 4096,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";

static size_t train_arena(tr_backend *be, const tr_model_config *cfg, int32_t T, bool recompute) {
    tr_model_opts mo = {.max_tokens = T, .training = true, .recompute = recompute};
    return tr_model_arena_bytes(cfg, &mo, be->act);
}

// The rule of tr_plan.max_tokens, from the plan's budget, reserve and fixed parts (recompute
// allowed).
static void expected_tokens(tr_backend *be, const tr_model_config *cfg, const tr_plan *p, int32_t lo,
                            int32_t want, int32_t *tokens, bool *recompute) {
    size_t room = (p->budget - p->reserve - (p->weights + p->grads + p->optim)) / 2;
    int32_t hi = want < TR_PLAN_MAX_TOKENS ? want : TR_PLAN_MAX_TOKENS;
    for (int with = 0; with < 2; with++)
        for (int32_t t = hi;; t = t / 2 > lo ? t / 2 : lo) {
            if (train_arena(be, cfg, t, with) <= room) {
                *tokens = t;
                *recompute = with;
                return;
            }
            if (t == lo) break;
        }
    // Nothing within half: the least, which may take the rest too.
    *tokens = lo;
    *recompute = true;
}

static void check_tokens(tr_backend *be) {
    tr_model_config cfg;
    tr_err err = {0};
    CHECK(tr_config_parse(DEEP, sizeof DEEP - 1, "deep", &cfg, &err) == 0);
    const int32_t lo = 300, want = 40000;
    CHECKF(train_arena(be, &cfg, lo, true) * 2 < train_arena(be, &cfg, lo, false), "%zu vs %zu",
           train_arena(be, &cfg, lo, true), train_arena(be, &cfg, lo, false));
    bool seen_full = false, seen_halved = false, seen_recompute = false, seen_error = false;
    for (size_t budget = (size_t)4 << 20; budget <= ((size_t)4 << 30); budget += budget / 8) {
        tr_plan_req req = {.cfg = &cfg, .min_tokens = lo, .max_tokens_want = want, .training = true,
                           .budget = budget};
        tr_plan p;
        int rc = tr_plan_make(be, &req, &p, &err);
        if (rc != 0) {
            CHECKF(err.code == TR_ENOMEM && strstr(err.msg, "with recompute"), "%s", err.msg);
            seen_error = true;
            continue;
        }
        int32_t t;
        bool rec;
        expected_tokens(be, &cfg, &p, lo, want, &t, &rec);
        CHECKF(p.max_tokens == t && p.recompute == rec, "budget %zu: %d tokens%s, the rule gives %d%s", budget,
               p.max_tokens, p.recompute ? " recomputed" : "", t, rec ? " recomputed" : "");
        CHECK(p.arena_train == train_arena(be, &cfg, p.max_tokens, p.recompute) || p.logit_rows > 0);
        seen_full |= t == TR_PLAN_MAX_TOKENS && !rec;
        seen_halved |= t < TR_PLAN_MAX_TOKENS && t > lo && !rec;
        seen_recompute |= rec;
    }
    CHECK(seen_full && seen_halved && seen_recompute && seen_error);
    // Given tokens are kept; recompute off refuses what only recompute fits, on forces it.
    tr_plan p;
    tr_plan_req req = {.cfg = &cfg, .max_tokens = 4096, .training = true, .budget = (size_t)4 << 30};
    CHECK(tr_plan_make(be, &req, &p, &err) == 0 && p.max_tokens == 4096 && !p.recompute);
    req.recompute = TR_RECOMPUTE_ON;
    CHECK(tr_plan_make(be, &req, &p, &err) == 0 && p.max_tokens == 4096 && p.recompute);
    CHECK(p.arena_train < train_arena(be, &cfg, 4096, false));
    // A budget where 4096 tokens fit only with recompute.
    tr_plan probe;
    req.recompute = TR_RECOMPUTE_OFF;
    req.budget = (size_t)1 << 40;
    CHECK(tr_plan_make(be, &req, &probe, &err) == 0);
    size_t fixed = probe.weights + probe.grads + probe.optim;
    size_t mid = (train_arena(be, &cfg, 4096, true) + train_arena(be, &cfg, 4096, false)) / 2;
    req.budget = (fixed + mid) * 4 / 3;   // the reserve is a quarter at most
    CHECKF(tr_plan_make(be, &req, &p, &err) != 0 && err.code == TR_ENOMEM, "off: %s", err.msg);
    req.recompute = TR_RECOMPUTE_AUTO;
    CHECKF(tr_plan_make(be, &req, &p, &err) == 0 && p.recompute, "auto: %s", err.msg);
    printf("  tokens: the plan's choice matches the rule from 4 MiB to 4 GiB\n");
}

int main(void) {
    tr_backend be;
    et_backend(&be, 1);
    tr_model_config cfg;
    tr_err err = {0};
    if (tr_config_parse(CONFIG, sizeof CONFIG - 1, "test", &cfg, &err) != 0) {
        fprintf(stderr, "config: %s\n", err.msg);
        return 1;
    }
    check_widening(&be, &cfg);
    check_kept(&be, &cfg);
    check_errors_and_kv(&be, &cfg);
    check_tokens(&be);
    tr_backend_free(&be);
    return tr_test_summary("test_plan");
}
