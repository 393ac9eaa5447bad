// The model in mixed precision (bf16 weights and activations over fp32 masters; the CPU
// backend's emulated mode, or CUDA with TROUPE_BACKEND=cuda):
//  - token logprobs of the LM fixtures against an independent torch implementation of the
//    same rounding points (tools/make_bf16_fixtures.py: fp32 arithmetic from bf16 inputs, one
//    rounding per activation output): within 0.01 at most and 1e-3 on average (on the CPU
//    the two agree to fp32 rounding of the log-softmax; a GPU's other summation order may
//    flip a rare bf16 rounding), where the fp32 engine is 0.01-0.02 away on average, so the
//    bound sees whether bf16 rounds where it should. The distance to transformers' own bf16 autocast is measured and printed: autocast
//    rounds elsewhere (fp32 embedding and norm weights, bf16 RoPE and SwiGLU steps, o_proj and
//    down_proj outputs), and on these random-weight models one rounding point alone moves its
//    logprobs by ~0.01 on average, so that distance is of the size of bf16 itself;
//  - the layout of a bf16 model: fp32 masters and a working copy for a model that trains, the
//    working copy alone for one that does not (loaded raw: the masters rounded), a bf16
//    checkpoint that reloads to the same copy;
//  - 200 steps of SFT on a small model in bf16 end within 2% of the same run's loss in fp32,
//    on data with a known entropy floor (a random first-order Markov chain), so the loss is
//    far from 0 and 2% is a real bound.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/generate.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "engine/pack.h"
#include "engine/rng.h"
#include "engine/train.h"
#include "tests/backend_test.h"
#include "tests/engine/model_util.h"
#include "tests/test.h"

// Token logprobs of the fixture batch on backend be against tensor `key` of the fixture's
// bf16_autocast.safetensors. Returns the max abs error; *mean gets the mean.
static double fixture_logprobs(tr_backend *be, const char *name, const char *key, double *mean) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/models/%s", name);
    tr_err err = {0};
    tr_model m;
    tr_model_opts opts = {.max_tokens = 64};
    if (tr_model_load(&m, tr_test_src(path), be, &opts, &err) != 0) {
        CHECKF(0, "%s: %s", name, err.msg);
        return INFINITY;
    }
    tr_st_file ex, want_f;
    snprintf(path, sizeof path, "tests/fixtures/models/%s/expected.safetensors", name);
    int rc = tr_st_open(&ex, tr_test_src(path), &err);
    snprintf(path, sizeof path, "tests/fixtures/models/%s/bf16_autocast.safetensors", name);
    if (!rc) rc = tr_st_open(&want_f, tr_test_src(path), &err);
    CHECKF(rc == 0, "%s: %s", name, err.msg);
    double worst = INFINITY;
    if (rc == 0) {
        size_t n_ids = 0, n_seq = 0, n_want = 0;
        int32_t *ids = st_ints(&ex, "input_ids", &n_ids);
        int32_t *lens = st_ints(&ex, "seq_lens", &n_seq);
        float *want = st_floats(&want_f, key, &n_want);
        static packed_batch b;
        pack_batch(&b, ids, lens, (int32_t)n_seq);
        float got[512];
        rc = tr_model_forward(&m, b.ids, &b.docs, &err);
        if (!rc) rc = tr_lm_head_forward(&m, b.targets, got, NULL, &err);
        CHECKF(rc == 0 && want && n_want == (size_t)b.n_tokens, "%s %s: %s", name, key, err.msg);
        if (rc == 0 && want) {
            worst = 0;
            double sum = 0;
            for (int32_t t = 0; t < b.n_tokens; t++) {
                double e = fabs((double)got[t] - want[t]);
                worst = e > worst ? e : worst;
                sum += e;
            }
            *mean = sum / b.n_tokens;
        }
        free(ids);
        free(lens);
        free(want);
        tr_st_close(&want_f);
        tr_st_close(&ex);
    }
    tr_model_free(&m);
    return worst;
}

