/* cli.c — see cli.h. Every option is documented in engine/README.md. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "matmul.h"
#include "util.h"

/* ---------------------------------------------------------------- option table */

/* the commands an option applies to: bits 1 << Command */
enum {
    C_GEN = 1 << CMD_GENERATE, C_PPL = 1 << CMD_PPL, C_BENCH = 1 << CMD_ATTN_BENCH, C_PRED = 1 << CMD_PREDICT,
    C_MODEL = C_GEN | C_PPL, C_ALL = C_GEN | C_PPL | C_BENCH /* the commands that attend */
};
enum { T_FLAG, T_INT, T_STR, T_POLICY, T_KVTYPE, T_WTYPE, T_PREFILL, T_U64 };

typedef struct {
    const char *name;
    int commands, type;
    size_t offset; /* into Options */
    int lo, hi;    /* T_INT bounds */
    int value;     /* T_FLAG: the value stored */
} OptSpec;

/* every option but the attention switches, whose flags SWITCHES gives (policy.h) */
#define OFF(field) offsetof(Options, field)
static const OptSpec OPTIONS[] = {
    {"--model", C_MODEL, T_STR, OFF(model), 0, 0, 0},
    {"--prompt", C_GEN, T_STR, OFF(prompt), 0, 0, 0},
    {"--text", C_PPL, T_STR, OFF(text), 0, 0, 0},
    {"--dump-logits", C_GEN, T_STR, OFF(dump_logits), 0, 0, 0},
    {"--trace-selection", C_GEN | C_BENCH, T_STR, OFF(trace), 0, 0, 0},
    {"--dump-importance", C_GEN, T_STR, OFF(dump_importance), 0, 0, 0},
    {"--inputs", C_BENCH | C_PRED, T_STR, OFF(inputs), 0, 0, 0},
    {"--dump-out", C_BENCH | C_PRED, T_STR, OFF(dump_out), 0, 0, 0},
    {"--predictor", C_MODEL | C_PRED, T_STR, OFF(predictor), 0, 0, 0},
    {"--layer", C_PRED, T_INT, OFF(layer), 0, 4095, 0},
    {"--dump-features", C_MODEL, T_STR, OFF(dump_features), 0, 0, 0},
    {"--dump-every", C_MODEL, T_INT, OFF(dump_every), 1, 1 << 24, 0},
    {"--kv-budget", C_MODEL, T_INT, OFF(kv_budget), 1, 1 << 24, 0},
    {"--measure-keys", C_PPL, T_INT, OFF(measure_keys), 1, 1 << 24, 0},
    {"--measure-keys-keep", C_PPL, T_INT, OFF(measure_keys_keep), 1, 99, 0},
    {"--measure-keys-direct", C_PPL, T_INT, OFF(measure_keys_direct), 32, 1 << 24, 0},
    {"--kv-keep-evicted", C_MODEL, T_FLAG, OFF(keep_evicted), 0, 0, 1},
    {"--kv-prefault", C_MODEL, T_FLAG, OFF(kv_prefault), 0, 0, 1},
    {"--attn", C_ALL, T_POLICY, OFF(policy), 0, 0, 0},
    {"--k", C_ALL, T_INT, OFF(k), 1, 1 << 24, 0},
    {"--block", C_ALL, T_INT, OFF(block), 1, 1 << 20, 0},
    {"--probes", C_ALL, T_INT, OFF(probes), 1, 1 << 20, 0},
    {"--prefill-attn", C_MODEL, T_PREFILL, OFF(prefill_sparse), 0, 0, 0},
    {"--measure-selection", C_GEN | C_BENCH, T_FLAG, OFF(measure), 0, 0, 1},
    {"--seed", C_ALL, T_U64, OFF(seed), 0, 0, 0},
    {"--kv", C_ALL, T_KVTYPE, OFF(kv_q8), 0, 0, 0},
    {"--wq", C_MODEL, T_WTYPE, OFF(wq), 0, 0, 0},
    {"--bf16-acts", C_MODEL, T_FLAG, OFF(bf16_acts), 0, 0, 1},
    {"--threads", C_ALL, T_INT, OFF(threads), 1, 256, 0},
    {"--max-new", C_GEN, T_INT, OFF(max_new), 0, 1 << 24, 0},
    {"--ctx", C_ALL, T_INT, OFF(ctx), 1, 1 << 24, 0},
    {"--stop", C_GEN, T_INT, OFF(stops), 0, (1 << 22) - 1, 0},
    {"--heads", C_BENCH, T_INT, OFF(heads), 1, 1024, 0},
    {"--kv-heads", C_BENCH, T_INT, OFF(kv_heads), 1, 1024, 0},
    {"--head-dim", C_BENCH, T_INT, OFF(head_dim), 2, LMC_MAX_HEAD_DIM, 0},
    {"--runs", C_BENCH, T_INT, OFF(runs), 1, 10000, 0},
    {"--warmup", C_BENCH, T_INT, OFF(warmup), 0, 10000, 0},
    {"--stages", C_BENCH, T_FLAG, OFF(stages), 0, 0, 1},
    {"--layers", C_BENCH, T_INT, OFF(layers), 1, 1024, 0},
};
#define N_OPTIONS (int)(sizeof OPTIONS / sizeof OPTIONS[0])

