/* check_rows.c — attention's row products (matmul.c) against their rule written out, bit for bit:
 * - dot_rows_f32_x: out[t][i] = 8 partial sums of x_t[c]·row_i[c] by c mod 8 in column order
 *   (fmaf) over the first n & ~7 columns, lmc_reduce8, then the tail columns in order;
 * - axpy_rows_f32_x: y[u][c] = fmaf(a[u][r], row_r[c], y[u][c]) for r < count[u] in order,
 *   and nothing past y[u][n - 1] written.
 * Widths 0-150 (every chunk and remainder of the 8- and 16-lane paths), row counts 0-9 (quads
 * and single rows), 1-7 vectors (tiles of 3, 2 and 1; groups of 3 and their own rests), rows
 * a stride apart that is not a multiple of 8. Exit 0 and one summary line; 1 and the first
 * mismatch. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "matmul.h"
#include "ops.h"
#include "check_random.h"

#define MAX_N 150
#define MAX_ROWS 9
#define MAX_VECS 7
#define STRIDE (MAX_N + 5)
#define GUARD 16

static int fail(const char *what, int n, int count, int vecs) {
    printf("mismatch: %s, width %d, %d rows (axpy: vector u has (that + 4u) %% 10), %d vectors\n", what, n, count, vecs);
    return 1;
}

static float dot_rule(const float *x, const float *row, int n) {
    float s[8] = {0};
    int n8 = n & ~7;
    for (int c = 0; c < n8; c++) s[c % 8] = fmaf(x[c], row[c], s[c % 8]);
    float r = lmc_reduce8(s);
    for (int c = n8; c < n; c++) r = fmaf(x[c], row[c], r);
    return r;
}

int main(void) {
    static float rows[MAX_ROWS * STRIDE], x[MAX_VECS * STRIDE], a[MAX_VECS][MAX_ROWS];
    static float y0[MAX_VECS][MAX_N + GUARD], y[MAX_VECS][MAX_N + GUARD], want[MAX_VECS][MAX_N + GUARD];
    static float out[MAX_VECS * MAX_ROWS];
    unsigned seed = 7;
    for (int i = 0; i < MAX_ROWS * STRIDE; i++) rows[i] = uniform(&seed);
    for (int i = 0; i < MAX_VECS * STRIDE; i++) x[i] = uniform(&seed);
    for (int u = 0; u < MAX_VECS; u++) {
        for (int r = 0; r < MAX_ROWS; r++) a[u][r] = uniform(&seed);
        for (int c = 0; c < MAX_N + GUARD; c++) y0[u][c] = uniform(&seed);
    }
    long checked = 0;
    for (int n = 0; n <= MAX_N; n++)
        for (int count = 0; count <= MAX_ROWS; count++)
            for (int vecs = 1; vecs <= MAX_VECS; vecs++) {
                dot_rows_f32_x(x, STRIDE, vecs, rows, STRIDE, count, n, out, MAX_ROWS);
                for (int t = 0; t < vecs; t++)
                    for (int i = 0; i < count; i++, checked++) {
                        float w = dot_rule(x + t * STRIDE, rows + i * STRIDE, n);
                        if (memcmp(&w, &out[t * MAX_ROWS + i], sizeof w) != 0) return fail("dot_rows_f32_x", n, count, vecs);
                    }
                float *yp[MAX_VECS];
                const float *ap[MAX_VECS];
                int counts[MAX_VECS];
                memcpy(y, y0, sizeof y);
                memcpy(want, y0, sizeof want);
                for (int u = 0; u < vecs; u++) {
                    counts[u] = (count + 4 * u) % (MAX_ROWS + 1); /* groups of 3 with their own rests */
                    yp[u] = y[u];
                    ap[u] = a[u];
                    for (int c = 0; c < n; c++)
                        for (int r = 0; r < counts[u]; r++) want[u][c] = fmaf(a[u][r], rows[r * STRIDE + c], want[u][c]);
                }
                axpy_rows_f32_x(yp, ap, counts, vecs, rows, STRIDE, n);
                checked += (long)vecs * n;
                if (memcmp(y, want, sizeof y) != 0) return fail("axpy_rows_f32_x", n, count, vecs);
            }
    printf("%ld sums checked: widths 0-%d, 0-%d rows, 1-%d vectors agree bit for bit\n", checked, MAX_N, MAX_ROWS,
           MAX_VECS);
    return 0;
}
