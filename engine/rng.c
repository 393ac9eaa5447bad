// Counter-based random streams over Philox4x32-10, whose core lives in kernels/philox.h so
// that GPU kernels share it: a stream is (seed, blocks consumed, words of the last block
// used), handed out word by word.
#include "engine/rng.h"

#include <math.h>

#include "kernels/philox.h"

void tr_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key, uint32_t out[4]) {
    tr_philox4x32_10(counter_lo, counter_hi, key, out);
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

uint64_t tr_rng_position(const tr_rng *rng) {
    return rng->used >= 4 ? rng->counter * 4 : (rng->counter - 1) * 4 + (uint64_t)rng->used;
}

void tr_rng_seek(tr_rng *rng, uint64_t word) {
    rng->counter = word / 4;
    rng->used = 4;
    if (word % 4 == 0) return;
    tr_philox4x32(rng->counter++, 0, rng->seed, rng->buf);
    rng->used = (int32_t)(word % 4);
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