static int parse_int(const char *flag, const char *value, int lo, int hi) {
    char *end;
    errno = 0;
    long long v = strtoll(value, &end, 10);
    if (errno || end == value || *end != '\0' || v < lo || v > hi)
        lmc_die_input("%s expects an integer in [%d, %d], got '%.64s'", flag, lo, hi, value);
    return (int)v;
}

/* what an option not given is (the switches: SWITCHES[].on) */
static const Options DEFAULTS = {
    .policy = POL_EXACT, .measure_keys_keep = 50, .k = 32, .block = 32, .probes = 8, .threads = 1, .max_new = 32, .runs = 7,
    .warmup = 1, .layers = 1, .dump_every = 1,
};

/* the switch whose flag arg is, or -1 */
static int find_switch(const char *arg) {
    for (int i = 0; i < N_SWITCHES; i++)
        if (strcmp(arg, SWITCHES[i].flag) == 0) return i;
    return -1;
}

void cli_parse(Options *o, Command cmd, const char *command, int argc, char **argv) {
    *o = DEFAULTS;
    for (int i = 0; i < N_SWITCHES; i++) o->switches[i] = SWITCHES[i].on;
    o->cmd = cmd;
    o->command = command;
    int cbit = 1 << cmd;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        int sw = find_switch(arg);
        if (sw >= 0 && (cbit & C_ALL)) { /* the switches are options of the commands that attend */
            o->switches[sw] = !SWITCHES[sw].on;
            continue;
        }
        const OptSpec *spec = NULL;
        for (int j = 0; j < N_OPTIONS; j++)
            if (strcmp(arg, OPTIONS[j].name) == 0) spec = &OPTIONS[j];
        if (!spec || !(spec->commands & cbit))
            lmc_die_input("unknown option '%.64s' for '%s' (options are listed in engine/README.md)", arg, command);
        char *field = (char *)o + spec->offset;
        if (spec->type == T_FLAG) {
            *(int *)field = spec->value;
            continue;
        }
        if (i + 1 >= argc) lmc_die_input("%s needs a value", arg);
        const char *value = argv[++i];
        switch (spec->type) {
        case T_STR: *(const char **)field = value; break;
        case T_INT:
            if (strcmp(arg, "--stop") == 0) {
                if (o->n_stops == MAX_STOPS) lmc_die_input("--stop given more than %d times", MAX_STOPS);
                o->stops[o->n_stops++] = parse_int(arg, value, spec->lo, spec->hi);
            } else {
                *(int *)field = parse_int(arg, value, spec->lo, spec->hi);
            }
            break;
        case T_U64: {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(value, &end, 10);
            if (errno || end == value || *end != '\0' || value[0] == '-')
                lmc_die_input("%s expects a non-negative integer, got '%.64s'", arg, value);
            *(uint64_t *)field = (uint64_t)v;
            break;
        }
        case T_POLICY:
            if (policy_parse(value, (Policy *)field) != 0) {
                char names[256];
                lmc_die_input("--attn '%.64s' is not a policy (allowed: %s)", value,
                              policy_list(ALL_POLICIES, ", ", names, sizeof names));
            }
            break;
        case T_KVTYPE:
            if (strcmp(value, "f32") == 0) *(int *)field = 0;
            else if (strcmp(value, "q8") == 0) *(int *)field = 1;
            else lmc_die_input("%s '%.64s' is not allowed (allowed: f32, q8)", arg, value);
            break;
        case T_WTYPE:
            if (strcmp(value, "f32") == 0) *(int *)field = WQ_F32;
            else if (strcmp(value, "q8") == 0) *(int *)field = WQ_Q8;
            else if (strcmp(value, "bf16") == 0) *(int *)field = WQ_BF16;
            else lmc_die_input("%s '%.64s' is not allowed (allowed: f32, q8, bf16)", arg, value);
            break;
        case T_PREFILL:
            if (strcmp(value, "exact") == 0) *(int *)field = 0;
            else if (strcmp(value, "sparse") == 0) *(int *)field = 1;
            else lmc_die_input("--prefill-attn '%.64s' is not allowed (allowed: exact, sparse)", value);
            break;
        }
    }
}

