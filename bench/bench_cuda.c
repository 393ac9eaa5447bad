// CUDA backend speed in both precisions: GFLOP/s of the linear layers at the sizes of a
// ~10M-parameter model (with the fp32 CPU backend's ratio beside them) and of one 7B Llama
// layer (T = 4096), and milliseconds of attention forward/backward and decode over a fused
// [q;k;v] buffer, fp32 next to bf16; then the embedding backward, the gradient's sum of
// squares, the LM head's log-softmax and token sampling. The attention section times the bf16 tensor-core kernels at
// model shapes, dense and packed into documents (TFLOP/s counted per document, causal), and
// decode's HBM bandwidth; bench/attention_peer.py runs torch on the same shapes beside it.
// Run by hand or by tools/gpu_suite.sh: build-*/bench/bench_cuda [cpu_threads], or
// build-*/bench/bench_cuda attention [SHAPE] for that section alone (with SHAPE, say
// qwen05b_dense, only that training shape: for a profiler; `attention decode [B CTX H KVH D]`
// decode attention alone, at every decode shape or at one). Best of a few repetitions after
// one warm-up. `bench_cuda gemm` times every cuBLASLt candidate (no split-K) of the products
// of a Qwen2.5-0.5B/1.5B training step at 16K tokens, the backend's choice marked;
// `bench_cuda sample` the sampler and the log-softmax at decode batches of the Qwen vocabulary;
// `bench_cuda gemm_decode` every candidate of a decode step's products (cuBLASLt's, whole and
// split, and the sequential-k kernel's configurations, "seqk"), with its bits against the
// batch-invariant plan's.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "kernels/ops.h"

#define REPS 3

static tr_backend gpu, gpu32;   // bf16 (the default) and fp32

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

// Device copy of host data (or of random fp32 data when host is NULL).
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

// n random values of dtype t (bf16: the fp32 values rounded to nearest even).
static void *dev_rand_t(size_t n, tr_dt t, float scale) {
    float *h = host_rand(n, scale);
    void *d;
    if (t == TR_F32) {
        d = dev_put(h, n * sizeof(float));
    } else {
        uint16_t *b = malloc((n ? n : 1) * sizeof(uint16_t));
        if (!b) fail("malloc", "out of memory");
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, &h[i], 4);
            b[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);   // finite values only
        }
        d = dev_put(b, n * sizeof(uint16_t));
        free(b);
    }
    free(h);
    return d;
}

static void gpu_sync(tr_backend *be) {
    char msg[512];
    if (tr_backend_cuda_status(be, msg, sizeof msg) != 0) fail("cuda backend", msg);
}

typedef struct mm_shape {
    const char *name;
    int32_t T, IC, OC;
} mm_shape;

// Best forward and backward (din + dw) seconds of one shape on a backend, in its precision;
// buffers are device memory when on_gpu.
static void time_matmul(tr_backend *be, int on_gpu, const mm_shape *s, double *fwd,
                        double *bwd) {
    size_t nin = (size_t)s->T * s->IC, nw = (size_t)s->OC * s->IC, nout = (size_t)s->T * s->OC;
    void *in, *w, *out, *din;
    float *dw;
    if (on_gpu) {
        in = dev_rand_t(nin, be->act, 1); w = dev_rand_t(nw, be->wt, 0.1f);
        out = dev_rand_t(nout, be->act, 1); din = dev_rand_t(nin, be->act, 1);
        dw = dev_rand(nw);
    } else {
        in = host_rand(nin, 1); w = host_rand(nw, 0.1f); out = host_rand(nout, 1);
        din = host_rand(nin, 0); dw = host_rand(nw, 0);
    }
    *fwd = *bwd = 1e30;
    for (int r = 0; r <= REPS; r++) {   // r = 0 warms up (cuBLAS plans, clocks)
        double t0 = now_s();
        be->ops->matmul_forward(be, out, in, w, NULL, s->T, s->IC, s->OC, 0);
        if (on_gpu) gpu_sync(be);
        double t1 = now_s();
        be->ops->matmul_backward(be, din, dw, NULL, out, in, w, s->T, s->IC, s->OC);
        if (on_gpu) gpu_sync(be);
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
    double ff, fb, bf, bb, cf = 0, cb = 0;
    time_matmul(&gpu32, 1, s, &ff, &fb);
    time_matmul(&gpu, 1, s, &bf, &bb);
    double flops = 2.0 * s->T * s->IC * s->OC;
    printf("  matmul %-8s T=%-5d IC=%-5d OC=%-5d  fp32 fwd %7.0f bwd %7.0f  bf16 fwd %7.0f bwd "
           "%7.0f GFLOP/s", s->name, s->T, s->IC, s->OC, flops / ff * 1e-9, 2 * flops / fb * 1e-9,
           flops / bf * 1e-9, 2 * flops / bb * 1e-9);
    if (cpu) {
        time_matmul(cpu, 0, s, &cf, &cb);
        printf("  (fp32 x%.0f / x%.0f cpu)", cf / ff, cb / fb);
    }
    printf("\n");
}

// Best forward and backward seconds of the CPU backend on host copies of random data.
static void time_attention_cpu(tr_backend *cpu, const tr_doc_layout *host_docs, int32_t H,
                               int32_t KVH, int32_t D, double *fwd, double *bwd) {
    int32_t T = host_docs->n_tokens, ld = (H + 2 * KVH) * D;
    size_t nq = (size_t)T * H * D, nqkv = (size_t)T * ld;
    float *qkv = host_rand(nqkv, 2), *dqkv = host_rand(nqkv, 0);
    float *out = host_rand(nq, 0), *lse = host_rand((size_t)T * H, 0);
    float *k = qkv + (size_t)H * D, *v = k + (size_t)KVH * D;
    *fwd = *bwd = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        cpu->ops->attention_forward(cpu, out, lse, qkv, k, v, ld, host_docs, H, KVH, D);
        double t1 = now_s();
        cpu->ops->attention_backward(cpu, dqkv, dqkv + (size_t)H * D,
                                     dqkv + (size_t)(H + KVH) * D, out, out, lse, qkv, k, v, ld,
                                     host_docs, H, KVH, D);
        double t2 = now_s();
        if (t1 - t0 < *fwd) *fwd = t1 - t0;
        if (t2 - t1 < *bwd) *bwd = t2 - t1;
    }
    free(qkv); free(dqkv); free(out); free(lse);
}

