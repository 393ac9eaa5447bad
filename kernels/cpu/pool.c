// The CPU kernels' thread pool: workers sleep on a condition variable between jobs and take
// tasks from a shared atomic counter, so uneven tasks (causal attention rows) balance out.
// Waking through a condition variable costs a few microseconds per op; spinning would burn
// the cores that other processes of a colocated run need.
#include "kernels/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct tr_pool {
    int32_t n_threads;
    int32_t n_started;          // workers actually running (n_threads - 1 once init succeeded)
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_job;      // a new job or stop
    pthread_cond_t cv_done;     // the last worker left the current job
    uint64_t generation;        // bumped per job; workers compare with the one they last ran
    int32_t n_busy;             // workers that have not finished the current job
    int stop;
    tr_pool_fn fn;
    void *arg;
    int32_t n_tasks;
    atomic_int next_task;
};

static void pool_take_tasks(tr_pool *p) {
    for (;;) {
        int32_t task = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (task >= p->n_tasks) break;
        p->fn(p->arg, task);
    }
}

static void *pool_worker(void *arg) {
    tr_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->cv_job, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        pool_take_tasks(p);
        pthread_mutex_lock(&p->mu);
        if (--p->n_busy == 0) pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_stop(tr_pool *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    p->n_started = 0;
}

int tr_pool_init(tr_pool **pool, int32_t n_threads) {
    *pool = NULL;
    if (n_threads < 1) return -1;
    tr_pool *p = calloc(1, sizeof *p);
    if (!p) return -1;
    p->n_threads = n_threads;
    atomic_init(&p->next_task, 0);
    if (n_threads > 1) {
        p->threads = calloc((size_t)(n_threads - 1), sizeof *p->threads);
        if (!p->threads) {
            free(p);
            return -1;
        }
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&p->cv_job, NULL) != 0) goto fail_job;
    if (pthread_cond_init(&p->cv_done, NULL) != 0) goto fail_done;
    for (int32_t i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&p->threads[i], NULL, pool_worker, p) != 0) {
            pool_stop(p);
            goto fail_threads;
        }
        p->n_started++;
    }
    *pool = p;
    return 0;

fail_threads:
    pthread_cond_destroy(&p->cv_done);
fail_done:
    pthread_cond_destroy(&p->cv_job);
fail_job:
    pthread_mutex_destroy(&p->mu);
fail_mu:
    free(p->threads);
    free(p);
    return -1;
}

void tr_pool_free(tr_pool *pool) {
    if (!pool) return;
    pool_stop(pool);
    pthread_cond_destroy(&pool->cv_done);
    pthread_cond_destroy(&pool->cv_job);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool);
}

void tr_pool_run(tr_pool *p, int32_t n_tasks, tr_pool_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    if (p->n_started == 0 || n_tasks == 1) {
        for (int32_t t = 0; t < n_tasks; t++) fn(arg, t);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next_task, 0, memory_order_relaxed);
    p->n_busy = p->n_started;
    p->generation++;
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);

    pool_take_tasks(p);

    pthread_mutex_lock(&p->mu);
    while (p->n_busy > 0) pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int32_t tr_pool_threads(const tr_pool *pool) { return pool->n_threads; }
