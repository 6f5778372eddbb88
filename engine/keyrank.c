/* keyrank.c — see keyrank.h */
#include "keyrank.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define TOP 32

void keyrank_init(KeyRank *r, int capacity, int n_layers, int every, int keep_pct, int direct) {
    memset(r, 0, sizeof *r);
    r->every = every;
    r->keep_pct = keep_pct;
    r->direct = direct;
    r->n_layers = n_layers;
    size_t C = (size_t)capacity;
    r->score = lmc_alloc(C, sizeof(float), "key ranking");
    r->mass = lmc_alloc(C, sizeof(float), "key ranking");
    r->order = lmc_alloc(C, sizeof(int), "key ranking");
    r->rank_s = lmc_alloc(C, sizeof(double), "key ranking");
    r->rank_m = lmc_alloc(C, sizeof(double), "key ranking");
    r->sum = lmc_alloc((size_t)n_layers * KR_METRICS, sizeof(double), "key ranking");
    r->queries = lmc_alloc((size_t)n_layers, sizeof(long), "key ranking");
    r->cand_queries = lmc_alloc((size_t)n_layers, sizeof(long), "key ranking");
    r->direct_queries = lmc_alloc((size_t)n_layers, sizeof(long), "key ranking");
}

void keyrank_free(KeyRank *r) {
    void *bufs[] = {r->score, r->mass, r->order, r->rank_s, r->rank_m, r->sum, r->queries,
                    r->cand_queries, r->direct_queries};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmc_free(bufs[i]);
    memset(r, 0, sizeof *r);
}

int keyrank_due(const KeyRank *r, int pos) { return r->every > 0 && (pos + 1) % r->every == 0; }

/* qsort has no context argument; the measurement runs on the calling thread only */
static const float *sort_values;

/* descending by value, ties to the lower index first: the order a stable sort of -value gives */
static int by_value_desc(const void *x, const void *y) {
    int i = *(const int *)x, j = *(const int *)y;
    float a = sort_values[i], b = sort_values[j];
    if (a != b) return a > b ? -1 : 1;
    return (i > j) - (i < j);
}

static void order_desc(const float *values, int *order, int n) {
    for (int i = 0; i < n; i++) order[i] = i;
    sort_values = values;
    qsort(order, (size_t)n, sizeof *order, by_value_desc);
}

/* rank[i] of values[i] (1 = the smallest), ties sharing their mean rank; 0 if all are equal */
static int mean_ranks(const float *values, int *order, double *rank, int n) {
    order_desc(values, order, n);
    if (values[order[0]] == values[order[n - 1]]) return 0;
    for (int a = 0; a < n;) {
        int b = a;
        while (b + 1 < n && values[order[b + 1]] == values[order[a]]) b++;
        /* descending positions a..b hold ranks n-b .. n-a */
        double mean = n - (a + b) / 2.0;
        for (int i = a; i <= b; i++) rank[order[i]] = mean;
        a = b + 1;
    }
    return 1;
}

static double pearson(const double *x, const double *y, int n) {
    double mx = 0, my = 0;
    for (int i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= n;
    my /= n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
        syy += (y[i] - my) * (y[i] - my);
    }
    return sxy / sqrt(sxx * syy);
}

static int by_double_desc(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a < b) - (a > b);
}

/* the two-stage figures (keyrank.h) of the last 128 keys, added to sum; uses the scratch */
static void add_candidates(KeyRank *r, double *sum, int n) {
    static const int cands[] = {32, 48, 64, 96};
    const float *s = r->score + (n - KR_UNIVERSE), *m = r->mass + (n - KR_UNIVERSE);
    double total = 0.0;
    for (int j = 0; j < KR_UNIVERSE; j++) total += m[j];
    order_desc(m, r->order, KR_UNIVERSE);
    for (int j = 0; j < KR_UNIVERSE; j++) r->rank_m[j] = 0.0;
    for (int i = 0; i < TOP; i++) r->rank_m[r->order[i]] = 1.0;
    order_desc(s, r->order, KR_UNIVERSE);
    double hits = 0.0;
    for (int c = 0, i = 0; c < (int)(sizeof cands / sizeof cands[0]); c++) {
        for (; i < cands[c]; i++) hits += r->rank_m[r->order[i]];
        sum[KR_C32 + c] += hits / TOP;
    }
    enum { KEPT_C = 96 }; /* the candidate count of kept32_c96 */
    for (int i = 0; i < KEPT_C; i++) r->rank_s[i] = m[r->order[i]];
    qsort(r->rank_s, KEPT_C, sizeof *r->rank_s, by_double_desc);
    double kept = 0.0;
    for (int i = 0; i < TOP; i++) kept += r->rank_s[i];
    sum[KR_KEPT96] += total > 0 ? kept / total : 0.0;
}

