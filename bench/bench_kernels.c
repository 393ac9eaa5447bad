// CPU kernel speed at the sizes of a ~10M-parameter Llama-style model (hidden 256, T = 1024):
// GFLOP/s of the linear layers and milliseconds of attention forward/backward (q, k, v read
// from fused [q;k;v] rows) and decode, for 1 and 2 threads, in fp32 and in the emulated bf16
// mode (bf16 activations and weights, fp32 arithmetic). Run by hand:
// build-*/bench/bench_kernels [max_threads] [fp32|bf16]. Best of a few repetitions.
// Where OpenBLAS was found at build time, its single-threaded sgemm on the forward's shape is
// timed beside troupe's own fp32 product, as the reference for what a tuned BLAS does here.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ops.h"
#ifdef TR_BENCH_OPENBLAS
#include <cblas.h>
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *alloc_or_die(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(1);
    }
    return p;
}

// n values in [-scale/2, scale/2) as dtype t (bf16: the top half of the fp32, truncated; the
// values only need to be ordinary numbers).
static void *rand_buf(size_t n, float scale, tr_dt t) {
    void *p = alloc_or_die(n * tr_dt_size(t));
    uint32_t s = 12345u + (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float x = scale * ((float)(s >> 8) / 16777216.0f - 0.5f);
        if (t == TR_F32) {
            ((float *)p)[i] = x;
        } else {
            uint32_t u;
            memcpy(&u, &x, sizeof u);
            ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
        }
    }
    return p;
}

#define REPS 3

typedef struct mm_shape {
    const char *name;
    int32_t IC, OC;
} mm_shape;

static void bench_matmul(tr_backend *be, const mm_shape *s, int32_t T) {
    tr_dt A = be->act, W = be->wt;
    void *in = rand_buf((size_t)T * s->IC, 1, A), *w = rand_buf((size_t)s->OC * s->IC, 0.1f, W);
    void *out = rand_buf((size_t)T * s->OC, 1, A), *din = rand_buf((size_t)T * s->IC, 0, A);
    float *dw = rand_buf((size_t)s->OC * s->IC, 0, TR_F32);
    double flops = 2.0 * T * s->IC * s->OC, best_f = 1e30, best_b = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        be->ops->matmul_forward(be, out, in, w, NULL, T, s->IC, s->OC, 0);
        double t1 = now_s();
        be->ops->matmul_backward(be, din, dw, NULL, out, in, w, T, s->IC, s->OC);
        double t2 = now_s();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("  matmul %-8s T=%-5d IC=%-5d OC=%-5d  fwd %7.1f GFLOP/s  bwd %7.1f GFLOP/s", s->name,
           T, s->IC, s->OC, flops / best_f * 1e-9, 2 * flops / best_b * 1e-9);
#ifdef TR_BENCH_OPENBLAS
    if (be->n_threads == 1 && A == TR_F32) {
        double best_o = 1e30;
        for (int r = 0; r < REPS; r++) {
            double t0 = now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, s->OC, s->IC, 1.0f, in,
                        s->IC, w, s->IC, 0.0f, out, s->OC);
            double t1 = now_s();
            if (t1 - t0 < best_o) best_o = t1 - t0;
        }
        printf("  (openblas fwd %7.1f)", flops / best_o * 1e-9);
    }
#endif
    printf("\n");
    free(in); free(w); free(out); free(din); free(dw);
}

static void bench_attention(tr_backend *be, int32_t T, int32_t n_docs, int32_t H, int32_t KVH,
                            int32_t D) {
    tr_dt A = be->act;
    size_t es = tr_dt_size(A);
    int32_t *doc_start = alloc_or_die((size_t)(n_docs + 1) * sizeof(int32_t));
    int32_t *pos = alloc_or_die((size_t)T * sizeof(int32_t));
    for (int32_t d = 0; d <= n_docs; d++) doc_start[d] = (int32_t)((int64_t)T * d / n_docs);
    for (int32_t d = 0; d < n_docs; d++)
        for (int32_t t = doc_start[d]; t < doc_start[d + 1]; t++) pos[t] = t - doc_start[d];
    tr_doc_layout docs = {.n_tokens = T, .n_docs = n_docs, .doc_start = doc_start, .pos = pos};
    // one fused [q;k;v] projection per token, as the model's qkv matmul writes it
    int32_t ld = (H + 2 * KVH) * D;
    size_t nq = (size_t)T * H * D, k_at = (size_t)H * D * es, v_at = (size_t)(H + KVH) * D * es;
    char *qkv = rand_buf((size_t)T * ld, 2, A), *dqkv = rand_buf((size_t)T * ld, 0, A);
    void *out = rand_buf(nq, 0, A), *dout = rand_buf(nq, 1, A);
    float *lse = rand_buf((size_t)T * H, 0, TR_F32);
    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        be->ops->attention_forward(be, out, lse, qkv, qkv + k_at, qkv + v_at, ld, &docs, H, KVH,
                                   D);
        double t1 = now_s();
        be->ops->attention_backward(be, dqkv, dqkv + k_at, dqkv + v_at, dout, out, lse, qkv,
                                    qkv + k_at, qkv + v_at, ld, &docs, H, KVH, D);
        double t2 = now_s();
        if (t1 - t0 < best_f) best_f = t1 - t0;
        if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("  attention T=%d docs=%d H=%d KVH=%d D=%-3d        fwd %7.2f ms        bwd %7.2f ms\n",
           T, n_docs, H, KVH, D, best_f * 1e3, best_b * 1e3);
    free(doc_start); free(pos); free(qkv); free(dqkv); free(out); free(dout); free(lse);
}

