// Sampling against hand-computed distributions on small logits vectors: temperature, top-k,
// top-p (on the temperature-scaled distribution, renormalized after top-k), ties broken by
// lower id; exact support checks (tokens outside the kept set are never drawn) and empirical
// frequencies over many draws within a binomial bound. A 1000-token vocabulary checks the
// selection paths (top-k beyond one head, nucleus grown past 256 tokens) against a full sort
// in float64. The CPU backend's sample op draws tr_sample's ids from the same stream
// positions, which the caller then advances by two words.
#include <stdbool.h>
#include <stdio.h>

#include "engine/sample.h"
#include "kernels/ops.h"
#include "tests/test.h"

#define N_DRAWS 200000

// Checks tr_sample_probs against want[] (1e-9) and N_DRAWS draws against it: every
// frequency within 5 binomial standard deviations (+1 draw), zero-probability tokens never.
static void check_dist(const char *what, const float *logits, int32_t V,
                       tr_sample_params p, const double *want, uint64_t seed) {
    tr_token_sampler s;
    tr_err err = {0};
    CHECK(tr_token_sampler_init(&s, V, &err) == 0);
    double probs[16];
    int32_t kept = tr_sample_probs(&s, logits, &p, probs);
    int32_t want_kept = 0;
    for (int32_t i = 0; i < V; i++) {
        want_kept += want[i] > 0;
        CHECKF(fabs(probs[i] - want[i]) <= 1e-9, "%s: p[%d] = %.12g, hand %.12g", what, i,
               probs[i], want[i]);
    }
    CHECKF(kept == want_kept, "%s: kept %d, want %d", what, kept, want_kept);
    int64_t count[16] = {0};
    tr_rng rng;
    tr_rng_init(&rng, seed);
    int64_t outside = 0;
    for (int32_t d = 0; d < N_DRAWS; d++) {
        int32_t t = tr_sample(&s, logits, &p, &rng);
        if (t >= 0 && t < V) count[t]++;
        else outside++;
    }
    CHECKF(outside == 0, "%s: %lld draws outside the vocabulary", what, (long long)outside);
    for (int32_t i = 0; i < V; i++) {
        double f = (double)count[i] / N_DRAWS;
        double bound = 5.0 * sqrt(want[i] * (1 - want[i]) / N_DRAWS) + 1.0 / N_DRAWS;
        if (want[i] == 0) CHECKF(count[i] == 0, "%s: token %d outside the support drawn %lld "
                                 "times", what, i, (long long)count[i]);
        else CHECKF(fabs(f - want[i]) <= bound, "%s: token %d frequency %.5f, p %.5f (bound "
                    "%.5f)", what, i, f, want[i], bound);
    }
    tr_token_sampler_free(&s);
}