// Forward and backward over one fused [q;k;v] buffer (rows of stride (H + 2 KVH) D), the
// gradients into another, on one GPU backend.
static void time_attention(tr_backend *be, const tr_doc_layout *docs, int32_t H, int32_t KVH,
                           int32_t D, double *fwd, double *bwd) {
    int32_t T = docs->n_tokens, ld = (H + 2 * KVH) * D;
    size_t nq = (size_t)T * H * D, nqkv = (size_t)T * ld, es = tr_dt_size(be->act);
    char *qkv = dev_rand_t(nqkv, be->act, 2), *dqkv = dev_rand_t(nqkv, be->act, 0);
    void *out = dev_rand_t(nq, be->act, 1);
    float *lse = dev_rand((size_t)T * H);
    char *k = qkv + (size_t)H * D * es, *v = qkv + (size_t)(H + KVH) * D * es;
    *fwd = *bwd = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        be->ops->attention_forward(be, out, lse, qkv, k, v, ld, docs, H, KVH, D);
        gpu_sync(be);
        double t1 = now_s();
        be->ops->attention_backward(be, dqkv, dqkv + (size_t)H * D * es,
                                    dqkv + (size_t)(H + KVH) * D * es, out, out, lse, qkv, k, v,
                                    ld, docs, H, KVH, D);
        gpu_sync(be);
        double t2 = now_s();
        if (r > 0 && t1 - t0 < *fwd) *fwd = t1 - t0;
        if (r > 0 && t2 - t1 < *bwd) *bwd = t2 - t1;
    }
    void *bufs[4] = {qkv, dqkv, out, lse};
    for (int i = 0; i < 4; i++) tr_cuda_free(bufs[i]);
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
    double ff, fb, bf, bb;
    time_attention(&gpu32, &docs, H, KVH, D, &ff, &fb);
    time_attention(&gpu, &docs, H, KVH, D, &bf, &bb);
    printf("  attention T=%d docs=%d H=%d KVH=%d D=%-3d  fp32 fwd %8.2f bwd %8.2f  bf16 fwd %8.2f "
           "bwd %8.2f ms", T, n_docs, H, KVH, D, ff * 1e3, fb * 1e3, bf * 1e3, bb * 1e3);
    if (cpu) {
        tr_doc_layout host_docs = {.n_tokens = T, .n_docs = n_docs, .doc_start = doc_start,
                                   .pos = pos};
        double cf, cb;
        time_attention_cpu(cpu, &host_docs, H, KVH, D, &cf, &cb);
        printf("  (fp32 x%.1f / x%.1f cpu)", cf / ff, cb / fb);
    }
    printf("\n");
    tr_cuda_free((void *)docs.doc_start);
    tr_cuda_free((void *)docs.pos);
    free(doc_start);
    free(pos);
}

