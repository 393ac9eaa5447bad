// The CPU backend's sample op against a sampler written out here from the contract: a full
// sort by (logit descending, id ascending) instead of the op's selection, the stream's words
// read by their position (4 per Philox block), sums in the orders the contract names. Rows of
// every parameter combination (greedy, temperature, top-k below, at and past V, top-p) on
// random, tied and signed-zero logits, each with its own seed and stream position: the same
// ids and near counts; logprobs bitwise those of logsoftmax_forward for the drawn ids; rows
// drawn one at a time equal the batch's; inputs untouched; bf16 logits draw what their fp32
// values draw. All buffers are backend memory, so the test also runs under
// TROUPE_CPU_GUARD=1.
#include "kernels/philox.h"
#include "tests/backend_test.h"
#include "tests/kernels/kernels_test.h"
#include "tests/kernels/sample_cases.h"

static tr_backend be;


// ---- the reference sampler ----

static int by_rank(const void *pa, const void *pb, void *ctx) {
    const float *lg = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    if (lg[a] != lg[b]) return lg[a] > lg[b] ? -1 : 1;
    return a < b ? -1 : 1;
}

// Word number k (from 0) of the stream: block k / 4, word k % 4.
static uint32_t stream_word(uint64_t seed, uint64_t k) {
    uint32_t block[4];
    tr_philox4x32_10(k / 4, 0, seed, block);
    return block[k % 4];
}

static int32_t ref_draw(const float *lg, int32_t V, const tr_sample_row *row, int *near) {
    *near = 0;
    if (row->temperature == 0.0f) {
        int32_t best = 0;
        for (int32_t i = 1; i < V; i++)
            if (lg[i] > lg[best]) best = i;
        return best;
    }
    double *w = kt_malloc((size_t)V * sizeof(double));
    int32_t *order = kt_malloc((size_t)V * sizeof(int32_t));
    float mx = lg[0];
    for (int32_t i = 1; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    for (int32_t i = 0; i < V; i++)
        w[i] = exp(((double)lg[i] - (double)mx) * (1.0 / (double)row->temperature));
    for (int32_t i = 0; i < V; i++) order[i] = i;   // id order unless a cut ranks
    int use_k = row->top_k > 0 && row->top_k < V, use_p = row->top_p < 1.0f;
    int32_t n = V;
    if (use_k || use_p) {
        qsort_r(order, (size_t)V, sizeof(int32_t), by_rank, (void *)lg);
        double mass = 0.0;   // top-k's in rank order, else the whole row's in id order
        if (use_k) {
            n = row->top_k;
            for (int32_t r = 0; r < n; r++) mass += w[order[r]];
        } else {
            for (int32_t i = 0; i < V; i++) mass += w[i];
        }
        if (use_p) {
            double limit = (double)row->top_p * mass, cum = 0.0, prev = 0.0;
            int32_t r = 0;
            while (r < n && cum < limit) {
                prev = cum;
                cum += w[order[r++]];
            }
            double tol = TR_SAMPLE_NEAR * mass;
            *near = fabs(cum - limit) <= tol || (r >= 2 && limit - prev <= tol);
            n = r;
        }
    }
    double total = 0.0;
    for (int32_t r = 0; r < n; r++) total += w[order[r]];
    // the next two words: position counter * 4 when the last block is used up, else the
    // word after the `used` ones of block counter - 1
    uint64_t k = row->used >= 4 ? row->counter * 4 : (row->counter - 1) * 4 + (uint64_t)row->used;
    uint32_t a = stream_word(row->seed, k), b = stream_word(row->seed, k + 1);
    double u = ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) / 9007199254740992.0;
    double target = u * total, tol = TR_SAMPLE_NEAR * total, cum = 0.0;
    int32_t id = -1;
    for (int32_t r = 0; r < n && id < 0; r++) {
        double before = cum;
        cum += w[order[r]];
        if (target < cum) {
            id = order[r];
            *near |= cum - target <= tol || (r > 0 && target - before <= tol);
        }
    }
    if (id < 0) {   // the target rounded up to the total: the last kept token with weight
        *near = 1;
        id = order[0];
        for (int32_t r = n - 1; r > 0; r--)
            if (w[order[r]] > 0.0) {
                id = order[r];
                break;
            }
    }
    free(w);
    free(order);
    return id;
}

// ---- cases (tests/kernels/sample_cases.h) ----

