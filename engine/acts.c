/* acts.c — see matmul.h (QActs): the activations of a chunk of tokens as the weight products
 * take them: quantised to q8 for q8 weights, rounded to bf16 for bf16 ones (--bf16-acts). */
#include <stdint.h>
#include <string.h>

#include "matmul.h"
#include "ops.h"
#include "simd.h"
#include "util.h"

void qacts_init(QActs *a, int tokens, int max_cols, int bf16_acts) {
    a->tokens = tokens;
    a->groups = q8_groups(max_cols);
    a->q = lmc_alloc((size_t)tokens * (size_t)a->groups, Q8_GROUP, "quantised activations");
    a->d = lmc_alloc((size_t)tokens * (size_t)a->groups, sizeof(float), "quantised activations");
    a->cols = max_cols;
    a->bf = bf16_acts ? lmc_alloc((size_t)tokens * (size_t)max_cols, sizeof(float), "bf16 activations") : NULL;
    a->bf_pairs = bf16_acts ? lmc_alloc((size_t)tokens * (size_t)(max_cols / 2), sizeof(uint32_t), "bf16 activations")
                            : NULL;
}

void qacts_free(QActs *a) {
    lmc_free(a->q);
    lmc_free(a->d);
    lmc_free(a->bf);
    lmc_free(a->bf_pairs);
    memset(a, 0, sizeof *a);
}

/* lmc_f32_to_bf16(f) << 16 (round to nearest even; a NaN stays a quiet NaN) in a form the
 * compiler vectorises: calling it took 15 % of a bf16 prefill's products */
ALWAYS_INLINE uint32_t bf16_rounded_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t nearest = (x + 0x7FFF + (x >> 16 & 1)) & 0xFFFF0000u, quiet_nan = (x | 0x400000u) & 0xFFFF0000u;
    return (x & 0x7FFFFFFF) > 0x7F800000 ? quiet_nan : nearest;
}

void qacts_round_bf16(QActs *a, const float *x, int x_stride, int cols, int T, int pairs) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * (size_t)x_stride;
        float *bt = a->bf + (size_t)t * (size_t)a->cols;
        uint32_t *pt = a->bf_pairs + (size_t)t * (size_t)(a->cols / 2);
        for (int j = 0; j < cols; j++) {
            uint32_t bits = bf16_rounded_bits(xt[j]);
            memcpy(bt + j, &bits, 4);
        }
        if (!pairs) continue;
        for (int j = 0; j + 16 <= cols; j += 16)
            for (int i = 0; i < 8; i++) { /* the rounded values' top halves, column j high */
                uint32_t high, low;
                memcpy(&high, bt + j + i, 4);
                memcpy(&low, bt + j + 8 + i, 4);
                pt[j / 2 + i] = high | low >> 16;
            }
    }
}

void qacts_quantize(QActs *a, const float *x, int x_stride, int cols, int T) {
    for (int t = 0; t < T; t++) {
        int8_t *q = a->q + (size_t)t * (size_t)a->groups * Q8_GROUP;
        memset(q, 0, (size_t)q8_groups(cols) * Q8_GROUP);
        quantize_q8(x + (size_t)t * (size_t)x_stride, cols, q, a->d + (size_t)t * (size_t)a->groups);
    }
}
