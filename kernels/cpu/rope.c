// Rotary position embedding (HF rotate_half layout) on the CPU, in place on H heads of D
// values per token row, rows ld elements apart (so q and k are rotated inside a fused qkv).
// The angle is the fp32 product pos * inv_freq[i], as transformers computes it; cos and sin
// are evaluated in double and rounded, once per token and frequency, shared by all heads.
// Each rotated value is computed in fp32 and stored once in the activation dtype.
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define ROPE_ROWS_PER_TASK 16
#define ROPE_FREQ_CHUNK 64   // frequencies per stack buffer of cos/sin: no limit on D

typedef struct rope_job {
    void *x;
    tr_dt x_t;
    const int32_t *pos;
    const float *inv_freq;
    int32_t T, H, D, ld;
    float sign;   // +1 forward, -1 backward (the transpose rotation)
} rope_job;

static void rope_task(void *arg, int32_t task) {
    const rope_job *j = arg;
    int32_t half = j->D / 2;
    int32_t t0 = task * ROPE_ROWS_PER_TASK;
    int32_t t1 = t0 + ROPE_ROWS_PER_TASK < j->T ? t0 + ROPE_ROWS_PER_TASK : j->T;
    float cs[ROPE_FREQ_CHUNK], sn[ROPE_FREQ_CHUNK];
    for (int32_t t = t0; t < t1; t++) {
        float p = (float)j->pos[t];
        for (int32_t i0 = 0; i0 < half; i0 += ROPE_FREQ_CHUNK) {
            int32_t n = half - i0 < ROPE_FREQ_CHUNK ? half - i0 : ROPE_FREQ_CHUNK;
            for (int32_t i = 0; i < n; i++) {
                float angle = p * j->inv_freq[i0 + i];
                cs[i] = (float)cos((double)angle);
                sn[i] = j->sign * (float)sin((double)angle);
            }
            for (int32_t h = 0; h < j->H; h++) {
                size_t o1 = (size_t)t * j->ld + (size_t)h * j->D + i0, o2 = o1 + half;
                for (int32_t i = 0; i < n; i++) {
                    float a = tr_ld(j->x, o1 + i, j->x_t), b = tr_ld(j->x, o2 + i, j->x_t);
                    tr_st(j->x, o1 + i, a * cs[i] - b * sn[i], j->x_t);
                    tr_st(j->x, o2 + i, b * cs[i] + a * sn[i], j->x_t);
                }
            }
        }
    }
}

static void rope_run(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                     const float *inv_freq, int32_t T, int32_t H, int32_t D, float sign) {
    rope_job j = {.x = x, .x_t = be->act, .pos = pos, .inv_freq = inv_freq, .T = T, .H = H,
                  .D = D, .ld = ld, .sign = sign};
    tr_cpu_run(be, tr_cpu_ceil_div(T, ROPE_ROWS_PER_TASK), rope_task, &j, 1.0 * T * H * D);
}

void tr_cpu_rope_forward(tr_backend *be, void *x, int32_t ld, const int32_t *pos,
                         const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, x, ld, pos, inv_freq, T, H, D, 1.0f);
}

void tr_cpu_rope_backward(tr_backend *be, void *dx, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, int32_t D) {
    rope_run(be, dx, ld, pos, inv_freq, T, H, D, -1.0f);
}

// The two ops in turn: one pass buys the CPU nothing.
void tr_cpu_attention_decode_rope(tr_backend *be, void *out, void *x, const void *v, int32_t ld,
                                  const int32_t *pos, const float *inv_freq,
                                  const tr_kv_pages *kv, const int32_t *slot,
                                  const int32_t *block_table, int32_t max_blocks,
                                  const int32_t *seq_len, int32_t B, int32_t H) {
    tr_cpu_rope_kv_write(be, x, v, ld, pos, inv_freq, B, H, kv, slot);
    tr_cpu_attention_decode(be, out, x, ld, kv, block_table, max_blocks, seq_len, B, H);
}

// The two ops in turn: one pass buys the CPU nothing.
void tr_cpu_rope_kv_write(tr_backend *be, void *x, const void *v, int32_t ld, const int32_t *pos,
                          const float *inv_freq, int32_t T, int32_t H, const tr_kv_pages *kv,
                          const int32_t *slot) {
    const int32_t D = kv->head_dim;
    tr_cpu_rope_forward(be, x, ld, pos, inv_freq, T, H + kv->n_kv_heads, D);
    const char *k = (const char *)x + (size_t)H * D * tr_dt_size(be->act);
    tr_cpu_kv_write(be, kv, slot, k, v, ld, T);
}