// B sequences of ctx tokens each in a paged cache of 16-token blocks, one query per sequence.
static void bench_decode(tr_backend *be, int32_t B, int32_t ctx, int32_t H, int32_t KVH,
                         int32_t D) {
    tr_dt A = be->act;
    int32_t bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = B * max_blocks;
    void *kp = rand_buf((size_t)n_blocks * bs * KVH * D, 2, A);
    void *vp = rand_buf((size_t)n_blocks * bs * KVH * D, 1, A);
    void *q = rand_buf((size_t)B * H * D, 2, A), *out = rand_buf((size_t)B * H * D, 0, A);
    int32_t *table = alloc_or_die((size_t)n_blocks * sizeof(int32_t));
    int32_t *seq_len = alloc_or_die((size_t)B * sizeof(int32_t));
    for (int32_t i = 0; i < n_blocks; i++) table[i] = (i * 7919) % n_blocks;   // scattered
    for (int32_t b = 0; b < B; b++) seq_len[b] = ctx;
    tr_kv_pages kv = {.k_pool = kp, .v_pool = vp, .block_size = bs, .n_blocks = n_blocks,
                      .n_kv_heads = KVH, .head_dim = D};
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
        be->ops->attention_decode(be, out, q, H * D, &kv, table, max_blocks, seq_len, B, H);
        double t1 = now_s();
        if (t1 - t0 < best) best = t1 - t0;
    }
    printf("  attention_decode B=%d ctx=%d H=%d KVH=%d D=%-3d      %7.3f ms\n", B, ctx, H, KVH,
           D, best * 1e3);
    free(kp); free(vp); free(q); free(out); free(table); free(seq_len);
}

int main(int argc, char **argv) {
    int32_t max_threads = argc > 1 ? atoi(argv[1]) : 2;
    const char *only = argc > 2 ? argv[2] : NULL;
    if (only && strcmp(only, "fp32") != 0 && strcmp(only, "bf16") != 0) {
        fprintf(stderr, "usage: bench_kernels [max_threads] [fp32|bf16]\n");
        return 2;
    }
#ifdef TR_BENCH_OPENBLAS
    openblas_set_num_threads(1);
#endif
    if (max_threads < 1) max_threads = 1;
    const int32_t T = 1024;
    // hidden 256, 4 heads of 64 with 2 kv heads, SwiGLU 1024, vocabulary 8192: 8 layers ~ 10M
    static const mm_shape shapes[] = {
        {"qkv", 256, 512}, {"o", 256, 256}, {"gate/up", 256, 1024},
        {"down", 1024, 256}, {"lm_head", 256, 8192},
    };
    static const tr_dt precisions[] = {TR_F32, TR_BF16};
    for (int p = 0; p < 2; p++) {
        if (only && strcmp(only, tr_dt_name(precisions[p])) != 0) continue;
        for (int32_t n = 1; n <= max_threads; n++) {
            tr_backend be;
            if (tr_backend_cpu_init(&be, n, precisions[p]) != 0) {
                fprintf(stderr, "bench_kernels: cannot start the CPU backend\n");
                return 1;
            }
            printf("cpu backend, %s, %d thread%s\n", tr_dt_name(precisions[p]), n,
                   n > 1 ? "s" : "");
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                bench_matmul(&be, &shapes[i], T);
            bench_matmul(&be, &shapes[0], 1);
            bench_attention(&be, T, 1, 4, 2, 64);
            bench_attention(&be, T, 1, 8, 4, 32);
            bench_attention(&be, T, 4, 4, 2, 64);
            bench_decode(&be, 16, 512, 4, 2, 64);
            tr_backend_cpu_free(&be);
        }
    }
    return 0;
}