/* ---------------------------------------------------------------- shared checks */

/* every policy and switch named in a message comes from the tables (policy.h), in their order */
void cli_check_options(const Options *o) {
    const char *got = policy_name(o->policy);
    char names[256];
    for (int i = 0; i < N_SWITCHES; i++) {
        const SwitchInfo *sw = &SWITCHES[i];
        if (sw->strict && o->switches[i] != sw->on && !(sw->policies & POLICY_BIT(o->policy)))
            lmc_die_input("%s applies to --attn %s only (got --attn %s)", sw->flag,
                          policy_list(sw->policies, " or ", names, sizeof names), got);
    }
    /* attn-bench's synthetic data has no tokens to take features from */
    if (o->cmd == CMD_ATTN_BENCH && policy_uses_features(o->policy))
        lmc_die_input("--attn %s scores keys from token features: it runs in generate and ppl, not attn-bench", got);
    /* the rest are options of generate and ppl only (0 in attn-bench) */
    if (o->policy == POL_GBM && !o->predictor) lmc_die_input("--attn gbm needs --predictor FILE");
    const char *evicting = policy_list(policy_set(policy_can_evict), " or ", names, sizeof names);
    if (o->kv_budget && !policy_can_evict(o->policy))
        lmc_die_input("--kv-budget evicts by the policy's scores: --attn %s (got --attn %s)", evicting, got);
    if (o->kv_budget && o->kv_budget < o->block)
        lmc_die_input("--kv-budget %d is less than one block (--block %d)", o->kv_budget, o->block);
    if (o->keep_evicted && !o->kv_budget) lmc_die_input("--kv-keep-evicted needs --kv-budget");
    if (o->bf16_acts && o->wq != WQ_BF16)
        lmc_die_input("--bf16-acts rounds the activations of bf16 weight products: it needs --wq bf16 (got --wq %s)",
                      wq_name(o->wq));
    if (o->kv_prefault && o->kv_budget)
        lmc_die_input("--kv-prefault makes the whole cache resident at start, --kv-budget keeps only its budget: "
                      "give one of them");
    if (o->measure_keys && !policy_can_evict(o->policy))
        lmc_die_input("--measure-keys ranks keys by the policy's keep score: --attn %s (got --attn %s)", evicting,
                      got);
    if (o->predictor && o->policy != POL_GBM)
        lmc_die_input("--predictor applies to --attn gbm only (got --attn %s)", got);
}

/* ---------------------------------------------------------------- what the commands take and write */

