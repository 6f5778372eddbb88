/* evict.c — see evict.h */
#include "evict.h"

#include <math.h>

#include "attn_kernel.h"

/* oracle: exact attention of the query over the cached blocks, by the kernel every policy
 * uses, summed per block (into score; exact_out and the oracle's block list are scratch) */
static void oracle_block_mass(Attention *a, int layer, int h, int n_pos, const float *q,
                              const unsigned char *gone, float *score) {
    int bs = a->kv->block, n_blocks = (n_pos + bs - 1) / bs, n = 0;
    int *cached = a->diag.oracle_sel + (size_t)h * a->n_blocks;
    float *probs = a->diag.exact_probs + (size_t)h * a->capacity;
    for (int b = 0; b < n_blocks; b++) {
        score[b] = 0.0f;
        if (!gone || !gone[b]) cached[n++] = b;
    }
    attn_blocks(q, 1, a->kv, layer, h / (a->n_heads / a->n_kv), n_pos, cached, NULL, n,
                a->diag.exact_out + (size_t)h * a->head_dim, a->head.kscratch + (size_t)h * bs, probs, 0);
    for (int i = 0; i < n; i++) {
        int p0 = cached[i] * bs, p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        for (int p = p0; p < p1; p++) score[cached[i]] += probs[p];
    }
}

const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q,
                                const unsigned char *gone) {
    float *score = a->head.select[h].score;
    /* a ranking by exact attention (T_EXACT_SCORES) needs that attention first, which select_blocks
     * only reads: computed here over the blocks still cached */
    if (policy_has(a->opt.sel.policy, T_EXACT_SCORES)) {
        oracle_block_mass(a, layer, h, pos + 1, q, gone, score);
        return score;
    }
    if (pos < a->kv->block) { /* one block: nothing to rank (select_blocks would not score) */
        score[0] = 0.0f;
        return score;
    }
    /* the policy's own selection scores every block into its scratch before it picks the top
     * k; k = 1 below the block count makes it score them all, and the choice is discarded
     * (written into the oracle's row of head h, unused while eviction runs) */
    SelectConfig cfg = a->opt.sel;
    cfg.k = 1;
    cfg.importance = 0;
    SelectInput in = {.q = q, .kv = a->kv, .layer = layer, .kvh = h / (a->n_heads / a->n_kv), .head = h,
                      .n_pos = pos + 1};
    size_t bytes = 0;
    select_blocks(&cfg, &in, &a->head.select[h], a->diag.oracle_sel + (size_t)h * a->n_blocks, &bytes);
    return score;
}

/* ---------------------------------------------------------------- keys, eviction, ranking */

/* h2o-prev, gbm: every key's score for this query and layer, one chunk of keys per item (each
 * key on its own: same bits for any --threads) */
#define SCORE_CHUNK 64

typedef struct {
    Attention *a;
    int layer, pos;
} ScoreJob;

static void score_keys(void *arg, int begin, int end) {
    const ScoreJob *job = arg;
    const Attention *a = job->a;
    const Gbm *g = a->opt.gbm;
    float x[GBM_MAX_FEATURES];
    for (int c = begin; c < end; c++)
        for (int j = c * SCORE_CHUNK; j < (c + 1) * SCORE_CHUNK && j <= job->pos; j++) {
            if (!g && job->layer == 0) { /* h2o-prev, first layer: accumulated mass, all heads */
                float m = 0.0f;
                for (int h = 0; h < a->n_heads; h++) m += a->state.mass[(size_t)h * a->capacity + j];
                a->keys.key_score[j] = m;
                continue;
            }
            if (!g) { /* h2o-prev: the previous layer's mass for this query */
                a->keys.key_score[j] = keyfeat_value(a->keys.feat, job->layer, j, KF_PREV_MASS);
                continue;
            }
            for (int i = 0; i < g->n_features; i++)
                x[i] = keyfeat_value(a->keys.feat, job->layer, j, a->keys.gbm_cols[i]);
            /* the trees predict ln(mass + 1e-6); blocks are ranked by summed predicted mass */
            a->keys.key_score[j] = (float)exp(gbm_predict(g, job->layer, x));
        }
}

