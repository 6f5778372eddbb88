/* matmul.c — see matmul.h.
 *
 * The kernels work on tiles of up to 4 weight rows x up to 3 tokens: each weight row loaded
 * once per tile serves every token of the tile (prefill), and in decode the 4 independent rows
 * keep the FMA units and the memory system busy. Every tile computes each of its outputs
 * exactly as the 1 x 1 tile would, so tiling never changes a bit. */
#include "matmul.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "safetensors.h"
#include "simd.h"
#include "util.h"

#define TILE_ROWS MAT_PACK_ROWS /* a tile's rows are one packed quad */
#define TILE_TOKENS 3
#define MATMUL_MAX 4 /* matrices per fused product */
/* how many row quads ahead the q8 kernel prefetches: a quad of q8 rows is only a few KiB,
 * less than memory latency x bandwidth */
#ifndef Q8_PREFETCH_QUADS
#define Q8_PREFETCH_QUADS 2
#endif
/* how far ahead a packed f32/bf16 tile prefetches, in bytes */
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 2048
#endif
/* two cache lines (prefetch never faults, so reading past the matrix is harmless) */
#define PREFETCH_NEXT(p) (__builtin_prefetch(p), __builtin_prefetch((p) + 64))

void qacts_init(QActs *a, int tokens, int max_cols) {
    a->tokens = tokens;
    a->groups = q8_groups(max_cols);
    a->q = lmc_alloc((size_t)tokens * (size_t)a->groups, Q8_GROUP, "quantised activations");
    a->d = lmc_alloc((size_t)tokens * (size_t)a->groups, sizeof(float), "quantised activations");
}

void qacts_free(QActs *a) {
    lmc_free(a->q);
    lmc_free(a->d);
    memset(a, 0, sizeof *a);
}

/* token t's activations in blocks of 32 (zero-padded), as quantize_q8 */
static void qacts_quantize(QActs *a, const float *x, int x_stride, int cols, int T) {
    for (int t = 0; t < T; t++) {
        int8_t *q = a->q + (size_t)t * (size_t)a->groups * Q8_GROUP;
        memset(q, 0, (size_t)q8_groups(cols) * Q8_GROUP);
        quantize_q8(x + (size_t)t * (size_t)x_stride, cols, q, a->d + (size_t)t * (size_t)a->groups);
    }
}

/* ---------------------------------------------------------------- tiles */

/* token t's R sums of a tile, acc[r][t], reduced into v[r] (four at a time for a whole quad:
 * the same additions) */
ALWAYS_INLINE void reduce_token(const int R, v8 acc[][TILE_TOKENS], int t, float *v) {
    if (R == TILE_ROWS) v8_reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t], v);
    else
        for (int r = 0; r < R; r++) v[r] = v8_reduce(acc[r][t]);
}

#if defined(LMC_AVX2) && defined(__AVX512F__) && defined(__AVX512DQ__)
#define LMC_AVX512_TILES 1
/* 16 bf16 values widened to f32 (a bf16 is the top half of its f32), as v8_load_bf16 */
ALWAYS_INLINE __m512 v16_load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* 16 words, each two bf16 values: the low halves give *lo, the high halves *hi, as
 * v8_load_bf16_pair */
