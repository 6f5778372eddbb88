/* util.h — errors, memory, clocks, token files, a counter-based random generator.
 *
 * Errors: parsers and loaders never exit; they record one message with lmc_set_error() and
 * return -1, so the fuzz target can run them in-process. The CLI turns a recorded error into
 * "lmc: error: <message>" on stderr and exit code 2 (lmc_die_input). */
#ifndef LMC_UTIL_H
#define LMC_UTIL_H

#include <stddef.h>
#include <stdint.h>

#ifndef LMC_SOURCE_HASH
#define LMC_SOURCE_HASH "unknown"
#endif
#ifndef LMC_COMPILER
#define LMC_COMPILER "unknown"
#endif
#ifndef LMC_FLAGS
#define LMC_FLAGS "unknown"
#endif
#ifndef LMC_TARGET
#define LMC_TARGET "unknown"
#endif
#ifndef LMC_ISA /* the instruction-set level the harness built it for (devices/isa.py) */
#define LMC_ISA "unknown"
#endif

#define LMC_VERSION "0.2.0"
#define LMC_SCHEMA "lmc/1"

/* exit codes of the CLI */
#define LMC_EXIT_INPUT 2
#define LMC_EXIT_RUNTIME 1

void lmc_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *lmc_last_error(void);
/* print "lmc: error: <message>" and exit 2 (bad input) */
_Noreturn void lmc_die_input(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* same for failures while running (out of memory, threads): exit 1 */
_Noreturn void lmc_die_runtime(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* allocation that reports instead of crashing; memory is zeroed, 64-byte aligned */
void *lmc_alloc(size_t count, size_t size, const char *what);
void lmc_free(void *p);
/* ask for n floats from p on, every 64-byte line of them (prefetch never faults) */
static inline void lmc_prefetch_floats(const float *p, int n) {
    for (int i = 0; i < n; i += 16) __builtin_prefetch(p + i);
}

double lmc_now_ms(void);
/* CPU time of the whole process (all its threads) so far, in ms */
double lmc_cpu_ms(void);

/* the most bytes lmc_read_file reads: config and index JSON, token files, predictors are far
 * smaller; a larger file (or /dev/zero behind "-") is refused, not read until memory runs out */
#define LMC_MAX_INPUT_BYTES ((size_t)256 << 20)

/* Read a whole file into a NUL-terminated buffer; -1 with an error naming the path. Only a
 * regular file is read ("-", standard input, excepted): it is opened non-blocking and checked
 * with fstat, so a FIFO or a device is refused at once instead of hanging the command. */
int lmc_read_file(const char *path, char **out, size_t *len);

/* Parse whitespace-separated decimal token ids; -1 with an error naming the path. */
int lmc_read_tokens(const char *path, int **out, int *count);

/* splitmix64: a counter-based generator, so a value depends only on its inputs, never on
 * which thread asks or in which order (needed for --threads invariance). */
uint64_t lmc_mix64(uint64_t x);
/* uniform float in [-1, 1) from a 64-bit state, advancing it */
float lmc_rand_uniform(uint64_t *state);

/* float comparison helpers for qsort */
int lmc_cmp_int(const void *a, const void *b);
double lmc_median(const double *values, int n);

#endif
