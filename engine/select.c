/* select.c — see select.h */
#include "select.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"
#include "ops.h"
#include "util.h"

void select_scratch_init(SelectScratch *s, int n_blocks) {
    s->score = lmc_alloc((size_t)n_blocks, sizeof(float), "selection scores");
    s->aux = lmc_alloc((size_t)n_blocks, sizeof(float), "selection scores");
    s->order = lmc_alloc((size_t)n_blocks, sizeof(int), "selection order");
    s->used = lmc_alloc((size_t)n_blocks, 1, "selection flags");
}

void select_scratch_free(SelectScratch *s) {
    lmc_free(s->score);
    lmc_free(s->aux);
    lmc_free(s->order);
    lmc_free(s->used);
}

/* ---------------------------------------------------------------- helpers */

static inline int block_end(int b, int bs, int n_pos) { return b * bs + bs < n_pos ? b * bs + bs : n_pos; }

/* the unused block with the highest score; ties -> lower index; -1 when none is left */
static int best_unused(const float *score, const unsigned char *used, int n) {
    int best = -1;
    for (int b = 0; b < n; b++) {
        if (used[b]) continue;
        if (best < 0 || score[b] > score[best]) best = b;
    }
    return best;
}

/* The seed's greedy fill one pick at a time (k scans of every block); take_top's result when
 * a score is NaN, which orders nothing. */
static int take_greedy(const float *score, unsigned char *used, int n_blocks, int *sel, int count, int want) {
    for (int i = 0; i < want; i++) {
        int b = best_unused(score, used, n_blocks);
        if (b < 0) break;
        used[b] = 1;
        sel[count++] = b;
    }
    return count;
}

/* Greedily take up to `want` more blocks by score; returns the new count. The greedy picks
 * are the unused blocks in (score descending, index ascending) order, so one pass keeps the
 * best `want` seen so far in that order (a block enters only if it beats the worst kept one;
 * an equal score later in the pass never does): O(n_blocks) instead of O(want * n_blocks). */
static int take_top(const float *score, unsigned char *used, int n_blocks, int *sel, int count, int want) {
    int *top = sel + count, m = 0;
    if (want <= 0) return count;
    for (int b = 0; b < n_blocks; b++) {
        if (used[b]) continue;
        float sc = score[b];
        if (sc != sc) return take_greedy(score, used, n_blocks, sel, count, want);
        if (m == want && !(sc > score[top[m - 1]])) continue;
        int i = m < want ? m++ : want - 1;
        for (; i > 0 && sc > score[top[i - 1]]; i--) top[i] = top[i - 1];
        top[i] = b;
    }
    for (int i = 0; i < m; i++) used[top[i]] = 1;
    return count + m;
}

/* sum of a per-position array over each block, in position order */
static void block_sums(const float *per_pos, int n_pos, int bs, int n_blocks, float *out) {
    for (int b = 0; b < n_blocks; b++) {
        float s = 0.0f;
        for (int p = b * bs; p < block_end(b, bs, n_pos); p++) s += per_pos[p];
        out[b] = s;
    }
}

/* "top-k plus recency": the last block first (when kept), then the best others */
static int top_k_with_recency(const SelectConfig *cfg, const float *score, unsigned char *used,
                              int n_blocks, int *sel) {
    int count = 0, k = cfg->k;
    if (cfg->recency) {
        used[n_blocks - 1] = 1;
        sel[count++] = n_blocks - 1;
        k--;
    }
    return take_top(score, used, n_blocks, sel, count, k);
}

uint64_t select_random_key(uint64_t seed, int pos, int layer, int head) {
    uint64_t x = lmc_mix64(seed);
    x = lmc_mix64(x ^ (uint64_t)(uint32_t)pos);
    x = lmc_mix64(x ^ (uint64_t)(uint32_t)layer);
    return lmc_mix64(x ^ (uint64_t)(uint32_t)head);
}

/* ---------------------------------------------------------------- the seed rule */

/* probe rows scored in one batch (more probes per block fall back to one at a time) */
#define LMC_MAX_PROBE_ROWS 64

/* probe keys are scored this many rows at a time with the next as many prefetched, as
 * attn_blocks streams keys: the hardware prefetcher alone ran a quarter behind exact's rate
 * per byte on an AMD EPYC host (bench/attention.py at 32K, 15 alternating rounds: probe stage
 * 5.5 -> 4.4 ms; 4 rows as good as 8 and better than 16 or 32, same bits) */