// B rows of V logits with parameters from the combination tables; rows' streams at random
// positions. Checks everything the header comment lists.
static void check_batch(int32_t B, int32_t V, int kind, uint64_t salt) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    float *lg = kt_floats((size_t)B * V);
    tr_sample_row *rows = kt_malloc((size_t)B * sizeof(tr_sample_row));
    for (int32_t b = 0; b < B; b++) {
        fill_row(lg + (size_t)b * V, V, kind);
        uint64_t c = salt + (uint64_t)b;
        rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                  .top_p = top_ps[c / 24 % 4], .seed = rand_u64(),
                                  .counter = 1 + (uint64_t)(b * 37 % 1000),
                                  .used = 1 + b % 4};
        if (b % 7 == 0) {   // a fresh stream
            rows[b].counter = 0;
            rows[b].used = 4;
        }
    }
    int32_t *want = kt_malloc((size_t)B * sizeof(int32_t)), want_near = 0;
    for (int32_t b = 0; b < B; b++) {
        int near;
        want[b] = ref_draw(lg + (size_t)b * V, V, &rows[b], &near);
        want_near += near;
    }

    const int32_t near0 = 5;   // n_near is added to
    size_t scratch_bytes = be.ops->sample_scratch_bytes(&be, B, V);
    float *d_lg = et_dev(&be, lg, (size_t)B * V * sizeof(float));
    tr_sample_row *d_rows = et_dev(&be, rows, (size_t)B * sizeof(tr_sample_row));
    int32_t *d_ids = et_dev(&be, NULL, (size_t)B * sizeof(int32_t));
    float *d_lp = et_dev(&be, NULL, (size_t)B * sizeof(float));
    int32_t *d_near = et_dev(&be, &near0, sizeof near0);
    void *d_scratch = et_dev(&be, NULL, scratch_bytes);
    be.ops->sample(&be, d_ids, d_lp, d_lg, d_rows, B, V, tr_sample_rows_ranked(rows, B, V),
                   d_scratch, d_near);

    int32_t *ids = kt_malloc((size_t)B * sizeof(int32_t)), n_near;
    float *lp = kt_floats(B), *lp_want = kt_floats(B), *lse = kt_floats(B);
    et_get(&be, ids, d_ids, (size_t)B * sizeof(int32_t));
    et_get(&be, lp, d_lp, (size_t)B * sizeof(float));
    et_get(&be, &n_near, d_near, sizeof n_near);
    int bad = 0;
    for (int32_t b = 0; b < B; b++)
        if (ids[b] != want[b] && bad++ < 5)
            fprintf(stderr, "row %d (T %g, k %d, p %g): id %d, reference %d\n", b,
                    (double)rows[b].temperature, rows[b].top_k, (double)rows[b].top_p, ids[b],
                    want[b]);
    CHECKF(bad == 0, "B=%d V=%d kind %d: %d ids differ from the reference", B, V, kind, bad);
    CHECKF(n_near == near0 + want_near, "B=%d V=%d kind %d: n_near %d, want %d", B, V, kind,
           n_near, near0 + want_near);

    // logprobs: logsoftmax_forward's bits for the drawn ids
    float *d_lp_want = et_dev(&be, NULL, (size_t)B * sizeof(float));
    float *d_lse = et_dev(&be, NULL, (size_t)B * sizeof(float));
    be.ops->logsoftmax_forward(&be, d_lp_want, NULL, d_lse, d_lg, d_ids, B, V);
    et_get(&be, lp_want, d_lp_want, (size_t)B * sizeof(float));
    CHECKF(kt_same_bits(lp, lp_want, B), "B=%d V=%d: logprobs are not logsoftmax_forward's", B, V);
    double worst = 0.0;   // and they are log-probabilities of the drawn ids, in float64
    for (int32_t b = 0; b < B; b++) {
        const float *x = lg + (size_t)b * V;
        double m = x[0], s = 0.0;
        for (int32_t i = 1; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int32_t i = 0; i < V; i++) s += exp((double)x[i] - m);
        worst = fmax(worst, fabs(lp[b] - ((double)x[ids[b]] - m - log(s))));
    }
    // The op rounds a double result to float, from expf terms: |logprob| < 20 here, so a
    // few float ulps there (2e-6 each) are the whole difference.
    CHECKF(worst <= 1e-5, "B=%d V=%d: logprob off by %.3g", B, V, worst);

    // one row at a time, in the batch's scratch: the same ids and bits
    int same = 1;
    for (int32_t b = 0; b < B; b++) {
        int32_t id1;
        float lp1;
        be.ops->sample(&be, d_ids, d_lp, d_lg + (size_t)b * V, d_rows + b, 1, V,
                       tr_sample_row_ranked(&rows[b], V), d_scratch, d_near);
        et_get(&be, &id1, d_ids, sizeof id1);
        et_get(&be, &lp1, d_lp, sizeof lp1);
        same &= id1 == ids[b] && memcmp(&lp1, &lp[b], sizeof lp1) == 0;
    }
    CHECKF(same, "B=%d V=%d: rows drawn alone differ from the batch", B, V);

    // inputs unchanged
    float *lg2 = kt_floats((size_t)B * V);
    tr_sample_row *rows2 = kt_malloc((size_t)B * sizeof(tr_sample_row));
    et_get(&be, lg2, d_lg, (size_t)B * V * sizeof(float));
    et_get(&be, rows2, d_rows, (size_t)B * sizeof(tr_sample_row));
    CHECK(memcmp(lg2, lg, (size_t)B * V * sizeof(float)) == 0);
    CHECK(memcmp(rows2, rows, (size_t)B * sizeof(tr_sample_row)) == 0);

    be.ops->free(&be, d_lg);
    be.ops->free(&be, d_rows);
    be.ops->free(&be, d_ids);
    be.ops->free(&be, d_lp);
    be.ops->free(&be, d_near);
    be.ops->free(&be, d_scratch);
    be.ops->free(&be, d_lp_want);
    be.ops->free(&be, d_lse);
    free(lg); free(rows); free(want); free(ids); free(lp); free(lp_want); free(lse); free(lg2);
    free(rows2);
}

