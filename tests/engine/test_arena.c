// The worker arena against its references:
//  - sizing: activations, KV pool and the arena's need equal the documented formulas
//    (tests/engine/arena_formula.h) for the fixture models and the quickstart's shape, whose
//    numbers are printed; the shared region is smaller than separate buffers;
//  - phases: on one region (poisoned with NaN between phases, so nothing can survive from
//    one phase to the next) a policy generates, a colocated reference computes logprobs, the
//    policy trains, the reference runs again and the policy generates again: tokens,
//    logprobs, the trained parameters and Adam moments are bit for bit those of separately
//    allocated models, generator and KV pool; the KV blocks lie inside the training
//    activations, so the sharing is real; the region grows (and moves) between the
//    reference's set-up and the policy's, as a worker's does;
//  - invariants: a generator used outside its generation phase (e.g. after a train phase),
//    a model run while another holds the region, training on the inference layout, nested
//    phases, growing during a phase and undersized buffers are errors naming the cause.
#include <math.h>
#include <stdio.h>

#include "engine/arena.h"
#include "engine/checkpoint.h"
#include "engine/heads.h"
#include "engine/train.h"
#include "tests/engine/arena_formula.h"
#include "tests/backend_test.h"
#include "tests/engine/model_util.h"
#include "tests/test.h"

// The quickstart's model (examples/arith/init/config.json) and recipe: micro_batch_tokens
// 2048, a policy generating with the controller's KV budget (at least 16384 tokens).
static const char QS_CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 274,"
    " \"hidden_size\": 128, \"intermediate_size\": 384, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true,"
    " \"eos_token_id\": [2, 0], \"pad_token_id\": 0, \"torch_dtype\": \"float32\"}";

static double mib(size_t bytes) { return (double)bytes / (1 << 20); }

// Both activation dtypes: fp32, and bf16 with its fp32 regions (residual stream, statistics,
// logits) where the layout keeps them.
static void check_sizes(const char *name, const tr_model_config *cfg, int32_t T,
                        int64_t kv_tokens, int32_t bs) {
    for (int d = 0; d < 2; d++) {
        tr_dt act = d ? TR_BF16 : TR_F32;
        size_t A = tr_dt_size(act);
        tr_model_opts mo = {.max_tokens = T, .training = true};
        tr_gen_opts go = {.kv_tokens = kv_tokens, .block_size = bs};
        size_t train = af_acts_bytes(cfg, (size_t)T, true, A);
        size_t fwd = af_acts_bytes(cfg, (size_t)T, false, A);
        size_t kv = af_kv_bytes(cfg, (size_t)kv_tokens, (size_t)bs, A);
        CHECKF(tr_model_arena_bytes(cfg, &mo, act) == train, "%s T=%d %s: training activations "
               "%zu, formula %zu", name, T, tr_dt_name(act), tr_model_arena_bytes(cfg, &mo, act),
               train);
        mo.training = false;
        CHECKF(tr_model_arena_bytes(cfg, &mo, act) == fwd, "%s T=%d %s: inference activations "
               "%zu, formula %zu", name, T, tr_dt_name(act), tr_model_arena_bytes(cfg, &mo, act),
               fwd);
        CHECK(tr_kvcache_pool_bytes(cfg, bs, kv_tokens, act) == kv);
        CHECK(tr_generator_kv_bytes(cfg, &go, act) == kv);
        mo.training = true;
        tr_arena_need n;
        tr_arena_need_init(&n, cfg, &mo, &go, act);
        CHECK(n.train == train && n.forward == fwd && n.kv == kv);
        CHECK(tr_arena_need_bytes(&n) == af_need(train, fwd, kv));
        CHECK(tr_arena_separate_bytes(&n) == train + kv);
        mo.training = false;
        tr_arena_need_init(&n, cfg, &mo, NULL, act);
        CHECK(n.train == 0 && n.kv == 0 && tr_arena_need_bytes(&n) == fwd);
    }
}