#define PROBE_STREAM_ROWS 4
/* ... and fetched this many rows (8 KiB) ahead of the rows being scored: fetching only the
 * next 4 left the probe stage at 1.3-1.6x exact's time per byte on the Zen 5 host (issue 40;
 * attn-bench 32K, 2 layers, v4, 7 alternating rounds: probe min 1.25 -> 1.07 ms, 32 rows
 * ahead no better); same bits, only the fetch moves */
#define PROBE_AHEAD_ROWS 16

/* the max of each block's n probe scores d[g * stride + i * n ...] into best[g] (in probe
 * order, as probe_block) */
static void probe_max(const float *d, size_t stride, int nq, int n, float *best) {
    for (int g = 0; g < nq; g++) {
        best[g] = -INFINITY;
        for (int i = 0; i < n; i++)
            if (d[g * stride + (size_t)i] > best[g]) best[g] = d[g * stride + (size_t)i];
    }
}

/* probe scores of block b for nq query heads of one KV head (qs: nq x head_dim): the max of
 * q.k over keys at the uniform stride inside the block (unscaled dot products; the 1/sqrt(d)
 * scale would not change the order). f32 keys: the probed rows are scored 4 at a time for
 * every head at once (dot_rows_f32_x: each row read once, same bits as one by one), and the
 * next block's probe rows are prefetched (probe rows are step rows apart: each its own miss). */
static void probe_block(const SelectConfig *cfg, const SelectInput *in, const float *qs, int nq, int b,
                        size_t *rows, float *best) {
    const KVCache *kv = in->kv;
    int bs = cfg->block, D = kv->head_dim;
    int p0 = b * bs, p1 = block_end(b, bs, in->n_pos);
    int step = (p1 - p0) / cfg->probes;
    if (step < 1) step = 1;
    int n = (p1 - p0 + step - 1) / step;
    for (int g = 0; g < nq; g++) best[g] = -INFINITY;
    *rows += (size_t)n;
    if (!kv->q8 && n <= LMC_MAX_PROBE_ROWS) {
        size_t stride = (size_t)D; /* consecutive positions of one head (kvcache.h) */
        const float *k0 = kv->k + kv_row(kv, in->layer, p0, in->kvh) * stride;
        for (int i = 0; i < n; i++) /* the next block's rows at the same offsets */
            lmc_prefetch_floats(k0 + ((size_t)bs + (size_t)i * step) * stride, D);
        float d[ATTN_MAX_GROUP * LMC_MAX_PROBE_ROWS];
        dot_rows_f32_x(qs, (size_t)D, nq, k0, (size_t)step * stride, n, D, d, (size_t)n);
        probe_max(d, (size_t)n, nq, n, best);
        return;
    }
    for (int p = p0; p < p1; p += step)
        for (int g = 0; g < nq; g++) {
            float d = kv_key_dot(kv, in->layer, p, in->kvh, qs + (size_t)g * D);
            if (d > best[g]) best[g] = d;
        }
}

void select_probe_group(const SelectConfig *cfg, const SelectInput *in, const float *qs, int nq, float *scores,
                        size_t stride, size_t *rows) {
    const KVCache *kv = in->kv;
    int n_blocks = (in->n_pos + cfg->block - 1) / cfg->block, b = 0;
    float best[ATTN_MAX_GROUP];
    if (kv->pk && kv->pk_rows <= LMC_MAX_PROBE_ROWS) {
        /* full blocks from the probe keys (kvcache.h): the same rows, read as one stream, the
         * probe rows of several blocks scored in one batch, 4 rows at a time */
        int n = kv->pk_rows, per_batch = LMC_MAX_PROBE_ROWS / n, full = in->n_pos / cfg->block;
        int D = kv->head_dim;
        float d[ATTN_MAX_GROUP * LMC_MAX_PROBE_ROWS];
        for (; b < full; b += per_batch) {
            int nb = full - b < per_batch ? full - b : per_batch;
            const float *keys = kv_probe_keys(kv, in->layer, b, in->kvh);
            for (int r = 0; r < nb * n; r += PROBE_STREAM_ROWS) {
                int c = nb * n - r < PROBE_STREAM_ROWS ? nb * n - r : PROBE_STREAM_ROWS;
                lmc_prefetch_floats(keys + (size_t)(r + PROBE_AHEAD_ROWS) * D, PROBE_STREAM_ROWS * D);
                dot_rows_f32_x(qs, (size_t)D, nq, keys + (size_t)r * D, (size_t)D, c, D, d + r, (size_t)(nb * n));
            }
            for (int j = 0; j < nb; j++) {
                probe_max(d + (size_t)j * n, (size_t)(nb * n), nq, n, best);
                for (int g = 0; g < nq; g++) scores[(size_t)g * stride + (size_t)(b + j)] = best[g];
            }
        }
        *rows += (size_t)full * (size_t)n;
        b = full;
    }
    for (; b < n_blocks; b++) {
        probe_block(cfg, in, qs, nq, b, rows, best);
        for (int g = 0; g < nq; g++) scores[(size_t)g * stride + (size_t)b] = best[g];
    }
}

