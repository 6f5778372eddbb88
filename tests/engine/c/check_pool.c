/* check_pool.c — the engine's thread pool (threads.c) against what pool_run promises:
 *
 * 1. every item of every job runs exactly once, for 1-4 threads and job sizes 1..300 and
 *    some large ones, job after job (generation after generation);
 * 2. with two threads, each thread runs one contiguous ascending stretch of chunks first (its
 *    own share, the caller's from item 0), then only chunks taken from the back of the
 *    other's share, each ending where the previous one it took began;
 * 3. a worker stalled inside its first chunk holds up only that chunk: the caller runs every
 *    other chunk, its own and the worker's.
 * Exit 0 when all hold; 1 with the first failure printed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "threads.h"

#define MAX_ITEMS 100000
#define MAX_RUNS 4096

static atomic_int counts[MAX_ITEMS];

/* the chunks each thread ran, in order: thread 0 is the caller, 1 the other (two threads) */
typedef struct {
    int begin[MAX_RUNS], end[MAX_RUNS], n;
} Trace;
static Trace traces[2];
static pthread_t caller;
static atomic_int stall_first; /* the worker sleeps inside its first chunk while set */

static void count_items(void *arg, int begin, int end) {
    (void)arg;
    for (int i = begin; i < end; i++) atomic_fetch_add(&counts[i], 1);
}

static void trace_chunks(void *arg, int begin, int end) {
    Trace *t = &traces[pthread_equal(pthread_self(), caller) ? 0 : 1];
    if (t != &traces[0] && atomic_exchange(&stall_first, 0)) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    t->begin[t->n] = begin;
    t->end[t->n] = end;
    t->n++;
    count_items(arg, begin, end);
}

static int fail(const char *what, int threads, int n) {
    printf("FAIL: %s (threads %d, items %d)\n", what, threads, n);
    return 1;
}

static int each_item_once(ThreadPool *pool, int threads, int n, PoolFn fn) {
    memset(counts, 0, sizeof(atomic_int) * (size_t)n);
    pool_run(pool, fn, NULL, n);
    for (int i = 0; i < n; i++)
        if (atomic_load(&counts[i]) != 1) return fail("an item ran other than once", threads, n);
    return 0;
}

/* a thread's trace: an ascending contiguous stretch (its share; the caller's starts at item
 * 0), then chunks taken from the back of the other's share, each ending where the last began.
 * A caller whose whole share was taken has only the second part, from the last item back. */
static int share_then_steals(const Trace *t, int is_caller, int n) {
    if (t->n == 0) return 0;
    int k = 1;
    if (is_caller && t->begin[0] != 0) {
        if (t->end[0] != n) return fail("the caller began neither at item 0 nor at the back", 2, n);
    } else {
        while (k < t->n && t->begin[k] == t->end[k - 1]) k++;
        k++; /* the first chunk taken from the other's share may start anywhere in it */
    }
    for (; k < t->n; k++)
        if (t->end[k] != t->begin[k - 1]) return fail("chunks taken out of order", 2, n);
    return 0;
}

int main(void) {
    caller = pthread_self();
    int sizes[320], n_sizes = 0;
    for (int n = 1; n <= 300; n++) sizes[n_sizes++] = n;
    int large[] = {1024, 4096, 37984, MAX_ITEMS};
    for (size_t i = 0; i < sizeof large / sizeof large[0]; i++) sizes[n_sizes++] = large[i];

    for (int threads = 1; threads <= 4; threads++) {
        ThreadPool *pool = pool_create(threads);
        for (int round = 0; round < 3; round++)
            for (int s = 0; s < n_sizes; s++)
                if (each_item_once(pool, threads, sizes[s], count_items)) return 1;
        pool_destroy(pool);
    }

    ThreadPool *pool = pool_create(2);
    int checked = 0;
    for (int s = 0; s < n_sizes; s++) {
        memset(traces, 0, sizeof traces);
        if (each_item_once(pool, 2, sizes[s], trace_chunks)) return 1;
        if (share_then_steals(&traces[0], 1, sizes[s]) || share_then_steals(&traces[1], 0, sizes[s]))
            return 1;
        checked++;
    }

    /* the worker stalls in its first chunk; a large job so both threads have chunks to run */
    memset(traces, 0, sizeof traces);
    atomic_store(&stall_first, 1);
    if (each_item_once(pool, 2, 4096, trace_chunks)) return 1;
    if (traces[1].n > 1) return fail("the stalled worker ran more than its one chunk", 2, 4096);
    pool_destroy(pool);

    printf("pool: every item once for 1-4 threads; %d two-thread traces in order; a stalled "
           "worker held %d chunk(s)\n", checked, traces[1].n);
    return 0;
}
