// embedding_forward/backward: the forward is an exact row copy; the backward (with repeated
// ids) against central differences of the float64 forward, accumulation, bitwise equal
// results for 1, 2 and 3 threads, and bitwise the float sums of each row's tokens in token
// order, the order the contract fixes for every backend. In bf16 mode the table is bf16 and
// the forward's fp32 rows are its values exactly. Negative ids (rows another tensor-parallel
// rank holds) read zeros and leave the table's gradient alone.
#include "tests/kernels/kernels_test.h"

typedef struct emb_ref {
    double *table;
    const double *dout;
    const int32_t *ids;
    int32_t T, C;
} emb_ref;

static double emb_loss(void *arg) {
    emb_ref *r = arg;
    double L = 0;
    for (int32_t t = 0; t < r->T; t++)
        for (int32_t c = 0; c < r->C; c++)
            L += r->dout[(size_t)t * r->C + c] * r->table[(size_t)r->ids[t] * r->C + c];
    return L;
}

static void check_case(int32_t T, int32_t C, int32_t V, size_t fd_checks) {
    int32_t *ids = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) ids[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * V) % V;
    if (T > 2) ids[T - 1] = ids[0];   // a repeated id must sum both rows' gradients
    float *table = kt_rand((size_t)V * C, 1.0), *dout = kt_rand((size_t)T * C, 1.0);
    float *out = kt_fill((size_t)T * C, NAN);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    be.ops->embedding_forward(&be, out, ids, table, T, C);
    int ok = 1;
    for (int32_t t = 0; t < T; t++)
        ok &= memcmp(out + (size_t)t * C, table + (size_t)ids[t] * C, C * sizeof(float)) == 0;
    CHECKF(ok, "forward rows are not the table rows (T=%d C=%d)", T, C);
    {
        tr_backend b16;
        kt_backend(&b16, 2, TR_BF16);
        uint16_t *t16 = kt_to(table, (size_t)V * C, TR_BF16);
        float *o16 = kt_fill((size_t)T * C, NAN), *tr = kt_from(t16, (size_t)V * C, TR_BF16);
        b16.ops->embedding_forward(&b16, o16, ids, t16, T, C);
        int ok16 = 1;
        for (int32_t t = 0; t < T; t++)
            ok16 &= kt_same_bits(o16 + (size_t)t * C, tr + (size_t)ids[t] * C, C);
        CHECKF(ok16, "bf16 forward rows are not the bf16 table rows widened (T=%d C=%d)", T, C);
        tr_backend_cpu_free(&b16);
        free(t16); free(o16); free(tr);
    }

    size_t nt = (size_t)V * C;
    float *dtable = kt_fill(nt, 0);
    void *scratch = kt_malloc(be.ops->embedding_scratch_bytes(&be, T));
    be.ops->embedding_backward(&be, dtable, dout, ids, T, C, scratch);
    double *td = kt_to_double(table, nt), *dd = kt_to_double(dout, (size_t)T * C);
    emb_ref r = {.table = td, .dout = dd, .ids = ids, .T = T, .C = C};
    double e = kt_fd_rel_err(td, nt, dtable, emb_loss, &r, fd_checks);
    CHECKF(e < 1e-6, "dtable vs finite differences (T=%d C=%d V=%d): %.3g", T, C, V, e);

    float *pre = kt_rand(nt, 1.0), *acc = kt_copy(pre, nt);
    be.ops->embedding_backward(&be, acc, dout, ids, T, C, scratch);
    CHECK(kt_accum_err(acc, pre, dtable, nt) < 1e-6);
    float *ordered = kt_copy(pre, nt);   // row += each of its tokens' rows, tokens in order
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = 0; c < C; c++)
            ordered[(size_t)ids[t] * C + c] += dout[(size_t)t * C + c];
    CHECKF(kt_same_bits(acc, ordered, nt), "backward is not the token-order sum (T=%d C=%d)", T,
           C);
    tr_backend_cpu_free(&be);
    free(scratch);
    free(ordered);

    float *res[3];
    for (int32_t k = 0; k < 3; k++) {
        kt_backend(&be, k + 1, TR_F32);
        res[k] = kt_copy(pre, nt);
        void *s = kt_malloc(be.ops->embedding_scratch_bytes(&be, T));
        be.ops->embedding_backward(&be, res[k], dout, ids, T, C, s);
        free(s);
        tr_backend_cpu_free(&be);
    }
    CHECK(kt_same_bits(res[1], res[0], nt) && kt_same_bits(res[2], res[0], nt));
    for (int32_t k = 0; k < 3; k++) free(res[k]);
    free(ids); free(table); free(dout); free(out); free(dtable); free(td); free(dd);
    free(pre); free(acc);
}

static void check_negative_ids(void) {
    const int32_t T = 7, C = 70, V = 5;
    int32_t ids[7] = {3, -1, 0, -1, 3, 4, -2};
    float *table = kt_rand((size_t)V * C, 1.0), *dout = kt_rand((size_t)T * C, 1.0);
    float *out = kt_fill((size_t)T * C, NAN), *dtable = kt_fill((size_t)V * C, 0.0f);
    tr_backend be;
    kt_backend(&be, 2, TR_F32);
    be.ops->embedding_forward(&be, out, ids, table, T, C);
    be.ops->embedding_backward(&be, dtable, dout, ids, T, C, NULL);
    int bad = 0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = 0; c < C; c++)
            bad += out[(size_t)t * C + c] != (ids[t] < 0 ? 0.0f : table[(size_t)ids[t] * C + c]);
    for (int32_t v = 0; v < V; v++)
        for (int32_t c = 0; c < C; c++) {
            float want = 0.0f;
            for (int32_t t = 0; t < T; t++)
                if (ids[t] == v) want += dout[(size_t)t * C + c];
            bad += dtable[(size_t)v * C + c] != want;
        }
    CHECKF(bad == 0, "negative ids: %d values differ from zero rows and no gradient", bad);
    tr_backend_cpu_free(&be);
    free(table);
    free(dout);
    free(out);
    free(dtable);
}

int main(void) {
    kt_seed(2);
    check_negative_ids();
    check_case(1, 37, 5, 100000);
    check_case(9, 37, 4, 100000);     // more tokens than ids: repeats
    check_case(600, 200, 31, 300);   // several row tasks and column blocks, run in parallel
    return tr_test_summary("test_embedding");
}
