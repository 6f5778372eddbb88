/* keyfeat.h — seed 004's cheap per-key features, the attention mass each key received, and
 * the dump that trains the predictor (--dump-features).
 *
 * For the query at position t (the last appended) and key j <= t, at layer l:
 *   distance   t - j                    rel_pos  j / (t + 1)          pos  j
 *   s64, s128, s256  windowed surprisal of key token x_j: ln((n + 1) / (c + 1)), n = min(W, j)
 *              tokens before j, c = how many of them equal x_j (a token the window has seen
 *              often is unsurprising)
 *   s_glob     ln((t + 1) / f), f = occurrences of x_j in positions 0..t (the whole context)
 *   freq       f                        same_token  1 if x_j == x_t, else 0
 *   emb_dot    <emb[x_t], emb[x_j]>     emb_norm  |emb[x_j]|  (the token embeddings)
 *   prev_mass  the attention probability key j got from this query at layer l - 1, mean over
 *              query heads (0 at layer 0); prev2_mass the same at layer l - 2;
 *   prev_head<h>  head h's probability at layer l - 1.
 * The target is the mass at layer l itself (mean over heads). The masses are those of the
 * attention that ran: exact in a dump, the selected blocks only (0 elsewhere) under a sparse
 * policy. Features use the query only through its token and position, never q.k. */
#ifndef LMC_KEYFEAT_H
#define LMC_KEYFEAT_H

#include <stdio.h>

enum {
    KF_DISTANCE, KF_REL_POS, KF_POS, KF_S64, KF_S128, KF_S256, KF_SGLOB, KF_FREQ, KF_SAME_TOKEN,
    KF_EMB_DOT, KF_EMB_NORM, KF_PREV_MASS, KF_PREV2_MASS,
    KF_PREV_HEAD0 /* then one per query head */
};

typedef struct {
    int n_layers, n_heads, capacity, hidden, vocab;
    int n_pos;       /* positions appended; the query is n_pos - 1 */
    int *token;      /* [capacity] */
    int *count;      /* [vocab] occurrences in 0..n_pos-1 */
    float *window;   /* [capacity][3]: s64, s128, s256 */
    float *emb;      /* [capacity][hidden]: the token embeddings */
    float *emb_norm; /* [capacity] */
    float *emb_dot;  /* [capacity]: against the current query's embedding */
    float *mass;     /* [n_layers][n_heads][capacity]: the current query's probabilities */
    FILE *dump;      /* --dump-features, or NULL */
    int dump_every;  /* dump queries at positions p with (p + 1) % dump_every == 0 */
} KeyFeat;

void keyfeat_init(KeyFeat *f, int n_layers, int n_heads, int capacity, int hidden, int vocab);
void keyfeat_free(KeyFeat *f);
int keyfeat_count(const KeyFeat *f); /* features per key: KF_PREV_HEAD0 + n_heads */
/* the feature id of a name, -1 if unknown */
int keyfeat_lookup(const KeyFeat *f, const char *name);
/* write the dump's header (call once, before any query) */
void keyfeat_dump_header(KeyFeat *f);
/* append the token at position n_pos with its embedding [hidden]; it becomes the query */
void keyfeat_append(KeyFeat *f, int token, const float *embedding);
/* the attention probability key j got from the current query at layer l, mean over heads */
float keyfeat_mass(const KeyFeat *f, int layer, int j);
/* feature `id` of key j for the current query at layer l */
float keyfeat_value(const KeyFeat *f, int layer, int j, int id);
/* record head h's attention at layer l: probs[p] for p in the selected blocks, 0 elsewhere */
void keyfeat_record(KeyFeat *f, int layer, int head, const int *blocks, int n_blocks, int block,
                    const float *probs);
/* after the last layer: write the current query's rows when it is due (see dump_every) */
void keyfeat_dump_query(KeyFeat *f);

#endif
