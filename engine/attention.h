/* attention.h — attention of one query head over the KV cache.
 *
 * score(pos) = q . k_pos / sqrt(head_dim); w = softmax over the attended positions (max
 * subtracted first); out = sum w * v_pos. Causality is the caller's: it passes n_pos, the
 * number of visible positions (query position + 1). */
#ifndef LMC_ATTENTION_H
#define LMC_ATTENTION_H

#include "kvcache.h"

/* The plain reference: scores for all n_pos positions, max, exp, sum, normalise, weighted V.
 * Slow and obviously correct; the yardstick for the kernel below. probs (required, n_pos
 * floats) receives the attention probabilities. */
void attn_reference(const float *q, const KVCache *kv, int layer, int kvh, int n_pos, float *out,
                    float *probs);

/* The kernel: one pass over the selected blocks (ascending block ids) with an online softmax
 * that rescales the running sum once per block. Exact attention is this kernel over all
 * blocks, so sparse with every block selected is bit-identical to exact.
 * scratch: >= block floats. probs (may be NULL): receives the probability of every attended
 * position; other entries are left untouched. */
void attn_blocks(const float *q, const KVCache *kv, int layer, int kvh, int n_pos,
                 const int *blocks, int n_blocks, float *out, float *scratch, float *probs);

#endif
