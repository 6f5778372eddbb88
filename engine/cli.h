/* cli.h — lmc's command line: the options every command reads, their parsing and the checks
 * the commands share, and what the commands write from them. main.c dispatches to the commands
 * (cmd_*.c); they call in here, never into main.c or each other. */
#ifndef LMC_CLI_H
#define LMC_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "attend_layer.h"
#include "select.h"

#define MAX_STOPS 64

typedef enum { CMD_GENERATE, CMD_PPL, CMD_ATTN_BENCH, CMD_PREDICT } Command;

typedef struct {
    Command cmd;
    const char *command; /* its name, for messages */
    /* files */
    const char *model, *prompt, *text, *dump_logits, *trace, *inputs, *dump_out;
    const char *predictor, *dump_features;
    const char *dump_importance; /* generate --dump-importance FILE */
    int dump_every, layer; /* --dump-every; predict: --layer */
    int kv_budget;         /* --kv-budget, 0: off */
    int measure_keys;      /* --measure-keys N: rank the keys of every N-th query, 0: off */
    int measure_keys_keep; /* --measure-keys-keep P: lost_keep is the mass lost keeping P % */
    int measure_keys_direct; /* --measure-keys-direct D: recall32_direct's top D, 0: off */
    int keep_evicted;      /* --kv-keep-evicted */
    int kv_prefault;       /* --kv-prefault */
    /* attention */
    Policy policy;
    int k, block, probes, prefill_sparse, measure;
    int switches[N_SWITCHES]; /* by Switch (policy.h): on or off */
    uint64_t seed;
    int kv_q8, wq, threads; /* wq: WQ_F32, WQ_Q8 or WQ_BF16 (matmul.h) */
    int bf16_acts;          /* --bf16-acts: bf16 products take activations rounded to bf16 */
    /* generate / ppl */
    int max_new, ctx;
    int stops[MAX_STOPS], n_stops;
    /* attn-bench */
    int heads, kv_heads, head_dim, runs, warmup; /* attn-bench uses ctx as its context */
    int stages;                                  /* attn-bench --stages */
    int layers;                                  /* attn-bench: layers attended in turn per pass */
} Options;

/* ---- parsing and checks */
/* parse argv (after the command name) over the defaults; exits 2 naming the bad flag or value */
void cli_parse(Options *o, Command cmd, const char *name, int argc, char **argv);
/* the checks across options that generate, ppl and attn-bench share: attention policies and
 * their switches, the KV budget, --bf16-acts against --wq, --kv-prefault (which apply depends
 * on o->cmd); exits 2 naming the conflict */
void cli_check_options(const Options *o);

/* ---- what the commands take and write */
/* the attention options an Options describes; opens the trace file if asked */
AttnOptions cli_attn_options(const Options *o);
/* write the "config" members common to all commands (no braces) */
void cli_write_attn_config(FILE *f, const Options *o);
/* the "selection" object: bytes read and (measured) diagnostics, per step over `steps` */
void cli_write_selection(FILE *f, const SelStats *st, int steps, int measured);
/* `lmc info`'s "defaults" member: the values cli_parse starts from (no leading comma) */
void cli_write_defaults(FILE *f);

/* ---- the commands, each in its cmd_*.c */
int cmd_generate(const Options *o);
int cmd_ppl(const Options *o);
int cmd_attn_bench(const Options *o);
int cmd_predict(const Options *o);

#endif
