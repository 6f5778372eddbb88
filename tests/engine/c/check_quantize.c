/* check_quantize.c — the engine's q8 quantiser (quantize_q8, ops.c: whole blocks in vectors on
 * AVX2) against the scalar rule written out here: per block of 32, scale = max|x| / 127 and
 * q = clamp(round half away from zero(x / scale), -127, 127). Random blocks, blocks whose
 * values land exactly on a half after scaling, tiny scales, zeros and a partial last block.
 * Exit 0: every value and scale agreed; 1: a mismatch (printed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops.h"

#define N (3 * Q8_GROUP + 7) /* three whole blocks and a partial one */
#define GROUPS ((N + Q8_GROUP - 1) / Q8_GROUP)

static void reference(const float *x, int8_t *q, float *scales) {
    for (int g = 0; g < GROUPS; g++) {
        int i0 = g * Q8_GROUP, end = i0 + Q8_GROUP < N ? i0 + Q8_GROUP : N;
        float amax = 0.0f;
        for (int i = i0; i < end; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
        float scale = amax / 127.0f, inv = scale > 0.0f ? 1.0f / scale : 0.0f;
        scales[g] = scale;
        for (int i = i0; i < end; i++) {
            float v = x[i] * inv, t = truncf(v);
            if (fabsf(v - t) >= 0.5f) t += v < 0.0f ? -1.0f : 1.0f;
            q[i] = (int8_t)(t > 127.0f ? 127 : t < -127.0f ? -127 : (int)t);
        }
    }
}

int main(void) {
    srand(1);
    long rows = 0, bad = 0;
    for (int it = 0; it < 30000; it++, rows++) {
        float x[N];
        for (int i = 0; i < N; i++) {
            float u = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
            switch (it % 4) {
            case 0: x[i] = u * 100.0f; break;
            /* 127 fixes the scale at exactly 1, the rest are whole numbers or exact halves */
            case 1: x[i] = i % Q8_GROUP == 0 ? 127.0f : (float)(rand() % 253 - 126) * 0.5f; break;
            case 2: x[i] = u * 1e-30f; break;
            default: x[i] = rand() % 3 ? u * 3.0f : 0.0f; break;
            }
        }
        int8_t q[N], want_q[N];
        float scales[GROUPS], want_scales[GROUPS];
        quantize_q8(x, N, q, scales);
        reference(x, want_q, want_scales);
        int ok = 1;
        for (int g = 0; g < GROUPS; g++) ok &= scales[g] == want_scales[g];
        for (int i = 0; i < N; i++) ok &= q[i] == want_q[i];
        if (!ok && bad++ < 5) fprintf(stderr, "row %d differs\n", it);
    }
    printf("%ld rows, %ld mismatches\n", rows, bad);
    return bad ? 1 : 0;
}
