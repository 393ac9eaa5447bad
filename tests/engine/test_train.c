// The training step: learning-rate schedules against their published formulas; one batch
// split into 1, 2 or 3 micro-batches gives the same gradient and update (the loss is
// normalized over the step, not per micro-batch); loss weights, the per-token-gradient and
// callback loss modes agree with built-in cross entropy; clipping matches
// clip_grad_norm_; trainer state saved and loaded resumes bit for bit.
#include <stdio.h>

#include "engine/config.h"
#include "engine/file.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "engine/schedule.h"
#include "engine/train.h"
#include "engine/train_state.h"
#include "tests/engine/model_util.h"
#include "tests/backend_test.h"
#include "tests/test.h"

static void test_schedules(void) {
    const double lr = 3e-4;
    // Warmup ramp lr * step / warmup (transformers' schedulers), then constant.
    tr_lr_schedule c = {.kind = TR_LR_CONSTANT, .warmup_steps = 10};
    CHECK_NEAR(tr_lr_at(&c, lr, 0), 0.0, 1e-15);
    CHECK_NEAR(tr_lr_at(&c, lr, 5), 0.5 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&c, lr, 10), lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&c, lr, 100000), lr, 1e-15);
    // Linear: lr * (total - step) / (total - warmup), floored at min_lr_ratio * lr.
    tr_lr_schedule l = {.kind = TR_LR_LINEAR, .warmup_steps = 10, .total_steps = 110};
    CHECK_NEAR(tr_lr_at(&l, lr, 3), 0.3 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&l, lr, 60), 0.5 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&l, lr, 85), 0.25 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&l, lr, 110), 0.0, 1e-15);
    CHECK_NEAR(tr_lr_at(&l, lr, 500), 0.0, 1e-15);
    l.min_lr_ratio = 0.1;
    CHECK_NEAR(tr_lr_at(&l, lr, 60), (0.1 + 0.9 * 0.5) * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&l, lr, 500), 0.1 * lr, 1e-15);
    // Cosine: lr * (r + (1 - r) * 0.5 * (1 + cos(pi * progress))).
    tr_lr_schedule k = {.kind = TR_LR_COSINE, .warmup_steps = 10, .total_steps = 110};
    CHECK_NEAR(tr_lr_at(&k, lr, 10), lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&k, lr, 35), lr * 0.5 * (1 + cos(M_PI * 0.25)), 1e-15);
    CHECK_NEAR(tr_lr_at(&k, lr, 60), 0.5 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&k, lr, 110), 0.0, 1e-15);
    k.min_lr_ratio = 0.1;
    CHECK_NEAR(tr_lr_at(&k, lr, 35), lr * (0.1 + 0.9 * 0.8535533905932737), 1e-15);
    CHECK_NEAR(tr_lr_at(&k, lr, 110), 0.1 * lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&k, lr, 1000), 0.1 * lr, 1e-15);
    // No warmup: the first update runs at the peak.
    tr_lr_schedule n = {.kind = TR_LR_COSINE, .warmup_steps = 0, .total_steps = 4};
    CHECK_NEAR(tr_lr_at(&n, lr, 0), lr, 1e-15);
    CHECK_NEAR(tr_lr_at(&n, lr, 2), 0.5 * lr, 1e-15);
    // A warmup longer than the run is cut to the run: 3 updates ramp 0, 1/3, 2/3 of lr for
    // every kind (not 0, 1/5, 2/5 of a 5-step ramp that never ends), and the decay never starts.
    const enum tr_lr_kind kinds[] = {TR_LR_CONSTANT, TR_LR_LINEAR, TR_LR_COSINE};
    for (int i = 0; i < 3; i++) {
        tr_lr_schedule w = {.kind = kinds[i], .warmup_steps = 5, .total_steps = 3, .min_lr_ratio = 0.1};
        CHECK(tr_lr_warmup(&w) == 3);
        CHECK_NEAR(tr_lr_at(&w, lr, 0), 0.0, 1e-15);
        CHECK_NEAR(tr_lr_at(&w, lr, 1), lr / 3, 1e-15);
        CHECK_NEAR(tr_lr_at(&w, lr, 2), 2 * lr / 3, 1e-15);
        // Past the run: the peak for constant, the floor for a decay with no span left.
        CHECK_NEAR(tr_lr_at(&w, lr, 3), kinds[i] == TR_LR_CONSTANT ? lr : 0.1 * lr, 1e-15);
    }
    // Equal lengths behave the same; an unknown length (0, constant only) keeps the warmup.
    tr_lr_schedule e = {.kind = TR_LR_COSINE, .warmup_steps = 4, .total_steps = 4};
    CHECK(tr_lr_warmup(&e) == 4);
    CHECK_NEAR(tr_lr_at(&e, lr, 3), 0.75 * lr, 1e-15);
    tr_lr_schedule u = {.kind = TR_LR_CONSTANT, .warmup_steps = 10};
    CHECK(tr_lr_warmup(&u) == 10);
    enum tr_lr_kind kind;
    CHECK(tr_lr_kind_parse("cosine", &kind) == 0 && kind == TR_LR_COSINE);
    CHECK(tr_lr_kind_parse("cosin", &kind) == -1);
}

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"float32\"}";