// Equal logits and top_p = 0.5 over an even vocabulary: the prefix meets the limit exactly,
// so every such draw is near (and counted); top_p = 0.3 cuts far from any prefix.
static void check_near_cut(void) {
    const int32_t V = 10, B = 4;
    float lg[40];
    for (int32_t i = 0; i < B * V; i++) lg[i] = 0.5f;
    tr_sample_row rows[4];
    for (int32_t b = 0; b < B; b++)
        rows[b] = (tr_sample_row){.temperature = 1.0f, .top_k = 0,
                                  .top_p = b < 3 ? 0.5f : 0.3f, .seed = 99 + (uint64_t)b,
                                  .counter = 0, .used = 4};
    int32_t zero = 0, n_near, ids[4];
    float *d_lg = et_dev(&be, lg, sizeof lg);
    tr_sample_row *d_rows = et_dev(&be, rows, sizeof rows);
    int32_t *d_ids = et_dev(&be, NULL, sizeof ids), *d_near = et_dev(&be, &zero, sizeof zero);
    float *d_lp = et_dev(&be, NULL, B * sizeof(float));
    void *d_scratch = et_dev(&be, NULL, be.ops->sample_scratch_bytes(&be, B, V));
    be.ops->sample(&be, d_ids, d_lp, d_lg, d_rows, B, V, tr_sample_rows_ranked(rows, B, V),
                   d_scratch, d_near);
    et_get(&be, &n_near, d_near, sizeof n_near);
    et_get(&be, ids, d_ids, sizeof ids);
    CHECKF(n_near == 3, "near cuts counted: %d, want 3", n_near);
    for (int32_t b = 0; b < B; b++)   // the nucleus: the lowest 5 (top_p 0.3: 4) ids
        CHECKF(ids[b] >= 0 && ids[b] < (b < 3 ? 5 : 4), "row %d drew %d", b, ids[b]);
    be.ops->sample(&be, d_ids, d_lp, d_lg, d_rows, 0, V, false, d_scratch, d_near);   // B = 0
    et_get(&be, &n_near, d_near, sizeof n_near);
    CHECK(n_near == 3);
    be.ops->free(&be, d_lg);
    be.ops->free(&be, d_rows);
    be.ops->free(&be, d_ids);
    be.ops->free(&be, d_near);
    be.ops->free(&be, d_lp);
    be.ops->free(&be, d_scratch);
}