ALWAYS_INLINE void v16_load_bf16_pair(const uint16_t *p, __m512 *lo, __m512 *hi) {
    __m512i w = _mm512_loadu_si512(p);
    *lo = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    *hi = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* AVX-512 (x86-64-v4) for a packed quad: a packed quad holds each 8 columns of its 4 rows one
 * after the other, so one 512-bit load takes the same 8 columns of two rows, and one FMA with
 * the activations repeated in both halves does the work of two 256-bit ones. Each lane still
 * sums exactly the products, in exactly the order, that lane of the 8-wide kernel sums: the
 * halves are split back into acc[r][t] and reduced as before, so the bits are the same.
 * Four plain f32 rows ws values apart (!PK: attention's keys) take the same path, each zmm
 * put together from two rows' 8 columns (a 256-bit load and an insert).
 * Columns up to n8 (a multiple of 8); returns n8. */
ALWAYS_INLINE int quad_avx512(const int TT, const int BF, const int PK, const void *wp, size_t ws, const float *x,
                              size_t xs, int n8, v8 acc[][TILE_TOKENS]) {
    const float *w = wp;
    const uint16_t *wh = wp;
    const size_t wsize = BF ? sizeof(uint16_t) : sizeof(float);
    __m512 a01[TILE_TOKENS], a23[TILE_TOKENS]; /* rows 0 | 1 and 2 | 3, 8 lanes each */
    for (int t = 0; t < TT; t++) a01[t] = a23[t] = _mm512_setzero_ps();
    int i = 0;
    if (BF && PK) /* tile_f32's 16-column steps: a word pairs column j (low half) with j + 8 */
        for (; i + 16 <= n8; i += 16) {
            PREFETCH_NEXT((const char *)wp + (size_t)i * TILE_ROWS * wsize + PREFETCH_AHEAD);
            __m512 lo01, hi01, lo23, hi23;
            v16_load_bf16_pair(wh + (size_t)i * TILE_ROWS, &lo01, &hi01);
            v16_load_bf16_pair(wh + (size_t)i * TILE_ROWS + 32, &lo23, &hi23);
            for (int t = 0; t < TT; t++) {
                __m512 xa = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
                __m512 xb = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i + 8));
                a01[t] = _mm512_fmadd_ps(xb, hi01, _mm512_fmadd_ps(xa, lo01, a01[t]));
                a23[t] = _mm512_fmadd_ps(xb, hi23, _mm512_fmadd_ps(xa, lo23, a23[t]));
            }
        }
    for (; i < n8; i += 8) { /* 8 columns of each row, two rows a load */
        if (PK) PREFETCH_NEXT((const char *)wp + (size_t)i * TILE_ROWS * wsize + PREFETCH_AHEAD);
        __m512 w01, w23;
        if (!PK) {
            const float *w0 = w + i;
            w01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w0)), _mm256_loadu_ps(w0 + ws), 1);
            w23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(w0 + 2 * ws)),
                                     _mm256_loadu_ps(w0 + 3 * ws), 1);
        } else if (BF) {
            w01 = v16_load_bf16(wh + (size_t)i * TILE_ROWS);
            w23 = v16_load_bf16(wh + (size_t)i * TILE_ROWS + 16);
        } else {
            w01 = _mm512_loadu_ps(w + (size_t)i * TILE_ROWS);
            w23 = _mm512_loadu_ps(w + (size_t)i * TILE_ROWS + 16);
        }
        for (int t = 0; t < TT; t++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
            a01[t] = _mm512_fmadd_ps(xv, w01, a01[t]);
            a23[t] = _mm512_fmadd_ps(xv, w23, a23[t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        acc[0][t] = _mm512_castps512_ps256(a01[t]);
        acc[1][t] = _mm512_extractf32x8_ps(a01[t], 1);
        acc[2][t] = _mm512_castps512_ps256(a23[t]);
        acc[3][t] = _mm512_extractf32x8_ps(a23[t], 1);
    }
    return n8;
}
#endif

/* R rows of weights times TT tokens of x (stride xs) over n columns: f32, or bf16 when BF.
 * PK: the rows are one packed quad (mat_pack), read as one sequential stream and prefetched
 * ahead; otherwise R plain rows ws values apart (attention's keys, a matrix's rows % 4 last
 * rows), which the caller prefetches if anyone does. Same operations in the same order
 * either way: the layout changes no bit. */
ALWAYS_INLINE void tile_f32(const int R, const int TT, const int BF, const int PK, const void *wp, size_t ws,
                            const float *x, size_t xs, int n, float *out, size_t os) {
    const float *w = wp;
    const uint16_t *wh = wp;
    const size_t wsize = BF ? sizeof(uint16_t) : sizeof(float);
    const int n8 = n & ~7;
    /* where row r's SIMD columns i.. and its tail columns j >= n8 are */
#define W_AT(r, i) (PK ? (size_t)(i) * TILE_ROWS + (size_t)(r) * 8 : (size_t)(r) * ws + (size_t)(i))
#define W_TAIL(r, j) (PK ? (size_t)n8 * TILE_ROWS + (size_t)(r) * (size_t)(n - n8) + (size_t)((j) - n8) \
                         : (size_t)(r) * ws + (size_t)(j))
    v8 acc[TILE_ROWS][TILE_TOKENS];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = v8_zero();
    int i = 0;
#if defined(LMC_AVX512_TILES)
    if (R == TILE_ROWS && (PK || !BF)) i = quad_avx512(TT, BF, PK, wp, ws, x, xs, n8, acc);
#endif
    if (BF && PK) /* 16 columns a step: columns i + j and i + 8 + j share a word (mat_pack) */
        for (; i + 16 <= n8; i += 16) {
            PREFETCH_NEXT((const char *)wp + W_AT(0, i) * wsize + PREFETCH_AHEAD);
            v8 xa[TILE_TOKENS], xb[TILE_TOKENS];
            for (int t = 0; t < TT; t++) {
                xa[t] = v8_load(x + t * xs + i);
                xb[t] = v8_load(x + t * xs + i + 8);
            }
            for (int r = 0; r < R; r++) {
                v8 lo, hi;
                v8_load_bf16_pair(wh + (size_t)i * TILE_ROWS + (size_t)r * 16, &lo, &hi);
                for (int t = 0; t < TT; t++) acc[r][t] = v8_fma(xb[t], hi, v8_fma(xa[t], lo, acc[r][t]));
            }
        }
    for (; i < n8; i += 8) {
        /* the packed stream runs on into the next quad: fetch PREFETCH_AHEAD bytes ahead of
         * the tile (the hardware prefetcher starts over at every 4 KiB page) */
        if (PK) PREFETCH_NEXT((const char *)wp + W_AT(0, i) * wsize + PREFETCH_AHEAD);
        v8 xv[TILE_TOKENS];
        for (int t = 0; t < TT; t++) xv[t] = v8_load(x + t * xs + i);
        for (int r = 0; r < R; r++) {
            v8 wv = BF ? v8_load_bf16(wh + W_AT(r, i)) : v8_load(w + W_AT(r, i));
            for (int t = 0; t < TT; t++) acc[r][t] = v8_fma(xv[t], wv, acc[r][t]);
        }
    }
    for (int t = 0; t < TT; t++) {
        float v[TILE_ROWS];
        reduce_token(R, acc, t, v);
        for (int r = 0; r < R; r++) {
            for (int j = n8; j < n; j++)
                v[r] = fmaf(x[t * xs + j], BF ? lmc_bf16_to_f32(wh[W_TAIL(r, j)]) : w[W_TAIL(r, j)], v[r]);
            out[t * os + r] = v[r];
        }
    }
#undef W_AT
#undef W_TAIL
}

