/* evict.h — keep scores and what uses them: --kv-budget eviction and --measure-keys ranking.
 * Key-scoring policies keep a score per key (window: the newest, h2o: accumulated mass, random:
 * a fixed draw, h2o-prev and gbm: Attention.keys.key_score); block-scoring ones (sparse, quest,
 * oracle) give each block the score their per-query selection (select.c) ranks by. Which kind
 * a policy has is POLICIES[].keep (policy.h): this file branches on the kind, not the policy. */
#ifndef LMC_EVICT_H
#define LMC_EVICT_H

#include "attend_layer.h"

/* head h's score of every block 0 .. pos / block for the query at pos (q: that head's query;
 * gone: the head's evicted blocks, or NULL): sparse — the probe score (max q.k over the block's
 * probe keys, or its centroid with --probe-summary), quest — the upper bound of q.k from the
 * block's key min/max, oracle — the block's share of the query's exact attention over the
 * blocks still cached. Higher: kept longer. Returns head h's scratch, valid until the head
 * selects again. */
const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q,
                                const unsigned char *gone);

/* h2o-prev, gbm: every key's score for the query at pos into a->keys.key_score (the previous
 * layer's mass, or the predictor's estimate; same bits for any --threads) */
void evict_score_keys(Attention *a, int layer, int pos);

/* --kv-budget, before the query at pos attends: while head h keeps more than budget / block
 * blocks, drop the one with the lowest summed keep score (ties: the lower index) for good. The
 * newest block (still filling) always stays, and so does block 0 under window's KEEP_NEWEST
 * (StreamingLLM's sink). */
void evict_blocks(Attention *a, int layer, int pos, const float *q_all);

/* --measure-keys: every key's keep score summed over heads into a->keys.rank->score, taken
 * before the query attends (h2o's mass must not hold the query's own attention yet) */
void evict_rank_scores(Attention *a, int layer, int pos, const float *q_all);

#endif
