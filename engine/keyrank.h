/* keyrank.h — seed 004's metrics of a key ranking against the true attention mass
 * (--measure-keys N): how well a policy's keep score (evict.c) orders the keys of a query.
 *
 * For the query at position t (every N-th: (t + 1) % N == 0) and layer l, with n = t + 1 keys,
 * true masses m_j (the attention that ran, mean over query heads: keyfeat.h) and scores s_j:
 *   rho        Spearman's rank correlation of s and m (ties get their mean rank; 0 when s
 *              or m is constant: a constant ranking carries no order)
 *   recall32   |top-32 by s & top-32 by m| / 32
 *   captured32 the mass inside the top-32 by s, over the total
 *   lost50     the mass of the n/2 (rounded down) keys with the lowest s, over the total: what
 *              evicting half the cache by s would lose
 *   lost_keep  the same at another budget (--measure-keys-keep P, default 50): the mass of the
 *              n * (100 - P) / 100 (rounded down) keys with the lowest s, over the total:
 *              what keeping P % of the cache by s would lose (seed 004's 25 % column)
 * Orders are by value, ties to the lower key first. Queries with fewer than 64 keys are left
 * out (every key would be in the top 32). The figures are means over (query, layer) pairs,
 * over all layers and per layer; harness/predictor/metrics.py defines the same in Python.
 *
 * Seed 004's two-stage candidate attention (the scorer picks C candidates of a 128-key
 * universe, exact attention takes the top 32 inside them), on the universe of the last 128
 * keys (positions n-128 .. n-1; queries with fewer keys are left out, "cand_queries" counts
 * the rest), the masses normalised over those 128:
 *   recall32_c32, _c48, _c64, _c96   |top-C of the 128 by s & top-32 of the 128 by m| / 32
 *   kept32_c96  the mass of the 32 largest m among the top-96 by s (the pipeline's top 32), over
 *               the 128 keys' total
 * (C = 128 would be the whole universe: recall 1 by construction.)
 *
 * Seed 004's long-context "direct" scoring (--measure-keys-direct D, off by default): the top D
 * by s of all n keys as they are, no exact stage, for queries with at least 2 D keys (the
 * article's t + 1 = 513..1024 at D = 256; "direct_queries" counts them):
 *   recall32_direct  |top-D by s & top-32 by m| / 32 over the whole context */
#ifndef LMC_KEYRANK_H
#define LMC_KEYRANK_H

#include <stdio.h>

enum { KR_RHO, KR_RECALL32, KR_CAPTURED32, KR_LOST50, KR_LOST_KEEP, KR_RANK_METRICS };
enum { KR_C32 = KR_RANK_METRICS, KR_C48, KR_C64, KR_C96, KR_KEPT96, KR_DIRECT, KR_METRICS };
enum { KR_UNIVERSE = 128 };

typedef struct {
    int every;      /* measured queries: positions t with (t + 1) % every == 0 */
    int keep_pct;   /* lost_keep's budget: % of the keys kept */
    int direct;     /* recall32_direct's candidate count D, 0: off */
    int n_layers;
    float *score;   /* [capacity]: the policy's key scores for the current query and layer */
    float *mass;    /* [capacity]: the true masses */
    int *order;     /* [capacity] scratch */
    double *rank_s, *rank_m; /* [capacity] scratch */
    double *sum;    /* [n_layers][KR_METRICS] */
    long *queries;  /* [n_layers] */
    long *cand_queries; /* [n_layers]: queries with a whole 128-key universe */
    long *direct_queries; /* [n_layers]: queries with 2 D keys or more */
} KeyRank;

void keyrank_init(KeyRank *r, int capacity, int n_layers, int every, int keep_pct, int direct);
void keyrank_free(KeyRank *r);
/* whether the query at position pos is measured */
int keyrank_due(const KeyRank *r, int pos);
/* add the metrics of score[0..n) against mass[0..n) at layer l (no-op below 64 keys) */
void keyrank_add(KeyRank *r, int layer, int n);
/* "key_ranking": {"every", "queries", "rho", ..., "layers": [{...}, ...]} (no leading comma) */
void keyrank_write_json(FILE *f, const KeyRank *r);

#endif