int select_tile_blocks(const SelectConfig *cfg, const SelectInput *in, const float *qs, int nq, int want,
                       float *probe, SelectScratch *s, int *sel) {
    int n_blocks = in->n_pos / cfg->block;
    size_t rows = 0;
    select_probe_group(cfg, in, qs, nq, probe, (size_t)n_blocks, &rows);
    for (int b = 0; b < n_blocks; b++) {
        float sum = 0.0f;
        for (int g = 0; g < nq; g++) sum += probe[(size_t)g * n_blocks + b];
        s->score[b] = sum;
        s->used[b] = 0;
    }
    int count = take_top(s->score, s->used, n_blocks, sel, 0, want < n_blocks ? want : n_blocks);
    for (int i = 1; i < count; i++) /* ascending, as the kernel reads them */
        for (int j = i; j > 0 && sel[j] < sel[j - 1]; j--) {
            int x = sel[j];
            sel[j] = sel[j - 1];
            sel[j - 1] = x;
        }
    return count;
}

static int select_sparse(const SelectConfig *cfg, const SelectInput *in, SelectScratch *s,
                         int n_blocks, int *sel, size_t *bytes) {
    const KVCache *kv = in->kv;
    int bs = cfg->block, D = kv->head_dim;
    /* probed for the whole GQA group already (select_probe_group), or here */
    const float *probe = in->probe_scores ? in->probe_scores : s->score;
    size_t rows = 0;
    int full_blocks = in->n_pos / bs;
    if (in->probe_scores) {
        rows = in->probe_rows;
    } else if (cfg->probe_summary && kv->ksum) {
        /* centroid probes: one precomputed row per full block instead of `probes` keys */
        for (int b = 0; b < n_blocks; b++) {
            if (b >= full_blocks) {
                probe_block(cfg, in, in->q, 1, b, &rows, &s->score[b]);
                continue;
            }
            const float *sum = kv->ksum + kv_summary_index(kv, in->layer, b, in->kvh);
            s->score[b] = dot_f32(in->q, sum, D) * (1.0f / (float)bs);
            *bytes += sizeof(float) * (size_t)D;
        }
    } else {
        select_probe_group(cfg, in, in->q, 1, s->score, (size_t)n_blocks, &rows);
    }
    *bytes += rows * kv_row_bytes(kv);

    int count = 0, n_imp = 0;
    if (cfg->importance && in->importance) {
        *bytes += sizeof(float) * (size_t)in->n_pos;
        if (in->imp_picks) {
            n_imp = in->n_imp_picks;
            memcpy(sel, in->imp_picks, sizeof(int) * (size_t)n_imp);
            for (int i = 0; i < n_imp; i++) s->used[sel[i]] = 1;
        } else {
            n_imp = select_importance(cfg, in->importance, in->n_pos, s->aux, s->used, sel);
        }
        count = n_imp;
    }
    count = take_top(probe, s->used, n_blocks, sel, count, cfg->k - count);

    /* recency insurance: the last block replaces the lowest-ranked probe pick (the last one
     * taken, since picks come in descending score order); importance picks stay */
    int last = n_blocks - 1;
    if (cfg->recency && !s->used[last] && count > n_imp) {
        s->used[sel[count - 1]] = 0;
        sel[count - 1] = last;
        s->used[last] = 1;
    }
    return count;
}

int select_importance(const SelectConfig *cfg, const float *importance, int n_pos, float *sums,
                      unsigned char *used, int *picks) {
    int n_blocks = (n_pos + cfg->block - 1) / cfg->block;
    block_sums(importance, n_pos, cfg->block, n_blocks, sums);
    memset(used, 0, (size_t)n_blocks);
    return take_top(sums, used, n_blocks, picks, 0, (cfg->k + 1) / 2);
}

/* ---------------------------------------------------------------- the zoo */

static int select_window(const SelectConfig *cfg, int n_blocks, int *sel) {
    if (cfg->k >= n_blocks) {
        for (int b = 0; b < n_blocks; b++) sel[b] = b;
        return n_blocks;
    }
    int count = 0;
    sel[count++] = 0; /* the attention sink */
    for (int b = n_blocks - (cfg->k - 1); b < n_blocks; b++) sel[count++] = b;
    return count;
}

