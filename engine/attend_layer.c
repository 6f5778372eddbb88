/* attend_layer.c — see attend_layer.h. What a policy does beyond choosing blocks reaches here
 * as its traits (policy.h: T_IMPORTANCE, T_PROBES, T_MASS, T_EXACT_SCORES), never as its id:
 * POL_EXACT and POL_ORACLE appear only as what the attention runs itself (exact attention in
 * an exact prefill, on layer 0 under --exact-first-layer, and --ref-attn's; the oracle's picks
 * that --measure-selection's recall counts against). */
#include "attend_layer.h"

#include <math.h>
#include <string.h>

#include "attn_kernel.h"
#include "evict.h"
#include "util.h"

const char *const STAGE_NAMES[N_STAGES] = {"probe", "importance", "select", "gather", "attend"};

/* ---------------------------------------------------------------- set-up */

/* sparse prefill tiles keep the scores of at most this many positions per query (k blocks and
 * the tile's own; a larger k attends token by token) */
#define TILE_KEEP_POSITIONS 2048

void attention_init(Attention *a, const AttnOptions *opt, KVCache *kv, int n_heads, ThreadPool *pool) {
    memset(a, 0, sizeof *a);
    a->opt = *opt;
    a->kv = kv;
    a->pool = pool;
    a->n_layers = kv->n_layers;
    a->n_heads = n_heads;
    a->n_kv = kv->n_kv;
    a->head_dim = kv->head_dim;
    a->capacity = kv->capacity;
    a->n_blocks = kv->n_blocks;
    size_t H = (size_t)n_heads, C = (size_t)kv->capacity, NB = (size_t)kv->n_blocks;
    Policy policy = opt->sel.policy;
    SparseScratch *sp = &a->sparse;
    if (policy_has(policy, T_IMPORTANCE)) { /* the state, and the reservation chosen per layer */
        a->state.importance = lmc_alloc((size_t)a->n_layers * C, sizeof(float), "prefill importance");
        sp->imp_picks = lmc_alloc(NB, sizeof(int), "importance reservation");
        sp->imp_sums = lmc_alloc(NB, sizeof(float), "importance reservation");
        sp->imp_used = lmc_alloc(NB, 1, "importance reservation");
    }
    if (policy_has(policy, T_PROBES)) { /* a GQA group's probes and the union of its blocks */
        sp->probe_scores = lmc_alloc(H * NB, sizeof(float), "probe scores");
        sp->group_blocks = lmc_alloc(H * NB, sizeof(int), "blocks of a GQA group");
        sp->group_heads = lmc_alloc(H * NB, 1, "blocks of a GQA group");
    }
    /* h2o ranks by it; h2o-prev ranks layer 0 (which has no previous layer) by it */
    if (policy_has(policy, T_MASS))
        a->state.mass = lmc_alloc((size_t)a->n_layers * H * C, sizeof(float), "h2o attention mass");
    HeadScratch *hs = &a->head;
    hs->att_probs = lmc_alloc(H * C, sizeof(float), "attention probabilities");
    hs->kscratch = lmc_alloc(H * (size_t)kv->block, sizeof(float), "attention scores");
    hs->sel = lmc_alloc(H * NB, sizeof(int), "selected blocks");
    hs->n_sel = lmc_alloc(H, sizeof(int), "selection counts");
    hs->select = lmc_alloc(H, sizeof(SelectScratch), "selection scratch");
    for (int h = 0; h < n_heads; h++) select_scratch_init(&hs->select[h], kv->n_blocks);
    Diagnostics *d = &a->diag;
    d->exact_probs = lmc_alloc(H * C, sizeof(float), "attention probabilities");
    d->exact_out = lmc_alloc(H * (size_t)kv->head_dim, sizeof(float), "attention output");
    d->oracle_sel = lmc_alloc(H * NB, sizeof(int), "oracle blocks");
    d->stats = lmc_alloc(H, sizeof(SelStats), "selection statistics");
    if (opt->kv_budget) a->evict.evicted = lmc_alloc((size_t)a->n_layers * H * NB, 1, "evicted blocks");
    PrefillTile *pt = &a->tile;
    int group = n_heads / a->n_kv;
    pt->n_q = group < ATTN_MAX_GROUP ? group : ATTN_MAX_GROUP;
    size_t vecs = (size_t)a->n_kv * ATTN_TILE_QUERIES * (size_t)pt->n_q;
    pt->q = lmc_alloc(vecs * (size_t)kv->head_dim, sizeof(float), "prefill tile");
    if (policy_has(policy, T_PROBES) && opt->prefill_sparse) { /* a tile probes once for its queries */
        int keep = opt->sel.k - 1 + (ATTN_TILE_QUERIES - 1) / kv->block + 2;
        keep = keep < kv->n_blocks ? keep : kv->n_blocks;
        pt->keep = (size_t)keep * (size_t)kv->block <= TILE_KEEP_POSITIONS ? keep : 0; /* 0: token by token */
    }
    size_t row = pt->keep ? (size_t)pt->keep * (size_t)kv->block : (size_t)kv->block;
    pt->scores = lmc_alloc(vecs * row, sizeof(float), "prefill tile");
    pt->m = lmc_alloc(vecs, sizeof(float), "prefill tile");
    pt->l = lmc_alloc(vecs, sizeof(float), "prefill tile");
    if (pt->keep) {
        pt->mean = lmc_alloc((size_t)a->n_kv * (size_t)pt->n_q * (size_t)kv->head_dim, sizeof(float), "prefill tile");
        pt->weights = lmc_alloc(vecs * (size_t)kv->block, sizeof(float), "prefill tile");
    }
    if (kv->q8)
        pt->q8_scratch = lmc_alloc((size_t)a->n_kv * ATTN_TILE_Q8_FLOATS(kv->block, kv->head_dim, pt->n_q),
                                   sizeof(float), "prefill tile");
    if (a->state.importance) /* its prefill tiles record the importance */
        pt->importance = lmc_alloc((size_t)a->n_kv * C, sizeof(float), "prefill tile");
    if (opt->dump_prefill) { /* --dump-importance */
        a->dump.q = lmc_alloc(C * H * (size_t)kv->head_dim, sizeof(float), "--dump-importance queries");
        if (opt->prefill_sparse) {
            a->dump.sel = lmc_alloc(C * H * NB, sizeof(int), "--dump-importance blocks");
            a->dump.n_sel = lmc_alloc(C * H, sizeof(int), "--dump-importance blocks");
        }
    }
}

