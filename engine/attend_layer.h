/* attend_layer.h — attention for one layer and one query position, all heads: policy selection,
 * the kernel, the state policies keep (prefill importance, H2O mass), selection diagnostics
 * (--measure-selection), the selection trace (--trace-selection) and what --dump-importance keeps
 * of layer 0's prefill. Set up in attend_setup.c; the layer's job in attend_layer.c, its kernel
 * by head or GQA group in attend_heads.c, prefill tiles in attend_tile.c (what those share:
 * attend_internal.h). */
#ifndef LMC_ATTEND_LAYER_H
#define LMC_ATTEND_LAYER_H

#include <stdio.h>

#include "keyfeat.h"
#include "keyrank.h"
#include "kvcache.h"
#include "predictor.h"
#include "select.h"
#include "threads.h"

enum { ATTN_PREFILL = 0, ATTN_DECODE = 1, ATTN_BENCH = 2 /* decode without state updates */ };

typedef struct {
    SelectConfig sel;   /* the --attn policy and its parameters */
    int prefill_sparse; /* --prefill-attn sparse: prefill queries use the policy too */
    int reference;      /* --ref-attn: exact attention by the plain reference */
    int measure;        /* --measure-selection */
    FILE *trace;        /* --trace-selection, or NULL */
    const Gbm *gbm;     /* --attn gbm: the --predictor trees */
    const char *predictor_path;
    FILE *features;     /* --dump-features, or NULL */
    int features_every; /* --dump-every */
    int kv_budget;      /* --kv-budget: positions each head keeps (whole blocks), 0: no eviction */
    int kv_prefault;    /* --kv-prefault: every page of the cache written at start */
    int rank_every;     /* --measure-keys N: rank the keys of every N-th query (keyrank.h), 0: off */
    int rank_keep;      /* --measure-keys-keep P: the budget of lost_keep, % of keys kept */
    int rank_direct;    /* --measure-keys-direct D: recall32_direct's candidates, 0: off */
    int exact_first_layer; /* --exact-first-layer: layer 0 attends exactly (attend_layer) */
    int keep_evicted;   /* --kv-keep-evicted: evicted blocks stay in memory (masked only) */
    int dump_prefill;   /* --dump-importance: keep layer 0's prefill queries and blocks (PrefillDump) */
} AttnOptions;

/* --kv-budget gives evicted blocks' memory back (a paged cache, kvcache.h) unless something
 * still reads every key: --measure-selection's exact attention, --measure-keys' ranking, or
 * --kv-keep-evicted, which keeps the masking alone (same outputs, for comparison) */
int attention_pages_kv(const AttnOptions *opt);

/* diagnostics summed over heads (and layers, and steps by the caller) */
typedef struct {
    double mass;         /* exact attention mass inside the selected blocks */
    double recall;       /* |selected & oracle top-k| / |oracle top-k| */
    double max_abs_diff; /* max |out - exact out| over the head's dims */
    double select_bytes; /* bytes read to choose blocks */
    double kv_bytes;     /* K and V bytes read by the kernel */
    double heads;        /* head-evaluations summed (to average mass/recall/diff) */
    double measured;     /* head-evaluations that carry mass/recall/diff */
} SelStats;

/* into += s, field by field */
void selstats_add(SelStats *into, const SelStats *s);

/* the stages of a decode step that attn-bench --stages times: sparse probing, the importance
 * reservation (once per layer), the rest of the selection (probe top-k, recency, sorting),
 * gathering a GQA group's blocks into one list, and the attention kernel over them */
enum { STAGE_PROBE, STAGE_IMPORTANCE, STAGE_SELECT, STAGE_GATHER, STAGE_ATTEND, N_STAGES };
extern const char *const STAGE_NAMES[N_STAGES];

/* The state of a layer's attention, one struct per concern. Every array is allocated once, by
 * attention_init (or attention_set_features), for the whole run. */

/* what the policies remember from query to query */
typedef struct {
    /* sparse: [layer][capacity] the attention probability each position received during
     * prefill, summed over the prefill queries and all query heads; NULL for other policies */
    float *importance;
    /* h2o, h2o-prev: [layer][head][capacity] the attention mass accumulated over all earlier
     * queries of the layer and head; NULL for other policies */
    float *mass;
} PolicyState;

/* sparse: what the query heads of a GQA group, or of a whole layer, share within one step */
typedef struct {
    float *probe_scores;        /* [n_heads][n_blocks] probe scores of a GQA group */
    int *group_blocks;          /* [n_heads][n_blocks] the union of a GQA group's blocks */
    unsigned char *group_heads; /* [n_heads][n_blocks] which of its heads chose each */
    /* this step's importance reservation, the same for every head of the layer */
    int *imp_picks, n_imp_picks;
    float *imp_sums;         /* [n_blocks] its block sums */
    unsigned char *imp_used; /* [n_blocks] */
} SparseScratch;

/* per head, so heads run in parallel without sharing anything: the selection and the kernel */
typedef struct {
    int *sel, *n_sel;      /* [head][n_blocks], [head]: the blocks each head attends this step */
    float *att_probs;      /* [head][capacity]: the probabilities of the attention that ran */
    float *kscratch;       /* [head][block]: the kernel's scores of one block */
    SelectScratch *select; /* [head] */
} HeadScratch;

/* exact attention beside the policy's, by the same kernel: --measure-selection's yardstick, the
 * oracle policy's ranking and evict.c's oracle keep scores; and what each head read */
typedef struct {
    float *exact_probs; /* [head][capacity] */
    float *exact_out;   /* [head][head_dim] */
    int *oracle_sel;    /* [head][n_blocks]: every block, then the oracle's picks */
    SelStats *stats;    /* [head]: this step's bytes read and diagnostics */
} Diagnostics;

