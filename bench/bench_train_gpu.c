// Training throughput on a GPU at the shapes the peers are measured on (Qwen2.5-0.5B, -1.5B):
// tokens/s of a full step (forward, backward, clipping, AdamW), MFU by the peers' formula
// ((6N + 6*L*S*d) FLOPs a token against 790 TFLOP/s, ../shared/anchors/torch_anchor.py) and
// the peak device memory the run took. Random weights and tokens; micro-batches of `mb`
// sequences of `seq` tokens packed as documents, as troupe trains them.
// usage: bench_train_gpu SHAPE [MB [SEQ [STEPS [LOGIT_ROWS]]]]   SHAPE: qwen2.5-0.5b | qwen2.5-1.5b | tiny
// (defaults: 8 x 2048 for 0.5b, 4 x 2048 for 1.5b, 5 timed steps after 2 warm-up steps, the
// LM head's rows per chunk from the memory plan, as a worker's)
// The backend comes from $TROUPE_BACKEND (cuda) and the precision from $TROUPE_PRECISION
// (default: the backend's, bf16 on CUDA); TROUPE_RECOMPUTE=on|off (default: the plan's, on
// only where the micro-batch does not fit otherwise) measures activation recompute's cost.
// BENCH_PACKED=1 packs each micro-batch's MB x SEQ tokens as RL rollouts come instead:
// documents of 256 to 2,048 tokens (uniform, a fixed seed; the last one cut to fit), MFU then
// counting each document's attention over its own length (6 L S d a token of a document of S).
// bench/run_gpu_train.sh runs it beside the peer.
// On CUDA it then measures launch overhead: the trunk's backward queued op by op against the
// same launches replayed as one CUDA graph.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/gpu_shape.h"
#include "engine/config.h"
#include "engine/device.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/rng.h"
#include "engine/train.h"
#include "kernels/backend.h"
#include "tr_build_config.h"
#if TR_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

#define PEAK 790e12

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if TR_HAVE_CUDA
// Launch overhead: the trunk's backward (every layer's ops, most of a step's launches) queued
// op by op, then the same launches replayed as one CUDA graph. Their difference is what
// launching costs; printed against the backward and against the step.
static int launch_overhead(tr_backend *be, tr_model *m, double step_s) {
    const int reps = 5;
    char msg[512];
    tr_err err = {0};
    if (tr_model_backward(m, &err) != 0 || be->ops->sync(be, "warm-up", msg, sizeof msg)) return -1;
    double t0 = now();
    for (int i = 0; i < reps; i++)
        if (tr_model_backward(m, &err) != 0) return -1;
    if (be->ops->sync(be, "backward", msg, sizeof msg)) return -1;
    double eager = (now() - t0) / reps;
    void *exec = NULL;
    int rc = be->ops->graph_begin(be);
    if (rc == 1) {
        printf("  launch overhead: not measured (no graphs with TROUPE_CUDA_PROFILE, "
               "TROUPE_SYNC_EACH_OP or TROUPE_CUDA_GRAPHS=0)\n");
        return 0;
    }
    if (rc != 0) return -1;
    rc = tr_model_backward(m, &err);
    if (be->ops->graph_end(be, &exec) != 0 || rc != 0) return -1;
    t0 = now();
    for (int i = 0; i < reps && rc == 0; i++) rc = be->ops->graph_launch(be, exec);
    if (rc || be->ops->sync(be, "graph", msg, sizeof msg)) rc = -1;
    double graph = (now() - t0) / reps;
    be->ops->graph_free(be, exec);
    if (rc) return -1;
    printf("  launch overhead: the trunk's backward %.2f ms queued op by op, %.2f ms as one CUDA "
           "graph: %.1f%% of the backward, %.1f%% of a step\n", 1e3 * eager, 1e3 * graph,
           100 * (eager - graph) / eager, 100 * (eager - graph) / step_s);
    return 0;
}
#endif

