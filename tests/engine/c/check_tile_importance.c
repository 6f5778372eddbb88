/* check_tile_importance.c — the prefill tile's attention probabilities (attn_causal_tile's
 * importance, which sparse decode reserves blocks by) two ways and against the plain
 * reference: a tile of queries over every block of a random f32 cache,
 * - with the scores kept (what --prefill-attn sparse does) and recomputed after the pass
 *   (sparse's exact prefill): outputs and importance the same bits;
 * - against attn_reference per query and head (libm's exp, pairwise sums): each position's
 *   importance within 1e-5 relative, the outputs within 1e-5 absolute.
 * Tiles at positions 0 (the diagonal only) and 100 (whole blocks before it), a partial block
 * at the end. Exit 0 and one summary line; 1 and the first mismatch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_kernel.h"
#include "util.h"
#include "check_random.h"

#define D 64
#define BS 8
#define NQ 2 /* query heads over the KV head */
#define T 37 /* queries of the tile */
#define CAP 256

static int fail(const char *what, int p, double a, double b) {
    printf("mismatch: %s at %d: %.9g against %.9g\n", what, p, a, b);
    return 1;
}

int main(void) {
    KVLayout layout = {0};
    KVCache kv;
    kv_init(&kv, 1, 1, D, CAP, BS, 0, &layout);
    unsigned seed = 3;
    float k[D], v[D];
    for (int p = 0; p < CAP; p++) {
        for (int d = 0; d < D; d++) k[d] = 2.0f * uniform(&seed), v[d] = uniform(&seed);
        kv_write(&kv, 0, p, k, v);
    }
    static float q[T * NQ * D], qbuf[T * NQ * D], out[2][T * NQ * D], m[T * NQ], l[T * NQ];
    static float scores_kept[T * NQ * CAP], scores[T * NQ * BS], weights[T * NQ * BS], imp[2][CAP];
    static float ref_out[D], probs[CAP], want[CAP];
    int blocks[CAP / BS];
    for (int i = 0; i < T * NQ * D; i++) q[i] = uniform(&seed);
    int checked = 0;
    for (int pos0 = 0; pos0 <= 100; pos0 += 100) {
        int n = (pos0 + T - 1) / BS + 1;
        for (int b = 0; b < n; b++) blocks[b] = b;
        memset(imp, 0, sizeof imp);
        TileBlocks kept = {blocks, n, (size_t)n * BS, weights, imp[0], 0};
        TileBlocks again = {blocks, n, BS, NULL, imp[1], 1};
        attn_causal_tile(q, NQ, T, NQ * D, &kv, 0, 0, pos0, out[0], NQ * D, qbuf, scores_kept, m, l, &kept, NULL);
        attn_causal_tile(q, NQ, T, NQ * D, &kv, 0, 0, pos0, out[1], NQ * D, qbuf, scores, m, l, &again, NULL);
        if (memcmp(out[0], out[1], sizeof out[0]) != 0) return fail("outputs, kept against again", pos0, 0, 0);
        if (memcmp(imp[0], imp[1], sizeof imp[0]) != 0) return fail("importance, kept against again", pos0, 0, 0);
        memset(want, 0, sizeof want);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < NQ; g++) {
                attn_reference(q + (t * NQ + g) * D, &kv, 0, 0, pos0 + t + 1, ref_out, probs);
                for (int p = 0; p <= pos0 + t; p++) want[p] += probs[p];
                for (int d = 0; d < D; d++)
                    if (fabsf(ref_out[d] - out[0][(t * NQ + g) * D + d]) > 1e-5f)
                        return fail("output against the reference", t, out[0][(t * NQ + g) * D + d], ref_out[d]);
            }
        for (int p = 0; p < pos0 + T; p++, checked++)
            if (fabsf(imp[0][p] - want[p]) > 1e-5f * want[p]) return fail("importance against the reference", p, imp[0][p], want[p]);
    }
    kv_free(&kv);
    printf("%d positions: importance kept = recomputed, bit for bit, and within 1e-5 of the reference\n", checked);
    return 0;
}
