// Pretraining sampler: windows are contiguous runs of the document stream (tokens encode
// (document, position) so every window is checked token by token), the same seed gives the
// same stream and a fresh sampler seeking to k resumes it, the first epoch's draws cover
// every token, blend shares track Megatron's greedy rule, and the train/valid/test bounds
// follow Megatron's split formula (hand-computed values).
#include <stdint.h>

#include "data/indexed.h"
#include "data/sampler.h"
#include "tests/test.h"

#define N_DOCS 50

static int32_t doc_len[N_DOCS];

// Token of document d at position t, and back.
static int32_t tok(int64_t d, int64_t t) { return (int32_t)(d * 1000 + t); }

static void make_dataset(const char *prefix, int64_t doc_base) {
    tr_indexed_builder b;
    tr_err err = {0};
    CHECK(tr_indexed_builder_init(&b, prefix, TR_IDX_INT32, &err) == 0);
    uint32_t x = 12345;
    for (int d = 0; d < N_DOCS; d++) {
        x = x * 1103515245u + 12345u;
        doc_len[d] = 1 + (int32_t)((x >> 16) % 40);
        int32_t ids[64];
        for (int t = 0; t < doc_len[d]; t++) ids[t] = tok(doc_base + d, t);
        // Some documents are stored as two sequences (sentence-split data).
        int32_t cut = (d % 3 == 0 && doc_len[d] > 1) ? doc_len[d] / 2 : doc_len[d];
        CHECK(tr_indexed_builder_add(&b, ids, cut, &err) == 0);
        if (cut < doc_len[d]) CHECK(tr_indexed_builder_add(&b, ids + cut, doc_len[d] - cut, &err) == 0);
        CHECK(tr_indexed_builder_end_document(&b, &err) == 0);
    }
    CHECKF(tr_indexed_builder_finish(&b, &err) == 0, "%s", err.msg);
    tr_indexed_builder_free(&b);
}

// Every window is consecutive tokens of documents; a new document starts at position 0
// exactly where doc_start says.
static int window_ok(const int32_t *w, int32_t n, const int32_t *ds, int32_t nd) {
    if (ds[0] != 0 || ds[nd] != n) return 0;
    for (int32_t k = 0; k < nd; k++) {
        for (int32_t t = ds[k]; t < ds[k + 1]; t++) {
            if (k > 0 && t == ds[k] &&
                (w[t] % 1000 != 0 || w[t - 1] % 1000 != doc_len[(w[t - 1] / 1000) % 100] - 1))
                return 0;
            if (t > ds[k] && w[t] != w[t - 1] + 1) return 0;
        }
    }
    return 1;
}