static void test_rounding_points(tr_backend *bf, tr_backend *fp) {
    const char *names[] = {"llama3", "qwen2", "llama_bias", "qwen3"};
    printf("logprobs against troupe's rounding points in torch (max <= 0.01, mean <= 1e-3), and\n"
           "against transformers' bf16 autocast (measured):\n");
    for (int i = 0; i < 4; i++) {
        double mean = 0, mean32 = 0, mean_ac = 0;
        double worst = fixture_logprobs(bf, names[i], "troupe_bf16", &mean);
        double worst32 = fixture_logprobs(fp, names[i], "troupe_bf16", &mean32);
        double worst_ac = fixture_logprobs(bf, names[i], "logprobs", &mean_ac);
        printf("  %-10s bf16: max %.3g mean %.3g (fp32 engine: max %.3g mean %.3g); "
               "autocast: max %.3g mean %.3g\n", names[i], worst, mean, worst32, mean32,
               worst_ac, mean_ac);
        CHECKF(worst <= 0.01 && mean <= 1e-3, "%s: bf16 logprobs max %.3g mean %.3g", names[i],
               worst, mean);
        // The bound discriminates: fp32 arithmetic throughout is well outside it.
        CHECKF(mean32 > 4e-3, "%s: the fp32 engine is within %.3g of the bf16 reference",
               names[i], mean32);
    }
}

// A bf16 model that trains holds fp32 masters and a bf16 working copy; one that does not holds
// the copy alone, whose read-back is the masters rounded to bf16.
static void test_layout(tr_backend *bf) {
    tr_err err = {0};
    tr_model t, f;
    tr_model_opts to = {.max_tokens = 16, .training = true}, fo = {.max_tokens = 16};
    const char *dir = tr_test_src("tests/fixtures/models/qwen2");
    CHECKF(tr_model_load(&t, dir, bf, &to, &err) == 0, "%s", err.msg);
    CHECKF(tr_model_load(&f, dir, bf, &fo, &err) == 0, "%s", err.msg);
    CHECK(t.params && t.work && t.work != (void *)t.params && t.wt == TR_BF16);
    CHECK(!f.params && f.work && !f.grads);
    size_t n = t.layout.total;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    CHECK(a && b && tr_model_read_params(&t, a, &err) == 0 && tr_model_read_params(&f, b, &err) == 0);
    size_t exact = 0, rounded = 0;
    for (size_t i = 0; i < n; i++) {
        // b[i] is a[i] rounded to nearest even bf16 (no NaNs in weights).
        uint32_t u;
        memcpy(&u, &a[i], 4);
        u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
        float r;
        memcpy(&r, &u, 4);
        exact += b[i] == a[i];
        rounded += b[i] == r;
    }
    CHECKF(rounded == n, "frozen bf16 copy: %zu of %zu values are the masters rounded", rounded, n);
    CHECK(exact < n);   // the fixture's weights are not all bf16 values: the copy is narrower
    printf("layout: trained model fp32 masters + bf16 copy, frozen model bf16 copy only; "
           "%zu values, %zu already exact in bf16\n", n, exact);
    // Saved in bf16 (the option; masters are the default) and loaded raw into a frozen model:
    // the same working copy, and the file holds exactly it.
    char out[600];
    snprintf(out, sizeof out, "%s/bf16_ckpt", tr_test_tmpdir());
    tr_ckpt_save_opts so = {.dtype = TR_ST_BF16};
    tr_model g;
    CHECKF(tr_model_save(&t, out, &so, &err) == 0, "%s", err.msg);
    CHECKF(tr_model_load(&g, out, bf, &fo, &err) == 0, "%s", err.msg);
    CHECK(tr_model_read_params(&g, a, &err) == 0 && memcmp(a, b, n * sizeof *a) == 0);
    tr_model_free(&g);
    free(a);
    free(b);
    tr_model_free(&t);
    tr_model_free(&f);
}

// ---- 200 SFT steps, bf16 against fp32 ----

enum { V = 48, SEQ = 32, BATCH = 4, STEPS = 200 };