/* one block of R rows (w: row r's block at r * Q8_GROUP, as a quad interleaves them, or one
 * row) and TT tokens (x: token t's block at t * xqs) into the accumulators: acc[r][t] +=
 * scale(r, t) * the block's integer lane sums, scale(r, t) at s[r * sr + t * st] */
ALWAYS_INLINE void block_acc(const int R, const int TT, const int8_t *w, const int8_t *x, size_t xqs,
                             const float *s, size_t sr, size_t st, v8 acc[][TILE_TOKENS]) {
    qblock xb[TILE_TOKENS];
    for (int t = 0; t < TT; t++) xb[t] = qblock_load(x + t * xqs);
#if defined(LMC_QBLOCK_PAIRS)
    if (R % 2 == 0) { /* i8mm: rows in pairs, each token split once */
        for (int t = 0; t < TT; t++) {
            qsplit xs = qblock_split(xb[t]);
            for (int r = 0; r < R; r += 2) {
                v8i d0, d1;
                qblock_dot_pair(&xs, qblock_load(w + (size_t)r * Q8_GROUP),
                                qblock_load(w + (size_t)(r + 1) * Q8_GROUP), &d0, &d1);
                acc[r][t] = v8_fma(v8_broadcast(s + r * sr + t * st), v8_from_i(d0), acc[r][t]);
                acc[r + 1][t] = v8_fma(v8_broadcast(s + (r + 1) * sr + t * st), v8_from_i(d1), acc[r + 1][t]);
            }
        }
        return;
    }
#endif
    for (int r = 0; r < R; r++) {
        qblock wb = qblock_load(w + (size_t)r * Q8_GROUP);
        for (int t = 0; t < TT; t++)
            acc[r][t] = v8_fma(v8_broadcast(s + r * sr + t * st), v8_from_i(qblock_dot(xb[t], wb)), acc[r][t]);
    }
}

