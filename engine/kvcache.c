/* kvcache.c — see kvcache.h */
#include "kvcache.h"

#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include "ops.h"
#include "util.h"

enum { A_K, A_V, A_KQ, A_VQ, A_KS, A_VS, A_KMIN, A_KMAX, A_KSUM, A_PK, N_ARRAYS };

/* count x size bytes of zero pages, reserved (mmap): a page becomes resident when first
 * written, so a cache sized for the whole context costs what its written rows occupy.
 * Streamed arrays take transparent huge pages as lmc_alloc gives them (fewer TLB misses),
 * except under paging, where a 2 MiB page would hold far more than one block. */
static void *reserve(KVCache *kv, int which, size_t count, size_t size, const char *what) {
    if (count > SIZE_MAX / size) lmc_die_runtime("out of memory allocating %s (size overflow)", what);
    size_t bytes = count * size;
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) lmc_die_runtime("out of memory allocating %s (%zu bytes)", what, bytes);
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
    madvise(p, bytes, kv->paged ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
#endif
    kv->reserved[which] = bytes;
    return p;
}

/* the arrays in A_* order (NULL where the cache keeps none) */
static void kv_arrays(const KVCache *kv, void *arrays[N_ARRAYS]) {
    void *all[N_ARRAYS] = {kv->k, kv->v, kv->kq, kv->vq, kv->ks, kv->vs, kv->kmin, kv->kmax, kv->ksum, kv->pk};
    memcpy(arrays, all, sizeof all);
}

void kv_init(KVCache *kv, int n_layers, int n_kv, int head_dim, int capacity, int block, int q8,
             const KVLayout *layout) {
    int probes = layout->probes;
    memset(kv, 0, sizeof *kv);
    kv->n_layers = n_layers;
    kv->n_kv = n_kv;
    kv->head_dim = head_dim;
    kv->capacity = capacity;
    kv->block = block;
    kv->q8 = q8;
    kv->kv_dim = n_kv * head_dim;
    kv->n_blocks = (capacity + block - 1) / block;
    kv->paged = layout->paged;
    /* one block of rows beyond the heads' rows: the dead block, NaN, where released blocks read */
    size_t rows = (size_t)n_layers * (size_t)capacity + (size_t)block;
    kv->dead_row = (size_t)n_layers * (size_t)n_kv * (size_t)capacity;
    size_t dead = kv->dead_row * (size_t)head_dim, n_dead = (size_t)block * (size_t)head_dim;
    if (q8) {
        kv->kq = reserve(kv, A_KQ, rows, (size_t)kv->kv_dim, "q8 key cache");
        kv->vq = reserve(kv, A_VQ, rows, (size_t)kv->kv_dim, "q8 value cache");
        size_t scales = rows * (size_t)n_kv * (size_t)q8_groups(head_dim);
        kv->ks = reserve(kv, A_KS, scales, sizeof(float), "q8 key scales");
        kv->vs = reserve(kv, A_VS, scales, sizeof(float), "q8 value scales");
        size_t g = (size_t)q8_groups(head_dim), s0 = kv->dead_row * g;
        for (size_t i = 0; i < (size_t)block * g; i++) kv->ks[s0 + i] = kv->vs[s0 + i] = NAN;
    } else {
        kv->k = reserve(kv, A_K, rows * (size_t)kv->kv_dim, sizeof(float), "key cache");
        kv->v = reserve(kv, A_V, rows * (size_t)kv->kv_dim, sizeof(float), "value cache");
        for (size_t i = 0; i < n_dead; i++) kv->k[dead + i] = kv->v[dead + i] = NAN;
    }
    size_t summaries = (size_t)n_layers * (size_t)kv->n_blocks * (size_t)kv->kv_dim;
    if (layout->minmax) {
        kv->kmin = reserve(kv, A_KMIN, summaries, sizeof(float), "key block minima");
        kv->kmax = reserve(kv, A_KMAX, summaries, sizeof(float), "key block maxima");
    }
    if (layout->sum) kv->ksum = reserve(kv, A_KSUM, summaries, sizeof(float), "key block sums");
    /* a full block's probes: the stride select.c probes at (step = block / probes, at least 1) */
    kv->pk_step = probes > 0 && probes < block ? block / probes : 1;
    kv->pk_rows = (block + kv->pk_step - 1) / kv->pk_step;
    if (!q8 && probes > 0 && kv->pk_step > 1)
        kv->pk = reserve(kv, A_PK, summaries * (size_t)kv->pk_rows, sizeof(float), "probe keys");
    size_t heads = (size_t)n_layers * (size_t)n_kv, slots = heads * (size_t)kv->n_blocks;
    kv->n_used = lmc_alloc(heads, sizeof(int), "KV slots");
    if (layout->prefault) { /* every page written once: each becomes resident now */
        void *arrays[N_ARRAYS];
        kv_arrays(kv, arrays);
        for (int a = 0; a < N_ARRAYS; a++)
            for (size_t at = 0; arrays[a] && at < kv->reserved[a]; at += 4096) {
                volatile char *page = (char *)arrays[a] + at;
                *page = *page; /* the dead block's NaNs stay */
            }
    }
    if (kv->paged) {
        kv->slot = lmc_alloc(slots, sizeof(int), "KV slots");
        kv->free_slots = lmc_alloc(slots, sizeof(int), "KV slots");
        kv->n_free = lmc_alloc(heads, sizeof(int), "KV slots");
        for (size_t i = 0; i < slots; i++) kv->slot[i] = -1;
    }
}

