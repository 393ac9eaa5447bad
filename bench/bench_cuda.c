// CUDA backend speed: GFLOP/s of the linear layers at the sizes of a ~10M-parameter model
// (with the CPU backend's ratio beside them) and of one 7B Llama layer (T = 4096), and
// milliseconds of attention forward/backward and decode, the embedding backward, the
// gradient's sum of squares and token sampling. Run by hand or by tools/gpu_suite.sh:
// build-*/bench/bench_cuda [cpu_threads]. Best of a few repetitions after one warm-up.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"

#define REPS 3

static tr_backend gpu;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fail(const char *what, const char *msg) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, msg);
    exit(1);
}

static float *host_rand(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) fail("malloc", "out of memory");
    uint32_t s = 12345u + (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
    }
    return x;
}

// Device copy of host data (or of random data when host is NULL).
static void *dev_put(const void *host, size_t bytes) {
    char msg[256];
    void *d;
    if (tr_cuda_alloc(&d, bytes, msg, sizeof msg) != 0) fail("alloc", msg);
    if (host) {
        if (tr_cuda_copy_h2d(d, host, bytes, msg, sizeof msg) != 0) fail("h2d", msg);
    } else {
        float *h = host_rand(bytes / sizeof(float), 1.0f);
        if (tr_cuda_copy_h2d(d, h, bytes, msg, sizeof msg) != 0) fail("h2d", msg);
        free(h);
    }
    return d;
}

static float *dev_rand(size_t n) { return dev_put(NULL, n * sizeof(float)); }

static void gpu_sync(void) {
    char msg[512];
    if (tr_backend_cuda_status(&gpu, msg, sizeof msg) != 0) fail("cuda backend", msg);
}

typedef struct mm_shape {
    const char *name;
    int32_t T, IC, OC;
} mm_shape;

// Best forward and backward (din + dw) seconds of one shape on a backend; be is the GPU one
// when on_gpu, and buffers are device memory there.
static void time_matmul(tr_backend *be, int on_gpu, const mm_shape *s, double *fwd,
                        double *bwd) {
    size_t nin = (size_t)s->T * s->IC, nw = (size_t)s->OC * s->IC, nout = (size_t)s->T * s->OC;
    float *in, *w, *out, *din, *dw;
    if (on_gpu) {
        in = dev_rand(nin); w = dev_rand(nw); out = dev_rand(nout);
        din = dev_rand(nin); dw = dev_rand(nw);
    } else {
        in = host_rand(nin, 1); w = host_rand(nw, 0.1f); out = host_rand(nout, 1);
        din = host_rand(nin, 0); dw = host_rand(nw, 0);
    }
    *fwd = *bwd = 1e30;
    for (int r = 0; r <= REPS; r++) {   // r = 0 warms up (cuBLAS heuristics, clocks)
        double t0 = now_s();
        be->ops->matmul_forward(be, out, in, w, NULL, s->T, s->IC, s->OC);
        if (on_gpu) gpu_sync();
        double t1 = now_s();
        be->ops->matmul_backward(be, din, dw, NULL, out, in, w, s->T, s->IC, s->OC);
        if (on_gpu) gpu_sync();
        double t2 = now_s();
        if (r > 0 && t1 - t0 < *fwd) *fwd = t1 - t0;
        if (r > 0 && t2 - t1 < *bwd) *bwd = t2 - t1;
    }
    void *bufs[5] = {in, w, out, din, dw};
    for (int i = 0; i < 5; i++) {
        if (on_gpu) tr_cuda_free(bufs[i]);
        else free(bufs[i]);
    }
}

