/* run.c — `lmc generate` (greedy decoding) and `lmc ppl` (teacher-forced perplexity). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "json.h"
#include "model.h"
#include "util.h"

/* ---------------------------------------------------------------- shared set-up */

typedef struct {
    Model model;
    int *tokens;
    int n_tokens;
    int capacity;
    ThreadPool *pool;
    Forward fwd;
    AttnOptions attn;
    Gbm gbm; /* --predictor */
} Session;

static void check_attn_options(const Options *o) {
    if (o->probe_summary && o->policy != POL_SPARSE)
        lmc_die_input("--probe-summary applies to --attn sparse only (got --attn %s)", policy_name(o->policy));
    if (o->ref_attn && o->policy != POL_EXACT)
        lmc_die_input("--ref-attn applies to --attn exact only (got --attn %s)", policy_name(o->policy));
    if (o->policy == POL_GBM && !o->predictor) lmc_die_input("--attn gbm needs --predictor FILE");
    if (o->kv_budget && !attention_can_evict(o->policy))
        lmc_die_input("--kv-budget evicts by the policy's scores: --attn window, h2o, h2o-prev, gbm, random, sparse, "
                      "quest or oracle (got --attn %s)", policy_name(o->policy));
    if (o->kv_budget && o->kv_budget < o->block)
        lmc_die_input("--kv-budget %d is less than one block (--block %d)", o->kv_budget, o->block);
    if (o->measure_keys && !attention_can_evict(o->policy))
        lmc_die_input("--measure-keys ranks keys by the policy's keep score: --attn window, h2o, h2o-prev, gbm, "
                      "random, sparse, quest or oracle (got --attn %s)", policy_name(o->policy));
    if (o->predictor && o->policy != POL_GBM)
        lmc_die_input("--predictor applies to --attn gbm only (got --attn %s)", policy_name(o->policy));
}

/* load the model and the token file, check them against each other, size the context */
static void session_open(Session *s, const Options *o, const char *tokens_flag, const char *tokens_path,
                         int extra, int all_logits) {
    memset(s, 0, sizeof *s);
    if (!o->model) lmc_die_input("%s needs --model DIR", o->command);
    if (!tokens_path) lmc_die_input("%s needs %s FILE", o->command, tokens_flag);
    check_attn_options(o);
    if (lmc_read_tokens(tokens_path, &s->tokens, &s->n_tokens) != 0) lmc_die_input("%s", lmc_last_error());
    s->pool = pool_create(o->threads); /* loading converts weights on all threads too */
    if (model_load(&s->model, o->model, o->wq, s->pool) != 0) lmc_die_input("%s", lmc_last_error());
    const Config *c = &s->model.cfg;
    if (s->n_tokens == 0) lmc_die_input("%s %s holds no token ids", tokens_flag, tokens_path);
    for (int i = 0; i < s->n_tokens; i++)
        if (s->tokens[i] >= c->vocab)
            lmc_die_input("%s: token %d has id %d, not below the vocabulary size %d", tokens_path, i,
                          s->tokens[i], c->vocab);
    for (int i = 0; i < o->n_stops; i++)
        if (o->stops[i] >= c->vocab)
            lmc_die_input("--stop %d is not below the vocabulary size %d", o->stops[i], c->vocab);
    int ctx = o->ctx ? o->ctx : c->max_pos;
    if (s->n_tokens > ctx)
        lmc_die_input("%s %s has %d tokens, longer than the context of %d%s", tokens_flag, tokens_path,
                      s->n_tokens, ctx, o->ctx ? " (--ctx)" : " (max_position_embeddings)");
    /* the cache holds what this run can reach, not the model's whole context */
    long long need = (long long)s->n_tokens + extra;
    s->capacity = need < ctx ? (int)need : ctx;
    s->attn = cli_attn_options(o);
    if (o->predictor) {
        if (gbm_load(&s->gbm, o->predictor) != 0) lmc_die_input("%s", lmc_last_error());
        if (s->gbm.n_layers != c->n_layers)
            lmc_die_input("--predictor %s has %d layers, the model %d", o->predictor, s->gbm.n_layers, c->n_layers);
        s->attn.gbm = &s->gbm;
    }
    forward_init(&s->fwd, &s->model, s->capacity, &s->attn, o->kv_q8, all_logits, s->pool);
}

