/* evict.h — keep scores of the block-scoring policies (sparse, quest) for --kv-budget and
 * --measure-keys: the score the policy gives each block for the current query, the one its
 * per-query selection (select.c) ranks by. */
#ifndef LMC_EVICT_H
#define LMC_EVICT_H

#include "attend.h"

/* whether the policy's keep score is a per-block score of the current query (sparse, quest) */
int evict_scores_blocks(Policy p);
/* head h's score of every block 0 .. pos / block for the query at pos (q: that head's query):
 * sparse — the probe score (max q.k over the block's probe keys, or its centroid with
 * --probe-summary), quest — the upper bound of q.k from the block's key min/max. Higher: kept
 * longer. Returns head h's selection scratch, valid until the head selects again. */
const float *evict_block_scores(Attention *a, int layer, int h, int pos, const float *q);

#endif
