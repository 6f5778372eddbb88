/* ops.c — see ops.h */
#include "ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#if defined(__AVX2__) && defined(__FMA__)
#define LMC_AVX2 1
#include <immintrin.h>
#elif defined(__ARM_NEON)
#define LMC_NEON 1
#include <arm_neon.h>
#endif

const char *simd_features(void) {
#if defined(LMC_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "\"avx2\", \"fma\", \"avx512\", \"vnni\"";
#elif defined(LMC_AVX2) && defined(__AVX512F__)
    return "\"avx2\", \"fma\", \"avx512\"";
#elif defined(LMC_AVX2)
    return "\"avx2\", \"fma\"";
#elif defined(LMC_NEON) && defined(__ARM_FEATURE_MATMUL_INT8)
    return "\"neon\", \"dotprod\", \"i8mm\"";
#elif defined(LMC_NEON) && defined(__ARM_FEATURE_DOTPROD)
    return "\"neon\", \"dotprod\"";
#elif defined(LMC_NEON)
    return "\"neon\"";
#else
    return "";
#endif
}

#if defined(LMC_AVX2)
/* ---------------------------------------------------------------- q8 blocks in vectors */

/* max(m, |x[i]|) over a block of 32, as lmc_max_abs folds it (max_ps(a, m) = a > m ? a : m
 * per lane, and lanes combine by the same rule: the same result in any order) */
static inline float max_abs32(const float *x, float m) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 acc = _mm256_set1_ps(m);
    for (int i = 0; i < 32; i += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), acc);
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
    return m;
}
/* q[i] = clamp(lmc_round_away(x[i] * inv), -127, 127) for a block of 32: truncate, then step
 * away from zero when the dropped fraction is >= 0.5 (both exact), as lmc_round_away */
static inline void quantize32(const float *x, float inv, int8_t *q) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(127.0f);
    __m256i r32[4];
    for (int k = 0; k < 4; k++) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), _mm256_set1_ps(inv));
        __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        __m256 step = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(v, t), abs_mask), half, _CMP_GE_OQ), one);
        t = _mm256_add_ps(t, _mm256_or_ps(step, _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)))));
        t = _mm256_min_ps(_mm256_max_ps(t, _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
        r32[k] = _mm256_cvtps_epi32(t); /* already whole numbers: exact */
    }
    /* int32 -> int16 -> int8 packs work within 128-bit lanes: restore the order after */
    __m256i w16a = _mm256_packs_epi32(r32[0], r32[1]), w16b = _mm256_packs_epi32(r32[2], r32[3]);
    __m256i w8 = _mm256_packs_epi16(w16a, w16b);
    w8 = _mm256_permutevar8x32_epi32(w8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, w8);
}
#endif

/* ---------------------------------------------------------------- reductions */

float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    float s[8];
#if defined(LMC_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    _mm256_storeu_ps(s, acc);
#elif defined(LMC_NEON)
    float32x4_t lo = vdupq_n_f32(0), hi = vdupq_n_f32(0);
    for (; i + 8 <= n; i += 8) {
        lo = vfmaq_f32(lo, vld1q_f32(a + i), vld1q_f32(b + i));
        hi = vfmaq_f32(hi, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    }
    vst1q_f32(s, lo);
    vst1q_f32(s + 4, hi);
#else
    for (int j = 0; j < 8; j++) s[j] = 0.0f;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] = fmaf(a[i + j], b[i + j], s[j]);
#endif
    float r = lmc_reduce8(s);
    for (; i < n; i++) r = fmaf(a[i], b[i], r);
    return r;
}

/* one q8 group (up to 32 values): x . q, same lane order as dot_f32 */
static inline float dot_q8_group(const float *x, const int8_t *q, int n) {
    int i = 0;
    float s[8];
#if defined(LMC_AVX2)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m128i q8 = _mm_loadl_epi64((const __m128i *)(q + i));
        __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), qf, acc);
    }
    _mm256_storeu_ps(s, acc);