// B sequences of ctx tokens each in a paged cache of 16-token blocks, one query per sequence
// (rows of a fused [q;k;v] width).
static double time_decode(tr_backend *be, int32_t B, int32_t ctx, int32_t H, int32_t KVH,
                          int32_t D) {
    int32_t bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = B * max_blocks;
    int32_t ld = (H + 2 * KVH) * D;
    int32_t *table = malloc((size_t)n_blocks * sizeof(int32_t));
    int32_t *seq_len = malloc((size_t)B * sizeof(int32_t));
    if (!table || !seq_len) fail("malloc", "out of memory");
    for (int32_t i = 0; i < n_blocks; i++) table[i] = (int32_t)(((int64_t)i * 7919) % n_blocks);
    for (int32_t b = 0; b < B; b++) seq_len[b] = ctx;
    size_t pool = (size_t)n_blocks * bs * KVH * D;
    tr_kv_pages kv = {.k_pool = dev_rand_t(pool, be->act, 1),
                      .v_pool = dev_rand_t(pool, be->act, 1), .block_size = bs,
                      .n_blocks = n_blocks, .n_kv_heads = KVH, .head_dim = D};
    int32_t *dtable = dev_put(table, (size_t)n_blocks * sizeof(int32_t));
    int32_t *dlen = dev_put(seq_len, (size_t)B * sizeof(int32_t));
    void *q = dev_rand_t((size_t)B * ld, be->act, 1);
    void *out = dev_rand_t((size_t)B * H * D, be->act, 1);
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        be->ops->attention_decode(be, out, q, ld, &kv, dtable, max_blocks, dlen, B, H);
        gpu_sync(be);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    void *bufs[6] = {kv.k_pool, kv.v_pool, dtable, dlen, q, out};
    for (int i = 0; i < 6; i++) tr_cuda_free(bufs[i]);
    free(table);
    free(seq_len);
    return best;
}

static void bench_decode(int32_t B, int32_t ctx, int32_t H, int32_t KVH, int32_t D) {
    double f = time_decode(&gpu32, B, ctx, H, KVH, D), b = time_decode(&gpu, B, ctx, H, KVH, D);
    printf("  attention_decode B=%d ctx=%d H=%d KVH=%d D=%-3d  fp32 %8.3f  bf16 %8.3f ms\n", B,
           ctx, H, KVH, D, f * 1e3, b * 1e3);
}

// Packed rows for the attention section, the same in bench/attention_peer.py: documents of
// 256..2048 tokens drawn by this LCG (the last one cut to fit), or dense rows of `dense`
// tokens. Returns the number of documents; doc_start has room for T / 256 + 2 entries.
static int32_t attn_layout(int32_t *doc_start, int32_t T, int32_t dense) {
    int32_t n = 0, t = 0;
    uint32_t s = 20240607u;
    doc_start[0] = 0;
    while (t < T) {
        int32_t len = dense;
        if (!dense) {
            s = s * 1664525u + 1013904223u;
            len = 256 + (int32_t)((s >> 8) % 1793u);
        }
        t = t + len < T ? t + len : T;
        doc_start[++n] = t;
    }
    return n;
}

// Causal attention FLOPs of a layout, per document: 4 H D per (query, visible key) pair
// forward (Q K^T and P V), 2.5 times that backward (the usual five products' count).
static double attn_flops(const int32_t *doc_start, int32_t n_docs, int32_t H, int32_t D) {
    double pairs = 0;
    for (int32_t d = 0; d < n_docs; d++) {
        double len = doc_start[d + 1] - doc_start[d];
        pairs += 0.5 * len * (len + 1);
    }
    return 4.0 * H * D * pairs;
}

