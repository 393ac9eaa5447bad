// The vocab-parallel sampling ops of the CPU backend against its sample op: rows split over
// R = 2, 3 and 4 ranks' columns (uneven splits too), each rank's candidate lists and walks
// written where a gather would put them, the running sums chained from rank to rank as the
// engine passes them, and the pick over all of it must draw the sample op's ids from the
// whole rows, with the same count of near draws, for every parameter combination (greedy,
// temperature, top-k below, at and past the vocabulary, top-p, both) on random, tied, equal
// and signed-zero logits and streams at random positions. Top-p rows whose nucleus is larger
// than the first lists ask again with longer ones, as the engine does, until they draw.
// Candidate lists are each rank's best by (logit descending, id ascending), padded with
// {-inf, -1}. All buffers are backend memory, so the test also runs under TROUPE_CPU_GUARD=1.
#include "tests/backend_test.h"
#include "tests/kernels/kernels_test.h"
#include "tests/kernels/sample_cases.h"

static tr_backend be;

// Rank r's first column of V split over R, as tensor parallelism splits the vocabulary.
static int32_t col0(int32_t V, int32_t R, int32_t r) { return (int32_t)((int64_t)V * r / R); }

typedef struct ranks {
    int32_t R, V, B;
    float *logits[4];          // backend memory: rank r's columns of every row [B, V_r]
    tr_sample_row *rows;       // backend memory
    tr_sample_cand *cand;      // [R][B][k]
    double *sums, *walk;       // [R][B], [B]
    int32_t *hits, *ids, *near;
    void *scratch;
    int32_t k_max;
} ranks;

// The exchange for rows [b0, b0 + n) with lists of k: every rank's lists at its place, the
// chained sums, every rank's walk, then the pick into ids[b0 ..].
static void draw(ranks *s, int32_t b0, int32_t n, int32_t k) {
    const int32_t R = s->R;
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = col0(s->V, R, r), Vr = col0(s->V, R, r + 1) - v0;
        be.ops->sample_vp_top(&be, s->cand + (size_t)r * n * k, s->logits[r] + (size_t)b0 * Vr, v0, n, Vr,
                              k, s->scratch);
    }
    for (int32_t pass = 0; pass < 2; pass++)
        for (int32_t r = 0; r < R; r++) {
            int32_t v0 = col0(s->V, R, r), Vr = col0(s->V, R, r + 1) - v0;
            const double *carry = r ? s->sums + (size_t)(r - 1) * n : NULL;
            be.ops->sample_vp_scan(&be, pass ? s->walk : s->sums + (size_t)r * n,
                                   s->hits + (size_t)r * n * 3, s->logits[r] + (size_t)b0 * Vr,
                                   s->rows + b0, s->cand, carry,
                                   pass ? s->sums + (size_t)(R - 1) * n : NULL, R, k, v0, n, Vr);
        }
    be.ops->sample_vp_pick(&be, s->ids + b0, s->near, s->cand, s->hits, s->sums + (size_t)(R - 1) * n,
                           s->rows + b0, R, k, n, s->V, s->scratch);
}

