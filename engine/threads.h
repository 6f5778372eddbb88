/* threads.h — a small pthreads pool.
 *
 * pool_run splits [0, n) into one contiguous range per thread and waits for all of them.
 * Work functions must compute each item independently (no cross-item reductions), which is
 * what makes results bit-identical for any thread count. */
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