// The bf16 kernels on one shape: best of REPS, each REPS_IN calls between syncs (so the host's
// sync does not count). One line for people and bench/attention_peer.py ("attn" key=value).
#define REPS_IN 5
static void bench_flash(const char *shape, int32_t T, int32_t dense, int32_t H, int32_t KVH,
                        int32_t D) {
    int32_t *doc_start = malloc((size_t)(T / 256 + 2) * sizeof(int32_t));
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    if (!doc_start || !pos) fail("malloc", "out of memory");
    int32_t n_docs = attn_layout(doc_start, T, dense);
    for (int32_t d = 0; d < n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++) pos[t] = t - doc_start[d];
    tr_doc_layout docs = {.n_tokens = T, .n_docs = n_docs,
                          .doc_start = dev_put(doc_start, (size_t)(n_docs + 1) * sizeof(int32_t)),
                          .pos = dev_put(pos, (size_t)T * sizeof(int32_t))};
    int32_t ld = (H + 2 * KVH) * D;
    size_t nq = (size_t)T * H * D, nqkv = (size_t)T * ld, es = 2;
    char *qkv = dev_rand_t(nqkv, TR_BF16, 2), *dqkv = dev_rand_t(nqkv, TR_BF16, 0);
    void *out = dev_rand_t(nq, TR_BF16, 1), *dout = dev_rand_t(nq, TR_BF16, 1);
    float *lse = dev_rand((size_t)T * H);
    char *k = qkv + (size_t)H * D * es, *v = qkv + (size_t)(H + KVH) * D * es;
    gpu.ops->attention_forward(&gpu, out, lse, qkv, k, v, ld, &docs, H, KVH, D);   // real lse
    gpu_sync(&gpu);
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        for (int i = 0; i < REPS_IN; i++)
            gpu.ops->attention_forward(&gpu, out, lse, qkv, k, v, ld, &docs, H, KVH, D);
        gpu_sync(&gpu);
        double t1 = now_s();
        for (int i = 0; i < REPS_IN; i++)
            gpu.ops->attention_backward(&gpu, dqkv, dqkv + (size_t)H * D * es,
                                        dqkv + (size_t)(H + KVH) * D * es, dout, out, lse, qkv,
                                        k, v, ld, &docs, H, KVH, D);
        gpu_sync(&gpu);
        double t2 = now_s();
        if (r > 0 && (t1 - t0) / REPS_IN < fwd) fwd = (t1 - t0) / REPS_IN;
        if (r > 0 && (t2 - t1) / REPS_IN < bwd) bwd = (t2 - t1) / REPS_IN;
    }
    double f = attn_flops(doc_start, n_docs, H, D);
    printf("attn shape=%s T=%d docs=%d H=%d KVH=%d D=%d fwd_ms=%.3f bwd_ms=%.3f "
           "fwd_tflops=%.1f bwd_tflops=%.1f\n", shape, T, n_docs, H, KVH, D, fwd * 1e3,
           bwd * 1e3, f / fwd * 1e-12, 2.5 * f / bwd * 1e-12);
    void *bufs[7] = {qkv, dqkv, out, dout, lse, (void *)docs.doc_start, (void *)docs.pos};
    for (int i = 0; i < 7; i++) tr_cuda_free(bufs[i]);
    free(doc_start);
    free(pos);
}

// Device-to-device copy bandwidth (bytes read + written per second) over 1 GiB: the ceiling
// decode's bandwidth is measured against.
static double bench_copy_bandwidth(void) {
    size_t n = (size_t)1 << 30;
    void *a = dev_put(NULL, n), *b = dev_put(NULL, n);
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->copy(&gpu, b, a, n);
        gpu_sync(&gpu);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    tr_cuda_free(a);
    tr_cuda_free(b);
    double bw = 2.0 * (double)n / best;
    printf("attn_copy GBps=%.0f (device-to-device, 1 GiB read + written)\n", bw * 1e-9);
    return bw;
}

// bf16 decode of B sequences of ctx tokens (16-token blocks, scattered): microseconds per
// call and the bandwidth of the K and V bytes read. Consecutive calls use different copies of
// the cache, 256 MiB or more in all, so that L2 (50 MiB) holds none of what a call reads.
static void bench_decode_bw_with(const char *shape, int32_t B, int32_t ctx, int32_t H,
                                 int32_t KVH, int32_t D, double copy_bw, const char *kernel) {
    int32_t bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = B * max_blocks;
    int32_t ld = (H + 2 * KVH) * D;
    int32_t *table = malloc((size_t)n_blocks * sizeof(int32_t));
    int32_t *seq_len = malloc((size_t)B * sizeof(int32_t));
    if (!table || !seq_len) fail("malloc", "out of memory");
    for (int32_t i = 0; i < n_blocks; i++) table[i] = (int32_t)(((int64_t)i * 7919) % n_blocks);
    for (int32_t b = 0; b < B; b++) seq_len[b] = ctx;
    size_t pool = (size_t)n_blocks * bs * KVH * D, pool_bytes = 2 * pool * 2;
    int n_copies = (int)(((size_t)256 << 20) / pool_bytes) + 1;
    if (n_copies > 64) n_copies = 64;
    tr_kv_pages kv[64];
    for (int c = 0; c < n_copies; c++)
        kv[c] = (tr_kv_pages){.k_pool = dev_rand_t(pool, TR_BF16, 1),
                              .v_pool = dev_rand_t(pool, TR_BF16, 1), .block_size = bs,
                              .n_blocks = n_blocks, .n_kv_heads = KVH, .head_dim = D};
    int32_t *dtable = dev_put(table, (size_t)n_blocks * sizeof(int32_t));
    int32_t *dlen = dev_put(seq_len, (size_t)B * sizeof(int32_t));
    void *q = dev_rand_t((size_t)B * ld, TR_BF16, 1);
    void *out = dev_rand_t((size_t)B * H * D, TR_BF16, 1);
    int calls = n_copies < 20 ? 40 : 2 * n_copies;
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        for (int i = 0; i < calls; i++)
            gpu.ops->attention_decode(&gpu, out, q, ld, &kv[i % n_copies], dtable, max_blocks,
                                      dlen, B, H);
        gpu_sync(&gpu);
        double t1 = now_s();
        if (r > 0 && (t1 - t0) / calls < best) best = (t1 - t0) / calls;
    }
    double bytes = 2.0 * B * (double)ctx * KVH * D * 2;
    printf("attn_decode shape=%s B=%d ctx=%d H=%d KVH=%d D=%d kernel=%s us=%.2f GBps=%.0f "
           "of_copy=%.0f%% of_4.3TBps=%.0f%%\n", shape, B, ctx, H, KVH, D, kernel, best * 1e6,
           bytes / best * 1e-9, 100.0 * bytes / best / copy_bw, 100.0 * bytes / best / 4.3e12);
    for (int c = 0; c < n_copies; c++) {
        tr_cuda_free(kv[c].k_pool);
        tr_cuda_free(kv[c].v_pool);
    }
    void *bufs[4] = {dtable, dlen, q, out};
    for (int i = 0; i < 4; i++) tr_cuda_free(bufs[i]);
    free(table);
    free(seq_len);
}

