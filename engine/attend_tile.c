/* attend_tile.c — see attend_layer.h: prefill a tile of queries at a time (attn_causal_tile):
 * which prefills can (attention_tiles_prefill, attention_tiles_evicting), the blocks a tile
 * attends (every block, the sparse tile's choice, or what --kv-budget keeps), and the prefill
 * importance the tiles record. */
#include "attend_internal.h"

#include <string.h>

#include "attn_kernel.h"

/* ---------------------------------------------------------------- prefill tiles */

/* what either of the prefill tiles that record the prefill importance (T_IMPORTANCE) leaves
 * out: the reference, eviction, state kept per query (H2O mass, key features), a different
 * layer 0 */
static int importance_tiles_possible(const Attention *a) {
    const AttnOptions *o = &a->opt;
    return a->state.importance && !o->reference && !a->evict.evicted && !a->state.mass && !a->keys.feat &&
           !o->exact_first_layer;
}

/* sparse prefill a tile at a time, the tile's blocks chosen by probing (T_PROBES;
 * attention_tiles_prefill) */
static int sparse_tiles(const Attention *a) {
    return a->opt.prefill_sparse && policy_has(a->opt.sel.policy, T_PROBES) && a->tile.keep &&
           !a->opt.sel.probe_summary && importance_tiles_possible(a);
}

/* the exact prefill of a policy that records the prefill importance, a tile at a time: every
 * block, with the probabilities recomputed for the importance after each tile
 * (attention_tiles_prefill) */
static int importance_tiles(const Attention *a) {
    return !a->opt.prefill_sparse && !a->keys.rank && importance_tiles_possible(a);
}

int attention_tiles_evicting(const Attention *a) {
    return a->evict.evicted && a->opt.prefill_sparse && !a->state.importance && !a->keys.feat && !a->opt.reference &&
           !a->stages.ms;
}

int attention_tiles_prefill(const Attention *a) {
    int exact = grouped_exact(a, ATTN_PREFILL) && !needs_probs(a, ATTN_PREFILL);
    return ((exact || sparse_tiles(a) || importance_tiles(a)) && !a->stages.ms) || attention_tiles_evicting(a);
}

typedef struct {
    Attention *a;
    int layer, pos0, n;
    const float *q_all;
    float *out_all;
} TileJob;

/* sparse prefill: the blocks of the tile at pos0 .. pos0 + T - 1 for n_q heads from h0 (q:
 * the tile's first query, head h0), into sel; returns the count */
static int tile_blocks(const TileJob *job, int kvh, int h0, int n_q, int pos0, int T, const float *q, int *sel) {
    Attention *a = job->a;
    PrefillTile *pt = &a->tile;
    int D = a->head_dim, bs = a->kv->block, first = pos0 / bs, last = (pos0 + T - 1) / bs;
    size_t Q = (size_t)a->n_heads * D;
    int count = 0;
    if (first > 0) {
        float *mean = pt->mean + (size_t)kvh * pt->n_q * D;
        for (int g = 0; g < n_q; g++)
            for (int d = 0; d < D; d++) {
                float sum = 0.0f;
                for (int t = 0; t < T; t++) sum += q[(size_t)t * Q + (size_t)g * D + d];
                mean[(size_t)g * D + d] = sum / (float)T;
            }
        SelectInput in = {.kv = a->kv, .layer = job->layer, .kvh = kvh, .head = h0, .n_pos = first * bs};
        count = select_tile_blocks(&a->opt.sel, &in, mean, n_q, a->opt.sel.k - 1,
                                   a->sparse.probe_scores + (size_t)h0 * a->n_blocks, &a->head.select[h0], sel);
    }
    for (int b = first; b <= last; b++) sel[count++] = b;
    return count;
}

/* --kv-budget: how many of the n_q heads from h0 keep the blocks head h0 keeps (they then
 * share a pass) */
static int heads_keeping_alike(const Attention *a, int layer, int h0, int n_q, int n_blocks) {
    const unsigned char *gone = a->evict.evicted + ((size_t)layer * a->n_heads + h0) * a->n_blocks;
    int n = 1;
    while (n < n_q && !memcmp(gone, gone + (size_t)n * a->n_blocks, (size_t)n_blocks)) n++;
    return n;
}

/* --kv-budget: the blocks up to n_blocks that head h keeps, ascending, into blocks; the count */
static int kept_blocks(const Attention *a, int layer, int h, int n_blocks, int *blocks) {
    const unsigned char *gone = a->evict.evicted + ((size_t)layer * a->n_heads + h) * a->n_blocks;
    int n = 0;
    for (int b = 0; b < n_blocks; b++)
        if (!gone[b]) blocks[n++] = b;
    return n;
}

