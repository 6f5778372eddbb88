/* stream_read.c — STREAM-like memory read bandwidth, all threads.
 *
 * Each thread owns a contiguous slice of one large buffer (first-touched by that thread) and
 * sums it as 64-bit integers; a pass is timed from one barrier to the next, so a pass lasts as
 * long as its slowest thread. Only reads are timed: decode in an inference engine is dominated
 * by streaming weights, never by writes. The buffer is far larger than the last-level cache so
 * every pass comes from DRAM.
 *
 * --kernel fma reads the same bytes the way lmc's decode reads weights: f32 rows packed four at
 * a time (eight columns of row 0, then of rows 1-3, and on: one sequential stream per quad of
 * 16 KiB), each quad multiplied into a vector of 1024 activations held in L1 with fused
 * multiply-adds, prefetched 2 KiB ahead. Nothing else of an engine (no jobs, no attention, no
 * other layers): set beside STREAM's sum it says how fast this host streams bytes through FMAs,
 * the ceiling a matrix-vector kernel can reach; set beside lmc it says what lmc loses around
 * its kernel.
 *
 * usage: stream_read [--mib N] [--threads T] [--passes P] [--kernel sum|fma]
 * output: one JSON document on stdout; errors: exit code 2 and one line on stderr. */
#include <errno.h>
#include <math.h>
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
#define FMA_COLS 1024 /* columns of the fma kernel's rows: Qwen3-0.6B's hidden size */
#define FMA_QUAD_WORDS (FMA_COLS * 4 * sizeof(float) / sizeof(uint64_t)) /* one quad of rows */
#define FMA_PREFETCH_AHEAD 2048 /* bytes, as lmc's packed tiles */

typedef enum { KERNEL_SUM, KERNEL_FMA } Kernel;

