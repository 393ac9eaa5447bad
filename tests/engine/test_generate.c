// Generation against its references, on the transformers fixture models:
//  - greedy output equals transformers' generate(do_sample=False) (tools/make_model_fixtures.py);
//  - every reported logprob equals the training path's (tr_model_forward + LM head over
//    prompt + output) bit for bit, for prompts of different lengths with n > 1, small blocks
//    (shared prefixes, copy on write) and prompts longer than one pass (chunked prefill);
//  - a request's tokens do not depend on what else is in the batch, the block size or how
//    many sequences decode together;
//  - KV accounting: a short pool makes requests wait (same results), nothing leaks, and a
//    request that cannot fit at all is an error naming it;
//  - stop ids: one, or hundreds in any order with repeats, end a sample at the first one
//    sampled after min_new_tokens.
#include <stdio.h>

#include "engine/generate.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "tests/engine/model_util.h"
#include "tests/backend_test.h"
#include "tests/test.h"

#define MAX_OUT 64

static int load(tr_model *m, const char *name, int32_t max_tokens, tr_backend *be) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/models/%s", name);
    tr_model_opts opts = {.max_tokens = max_tokens, .training = false};
    tr_err err = {0};
    int rc = tr_model_load(m, tr_test_src(path), be, &opts, &err);
    CHECKF(rc == 0, "%s", err.msg);
    return rc;
}

// Runs reqs through a fresh generator with opts; outs must hold every sample.
static int run(tr_model *m, const tr_gen_opts *opts, const tr_gen_request *reqs, int32_t n,
               tr_gen_output *outs, tr_gen_stats *stats) {
    tr_generator g;
    tr_err err = {0};
    int rc = tr_generator_init(&g, m, opts, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc != 0) return -1;
    rc = tr_generate(&g, reqs, n, outs, &err);
    CHECKF(rc == 0, "%s", err.msg);
    // Nothing is left holding a block once every sample has finished.
    CHECKF(g.cache.n_free == g.cache.n_blocks, "%d of %d blocks free after the run",
           g.cache.n_free, g.cache.n_blocks);
    int32_t held = 0;
    for (int32_t b = 0; b < g.cache.n_blocks; b++) held += g.cache.refs[b] != 0;
    CHECK(held == 0 && g.reserved == 0 && g.n_active == 0);
    if (stats) *stats = g.stats;
    tr_generator_free(&g);
    return rc;
}

