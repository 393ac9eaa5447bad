// troupe's side of the convergence check (issue 13, item 7): loads an HF checkpoint (the
// initialisation bench/converge_peer.py saved), trains it on windows of a flat little-endian
// int32 token file and prints one JSON line per step; bench/run_converge_gpu.sh runs it beside
// three torch runs and compares the losses.
// usage: converge_gpu MODEL_DIR TOKENS [--steps N] [--mb N] [--seq N] [--lr X] [--warmup N]
//                     [--weight-decay X] [--logit-rows N]
// (defaults: 200 steps of 8 x 2048, lr 3e-4 after 20 warmup steps, weight decay 0.01; the LM
// head's rows a chunk from the memory plan, as a worker's.) The backend comes from
// $TROUPE_BACKEND (default cuda), the precision from $TROUPE_PRECISION (the backend's).
// Row r of step s (from 0) is window k = (s * mb + r) mod (N / seq) of the N tokens, window k
// being tokens[k*seq, (k+1)*seq): one document each, its last token without a target, so the
// loss is the mean over mb * (seq - 1) tokens, as transformers' shifted labels give it.
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/checkpoint.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/train.h"
#include "kernels/backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, const tr_err *err) {
    fprintf(stderr, "converge_gpu: %s: %s\n", what, err->msg);
    return 1;
}

static int usage(void) {
    fprintf(stderr, "usage: converge_gpu MODEL_DIR TOKENS [--steps N] [--mb N] [--seq N] "
            "[--lr X] [--warmup N] [--weight-decay X] [--logit-rows N]\n");
    return 2;
}

