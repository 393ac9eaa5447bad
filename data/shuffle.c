// Fisher-Yates over a Philox stream; bounded draws by rejection so every permutation is
// equally likely.
#include "data/shuffle.h"

#include "engine/rng.h"

uint64_t tr_shuffle_below(tr_rng *rng, uint64_t n) {
    // Reject the top partial bucket of the 64-bit range: threshold = 2^64 mod n.
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = ((uint64_t)tr_rng_u32(rng) << 32) | tr_rng_u32(rng);
        if (x >= threshold) return x % n;
    }
}

void tr_shuffle_i64(int64_t *a, int64_t n, uint64_t seed) {
    tr_rng rng;
    tr_rng_init(&rng, seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)tr_shuffle_below(&rng, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

void tr_shuffle_i32(int32_t *a, int64_t n, uint64_t seed) {
    tr_rng rng;
    tr_rng_init(&rng, seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)tr_shuffle_below(&rng, (uint64_t)i + 1);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}