int attention_pages_kv(const AttnOptions *opt) {
    return opt->kv_budget && !opt->keep_evicted && !opt->measure && !opt->rank_every;
}

int attention_needs_features(const AttnOptions *opt) {
    return policy_uses_features(opt->sel.policy) || opt->rank_every;
}

void attention_set_features(Attention *a, KeyFeat *feat, const char *predictor_path) {
    KeyScoring *ks = &a->keys;
    ks->feat = feat;
    ks->key_score = lmc_alloc((size_t)a->capacity, sizeof(float), "key scores");
    const Gbm *g = a->opt.gbm;
    if (!g) return;
    ks->gbm_cols = lmc_alloc((size_t)g->n_features, sizeof(int), "predictor columns");
    for (int c = 0; c < g->n_features; c++) {
        ks->gbm_cols[c] = keyfeat_lookup(feat, g->names[c]);
        if (ks->gbm_cols[c] < 0)
            lmc_die_input("--predictor %s reads feature '%s', which this model does not have (features: keyfeat.h)",
                          predictor_path, g->names[c]);
    }
}

void attention_free(Attention *a) {
    lmc_free(a->keys.gbm_cols);
    lmc_free(a->keys.key_score);
    lmc_free(a->evict.evicted);
    lmc_free(a->tile.q);
    lmc_free(a->tile.scores);
    lmc_free(a->tile.m);
    lmc_free(a->tile.l);
    lmc_free(a->tile.mean);
    lmc_free(a->tile.weights);
    lmc_free(a->tile.importance);
    lmc_free(a->tile.q8_scratch);
    lmc_free(a->dump.q);
    lmc_free(a->dump.sel);
    lmc_free(a->dump.n_sel);
    for (int h = 0; h < a->n_heads; h++) select_scratch_free(&a->head.select[h]);
    lmc_free(a->head.select);
    lmc_free(a->state.importance);
    lmc_free(a->state.mass);
    lmc_free(a->sparse.probe_scores);
    lmc_free(a->sparse.group_blocks);
    lmc_free(a->sparse.group_heads);
    lmc_free(a->sparse.imp_picks);
    lmc_free(a->sparse.imp_sums);
    lmc_free(a->sparse.imp_used);
    lmc_free(a->head.att_probs);
    lmc_free(a->head.kscratch);
    lmc_free(a->head.sel);
    lmc_free(a->head.n_sel);
    lmc_free(a->diag.exact_probs);
    lmc_free(a->diag.exact_out);
    lmc_free(a->diag.oracle_sel);
    lmc_free(a->diag.stats);
    memset(a, 0, sizeof *a);
}

