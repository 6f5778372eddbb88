/* tiles.h — the weight kernels' tiles, shared by matmul.c (weight products) and rows.c
 * (attention's row products). It defines TILE_ROWS, TILE_TOKENS and the prefetch distances:
 * a file that includes it defines none of them itself.
 *
 * The kernels work on tiles of up to 4 weight rows x up to 3 tokens: each weight row loaded
 * once per tile serves every token of the tile (prefill), and in decode the 4 independent rows
 * keep the FMA units and the memory system busy. Every tile computes each of its outputs
 * exactly as the 1 x 1 tile would, so tiling never changes a bit. Everything here is static
 * inline: each file that includes it gets its own copy, specialised where it is called. */
#ifndef LMC_TILES_H
#define LMC_TILES_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "matmul.h"
#include "ops.h"
#include "simd.h"

#define TILE_ROWS MAT_PACK_ROWS /* a tile's rows are one packed quad */
#define TILE_TOKENS 3
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
/* 16 words, each two bf16 values: the high halves give *first, the low halves *second, as
 * v8_load_bf16_pair */
ALWAYS_INLINE void v16_load_bf16_pair(const uint16_t *p, __m512 *first, __m512 *second) {
    __m512i w = _mm512_loadu_si512(p);
    *first = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
    *second = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
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
    if (BF && PK) /* tile_f32's 16-column steps: a word pairs column j (high half) with j + 8 */
        for (; i + 16 <= n8; i += 16) {
            PREFETCH_NEXT((const char *)wp + (size_t)i * TILE_ROWS * wsize + PREFETCH_AHEAD);
            __m512 wj01, wj801, wj23, wj823; /* columns j, j + 8 of rows 0 | 1 and 2 | 3 */
            v16_load_bf16_pair(wh + (size_t)i * TILE_ROWS, &wj01, &wj801);
            v16_load_bf16_pair(wh + (size_t)i * TILE_ROWS + 32, &wj23, &wj823);
            for (int t = 0; t < TT; t++) {
                __m512 xa = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i));
                __m512 xb = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + t * xs + i + 8));
                a01[t] = _mm512_fmadd_ps(xb, wj801, _mm512_fmadd_ps(xa, wj01, a01[t]));
                a23[t] = _mm512_fmadd_ps(xb, wj823, _mm512_fmadd_ps(xa, wj23, a23[t]));
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
                v8 wj, wj8; /* columns j and j + 8 */
                v8_load_bf16_pair(wh + (size_t)i * TILE_ROWS + (size_t)r * 16, &wj, &wj8);
                for (int t = 0; t < TT; t++) acc[r][t] = v8_fma(xb[t], wj8, v8_fma(xa[t], wj, acc[r][t]));
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

#if defined(LMC_AVX512_TILES) && defined(__AVX512BW__)
#define LMC_Q8_PAIRS512 1
/* AVX-512 (x86-64-v4) for a q8 quad: a quad's block holds rows 0, 1, 2, 3 one after the other,
 * so one 512-bit load takes the block of two rows, and a token's block repeated in both halves
 * gives both rows' 8 lane sums in one instruction (lanes 0-7 the first row's, 8-15 the
 * second's). Two ways to those sums, both the exact integers qblock_dot gives:
 * - by sign: |x| from vpabsb and x's sign put onto w by a negate under the mask of x < 0
 *   (where x = 0 the product is 0 either way; AVX-512 has no vpsignb, the 256-bit trick),
 *   then vpdpbusd (VNNI) or vpmaddubsw + vpmaddwd;
 * - biased (VNNI, a tile of 2 or more tokens): x + 128 (x ^ 0x80) is unsigned as vpdpbusd
 *   wants it, and (x + 128)·w - 128·w = x·w lane by lane, so each pair of rows forms its
 *   lanes' -128·Σw once per block and every token's sum starts from it: one instruction a
 *   token and no sign work (pp512: 13 % less CPU time than by sign, measured). With one
 *   token (decode) the -128·Σw costs more than it saves (decode 10 % slower, measured), so
 *   decode goes by sign. Without VNNI vpmaddubsw would saturate on x + 128.
 * Each lane then takes the same fused multiply-add as the 8-wide tile's, so the same bits. */
