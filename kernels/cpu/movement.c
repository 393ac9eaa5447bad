// Buffer ops on the CPU: fill, row gather and scatter by bytes, the all-layer KV block copy
// of copy-on-write, the KV cache write of new tokens, a decode step's row advance, and dtype
// conversion. No arithmetic
// beyond conversion's rounding (kernels/cpu/dtype.h), so every result is exact; work is split
// into fixed chunks of elements or rows.
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"
#include "kernels/decode_rows.h"

#define MOVE_ELEMS_PER_TASK 65536
#define MOVE_BYTES_PER_TASK (256 * 1024)

typedef struct move_job {
    float *f32;
    float value;
    size_t n;
    char *dst;
    const char *src, *src2;
    tr_dt out_t, in_t;
    size_t elem, ld;
    const tr_kv_pages *kv;
    const int32_t *idx;
    size_t row_bytes;
    int32_t rows_per_task, n_rows;
    int scatter;
    const tr_kv_pool *pool;
    const int32_t *src_block, *dst_block, *n_slots;
} move_job;

static size_t elem_begin(int32_t task) { return (size_t)task * MOVE_ELEMS_PER_TASK; }
static size_t elem_end(const move_job *j, int32_t task) {
    size_t e = elem_begin(task) + MOVE_ELEMS_PER_TASK;
    return e < j->n ? e : j->n;
}
static int32_t elem_tasks(size_t n) {
    return (int32_t)((n + MOVE_ELEMS_PER_TASK - 1) / MOVE_ELEMS_PER_TASK);
}

static void fill_task(void *arg, int32_t task) {
    const move_job *j = arg;
    for (size_t i = elem_begin(task), e = elem_end(j, task); i < e; i++) j->f32[i] = j->value;
}

void tr_cpu_fill(tr_backend *be, float *x, float value, size_t n) {
    move_job j = {.f32 = x, .value = value, .n = n};
    tr_cpu_run(be, elem_tasks(n), fill_task, &j, 0.1 * (double)n);
}

static void rows_task(void *arg, int32_t task) {
    const move_job *j = arg;
    int32_t r0 = task * j->rows_per_task;
    int32_t r1 = r0 + j->rows_per_task < j->n_rows ? r0 + j->rows_per_task : j->n_rows;
    for (int32_t r = r0; r < r1; r++) {
        size_t d = j->scatter ? (size_t)j->idx[r] : (size_t)r;
        size_t s = j->scatter ? (size_t)r : (size_t)j->idx[r];
        memcpy(j->dst + d * j->row_bytes, j->src + s * j->row_bytes, j->row_bytes);
    }
}

static void rows_run(tr_backend *be, void *dst, const void *src, const int32_t *idx, int32_t n,
                     size_t row_bytes, int scatter) {
    if (n <= 0 || row_bytes == 0) return;
    size_t per = MOVE_BYTES_PER_TASK / row_bytes;
    move_job j = {.dst = dst, .src = src, .idx = idx, .row_bytes = row_bytes, .n_rows = n,
                  .scatter = scatter,
                  .rows_per_task = per < 1 ? 1 : per > INT32_MAX ? INT32_MAX : (int32_t)per};
    tr_cpu_run(be, tr_cpu_ceil_div(n, j.rows_per_task), rows_task, &j,
               0.05 * (double)n * (double)row_bytes);
}

void tr_cpu_gather_rows(tr_backend *be, void *out, const void *src, const int32_t *idx,
                        int32_t n, size_t row_bytes) {
    rows_run(be, out, src, idx, n, row_bytes, 0);
}

void tr_cpu_scatter_rows(tr_backend *be, void *dst, const void *rows, const int32_t *idx,
                         int32_t n, size_t row_bytes) {
    rows_run(be, dst, rows, idx, n, row_bytes, 1);
}

// A few hundred rows at most, a few integers each: one thread.
void tr_cpu_decode_rows(tr_backend *be, const tr_decode_rows_args *a) {
    (void)be;
    for (int32_t r = 0; r < a->n; r++) tr_decode_row(a, r);
}

