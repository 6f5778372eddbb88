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

int cmd_generate(const Options *o) {
    Session s;
    session_open(&s, o, "--prompt", o->prompt, o->max_new, o->dump_logits != NULL);
    const Config *c = &s.model.cfg;
    FILE *dump = NULL;
    if (o->dump_logits) {
        dump = fopen(o->dump_logits, "wb");
        if (!dump) lmc_die_input("cannot write --dump-logits file %s: %s", o->dump_logits, strerror(errno));
    }

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
