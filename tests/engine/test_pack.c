// The micro-batch packer against hand-written layouts: documents end to end, positions
// restarting at each, targets the next token of the same document or the caller's, and a
// document that does not fit refused without changing what is packed; samples sharing a
// prompt: the prompt's tokens but the last once, each sample's rest reading it first, with
// positions and targets as the unshared layout has them and rows mapped back.
#include "engine/pack.h"
#include "tests/test.h"

int main(void) {
    tr_err err = {0};
    tr_pack p;
    CHECK(tr_pack_init(&p, 0, &err) == -1);
    CHECK(tr_pack_init(&p, 8, &err) == 0);
    const int32_t a[3] = {5, 6, 7}, b[2] = {9, 4}, b_tg[2] = {-1, 3}, c[4] = {1, 1, 1, 1};
    CHECK(tr_pack_add(&p, a, NULL, 3));
    CHECK(tr_pack_add(&p, b, b_tg, 2));
    CHECK(!tr_pack_add(&p, c, NULL, 4));   // 5 + 4 > 8
    CHECK(!tr_pack_add(&p, c, NULL, 0));
    const int32_t ids[5] = {5, 6, 7, 9, 4}, pos[5] = {0, 1, 2, 0, 1}, tg[5] = {6, 7, -1, -1, 3};
    const int32_t starts[3] = {0, 3, 5};
    CHECK(p.docs.n_tokens == 5 && p.docs.n_docs == 2);
    CHECK(memcmp(p.ids, ids, sizeof ids) == 0 && memcmp(p.pos, pos, sizeof pos) == 0);
    CHECK(memcmp(p.targets, tg, sizeof tg) == 0 && memcmp(p.doc_start, starts, sizeof starts) == 0);
    CHECK(p.docs.doc_start == p.doc_start && p.docs.pos == p.pos);
    CHECK(tr_pack_add(&p, c, NULL, 3) && p.docs.n_tokens == 8 && p.docs.n_docs == 3);
    tr_pack_clear(&p);
    CHECK(p.docs.n_tokens == 0 && p.docs.n_docs == 0 && p.doc_start[0] == 0);
    CHECK(tr_pack_add(&p, c, NULL, 4) && p.targets[3] == -1 && p.pos[3] == 3);
    tr_pack_free(&p);

    // prompt {1 2 3}, samples {1 2 3 7 8} and {1 2 3 9}, then a sequence of its own
    CHECK(tr_pack_init(&p, 9, &err) == 0);
    const int32_t s1[5] = {1, 2, 3, 7, 8}, s2[4] = {1, 2, 3, 9}, s3[2] = {4, 5};
    CHECK(!tr_pack_add_sharing(&p, s1, 5, 3));   // no prompt yet
    CHECK(!tr_pack_add_prompt(&p, s1, 1));
    CHECK(tr_pack_add_prompt(&p, s1, 3) && p.n_seqs == 0 && p.docs.prefix == NULL);
    CHECK(!tr_pack_add_sharing(&p, s1, 5, 4));   // not this prompt's length
    CHECK(tr_pack_add_sharing(&p, s1, 5, 3) && tr_pack_add_sharing(&p, s2, 4, 3));
    CHECK(!tr_pack_add_sharing(&p, s1, 5, 3));   // 2 + 3 + 2 + 3 > 9
    CHECK(tr_pack_add(&p, s3, NULL, 2) && !tr_pack_add_sharing(&p, s2, 4, 3));
    const int32_t ids2[9] = {1, 2, 3, 7, 8, 3, 9, 4, 5}, pos2[9] = {0, 1, 2, 3, 4, 2, 3, 0, 1};
    const int32_t tg2[9] = {2, 3, 7, 8, -1, 9, -1, 5, -1}, st2[5] = {0, 2, 5, 7, 9};
    const int32_t pf2[4] = {-1, 0, 0, -1};
    CHECK(p.docs.n_tokens == 9 && p.docs.n_docs == 4 && p.n_seqs == 3);
    CHECK(memcmp(p.ids, ids2, sizeof ids2) == 0 && memcmp(p.pos, pos2, sizeof pos2) == 0);
    CHECK(memcmp(p.targets, tg2, sizeof tg2) == 0 && memcmp(p.doc_start, st2, sizeof st2) == 0);
    CHECK(p.docs.prefix == p.prefix && memcmp(p.prefix, pf2, sizeof pf2) == 0);
    // sequence 0's tokens 0..4 sit at rows 0 1 2 3 4; sequence 1's at 0 1 5 6; sequence 2's at 7 8
    const int32_t rows[3][5] = {{0, 1, 2, 3, 4}, {0, 1, 5, 6, -1}, {7, 8, -1, -1, -1}};
    int same = 1;
    for (int32_t k = 0; k < 3; k++)
        for (int32_t t = 0; t < 5 && rows[k][t] >= 0; t++) {
            int32_t r = tr_pack_row(&p, k, t);
            same &= r == rows[k][t] && p.ids[r] == (k == 0 ? s1 : k == 1 ? s2 : s3)[t];
        }
    CHECK(same);
    CHECK(tr_pack_cost(5, 3) == 3 && tr_pack_cost(5, 1) == 5);
    tr_pack_clear(&p);
    CHECK(p.docs.prefix == NULL && p.n_seqs == 0 && !tr_pack_add_sharing(&p, s1, 5, 3));
    tr_pack_free(&p);
    return tr_test_summary("test_pack");
}
