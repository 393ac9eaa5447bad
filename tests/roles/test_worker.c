// Role workers as real processes (`troupe worker`), driven through the client calls of
// roles/client.h by this test acting as the controller (a ROUTER on loopback):
//   - policy/reference/reward round trips on a fixture model: the logprobs the reference
//     (2 DP ranks, gathered in order) and the policy recompute equal the generation's within
//     1e-5; rule scores equal the rule applied here to texts decoded here; same seed, same
//     rollouts; the first PPO step's metrics at ratio 1 equal the surrogate's closed form
//     (pg_loss = -mean advantage, no clipping, approx_kl 0);
//   - against transformers' outputs of the fixtures: policy logprobs/entropy and greedy
//     generation, critic values, reward-model scores; the critic's first clipped value loss
//     equals 1/2 (v - R)^2 token-mean;
//   - error replies name role/rank/op; save/load round trip;
//   - colocated policy + reference in one process (one arena; the reference's weights copied
//     from the policy's, the same checkpoint) give bit for bit the numbers of
//     separate processes through generate, logprobs, a PPO step with KL and generate again,
//     and the worker's arena is the documented max(train, forward + kv) formula, smaller
//     than separate buffers;
//   - two data-parallel policy ranks: train refused until their communicator is formed, formed
//     once (a second time is an error), then a train call whose 5 sequences are split 3 + 2
//     by tokens across the ranks and whose metrics count all of them on both;
//   - a worker exits on SIGTERM, on shutdown, and by itself when the controller goes silent;
//   - a reward service that hangs, crashes or answers garbage: on_failure fail -> an error,
//     zero -> zero scores counted as failures (with the misbehaving fake service).
// usage: test_worker TROUPE [FAKE_REWARD_SERVICE]
#include <math.h>
#include <poll.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "engine/checkpoint.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "roles/client.h"
#include "roles/reward_rule.h"
#include "tests/engine/arena_formula.h"
#include "tests/roles/proc_util.h"
#include "tests/test.h"

#define HB_INTERVAL_MS 250
#define HB_TIMEOUT_MS 4000

static const char *troupe, *fake_service, *tmp, *model_dir;
static int n_logs;

typedef struct proc {
    pid_t pid;
    char log[512];
} proc;

