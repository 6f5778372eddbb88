/* check_softmax.c — the attention kernels' softmax pieces (ops.c) against their definitions:
 * - lmc_expf against libm's expf over [-87.3, 88] (every 1e-4 and then some), at most 2 ulp
 *   apart, relative error; and its edges: 0 below -87.34 and at -inf, NaN stays NaN;
 * - exp_sum (vectors on AVX2) against lmc_expf element by element (the same bits) and its
 *   sum against the rule written out here (8 partial sums by index mod 8, lmc_reduce8, the
 *   tail in order), for every length 0..70;
 * - scale_max against the scalar fold, NaN scores passed over.
 * Exit 0 and one summary line; 1 and the first mismatch. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static int32_t ordered(float f) { /* floats as integers in their order: ulps apart = difference */
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? INT32_MIN - i : i;
}

static int fail(const char *what, double a, double b) {
    printf("mismatch: %s: %.9g against %.9g\n", what, a, b);
    return 1;
}

int main(void) {
    long checked = 0;
    int32_t worst = 0;
    for (double x = -87.3; x <= 88.0; x += 1e-4, checked++) {
        float f = (float)x, got = lmc_expf(f), want = expf(f);
        int32_t ulps = abs(ordered(got) - ordered(want));
        if (ulps > worst) worst = ulps;
        if (ulps > 2) return fail("lmc_expf vs expf", got, want);
    }
    if (lmc_expf(-87.5f) != 0.0f || lmc_expf(-INFINITY) != 0.0f || lmc_expf(-1e30f) != 0.0f)
        return fail("lmc_expf below its range", lmc_expf(-87.5f), 0.0);
    if (!isnan(lmc_expf(NAN))) return fail("lmc_expf(NaN)", lmc_expf(NAN), NAN);
    if (lmc_expf(0.0f) != 1.0f || lmc_expf(-0.0f) != 1.0f) return fail("lmc_expf(0)", lmc_expf(0.0f), 1.0);

    srand(7);
    float s[70], e[70];
    for (int n = 0; n <= 70; n++) {
        for (int p = 0; p < n; p++) s[p] = (float)rand() / (float)RAND_MAX * 30.0f - 25.0f;
        if (n > 5) s[3] = -INFINITY; /* a masked score */
        memcpy(e, s, sizeof s);
        float m = 1.5f, sum = exp_sum(e, n, m), lanes[8] = {0};
        int n8 = n - n % 8;
        for (int p = 0; p < n; p++) {
            float want = lmc_expf(s[p] - m);
            if (memcmp(&e[p], &want, sizeof want) != 0) return fail("exp_sum element", e[p], want);
            if (p < n8) lanes[p % 8] += want;
        }
        float want = lmc_reduce8(lanes);
        for (int p = n8; p < n; p++) want += e[p];
        if (memcmp(&sum, &want, sizeof sum) != 0) return fail("exp_sum sum", sum, want);

        memcpy(e, s, sizeof s);
        if (n > 9) e[9] = NAN;
        float max = scale_max(e, n, 0.125f), fold = -INFINITY;
        for (int p = 0; p < n; p++) {
            float v = (p == 9 && n > 9) ? NAN : s[p] * 0.125f;
            if (!(isnan(v) && isnan(e[p])) && memcmp(&e[p], &v, sizeof v) != 0) return fail("scale_max element", e[p], v);
            if (v > fold) fold = v;
        }
        if (max != fold) return fail("scale_max", max, fold);
    }
    printf("lmc_expf: %ld values within %d ulp of expf; exp_sum and scale_max: lengths 0-70 agree\n",
           checked, worst);
    return 0;
}
