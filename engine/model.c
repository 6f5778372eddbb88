/* model.c — the forward pass for a chunk of tokens, as transformers' Qwen3ForCausalLM (and
 * LlamaForCausalLM, Qwen3-VL's text model, MiniCPM: the switches in brackets, see config.c):
 *
 *   x = embed[token]                      [* embed_scale]
 *   per layer:  h = rmsnorm(x)            (input_layernorm)
 *               q, k, v = Wq h, Wk h, Wv h (GQA: n_kv_heads key/value heads)
 *               q, k = rmsnorm per head (q_norm, k_norm) [qk_norm only], then RoPE (rotate_half)
 *               cache k, v; a = attention(q) over the cache; x += Wo a   [* residual_scale]
 *               h = rmsnorm(x)            (post_attention_layernorm)
 *               x += Wdown (silu(Wgate h) * Wup h)                       [* residual_scale]
 *   logits = lm_head(rmsnorm(x))          (final norm)  [rmsnorm(x) / logit_div]
 *
 * The weight products run over the whole chunk (matmul.c); attention runs token by token. */
#include <math.h>
#include <string.h>

#include "model.h"
#include "util.h"

/* RoPE frequency i (of head_dim / 2) as transformers computes it in float32: 1 / theta^(2i/d),
 * and for "llama3" rescaled by wavelength: long waves (beyond original_max / low_freq_factor)
 * slowed by `factor`, short ones (below original_max / high_freq_factor) kept, the band
 * between interpolated */
static float rope_inv_freq(const Config *c, int i) {
    float expo = (float)(2 * i) / (float)c->head_dim;
    float inv_freq = (float)(1.0 / pow(c->rope_theta, (double)expo));
    if (!c->rope_llama3) return inv_freq;
    float factor = (float)c->rope_factor, low = (float)c->rope_low_freq;
    float wavelen = (float)(2.0 * 3.14159265358979323846) / inv_freq;
    float low_wavelen = (float)(c->rope_orig_max / c->rope_low_freq);
    float high_wavelen = (float)(c->rope_orig_max / c->rope_high_freq);
    if (wavelen > low_wavelen) return inv_freq / factor;
    if (wavelen < high_wavelen) return inv_freq;
    float smooth = ((float)c->rope_orig_max / wavelen - low) / (float)(c->rope_high_freq - c->rope_low_freq);
    return (1.0f - smooth) * inv_freq / factor + smooth * inv_freq;
}

void runner_init(Runner *r, const Model *m, int capacity, const AttnOptions *opt, int kv_q8,
                 int all_logits, ThreadPool *pool) {
    memset(r, 0, sizeof *r);
    const Config *c = &m->cfg;
    r->m = m;
    r->pool = pool;
    r->capacity = capacity;
    r->chunk = capacity < LMC_PREFILL_CHUNK ? capacity : LMC_PREFILL_CHUNK;
    int keep_minmax = opt->sel.policy == POL_QUEST;
    int keep_sum = opt->sel.policy == POL_SPARSE && opt->sel.probe_summary;
    int probes = opt->sel.policy == POL_SPARSE && !opt->sel.probe_summary ? opt->sel.probes : 0;
    kv_init(&r->kv, c->n_layers, c->n_kv_heads, c->head_dim, capacity, opt->sel.block, kv_q8,
            keep_minmax, keep_sum, probes);
    attention_init(&r->attn, opt, &r->kv, c->n_heads, pool);
    r->use_feat = attention_needs_features(opt) || opt->features;
    if (r->use_feat) {
        r->chunk = 1;
        keyfeat_init(&r->feat, c->n_layers, c->n_heads, capacity, c->hidden, c->vocab);
        r->feat.dump = opt->features;
        r->feat.dump_every = opt->features_every;
        if (r->feat.dump) keyfeat_dump_header(&r->feat);
        attention_set_features(&r->attn, &r->feat, opt->predictor_path);
        if (opt->rank_every) {
            keyrank_init(&r->rank, capacity, c->n_layers, opt->rank_every);
            r->attn.rank = &r->rank;
        }
    }
    r->logit_rows = all_logits ? r->chunk : 1;
    size_t T = (size_t)r->chunk, H = (size_t)c->hidden, Q = (size_t)c->n_heads * c->head_dim;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate;
    r->x = lmc_alloc(T * H, sizeof(float), "activations");
    r->xb = lmc_alloc(T * H, sizeof(float), "activations");
    r->q = lmc_alloc(T * Q, sizeof(float), "activations");
    r->k = lmc_alloc(T * KV, sizeof(float), "activations");
    r->v = lmc_alloc(T * KV, sizeof(float), "activations");
    r->att = lmc_alloc(T * Q, sizeof(float), "activations");
    r->hb = lmc_alloc(T * I, sizeof(float), "activations");
    r->hb2 = lmc_alloc(T * I, sizeof(float), "activations");
    r->logits = lmc_alloc((size_t)r->logit_rows * (size_t)c->vocab, sizeof(float), "logits");
    size_t widest = H > Q ? H : Q;
    qacts_init(&r->xq, r->chunk, (int)(widest > I ? widest : I));
    /* RoPE tables as transformers builds them: inv_freq = 1 / theta^(2i/d) and the angle
     * pos * inv_freq both rounded to float32 (their rounding matters at large positions) */
    int half = c->head_dim / 2;
    r->rope_cos = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    r->rope_sin = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    for (int p = 0; p < capacity; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * rope_inv_freq(c, i);
            r->rope_cos[(size_t)p * half + i] = (float)cos((double)angle);
            r->rope_sin[(size_t)p * half + i] = (float)sin((double)angle);
        }
}

