/* model.c — the Qwen3 forward pass for one token, as transformers' Qwen3ForCausalLM:
 *
 *   x = embed[token]
 *   per layer:  h = rmsnorm(x)            (input_layernorm)
 *               q, k, v = Wq h, Wk h, Wv h (GQA: n_kv_heads key/value heads)
 *               q, k = rmsnorm per head (q_norm, k_norm), then RoPE (rotate_half)
 *               cache k, v; a = attention(q) over the cache; x += Wo a
 *               h = rmsnorm(x)            (post_attention_layernorm)
 *               x += Wdown (silu(Wgate h) * Wup h)
 *   logits = lm_head(rmsnorm(x))          (final norm)
 */
#include <math.h>
#include <string.h>

#include "model.h"
#include "util.h"

void runner_init(Runner *r, const Model *m, int capacity, const AttnOptions *opt, int kv_q8,
                 ThreadPool *pool) {
    memset(r, 0, sizeof *r);
    const Config *c = &m->cfg;
    r->m = m;
    r->pool = pool;
    r->capacity = capacity;
    int keep_minmax = opt->sel.policy == POL_QUEST;
    int keep_sum = opt->sel.policy == POL_SPARSE && opt->sel.probe_summary;
    kv_init(&r->kv, c->n_layers, c->n_kv_heads, c->head_dim, capacity, opt->sel.block, kv_q8,
            keep_minmax, keep_sum);
    attention_init(&r->attn, opt, &r->kv, c->n_heads, pool);
    size_t H = (size_t)c->hidden, Q = (size_t)c->n_heads * c->head_dim;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate;
    r->x = lmc_alloc(H, sizeof(float), "activations");
    r->xb = lmc_alloc(H > Q ? H : Q, sizeof(float), "activations");
    r->q = lmc_alloc(Q, sizeof(float), "activations");
    r->k = lmc_alloc(KV, sizeof(float), "activations");
    r->v = lmc_alloc(KV, sizeof(float), "activations");
    r->att = lmc_alloc(Q, sizeof(float), "activations");
    r->hb = lmc_alloc(I, sizeof(float), "activations");
    r->hb2 = lmc_alloc(I, sizeof(float), "activations");
    r->logits = lmc_alloc((size_t)c->vocab, sizeof(float), "logits");
    /* RoPE tables as transformers builds them: inv_freq = 1 / theta^(2i/d) and the angle
     * pos * inv_freq both rounded to float32 (their rounding matters at large positions) */
    int half = c->head_dim / 2;
    r->rope_cos = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    r->rope_sin = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    for (int p = 0; p < capacity; p++)
        for (int i = 0; i < half; i++) {
            float expo = (float)(2 * i) / (float)c->head_dim;
            float inv_freq = (float)(1.0 / pow(c->rope_theta, (double)expo));
            float angle = (float)p * inv_freq;
            r->rope_cos[(size_t)p * half + i] = (float)cos((double)angle);
            r->rope_sin[(size_t)p * half + i] = (float)sin((double)angle);
        }
}

void runner_free(Runner *r) {
    attention_free(&r->attn);
    kv_free(&r->kv);
    float *bufs[] = {r->x, r->xb, r->q, r->k, r->v, r->att, r->hb, r->hb2, r->logits, r->rope_cos, r->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmc_free(bufs[i]);
    memset(r, 0, sizeof *r);
}

float *forward(Runner *r, int token, int pos, int phase, int want_logits, SelStats *stats) {
    const Model *m = r->m;
    const Config *c = &m->cfg;
    int H = c->hidden, D = c->head_dim, half = D / 2;
    float *x = r->x;
    memcpy(x, m->embed + (size_t)token * H, sizeof(float) * (size_t)H);
    const float *cos_row = r->rope_cos + (size_t)pos * half, *sin_row = r->rope_sin + (size_t)pos * half;
    r->attn_ms = 0.0;

    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];

        /* ---- attention block */
        rmsnorm(r->xb, x, L->attn_norm, H, c->rms_eps);
        matvec(r->q, &L->q, r->xb, r->pool);
        matvec(r->k, &L->k, r->xb, r->pool);
        matvec(r->v, &L->v, r->xb, r->pool);
        /* Qwen3 normalises each query and key head before rotating it */
        for (int h = 0; h < c->n_heads; h++) {
            float *qh = r->q + (size_t)h * D;
            rmsnorm(qh, qh, L->q_norm, D, c->rms_eps);
            rope_apply(qh, D, cos_row, sin_row);
        }
        for (int h = 0; h < c->n_kv_heads; h++) {
            float *kh = r->k + (size_t)h * D;
            rmsnorm(kh, kh, L->k_norm, D, c->rms_eps);
            rope_apply(kh, D, cos_row, sin_row);
        }
        kv_write(&r->kv, l, pos, r->k, r->v);
        double t0 = lmc_now_ms();
        attend_layer(&r->attn, l, pos, r->q, r->att, phase, stats);
        r->attn_ms += lmc_now_ms() - t0;
        matvec(r->xb, &L->o, r->att, r->pool);
        for (int i = 0; i < H; i++) x[i] += r->xb[i];

        /* ---- MLP block (SwiGLU) */
        rmsnorm(r->xb, x, L->ffn_norm, H, c->rms_eps);
        matvec(r->hb, &L->gate, r->xb, r->pool);
        matvec(r->hb2, &L->up, r->xb, r->pool);
        swiglu(r->hb, r->hb, r->hb2, c->intermediate);
        matvec(r->xb, &L->down, r->hb, r->pool);
        for (int i = 0; i < H; i++) x[i] += r->xb[i];
    }
    if (!want_logits) return NULL;
    rmsnorm(x, x, m->final_norm, H, c->rms_eps);
    matvec(r->logits, &m->lm_head, x, r->pool);
    return r->logits;
}