static void test_greedy_hf(const char *name, tr_backend *be) {
    printf("%s: greedy vs transformers\n", name);
    tr_model m;
    if (load(&m, name, 64, be) != 0) return;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/models/%s/expected.safetensors", name);
    tr_st_file ex;
    tr_err err = {0};
    CHECKF(tr_st_open(&ex, tr_test_src(path), &err) == 0, "%s", err.msg);
    int32_t *prompts[8], *want[8];
    size_t np[8], nw[8];
    int32_t n = 0;
    for (; n < 8; n++) {
        char key[64];
        snprintf(key, sizeof key, "gen.prompt.%d", n);
        if (!(prompts[n] = st_ints(&ex, key, &np[n]))) break;
        snprintf(key, sizeof key, "gen.output.%d", n);
        want[n] = st_ints(&ex, key, &nw[n]);
        CHECK(want[n] && nw[n] > np[n]);
    }
    CHECKF(n >= 3, "%d greedy fixtures", n);
    // Every prompt with two samples: both must be the greedy continuation.
    tr_gen_request reqs[8];
    for (int32_t i = 0; i < n; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = (int32_t)np[i],
                                   .n_samples = 2, .sampling = {.temperature = 0, .top_p = 1},
                                   .seed = 1, .stop_ids = m.cfg.eos_token_ids,
                                   .n_stop = m.cfg.n_eos, .max_new_tokens = 16};
    tr_gen_output outs[16];
    tr_gen_opts opts = {.kv_tokens = 256, .block_size = 4};
    if (run(&m, &opts, reqs, n, outs, NULL) == 0) {
        for (int32_t i = 0; i < 2 * n; i++) {
            int32_t r = outs[i].request;
            int32_t n_new = (int32_t)(nw[r] - np[r]);
            bool same = outs[i].n_tokens == n_new;
            for (int32_t t = 0; same && t < n_new; t++)
                same = outs[i].tokens[t] == want[r][np[r] + t];
            CHECKF(same, "prompt %d sample %d: %d tokens, transformers %d", r, outs[i].sample,
                   outs[i].n_tokens, n_new);
            bool eos = false;
            for (int32_t e = 0; e < m.cfg.n_eos; e++)
                eos |= want[r][nw[r] - 1] == m.cfg.eos_token_ids[e];
            CHECK(outs[i].finish == (eos ? TR_GEN_STOP : TR_GEN_LENGTH));
            if (eos) CHECK(n_new < 16);
        }
        printf("  %d prompts x 2 samples match\n", n);
        tr_gen_outputs_free(outs, 2 * n);
    }
    // A stop id taken from the continuation ends the sample right there.
    int32_t stop = want[0][np[0] + 3];
    int32_t first = 0;
    while (want[0][np[0] + first] != stop) first++;
    tr_gen_request r0 = reqs[0];
    r0.stop_ids = &stop;
    r0.n_stop = 1;
    r0.n_samples = 1;
    if (run(&m, &opts, &r0, 1, outs, NULL) == 0) {
        CHECK(outs[0].n_tokens == first + 1 && outs[0].finish == TR_GEN_STOP);
        CHECK(outs[0].tokens[first] == stop);
        tr_gen_outputs_free(outs, 1);
    }
    // A stop set of hundreds of ids, unsorted and with repeats: every id but those the greedy
    // continuation takes before `first`, so the sample ends at `first` again.
    int32_t V = m.cfg.vocab_size, many[2 * 300], n_many = 0;
    CHECKF(V <= 300, "the fixture's vocabulary is %d ids", V);   // many's room
    for (int32_t id = (V <= 300 ? V : 0) - 1; id >= 0; id--) {
        bool before = false;
        for (int32_t t = 0; t < first; t++) before |= want[0][np[0] + t] == id;
        if (!before) many[n_many++] = id;
        if (!before && id % 3 == 0) many[n_many++] = id;
    }
    CHECKF(n_many > 200, "%d stop ids", n_many);
    r0.stop_ids = many;
    r0.n_stop = n_many;
    if (run(&m, &opts, &r0, 1, outs, NULL) == 0) {
        CHECK(outs[0].n_tokens == first + 1 && outs[0].finish == TR_GEN_STOP && outs[0].tokens[first] == stop);
        tr_gen_outputs_free(outs, 1);
    }
    // Sampled: with the even ids as stops (listed backwards), every sample ends at its first
    // even id after min_new_tokens, or runs to max_new_tokens.
    int32_t even[150], n_even = 0;
    for (int32_t id = V - 1; id >= 0 && n_even < 150; id--)
        if (id % 2 == 0) even[n_even++] = id;
    tr_gen_request rs = reqs[0];
    rs.sampling = (tr_sample_params){.temperature = 1.0f, .top_p = 1.0f};
    rs.n_samples = 8;
    rs.stop_ids = even;
    rs.n_stop = n_even;
    rs.min_new_tokens = 2;
    if (run(&m, &opts, &rs, 1, outs, NULL) == 0) {
        int32_t stopped = 0;
        for (int32_t i = 0; i < 8; i++) {
            const tr_gen_output *o = &outs[i];
            bool ok = o->n_tokens >= 1;
            for (int32_t t = rs.min_new_tokens; ok && t < o->n_tokens - 1; t++) ok = o->tokens[t] % 2 != 0;
            if (o->finish == TR_GEN_STOP)
                ok = ok && o->n_tokens > rs.min_new_tokens && o->tokens[o->n_tokens - 1] % 2 == 0;
            else
                ok = ok && o->finish == TR_GEN_LENGTH && o->n_tokens == rs.max_new_tokens;
            CHECKF(ok, "sample %d: %d tokens, finish %d", i, o->n_tokens, (int)o->finish);
            stopped += o->finish == TR_GEN_STOP;
        }
        CHECKF(stopped > 0, "no sample of 8 met one of %d stop ids", n_even);
        tr_gen_outputs_free(outs, 8);
    }
    r0.stop_ids = &stop;
    r0.n_stop = 1;
    // With min_new_tokens past it the stop id is a token like any other: the sample goes on as
    // the reference's greedy continuation, to the next occurrence or to max_new_tokens.
    r0.min_new_tokens = first + 1;
    int32_t next = first + 1;
    while (next < r0.max_new_tokens && want[0][np[0] + next] != stop) next++;
    if (run(&m, &opts, &r0, 1, outs, NULL) == 0) {
        int32_t n_want = next < r0.max_new_tokens ? next + 1 : r0.max_new_tokens;
        CHECK(outs[0].n_tokens == n_want && outs[0].tokens[first] == stop);
        CHECK(outs[0].finish == (next < r0.max_new_tokens ? TR_GEN_STOP : TR_GEN_LENGTH));
        CHECK(memcmp(outs[0].tokens, want[0] + np[0], (size_t)n_want * sizeof(int32_t)) == 0);
        tr_gen_outputs_free(outs, 1);
    }
    r0.min_new_tokens = r0.max_new_tokens + 1;   // past max_new_tokens: refused
    tr_generator g;
    tr_err gerr = {0};
    if (tr_generator_init(&g, &m, &opts, &gerr) == 0) {
        CHECK(tr_generate(&g, &r0, 1, outs, &gerr) != 0 && strstr(gerr.msg, "min_new_tokens"));
        tr_generator_free(&g);
    }
    for (int32_t i = 0; i < n; i++) {
        free(prompts[i]);
        free(want[i]);
    }
    tr_st_close(&ex);
    tr_model_free(&m);
}

