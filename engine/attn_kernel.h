/* attn_kernel.h — the attention kernels: one query head (or a GQA group of them) over the KV
 * cache, by the plain reference or by the block kernel every policy runs.
 *
 * score(pos) = q . k_pos / sqrt(head_dim); w = softmax over the attended positions (max
 * subtracted first); out = sum w * v_pos. Causality is the caller's: it passes n_pos, the
 * number of visible positions (query position + 1). */
#ifndef LMC_ATTN_KERNEL_H
#define LMC_ATTN_KERNEL_H

#include <stddef.h>

#include "kvcache.h"

/* The plain reference: scores for all n_pos positions, max, exp (libm's), sum, normalise,
 * weighted V, the sums pairwise (their float32 rounding grows with log n_pos). Slow and
 * obviously correct; the yardstick for the kernel below. probs (required, n_pos floats)
 * receives the attention probabilities. */
void attn_reference(const float *q, const KVCache *kv, int layer, int kvh, int n_pos, float *out,
                    float *probs);

/* The kernel: one pass over the selected blocks (ascending block ids) with an online softmax
 * that rescales the running sum once per block. Exact attention is this kernel over all
 * blocks, so sparse with every block selected is bit-identical to exact.
 * n_q (1..ATTN_MAX_GROUP) query heads that share KV head kvh and attend to the same blocks
 * run together, so each K and V row is read once for all of them; every head's arithmetic is
 * exactly what it would be alone. q, out: [n_q][head_dim]; scratch: n_q x block floats.
 * heads (may be NULL: every head attends every block): bit g of heads[i] says whether head
 * g attends block blocks[i]; a head's blocks are then the ascending sub-list it selected, read
 * together with the other heads' (heads of a GQA group that select different blocks share
 * the rows they have in common), with exactly its arithmetic when alone.
 * probs (may be NULL): head g's probabilities go to probs + g * probs_stride, at every
 * position it attends; other entries are left untouched. */
void attn_blocks(const float *q, int n_q, const KVCache *kv, int layer, int kvh, int n_pos,
                 const int *blocks, const unsigned char *heads, int n_blocks, float *out,
                 float *scratch, float *probs, size_t probs_stride);

/* Exact causal attention for a tile of T consecutive prefill queries (issue 29): the queries
 * at positions pos0 .. pos0 + T - 1, each of n_q query heads over KV head kvh, every query
 * over all the positions up to its own. Each query's output has exactly the bits attn_blocks
 * gives it alone over every block (same dot products, the same online softmax block by block,
 * the same value sums in position order); what the tile shares is the reading: a block's keys
 * are scored for all the tile's queries in one pass (dot_rows_f32_x over T x n_q vectors, 4
 * rows x 3 vectors a tile, instead of 4 x n_q per query), and its values stay in L1 while
 * every query sums them. q8 KV: a block's rows are widened to floats once for all the tile's
 * vectors, with the bits of attn_blocks' q8 dot products and sums (q8_scratch: at least
 * ATTN_TILE_Q8_FLOATS floats; NULL with f32 KV). q: query t, head g at q + t * q_stride + g * head_dim;
 * out likewise. Scratch (ATTN_TILE_QUERIES x n_q each): qbuf x head_dim, scores x block, m, l. */
#define ATTN_TILE_QUERIES 64
#define ATTN_TILE_Q8_FLOATS(block, head_dim, n_q) \
    ((size_t)(block) * (size_t)(head_dim) + (size_t)ATTN_TILE_QUERIES * (size_t)(n_q) * (size_t)(block))
/* Sparse prefill (--prefill-attn sparse): the blocks the whole tile attends, shared by its
 * queries, each query still over the positions up to its own. blocks: n ascending block ids;
 * importance (may be NULL): each query's attention probabilities are added to importance[p]
 * (queries in order, heads in order), for which the scores are kept, block i's at i * block of
 * the vector's score row (score_stride floats, >= n * block) and weights (block floats per
 * vector) holds the value weights. */
typedef struct {
    const int *blocks;
    int n;
    size_t score_stride;
    float *weights;
    float *importance;
    /* importance without keeping the scores (exact prefill over every block, too many to
     * keep): after the pass each block's scores are computed again (the same dot products,
     * the same bits) for the probabilities; score_stride is then one block */
    int recompute;
} TileBlocks;
/* sel: NULL attends every block up to the tile's last query (exact; scores: block floats per
 * vector) */
void attn_causal_tile(const float *q, int n_q, int T, size_t q_stride, const KVCache *kv, int layer,
                      int kvh, int pos0, float *out, size_t out_stride, float *qbuf, float *scores,
                      float *m, float *l, const TileBlocks *sel, float *q8_scratch);

#endif