static void bench_matmul(const mm_shape *s, tr_backend *cpu) {
    double gf, gb, cf = 0, cb = 0;
    time_matmul(&gpu, 1, s, &gf, &gb);
    double flops = 2.0 * s->T * s->IC * s->OC;
    printf("  matmul %-8s T=%-5d IC=%-5d OC=%-5d  fwd %8.1f GFLOP/s  bwd %8.1f GFLOP/s", s->name,
           s->T, s->IC, s->OC, flops / gf * 1e-9, 2 * flops / gb * 1e-9);
    if (cpu) {
        time_matmul(cpu, 0, s, &cf, &cb);
        printf("  (x%.0f / x%.0f cpu)", cf / gf, cb / gb);
    }
    printf("\n");
}

// Best forward and backward seconds of the CPU backend on host copies of random data.
static void time_attention_cpu(tr_backend *cpu, const tr_doc_layout *host_docs, int32_t H,
                               int32_t KVH, int32_t D, double *fwd, double *bwd) {
    int32_t T = host_docs->n_tokens;
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    float *q = host_rand(nq, 2), *k = host_rand(nk, 2), *v = host_rand(nk, 1);
    float *out = host_rand(nq, 0), *lse = host_rand((size_t)T * H, 0);
    float *dq = host_rand(nq, 0), *dk = host_rand(nk, 0), *dv = host_rand(nk, 0);
    *fwd = *bwd = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        cpu->ops->attention_forward(cpu, out, lse, q, k, v, host_docs, H, KVH, D);
        double t1 = now_s();
        cpu->ops->attention_backward(cpu, dq, dk, dv, out, out, lse, q, k, v, host_docs, H, KVH,
                                     D);
        double t2 = now_s();
        if (t1 - t0 < *fwd) *fwd = t1 - t0;
        if (t2 - t1 < *bwd) *bwd = t2 - t1;
    }
    free(q); free(k); free(v); free(out); free(lse); free(dq); free(dk); free(dv);
}

static void bench_attention(int32_t T, int32_t n_docs, int32_t H, int32_t KVH, int32_t D,
                            tr_backend *cpu) {
    int32_t *doc_start = malloc((size_t)(n_docs + 1) * sizeof(int32_t));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    if (!doc_start || !pos) fail("malloc", "out of memory");
    for (int32_t d = 0; d <= n_docs; d++) doc_start[d] = (int32_t)((int64_t)T * d / n_docs);
    for (int32_t d = 0; d < n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++) pos[t] = t - doc_start[d];
    tr_doc_layout docs = {.n_tokens = T, .n_docs = n_docs,
                          .doc_start = dev_put(doc_start, (size_t)(n_docs + 1) * sizeof(int32_t)),
                          .pos = dev_put(pos, (size_t)T * sizeof(int32_t))};
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    float *q = dev_rand(nq), *k = dev_rand(nk), *v = dev_rand(nk), *out = dev_rand(nq);
    float *lse = dev_rand((size_t)T * H), *dq = dev_rand(nq), *dk = dev_rand(nk);
    float *dv = dev_rand(nk);
    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->attention_forward(&gpu, out, lse, q, k, v, &docs, H, KVH, D);
        gpu_sync();
        double t1 = now_s();
        gpu.ops->attention_backward(&gpu, dq, dk, dv, out, out, lse, q, k, v, &docs, H, KVH, D);
        gpu_sync();
        double t2 = now_s();
        if (r > 0 && t1 - t0 < best_f) best_f = t1 - t0;
        if (r > 0 && t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("  attention T=%d docs=%d H=%d KVH=%d D=%-3d        fwd %8.2f ms       bwd %8.2f ms",
           T, n_docs, H, KVH, D, best_f * 1e3, best_b * 1e3);
    if (cpu) {
        tr_doc_layout host_docs = {.n_tokens = T, .n_docs = n_docs, .doc_start = doc_start,
                                   .pos = pos};
        double cf, cb;
        time_attention_cpu(cpu, &host_docs, H, KVH, D, &cf, &cb);
        printf("  (x%.1f / x%.1f cpu)", cf / best_f, cb / best_b);
    }
    printf("\n");
    void *bufs[10] = {(void *)docs.doc_start, (void *)docs.pos, q, k, v, out, lse, dq, dk, dv};
    for (int i = 0; i < 10; i++) tr_cuda_free(bufs[i]);
    free(doc_start);
    free(pos);
}

// B sequences of ctx tokens each in a paged cache of 16-token blocks, one query per sequence.
static void bench_decode(int32_t B, int32_t ctx, int32_t H, int32_t KVH, int32_t D) {
    int32_t bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = B * max_blocks;
    int32_t *table = malloc((size_t)n_blocks * sizeof(int32_t));
    int32_t *seq_len = malloc((size_t)B * sizeof(int32_t));
    if (!table || !seq_len) fail("malloc", "out of memory");
    for (int32_t i = 0; i < n_blocks; i++) table[i] = (int32_t)(((int64_t)i * 7919) % n_blocks);
    for (int32_t b = 0; b < B; b++) seq_len[b] = ctx;
    size_t pool = (size_t)n_blocks * bs * KVH * D;
    tr_kv_pages kv = {.k_pool = dev_rand(pool), .v_pool = dev_rand(pool), .block_size = bs,
                      .n_blocks = n_blocks, .n_kv_heads = KVH, .head_dim = D};
    int32_t *dtable = dev_put(table, (size_t)n_blocks * sizeof(int32_t));
    int32_t *dlen = dev_put(seq_len, (size_t)B * sizeof(int32_t));
    float *q = dev_rand((size_t)B * H * D), *out = dev_rand((size_t)B * H * D);
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->attention_decode(&gpu, out, q, &kv, dtable, max_blocks, dlen, B, H);
        gpu_sync();
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  attention_decode B=%d ctx=%d H=%d KVH=%d D=%-3d      %8.3f ms\n", B, ctx, H, KVH,
           D, best * 1e3);
    void *bufs[6] = {kv.k_pool, kv.v_pool, dtable, dlen, q, out};
    for (int i = 0; i < 6; i++) tr_cuda_free(bufs[i]);
    free(table);
    free(seq_len);
}

