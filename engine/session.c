/* session.c — see session.h */
#include "session.h"

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "json.h"
#include "util.h"

void session_open(Session *s, const Options *o, const char *tokens_flag, const char *tokens_path,
                  int extra, int all_logits) {
    memset(s, 0, sizeof *s);
    if (!o->model) lmc_die_input("%s needs --model DIR", o->command);
    if (!tokens_path) lmc_die_input("%s needs %s FILE", o->command, tokens_flag);
    cli_check_options(o);
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
    forward_init(&s->fwd, &s->model, s->capacity, &s->attn, o->kv_q8, o->bf16_acts, all_logits, s->pool);
}

void session_close(Session *s) {
    if (s->attn.trace) fclose(s->attn.trace);
    if (s->attn.features && fclose(s->attn.features) != 0) lmc_die_runtime("cannot write the --dump-features file");
    forward_free(&s->fwd);
    gbm_free(&s->gbm);
    pool_destroy(s->pool);
    model_free(&s->model);
    free(s->tokens);
}

void session_write_config(FILE *f, const Options *o, const Session *s) {
    const Config *c = &s->model.cfg;
    fprintf(f, "\"config\": {\"model\": ");
    json_write_string(f, o->model);
    fprintf(f, ", ");
    cli_write_attn_config(f, o);
    fprintf(f, ", \"prefill_tiles\": %s", attention_tiles_prefill(&s->fwd.attn) ? "true" : "false");
    fprintf(f, ", \"wq\": \"%s\", \"bf16_acts\": %s, \"ctx\": %d, \"max_new\": %d, \"stop\": [", wq_name(o->wq),
            o->bf16_acts ? "true" : "false", s->capacity, o->max_new);
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

/* The process's peak resident set in KiB: VmHWM of /proc/self/status, which belongs to this
 * program's address space. getrusage's ru_maxrss is only the fallback: Linux carries it over
 * exec from the parent's address space, so lmc started by a large process (a Python harness,
 * a test runner) would report the parent's peak instead of its own. */
static long peak_rss_kb(void) {
    FILE *status = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (status && kb < 0 && fgets(line, sizeof line, status))
        if (sscanf(line, "VmHWM: %ld kB", &kb) != 1) kb = -1;
    if (status) fclose(status);
    if (kb >= 0) return kb;
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_maxrss : 0;
}

void session_write_memory(FILE *f, const Session *s) {
    const KVCache *kv = &s->fwd.kv;
    size_t block = kv_block_bytes(kv);
    fprintf(f, ", \"kv_memory\": {\"paged\": %s, \"block_bytes\": %zu, \"allocated_bytes\": %zu, "
               "\"resident_bytes\": %zu, \"live_bytes\": %zu, \"peak_live_bytes\": %zu}, \"peak_rss_kb\": %ld, "
               "\"weights_bytes\": %zu",
            kv->paged ? "true" : "false", block, kv_reserved_bytes(kv), kv_touched_bytes(kv),
            (size_t)kv->held * block, (size_t)kv->peak_held * block, peak_rss_kb(),
            model_weight_bytes(&s->model));
}
