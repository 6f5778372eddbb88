/* select.h — which KV blocks a query head attends to: the seed's sparse rule and the zoo.
 *
 * All policies pick at most --k blocks of --block positions; the same kernel (attn_blocks)
 * then attends to the chosen blocks. Block b covers positions [b*block, min((b+1)*block,
 * n_pos)); the last block may be partial. Ties always go to the lower block index. */
#ifndef LMC_SELECT_H
#define LMC_SELECT_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "policy.h"

typedef struct {
    Policy policy;
    int k, block, probes;
    int importance;    /* sparse: reserve (k+1)/2 blocks by prefill importance */
    int recency;       /* keep the last block (the policies of SWITCHES[SW_RECENCY]) */
    int probe_summary; /* sparse: probe full blocks by their key centroid, not sampled keys */
    uint64_t seed;     /* random */
} SelectConfig;

typedef struct {
    const float *q; /* the query head, head_dim floats */
    const KVCache *kv;
    int layer, kvh, head;
    int n_pos;               /* visible positions 0 .. n_pos-1 */
    const float *importance; /* sparse: prefill importance per position, or NULL (none yet) */
    const float *mass;       /* h2o: accumulated attention mass per position */
    const float *probs;      /* oracle: exact attention probabilities per position */
    /* h2o-prev, gbm: the score of each position (higher: keep); evict.c fills it: the previous
     * layer's attention mass, or the predictor's estimate of this layer's */
    const float *key_score;
    /* --kv-budget: blocks dropped from this head's cache for good (1 = evicted), or NULL;
     * with it the head attends to every block still cached */
    const unsigned char *evicted;
    /* sparse: this head's probe score per block, already computed for its GQA group
     * (select_probe_group), and the probe rows to charge it (the group's rows once); NULL:
     * the head probes for itself */
    const float *probe_scores;
    size_t probe_rows;
    /* sparse: the importance reservation, already chosen for this layer and step (it is the
     * same for every head: select_importance), n_imp_picks blocks in pick order; NULL: the
     * head chooses it itself from importance */
    const int *imp_picks;
    int n_imp_picks;
} SelectInput;

/* per-thread scratch, sized for the cache's block count */
typedef struct {
    float *score, *aux;
    int *order; /* random: the candidate blocks being shuffled */
    unsigned char *used;
} SelectScratch;

void select_scratch_init(SelectScratch *s, int n_blocks);
void select_scratch_free(SelectScratch *s);

/* Choose blocks; writes them ascending to sel (room for the cache's n_blocks) and returns
 * the count. *select_bytes gets the bytes read to make the choice (probe keys, summaries,
 * importance or mass arrays). */
int select_blocks(const SelectConfig *cfg, const SelectInput *in, SelectScratch *s, int *sel,
                  size_t *select_bytes);

/* Sparse probing for nq <= ATTN_MAX_GROUP query heads of one KV head (qs: nq x head_dim,
 * in->q unused) over every block: scores[g * stride + b], bit for bit what each head's own
 * probing computes, each probe row read once for the group; *rows += the rows read. Sampled
 * keys only (not --probe-summary). */
void select_probe_group(const SelectConfig *cfg, const SelectInput *in, const float *qs, int nq, float *scores,
                        size_t stride, size_t *rows);

/* Sparse prefill's blocks for a tile of queries (attn_causal_tile): the blocks before the tile
 * (in->n_pos positions, whole blocks) probed with qs (nq x head_dim: each head's mean query
 * over the tile), scored by the sum over the heads, the best `want` (ties: the lower index)
 * written ascending to sel; returns the count. probe (nq x the blocks) and s are scratch. */
int select_tile_blocks(const SelectConfig *cfg, const SelectInput *in, const float *qs, int nq, int want,
                       float *probe, SelectScratch *s, int *sel);

/* The seed's importance reservation: the (k + 1) / 2 blocks of the highest prefill importance
 * summed over their positions (ties: the lower index), in pick order, into picks; sums (one
 * float per block) gets the block sums, used (one flag per block) 1 for the picks. Returns the
 * count. */
int select_importance(const SelectConfig *cfg, const float *importance, int n_pos, float *sums,
                      unsigned char *used, int *picks);

/* the random policy's stream for one (query position, layer, head); documented in README */
uint64_t select_random_key(uint64_t seed, int pos, int layer, int head);

/* the per-block key summaries the cache must keep for cfg's selection: quest's key min/max,
 * sparse's key sums (--probe-summary) or probe keys (sampled probes) */
KVLayout kv_layout_for(const SelectConfig *cfg);

#endif
