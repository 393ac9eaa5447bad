// Deterministic shuffling by seed for datasets: Fisher-Yates driven by the Philox stream of
// engine/rng.h, so a seed gives the same order on every machine and every run.
#pragma once
#include <stdint.h>

struct tr_rng;

// Uniform integer in [0, n) without modulo bias; n > 0.
uint64_t tr_shuffle_below(struct tr_rng *rng, uint64_t n);
// Permutes a[0..n) in place; the order depends only on (seed, n).
void tr_shuffle_i64(int64_t *a, int64_t n, uint64_t seed);
void tr_shuffle_i32(int32_t *a, int64_t n, uint64_t seed);