static void test_hand_distributions(void) {
    // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
    float lg[4];
    const double p[4] = {0.4, 0.3, 0.2, 0.1};
    for (int32_t i = 0; i < 4; i++) lg[i] = (float)log(p[i]);
    // exp of float-rounded logs: the float rounding moves probabilities by < 1e-7.
    double q[4], z = 0;
    for (int32_t i = 0; i < 4; i++) z += q[i] = exp((double)lg[i]);
    for (int32_t i = 0; i < 4; i++) q[i] /= z;
    check_dist("T=1", lg, 4, (tr_sample_params){1.0f, 0, 1.0f}, q, 1);
    // Temperature 0.5 squares the probabilities: .16 .09 .04 .01 over .30.
    double t05[4];
    z = 0;
    for (int32_t i = 0; i < 4; i++) z += t05[i] = q[i] * q[i];
    for (int32_t i = 0; i < 4; i++) t05[i] /= z;
    CHECK(fabs(t05[0] - 0.16 / 0.30) < 1e-6 && fabs(t05[3] - 0.01 / 0.30) < 1e-6);
    check_dist("T=0.5", lg, 4, (tr_sample_params){0.5f, 0, 1.0f}, t05, 2);
    // top-k 3: .4 .3 .2 over .9.
    double k3[4] = {q[0] / (q[0] + q[1] + q[2]), q[1] / (q[0] + q[1] + q[2]),
                    q[2] / (q[0] + q[1] + q[2]), 0};
    check_dist("top_k=3", lg, 4, (tr_sample_params){1.0f, 3, 1.0f}, k3, 3);
    // top-p 0.65: .4 (nothing before it), .3 (.4 before it < .65); .2 has .7 before it.
    double p65[4] = {q[0] / (q[0] + q[1]), q[1] / (q[0] + q[1]), 0, 0};
    check_dist("top_p=0.65", lg, 4, (tr_sample_params){1.0f, 0, 0.65f}, p65, 4);
    // top-p 0.75 keeps .2 as well (.7 before it < .75).
    check_dist("top_p=0.75", lg, 4, (tr_sample_params){1.0f, 0, 0.75f}, k3, 5);
    // top-k 3 then top-p 0.5 on the renormalized top 3 (.444, .333, .222): keeps 2 tokens.
    check_dist("top_k=3,top_p=0.5", lg, 4, (tr_sample_params){1.0f, 3, 0.5f}, p65, 6);
    // Temperature 2 then top-p 0.6: sqrt(p) normalized = .3254 .2818 .2301 .1627; the third
    // token has .6072 before it, so two stay: .5359 .4641.
    double t2[4] = {sqrt(q[0]) / (sqrt(q[0]) + sqrt(q[1])), sqrt(q[1]) / (sqrt(q[0]) + sqrt(q[1])),
                    0, 0};
    CHECK(fabs(t2[0] - 0.53590) < 1e-4);
    check_dist("T=2,top_p=0.6", lg, 4, (tr_sample_params){2.0f, 0, 0.6f}, t2, 7);
    // Ties: three equal logits; top-k 2 keeps the two lowest ids, never id 2.
    float tie[4] = {1.0f, 1.0f, 1.0f, 0.0f};
    double half[4] = {0.5, 0.5, 0, 0};
    check_dist("ties top_k=2", tie, 4, (tr_sample_params){1.0f, 2, 1.0f}, half, 8);
    // p = e/(3e+1) = .2969 each: top-p 0.5 keeps ids 0 and 1 (.594 before id 2).
    check_dist("ties top_p=0.5", tie, 4, (tr_sample_params){1.0f, 0, 0.5f}, half, 9);
    // Greedy: argmax, lowest id on ties, no randomness used.
    float g[4] = {0.0f, 3.0f, 3.0f, 1.0f};
    tr_token_sampler s;
    tr_err err = {0};
    CHECK(tr_token_sampler_init(&s, 4, &err) == 0);
    tr_rng rng;
    tr_rng_init(&rng, 3);
    tr_sample_params greedy = {0.0f, 0, 1.0f};
    CHECK(tr_sample(&s, g, &greedy, &rng) == 1 && rng.counter == 0 && rng.used == 4);
    double one[4] = {0, 1, 0, 0};
    check_dist("greedy", g, 4, greedy, one, 10);
    tr_token_sampler_free(&s);
}