void keyrank_add(KeyRank *r, int layer, int n) {
    if (n < 2 * TOP) return;
    double total = 0.0;
    for (int j = 0; j < n; j++) total += r->mass[j];
    /* the true top 32, marked in rank_m before it holds ranks */
    order_desc(r->mass, r->order, n);
    for (int j = 0; j < n; j++) r->rank_m[j] = 0.0;
    for (int i = 0; i < TOP; i++) r->rank_m[r->order[i]] = 1.0;
    order_desc(r->score, r->order, n);
    double hits = 0.0, captured = 0.0, lost = 0.0;
    for (int i = 0; i < TOP; i++) {
        hits += r->rank_m[r->order[i]];
        captured += r->mass[r->order[i]];
    }
    for (int i = n - n / 2; i < n; i++) lost += r->mass[r->order[i]];
    /* evicted: n * (100 - P) / 100 rounded down, so that P = 50 evicts what lost50 evicts */
    double lost_keep = 0.0;
    for (int i = n - (int)((long)n * (100 - r->keep_pct) / 100); i < n; i++)
        lost_keep += r->mass[r->order[i]];
    int direct = r->direct && n >= 2 * r->direct;
    double direct_hits = 0.0;
    for (int i = 0; direct && i < r->direct; i++) direct_hits += r->rank_m[r->order[i]];
    int varied = mean_ranks(r->score, r->order, r->rank_s, n);
    varied = mean_ranks(r->mass, r->order, r->rank_m, n) && varied;
    double *sum = r->sum + (size_t)layer * KR_METRICS;
    sum[KR_RHO] += varied ? pearson(r->rank_s, r->rank_m, n) : 0.0;
    sum[KR_RECALL32] += hits / TOP;
    sum[KR_CAPTURED32] += total > 0 ? captured / total : 0.0;
    sum[KR_LOST50] += total > 0 ? lost / total : 0.0;
    sum[KR_LOST_KEEP] += total > 0 ? lost_keep / total : 0.0;
    r->queries[layer]++;
    if (direct) {
        sum[KR_DIRECT] += direct_hits / TOP;
        r->direct_queries[layer]++;
    }
    if (n >= KR_UNIVERSE) {
        add_candidates(r, sum, n);
        r->cand_queries[layer]++;
    }
}

/* the means of sum, each over its own query count */
static void write_means(FILE *f, const double *sum, long queries, long cand_queries,
                        long direct_queries) {
    static const char *names[KR_METRICS] = {"rho", "recall32", "captured32", "lost50", "lost_keep",
                                            "recall32_c32", "recall32_c48", "recall32_c64",
                                            "recall32_c96", "kept32_c96", "recall32_direct"};
    fprintf(f, "\"queries\": %ld, \"cand_queries\": %ld, \"direct_queries\": %ld", queries,
            cand_queries, direct_queries);
    for (int m = 0; m < KR_METRICS; m++) {
        long count = m < KR_RANK_METRICS ? queries : m == KR_DIRECT ? direct_queries : cand_queries;
        if (count) fprintf(f, ", \"%s\": %.9g", names[m], sum[m] / (double)count);
        else fprintf(f, ", \"%s\": null", names[m]);
    }
}

void keyrank_write_json(FILE *f, const KeyRank *r) {
    double all[KR_METRICS] = {0};
    long queries = 0, cand_queries = 0, direct_queries = 0;
    for (int l = 0; l < r->n_layers; l++) {
        for (int m = 0; m < KR_METRICS; m++) all[m] += r->sum[(size_t)l * KR_METRICS + m];
        queries += r->queries[l];
        cand_queries += r->cand_queries[l];
        direct_queries += r->direct_queries[l];
    }
    fprintf(f, "\"key_ranking\": {\"every\": %d, \"keep\": %d, \"direct\": %d, ", r->every, r->keep_pct,
            r->direct);
    write_means(f, all, queries, cand_queries, direct_queries);
    fprintf(f, ", \"layers\": [");
    for (int l = 0; l < r->n_layers; l++) {
        fprintf(f, "%s{", l ? ", " : "");
        write_means(f, r->sum + (size_t)l * KR_METRICS, r->queries[l],
                    r->cand_queries[l], r->direct_queries[l]);
        fputc('}', f);
    }
    fprintf(f, "]}");
}
