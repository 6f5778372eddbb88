/* cmd_attn_bench.c — `lmc attn-bench`: one decode step of attention (all heads, one layer) over
 * a KV cache of --ctx positions, timed on its own.
 *
 * One layer attended pass after pass keeps whatever of its KV fits in the last-level cache
 * there: a selection that reads less than the cache holds then runs from it, which a decode
 * step (every layer in turn) never does. --layers N holds N copies of the layer and attends
 * them in turn each pass, so the data comes from memory as in decode; times are per layer.
 *
 * Inputs are seeded synthetic data (uniform in [-1, 1) for q, k, v; [0, 1) for the
 * per-position importance that the sparse rule reserves blocks by and that H2O uses as its
 * accumulated mass), or an exact file (--inputs) so tests can check the engine against a
 * Python reference. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "attend_layer.h"
#include "cli.h"
#include "util.h"

static void load_inputs(const char *path, float *buf, size_t count) {
    char *data;
    size_t len;
    if (lmc_read_file(path, &data, &len) != 0) lmc_die_input("%s", lmc_last_error());
    if (len != count * sizeof(float))
        lmc_die_input("--inputs %s has %zu bytes; q, k, v and importance need %zu (f32 little-endian)",
                      path, len, count * sizeof(float));
    memcpy(buf, data, len);
    free(data);
}

/* page faults so far: the timed passes should take none (every buffer is touched before) */
static long minor_faults(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? ru.ru_minflt : 0;
}

/* --stages: each stage's milliseconds per pass (summed over heads and threads, averaged over
 * the timed passes), the mean pass, what the stages leave out of it, and the timed passes'
 * page faults */
static void write_stages(const Attention *a, int runs, int layers, const double *ms, long faults) {
    double mean = 0.0, staged = 0.0;
    for (int i = 0; i < runs; i++) mean += ms[i] / runs;
    runs *= layers; /* the stage clocks ran for every layer of every pass */
    printf(", \"stages\": {\"ms\": {");
    for (int st = 0; st < N_STAGES; st++) {
        double sum = 0.0;
        for (int h = 0; h < a->n_heads; h++) sum += a->stages.ms[(size_t)h * N_STAGES + st];
        staged += sum / runs;
        printf("%s\"%s\": %.5f", st ? ", " : "", STAGE_NAMES[st], sum / runs);
    }
    printf("}, \"mean_ms\": %.5f, \"other_ms\": %.5f, \"minor_faults\": %ld}", mean, mean - staged, faults);
}

int cmd_attn_bench(const Options *o) {
    if (!o->ctx || !o->heads || !o->kv_heads || !o->head_dim)
        lmc_die_input("attn-bench needs --ctx, --heads, --kv-heads and --head-dim");
    if (o->heads % o->kv_heads != 0)
        lmc_die_input("--heads %d is not a multiple of --kv-heads %d", o->heads, o->kv_heads);
    cli_check_options(o);
    int ctx = o->ctx, H = o->heads, G = o->kv_heads, D = o->head_dim, L = o->layers;
    size_t nq = (size_t)H * D, nkv = (size_t)ctx * G * D;
    size_t total = nq + 2 * nkv + (size_t)ctx;
    float *buf = lmc_alloc(total, sizeof(float), "attn-bench inputs");
    float *q = buf, *k = q + nq, *v = k + nkv, *importance = v + nkv;
    if (o->inputs) {
        load_inputs(o->inputs, buf, total);
    } else {
        uint64_t state = o->seed;
        for (size_t i = 0; i < nq + 2 * nkv; i++) buf[i] = lmc_rand_uniform(&state);
        for (int p = 0; p < ctx; p++) importance[p] = 0.5f * (lmc_rand_uniform(&state) + 1.0f);
    }

    AttnOptions opt = cli_attn_options(o);
    FILE *trace = opt.trace;
    opt.trace = NULL;
    int measure = opt.measure;
    opt.measure = 0;
    ThreadPool *pool = pool_create(o->threads);
    KVCache kv;
    KVLayout layout = kv_layout_for(&opt.sel);
    kv_init(&kv, L, G, D, ctx, o->block, o->kv_q8, &layout);
    for (int l = 0; l < L; l++) /* the same data in every layer, each its own memory */
        for (int p = 0; p < ctx; p++) kv_write(&kv, l, p, k + (size_t)p * G * D, v + (size_t)p * G * D);
    Attention a;
    attention_init(&a, &opt, &kv, H, pool);
    for (int l = 0; l < L; l++) {
        if (a.state.importance)
            memcpy(a.state.importance + (size_t)l * ctx, importance, sizeof(float) * (size_t)ctx);
        if (a.state.mass)
            for (int h = 0; h < H; h++)
                memcpy(a.state.mass + ((size_t)l * H + h) * ctx, importance, sizeof(float) * (size_t)ctx);
    }
    float *out = lmc_alloc(nq, sizeof(float), "attention output");

    /* untimed passes first: the trace and the diagnostics */
    SelStats sel;
    memset(&sel, 0, sizeof sel);
    a.opt.trace = trace;
    a.opt.measure = measure;
    attend_layer(&a, 0, ctx - 1, q, out, ATTN_BENCH, &sel);
    a.opt.trace = NULL;
    a.opt.measure = 0;
    if (trace) fclose(trace);

    for (int i = 0; i < o->warmup; i++)
        for (int l = 0; l < L; l++) attend_layer(&a, l, ctx - 1, q, out, ATTN_BENCH, NULL);
    double *runs = lmc_alloc((size_t)o->runs, sizeof(double), "timings");
    if (o->stages) a.stages.ms = lmc_alloc((size_t)H * N_STAGES, sizeof(double), "stage timings");
    long faults = minor_faults();
    for (int i = 0; i < o->runs; i++) {
        double t0 = lmc_now_ms();
        for (int l = 0; l < L; l++) attend_layer(&a, l, ctx - 1, q, out, ATTN_BENCH, NULL);
        runs[i] = (lmc_now_ms() - t0) / L;
    }
    faults = minor_faults() - faults;
    if (o->dump_out) {
        FILE *f = fopen(o->dump_out, "wb");
        if (!f) lmc_die_input("cannot write --dump-out file %s: %s", o->dump_out, strerror(errno));
        if (fwrite(out, sizeof(float), nq, f) != nq) lmc_die_runtime("cannot write %s", o->dump_out);
        fclose(f);
    }

    printf("{\"schema\": \"%s\", \"command\": \"attn-bench\", \"config\": {", LMC_SCHEMA);
    cli_write_attn_config(stdout, o);
    printf("}, \"ctx\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"policy\": \"%s\", "
           "\"layers\": %d, \"ms\": %.5f, \"runs\": [", ctx, H, G, D, policy_name(o->policy), L,
           lmc_median(runs, o->runs));
    for (int i = 0; i < o->runs; i++) printf("%s%.5f", i ? ", " : "", runs[i]);
    printf("], \"selection\": ");
    cli_write_selection(stdout, &sel, 1, measure); /* one step */
    if (o->stages) write_stages(&a, o->runs, L, runs, faults);
    printf("}\n");

    lmc_free(a.stages.ms);
    lmc_free(runs);
    lmc_free(out);
    attention_free(&a);
    kv_free(&kv);
    pool_destroy(pool);
    lmc_free(buf);
    return 0;
}
