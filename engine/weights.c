/* weights.c — how weight matrices are stored: four rows at a time (f32/bf16 packed after
 * loading, q8 blocks written into their quads), q8 scales in binary16, and the half-precision
 * conversions they use (see matmul.h). */
#include <math.h>
#include <string.h>

#include "matmul.h"
#include "ops.h"
#include "safetensors.h"
#include "util.h"

/* ---------------------------------------------------------------- half precision */

uint16_t lmc_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7FFFFFFF;
    if (ax > 0x7F800000) return sign | 0x7E00;   /* NaN */
    if (ax >= 0x477FF000) return sign | 0x7C00;  /* >= 65520 rounds to infinity */
    if (ax < 0x38800000) {                       /* below 2^-14: subnormal (or zero) */
        float a;
        memcpy(&a, &ax, 4);
        return sign | (uint16_t)rintf(a * 16777216.0f); /* units of 2^-24, nearest even */
    }
    uint32_t h = ((ax >> 23) - 127 + 15) << 10 | ((ax >> 13) & 0x3FF);
    uint32_t rest = ax & 0x1FFF;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry moves into the exponent */
    return sign | (uint16_t)h;
}

uint16_t lmc_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)(x >> 16 | 0x40); /* quiet NaN */
    x += 0x7FFF + (x >> 16 & 1);
    return (uint16_t)(x >> 16);
}

/* ---------------------------------------------------------------- storage */

const char *wq_name(int wq) { return wq == WQ_Q8 ? "q8" : wq == WQ_BF16 ? "bf16" : "f32"; }

void mat_alloc_q8(Mat *m, int rows, int cols, const char *what) {
    memset(m, 0, sizeof *m);
    m->rows = rows;
    m->cols = cols;
    m->groups = q8_groups(cols);
    m->q = lmc_alloc((size_t)rows * (size_t)m->groups, Q8_GROUP, what);
    m->d = lmc_alloc((size_t)rows * (size_t)m->groups, sizeof(uint16_t), what);
}

void mat_quantize_row(Mat *m, int r, const float *row) {
    size_t row_bytes = (size_t)m->groups * Q8_GROUP;
    uint16_t *d = m->d + (size_t)r * (size_t)m->groups;
    /* in a quad, block g of this row sits between the same block of the quad's other rows */
    int in_quad = r < m->rows - m->rows % MAT_PACK_ROWS;
    int8_t *first = m->q + (in_quad ? (size_t)(r - r % MAT_PACK_ROWS) * row_bytes
                                          + (size_t)(r % MAT_PACK_ROWS) * Q8_GROUP
                                    : (size_t)r * row_bytes);
    size_t block_step = in_quad ? MAT_PACK_ROWS * Q8_GROUP : Q8_GROUP;
    for (int g = 0, i0 = 0; i0 < m->cols; g++, i0 += Q8_GROUP) {
        int n = m->cols - i0 < Q8_GROUP ? m->cols - i0 : Q8_GROUP;
        /* quantize_q8's rule with the scale rounded to half first (the value stored) */
        float scale = q8_block_max_abs(row + i0, n) / 127.0f;
        if (scale > 65504.0f) scale = 65504.0f; /* largest finite half */
        d[g] = lmc_f32_to_f16(scale);
        q8_quantize_block(row + i0, n, first + (size_t)g * block_step, lmc_f16_to_f32(d[g]));
    }
}

void mat_pack(Mat *m) {
    if (m->packed || m->q || m->rows < MAT_PACK_ROWS) return;
    size_t esize = m->h ? sizeof(uint16_t) : sizeof(float);
    size_t cols = (size_t)m->cols, n8 = cols & ~(size_t)7, quad = MAT_PACK_ROWS * cols;
    /* bf16: whole 16-column blocks pair column j with j + 8 in one 32-bit word (high, low
     * half), which widens with a mask and a shift instead of a shuffle per 8 values, and is
     * the order in which vdpbf16ps adds a word's two products (--bf16-acts) */
    size_t n16 = m->h ? cols & ~(size_t)15 : 0;
    char *base = m->h ? (char *)m->h : (char *)m->f;
    char *tmp = lmc_alloc(quad, esize, "packing a quad of rows");
    for (int r = 0; r + MAT_PACK_ROWS <= m->rows; r += MAT_PACK_ROWS) {
        char *dst = base + (size_t)r * cols * esize;
        memcpy(tmp, dst, quad * esize);
        const uint16_t *th = (const uint16_t *)tmp;
        for (size_t j = 0; j < n16; j += 16)
            for (size_t k = 0; k < MAT_PACK_ROWS; k++, dst += 16 * esize) {
                uint16_t *d = (uint16_t *)dst;
                for (size_t i = 0; i < 8; i++) {
                    d[2 * i + 1] = th[k * cols + j + i];
                    d[2 * i] = th[k * cols + j + 8 + i];
                }
            }
        for (size_t j = n16; j < n8; j += 8)
            for (size_t k = 0; k < MAT_PACK_ROWS; k++, dst += 8 * esize) memcpy(dst, tmp + (k * cols + j) * esize, 8 * esize);
        for (size_t k = 0; k < MAT_PACK_ROWS; k++, dst += (cols - n8) * esize)
            memcpy(dst, tmp + (k * cols + n8) * esize, (cols - n8) * esize);
    }
    lmc_free(tmp);
    m->packed = 1;
}

void mat_free(Mat *m) {
    lmc_free(m->f);
    lmc_free(m->h);
    lmc_free(m->q);
    lmc_free(m->d);
    memset(m, 0, sizeof *m);
}

size_t mat_bytes(const Mat *m) {
    if (m->q) return (size_t)m->rows * (size_t)m->groups * (Q8_GROUP + sizeof(uint16_t));
    if (m->h) return (size_t)m->rows * (size_t)m->cols * sizeof(uint16_t);
    return (size_t)m->rows * (size_t)m->cols * sizeof(float);
}