// Prompts of lengths 1..37 (deterministic ids), some longer than a 16-row pass.
static void make_prompts(int32_t prompts[][40], int32_t *lens, int32_t n, int32_t V) {
    static const int32_t L[] = {1, 5, 13, 20, 37, 8, 3, 16};
    for (int32_t i = 0; i < n; i++) {
        lens[i] = L[i % 8];
        for (int32_t t = 0; t < lens[i]; t++) prompts[i][t] = (7 + 31 * i + 17 * t * t) % V;
    }
}

static void test_logprobs(const char *name, tr_backend *be) {
    printf("%s: logprobs vs the training path\n", name);
    tr_model gen_m, train_m;
    // 16-row passes: the 20- and 37-token prompts are prefilled in chunks.
    if (load(&gen_m, name, 16, be) != 0) return;
    if (load(&train_m, name, 128, be) != 0) return;
    const int32_t NR = 6, NS = 3;
    int32_t prompts[8][40], lens[8];
    make_prompts(prompts, lens, NR, gen_m.cfg.vocab_size);
    tr_gen_request reqs[8];
    const tr_sample_params sp[] = {{1.0f, 0, 1.0f}, {0.8f, 20, 1.0f}, {1.2f, 0, 0.9f},
                                   {0.0f, 0, 1.0f}, {1.0f, 5, 0.7f}, {1.0f, 0, 1.0f}};
    for (int32_t i = 0; i < NR; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = lens[i], .n_samples = NS,
                                   .sampling = sp[i], .seed = 100 + (uint64_t)i,
                                   .stop_ids = gen_m.cfg.eos_token_ids,
                                   .n_stop = gen_m.cfg.n_eos, .max_new_tokens = 12 + i};
    tr_gen_output outs[8 * 3];
    tr_gen_opts opts = {.kv_tokens = 1024, .block_size = 4, .max_seqs = 8};
    tr_gen_stats st;
    if (run(&gen_m, &opts, reqs, NR, outs, &st) == 0) {
        double worst = 0;
        int64_t bitwise = 0, total = 0;
        bool distinct = false;
        for (int32_t i = 0; i < NR * NS; i++) {
            const tr_gen_output *o = &outs[i];
            CHECK(o->request == i / NS && o->sample == i % NS);
            CHECK(o->n_tokens >= 1 && o->n_tokens <= reqs[o->request].max_new_tokens);
            CHECK(o->finish == TR_GEN_STOP || o->n_tokens == reqs[o->request].max_new_tokens);
            double e = gen_vs_training(&train_m, prompts[o->request], lens[o->request],
                                       o->tokens, o->logprobs, o->n_tokens, &bitwise);
            if (!(e <= worst)) worst = e;
            total += o->n_tokens;
            if (o->sample > 0 && o->tokens[0] != outs[i - 1].tokens[0]) distinct = true;
        }
        printf("  %lld tokens, max |logprob - training path| = %.3g (%lld bitwise equal); "
               "%lld passes, peak %d sequences, %d blocks\n", (long long)total, worst,
               (long long)bitwise, (long long)st.passes, st.peak_seqs, st.peak_blocks);
        // The CPU product is batch-invariant (kernels/cpu/gemm.h): the rows of a decode pass
        // and of a training forward give the same bits, so equality is exact. Elsewhere the
        // two paths differ by fp32 rounding of sums in another order (a few ulp per layer).
        if (et_batch_invariant(gen_m.be))
            CHECKF(worst == 0 && bitwise == total, "max logprob difference %.3g, %lld of %lld "
                   "bitwise equal", worst, (long long)bitwise, (long long)total);
        else
            CHECKF(worst <= 1e-5, "max logprob difference %.3g", worst);
        // Sampled requests really sampled: some samples of one prompt differ.
        CHECK(distinct);
        // Greedy request 3: all samples equal.
        for (int32_t j = 1; j < NS; j++) {
            const tr_gen_output *a = &outs[3 * NS], *b = &outs[3 * NS + j];
            CHECK(a->n_tokens == b->n_tokens &&
                  memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) == 0);
        }
        // Chunked prefill ran: 83 prompt tokens through 16-row passes, each prompt once.
        int32_t prompt_tokens = 0;
        for (int32_t i = 0; i < NR; i++) prompt_tokens += lens[i];
        CHECK(st.prefill_tokens == prompt_tokens);
        tr_gen_outputs_free(outs, NR * NS);
    }
    tr_model_free(&gen_m);
    tr_model_free(&train_m);
}

