/* matmul.h — weight matrices (f32 or q8) times the activations of one or more tokens.
 *
 * Decode is the one-token case (a mat-vec); prefill runs a chunk of tokens through the same
 * kernels, so every output element is computed the same way whatever the batch:
 *
 * - f32 and bf16 (widened to f32 exactly as loaded): out = x . w with 8 partial sums by index mod 8 (fused multiply-add), combined by
 *   lmc_reduce8, tail added last — the order of dot_f32 (ops.h), on AVX2, NEON and C alike.
 * - q8: activations are quantised per token in blocks of 32 (scale = max|x| / 127, round half
 *   away from zero, as quantize_q8); per block the integer products of 4 consecutive values
 *   are summed exactly (int32), lane j of 8 holding values 4j..4j+3, then
 *   acc_j = fma(w_scale * x_scale, (float)sum_j, acc_j); the 8 lanes are combined by
 *   lmc_reduce8. Integer sums are exact, so AVX2 (maddubs/madd), AVX-512 (vpdpbusd, two rows a
 *   register), NEON (sdot, smmla) and C agree.
 *
 * Rows are split over the pool in units of MAT_UNIT_ROWS rows of one matrix: each output
 * element is computed by exactly one thread with a fixed order, so the result is bit-identical
 * for any --threads. */
#ifndef LMC_MATMUL_H
#define LMC_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "threads.h"

#define MAT_UNIT_ROWS 16

/* how weight matrices are stored (--wq) */
enum { WQ_F32 = 0, WQ_Q8 = 1, WQ_BF16 = 2 };
const char *wq_name(int wq);

/* A weight matrix [rows x cols]: f32, bf16 or q8 (exactly one pointer is set). f32 and bf16
 * are row-major until mat_pack interleaves them (packed = 1). */
typedef struct {
    int rows, cols;
    float *f;    /* f32 weights, or NULL */
    uint16_t *h; /* bf16 weights (the upper half of an f32), or NULL */
    int packed;  /* f32/bf16: rows in packed quads (mat_pack) */
    int groups;  /* q8: blocks of 32 per row, ceil(cols / 32) */
    int8_t *q;   /* q8: rows x groups blocks of 32 (each row zero-padded to whole blocks), in
                  * quads: block g of rows 4i..4i+3 side by side, then block g + 1 (one
                  * sequential stream per tile, as mat_pack makes for f32); the rows % 4 last
                  * rows plain, row after row. Or NULL */
    uint16_t *d; /* q8: scales as IEEE binary16, [rows][groups] (a quad's scales are one short
                  * run already) */
} Mat;

/* q8 storage for a rows x cols matrix (zeroed); fill it row by row with mat_quantize_row */
void mat_alloc_q8(Mat *m, int rows, int cols, const char *what);
/* quantise one f32 row into row r (wherever its quad puts it): scale d = half(max|x| / 127),
 * q = round(x / d) */
void mat_quantize_row(Mat *m, int r, const float *row);
/* rows per packed quad (mat_pack), the rows of one kernel tile */
#define MAT_PACK_ROWS 4

/* Interleave an f32 or bf16 matrix in place, four rows at a time: each quad of rows becomes
 * 8 columns of row 0, 8 of row 1, 8 of row 2, 8 of row 3, then the next 8 columns, and so on,
 * the cols % 8 tail columns row by row at the quad's end; the rows % 4 last rows stay as they
 * are. bf16 goes 16 columns at a time instead while 16 remain, each row's 16 as 8 words
 * (column j in the high half, column j + 8 in the low half). A decode product then reads
 * each thread's rows as one sequential stream (four rows read side by side are four streams,
 * which the prefetchers follow less well: measured ~10-15 % slower on 2 threads). Products
 * give the same bits either way, and take every f32/bf16 matrix of four rows or more packed
 * (matmul checks). */
void mat_pack(Mat *m);
void mat_free(Mat *m);
/* bytes of weights one product reads (what decode streams from memory) */
size_t mat_bytes(const Mat *m);

/* Activations of up to `tokens` tokens as the weight products take them (scratch, allocated
 * once): quantised for q8 weights, and with --bf16-acts rounded to bfloat16 for bf16 ones. */