/* --kv-budget: the score that keeps key p of head h (higher: kept longer), by the policy's kind
 * of keep score (policy.h: window keeps the newest, h2o the most mass, random draws a fixed value
 * per (seed, layer, head, key), h2o-prev and gbm score keys for the query); KEEP_BLOCKS scores
 * blocks, not keys (evict.h) */
static float keep_score(const Attention *a, int layer, int h, int p) {
    switch (POLICIES[a->opt.sel.policy].keep) {
    case KEEP_NEWEST: return (float)p;
    case KEEP_MASS: return a->state.mass[((size_t)layer * a->n_heads + h) * a->capacity + p];
    case KEEP_DRAW: return (float)(select_random_key(a->opt.sel.seed, p, layer, h) >> 40);
    default: return a->keys.key_score[p]; /* KEEP_KEY_SCORE */
    }
}

void evict_score_keys(Attention *a, int layer, int pos) {
    ScoreJob job = {a, layer, pos};
    pool_run(a->pool, score_keys, &job, (pos + SCORE_CHUNK) / SCORE_CHUNK);
}

/* paging: a KV head's block goes back to the cache once every query head of its group has
 * dropped it (the group's heads choose on their own; the union of what they keep stays) */
static void release_evicted(Attention *a, int layer, int n_blocks) {
    int group = a->n_heads / a->n_kv;
    for (int kvh = 0; kvh < a->n_kv; kvh++) {
        const unsigned char *gone = a->evict.evicted + ((size_t)layer * a->n_heads + (size_t)kvh * group) * a->n_blocks;
        for (int b = 0; b < n_blocks - 1; b++) {
            if (!kv_block_held(a->kv, layer, kvh, b)) continue;
            int all = 1;
            for (int g = 0; g < group && all; g++) all = gone[(size_t)g * a->n_blocks + b];
            if (all) kv_release_block(a->kv, layer, kvh, b);
        }
    }
}

void evict_blocks(Attention *a, int layer, int pos, const float *q_all) {
    int bs = a->kv->block, n_pos = pos + 1, n_blocks = (n_pos + bs - 1) / bs;
    int keep = a->opt.kv_budget / bs;
    int first = POLICIES[a->opt.sel.policy].keep == KEEP_NEWEST ? 1 : 0; /* the sink stays */
    for (int h = 0; h < a->n_heads; h++) {
        unsigned char *gone = a->evict.evicted + ((size_t)layer * a->n_heads + h) * a->n_blocks;
        int live = 0;
        for (int b = 0; b < n_blocks; b++) live += !gone[b];
        const float *block_score = live > keep && policy_keeps_blocks(a->opt.sel.policy)
                                       ? evict_block_scores(a, layer, h, pos, q_all + (size_t)h * a->head_dim, gone)
                                       : NULL;
        while (live > keep) {
            int worst = -1;
            float worst_score = 0.0f;
            for (int b = first; b < n_blocks - 1; b++) {
                if (gone[b]) continue;
                float sc = 0.0f;
                if (block_score) sc = block_score[b];
                else
                    for (int p = b * bs; p < (b + 1) * bs; p++) sc += keep_score(a, layer, h, p);
                if (worst < 0 || sc < worst_score) {
                    worst = b;
                    worst_score = sc;
                }
            }
            if (worst < 0) break;
            gone[worst] = 1;
            live--;
        }
    }
    if (a->kv->paged) release_evicted(a, layer, n_blocks);
}

void evict_rank_scores(Attention *a, int layer, int pos, const float *q_all) {
    float *score = a->keys.rank->score;
    if (policy_keeps_blocks(a->opt.sel.policy)) { /* a key scores as its block */
        int bs = a->kv->block;
        for (int p = 0; p <= pos; p++) score[p] = 0.0f;
        for (int h = 0; h < a->n_heads; h++) {
            const float *block_score = evict_block_scores(a, layer, h, pos, q_all + (size_t)h * a->head_dim, NULL);
            for (int p = 0; p <= pos; p++) score[p] += block_score[p / bs];
        }
        return;
    }
    for (int p = 0; p <= pos; p++) {
        float s = 0.0f;
        for (int h = 0; h < a->n_heads; h++) s += keep_score(a, layer, h, p);
        score[p] = s;
    }
}