static bool same_output(const tr_gen_output *a, const tr_gen_output *b) {
    return a->n_tokens == b->n_tokens && a->finish == b->finish &&
           memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) == 0;
}

static bool same_logprobs(const tr_gen_output *a, const tr_gen_output *b) {
    return a->n_tokens == b->n_tokens &&
           memcmp(a->logprobs, b->logprobs, (size_t)a->n_tokens * sizeof(float)) == 0;
}

static void test_batch_independence(const char *name, tr_backend *be) {
    printf("%s: results independent of the batch\n", name);
    tr_model m;
    if (load(&m, name, 32, be) != 0) return;
    int32_t prompts[8][40], lens[8];
    make_prompts(prompts, lens, 8, m.cfg.vocab_size);
    tr_gen_request reqs[8];
    for (int32_t i = 0; i < 8; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = lens[i], .n_samples = 2,
                                   .sampling = {1.0f, 50, 0.95f}, .seed = 7 + (uint64_t)i,
                                   .stop_ids = NULL, .n_stop = 0, .max_new_tokens = 20};
    // Request 2 alone, then in the middle of all eight, with other block sizes and fewer
    // sequences decoding together.
    tr_gen_output alone[2], all[16], other[16];
    tr_gen_opts o1 = {.kv_tokens = 512, .block_size = 16, .max_seqs = 2};
    tr_gen_opts o2 = {.kv_tokens = 512, .block_size = 4, .max_seqs = 16};
    tr_gen_opts o3 = {.kv_tokens = 2048, .block_size = 7, .max_seqs = 5};
    if (run(&m, &o1, &reqs[2], 1, alone, NULL) != 0 || run(&m, &o2, reqs, 8, all, NULL) != 0 ||
        run(&m, &o3, reqs, 8, other, NULL) != 0)
        return;
    for (int32_t j = 0; j < 2; j++) {
        CHECKF(same_output(&alone[j], &all[4 + j]), "sample %d alone vs batch of 8", j);
        CHECKF(same_output(&alone[j], &other[4 + j]), "sample %d alone vs block size 7", j);
    }
    int32_t lp_same = 0;
    for (int32_t i = 0; i < 16; i++) {
        CHECKF(same_output(&all[i], &other[i]), "output %d differs between layouts", i);
        lp_same += same_logprobs(&all[i], &other[i]);
    }
    printf("  tokens identical; logprobs bitwise identical in %d of 16 outputs\n", lp_same);
    // Decode steps padded to buckets (what recorded steps run: requests of different lengths
    // leave 5, 4, 3 ... sequences decoding, padded to 4 or 5 rows, and block tables to a power
    // of two) give every real row the same bits as steps of exactly their rows.
    tr_gen_request varied[8];
    for (int32_t i = 0; i < 8; i++) {
        varied[i] = reqs[i];
        varied[i].max_new_tokens = 4 + 2 * i;
    }
    tr_gen_opts o3u = o3, o3p = o3;
    o3u.graphs = TR_GEN_GRAPHS_OFF;
    o3p.graphs = TR_GEN_GRAPHS_PAD;
    tr_gen_output exact[16], padded[16];
    tr_gen_stats st;
    if (run(&m, &o3u, varied, 8, exact, NULL) != 0 || run(&m, &o3p, varied, 8, padded, &st) != 0) return;
    int32_t pad_same = 0;
    for (int32_t i = 0; i < 16; i++)
        pad_same += same_output(&exact[i], &padded[i]) && same_logprobs(&exact[i], &padded[i]);
    printf("  padded steps: %lld padding rows, %d of 16 outputs bitwise identical\n",
           (long long)st.padded_rows, pad_same);
    CHECK(st.padded_rows > 0 && st.graph_steps == 0);
    // The device's block tables: rewritten whole when the width bucket changes, otherwise
    // sent as the entries that changed (samples admitted into freed slots, new blocks).
    printf("  block tables: %lld of %lld decode steps rewrote them, %lld entries sent\n",
           (long long)st.table_rewrites, (long long)st.decode_steps, (long long)st.table_entries);
    CHECK(st.table_rewrites > 0 && st.table_rewrites < st.decode_steps && st.table_entries > 0);
    // The rows advance on the device: the host sends a row when it starts (after a prefill
    // pass), moves into a freed slot or pads a bucket, not every step.
    printf("  decode rows: %lld of %lld (with padding) sent by the host\n",
           (long long)st.rows_sent, (long long)(st.decode_tokens + st.padded_rows));
    CHECK(st.rows_sent >= st.padded_rows && st.rows_sent < st.decode_tokens + st.padded_rows);
    if (et_batch_invariant(be)) CHECK(pad_same == 16);
    for (int32_t i = 0; i < 16; i++) CHECKF(same_output(&exact[i], &padded[i]), "padded output %d", i);
    tr_gen_outputs_free(exact, 16);
    tr_gen_outputs_free(padded, 16);
    // Two samples of one request draw from different streams.
    CHECK(!same_output(&all[0], &all[1]) || !same_output(&all[2], &all[3]));
    // A model set up for training (the policy generating between steps) gives the same.
    tr_model tm;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/models/%s", name);
    tr_model_opts topts = {.max_tokens = 32, .training = true};
    tr_err err = {0};
    int rc = tr_model_load(&tm, tr_test_src(path), be, &topts, &err);
    CHECKF(rc == 0, "%s", err.msg);
    tr_gen_outputs_free(other, 16);
    if (rc == 0 && run(&tm, &o2, reqs, 8, other, NULL) == 0) {
        for (int32_t i = 0; i < 16; i++)
            CHECKF(same_output(&all[i], &other[i]) && same_logprobs(&all[i], &other[i]),
                   "output %d differs on a training model", i);
    }
    if (rc == 0) tr_model_free(&tm);
    tr_gen_outputs_free(alone, 2);
    tr_gen_outputs_free(all, 16);
    tr_gen_outputs_free(other, 16);
    tr_model_free(&m);
}

