/* policy.c — see policy.h */
#include "policy.h"

#include <stdio.h>
#include <string.h>

const PolicyInfo POLICIES[N_POLICIES] = {
#define LMC_POLICY_INFO(id, name, keep, features) [POL_##id] = {name, keep, features},
    LMC_POLICY_TABLE(LMC_POLICY_INFO)
#undef LMC_POLICY_INFO
};

#define P(x) POLICY_BIT(POL_##x)
const SwitchInfo SWITCHES[N_SWITCHES] = {
    /* sparse reserves (k + 1) / 2 blocks by prefill importance */
    [SW_IMPORTANCE] = {"importance", "--no-importance", 1, P(SPARSE), 0},
    /* the selections that keep the last block (window always keeps the newest; oracle and
     * exact rank every block alike) */
    [SW_RECENCY] = {"recency", "--no-recency", 1,
                    P(SPARSE) | P(H2O) | P(QUEST) | P(RANDOM) | P(H2O_PREV) | P(GBM), 0},
    /* sparse probes full blocks by their key centroid */
    [SW_PROBE_SUMMARY] = {"probe_summary", "--probe-summary", 0, P(SPARSE), 1},
    /* exact attention by the plain reference */
    [SW_REF_ATTN] = {"ref_attn", "--ref-attn", 0, P(EXACT), 1},
    /* layer 0 attends to every key under every policy (none evicts or ranks there): the one
     * first-layer treatment for all, instead of each policy's own (h2o-prev has no previous
     * layer there and falls back to h2o's accumulated mass) */
    [SW_EXACT_FIRST_LAYER] = {"exact_first_layer", "--exact-first-layer", 0,
                              P(SPARSE) | P(WINDOW) | P(H2O) | P(QUEST) | P(RANDOM) | P(ORACLE) |
                                  P(H2O_PREV) | P(GBM),
                              1},
};
#undef P

const char *policy_name(Policy p) { return POLICIES[p].name; }

int policy_parse(const char *name, Policy *out) {
    for (int i = 0; i < N_POLICIES; i++)
        if (strcmp(name, POLICIES[i].name) == 0) {
            *out = (Policy)i;
            return 0;
        }
    return -1;
}

int policy_can_evict(Policy p) { return POLICIES[p].keep != KEEP_NONE; }
int policy_keeps_blocks(Policy p) { return POLICIES[p].keep == KEEP_BLOCKS; }
int policy_uses_features(Policy p) { return POLICIES[p].features; }

unsigned policy_set(int (*has)(Policy p)) {
    unsigned set = 0;
    for (int i = 0; i < N_POLICIES; i++)
        if (has((Policy)i)) set |= POLICY_BIT(i);
    return set;
}

const char *policy_list(unsigned set, const char *last, char *buf, size_t size) {
    int left = 0; /* policies in set still to write */
    for (int i = 0; i < N_POLICIES; i++) left += (set >> i) & 1u;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_POLICIES && len < size; i++) {
        if (!((set >> i) & 1u)) continue;
        const char *sep = len == 0 ? "" : left == 1 ? last : ", ";
        int n = snprintf(buf + len, size - len, "%s%s", sep, POLICIES[i].name);
        len += n > 0 ? (size_t)n : 0;
        left--;
    }
    return buf;
}