typedef struct {
    int8_t *q; /* [tokens][groups * 32] */
    float *d;  /* [tokens][groups] */
    int tokens, groups;
    /* --bf16-acts (NULL without it): each token's activations rounded to bf16 (round to
     * nearest even), kept as f32 ([tokens][cols]), and as bf16 pairs laid out as mat_pack lays
     * out a row's 16-column blocks ([tokens][cols / 2] words: column j high, j + 8 low), which
     * vdpbf16ps takes as they are. Every bf16 product then computes exactly what it computes
     * from f32 activations, with the rounded ones: vdpbf16ps adds a word's two products, each
     * exact, as two fused multiply-adds in that order (high half first). So --bf16-acts gives
     * the same bits at every level (v4-vnni's instruction flushes subnormal inputs and sums to
     * zero, which a rounded activation or a partial sum of a model's products does not reach) */
    float *bf;
    uint32_t *bf_pairs;
    int cols;
} QActs;

/* bf16_acts: also the --bf16-acts scratch */
void qacts_init(QActs *a, int tokens, int max_cols, int bf16_acts);
void qacts_free(QActs *a);
/* tokens x + t * x_stride, t < T, of `cols` values: in blocks of 32 (zero-padded), as
 * quantize_q8 */
void qacts_quantize(QActs *a, const float *x, int x_stride, int cols, int T);
/* those tokens rounded to bf16 into a->bf (stride a->cols) and, with `pairs` (for the panels
 * that read them, vdpbf16ps's), for each whole 16-column block as the words mat_pack makes of a
 * bf16 row's (a->bf_pairs, a->cols / 2 words a token) */
void qacts_round_bf16(QActs *a, const float *x, int x_stride, int cols, int T, int pairs);

/* One matrix of a fused product and where its output goes: out[t * out_stride + r]. */
typedef struct {
    const Mat *w;
    float *out;
    int out_stride;
} MatOut;

/* For each of the n matrices (all with the same cols): out = W x[t] for t < T, where token t's
 * input is x + t * x_stride. xq is the scratch for q8 (may be NULL when every matrix is f32).
 * One pool_run for all n matrices. */
void matmul(const MatOut *outs, int n, const float *x, int x_stride, int T, QActs *xq,
            ThreadPool *pool);

/* The SwiGLU MLP's first half in one pool job: gate->out = silu(W_gate x) * (W_up x), with
 * up->out as scratch; each thread applies silu to the rows it computed (same bits as matmul
 * of both, then swiglu). */
void matmul_swiglu(const MatOut *gate, const MatOut *up, const float *x, int x_stride, int T, QActs *xq,
                   ThreadPool *pool);

/* out[i] = dot_f32(x, rows + i * stride, n) for i < count, bit for bit, several rows at a
 * time (independent sums keep the FMA units busy; one dot alone waits on its own latency) */
void dot_rows_f32(const float *x, const float *rows, size_t stride, int count, int n, float *out);
/* the same for nx vectors x + t * xs at once (each row loaded once for all of them):
 * out[t * os + i] = dot_f32(x + t * xs, rows + i * stride, n), bit for bit */
void dot_rows_f32_x(const float *x, size_t xs, int nx, const float *rows, size_t stride, int count, int n,
                    float *out, size_t os);

/* y[i] = fma(a[r], row_r[i], y[i]) for r = 0 .. count-1 in order: each element exactly as
 * count axpy_f32 calls would compute it, but 64 elements of y (128 at x86-64-v4) stay in
 * registers across all the rows (a pass over the rows per 64 elements, so rows 4 KiB apart do
 * not thrash L1) */
void axpy_rows_f32(float *y, const float *a, const float *rows, size_t stride, int count, int n);

/* The same for ny vectors at once, each over its own first count[u] rows (each row loaded
 * once for up to 3 of them): y[u][i] exactly as axpy_rows_f32(y[u], a[u], rows, stride,
 * count[u], n) computes it */
void axpy_rows_f32_x(float *const *y, const float *const *a, const int *count, int ny, const float *rows,
                     size_t stride, int n);

/* IEEE binary16 <-> f32 (round to nearest even), as the q8 scales are stored */
uint16_t lmc_f32_to_f16(float f);
/* f32 -> bfloat16, round to nearest even (NaN stays NaN) */
uint16_t lmc_f32_to_bf16(float f);

#endif