static void test_pool_pressure(const char *name, tr_backend *be) {
    printf("%s: KV pool pressure\n", name);
    tr_model m;
    if (load(&m, name, 32, be) != 0) return;
    int32_t prompts[8][40], lens[8];
    make_prompts(prompts, lens, 8, m.cfg.vocab_size);
    tr_gen_request reqs[8];
    for (int32_t i = 0; i < 8; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = lens[i], .n_samples = 3,
                                   .sampling = {1.0f, 0, 1.0f}, .seed = 50 + (uint64_t)i,
                                   .stop_ids = m.cfg.eos_token_ids, .n_stop = m.cfg.n_eos,
                                   .max_new_tokens = 10};
    // The largest request (37-token prompt): 10 prompt blocks + one sample's 3 = 13 blocks.
    int32_t need = tr_kv_blocks_for(37, 4) + tr_gen_sample_blocks(37, 10, 4);
    CHECK(need == 13);
    tr_gen_output big[24], small[24];
    tr_gen_stats sb, ss;
    tr_gen_opts ob = {.kv_tokens = 4096, .block_size = 4, .max_seqs = 32};
    tr_gen_opts os = {.kv_tokens = 4 * need, .block_size = 4, .max_seqs = 32};
    if (run(&m, &ob, reqs, 8, big, &sb) != 0 || run(&m, &os, reqs, 8, small, &ss) != 0) return;
    printf("  big pool: %lld waits, peak %d sequences, %d blocks; %d-block pool: %lld waits, "
           "peak %d sequences, %d blocks, %lld decode steps (vs %lld)\n", (long long)sb.waits,
           sb.peak_seqs, sb.peak_blocks, need, (long long)ss.waits, ss.peak_seqs,
           ss.peak_blocks, (long long)ss.decode_steps, (long long)sb.decode_steps);
    CHECK(sb.waits == 0 && ss.waits > 0);
    CHECK(ss.peak_seqs < sb.peak_seqs && sb.peak_seqs == 24);
    for (int32_t i = 0; i < 24; i++) {
        CHECKF(same_output(&big[i], &small[i]), "output %d differs under pool pressure", i);
    }
    tr_gen_outputs_free(big, 24);
    tr_gen_outputs_free(small, 24);

    // A pool exactly the size of the largest request runs it (its samples one after another).
    tr_gen_opts oe = {.kv_tokens = 4 * need, .block_size = 4, .max_seqs = 32};
    if (run(&m, &oe, &reqs[4], 1, small, &ss) == 0) {
        CHECK(ss.peak_seqs == 1);
        tr_gen_outputs_free(small, 3);
    }
    // Shared prefix, counted by hand: a 13-token prompt in 4-token blocks is 3 full blocks
    // and 1 holding one token; 3 greedy samples of 10 tokens write positions 13..21 (blocks
    // 3..5). Two samples copy block 3 on write, the third keeps it: 3 + 3 + 3 * 2 = 12 blocks
    // at the end, against 18 without sharing.
    tr_gen_request sh = {.prompt = prompts[2], .n_prompt = 13, .n_samples = 3,
                         .sampling = {0.0f, 0, 1.0f}, .max_new_tokens = 10};
    CHECK(lens[2] == 13);
    if (run(&m, &ob, &sh, 1, small, &ss) == 0) {
        CHECKF(ss.peak_blocks == 12, "peak %d blocks", ss.peak_blocks);
        tr_gen_outputs_free(small, 3);
    }
    // One block short: an error naming the request, and the pool stays whole.
    tr_generator g;
    tr_err err = {0};
    tr_gen_opts os2 = {.kv_tokens = 4 * (need - 1), .block_size = 4};
    CHECK(tr_generator_init(&g, &m, &os2, &err) == 0);
    CHECK(tr_generate(&g, reqs, 8, small, &err) != 0);
    CHECKF(strstr(err.msg, "request 4 needs 13 KV blocks") != NULL, "%s", err.msg);
    CHECK(g.cache.n_free == g.cache.n_blocks);
    // Bad requests are refused before anything runs.
    tr_gen_request bad = reqs[0];
    bad.max_new_tokens = 0;
    CHECK(tr_generate(&g, &bad, 1, small, &err) != 0 && strstr(err.msg, "request 0") != NULL);
    bad = reqs[0];
    int32_t oov = m.cfg.vocab_size;
    bad.prompt = &oov;
    bad.n_prompt = 1;
    CHECK(tr_generate(&g, &bad, 1, small, &err) != 0 && strstr(err.msg, "vocabulary") != NULL);
    bad = reqs[0];
    bad.sampling.top_p = 0.0f;
    CHECK(tr_generate(&g, &bad, 1, small, &err) != 0 && strstr(err.msg, "top_p") != NULL);
    tr_generator_free(&g);
    tr_model_free(&m);
}