static proc spawn_worker(const char *roles, const char *endpoint, int rank, int world) {
    proc p;
    char r[16], w[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(w, sizeof w, "%d", world);
    snprintf(p.log, sizeof p.log, "%s/worker-%d.log", tmp, n_logs++);
    char *argv[] = {(char *)troupe, "worker", "--role", (char *)roles, "--connect", (char *)endpoint,
                    "--rank", r, "--world", w, NULL};
    p.pid = tp_spawn(argv, p.log);
    return p;
}

static tr_router *start_router(void) {
    tr_router *router = NULL;
    tr_err err = {0};
    tr_router_opts o = {.endpoint = "tcp://127.0.0.1:*", .heartbeat_interval_ms = HB_INTERVAL_MS,
                        .heartbeat_timeout_ms = HB_TIMEOUT_MS};
    if (tr_router_init(&router, &o, &err)) {
        fprintf(stderr, "router: %s\n", err.msg);
        return NULL;
    }
    return router;
}

static void group(tr_group *g, tr_router *r, const char *role, int world) {
    tr_group_init(g, r, role, world);
    g->timeout_ms = 60000;
}

static tr_init_args model_args(bool train) {
    tr_init_args a = {.model = model_dir, .backend = "cpu", .threads = 1, .max_tokens = 256, .seed = 3,
                      .tokenizer = NULL, .train = train};
    if (train) {
        a.optim = (tr_role_optim){.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .grad_clip = 1.0,
                                  .schedule = "constant"};
        a.loss = (tr_role_loss){.clip_low = 0.2, .clip_high = 0.28, .ratio = "token", .agg = "token-mean",
                                .kl_estimator = "k3", .ppo_epochs = 1, .mini_batches = 1, .max_len = 12};
    }
    return a;
}

static bool finished(proc *p, int timeout_ms, int want_status) {
    int st = 0;
    if (!tp_wait(p->pid, timeout_ms, &st)) {
        tp_reap(p->pid);
        p->pid = 0;
        return false;
    }
    p->pid = 0;
    return WIFEXITED(st) && WEXITSTATUS(st) == want_status;
}

// Prompts of random ids (fixed seed) in [3, 300): lengths 3..6.
static void make_prompts(int32_t n, int32_t *ids, int64_t *off) {
    uint32_t s = 12345;
    off[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = 3 + i % 4;
        for (int32_t j = 0; j < len; j++) {
            s = s * 1664525u + 1013904223u;
            ids[off[i] + j] = 3 + (int32_t)((s >> 8) % 297);
        }
        off[i + 1] = off[i] + len;
    }
}

static void check_logprobs_equal_generation(const tr_rollouts *r, const float *lp, const char *who) {
    double worst = 0;
    int prompt_nonzero = 0;
    for (int32_t i = 0; i < r->n; i++) {
        int64_t o = r->offset[i];
        for (int32_t t = 0; t < r->prompt_len[i]; t++) prompt_nonzero += lp[o + t] != 0.0f;
        for (int32_t t = r->prompt_len[i]; t < r->prompt_len[i] + r->response_len[i]; t++) {
            double d = fabs((double)lp[o + t] - r->gen_logprobs[o + t]);
            if (!(d <= worst)) worst = d;
        }
    }
    CHECKF(worst <= 1e-5, "%s logprobs differ from the generation's by %.3g", who, worst);
    CHECK(prompt_nonzero == 0);
    printf("%s: max |logprob - generation logprob| = %.3g\n", who, worst);
}

static void test_round_trip(void) {
    tr_router *router = start_router();
    CHECK(router != NULL);
    if (!router) return;
    const char *ep = tr_router_endpoint(router);
    proc pol = spawn_worker("policy", ep, 0, 1), ref0 = spawn_worker("reference", ep, 0, 2),
         ref1 = spawn_worker("reference", ep, 1, 2), rew = spawn_worker("reward", ep, 0, 1);
    tr_err err = {0};
    CHECKF(tr_router_wait_peers(router, NULL, 4, 30000, &err) == 0, "%s", err.msg);
    tr_group gp, gr, gw;
    group(&gp, router, "policy", 1);
    group(&gr, router, "reference", 2);
    group(&gw, router, "reward", 1);
    char tok_path[1100];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
    tr_init_args pa = model_args(true), ra = model_args(false);
    pa.tokenizer = tok_path;
    tr_init_args wa = {.backend = "cpu", .threads = 1, .max_tokens = 256, .tokenizer = tok_path,
                       .reward = {.kind = "rule", .function = "regex", .pattern = "[aeiou]", .on_failure = "fail"}};
    tr_role_info info;
    CHECKF(tr_role_init(&gp, &pa, &info, &err) == 0, "%s", err.msg);
    CHECK(info.vocab_size == 300 && info.n_params > 0 && strstr(info.architecture, "Qwen2") != NULL);
    CHECKF(tr_role_init(&gr, &ra, &info, &err) == 0, "%s", err.msg);
    CHECKF(tr_role_init(&gw, &wa, &info, &err) == 0, "%s", err.msg);
    CHECK(info.n_params == 0);
    // A second init is refused, naming the worker.
    CHECK(tr_role_init(&gw, &wa, &info, &err) != 0 && strstr(err.msg, "reward/0: init") != NULL);

    enum { NP = 3, NS = 4, MAXNEW = 12 };
    int32_t ids[64];
    int64_t off[NP + 1];
    make_prompts(NP, ids, off);
    char *texts[NP] = {"first", NULL, "third"};
    char *metas[NP] = {"{\"answer\": \"1\"}", "{}", "{\"answer\": \"3\"}"};
    int32_t groups[NP] = {10, 11, 12};
    tr_prompt_batch pb = {.n = NP, .ids = ids, .offset = off, .group = groups, .text = texts, .meta = metas};
    tr_sampling s = {.n = NS, .max_new_tokens = MAXNEW, .temperature = 1.0f, .top_p = 1.0f, .seed = 7};
    tr_rollouts r, r2;
    tr_rollouts_init(&r);
    tr_rollouts_init(&r2);
    CHECKF(tr_policy_generate(&gp, &pb, &s, &r, &err) == 0, "%s", err.msg);
    CHECK(r.n == NP * NS);
    tr_tokenizer *tok = NULL;
    CHECK(tr_tokenizer_load(&tok, tok_path, &err) == 0);
    int bad_order = 0, bad_prompt = 0, bad_finish = 0, bad_text = 0;
    for (int32_t i = 0; i < r.n && tok; i++) {
        int32_t p = i / NS;
        bad_order += r.group[i] != groups[p] || r.sample[i] != i % NS;
        bad_prompt += r.prompt_len[i] != off[p + 1] - off[p] ||
                      memcmp(r.tokens + r.offset[i], ids + off[p], (size_t)r.prompt_len[i] * 4) != 0 ||
                      strcmp(r.meta[i], metas[p]) != 0 ||
                      (texts[p] ? !r.prompt_text[i] || strcmp(r.prompt_text[i], texts[p]) : r.prompt_text[i] != NULL);
        const int32_t *resp = r.tokens + r.offset[i] + r.prompt_len[i];
        int32_t n = r.response_len[i];
        bool stopped = n > 0 && resp[n - 1] == 2;  // the fixture's eos_token_id
        bad_finish += n < 1 || n > MAXNEW || (r.finish[i] == TR_FINISH_STOP) != stopped ||
                      (r.finish[i] == TR_FINISH_LENGTH && n != MAXNEW);
        char *text = NULL;
        size_t len;
        CHECK(tr_tokenizer_decode(tok, resp, (size_t)(stopped ? n - 1 : n), &text, &len, &err) == 0);
        bad_text += !r.response_text[i] || !text || strcmp(text, r.response_text[i]) != 0;
        free(text);
    }
    CHECK(bad_order == 0 && bad_prompt == 0 && bad_finish == 0 && bad_text == 0);

    // The same seed gives the same rollouts (each prompt's stream is derived from its index).
    CHECKF(tr_policy_generate(&gp, &pb, &s, &r2, &err) == 0, "%s", err.msg);
    CHECK(r2.n_tokens == r.n_tokens && memcmp(r2.tokens, r.tokens, (size_t)r.n_tokens * 4) == 0);

    // Rule scores against the rule applied here.
    float scores[NP * NS];
    int64_t failures = -1;
    CHECKF(tr_reward_score(&gw, &r, 0, scores, &failures, &err) == 0, "%s", err.msg);
    CHECK(failures == 0);
    tr_reward_rule *rule = NULL;
    tr_reward_rule_opts ro = {.kind = TR_REWARD_RULE_REGEX, .pattern = "[aeiou]"};
    CHECK(tr_reward_rule_init(&rule, &ro, &err) == 0);
    int bad_score = 0, ones = 0;
    for (int32_t i = 0; i < r.n && rule; i++) {
        float want = -1;
        tr_reward_rule_score(rule, r.response_text[i], strlen(r.response_text[i]), NULL, &want, &err);
        bad_score += want != scores[i];
        ones += scores[i] == 1.0f;
    }
    CHECK(bad_score == 0);
    printf("rule scores: %d of %d responses match [aeiou]\n", ones, r.n);
    tr_reward_rule_free(rule);

    // Training-path logprobs equal the generation's, from the reference (split over 2 ranks)
    // and from the policy itself; entropy is a valid entropy.
    float *lp = calloc((size_t)r.n_tokens, sizeof(float)), *lp2 = calloc((size_t)r.n_tokens, sizeof(float));
    float *ent = calloc((size_t)r.n_tokens, sizeof(float));
    CHECKF(tr_model_logprobs(&gr, &r, lp, NULL, &err) == 0, "%s", err.msg);
    check_logprobs_equal_generation(&r, lp, "reference (2 ranks)");
    CHECKF(tr_model_logprobs(&gp, &r, lp2, ent, &err) == 0, "%s", err.msg);
    check_logprobs_equal_generation(&r, lp2, "policy");
    int bad_ent = 0;
    for (int64_t t = 0; t < r.n_tokens; t++) bad_ent += !(ent[t] >= 0.0f && ent[t] <= logf(300.0f) + 1e-4f);
    CHECK(bad_ent == 0);

    // One PPO step at ratio 1: the clipped surrogate is -A per token, token-mean aggregated.
    float *adv = calloc((size_t)r.n_tokens, sizeof(float));
    double adv_sum = 0;
    int64_t n_resp = 0;
    for (int32_t i = 0; i < r.n; i++) {
        float mean = 0;
        for (int32_t j = 0; j < NS; j++) mean += scores[(i / NS) * NS + j] / NS;
        for (int32_t t = r.prompt_len[i]; t < r.prompt_len[i] + r.response_len[i]; t++) {
            adv[r.offset[i] + t] = scores[i] - mean + 0.25f * (float)((t % 3) - 1);
            adv_sum += adv[r.offset[i] + t];
            n_resp++;
        }
    }
    tr_train_batch tb = {.r = &r, .advantages = adv, .old_logprobs = lp2};
    tr_train_metrics m;
    CHECKF(tr_policy_train(&gp, &tb, &m, &err) == 0, "%s", err.msg);
    CHECK_NEAR(m.pg_loss, -adv_sum / (double)n_resp, 1e-5);
    CHECK_NEAR(m.loss, m.pg_loss, 1e-9);
    CHECK(m.clip_frac == 0 && m.approx_kl < 1e-9 && fabs(m.ratio_mean - 1) < 1e-6);
    CHECK(m.tokens == n_resp && m.steps == 1 && m.step == 1 && m.grad_norm > 0 && m.lr > 0);
    printf("train: pg_loss %.6g (closed form %.6g), grad norm %.4g\n", m.pg_loss, -adv_sum / (double)n_resp,
           m.grad_norm);
    // The update moved the policy.
    CHECKF(tr_model_logprobs(&gp, &r, lp, NULL, &err) == 0, "%s", err.msg);
    double moved = 0;
    for (int64_t t = 0; t < r.n_tokens; t++) moved = fmax(moved, fabs((double)lp[t] - lp2[t]));
    CHECK(moved > 1e-4);

    // Errors come back naming role, rank and op; the worker keeps serving.
    int32_t bad_ids[3] = {5, 5000, 7};
    int64_t bad_off[2] = {0, 3};
    tr_prompt_batch bad = {.n = 1, .ids = bad_ids, .offset = bad_off};
    CHECK(tr_policy_generate(&gp, &bad, &s, &r2, &err) != 0);
    CHECKF(strstr(err.msg, "policy/0: generate:") && strstr(err.msg, "5000"), "%s", err.msg);
    CHECK(tr_model_logprobs(&gw, &r, lp, NULL, &err) != 0);
    CHECKF(strstr(err.msg, "reward/0: logprobs:") && strstr(err.msg, "no op"), "%s", err.msg);

    // save / load / sync_weights.
    char ckpt[600];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    CHECKF(tr_role_save(&gp, ckpt, &err) == 0, "%s", err.msg);
    char f[700];
    const char *want[] = {"config.json", "model.safetensors", "tokenizer.json", "trainer_state.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(f, sizeof f, "%s/%s", ckpt, want[i]);
        CHECKF(access(f, R_OK) == 0, "%s", f);
    }
    CHECKF(tr_role_load(&gp, ckpt, &err) == 0, "%s", err.msg);
    CHECKF(tr_model_logprobs(&gp, &r, lp2, NULL, &err) == 0, "%s", err.msg);
    CHECK(memcmp(lp, lp2, (size_t)r.n_tokens * sizeof(float)) == 0);
    bool synced = true;
    CHECK(tr_policy_sync_weights(&gp, &synced, &err) == 0 && !synced);

    CHECK(tr_group_shutdown(&gp, &err) == 0 && tr_group_shutdown(&gr, &err) == 0 &&
          tr_group_shutdown(&gw, &err) == 0);
    CHECK(finished(&pol, 10000, 0) && finished(&ref0, 10000, 0) && finished(&ref1, 10000, 0) &&
          finished(&rew, 10000, 0));
    free(lp);
    free(lp2);
    free(ent);
    free(adv);
    tr_tokenizer_free(tok);
    tr_rollouts_free(&r);
    tr_rollouts_free(&r2);
    tr_router_free(router);
}

// What a policy and a reference do in one RL step, as the workflow drives them: generate,
// reference logprobs, a PPO step with a KL term on those logprobs, generate again, and the
// trained policy's logprobs of the first rollouts.
typedef struct step_run {
    tr_rollouts r, r2;
    float *ref_lp, *old_lp, *lp_after;
    tr_train_metrics m;
} step_run;

static void step_run_free(step_run *o) {
    tr_rollouts_free(&o->r);
    tr_rollouts_free(&o->r2);
    free(o->ref_lp);
    free(o->old_lp);
    free(o->lp_after);
}

static int rl_step(tr_group *gp, tr_group *gr, step_run *o, const char *who) {
    tr_err err = {0};
    int32_t ids[32];
    int64_t off[3];
    make_prompts(2, ids, off);
    tr_prompt_batch pb = {.n = 2, .ids = ids, .offset = off};
    tr_sampling s = {.n = 2, .max_new_tokens = 8, .temperature = 0.8f, .top_p = 0.9f, .top_k = 50, .seed = 1};
    memset(o, 0, sizeof *o);
    tr_rollouts_init(&o->r);
    tr_rollouts_init(&o->r2);
    int rc = tr_policy_generate(gp, &pb, &s, &o->r, &err);
    size_t n = (size_t)(o->r.n_tokens ? o->r.n_tokens : 1);
    float *adv = calloc(n, sizeof(float));
    o->ref_lp = calloc(n, sizeof(float));
    o->old_lp = calloc(n, sizeof(float));
    o->lp_after = calloc(n, sizeof(float));
    if (!rc) rc = tr_model_logprobs(gr, &o->r, o->ref_lp, NULL, &err);
    if (!rc) rc = tr_model_logprobs(gp, &o->r, o->old_lp, NULL, &err);
    for (int64_t t = 0; !rc && t < o->r.n_tokens; t++) adv[t] = 0.1f * (float)(o->r.tokens[t] % 7 - 3);
    tr_train_batch tb = {.r = &o->r, .advantages = adv, .old_logprobs = o->old_lp, .ref_logprobs = o->ref_lp};
    if (!rc) rc = tr_policy_train(gp, &tb, &o->m, &err);
    s.seed = 2;
    if (!rc) rc = tr_policy_generate(gp, &pb, &s, &o->r2, &err);
    if (!rc) rc = tr_model_logprobs(gp, &o->r, o->lp_after, NULL, &err);
    CHECKF(rc == 0, "%s: %s", who, err.msg);
    free(adv);
    return rc;
}

static bool same_rollouts(const tr_rollouts *a, const tr_rollouts *b) {
    return a->n == b->n && a->n_tokens == b->n_tokens &&
           memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) == 0 &&
           memcmp(a->gen_logprobs, b->gen_logprobs, (size_t)a->n_tokens * sizeof(float)) == 0 &&
           memcmp(a->response_len, b->response_len, (size_t)a->n * sizeof(int32_t)) == 0;
}

