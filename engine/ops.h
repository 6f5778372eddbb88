/* ops.h — the numeric building blocks: dot products, mat-vec, RMSNorm, RoPE, SwiGLU, q8.
 *
 * Every reduction uses the same fixed order on every target (8 partial sums by index mod 8,
 * combined pairwise in a fixed order, tail added last, all with fused multiply-add), so the
 * AVX2, NEON and portable C paths give bit-identical results. */
#ifndef LMC_OPS_H
#define LMC_OPS_H

#include <stdint.h>

#include "threads.h"

/* q8: int8 values with one float scale per group of Q8_GROUP consecutive values
 * (the last group of a row may be shorter); value = q * scale, scale = max|x| / 127. */
#define Q8_GROUP 32

static inline int q8_groups(int n) { return (n + Q8_GROUP - 1) / Q8_GROUP; }

float dot_f32(const float *a, const float *b, int n);
/* x . dequant(q, scales) over n values */
float dot_q8(const float *x, const int8_t *q, const float *scales, int n);
/* y += a * x */
void axpy_f32(float *y, float a, const float *x, int n);
void axpy_q8(float *y, float a, const int8_t *q, const float *scales, int n);
void quantize_q8(const float *x, int n, int8_t *q, float *scales);
void dequantize_q8(const int8_t *q, const float *scales, int n, float *out);

/* A weight matrix [rows x cols], row-major, either f32 or q8 (groups along a row). */
typedef struct {
    int rows, cols;
    float *f;      /* f32 weights, or NULL */
    int8_t *q;     /* q8 values, or NULL */
    float *scales; /* q8 scales [rows x q8_groups(cols)] */
    int owns_f;    /* 0 when f aliases another matrix (tied embeddings) */
} Mat;

/* out[rows] = W x; rows are split over the pool (each row is computed by one thread only) */
void matvec(float *out, const Mat *w, const float *x, ThreadPool *pool);
void mat_free(Mat *m);

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
