// CPU training throughput: tokens/s of a full step (forward, backward, clipping, AdamW) and of
// the forward alone, for a ~10M-parameter Llama-style model, at 1 and 2 threads.
// usage: bench_train [--machine] [STEPS [TOKENS_PER_STEP]]   (defaults 3 and 1024, in
// 256-token documents). --machine adds one key=value line per thread count after the table
// (`troupe train threads=N tok/s=...`), which bench/run_cpu_peers.sh reads.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/config.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "engine/rng.h"
#include "engine/train.h"

static const char CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 8192,"
    " \"hidden_size\": 256, \"intermediate_size\": 688, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"max_position_embeddings\": 2048,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float32\"}";

#define SEQ 256

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now(void) { return clock_s(CLOCK_MONOTONIC); }
// CPU time of all threads: on a shared machine wall time also counts waiting for a core.
static double cpu_now(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

int main(int argc, char **argv) {
    bool machine = false;
    if (argc > 1 && strcmp(argv[1], "--machine") == 0) {
        machine = true;
        argv++;
        argc--;
    }
    int steps = argc > 1 ? atoi(argv[1]) : 3;
    int tokens = argc > 2 ? atoi(argv[2]) : 1024;
    if (steps < 1 || tokens < SEQ || tokens % SEQ != 0) {
        fprintf(stderr, "usage: bench_train [--machine] [STEPS [TOKENS_PER_STEP, a multiple of "
                "%d]]\n", SEQ);
        return 2;
    }
    tr_err err = {0};
    tr_model_config cfg;
    if (tr_config_parse(CONFIG, sizeof CONFIG - 1, "bench config", &cfg, &err) != 0) {
        fprintf(stderr, "bench_train: %s\n", err.msg);
        return 1;
    }
    int32_t n_docs = tokens / SEQ;
    int32_t *ids = malloc((size_t)tokens * sizeof(int32_t));
    int32_t *targets = malloc((size_t)tokens * sizeof(int32_t));
    int32_t *pos = malloc((size_t)tokens * sizeof(int32_t));
    int32_t *starts = malloc(((size_t)n_docs + 1) * sizeof(int32_t));
    float *lp = malloc((size_t)tokens * sizeof(float));
    if (!ids || !targets || !pos || !starts || !lp) return 1;
    tr_rng rng;
    tr_rng_init(&rng, 1);
    for (int32_t t = 0; t < tokens; t++) {
        ids[t] = (int32_t)(tr_rng_u32(&rng) % (uint32_t)cfg.vocab_size);
        pos[t] = t % SEQ;
    }
    for (int32_t t = 0; t < tokens; t++) targets[t] = pos[t] + 1 < SEQ ? ids[t + 1] : -1;
    for (int32_t d = 0; d <= n_docs; d++) starts[d] = d * SEQ;
    tr_doc_layout docs = {.n_tokens = tokens, .n_docs = n_docs, .doc_start = starts, .pos = pos};
    tr_micro_batch mb = {.ids = ids, .docs = docs, .targets = targets};
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_optim_cfg opt = {.lr = 1e-3, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                        .weight_decay = 0.1f, .max_grad_norm = 1.0f,
                        .schedule = {.kind = TR_LR_CONSTANT}};

    printf("model: hidden %d, %d layers, %d heads (%d kv), intermediate %d, vocab %d\n",
           cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.intermediate_size,
           cfg.vocab_size);
    printf("step: %d tokens (%d x %d), %d timed steps after one warm-up\n\n", tokens, n_docs, SEQ,
           steps);
    printf("%-8s %-8s %-8s %-12s %-12s %-14s %-8s\n", "threads", "params", "s/step",
           "cpu-s/step", "train tok/s", "forward tok/s", "loss");
    const int32_t thread_counts[] = {1, 2};
    // Kept until the table is done, so the key=value lines do not interleave with it.
    double train_tps[2], fwd_tps[2], step_s[2], step_cpu[2];
    float loss[2];
    for (int32_t k = 0; k < 2; k++) {
        tr_backend be;
        if (tr_backend_cpu_init(&be, thread_counts[k], TR_F32) != 0) return 1;
        tr_model m;
        tr_trainer tr;
        tr_model_opts mo = {.max_tokens = tokens, .training = true};
        if (tr_model_init(&m, &cfg, &be, &mo, &err) != 0 ||
            tr_trainer_init(&tr, &m, &opt, 1, &err) != 0) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        if (tr_model_init_weights(&m, 7, 0.02f, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        tr_step_result res;
        if (tr_train_step(&tr, &mb, 1, &args, &res, &err) != 0) {
            fprintf(stderr, "bench_train: %s\n", err.msg);
            return 1;
        }
        double t0 = now(), c0 = cpu_now();
        for (int s = 0; s < steps; s++)
            if (tr_train_step(&tr, &mb, 1, &args, &res, &err) != 0) {
                fprintf(stderr, "bench_train: %s\n", err.msg);
                return 1;
            }
        double train_s = (now() - t0) / steps, train_cpu = (cpu_now() - c0) / steps;
        t0 = now();
        for (int s = 0; s < steps; s++)
            if (tr_model_forward(&m, ids, &docs, &err) != 0 ||
                tr_lm_head_forward(&m, targets, lp, NULL, &err) != 0) {
                fprintf(stderr, "bench_train: %s\n", err.msg);
                return 1;
            }
        double fwd_s = (now() - t0) / steps;
        char params[32];
        snprintf(params, sizeof params, "%.2fM", (double)tr_model_n_params(&m) / 1e6);
        printf("%-8d %-8s %-8.3f %-12.3f %-12.0f %-14.0f %-8.4f\n", thread_counts[k], params,
               train_s, train_cpu, tokens / train_s, tokens / fwd_s, res.loss);
        train_tps[k] = tokens / train_s;
        fwd_tps[k] = tokens / fwd_s;
        step_s[k] = train_s;
        step_cpu[k] = train_cpu;
        loss[k] = res.loss;
        tr_trainer_free(&tr);
        tr_model_free(&m);
        tr_backend_cpu_free(&be);
    }
    if (machine) {
        printf("\n");
        for (int32_t k = 0; k < 2; k++)
            printf("troupe train threads=%d tokens=%d steps=%d tok/s=%.1f forward_tok/s=%.1f "
                   "s/step=%.4f cpu-s/step=%.4f loss=%.4f\n", thread_counts[k], tokens, steps,
                   train_tps[k], fwd_tps[k], step_s[k], step_cpu[k], loss[k]);
    }
    free(ids);
    free(targets);
    free(pos);
    free(starts);
    free(lp);
    return 0;
}