// One sample call on backend b over B rows of logits (host values of b's activation dtype):
// ids, logprobs and the near count into the host arrays; then b's logsoftmax_forward of the
// drawn ids into lp_lsm.
static void sample_on(tr_backend *b, const void *lg, const tr_sample_row *rows, int32_t B,
                      int32_t V, int32_t *ids, float *lp, int32_t *n_near, float *lp_lsm) {
    size_t lb = (size_t)B * V * tr_dt_size(b->act);
    int32_t zero = 0;
    void *d_lg = et_dev(b, lg, lb);
    tr_sample_row *d_rows = et_dev(b, rows, (size_t)B * sizeof(tr_sample_row));
    int32_t *d_ids = et_dev(b, NULL, (size_t)B * sizeof(int32_t)), *d_near = et_dev(b, &zero, 4);
    float *d_lp = et_dev(b, NULL, (size_t)B * sizeof(float));
    float *d_lsm = et_dev(b, NULL, (size_t)B * sizeof(float)), *d_lse = et_dev(b, NULL, (size_t)B * sizeof(float));
    void *d_scratch = et_dev(b, NULL, b->ops->sample_scratch_bytes(b, B, V));
    b->ops->sample(b, d_ids, d_lp, d_lg, d_rows, B, V, tr_sample_rows_ranked(rows, B, V),
                   d_scratch, d_near);
    b->ops->logsoftmax_forward(b, d_lsm, NULL, d_lse, d_lg, d_ids, B, V);
    et_get(b, ids, d_ids, (size_t)B * sizeof(int32_t));
    et_get(b, lp, d_lp, (size_t)B * sizeof(float));
    et_get(b, n_near, d_near, sizeof *n_near);
    et_get(b, lp_lsm, d_lsm, (size_t)B * sizeof(float));
    void *bufs[8] = {d_lg, d_rows, d_ids, d_near, d_lp, d_lsm, d_lse, d_scratch};
    for (int i = 0; i < 8; i++) b->ops->free(b, bufs[i]);
}

// bf16 logits (the emulated mixed precision's activation dtype): the op draws the ids, near
// counts and logprobs the fp32 op draws from the same values widened, and its logprobs are
// the bf16 logsoftmax_forward's bits.
static void check_bf16(int32_t B, int32_t V, uint64_t salt) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    size_t n = (size_t)B * V;
    float *lg = kt_floats(n);
    tr_sample_row *rows = kt_malloc((size_t)B * sizeof(tr_sample_row));
    for (int32_t b = 0; b < B; b++) {
        fill_row(lg + (size_t)b * V, V, b % 2 ? LOGITS_TIED : LOGITS_RANDOM);
        uint64_t c = salt + (uint64_t)b;
        rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                  .top_p = top_ps[c / 24 % 4], .seed = rand_u64(),
                                  .counter = 0, .used = 4};
    }
    uint16_t *lg16 = kt_to(lg, n, TR_BF16);
    float *wide = kt_from(lg16, n, TR_BF16);
    tr_backend bb;
    kt_backend_dev(&bb, 2, TR_BF16);
    int32_t *ids = kt_malloc((size_t)B * sizeof(int32_t)), *ids16 = kt_malloc((size_t)B * sizeof(int32_t));
    int32_t near, near16;
    float *lp = kt_floats(B), *lp16 = kt_floats(B), *lsm = kt_floats(B), *lsm16 = kt_floats(B);
    sample_on(&be, wide, rows, B, V, ids, lp, &near, lsm);
    sample_on(&bb, lg16, rows, B, V, ids16, lp16, &near16, lsm16);
    tr_backend_cpu_free(&bb);
    CHECKF(memcmp(ids16, ids, (size_t)B * sizeof(int32_t)) == 0 && near16 == near &&
           kt_same_bits(lp16, lp, B), "bf16 B=%d V=%d: not the fp32 op's draws on the same "
           "values", B, V);
    CHECKF(kt_same_bits(lp16, lsm16, B), "bf16 B=%d V=%d: logprobs are not logsoftmax_forward's",
           B, V);
    free(lg); free(rows); free(lg16); free(wide); free(ids); free(ids16); free(lp); free(lp16);
    free(lsm); free(lsm16);
}

int main(void) {
    kt_seed(33);
    kt_backend_dev(&be, 2, TR_F32);
    check_bf16(96, 300, 7);
    check_bf16(40, 3000, 8);
    check_batch(96, 1, LOGITS_RANDOM, 0);
    check_batch(96, 7, LOGITS_TIED, 1);
    check_batch(96, 300, LOGITS_RANDOM, 2);
    check_batch(96, 300, LOGITS_TIED, 3);
    check_batch(40, 300, LOGITS_EQUAL, 4);
    check_batch(40, 301, LOGITS_ZEROS, 5);
    check_batch(96, 3000, LOGITS_RANDOM, 6);   // top-p grows the ranked head past 256
    check_near_cut();
    tr_backend_cpu_free(&be);
    return tr_test_summary("test_sample_op");
}