static const char SMALL[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 48,"
    " \"hidden_size\": 32, \"intermediate_size\": 64, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 128,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"tie_word_embeddings\": true}";

// A random first-order chain: each token has 4 successors with probabilities 0.4, 0.3, 0.2,
// 0.1, so the best possible loss is their entropy, 1.2799 nats.
typedef struct chain {
    int32_t next[V][4];
} chain;

static int32_t draw(const chain *c, int32_t tok, tr_rng *r) {
    double u = tr_rng_uniform(r);
    int j = u < 0.4 ? 0 : u < 0.7 ? 1 : u < 0.9 ? 2 : 3;
    return c->next[tok][j];
}

static void batch(const chain *c, tr_rng *r, packed_batch *b) {
    int32_t ids[BATCH * SEQ], lens[BATCH];
    for (int32_t s = 0; s < BATCH; s++) {
        lens[s] = SEQ;
        int32_t tok = (int32_t)(tr_rng_uniform(r) * V);
        for (int32_t i = 0; i < SEQ; i++) {
            ids[s * SEQ + i] = tok;
            tok = draw(c, tok, r);
        }
    }
    pack_batch(b, ids, lens, BATCH);
}

// Mean loss of the last 20 steps of a 200-step run on backend be.
static double sft_run(tr_backend *be, const chain *c) {
    tr_model_config cfg;
    tr_err err = {0};
    tr_model m;
    tr_trainer tr;
    tr_model_opts mo = {.max_tokens = BATCH * SEQ, .training = true};
    tr_optim_cfg opt = {.lr = 3e-3, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = 0.01f, .max_grad_norm = 1.0f,
                        .schedule = {.kind = TR_LR_CONSTANT}};
    if (tr_config_parse(SMALL, sizeof SMALL - 1, "small", &cfg, &err) != 0 ||
        tr_model_init(&m, &cfg, be, &mo, &err) != 0 ||
        tr_model_init_weights(&m, 7, 0.02f, &err) != 0 || tr_trainer_init(&tr, &m, &opt, 1, &err) != 0) {
        CHECKF(0, "sft set-up: %s", err.msg);
        return NAN;
    }
    tr_rng r;
    tr_rng_init(&r, 11);
    static packed_batch b;
    double tail = 0;
    for (int32_t s = 0; s < STEPS; s++) {
        batch(c, &r, &b);
        tr_micro_batch mb = {.ids = b.ids, .docs = b.docs, .targets = b.targets};
        tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
        tr_step_result res;
        if (tr_train_step(&tr, &mb, 1, &args, &res, &err) != 0) {
            CHECKF(0, "step %d: %s", s, err.msg);
            tail = NAN;
            break;
        }
        if (s >= STEPS - 20) tail += res.loss / 20;
    }
    tr_trainer_free(&tr);
    tr_model_free(&m);
    return tail;
}

static void test_sft(tr_backend *bf, tr_backend *fp) {
    chain c;
    tr_rng r;
    tr_rng_init(&r, 5);
    for (int32_t t = 0; t < V; t++)
        for (int j = 0; j < 4; j++) c.next[t][j] = (int32_t)(tr_rng_uniform(&r) * V);
    double l32 = sft_run(fp, &c), l16 = sft_run(bf, &c);
    double rel = fabs(l16 - l32) / l32;
    printf("SFT %d steps: loss fp32 %.6f, bf16 %.6f (%.3f%% apart; the chain's entropy %.4f)\n",
           STEPS, l32, l16, 100 * rel, 1.2799);
    CHECKF(l16 != l32, "bf16 and fp32 runs gave the same loss %.9g: bf16 did not run", l16);
    CHECKF(rel <= 0.02, "bf16 SFT loss %.4f is %.2f%% from fp32's %.4f", l16, 100 * rel, l32);
    // Both learned the chain: well under the uniform loss ln 48 = 3.87.
    CHECKF(l32 < 2.0 && l16 < 2.0, "losses %.4f %.4f: nothing learned", l32, l16);
}

// The ns samples of each of the nr prompts (outs[i * ns + k]) in one forward per prompt,
// sharing it (engine/pack.h), against generation's logprobs: the largest difference (NAN
// when a forward failed); *bitwise counts the equal ones.
static double shared_vs_gen(tr_model *m, int32_t (*prompts)[20], const int32_t *L, const tr_gen_output *outs,
                            int32_t nr, int32_t ns, int64_t *bitwise) {
    tr_err err = {0};
    tr_pack pk;
    if (tr_pack_init(&pk, m->max_tokens, &err) != 0) return NAN;
    double worst = 0;
    *bitwise = 0;
    for (int32_t i = 0; i < nr; i++) {
        int32_t seq[128];
        float lp[128];
        tr_pack_clear(&pk);
        memcpy(seq, prompts[i], (size_t)L[i] * sizeof(int32_t));
        bool ok = L[i] >= 2 && tr_pack_add_prompt(&pk, seq, L[i]);
        for (int32_t k = 0; k < ns && ok; k++) {
            const tr_gen_output *o = &outs[i * ns + k];
            memcpy(seq + L[i], o->tokens, (size_t)o->n_tokens * sizeof(int32_t));
            ok = o->request == i && tr_pack_add_sharing(&pk, seq, L[i] + o->n_tokens, L[i]);
        }
        if (!ok || tr_model_forward(m, pk.ids, &pk.docs, &err) != 0 ||
            tr_lm_head_forward(m, pk.targets, lp, NULL, &err) != 0) {
            fprintf(stderr, "shared_vs_gen: prompt %d: %s\n", i, err.msg);
            worst = NAN;
            break;
        }
        for (int32_t k = 0; k < ns; k++) {
            const tr_gen_output *o = &outs[i * ns + k];
            for (int32_t t = 0; t < o->n_tokens; t++) {
                float x = lp[tr_pack_row(&pk, k, L[i] - 1 + t)];
                double d = fabs((double)x - (double)o->logprobs[t]);
                if (!(d <= worst)) worst = d;
                *bitwise += x == o->logprobs[t];
            }
        }
    }
    tr_pack_free(&pk);
    return worst;
}

// Generation's logprobs in bf16 against the training path's: decode passes of up to 8 rows
// (and 16-row prefill chunks) against one forward of each whole sequence. On a batch-invariant
// backend (the CPU; CUDA's bf16 products choosing their kernel without regard to T) they are
// the same bits, which is what lets an RL step take its old logprobs from the rollout.
// Otherwise the difference is printed: bf16 roundings of sums in other orders.
static void test_generation_logprobs(tr_backend *bf) {
    tr_model gen_m, train_m;
    tr_err err = {0};
    tr_model_opts go = {.max_tokens = 16}, to = {.max_tokens = 128};
    const char *path = tr_test_src("tests/fixtures/models/qwen2");
    if (tr_model_load(&gen_m, path, bf, &go, &err) != 0 || tr_model_load(&train_m, path, bf, &to, &err) != 0) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    enum { NR = 4, NS = 3 };
    static const int32_t L[NR] = {3, 9, 20, 13};
    int32_t prompts[NR][20];
    tr_gen_request reqs[NR];
    for (int32_t i = 0; i < NR; i++) {
        for (int32_t t = 0; t < L[i]; t++) prompts[i][t] = (5 + 29 * i + 13 * t * t) % gen_m.cfg.vocab_size;
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = L[i], .n_samples = NS,
                                   .sampling = {1.0f, 0, 1.0f}, .seed = 40 + (uint64_t)i,
                                   .max_new_tokens = 10 + i};
    }
    tr_gen_output outs[NR * NS];
    tr_gen_opts opts = {.kv_tokens = 512, .block_size = 4, .max_seqs = 8};
    tr_generator g;
    int rc = tr_generator_init(&g, &gen_m, &opts, &err);
    if (!rc) rc = tr_generate(&g, reqs, NR, outs, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc == 0) {
        double worst = 0;
        int64_t bitwise = 0, total = 0;
        for (int32_t i = 0; i < NR * NS; i++) {
            const tr_gen_output *o = &outs[i];
            double e = gen_vs_training(&train_m, prompts[o->request], L[o->request], o->tokens, o->logprobs,
                                       o->n_tokens, &bitwise);
            if (!(e <= worst)) worst = e;
            total += o->n_tokens;
        }
        printf("generation vs training logprobs in bf16 (%s, batch-invariant %d): max difference %.3g, "
               "%lld of %lld bitwise equal\n", bf->ops->name, bf->batch_invariant, worst, (long long)bitwise,
               (long long)total);
        if (bf->batch_invariant) CHECKF(worst == 0 && bitwise == total, "max difference %.3g", worst);
        else CHECKF(isfinite(worst), "max difference %.3g", worst);
        worst = shared_vs_gen(&train_m, prompts, L, outs, NR, NS, &bitwise);
        printf("  the samples of each prompt in one forward sharing it: max difference %.3g, "
               "%lld of %lld bitwise equal\n", worst, (long long)bitwise, (long long)total);
        if (bf->batch_invariant) CHECKF(worst == 0 && bitwise == total, "shared: max difference %.3g", worst);
        else CHECKF(isfinite(worst), "shared: max difference %.3g", worst);
        tr_gen_outputs_free(outs, NR * NS);
    }
    tr_generator_free(&g);
    tr_model_free(&gen_m);
    tr_model_free(&train_m);
}

int main(void) {
    tr_backend bf, fp;
    et_backend_in(&bf, 1, "bf16");
    et_backend_in(&fp, 1, "fp32");
    CHECK(bf.act == TR_BF16 && bf.wt == TR_BF16 && fp.act == TR_F32);
    test_layout(&bf);
    test_rounding_points(&bf, &fp);
    test_sft(&bf, &fp);
    test_generation_logprobs(&bf);
    tr_backend_free(&bf);
    tr_backend_free(&fp);
    return tr_test_summary("test_model_bf16");
}
