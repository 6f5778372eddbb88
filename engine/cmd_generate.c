/* cmd_generate.c — `lmc generate`: prefill of the prompt, then greedy decoding (argmax, ties to
 * the lowest id), each step timed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "session.h"
#include "util.h"

/* NaN or infinite logits (NaN weights, say) would decode garbage and print nan: end the run */
static void check_finite(const float *logits, int vocab, int position) {
    for (int v = 0; v < vocab; v++)
        if (!isfinite(logits[v]))
            lmc_die_runtime("the logits at position %d are not finite (token %d: %g): the model's "
                            "weights or config give NaN or infinite values", position, v, (double)logits[v]);
}

/* a row of floats after a label, each as %.9g (a float32 read back exactly) */
static void write_floats(FILE *f, const char *label, const float *x, int n) {
    fputs(label, f);
    for (int i = 0; i < n; i++) fprintf(f, " %.9g", (double)x[i]);
    fputc('\n', f);
}

/* --dump-importance (engine/README.md): after prefill, every layer's prefill importance and
 * what recomputing layer 0's needs: its queries, its keys as the cache holds them and, for a
 * sparse prefill, the blocks each query and head attended */
static void write_importance(FILE *f, const Session *s, const Options *o) {
    const Attention *a = &s->fwd.attn;
    int n = s->n_tokens, H = a->n_heads, D = a->head_dim;
    char label[64];
    fprintf(f, "# lmc prefill importance: engine/README.md, --dump-importance\n");
    fprintf(f, "shape %d %d %d %d %d %d %s\n", a->n_layers, H, a->n_kv, D, a->kv->block, n,
            o->prefill_sparse ? "sparse" : "exact");
    for (int l = 0; l < a->n_layers; l++) {
        snprintf(label, sizeof label, "importance %d", l);
        write_floats(f, label, a->state.importance + (size_t)l * a->capacity, n);
    }
    for (int p = 0; p < n; p++)
        for (int h = 0; h < H; h++) {
            snprintf(label, sizeof label, "q %d %d", p, h);
            write_floats(f, label, a->dump.q + ((size_t)p * H + h) * D, D);
        }
    float key[LMC_MAX_HEAD_DIM];
    for (int p = 0; p < n; p++)
        for (int g = 0; g < a->n_kv; g++) {
            kv_key_read(a->kv, 0, p, g, key);
            snprintf(label, sizeof label, "k %d %d", p, g);
            write_floats(f, label, key, D);
        }
    for (int p = 0; a->dump.sel && p < n; p++)
        for (int h = 0; h < H; h++) {
            size_t at = (size_t)p * H + h;
            fprintf(f, "blocks %d %d %d", p, h, a->dump.n_sel[at]);
            for (int i = 0; i < a->dump.n_sel[at]; i++) fprintf(f, " %d", a->dump.sel[at * a->n_blocks + i]);
            fputc('\n', f);
        }
    if (fclose(f) != 0) lmc_die_runtime("cannot write --dump-importance file %s", o->dump_importance);
}

