/* matmul_rate.c — how fast lmc's weight products run by themselves: the calls one layer of a
 * prefill chunk makes (q, k and v as one job, o, gate and up with SwiGLU, down; matmul.c, the
 * engine's own code, built with it), on a Qwen3-shaped layer of random weights, with nothing
 * else between them (no norms, RoPE, attention or KV writes). Set beside a whole prefill's
 * rate (bench/prefill.py) it says how much of the prefill's distance from the FMA peak is the
 * weight products' own, and, run over one layer's weights again and again ("cached") against
 * as many layers as the model has ("streamed", the weights read from memory once per chunk as
 * the prefill reads them), how much of it is the memory's.
 *
 * usage: matmul_rate [--wq f32|bf16|q8] [--hidden H] [--heads N] [--kv-heads N] [--head-dim D]
 *                    [--intermediate I] [--layers L] [--cached] [--tokens T] [--threads N]
 *                    [--passes P] [--bf16-acts]
 *   defaults: Qwen3-0.6B's layer (1024, 16, 8, 128, 3072), 28 layers, LMC_PREFILL_CHUNK
 *   tokens (the chunk lmc's prefill takes through the layers), 1 thread, 3 passes. --cached
 *   runs layer 0 L times instead of L layers; --bf16-acts: bf16 weights take activations
 *   rounded to bf16, as lmc's option of that name does.
 * output: one JSON document on stdout: the shape, the operations a pass (2 per multiply-add),
 * the weights' bytes, and each pass's GFLOP per CPU second (and per wall second), with the
 * best; errors: exit code 2 and one line on stderr. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/matmul.h"
#include "../../engine/model.h"
#include "../../engine/threads.h"
#include "../../engine/util.h"

#define MAX_PASSES 100

typedef struct {
    Mat q, k, v, o, gate, up, down;
} LayerMats;

static void usage_error(const char *msg, const char *arg) {
    fprintf(stderr, "matmul_rate: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    exit(2);
}

static int int_arg(int argc, char **argv, int *i, int lo, int hi) {
    if (*i + 1 >= argc) usage_error("missing value after", argv[*i]);
    char *end;
    long v = strtol(argv[++*i], &end, 10);
    if (*end || v < lo || v > hi) usage_error("bad value", argv[*i]);
    return (int)v;
}

/* rows x cols of uniform values in [-1/cols, 1/cols), stored as --wq asks (bf16 rounded as
 * lmc's loader rounds, q8 quantised by mat_quantize_row) and packed as the loader packs them */
static Mat random_mat(int rows, int cols, int wq, uint64_t *seed) {
    float *row = lmc_alloc((size_t)cols, sizeof(float), "matmul_rate row");
    Mat m = {.rows = rows, .cols = cols};
    size_t n = (size_t)rows * (size_t)cols;
    if (wq == WQ_Q8) mat_alloc_q8(&m, rows, cols, "matmul_rate q8 weights");
    else if (wq == WQ_BF16) m.h = lmc_alloc(n, sizeof(uint16_t), "matmul_rate bf16 weights");
    else m.f = lmc_alloc(n, sizeof(float), "matmul_rate f32 weights");
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) row[c] = lmc_rand_uniform(seed) / (float)cols;
        size_t at = (size_t)r * (size_t)cols;
        if (wq == WQ_Q8) mat_quantize_row(&m, r, row);
        else if (wq == WQ_BF16)
            for (int c = 0; c < cols; c++) m.h[at + (size_t)c] = lmc_f32_to_bf16(row[c]);
        else memcpy(m.f + at, row, (size_t)cols * sizeof(float));
    }
    if (wq != WQ_Q8) mat_pack(&m);
    lmc_free(row);
    return m;
}