// Every decode kernel (the per-warp walk, the shared chunk, tr_backend_cuda_decode_coop, and
// the split walk, tr_backend_cuda_decode_split, wherever it fits: otherwise the walk), then
// the backend's rule.
static void bench_decode_bw(const char *shape, int32_t B, int32_t ctx, int32_t H, int32_t KVH,
                            int32_t D, double copy_bw) {
    static const char *names[4] = {"walk", "shared", "split", "rule"};
    for (int mode = 0; mode < 4; mode++) {
        const int was = tr_backend_cuda_decode_coop(&gpu, mode == 1 ? 1 : mode == 3 ? -1 : 0);
        const int split_was = mode == 2 ? tr_backend_cuda_decode_split(&gpu, 1) : -2;
        if (split_was != -1) bench_decode_bw_with(shape, B, ctx, H, KVH, D, copy_bw, names[mode]);
        if (split_was >= 0) tr_backend_cuda_decode_split(&gpu, split_was);
        tr_backend_cuda_decode_coop(&gpu, was);
    }
}

static void bench_decode_section(void);

// The shapes of issue 13 (7B layer at T = 4096; Qwen2.5-0.5B and -1.5B at sequence 2048 x
// micro-batch, dense and packed into RL documents of 256..2048 tokens in 16K rows) and the
// decode shapes of issue 14.
// only: one training shape's name, or NULL for every shape and decode.
static void bench_attention_section(const char *only) {
    static const struct {
        const char *name;
        int32_t T, dense, H, KVH, D;
    } shapes[] = {
        {"7b_dense", 4096, 4096, 32, 8, 128},       {"7b_packed", 16384, 0, 32, 8, 128},
        {"qwen05b_dense", 16384, 2048, 14, 2, 64},  {"qwen05b_packed", 16384, 0, 14, 2, 64},
        {"qwen15b_dense", 8192, 2048, 12, 2, 128},  {"qwen15b_packed", 16384, 0, 12, 2, 128},
    };
    printf("attention, bf16 tensor-core kernels (ms per call; TFLOP/s per document, causal):\n");
    int ran = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        if (only && strcmp(only, shapes[i].name) != 0) continue;
        bench_flash(shapes[i].name, shapes[i].T, shapes[i].dense, shapes[i].H, shapes[i].KVH,
                    shapes[i].D);
        ran++;
    }
    if (only) {
        if (!ran) fail("bench_cuda attention", "no such shape");
        return;
    }
    bench_decode_section();
}

// Decode attention at issue 14's shapes against the device's copy bandwidth.
static void bench_decode_section(void) {
    printf("decode attention, bf16 (K and V bytes read per second):\n");
    double bw = bench_copy_bandwidth();
    for (int32_t ctx = 512; ctx <= 4096; ctx *= 2)
        bench_decode_bw("qwen05b", 64, ctx, 14, 2, 64, bw);
    bench_decode_bw("qwen05b", 256, 512, 14, 2, 64, bw);
    bench_decode_bw("qwen15b", 64, 512, 12, 2, 128, bw);
    bench_decode_bw("qwen15b", 64, 2048, 12, 2, 128, bw);
    bench_decode_bw("7b", 16, 4096, 32, 8, 128, bw);
    bench_decode_bw("7b", 64, 1024, 32, 8, 128, bw);
    bench_decode_bw("7b", 1, 32768, 32, 8, 128, bw);
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
        gpu_sync(&gpu);
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
        gpu_sync(&gpu);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  sumsq n=%-10zu                                %8.3f ms\n", n, best * 1e3);
    tr_cuda_free(x);
    tr_cuda_free(acc);
}