static int select_quest(const SelectConfig *cfg, const SelectInput *in, SelectScratch *s,
                        int n_blocks, int *sel, size_t *bytes) {
    const KVCache *kv = in->kv;
    int D = kv->head_dim;
    for (int b = 0; b < n_blocks; b++) {
        size_t off = kv_summary_index(kv, in->layer, b, in->kvh);
        const float *mn = kv->kmin + off, *mx = kv->kmax + off;
        float score = 0.0f;
        /* sum_i max(q_i min_i, q_i max_i) bounds q.k from above for every key in the block */
        for (int i = 0; i < D; i++) score += fmaxf(in->q[i] * mn[i], in->q[i] * mx[i]);
        s->score[b] = score;
    }
    *bytes += 2 * sizeof(float) * (size_t)D * (size_t)n_blocks;
    return top_k_with_recency(cfg, s->score, s->used, n_blocks, sel);
}

static int select_random(const SelectConfig *cfg, const SelectInput *in, SelectScratch *s,
                         int n_blocks, int *sel) {
    /* candidates: every block except a kept last one, ascending; a partial Fisher-Yates
     * shuffle draws from them: for draw i, j = i + next() % (m - i), swap(c[i], c[j]) */
    int count = 0, m = 0;
    int *cand = s->order;
    if (cfg->recency) sel[count++] = n_blocks - 1;
    for (int b = 0; b < n_blocks - (cfg->recency ? 1 : 0); b++) cand[m++] = b;
    int want = cfg->k - count;
    if (want > m) want = m;
    uint64_t state = select_random_key(cfg->seed, in->n_pos - 1, in->layer, in->head);
    for (int i = 0; i < want; i++) {
        state = lmc_mix64(state);
        int j = i + (int)(state % (uint64_t)(m - i));
        int t = cand[i];
        cand[i] = cand[j];
        cand[j] = t;
        sel[count++] = cand[i];
    }
    return count;
}

/* ---------------------------------------------------------------- entry points */

KVLayout kv_layout_for(const SelectConfig *cfg) {
    int probing = policy_has(cfg->policy, T_PROBES); /* what select_probe_group reads */
    return (KVLayout){
        .minmax = cfg->policy == POL_QUEST,
        .sum = probing && cfg->probe_summary,
        .probes = probing && !cfg->probe_summary ? cfg->probes : 0,
    };
}

int select_blocks(const SelectConfig *cfg, const SelectInput *in, SelectScratch *s, int *sel,
                  size_t *select_bytes) {
    int n_blocks = (in->n_pos + cfg->block - 1) / cfg->block;
    size_t bytes = 0;
    int count;
    memset(s->used, 0, (size_t)n_blocks);
    if (in->evicted) { /* eviction decided what is left: attend to all of it */
        count = 0;
        for (int b = 0; b < n_blocks; b++)
            if (!in->evicted[b]) sel[count++] = b;
        *select_bytes = 0;
        return count;
    }
    if (cfg->policy == POL_EXACT || cfg->k >= n_blocks) {
        /* every block fits the budget: no choice to make, nothing to read */
        for (int b = 0; b < n_blocks; b++) sel[b] = b;
        *select_bytes = 0;
        return n_blocks;
    }
    switch (cfg->policy) {
    case POL_SPARSE: count = select_sparse(cfg, in, s, n_blocks, sel, &bytes); break;
    case POL_WINDOW: count = select_window(cfg, n_blocks, sel); break;
    case POL_H2O:
        block_sums(in->mass, in->n_pos, cfg->block, n_blocks, s->score);
        bytes = sizeof(float) * (size_t)in->n_pos;
        count = top_k_with_recency(cfg, s->score, s->used, n_blocks, sel);
        break;
    case POL_H2O_PREV:
    case POL_GBM:
        block_sums(in->key_score, in->n_pos, cfg->block, n_blocks, s->score);
        bytes = sizeof(float) * (size_t)in->n_pos;
        count = top_k_with_recency(cfg, s->score, s->used, n_blocks, sel);
        break;
    case POL_QUEST: count = select_quest(cfg, in, s, n_blocks, sel, &bytes); break;
    case POL_RANDOM: count = select_random(cfg, in, s, n_blocks, sel); break;
    case POL_ORACLE:
        block_sums(in->probs, in->n_pos, cfg->block, n_blocks, s->score);
        /* the oracle needs every key to know the true mass */
        bytes = (size_t)in->n_pos * kv_row_bytes(in->kv);
        count = take_top(s->score, s->used, n_blocks, sel, 0, cfg->k);
        break;
    default: count = 0; break;
    }
    qsort(sel, (size_t)count, sizeof(int), lmc_cmp_int);
    *select_bytes = bytes;
    return count;
}