// float64 reference for a large vocabulary: full sort by (logit desc, id asc), temperature,
// top-k, then the nucleus rule on the renormalized top-k mass.
static const float *ref_lg;
static int ref_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (ref_lg[x] != ref_lg[y]) return ref_lg[x] > ref_lg[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

static int32_t ref_probs(const float *lg, int32_t V, tr_sample_params p, double *out) {
    int32_t *idx = malloc((size_t)V * sizeof(int32_t));
    for (int32_t i = 0; i < V; i++) idx[i] = i;
    ref_lg = lg;
    qsort(idx, (size_t)V, sizeof(int32_t), ref_cmp);
    int32_t n = p.top_k > 0 && p.top_k < V ? p.top_k : V;
    double mx = lg[idx[0]], mass = 0;
    for (int32_t r = 0; r < n; r++) mass += exp(((double)lg[idx[r]] - mx) / p.temperature);
    int32_t keep = 0;
    double before = 0;
    while (keep < n && before < p.top_p * mass)
        before += exp(((double)lg[idx[keep++]] - mx) / p.temperature);
    for (int32_t i = 0; i < V; i++) out[i] = 0;
    double z = 0;
    for (int32_t r = 0; r < keep; r++) z += exp(((double)lg[idx[r]] - mx) / p.temperature);
    for (int32_t r = 0; r < keep; r++)
        out[idx[r]] = exp(((double)lg[idx[r]] - mx) / p.temperature) / z;
    free(idx);
    return keep;
}

static void test_large_vocab(void) {
    enum { V = 1000 };
    float lg[V];
    tr_rng rng;
    tr_rng_init(&rng, 11);
    // Flat-ish logits in [-1, 1), with runs of exact ties (every 10th value repeated).
    for (int32_t i = 0; i < V; i++) lg[i] = 2.0f * tr_rng_uniform(&rng) - 1.0f;
    for (int32_t i = 10; i < V; i += 10) lg[i] = lg[i - 10];
    tr_token_sampler s;
    tr_err err = {0};
    CHECK(tr_token_sampler_init(&s, V, &err) == 0);
    static double got[V], want[V];
    const tr_sample_params cases[] = {{1.0f, 0, 0.9f},   {0.7f, 300, 1.0f}, {1.3f, 300, 0.5f},
                                      {1.0f, 0, 1.0f},   {0.5f, 5, 1.0f},   {1.0f, 999, 0.99f},
                                      {0.9f, 1000, 0.3f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t kept = tr_sample_probs(&s, lg, &cases[c], got);
        int32_t want_kept = ref_probs(lg, V, cases[c], want);
        double e = 0;
        for (int32_t i = 0; i < V; i++) e = fmax(e, fabs(got[i] - want[i]));
        CHECKF(kept == want_kept && e <= 1e-12, "case %zu: kept %d (ref %d), max diff %.3g", c,
               kept, want_kept, e);
        if (c == 0) CHECKF(kept > 256, "nucleus of %d tokens does not exercise growth", kept);
        // Draws stay inside the kept set.
        bool inside = true;
        for (int32_t d = 0; d < 2000; d++) inside &= want[tr_sample(&s, lg, &cases[c], &rng)] > 0;
        CHECKF(inside, "case %zu: a draw outside the kept set", c);
    }
    tr_token_sampler_free(&s);
}

static void test_streams(void) {
    float lg[8] = {0.1f, 0.5f, -0.3f, 0.0f, 0.2f, 0.9f, -1.0f, 0.4f};
    tr_token_sampler s;
    tr_err err = {0};
    CHECK(tr_token_sampler_init(&s, 8, &err) == 0);
    tr_sample_params p = {1.0f, 0, 1.0f};
    // Same seed: same tokens; derived streams of one seed differ from each other.
    tr_rng a, b, c;
    tr_rng_init(&a, tr_rng_derive(5, 0));
    tr_rng_init(&b, tr_rng_derive(5, 0));
    tr_rng_init(&c, tr_rng_derive(5, 1));
    int32_t same = 0, diff = 0;
    for (int32_t i = 0; i < 200; i++) {
        int32_t x = tr_sample(&s, lg, &p, &a), y = tr_sample(&s, lg, &p, &b);
        int32_t z = tr_sample(&s, lg, &p, &c);
        same += x == y;
        diff += x != z;
    }
    CHECK(same == 200 && diff > 100);
    // The 53-bit uniform: in [0, 1), mean 1/2 within 5 standard errors.
    tr_rng r;
    tr_rng_init(&r, 9);
    double sum = 0, lo = 1, hi = 0;
    for (int32_t i = 0; i < 100000; i++) {
        double u = tr_sample_uniform(&r);
        sum += u;
        lo = fmin(lo, u);
        hi = fmax(hi, u);
    }
    CHECK(lo >= 0 && hi < 1);
    CHECK(fabs(sum / 100000 - 0.5) <= 5 * sqrt(1.0 / 12 / 100000));
    // Parameter checks.
    CHECK(tr_sample_params_check(&(tr_sample_params){-1.0f, 0, 1.0f}, &err) != 0);
    CHECK(tr_sample_params_check(&(tr_sample_params){NAN, 0, 1.0f}, &err) != 0);
    CHECK(tr_sample_params_check(&(tr_sample_params){1.0f, -2, 1.0f}, &err) != 0);
    CHECK(tr_sample_params_check(&(tr_sample_params){1.0f, 0, 0.0f}, &err) != 0);
    CHECK(tr_sample_params_check(&(tr_sample_params){1.0f, 0, 1.5f}, &err) != 0 &&
          strstr(err.msg, "top_p"));
    CHECK(tr_sample_params_check(&(tr_sample_params){0.0f, 0, 1.0f}, &err) == 0);
    tr_token_sampler_free(&s);
}

static void *dev_put(tr_backend *be, const void *host, size_t bytes) {
    void *p = be->ops->alloc(be, bytes);
    if (!p) {
        fprintf(stderr, "backend alloc of %zu bytes failed\n", bytes);
        exit(1);
    }
    if (host) be->ops->upload(be, p, host, bytes);
    return p;
}

// B rows of normal(0, 3) logits, every combination of the parameters below, each row with
// its own stream at its own position: the op and tr_sample draw the same ids.
static void test_backend_op(void) {
    enum { B = 96, V = 700 };
    static const float temps[] = {0.0f, 0.6f, 1.0f, 2.5f}, top_ps[] = {1.0f, 0.9f, 0.3f, 0.02f};
    static const int32_t top_ks[] = {0, 1, 20, 300, 700, 900};
    tr_backend be;
    CHECK(tr_backend_cpu_init(&be, 2, TR_F32) == 0);
    tr_token_sampler s;
    tr_err err = {0};
    CHECK(tr_token_sampler_init(&s, V, &err) == 0);
    float *lg = malloc((size_t)B * V * sizeof(float));
    tr_sample_row rows[B];
    tr_rng streams[B], gen;
    CHECK(lg != NULL);
    tr_rng_init(&gen, 2024);
    for (int32_t b = 0; b < B; b++) {
        for (int32_t i = 0; i < V; i++) lg[(size_t)b * V + i] = 3.0f * tr_rng_normal(&gen);
        tr_rng_init(&streams[b], tr_rng_derive(77, (uint64_t)b));
        for (int32_t k = 0; k < b % 9; k++) tr_rng_u32(&streams[b]);
        rows[b] = (tr_sample_row){.temperature = temps[b % 4], .top_k = top_ks[b / 4 % 6],
                                  .top_p = top_ps[b / 24 % 4], .seed = streams[b].seed,
                                  .counter = streams[b].counter, .used = streams[b].used};
    }
    int32_t zero = 0, n_near = -1, ids[B];
    float *d_lg = dev_put(&be, lg, (size_t)B * V * sizeof(float));
    tr_sample_row *d_rows = dev_put(&be, rows, sizeof rows);
    int32_t *d_ids = dev_put(&be, NULL, sizeof ids), *d_near = dev_put(&be, &zero, sizeof zero);
    float *d_lp = dev_put(&be, NULL, B * sizeof(float));
    void *d_scratch = dev_put(&be, NULL, be.ops->sample_scratch_bytes(&be, B, V));
    be.ops->sample(&be, d_ids, d_lp, d_lg, d_rows, B, V, tr_sample_rows_ranked(rows, B, V),
                   d_scratch, d_near);
    be.ops->download(&be, ids, d_ids, sizeof ids);
    be.ops->download(&be, &n_near, d_near, sizeof n_near);
    char msg[256];
    CHECK(be.ops->sync(&be, "test_sample", msg, sizeof msg) == 0);
    int same = 1, advanced = 1;
    for (int32_t b = 0; b < B; b++) {
        tr_sample_params p = {rows[b].temperature, rows[b].top_k, rows[b].top_p};
        tr_rng after = streams[b];
        if (p.temperature > 0.0f) {   // the caller's advance: two words
            tr_rng_u32(&after);
            tr_rng_u32(&after);
        }
        int32_t want = tr_sample(&s, lg + (size_t)b * V, &p, &streams[b]);
        if (want != ids[b])
            fprintf(stderr, "row %d: op %d, tr_sample %d\n", b, ids[b], want);
        same &= want == ids[b];
        advanced &= streams[b].counter == after.counter && streams[b].used == after.used;
    }
    CHECK(same);
    CHECK(advanced);
    CHECK(n_near == 0);   // random logits: no target within 1e-12 of a boundary
    be.ops->free(&be, d_lg);
    be.ops->free(&be, d_rows);
    be.ops->free(&be, d_ids);
    be.ops->free(&be, d_near);
    be.ops->free(&be, d_lp);
    be.ops->free(&be, d_scratch);
    free(lg);
    tr_token_sampler_free(&s);
    tr_backend_cpu_free(&be);
}

int main(void) {
    test_hand_distributions();
    test_large_vocab();
    test_streams();
    test_backend_op();
    return tr_test_summary("test_sample");
}
