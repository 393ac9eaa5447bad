// Generation on a GPU at the RL bench's shapes (Qwen2.5-0.5B, -1.5B, random bf16 weights):
// PROMPTS prompts of PLEN random tokens, SAMPLES samples each, NEW tokens per sample (the
// config names no EOS, so every sample runs to the end), as a policy generates in one GRPO
// step. Prints the wall time, decode tokens/s and the decode steps' memory traffic per
// second (the generator's decode_bytes over decode_seconds) against an H200's measured
// 4300 GB/s, and the host's scheduling time per decode step (the generator's host_seconds:
// KV slots, block tables, retiring samples). A warm-up call first; with TROUPE_CUDA_PROFILE=1 the table of where the timed
// call's device time went goes to stderr at the end.
// Last, one machine-readable line: "troupe decode shape=... batch=... s=... tok/s=... ...".
// usage: bench_decode_gpu SHAPE [PROMPTS [SAMPLES [PLEN [NEW]]]]   (defaults 64 8 256 256)
//   SHAPE: qwen2.5-0.5b, qwen2.5-1.5b, or tiny (a CPU smoke test's, with TROUPE_BACKEND=cpu)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/gpu_shape.h"
#include "engine/config.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/rng.h"
#include "kernels/backend.h"
#include "tr_build_config.h"
#if TR_HAVE_CUDA
#include "kernels/cuda/backend_cuda.h"
#endif

#define PEAK_GBPS 4300.0

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what, const tr_err *err) {
    fprintf(stderr, "bench_decode_gpu: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    const bench_shape *sh = bench_shape_find(argc > 1 ? argv[1] : NULL);
    int P = argc > 2 ? atoi(argv[2]) : 64, S = argc > 3 ? atoi(argv[3]) : 8;
    int plen = argc > 4 ? atoi(argv[4]) : 256, new_tokens = argc > 5 ? atoi(argv[5]) : 256;
    if (!sh || P < 1 || S < 1 || plen < 1 || new_tokens < 1) {
        fprintf(stderr, "usage: bench_decode_gpu qwen2.5-0.5b|qwen2.5-1.5b|tiny [PROMPTS [SAMPLES [PLEN [NEW]]]]\n");
        return 2;
    }
    tr_err err = {0};
    tr_model_config cfg;
    if (bench_shape_config(sh, &cfg, &err) != 0) return fail("config", &err);
    tr_backend be;
    if (bench_backend_start(&be, "bench_decode_gpu") != 0) return 1;
    int32_t B = P * S, T = B > 2048 ? B : 2048;
    tr_plan_req pr = {.cfg = &cfg, .max_tokens = T, .training = false};
    tr_plan plan;
    if (tr_plan_make(&be, &pr, &plan, &err) != 0) return fail("memory plan", &err);
    tr_model m;
    tr_model_opts mo = {.max_tokens = T, .training = false, .logit_rows = plan.logit_rows};
    if (tr_model_init(&m, &cfg, &be, &mo, &err) != 0) return fail("model", &err);
    if (tr_model_init_weights(&m, 7, 0.02f, &err) != 0) return fail("weights", &err);
    tr_generator g;
    tr_gen_opts go = {.kv_tokens = (int64_t)B * (plen + new_tokens + 16), .block_size = 16, .max_seqs = B};
    if (tr_generator_init(&g, &m, &go, &err) != 0) return fail("generator", &err);
    int32_t *prompts = malloc((size_t)P * plen * sizeof(int32_t));
    tr_gen_request *reqs = calloc((size_t)P, sizeof *reqs);
    tr_gen_output *outs = calloc((size_t)B, sizeof *outs);
    if (!prompts || !reqs || !outs) return 1;
    tr_rng rng;
    tr_rng_init(&rng, 1);
    for (int32_t i = 0; i < P * plen; i++) prompts[i] = (int32_t)(tr_rng_u32(&rng) % BENCH_VOCAB);
    for (int32_t i = 0; i < P; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts + (size_t)i * plen, .n_prompt = plen, .n_samples = S,
                                   .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f},
                                   .seed = (uint64_t)i, .max_new_tokens = new_tokens};
    if (tr_generate(&g, reqs, P, outs, &err) != 0) return fail("warm-up", &err);
    tr_gen_outputs_free(outs, B);
#if TR_HAVE_CUDA
    if (strcmp(be.ops->name, "cuda") == 0) tr_backend_cuda_profile_reset(&be);
#endif
    double t0 = now();
    if (tr_generate(&g, reqs, P, outs, &err) != 0) return fail("generate", &err);
    double wall = now() - t0;
    int64_t sampled = 0;
    for (int32_t i = 0; i < B; i++) sampled += outs[i].n_tokens;
    tr_gen_outputs_free(outs, B);
    const tr_gen_stats *st = &g.stats;
    double gbps = st->decode_seconds > 0 ? st->decode_bytes / st->decode_seconds / 1e9 : 0;
    printf("%s: %s %s, %d prompts x %d samples, %d + %d tokens\n", sh->name, be.ops->name, tr_dt_name(be.act), P,
           S, plen, new_tokens);
    printf("  %.3f s: %.0f sampled tokens/s; %lld decode steps in %.3f s (%.2f ms a step, %.1f rows), prefill "
           "%lld tokens; decode traffic %.0f GB/s, %.1f%% of %.0f; host scheduling %.1f us a step\n",
           wall, (double)sampled / wall, (long long)st->decode_steps, st->decode_seconds,
           st->decode_steps ? 1e3 * st->decode_seconds / (double)st->decode_steps : 0.0,
           st->decode_steps ? (double)st->decode_tokens / (double)st->decode_steps : 0.0,
           (long long)st->prefill_tokens, gbps, 100 * gbps / PEAK_GBPS, PEAK_GBPS,
           st->decode_steps ? 1e6 * st->host_seconds / (double)st->decode_steps : 0.0);
    // One line for scripts (bench/run_decode_gpu.sh): the timed call's wall time and rate, and its
    // decode steps alone (prefill excluded) for a per-step view.
    printf("troupe decode shape=%s batch=%d s=%.4f tok/s=%.0f gbps=%.1f host_us=%.1f plen=%d new=%d tokens=%lld "
           "decode_steps=%lld decode_s=%.4f\n",
           sh->name, B, wall, (double)sampled / wall, gbps,
           st->decode_steps ? 1e6 * st->host_seconds / (double)st->decode_steps : 0.0, plen, new_tokens,
           (long long)sampled, (long long)st->decode_steps, st->decode_seconds);
    free(prompts);
    free(reqs);
    free(outs);
    tr_generator_free(&g);
    tr_model_free(&m);
    tr_backend_free(&be);
    return 0;
}
