/* main.c — lmc's entry point: which command runs, and `lmc info`.
 *
 *   lmc info
 *   lmc generate   --model DIR --prompt FILE [options]
 *   lmc ppl        --model DIR --text FILE [options]
 *   lmc attn-bench --ctx N --heads H --kv-heads G --head-dim D [options]
 *   lmc predict    --predictor FILE --layer L --inputs FILE --dump-out FILE
 *
 * Every option is documented in engine/README.md (parsed by cli.c). Output: one JSON document
 * on stdout. Bad input: exit 2 and one line "lmc: error: ..." on stderr. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "json.h"
#include "ops.h"
#include "util.h"

/* ---------------------------------------------------------------- info */

/* the names of a set of policies as a JSON array, in table order */
static void write_policies(unsigned set) {
    printf("[");
    for (int i = 0, n = 0; i < N_POLICIES; i++) {
        if (!((set >> i) & 1u)) continue;
        printf("%s", n++ ? ", " : "");
        json_write_string(stdout, policy_name((Policy)i));
    }
    printf("]");
}

/* what the build is, then what the policy and switch tables (policy.h) and the option
 * defaults (cli.c) say, so the harness can hold its own lists against the engine's */
static int cmd_info(void) {
    printf("{\"schema\": \"%s\", \"command\": \"info\", \"version\": \"%s\", \"source_hash\": ",
           LMC_SCHEMA, LMC_VERSION);
    json_write_string(stdout, LMC_SOURCE_HASH);
    printf(", \"compiler\": ");
    json_write_string(stdout, LMC_COMPILER);
    printf(", \"flags\": ");
    json_write_string(stdout, LMC_FLAGS);
    printf(", \"arch\": ");
    json_write_string(stdout, LMC_TARGET);
    printf(", \"isa\": ");
    json_write_string(stdout, LMC_ISA);
    printf(", \"simd\": [%s], \"q8_group\": %d, \"policies\": ", simd_features(), Q8_GROUP);
    write_policies(ALL_POLICIES);
    printf(", \"evicting\": ");
    write_policies(policy_set(policy_can_evict));
    printf(", \"feature_policies\": ");
    write_policies(policy_set(policy_uses_features));
    printf(", \"switches\": [");
    for (int i = 0; i < N_SWITCHES; i++) {
        const SwitchInfo *sw = &SWITCHES[i];
        printf("%s{\"name\": ", i ? ", " : "");
        json_write_string(stdout, sw->name);
        printf(", \"flag\": ");
        json_write_string(stdout, sw->flag);
        printf(", \"default\": %s, \"policies\": ", sw->on ? "true" : "false");
        write_policies(sw->policies);
        printf("}");
    }
    printf("], ");
    cli_write_defaults(stdout);
    printf("}\n");
    return 0;
}

/* ---------------------------------------------------------------- dispatch */

static const struct {
    const char *name;
    Command cmd;
    int (*run)(const Options *o);
} COMMANDS[] = {
    {"generate", CMD_GENERATE, cmd_generate},
    {"ppl", CMD_PPL, cmd_ppl},
    {"attn-bench", CMD_ATTN_BENCH, cmd_attn_bench},
    {"predict", CMD_PREDICT, cmd_predict},
};
#define N_COMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

static void usage(void) {
    fprintf(stderr, "usage: lmc info | generate --model DIR --prompt FILE [options] | "
                    "ppl --model DIR --text FILE [options] | "
                    "attn-bench --ctx N --heads H --kv-heads G --head-dim D [options] | "
                    "predict --predictor FILE --layer L --inputs FILE --dump-out FILE\n");
}

int main(int argc, char **argv) {
    if (argc < 2) lmc_die_input("no command given (allowed: info, generate, ppl, attn-bench, predict; see engine/README.md)");
    const char *command = argv[1];
    if (strcmp(command, "info") == 0) {
        if (argc > 2) lmc_die_input("unknown option '%.64s' for 'info' (it takes none)", argv[2]);
        return cmd_info();
    }
    if (strcmp(command, "--help") == 0 || strcmp(command, "-h") == 0) {
        usage();
        return 0;
    }
    for (int i = 0; i < N_COMMANDS; i++) {
        if (strcmp(command, COMMANDS[i].name) != 0) continue;
        Options o;
        cli_parse(&o, COMMANDS[i].cmd, command, argc - 2, argv + 2);
        return COMMANDS[i].run(&o);
    }
    lmc_die_input("unknown command '%.64s' (allowed: info, generate, ppl, attn-bench, predict)", command);
}