// The last "arena: N bytes ..., separate buffers would take S" line of a worker's log.
static bool arena_line(const char *log, long long *bytes, long long *separate) {
    FILE *f = fopen(log, "r");
    char line[1024];
    bool found = false;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "arena: ");
        if (p && sscanf(p, "arena: %lld bytes for the hosted roles, separate buffers would take %lld", bytes,
                        separate) == 2)
            found = true;
    }
    if (f) fclose(f);
    return found;
}

// The colocated worker's arena (its log's line) against the formula on the fixture's config
// (fp32): the policy trains on max_tokens 256 and generates with the default 16384-token KV
// pool (blocks of 16); the reference runs inference on 256 tokens.
static void check_colocated_arena(const char *log) {
    tr_err err = {0};
    tr_model_config cfg;
    long long bytes = 0, separate = 0;
    CHECKF(tr_checkpoint_load_config(model_dir, &cfg, &err) == 0, "%s", err.msg);
    CHECKF(arena_line(log, &bytes, &separate), "no arena line in %s", log);
    size_t train = af_acts_bytes(&cfg, 256, true, 4), fwd = af_acts_bytes(&cfg, 256, false, 4);
    size_t kv = af_kv_bytes(&cfg, 16384, 16, 4);
    size_t want = af_need(train, fwd, kv) > fwd ? af_need(train, fwd, kv) : fwd;
    size_t want_sep = train + kv + fwd;
    CHECKF(bytes == (long long)want && separate == (long long)want_sep,
           "arena %lld bytes (formula %zu), separate %lld (formula %zu)", bytes, want, separate, want_sep);
    CHECK(bytes < separate);
    printf("colocated policy + reference arena: %lld bytes = max(train %zu, forward %zu + kv %zu, forward %zu); "
           "separate buffers %lld bytes\n", bytes, train, fwd, kv, fwd, separate);
}

