/* attn_kernel.c — see attn_kernel.h */
#include "attn_kernel.h"

#include <math.h>
#include <string.h>

#include "matmul.h"
#include "ops.h"
#include "util.h"

/* keys of the next block fetched during this block's value sums, at most (32 rows x 128
 * dims x 4 bytes = 16 KiB) */
#define NEXT_KEYS_ROWS 32

/* The reference's sums are pairwise: the two halves summed apart, then added; at most 8 terms
 * in order at the bottom. In float32 their rounding grows with log n, not n: the reference
 * stays within about 1e-8 of double precision at 4096 positions, so an optimised kernel is
 * held to the truth, not to a sequential sum's own rounding. */
static float pairwise_sum(const float *x, int n) {
    if (n <= 8) {
        float s = 0.0f;
        for (int i = 0; i < n; i++) s += x[i];
        return s;
    }
    return pairwise_sum(x, n / 2) + pairwise_sum(x + n / 2, n - n / 2);
}

/* out = sum of w[p] * value(p) over p0 <= p < p1, pairwise as pairwise_sum */
static void pairwise_values(const KVCache *kv, int layer, int kvh, const float *w, int p0, int p1,
                            float *out) {
    int D = kv->head_dim;
    memset(out, 0, sizeof(float) * (size_t)D);
    if (p1 - p0 <= 8) {
        for (int p = p0; p < p1; p++) kv_value_axpy(kv, layer, p, kvh, w[p], out);
        return;
    }
    float right[LMC_MAX_HEAD_DIM];
    int half = p0 + (p1 - p0) / 2;
    pairwise_values(kv, layer, kvh, w, p0, half, out);
    pairwise_values(kv, layer, kvh, w, half, p1, right);
    for (int d = 0; d < D; d++) out[d] += right[d];
}

void attn_reference(const float *q, const KVCache *kv, int layer, int kvh, int n_pos, float *out,
                    float *probs) {
    int D = kv->head_dim;
    float scale = 1.0f / sqrtf((float)D);
    float *s = probs; /* scores first, probabilities after normalising */
    float max = -INFINITY;
    for (int p = 0; p < n_pos; p++) {
        s[p] = kv_key_dot(kv, layer, p, kvh, q) * scale;
        if (s[p] > max) max = s[p];
    }
    for (int p = 0; p < n_pos; p++) s[p] = expf(s[p] - max);
    float sum = pairwise_sum(s, n_pos);
    for (int p = 0; p < n_pos; p++) s[p] /= sum;
    pairwise_values(kv, layer, kvh, s, 0, n_pos, out);
}

