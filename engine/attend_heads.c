/* attend_heads.c — see attend_layer.h: the kernel of one layer's attention for one query, by
 * head (selection, kernel, --measure-selection's diagnostics) or by GQA group (exact, and sparse
 * probing once for the group), and what every head records after its kernel ran. */
#include "attend_internal.h"

#include <math.h>
#include <string.h>

#include "attn_kernel.h"

/* ---------------------------------------------------------------- one head, one GQA group */

static int in_selection(const int *sel, int n, int b) {
    for (int i = 0; i < n; i++)
        if (sel[i] == b) return 1;
    return 0;
}

/* what every head does after its kernel ran (in the parallel job): H2O mass, bytes read */
static void head_after_kernel(Attention *a, const LayerJob *job, int h, size_t select_bytes) {
    int bs = a->kv->block, n_pos = job->pos + 1;
    const int *sel = a->head.sel + (size_t)h * a->n_blocks;
    const float *att_probs = a->head.att_probs + (size_t)h * a->capacity;
    float *mass = a->state.mass;
    float *h2o_mass = mass ? mass + ((size_t)job->layer * a->n_heads + h) * a->capacity : NULL;
    int record_mass = job->phase != ATTN_BENCH && h2o_mass;
    size_t attended = 0;
    for (int i = 0; i < a->head.n_sel[h]; i++) {
        int p0 = sel[i] * bs, p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        attended += (size_t)(p1 - p0);
        if (record_mass)
            for (int p = p0; p < p1; p++) h2o_mass[p] += att_probs[p];
    }
    SelStats *st = &a->diag.stats[h];
    st->select_bytes = (double)select_bytes;
    st->kv_bytes = (double)(attended * 2 * kv_row_bytes(a->kv));
    st->heads = 1;
}

/* what head h's selection reads (probe_scores, probe_rows: see SelectInput; NULL, 0: the
 * head probes for itself) */
static SelectInput head_input(const LayerJob *job, int h, const float *probe_scores, size_t probe_rows) {
    const Attention *a = job->a;
    int decode = job->phase != ATTN_PREFILL;
    const float *importance = a->state.importance, *mass = a->state.mass;
    const unsigned char *evicted = a->evict.evicted;
    size_t head_row = (size_t)job->layer * a->n_heads + h;
    return (SelectInput){
        .q = job->q_all + (size_t)h * a->head_dim, .kv = a->kv, .layer = job->layer,
        .kvh = h / (a->n_heads / a->n_kv), .head = h, .n_pos = job->pos + 1,
        /* importance exists only after prefill, so prefill queries probe only */
        .importance = decode && importance ? importance + (size_t)job->layer * a->capacity : NULL,
        .mass = mass ? mass + head_row * a->capacity : NULL,
        .probs = a->diag.exact_probs + (size_t)h * a->capacity,
        .key_score = a->keys.key_score,
        .evicted = evicted ? evicted + head_row * a->n_blocks : NULL,
        .probe_scores = probe_scores,
        .probe_rows = probe_rows,
        .imp_picks = a->sparse.n_imp_picks ? a->sparse.imp_picks : NULL,
        .n_imp_picks = a->sparse.n_imp_picks,
    };
}

/* grouped_exact (attend_internal.h): KV head kvh's query heads over every block, together */
static void attend_group(LayerJob *job, int kvh) {
    Attention *a = job->a;
    const KVCache *kv = a->kv;
    HeadScratch *hs = &a->head;
    int D = a->head_dim, bs = kv->block, group = a->n_heads / a->n_kv;
    int n_pos = job->pos + 1, n_all = (n_pos + bs - 1) / bs;
    int need_probs = needs_probs(a, job->phase);
    for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += ATTN_MAX_GROUP) {
        int n_q = (kvh + 1) * group - h0 < ATTN_MAX_GROUP ? (kvh + 1) * group - h0 : ATTN_MAX_GROUP;
        int *all = hs->sel + (size_t)h0 * a->n_blocks;
        for (int b = 0; b < n_all; b++) all[b] = b;
        double t = stage_clock(a);
        attn_blocks(job->q_all + (size_t)h0 * D, n_q, kv, job->layer, kvh, n_pos, all, NULL, n_all,
                    job->out_all + (size_t)h0 * D, hs->kscratch + (size_t)h0 * bs,
                    need_probs ? hs->att_probs + (size_t)h0 * a->capacity : NULL, (size_t)a->capacity);
        stage_lap(a, h0, STAGE_ATTEND, &t);
        for (int h = h0; h < h0 + n_q; h++) {
            if (h > h0) memcpy(hs->sel + (size_t)h * a->n_blocks, all, sizeof(int) * (size_t)n_all);
            hs->n_sel[h] = n_all;
            memset(&a->diag.stats[h], 0, sizeof a->diag.stats[h]);
            head_after_kernel(a, job, h, 0);
        }
    }
}

