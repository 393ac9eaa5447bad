// Philox4x32-10 against the published known-answer vectors (Random123 kat_vectors), plus
// the statistics of the uniform and normal draws, exact resumption from (seed, counter), and
// kernels/philox.h's stream step (what GPU kernels use) continuing tr_rng's stream from any
// (seed, counter, used) position, and seeking to any word of a stream (how weights are drawn
// in pieces on several threads) continuing it as drawing up to there does.
#include "engine/rng.h"
#include "kernels/philox.h"
#include "tests/test.h"

int main(void) {
    uint32_t o[4];
    // philox4x32_10: ctr = 0, key = 0
    tr_philox4x32(0, 0, 0, o);
    CHECK(o[0] == 0x6627e8d5u && o[1] == 0xe169c58du && o[2] == 0xbc57ac4cu && o[3] == 0x9b00dbd8u);
    // ctr = ffffffff x4, key = ffffffff x2
    tr_philox4x32(~0ULL, ~0ULL, ~0ULL, o);
    CHECK(o[0] == 0x408f276du && o[1] == 0x41c83b0eu && o[2] == 0xa20bc7c6u && o[3] == 0x6d5451fdu);
    // ctr = 243f6a88 85a308d3 13198a2e 03707344, key = a4093822 299f31d0
    tr_philox4x32(0x85a308d3243f6a88ULL, 0x0370734413198a2eULL, 0x299f31d0a4093822ULL, o);
    CHECK(o[0] == 0xd16cfe09u && o[1] == 0x94fdccebu && o[2] == 0x5001e420u && o[3] == 0x24126ea1u);

    tr_rng r;
    tr_rng_init(&r, 42);
    double s = 0, s2 = 0, n = 200000;
    for (int i = 0; i < n; i++) {
        float u = tr_rng_uniform(&r);
        CHECK(u >= 0.0f && u < 1.0f);
        s += u;
        s2 += (double)u * u;
    }
    CHECK_NEAR(s / n, 0.5, 0.005);
    CHECK_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.002);
    s = s2 = 0;
    for (int i = 0; i < n; i++) {
        float z = tr_rng_normal(&r);
        s += z;
        s2 += (double)z * z;
    }
    CHECK_NEAR(s / n, 0.0, 0.01);
    CHECK_NEAR(s2 / n, 1.0, 0.02);

    // Resuming from a saved (seed, counter) at a block boundary continues the same stream.
    tr_rng a, b;
    tr_rng_init(&a, 7);
    for (int i = 0; i < 8; i++) tr_rng_u32(&a);
    tr_rng_init(&b, 7);
    b.counter = a.counter;
    for (int i = 0; i < 16; i++) CHECK(tr_rng_u32(&a) == tr_rng_u32(&b));
    // From every offset inside a block and across block boundaries: the position alone
    // (without tr_rng's buffered block) gives tr_rng_u32's next words.
    for (int skip = 0; skip < 13; skip++) {
        tr_rng c;
        tr_rng_init(&c, 0x1234567890abcdefULL + (uint64_t)skip);
        for (int i = 0; i < skip; i++) tr_rng_u32(&c);
        uint64_t counter = c.counter;
        int32_t used = c.used;
        int same = 1;
        for (int i = 0; i < 11; i++) same &= tr_philox_next(c.seed, &counter, &used) == tr_rng_u32(&c);
        CHECKF(same && counter == c.counter && used == c.used, "tr_philox_next after %d words",
               skip);
    }
    CHECK(tr_rng_derive(1, 0) != tr_rng_derive(1, 1));
    CHECK(tr_rng_derive(1, 5) == tr_rng_derive(1, 5));
    // Seek: from every position in the first few blocks, and far away, the words that follow
    // are the sequential stream's, and the position reads back.
    tr_rng seq, jump;
    tr_rng_init(&seq, 99);
    uint32_t words[64];
    for (int i = 0; i < 64; i++) words[i] = tr_rng_u32(&seq);
    CHECK(tr_rng_position(&seq) == 64);
    for (uint64_t w = 0; w < 48; w++) {
        tr_rng_init(&jump, 99);
        tr_rng_seek(&jump, w);
        CHECK(tr_rng_position(&jump) == w);
        int same = 1;
        for (uint64_t i = w; i < 64; i++) same &= tr_rng_u32(&jump) == words[i];
        CHECKF(same, "seek to word %llu", (unsigned long long)w);
    }
    tr_rng_init(&seq, 5);
    for (int i = 0; i < 1001; i++) tr_rng_normal(&seq);   // 2002 words
    tr_rng_init(&jump, 5);
    tr_rng_seek(&jump, 2002);
    CHECK(tr_rng_position(&seq) == 2002 && tr_rng_normal(&seq) == tr_rng_normal(&jump));
    return tr_test_summary("test_rng");
}
