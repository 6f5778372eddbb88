/* policy.h — the attention policies and the switches that tune them, each written down once:
 * a policy's name and what it does beyond choosing blocks, a switch's name, flag, default, the
 * policies it changes and the option it sets. Whatever names, lists or branches on them
 * (--attn, the option checks and their messages, `lmc info`, the attention's code paths) reads
 * these two tables; select.c implements the policies' selections themselves. */
#ifndef LMC_POLICY_H
#define LMC_POLICY_H

#include <stddef.h>

/* ---------------------------------------------------------------- the policies */

/* what --kv-budget evicts by and --measure-keys ranks by: the policy's keep score (evict.c) */
typedef enum {
    KEEP_NONE,      /* exact attends to every key by definition: it has no rule for what to drop */
    KEEP_NEWEST,    /* a key's position, the oldest first; block 0 (StreamingLLM's sink) stays */
    KEEP_MASS,      /* the head's attention mass accumulated on the key (needs T_MASS) */
    KEEP_DRAW,      /* a fixed draw per (seed, layer, head, key): select_random_key */
    KEEP_KEY_SCORE, /* the key's score for the query, from its features (Attention.keys.key_score) */
    KEEP_BLOCKS,    /* the score its per-query selection ranks blocks by (select.c computes it) */
} KeepScore;

/* What a policy does beyond choosing blocks, one bit each. The attention (attend_*.c) and
 * eviction (evict.c) branch on these and on the keep score, not on which policy runs, so a new
 * policy that does one of them gets its code paths from its row. Ids are compared only where a
 * policy's own rule lives (select.c's selections, gbm's --predictor in cli.c, h2o-prev's and
 * gbm's key scorers in evict.c) and where the engine runs exact attention or the oracle itself
 * (an exact prefill, --exact-first-layer, --ref-attn, --measure-selection's yardstick). */
enum {
    /* scores keys from token features (keyfeat.h): generate and ppl only, attn-bench's
     * synthetic data has no tokens */
    T_FEATURES = 1 << 0,
    /* its selection keeps the last block unless --no-recency */
    T_RECENCY = 1 << 1,
    /* records the attention each position gets in prefill (PolicyState.importance) and reserves
     * blocks by it at decode, unless --no-importance */
    T_IMPORTANCE = 1 << 2,
    /* ranks blocks by probing their keys (select_probe_group), which the heads of a GQA group
     * share (one kernel pass over their union) and a prefill tile does once for its queries */
    T_PROBES = 1 << 3,
    /* accumulates each head's attention mass over the queries (PolicyState.mass) */
    T_MASS = 1 << 4,
    /* ranks blocks by exact attention, which the head computes over every block first */
    T_EXACT_SCORES = 1 << 5,
};

/* The policies, one row each: its enum name (POL_<ID>), its --attn name, what --kv-budget
 * evicts by, and what it does beyond choosing blocks (the T_ bits). The row's place is its
 * Policy value, and the order every list of policies is written in. A new policy is a row here
 * and its selection in select.c (a new kind of keep score also its case in evict.c), and a row
 * of the harness's list, db/lmc_axes.py, which tests hold against `lmc info`: the checklist
 * "Add an attention policy (lmc)" in harness/engines/README.md. `a` is passed to every X
 * unchanged (POLICIES_WITH's trait). */
#define LMC_POLICY_TABLE(X, a)                                                    \
    X(a, EXACT, "exact", KEEP_NONE, 0)                                            \
    X(a, SPARSE, "sparse", KEEP_BLOCKS, T_RECENCY | T_IMPORTANCE | T_PROBES)      \
    X(a, WINDOW, "window", KEEP_NEWEST, 0)                                        \
    X(a, H2O, "h2o", KEEP_MASS, T_RECENCY | T_MASS)                               \
    X(a, QUEST, "quest", KEEP_BLOCKS, T_RECENCY)                                  \
    X(a, RANDOM, "random", KEEP_DRAW, T_RECENCY)                                  \
    X(a, ORACLE, "oracle", KEEP_BLOCKS, T_EXACT_SCORES)                           \
    X(a, H2O_PREV, "h2o-prev", KEEP_KEY_SCORE, T_FEATURES | T_RECENCY | T_MASS)   \
    X(a, GBM, "gbm", KEEP_KEY_SCORE, T_FEATURES | T_RECENCY)

typedef enum {
#define LMC_POLICY_ID(a, id, ...) POL_##id,
    LMC_POLICY_TABLE(LMC_POLICY_ID, _)
#undef LMC_POLICY_ID
    N_POLICIES
} Policy;

