/* simd.h — the 8-lane primitives the weight kernels (matmul.c) are written in, for AVX2+FMA,
 * NEON (with or without the dot-product extension) and portable C, chosen at build time.
 *
 * v8: 8 floats; v8i: 8 int32; qblock: a block of 32 int8 values. qblock_dot(x, w) gives in
 * lane j the exact sum of x[i]·w[i] for i = 4j..4j+3 on every path (integer arithmetic), so
 * the kernels built on these give the same bits on every target. Include once, from the
 * file that defines the kernels (everything here is static inline). */
#ifndef LMC_SIMD_H
#define LMC_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops.h"
#include "safetensors.h"

#if defined(__AVX2__) && defined(__FMA__)
#define LMC_AVX2 1
#include <immintrin.h>
#elif defined(__ARM_NEON)
#define LMC_NEON 1
#include <arm_neon.h>
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#if defined(LMC_AVX2)
typedef __m256 v8;
typedef __m256i v8i;
typedef __m256i qblock;
ALWAYS_INLINE v8 v8_zero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE v8 v8_load(const float *p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE v8 v8_load_bf16(const uint16_t *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
/* 8 words, each two bf16 values (mat_pack): the high halves give *first (columns j), the low
 * halves *second (columns j + 8) */
ALWAYS_INLINE void v8_load_bf16_pair(const uint16_t *p, v8 *first, v8 *second) {
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    *first = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
    *second = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
ALWAYS_INLINE v8 v8_set1(float a) { return _mm256_set1_ps(a); }
/* lmc_reduce8 in registers, the same additions in the same order: (s0+s4, s1+s5, s2+s6, s3+s7)
 * then (t0+t2) + (t1+t3) */
ALWAYS_INLINE float v8_reduce(v8 a) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 1)));
}
/* v8_reduce of a, b, c and d into out[0..3], the same additions four at a time (a tile's
 * epilogue: 12 reductions one by one cost a third of a 128-column dot product's tile) */