// A prefill pass's finished requests draw their first tokens together, as many samples at a
// time as the logit rows hold, and a request with more samples than that draws alone in
// slices (engine/generate.c first_draws): with 3 logit rows, requests of 2, 1, 4, 2 and 3
// samples take every path, and every output equals the one drawn with 64 logit rows, bit for
// bit (on a batch-invariant backend; tokens on any).
static void test_first_draws(const char *name, tr_backend *be) {
    printf("%s: first tokens drawn in groups of the logit rows\n", name);
    tr_model narrow, wide;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/models/%s", name);
    tr_model_opts on = {.max_tokens = 64, .training = false, .logit_rows = 3};
    tr_model_opts ow = {.max_tokens = 64, .training = false, .logit_rows = 64};
    tr_err err = {0};
    if (tr_model_load(&narrow, tr_test_src(path), be, &on, &err) != 0 ||
        tr_model_load(&wide, tr_test_src(path), be, &ow, &err) != 0) {
        CHECKF(0, "%s", err.msg);
        return;
    }
    CHECK(narrow.logit_rows == 3 && wide.logit_rows == 64);
    int32_t prompts[5][40], lens[5];
    make_prompts(prompts, lens, 5, narrow.cfg.vocab_size);
    const int32_t samples[5] = {2, 1, 4, 2, 3};
    tr_gen_request reqs[5];
    for (int32_t i = 0; i < 5; i++)
        reqs[i] = (tr_gen_request){.prompt = prompts[i], .n_prompt = lens[i] < 12 ? lens[i] : 12,
                                   .n_samples = samples[i], .sampling = {1.0f, 0, 1.0f},
                                   .seed = 11 + (uint64_t)i, .max_new_tokens = 6};
    tr_gen_opts o = {.kv_tokens = 1024, .block_size = 8, .max_seqs = 12};
    tr_gen_output a[12], b[12];
    if (run(&narrow, &o, reqs, 5, a, NULL) != 0 || run(&wide, &o, reqs, 5, b, NULL) != 0) return;
    int32_t lp_same = 0;
    for (int32_t i = 0; i < 12; i++) {
        CHECKF(same_output(&a[i], &b[i]), "output %d differs with 3 logit rows", i);
        lp_same += same_logprobs(&a[i], &b[i]);
    }
    printf("  tokens identical; logprobs bitwise identical in %d of 12 outputs\n", lp_same);
    if (et_batch_invariant(be)) CHECK(lp_same == 12);
    tr_gen_outputs_free(a, 12);
    tr_gen_outputs_free(b, 12);
    tr_model_free(&narrow);
    tr_model_free(&wide);
}

int main(void) {
    tr_backend be;
    et_backend(&be, 2);
    const char *models[] = {"llama3", "qwen2"};
    for (int32_t i = 0; i < 2; i++) {
        test_greedy_hf(models[i], &be);
        test_logprobs(models[i], &be);
        test_batch_independence(models[i], &be);
        test_pool_pressure(models[i], &be);
        test_first_draws(models[i], &be);
    }
    // Llama with attention_bias: the o_proj bias reaches generation through the shared trunk.
    test_greedy_hf("llama_bias", &be);
    test_logprobs("llama_bias", &be);
    // Qwen3: the per-head q/k norm runs before RoPE, so the cache holds normed keys.
    test_greedy_hf("qwen3", &be);
    test_logprobs("qwen3", &be);
    test_batch_independence("qwen3", &be);
    tr_backend_free(&be);
    return tr_test_summary("test_generate");
}