void selstats_add(SelStats *into, const SelStats *s) {
    into->mass += s->mass;
    into->recall += s->recall;
    into->max_abs_diff += s->max_abs_diff;
    into->select_bytes += s->select_bytes;
    into->kv_bytes += s->kv_bytes;
    into->heads += s->heads;
    into->measured += s->measured;
}

/* --dump-importance: layer 0's prefill queries pos0 .. pos0 + n - 1 (q_all: [n][n_heads x
 * head_dim]) */
static void dump_queries(Attention *a, int layer, int pos0, int n, const float *q_all) {
    if (!a->dump.q || layer != 0) return;
    size_t Q = (size_t)a->n_heads * (size_t)a->head_dim;
    memcpy(a->dump.q + (size_t)pos0 * Q, q_all, sizeof(float) * Q * (size_t)n);
}

/* --dump-importance, sparse prefill: the n blocks query pos's head h attended on layer 0 */
static void dump_blocks(Attention *a, int pos, int h, const int *blocks, int n) {
    size_t at = (size_t)pos * a->n_heads + h;
    memcpy(a->dump.sel + at * a->n_blocks, blocks, sizeof(int) * (size_t)n);
    a->dump.n_sel[at] = n;
}

/* ---------------------------------------------------------------- stage timing */

/* attn-bench --stages: add the time since *t to stage st of head h's row, restart *t */
static void stage_lap(const Attention *a, int h, int st, double *t) {
    if (!a->stages.ms) return;
    double now = lmc_now_ms();
    a->stages.ms[(size_t)h * N_STAGES + st] += now - *t;
    *t = now;
}

/* the clock for stage_lap, read only when stages are timed */
static double stage_clock(const Attention *a) { return a->stages.ms ? lmc_now_ms() : 0.0; }

/* ---------------------------------------------------------------- one head, one GQA group */

typedef struct {
    Attention *a;
    int layer, pos, phase;
    const float *q_all;
    float *out_all;
    int ranking; /* --measure-keys measures this query (before_kernel decides) */
} LayerJob;

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

/* attended probabilities are needed to record prefill importance or H2O mass */
static int needs_probs(const Attention *a, int phase) {
    return (phase == ATTN_PREFILL && a->state.importance) ||
           (phase != ATTN_BENCH && (a->state.mass || a->keys.feat));
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

/* Exact attention without diagnostics: the query heads that share a KV head run together
 * (attn_blocks over a group), so each K/V row is read once per group instead of per head. The
 * exact policy, or any policy's prefill when the prefill is exact. */
static int grouped_exact(const Attention *a, int phase) {
    int policy = phase == ATTN_PREFILL && !a->opt.prefill_sparse ? POL_EXACT : a->opt.sel.policy;
    int measure = a->opt.measure && phase != ATTN_PREFILL;
    return policy == POL_EXACT && !a->opt.reference && !measure;
}

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

/* The kernel: exact grouped by KV head, sparse grouped by KV head, or head by head (every other
 * policy, the reference, and whatever runs with diagnostics) */
static void dispatch_kernel(Attention *a, LayerJob *job) {
    if (grouped_exact(a, job->phase)) pool_run(a->pool, attend_groups, job, a->n_kv);
    else if (grouped_sparse(a, job->phase)) pool_run(a->pool, attend_sparse_groups, job, a->n_kv);
    else pool_run(a->pool, attend_heads, job, a->n_heads);
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
        dispatch_kernel(a, job);
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