// A role initialised beside one that has since run an op (here a policy that trained) takes
// its weights from the source itself, not from the changed neighbour: the reference's
// logprobs are the untrained policy's, and the worker logs no copy.
static void test_no_copy_after_op(void) {
    tr_router *router = start_router();
    if (!router) {
        CHECK(0);
        return;
    }
    proc p = spawn_worker("policy,reference", tr_router_endpoint(router), 0, 1);
    tr_err err = {0};
    CHECKF(tr_router_wait_peers(router, NULL, 2, 30000, &err) == 0, "%s", err.msg);
    tr_group gp, gr;
    group(&gp, router, "policy", 1);
    group(&gr, router, "reference", 1);
    tr_init_args pa = model_args(true), ra = model_args(false);
    int32_t ids[32];
    int64_t off[3];
    make_prompts(2, ids, off);
    tr_prompt_batch pb = {.n = 2, .ids = ids, .offset = off};
    tr_sampling s = {.n = 2, .max_new_tokens = 8, .temperature = 0.8f, .top_p = 0.9f, .top_k = 50, .seed = 1};
    tr_rollouts r;
    tr_rollouts_init(&r);
    tr_train_metrics m;
    int rc = tr_role_init(&gp, &pa, NULL, &err) || tr_policy_generate(&gp, &pb, &s, &r, &err);
    size_t n = (size_t)(r.n_tokens ? r.n_tokens : 1);
    float *adv = calloc(n, sizeof(float)), *before = calloc(n, sizeof(float)),
          *ref = calloc(n, sizeof(float)), *after = calloc(n, sizeof(float));
    for (int64_t t = 0; t < r.n_tokens; t++) adv[t] = 0.1f * (float)(r.tokens[t] % 7 - 3);
    tr_train_batch tb = {.r = &r, .advantages = adv, .old_logprobs = before};
    if (!rc) rc = tr_model_logprobs(&gp, &r, before, NULL, &err) || tr_policy_train(&gp, &tb, &m, &err) ||
                  tr_model_logprobs(&gp, &r, after, NULL, &err) || tr_role_init(&gr, &ra, NULL, &err) ||
                  tr_model_logprobs(&gr, &r, ref, NULL, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (!rc) {
        size_t nb = (size_t)r.n_tokens * sizeof(float);
        CHECK(memcmp(after, before, nb) != 0);   // the policy's weights changed
        CHECK(memcmp(ref, before, nb) == 0);     // the reference has the checkpoint's
        CHECK(!tp_file_has(p.log, "weights copied"));
    }
    free(adv);
    free(before);
    free(ref);
    free(after);
    tr_rollouts_free(&r);
    CHECK(tr_group_shutdown(&gp, &err) == 0 && tr_group_shutdown(&gr, &err) == 0);
    CHECK(finished(&p, 10000, 0));
    tr_router_free(router);
}

// policy and reference in one process (both dealers, one pid, one thread pool, one arena)
// against the same roles in separate processes: the same rollouts, reference logprobs, PPO
// metrics, rollouts after the update and trained logprobs, bit for bit, in fp32 and in bf16
// (where the reference keeps no masters and takes the policy's rounded). The colocated
// worker's arena is the documented max(policy train, policy forward + kv, reference forward).
static void test_colocated(const char *precision) {
    tr_router *router = start_router(), *router_sep = start_router();
    if (!router || !router_sep) {
        CHECK(0);
        if (router) tr_router_free(router);
        if (router_sep) tr_router_free(router_sep);
        return;
    }
    proc p = spawn_worker("policy,reference", tr_router_endpoint(router), 0, 1);
    proc sp = spawn_worker("policy", tr_router_endpoint(router_sep), 0, 1),
         sr = spawn_worker("reference", tr_router_endpoint(router_sep), 0, 1);
    tr_err err = {0};
    CHECKF(tr_router_wait_peers(router, NULL, 2, 30000, &err) == 0, "%s", err.msg);
    CHECKF(tr_router_wait_peers(router_sep, NULL, 2, 30000, &err) == 0, "%s", err.msg);
    tr_peer peers[4];
    int n = 0;
    tr_router_peers(router, peers, 4, &n);
    CHECK(n == 2 && peers[0].pid == p.pid && peers[1].pid == p.pid);
    tr_group gp, gr, gsp, gsr;
    group(&gp, router, "policy", 1);
    group(&gr, router, "reference", 1);
    group(&gsp, router_sep, "policy", 1);
    group(&gsr, router_sep, "reference", 1);
    tr_init_args pa = model_args(true), ra = model_args(false);
    pa.precision = ra.precision = precision;   // bf16: the reference keeps no fp32 masters
    pa.loss.kl_coef = 0.05;  // the reference's logprobs enter the update
    CHECKF(tr_role_init(&gp, &pa, NULL, &err) == 0 && tr_role_init(&gr, &ra, NULL, &err) == 0, "%s", err.msg);
    CHECKF(tr_role_init(&gsp, &pa, NULL, &err) == 0 && tr_role_init(&gsr, &ra, NULL, &err) == 0, "%s", err.msg);
    // The colocated reference copies the policy's weights (the same checkpoint, unchanged
    // since the policy's init) rather than reading the checkpoint again; the separate one reads
    // it: the logprobs below compare the two bit for bit.
    CHECKF(tp_file_has(p.log, "[reference/0] init: weights copied from the policy role's"),
           "no copy line in %s", p.log);
    CHECK(!tp_file_has(sr.log, "weights copied"));
    step_run co, se;
    if (rl_step(&gp, &gr, &co, "colocated") == 0 && rl_step(&gsp, &gsr, &se, "separate") == 0) {
        check_logprobs_equal_generation(&co.r, co.ref_lp, "colocated reference");
        size_t nb = (size_t)co.r.n_tokens * sizeof(float);
        CHECK(same_rollouts(&co.r, &se.r));
        CHECK(co.r.n_tokens == se.r.n_tokens && memcmp(co.ref_lp, se.ref_lp, nb) == 0 &&
              memcmp(co.old_lp, se.old_lp, nb) == 0);
        CHECK(co.m.loss == se.m.loss && co.m.grad_norm == se.m.grad_norm && co.m.kl == se.m.kl &&
              co.m.tokens == se.m.tokens && co.m.grad_norm > 0);
        CHECK(same_rollouts(&co.r2, &se.r2));
        CHECK(memcmp(co.lp_after, se.lp_after, nb) == 0 && memcmp(co.lp_after, co.old_lp, nb) != 0);
        printf("colocated = separate (%s), bit for bit: %lld rollout tokens, loss %.6g, kl %.6g, grad norm %.6g\n",
               precision, (long long)co.r.n_tokens, co.m.loss, co.m.kl, co.m.grad_norm);
    }
    step_run_free(&co);
    step_run_free(&se);

    if (strcmp(precision, "fp32") == 0) check_colocated_arena(p.log);

    // Shutting one role down keeps the process for the other.
    CHECK(tr_group_shutdown(&gp, &err) == 0);
    tp_sleep_ms(300);
    CHECK(!tp_gone(p.pid));
    CHECK(tr_group_shutdown(&gr, &err) == 0);
    CHECK(finished(&p, 10000, 0));
    CHECK(tr_group_shutdown(&gsp, &err) == 0 && tr_group_shutdown(&gsr, &err) == 0);
    CHECK(finished(&sp, 10000, 0) && finished(&sr, 10000, 0));
    tr_router_free(router);
    tr_router_free(router_sep);
}

// ---- against transformers (tests/fixtures/models/*/expected.safetensors) ----

typedef struct hf_fixture {
    tr_st_file f;
    int32_t ids[64], lens[8], n_seq, n_tok;
} hf_fixture;

static float *hf_read(hf_fixture *h, const char *name, int64_t n) {
    const tr_st_tensor *t = tr_st_find(&h->f, name);
    float *out = t && (int64_t)t->numel == n ? malloc((size_t)n * sizeof(float)) : NULL;
    tr_err err = {0};
    if (out && tr_st_read_f32(&h->f, t, out, &err)) {
        free(out);
        out = NULL;
    }
    CHECKF(out != NULL, "fixture tensor %s", name);
    return out;
}

static int hf_open(hf_fixture *h, const char *model) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/%s/expected.safetensors",
             getenv("TROUPE_SOURCE_ROOT") ? getenv("TROUPE_SOURCE_ROOT") : ".", model);
    tr_err err = {0};
    if (tr_st_open(&h->f, path, &err)) return -1;
    const tr_st_tensor *ti = tr_st_find(&h->f, "input_ids"), *tl = tr_st_find(&h->f, "seq_lens");
    int64_t v[64];
    if (!ti || !tl || ti->numel > 64 || tl->numel > 8 || tr_st_read_i64(&h->f, ti, v, &err)) return -1;
    h->n_tok = (int32_t)ti->numel;
    for (int32_t i = 0; i < h->n_tok; i++) h->ids[i] = (int32_t)v[i];
    if (tr_st_read_i64(&h->f, tl, v, &err)) return -1;
    h->n_seq = (int32_t)tl->numel;
    for (int32_t i = 0; i < h->n_seq; i++) h->lens[i] = (int32_t)v[i];
    return 0;
}

