/* threads.h — a small pthreads pool.
 *
 * pool_run splits [0, n) into contiguous chunks, gives each thread (the caller included) a
 * contiguous share of them to run in order — a thread done with its share takes chunks from
 * the back of the others' — and waits for all of them. Work functions must compute each
 * item independently — no cross-item reductions, nothing that depends on which thread runs
 * an item or where a chunk starts — which is what makes results bit-identical for any thread
 * count and any scheduling. */
#ifndef LMC_THREADS_H
#define LMC_THREADS_H

typedef void (*PoolFn)(void *arg, int begin, int end);
typedef struct ThreadPool ThreadPool;

/* n_threads >= 1; the calling thread is one of them */
ThreadPool *pool_create(int n_threads);
void pool_destroy(ThreadPool *pool);
/* pool may be NULL: runs fn(arg, 0, n) on the caller */
void pool_run(ThreadPool *pool, PoolFn fn, void *arg, int n);
int pool_threads(const ThreadPool *pool);

#endif
