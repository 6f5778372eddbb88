/* rows.c — attention's row products (see matmul.h): key scores (dot_rows_f32*) by the weight
 * tiles of tiles.h, value sums (axpy_rows_f32*) by columns held in registers across the rows. */
#include <stddef.h>

#include "matmul.h"
#include "tiles.h"

/* The value sums' vectors: 16 columns at v4, 8 otherwise. Each column is its own sum (a fused
 * multiply-add per row, rows in order), so the width changes no bit. vrow_load_n / _store_n
 * take the first k <= ROW_LANES columns (k < ROW_LANES at v4 only: masked, the rest zero) */
#if defined(LMC_AVX512_TILES)
#define ROW_LANES 16
typedef __m512 vrow;
ALWAYS_INLINE vrow vrow_load_n(const float *p, int k) {
    return k == ROW_LANES ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << k) - 1), p);
}
ALWAYS_INLINE void vrow_store_n(float *p, vrow a, int k) {
    if (k == ROW_LANES) _mm512_storeu_ps(p, a);
    else _mm512_mask_storeu_ps(p, (__mmask16)((1u << k) - 1), a);
}
ALWAYS_INLINE vrow vrow_set1(float a) { return _mm512_set1_ps(a); }
ALWAYS_INLINE vrow vrow_fma(vrow a, vrow b, vrow c) { return _mm512_fmadd_ps(a, b, c); }
#else
#define ROW_LANES 8
typedef v8 vrow;
ALWAYS_INLINE vrow vrow_load_n(const float *p, int k) { return (void)k, v8_load(p); }
ALWAYS_INLINE void vrow_store_n(float *p, vrow a, int k) { (void)k, v8_store(p, a); }
ALWAYS_INLINE vrow vrow_set1(float a) { return v8_set1(a); }
ALWAYS_INLINE vrow vrow_fma(vrow a, vrow b, vrow c) { return v8_fma(a, b, c); }
#endif

/* y[u][c0 .. c0 + ROW_LANES·V) of NY vectors held in V x NY registers across rows r0 .. r1 (a
 * pass over the rows per chunk of columns, so rows 4 KiB apart do not thrash L1); the last
 * vector takes `last` columns */
ALWAYS_INLINE void axpy_rows_chunk(const int V, const int NY, float *const *y, const float *const *a, int c0,
                                   int last, const float *rows, size_t stride, int r0, int r1) {
    vrow acc[8][3];
#define LANES(j) ((j) == V - 1 ? last : ROW_LANES)
    for (int u = 0; u < NY; u++)
        for (int j = 0; j < V; j++) acc[j][u] = vrow_load_n(y[u] + c0 + ROW_LANES * j, LANES(j));
    for (int r = r0; r < r1; r++) {
        const float *row = rows + (size_t)r * stride + c0;
        vrow rv[8];
        for (int j = 0; j < V; j++) rv[j] = vrow_load_n(row + ROW_LANES * j, LANES(j));
        for (int u = 0; u < NY; u++) {
            vrow ar = vrow_set1(a[u][r]);
            for (int j = 0; j < V; j++) acc[j][u] = vrow_fma(ar, rv[j], acc[j][u]);
        }
    }
    for (int u = 0; u < NY; u++)
        for (int j = 0; j < V; j++) vrow_store_n(y[u] + c0 + ROW_LANES * j, acc[j][u], LANES(j));
#undef LANES
}

/* NY <= 3 vectors over the same rows r0 .. r1: 8 registers of columns a pass for one vector, 4
 * for several (at most 12 accumulators); at v4 the last columns (n % 16) in one masked vector,
 * otherwise n % 8 one by one */
ALWAYS_INLINE void axpy_rows_x(const int NY, float *const *y, const float *const *a, const float *rows,
                               size_t stride, int r0, int r1, int n) {
    const int V = NY == 1 ? 8 : 4;
    int i = 0;
    for (; i + ROW_LANES * V <= n; i += ROW_LANES * V) axpy_rows_chunk(V, NY, y, a, i, ROW_LANES, rows, stride, r0, r1);
    for (; i + ROW_LANES <= n; i += ROW_LANES) axpy_rows_chunk(1, NY, y, a, i, ROW_LANES, rows, stride, r0, r1);
#if defined(LMC_AVX512_TILES)
    if (i < n) axpy_rows_chunk(1, NY, y, a, i, n - i, rows, stride, r0, r1);
#else
    for (; i < n; i++)
        for (int u = 0; u < NY; u++) {
            float v = y[u][i];
            for (int r = r0; r < r1; r++) v = fmaf(a[u][r], rows[(size_t)r * stride + i], v);
            y[u][i] = v;
        }
#endif
}

void axpy_rows_f32(float *y, const float *a, const float *rows, size_t stride, int count, int n) {
    axpy_rows_x(1, &y, &a, rows, stride, 0, count, n);
}

void axpy_rows_f32_x(float *const *y, const float *const *a, const int *count, int ny, const float *rows,
                     size_t stride, int n) {
    for (int u0 = 0; u0 < ny; u0 += 3) {
        int nu = ny - u0 < 3 ? ny - u0 : 3, common = count[u0];
        for (int u = u0 + 1; u < u0 + nu; u++)
            if (count[u] < common) common = count[u];
        /* the rows every vector of the group has together, then each one's own rest: each
         * element still takes its rows in order */
        if (nu == 3) axpy_rows_x(3, y + u0, a + u0, rows, stride, 0, common, n);
        else if (nu == 2) axpy_rows_x(2, y + u0, a + u0, rows, stride, 0, common, n);
        else axpy_rows_x(1, y + u0, a + u0, rows, stride, 0, common, n);
        for (int u = u0; u < u0 + nu; u++)
            if (count[u] > common) axpy_rows_x(1, y + u, a + u, rows, stride, common, count[u], n);
    }
}

void dot_rows_f32(const float *x, const float *rows, size_t stride, int count, int n, float *out) {
    dot_rows_f32_x(x, 0, 1, rows, stride, count, n, out, 0);
}

void dot_rows_f32_x(const float *x, size_t xs, int nx, const float *rows, size_t stride, int count, int n,
                    float *out, size_t os) {
#define DOT_TILE(R, TT) \
    tile_f32(R, TT, 0, 0, rows + (size_t)i * stride, stride, x + (size_t)t * xs, xs, n, out + (size_t)t * os + i, os)
#define DOT_TOKENS(R)                                                    \
    do {                                                                 \
        int t = 0;                                                       \
        for (; t + TILE_TOKENS <= nx; t += TILE_TOKENS) DOT_TILE(R, TILE_TOKENS); \
        if (nx - t == 2) DOT_TILE(R, 2);                                 \
        else if (nx - t == 1) DOT_TILE(R, 1);                            \
    } while (0)
    int i = 0;
    for (; i + TILE_ROWS <= count; i += TILE_ROWS) DOT_TOKENS(TILE_ROWS);
    for (; i < count; i++) DOT_TOKENS(1);
#undef DOT_TOKENS
#undef DOT_TILE
}
