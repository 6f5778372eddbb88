/* matmul.c — see matmul.h: weight matrices times tokens, split over the thread pool. The
 * tiles (tiles.h) serve decode and the rows % 4 last rows; prefill goes by panels (below). */
#include "matmul.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "simd.h"
#include "tiles.h"
#include "util.h"

#define MATMUL_MAX 4 /* matrices per fused product */

/* ---------------------------------------------------------------- prefill panels */

/* A chunk of tokens (prefill) times packed f32 or bf16 quads, PANEL_QUADS quads (consecutive
 * in the matrix) at a time. Three things the decode tiles do not need:
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
#else
#define PANEL_TILE TILE_TOKENS
#define PANEL_QUADS 1
#endif
#define PANEL_ROWS (PANEL_QUADS * TILE_ROWS)
/* bf16 panels: at v4 by 512-bit tiles that widen their weights as they load them (with
 * --bf16-acts and AVX512_BF16, by vdpbf16ps); below, by the f32 tiles on a block widened
 * once for every token (panel_widen): at v3 a pp512 then takes 20 % less CPU time than in
 * the tiles, which widen for every 3 tokens; at v4 widening a block cost 7 % more than its
 * tiles' widening as they load */
#if defined(LMC_AVX512_TILES)
#define PANEL_BF16_TILES 1
#else
#define PANEL_BF16_TILES 0
#endif
#if defined(LMC_AVX512_TILES) && defined(__AVX512BF16__)
#define PANEL_DOT_BF16 1
#else
#define PANEL_DOT_BF16 0
#endif
#define PANEL_COLS (1024 / PANEL_QUADS) /* a block of the panel's quads: 16 KiB */

/* columns i0 .. i1 (multiples of 8, at most n & ~7; i0 of 16) of Q quads (quad q at w + q * qs
 * values: f32, or bf16 when BF) times TT tokens; the sums start from zero
 * (first) or from `carry`, token t's row r (of the Q quads' 4Q) at carry[t * 4Q + r], and go
 * back to it. xp: with --bf16-acts, x's bf16 pairs (QActs), xps words a token */