static void attend_groups(void *arg, int begin, int end) {
    for (int g = begin; g < end; g++) attend_group(arg, g);
}

/* one head on its own: selection (probing for itself), kernel, diagnostics */
static void attend_head(LayerJob *job, int h) {
    Attention *a = job->a;
    const KVCache *kv = a->kv;
    HeadScratch *hs = &a->head;
    Diagnostics *dg = &a->diag;
    int D = a->head_dim, bs = kv->block, layer = job->layer;
    int n_pos = job->pos + 1;
    int kvh = h / (a->n_heads / a->n_kv);
    int decode = job->phase != ATTN_PREFILL;
    const float *q = job->q_all + (size_t)h * D;
    float *out = job->out_all + (size_t)h * D;
    float *exact_probs = dg->exact_probs + (size_t)h * a->capacity;
    float *att_probs = hs->att_probs + (size_t)h * a->capacity;
    float *exact_out = dg->exact_out + (size_t)h * D;
    int *sel = hs->sel + (size_t)h * a->n_blocks;
    SelStats *st = &dg->stats[h];
    memset(st, 0, sizeof *st);

    SelectConfig cfg = a->opt.sel;
    if (!decode && !a->opt.prefill_sparse) cfg.policy = POL_EXACT;
    int measure = a->opt.measure && decode;
    int need_exact = measure || policy_has(cfg.policy, T_EXACT_SCORES);
    int need_probs = needs_probs(a, job->phase);

    if (need_exact) {
        /* exact attention by the same kernel over every block, so that the diagnostics
         * measure what the selection changes and nothing else (exact vs exact: diff 0) */
        int *all = dg->oracle_sel + (size_t)h * a->n_blocks;
        int n_all = (n_pos + bs - 1) / bs;
        for (int b = 0; b < n_all; b++) all[b] = b;
        attn_blocks(q, 1, kv, layer, kvh, n_pos, all, NULL, n_all, exact_out, hs->kscratch + (size_t)h * bs,
                    exact_probs, 0);
    }
    SelectInput in = head_input(job, h, NULL, 0);
    size_t select_bytes = 0;
    double t = stage_clock(a);
    int n = select_blocks(&cfg, &in, &hs->select[h], sel, &select_bytes);
    hs->n_sel[h] = n;
    stage_lap(a, h, STAGE_SELECT, &t);

    if (a->opt.reference && cfg.policy == POL_EXACT)
        attn_reference(q, kv, layer, kvh, n_pos, out, att_probs);
    else
        attn_blocks(q, 1, kv, layer, kvh, n_pos, sel, NULL, n, out, hs->kscratch + (size_t)h * bs,
                    need_probs ? att_probs : NULL, 0);
    stage_lap(a, h, STAGE_ATTEND, &t);
    head_after_kernel(a, job, h, select_bytes);
    if (!measure) return;

    /* diagnostics against exact attention */
    double mass = 0.0;
    for (int i = 0; i < n; i++) {
        int p0 = sel[i] * bs, p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        for (int p = p0; p < p1; p++) mass += exact_probs[p];
    }
    SelectConfig oracle = cfg;
    oracle.policy = POL_ORACLE;
    int *osel = dg->oracle_sel + (size_t)h * a->n_blocks;
    size_t unused;
    int n_oracle = select_blocks(&oracle, &in, &hs->select[h], osel, &unused);
    int hits = 0;
    for (int i = 0; i < n_oracle; i++) hits += in_selection(sel, n, osel[i]);
    double diff = 0.0;
    for (int d = 0; d < D; d++) {
        double e = fabs((double)out[d] - (double)exact_out[d]);
        if (e > diff) diff = e;
    }
    st->mass = mass;
    st->recall = n_oracle ? (double)hits / n_oracle : 1.0;
    st->max_abs_diff = diff;
    st->measured = 1;
}

static void attend_heads(void *arg, int begin, int end) {
    for (int h = begin; h < end; h++) attend_head(arg, h);
}

/* Sparse without diagnostics: the query heads of a GQA group probe together (each probe row
 * read once per group, not once per head; centroid probes per head) and each selects its own
 * blocks from the same scores as probing head by head would give; then one kernel pass over
 * the union of their blocks reads a row that several heads chose once for all of them, each
 * head attending exactly its own blocks (same bits as head by head). */
