/* util.c — see util.h */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HUGE_PAGE ((size_t)2 << 20)

/* ---------------------------------------------------------------- errors */

static char g_error[512];

void lmc_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
}

const char *lmc_last_error(void) { return g_error[0] ? g_error : "unknown error"; }

static _Noreturn void die_v(int code, const char *fmt, va_list ap) {
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    /* one line only: newlines inside a message (e.g. from a file name) become spaces */
    for (char *c = msg; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    fflush(stdout);
    fprintf(stderr, "lmc: error: %s\n", msg);
    exit(code);
}

void lmc_die_input(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    die_v(LMC_EXIT_INPUT, fmt, ap);
}

void lmc_die_runtime(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    die_v(LMC_EXIT_RUNTIME, fmt, ap);
}

/* ---------------------------------------------------------------- memory */

void *lmc_alloc(size_t count, size_t size, const char *what) {
    if (count == 0 || size == 0) count = size = 1;
    if (count > (SIZE_MAX >> 2) / size) lmc_die_runtime("out of memory allocating %s (size overflow)", what);
    /* a vector's width of slack past the end, zeroed, for kernels that read a tail whole */
    size_t bytes = count * size + 64;
    /* Large buffers (KV cache, weights) get 2 MiB alignment and transparent huge pages: they
     * are streamed once per token, and with 4 KiB pages every page of the stream costs a TLB
     * miss (probing reads rows a block apart: a miss per row). Only whole huge pages are asked
     * for: rounding the size up to 2 MiB made the tail's huge page resident too (up to 2 MiB
     * per matrix beyond the weights, about a tenth of a small model's). */
    size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 64;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0 || !p)
        lmc_die_runtime("out of memory allocating %s (%zu bytes)", what, bytes);
#ifdef MADV_HUGEPAGE
    if (align == HUGE_PAGE) madvise(p, bytes & ~(size_t)(HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    memset(p, 0, bytes);
    return p;
}

void lmc_free(void *p) { free(p); }

/* ---------------------------------------------------------------- clock */

static double clock_ms(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double lmc_now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

double lmc_cpu_ms(void) { return clock_ms(CLOCK_PROCESS_CPUTIME_ID); }

/* ---------------------------------------------------------------- files */

/* stdin is not ours to close */
static void close_input(FILE *f) {
    if (f != stdin) fclose(f);
}

/* a regular file opened for reading, checked before a byte is read (see lmc_read_file) */
static FILE *open_regular(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        lmc_set_error("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        lmc_set_error("%s is not a regular file (a FIFO, device or directory is not read)", path);
        close(fd);
        return NULL;
    }
    /* back to blocking reads: a regular file never waits, and stdio expects them */
    int flags = fcntl(fd, F_GETFL);
    FILE *f = flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        lmc_set_error("cannot open %s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int lmc_read_file(const char *path, char **out, size_t *len) {
    /* "-": standard input, which lets a harness send ids with the command */
    FILE *f = strcmp(path, "-") == 0 ? stdin : open_regular(path);
    if (!f) return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close_input(f);
        lmc_set_error("out of memory reading %s", path);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            if (cap >= LMC_MAX_INPUT_BYTES) {
                free(buf);
                close_input(f);
                lmc_set_error("%s is larger than lmc reads (%zu MiB at most)", path,
                              LMC_MAX_INPUT_BYTES >> 20);
                return -1;
            }
            cap *= 2;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                free(buf);
                close_input(f);
                lmc_set_error("out of memory reading %s", path);
                return -1;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int failed = ferror(f);
    close_input(f);
    if (failed) {
        free(buf);
        lmc_set_error("cannot read %s", path);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int lmc_read_tokens(const char *path, int **out, int *count) {
    char *text;
    size_t len;
    if (lmc_read_file(path, &text, &len) != 0) return -1;
    int cap = 256, n = 0;
    int *ids = malloc(sizeof(int) * (size_t)cap);
    if (!ids) {
        free(text);
        lmc_set_error("out of memory reading %s", path);
        return -1;
    }
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            lmc_set_error("%s: token %d is not a decimal integer (byte '%c' at offset %zu); "
                          "token files hold whitespace-separated ids", path, n, c, i);
            free(ids);
            free(text);
            return -1;
        }
        long long v = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            v = v * 10 + (text[i] - '0');
            if (v > 2147483647LL) {
                lmc_set_error("%s: token %d is too large", path, n);
                free(ids);
                free(text);
                return -1;
            }
            i++;
        }
        if (i < len && !(text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == '\r')) {
            lmc_set_error("%s: token %d is not a decimal integer (byte '%c' at offset %zu)",
                          path, n, text[i], i);
            free(ids);
            free(text);
            return -1;
        }
        if (n == cap) {
            cap *= 2;
            int *grown = realloc(ids, sizeof(int) * (size_t)cap);
            if (!grown) {
                free(ids);
                free(text);
                lmc_set_error("out of memory reading %s", path);
                return -1;
            }
            ids = grown;
        }
        ids[n++] = (int)v;
    }
    free(text);
    *out = ids;
    *count = n;
    return 0;
}

/* ---------------------------------------------------------------- random */

uint64_t lmc_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

float lmc_rand_uniform(uint64_t *state) {
    *state = lmc_mix64(*state);
    /* top 24 bits -> [0, 1) exactly representable, then to [-1, 1) */
    return (float)(*state >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
}

/* ---------------------------------------------------------------- misc */

int lmc_cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double lmc_median(const double *values, int n) {
    if (n <= 0) return 0.0;
    double *tmp = malloc(sizeof(double) * (size_t)n);
    if (!tmp) return values[0];
    memcpy(tmp, values, sizeof(double) * (size_t)n);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    double m = (n % 2) ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
    free(tmp);
    return m;
}