ALWAYS_INLINE void v8_reduce4(v8 a, v8 b, v8 c, v8 d, float *out) {
    __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    /* per 128-bit half (a | b, c | d): t0 + t2 and t1 + t3 of each */
    __m256 w = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 h = _mm256_hadd_ps(w, w); /* (a, c, a, c | b, d, b, d) */
    _mm_storeu_ps(out, _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
ALWAYS_INLINE v8 v8_fma(v8 a, v8 b, v8 c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE void v8_store(float *p, v8 a) { _mm256_storeu_ps(p, a); }
ALWAYS_INLINE v8 v8_from_i(v8i a) { return _mm256_cvtepi32_ps(a); }
ALWAYS_INLINE qblock qblock_load(const int8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* VNNI (x86-64-v4 with VNNI): vpdpbusd multiplies unsigned by signed bytes and adds each group
 * of four into an int32 lane in one instruction, without the int16 step; the same |x| times w
 * with x's sign, and integer sums, so the same bits as the AVX2 path below */
ALWAYS_INLINE v8i qblock_dot(qblock x, qblock w) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
}
#else
ALWAYS_INLINE v8i qblock_dot(qblock x, qblock w) {
    /* maddubs wants unsigned x signed: |x| times w with x's sign; |x|, |w| <= 127 so the
     * int16 pair sums (<= 2 * 127 * 127) never saturate */
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
#endif
ALWAYS_INLINE float half_to_f32(uint16_t h) { return _cvtsh_ss(h); }
/* out[j] = half(wd[j]) * xd[j], j < 8 */
ALWAYS_INLINE void scales8(const uint16_t *wd, const float *xd, float *out) {
    __m256 w = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wd));
    _mm256_storeu_ps(out, _mm256_mul_ps(w, _mm256_loadu_ps(xd)));
}
ALWAYS_INLINE v8 v8_broadcast(const float *p) { return _mm256_broadcast_ss(p); }
#elif defined(LMC_NEON)
typedef struct {
    float32x4_t lo, hi;
} v8;
typedef struct {
    int32x4_t lo, hi;
} v8i;
typedef int8x16x2_t qblock;
ALWAYS_INLINE v8 v8_zero(void) { return (v8){vdupq_n_f32(0), vdupq_n_f32(0)}; }
ALWAYS_INLINE v8 v8_load(const float *p) { return (v8){vld1q_f32(p), vld1q_f32(p + 4)}; }
ALWAYS_INLINE v8 v8_load_bf16(const uint16_t *p) {
    uint16x8_t h = vld1q_u16(p);
    return (v8){vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
                vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16))};
}
ALWAYS_INLINE void v8_load_bf16_pair(const uint16_t *p, v8 *first, v8 *second) {
    uint32x4_t a = vreinterpretq_u32_u16(vld1q_u16(p)), b = vreinterpretq_u32_u16(vld1q_u16(p + 8));
    uint32x4_t mask = vdupq_n_u32(0xFFFF0000u);
    *first = (v8){vreinterpretq_f32_u32(vandq_u32(a, mask)), vreinterpretq_f32_u32(vandq_u32(b, mask))};
    *second = (v8){vreinterpretq_f32_u32(vshlq_n_u32(a, 16)), vreinterpretq_f32_u32(vshlq_n_u32(b, 16))};
}
ALWAYS_INLINE v8 v8_set1(float a) { return (v8){vdupq_n_f32(a), vdupq_n_f32(a)}; }
ALWAYS_INLINE void v8_reduce4(v8 a, v8 b, v8 c, v8 d, float *out) { /* v8_reduce of each, four at a time */
    float32x4_t ta = vaddq_f32(a.lo, a.hi), tb = vaddq_f32(b.lo, b.hi);
    float32x4_t tc = vaddq_f32(c.lo, c.hi), td = vaddq_f32(d.lo, d.hi);
    float32x4_t ab = vaddq_f32(vcombine_f32(vget_low_f32(ta), vget_low_f32(tb)),
                               vcombine_f32(vget_high_f32(ta), vget_high_f32(tb)));
    float32x4_t cd = vaddq_f32(vcombine_f32(vget_low_f32(tc), vget_low_f32(td)),
                               vcombine_f32(vget_high_f32(tc), vget_high_f32(td)));
    vst1q_f32(out, vpaddq_f32(ab, cd));
}
ALWAYS_INLINE float v8_reduce(v8 a) { /* lmc_reduce8's order: t = lo + hi, (t0 + t2) + (t1 + t3) */
    float32x4_t t = vaddq_f32(a.lo, a.hi);
    float32x4_t u = vaddq_f32(t, vextq_f32(t, t, 2));
    return vgetq_lane_f32(u, 0) + vgetq_lane_f32(u, 1);
}
ALWAYS_INLINE v8 v8_fma(v8 a, v8 b, v8 c) { return (v8){vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)}; }
ALWAYS_INLINE void v8_store(float *p, v8 a) {
    vst1q_f32(p, a.lo);
    vst1q_f32(p + 4, a.hi);
}
ALWAYS_INLINE v8 v8_from_i(v8i a) { return (v8){vcvtq_f32_s32(a.lo), vcvtq_f32_s32(a.hi)}; }
ALWAYS_INLINE qblock qblock_load(const int8_t *p) { return vld1q_s8_x2(p); }
#if defined(__ARM_FEATURE_MATMUL_INT8)
/* i8mm: smmla multiplies a 2x8 by an 8x2 int8 matrix into 2x2 int32 sums. A token's 8-byte
 * chunk m split as (x0..3, 0000 | 0000, x4..7) against chunk m of two weight rows gives lanes
 * 2m and 2m+1 of both rows: the 4-byte lane sums of qblock_dot, exact in int32, so the same
 * bits as sdot (4 sums an instruction either way). The split is made once per token block
 * and serves every row pair. */