// The LM head's log-softmax over T rows of V logits of the backend's activation dtype: the
// forward, then the backward with both loss terms written over the logits, as the engine
// runs it. GB/s counts the passes over the logits each makes: the forward reads them twice,
// the backward three times (the entropy term's mean, then the gradient) and writes them once.
static void bench_logsoftmax(tr_backend *be, int32_t T, int32_t V) {
    size_t n = (size_t)T * V, bytes = n * tr_dt_size(be->act);
    int32_t *tg_h = malloc((size_t)T * sizeof(int32_t));
    if (!tg_h) fail("malloc", "out of memory");
    for (int32_t t = 0; t < T; t++) tg_h[t] = (int32_t)(((int64_t)t * 7919) % V);
    void *x = dev_rand_t(n, be->act, 8.0f);
    int32_t *tg = dev_put(tg_h, (size_t)T * sizeof(int32_t));
    float *lp = dev_rand(T), *ent = dev_rand(T), *lse = dev_rand(T), *g = dev_rand(T);
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        be->ops->logsoftmax_forward(be, lp, ent, lse, x, tg, T, V);
        gpu_sync(be);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < fwd) fwd = t1 - t0;
    }
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        be->ops->logsoftmax_backward(be, x, g, g, x, lse, tg, T, V);
        gpu_sync(be);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < bwd) bwd = t1 - t0;
    }
    printf("  logsoftmax %s T=%d V=%-6d forward %7.3f ms (%4.0f GB/s), backward in place "
           "%7.3f ms (%4.0f GB/s)\n", tr_dt_name(be->act), T, V, fwd * 1e3,
           2.0 * bytes / fwd / 1e9, bwd * 1e3, 4.0 * bytes / bwd / 1e9);
    void *bufs[6] = {x, tg, lp, ent, lse, g};
    for (int i = 0; i < 6; i++) tr_cuda_free(bufs[i]);
    free(tg_h);
}

// B rows of V logits (the activation dtype) drawn with one parameter set.
static void bench_sample(int32_t B, int32_t V, float temperature, int32_t top_k, float top_p) {
    tr_sample_row *rows = malloc((size_t)B * sizeof(tr_sample_row));
    if (!rows) fail("malloc", "out of memory");
    for (int32_t b = 0; b < B; b++)
        rows[b] = (tr_sample_row){.temperature = temperature, .top_k = top_k, .top_p = top_p,
                                  .seed = 1000 + (uint64_t)b, .counter = 0, .used = 4};
    void *logits = dev_rand_t((size_t)B * V, gpu.act, 1.0f);
    tr_sample_row *drows = dev_put(rows, (size_t)B * sizeof(tr_sample_row));
    int32_t *ids = dev_put(NULL, (size_t)B * sizeof(int32_t)), *n_near = dev_put(NULL, 4);
    float *lp = dev_rand(B);
    void *scratch = dev_put(NULL, gpu.ops->sample_scratch_bytes(&gpu, B, V));
    double best = 1e30;
    for (int r = 0; r <= REPS; r++) {
        double t0 = now_s();
        gpu.ops->sample(&gpu, ids, lp, logits, drows, B, V, tr_sample_rows_ranked(rows, B, V),
                        scratch, n_near);
        gpu_sync(&gpu);
        double t1 = now_s();
        if (r > 0 && t1 - t0 < best) best = t1 - t0;
    }
    printf("  sample B=%d V=%d T=%.1f top_k=%d top_p=%.2f       %8.3f ms\n", B, V,
           (double)temperature, top_k, (double)top_p, best * 1e3);
    void *bufs[6] = {logits, drows, ids, n_near, lp, scratch};
    for (int i = 0; i < 6; i++) tr_cuda_free(bufs[i]);
    free(rows);
}