/* KV head kvh's query heads over the chunk, ATTN_TILE_QUERIES queries and n_q heads a pass */
static void tile_groups(void *arg, int begin, int end) {
    const TileJob *job = arg;
    Attention *a = job->a;
    PrefillTile *pt = &a->tile;
    int D = a->head_dim, group = a->n_heads / a->n_kv, sparse = sparse_tiles(a), every = importance_tiles(a);
    int evicting = attention_tiles_evicting(a), bs = a->kv->block;
    size_t Q = (size_t)a->n_heads * D, vecs = (size_t)ATTN_TILE_QUERIES * (size_t)pt->n_q;
    size_t row = sparse ? (size_t)pt->keep * bs : (size_t)bs;
    for (int kvh = begin; kvh < end; kvh++)
        for (int h0 = kvh * group, n_q; h0 < (kvh + 1) * group; h0 += n_q) {
            n_q = (kvh + 1) * group - h0 < pt->n_q ? (kvh + 1) * group - h0 : pt->n_q;
            int n_blocks = (job->pos0 + job->n - 1) / bs + 1; /* up to the last query's */
            /* h2o: a head at a time, its queries' probabilities added to its own mass */
            if (evicting) n_q = a->state.mass ? 1 : heads_keeping_alike(a, job->layer, h0, n_q, n_blocks);
            for (int t0 = 0; t0 < job->n; t0 += ATTN_TILE_QUERIES) {
                int T = job->n - t0 < ATTN_TILE_QUERIES ? job->n - t0 : ATTN_TILE_QUERIES;
                size_t at = (size_t)t0 * Q + (size_t)h0 * D;
                TileBlocks sel = {0};
                if (evicting) { /* the blocks the heads keep (the queries lie in one block) */
                    int *blocks = a->head.sel + (size_t)h0 * a->n_blocks;
                    int n = kept_blocks(a, job->layer, h0, n_blocks, blocks);
                    /* h2o: the probabilities computed again after the pass and added query by
                     * query, as head_after_kernel adds them */
                    float *mass = a->state.mass ? a->state.mass + ((size_t)job->layer * a->n_heads + h0) * a->capacity
                                                : NULL;
                    sel = (TileBlocks){blocks, n, (size_t)bs, NULL, mass, 1};
                } else if (every) { /* exact: every block up to the tile's last query */
                    int *blocks = a->head.sel + (size_t)h0 * a->n_blocks, n = (job->pos0 + t0 + T - 1) / a->kv->block + 1;
                    for (int b = 0; b < n; b++) blocks[b] = b;
                    sel = (TileBlocks){blocks, n, (size_t)a->kv->block, NULL, pt->importance + (size_t)kvh * a->capacity, 1};
                } else if (sparse) {
                    int *blocks = a->head.sel + (size_t)h0 * a->n_blocks;
                    sel = (TileBlocks){blocks, tile_blocks(job, kvh, h0, n_q, job->pos0 + t0, T, job->q_all + at, blocks),
                                       row, pt->weights + (size_t)kvh * vecs * (size_t)a->kv->block,
                                       pt->importance + (size_t)kvh * a->capacity, 0};
                    if (job->layer == 0 && a->dump.sel) /* each query and head of the tile attends them */
                        for (int t = 0; t < T; t++)
                            for (int g = 0; g < n_q; g++) dump_blocks(a, job->pos0 + t0 + t, h0 + g, blocks, sel.n);
                }
                attn_causal_tile(job->q_all + at, n_q, T, Q, a->kv, job->layer, kvh, job->pos0 + t0,
                                 job->out_all + at, Q, pt->q + (size_t)kvh * vecs * D,
                                 pt->scores + (size_t)kvh * vecs * row, pt->m + (size_t)kvh * vecs,
                                 pt->l + (size_t)kvh * vecs, sparse || every || evicting ? &sel : NULL,
                                 pt->q8_scratch ? pt->q8_scratch + (size_t)kvh * ATTN_TILE_Q8_FLOATS(a->kv->block, D, pt->n_q)
                                                : NULL);
            }
        }
}

void attend_prefill_tile(Attention *a, int layer, int pos0, int n, const float *q_all, float *out_all) {
    TileJob job = {a, layer, pos0, n, q_all, out_all};
    dump_queries(a, layer, pos0, n, q_all);
    int record = sparse_tiles(a) || importance_tiles(a), n_pos = pos0 + n;
    if (record)
        for (int kvh = 0; kvh < a->n_kv; kvh++)
            memset(a->tile.importance + (size_t)kvh * a->capacity, 0, sizeof(float) * (size_t)n_pos);
    pool_run(a->pool, tile_groups, &job, a->n_kv);
    if (!record) return;
    float *imp = a->state.importance + (size_t)layer * a->capacity; /* KV heads in order */
    for (int kvh = 0; kvh < a->n_kv; kvh++) {
        const float *part = a->tile.importance + (size_t)kvh * a->capacity;
        for (int p = 0; p < n_pos; p++) imp[p] += part[p];
    }
}
