/* kvcache.c — see kvcache.h */
#include "kvcache.h"

#include <math.h>
#include <string.h>

#include "ops.h"
#include "util.h"

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
    size_t rows = (size_t)n_layers * (size_t)capacity;
    if (q8) {
        kv->kq = lmc_alloc(rows, (size_t)kv->kv_dim, "q8 key cache");
        kv->vq = lmc_alloc(rows, (size_t)kv->kv_dim, "q8 value cache");
        size_t scales = rows * (size_t)n_kv * (size_t)q8_groups(head_dim);
        kv->ks = lmc_alloc(scales, sizeof(float), "q8 key scales");
        kv->vs = lmc_alloc(scales, sizeof(float), "q8 value scales");
    } else {
        kv->k = lmc_alloc(rows * (size_t)kv->kv_dim, sizeof(float), "key cache");
        kv->v = lmc_alloc(rows * (size_t)kv->kv_dim, sizeof(float), "value cache");
    }
    size_t summaries = (size_t)n_layers * (size_t)kv->n_blocks * (size_t)kv->kv_dim;
    if (layout->minmax) {
        kv->kmin = lmc_alloc(summaries, sizeof(float), "key block minima");
        kv->kmax = lmc_alloc(summaries, sizeof(float), "key block maxima");
    }
    if (layout->sum) kv->ksum = lmc_alloc(summaries, sizeof(float), "key block sums");
    /* a full block's probes: the stride select.c probes at (step = block / probes, at least 1) */
    kv->pk_step = probes > 0 && probes < block ? block / probes : 1;
    kv->pk_rows = (block + kv->pk_step - 1) / kv->pk_step;
    if (!q8 && probes > 0 && kv->pk_step > 1)
        kv->pk = lmc_alloc(summaries * (size_t)kv->pk_rows, sizeof(float), "probe keys");
}

void kv_free(KVCache *kv) {
    lmc_free(kv->k);
    lmc_free(kv->v);
    lmc_free(kv->kq);
    lmc_free(kv->vq);
    lmc_free(kv->ks);
    lmc_free(kv->vs);
    lmc_free(kv->kmin);
    lmc_free(kv->kmax);
    lmc_free(kv->ksum);
    lmc_free(kv->pk);
    memset(kv, 0, sizeof *kv);
}

void kv_write(KVCache *kv, int layer, int pos, const float *k_row, const float *v_row) {
    int D = kv->head_dim, G = q8_groups(D);
    for (int h = 0; h < kv->n_kv; h++) {
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