static void session_close(Session *s) {
    if (s->attn.trace) fclose(s->attn.trace);
    if (s->attn.features && fclose(s->attn.features) != 0) lmc_die_runtime("cannot write the --dump-features file");
    forward_free(&s->fwd);
    gbm_free(&s->gbm);
    pool_destroy(s->pool);
    model_free(&s->model);
    free(s->tokens);
}

static void write_config(FILE *f, const Options *o, const Session *s) {
    const Config *c = &s->model.cfg;
    fprintf(f, "\"config\": {\"model\": ");
    json_write_string(f, o->model);
    fprintf(f, ", ");
    cli_write_attn_config(f, o);
    fprintf(f, ", \"wq\": \"%s\", \"ctx\": %d, \"max_new\": %d, \"stop\": [", wq_name(o->wq),
            s->capacity, o->max_new);
    for (int i = 0; i < o->n_stops; i++) fprintf(f, "%s%d", i ? ", " : "", o->stops[i]);
    fprintf(f, "], \"model_config\": {\"model_type\": \"%s\", \"hidden_size\": %d, "
               "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d, "
               "\"head_dim\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d, "
               "\"rope_theta\": %.17g, \"rope_type\": \"%s\", \"rms_norm_eps\": %.9g, "
               "\"tied_embeddings\": %s, \"weights_dtype\": \"%s\"}}",
            c->model_type, c->hidden, c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads,
            c->head_dim, c->vocab, c->max_pos, c->rope_theta, c->rope_type, (double)c->rms_eps,
            s->model.tied_used ? "true" : "false", s->model.weights_dtype);
}

/* averaged selection diagnostics and bytes read, as one JSON object */
static void write_selection(FILE *f, const SelStats *st, int steps, int measured) {
    double m = st->measured > 0 ? st->measured : 1;
    double per_step = steps > 0 ? 1.0 / steps : 0.0;
    fprintf(f, "{\"select_bytes\": %.0f, \"kv_bytes\": %.0f, \"bytes_read\": %.0f",
            st->select_bytes * per_step, st->kv_bytes * per_step,
            (st->select_bytes + st->kv_bytes) * per_step);
    if (measured)
        fprintf(f, ", \"mass\": %.9g, \"oracle_recall\": %.9g, \"max_abs_diff\": %.9g", st->mass / m,
                st->recall / m, st->max_abs_diff / m);
    fprintf(f, "}");
}

