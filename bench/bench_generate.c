// CPU decode throughput of the batched generator: tokens/s at batch 1, 16 and 64 for the
// ~10M-parameter Llama-style model of bench_train (random weights), at 1 and 2 threads.
// Decode time is the difference between a run generating 1 + NEW tokens per sequence and one
// generating 1 (prefill and first token only), so prompt processing is not counted.
// usage: bench_generate [--machine] [NEW_TOKENS [PROMPT_LEN]]   (defaults 32 and 64).
// --machine adds one key=value line per thread count and batch after the table
// (`troupe decode threads=N batch=B tok/s=...`), which bench/run_cpu_peers.sh reads.
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/config.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/rng.h"

static const char CONFIG[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 8192,"
    " \"hidden_size\": 256, \"intermediate_size\": 688, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"max_position_embeddings\": 2048,"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float32\"}";

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Generates max_new tokens for each of the B requests; returns wall and CPU seconds.
static int timed(tr_generator *g, tr_gen_request *reqs, int32_t B, int32_t max_new,
                 tr_gen_output *outs, double *wall, double *cpu, tr_err *err) {
    for (int32_t i = 0; i < B; i++) reqs[i].max_new_tokens = max_new;
    double t0 = now(), c0 = cpu_now();
    if (tr_generate(g, reqs, B, outs, err) != 0) return -1;
    *wall = now() - t0;
    *cpu = cpu_now() - c0;
    tr_gen_outputs_free(outs, B);
    return 0;
}

int main(int argc, char **argv) {
    bool machine = false;
    if (argc > 1 && strcmp(argv[1], "--machine") == 0) {
        machine = true;
        argv++;
        argc--;
    }
    int new_tokens = argc > 1 ? atoi(argv[1]) : 32;
    int prompt_len = argc > 2 ? atoi(argv[2]) : 64;
    if (new_tokens < 1 || prompt_len < 1 || prompt_len > 1024 || new_tokens > 1024) {
        fprintf(stderr, "usage: bench_generate [--machine] [NEW_TOKENS [PROMPT_LEN]] "
                "(1..1024 each)\n");
        return 2;
    }
    tr_err err = {0};
    tr_model_config cfg;
    if (tr_config_parse(CONFIG, sizeof CONFIG - 1, "bench config", &cfg, &err) != 0) {
        fprintf(stderr, "bench_generate: %s\n", err.msg);
        return 1;
    }
    enum { MAX_B = 64 };
    int32_t *prompts = malloc((size_t)MAX_B * prompt_len * sizeof(int32_t));
    tr_gen_request reqs[MAX_B];
    tr_gen_output outs[MAX_B];
    if (!prompts) return 1;
    tr_rng rng;
    tr_rng_init(&rng, 1);
    for (int32_t i = 0; i < MAX_B * prompt_len; i++)
        prompts[i] = (int32_t)(tr_rng_u32(&rng) % (uint32_t)cfg.vocab_size);
    for (int32_t i = 0; i < MAX_B; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts + (size_t)i * prompt_len,
                                   .n_prompt = prompt_len, .n_samples = 1,
                                   .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
                                   .seed = (uint64_t)i, .max_new_tokens = 1};

    printf("model: hidden %d, %d layers, %d heads (%d kv), intermediate %d, vocab %d\n",
           cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.intermediate_size,
           cfg.vocab_size);
    printf("per sequence: %d-token prompt, %d decoded tokens (temperature 1, full vocabulary)\n\n",
           prompt_len, new_tokens);
    printf("%-8s %-6s %-14s %-14s %-16s %-14s\n", "threads", "batch", "decode tok/s",
           "ms/step", "decode cpu-s/tok", "prefill tok/s");
    const int32_t thread_counts[] = {1, 2}, batches[] = {1, 16, 64};
    // Kept until the table is done, so the key=value lines do not interleave with it.
    double decode_tps[2][3], prefill_tps[2][3], step_ms[2][3], cpu_per_tok[2][3];
    for (int32_t k = 0; k < 2; k++) {
        tr_backend be;
        if (tr_backend_cpu_init(&be, thread_counts[k], TR_F32) != 0) return 1;
        tr_model m;
        tr_model_opts mo = {.max_tokens = MAX_B * prompt_len, .training = false};
        if (tr_model_init(&m, &cfg, &be, &mo, &err) != 0) {
            fprintf(stderr, "bench_generate: %s\n", err.msg);
            return 1;
        }
        if (tr_model_init_weights(&m, 7, 0.02f, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        tr_generator g;
        tr_gen_opts go = {.kv_tokens = (int64_t)MAX_B * (prompt_len + new_tokens + 16),
                          .block_size = 16, .max_seqs = MAX_B};
        if (tr_generator_init(&g, &m, &go, &err) != 0) {
            fprintf(stderr, "bench_generate: %s\n", err.msg);
            return 1;
        }
        for (int32_t bi = 0; bi < 3; bi++) {
            int32_t B = batches[bi];
            double w0, c0, w1, c1;
            if (timed(&g, reqs, B, 1, outs, &w0, &c0, &err) != 0 ||
                timed(&g, reqs, B, 1 + new_tokens, outs, &w1, &c1, &err) != 0) {
                fprintf(stderr, "bench_generate: %s\n", err.msg);
                return 1;
            }
            double decode = w1 - w0, tokens = (double)B * new_tokens;
            printf("%-8d %-6d %-14.0f %-14.2f %-16.6f %-14.0f\n", thread_counts[k], B,
                   tokens / decode, 1e3 * decode / new_tokens, (c1 - c0) / tokens,
                   (double)B * prompt_len / w0);
            decode_tps[k][bi] = tokens / decode;
            prefill_tps[k][bi] = (double)B * prompt_len / w0;
            step_ms[k][bi] = 1e3 * decode / new_tokens;
            cpu_per_tok[k][bi] = (c1 - c0) / tokens;
        }
        tr_generator_free(&g);
        tr_model_free(&m);
        tr_backend_cpu_free(&be);
    }
    if (machine) {
        printf("\n");
        for (int32_t k = 0; k < 2; k++)
            for (int32_t bi = 0; bi < 3; bi++)
                printf("troupe decode threads=%d batch=%d prompt=%d new=%d tok/s=%.1f "
                       "ms/step=%.3f cpu-s/tok=%.6f prefill_tok/s=%.1f\n", thread_counts[k],
                       batches[bi], prompt_len, new_tokens, decode_tps[k][bi], step_ms[k][bi],
                       cpu_per_tok[k][bi], prefill_tps[k][bi]);
    }
    free(prompts);
    return 0;
}
