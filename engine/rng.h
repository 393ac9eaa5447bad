// Counter-based random numbers (Philox4x32-10): the value at (seed, counter) is fixed, so a
// stream can be split per request (a sampling seed per prompt sample), saved as two integers,
// resumed exactly, and reproduced bit-for-bit by a GPU kernel.
#pragma once
#include <stdint.h>

typedef struct tr_rng {
    uint64_t seed;
    uint64_t counter;   // number of 128-bit blocks consumed
    uint32_t buf[4];    // the current block
    int32_t used;       // words of buf already handed out (4 = empty)
} tr_rng;

void tr_rng_init(tr_rng *rng, uint64_t seed);
// Philox4x32-10 of (counter, key) -> 4 words; the raw function, for kernels and tests.
void tr_philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t key, uint32_t out[4]);
uint32_t tr_rng_u32(tr_rng *rng);
// Uniform in [0, 1) with 24 bits of precision (exactly representable in fp32).
float tr_rng_uniform(tr_rng *rng);
// Standard normal (Box-Muller over two uniforms in (0, 1]).
float tr_rng_normal(tr_rng *rng);
// The stream's position in words handed out, and a jump to any position: a stream can be
// split into pieces drawn apart (tr_rng_normal takes two words) and give the same values.
uint64_t tr_rng_position(const tr_rng *rng);
void tr_rng_seek(tr_rng *rng, uint64_t word);
// Derives an independent seed for stream `index` (e.g. one per prompt sample).
uint64_t tr_rng_derive(uint64_t seed, uint64_t index);
