// Logit rows and stream seeds the sampler tests draw from (test_sample_op, test_sample_vp):
// random, tied (a few values), all equal, and signed zeros among negatives.
#pragma once
#include <math.h>
#include <stdint.h>

#include "tests/kernels/kernels_test.h"

enum { LOGITS_RANDOM, LOGITS_TIED, LOGITS_EQUAL, LOGITS_ZEROS };

static inline void fill_row(float *lg, int32_t V, int kind) {
    for (int32_t i = 0; i < V; i++) {
        double x = 4.0 * kt_uniform();
        switch (kind) {
        case LOGITS_TIED: lg[i] = (float)(floor(x * 2.0) / 2.0); break;   // a few values
        case LOGITS_EQUAL: lg[i] = 1.25f; break;
        case LOGITS_ZEROS: lg[i] = i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : (float)(x - 4.5); break;
        default: lg[i] = (float)x; break;
        }
    }
}

static inline uint64_t rand_u64(void) {
    uint64_t a = (uint64_t)((kt_uniform() + 1.0) * 2147483648.0);
    uint64_t b = (uint64_t)((kt_uniform() + 1.0) * 2147483648.0);
    return a << 32 ^ b;
}