// The micro-batch's document starts (n + 1 of them, n returned): mb documents of seq tokens,
// or with packed lengths of 256 to 2,048 tokens over the same T = mb * seq.
#define PACKED_MIN 256
#define PACKED_MAX 2048
static int32_t doc_layout(int32_t *starts, int32_t mb, int32_t seq, bool packed, tr_rng *rng) {
    const int32_t T = mb * seq;
    if (!packed) {
        for (int32_t d = 0; d <= mb; d++) starts[d] = d * seq;
        return mb;
    }
    int32_t n = 0;
    starts[0] = 0;
    while (starts[n] < T) {
        int32_t len = PACKED_MIN + (int32_t)(tr_rng_u32(rng) % (PACKED_MAX - PACKED_MIN + 1));
        starts[n + 1] = starts[n] + len < T ? starts[n] + len : T;
        n++;
    }
    return n;
}

static int fail(const char *what, const tr_err *err) {
    fprintf(stderr, "bench_train_gpu: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    const bench_shape *sh = bench_shape_find(argc > 1 ? argv[1] : NULL);
    int mb = sh && argc > 2 ? atoi(argv[2]) : sh ? sh->mb : 0;
    int seq = argc > 3 ? atoi(argv[3]) : 2048, steps = argc > 4 ? atoi(argv[4]) : 5;
    int logit_rows = argc > 5 ? atoi(argv[5]) : 0;
    if (!sh || mb < 1 || seq < 2 || steps < 1 || logit_rows < 0) {
        fprintf(stderr, "usage: bench_train_gpu qwen2.5-0.5b|qwen2.5-1.5b|tiny [MB [SEQ [STEPS "
                "[LOGIT_ROWS]]]]\n");
        return 2;
    }
    tr_err err = {0};
    tr_model_config cfg;
    if (bench_shape_config(sh, &cfg, &err) != 0) return fail("config", &err);
    tr_backend be;
    if (bench_backend_start(&be, "bench_train_gpu") != 0) return 1;
    size_t free0 = 0, total = 0, free_min;
    be.ops->mem_info(&be, &free0, &total);
    free_min = free0;

    // One micro-batch of mb documents of seq tokens: the step the peer takes on [mb, seq]
    // (or, with BENCH_PACKED=1, the same tokens in documents of rollouts' lengths).
    const char *pk = getenv("BENCH_PACKED");
    const bool packed = pk && strcmp(pk, "1") == 0;
    int32_t T = mb * seq, max_docs = packed ? T / PACKED_MIN + 2 : mb + 1;
    int32_t *ids = malloc((size_t)T * sizeof *ids), *targets = malloc((size_t)T * sizeof *targets);
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    int32_t *starts = malloc((size_t)max_docs * sizeof *starts);
    if (!ids || !targets || !pos || !starts) return 1;
    tr_rng rng;
    tr_rng_init(&rng, 1);
    for (int32_t t = 0; t < T; t++) ids[t] = (int32_t)(tr_rng_u32(&rng) % BENCH_VOCAB);
    const int32_t n_docs = doc_layout(starts, mb, seq, packed, &rng);
    double sq_sum = 0;   // sum over documents of S^2: attention's work
    for (int32_t d = 0; d < n_docs; d++) {
        const int32_t s = starts[d], e = starts[d + 1];
        sq_sum += (double)(e - s) * (double)(e - s);
        for (int32_t t = s; t < e; t++) {
            pos[t] = t - s;
            targets[t] = t + 1 < e ? ids[t + 1] : -1;
        }
    }
    tr_micro_batch batch = {.ids = ids, .targets = targets,
                            .docs = {.n_tokens = T, .n_docs = n_docs, .doc_start = starts,
                                     .pos = pos}};
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY};
    tr_optim_cfg opt = {.lr = 1e-5, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                        .weight_decay = 0.01f, .max_grad_norm = 1.0f,
                        .schedule = {.kind = TR_LR_CONSTANT}};
    tr_model m;
    tr_trainer tr;
    // The LM head's chunk as a worker's memory plan sizes it, unless given.
    const char *rec = getenv("TROUPE_RECOMPUTE");
    tr_plan_req pr = {.cfg = &cfg, .max_tokens = T, .training = true, .logit_rows = logit_rows,
                      .recompute = !rec ? TR_RECOMPUTE_AUTO : strcmp(rec, "on") == 0 ? TR_RECOMPUTE_ON
                                                                                     : TR_RECOMPUTE_OFF};
    tr_plan plan;
    if (tr_plan_make(&be, &pr, &plan, &err) != 0) return fail("memory plan", &err);
    tr_model_opts mo = {.max_tokens = T, .training = true, .logit_rows = plan.logit_rows,
                        .recompute = plan.recompute};
    if (tr_model_init(&m, &cfg, &be, &mo, &err) != 0) return fail("model", &err);
    if (tr_model_init_weights(&m, 7, 0.02f, &err) != 0) return fail("weights", &err);
    if (tr_trainer_init(&tr, &m, &opt, 1, &err) != 0) return fail("trainer", &err);
    tr_step_result res = {0};
    double t0 = 0;
    for (int s = 0; s < steps + 2; s++) {
        if (s == 2) {
#if TR_HAVE_CUDA
            if (strcmp(be.ops->name, "cuda") == 0) tr_backend_cuda_profile_reset(&be);
#endif
            t0 = now();
        }
        if (tr_train_step(&tr, &batch, 1, &args, &res, &err) != 0) return fail("step", &err);
        size_t f = 0;
        be.ops->mem_info(&be, &f, &total);
        if (f < free_min) free_min = f;
    }
    double step_s = (now() - t0) / steps;   // tr_train_step waits for its norm: steps are whole
    // Matmul parameters as the peer counts them (tied LM head counted once, as a matmul).
    double d = cfg.hidden_size, L = cfg.n_layers, I = cfg.intermediate_size;
    double hd = d / cfg.n_heads, kv = 2.0 * cfg.n_kv_heads * hd;
    double N = L * (d * (d + kv) + d * d + 3 * d * I) + d * BENCH_VOCAB;
    // attention's term per token: 6 L S d for a document of S, averaged over the tokens
    double flops = 6 * N + 6 * L * d * (sq_sum / T);
    double tps = T / step_s;
    printf("%s: %s %s, micro-batch %d x %d, %.1fM matmul params, LM head %d rows a chunk%s\n",
           sh->name, be.ops->name, tr_dt_name(be.act), mb, seq, N / 1e6, m.logit_rows,
           m.recompute ? ", activations recomputed" : "");
    if (packed)
        printf("  packed: %d documents of %d to %d tokens (mean %.0f)\n", n_docs, PACKED_MIN,
               PACKED_MAX, (double)T / n_docs);
    printf("  step %.3f s, %.0f tokens/s, MFU %.1f%%, peak memory %.1f GiB, loss %.4f\n", step_s,
           tps, 100 * tps * flops / PEAK, (double)(free0 - free_min) / (1 << 30), res.loss);
    printf("troupe train shape=%s%s tok/s=%.0f mfu=%.4f peak_gib=%.2f\n", sh->name,
           packed ? " packed=1" : "", tps, tps * flops / PEAK,
           (double)(free0 - free_min) / (1 << 30));
#if TR_HAVE_CUDA
    const char *prof = getenv("TROUPE_CUDA_PROFILE");
    if (strcmp(be.ops->name, "cuda") == 0 && !(prof && strcmp(prof, "1") == 0) &&
        launch_overhead(&be, &m, step_s) != 0) {
        char msg[512];
        tr_backend_cuda_status(&be, msg, sizeof msg);
        fprintf(stderr, "bench_train_gpu: launch overhead: %s\n", msg);
        return 1;
    }
#endif
    tr_trainer_free(&tr);
    tr_model_free(&m);
    tr_backend_free(&be);
    free(ids);
    free(targets);
    free(pos);
    free(starts);
    return 0;
}
