/* fma_peak.c — how many floating-point operations one CPU second of this host does at most
 * with the widest vectors of the level it is built for: 12 independent fused multiply-add
 * chains in registers (the accumulators of lmc's 4 x 3 weight tiles), no memory traffic,
 * 16 lanes (512 bits) where AVX-512 is built in (x86-64 v4), 8 (AVX2, or two NEON registers)
 * below. A weight product can reach this only if it never waits on a load; set beside a
 * prefill's FLOP count and CPU seconds, it says what fraction of the level's peak an engine's
 * prefill runs at. Where the build has AVX512_BF16 (x86-64 v4-vnni), the same for bf16 dot
 * products too: 12 chains of vdpbf16ps, each lane two multiply-adds an instruction (4
 * operations), the ceiling of a bf16 product whose activations are rounded to bf16 (lmc
 * --bf16-acts, llama.cpp's bf16 products).
 *
 * usage: fma_peak [--passes P]   (P in [1, 100], default 5; each pass about 0.25 s)
 * output: one JSON document on stdout, the vector width (lanes, bits), the best pass and every
 * pass in GFLOP per CPU second, and the bf16 dot products' best pass (null without
 * AVX512_BF16); errors: exit code 2 and one line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 lanes;
#define LANES 16
static inline lanes lanes_set(float a) { return _mm512_set1_ps(a); }
static inline lanes lanes_fma(lanes a, lanes b, lanes c) { return _mm512_fmadd_ps(a, b, c); }
static inline float lanes_first(lanes a) { return _mm512_cvtss_f32(a); }
#define SIMD "avx512f"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 lanes;
#define LANES 8
static inline lanes lanes_set(float a) { return _mm256_set1_ps(a); }
static inline lanes lanes_fma(lanes a, lanes b, lanes c) { return _mm256_fmadd_ps(a, b, c); }
static inline float lanes_first(lanes a) { return _mm256_cvtss_f32(a); }
#define SIMD "avx2+fma"
#elif defined(__ARM_NEON)
#include <arm_neon.h>
typedef struct {
    float32x4_t lo, hi;
} lanes;
#define LANES 8
static inline lanes lanes_set(float a) { return (lanes){vdupq_n_f32(a), vdupq_n_f32(a)}; }
static inline lanes lanes_fma(lanes a, lanes b, lanes c) {
    return (lanes){vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}
static inline float lanes_first(lanes a) { return vgetq_lane_f32(a.lo, 0); }
#define SIMD "neon"
#else
#error "fma_peak needs AVX-512F, AVX2+FMA or NEON"
#endif

#define CHAINS 12
#define STEPS 20000000L /* per pass: 12 x LANES x 2 x 2e7 = 3.84 GFLOP at 8 lanes */

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* one pass; returns its GFLOP per CPU second (sink: keeps the chains' results alive) */
static double pass(float *sink) {
    lanes acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = lanes_set(0.001f * (float)j);
    const lanes a = lanes_set(0.999999f), b = lanes_set(1e-7f);
    double t0 = cpu_s();
    /* each step depends on the last (fused multiply-adds are exact operations the compiler
     * may not reassociate), so the loop cannot be folded */
    for (long i = 0; i < STEPS; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = lanes_fma(acc[j], a, b);
    double dt = cpu_s() - t0;
    for (int j = 0; j < CHAINS; j++) *sink += lanes_first(acc[j]);
    return (double)STEPS * CHAINS * LANES * 2 / dt / 1e9;
}

#if defined(__AVX512BF16__)
/* one pass of bf16 dot products (vdpbf16ps: per lane acc + a0·b0 + a1·b1); GFLOP per CPU
 * second */
static double pass_dot_bf16(float *sink) {
    __m512 acc[CHAINS];
    for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_set1_ps(0.001f * (float)j);
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3F803F80), b = (__m512bh)_mm512_set1_epi32(0x33D633D6);
    double t0 = cpu_s();
    for (long i = 0; i < STEPS; i++)
        for (int j = 0; j < CHAINS; j++) acc[j] = _mm512_dpbf16_ps(acc[j], a, b);
    double dt = cpu_s() - t0;
    for (int j = 0; j < CHAINS; j++) *sink += _mm512_cvtss_f32(acc[j]);
    return (double)STEPS * CHAINS * 16 * 4 / dt / 1e9;
}
#endif

int main(int argc, char **argv) {
    long passes = 5;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--passes") == 0 && i + 1 < argc) {
            passes = strtol(argv[++i], &end, 10);
            if (*end != '\0' || passes < 1 || passes > 100) {
                fprintf(stderr, "fma_peak: --passes must be an integer in [1, 100], got '%s'\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "fma_peak: unknown option '%s' (allowed: --passes P)\n", argv[i]);
            return 2;
        }
    }
    float sink = 0.0f;
    double best = 0.0;
    printf("{\"simd\": \"%s\", \"lanes\": %d, \"bits\": %d, \"chains\": %d, \"passes_gflops\": [", SIMD, LANES,
           LANES * 32, CHAINS);
    for (long p = 0; p < passes; p++) {
        double g = pass(&sink);
        best = g > best ? g : best;
        printf("%s%.2f", p ? ", " : "", g);
    }
    printf("], \"best_gflops\": %.2f, ", best);
#if defined(__AVX512BF16__)
    double best_dot = 0.0;
    for (long p = 0; p < passes; p++) {
        double g = pass_dot_bf16(&sink);
        best_dot = g > best_dot ? g : best_dot;
    }
    printf("\"dot_bf16_best_gflops\": %.2f, ", best_dot);
#else
    printf("\"dot_bf16_best_gflops\": null, ");
#endif
    printf("\"sink\": %g}\n", (double)sink);
    return 0;
}
