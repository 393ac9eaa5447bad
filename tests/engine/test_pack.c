// The micro-batch packer against hand-written layouts: documents end to end, positions
// restarting at each, targets the next token of the same document or the caller's, and a
// document that does not fit refused without changing what is packed.
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
    return tr_test_summary("test_pack");
}
