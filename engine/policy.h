/* policy.h — the attention policies and the switches that tune them, each written down once:
 * a policy's name and what it can do, a switch's name, flag, default and the policies it
 * changes. Whatever names or lists them (--attn, the option checks and their messages,
 * `lmc info`) reads these two tables; select.c implements the policies themselves. */
#ifndef LMC_POLICY_H
#define LMC_POLICY_H

#include <stddef.h>

/* what --kv-budget evicts by and --measure-keys ranks by: the policy's keep score (evict.c) */
typedef enum {
    KEEP_NONE,   /* exact attends to every key by definition: it has no rule for what to drop */
    KEEP_KEYS,   /* a score per key (window: the newest, h2o: its mass, random: a fixed draw,
                  * h2o-prev and gbm: their key scores), summed over a block */
    KEEP_BLOCKS, /* the score its per-query selection ranks blocks by (select.c computes it) */
} KeepScore;

/* The policies, one row each: its enum name (POL_<ID>), its --attn name, what --kv-budget
 * evicts by, and whether it scores keys from token features (keyfeat.h: generate and ppl only;
 * attn-bench's synthetic data has no tokens). The row's place is its Policy value, and the
 * order every list of policies is written in. A new policy is a row here and its selection in
 * select.c (and a row of the harness's list, db/lmc_axes.py, which tests hold against `lmc
 * info`). */
#define LMC_POLICY_TABLE(X)                 \
    X(EXACT, "exact", KEEP_NONE, 0)         \
    X(SPARSE, "sparse", KEEP_BLOCKS, 0)     \
    X(WINDOW, "window", KEEP_KEYS, 0)       \
    X(H2O, "h2o", KEEP_KEYS, 0)             \
    X(QUEST, "quest", KEEP_BLOCKS, 0)       \
    X(RANDOM, "random", KEEP_KEYS, 0)       \
    X(ORACLE, "oracle", KEEP_BLOCKS, 0)     \
    X(H2O_PREV, "h2o-prev", KEEP_KEYS, 1)   \
    X(GBM, "gbm", KEEP_KEYS, 1)

typedef enum {
#define LMC_POLICY_ID(id, name, keep, features) POL_##id,
    LMC_POLICY_TABLE(LMC_POLICY_ID)
#undef LMC_POLICY_ID
    N_POLICIES
} Policy;

typedef struct {
    const char *name; /* --attn NAME */
    KeepScore keep;
    int features; /* scores keys from token features */
} PolicyInfo;

extern const PolicyInfo POLICIES[N_POLICIES];

const char *policy_name(Policy p);
/* -1 if unknown */
int policy_parse(const char *name, Policy *out);
int policy_can_evict(Policy p);     /* --kv-budget and --measure-keys take it */
int policy_keeps_blocks(Policy p);  /* its keep score is a per-block score (KEEP_BLOCKS) */
int policy_uses_features(Policy p); /* it scores keys from token features */

/* sets of policies: bit p for policy p */
#define POLICY_BIT(p) (1u << (p))
#define ALL_POLICIES ((1u << N_POLICIES) - 1u)
/* the policies p with has(p) */
unsigned policy_set(int (*has)(Policy p));
/* the names of the policies in set, in table order, ", " between them and `last` (", " or
 * " or ") before the last, into buf (cut short to fit size); returns buf */
const char *policy_list(unsigned set, const char *last, char *buf, size_t size);

/* ---------------------------------------------------------------- the switches */

typedef enum { SW_IMPORTANCE, SW_RECENCY, SW_PROBE_SUMMARY, SW_REF_ATTN, SW_EXACT_FIRST_LAYER, N_SWITCHES } Switch;

typedef struct {
    const char *name;  /* in a spec and in the "config" the commands write */
    const char *flag;  /* the option that turns it from its default */
    int on;            /* the default */
    unsigned policies; /* the policies whose attention it changes */
    /* the flag with any other policy is refused; --no-importance and --no-recency have always
     * been taken with every policy (and then change nothing), so they stay so */
    int strict;
} SwitchInfo;

extern const SwitchInfo SWITCHES[N_SWITCHES];

#endif
