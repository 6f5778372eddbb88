/* threads.c — see threads.h.
 *
 * A decode step runs about five pool jobs per layer, each of them tens of microseconds, so
 * waking threads through a condition variable (several microseconds, far more on a loaded
 * machine) would cost a large share of the step. Waiting threads therefore spin briefly,
 * then yield their core (on a loaded machine the thread they wait for may need it), and only
 * then sleep on a condition variable; a job's publisher wakes sleepers only when there are
 * any.
 *
 * Each thread owns a contiguous share of a job's chunks and runs them in order, so a matrix
 * job is one sequential stream per thread: a kernel's prefetch runs on from one chunk into
 * the next (chunks handed out in turn from one counter made every chunk start cold, and
 * every claim moved the counter's cache line between cores: two-thread q8 decode ran 13 %
 * slower). A thread that has run its share steals chunks from the back of the others', so a
 * thread the OS has descheduled holds up at most the chunk it is running.
 *
 * A job is done when all its chunks are done, not when every worker has seen it. To make that
 * safe, a share is one word — the job's generation, the share's front and back — changed only
 * by compare-and-swap: a late worker's claim fails once the job is over, and the job's fields
 * cannot change while any claimed chunk is unfinished. */
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

/* chunks per thread: small enough that a descheduled thread's chunk is little work for the
 * others to wait on, and that stealing evens out threads of unequal speed */
#define CHUNKS_PER_THREAD 8
#define MAX_CHUNKS 0xFFFF

static inline void backoff(int round) {
    if (round < SPIN_ROUNDS) cpu_relax();
    else sched_yield();
}

/* a share's word: generation (32 bits) | front (16) | back (16); chunks [front, back) are
 * unclaimed, the owner takes the front one, other threads the back one */
static inline uint64_t share_word(uint32_t gen, int front, int back) {
    return (uint64_t)gen << 32 | (uint64_t)front << 16 | (uint64_t)back;
}

/* one thread's share of the current job and the chunks it has finished, on a cache line of
 * its own: the owner's claims and counts do not disturb the other threads */
typedef struct {
    _Alignas(64) _Atomic uint64_t word;
    atomic_int done; /* chunks of the current job this thread has finished */
} Share;

typedef struct {
    ThreadPool *pool;
    int id; /* 1 .. n-1; the caller of pool_run is 0 */
    pthread_t thread;
} Worker;

struct ThreadPool {
    int n;
    Worker *workers; /* [1 .. n-1]; slot 0 is the caller's and unused */
    Share *shares;   /* one per thread */
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    atomic_uint generation; /* bumped for each pool_run */
    atomic_int sleepers;    /* workers asleep on `wake` */
    atomic_int caller_asleep;
    atomic_int stop;
    /* the current job; written only while no chunk is claimed or running */
    PoolFn fn;
    void *arg;
    int items, chunk, n_chunks;
};

/* the next chunk of share s for job gen — its front one for the owner, its back one for a
 * thief — or -1 when the share is empty or the job is over */
static int claim(Share *s, uint32_t gen, int thief) {
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        int front = (int)(w >> 16 & 0xFFFF), back = (int)(w & 0xFFFF);
        if ((uint32_t)(w >> 32) != gen || front >= back) return -1;
        uint64_t claimed = thief ? w - 1 : w + ((uint64_t)1 << 16);
        if (atomic_compare_exchange_weak_explicit(&s->word, &w, claimed, memory_order_acq_rel,
                                                  memory_order_acquire))
            return thief ? back - 1 : front;
    }
}

static int chunks_done(ThreadPool *pool) {
    int total = 0;
    for (int t = 0; t < pool->n; t++) total += atomic_load(&pool->shares[t].done);
    return total;
}

/* thread self runs its share of job gen, then steals from the others' until none is left */
static void run_chunks(ThreadPool *pool, uint32_t gen, int self) {
    for (int k = 0; k < pool->n; k++) {
        Share *s = &pool->shares[(self + k) % pool->n];
        for (int c; (c = claim(s, gen, k > 0)) >= 0;) {
            int begin = c * pool->chunk, end = begin + pool->chunk;
            pool->fn(pool->arg, begin, end < pool->items ? end : pool->items);
            atomic_fetch_add(&pool->shares[self].done, 1);
            /* the caller re-checks under the lock: a signal it does not need is harmless */
            if (atomic_load(&pool->caller_asleep)) {
                pthread_mutex_lock(&pool->lock);
                pthread_cond_signal(&pool->finished);
                pthread_mutex_unlock(&pool->lock);
            }
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
    const Worker *self = p;
    ThreadPool *pool = self->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) return NULL;
        run_chunks(pool, seen, self->id);
    }
}

ThreadPool *pool_create(int n_threads) {
    ThreadPool *pool = lmc_alloc(1, sizeof *pool, "thread pool");
    pool->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->finished, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->caller_asleep, 0);
    atomic_init(&pool->stop, 0);
    pool->shares = lmc_alloc((size_t)pool->n, sizeof(Share), "thread pool");
    for (int t = 0; t < pool->n; t++) {
        atomic_init(&pool->shares[t].word, share_word(0, 0, 0));
        atomic_init(&pool->shares[t].done, 0);
    }
    pool->workers = lmc_alloc((size_t)pool->n, sizeof(Worker), "thread pool");
    for (int i = 1; i < pool->n; i++) {
        Worker *w = &pool->workers[i];
        w->pool = pool;
        w->id = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
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
    for (int i = 1; i < pool->n; i++) pthread_join(pool->workers[i].thread, NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->wake);
    pthread_cond_destroy(&pool->finished);
    lmc_free(pool->workers);
    lmc_free(pool->shares);
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
    uint32_t gen = atomic_load(&pool->generation) + 1;
    for (int t = 0; t < pool->n; t++) { /* thread t owns chunks [t·n/T, (t+1)·n/T) */
        atomic_store_explicit(&pool->shares[t].done, 0, memory_order_relaxed);
        int front = (int)((long)pool->n_chunks * t / pool->n);
        int back = (int)((long)pool->n_chunks * (t + 1) / pool->n);
        atomic_store_explicit(&pool->shares[t].word, share_word(gen, front, back), memory_order_release);
    }
    atomic_store(&pool->generation, gen);
    if (atomic_load(&pool->sleepers) > 0) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }

    run_chunks(pool, gen, 0);

    for (int i = 0; i < SPIN_ROUNDS + YIELD_ROUNDS; i++) {
        if (chunks_done(pool) == pool->n_chunks) return;
        backoff(i);
    }
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->caller_asleep, 1);
    while (chunks_done(pool) < pool->n_chunks) pthread_cond_wait(&pool->finished, &pool->lock);
    atomic_store(&pool->caller_asleep, 0);
    pthread_mutex_unlock(&pool->lock);
}