static const int32_t IDS[] = {4, 9, 30, 1, 7, 7, 12, 3, 25, 18, 2, 11, 5, 29, 8, 16, 0, 21};
static const int32_t LENS[] = {7, 4, 5, 2};

typedef struct setup {
    tr_model_config cfg;
    tr_model model;
    tr_trainer tr;
} setup;

static int make(setup *s, tr_backend *be, const tr_optim_cfg *opt, uint64_t weight_seed) {
    tr_err err = {0};
    if (tr_config_parse(CONFIG, sizeof CONFIG - 1, "test config", &s->cfg, &err) != 0 ||
        tr_model_init(&s->model, &s->cfg, be, &(tr_model_opts){.max_tokens = 32, .training = true},
                      &err) != 0 ||
        tr_trainer_init(&s->tr, &s->model, opt, 5, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    if (tr_model_init_weights(&s->model, weight_seed, 0.3f, &err) != 0) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void destroy(setup *s) {
    tr_trainer_free(&s->tr);
    tr_model_free(&s->model);
}

// Splits the 4 documents of IDS into micro-batches of docs_per_mb[i] documents each.
static int32_t split(packed_batch *pb, tr_micro_batch *mbs, const int32_t *docs_per_mb,
                     int32_t n_mb) {
    int32_t t0 = 0, d0 = 0;
    for (int32_t i = 0; i < n_mb; i++) {
        int32_t nd = docs_per_mb[i], nt = 0;
        for (int32_t d = 0; d < nd; d++) nt += LENS[d0 + d];
        pack_batch(&pb[i], IDS + t0, LENS + d0, nd);
        mbs[i] = (tr_micro_batch){.ids = pb[i].ids, .docs = pb[i].docs, .targets = pb[i].targets};
        t0 += nt;
        d0 += nd;
    }
    return t0;
}

// eps is large enough that an update is a well-conditioned function of the gradient
// (|d update / d g| <= lr / (4 eps) = 2.5): with eps 1e-8, an element whose gradient is a
// rounding error away from 0 may move by up to 2 lr, whatever the implementation.
static const tr_optim_cfg OPT = {.lr = 1e-2, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-3f,
                                 .weight_decay = 0.05f, .decay_all = false,
                                 .max_grad_norm = 0.0f,
                                 .schedule = {.kind = TR_LR_COSINE, .warmup_steps = 0,
                                              .total_steps = 10, .min_lr_ratio = 0.1}};

static void test_accumulation(tr_backend *be) {
    const int32_t splits[3][4] = {{4}, {1, 3}, {2, 1, 1}};
    const int32_t n_mb[3] = {1, 2, 3};
    size_t n = 0;
    float *g_ref = NULL, *p_ref = NULL;
    double loss_ref = 0;
    for (int32_t k = 0; k < 3; k++) {
        setup s;
        if (make(&s, be, &OPT, 42) != 0) {
            CHECK(0);
            return;
        }
        packed_batch pb[4];
        tr_micro_batch mbs[4];
        split(pb, mbs, splits[k], n_mb[k]);
        tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
        tr_step_result res;
        tr_err err = {0};
        CHECKF(tr_train_step(&s.tr, mbs, n_mb[k], &args, &res, &err) == 0, "%s", err.msg);
        CHECK(res.weight_total == 18 - 4);  // every token but each document's last
        n = s.model.layout.total;
        if (k == 0) {
            g_ref = malloc(n * sizeof(float));
            p_ref = malloc(n * sizeof(float));
            et_get(be, g_ref, s.model.grads, n * sizeof(float));
            et_get(be, p_ref, s.model.params, n * sizeof(float));
            loss_ref = res.loss;
            CHECK_NEAR(res.lr, OPT.lr, 1e-15);
        } else {
            float *g = et_floats(be, s.model.grads, n), *p = et_floats(be, s.model.params, n);
            double eg = tr_test_rel_err(g, g_ref, n);
            double ep = tr_test_max_abs_err(p, p_ref, n);
            free(g);
            free(p);
            printf("accumulation over %d micro-batches: gradient rel diff %.3g, params %.3g\n",
                   n_mb[k], eg, ep);
            CHECK(eg <= 1e-5);
            CHECK(ep <= 1e-5);
            CHECK_NEAR(res.loss, loss_ref, 1e-6 * loss_ref);
        }
        destroy(&s);
    }
    free(g_ref);
    free(p_ref);
}

// A callback computing cross entropy by hand, with weights doubled on odd tokens.
static int ce_callback(void *user, int32_t index, const tr_micro_batch *mb, int32_t n,
                       const float *out, const float *entropy, float *loss, float *dout,
                       float *dentropy, tr_err *err) {
    (void)index;
    (void)mb;
    (void)dentropy;
    int *calls = user;
    (*calls)++;
    if (!entropy) return tr_errf(err, TR_EINVAL, "no entropy");
    for (int32_t i = 0; i < n; i++) {
        loss[i] = -out[i];
        dout[i] = -1.0f;
    }
    return 0;
}

static void test_loss_modes(tr_backend *be) {
    packed_batch pb[2];
    tr_micro_batch mbs[2];
    const int32_t per[2] = {2, 2};
    split(pb, mbs, per, 2);
    float w[2][32], dout[2][32];
    double wsum = 0;
    for (int32_t i = 0; i < 2; i++)
        for (int32_t t = 0; t < pb[i].n_tokens; t++) {
            w[i][t] = pb[i].targets[t] < 0 ? 0.0f : (t % 2 ? 2.0f : 0.5f);
            dout[i][t] = -1.0f;
            wsum += w[i][t];
        }
    float *p[4] = {0};
    double losses[4];
    size_t n = 0;
    for (int32_t mode = 0; mode < 4; mode++) {
        setup s;
        if (make(&s, be, &OPT, 43) != 0) {
            CHECK(0);
            return;
        }
        int calls = 0;
        tr_step_args args = {.norm = TR_NORM_TOKEN_MEAN};
        for (int32_t i = 0; i < 2; i++) mbs[i].weights = w[i];
        if (mode == 0) args.loss = TR_LOSS_CROSS_ENTROPY;
        if (mode == 1) {
            args.loss = TR_LOSS_GRADIENT;
            for (int32_t i = 0; i < 2; i++) mbs[i].dout = dout[i];
        }
        if (mode == 2) {
            args.loss = TR_LOSS_CALLBACK;
            args.loss_fn = ce_callback;
            args.user = &calls;
        }
        if (mode == 3) {  // weights pre-divided, summed as they are
            args.loss = TR_LOSS_CROSS_ENTROPY;
            args.norm = TR_NORM_SUM;
            for (int32_t i = 0; i < 2; i++)
                for (int32_t t = 0; t < pb[i].n_tokens; t++) w[i][t] /= (float)wsum;
        }
        tr_step_result res;
        tr_err err = {0};
        CHECKF(tr_train_step(&s.tr, mbs, 2, &args, &res, &err) == 0, "mode %d: %s", mode, err.msg);
        if (mode == 2) CHECK(calls == 2);
        if (mode != 3) CHECK_NEAR(res.weight_total, wsum, 1e-9);
        n = s.model.layout.total;
        p[mode] = et_floats(be, s.model.params, n);
        losses[mode] = res.loss;
        for (int32_t i = 0; i < 2; i++) mbs[i].dout = NULL;
        destroy(&s);
    }
    CHECK(tr_test_max_abs_err(p[1], p[0], n) == 0.0);
    CHECK(tr_test_max_abs_err(p[2], p[0], n) == 0.0);
    CHECK(tr_test_max_abs_err(p[3], p[0], n) <= 1e-6);
    CHECK(losses[1] == 0.0);
    CHECK_NEAR(losses[2], losses[0], 1e-12);
    CHECK_NEAR(losses[3], losses[0], 1e-6 * losses[0]);
    for (int32_t i = 0; i < 4; i++) free(p[i]);
    // The weighted loss really weighs: different from the unweighted one.
    setup s;
    if (make(&s, be, &OPT, 43) == 0) {
        for (int32_t i = 0; i < 2; i++) mbs[i].weights = NULL;
        tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
        tr_step_result res;
        tr_err err = {0};
        CHECK(tr_train_step(&s.tr, mbs, 2, &args, &res, &err) == 0);
        CHECK(fabs(res.loss - losses[0]) > 1e-4);
        destroy(&s);
    }
}

// Clipping: with max_grad_norm below the norm the update equals one with grads scaled by
// max / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_ scales them.
static void test_clipping(tr_backend *be) {
    packed_batch pb[1];
    tr_micro_batch mbs[1];
    const int32_t per[1] = {4};
    split(pb, mbs, per, 1);
    tr_optim_cfg opt = OPT;
    opt.max_grad_norm = 0.25f;
    setup a;
    if (make(&a, be, &opt, 44) != 0) return;
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_step_result res;
    tr_err err = {0};
    CHECK(tr_train_step(&a.tr, mbs, 1, &args, &res, &err) == 0);
    CHECK(res.grad_norm > 0.25);
    // AdamW clips as it reads the gradient (the buffer keeps the unclipped one): Adam's first
    // step is sign-like, so scaling the gradient changes only eps's share; compare instead the
    // first moment, m = (1 - beta1) * c * gradient with c = max / (norm + 1e-6), whose norm is
    // (1 - beta1) * max.
    size_t n = a.model.layout.total;
    float *g = et_floats(be, a.model.grads, n), *am = et_floats(be, a.tr.adam_m, n);
    const double c = 0.25 / (res.grad_norm + 1e-6);
    double em = 0, ss = 0, sm = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(am[i] - (1.0 - opt.beta1) * c * g[i]);
        if (d > em) em = d;
        ss += (double)g[i] * g[i];
        sm += (double)am[i] * am[i];
    }
    CHECK_NEAR(sqrt(ss), res.grad_norm, 1e-6 * res.grad_norm);
    CHECK_NEAR(sqrt(sm), (1.0 - opt.beta1) * 0.25 * res.grad_norm / (res.grad_norm + 1e-6), 1e-6);
    CHECK(em <= 1e-8);
    free(g);
    free(am);
    destroy(&a);
}

static void test_state_roundtrip(tr_backend *be) {
    packed_batch pb[2];
    tr_micro_batch mbs[2];
    const int32_t per[2] = {3, 1};
    split(pb, mbs, per, 2);
    tr_optim_cfg opt = OPT;
    opt.max_grad_norm = 1.0f;
    opt.schedule.warmup_steps = 2;
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_step_result res;
    tr_err err = {0};
    setup a, b;
    if (make(&a, be, &opt, 45) != 0 || make(&b, be, &opt, 1) != 0) {
        CHECK(0);
        return;
    }
    for (int32_t i = 0; i < 2; i++) CHECK(tr_train_step(&a.tr, mbs, 2, &args, &res, &err) == 0);
    for (int32_t i = 0; i < 3; i++) tr_rng_u32(&a.tr.rng);  // mid-block RNG position
    const char *dir = tr_test_tmpdir();
    CHECKF(tr_train_state_save(&a.tr, dir, &err) == 0, "%s", err.msg);
    size_t n = a.model.layout.total;
    be->ops->copy(be, b.model.params, a.model.params, n * sizeof(float));
    CHECKF(tr_train_state_load(&b.tr, dir, &err) == 0, "%s", err.msg);
    CHECK(b.tr.step == 2);
    CHECK(tr_rng_u32(&a.tr.rng) == tr_rng_u32(&b.tr.rng));
    CHECK(et_same(be, a.tr.adam_v, b.tr.adam_v, n * sizeof(float)));
    CHECK(tr_train_step(&a.tr, mbs, 2, &args, &res, &err) == 0);
    double lr_a = res.lr;
    CHECK(tr_train_step(&b.tr, mbs, 2, &args, &res, &err) == 0);
    CHECK(res.lr == lr_a && res.step == 3);
    CHECK(et_same(be, a.model.params, b.model.params, n * sizeof(float)));

    // A moment file from another step is refused, and the trainer is left as it was.
    char path[512];
    CHECK(tr_train_state_save(&a.tr, dir, &err) == 0);  // step 3
    snprintf(path, sizeof path, "%s/%s", dir, TR_TRAIN_STATE_JSON);
    char *text;
    size_t len;
    CHECK(tr_file_read(path, &text, &len, &err) == 0);
    char *at = strstr(text, "\"step\": 3");
    CHECK(at != NULL);
    if (at) {
        at[8] = '4';
        CHECK(tr_file_write_atomic(path, text, len, &err) == 0);
        int64_t step_before = b.tr.step;
        CHECK(tr_train_state_load(&b.tr, dir, &err) == -1);
        CHECKF(strstr(err.msg, "optim_exp_avg.safetensors") && strstr(err.msg, "step 3"),
               "%s", err.msg);
        CHECK(b.tr.step == step_before);
    }
    free(text);
    snprintf(path, sizeof path, "%s/%s", dir, TR_TRAIN_STATE_JSON);
    CHECK(tr_file_write_atomic(path, "{\"format\": \"x\"}", 15, &err) == 0);
    CHECK(tr_train_state_load(&b.tr, dir, &err) == -1 && strstr(err.msg, "trainer_state.json"));
    destroy(&a);
    destroy(&b);
}

static void test_errors(tr_backend *be) {
    setup s;
    if (make(&s, be, &OPT, 46) != 0) return;
    packed_batch pb[1];
    tr_micro_batch mbs[1];
    const int32_t per[1] = {4};
    split(pb, mbs, per, 1);
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_step_result res;
    tr_err err = {0};
    size_t n = s.model.layout.total;
    float *before = et_floats(be, s.model.params, n);
    pb[0].ids[5] = 31;  // vocab is 31
    CHECK(tr_train_step(&s.tr, mbs, 1, &args, &res, &err) == -1);
    CHECKF(err.code == TR_ERANGE && strstr(err.msg, "micro-batch 0") && strstr(err.msg, "token 5"),
           "%s", err.msg);
    float *after = et_floats(be, s.model.params, n);
    CHECK(memcmp(before, after, n * sizeof(float)) == 0 && s.tr.step == 0);
    free(after);
    pb[0].ids[5] = 3;
    float zero[32] = {0};
    mbs[0].weights = zero;
    CHECK(tr_train_step(&s.tr, mbs, 1, &args, &res, &err) == -1 && err.code == TR_EINVAL);
    free(before);
    destroy(&s);
}

// A trainer whose warmup is longer than its run: accepted, and its updates use the cut ramp.
static void test_short_run(tr_backend *be) {
    tr_optim_cfg opt = OPT;
    opt.schedule = (tr_lr_schedule){.kind = TR_LR_COSINE, .warmup_steps = 5, .total_steps = 2, .min_lr_ratio = 0.1};
    setup s;
    if (make(&s, be, &opt, 47) != 0) {
        CHECK(0);
        return;
    }
    packed_batch pb[1];
    tr_micro_batch mbs[1];
    const int32_t per[1] = {4};
    split(pb, mbs, per, 1);
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_step_result r0, r1;
    tr_err err = {0};
    CHECKF(tr_train_step(&s.tr, mbs, 1, &args, &r0, &err) == 0 &&
           tr_train_step(&s.tr, mbs, 1, &args, &r1, &err) == 0, "%s", err.msg);
    CHECK_NEAR(r0.lr, 0.0, 1e-15);
    CHECK_NEAR(r1.lr, 0.5 * opt.lr, 1e-15);
    destroy(&s);
    // Still refused: a decay over a run of no steps.
    tr_trainer tr;
    opt.schedule.total_steps = 0;
    CHECK(make(&s, be, &OPT, 47) == 0);
    CHECK(tr_trainer_init(&tr, &s.model, &opt, 5, &err) == -1 && strstr(err.msg, "total_steps"));
    destroy(&s);
}

int main(void) {
    tr_backend be;
    et_backend(&be, 2);
    test_schedules();
    test_accumulation(&be);
    test_loss_modes(&be);
    test_clipping(&be);
    test_state_roundtrip(&be);
    test_errors(&be);
    test_short_run(&be);
    tr_backend_free(&be);
    return tr_test_summary("test_train");
}