/* --kv-budget (evict.c) */
typedef struct {
    unsigned char *evicted; /* [layer][head][n_blocks], 1 = dropped for good; NULL: no budget */
} Eviction;

/* the key features (keyfeat.h) and what reads them: h2o-prev's and gbm's key scores, the
 * predictor's columns, --measure-keys; set by attention_set_features (forward_init) */
typedef struct {
    KeyFeat *feat;    /* NULL: no features */
    int *gbm_cols;    /* [gbm->n_features]: the feature id of each predictor column */
    float *key_score; /* [capacity]: h2o-prev, gbm: each key's score for the current query */
    KeyRank *rank;    /* --measure-keys, or NULL */
} KeyScoring;

/* attn-bench --stages: milliseconds per stage, summed, one row per head (a GQA group's times go
 * to its first head's row: each row is written by one thread) */
typedef struct {
    double *ms; /* [n_heads][N_STAGES]; NULL: nothing is timed */
} StageTimes;

/* prefill a tile of queries at a time (attn_causal_tile), per KV head's scratch */
typedef struct {
    float *q, *scores, *m, *l; /* [n_kv][ATTN_TILE_QUERIES][min(group, ATTN_MAX_GROUP)][...] */
    int n_q;                   /* query heads per pass */
    /* sparse prefill: the tile's blocks (at most `keep` of them, whose scores stay for the
     * probabilities), each head's mean query, the value weights and the prefill importance
     * of the chunk, per KV head ([n_kv][capacity], summed into the layer's in KV head order) */
    int keep;
    float *mean, *weights, *importance;
    float *q8_scratch; /* q8 KV: [n_kv][ATTN_TILE_Q8_FLOATS] (attn_causal_tile) */
} PrefillTile;

/* --dump-importance (cmd_generate.c writes it after prefill): what an independent recompute of
 * layer 0's prefill importance needs beside the keys in the cache; NULL arrays when off */
typedef struct {
    float *q;   /* [capacity][n_heads * head_dim]: layer 0's post-RoPE prefill queries */
    int *sel;   /* sparse prefill: [capacity][n_heads][n_blocks] the blocks each query and head
                 * attended (a tile's blocks for each of its queries, each over the positions up
                 * to its own); NULL for an exact prefill */
    int *n_sel; /* [capacity][n_heads] */
} PrefillDump;

typedef struct {
    AttnOptions opt;
    int n_layers, n_heads, n_kv, head_dim, capacity, n_blocks;
    KVCache *kv;
    ThreadPool *pool;
    PolicyState state;
    SparseScratch sparse;
    HeadScratch head;
    Diagnostics diag;
    Eviction evict;
    KeyScoring keys;
    StageTimes stages;
    PrefillTile tile;
    PrefillDump dump;
} Attention;

/* h2o-prev and gbm score keys from the key features; so does --measure-keys (the true masses) */
int attention_needs_features(const AttnOptions *opt);
/* give the attention its key features; maps the predictor's columns to feature ids (exits 2
 * naming the feature when the predictor reads one the features lack) */
void attention_set_features(Attention *a, KeyFeat *feat, const char *predictor_path);

void attention_init(Attention *a, const AttnOptions *opt, KVCache *kv, int n_heads, ThreadPool *pool);
void attention_free(Attention *a);
/* attend for query position pos (n_pos = pos + 1 visible positions); q_all/out_all hold all
 * heads ([n_heads x head_dim]); stats (may be NULL) receive sums over heads. */
void attend_layer(Attention *a, int layer, int pos, const float *q_all, float *out_all, int phase,
                  SelStats *stats);
/* whether a prefill chunk's attention can run a tile of queries at a time over an f32 cache,
 * with no reference kernel or stage times: exact prefill attention that records nothing per
 * query (no prefill importance, H2O mass, features), same bits as attend_layer per query; or
 * sparse prefill (--prefill-attn sparse, the sparse policy, sampled probes, no --kv-budget or
 * --exact-first-layer), whose blocks are chosen once per tile (select_tile_blocks: k - 1 of the
 * blocks before it by the tile's mean queries, and the tile's own) and whose probabilities
 * still feed the prefill importance. */
int attention_tiles_prefill(const Attention *a);
/* --kv-budget's prefill a tile of queries at a time (attention_tiles_prefill says so too):
 * --prefill-attn sparse under a policy that records no prefill importance or key features
 * (window, h2o, quest, random, oracle). Blocks are evicted only before the first query of a
 * block attends (a new block is what takes a head over its budget), so the queries of one
 * block keep the same blocks and their eviction reads no attention of theirs (h2o's mass is
 * that of the blocks before): the caller writes their keys and values and runs attend_evict
 * for each in order, then attend_prefill_tile for them all, where each head attends to the
 * blocks it keeps and h2o adds each query's probabilities to its mass in query order (same
 * bits as attend_layer per query). */
int attention_tiles_evicting(const Attention *a);
/* what attend_layer does before the prefill query at pos attends: --kv-budget's eviction
 * (none on layer 0 under --exact-first-layer) */
void attend_evict(Attention *a, int layer, int pos, const float *q_all);
/* the n queries at pos0 .. pos0 + n - 1 (q_all, out_all: [n][n_heads x head_dim]), each over
 * the positions up to its own; their keys and values must be in the cache (under
 * attention_tiles_evicting: queries of one block, evicted for already) */
void attend_prefill_tile(Attention *a, int layer, int pos0, int n, const float *q_all, float *out_all);

#endif