/* R q8 rows (wqs bytes each, scales wd stride wds) times TT quantised tokens: a whole quad
 * (R = 4, its blocks interleaved, see Mat) or one plain row (R = 1) */
ALWAYS_INLINE void tile_q8(const int R, const int TT, const int8_t *wq, size_t wqs, const uint16_t *wd,
                           size_t wds, const int8_t *xq, size_t xqs, const float *xd, size_t xds, int groups,
                           float *out, size_t os) {
    /* block g of row r: a quad is one stream, block after block; a plain row is one row */
#define WQ_AT(r, g) (((size_t)(g) * (size_t)R + (size_t)(r)) * Q8_GROUP)
    v8 acc[TILE_ROWS][TILE_TOKENS];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = v8_zero();
    int g = 0;
    /* 8 blocks at a time: their 8 scale products (weight x activation) per row and token
     * are formed in one vector step, then each block broadcasts its own */
    for (; g + 8 <= groups; g += 8) {
        if (R == TILE_ROWS) { /* these 8 blocks of the quad Q8_PREFETCH_QUADS ahead */
            const char *next = (const char *)(wq + Q8_PREFETCH_QUADS * R * wqs) + (size_t)g * R * Q8_GROUP;
            for (int k = 0; k < 1024; k += 64) __builtin_prefetch(next + k);
            __builtin_prefetch((const char *)(wd + Q8_PREFETCH_QUADS * R * wds) + (size_t)g * 8);
        }
        float sc[TILE_ROWS][TILE_TOKENS][8];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < TT; t++) scales8(wd + r * wds + g, xd + t * xds + g, sc[r][t]);
        for (int j = 0; j < 8; j++)
            block_acc(R, TT, wq + WQ_AT(0, g + j), xq + (size_t)(g + j) * Q8_GROUP, xqs, &sc[0][0][j],
                      TILE_TOKENS * 8, 8, acc);
    }
    for (; g < groups; g++) {
        float sc[TILE_ROWS][TILE_TOKENS];
        for (int r = 0; r < R; r++) {
            float dw = half_to_f32(wd[r * wds + g]);
            for (int t = 0; t < TT; t++) sc[r][t] = dw * xd[t * xds + g];
        }
        block_acc(R, TT, wq + WQ_AT(0, g), xq + (size_t)g * Q8_GROUP, xqs, &sc[0][0], TILE_TOKENS, 1, acc);
    }
    for (int t = 0; t < TT; t++) {
        float v[TILE_ROWS];
        reduce_token(R, acc, t, v);
        for (int r = 0; r < R; r++) out[t * os + r] = v[r];
    }
#undef WQ_AT
}

/* ---------------------------------------------------------------- prefill panels */

/* A chunk of tokens (prefill) times packed f32 quads (and bf16 ones at v4: PANEL_BF16),
 * PANEL_QUADS quads (consecutive in the matrix) at a time. Three things the decode tiles do not need:
 * - the columns go in blocks of PANEL_COLS, so that a block of the quads (16 KiB) stays
 *   in L1 while every token of the chunk goes past it; a whole quad of a wide matrix (32-48
 *   KiB for Qwen3-0.6B's o and down projections) and a tile's tokens would not fit together.
 *   A tile's sums are carried from block to block unreduced (a store and a load are exact);
 * - the next quads are fetched a slice per tile while these are in use: decode's prefetch
 *   runs a fixed distance ahead in the stream, which here would leave the first tile of each
 *   quad waiting on memory for most of it;
 * - at v4 a tile takes two quads: each activation load (from L2: every token's block goes
 *   past every quad) then serves 4 FMAs of 512 bits instead of 2.
 * Each output is still computed as tile_f32 computes it (the same fused multiply-adds in the
 * same order, lmc_reduce8, then the tail), so prefill and decode agree bit for bit. */
