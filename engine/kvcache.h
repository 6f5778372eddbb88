/* kvcache.h — the KV cache, head-major, f32 or q8, plus per-block key summaries.
 *
 * Layout (head-major: the positions of one layer's KV head are contiguous, so attention over
 * a head reads one sequential stream; the seed's token-major k_cache + t * kv_dim + h * head_dim
 * put a head's rows kv_dim floats apart, which read at half the bandwidth):
 *   row(layer, pos, kvh) = (layer * n_kv + kvh) * capacity + pos
 *   f32: k[row * head_dim + i]        (same for v)
 *   q8:  kq[row * head_dim + i] int8 values, and one float scale per group of 32 values:
 *        ks[row * q8_groups(head_dim) + g]; value = kq * ks (same for v).
 * Summaries, per layer, block of `block` positions and KV head (only built when asked for):
 *   kmin/kmax [layer][block][kvh][head_dim]: element-wise min/max of the block's keys (quest);
 *   ksum      [layer][block][kvh][head_dim]: element-wise sum of the block's keys, in position
 *             order (the --probe-summary centroid is ksum / positions in block).
 * Probe keys (f32 only, sparse with sampled probes): a copy of the keys a full block's probes
 * read, the rows at offsets 0, step, 2*step, ... (step = block / probes), contiguous per head:
 *   pk [layer][kvh][block][probe_rows][head_dim]
 * so probing one head's blocks is one sequential stream (the keys themselves are step rows
 * apart, each row its own miss). Costs probe_rows / block of the key cache (1/4 by default).
 * Summaries are computed from the keys as stored (dequantised for q8), updated on each write.
 *
 * Paging (--kv-budget, issue 29): the rows of one (layer, KV head) are `block`-row slots, and
 * logical block b of that head lives in slot slot[(layer * n_kv + kvh) * n_blocks + b]. Without
 * paging slot b holds block b (the layout above, unchanged). With it a block gets a slot when
 * its first row is written: the last slot the head released (a stack per head), else the
 * head's next unused one; kv_release_block gives a block's slot back when eviction dropped it
 * for every query head of the KV head (the union of the group's choices stays). A head that
 * keeps N positions so touches at most about N / block + 1 slots: the memory the cache makes
 * resident follows the budget, not the context. A released block reads as the dead block (NaN
 * everywhere), so any read of evicted rows shows in the output. All arrays are reserved, not
 * written (mmap, zero pages): only touched pages become resident, with or without paging. */
#ifndef LMC_KVCACHE_H
#define LMC_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

/* query heads of one KV head that attention and sparse probing handle in one pass over its
 * rows (larger GQA groups go in several passes) */
#define ATTN_MAX_GROUP 8

/* the largest head_dim accepted (stack buffers are sized by it) */
#define LMC_MAX_HEAD_DIM 1024

typedef struct {
    int n_layers, n_kv, head_dim, capacity, block;
    int q8;
    int kv_dim;    /* n_kv * head_dim */
    int n_blocks;  /* blocks that fit in capacity */
    float *k, *v;
    int8_t *kq, *vq;
    float *ks, *vs;
    float *kmin, *kmax; /* NULL unless minmax summaries are kept */
    float *ksum;        /* NULL unless sum summaries are kept */
    float *pk;          /* NULL unless probe keys are kept */
    int pk_step, pk_rows; /* probe keys: rows apart in a block, rows per block */
    /* paging (above); slot, free_slots, n_free are NULL/unused when !paged */
    int paged;
    int *slot;          /* [layer][kvh][n_blocks]: the slot of each block, -1: none */
    int *free_slots;    /* [layer][kvh][n_blocks]: each head's stack of released slots */
    int *n_free;        /* [layer][kvh] */
    int *n_used;        /* [layer][kvh]: slots the head has touched (paged or not) */
    size_t dead_row;    /* the first row of the dead block */
    long held, peak_held; /* blocks holding KV now, and at most */
    size_t reserved[10]; /* bytes reserved per array, for kv_free (k v kq vq ks vs kmin kmax ksum pk) */
} KVCache;

/* which per-block key summaries a cache keeps besides the keys (select.c's kv_layout_for says
 * which a policy reads) */
typedef struct {
    int minmax; /* kmin/kmax (quest) */
    int sum;    /* ksum (sparse --probe-summary) */
    int probes; /* > 0 (f32 only): the probe keys of that many probes per block (none when every
                 * row is a probe: the keys are contiguous already) */
    int paged;  /* blocks in per-head slots, released by eviction (above) */
    int prefault; /* every page written once at start (--kv-prefault), not when first used */
} KVLayout;

void kv_init(KVCache *kv, int n_layers, int n_kv, int head_dim, int capacity, int block, int q8,
             const KVLayout *layout);
void kv_free(KVCache *kv);
/* store one position's keys and values for all KV heads (k_row, v_row: [kv_dim]) */
void kv_write(KVCache *kv, int layer, int pos, const float *k_row, const float *v_row);

/* the row of (layer, pos, kvh): its values start at row * head_dim, its q8 scales at
 * row * q8_groups(head_dim); the next position of the same head is the next row */
static inline size_t kv_row(const KVCache *kv, int layer, int pos, int kvh) {
    size_t head = (size_t)layer * (size_t)kv->n_kv + (size_t)kvh;
    if (!kv->paged) return head * (size_t)kv->capacity + (size_t)pos;
    int slot = kv->slot[head * (size_t)kv->n_blocks + (size_t)(pos / kv->block)];
    size_t off = (size_t)(pos % kv->block);
    if (slot < 0) return kv->dead_row + off;
    return head * (size_t)kv->capacity + (size_t)slot * (size_t)kv->block + off;
}
/* paging: give block `block` of (layer, kvh) back (its rows then read as NaN); whether it
 * holds a slot */
void kv_release_block(KVCache *kv, int layer, int kvh, int block);
int kv_block_held(const KVCache *kv, int layer, int kvh, int block);
/* bytes of K and V one block of one KV head occupies; bytes of K and V reserved (virtual);
 * bytes of K and V in slots touched so far (what the cache made resident: nothing is given
 * back, a released slot is reused) */
size_t kv_block_bytes(const KVCache *kv);
size_t kv_reserved_bytes(const KVCache *kv);
size_t kv_touched_bytes(const KVCache *kv);
/* q . key(layer, pos, kvh) */
float kv_key_dot(const KVCache *kv, int layer, int pos, int kvh, const float *q);
/* out += a * value(layer, pos, kvh) */
void kv_value_axpy(const KVCache *kv, int layer, int pos, int kvh, float a, float *out);
/* the key as floats (dequantised for q8) */
void kv_key_read(const KVCache *kv, int layer, int pos, int kvh, float *out);
/* bytes one head's key (or value) row occupies: what reading it costs */
size_t kv_row_bytes(const KVCache *kv);
/* summary rows for (layer, block, kvh) */
static inline size_t kv_summary_index(const KVCache *kv, int layer, int block, int kvh) {
    return (((size_t)layer * (size_t)kv->n_blocks + (size_t)block) * (size_t)kv->n_kv + (size_t)kvh) *
           (size_t)kv->head_dim;
}

/* the probe keys of full block `block` of (layer, kvh): pk_rows rows of head_dim floats; the
 * next block's follow */
static inline const float *kv_probe_keys(const KVCache *kv, int layer, int block, int kvh) {
    size_t b = ((size_t)layer * (size_t)kv->n_kv + (size_t)kvh) * (size_t)kv->n_blocks + (size_t)block;
    return kv->pk + b * (size_t)kv->pk_rows * (size_t)kv->head_dim;
}

#endif
