/* threads.c — see threads.h.
 *
 * A decode step runs about five pool jobs per layer, each of them tens of microseconds, so
 * waking threads through a condition variable (several microseconds, far more on a loaded
 * machine) would cost a large share of the step. Waiting threads therefore spin briefly,
 * then yield their core (on a loaded machine the thread they wait for may need it), and only
 * then sleep on a condition variable; a job's publisher wakes sleepers only when there are
 * any.
 *
 * A job is done when all its chunks are done, not when every worker has seen it: a worker the
 * OS has descheduled does not hold up a job whose chunks the other threads already ran. To
 * make that safe, chunks are claimed with a compare-and-swap on one word holding the job's
 * generation, its chunk count and the next chunk: a late worker's claim fails once the job is
 * over, and the job's fields cannot change while any claimed chunk is unfinished. */
#include "threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
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

/* a waiting thread spins SPIN_ROUNDS pauses, then makes YIELD_ROUNDS sched_yield calls,
 * then sleeps */
#define SPIN_ROUNDS 200
#define YIELD_ROUNDS 2000

/* chunks per thread: small enough that a thread the OS has descheduled holds up little
 * work (the others take the rest), large enough that claiming costs nothing */
#define CHUNKS_PER_THREAD 8
#define MAX_CHUNKS 0xFFFF

static inline void backoff(int round) {
    if (round < SPIN_ROUNDS) cpu_relax();
    else sched_yield();
}

/* the claim word: generation (32 bits) | chunk count (16) | next chunk (16) */
static inline uint64_t claim_word(uint32_t gen, int n_chunks, int next) {
    return (uint64_t)gen << 32 | (uint64_t)n_chunks << 16 | (uint64_t)next;
}

struct ThreadPool {
    int n;
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    atomic_uint generation; /* bumped for each pool_run */
    _Atomic uint64_t claim; /* see claim_word */
    atomic_int done;        /* chunks of the current job finished */
    atomic_int sleepers;    /* workers asleep on `wake` */
    atomic_int caller_asleep;
    atomic_int stop;
    /* the current job; written only while no chunk is claimed or running */
    PoolFn fn;
    void *arg;
    int items, chunk, n_chunks;
};

/* claim and run chunks of generation gen until none are left */
static void run_chunks(ThreadPool *pool, uint32_t gen) {
    for (;;) {
        uint64_t w = atomic_load_explicit(&pool->claim, memory_order_acquire);
        int next = (int)(w & 0xFFFF), n_chunks = (int)(w >> 16 & 0xFFFF);
        if ((uint32_t)(w >> 32) != gen || next >= n_chunks) return;
        if (!atomic_compare_exchange_weak_explicit(&pool->claim, &w, w + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        int begin = next * pool->chunk, end = begin + pool->chunk;
        pool->fn(pool->arg, begin, end < pool->items ? end : pool->items);
        if (atomic_fetch_add(&pool->done, 1) + 1 == n_chunks && atomic_load(&pool->caller_asleep)) {
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->finished);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

/* wait until the generation differs from `seen` (or stop); returns the current generation */
static uint32_t wait_for_job(ThreadPool *pool, uint32_t seen) {
    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        uint32_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
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
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) return NULL;
        run_chunks(pool, seen);
    }
}

ThreadPool *pool_create(int n_threads) {
    ThreadPool *pool = lmc_alloc(1, sizeof *pool, "thread pool");
    pool->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->finished, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->claim, claim_word(0, 0, 0));
    atomic_init(&pool->done, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_asleep, 0);
    atomic_init(&pool->stop, 0);
    pool->workers = lmc_alloc((size_t)pool->n, sizeof(pthread_t), "thread pool");
    for (int i = 1; i < pool->n; i++)
        if (pthread_create(&pool->workers[i], NULL, worker_main, pool) != 0)
            lmc_die_runtime("cannot start thread %d of %d", i + 1, pool->n);
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
    pthread_cond_destroy(&pool->finished);
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
    /* no chunk of the previous job is claimed or running: the fields are ours to write */
    int want = pool->n * CHUNKS_PER_THREAD;
    pool->fn = fn;
    pool->arg = arg;
    pool->items = n;
    pool->chunk = n / want > 0 ? n / want : 1;
    while ((n + pool->chunk - 1) / pool->chunk > MAX_CHUNKS) pool->chunk *= 2;
    pool->n_chunks = (n + pool->chunk - 1) / pool->chunk;
    atomic_store(&pool->done, 0);
    uint32_t gen = atomic_load(&pool->generation) + 1;
    atomic_store_explicit(&pool->claim, claim_word(gen, pool->n_chunks, 0), memory_order_release);
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }

    run_chunks(pool, gen);

    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        if (atomic_load_explicit(&pool->done, memory_order_acquire) == pool->n_chunks) return;
        backoff(i);
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->caller_asleep, 1);
    while (atomic_load(&pool->done) < pool->n_chunks) pthread_cond_wait(&pool->finished, &pool->lock);
    atomic_store(&pool->caller_asleep, 0);
    pthread_mutex_unlock(&pool->lock);
}