#elif defined(LMC_NEON)
    float32x4_t lo = vdupq_n_f32(0), hi = vdupq_n_f32(0);
    for (; i + 8 <= n; i += 8) {
        int16x8_t q16 = vmovl_s8(vld1_s8(q + i));
        float32x4_t qlo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q16)));
        float32x4_t qhi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(q16)));
        lo = vfmaq_f32(lo, vld1q_f32(x + i), qlo);
        hi = vfmaq_f32(hi, vld1q_f32(x + i + 4), qhi);
    }
    vst1q_f32(s, lo);
    vst1q_f32(s + 4, hi);
#else
    for (int j = 0; j < 8; j++) s[j] = 0.0f;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] = fmaf(x[i + j], (float)q[i + j], s[j]);
#endif
    float r = lmc_reduce8(s);
    for (; i < n; i++) r = fmaf(x[i], (float)q[i], r);
    return r;
}

float dot_q8(const float *x, const int8_t *q, const float *scales, int n) {
    float r = 0.0f;
    for (int g = 0, i = 0; i < n; g++, i += Q8_GROUP) {
        int len = n - i < Q8_GROUP ? n - i : Q8_GROUP;
        r = fmaf(scales[g], dot_q8_group(x + i, q + i, len), r);
    }
    return r;
}

void axpy_f32(float *y, float a, const float *x, int n) {
    int i = 0;
#if defined(LMC_AVX2)
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#elif defined(LMC_NEON)
    float32x4_t va = vdupq_n_f32(a);
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i)));
#endif
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

void axpy_q8(float *y, float a, const int8_t *q, const float *scales, int n) {
    for (int g = 0, i0 = 0; i0 < n; g++, i0 += Q8_GROUP) {
        int end = n - i0 < Q8_GROUP ? n : i0 + Q8_GROUP;
        float as = a * scales[g];
        int i = i0;
#if defined(LMC_AVX2)
        __m256 va = _mm256_set1_ps(as);
        for (; i + 8 <= end; i += 8) {
            __m256 qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + i))));
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, qf, _mm256_loadu_ps(y + i)));
        }
#elif defined(LMC_NEON)
        float32x4_t va = vdupq_n_f32(as);
        for (; i + 8 <= end; i += 8) {
            int16x8_t q16 = vmovl_s8(vld1_s8(q + i));
            float32x4_t qlo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(q16)));
            float32x4_t qhi = vcvtq_f32_s32(vmovl_s16(vget_high_s16(q16)));
            vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, qlo));
            vst1q_f32(y + i + 4, vfmaq_f32(vld1q_f32(y + i + 4), va, qhi));
        }
#endif
        for (; i < end; i++) y[i] = fmaf(as, (float)q[i], y[i]);
    }
}

void q8_quantize_block(const float *x, int n, int8_t *q, float scale) {
    float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
#if defined(LMC_AVX2)
    if (n == Q8_GROUP) { /* whole blocks in vectors: the activations of every q8 product */
        quantize32(x, inv, q);
        return;
    }
#endif
    for (int i = 0; i < n; i++) {
        float r = lmc_round_away(x[i] * inv);
        q[i] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
    }
}

float q8_block_max_abs(const float *x, int n) {
#if defined(LMC_AVX2)
    if (n == Q8_GROUP) return max_abs32(x, 0.0f);
#endif
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = lmc_max_abs(amax, x[i]);
    return amax;
}

void quantize_q8(const float *x, int n, int8_t *q, float *scales) {
    for (int g = 0, i0 = 0; i0 < n; g++, i0 += Q8_GROUP) {
        int len = n - i0 < Q8_GROUP ? n - i0 : Q8_GROUP;
        scales[g] = q8_block_max_abs(x + i0, len) / 127.0f;
        q8_quantize_block(x + i0, len, q + i0, scales[g]);
    }
}

void dequantize_q8(const int8_t *q, const float *scales, int n, float *out) {
    for (int i = 0; i < n; i++) out[i] = (float)q[i] * scales[i / Q8_GROUP];
}

/* ---------------------------------------------------------------- softmax pieces */