void runner_free(Runner *r) {
    attention_free(&r->attn);
    if (r->use_feat) keyfeat_free(&r->feat);
    if (r->rank.score) keyrank_free(&r->rank);
    kv_free(&r->kv);
    qacts_free(&r->xq);
    float *bufs[] = {r->x, r->xb, r->q, r->k, r->v, r->att, r->hb, r->hb2, r->logits, r->rope_cos, r->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmc_free(bufs[i]);
    memset(r, 0, sizeof *r);
}

void model_embed(const Model *m, int token, float *out) {
    int H = m->cfg.hidden;
    if (m->embed) memcpy(out, m->embed + (size_t)token * (size_t)H, sizeof(float) * (size_t)H);
    else mat_row_f32(&m->lm_head, token, out);
}

/* the residual add; MiniCPM scales the branch first (the plain add stays a plain add, so the
 * other architectures' bits do not depend on the switch) */
static void add_into(float *x, const float *y, size_t n, float scale) {
    if (scale == 1.0f)
        for (size_t i = 0; i < n; i++) x[i] += y[i];
    else
        for (size_t i = 0; i < n; i++) x[i] += y[i] * scale;
}

static void scale_by(float *x, size_t n, float s) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

/* Qwen3 normalises each query and key head (norm != NULL), then each is rotated (token at
 * position pos); Llama only rotates */
static void norm_rope_heads(float *v, int n_heads, const float *norm, const Config *c, const Runner *r, int pos) {
    int D = c->head_dim, half = D / 2;
    const float *cos_row = r->rope_cos + (size_t)pos * half, *sin_row = r->rope_sin + (size_t)pos * half;
    for (int h = 0; h < n_heads; h++) {
        float *vh = v + (size_t)h * D;
        if (norm) rmsnorm(vh, vh, norm, D, c->rms_eps);
        rope_apply(vh, D, cos_row, sin_row);
    }
}

float *forward(Runner *r, const int *tokens, int n, int pos, int phase, int want, SelStats *stats) {
    const Model *m = r->m;
    const Config *c = &m->cfg;
    if (n < 1 || n > r->chunk || (want == LOGITS_ALL && n > r->logit_rows))
        lmc_die_runtime("forward: %d tokens for a runner of %d", n, r->chunk);
    int H = c->hidden, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim, I = c->intermediate;
    size_t nH = (size_t)n * H;
    for (int t = 0; t < n; t++) {
        model_embed(m, tokens[t], r->x + (size_t)t * H);
        if (r->use_feat) keyfeat_append(&r->feat, tokens[t], r->x + (size_t)t * H);
    }
    if (c->embed_scale != 1.0f) scale_by(r->x, nH, c->embed_scale);
    r->attn_ms = 0.0;

    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];

        /* ---- attention block */
        for (int t = 0; t < n; t++) rmsnorm(r->xb + (size_t)t * H, r->x + (size_t)t * H, L->attn_norm, H, c->rms_eps);
        MatOut qkv[3] = {{&L->q, r->q, Q}, {&L->k, r->k, KV}, {&L->v, r->v, KV}};
        matmul(qkv, 3, r->xb, H, n, &r->xq, r->pool);
        for (int t = 0; t < n; t++) {
            norm_rope_heads(r->q + (size_t)t * Q, c->n_heads, L->q_norm, c, r, pos + t);
            norm_rope_heads(r->k + (size_t)t * KV, c->n_kv_heads, L->k_norm, c, r, pos + t);
        }
        /* token by token, in order: each query sees exactly the positions up to its own, and
         * policy state (importance, H2O mass, block summaries) evolves as in decode */
        for (int t = 0; t < n; t++) {
            kv_write(&r->kv, l, pos + t, r->k + (size_t)t * KV, r->v + (size_t)t * KV);
            double t0 = lmc_now_ms();
            attend_layer(&r->attn, l, pos + t, r->q + (size_t)t * Q, r->att + (size_t)t * Q, phase, stats);
            r->attn_ms += lmc_now_ms() - t0;
        }
        MatOut o = {&L->o, r->xb, H};
        matmul(&o, 1, r->att, Q, n, &r->xq, r->pool);
        add_into(r->x, r->xb, nH, c->residual_scale);

        /* ---- MLP block (SwiGLU) */
        for (int t = 0; t < n; t++) rmsnorm(r->xb + (size_t)t * H, r->x + (size_t)t * H, L->ffn_norm, H, c->rms_eps);
        MatOut gate = {&L->gate, r->hb, I}, up = {&L->up, r->hb2, I};
        matmul_swiglu(&gate, &up, r->xb, H, n, &r->xq, r->pool); /* hb = silu(gate) * up */
        MatOut down = {&L->down, r->xb, H};
        matmul(&down, 1, r->hb, I, n, &r->xq, r->pool);
        add_into(r->x, r->xb, nH, c->residual_scale);
    }
    if (want == LOGITS_NONE) return NULL;
    int first = want == LOGITS_LAST ? n - 1 : 0;
    for (int t = first; t < n; t++) {
        float *xt = r->x + (size_t)t * H;
        rmsnorm(xt, xt, m->final_norm, H, c->rms_eps);
        if (c->logit_div != 1.0f)
            for (int i = 0; i < H; i++) xt[i] /= c->logit_div;
    }
    MatOut head = {&m->lm_head, r->logits, c->vocab};
    matmul(&head, 1, r->x + (size_t)first * H, H, n - first, &r->xq, r->pool);
    return r->logits;
}