/* the block of (layer, pos, kvh) gets its slot when its first row is written */
static void hold_block(KVCache *kv, int layer, int pos, int kvh) {
    size_t head = (size_t)layer * (size_t)kv->n_kv + (size_t)kvh;
    int b = pos / kv->block;
    if (!kv->paged) {
        if (b >= kv->n_used[head]) {
            kv->held += b + 1 - kv->n_used[head];
            kv->n_used[head] = b + 1;
        }
    } else {
        int *slot = &kv->slot[head * (size_t)kv->n_blocks + (size_t)b];
        if (*slot >= 0) return;
        int *n_free = &kv->n_free[head];
        *slot = *n_free > 0 ? kv->free_slots[head * (size_t)kv->n_blocks + (size_t)--*n_free] : kv->n_used[head]++;
        kv->held++;
    }
    if (kv->held > kv->peak_held) kv->peak_held = kv->held;
}

int kv_block_held(const KVCache *kv, int layer, int kvh, int block) {
    size_t head = (size_t)layer * (size_t)kv->n_kv + (size_t)kvh;
    if (!kv->paged) return block < kv->n_used[head];
    return kv->slot[head * (size_t)kv->n_blocks + (size_t)block] >= 0;
}

void kv_release_block(KVCache *kv, int layer, int kvh, int block) {
    if (!kv->paged) lmc_die_runtime("kv_release_block: the cache is not paged");
    size_t head = (size_t)layer * (size_t)kv->n_kv + (size_t)kvh;
    int *slot = &kv->slot[head * (size_t)kv->n_blocks + (size_t)block];
    if (*slot < 0) return;
    kv->free_slots[head * (size_t)kv->n_blocks + (size_t)kv->n_free[head]++] = *slot;
    *slot = -1;
    kv->held--;
}

size_t kv_block_bytes(const KVCache *kv) { return 2 * (size_t)kv->block * kv_row_bytes(kv); }

size_t kv_reserved_bytes(const KVCache *kv) {
    size_t bytes = 0;
    for (int a = A_K; a <= A_VS; a++) bytes += kv->reserved[a];
    return bytes;
}

size_t kv_touched_bytes(const KVCache *kv) {
    size_t slots = 0;
    for (int h = 0; h < kv->n_layers * kv->n_kv; h++) slots += (size_t)kv->n_used[h];
    return slots * kv_block_bytes(kv);
}

void kv_free(KVCache *kv) {
    void *arrays[N_ARRAYS];
    kv_arrays(kv, arrays);
    for (int a = 0; a < N_ARRAYS; a++)
        if (arrays[a]) munmap(arrays[a], kv->reserved[a]);
    lmc_free(kv->slot);
    lmc_free(kv->free_slots);
    lmc_free(kv->n_free);
    lmc_free(kv->n_used);
    memset(kv, 0, sizeof *kv);
}

