// A small pthread pool for the CPU kernels: one job at a time, split by the caller into
// n_tasks tasks that the caller and the workers take in turn. Which thread runs a task is not
// fixed, so a task must write only its own outputs; results then never depend on the pool size.
#pragma once
#include <stdint.h>

typedef struct tr_pool tr_pool;

typedef void (*tr_pool_fn)(void *arg, int32_t task);

// Starts n_threads - 1 workers (the caller is the n-th thread). Returns 0, or -1 if threads
// or memory could not be had (nothing is left running then).
int tr_pool_init(tr_pool **pool, int32_t n_threads);
void tr_pool_free(tr_pool *pool);

// Runs fn(arg, task) for task = 0 .. n_tasks-1 and returns when all are done. Not reentrant:
// one caller thread per pool.
void tr_pool_run(tr_pool *pool, int32_t n_tasks, tr_pool_fn fn, void *arg);

int32_t tr_pool_threads(const tr_pool *pool);
