/* evict.h — keep scores of the block-scoring policies (sparse, quest, oracle) for --kv-budget
 * and --measure-keys: the score the policy gives each block for the current query, the one its
 * per-query selection (select.c) ranks by. */
#ifndef LMC_EVICT_H
#define LMC_EVICT_H

#include "attend.h"

/* whether the policy's keep score is a per-block score of the current query */
int evict_scores_blocks(Policy p);
/* head h's score of every block 0 .. pos / block for the query at pos (q: that head's query;
 * gone: the head's evicted blocks, or NULL): sparse — the probe score (max q.k over the block's
 * probe keys, or its centroid with --probe-summary), quest — the upper bound of q.k from the
 * block's key min/max, oracle — the block's share of the query's exact attention over the
 * blocks still cached. Higher: kept longer. Returns head h's scratch, valid until the head
 * selects again. */
const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q,
                                const unsigned char *gone);

#endif