typedef struct {
    const uint64_t *base;
    size_t begin, end; /* word indices of this thread's slice */
    int passes;
    Kernel kernel;
    uint64_t sink;     /* keeps the sums observable so the reads are not optimised away */
    double fma_sink;   /* the same for the fma kernel: the sum of every row's dot product */
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

/* ---- the fma kernel: 8 float lanes, as lmc's weight kernels (engine/simd.h) have them on
 * each target. Every lane is one chain of fused multiply-adds, so the sums are the same on
 * every target. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 lanes8;
static inline lanes8 lanes8_zero(void) { return _mm256_setzero_ps(); }
static inline lanes8 lanes8_fma(lanes8 x, const float *w, lanes8 acc) {
    return _mm256_fmadd_ps(x, _mm256_loadu_ps(w), acc);
}
static inline lanes8 lanes8_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void lanes8_store(float *p, lanes8 a) { _mm256_storeu_ps(p, a); }
#elif defined(__ARM_NEON)
#include <arm_neon.h>
typedef struct { float32x4_t lo, hi; } lanes8;
static inline lanes8 lanes8_zero(void) { return (lanes8){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}; }
static inline lanes8 lanes8_fma(lanes8 x, const float *w, lanes8 acc) {
    return (lanes8){vfmaq_f32(acc.lo, x.lo, vld1q_f32(w)), vfmaq_f32(acc.hi, x.hi, vld1q_f32(w + 4))};
}
static inline lanes8 lanes8_load(const float *p) { return (lanes8){vld1q_f32(p), vld1q_f32(p + 4)}; }
static inline void lanes8_store(float *p, lanes8 a) { vst1q_f32(p, a.lo), vst1q_f32(p + 4, a.hi); }
#else
typedef struct { float v[8]; } lanes8;
static inline lanes8 lanes8_zero(void) { return (lanes8){{0}}; }
static inline lanes8 lanes8_fma(lanes8 x, const float *w, lanes8 acc) {
    for (int j = 0; j < 8; j++) acc.v[j] = fmaf(x.v[j], w[j], acc.v[j]);
    return acc;
}
static inline lanes8 lanes8_load(const float *p) { lanes8 a; memcpy(a.v, p, sizeof a.v); return a; }
static inline void lanes8_store(float *p, lanes8 a) { memcpy(p, a.v, sizeof a.v); }
#endif

/* the activations: small, exact in binary, the same on every machine */
static float fma_x[FMA_COLS];

/* quads of 4 packed rows times fma_x; returns the sum of the rows' dot products */
static double fma_quads(const float *w, size_t quads) {
    double total = 0.0;
    for (size_t q = 0; q < quads; q++, w += FMA_COLS * 4) {
        lanes8 acc[4] = {lanes8_zero(), lanes8_zero(), lanes8_zero(), lanes8_zero()};
        for (int i = 0; i < FMA_COLS; i += 8) {
            const float *wi = w + i * 4;
            __builtin_prefetch((const char *)wi + FMA_PREFETCH_AHEAD);
            __builtin_prefetch((const char *)wi + FMA_PREFETCH_AHEAD + 64);
            lanes8 x = lanes8_load(fma_x + i);
            for (int r = 0; r < 4; r++) acc[r] = lanes8_fma(x, wi + r * 8, acc[r]);
        }
        for (int r = 0; r < 4; r++) {
            float lane[8];
            lanes8_store(lane, acc[r]);
            for (int j = 0; j < 8; j++) total += lane[j];
        }
    }
    return total;
}

/* the fma kernel's weights: small multiples of 1/1024 (exact in f32), varied */
static float fma_weight(size_t i) { return (float)((long)(i % 2039) - 1019) / 1024.0f; }

static void *worker_main(void *arg) {
    Worker *w = arg;
    if (w->kernel == KERNEL_FMA)
        for (size_t i = w->begin * 2; i < w->end * 2; i++) ((float *)w->init)[i] = fma_weight(i);
    else
        for (size_t i = w->begin; i < w->end; i++) w->init[i] = i * 0x9E3779B97F4A7C15ull;
    pthread_barrier_wait(w->start); /* buffer initialised */
    pthread_barrier_wait(w->stop);
    for (int p = 0; p < w->passes; p++) {
        pthread_barrier_wait(w->start);
        if (w->kernel == KERNEL_FMA)
            w->fma_sink += fma_quads((const float *)(w->base + w->begin),
                                     (w->end - w->begin) / FMA_QUAD_WORDS);
        else
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
    Kernel kernel = KERNEL_SUM;
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--kernel") == 0) {
            const char *name = i + 1 < argc ? argv[++i] : "";
            if (strcmp(name, "sum") == 0) kernel = KERNEL_SUM;
            else if (strcmp(name, "fma") == 0) kernel = KERNEL_FMA;
            else {
                fprintf(stderr, "stream_read: --kernel must be 'sum' or 'fma', got '%s'\n", name);
                return 2;
            }
            continue;
        }
        long *dest = NULL, lo = 1, hi = 1;
        if (strcmp(flag, "--mib") == 0) dest = &mib, lo = 1, hi = 1 << 20;
        else if (strcmp(flag, "--threads") == 0) dest = &threads, lo = 1, hi = MAX_THREADS;
        else if (strcmp(flag, "--passes") == 0) dest = &passes, lo = 1, hi = MAX_PASSES;
        if (!dest) {
            fprintf(stderr, "stream_read: unknown option '%s' (allowed: --mib, --threads, "
                            "--passes, --kernel)\n", flag);
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
    for (int i = 0; i < FMA_COLS; i++) fma_x[i] = (float)(i % 13 + 1) / 16.0f;
    /* slices on 64-byte (8-word) boundaries so no cache line is shared; the fma kernel's on
     * whole quads, and words past the last whole quad are not read */
    size_t unit = kernel == KERNEL_FMA ? FMA_QUAD_WORDS : 8;
    if (kernel == KERNEL_FMA && words / unit < (size_t)threads) {
        fprintf(stderr, "stream_read: --mib %ld holds fewer 16 KiB quads than threads\n", mib);
        return 2;
    }
    size_t per = words / unit / (size_t)threads * unit;
    size_t last_end = kernel == KERNEL_FMA ? words / unit * unit : words;
    for (long t = 0; t < threads; t++) {
        workers[t] = (Worker){
            .base = buf, .init = buf, .passes = (int)passes, .start = &start, .stop = &stop,
            .kernel = kernel,
            .begin = per * (size_t)t,
            .end = t == threads - 1 ? last_end : per * (size_t)(t + 1),
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
    double fma_sink = 0.0;
    for (long t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        sink ^= workers[t].sink;
        fma_sink += workers[t].fma_sink;
    }
    free(buf);
    bytes = last_end * sizeof(uint64_t); /* the bytes a pass reads */

    printf("{\"schema\": \"stream_read/2\", \"kernel\": \"%s\", \"threads\": %ld, \"bytes\": %zu, "
           "\"passes\": %ld, \"gbps\": [", kernel == KERNEL_FMA ? "fma" : "sum", threads, bytes, passes);
    for (long p = 0; p < passes; p++) printf("%s%.3f", p ? ", " : "", (double)bytes / secs[p] / 1e9);
    qsort(secs, (size_t)passes, sizeof secs[0], cmp_double);
    double median = passes % 2 ? secs[passes / 2] : 0.5 * (secs[passes / 2 - 1] + secs[passes / 2]);
    printf("], \"gbps_best\": %.3f, \"gbps_median\": %.3f, \"checksum\": %llu, "
           "\"fma_checksum\": %.17g}\n", (double)bytes / secs[0] / 1e9, (double)bytes / median / 1e9,
           (unsigned long long)sink, fma_sink);
    return 0;
}
