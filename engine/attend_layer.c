/* attend_layer.c — see attend_layer.h: one layer's attention for one query, before the kernel
 * (key scores, eviction, ranking, the importance reservation), the kernel (attend_heads.c) and
 * after it (importance, features, trace, statistics); and --kv-budget's eviction before a
 * prefill query. The Attention is set up in attend_setup.c, prefill tiles run in attend_tile.c,
 * and what these files share is attend_internal.h. What a policy does beyond choosing blocks
 * reaches them as its traits (policy.h: T_IMPORTANCE, T_PROBES, T_MASS, T_EXACT_SCORES), never
 * as its id: POL_EXACT and POL_ORACLE appear only as what the attention runs itself (exact
 * attention in an exact prefill, on layer 0 under --exact-first-layer, and --ref-attn's; the
 * oracle's picks that --measure-selection's recall counts against). */
#include "attend_internal.h"

#include "evict.h"

/* ---------------------------------------------------------------- the layer */

/* Before the kernel: h2o-prev's and gbm's key scores, --kv-budget eviction, --measure-keys'
 * ranking (before the query's own attention changes any state), and sparse's importance
 * reservation. */
static void before_kernel(Attention *a, LayerJob *job) {
    int layer = job->layer, pos = job->pos, phase = job->phase;
    int n_blocks = (pos + a->kv->block) / a->kv->block;
    int policy_runs = phase != ATTN_PREFILL || a->opt.prefill_sparse;
    int evicts = policy_can_evict(a->opt.sel.policy); /* not exact (nor layer 0 under --exact-first-layer) */
    job->ranking = a->keys.rank && evicts && phase != ATTN_BENCH && keyrank_due(a->keys.rank, pos);
    int scored = policy_uses_features(a->opt.sel.policy); /* h2o-prev, gbm: keys scored from features */
    if (scored && ((policy_runs && (a->opt.sel.k < n_blocks || a->evict.evicted)) || job->ranking))
        evict_score_keys(a, layer, pos);
    if (a->evict.evicted && evicts && policy_runs && phase != ATTN_BENCH) evict_blocks(a, layer, pos, job->q_all);
    if (job->ranking) evict_rank_scores(a, layer, pos, job->q_all);
    /* the importance reservation depends on the layer's prefill importance only: choose it
     * once for all heads (the same picks each head would make) */
    SparseScratch *sp = &a->sparse;
    sp->n_imp_picks = 0;
    if (a->state.importance && a->opt.sel.importance && phase != ATTN_PREFILL && a->opt.sel.k < n_blocks) {
        double t = stage_clock(a);
        sp->n_imp_picks = select_importance(&a->opt.sel, a->state.importance + (size_t)layer * a->capacity,
                                            pos + 1, sp->imp_sums, sp->imp_used, sp->imp_picks);
        stage_lap(a, 0, STAGE_IMPORTANCE, &t);
    }
}

/* After the kernel: prefill importance, the key features (and --measure-keys' true masses), the
 * trace, the statistics. Heads in head order (fixed order: same bits for any --threads). */
static void after_kernel(Attention *a, const LayerJob *job, SelStats *stats) {
    int layer = job->layer, pos = job->pos, phase = job->phase;
    int bs = a->kv->block, n_pos = pos + 1;
    const HeadScratch *hs = &a->head;
    if (phase == ATTN_PREFILL && a->state.importance) {
        /* summed over heads in head order */
        float *imp = a->state.importance + (size_t)layer * a->capacity;
        for (int h = 0; h < a->n_heads; h++) {
            const int *sel = hs->sel + (size_t)h * a->n_blocks;
            const float *probs = hs->att_probs + (size_t)h * a->capacity;
            for (int i = 0; i < hs->n_sel[h]; i++) {
                int p0 = sel[i] * bs, p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
                for (int p = p0; p < p1; p++) imp[p] += probs[p];
            }
        }
    }
    KeyScoring *ks = &a->keys;
    if (ks->feat && phase != ATTN_BENCH) {
        for (int h = 0; h < a->n_heads; h++)
            keyfeat_record(ks->feat, layer, h, hs->sel + (size_t)h * a->n_blocks, hs->n_sel[h], bs,
                           hs->att_probs + (size_t)h * a->capacity);
        if (job->ranking) {
            for (int p = 0; p < n_pos; p++) ks->rank->mass[p] = keyfeat_mass(ks->feat, layer, p);
            keyrank_add(ks->rank, layer, n_pos);
        }
        if (layer == a->n_layers - 1) keyfeat_dump_query(ks->feat);
    }
    if (phase == ATTN_PREFILL && layer == 0 && a->dump.sel)
        for (int h = 0; h < a->n_heads; h++) dump_blocks(a, pos, h, hs->sel + (size_t)h * a->n_blocks, hs->n_sel[h]);
    if (a->opt.trace && phase != ATTN_PREFILL) {
        for (int h = 0; h < a->n_heads; h++) {
            const int *sel = hs->sel + (size_t)h * a->n_blocks;
            fprintf(a->opt.trace, "%d %d %d %d", pos, layer, h, hs->n_sel[h]);
            for (int i = 0; i < hs->n_sel[h]; i++) fprintf(a->opt.trace, " %d", sel[i]);
            fputc('\n', a->opt.trace);
        }
    }
    if (!stats) return;
    for (int h = 0; h < a->n_heads; h++) selstats_add(stats, &a->diag.stats[h]);
}

/* the job's eviction and selection, then (attends) its kernel and what follows it.
 * --exact-first-layer: layer 0 runs as exact under every policy (it selects, evicts and ranks
 * nothing; what it attended still feeds the state: importance, mass, features) */
static void run_layer_job(Attention *a, LayerJob *job, int attends, SelStats *stats) {
    Policy policy = a->opt.sel.policy;
    if (job->layer == 0 && a->opt.exact_first_layer) a->opt.sel.policy = POL_EXACT;
    before_kernel(a, job);
    if (attends) {
        attend_dispatch_kernel(a, job);
        after_kernel(a, job, stats);
    }
    a->opt.sel.policy = policy;
}

void attend_layer(Attention *a, int layer, int pos, const float *q_all, float *out_all, int phase,
                  SelStats *stats) {
    LayerJob job = {a, layer, pos, phase, q_all, out_all, 0};
    if (phase == ATTN_PREFILL) dump_queries(a, layer, pos, 1, q_all);
    run_layer_job(a, &job, 1, stats);
}

void attend_evict(Attention *a, int layer, int pos, const float *q_all) {
    LayerJob job = {a, layer, pos, ATTN_PREFILL, q_all, NULL, 0};
    run_layer_job(a, &job, 0, NULL);
}
