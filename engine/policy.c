/* policy.c — see policy.h */
#include "policy.h"

#include <stdio.h>
#include <string.h>

const PolicyInfo POLICIES[N_POLICIES] = {
#define LMC_POLICY_INFO(a, id, name, keep, traits) [POL_##id] = {name, keep, traits},
    LMC_POLICY_TABLE(LMC_POLICY_INFO, _)
#undef LMC_POLICY_INFO
};

const SwitchInfo SWITCHES[N_SWITCHES] = {
#define LMC_SWITCH_INFO(id, name, flag, on, policies, strict, member) [SW_##id] = {name, flag, on, policies, strict},
    LMC_SWITCH_TABLE(LMC_SWITCH_INFO)
#undef LMC_SWITCH_INFO
};

const char *policy_name(Policy p) { return POLICIES[p].name; }

int policy_parse(const char *name, Policy *out) {
    for (int i = 0; i < N_POLICIES; i++)
        if (strcmp(name, POLICIES[i].name) == 0) {
            *out = (Policy)i;
            return 0;
        }
    return -1;
}

int policy_has(Policy p, unsigned trait) { return (POLICIES[p].traits & trait) != 0; }
int policy_can_evict(Policy p) { return POLICIES[p].keep != KEEP_NONE; }
int policy_keeps_blocks(Policy p) { return POLICIES[p].keep == KEEP_BLOCKS; }
int policy_uses_features(Policy p) { return policy_has(p, T_FEATURES); }

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