AttnOptions cli_attn_options(const Options *o) {
    AttnOptions a;
    memset(&a, 0, sizeof a);
    a.sel.policy = o->policy;
    a.sel.k = o->k;
    a.sel.block = o->block;
    a.sel.probes = o->probes;
    a.sel.seed = o->seed;
    a.prefill_sparse = o->prefill_sparse;
    /* each switch into the member of AttnOptions its row names (policy.h) */
#define LMC_SWITCH_APPLY(id, name, flag, on, policies, strict, member) a.member = o->switches[SW_##id];
    LMC_SWITCH_TABLE(LMC_SWITCH_APPLY)
#undef LMC_SWITCH_APPLY
    a.measure = o->measure;
    if (o->trace) {
        a.trace = fopen(o->trace, "w");
        if (!a.trace) lmc_die_input("cannot write --trace-selection file %s: %s", o->trace, strerror(errno));
        fprintf(a.trace, "# lmc selection trace: query_pos layer head n_selected block_ids...\n");
    }
    a.predictor_path = o->predictor;
    a.kv_budget = o->kv_budget;
    a.kv_prefault = o->kv_prefault;
    a.rank_every = o->measure_keys;
    a.rank_keep = o->measure_keys_keep;
    a.rank_direct = o->measure_keys_direct;
    a.keep_evicted = o->keep_evicted;
    a.features_every = o->dump_every;
    a.dump_prefill = o->dump_importance != NULL;
    if (o->dump_features) {
        a.features = fopen(o->dump_features, "wb");
        if (!a.features)
            lmc_die_input("cannot write --dump-features file %s: %s", o->dump_features, strerror(errno));
    }
    return a;
}

static const char *kv_name(int q8) { return q8 ? "q8" : "f32"; }
static const char *prefill_name(int sparse) { return sparse ? "sparse" : "exact"; }

/* ", \"name\": true|false" of switch sw */
static void write_switch(FILE *f, const Options *o, Switch sw) {
    fprintf(f, ", \"%s\": %s", SWITCHES[sw].name, o->switches[sw] ? "true" : "false");
}

void cli_write_attn_config(FILE *f, const Options *o) {
    fprintf(f, "\"attn\": \"%s\", \"k\": %d, \"block\": %d, \"probes\": %d", policy_name(o->policy), o->k,
            o->block, o->probes);
    write_switch(f, o, SW_IMPORTANCE);
    write_switch(f, o, SW_RECENCY);
    write_switch(f, o, SW_PROBE_SUMMARY);
    fprintf(f, ", \"prefill_attn\": \"%s\", \"seed\": %llu, \"kv\": \"%s\", \"threads\": %d",
            prefill_name(o->prefill_sparse), (unsigned long long)o->seed, kv_name(o->kv_q8), o->threads);
    write_switch(f, o, SW_REF_ATTN);
    fprintf(f, ", \"kv_budget\": %d", o->kv_budget);
    write_switch(f, o, SW_EXACT_FIRST_LAYER);
}

void cli_write_selection(FILE *f, const SelStats *st, int steps, int measured) {
    double m = st->measured > 0 ? st->measured : 1;
    double per_step = steps > 0 ? 1.0 / steps : 0.0;
    fprintf(f, "{\"select_bytes\": %.0f, \"kv_bytes\": %.0f, \"bytes_read\": %.0f",
            st->select_bytes * per_step, st->kv_bytes * per_step,
            (st->select_bytes + st->kv_bytes) * per_step);
    if (measured && !(isfinite(st->mass) && isfinite(st->recall) && isfinite(st->max_abs_diff)))
        lmc_die_runtime("the selection's measured attention mass is not finite: the model's weights or "
                        "config give NaN or infinite values");
    if (measured)
        fprintf(f, ", \"mass\": %.9g, \"oracle_recall\": %.9g, \"max_abs_diff\": %.9g", st->mass / m,
                st->recall / m, st->max_abs_diff / m);
    fprintf(f, "}");
}

void cli_write_defaults(FILE *f) {
    const Options *d = &DEFAULTS;
    fprintf(f, "\"defaults\": {\"k\": %d, \"block\": %d, \"probes\": %d, \"kv\": \"%s\", \"wq\": \"%s\", "
               "\"prefill_attn\": \"%s\", \"threads\": %d}",
            d->k, d->block, d->probes, kv_name(d->kv_q8), wq_name(d->wq), prefill_name(d->prefill_sparse),
            d->threads);
}
