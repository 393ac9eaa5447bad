// The micro-batch plan against hand-made rollouts: every sequence planned once, no
// micro-batch past max_tokens, each token's row holding that token, first-fit decreasing
// using fewer micro-batches than packing in order, equal sizes kept in order, the samples of
// a prompt sharing it (and a group too large for one micro-batch cut into parts that each
// carry it), share off packing every sequence whole, and a sequence too long named.
#include "roles/mb_plan.h"
#include "tests/test.h"

// Sequence s: prompt (group g's, plen tokens) then rlen response tokens, ids from s.
static void add(tr_rollouts *r, int32_t g, int32_t plen, int32_t rlen) {
    int32_t prompt[64], resp[64];
    for (int32_t i = 0; i < plen; i++) prompt[i] = 100 * g + i;
    for (int32_t i = 0; i < rlen; i++) resp[i] = 10000 + 100 * r->n + i;
    tr_err err = {0};
    CHECK(tr_rollouts_append(r, g, 0, prompt, plen, resp, NULL, rlen, 1, NULL, NULL, NULL, &err) == 0);
}

// Every planned sequence once, packs within max_tokens, rows holding the sequences' tokens.
static int plan_ok(const tr_rollouts *r, const tr_mb_plan *p, int32_t max_tokens) {
    int seen[64] = {0}, ok = p->first[0] == 0 && p->first[p->n] == p->s1 - p->s0;
    int64_t tokens = 0;
    for (int32_t i = 0; i < p->n; i++) {
        const tr_pack *pk = &p->packs[i];
        ok &= pk->docs.n_tokens <= max_tokens && pk->n_seqs == p->first[i + 1] - p->first[i];
        tokens += pk->docs.n_tokens;
        for (int32_t k = p->first[i]; k < p->first[i + 1]; k++) {
            int32_t s = p->seqs[k], len = (int32_t)(r->offset[s + 1] - r->offset[s]);
            seen[s]++;
            for (int32_t t = 0; t < len; t++)
                ok &= pk->ids[tr_pack_row(pk, k - p->first[i], t)] == r->tokens[r->offset[s] + t];
        }
    }
    for (int32_t s = p->s0; s < p->s1; s++) ok &= seen[s] == 1;
    return ok && tokens == p->tokens;
}

int main(void) {
    tr_err err = {0};
    tr_rollouts r;
    tr_rollouts_init(&r);
    tr_mb_plan p;

    // lengths 6, 9, 4, 7, 3, 1 (prompts of 1 token: nothing to share) into 10-token
    // micro-batches: in order 6 | 9 | 4 | 7,3 | 1 takes five; first fit decreasing
    // 9,1 | 7,3 | 6,4 three.
    const int32_t lens[] = {6, 9, 4, 7, 3, 1};
    for (int32_t i = 0; i < 6; i++) add(&r, i, 1, lens[i] - 1);
    CHECK(tr_mb_plan_build(&r, 0, 6, 10, true, &p, &err) == 0);
    CHECK(plan_ok(&r, &p, 10) && p.n == 3 && p.tokens == 30);
    const int32_t order[] = {1, 5, 3, 4, 0, 2};
    CHECK(memcmp(p.seqs, order, sizeof order) == 0);
    tr_mb_plan_free(&p);
    // equal sizes keep their order
    tr_rollouts_clear(&r);
    for (int32_t i = 0; i < 5; i++) add(&r, i, 1, 3);
    CHECK(tr_mb_plan_build(&r, 1, 5, 8, true, &p, &err) == 0);
    const int32_t order2[] = {1, 2, 3, 4};
    CHECK(plan_ok(&r, &p, 8) && p.n == 2 && memcmp(p.seqs, order2, sizeof order2) == 0);
    tr_mb_plan_free(&p);

    // a group of 4 samples of a 5-token prompt (responses 3, 2, 4, 1), then a sequence of its
    // own: shared, the group takes 4 + (4 + 3 + 5 + 2) = 18 tokens; with 12 a micro-batch it
    // is cut into 4 + 4 + 3 = 11 and 4 + 5 + 2 = 11.
    tr_rollouts_clear(&r);
    const int32_t resp[] = {3, 2, 4, 1};
    for (int32_t i = 0; i < 4; i++) add(&r, 7, 5, resp[i]);
    add(&r, 8, 5, 2);
    CHECK(tr_mb_plan_build(&r, 0, 5, 32, true, &p, &err) == 0);
    CHECK(plan_ok(&r, &p, 32) && p.n == 1 && p.tokens == 18 + 7);
    CHECK(p.packs[0].docs.prefix && p.packs[0].docs.n_docs == 6);
    tr_mb_plan_free(&p);
    CHECK(tr_mb_plan_build(&r, 0, 5, 12, true, &p, &err) == 0);
    CHECK(plan_ok(&r, &p, 12) && p.n == 3 && p.tokens == 11 + 11 + 7);
    tr_mb_plan_free(&p);
    CHECK(tr_mb_plan_build(&r, 0, 5, 32, false, &p, &err) == 0);
    CHECK(plan_ok(&r, &p, 32) && p.tokens == 8 + 7 + 9 + 6 + 7 && p.packs[0].docs.prefix == NULL);
    tr_mb_plan_free(&p);

    // a sequence longer than a micro-batch
    CHECK(tr_mb_plan_build(&r, 0, 5, 8, true, &p, &err) == -1 && strstr(err.msg, "sequence 2 has 9 tokens"));
    tr_rollouts_free(&r);
    return tr_test_summary("test_mb_plan");
}
