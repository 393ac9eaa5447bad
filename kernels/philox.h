// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) as
// static inline functions for C and for CUDA device code, so that a kernel reproduces the
// host's random streams (engine/rng.h) bit for bit: the block function, the next word of a
// tr_rng-style stream position, and the 53-bit uniform of two words the sampler draws.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define TR_PHILOX_FN static inline __host__ __device__
#else
#define TR_PHILOX_FN static inline
#endif

#define TR_PHILOX_M0 0xD2511F53u
#define TR_PHILOX_M1 0xCD9E8D57u
#define TR_PHILOX_W0 0x9E3779B9u
#define TR_PHILOX_W1 0xBB67AE85u

// Ten rounds of multiply-xor over the 128-bit counter, the 64-bit key bumped by Weyl
// constants between rounds.
TR_PHILOX_FN void tr_philox4x32_10(uint64_t counter_lo, uint64_t counter_hi, uint64_t key,
                                   uint32_t out[4]) {
    uint32_t c0 = (uint32_t)counter_lo, c1 = (uint32_t)(counter_lo >> 32);
    uint32_t c2 = (uint32_t)counter_hi, c3 = (uint32_t)(counter_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)TR_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)TR_PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += TR_PHILOX_W0;
        k1 += TR_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

// The next word of the stream (seed, *counter blocks consumed, *used words of block
// *counter - 1 handed out, 4 = none left), advancing the position as tr_rng_u32 does; the
// current block is recomputed rather than kept, so the position is two plain integers.
TR_PHILOX_FN uint32_t tr_philox_next(uint64_t seed, uint64_t *counter, int32_t *used) {
    uint32_t block[4];
    if (*used >= 4) {
        tr_philox4x32_10((*counter)++, 0, seed, block);
        *used = 1;
        return block[0];
    }
    tr_philox4x32_10(*counter - 1, 0, seed, block);
    return block[(*used)++];
}

// Uniform in [0, 1) with 53 random bits: the top 27 bits of a, then the top 26 of b. Every
// step is exact in double, so any compiler gives the same value.
TR_PHILOX_FN double tr_philox_uniform53(uint32_t a, uint32_t b) {
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * (1.0 / 9007199254740992.0);
}
