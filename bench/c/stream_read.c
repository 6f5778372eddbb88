/* stream_read.c — STREAM-like memory read bandwidth, all threads.
 *
 * Each thread owns a contiguous slice of one large buffer (first-touched by that thread) and
 * sums it as 64-bit integers; a pass is timed from one barrier to the next, so a pass lasts as
 * long as its slowest thread. Only reads are timed: decode in an inference engine is dominated
 * by streaming weights, never by writes. The buffer is far larger than the last-level cache so
 * every pass comes from DRAM.
 *
 * usage: stream_read [--mib N] [--threads T] [--passes P]
 * output: one JSON document on stdout; errors: exit code 2 and one line on stderr. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 256
#define MAX_PASSES 1000

typedef struct {
    const uint64_t *base;
    size_t begin, end; /* word indices of this thread's slice */
    int passes;
    uint64_t sink;     /* keeps the sums observable so the reads are not optimised away */
    pthread_barrier_t *start, *stop;
    uint64_t *init;    /* the same slice, writable, for the first touch */
} Worker;

/* Eight independent partial sums (two 256-bit vectors once vectorised) keep several loads in
 * flight per iteration; a single dependency chain would measure latency, not bandwidth. */
static uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    for (; i < n; i++) s[0] += p[i];
    uint64_t total = 0;
    for (int j = 0; j < 8; j++) total += s[j];
    return total;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    for (size_t i = w->begin; i < w->end; i++) w->init[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_barrier_wait(w->start); /* buffer initialised */
    pthread_barrier_wait(w->stop);
    for (int p = 0; p < w->passes; p++) {
        pthread_barrier_wait(w->start);
        w->sink += sum_words(w->base + w->begin, w->end - w->begin);
        pthread_barrier_wait(w->stop);
    }
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int parse_int(const char *flag, const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "stream_read: %s must be an integer in [%ld, %ld], got '%s'\n", flag, lo,
                hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv) {
    long mib = 1024, threads = sysconf(_SC_NPROCESSORS_ONLN), passes = 10;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        long *dest = NULL, lo = 1, hi = 1;
        if (strcmp(flag, "--mib") == 0) dest = &mib, lo = 1, hi = 1 << 20;
        else if (strcmp(flag, "--threads") == 0) dest = &threads, lo = 1, hi = MAX_THREADS;
        else if (strcmp(flag, "--passes") == 0) dest = &passes, lo = 1, hi = MAX_PASSES;
        if (!dest) {
            fprintf(stderr, "stream_read: unknown option '%s' (allowed: --mib, --threads, "
                            "--passes)\n", flag);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "stream_read: %s needs a value\n", flag);
            return 2;
        }
        if (parse_int(flag, argv[++i], lo, hi, dest) != 0) return 2;
    }

    size_t bytes = (size_t)mib << 20;
    size_t words = bytes / sizeof(uint64_t);
    /* 2 MiB aligned and backed by transparent huge pages where the kernel offers them, as
     * lmc's weights are (engine/util.c): the ceiling must not be lowered by TLB misses the
     * engine does not pay */
    size_t huge = (size_t)2 << 20;
    bytes = (bytes + huge - 1) & ~(huge - 1);
    uint64_t *buf = aligned_alloc(huge, bytes);
#ifdef MADV_HUGEPAGE
    if (buf) madvise(buf, bytes, MADV_HUGEPAGE);
#endif
    if (!buf) {
        fprintf(stderr, "stream_read: cannot allocate %ld MiB\n", mib);
        return 2;
    }
    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
    Worker workers[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    for (long t = 0; t < threads; t++) {
        /* slices on 64-byte (8-word) boundaries so no cache line is shared */
        size_t per = (words / (size_t)threads) & ~(size_t)7;
        workers[t] = (Worker){
            .base = buf, .init = buf, .passes = (int)passes, .start = &start, .stop = &stop,
            .begin = per * (size_t)t,
            .end = t == threads - 1 ? words : per * (size_t)(t + 1),
        };
        if (pthread_create(&tids[t], NULL, worker_main, &workers[t]) != 0) {
            fprintf(stderr, "stream_read: cannot start thread %ld\n", t);
            return 2;
        }
    }
    pthread_barrier_wait(&start);
    pthread_barrier_wait(&stop);
    double secs[MAX_PASSES];
    for (long p = 0; p < passes; p++) {
        pthread_barrier_wait(&start);
        double t0 = now_s();
        pthread_barrier_wait(&stop);
        secs[p] = now_s() - t0;
    }
    uint64_t sink = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        sink ^= workers[t].sink;
    }
    free(buf);

    printf("{\"schema\": \"stream_read/1\", \"threads\": %ld, \"bytes\": %zu, \"passes\": %ld, "
           "\"gbps\": [", threads, bytes, passes);
    for (long p = 0; p < passes; p++) printf("%s%.3f", p ? ", " : "", (double)bytes / secs[p] / 1e9);
    qsort(secs, (size_t)passes, sizeof secs[0], cmp_double);
    double median = passes % 2 ? secs[passes / 2] : 0.5 * (secs[passes / 2 - 1] + secs[passes / 2]);
    printf("], \"gbps_best\": %.3f, \"gbps_median\": %.3f, \"checksum\": %llu}\n",
           (double)bytes / secs[0] / 1e9, (double)bytes / median / 1e9, (unsigned long long)sink);
    return 0;
}