void attn_blocks(const float *q, int n_q, const KVCache *kv, int layer, int kvh, int n_pos,
                 const int *blocks, const unsigned char *heads, int n_blocks, float *out,
                 float *scratch, float *probs, size_t probs_stride) {
    const unsigned all = (1u << n_q) - 1;
#define BLOCK_HEADS(i) (heads ? (unsigned)heads[i] : all) /* heads that attend block blocks[i] */
    int D = kv->head_dim, bs = kv->block;
    float scale = 1.0f / sqrtf((float)D);
    float m[ATTN_MAX_GROUP], l[ATTN_MAX_GROUP], bmax[ATTN_MAX_GROUP];
    size_t stride = (size_t)D; /* one head's positions are consecutive rows (kvcache.h) */
    for (int g = 0; g < n_q; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(out, 0, sizeof(float) * (size_t)D * (size_t)n_q);
    for (int i = 0; i < n_blocks; i++) {
        int p0 = blocks[i] * bs;
        int p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        if (p0 >= p1) continue;
        unsigned mask = BLOCK_HEADS(i);
        for (int g = 0; g < n_q; g++) bmax[g] = -INFINITY;
        if (!kv->q8) {
            /* 4 rows at a time, scored for every query head of the group while in L1 (each
             * row loaded once; 4 rows x the heads are independent sums), with the next keys
             * and these values prefetched */
            const float *k = kv->k + kv_row(kv, layer, p0, kvh) * stride;
            const float *v = kv->v + kv_row(kv, layer, p0, kvh) * stride;
            int np = p1 - p0;
            for (int p = 0; p < np; p += 4) {
                int c = np - p < 4 ? np - p : 4;
                lmc_prefetch_floats(k + (size_t)(p + 4) * stride, 4 * D);
                lmc_prefetch_floats(v + (size_t)p * stride, 4 * D);
                if (mask == all)
                    dot_rows_f32_x(q, (size_t)D, n_q, k + (size_t)p * stride, stride, c, D, scratch + p, (size_t)bs);
                else /* the heads that attend this block, one at a time (the rows stay in L1) */
                    for (int g = 0; g < n_q; g++)
                        if (mask >> g & 1u)
                            dot_rows_f32_x(q + (size_t)g * D, 0, 1, k + (size_t)p * stride, stride, c, D,
                                           scratch + g * bs + p, 0);
            }
            for (int g = 0; g < n_q; g++)
                if (mask >> g & 1u) bmax[g] = scale_max(scratch + g * bs, np, scale);
        } else {
            for (int p = p0; p < p1; p++)
                for (int g = 0; g < n_q; g++) {
                    if (!(mask >> g & 1u)) continue;
                    float s = kv_key_dot(kv, layer, p, kvh, q + (size_t)g * D) * scale;
                    scratch[g * bs + p - p0] = s;
                    if (s > bmax[g]) bmax[g] = s;
                }
        }
        for (int g = 0; g < n_q; g++) {
            if (!(mask >> g & 1u) || !(bmax[g] > m[g])) continue;
            /* new running max: rescale what was accumulated so far (exp(-inf) = 0 at start) */
            float corr = lmc_expf(m[g] - bmax[g]);
            float *o = out + (size_t)g * D;
            for (int d = 0; d < D; d++) o[d] *= corr;
            l[g] *= corr;
            m[g] = bmax[g];
        }
        if (!kv->q8 && i + 1 < n_blocks) {
            /* the scoring loop above waits on memory, the exponentials and the value sums
             * below do not: fetch the next block's keys now so the two overlap (exact
             * attention, one thread, 11 alternating rounds of attn-bench: -5 % at 4K, -8 %
             * at 32K) */
            int q0 = blocks[i + 1] * bs;
            int q1 = q0 + bs < n_pos ? q0 + bs : n_pos;
            int rows = q1 - q0 < NEXT_KEYS_ROWS ? q1 - q0 : NEXT_KEYS_ROWS; /* stay well inside L1 */
            if (rows > 0) lmc_prefetch_floats(kv->k + kv_row(kv, layer, q0, kvh) * stride, rows * D);
        }
        for (int g = 0; g < n_q; g++) {
            if (!(mask >> g & 1u)) continue;
            float *sg = scratch + g * bs, *o = out + (size_t)g * D;
            if (probs) memcpy(probs + (size_t)g * probs_stride + p0, sg, sizeof(float) * (size_t)(p1 - p0));
            l[g] += exp_sum(sg, p1 - p0, m[g]); /* now sg[p - p0] is the weight of V row p */
            if (kv->q8)
                for (int p = p0; p < p1; p++) kv_value_axpy(kv, layer, p, kvh, sg[p - p0], o);
            else /* out += e_p * v_p, p in order, out held in registers */
                axpy_rows_f32(o, sg, kv->v + kv_row(kv, layer, p0, kvh) * stride, stride, p1 - p0, D);
        }
    }
    for (int g = 0; g < n_q; g++) {
        if (l[g] <= 0.0f) continue;
        float inv = 1.0f / l[g];
        float *o = out + (size_t)g * D;
        for (int d = 0; d < D; d++) o[d] *= inv;
        if (!probs) continue;
        float *pr = probs + (size_t)g * probs_stride;
        for (int i = 0; i < n_blocks; i++) {
            if (!(BLOCK_HEADS(i) >> g & 1u)) continue;
            int p0 = blocks[i] * bs;
            int p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
            for (int p = p0; p < p1; p++) pr[p] = lmc_expf(pr[p] - m[g]) * inv;
        }
    }
#undef BLOCK_HEADS
}

/* importance[p] += the probability of score s[p] * scale (an exact product when scale is 1)
 * for p < n, with the vector's final max m and 1 / sum inv, as attn_blocks gives them */
static void add_probabilities(float *importance, const float *s, int n, float scale, float m, float inv) {
    for (int p = 0; p < n; p++) importance[p] += lmc_expf(s[p] * scale - m) * inv;
}

/* q8 KV in a tile: a block's int8 rows are widened to floats once (the values exactly, no
 * scale) and each group of Q8_GROUP columns goes through the f32 tile kernels, the scales
 * applied per group as dot_q8 and axpy_q8 apply them. The conversions are then shared by the
 * tile's vectors instead of repeated for each, and every score and sum keeps its bits: a
 * group's dot product is dot_q8_group's (8-lane sums in column order, lmc_reduce8, then the
 * tail, as dot_rows_f32_x takes them), combined over groups as fmaf(scale, dot, r) from 0; a
 * value row is added as fma(weight * scale, value, y), row by row in position order. Scratch:
 * ATTN_TILE_Q8_FLOATS, the widened rows (keys for the scores, values for the sums: never both
 * at once), then a row of block floats per vector (a group's dots, or its scaled weights). */
static void widen_rows(const int8_t *q, size_t count, float *out) {
    for (size_t i = 0; i < count; i++) out[i] = (float)q[i];
}

/* the scores of rows p0 .. p0 + np - 1 (one block or less) for nv query vectors (q:
 * consecutive head_dim rows) into out[v * row + p - p0], unscaled: the bits kv_key_dot gives */
static void tile_scores(const KVCache *kv, int layer, int kvh, int p0, int np, const float *q, int nv,
                        float *out, size_t row, float *q8_scratch) {
    int D = kv->head_dim, bs = kv->block, G = q8_groups(D);
    size_t r0 = kv_row(kv, layer, p0, kvh);
    if (!kv->q8) {
        dot_rows_f32_x(q, (size_t)D, nv, kv->k + r0 * (size_t)D, (size_t)D, np, D, out, row);
        return;
    }
    float *keys = q8_scratch, *dots = q8_scratch + (size_t)bs * (size_t)D; /* dots[v * bs + p] */
    const float *scales = kv->ks + r0 * (size_t)G;
    widen_rows(kv->kq + r0 * (size_t)D, (size_t)np * (size_t)D, keys);
    for (int g = 0; g < G; g++) {
        int c0 = g * Q8_GROUP, len = D - c0 < Q8_GROUP ? D - c0 : Q8_GROUP;
        dot_rows_f32_x(q + c0, (size_t)D, nv, keys + c0, (size_t)D, np, len, dots, (size_t)bs);
        for (int v = 0; v < nv; v++) {
            float *o = out + (size_t)v * row;
            for (int p = 0; p < np; p++)
                o[p] = fmaf(scales[(size_t)p * G + g], dots[(size_t)v * bs + p], g ? o[p] : 0.0f);
        }
    }
}

/* y[u] += w[u][p] * value(p0 + p) for p < count[u], p in order for each u (attn_blocks' value
 * sums, the bits kv_value_axpy gives for q8), 3 vectors a row load (axpy_rows_f32_x) */
static void tile_values(const KVCache *kv, int layer, int kvh, int p0, float *const *y, const float *const *w,
                        const int *count, int ny, float *q8_scratch) {
    int D = kv->head_dim, bs = kv->block, G = q8_groups(D);
    size_t r0 = kv_row(kv, layer, p0, kvh);
    if (!kv->q8) {
        axpy_rows_f32_x(y, w, count, ny, kv->v + r0 * (size_t)D, (size_t)D, D);
        return;
    }
    int most = 0;
    for (int u = 0; u < ny; u++)
        if (count[u] > most) most = count[u];
    float *values = q8_scratch, *scaled = q8_scratch + (size_t)bs * (size_t)D; /* scaled[u * bs + p] */
    const float *scales = kv->vs + r0 * (size_t)G;
    widen_rows(kv->vq + r0 * (size_t)D, (size_t)most * (size_t)D, values);
    float *yg[ATTN_TILE_QUERIES * ATTN_MAX_GROUP];
    const float *wg[ATTN_TILE_QUERIES * ATTN_MAX_GROUP];
    for (int g = 0; g < G; g++) {
        int c0 = g * Q8_GROUP, len = D - c0 < Q8_GROUP ? D - c0 : Q8_GROUP;
        for (int u = 0; u < ny; u++) {
            float *su = scaled + (size_t)u * bs;
            for (int p = 0; p < count[u]; p++) su[p] = w[u][p] * scales[(size_t)p * G + g];
            yg[u] = y[u] + c0;
            wg[u] = su;
        }
        axpy_rows_f32_x(yg, wg, count, ny, values + c0, (size_t)D, len);
    }
}

void attn_causal_tile(const float *q, int n_q, int T, size_t q_stride, const KVCache *kv, int layer,
                      int kvh, int pos0, float *out, size_t out_stride, float *qbuf, float *scores,
                      float *m, float *l, const TileBlocks *sel, float *q8_scratch) {
    int D = kv->head_dim, bs = kv->block, nv = T * n_q; /* vector t * n_q + g: query t, head g */
    float scale = 1.0f / sqrtf((float)D);
    for (int t = 0; t < T; t++)
        for (int g = 0; g < n_q; g++) {
            int v = t * n_q + g;
            memcpy(qbuf + (size_t)v * D, q + (size_t)t * q_stride + (size_t)g * D, sizeof(float) * (size_t)D);
            memset(out + (size_t)t * out_stride + (size_t)g * D, 0, sizeof(float) * (size_t)D);
            m[v] = -INFINITY;
            l[v] = 0.0f;
        }
    float *ys[ATTN_TILE_QUERIES * ATTN_MAX_GROUP]; /* a block's value sums: output, weights, rows */
    float *ws[ATTN_TILE_QUERIES * ATTN_MAX_GROUP];
    int counts[ATTN_TILE_QUERIES * ATTN_MAX_GROUP];
    int last = pos0 + T - 1; /* the tile's last query sees positions 0 .. last */
    int keep = sel && sel->importance && !sel->recompute; /* scores kept for the probabilities */
    size_t row = sel ? sel->score_stride : (size_t)bs;
    int n_blocks = sel ? sel->n : last / bs + 1;
    for (int i = 0; i < n_blocks; i++) {
        int b = sel ? sel->blocks[i] : i;
        int p0 = b * bs, np = (p0 + bs <= last + 1 ? bs : last + 1 - p0);
        int t0 = p0 > pos0 ? p0 - pos0 : 0; /* the first query that sees this block */
        float *srow = scores + (keep ? (size_t)i * bs : 0);
        tile_scores(kv, layer, kvh, p0, np, qbuf + (size_t)t0 * n_q * D, nv - t0 * n_q,
                    srow + (size_t)t0 * n_q * row, row, q8_scratch);
        for (int t = t0; t < T; t++) {
            int vis = pos0 + t + 1 - p0 < np ? pos0 + t + 1 - p0 : np; /* its rows of the block */
            for (int g = 0; g < n_q; g++) {
                int v = t * n_q + g;
                float *sg = srow + (size_t)v * row, *o = out + (size_t)t * out_stride + (size_t)g * D;
                float *w = keep ? sel->weights + (size_t)v * bs : sg;
                float bmax = scale_max(sg, vis, scale); /* attn_blocks' steps, block by block */
                if (bmax > m[v]) {
                    float corr = lmc_expf(m[v] - bmax);
                    for (int d = 0; d < D; d++) o[d] *= corr;
                    l[v] *= corr;
                    m[v] = bmax;
                }
                if (keep) memcpy(w, sg, sizeof(float) * (size_t)vis); /* the scores are kept */
                l[v] += exp_sum(w, vis, m[v]);
                ys[v] = o;
                ws[v] = w;
                counts[v] = vis;
            }
        }
        /* the weights (in each vector's score row, or its own row when the scores are kept):
         * the block's values for all of them at once, each value row loaded once per 3
         * vectors (each sum still in position order) */
        tile_values(kv, layer, kvh, p0, ys + t0 * n_q, (const float *const *)(ws + t0 * n_q), counts + t0 * n_q,
                    nv - t0 * n_q, q8_scratch);
    }
    float inv[ATTN_TILE_QUERIES * ATTN_MAX_GROUP];
    for (int t = 0; t < T; t++)
        for (int g = 0; g < n_q; g++) {
            int v = t * n_q + g;
            inv[v] = l[v] > 0.0f ? 1.0f / l[v] : 0.0f;
            if (l[v] <= 0.0f) continue;
            float *o = out + (size_t)t * out_stride + (size_t)g * D;
            for (int d = 0; d < D; d++) o[d] *= inv[v];
            if (!keep) continue;
            for (int i = 0; i < n_blocks; i++) { /* the probabilities, as attn_blocks gives them */
                int p0 = sel->blocks[i] * bs, vis = pos0 + t + 1 - p0 < bs ? pos0 + t + 1 - p0 : bs;
                add_probabilities(sel->importance + p0, scores + (size_t)v * row + (size_t)i * bs, vis, 1.0f,
                                  m[v], inv[v]);
            }
        }
    if (!sel || !sel->importance || !sel->recompute) return;
    /* the same probabilities from the scores computed again, a block at a time: each position
     * still takes the vectors' terms in vector order, so the sums have the kept scores' bits */
    for (int i = 0; i < n_blocks; i++) {
        int p0 = sel->blocks[i] * bs, np = (p0 + bs <= last + 1 ? bs : last + 1 - p0);
        int t0 = p0 > pos0 ? p0 - pos0 : 0;
        tile_scores(kv, layer, kvh, p0, np, qbuf + (size_t)t0 * n_q * D, nv - t0 * n_q,
                    scores + (size_t)t0 * n_q * row, row, q8_scratch);
        for (int v = t0 * n_q; v < nv; v++) {
            if (l[v] <= 0.0f) continue;
            int t = v / n_q, vis = pos0 + t + 1 - p0 < np ? pos0 + t + 1 - p0 : np;
            add_probabilities(sel->importance + p0, scores + (size_t)v * row, vis, scale, m[v], inv[v]);
        }
    }
}
