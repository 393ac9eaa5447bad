// Checkpoint I/O throughput: save and load of a Llama-style model (about 100M parameters
// by default) as one F32 file and as BF16 shards, in MB/s of file data and parameters/s.
// Loads run twice: the second finds the files in the page cache, so it measures the
// parsing and conversion cost rather than the disk.
// usage: bench_checkpoint [DIR [LAYERS]]   (DIR default /tmp, LAYERS default 8)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/rng.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run(const char *dir, const tr_model_config *cfg, const tr_param_layout *L,
               const float *src, float *dst, const tr_ckpt_save_opts *o, const char *what) {
    tr_err err = {0};
    double bytes = (double)L->total * (o->dtype == TR_ST_BF16 ? 2 : 4);
    double t0 = now();
    if (tr_checkpoint_save(dir, cfg, L, src, o, &err)) {
        fprintf(stderr, "save: %s\n", err.msg);
        return 1;
    }
    double t1 = now();
    printf("%-22s save  %7.3f s  %8.1f MB/s\n", what, t1 - t0, bytes / (t1 - t0) / 1e6);
    for (int rep = 0; rep < 2; rep++) {
        t0 = now();
        if (tr_checkpoint_load(dir, cfg, L, dst, &err)) {
            fprintf(stderr, "load: %s\n", err.msg);
            return 1;
        }
        t1 = now();
        printf("%-22s load%s %6.3f s  %8.1f MB/s  %6.1f Mparam/s\n", what, rep ? "*" : " ",
               t1 - t0, bytes / (t1 - t0) / 1e6, (double)L->total / (t1 - t0) / 1e6);
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *base = argc > 1 ? argv[1] : "/tmp";
    int layers = argc > 2 ? atoi(argv[2]) : 8;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 1024,"
             " \"intermediate_size\": 2816, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": 16, \"num_key_value_heads\": 4}", layers);
    tr_model_config cfg;
    tr_param_layout L;
    tr_err err = {0};
    if (layers < 1 || tr_config_parse(json, strlen(json), "bench", &cfg, &err) ||
        tr_param_layout_init(&L, &cfg, &err)) {
        fprintf(stderr, "usage: bench_checkpoint [DIR [LAYERS]]: %s\n", err.msg);
        return 2;
    }
    float *src = malloc(L.total * sizeof *src), *dst = malloc(L.total * sizeof *dst);
    if (!src || !dst) return 1;
    tr_rng rng;
    tr_rng_init(&rng, 1);
    for (size_t i = 0; i < L.total; i++) src[i] = tr_rng_normal(&rng) * 0.02f;
    printf("%zu parameters, %d tensors (* = files in the page cache)\n", L.total, L.n_tensors);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/troupe-bench-ckpt-%ld", base, (long)getpid());
    tr_ckpt_save_opts f32 = {.dtype = TR_ST_F32};
    tr_ckpt_save_opts bf16 = {.dtype = TR_ST_BF16, .max_shard_bytes = 64u << 20};
    int rc = run(dir, &cfg, &L, src, dst, &f32, "f32 single file");
    if (!rc) rc = run(dir, &cfg, &L, src, dst, &bf16, "bf16 64 MB shards");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(src);
    free(dst);
    tr_param_layout_free(&L);
    return rc;
}