int cmd_generate(const Options *o) {
    if (o->dump_importance && !policy_has(o->policy, T_IMPORTANCE)) {
        char names[256];
        lmc_die_input("--dump-importance writes the prefill importance, which --attn %s records (got --attn %s)",
                      policy_list(POLICIES_WITH(T_IMPORTANCE), " or ", names, sizeof names), policy_name(o->policy));
    }
    Session s;
    session_open(&s, o, "--prompt", o->prompt, o->max_new, o->dump_logits != NULL);
    const Config *c = &s.model.cfg;
    FILE *dump = NULL;
    if (o->dump_logits) {
        dump = fopen(o->dump_logits, "wb");
        if (!dump) lmc_die_input("cannot write --dump-logits file %s: %s", o->dump_logits, strerror(errno));
    }
    FILE *importance = o->dump_importance ? fopen(o->dump_importance, "w") : NULL;
    if (o->dump_importance && !importance)
        lmc_die_input("cannot write --dump-importance file %s: %s", o->dump_importance, strerror(errno));

    /* ---- prefill: the prompt in chunks; logits only where needed */
    double c0 = lmc_cpu_ms(), t0 = lmc_now_ms(); /* the CPU clock read outside the wall span */
    float *logits = NULL;
    for (int i = 0, n; i < s.n_tokens; i += n) {
        n = s.n_tokens - i < s.fwd.chunk ? s.n_tokens - i : s.fwd.chunk;
        int last = i + n == s.n_tokens;
        logits = forward(&s.fwd, s.tokens + i, n, i, ATTN_PREFILL,
                         dump ? LOGITS_ALL : last ? LOGITS_LAST : LOGITS_NONE, NULL);
        if (!dump) continue;
        if (fwrite(logits, sizeof(float), (size_t)n * c->vocab, dump) != (size_t)n * c->vocab)
            lmc_die_runtime("cannot write --dump-logits file %s", o->dump_logits);
        if (last) logits += (size_t)(n - 1) * c->vocab; /* the last position's row */
    }
    double prefill_ms = lmc_now_ms() - t0, prefill_cpu_ms = lmc_cpu_ms() - c0;
    if (dump) fclose(dump);
    if (importance) write_importance(importance, &s, o);

    /* ---- decode: step i emits token i and feeds it at position n_prompt + i */
    int max_steps = s.capacity - s.n_tokens;
    if (max_steps > o->max_new) max_steps = o->max_new;
    int *out = lmc_alloc((size_t)max_steps + 1, sizeof(int), "tokens");
    double *ms = lmc_alloc((size_t)max_steps + 1, sizeof(double), "timings");
    double *attn_ms = lmc_alloc((size_t)max_steps + 1, sizeof(double), "timings");
    double *cpu_ms = lmc_alloc((size_t)max_steps + 1, sizeof(double), "timings");
    SelStats *step_stats = lmc_alloc((size_t)max_steps + 1, sizeof(SelStats), "statistics");
    SelStats total;
    memset(&total, 0, sizeof total);
    const char *stop_reason = o->max_new == 0 ? "max_new" : "context";
    int n_out = 0;
    check_finite(logits, c->vocab, s.n_tokens - 1);
    int next = argmax(logits, c->vocab);
    for (int step = 0; step < max_steps; step++) {
        out[n_out] = next;
        double c1 = lmc_cpu_ms(), t1 = lmc_now_ms();
        logits = forward(&s.fwd, &next, 1, s.n_tokens + step, ATTN_DECODE, LOGITS_LAST, &step_stats[n_out]);
        ms[n_out] = lmc_now_ms() - t1;
        cpu_ms[n_out] = lmc_cpu_ms() - c1;
        attn_ms[n_out] = s.fwd.attn_ms;
        n_out++;
        int stopped = 0;
        for (int j = 0; j < o->n_stops; j++) stopped |= o->stops[j] == next;
        if (stopped) {
            stop_reason = "stop";
            break;
        }
        if (n_out == o->max_new) stop_reason = "max_new";
        check_finite(logits, c->vocab, s.n_tokens + step);
        next = argmax(logits, c->vocab);
    }

    /* ---- report */
    printf("{\"schema\": \"%s\", \"command\": \"generate\", ", LMC_SCHEMA);
    session_write_config(stdout, o, &s);
    printf(", \"prompt_tokens\": %d, \"prefill_ms\": %.4f, \"prefill_cpu_ms\": %.4f, "
           "\"stop_reason\": \"%s\", \"tokens\": [", s.n_tokens, prefill_ms, prefill_cpu_ms,
           stop_reason);
    for (int i = 0; i < n_out; i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"steps\": [");
    for (int i = 0; i < n_out; i++) {
        printf("%s{\"token\": %d, \"ms\": %.4f, \"attn_ms\": %.4f", i ? ", " : "", out[i], ms[i], attn_ms[i]);
        if (o->measure) {
            printf(", \"selection\": ");
            cli_write_selection(stdout, &step_stats[i], 1, 1);
        }
        printf("}");
        selstats_add(&total, &step_stats[i]);
    }
    printf("], \"decode_ms_per_token\": %.4f, \"decode_cpu_ms_per_token\": %.4f, "
           "\"attn_ms_per_token\": %.4f, \"selection\": ",
           lmc_median(ms, n_out), lmc_median(cpu_ms, n_out), lmc_median(attn_ms, n_out));
    cli_write_selection(stdout, &total, n_out, o->measure);
    session_write_memory(stdout, &s);
    printf("}\n");
    lmc_free(out);
    lmc_free(ms);
    lmc_free(attn_ms);
    lmc_free(cpu_ms);
    lmc_free(step_stats);
    session_close(&s);
    return 0;
}
