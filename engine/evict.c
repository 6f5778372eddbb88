/* evict.c — see evict.h */
#include "evict.h"

#include "attention.h"

int evict_scores_blocks(Policy p) { return p == POL_SPARSE || p == POL_QUEST || p == POL_ORACLE; }

/* oracle: exact attention of the query over the cached blocks, by the kernel every policy
 * uses, summed per block (into score; exact_out and the oracle's block list are scratch) */
static void oracle_block_mass(Attention *a, int layer, int h, int n_pos, const float *q,
                              const unsigned char *gone, float *score) {
    int bs = a->kv->block, n_blocks = (n_pos + bs - 1) / bs, n = 0;
    int *cached = a->oracle_sel + (size_t)h * a->n_blocks;
    float *probs = a->exact_probs + (size_t)h * a->capacity;
    for (int b = 0; b < n_blocks; b++) {
        score[b] = 0.0f;
        if (!gone || !gone[b]) cached[n++] = b;
    }
    attn_blocks(q, 1, a->kv, layer, h / (a->n_heads / a->n_kv), n_pos, cached, NULL, n,
                a->exact_out + (size_t)h * a->head_dim, a->kscratch + (size_t)h * bs, probs, 0);
    for (int i = 0; i < n; i++) {
        int p0 = cached[i] * bs, p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        for (int p = p0; p < p1; p++) score[cached[i]] += probs[p];
    }
}

const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q,
                                const unsigned char *gone) {
    float *score = a->scratch[h].score;
    if (a->opt.sel.policy == POL_ORACLE) {
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
    select_blocks(&cfg, &in, &a->scratch[h], a->oracle_sel + (size_t)h * a->n_blocks, &bytes);
    return score;
}