// B rows of V logits over R ranks, with parameters from the combination tables (or, with
// top_p_all > 0, temperature 1 and that top-p on every row).
static void check_batch(int32_t B, int32_t V, int32_t R, int kind, uint64_t salt, float top_p_all) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    float *lg = kt_floats((size_t)B * V);
    tr_sample_row *rows = kt_malloc((size_t)B * sizeof(tr_sample_row));
    int32_t k0 = 1;
    for (int32_t b = 0; b < B; b++) {
        fill_row(lg + (size_t)b * V, V, kind);
        uint64_t c = salt + (uint64_t)b;
        rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                  .top_p = top_ps[c / 24 % 4], .seed = rand_u64(),
                                  .counter = 1 + (uint64_t)(b * 37 % 1000), .used = 1 + b % 4};
        if (b % 7 == 0) rows[b].counter = 0, rows[b].used = 4;
        if (top_p_all > 0.0f) rows[b].temperature = 1.0f, rows[b].top_k = 0, rows[b].top_p = top_p_all;
        if (rows[b].top_k > k0 && rows[b].top_k < V) k0 = rows[b].top_k;
    }
    // The single-rank op's ids and near count.
    int32_t zero = 0;
    float *d_lg = et_dev(&be, lg, (size_t)B * V * sizeof(float));
    tr_sample_row *d_rows = et_dev(&be, rows, (size_t)B * sizeof(tr_sample_row));
    int32_t *d_ids = et_dev(&be, NULL, (size_t)B * sizeof(int32_t)), *d_near = et_dev(&be, &zero, 4);
    float *d_lp = et_dev(&be, NULL, (size_t)B * sizeof(float));
    void *d_scr = et_dev(&be, NULL, be.ops->sample_scratch_bytes(&be, B, V));
    be.ops->sample(&be, d_ids, d_lp, d_lg, d_rows, B, V, tr_sample_rows_ranked(rows, B, V), d_scr,
                   d_near);
    int32_t *want = kt_malloc((size_t)B * sizeof(int32_t)), want_near;
    et_get(&be, want, d_ids, (size_t)B * sizeof(int32_t));
    et_get(&be, &want_near, d_near, sizeof want_near);

    // The ranks: their columns, and buffers for the largest lists.
    ranks s = {.R = R, .V = V, .B = B, .rows = d_rows, .k_max = col0(V, R, R) - col0(V, R, R - 1) + 1};
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = col0(V, R, r), Vr = col0(V, R, r + 1) - v0;
        float *part = kt_floats((size_t)B * Vr);
        for (int32_t b = 0; b < B; b++) memcpy(part + (size_t)b * Vr, lg + (size_t)b * V + v0, (size_t)Vr * 4);
        s.logits[r] = et_dev(&be, part, (size_t)B * Vr * sizeof(float));
        free(part);
    }
    size_t n_cand = (size_t)R * B * s.k_max;
    s.cand = et_dev(&be, NULL, n_cand * sizeof(tr_sample_cand));
    s.sums = et_dev(&be, NULL, (size_t)R * B * sizeof(double));
    s.walk = et_dev(&be, NULL, (size_t)B * sizeof(double));
    s.hits = et_dev(&be, NULL, (size_t)R * B * 3 * sizeof(int32_t));
    s.ids = et_dev(&be, NULL, (size_t)B * sizeof(int32_t));
    s.near = et_dev(&be, &zero, 4);
    s.scratch = et_dev(&be, NULL, be.ops->sample_vp_scratch_bytes(&be, B, s.k_max, n_cand));
    // Lists of the longest top-k (at least 8) first; rows whose top-p cut lies past them again
    // alone with lists 8 times as long.
    int32_t k = k0 > 8 ? k0 : 8;
    if (k > s.k_max) k = s.k_max;
    draw(&s, 0, B, k);
    int32_t *got = kt_malloc((size_t)B * sizeof(int32_t)), asked = 0;
    et_get(&be, got, s.ids, (size_t)B * sizeof(int32_t));
    for (int32_t b = 0; b < B; b++)
        for (int32_t kk = k; got[b] < 0 && kk < s.k_max; asked++) {
            kk = kk * 8 < s.k_max ? kk * 8 : s.k_max;
            draw(&s, b, 1, kk);
            et_get(&be, &got[b], s.ids + b, sizeof got[b]);
        }
    int32_t near;
    et_get(&be, &near, s.near, sizeof near);
    int bad = 0;
    for (int32_t b = 0; b < B; b++)
        if (got[b] != want[b] && bad++ < 5)
            fprintf(stderr, "row %d (T %g, k %d, p %g): vocab-parallel id %d, sample %d\n", b,
                    (double)rows[b].temperature, rows[b].top_k, (double)rows[b].top_p, got[b], want[b]);
    printf("  B=%d V=%d R=%d kind %d: %d rows, %d asked again with longer lists, %d near\n", B, V, R,
           kind, B, asked, near);
    CHECKF(bad == 0, "B=%d V=%d R=%d kind %d: %d ids differ from the sample op's", B, V, R, kind, bad);
    CHECKF(near == want_near, "B=%d V=%d R=%d kind %d: %d near draws, the sample op counts %d", B, V, R,
           kind, near, want_near);

    for (int32_t r = 0; r < R; r++) be.ops->free(&be, s.logits[r]);
    void *bufs[] = {s.cand, s.sums, s.walk, s.hits, s.ids, s.near, s.scratch, d_lg, d_rows, d_ids,
                    d_near, d_lp, d_scr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be.ops->free(&be, bufs[i]);
    free(lg); free(rows); free(want); free(got);
}

// sample_vp_top alone: a rank's list is its best tokens by rank order, then padding.
static void check_top(void) {
    const float lg[6] = {1.0f, 3.0f, -0.0f, 3.0f, 0.0f, 2.0f};
    float *d = et_dev(&be, lg, sizeof lg);
    tr_sample_cand got[8], *dc = et_dev(&be, NULL, sizeof got);
    void *scr = et_dev(&be, NULL, be.ops->sample_vp_scratch_bytes(&be, 1, 6, 0));
    be.ops->sample_vp_top(&be, dc, d, 100, 1, 6, 8, scr);
    et_get(&be, got, dc, sizeof got);
    const int32_t ids[8] = {101, 103, 105, 100, 102, 104, -1, -1};   // -0 == +0: lower id first
    int ok = 1;
    for (int j = 0; j < 8; j++) ok &= got[j].id == ids[j] && (j < 6 ? got[j].logit == lg[ids[j] - 100] : 1);
    CHECKF(ok, "sample_vp_top: the list is not the columns by rank order");
    be.ops->free(&be, d);
    be.ops->free(&be, dc);
    be.ops->free(&be, scr);
}

int main(void) {
    kt_seed(35);
    kt_backend_dev(&be, 2, TR_F32);
    check_top();
    for (int32_t R = 2; R <= 4; R++) {
        check_batch(96, 7, R, LOGITS_TIED, 1, 0.0f);
        check_batch(96, 300, R, LOGITS_RANDOM, 2, 0.0f);
        check_batch(96, 301, R, LOGITS_TIED, 3, 0.0f);
        check_batch(40, 300, R, LOGITS_EQUAL, 4, 0.0f);
        check_batch(40, 301, R, LOGITS_ZEROS, 5, 0.0f);
        // equal logits: top_p 0.5 of an even vocabulary meets the limit exactly, a near cut
        check_batch(8, 10, R, LOGITS_EQUAL, 7, 0.5f);
    }
    check_batch(96, 3001, 3, LOGITS_RANDOM, 6, 0.0f);   // nuclei past the first lists
    tr_backend_cpu_free(&be);
    return tr_test_summary("test_sample_vp");
}