// Embedding backward of T tokens over a vocabulary of V (ids sorted on the device each call).
static void bench_embedding(int32_t T, int32_t C, int32_t V) {
    int32_t *ids = malloc((size_t)T * sizeof(int32_t));
    if (!ids) fail("malloc", "out of memory");
    for (int32_t t = 0; t < T; t++) ids[t] = (int32_t)(((int64_t)t * 7919 + t / 3) % V);
    int32_t *dids = dev_put(ids, (size_t)T * sizeof(int32_t));
    float *dout = dev_rand((size_t)T * C), *dtable = dev_rand((size_t)V * C);
    void *scratch = dev_put(NULL, gpu.ops->embedding_scratch_bytes(&gpu, T));
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->embedding_backward(&gpu, dtable, dout, dids, T, C, scratch);
        gpu_sync();
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  embedding_backward T=%d C=%d V=%-6d               %8.3f ms\n", T, C, V, best * 1e3);
    void *bufs[4] = {dids, dout, dtable, scratch};
    for (int i = 0; i < 4; i++) tr_cuda_free(bufs[i]);
    free(ids);
}

// Sum of squares of n floats into a device double.
static void bench_sumsq(size_t n) {
    float *x = dev_rand(n);
    double *acc = dev_put(NULL, sizeof(double));
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->sumsq(&gpu, acc, x, n);
        gpu_sync();
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  sumsq n=%-10zu                                %8.3f ms\n", n, best * 1e3);
    tr_cuda_free(x);
    tr_cuda_free(acc);
}