// The products of a training step of a model of hidden C, [q;k;v] width QKV, SwiGLU I and
// vocabulary V over T tokens, each as matmul.cu issues it (column-major, transposed): the
// forward (bf16 out, with the bias for [q;k;v]; fp32 added into the residual for o and down),
// the input gradient (bf16) and the weight gradient (fp32, added into). The LM head's over
// R rows a chunk.
static void bench_gemm_model(const char *name, int64_t C, int64_t QKV, int64_t I, int64_t V,
                             int64_t T, int64_t R) {
    printf("%s, %lld tokens (LM head %lld rows a chunk):\n", name, (long long)T, (long long)R);
    const struct { const char *n; int64_t ic, oc; int bias, res; } L[] = {
        {"qkv", C, QKV, 1, 0}, {"o", C, C, 0, 1}, {"gate/up", C, 2 * I, 0, 0}, {"down", I, C, 0, 1},
    };
    const int N = 0, Tr = 1;
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
        char f[32], d[32], w[32];
        snprintf(f, sizeof f, "%s fwd", L[i].n);
        snprintf(d, sizeof d, "%s dgrad", L[i].n);
        snprintf(w, sizeof w, "%s wgrad", L[i].n);
        tr_backend_cuda_gemm_probe(&gpu, Tr, N, L[i].oc, T, L[i].ic, L[i].res, L[i].res,
                                   L[i].bias, f);
        tr_backend_cuda_gemm_probe(&gpu, N, N, L[i].ic, T, L[i].oc, 0, 0, 0, d);
        tr_backend_cuda_gemm_probe(&gpu, N, Tr, L[i].ic, L[i].oc, T, 1, 1, 0, w);
    }
    tr_backend_cuda_gemm_probe(&gpu, Tr, N, V, R, C, 0, 0, 0, "lm_head fwd");
    tr_backend_cuda_gemm_probe(&gpu, N, N, C, R, V, 0, 0, 0, "lm_head dgrad");
    tr_backend_cuda_gemm_probe(&gpu, N, Tr, C, V, R, 1, 1, 0, "lm_head wgrad");
}

// The forward products of a decode step of the same models at 64 and 256 rows: every
// algorithm the heuristic offers and every configuration of the sequential-k kernel, timed,
// with its outputs' bits against the batch-invariant plan's (whose algorithm is the training
// forward's).
static void bench_gemm_decode(const char *name, int64_t C, int64_t QKV, int64_t I, int64_t V) {
    const struct { const char *n; int64_t ic, oc; int bias, res; } L[] = {
        {"qkv", C, QKV, 1, 0}, {"o", C, C, 0, 1}, {"gate/up", C, 2 * I, 0, 0},
        {"down", I, C, 0, 1}, {"lm_head", C, V, 0, 0},
    };
    const int64_t Ts[] = {64, 256};
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
        printf("%s, decode products at %lld rows:\n", name, (long long)Ts[t]);
        for (size_t i = 0; i < sizeof L / sizeof L[0]; i++)
            tr_backend_cuda_gemm_decode_probe(&gpu, Ts[t], L[i].ic, L[i].oc, L[i].res, L[i].res,
                                              L[i].bias, L[i].n);
    }
}

