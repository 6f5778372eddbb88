/* ops.h — the numeric building blocks: dot products, mat-vec, RMSNorm, RoPE, SwiGLU, q8.
 *
 * Every reduction uses the same fixed order on every target (8 partial sums by index mod 8,
 * combined pairwise in a fixed order, tail added last, all with fused multiply-add), so the
 * AVX2, NEON and portable C paths give bit-identical results. */
#ifndef LMC_OPS_H
#define LMC_OPS_H

#include <math.h>
#include <stdint.h>

#include "threads.h"

/* q8: int8 values with one float scale per group of Q8_GROUP consecutive values
 * (the last group of a row may be shorter); value = q * scale, scale = max|x| / 127. */
#define Q8_GROUP 32

static inline int q8_groups(int n) { return (n + Q8_GROUP - 1) / Q8_GROUP; }

/* Combine 8 partial sums (lane j = indices j mod 8) in the one order every path shares. */
static inline float lmc_reduce8(const float s[8]) {
    float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
    return (t0 + t2) + (t1 + t3);
}

/* roundf (half away from zero) without a library call: x - trunc(x) is exact in float */
static inline float lmc_round_away(float x) {
    float t = truncf(x);
    if (fabsf(x - t) >= 0.5f) t += x < 0.0f ? -1.0f : 1.0f;
    return t;
}

/* max(m, |x|) as fmaxf(m, fabsf(x)) gives it, without a library call */
static inline float lmc_max_abs(float m, float x) {
    float a = fabsf(x);
    return a > m ? a : m;
}

float dot_f32(const float *a, const float *b, int n);
/* x . dequant(q, scales) over n values */
float dot_q8(const float *x, const int8_t *q, const float *scales, int n);
/* y += a * x */
void axpy_f32(float *y, float a, const float *x, int n);
void axpy_q8(float *y, float a, const int8_t *q, const float *scales, int n);
/* q[i] = clamp(lmc_round_away(x[i] / scale), -127, 127) for i < n (0 when scale is 0): the q8
 * rounding rule of weights, activations and the KV cache alike (AVX2: whole blocks in
 * vectors, the same bits) */
void q8_quantize_block(const float *x, int n, int8_t *q, float scale);
/* max(|x[i]|), i < n <= Q8_GROUP, as lmc_max_abs folds it from 0 */
float q8_block_max_abs(const float *x, int n);
/* per group of Q8_GROUP values: scale = max|x| / 127 (scales[g]), q = q8_quantize_block */
void quantize_q8(const float *x, int n, int8_t *q, float *scales);
void dequantize_q8(const int8_t *q, const float *scales, int n, float *out);

/* The softmax of the attention kernels (every one of them uses these, so their outputs agree
 * bit for bit; the plain reference keeps libm's expf).
 * lmc_expf: e^x within about 1 ulp of expf, the same operations on every target and in every
 * vector lane; 0 below -87.34 (no denormals), NaN stays NaN. */
float lmc_expf(float x);
/* s[p] = lmc_expf(s[p] - m) for p < n; returns their sum: 8 partial sums by index mod 8,
 * lmc_reduce8, the tail added in order */
float exp_sum(float *s, int n, float m);
/* s[p] *= scale for p < n; returns the largest (NaN passed over; -inf when n = 0) */
float scale_max(float *s, int n, float scale);

void rmsnorm(float *out, const float *x, const float *weight, int n, float eps);
/* rotate_half RoPE on one head: pairs (i, i + d/2) rotated by the angle pos * inv_freq[i] */
void rope_apply(float *vec, int head_dim, const float *cos_row, const float *sin_row);
/* out = silu(gate) * up */
void swiglu(float *out, const float *gate, const float *up, int n);
/* index of the largest value; ties -> lowest index */
int argmax(const float *x, int n);

/* SIMD features compiled in, as a JSON array body: "\"avx2\", \"fma\"" */
const char *simd_features(void);

#endif
