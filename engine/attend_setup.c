/* attend_setup.c — see attend_layer.h: the Attention's arrays, allocated once for the run by
 * attention_init (what each policy and option needs) and attention_set_features, freed by
 * attention_free; the options' questions (attention_pages_kv, attention_needs_features) and
 * the statistics' sum. */
#include "attend_layer.h"

#include <string.h>

#include "attn_kernel.h"
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