#define PANEL_TOKENS 96 /* tokens per pass over the quads: their carried sums fit on the stack */
/* tokens per panel tile and quads per panel: at v4 a 512-bit accumulator holds two rows of a
 * token, so a tile keeps 2 x PANEL_QUADS x PANEL_TILE of them (FMA latency x FMA units needs
 * 8 or more); at v3 4 x 3 256-bit ones of one quad, as the decode tiles */
#if defined(LMC_AVX512_TILES)
#define PANEL_TILE 4
#define PANEL_QUADS 2
#define PANEL_BF16 1 /* bf16 quads by panels too (at v3 a bf16 tile's 16-column step needs
                      * more registers than there are: they stay with the tiles) */
#else
#define PANEL_TILE TILE_TOKENS
#define PANEL_QUADS 1
#define PANEL_BF16 0
#endif
#define PANEL_ROWS (PANEL_QUADS * TILE_ROWS)
#define PANEL_COLS (1024 / PANEL_QUADS) /* a block of the panel's quads: 16 KiB */

/* columns i0 .. i1 (multiples of 8, at most n & ~7; i0 of 16) of Q quads (quad q at w + q * qs
 * values: f32, or bf16 when BF, PANEL_BF16 only) times TT tokens; the sums start from zero
 * (first) or from `carry`, token t's row r (of the Q quads' 4Q) at carry[t * 4Q + r], and go
 * back to it */
