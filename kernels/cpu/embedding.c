// Token embedding lookup and its backward on the CPU. The backward scatters rows into the
// table; repeated ids would race if split by tokens, so it is split by blocks of channels and
// every block walks the tokens in order: deterministic, no atomics, no scratch. Each table
// row thus adds its tokens in token order, the order kernels/cuda reproduces. A negative id
// (a row another tensor-parallel rank holds) reads zeros and takes no gradient. The table is a
// working weight (W): the forward widens bf16 rows exactly into the fp32 residual stream.
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/dtype.h"

#define EMB_ROWS_PER_TASK 64
#define EMB_COLS_PER_TASK 64

typedef struct emb_job {
    float *out;
    float *dtable;
    const void *table;
    tr_dt table_t;
    const float *dout;
    const int32_t *ids;
    int32_t T, C;
} emb_job;

static void emb_forward_task(void *arg, int32_t task) {
    const emb_job *j = arg;
    int32_t t0 = task * EMB_ROWS_PER_TASK;
    int32_t t1 = t0 + EMB_ROWS_PER_TASK < j->T ? t0 + EMB_ROWS_PER_TASK : j->T;
    for (int32_t t = t0; t < t1; t++) {
        float *out = j->out + (size_t)t * j->C;
        if (j->ids[t] < 0) memset(out, 0, (size_t)j->C * sizeof(float));
        else tr_ld_row(out, j->table, (size_t)j->ids[t] * j->C, j->C, j->table_t);
    }
}

void tr_cpu_embedding_forward(tr_backend *be, float *out, const int32_t *ids,
                              const void *table, int32_t T, int32_t C) {
    emb_job j = {.out = out, .table = table, .table_t = be->wt, .ids = ids, .T = T, .C = C};
    tr_cpu_run(be, tr_cpu_ceil_div(T, EMB_ROWS_PER_TASK), emb_forward_task, &j,
               0.25 * T * C);
}

static void emb_backward_task(void *arg, int32_t task) {
    const emb_job *j = arg;
    int32_t c0 = task * EMB_COLS_PER_TASK;
    int32_t cn = j->C - c0 < EMB_COLS_PER_TASK ? j->C - c0 : EMB_COLS_PER_TASK;
    for (int32_t t = 0; t < j->T; t++) {
        if (j->ids[t] < 0) continue;   // another tensor-parallel rank's row
        float *dst = j->dtable + (size_t)j->ids[t] * j->C + c0;
        const float *src = j->dout + (size_t)t * j->C + c0;
        for (int32_t i = 0; i < cn; i++) dst[i] += src[i];
    }
}

size_t tr_cpu_embedding_scratch_bytes(tr_backend *be, int32_t T) {
    (void)be, (void)T;
    return 0;
}

void tr_cpu_embedding_backward(tr_backend *be, float *dtable, const float *dout,
                               const int32_t *ids, int32_t T, int32_t C, void *scratch) {
    (void)scratch;
    if (T <= 0) return;
    emb_job j = {.dtable = dtable, .dout = dout, .ids = ids, .T = T, .C = C};
    tr_cpu_run(be, tr_cpu_ceil_div(C, EMB_COLS_PER_TASK), emb_backward_task, &j, 0.5 * T * C);
}