// The fixture's sequences as rollouts: the first prompt_len tokens of each are the prompt.
static void hf_rollouts(const hf_fixture *h, int32_t prompt_len, tr_rollouts *r) {
    tr_err err = {0};
    int32_t o = 0;
    for (int32_t i = 0; i < h->n_seq; i++) {
        tr_rollouts_append(r, i, 0, h->ids + o, prompt_len, h->ids + o + prompt_len, NULL, h->lens[i] - prompt_len,
                           TR_FINISH_LENGTH, NULL, "", NULL, &err);
        o += h->lens[i];
    }
}

// Largest |ours[t] - hf[t - 1]| over the scored tokens (t >= prompt_len) of every sequence.
static double hf_shifted_err(const tr_rollouts *r, const float *ours, const float *hf) {
    double e = 0;
    for (int32_t i = 0; i < r->n; i++)
        for (int64_t t = r->prompt_len[i]; t < r->prompt_len[i] + r->response_len[i]; t++)
            e = fmax(e, fabs((double)ours[r->offset[i] + t] - hf[r->offset[i] + t - 1]));
    return e;
}

static void test_hf_reference(void) {
    tr_router *router = start_router();
    if (!router) return;
    const char *ep = tr_router_endpoint(router);
    char lm[1100], val[1100], score[1100];
    snprintf(lm, sizeof lm, "%s", model_dir);
    snprintf(val, sizeof val, "%s", tp_model_dir(getenv("TROUPE_SOURCE_ROOT"), tmp, "value_llama3"));
    snprintf(score, sizeof score, "%s", tp_model_dir(getenv("TROUPE_SOURCE_ROOT"), tmp, "score_qwen2"));
    proc pp = spawn_worker("policy", ep, 0, 1), pc = spawn_worker("critic", ep, 0, 1),
         pw = spawn_worker("reward", ep, 0, 1);
    tr_err err = {0};
    CHECKF(tr_router_wait_peers(router, NULL, 3, 30000, &err) == 0, "%s", err.msg);
    tr_group gp, gc, gw;
    group(&gp, router, "policy", 1);
    group(&gc, router, "critic", 1);
    group(&gw, router, "reward", 1);
    tr_init_args pa = model_args(true), ca = model_args(true), wa = model_args(false);
    // The fixture's optimizer (tools/make_model_fixtures.py: ADAMW, MAX_GRAD_NORM).
    pa.optim = (tr_role_optim){.lr = 2e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                               .grad_clip = 1.0, .schedule = "constant"};
    ca.model = val;
    ca.loss.value_clip = 0.2;
    wa.model = score;
    wa.reward = (tr_role_reward){.kind = "model", .on_failure = "fail"};
    CHECKF(tr_role_init(&gp, &pa, NULL, &err) == 0, "%s", err.msg);
    CHECKF(tr_role_init(&gc, &ca, NULL, &err) == 0, "%s", err.msg);
    CHECKF(tr_role_init(&gw, &wa, NULL, &err) == 0, "%s", err.msg);

    hf_fixture h;
    tr_rollouts r;
    // Policy logprobs and entropy, and greedy generation.
    if (hf_open(&h, "qwen2") == 0) {
        tr_rollouts_init(&r);
        hf_rollouts(&h, 1, &r);
        float *want = hf_read(&h, "logprobs", h.n_tok), *went = hf_read(&h, "entropy", h.n_tok);
        float lp[64], ent[64];
        CHECKF(tr_model_logprobs(&gp, &r, lp, ent, &err) == 0, "%s", err.msg);
        if (want && went) {
            double e1 = hf_shifted_err(&r, lp, want), e2 = hf_shifted_err(&r, ent, went);
            CHECKF(e1 <= 1e-5 && e2 <= 1e-5, "logprobs %.3g, entropy %.3g", e1, e2);
            printf("policy logprobs vs transformers: %.3g, entropy %.3g\n", e1, e2);
        }
        free(want);
        free(went);
        tr_rollouts_free(&r);
        for (int i = 0; i < 3; i++) {
            char name[32];
            snprintf(name, sizeof name, "gen.prompt.%d", i);
            const tr_st_tensor *tp = tr_st_find(&h.f, name);
            snprintf(name, sizeof name, "gen.output.%d", i);
            const tr_st_tensor *to = tr_st_find(&h.f, name);
            int64_t p64[64], o64[64];
            CHECK(tp && to && tp->numel < 64 && to->numel < 64 && tr_st_read_i64(&h.f, tp, p64, &err) == 0 &&
                  tr_st_read_i64(&h.f, to, o64, &err) == 0);
            if (!tp || !to) continue;
            int32_t prompt[64];
            for (size_t j = 0; j < tp->numel; j++) prompt[j] = (int32_t)p64[j];
            int64_t off[2] = {0, (int64_t)tp->numel};
            tr_prompt_batch pb = {.n = 1, .ids = prompt, .offset = off};
            tr_sampling s = {.n = 1, .max_new_tokens = 16, .temperature = 0.0f, .top_p = 1.0f};
            tr_rollouts_init(&r);
            CHECKF(tr_policy_generate(&gp, &pb, &s, &r, &err) == 0, "%s", err.msg);
            int same = r.n == 1 && r.n_tokens == (int64_t)to->numel;
            for (int64_t t = 0; same && t < r.n_tokens; t++) same = r.tokens[t] == o64[t];
            CHECKF(same, "greedy generation %d differs from transformers'", i);
            tr_rollouts_free(&r);
        }
        // train_sft: the fixture's sequences as the documents of one row; the first step's
        // loss and pre-clip gradient norm are transformers' (its AdamW steps also decay norm
        // weights, the worker's do not, so later steps are not compared).
        int32_t targets[64], doc_start[8] = {0}, n_docs = h.n_seq;
        for (int32_t i = 0, o = 0; i < h.n_seq; o += h.lens[i], i++) {
            doc_start[i + 1] = o + h.lens[i];
            for (int32_t t = 0; t < h.lens[i]; t++) targets[o + t] = t + 1 < h.lens[i] ? h.ids[o + t + 1] : -1;
        }
        tr_sft_batch sb = {.n_rows = 1, .row_len = h.n_tok, .ids = h.ids, .targets = targets,
                           .doc_start = doc_start, .n_docs = &n_docs};
        float *loss = hf_read(&h, "loss", 1), *gn = hf_read(&h, "grad_norm", 3);
        tr_train_metrics m;
        CHECKF(tr_policy_train_sft(&gp, &sb, &m, &err) == 0, "%s", err.msg);
        if (loss && gn) {
            CHECKF(fabs(m.loss - loss[0]) <= 1e-5 * loss[0] && fabs(m.grad_norm - gn[0]) <= 1e-5 * gn[0],
                   "train_sft loss %.8g (transformers %.8g), grad norm %.8g (%.8g)", m.loss, loss[0], m.grad_norm,
                   gn[0]);
            printf("train_sft vs transformers: loss %.8g (%.8g), grad norm %.8g (%.8g)\n", m.loss, loss[0],
                   m.grad_norm, gn[0]);
        }
        CHECK(m.tokens == h.n_tok - h.n_seq && m.steps == 1 && m.step == 1);
        free(loss);
        free(gn);
        tr_st_close(&h.f);
    } else {
        CHECK(0);
    }
    // Critic values, then one clipped-value-loss step whose loss at values == old_values is
    // the plain 1/2 (v - R)^2, token-mean.
    if (hf_open(&h, "value_llama3") == 0) {
        tr_rollouts_init(&r);
        hf_rollouts(&h, 2, &r);
        float *want = hf_read(&h, "values", h.n_tok), v[64], ret[64];
        CHECKF(tr_critic_values(&gc, &r, v, &err) == 0, "%s", err.msg);
        if (want) {
            double e = hf_shifted_err(&r, v, want);
            CHECKF(e <= 1e-5, "values differ from transformers' by %.3g", e);
            printf("critic values vs transformers: %.3g\n", e);
        }
        double sq = 0;
        int64_t n = 0;
        for (int32_t i = 0; i < r.n; i++)
            for (int64_t t = r.offset[i]; t < r.offset[i + 1]; t++) {
                ret[t] = v[t] + 0.1f * (float)(t % 5) - 0.2f;
                if (t - r.offset[i] >= r.prompt_len[i]) {
                    sq += 0.5 * ((double)v[t] - ret[t]) * ((double)v[t] - ret[t]);
                    n++;
                }
            }
        tr_train_batch tb = {.r = &r, .returns = ret, .old_values = v};
        tr_train_metrics m;
        CHECKF(tr_critic_train(&gc, &tb, &m, &err) == 0, "%s", err.msg);
        CHECK_NEAR(m.value_loss, sq / (double)n, 1e-6);
        CHECK(m.value_clip_frac == 0 && m.tokens == n && m.steps == 1);
        free(want);
        tr_rollouts_free(&r);
        tr_st_close(&h.f);
    } else {
        CHECK(0);
    }
    // Reward model scores.
    if (hf_open(&h, "score_qwen2") == 0) {
        tr_rollouts_init(&r);
        hf_rollouts(&h, 2, &r);
        float *want = hf_read(&h, "scores", h.n_seq), sc[8];
        CHECKF(tr_reward_score(&gw, &r, 0, sc, NULL, &err) == 0, "%s", err.msg);
        double e = 0;
        for (int32_t i = 0; want && i < h.n_seq; i++) e = fmax(e, fabs((double)sc[i] - want[i]));
        CHECKF(want && e <= 1e-5, "scores differ from transformers' by %.3g", e);
        printf("reward model scores vs transformers: %.3g\n", e);
        free(want);
        tr_rollouts_free(&r);
        tr_st_close(&h.f);
    } else {
        CHECK(0);
    }
    CHECK(tr_group_shutdown(&gp, &err) == 0 && tr_group_shutdown(&gc, &err) == 0 &&
          tr_group_shutdown(&gw, &err) == 0);
    CHECK(finished(&pp, 10000, 0) && finished(&pc, 10000, 0) && finished(&pw, 10000, 0));
    tr_router_free(router);
}