// One tensor-parallel rank's activations, with and without sequence parallelism, against
// the formula; sequence parallelism must take less for training (it shards the residual
// stream and the norms' saved rows) and the saving is printed.
static void check_tp_sizes(const char *name, const tr_model_config *cfg, int32_t T, int32_t tp) {
    for (int d = 0; d < 2; d++) {
        tr_dt act = d ? TR_BF16 : TR_F32;
        size_t bytes[2][2];   // [sp][training]
        for (int sp = 0; sp < 2; sp++)
            for (int train = 0; train < 2; train++) {
                tr_model_opts mo = {.max_tokens = T, .training = train, .tp_size = tp,
                                    .tp_rank = tp - 1, .sequence_parallel = sp};
                tr_tp shape;
                tr_err err = {0};
                CHECK(tr_tp_init(&shape, cfg, tp, tp - 1, &err) == 0);
                tr_model_config local = tr_tp_local_config(cfg, &shape);
                size_t want = af_acts_bytes_tp(&local, (size_t)shape.vocab, (size_t)T, train,
                                               tr_dt_size(act), (size_t)tp, sp);
                bytes[sp][train] = tr_model_arena_bytes(cfg, &mo, act);
                CHECKF(bytes[sp][train] == want, "%s T=%d tp %d%s %s %s: activations %zu, formula "
                       "%zu", name, T, tp, sp ? " sp" : "", tr_dt_name(act),
                       train ? "training" : "inference", bytes[sp][train], want);
            }
        CHECKF(bytes[1][1] < bytes[0][1], "%s T=%d tp %d %s: sequence parallelism takes %zu bytes "
               "to train, %zu without", name, T, tp, tr_dt_name(act), bytes[1][1], bytes[0][1]);
        if (T >= 256)
            printf("  %s T=%d tp %d %s: training activations per rank %.2f MiB, %.2f MiB with "
                   "sequence parallelism\n", name, T, tp, tr_dt_name(act), mib(bytes[0][1]),
                   mib(bytes[1][1]));
    }
}

static void test_sizing(void) {
    printf("sizing against the documented formulas\n");
    const char *names[] = {"qwen2", "llama3", "value_llama3", "score_qwen2", "qwen3"};
    for (int i = 0; i < 5; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/models/%s", names[i]);
        tr_model_config cfg;
        tr_err err = {0};
        CHECKF(tr_checkpoint_load_config(tr_test_src(dir), &cfg, &err) == 0, "%s", err.msg);
        check_sizes(names[i], &cfg, 1, 1, 16);
        check_sizes(names[i], &cfg, 37, 100, 4);
        check_sizes(names[i], &cfg, 256, 16384, 16);
        for (int32_t tp = 2; tp <= 4; tp += 2) {
            check_tp_sizes(names[i], &cfg, 37, tp);   // rows tp does not divide
            check_tp_sizes(names[i], &cfg, 256, tp);
        }
    }
    tr_model_config qs;
    tr_err err = {0};
    CHECKF(tr_config_parse(QS_CONFIG, sizeof QS_CONFIG - 1, "quickstart", &qs, &err) == 0, "%s",
           err.msg);
    check_sizes("quickstart", &qs, 2048, 16384, 16);
    check_tp_sizes("quickstart", &qs, 2048, 2);
    // The quickstart's worker: policy (training, generating) alone, and with a colocated
    // reference (kl on), the region against separate buffers.
    tr_model_opts mo = {.max_tokens = 2048, .training = true}, ro = {.max_tokens = 2048};
    tr_gen_opts go = {.kv_tokens = 16384, .block_size = 16, .max_seqs = 64};
    tr_arena_need pol, ref;
    tr_arena_need_init(&pol, &qs, &mo, &go, TR_F32);
    tr_arena_need_init(&ref, &qs, &ro, NULL, TR_F32);
    size_t region = tr_arena_need_bytes(&pol);
    if (tr_arena_need_bytes(&ref) > region) region = tr_arena_need_bytes(&ref);
    size_t sep1 = tr_arena_separate_bytes(&pol), sep2 = sep1 + tr_arena_separate_bytes(&ref);
    printf("  quickstart (2048 tokens, 16384 KV tokens): train %.2f MiB, forward %.2f MiB, "
           "KV %.2f MiB\n", mib(pol.train), mib(pol.forward), mib(pol.kv));
    printf("  region %.2f MiB (%zu bytes); separate: policy %.2f MiB, policy + reference "
           "%.2f MiB\n", mib(region), region, mib(sep1), mib(sep2));
    CHECK(region == af_need(pol.train, pol.forward, pol.kv) && region < sep1 && sep1 < sep2);
}

