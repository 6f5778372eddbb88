/* evict.c — see evict.h */
#include "evict.h"

int evict_scores_blocks(Policy p) { return p == POL_SPARSE || p == POL_QUEST; }

const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q) {
    /* the policy's own selection scores every block into its scratch before it picks the top
     * k; k = 1 below the block count makes it score them all, and the choice is discarded
     * (written into the oracle's row of head h, unused while eviction runs) */
    if (pos < a->kv->block) { /* one block: nothing to rank (select_blocks would not score) */
        a->scratch[h].score[0] = 0.0f;
        return a->scratch[h].score;
    }
    SelectConfig cfg = a->opt.sel;
    cfg.k = 1;
    cfg.importance = 0;
    SelectInput in = {.q = q, .kv = a->kv, .layer = layer, .kvh = h / (a->n_heads / a->n_kv), .head = h,
                      .n_pos = pos + 1};
    size_t bytes = 0;
    select_blocks(&cfg, &in, &a->scratch[h], a->oracle_sel + (size_t)h * a->n_blocks, &bytes);
    return a->scratch[h].score;
}