// SIGTERM ends a worker cleanly; a silent controller ends it with an error.
static void test_data_parallel(void) {
    tr_router *router = start_router();
    if (!router) return;
    tr_err err = {0};
    proc w0 = spawn_worker("policy", tr_router_endpoint(router), 0, 2);
    proc w1 = spawn_worker("policy", tr_router_endpoint(router), 1, 2);
    tr_group g;
    group(&g, router, "policy", 2);
    CHECK(tr_router_wait_peers(router, "policy", 2, 30000, &err) == 0);
    tr_init_args a = model_args(true);
    tr_role_info info;
    CHECKF(tr_role_init(&g, &a, &info, &err) == 0, "%s", err.msg);
    // Five sequences, the first three short: 3 + 2 balances the tokens best.
    tr_rollouts r;
    tr_rollouts_init(&r);
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = 5 + (i * 7) % 200;
    const int32_t plen[5] = {2, 2, 3, 4, 4}, rlen[5] = {2, 3, 2, 7, 6};
    for (int i = 0, o = 0; i < 5; o += plen[i] + rlen[i], i++)
        tr_rollouts_append(&r, i, 0, toks + o, plen[i], toks + o + plen[i], NULL, rlen[i], TR_FINISH_STOP, NULL, NULL,
                           NULL, &err);
    float adv[40], old[40];
    for (int i = 0; i < 40; i++) {
        adv[i] = i % 3 == 0 ? 1.0f : -0.5f;
        old[i] = -3.0f;
    }
    tr_train_batch b = {.r = &r, .advantages = adv, .old_logprobs = old};
    tr_train_metrics m;
    CHECK(tr_policy_train(&g, &b, &m, &err) == -1 && strstr(err.msg, "has no communicator"));
    tr_group *gs[] = {&g};
    CHECKF(tr_groups_comm_init(gs, 1, 30000, &err) == 0, "%s", err.msg);
    CHECK(tr_groups_comm_init(gs, 1, 30000, &err) == -1 && strstr(err.msg, "already has its dp communicator"));
    CHECKF(tr_policy_train(&g, &b, &m, &err) == 0, "%s", err.msg);
    CHECK(m.steps == 1 && m.tokens == 20);
    CHECK(tp_file_has(w0.log, "[policy/0] train: 3 sequences here, 1 steps"));
    CHECK(tp_file_has(w1.log, "[policy/1] train: 2 sequences here, 1 steps"));
    tr_group_shutdown(&g, &err);
    CHECK(finished(&w0, 10000, 0) && finished(&w1, 10000, 0));
    tr_rollouts_free(&r);
    tr_router_free(router);
}