// ---- phases on one region against separate allocations ----

enum { T_MAX = 64, N_PROMPT = 3, N_SAMPLE = 2, N_OUT = N_PROMPT * N_SAMPLE, MAX_NEW = 10 };

typedef struct prompts {
    int32_t ids[N_PROMPT][24];
    int32_t lens[N_PROMPT];
    tr_gen_request reqs[N_PROMPT];
} prompts;

static void make_requests(prompts *p, const tr_model *m, uint64_t seed) {
    static const int32_t L[N_PROMPT] = {5, 13, 20};
    for (int32_t i = 0; i < N_PROMPT; i++) {
        p->lens[i] = L[i];
        for (int32_t t = 0; t < L[i]; t++)
            p->ids[i][t] = (7 + 31 * i + 17 * t * t) % m->cfg.vocab_size;
        p->reqs[i] = (tr_gen_request){.prompt = p->ids[i], .n_prompt = L[i],
                                      .n_samples = N_SAMPLE, .sampling = {1.0f, 0, 1.0f},
                                      .seed = seed + (uint64_t)i, .stop_ids = m->cfg.eos_token_ids,
                                      .n_stop = m->cfg.n_eos, .max_new_tokens = MAX_NEW};
    }
}

static bool same_outputs(const tr_gen_output *a, const tr_gen_output *b, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (a[i].n_tokens != b[i].n_tokens || a[i].finish != b[i].finish ||
            memcmp(a[i].tokens, b[i].tokens, (size_t)a[i].n_tokens * sizeof(int32_t)) != 0 ||
            memcmp(a[i].logprobs, b[i].logprobs, (size_t)a[i].n_tokens * sizeof(float)) != 0)
            return false;
    return true;
}

// prompt + response of every output as documents, packed into micro-batches of <= T_MAX.
typedef struct batches {
    packed_batch pb[N_OUT];
    tr_micro_batch mbs[N_OUT];
    int32_t n;
} batches;