int main(int argc, char **argv) {
    int wq = WQ_F32, H = 1024, heads = 16, kv_heads = 8, head_dim = 128, I = 3072, layers = 28;
    int cached = 0, T = LMC_PREFILL_CHUNK, threads = 1, passes = 3, bf16_acts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--wq")) {
            if (i + 1 >= argc) usage_error("missing value after", a);
            const char *v = argv[++i];
            if (!strcmp(v, "f32")) wq = WQ_F32;
            else if (!strcmp(v, "bf16")) wq = WQ_BF16;
            else if (!strcmp(v, "q8")) wq = WQ_Q8;
            else usage_error("--wq takes f32, bf16 or q8, not", v);
        } else if (!strcmp(a, "--hidden")) H = int_arg(argc, argv, &i, 8, 1 << 16);
        else if (!strcmp(a, "--heads")) heads = int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--kv-heads")) kv_heads = int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--head-dim")) head_dim = int_arg(argc, argv, &i, 8, 1024);
        else if (!strcmp(a, "--intermediate")) I = int_arg(argc, argv, &i, 8, 1 << 18);
        else if (!strcmp(a, "--layers")) layers = int_arg(argc, argv, &i, 1, 1024);
        else if (!strcmp(a, "--cached")) cached = 1;
        else if (!strcmp(a, "--bf16-acts")) bf16_acts = 1;
        else if (!strcmp(a, "--tokens")) T = int_arg(argc, argv, &i, 1, 4096);
        else if (!strcmp(a, "--threads")) threads = int_arg(argc, argv, &i, 1, 256);
        else if (!strcmp(a, "--passes")) passes = int_arg(argc, argv, &i, 1, MAX_PASSES);
        else usage_error("unknown option", a);
    }
    const int Q = heads * head_dim, KV = kv_heads * head_dim, stored = cached ? 1 : layers;
    const int widest = Q > I ? Q : I;

    /* ---- the weights, and one chunk's activations */
    uint64_t seed = 0x6d61746d756c7261ull;
    LayerMats *L = lmc_alloc((size_t)stored, sizeof *L, "matmul_rate layers");
    for (int l = 0; l < stored; l++) {
        L[l].q = random_mat(Q, H, wq, &seed);
        L[l].k = random_mat(KV, H, wq, &seed);
        L[l].v = random_mat(KV, H, wq, &seed);
        L[l].o = random_mat(H, Q, wq, &seed);
        L[l].gate = random_mat(I, H, wq, &seed);
        L[l].up = random_mat(I, H, wq, &seed);
        L[l].down = random_mat(H, I, wq, &seed);
    }
    float *x = lmc_alloc((size_t)T * (size_t)widest, sizeof(float), "matmul_rate activations");
    float *out = lmc_alloc((size_t)T * (size_t)widest, sizeof(float), "matmul_rate outputs");
    float *out2 = lmc_alloc((size_t)T * (size_t)I, sizeof(float), "matmul_rate outputs");
    float *out3 = lmc_alloc((size_t)T * (size_t)KV, sizeof(float), "matmul_rate outputs");
    float *out4 = lmc_alloc((size_t)T * (size_t)KV, sizeof(float), "matmul_rate outputs");
    for (size_t i = 0; i < (size_t)T * (size_t)widest; i++) x[i] = lmc_rand_uniform(&seed);
    QActs xq;
    qacts_init(&xq, T, widest, bf16_acts);
    ThreadPool *pool = pool_create(threads);

    /* ---- passes: every layer's products for one chunk of T tokens */
    size_t macs = (size_t)layers * (size_t)T *
                  ((size_t)(Q + 2 * KV) * H + (size_t)H * Q + 2 * (size_t)I * H + (size_t)H * I);
    size_t bytes = 0;
    const Mat *all[7] = {&L[0].q, &L[0].k, &L[0].v, &L[0].o, &L[0].gate, &L[0].up, &L[0].down};
    for (int m = 0; m < 7; m++) bytes += mat_bytes(all[m]);
    bytes *= (size_t)stored;
    double ops = 2.0 * (double)macs, rate[MAX_PASSES], wall_rate[MAX_PASSES], best = 0.0, checksum = 0.0;
    for (int p = 0; p < passes; p++) {
        double cpu0 = lmc_cpu_ms(), wall0 = lmc_now_ms();
        checksum = 0.0;
        for (int l = 0; l < layers; l++) {
            const LayerMats *w = &L[cached ? 0 : l];
            MatOut qkv[3] = {{&w->q, out, Q}, {&w->k, out3, KV}, {&w->v, out4, KV}};
            matmul(qkv, 3, x, H, T, &xq, pool);
            MatOut o = {&w->o, out, H};
            matmul(&o, 1, x, Q, T, &xq, pool);
            MatOut gate = {&w->gate, out, I}, up = {&w->up, out2, I};
            matmul_swiglu(&gate, &up, x, H, T, &xq, pool);
            MatOut down = {&w->down, out, H};
            matmul(&down, 1, x, I, T, &xq, pool);
            checksum += out[0];
        }
        rate[p] = ops / ((lmc_cpu_ms() - cpu0) / 1e3) / 1e9;
        wall_rate[p] = ops / ((lmc_now_ms() - wall0) / 1e3) / 1e9;
        if (rate[p] > best) best = rate[p];
    }

    /* ---- the document, printed whole once every pass is done */
    printf("{\"wq\": \"%s\", \"hidden\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, "
           "\"intermediate\": %d, \"layers\": %d, \"cached\": %s, \"bf16_acts\": %s, ",
           wq_name(wq), H, heads, kv_heads, head_dim, I, layers, cached ? "true" : "false",
           bf16_acts ? "true" : "false");
    printf("\"tokens\": %d, \"threads\": %d, \"operations\": %zu, \"weight_bytes\": %zu, \"passes\": [",
           T, threads, 2 * macs, bytes);
    for (int p = 0; p < passes; p++)
        printf("%s{\"gflops_per_cpu_s\": %.2f, \"gflops_per_s\": %.2f}", p ? ", " : "", rate[p], wall_rate[p]);
    /* the checksum (each layer's first down-projection output, summed, in the last pass)
     * keeps the products from being optimised away and tells the layers read apart */
    printf("], \"best_gflops_per_cpu_s\": %.2f, \"checksum\": %.6g}\n", best, checksum);
    pool_destroy(pool);
    return 0;
}