/* lmc_expf: e^x = 2^n e^r, n = x / ln 2 rounded to nearest (the magic number's addition
 * rounds), r = x - n ln 2 in two parts (exact), e^r = 1 + r + r^2 p(r) with p of degree 5
 * (Cephes' expf coefficients), all by fused multiply-adds; 2^n is built in the exponent bits.
 * Below EXP_MIN (where e^x is no longer a normal float) it gives 0, above EXP_MAX e^EXP_MAX;
 * NaN stays NaN. */
#define EXP_MIN (-87.33654f)
#define EXP_MAX 88.0f
#define EXP_ROUND 12582912.0f /* 1.5 * 2^23: x + it - it is x rounded to an integer */
#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

float lmc_expf(float x) {
    if (!(x >= EXP_MIN)) return x != x ? x : 0.0f;
    if (x > EXP_MAX) x = EXP_MAX;
    float n = fmaf(x, EXP_LOG2E, EXP_ROUND) - EXP_ROUND;
    float r = fmaf(n, -EXP_LN2_LO, fmaf(n, -EXP_LN2_HI, x));
    float p = fmaf(fmaf(fmaf(fmaf(fmaf(EXP_P0, r, EXP_P1), r, EXP_P2), r, EXP_P3), r, EXP_P4), r, EXP_P5);
    float y = fmaf(p, r * r, r) + 1.0f;
    int32_t bits = ((int32_t)n + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#if defined(LMC_AVX2)
/* lmc_expf in 8 lanes: the same operations */
static inline __m256 exp8(__m256 x) {
    __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(EXP_MIN), _CMP_GE_OQ);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 xc = _mm256_min_ps(x, _mm256_set1_ps(EXP_MAX));
    __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(EXP_LOG2E), _mm256_set1_ps(EXP_ROUND)),
                             _mm256_set1_ps(EXP_ROUND));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_HI), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_P0), r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(bits)), keep);
    return _mm256_blendv_ps(e, x, nan);
}
#endif

float exp_sum(float *s, int n, float m) {
    int p = 0;
    float lanes[8];
#if defined(LMC_AVX2)
    __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(m);
    for (; p + 8 <= n; p += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), mv));
        _mm256_storeu_ps(s + p, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
#else
    for (int j = 0; j < 8; j++) lanes[j] = 0.0f;
    for (; p + 8 <= n; p += 8)
        for (int j = 0; j < 8; j++) {
            s[p + j] = lmc_expf(s[p + j] - m);
            lanes[j] += s[p + j];
        }
#endif
    float sum = lmc_reduce8(lanes);
    for (; p < n; p++) {
        s[p] = lmc_expf(s[p] - m);
        sum += s[p];
    }
    return sum;
}

float scale_max(float *s, int n, float scale) {
    int p = 0;
    float max = -INFINITY;
#if defined(LMC_AVX2)
    __m256 acc = _mm256_set1_ps(-INFINITY), sv = _mm256_set1_ps(scale);
    for (; p + 8 <= n; p += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + p), sv);
        _mm256_storeu_ps(s + p, v);
        acc = _mm256_max_ps(v, acc); /* v > acc ? v : acc: a NaN score is passed over */
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    for (int j = 0; j < 8; j++) max = lanes[j] > max ? lanes[j] : max;
#endif
    for (; p < n; p++) {
        s[p] *= scale;
        if (s[p] > max) max = s[p];
    }
    return max;
}

/* ---------------------------------------------------------------- layers */

void rmsnorm(float *out, const float *x, const float *weight, int n, float eps) {
    /* as transformers: mean of squares in f32, x * rsqrt(mean + eps), then times weight */
    float ss = dot_f32(x, x, n) / (float)n;
    float inv = 1.0f / sqrtf(ss + eps);
    for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

void rope_apply(float *vec, int head_dim, const float *cos_row, const float *sin_row) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = vec[i], b = vec[i + half];
        /* x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1) */
        vec[i] = a * cos_row[i] - b * sin_row[i];
        vec[i + half] = b * cos_row[i] + a * sin_row[i];
    }
}

void swiglu(float *out, const float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = (g / (1.0f + expf(-g))) * up[i];
    }
}

int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}