/* ---------------------------------------------------------------- generate */

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
    double t0 = lmc_now_ms();
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
    double prefill_ms = lmc_now_ms() - t0;
    if (dump) fclose(dump);

    /* ---- decode: step i emits token i and feeds it at position n_prompt + i */
    int max_steps = s.capacity - s.n_tokens;
    if (max_steps > o->max_new) max_steps = o->max_new;
    int *out = lmc_alloc((size_t)max_steps + 1, sizeof(int), "tokens");
    double *ms = lmc_alloc((size_t)max_steps + 1, sizeof(double), "timings");
    double *attn_ms = lmc_alloc((size_t)max_steps + 1, sizeof(double), "timings");
    SelStats *step_stats = lmc_alloc((size_t)max_steps + 1, sizeof(SelStats), "statistics");
    SelStats total;
    memset(&total, 0, sizeof total);
    const char *stop_reason = o->max_new == 0 ? "max_new" : "context";
    int n_out = 0;
    int next = argmax(logits, c->vocab);
    for (int step = 0; step < max_steps; step++) {
        out[n_out] = next;
        double t1 = lmc_now_ms();
        logits = forward(&s.fwd, &next, 1, s.n_tokens + step, ATTN_DECODE, LOGITS_LAST, &step_stats[n_out]);
        ms[n_out] = lmc_now_ms() - t1;
        attn_ms[n_out] = s.fwd.attn_ms;
        n_out++;
        int stopped = 0;
        for (int j = 0; j < o->n_stops; j++) stopped |= o->stops[j] == next;
        if (stopped) {
            stop_reason = "stop";
            break;
        }
        if (n_out == o->max_new) stop_reason = "max_new";
        next = argmax(logits, c->vocab);
    }

    /* ---- report */
    printf("{\"schema\": \"%s\", \"command\": \"generate\", ", LMC_SCHEMA);
    write_config(stdout, o, &s);
    printf(", \"prompt_tokens\": %d, \"prefill_ms\": %.4f, \"stop_reason\": \"%s\", \"tokens\": [",
           s.n_tokens, prefill_ms, stop_reason);
    for (int i = 0; i < n_out; i++) printf("%s%d", i ? ", " : "", out[i]);
    printf("], \"steps\": [");
    for (int i = 0; i < n_out; i++) {
        printf("%s{\"token\": %d, \"ms\": %.4f, \"attn_ms\": %.4f", i ? ", " : "", out[i], ms[i], attn_ms[i]);
        if (o->measure) {
            printf(", \"selection\": ");
            write_selection(stdout, &step_stats[i], 1, 1);
        }
        printf("}");
        selstats_add(&total, &step_stats[i]);
    }
    printf("], \"decode_ms_per_token\": %.4f, \"attn_ms_per_token\": %.4f, \"selection\": ",
           lmc_median(ms, n_out), lmc_median(attn_ms, n_out));
    write_selection(stdout, &total, n_out, o->measure);
    printf("}\n");
    lmc_free(out);
    lmc_free(ms);
    lmc_free(attn_ms);
    lmc_free(step_stats);
    session_close(&s);
    return 0;
}

/* ---------------------------------------------------------------- ppl */

int cmd_ppl(const Options *o) {
    Session s;
    session_open(&s, o, "--text", o->text, 0, 1);
    const Config *c = &s.model.cfg;
    if (s.n_tokens < 2) lmc_die_input("--text %s needs at least 2 tokens to score", o->text);
    /* teacher forcing: position i predicts token i+1; the text runs as a prefill, so
     * --prefill-attn sparse applies the --attn policy to every position */
    double t0 = lmc_now_ms();
    double nll = 0.0;
    int scored = s.n_tokens - 1;
    for (int i = 0; i < scored; i += s.fwd.chunk) {
        int n = scored - i < s.fwd.chunk ? scored - i : s.fwd.chunk;
        float *logits = forward(&s.fwd, s.tokens + i, n, i, ATTN_PREFILL, LOGITS_ALL, NULL);
        for (int t = 0; t < n; t++) {
            const float *lt = logits + (size_t)t * c->vocab;
            float max = lt[argmax(lt, c->vocab)];
            double sum = 0.0;
            for (int v = 0; v < c->vocab; v++) sum += exp((double)(lt[v] - max));
            nll += -((double)(lt[s.tokens[i + t + 1]] - max) - log(sum));
        }
    }
    double elapsed = lmc_now_ms() - t0;
    nll /= scored;
    printf("{\"schema\": \"%s\", \"command\": \"ppl\", ", LMC_SCHEMA);
    write_config(stdout, o, &s);
    printf(", \"tokens\": %d, \"scored\": %d, \"nll\": %.9g, \"ppl\": %.9g, \"ms\": %.4f", s.n_tokens,
           scored, nll, exp(nll), elapsed);
    if (s.fwd.attn.keys.rank) {
        printf(", ");
        keyrank_write_json(stdout, s.fwd.attn.keys.rank);
    }
    printf("}\n");
    session_close(&s);
    return 0;
}