ALWAYS_INLINE __m512i pair_dot_by_sign(__m512i xabs, __mmask64 xneg, __m512i w) {
    __m512i ws = _mm512_mask_sub_epi8(w, xneg, _mm512_setzero_si512(), w);
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), xabs, ws);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(xabs, ws), _mm512_set1_epi16(1));
#endif
}
/* acc += the two rows' scales (*s0 in the low half, *s1 in the high) times the lane sums d */
ALWAYS_INLINE __m512 pair_fma(const float *s0, const float *s1, __m512i d, __m512 acc) {
    __m512 sc = _mm512_mask_broadcastss_ps(_mm512_set1_ps(*s0), 0xFF00, _mm_load_ss(s1));
    return _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(d), acc);
}
/* block_acc for a whole quad: acc2[p][t] is token t's rows 2p | 2p + 1 */
ALWAYS_INLINE void block_acc_pairs(const int TT, const int8_t *w, const int8_t *x, size_t xqs, const float *s,
                                   size_t sr, size_t st, __m512 acc2[][TILE_TOKENS]) {
    const __m512i w2[2] = {_mm512_loadu_si512(w), _mm512_loadu_si512(w + 2 * Q8_GROUP)};
#define X_BLOCK(t) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x + (t) * xqs)))
#define SCALE(r, t) (s + (r) * sr + (t) * st)
#if defined(__AVX512VNNI__)
    if (TT > 1) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        __m512i start[2]; /* -128·Σw of each lane's 4 weights */
        for (int p = 0; p < 2; p++)
            start[p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, w2[p]));
        for (int t = 0; t < TT; t++) {
            __m512i xu = _mm512_xor_si512(X_BLOCK(t), bias);
            for (int p = 0; p < 2; p++)
                acc2[p][t] = pair_fma(SCALE(2 * p, t), SCALE(2 * p + 1, t), _mm512_dpbusd_epi32(start[p], xu, w2[p]),
                                      acc2[p][t]);
        }
        return;
    }
#endif
    for (int t = 0; t < TT; t++) {
        __m512i xb = X_BLOCK(t);
        __m512i xabs = _mm512_abs_epi8(xb);
        __mmask64 xneg = _mm512_movepi8_mask(xb);
        for (int p = 0; p < 2; p++)
            acc2[p][t] = pair_fma(SCALE(2 * p, t), SCALE(2 * p + 1, t), pair_dot_by_sign(xabs, xneg, w2[p]), acc2[p][t]);
    }
#undef SCALE
#undef X_BLOCK
}
#endif

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
#if defined(LMC_Q8_PAIRS512)
    __m512 acc2[TILE_ROWS / 2][TILE_TOKENS];
    for (int p = 0; p < TILE_ROWS / 2; p++)
        for (int t = 0; t < TT; t++) acc2[p][t] = _mm512_setzero_ps();
#define BLOCK_ACC(w, x, s, sr, st) \
    (R == TILE_ROWS ? block_acc_pairs(TT, w, x, xqs, s, sr, st, acc2) : block_acc(R, TT, w, x, xqs, s, sr, st, acc))
#else
#define BLOCK_ACC(w, x, s, sr, st) block_acc(R, TT, w, x, xqs, s, sr, st, acc)
#endif
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
            BLOCK_ACC(wq + WQ_AT(0, g + j), xq + (size_t)(g + j) * Q8_GROUP, &sc[0][0][j], TILE_TOKENS * 8, 8);
    }
    for (; g < groups; g++) {
        float sc[TILE_ROWS][TILE_TOKENS];
        for (int r = 0; r < R; r++) {
            float dw = half_to_f32(wd[r * wds + g]);
            for (int t = 0; t < TT; t++) sc[r][t] = dw * xd[t * xds + g];
        }
        BLOCK_ACC(wq + WQ_AT(0, g), xq + (size_t)g * Q8_GROUP, &sc[0][0], TILE_TOKENS, 1);
    }
#undef BLOCK_ACC
#if defined(LMC_Q8_PAIRS512)
    if (R == TILE_ROWS) /* the halves back into the 8-wide sums */
        for (int p = 0; p < TILE_ROWS / 2; p++)
            for (int t = 0; t < TT; t++) {
                acc[2 * p][t] = _mm512_castps512_ps256(acc2[p][t]);
                acc[2 * p + 1][t] = _mm512_extractf32x8_ps(acc2[p][t], 1);
            }
#endif
    for (int t = 0; t < TT; t++) {
        float v[TILE_ROWS];
        reduce_token(R, acc, t, v);
        for (int r = 0; r < R; r++) out[t * os + r] = v[r];
    }
#undef WQ_AT
}

#endif
