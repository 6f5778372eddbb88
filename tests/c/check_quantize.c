/* check_quantize.c — the vector activation quantiser of engine/simd.h (max_abs32, quantize32)
 * against the scalar rule it replaces (lmc_max_abs, lmc_round_away, clamp to +-127), on random
 * blocks and on values that land exactly on a half after scaling. Exit 0: every block agreed;
 * 1: a mismatch (printed); 77: this build has no vector quantiser (nothing to compare). */
#include <stdio.h>
#include <stdlib.h>

#include "ops.h"
#include "simd.h"

#if defined(LMC_HAVE_QUANTIZE32)
static int8_t scalar_q(float x, float inv) {
    float r = lmc_round_away(x * inv);
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
}

int main(void) {
    srand(1);
    long blocks = 0, bad = 0;
    for (int it = 0; it < 100000; it++, blocks++) {
        float x[32];
        for (int i = 0; i < 32; i++) {
            float u = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
            switch (it % 4) {
            case 0: x[i] = u * 100.0f; break;                          /* ordinary */
            case 1: x[i] = (float)(rand() % 255 - 127) * 0.5f; break; /* exact halves */
            case 2: x[i] = u * 1e-30f; break;                          /* tiny scales */
            default: x[i] = rand() % 3 ? u * 3.0f : 0.0f; break;       /* zeros, signs */
            }
        }
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = lmc_max_abs(amax, x[i]);
        float d = amax / 127.0f, d_vec = max_abs32(x, 0.0f) / 127.0f;
        float inv = d > 0.0f ? 1.0f / d : 0.0f;
        /* case 1 again with inv = 1: every value is a whole number or exactly a half */
        float inv_used = it % 4 == 1 ? 1.0f : inv;
        int8_t q[32];
        quantize32(x, inv_used, q);
        int ok = d == d_vec;
        for (int i = 0; i < 32; i++) ok &= q[i] == scalar_q(x[i], inv_used);
        if (!ok) {
            if (bad++ < 5) fprintf(stderr, "block %d differs (scale %g vs %g)\n", it, d, d_vec);
        }
    }
    printf("%ld blocks, %ld mismatches\n", blocks, bad);
    return bad ? 1 : 0;
}
#else
int main(void) { return 77; }
#endif
