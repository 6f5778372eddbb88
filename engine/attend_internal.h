/* attend_internal.h — what the files of one layer's attention share among themselves
 * (attend_heads.c, attend_layer.c, attend_tile.c): the job of one query, the stage clock, the
 * predicates that pick a kernel, and what --dump-importance keeps. The rest of the engine reads
 * attend_layer.h only. */
#ifndef LMC_ATTEND_INTERNAL_H
#define LMC_ATTEND_INTERNAL_H

#include <string.h>

#include "attend_layer.h"
#include "util.h"

/* one layer and one query position: attend_layer's, or attend_evict's (no kernel, no out_all) */
typedef struct {
    Attention *a;
    int layer, pos, phase;
    const float *q_all;
    float *out_all;
    int ranking; /* --measure-keys measures this query (before_kernel decides) */
} LayerJob;

/* the kernel for the job (attend_heads.c): exact grouped by KV head, sparse grouped by KV head,
 * or head by head */
void attend_dispatch_kernel(Attention *a, LayerJob *job);

/* ---------------------------------------------------------------- stage timing */

/* attn-bench --stages: add the time since *t to stage st of head h's row, restart *t */
static inline void stage_lap(const Attention *a, int h, int st, double *t) {
    if (!a->stages.ms) return;
    double now = lmc_now_ms();
    a->stages.ms[(size_t)h * N_STAGES + st] += now - *t;
    *t = now;
}

/* the clock for stage_lap, read only when stages are timed */
static inline double stage_clock(const Attention *a) { return a->stages.ms ? lmc_now_ms() : 0.0; }

/* ---------------------------------------------------------------- which kernel */

/* attended probabilities are needed to record prefill importance or H2O mass */
static inline int needs_probs(const Attention *a, int phase) {
    return (phase == ATTN_PREFILL && a->state.importance) ||
           (phase != ATTN_BENCH && (a->state.mass || a->keys.feat));
}

/* Exact attention without diagnostics: the query heads that share a KV head run together
 * (attn_blocks over a group), so each K/V row is read once per group instead of per head. The
 * exact policy, or any policy's prefill when the prefill is exact. */
static inline int grouped_exact(const Attention *a, int phase) {
    int policy = phase == ATTN_PREFILL && !a->opt.prefill_sparse ? POL_EXACT : a->opt.sel.policy;
    int measure = a->opt.measure && phase != ATTN_PREFILL;
    return policy == POL_EXACT && !a->opt.reference && !measure;
}

/* ---------------------------------------------------------------- --dump-importance */

/* --dump-importance: layer 0's prefill queries pos0 .. pos0 + n - 1 (q_all: [n][n_heads x
 * head_dim]) */
static inline void dump_queries(Attention *a, int layer, int pos0, int n, const float *q_all) {
    if (!a->dump.q || layer != 0) return;
    size_t Q = (size_t)a->n_heads * (size_t)a->head_dim;
    memcpy(a->dump.q + (size_t)pos0 * Q, q_all, sizeof(float) * Q * (size_t)n);
}

/* --dump-importance, sparse prefill: the n blocks query pos's head h attended on layer 0 */
static inline void dump_blocks(Attention *a, int pos, int h, const int *blocks, int n) {
    size_t at = (size_t)pos * a->n_heads + h;
    memcpy(a->dump.sel + at * a->n_blocks, blocks, sizeof(int) * (size_t)n);
    a->dump.n_sel[at] = n;
}

#endif