static void make_batches(batches *b, const prompts *p, const tr_gen_output *outs) {
    int32_t ids[T_MAX], lens[N_OUT], k = 0, t = 0;
    b->n = 0;
    for (int32_t i = 0; i <= N_OUT; i++) {
        int32_t len = i < N_OUT ? p->lens[outs[i].request] + outs[i].n_tokens : 0;
        if (i == N_OUT || t + len > T_MAX) {
            pack_batch(&b->pb[b->n], ids, lens, k);
            b->mbs[b->n] = (tr_micro_batch){.ids = b->pb[b->n].ids, .docs = b->pb[b->n].docs,
                                            .targets = b->pb[b->n].targets};
            b->n++;
            k = t = 0;
        }
        if (i == N_OUT) break;
        const tr_gen_output *o = &outs[i];
        memcpy(ids + t, p->ids[o->request], (size_t)p->lens[o->request] * sizeof(int32_t));
        memcpy(ids + t + p->lens[o->request], o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
        lens[k++] = len;
        t += len;
    }
}

// Logprobs of every micro-batch's tokens under m (the reference's op).
static int ref_logprobs(tr_model *m, const batches *b, float *lp, tr_err *err) {
    for (int32_t i = 0; i < b->n; i++) {
        if (tr_model_forward(m, b->mbs[i].ids, &b->mbs[i].docs, err) != 0 ||
            tr_lm_head_forward(m, b->mbs[i].targets, lp + i * T_MAX, NULL, err) != 0)
            return -1;
    }
    return 0;
}

// What another phase leaves behind: every float of the region NaN (NaN in bf16 too: the
// pattern 0x7fc0 repeats in both halves of each fp32 NaN's bits).
static void poison(tr_arena *a) { a->be->ops->fill(a->be, a->base, NAN, a->bytes / sizeof(float)); }

typedef struct roles {
    tr_model pol, ref;
    tr_trainer tr;
    tr_generator gen;
} roles;

static const tr_optim_cfg OPT = {.lr = 1e-2, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                                 .weight_decay = 0.1f, .max_grad_norm = 1.0f,
                                 .schedule = {.kind = TR_LR_CONSTANT}};

// kv_tokens picks which side of the rule decides the region: training activations (small
// pool) or generation activations + KV blocks (large pool).
static void test_phases(const char *name, int64_t kv_tokens, tr_backend *be) {
    printf("%s: generate, reference, train, reference, generate on one region\n", name);
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", name);
    const char *path = tr_test_src(dir);
    tr_err err = {0};
    tr_model_config cfg;
    if (tr_checkpoint_load_config(path, &cfg, &err) != 0) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    tr_model_opts po = {.max_tokens = T_MAX, .training = true}, ro = {.max_tokens = T_MAX};
    tr_gen_opts go = {.kv_tokens = kv_tokens, .block_size = 4, .max_seqs = 8};

    // Separately allocated: each model its own activations, the generator its own pool.
    roles s, w;
    memset(&s, 0, sizeof s);
    memset(&w, 0, sizeof w);
    int rc = tr_model_load(&s.pol, path, be, &po, &err);
    if (!rc) rc = tr_model_load(&s.ref, path, be, &ro, &err);
    if (!rc) rc = tr_trainer_init(&s.tr, &s.pol, &OPT, 9, &err);
    if (!rc) rc = tr_generator_init(&s.gen, &s.pol, &go, &err);
    CHECKF(rc == 0, "separate: %s", err.msg);

    // One region, sized by the rule for the policy and the reference, grown as a worker
    // grows it: the reference is set up first, then the region is replaced by one that fits
    // the policy (the reference's views are laid out again when its phases begin).
    tr_arena_need np, nr;
    tr_arena_need_init(&np, &cfg, &po, &go, be->act);
    tr_arena_need_init(&nr, &cfg, &ro, NULL, be->act);
    tr_arena a;
    CHECKF(tr_arena_init(&a, be, tr_arena_need_bytes(&nr), &err) == 0, "%s", err.msg);
    ro.acts = a.base;
    ro.acts_bytes = a.bytes;
    if (!rc) rc = tr_model_load(&w.ref, path, be, &ro, &err);
    if (!rc) tr_arena_adopt(&a, &w.ref);
    CHECKF(tr_arena_reserve(&a, tr_arena_need_bytes(&np), &err) == 0, "%s", err.msg);
    CHECK(a.bytes == tr_arena_need_bytes(&np) && a.bytes > tr_arena_need_bytes(&nr));
    po.acts = a.base;
    po.acts_bytes = a.bytes;
    if (!rc) rc = tr_model_load(&w.pol, path, be, &po, &err);
    if (!rc) {
        tr_arena_adopt(&a, &w.pol);
        size_t off = tr_arena_kv_offset(&w.pol);
        go.kv_buf = (char *)a.base + off;
        go.kv_buf_bytes = a.bytes - off;
        rc = tr_generator_init(&w.gen, &w.pol, &go, &err);
    }
    if (!rc) rc = tr_trainer_init(&w.tr, &w.pol, &OPT, 9, &err);
    CHECKF(rc == 0, "shared: %s", err.msg);
    if (rc) goto out;
    // The KV blocks sit inside what training uses: the memory really is shared.
    size_t off = tr_arena_kv_offset(&w.pol);
    CHECK(w.gen.cache.k == (char *)a.base + off && off < np.train && off + np.kv <= a.bytes);
    CHECK(a.bytes < tr_arena_separate_bytes(&np) + tr_arena_separate_bytes(&nr));
    printf("  region %zu bytes = max(train %zu, forward %zu + kv %zu); separate %zu\n",
           a.bytes, np.train, np.forward, np.kv,
           tr_arena_separate_bytes(&np) + tr_arena_separate_bytes(&nr));

    prompts p;
    make_requests(&p, &s.pol, 100);
    tr_gen_output so[N_OUT], wo[N_OUT];
    // Generation.
    CHECKF(tr_generate(&s.gen, p.reqs, N_PROMPT, so, &err) == 0, "%s", err.msg);
    poison(&a);
    CHECKF(tr_arena_begin_generate(&a, &w.gen, &err) == 0, "%s", err.msg);
    CHECKF(tr_generate(&w.gen, p.reqs, N_PROMPT, wo, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    CHECKF(same_outputs(so, wo, N_OUT), "%s: first generation differs on the shared region", name);
    // Reference logprobs of the rollouts.
    batches b;
    make_batches(&b, &p, so);
    CHECK(b.n >= 2);
    float slp[N_OUT * T_MAX] = {0}, wlp[N_OUT * T_MAX] = {0};
    CHECKF(ref_logprobs(&s.ref, &b, slp, &err) == 0, "%s", err.msg);
    poison(&a);
    CHECKF(tr_arena_begin_forward(&a, &w.ref, &err) == 0, "%s", err.msg);
    CHECKF(ref_logprobs(&w.ref, &b, wlp, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    CHECK(memcmp(slp, wlp, sizeof slp) == 0);
    // One training step over every rollout (cross entropy, several micro-batches).
    tr_step_args sa = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
    tr_step_result sr, wr;
    CHECKF(tr_train_step(&s.tr, b.mbs, b.n, &sa, &sr, &err) == 0, "%s", err.msg);
    poison(&a);
    CHECKF(tr_arena_begin_train(&a, &w.pol, &err) == 0, "%s", err.msg);
    CHECKF(tr_train_step(&w.tr, b.mbs, b.n, &sa, &wr, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    size_t np_bytes = s.pol.layout.total * sizeof(float);
    CHECK(sr.loss == wr.loss && sr.grad_norm == wr.grad_norm && sr.grad_norm > 0);
    CHECK(et_same(be, s.pol.params, w.pol.params, np_bytes));
    CHECK(et_same(be, s.pol.grads, w.pol.grads, np_bytes));
    CHECK(et_same(be, s.tr.adam_m, w.tr.adam_m, np_bytes) &&
          et_same(be, s.tr.adam_v, w.tr.adam_v, np_bytes));
    printf("  train step: loss %.6f, grad norm %.6f, parameters and moments bit for bit\n",
           sr.loss, sr.grad_norm);
    // The reference again (its weights did not move), then the trained policy generates.
    memset(wlp, 0, sizeof wlp);
    poison(&a);
    CHECKF(tr_arena_begin_forward(&a, &w.ref, &err) == 0, "%s", err.msg);
    CHECKF(ref_logprobs(&w.ref, &b, wlp, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    CHECK(memcmp(slp, wlp, sizeof slp) == 0);
    tr_gen_outputs_free(so, N_OUT);
    tr_gen_outputs_free(wo, N_OUT);
    CHECKF(tr_generate(&s.gen, p.reqs, N_PROMPT, so, &err) == 0, "%s", err.msg);
    poison(&a);
    CHECKF(tr_arena_begin_generate(&a, &w.gen, &err) == 0, "%s", err.msg);
    CHECKF(tr_generate(&w.gen, p.reqs, N_PROMPT, wo, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    CHECKF(same_outputs(so, wo, N_OUT), "%s: generation after training differs", name);
    CHECK(w.gen.cache.n_free == w.gen.cache.n_blocks);
    // The update changed what the policy says about its first rollouts (a real step).
    float lp2[N_OUT * T_MAX] = {0};
    CHECKF(tr_arena_begin_forward(&a, &w.pol, &err) == 0, "%s", err.msg);
    CHECKF(ref_logprobs(&w.pol, &b, lp2, &err) == 0, "%s", err.msg);
    tr_arena_end(&a);
    CHECK(memcmp(slp, lp2, sizeof slp) != 0);
    tr_gen_outputs_free(so, N_OUT);
    tr_gen_outputs_free(wo, N_OUT);

    // ---- invariants ----
    // Outside any phase, and after a train phase without a new generation phase.
    CHECK(tr_generate(&w.gen, p.reqs, N_PROMPT, wo, &err) != 0 && strstr(err.msg, "phase idle"));
    CHECKF(tr_arena_begin_train(&a, &w.pol, &err) == 0, "%s", err.msg);
    CHECK(tr_generate(&w.gen, p.reqs, N_PROMPT, wo, &err) != 0 && strstr(err.msg, "phase train"));
    // The reference cannot run while the policy holds the region, nor a phase nest.
    CHECK(tr_model_forward(&w.ref, b.mbs[0].ids, &b.mbs[0].docs, &err) != 0 &&
          strstr(err.msg, "lent to another holder"));
    CHECK(tr_arena_begin_forward(&a, &w.ref, &err) != 0 &&
          strstr(err.msg, "while a train phase holds"));
    CHECK(tr_arena_reserve(&a, a.bytes + 1, &err) != 0 && strstr(err.msg, "train phase"));
    tr_arena_end(&a);
    CHECK(tr_model_forward(&w.pol, b.mbs[0].ids, &b.mbs[0].docs, &err) != 0 &&
          strstr(err.msg, "idle"));
    // Training on the inference layout would alias every layer's activations.
    CHECKF(tr_arena_begin_forward(&a, &w.pol, &err) == 0, "%s", err.msg);
    CHECK(tr_train_step(&w.tr, b.mbs, b.n, &sa, &wr, &err) != 0 &&
          strstr(err.msg, "laid out for inference"));
    tr_arena_end(&a);
    CHECK(tr_arena_begin_train(&a, &w.ref, &err) != 0 && strstr(err.msg, "set up for training"));
    // A region too small for the phase.
    tr_arena small;
    CHECK(tr_arena_init(&small, be, np.forward, &err) == 0);
    CHECK(tr_arena_begin_train(&small, &w.pol, &err) != 0 && strstr(err.msg, "needs"));
    CHECK(tr_arena_begin_generate(&small, &w.gen, &err) != 0 && strstr(err.msg, "needs"));
    CHECK(small.phase == TR_PHASE_IDLE);
    tr_arena_free(&small);
    // Undersized or misaligned caller buffers; a model owning its arena is not re-laid.
    tr_model m2;
    tr_model_opts bad = {.max_tokens = T_MAX, .training = true, .acts = a.base,
                         .acts_bytes = np.train - 64};
    CHECK(tr_model_init(&m2, &cfg, be, &bad, &err) != 0 && strstr(err.msg, "need"));
    bad.acts = (char *)a.base + 4;
    bad.acts_bytes = a.bytes - 4;
    CHECK(tr_model_init(&m2, &cfg, be, &bad, &err) != 0 && strstr(err.msg, "misaligned"));
    CHECK(tr_model_bind_acts(&s.pol, a.base, a.bytes, true, &err) != 0 &&
          strstr(err.msg, "its own"));
    tr_kvcache c;
    CHECK(tr_kvcache_init_in(&c, be, &cfg, 4, kv_tokens, a.base, np.kv - 1, &err) != 0 &&
          strstr(err.msg, "need"));
out:
    tr_generator_free(&w.gen);
    tr_trainer_free(&w.tr);
    tr_model_free(&w.pol);
    tr_model_free(&w.ref);
    tr_arena_free(&a);
    tr_generator_free(&s.gen);
    tr_trainer_free(&s.tr);
    tr_model_free(&s.pol);
    tr_model_free(&s.ref);
}

int main(void) {
    tr_backend be;
    et_backend(&be, 2);
    test_sizing();
    test_phases("qwen2", 256, &be);
    test_phases("llama3", 4096, &be);
    tr_backend_free(&be);
    return tr_test_summary("test_arena");
}