// B rows of V logits drawn with one parameter set.
static void bench_sample(int32_t B, int32_t V, float temperature, int32_t top_k, float top_p) {
    tr_sample_row *rows = malloc((size_t)B * sizeof(tr_sample_row));
    if (!rows) fail("malloc", "out of memory");
    for (int32_t b = 0; b < B; b++)
        rows[b] = (tr_sample_row){.temperature = temperature, .top_k = top_k, .top_p = top_p,
                                  .seed = 1000 + (uint64_t)b, .counter = 0, .used = 4};
    float *logits = dev_rand((size_t)B * V);
    tr_sample_row *drows = dev_put(rows, (size_t)B * sizeof(tr_sample_row));
    int32_t *ids = dev_put(NULL, (size_t)B * sizeof(int32_t)), *n_near = dev_put(NULL, 4);
    float *lp = dev_rand(B);
    void *scratch = dev_put(NULL, gpu.ops->sample_scratch_bytes(&gpu, B, V));
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->sample(&gpu, ids, lp, logits, drows, B, V, scratch, n_near);
        gpu_sync();
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  sample B=%d V=%d T=%.1f top_k=%d top_p=%.2f       %8.3f ms\n", B, V,
           (double)temperature, top_k, (double)top_p, best * 1e3);
    void *bufs[6] = {logits, drows, ids, n_near, lp, scratch};
    for (int i = 0; i < 6; i++) tr_cuda_free(bufs[i]);
    free(rows);
}

int main(int argc, char **argv) {
    int32_t cpu_threads = argc > 1 ? atoi(argv[1]) : 0;
    if (tr_cuda_device_count() == 0) {
        printf("bench_cuda: no CUDA device\n");
        return 1;
    }
    char msg[512];
    tr_cuda_device_info info;
    if (tr_cuda_device_query(0, &info, msg, sizeof msg) != 0) fail("device", msg);
    if (tr_backend_cuda_init(&gpu, 0) != 0) {
        tr_backend_cuda_status(&gpu, msg, sizeof msg);
        fail("tr_backend_cuda_init", msg);
    }
    tr_backend cpu;
    if (tr_backend_cpu_init(&cpu, cpu_threads < 0 ? 0 : cpu_threads) != 0)
        fail("tr_backend_cpu_init", "cannot start threads");
    printf("cuda backend (fp32, no TF32) on %s, sm_%d%d, %d SMs; cpu ratios with %d threads\n",
           info.name, info.major, info.minor, info.n_sms, cpu.n_threads);

    // hidden 256, 4 heads of 64 with 2 kv heads, SwiGLU 1024, vocabulary 8192: 8 layers ~ 10M
    static const mm_shape small[] = {
        {"qkv", 1024, 256, 512}, {"o", 1024, 256, 256}, {"gate/up", 1024, 256, 1024},
        {"down", 1024, 1024, 256}, {"lm_head", 1024, 256, 8192},
    };
    // one layer of a 7B-class model (Mistral 7B / Llama 3 8B widths) at T = 4096
    static const mm_shape big[] = {
        {"qkvo", 4096, 4096, 4096}, {"gate/up", 4096, 4096, 14336}, {"down", 4096, 14336, 4096},
    };
    printf("10M model:\n");
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) bench_matmul(&small[i], &cpu);
    bench_attention(1024, 1, 4, 2, 64, &cpu);
    bench_attention(1024, 4, 4, 2, 64, &cpu);
    bench_decode(16, 512, 4, 2, 64);
    printf("7B layer:\n");
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) bench_matmul(&big[i], NULL);
    bench_attention(4096, 1, 32, 8, 128, NULL);
    bench_decode(16, 4096, 32, 8, 128);
    bench_embedding(4096, 4096, 32000);
    bench_embedding(32768, 4096, 128256);
    bench_sumsq((size_t)1 << 28);   // the gradients of 268M parameters (1 GiB)
    printf("sampling (V of Qwen2 / Llama 3):\n");
    bench_sample(64, 152064, 0.0f, 0, 1.0f);
    bench_sample(64, 152064, 1.0f, 0, 1.0f);
    bench_sample(64, 152064, 0.7f, 50, 1.0f);
    bench_sample(64, 152064, 1.0f, 0, 0.9f);
    tr_backend_cpu_free(&cpu);
    tr_backend_cuda_free(&gpu);
    return 0;
}