ALWAYS_INLINE void panel_span(const int BF, const int Q, const int TT, const void *w, size_t qs, const float *x,
                              size_t xs, const uint32_t *xp, size_t xps, int i0, int i1, v8 *carry, int first) {
    const int R = Q * TILE_ROWS;
#if defined(LMC_AVX512_TILES)
    /* acc[p][t]: token t's rows 2p | 2p + 1, which is carry's pair of v8 there */
    __m512 acc[PANEL_ROWS / 2][PANEL_TILE];
    for (int p = 0; p < R / 2; p++)
        for (int t = 0; t < TT; t++)
            acc[p][t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps((const float *)(carry + t * R + 2 * p));
    const uint16_t *wh = w;
    int i = i0;
#if defined(__AVX512BF16__)
    /* --bf16-acts: one vdpbf16ps per 16-column step does the two FMAs below (x is rounded) */
    if (BF && xp)
        for (; i + 16 <= i1; i += 16) {
            __m512i xw[PANEL_TILE];
            for (int t = 0; t < TT; t++)
                xw[t] = _mm512_broadcast_i32x8(_mm256_loadu_si256((const __m256i *)(xp + t * xps + i / 2)));
            for (int p = 0; p < R / 2; p++) {
                __m512i wv = _mm512_loadu_si512(wh + (size_t)(p / 2) * qs + (size_t)i * TILE_ROWS + (size_t)(p % 2) * 32);
                for (int t = 0; t < TT; t++) acc[p][t] = _mm512_dpbf16_ps(acc[p][t], (__m512bh)wv, (__m512bh)xw[t]);
            }
        }
#else
    (void)xp, (void)xps;
#endif
    if (BF) /* as quad_avx512: a word pairs column j (high half) with j + 8, lane by lane */
        for (; i + 16 <= i1; i += 16) {
            __m512 xa[PANEL_TILE], xb[PANEL_TILE];
            for (int t = 0; t < TT; t++) {
                xa[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
                xb[t] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i + 8));
            }
            for (int p = 0; p < R / 2; p++) {
                __m512 wj, wj8; /* columns j, j + 8 of rows 2p | 2p + 1 */
                v16_load_bf16_pair(wh + (size_t)(p / 2) * qs + (size_t)i * TILE_ROWS + (size_t)(p % 2) * 32, &wj, &wj8);
                for (int t = 0; t < TT; t++) acc[p][t] = _mm512_fmadd_ps(xb[t], wj8, _mm512_fmadd_ps(xa[t], wj, acc[p][t]));
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
    (void)BF, (void)xp, (void)xps; /* bf16 comes widened (panel_widen) */
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
static void panel_tile(int BF, int Q, int TT, const void *w, size_t qs, const float *x, size_t xs, const uint32_t *xp,
                       size_t xps, int i0, int i1, v8 *carry, int first) {
#define PANEL_CASE(B, QQ, N) \
    case N: panel_span(B, QQ, N, w, qs, x, xs, xp, xps, i0, i1, carry, first); return;
#if PANEL_TILE == 4
#define PANEL_CASES(B, QQ) \
    switch (TT) { PANEL_CASE(B, QQ, 4) PANEL_CASE(B, QQ, 3) PANEL_CASE(B, QQ, 2) PANEL_CASE(B, QQ, 1) }
#else
#define PANEL_CASES(B, QQ) switch (TT) { PANEL_CASE(B, QQ, 3) PANEL_CASE(B, QQ, 2) PANEL_CASE(B, QQ, 1) }
#endif
#if PANEL_BF16_TILES
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

/* columns i0 .. i1 (a block) of Q packed bf16 quads (quad q at w + q * qs values, n columns)
 * widened to f32, exactly (a bf16 is the top half of its f32), into `wide` as packed f32 quads
 * of i1 - i0 columns, TILE_ROWS * PANEL_COLS values apart: a bf16 panel then takes the f32
 * panel's steps, whose order is the bf16 tiles' (columns j, then j + 8), with the widening
 * done once per block for every token of the pass instead of once per tile of tokens (at v3
 * a bf16 prefill ran at 70 % of the FMA peak widening per tile, f32 at 90 %; now 86 %) */
static void panel_widen(const uint16_t *w, int Q, size_t qs, int n, int i0, int i1, float *wide) {
    const int n16 = n & ~15; /* mat_pack's 16-column pairs end here */
    for (int q = 0; q < Q; q++) {
        const uint16_t *wq = w + (size_t)q * qs;
        float *dq = wide + (size_t)q * TILE_ROWS * PANEL_COLS;
        int i = i0;
        for (; i + 16 <= i1 && i + 16 <= n16; i += 16)
            for (int r = 0; r < TILE_ROWS; r++) {
                v8 wj, wj8;
                v8_load_bf16_pair(wq + (size_t)i * TILE_ROWS + (size_t)r * 16, &wj, &wj8);
                v8_store(dq + (size_t)(i - i0) * TILE_ROWS + (size_t)r * 8, wj);
                v8_store(dq + (size_t)(i + 8 - i0) * TILE_ROWS + (size_t)r * 8, wj8);
            }
        for (; i < i1; i += 8)
            for (int r = 0; r < TILE_ROWS; r++)
                v8_store(dq + (size_t)(i - i0) * TILE_ROWS + (size_t)r * 8,
                         v8_load_bf16(wq + (size_t)i * TILE_ROWS + (size_t)r * 8));
    }
}

/* Q packed quads at w, qs values apart (n columns; f32, or bf16 when BF), times tokens
 * x[0 .. T), T <= PANEL_TOKENS (and their bf16 pairs xp, xps words apart, for vdpbf16ps, or
 * NULL), into out[t * os + r], r < 4Q; `next` is what comes after them, fetched a slice per
 * span */
static void panel_quads(int BF, int Q, const void *w, size_t qs, const void *next, int n, const float *x,
                        size_t xs, const uint32_t *xp, size_t xps, int T, float *out, size_t os) {
    v8 carry[PANEL_TOKENS * PANEL_ROWS]; /* token t's sums at carry + t * 4Q, [t][r] */
    float wide[PANEL_BF16_TILES ? 1 : PANEL_ROWS * PANEL_COLS]; /* bf16 below v4: the block, widened */
    const int widen = BF && !PANEL_BF16_TILES;
    const int R = Q * TILE_ROWS, n8 = n & ~7;
    const int tiles = (T + PANEL_TILE - 1) / PANEL_TILE, blocks = (n8 + PANEL_COLS - 1) / PANEL_COLS;
    const size_t bytes = (size_t)Q * (size_t)n * TILE_ROWS * (BF ? sizeof(uint16_t) : sizeof(float));
    const size_t slice = (bytes / (size_t)(tiles * (blocks > 0 ? blocks : 1)) + 127) & ~(size_t)63;
    const char *fetch = (const char *)next;
    if (n8 == 0)
        for (int k = 0; k < T * R; k++) carry[k] = v8_zero();
    for (int i0 = 0; i0 < n8; i0 += PANEL_COLS) {
        int i1 = i0 + PANEL_COLS < n8 ? i0 + PANEL_COLS : n8;
        if (widen) panel_widen(w, Q, qs, n, i0, i1, wide);
        for (int t0 = 0; t0 < T; t0 += PANEL_TILE) {
            for (size_t b = 0; b < slice; b += 64) __builtin_prefetch(fetch + b);
            fetch += slice;
            int TT = T - t0 < PANEL_TILE ? T - t0 : PANEL_TILE;
            if (widen)
                panel_tile(0, Q, TT, wide, TILE_ROWS * PANEL_COLS, x + (size_t)t0 * xs + i0, xs, NULL, 0, 0,
                           i1 - i0, carry + t0 * R, i0 == 0);
            else
                panel_tile(BF, Q, TT, w, qs, x + (size_t)t0 * xs, xs, xp ? xp + (size_t)t0 * xps : NULL, xps, i0,
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

typedef struct {
    const MatOut *outs;
    int n;
    const float *x;
    int x_stride, T;
    const QActs *xq;
    const uint32_t *xp; /* --bf16-acts with vdpbf16ps panels: x's bf16 pairs (x is rounded), xps words a token */
    size_t xps;
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
    if (T == 1) {
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
                            job->x + t * xs, xs,
                            bf && job->xp ? job->xp + (size_t)t * job->xps : NULL, job->xps,
                            T - t < PANEL_TOKENS ? T - t : PANEL_TOKENS, mo->out + t * os + r, os);
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

/* DECODE: one token, so only the 1-token tiles; prefill: whole tiles of tokens, then 1-token
 * ones. Two functions, so that decode's loop is compiled apart from the prefill tiles: in one
 * function with the biased pairs (tiles.h), v4-vnni q8 decode ran 4-5 % slower with the same
 * instructions in its loop; apart, 2 % (medians of 7 alternating rounds) */
ALWAYS_INLINE void rows_q8_tiles(const int DECODE, const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    const Mat *w = mo->w;
    const QActs *a = job->xq;
    int G = w->groups, T = DECODE ? 1 : job->T, r = r0;
    size_t wqs = (size_t)G * Q8_GROUP, wds = (size_t)G, os = (size_t)mo->out_stride;
    size_t xqs = (size_t)a->groups * Q8_GROUP, xds = (size_t)a->groups;
#define Q8_TILE(R, TT)                                                                                  \
    tile_q8(R, TT, w->q + (size_t)r * wqs, wqs, w->d + (size_t)r * wds, wds, a->q + t * xqs, xqs,       \
            a->d + t * xds, xds, G, mo->out + t * os + r, os)
    for (; r + TILE_ROWS <= r1; r += TILE_ROWS) {
        int t = 0;
        if (!DECODE)
            for (; t + TILE_TOKENS <= T; t += TILE_TOKENS) Q8_TILE(TILE_ROWS, TILE_TOKENS);
        for (; t < T; t++) Q8_TILE(TILE_ROWS, 1);
    }
    for (; r < r1; r++) {
        int t = 0;
        if (!DECODE)
            for (; t + TILE_TOKENS <= T; t += TILE_TOKENS) Q8_TILE(1, TILE_TOKENS);
        for (; t < T; t++) Q8_TILE(1, 1);
    }
#undef Q8_TILE
}

static __attribute__((noinline)) void rows_q8_decode(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    rows_q8_tiles(1, job, mo, r0, r1);
}

static __attribute__((noinline)) void rows_q8_prefill(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    rows_q8_tiles(0, job, mo, r0, r1);
}

static void matmul_rows(const MatmulJob *job, const MatOut *mo, int r0, int r1) {
    if (!mo->w->q) rows_f32(job, mo, r0, r1);
    else if (job->T == 1) rows_q8_decode(job, mo, r0, r1);
    else rows_q8_prefill(job, mo, r0, r1);
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
    int any_q8 = 0, all_bf16 = 1;
    for (int m = 0; m < n; m++) {
        const Mat *w = outs[m].w;
        job.unit_start[m + 1] = job.unit_start[m] + (w->rows + MAT_UNIT_ROWS - 1) / MAT_UNIT_ROWS;
        any_q8 |= w->q != NULL;
        all_bf16 &= w->h != NULL;
        if (!w->q && !w->packed && w->rows >= MAT_PACK_ROWS)
            lmc_die_runtime("matmul: an f32/bf16 matrix of %d rows was not packed (mat_pack)", w->rows);
    }
    if (any_q8) {
        if (!xq || T > xq->tokens || outs[0].w->groups > xq->groups)
            lmc_die_runtime("matmul: quantised activation scratch too small");
        qacts_quantize(xq, x, x_stride, outs[0].w->cols, T);
    }
    if (all_bf16 && xq && xq->bf) { /* --bf16-acts */
        if (T > xq->tokens || outs[0].w->cols > xq->cols) lmc_die_runtime("matmul: bf16 activation scratch too small");
        qacts_round_bf16(xq, x, x_stride, outs[0].w->cols, T, PANEL_DOT_BF16);
        job.x = xq->bf;
        job.x_stride = xq->cols;
        job.xp = PANEL_DOT_BF16 ? xq->bf_pairs : NULL;
        job.xps = (size_t)(xq->cols / 2);
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