ALWAYS_INLINE void panel_span(const int BF, const int Q, const int TT, const void *w, size_t qs, const float *x,
                              size_t xs, int i0, int i1, v8 *carry, int first) {
    const int R = Q * TILE_ROWS;
#if defined(LMC_AVX512_TILES)
    /* acc[p][t]: token t's rows 2p | 2p + 1, which is carry's pair of v8 there */
    __m512 acc[PANEL_ROWS / 2][PANEL_TILE];
    for (int p = 0; p < R / 2; p++)
        for (int t = 0; t < TT; t++)
            acc[p][t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps((const float *)(carry + t * R + 2 * p));
    const uint16_t *wh = w;
    int i = i0;
    if (BF) /* as quad_avx512: a word pairs column j (low half) with j + 8, lane by lane */
        for (; i + 16 <= i1; i += 16) {
            __m512 xa[PANEL_TILE], xb[PANEL_TILE];
            for (int t = 0; t < TT; t++) {
                xa[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
                xb[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i + 8));
            }
            for (int p = 0; p < R / 2; p++) {
                __m512 lo, hi;
                v16_load_bf16_pair(wh + (size_t)(p / 2) * qs + (size_t)i * TILE_ROWS + (size_t)(p % 2) * 32, &lo, &hi);
                for (int t = 0; t < TT; t++) acc[p][t] = _mm512_fmadd_ps(xb[t], hi, _mm512_fmadd_ps(xa[t], lo, acc[p][t]));
            }
        }
    for (; i < i1; i += 8) {
        __m512 xv[PANEL_TILE];
        for (int t = 0; t < TT; t++) xv[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
        for (int p = 0; p < R / 2; p++) {
            size_t at = (size_t)(p / 2) * qs + (size_t)i * TILE_ROWS + (size_t)(p % 2) * 16;
            __m512 wv = BF ? v16_load_bf16(wh + at) : _mm512_loadu_ps((const float *)w + at);
            for (int t = 0; t < TT; t++) acc[p][t] = _mm512_fmadd_ps(xv[t], wv, acc[p][t]);
        }
    }
    for (int p = 0; p < R / 2; p++)
        for (int t = 0; t < TT; t++) _mm512_storeu_ps((float *)(carry + t * R + 2 * p), acc[p][t]);
#else
    v8 acc[PANEL_ROWS][PANEL_TILE];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) acc[r][t] = first ? v8_zero() : carry[t * R + r];
    for (int i = i0; i < i1; i += 8) {
        v8 xv[PANEL_TILE];
        for (int t = 0; t < TT; t++) xv[t] = v8_load(x + t * xs + i);
        for (int r = 0; r < R; r++) {
            v8 wv = v8_load((const float *)w + (size_t)(r / TILE_ROWS) * qs + (size_t)i * TILE_ROWS + (size_t)(r % TILE_ROWS) * 8);
            for (int t = 0; t < TT; t++) acc[r][t] = v8_fma(xv[t], wv, acc[r][t]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < TT; t++) carry[t * R + r] = acc[r][t];
#endif
}

/* panel_span for Q <= PANEL_QUADS quads and TT <= PANEL_TILE tokens, known at run time only */
static void panel_tile(int BF, int Q, int TT, const void *w, size_t qs, const float *x, size_t xs, int i0, int i1,
                       v8 *carry, int first) {
#define PANEL_CASE(B, QQ, N) \
    case N: panel_span(B, QQ, N, w, qs, x, xs, i0, i1, carry, first); return;
#if PANEL_TILE == 4
#define PANEL_CASES(B, QQ) \
    switch (TT) { PANEL_CASE(B, QQ, 4) PANEL_CASE(B, QQ, 3) PANEL_CASE(B, QQ, 2) PANEL_CASE(B, QQ, 1) }
#else
#define PANEL_CASES(B, QQ) switch (TT) { PANEL_CASE(B, QQ, 3) PANEL_CASE(B, QQ, 2) PANEL_CASE(B, QQ, 1) }
#endif
#if PANEL_BF16
    if (BF && Q == 2) PANEL_CASES(1, 2)
    if (BF && Q == 1) PANEL_CASES(1, 1)
#endif
#if PANEL_QUADS == 2
    if (!BF && Q == 2) PANEL_CASES(0, 2)
#endif
    if (!BF && Q == 1) PANEL_CASES(0, 1)
    lmc_die_runtime("panel_tile: %d quads, %d tokens%s", Q, TT, BF ? ", bf16" : "");
#undef PANEL_CASES
#undef PANEL_CASE
}

/* Q packed quads at w, qs values apart (n columns; f32, or bf16 when BF), times tokens
 * x[0 .. T), T <= PANEL_TOKENS, into out[t * os + r], r < 4Q; `next` is what comes after
 * them, fetched a slice per span */
static void panel_quads(int BF, int Q, const void *w, size_t qs, const void *next, int n, const float *x,
                        size_t xs, int T, float *out, size_t os) {
    v8 carry[PANEL_TOKENS * PANEL_ROWS]; /* token t's sums at carry + t * 4Q, [t][r] */
    const int R = Q * TILE_ROWS, n8 = n & ~7;
    const int tiles = (T + PANEL_TILE - 1) / PANEL_TILE, blocks = (n8 + PANEL_COLS - 1) / PANEL_COLS;
    const size_t bytes = (size_t)Q * (size_t)n * TILE_ROWS * (BF ? sizeof(uint16_t) : sizeof(float));
    const size_t slice = (bytes / (size_t)(tiles * (blocks > 0 ? blocks : 1)) + 127) & ~(size_t)63;
    const char *fetch = (const char *)next;
    if (n8 == 0)
        for (int k = 0; k < T * R; k++) carry[k] = v8_zero();
    for (int i0 = 0; i0 < n8; i0 += PANEL_COLS) {
        int i1 = i0 + PANEL_COLS < n8 ? i0 + PANEL_COLS : n8;
        for (int t0 = 0; t0 < T; t0 += PANEL_TILE) {
            for (size_t b = 0; b < slice; b += 64) __builtin_prefetch(fetch + b);
            fetch += slice;
            panel_tile(BF, Q, T - t0 < PANEL_TILE ? T - t0 : PANEL_TILE, w, qs, x + (size_t)t0 * xs, xs, i0,
                       i1, carry + t0 * R, i0 == 0);
        }
    }
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * xs;
        for (int q = 0; q < Q; q++) {
            const v8 *c = carry + t * R + q * TILE_ROWS;
            size_t tail = (size_t)q * qs + (size_t)n8 * TILE_ROWS; /* cols % 8, row by row */
            float v[TILE_ROWS];
            v8_reduce4(c[0], c[1], c[2], c[3], v);
            for (int r = 0; r < TILE_ROWS; r++) {
                for (int j = n8; j < n; j++) {
                    size_t at = tail + (size_t)r * (size_t)(n - n8) + (size_t)(j - n8);
                    v[r] = fmaf(xt[j], BF ? lmc_bf16_to_f32(((const uint16_t *)w)[at]) : ((const float *)w)[at], v[r]);
                }
                out[(size_t)t * os + q * TILE_ROWS + r] = v[r];
            }
        }
    }
}

/* ---------------------------------------------------------------- products */

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

typedef struct {
    const MatOut *outs;
    int n;
    const float *x;
    int x_stride, T;
    const QActs *xq;
    int unit_start[MATMUL_MAX + 1]; /* first unit of each matrix; the last entry is the total */
    int swiglu; /* matmul_swiglu: units are rows of both matrices, then silu(gate) * up */
} MatmulJob;

/* full quads are packed (matmul_job checks); the rows % 4 rows after them are plain */
static void rows_f32(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    const Mat *w = mo->w;
    size_t ws = (size_t)w->cols, xs = (size_t)job->x_stride, os = (size_t)mo->out_stride;
    int T = job->T;
#define F32_TILE(R, BF, PK)                                                                             \
    do {                                                                                                \
        const void *wr = BF ? (const void *)(w->h + (size_t)r * ws) : (const void *)(w->f + (size_t)r * ws); \
        int t = 0;                                                                                      \
        for (; t + TILE_TOKENS <= T; t += TILE_TOKENS)                                                  \
            tile_f32(R, TILE_TOKENS, BF, PK, wr, ws, job->x + t * xs, xs, w->cols, mo->out + t * os + r, os);    \
        for (; t < T; t++) tile_f32(R, 1, BF, PK, wr, ws, job->x + t * xs, xs, w->cols, mo->out + t * os + r, os); \
    } while (0)
#define F32_ROWS(BF)                                                                                    \
    do {                                                                                                \
        int r = r0;                                                                                     \
        for (; r + TILE_ROWS <= r1; r += TILE_ROWS) F32_TILE(TILE_ROWS, BF, 1);                         \
        for (; r < r1; r++) F32_TILE(1, BF, 0);                                                         \
    } while (0)
    const int bf = w->h != NULL;
    if (T == 1 || (bf && !PANEL_BF16)) {
        if (bf) F32_ROWS(1);
        else F32_ROWS(0);
    } else { /* prefill: full quads by panels, the rows % 4 last rows by tiles */
        const size_t esize = bf ? sizeof(uint16_t) : sizeof(float);
        const char *base = bf ? (const char *)w->h : (const char *)w->f;
        int r = r0;
        while (r + TILE_ROWS <= r1) {
            int Q = r + PANEL_ROWS <= r1 ? PANEL_QUADS : 1;
            const char *wr = base + (size_t)r * ws * esize;
            for (int t = 0; t < T; t += PANEL_TOKENS)
                panel_quads(bf, Q, wr, TILE_ROWS * ws, wr + (size_t)Q * TILE_ROWS * ws * esize, w->cols,
                            job->x + t * xs, xs, T - t < PANEL_TOKENS ? T - t : PANEL_TOKENS, mo->out + t * os + r, os);
            r += Q * TILE_ROWS;
        }
        for (; r < r1; r++) {
            if (bf) F32_TILE(1, 1, 0);
            else F32_TILE(1, 0, 0);
        }
    }
#undef F32_ROWS
#undef F32_TILE
}

static void rows_q8(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    const Mat *w = mo->w;
    const QActs *a = job->xq;
    int G = w->groups, T = job->T, r = r0;
    size_t wqs = (size_t)G * Q8_GROUP, wds = (size_t)G, os = (size_t)mo->out_stride;
    size_t xqs = (size_t)a->groups * Q8_GROUP, xds = (size_t)a->groups;
#define Q8_TILE(R, TT)                                                                                  \
    tile_q8(R, TT, w->q + (size_t)r * wqs, wqs, w->d + (size_t)r * wds, wds, a->q + t * xqs, xqs,       \
            a->d + t * xds, xds, G, mo->out + t * os + r, os)
    for (; r + TILE_ROWS <= r1; r += TILE_ROWS) {
        int t = 0;
        for (; t + TILE_TOKENS <= T; t += TILE_TOKENS) Q8_TILE(TILE_ROWS, TILE_TOKENS);
        for (; t < T; t++) Q8_TILE(TILE_ROWS, 1);
    }
    for (; r < r1; r++) {
        int t = 0;
        for (; t + TILE_TOKENS <= T; t += TILE_TOKENS) Q8_TILE(1, TILE_TOKENS);
        for (; t < T; t++) Q8_TILE(1, 1);
    }
#undef Q8_TILE
}

static void matmul_rows(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    if (mo->w->q) rows_q8(job, mo, r0, r1);
    else rows_f32(job, mo, r0, r1);
}

static void matmul_units(void *arg, int begin, int end) {
    const MatmulJob *job = arg;
    if (job->swiglu) {
        const MatOut *gate = &job->outs[0], *up = &job->outs[1];
        int r0 = begin * MAT_UNIT_ROWS, r1 = end * MAT_UNIT_ROWS;
        if (r1 > gate->w->rows) r1 = gate->w->rows;
        matmul_rows(job, gate, r0, r1);
        matmul_rows(job, up, r0, r1);
        for (int t = 0; t < job->T; t++) {
            float *g = gate->out + (size_t)t * gate->out_stride + r0;
            swiglu(g, g, up->out + (size_t)t * up->out_stride + r0, r1 - r0);
        }
        return;
    }
    for (int m = 0; m < job->n; m++) {
        /* this thread's units that fall in matrix m, as one row range */
        int u0 = begin > job->unit_start[m] ? begin : job->unit_start[m];
        int u1 = end < job->unit_start[m + 1] ? end : job->unit_start[m + 1];
        if (u0 >= u1) continue;
        const MatOut *mo = &job->outs[m];
        int r0 = (u0 - job->unit_start[m]) * MAT_UNIT_ROWS;
        int r1 = (u1 - job->unit_start[m]) * MAT_UNIT_ROWS;
        if (r1 > mo->w->rows) r1 = mo->w->rows;
        matmul_rows(job, mo, r0, r1);
    }
}

static void matmul_job(const MatOut *outs, int n, const float *x, int x_stride, int T, QActs *xq,
                       ThreadPool *pool, int swiglu) {
    if (n < 1 || n > MATMUL_MAX || T < 1) lmc_die_runtime("matmul: %d matrices, %d tokens", n, T);
    MatmulJob job = {.outs = outs, .n = n, .x = x, .x_stride = x_stride, .T = T, .xq = xq, .swiglu = swiglu};
    int any_q8 = 0;
    for (int m = 0; m < n; m++) {
        const Mat *w = outs[m].w;
        job.unit_start[m + 1] = job.unit_start[m] + (w->rows + MAT_UNIT_ROWS - 1) / MAT_UNIT_ROWS;
        any_q8 |= w->q != NULL;
        if (!w->q && !w->packed && w->rows >= MAT_PACK_ROWS)
            lmc_die_runtime("matmul: an f32/bf16 matrix of %d rows was not packed (mat_pack)", w->rows);
    }
    if (any_q8) {
        if (!xq || T > xq->tokens || outs[0].w->groups > xq->groups)
            lmc_die_runtime("matmul: quantised activation scratch too small");
        qacts_quantize(xq, x, x_stride, outs[0].w->cols, T);
    }
    pool_run(pool, matmul_units, &job, swiglu ? job.unit_start[1] : job.unit_start[n]);
}

void matmul(const MatOut *outs, int n, const float *x, int x_stride, int T, QActs *xq, ThreadPool *pool) {
    matmul_job(outs, n, x, x_stride, T, xq, pool, 0);
}

void matmul_swiglu(const MatOut *gate, const MatOut *up, const float *x, int x_stride, int T, QActs *xq,
                   ThreadPool *pool) {
    if (gate->w->rows != up->w->rows) lmc_die_runtime("matmul_swiglu: gate and up differ in rows");
    MatOut outs[2] = {*gate, *up};
    matmul_job(outs, 2, x, x_stride, T, xq, pool, 1);
}
