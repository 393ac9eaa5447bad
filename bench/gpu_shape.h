// The Qwen2.5 shapes the GPU benchmarks measure against the peers (bench_train_gpu,
// bench_decode_gpu): their config (random weights, tied embeddings, the 151,936-token
// vocabulary) and the backend they run on, from $TROUPE_BACKEND (default cuda) and
// $TROUPE_PRECISION (default: the backend's). "tiny" (width 64, 2 layers, the same vocabulary)
// is for the scripts' CPU smoke tests (bench/run_decode_gpu.sh --tiny).
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "kernels/backend.h"

typedef struct bench_shape {
    const char *name;
    int hidden, inter, layers, heads, kv_heads;
    int mb;   // the peer's training micro-batch at sequence length 2048
} bench_shape;

#define BENCH_VOCAB 151936

static const bench_shape BENCH_SHAPES[] = {
    {"qwen2.5-0.5b", 896, 4864, 24, 14, 2, 8},
    {"qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 4},
    {"tiny", 64, 128, 2, 4, 2, 8},
};

// The shape called name, or NULL.
static inline const bench_shape *bench_shape_find(const char *name) {
    for (size_t i = 0; name && i < sizeof BENCH_SHAPES / sizeof BENCH_SHAPES[0]; i++)
        if (strcmp(name, BENCH_SHAPES[i].name) == 0) return &BENCH_SHAPES[i];
    return NULL;
}

static inline int bench_shape_config(const bench_shape *sh, tr_model_config *cfg, tr_err *err) {
    char config[1024];
    int n = snprintf(config, sizeof config,
                     "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\","
                     " \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
                     " \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
                     " \"num_key_value_heads\": %d, \"max_position_embeddings\": 32768,"
                     " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
                     " \"tie_word_embeddings\": true}",
                     BENCH_VOCAB, sh->hidden, sh->inter, sh->layers, sh->heads, sh->kv_heads);
    return tr_config_parse(config, (size_t)n, sh->name, cfg, err);
}

// Starts the benchmark's backend; on failure prints why, prefixed by prog, and returns -1.
static inline int bench_backend_start(tr_backend *be, const char *prog) {
    const char *kind = getenv("TROUPE_BACKEND");
    tr_backend_opts bo = {.kind = kind ? kind : "cuda", .precision = getenv("TROUPE_PRECISION")};
    char msg[512];
    if (tr_backend_init(be, &bo, msg, sizeof msg) == 0) return 0;
    fprintf(stderr, "%s: %s\n", prog, msg);
    return -1;
}
