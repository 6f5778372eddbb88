/* threads.c — see threads.h.
 *
 * A decode step runs about five pool jobs per layer, each of them tens of microseconds, so
 * waking threads through a condition variable (several microseconds, far more on a loaded
 * machine) would cost a large share of the step. Threads therefore spin on an atomic job
 * counter for a while (about SPIN_ROUNDS pause instructions) and only then sleep on the
 * condition variable; the caller wakes sleepers only when there are any. The same
 * spin-then-sleep wait is used by the caller for the job to finish. */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* a waiting thread first spins (SPIN_ROUNDS pauses), then yields its core (YIELD_ROUNDS
 * sched_yield calls: on a loaded machine the thread it waits for may need that core), then
 * sleeps */
#ifndef SPIN_ROUNDS
#define SPIN_ROUNDS 2000
#endif
#ifndef YIELD_ROUNDS
#define YIELD_ROUNDS 200
#endif

static inline void backoff(int round) {
    if (round < SPIN_ROUNDS) cpu_relax();
    else sched_yield();
}

struct ThreadPool {
    int n;
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    atomic_ulong generation; /* bumped for each pool_run */
    atomic_int pending;      /* workers still busy with the current generation */
    atomic_int sleepers;     /* workers asleep on `wake` */
    atomic_int caller_asleep;
    atomic_int stop;
    PoolFn fn;
    void *arg;
    int items, chunk, n_chunks;
    atomic_int next_chunk; /* chunks are claimed in order by whichever thread is free */
};

/* chunks per thread: small enough that a thread the OS has descheduled holds up little
 * work (the others take the rest), large enough that claiming costs nothing */
#define CHUNKS_PER_THREAD 8

/* claim and run chunks until none are left */
static void run_chunks(ThreadPool *pool) {
    for (;;) {
        int c = atomic_fetch_add_explicit(&pool->next_chunk, 1, memory_order_relaxed);
        if (c >= pool->n_chunks) return;
        int begin = c * pool->chunk, end = begin + pool->chunk;
        pool->fn(pool->arg, begin, end < pool->items ? end : pool->items);
    }
}

/* wait until the generation differs from `seen` (or stop); returns the new generation */
static unsigned long wait_for_job(ThreadPool *pool, unsigned long seen) {
    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        unsigned long g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen || atomic_load(&pool->stop)) return g;
        backoff(i);
    }
    pthread_mutex_lock(&pool->lock);
    atomic_fetch_add(&pool->sleepers, 1);
    /* sleepers is raised before generation is re-read (both sequentially consistent), so a
     * caller that publishes a job either sees the sleeper and broadcasts under the lock, or
     * this load sees its job */
    while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->wake, &pool->lock);
    atomic_fetch_sub(&pool->sleepers, 1);
    pthread_mutex_unlock(&pool->lock);
    return atomic_load_explicit(&pool->generation, memory_order_acquire);
}

static void *worker_main(void *p) {
    ThreadPool *pool = p;
    unsigned long seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) return NULL;
        run_chunks(pool);
        if (atomic_fetch_sub(&pool->pending, 1) == 1 &&
            atomic_load(&pool->caller_asleep)) {
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->done);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

ThreadPool *pool_create(int n_threads) {
    ThreadPool *pool = lmc_alloc(1, sizeof *pool, "thread pool");
    pool->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_asleep, 0);
    atomic_init(&pool->stop, 0);
    pool->workers = lmc_alloc((size_t)pool->n, sizeof(pthread_t), "thread pool");
    for (int i = 1; i < pool->n; i++) {
        if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0)
            lmc_die_runtime("cannot start thread %d of %d", i + 1, pool->n);
    }
    return pool;
}

void pool_destroy(ThreadPool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->workers[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->done);
    lmc_free(pool->workers);
    lmc_free(pool);
}

int pool_threads(const ThreadPool *pool) { return pool ? pool->n : 1; }

void pool_run(ThreadPool *pool, PoolFn fn, void *arg, int n) {
    if (n <= 0) return;
    if (!pool || pool->n == 1 || n == 1) {
        fn(arg, 0, n);
        return;
    }
    /* workers are all idle here: the previous job ended with pending == 0 */
    pool->fn = fn;
    pool->arg = arg;
    pool->items = n;
    int want = pool->n * CHUNKS_PER_THREAD;
    pool->chunk = n / want > 0 ? n / want : 1;
    pool->n_chunks = (n + pool->chunk - 1) / pool->chunk;
    atomic_store_explicit(&pool->next_chunk, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* publishes the fields above */
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }

    run_chunks(pool);

    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        if (atomic_load_explicit(&pool->pending, memory_order_acquire) == 0) return;
        backoff(i);
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->caller_asleep, 1);
    while (atomic_load(&pool->pending) > 0) pthread_cond_wait(&pool->done, &pool->lock);
    atomic_store(&pool->caller_asleep, 0);
    pthread_mutex_unlock(&pool->lock);
}
