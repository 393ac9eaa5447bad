// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):
// ten rounds of multiply-xor over a 128-bit counter with a 64-bit key bumped by Weyl constants.
#include "engine/rng.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void tr_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

void tr_rng_init(tr_rng *rng, uint64_t seed) {
    rng->seed = seed;
    rng->counter = 0;
    rng->used = 4;
}

uint32_t tr_rng_u32(tr_rng *rng) {
    if (rng->used >= 4) {
        tr_philox4x32(rng->counter++, 0, rng->seed, rng->buf);
        rng->used = 0;
    }
    return rng->buf[rng->used++];
}

float tr_rng_uniform(tr_rng *rng) {
    return (float)(tr_rng_u32(rng) >> 8) * (1.0f / 16777216.0f);
}

float tr_rng_normal(tr_rng *rng) {
    double u1 = ((double)(tr_rng_u32(rng) >> 8) + 1.0) / 16777216.0;  // (0, 1]
    double u2 = (double)(tr_rng_u32(rng) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t tr_rng_derive(uint64_t seed, uint64_t index) {
    uint32_t out[4];
    tr_philox4x32(index, 0x5eedULL << 32, seed, out);
    return ((uint64_t)out[1] << 32) | out[0];
}