static void test_exits(void) {
    tr_router *router = start_router();
    if (!router) return;
    tr_err err = {0};
    proc a = spawn_worker("reference", tr_router_endpoint(router), 0, 1);
    CHECK(tr_router_wait_peers(router, "reference", 1, 30000, &err) == 0);
    kill(a.pid, SIGTERM);
    CHECK(finished(&a, 5000, 0));
    CHECK(tp_file_has(a.log, "[reference/0] exiting: stop signal"));

    proc b = spawn_worker("critic", tr_router_endpoint(router), 0, 1);
    CHECK(tr_router_wait_peers(router, "critic", 1, 30000, &err) == 0);
    long long t0 = tp_now_ms();
    tr_router_free(router);  // the controller goes away without a word
    CHECK(finished(&b, HB_TIMEOUT_MS + 5000, 1));
    long long dt = tp_now_ms() - t0;
    CHECK(tp_file_has(b.log, "controller at") && tp_file_has(b.log, "is dead"));
    printf("worker exited %lld ms after its controller went silent (heartbeat timeout %d ms)\n", dt, HB_TIMEOUT_MS);
}

// Exit statuses of the command line: usage errors 2, a controller that never answers 1.
static void test_cli(void) {
    struct {
        const char *args[8];
        int status;
    } cases[] = {
        {{"worker", "--help"}, 0},
        {{"worker", "--role", "policy"}, 2},
        {{"worker", "--role", "bogus", "--connect", "tcp://127.0.0.1:9"}, 2},
        {{"worker", "--role", "policy,policy", "--connect", "tcp://127.0.0.1:9"}, 2},
        {{"worker", "--role", "policy", "--connect", "tcp://127.0.0.1:9", "--rank"}, 2},
        {{"worker", "--role", "reward", "--connect", "ipc:///nonexistent/dir/x", "--connect-timeout-ms", "300"}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[10] = {(char *)troupe};
        for (int j = 0; j < 8 && cases[i].args[j]; j++) argv[j + 1] = (char *)cases[i].args[j];
        char log[600];
        snprintf(log, sizeof log, "%s/cli-%zu.log", tmp, i);
        proc p = {tp_spawn(argv, log), ""};
        CHECKF(finished(&p, 10000, cases[i].status), "case %zu", i);
    }
}

// ---- reward services ----

static pid_t start_fake(const char *endpoint, const char *mode) {
    int fds[2];
    if (pipe(fds) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(fake_service, fake_service, endpoint, mode, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char line[256] = "";
    struct pollfd p = {fds[0], POLLIN, 0};
    ssize_t n = poll(&p, 1, 10000) > 0 ? read(fds[0], line, sizeof line - 1) : -1;
    close(fds[0]);
    if (n <= 0 || strncmp(line, "listening on", 12) != 0) {
        tp_reap(pid);
        return -1;
    }
    return pid;
}

static void service_case(const char *mode, const char *on_failure, bool want_ok, const float *want_scores,
                         int64_t want_failures) {
    char ep[600];
    static int k;
    snprintf(ep, sizeof ep, "ipc://%s/svc%d", tmp, k++);
    pid_t svc = start_fake(ep, mode);
    CHECKF(svc > 0, "fake service %s", mode);
    tr_router *router = start_router();
    if (!router || svc <= 0) {
        tp_reap(svc);
        if (router) tr_router_free(router);
        return;
    }
    proc w = spawn_worker("reward", tr_router_endpoint(router), 0, 1);
    tr_err err = {0};
    CHECK(tr_router_wait_peers(router, "reward", 1, 30000, &err) == 0);
    tr_group g;
    group(&g, router, "reward", 1);
    tr_init_args a = {.backend = "cpu", .threads = 1, .max_tokens = 64,
                      .reward = {.kind = "service", .endpoint = ep, .timeout_ms = 1000, .attempts = 2,
                                 .max_items = 2, .on_failure = on_failure}};
    CHECKF(tr_role_init(&g, &a, NULL, &err) == 0, "%s", err.msg);
    tr_rollouts r;
    tr_rollouts_init(&r);
    int32_t prompt[2] = {5, 6}, resp[2] = {7, 8};
    for (int i = 0; i < 3; i++)
        tr_rollouts_append(&r, 0, i, prompt, 2, resp, NULL, 2, TR_FINISH_STOP, "p", "r", "{\"answer\": 1}", &err);
    float scores[3] = {-1, -1, -1};
    int64_t failures = -1;
    int rc = tr_reward_score(&g, &r, 0, scores, &failures, &err);
    CHECKF((rc == 0) == want_ok, "%s/%s: %s", mode, on_failure, rc ? err.msg : "ok");
    if (rc == 0) {
        CHECK(scores[0] == want_scores[0] && scores[1] == want_scores[1] && scores[2] == want_scores[2]);
        CHECKF(failures == want_failures, "%s: %lld failures", mode, (long long)failures);
    } else {
        CHECKF(strstr(err.msg, "reward/0: score:") && strstr(err.msg, ep), "%s", err.msg);
    }
    printf("service %-12s on_failure %-4s -> %s\n", mode, on_failure, rc ? err.msg : "scores ok");
    CHECK(tr_group_shutdown(&g, &err) == 0);
    CHECK(finished(&w, 10000, 0));
    tp_reap(svc);
    tr_rollouts_free(&r);
    tr_router_free(router);
}

static void test_reward_service(void) {
    // The fake service scores every item 0.5; the zero policy scores failed items 0.
    const float good[3] = {0.5f, 0.5f, 0.5f}, zero[3] = {0, 0, 0}, half[3] = {0.5f, 0.5f, 0};
    service_case("ok", "fail", true, good, 0);
    service_case("hang", "fail", false, NULL, 0);
    service_case("hang", "zero", true, zero, 3);
    service_case("crash_after=0", "fail", false, NULL, 0);
    service_case("crash_after=0", "zero", true, zero, 3);
    service_case("not_msgpack", "fail", false, NULL, 0);
    service_case("not_msgpack", "zero", true, zero, 3);
    // The first batch (2 items) is answered, then the service dies: only the rest are zeroed.
    service_case("crash_after=1", "zero", true, half, 1);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_worker TROUPE [FAKE_REWARD_SERVICE]\n");
        return 2;
    }
    troupe = argv[1];
    fake_service = argc > 2 ? argv[2] : NULL;
    static char dir[256];
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    tmp = dir;
    static char md[1024];
    const char *m = tp_model_dir(getenv("TROUPE_SOURCE_ROOT") ? getenv("TROUPE_SOURCE_ROOT") : ".", tmp, "qwen2");
    CHECK(m != NULL);
    if (!m) return tr_test_summary("test_worker");
    snprintf(md, sizeof md, "%s", m);
    model_dir = md;
    test_round_trip();
    test_hf_reference();
    test_colocated("fp32");
    test_colocated("bf16");
    test_no_copy_after_op();
    test_data_parallel();
    test_exits();
    test_cli();
    if (fake_service) test_reward_service();
    else printf("SKIP: reward service cases (no fake service given)\n");
    if (tr_test_failures == 0) tp_rmtree(tmp);
    return tr_test_summary("test_worker");
}