// The end of a section run alone: the bf16 backend's failure, if one was recorded, and both
// backends freed. Returns main's exit status.
static int section_end(const char *section) {
    char msg[512];
    int rc = tr_backend_cuda_status(&gpu, msg, sizeof msg);
    if (rc) fprintf(stderr, "bench_cuda %s: %s\n", section, msg);
    tr_backend_cuda_free(&gpu32);
    tr_backend_cuda_free(&gpu);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    int attention_only = argc > 1 && strcmp(argv[1], "attention") == 0;
    int gemm_only = argc > 1 && strcmp(argv[1], "gemm") == 0;
    int sample_only = argc > 1 && strcmp(argv[1], "sample") == 0;
    int decode_only = argc > 1 && strcmp(argv[1], "gemm_decode") == 0;
    int32_t cpu_threads = argc > 1 && !attention_only && !gemm_only && !sample_only &&
                                  !decode_only ? atoi(argv[1]) : 0;
    if (tr_cuda_device_count() == 0) {
        printf("bench_cuda: no CUDA device\n");
        return 1;
    }
    char msg[512];
    tr_cuda_device_info info;
    if (tr_cuda_device_query(0, &info, msg, sizeof msg) != 0) fail("device", msg);
    if (tr_backend_cuda_init(&gpu, 0, TR_BF16, -1) != 0) {
        tr_backend_cuda_status(&gpu, msg, sizeof msg);
        fail("tr_backend_cuda_init bf16", msg);
    }
    if (tr_backend_cuda_init(&gpu32, 0, TR_F32, -1) != 0) {
        tr_backend_cuda_status(&gpu32, msg, sizeof msg);
        fail("tr_backend_cuda_init fp32", msg);
    }
    if (sample_only) {   // a decode step's draw at the Qwen vocabulary, by parameters
        const int32_t Bs[] = {64, 256};
        for (int i = 0; i < 2; i++) {
            bench_sample(Bs[i], 151936, 0.0f, 0, 1.0f);
            bench_sample(Bs[i], 151936, 1.0f, 0, 1.0f);
            bench_sample(Bs[i], 151936, 1.0f, 0, 0.9f);
            // top-k ranked by a sort of the whole row, then by the select (sample_topk.cuh, the
            // default), k 50 and 20 with top-p 0.8 (Qwen2.5-Instruct's generation settings)
            tr_backend_cuda_topk_select(&gpu, 0);
            printf("  (top-k by sort)\n");
            bench_sample(Bs[i], 151936, 1.0f, 50, 1.0f);
            bench_sample(Bs[i], 151936, 0.7f, 20, 0.8f);
            tr_backend_cuda_topk_select(&gpu, 1);
            printf("  (top-k by select)\n");
            bench_sample(Bs[i], 151936, 1.0f, 50, 1.0f);
            bench_sample(Bs[i], 151936, 0.7f, 20, 0.8f);
            bench_logsoftmax(&gpu, Bs[i], 151936);
        }
        return section_end("sample");
    }
    if (decode_only) {
        bench_gemm_decode("qwen2.5-0.5b", 896, 1152, 4864, 151936);
        bench_gemm_decode("qwen2.5-1.5b", 1536, 2048, 8960, 151936);
        return section_end("gemm_decode");
    }
    if (gemm_only) {
        bench_gemm_model("qwen2.5-0.5b", 896, 1152, 4864, 151936, 16384, 16384);
        bench_gemm_model("qwen2.5-1.5b", 1536, 2048, 8960, 151936, 8192, 8192);
        return section_end("gemm");
    }
    if (attention_only) {
        printf("cuda backend on %s, sm_%d%d, %d SMs\n", info.name, info.major, info.minor,
               info.n_sms);
        if (argc > 2 && strcmp(argv[2], "decode") == 0) {
            // one decode shape (B ctx H KVH D), or all of them
            double bw = argc > 7 ? bench_copy_bandwidth() : 0;
            if (argc > 7)
                bench_decode_bw("custom", atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                                atoi(argv[6]), atoi(argv[7]), bw);
            else
                bench_decode_section();
        } else {
            bench_attention_section(argc > 2 ? argv[2] : NULL);
        }
        tr_backend_cuda_free(&gpu32);
        tr_backend_cuda_free(&gpu);
        return 0;
    }
    tr_backend cpu;
    if (tr_backend_cpu_init(&cpu, cpu_threads < 0 ? 0 : cpu_threads, TR_F32) != 0)
        fail("tr_backend_cpu_init", "cannot start threads");
    printf("cuda backend on %s, sm_%d%d, %d SMs: fp32 (sgemm, no TF32) and bf16 (cuBLASLt, fp32 "
           "accumulation); cpu fp32 ratios with %d threads\n",
           info.name, info.major, info.minor, info.n_sms, cpu.n_threads);

    // hidden 256, 4 heads of 64 with 2 kv heads, SwiGLU 1024, vocabulary 8192: 8 layers ~ 10M
    static const mm_shape small[] = {
        {"qkv", 1024, 256, 512}, {"o", 1024, 256, 256}, {"gate/up", 1024, 256, 2048},
        {"down", 1024, 1024, 256}, {"lm_head", 1024, 256, 8192},
    };
    // one layer of a 7B-class model (Mistral 7B / Llama 3 8B widths) at T = 4096, fused
    // projections as the engine runs them; and one decode step of 64 sequences
    static const mm_shape big[] = {
        {"qkv", 4096, 4096, 6144}, {"o", 4096, 4096, 4096}, {"gate/up", 4096, 4096, 28672},
        {"down", 4096, 14336, 4096}, {"decode", 64, 4096, 6144},
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
    bench_attention_section(NULL);
    bench_embedding(4096, 4096, 32000);
    bench_embedding(32768, 4096, 128256);
    bench_sumsq((size_t)1 << 28);   // the gradients of 268M parameters (1 GiB)
    printf("LM head log-softmax (a chunk of 2048 rows; V of Qwen2, and a third of it, odd):\n");
    bench_logsoftmax(&gpu, 2048, 151936);
    bench_logsoftmax(&gpu32, 2048, 151936);
    bench_logsoftmax(&gpu, 2048, 50645);
    printf("sampling (V of Qwen2 / Llama 3):\n");
    bench_sample(64, 152064, 0.0f, 0, 1.0f);
    bench_sample(64, 152064, 1.0f, 0, 1.0f);
    bench_sample(64, 152064, 0.7f, 50, 1.0f);
    bench_sample(64, 152064, 1.0f, 0, 0.9f);
    tr_backend_cpu_free(&cpu);
    tr_backend_cuda_free(&gpu32);
    tr_backend_cuda_free(&gpu);
    return 0;
}