// The whole token file; the stream is little-endian, as are the hosts this runs on.
static int32_t *read_tokens(const char *path, int64_t *n) {
    const uint16_t probe = 1;
    if (*(const uint8_t *)&probe != 1) {
        fprintf(stderr, "converge_gpu: the token file is little-endian; this host is not\n");
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "converge_gpu: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    int32_t *buf = NULL;
    long bytes = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (bytes < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "converge_gpu: %s: cannot find its size\n", path);
    } else if (bytes % 4 != 0) {
        fprintf(stderr, "converge_gpu: %s: %ld bytes is not a whole number of int32\n", path, bytes);
    } else if (!(buf = malloc(bytes > 0 ? (size_t)bytes : 1))) {
        fprintf(stderr, "converge_gpu: out of memory for %ld bytes of tokens\n", bytes);
    } else if (fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) {
        fprintf(stderr, "converge_gpu: %s: short read\n", path);
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *n = bytes / 4;
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 3) return usage();
    const char *model_dir = argv[1], *tokens_path = argv[2];
    int steps = 200, mb = 8, seq = 2048, warmup = 20, logit_rows = 0;
    double lr = 3e-4, wd = 0.01;
    for (int i = 3; i < argc; i += 2) {
        if (i + 1 >= argc) return usage();
        const char *k = argv[i], *v = argv[i + 1];
        char *end = NULL;
        errno = 0;
        double x = strtod(v, &end);
        // Counts must be whole numbers a step can hold; rates any finite value >= 0.
        bool whole = end != v && !*end && !errno && x >= 0 && x <= 1e9 && x == (double)(long)x;
        bool real = end != v && !*end && !errno && x >= 0 && x < 1e9;
        if (strcmp(k, "--steps") == 0 && whole) steps = (int)x;
        else if (strcmp(k, "--mb") == 0 && whole) mb = (int)x;
        else if (strcmp(k, "--seq") == 0 && whole) seq = (int)x;
        else if (strcmp(k, "--warmup") == 0 && whole) warmup = (int)x;
        else if (strcmp(k, "--logit-rows") == 0 && whole) logit_rows = (int)x;
        else if (strcmp(k, "--lr") == 0 && real) lr = x;
        else if (strcmp(k, "--weight-decay") == 0 && real) wd = x;
        else return usage();
    }
    if (steps < 1 || mb < 1 || seq < 2 || !(lr > 0) || (int64_t)mb * seq > INT32_MAX) return usage();

    int64_t n_tok = 0;
    int32_t *tokens = read_tokens(tokens_path, &n_tok);
    if (!tokens) return 1;
    int64_t n_windows = n_tok / seq;
    if (n_windows < 1) {
        fprintf(stderr, "converge_gpu: %lld tokens hold no window of %d\n", (long long)n_tok, seq);
        return 1;
    }

    tr_err err = {0};
    tr_model_config cfg;
    if (tr_checkpoint_load_lm_config(model_dir, "converge_gpu needs a causal LM", &cfg, &err) != 0)
        return fail(model_dir, &err);
    // Every id of the windows the run reads must be in the vocabulary (the forward checks
    // too, but this names the window).
    for (int64_t w = 0; w < n_windows && w < (int64_t)steps * mb; w++)
        for (int64_t t = w * seq; t < (w + 1) * seq; t++)
            if (tokens[t] < 0 || tokens[t] >= cfg.vocab_size) {
                fprintf(stderr, "converge_gpu: token %lld (window %lld) is %d, outside the "
                        "vocabulary of %d\n", (long long)t, (long long)w, tokens[t], cfg.vocab_size);
                return 1;
            }

    const char *kind = getenv("TROUPE_BACKEND");
    tr_backend_opts bo = {.kind = kind ? kind : "cuda", .precision = getenv("TROUPE_PRECISION")};
    tr_backend be;
    char msg[512];
    if (tr_backend_init(&be, &bo, msg, sizeof msg) != 0) {
        fprintf(stderr, "converge_gpu: %s\n", msg);
        return 1;
    }
    const int32_t T = mb * seq;
    tr_plan_req pr = {.cfg = &cfg, .max_tokens = T, .training = true, .logit_rows = logit_rows};
    tr_plan plan;
    if (tr_plan_make(&be, &pr, &plan, &err) != 0) return fail("memory plan", &err);
    tr_model_opts mo = {.max_tokens = T, .training = true, .logit_rows = plan.logit_rows,
                        .recompute = plan.recompute};
    tr_model m;
    if (tr_model_load(&m, model_dir, &be, &mo, &err) != 0) return fail("loading the model", &err);
    // torch's AdamW over two parameter groups: weight decay on matrices, none on norms and
    // biases (decay_all false), betas (0.9, 0.95), clipping at global norm 1.
    tr_optim_cfg opt = {.lr = lr, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = (float)wd, .decay_all = false, .max_grad_norm = 1.0f,
                        .schedule = {.kind = TR_LR_CONSTANT, .warmup_steps = warmup}};
    tr_trainer tr;
    if (tr_trainer_init(&tr, &m, &opt, 1, &err) != 0) return fail("trainer", &err);

    int32_t *targets = malloc((size_t)T * sizeof *targets), *pos = malloc((size_t)T * sizeof *pos);
    int32_t *starts = malloc(((size_t)mb + 1) * sizeof *starts);
    int32_t *ids = malloc((size_t)T * sizeof *ids);
    if (!targets || !pos || !starts || !ids) {
        fprintf(stderr, "converge_gpu: out of memory for a %d-token batch\n", T);
        return 1;
    }
    for (int32_t t = 0; t < T; t++) pos[t] = t % seq;
    for (int32_t d = 0; d <= mb; d++) starts[d] = d * seq;
    tr_micro_batch batch = {.ids = ids, .targets = targets,
                            .docs = {.n_tokens = T, .n_docs = mb, .doc_start = starts, .pos = pos}};
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};

    printf("{\"kind\": \"config\", \"side\": \"troupe\", \"backend\": \"%s\", \"precision\": \"%s\", "
           "\"vocab\": %d, \"params\": %zu, \"tokens\": %lld, \"windows\": %lld, "
           "\"windows_wrap\": %s, \"mb\": %d, \"seq\": %d, \"lr\": %g, \"warmup\": %d, "
           "\"weight_decay\": %g, \"logit_rows\": %d}\n",
           be.ops->name, tr_dt_name(be.act), cfg.vocab_size, tr_model_n_params(&m),
           (long long)n_tok, (long long)n_windows,
           (int64_t)steps * mb > n_windows ? "true" : "false", mb, seq, lr, warmup, wd,
           m.logit_rows);
    fflush(stdout);
    double t_start = now();
    for (int s = 0; s < steps; s++) {
        for (int r = 0; r < mb; r++) {
            int64_t k = ((int64_t)s * mb + r) % n_windows;
            memcpy(ids + (size_t)r * (size_t)seq, tokens + k * seq, (size_t)seq * sizeof *ids);
        }
        for (int32_t t = 0; t < T; t++) targets[t] = pos[t] + 1 < seq ? ids[t + 1] : -1;
        tr_step_result res;
        double t0 = now();
        if (tr_train_step(&tr, &batch, 1, &args, &res, &err) != 0) {
            char what[64];
            snprintf(what, sizeof what, "step %d", s + 1);
            return fail(what, &err);
        }
        // The step waits for its gradient norm, so its time is the device's too.
        printf("{\"step\": %d, \"loss\": %.9g, \"grad_norm\": %.9g, \"lr\": %.9g, \"time_s\": %.4f}\n",
               s + 1, res.loss, res.grad_norm, res.lr, now() - t0);
        fflush(stdout);
    }
    printf("{\"kind\": \"done\", \"side\": \"troupe\", \"steps\": %d, \"seconds\": %.2f}\n", steps,
           now() - t_start);
    tr_trainer_free(&tr);
    tr_model_free(&m);
    tr_backend_free(&be);
    free(tokens);
    free(ids);
    free(targets);
    free(pos);
    free(starts);
    return 0;
}