// One task per block pair: its slots in K and V of every layer.
static void kv_copy_task(void *arg, int32_t task) {
    const move_job *j = arg;
    const tr_kv_pool *p = j->pool;
    size_t block_bytes = (size_t)p->block_size * p->slot_bytes;
    size_t from = (size_t)j->src_block[task] * block_bytes;
    size_t to = (size_t)j->dst_block[task] * block_bytes;
    size_t bytes = (size_t)j->n_slots[task] * p->slot_bytes;
    for (int32_t l = 0; l < p->n_layers; l++) {
        size_t base = (size_t)l * p->layer_bytes;
        memcpy((char *)p->k + base + to, (const char *)p->k + base + from, bytes);
        memcpy((char *)p->v + base + to, (const char *)p->v + base + from, bytes);
    }
}

void tr_cpu_kv_copy_blocks(tr_backend *be, const tr_kv_pool *pool, const int32_t *src,
                           const int32_t *dst, const int32_t *n_slots, int32_t n) {
    if (n <= 0) return;
    move_job j = {.pool = pool, .src_block = src, .dst_block = dst, .n_slots = n_slots};
    double bytes = 2.0 * pool->n_layers * pool->block_size * (double)pool->slot_bytes;
    tr_cpu_run(be, n, kv_copy_task, &j, 0.05 * n * bytes);
}

// Row t of k and v into slot slot[t] of the pools: a row's values are contiguous in both.
static void kv_write_task(void *arg, int32_t task) {
    const move_job *j = arg;
    const tr_kv_pages *kv = j->kv;
    size_t row = (size_t)kv->n_kv_heads * kv->head_dim * j->elem;
    if (j->idx[task] < 0) return;   // a padding row
    size_t src = (size_t)task * j->ld * j->elem, dst = (size_t)j->idx[task] * row;
    memcpy((char *)kv->k_pool + dst, j->src + src, row);
    memcpy((char *)kv->v_pool + dst, j->src2 + src, row);
}

void tr_cpu_kv_write(tr_backend *be, const tr_kv_pages *kv, const int32_t *slot, const void *k,
                     const void *v, int32_t ld, int32_t T) {
    if (T <= 0) return;
    move_job j = {.kv = kv, .idx = slot, .src = k, .src2 = v, .ld = (size_t)ld,
                  .elem = tr_dt_size(be->act)};
    double bytes = 2.0 * kv->n_kv_heads * kv->head_dim * (double)j.elem;
    tr_cpu_run(be, T, kv_write_task, &j, 0.05 * T * bytes);
}

// fp32 <-> bf16 go through the row routines the kernels store and load with, so that the
// conversion tests cover their vector paths too.
static void convert_task(void *arg, int32_t task) {
    const move_job *j = arg;
    size_t i = elem_begin(task), e = elem_end(j, task);
    int32_t n = (int32_t)(e - i);
    if (j->out_t == TR_F32) {
        float *out = (float *)j->dst + i;
        const uint16_t *in = (const uint16_t *)j->src + i;
        if (j->in_t == TR_BF16) tr_ld_row(out, in, 0, n, TR_BF16);
        else
            for (int32_t k = 0; k < n; k++) out[k] = tr_f16_f32(in[k]);
    } else {
        uint16_t *out = (uint16_t *)j->dst + i;
        if (j->in_t == TR_F32) {
            tr_st_row(out, 0, (const float *)j->src + i, n, TR_BF16);
        } else {
            const uint16_t *in = (const uint16_t *)j->src + i;
            for (int32_t k = 0; k < n; k++) out[k] = tr_f32_bf16(tr_f16_f32(in[k]));
        }
    }
}

static void copy_task(void *arg, int32_t task) {
    const move_job *j = arg;
    size_t i = elem_begin(task), e = elem_end(j, task);
    memcpy(j->dst + i * j->elem, j->src + i * j->elem, (e - i) * j->elem);
}

void tr_cpu_convert(tr_backend *be, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                    size_t n) {
    move_job j = {.dst = out, .src = in, .n = n, .out_t = out_t, .in_t = in_t,
                  .elem = tr_dt_size(in_t)};
    tr_cpu_run(be, elem_tasks(n), out_t == in_t ? copy_task : convert_task, &j,
               0.3 * (double)n);
}