static int grouped_sparse(const Attention *a, int phase) {
    int decode = phase != ATTN_PREFILL;
    if (!decode && !a->opt.prefill_sparse) return 0;
    return policy_has(a->opt.sel.policy, T_PROBES) && !(a->opt.measure && decode) && !a->opt.reference;
}

static void attend_sparse_group(LayerJob *job, int kvh) {
    Attention *a = job->a;
    SparseScratch *sp = &a->sparse;
    HeadScratch *hs = &a->head;
    int D = a->head_dim, bs = a->kv->block, group = a->n_heads / a->n_kv;
    int n_pos = job->pos + 1, n_all = (n_pos + bs - 1) / bs;
    /* probe rows are read once for the group; centroid probes (--probe-summary) are one row
     * per block, which each head reads for itself */
    int summary = a->opt.sel.probe_summary;
    for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += ATTN_MAX_GROUP) {
        int nq = (kvh + 1) * group - h0 < ATTN_MAX_GROUP ? (kvh + 1) * group - h0 : ATTN_MAX_GROUP;
        SelectInput probe = {.kv = a->kv, .layer = job->layer, .kvh = kvh, .head = h0, .n_pos = n_pos};
        float *scores = sp->probe_scores + (size_t)h0 * a->n_blocks;
        size_t rows = 0;
        double t = stage_clock(a);
        if (!summary)
            select_probe_group(&a->opt.sel, &probe, job->q_all + (size_t)h0 * D, nq, scores, (size_t)a->n_blocks,
                               &rows);
        stage_lap(a, h0, STAGE_PROBE, &t);
        /* each head selects on its own; which heads chose each block */
        unsigned char *chosen = sp->group_heads + (size_t)h0 * a->n_blocks;
        memset(chosen, 0, (size_t)n_all);
        size_t select_bytes[ATTN_MAX_GROUP];
        for (int g = 0; g < nq; g++) {
            int h = h0 + g;
            /* the group's probe reads are charged to its first head */
            SelectInput in = summary ? head_input(job, h, NULL, 0)
                                     : head_input(job, h, scores + (size_t)g * a->n_blocks, g == 0 ? rows : 0);
            int *sel = hs->sel + (size_t)h * a->n_blocks;
            select_bytes[g] = 0;
            hs->n_sel[h] = select_blocks(&a->opt.sel, &in, &hs->select[h], sel, &select_bytes[g]);
            for (int i = 0; i < hs->n_sel[h]; i++) chosen[sel[i]] |= (unsigned char)(1u << g);
        }
        stage_lap(a, h0, STAGE_SELECT, &t);
        /* one pass over the union, ascending: a row two heads chose is read once for both */
        int *blocks = sp->group_blocks + (size_t)h0 * a->n_blocks, n_union = 0;
        for (int b = 0; b < n_all; b++)
            if (chosen[b]) {
                blocks[n_union] = b;
                chosen[n_union++] = chosen[b];
            }
        stage_lap(a, h0, STAGE_GATHER, &t);
        attn_blocks(job->q_all + (size_t)h0 * D, nq, a->kv, job->layer, kvh, n_pos, blocks, chosen,
                    n_union, job->out_all + (size_t)h0 * D, hs->kscratch + (size_t)h0 * bs,
                    needs_probs(a, job->phase) ? hs->att_probs + (size_t)h0 * a->capacity : NULL,
                    (size_t)a->capacity);
        stage_lap(a, h0, STAGE_ATTEND, &t);
        for (int g = 0; g < nq; g++) {
            memset(&a->diag.stats[h0 + g], 0, sizeof a->diag.stats[h0 + g]);
            head_after_kernel(a, job, h0 + g, select_bytes[g]);
        }
    }
}

static void attend_sparse_groups(void *arg, int begin, int end) {
    for (int g = begin; g < end; g++) attend_sparse_group(arg, g);
}

/* ---------------------------------------------------------------- the kernel */

/* The kernel: exact grouped by KV head, sparse grouped by KV head, or head by head (every other
 * policy, the reference, and whatever runs with diagnostics) */
void attend_dispatch_kernel(Attention *a, LayerJob *job) {
    if (grouped_exact(a, job->phase)) pool_run(a->pool, attend_groups, job, a->n_kv);
    else if (grouped_sparse(a, job->phase)) pool_run(a->pool, attend_sparse_groups, job, a->n_kv);
    else pool_run(a->pool, attend_heads, job, a->n_heads);
}
