/* threads.c — see threads.h */
#include "threads.h"

#include <pthread.h>
#include <stdlib.h>

#include "util.h"

struct ThreadPool {
    int n;
    pthread_t *workers;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned long generation; /* bumped for each pool_run */
    int pending;              /* workers still busy with the current generation */
    int stop;
    PoolFn fn;
    void *arg;
    int items;
};

typedef struct {
    ThreadPool *pool;
    int index;
} WorkerArg;

static void range_of(int items, int n, int index, int *begin, int *end) {
    /* contiguous, balanced ranges; the first (items % n) ranges get one extra item */
    int base = items / n, extra = items % n;
    *begin = index * base + (index < extra ? index : extra);
    *end = *begin + base + (index < extra ? 1 : 0);
}

static void *worker_main(void *p) {
    WorkerArg *wa = p;
    ThreadPool *pool = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (!pool->stop && pool->generation == seen) pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = pool->generation;
        PoolFn fn = pool->fn;
        void *arg = pool->arg;
        int items = pool->items;
        pthread_mutex_unlock(&pool->lock);

        int begin, end;
        range_of(items, pool->n, index, &begin, &end);
        if (begin < end) fn(arg, begin, end);

        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->lock);
    }
}

ThreadPool *pool_create(int n_threads) {
    ThreadPool *pool = lmc_alloc(1, sizeof *pool, "thread pool");
    pool->n = n_threads < 1 ? 1 : n_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->workers = lmc_alloc((size_t)pool->n, sizeof(pthread_t), "thread pool");
    for (int i = 1; i < pool->n; i++) {
        WorkerArg *wa = malloc(sizeof *wa);
        if (!wa) lmc_die_runtime("out of memory starting threads");
        wa->pool = pool;
        wa->index = i;
        if (pthread_create(&pool->workers[i], NULL, worker_main, wa) != 0)
            lmc_die_runtime("cannot start thread %d of %d", i + 1, pool->n);
    }
    return pool;
}

void pool_destroy(ThreadPool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
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
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->items = n;
    pool->pending = pool->n - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    int begin, end;
    range_of(n, pool->n, 0, &begin, &end);
    if (begin < end) fn(arg, begin, end);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0) pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
