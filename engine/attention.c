/* attention.c — see attention.h */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "ops.h"

/* ask for a whole future row (every 64-byte line), not just its first line: a row is
 * head_dim floats and the next row of the same head is kv_dim floats further on */
static inline void prefetch_row(const float *row, int n) {
    for (int i = 0; i < n; i += 16) __builtin_prefetch(row + i);
}

void attn_reference(const float *q, const KVCache *kv, int layer, int kvh, int n_pos, float *out,
                    float *probs) {
    int D = kv->head_dim;
    float scale = 1.0f / sqrtf((float)D);
    float *s = probs; /* scores first, probabilities after normalising */
    float max = -INFINITY;
    for (int p = 0; p < n_pos; p++) {
        s[p] = kv_key_dot(kv, layer, p, kvh, q) * scale;
        if (s[p] > max) max = s[p];
    }
    float sum = 0.0f;
    for (int p = 0; p < n_pos; p++) {
        s[p] = expf(s[p] - max);
        sum += s[p];
    }
    for (int p = 0; p < n_pos; p++) s[p] /= sum;
    memset(out, 0, sizeof(float) * (size_t)D);
    for (int p = 0; p < n_pos; p++) kv_value_axpy(kv, layer, p, kvh, s[p], out);
}

void attn_blocks(const float *q, const KVCache *kv, int layer, int kvh, int n_pos,
                 const int *blocks, int n_blocks, float *out, float *scratch, float *probs) {
    int D = kv->head_dim, bs = kv->block;
    float scale = 1.0f / sqrtf((float)D);
    float m = -INFINITY, l = 0.0f;
    memset(out, 0, sizeof(float) * (size_t)D);
    for (int i = 0; i < n_blocks; i++) {
        int p0 = blocks[i] * bs;
        int p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        if (p0 >= p1) continue;
        float bmax = -INFINITY;
        if (!kv->q8) {
            /* f32 rows of one KV head are kv_dim floats apart: walk them by pointer and
             * prefetch ahead, since each row usually sits on a different page */
            size_t stride = (size_t)kv->kv_dim;
            const float *k = kv->k + kv_index(kv, layer, p0) * stride + (size_t)kvh * D;
            for (int p = p0; p < p1; p++, k += stride) {
                prefetch_row(k + 4 * stride, D);
                float s = dot_f32(q, k, D) * scale;
                scratch[p - p0] = s;
                if (s > bmax) bmax = s;
            }
        } else {
            for (int p = p0; p < p1; p++) {
                float s = kv_key_dot(kv, layer, p, kvh, q) * scale;
                scratch[p - p0] = s;
                if (s > bmax) bmax = s;
            }
        }
        if (bmax > m) {
            /* new running max: rescale what was accumulated so far (exp(-inf) = 0 at start) */
            float corr = expf(m - bmax);
            for (int d = 0; d < D; d++) out[d] *= corr;
            l *= corr;
            m = bmax;
        }
        for (int p = p0; p < p1; p++) {
            float e = expf(scratch[p - p0] - m);
            l += e;
            if (!kv->q8) {
                size_t stride = (size_t)kv->kv_dim;
                const float *v = kv->v + kv_index(kv, layer, p) * stride + (size_t)kvh * D;
                prefetch_row(v + 4 * stride, D);
                axpy_f32(out, e, v, D);
            } else {
                kv_value_axpy(kv, layer, p, kvh, e, out);
            }
            if (probs) probs[p] = scratch[p - p0];
        }
    }
    if (l <= 0.0f) return;
    float inv = 1.0f / l;
    for (int d = 0; d < D; d++) out[d] *= inv;
    if (!probs) return;
    for (int i = 0; i < n_blocks; i++) {
        int p0 = blocks[i] * bs;
        int p1 = p0 + bs < n_pos ? p0 + bs : n_pos;
        for (int p = p0; p < p1; p++) probs[p] = expf(probs[p] - m) * inv;
    }
}