int main(void) {
    const char *dir = tr_test_tmpdir();
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/a", dir);
    snprintf(pb, sizeof pb, "%s/b", dir);
    make_dataset(pa, 0);
    make_dataset(pb, 100);
    int64_t T = 0;
    for (int d = 0; d < N_DOCS; d++) T += doc_len[d];
    tr_err err = {0};

    // Split bounds: Megatron's formula, values worked by hand.
    double f[3];
    int64_t b[4];
    CHECK(tr_split_parse("969,30,1", f, &err) == 0);
    tr_split_bounds(f, 1000, b);
    CHECK(b[0] == 0 && b[1] == 969 && b[2] == 999 && b[3] == 1000);
    CHECK(tr_split_parse("1,1,1", f, &err) == 0);
    tr_split_bounds(f, 10, b);  // round(3.33) = 3 each, 9 in all, so every bound moves up 1
    CHECK(b[1] == 4 && b[2] == 7 && b[3] == 10);
    CHECK(tr_split_parse("8/2", f, &err) == 0 && f[2] == 0);
    tr_split_bounds(f, 5, b);   // round(4.0) = 4, round(1.0) = 1
    CHECK(b[1] == 4 && b[2] == 5 && b[3] == 5);
    CHECK(tr_split_parse("1,2,x", f, &err) == -1 && strstr(err.msg, "1,2,x"));
    CHECK(tr_split_parse("1,2,3,4", f, &err) == -1);

    const int32_t L = 16;
    const char *one[1] = {pa};
    tr_sampler_config cfg = {one, NULL, 1, NULL, TR_SPLIT_TRAIN, L, 7, 0};
    cfg.n_samples = (3 * T - 1) / L;  // exactly three epochs of windows
    tr_sampler s1, s2;
    CHECKF(tr_sampler_init(&s1, &cfg, &err) == 0, "%s", err.msg);
    CHECKF(tr_sampler_init(&s2, &cfg, &err) == 0, "%s", err.msg);
    CHECK(s1.parts[0].n_epochs == 3);
    // Each epoch's document order is a permutation of all documents.
    for (int e = 0; e < 3; e++) {
        int seen[N_DOCS] = {0};
        for (int d = 0; d < N_DOCS; d++) seen[s1.parts[0].doc_order[e * N_DOCS + d]]++;
        int perm = 1;
        for (int d = 0; d < N_DOCS; d++) perm &= seen[d] == 1;
        CHECK(perm);
    }
    int32_t w1[L + 1], w2[L + 1], ds[L + 2], nd = 0;
    int64_t covered[N_DOCS][40];
    memset(covered, 0, sizeof covered);
    int all_ok = 1, same = 1;
    int64_t first_epoch = (T + L - 1) / L;  // windows that start in epoch 0
    for (int64_t k = 0; k < s1.n_samples; k++) {
        if (tr_sampler_get(&s1, k, w1, ds, &nd, &err)) {
            CHECKF(0, "%s", err.msg);
            break;
        }
        all_ok &= window_ok(w1, L + 1, ds, nd);
        CHECK(tr_sampler_next(&s2, w2, &err) == 1);
        same &= memcmp(w1, w2, sizeof w1) == 0;
        if (k < first_epoch)
            for (int t = 0; t < L; t++) covered[w1[t] / 1000][w1[t] % 1000]++;
    }
    CHECK(tr_sampler_next(&s2, w2, &err) == 0);  // exhausted
    CHECK(all_ok);
    CHECK(same);
    // The first epoch's draws cover every token of every document once, in whatever order
    // (a window straddling into epoch 1 may add a few tokens twice).
    int64_t missing = 0, total = 0;
    for (int d = 0; d < N_DOCS; d++)
        for (int t = 0; t < doc_len[d]; t++) {
            missing += covered[d][t] == 0;
            total += covered[d][t];
        }
    CHECK(missing == 0);
    CHECK(total == first_epoch * L);
    // The draws are shuffled: not in stream order.
    CHECK(s1.parts[0].order[0] != 0 || s1.parts[0].order[1] != 1 || s1.parts[0].order[2] != 2);

    // Resume: a fresh sampler seeking to k continues the same stream.
    tr_sampler s3;
    CHECK(tr_sampler_init(&s3, &cfg, &err) == 0);
    tr_sampler_seek(&s3, 17);
    CHECK(tr_sampler_next(&s3, w2, &err) == 1);
    CHECK(tr_sampler_get(&s1, 17, w1, NULL, NULL, &err) == 0);
    CHECK(memcmp(w1, w2, sizeof w1) == 0);
    tr_sampler_free(&s3);
    // Another seed, another order.
    cfg.seed = 8;
    CHECK(tr_sampler_init(&s3, &cfg, &err) == 0);
    int differ = 0;
    for (int64_t k = 0; k < 10; k++) {
        CHECK(tr_sampler_get(&s3, k, w2, NULL, NULL, &err) == 0);
        CHECK(tr_sampler_get(&s1, k, w1, NULL, NULL, &err) == 0);
        differ += memcmp(w1, w2, sizeof w1) != 0;
    }
    CHECK(differ > 0);
    tr_sampler_free(&s3);
    tr_sampler_free(&s1);
    tr_sampler_free(&s2);

    // Blend 30/70: after every draw k the shares are within one sample of weight * k.
    const char *two[2] = {pa, pb};
    double wts[2] = {3, 7};
    tr_sampler_config bc = {two, wts, 2, "8,1,1", TR_SPLIT_TRAIN, L, 3, 1000};
    CHECKF(tr_sampler_init(&s1, &bc, &err) == 0, "%s", err.msg);
    int64_t n0 = 0, n1 = 0, worst = 0, bad_doc = 0;
    tr_split_parse("8,1,1", f, &err);
    tr_split_bounds(f, N_DOCS, b);  // 40, 5, 5
    CHECK(b[1] == 40 && b[2] == 45);
    for (int64_t k = 0; k < 1000; k++) {
        CHECK(tr_sampler_get(&s1, k, w1, NULL, NULL, &err) == 0);
        int from_b = w1[0] / 1000 >= 100;
        CHECK(from_b == s1.blend_part[k]);
        if (from_b)
            n1++;
        else
            n0++;
        double e = (double)n0 - 0.3 * (double)(k + 1);
        if (e < 0) e = -e;
        if (e > 1.0) worst++;
        for (int t = 0; t <= L; t++) bad_doc += (w1[t] / 1000) % 100 >= 40;  // train docs only
    }
    CHECK(worst == 0);
    CHECK(n0 == 300 && n1 == 700);
    CHECK(bad_doc == 0);
    tr_sampler_free(&s1);
    // The validation split sees only its five documents.
    bc.split_index = TR_SPLIT_VALID;
    bc.n_samples = 50;
    CHECKF(tr_sampler_init(&s1, &bc, &err) == 0, "%s", err.msg);
    for (int64_t k = 0; k < 50; k++) {
        CHECK(tr_sampler_get(&s1, k, w1, NULL, NULL, &err) == 0);
        for (int t = 0; t <= L; t++) {
            int d = (w1[t] / 1000) % 100;
            bad_doc += d < 40 || d >= 45;
        }
    }
    CHECK(bad_doc == 0);
    tr_sampler_free(&s1);

    // Errors name what is wrong.
    const char *nope[1] = {"/nonexistent/prefix"};
    tr_sampler_config ec = {nope, NULL, 1, NULL, 0, L, 1, 10};
    CHECK(tr_sampler_init(&s1, &ec, &err) == -1 && strstr(err.msg, "/nonexistent/prefix.idx"));
    tr_sampler_config zc = {one, NULL, 1, "1,0,0", TR_SPLIT_TEST, L, 1, 10};
    CHECK(tr_sampler_init(&s1, &zc, &err) == -1 && strstr(err.msg, "nothing to sample"));
    return tr_test_summary("test_sampler");
}