#define LMC_QBLOCK_PAIRS 1
typedef struct {
    int8x16_t chunk[4];
} qsplit;
ALWAYS_INLINE qsplit qblock_split(qblock x) {
    const int8x16_t keep = vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(0x00000000FFFFFFFFull),
                                                             vcreate_u64(0xFFFFFFFF00000000ull)));
    qsplit s;
    for (int h = 0; h < 2; h++) {
        int8x16_t lo = vcombine_s8(vget_low_s8(x.val[h]), vget_low_s8(x.val[h]));
        int8x16_t hi = vcombine_s8(vget_high_s8(x.val[h]), vget_high_s8(x.val[h]));
        s.chunk[2 * h] = vandq_s8(lo, keep);
        s.chunk[2 * h + 1] = vandq_s8(hi, keep);
    }
    return s;
}
/* the lane sums of weight rows w0 and w1 against one split token block */
ALWAYS_INLINE void qblock_dot_pair(const qsplit *x, qblock w0, qblock w1, v8i *d0, v8i *d1) {
    int32x4_t c[4]; /* chunk m: row 0 lane 2m, row 1 lane 2m, row 0 lane 2m+1, row 1 lane 2m+1 */
    for (int h = 0; h < 2; h++) {
        int64x2_t a = vreinterpretq_s64_s8(w0.val[h]), b = vreinterpretq_s64_s8(w1.val[h]);
        c[2 * h] = vmmlaq_s32(vdupq_n_s32(0), x->chunk[2 * h], vreinterpretq_s8_s64(vzip1q_s64(a, b)));
        c[2 * h + 1] = vmmlaq_s32(vdupq_n_s32(0), x->chunk[2 * h + 1], vreinterpretq_s8_s64(vzip2q_s64(a, b)));
    }
    *d0 = (v8i){vuzp1q_s32(c[0], c[1]), vuzp1q_s32(c[2], c[3])};
    *d1 = (v8i){vuzp2q_s32(c[0], c[1]), vuzp2q_s32(c[2], c[3])};
}
#endif
#if defined(__ARM_FEATURE_DOTPROD)
ALWAYS_INLINE v8i qblock_dot(qblock x, qblock w) {
    return (v8i){vdotq_s32(vdupq_n_s32(0), x.val[0], w.val[0]), vdotq_s32(vdupq_n_s32(0), x.val[1], w.val[1])};
}
#else
/* widening multiplies, then pairwise adds: (p0+p1)+(p2+p3) per lane, exact in int32 */
ALWAYS_INLINE int32x4_t dot16(int8x16_t x, int8x16_t w) {
    int32x4_t a = vpaddlq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(w)));
    int32x4_t b = vpaddlq_s16(vmull_s8(vget_high_s8(x), vget_high_s8(w)));
    return vpaddq_s32(a, b);
}
ALWAYS_INLINE v8i qblock_dot(qblock x, qblock w) { return (v8i){dot16(x.val[0], w.val[0]), dot16(x.val[1], w.val[1])}; }
#endif
ALWAYS_INLINE float half_to_f32(uint16_t h) {
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}
ALWAYS_INLINE void scales8(const uint16_t *wd, const float *xd, float *out) {
    float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(wd));
    vst1q_f32(out, vmulq_f32(vcvt_f32_f16(vget_low_f16(h)), vld1q_f32(xd)));
    vst1q_f32(out + 4, vmulq_f32(vcvt_high_f32_f16(h), vld1q_f32(xd + 4)));
}
ALWAYS_INLINE v8 v8_broadcast(const float *p) { return v8_set1(*p); }
#else
typedef struct {
    float v[8];
} v8;
typedef struct {
    int32_t v[8];
} v8i;
typedef const int8_t *qblock;
ALWAYS_INLINE v8 v8_zero(void) { return (v8){{0}}; }
ALWAYS_INLINE v8 v8_load(const float *p) {
    v8 r;
    memcpy(r.v, p, sizeof r.v);
    return r;
}
ALWAYS_INLINE v8 v8_set1(float a) { return (v8){{a, a, a, a, a, a, a, a}}; }
ALWAYS_INLINE v8 v8_load_bf16(const uint16_t *p) {
    v8 r;
    for (int j = 0; j < 8; j++) r.v[j] = lmc_bf16_to_f32(p[j]);
    return r;
}
ALWAYS_INLINE void v8_load_bf16_pair(const uint16_t *p, v8 *first, v8 *second) {
    for (int j = 0; j < 8; j++) {
        first->v[j] = lmc_bf16_to_f32(p[2 * j + 1]);
        second->v[j] = lmc_bf16_to_f32(p[2 * j]);
    }
}
ALWAYS_INLINE v8 v8_fma(v8 a, v8 b, v8 c) {
    for (int j = 0; j < 8; j++) c.v[j] = fmaf(a.v[j], b.v[j], c.v[j]);
    return c;
}
ALWAYS_INLINE void v8_store(float *p, v8 a) { memcpy(p, a.v, sizeof a.v); }
ALWAYS_INLINE float v8_reduce(v8 a) { return lmc_reduce8(a.v); }
ALWAYS_INLINE void v8_reduce4(v8 a, v8 b, v8 c, v8 d, float *out) {
    out[0] = lmc_reduce8(a.v);
    out[1] = lmc_reduce8(b.v);
    out[2] = lmc_reduce8(c.v);
    out[3] = lmc_reduce8(d.v);
}
ALWAYS_INLINE v8 v8_from_i(v8i a) {
    v8 r;
    for (int j = 0; j < 8; j++) r.v[j] = (float)a.v[j];
    return r;
}
ALWAYS_INLINE qblock qblock_load(const int8_t *p) { return p; }
ALWAYS_INLINE v8i qblock_dot(qblock x, qblock w) {
    v8i r;
    for (int j = 0; j < 8; j++) {
        int32_t s = 0;
        for (int k = 4 * j; k < 4 * j + 4; k++) s += (int32_t)x[k] * (int32_t)w[k];
        r.v[j] = s;
    }
    return r;
}
ALWAYS_INLINE float half_to_f32(uint16_t h) { return lmc_f16_to_f32(h); }
ALWAYS_INLINE void scales8(const uint16_t *wd, const float *xd, float *out) {
    for (int j = 0; j < 8; j++) out[j] = lmc_f16_to_f32(wd[j]) * xd[j];
}
ALWAYS_INLINE v8 v8_broadcast(const float *p) { return v8_set1(*p); }
#endif

#endif