typedef struct {
    const char *name; /* --attn NAME */
    KeepScore keep;
    unsigned traits; /* T_ bits */
} PolicyInfo;

extern const PolicyInfo POLICIES[N_POLICIES];

const char *policy_name(Policy p);
/* -1 if unknown */
int policy_parse(const char *name, Policy *out);
int policy_has(Policy p, unsigned trait); /* p has the T_ bit trait */
int policy_can_evict(Policy p);           /* --kv-budget and --measure-keys take it */
int policy_keeps_blocks(Policy p);        /* its keep score is a per-block score (KEEP_BLOCKS) */
int policy_uses_features(Policy p);       /* it scores keys from token features (T_FEATURES) */

/* sets of policies: bit p for policy p */
#define POLICY_BIT(p) (1u << (p))
#define ALL_POLICIES ((1u << N_POLICIES) - 1u)
/* every policy that chooses blocks: exact attends to every key whatever it is told */
#define NON_EXACT_POLICIES (ALL_POLICIES & ~POLICY_BIT(POL_EXACT))
/* the policies with trait t, as a constant (the switch table's sets are initialisers) */
#define LMC_POLICY_IF_TRAIT(t, id, name, keep, traits) | (((traits) & (t)) ? POLICY_BIT(POL_##id) : 0u)
#define POLICIES_WITH(t) (0u LMC_POLICY_TABLE(LMC_POLICY_IF_TRAIT, t))
/* the policies p with has(p) */
unsigned policy_set(int (*has)(Policy p));
/* the names of the policies in set, in table order, ", " between them and `last` (", " or
 * " or ") before the last, into buf (cut short to fit size); returns buf */
const char *policy_list(unsigned set, const char *last, char *buf, size_t size);

/* ---------------------------------------------------------------- the switches */

/* The switches, one row each: its enum name (SW_<ID>); its name in a spec and in the "config"
 * the commands write; the flag that turns it from its default; the default; the policies whose
 * attention it changes; strict: the flag with any other policy is refused (--no-importance and
 * --no-recency have always been taken with every policy, and then change nothing, so they stay
 * so); and the member of AttnOptions (attend_layer.h) it sets, where the attention reads it
 * (cli_attn_options). The row's place is its Switch value and its place in `lmc info`. A new
 * switch is a row here, its member, the code that reads it, its "config" member in
 * cli_write_attn_config and a row of db/lmc_axes.py:SWITCHES. */
#define LMC_SWITCH_TABLE(X)                                                                          \
    /* sparse reserves (k + 1) / 2 blocks by prefill importance */                                   \
    X(IMPORTANCE, "importance", "--no-importance", 1, POLICIES_WITH(T_IMPORTANCE), 0, sel.importance) \
    /* the selections that keep the last block (window always keeps the newest; oracle and exact   \
     * rank every block alike) */                                                                    \
    X(RECENCY, "recency", "--no-recency", 1, POLICIES_WITH(T_RECENCY), 0, sel.recency)               \
    /* sparse probes full blocks by their key centroid */                                            \
    X(PROBE_SUMMARY, "probe_summary", "--probe-summary", 0, POLICIES_WITH(T_PROBES), 1,              \
      sel.probe_summary)                                                                             \
    /* exact attention by the plain reference */                                                     \
    X(REF_ATTN, "ref_attn", "--ref-attn", 0, POLICY_BIT(POL_EXACT), 1, reference)                    \
    /* layer 0 attends to every key under every policy (none evicts or ranks there): the one       \
     * first-layer treatment for all, instead of each policy's own (h2o-prev has no previous       \
     * layer there and falls back to h2o's accumulated mass) */                                    \
    X(EXACT_FIRST_LAYER, "exact_first_layer", "--exact-first-layer", 0, NON_EXACT_POLICIES, 1,        \
      exact_first_layer)

typedef enum {
#define LMC_SWITCH_ID(id, ...) SW_##id,
    LMC_SWITCH_TABLE(LMC_SWITCH_ID)
#undef LMC_SWITCH_ID
    N_SWITCHES
} Switch;

typedef struct {
    const char *name;  /* in a spec and in the "config" the commands write */
    const char *flag;  /* the option that turns it from its default */
    int on;            /* the default */
    unsigned policies; /* the policies whose attention it changes */
    int strict;        /* the flag with any other policy is refused */
} SwitchInfo;

extern const SwitchInfo SWITCHES[N_SWITCHES];

#endif