void kv_write(KVCache *kv, int layer, int pos, const float *k_row, const float *v_row) {
    int D = kv->head_dim, G = q8_groups(D);
    for (int h = 0; h < kv->n_kv; h++) {
        hold_block(kv, layer, pos, h);
        size_t row = kv_row(kv, layer, pos, h);
        size_t off = row * (size_t)D, soff = row * (size_t)G;
        if (kv->q8) {
            quantize_q8(k_row + h * D, D, kv->kq + off, kv->ks + soff);
            quantize_q8(v_row + h * D, D, kv->vq + off, kv->vs + soff);
        } else {
            memcpy(kv->k + off, k_row + h * D, sizeof(float) * (size_t)D);
            memcpy(kv->v + off, v_row + h * D, sizeof(float) * (size_t)D);
        }
    }
    int off = pos % kv->block;
    if (kv->pk && off % kv->pk_step == 0 && off / kv->pk_step < kv->pk_rows)
        for (int h = 0; h < kv->n_kv; h++) {
            float *dst = (float *)kv_probe_keys(kv, layer, pos / kv->block, h) + (size_t)(off / kv->pk_step) * D;
            memcpy(dst, k_row + h * D, sizeof(float) * (size_t)D);
        }
    if (!kv->kmin && !kv->ksum) return;
    /* summaries see the key as stored, so a summary agrees with what probing would read */
    int b = pos / kv->block, first = pos % kv->block == 0;
    float key[LMC_MAX_HEAD_DIM]; /* head_dim <= LMC_MAX_HEAD_DIM is checked by every caller */
    for (int h = 0; h < kv->n_kv; h++) {
        const float *k = key;
        if (kv->q8) kv_key_read(kv, layer, pos, h, key);
        else k = kv->k + kv_row(kv, layer, pos, h) * (size_t)D;
        size_t s = kv_summary_index(kv, layer, b, h);
        for (int i = 0; i < D; i++) {
            if (kv->kmin) {
                kv->kmin[s + i] = first ? k[i] : fminf(kv->kmin[s + i], k[i]);
                kv->kmax[s + i] = first ? k[i] : fmaxf(kv->kmax[s + i], k[i]);
            }
            if (kv->ksum) kv->ksum[s + i] = first ? k[i] : kv->ksum[s + i] + k[i];
        }
    }
}

float kv_key_dot(const KVCache *kv, int layer, int pos, int kvh, const float *q) {
    size_t row = kv_row(kv, layer, pos, kvh);
    int D = kv->head_dim;
    size_t off = row * (size_t)D, soff = row * (size_t)q8_groups(D);
    if (kv->q8)
        return dot_q8(q, kv->kq + off, kv->ks + soff, D);
    return dot_f32(q, kv->k + off, D);
}

void kv_value_axpy(const KVCache *kv, int layer, int pos, int kvh, float a, float *out) {
    size_t row = kv_row(kv, layer, pos, kvh);
    int D = kv->head_dim;
    size_t off = row * (size_t)D, soff = row * (size_t)q8_groups(D);
    if (kv->q8)
        axpy_q8(out, a, kv->vq + off, kv->vs + soff, D);
    else
        axpy_f32(out, a, kv->v + off, D);
}

void kv_key_read(const KVCache *kv, int layer, int pos, int kvh, float *out) {
    size_t row = kv_row(kv, layer, pos, kvh);
    int D = kv->head_dim;
    size_t off = row * (size_t)D, soff = row * (size_t)q8_groups(D);
    if (kv->q8)
        dequantize_q8(kv->kq + off, kv->ks + soff, D, out);
    else
        memcpy(out, kv->k + off, sizeof(float) * (size_t)D);
}

size_t kv_row_bytes(const KVCache *kv) {
    int D = kv->head_dim;
    return kv->q8 ? (size_t)D + sizeof(float) * (size_t)q8_groups(D) : sizeof(float) * (size_t)D;
}
