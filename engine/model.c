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
 * The weight products run over the whole chunk (matmul.c); attention a tile of queries at a
 * time where attend_layer.h says it can, else token by token. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

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

void forward_init(Forward *f, const Model *m, int capacity, const AttnOptions *opt, int kv_q8, int bf16_acts,
                  int all_logits, ThreadPool *pool) {
    memset(f, 0, sizeof *f);
    const Config *c = &m->cfg;
    f->m = m;
    f->pool = pool;
    f->capacity = capacity;
    f->chunk = capacity < LMC_PREFILL_CHUNK ? capacity : LMC_PREFILL_CHUNK;
    KVLayout layout = kv_layout_for(&opt->sel);
    layout.paged = attention_pages_kv(opt);
    layout.prefault = opt->kv_prefault;
    kv_init(&f->kv, c->n_layers, c->n_kv_heads, c->head_dim, capacity, opt->sel.block, kv_q8, &layout);
    attention_init(&f->attn, opt, &f->kv, c->n_heads, pool);
    f->use_feat = attention_needs_features(opt) || opt->features;
    if (f->use_feat) {
        f->chunk = 1;
        keyfeat_init(&f->feat, c->n_layers, c->n_heads, capacity, c->hidden, c->vocab);
        f->feat.dump = opt->features;
        f->feat.dump_every = opt->features_every;
        if (f->feat.dump) keyfeat_dump_header(&f->feat);
        attention_set_features(&f->attn, &f->feat, opt->predictor_path);
        if (opt->rank_every) {
            keyrank_init(&f->rank, capacity, c->n_layers, opt->rank_every, opt->rank_keep,
                         opt->rank_direct);
            f->attn.keys.rank = &f->rank;
        }
    }
    f->logit_rows = all_logits ? f->chunk : 1;
    size_t T = (size_t)f->chunk, H = (size_t)c->hidden, Q = (size_t)c->n_heads * c->head_dim;
    size_t KV = (size_t)c->n_kv_heads * c->head_dim, I = (size_t)c->intermediate;
    f->x = lmc_alloc(T * H, sizeof(float), "activations");
    f->xb = lmc_alloc(T * H, sizeof(float), "activations");
    f->q = lmc_alloc(T * Q, sizeof(float), "activations");
    f->k = lmc_alloc(T * KV, sizeof(float), "activations");
    f->v = lmc_alloc(T * KV, sizeof(float), "activations");
    f->att = lmc_alloc(T * Q, sizeof(float), "activations");
    f->hb = lmc_alloc(T * I, sizeof(float), "activations");
    f->hb2 = lmc_alloc(T * I, sizeof(float), "activations");
    f->logits = lmc_alloc((size_t)f->logit_rows * (size_t)c->vocab, sizeof(float), "logits");
    size_t widest = H > Q ? H : Q;
    qacts_init(&f->xq, f->chunk, (int)(widest > I ? widest : I), bf16_acts);
    /* RoPE tables as transformers builds them: inv_freq = 1 / theta^(2i/d) and the angle
     * pos * inv_freq both rounded to float32 (their rounding matters at large positions) */
    int half = c->head_dim / 2;
    f->rope_cos = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    f->rope_sin = lmc_alloc((size_t)capacity * half, sizeof(float), "rope table");
    for (int p = 0; p < capacity; p++)
        for (int i = 0; i < half; i++) {
            float angle = (float)p * rope_inv_freq(c, i);
            f->rope_cos[(size_t)p * half + i] = (float)cos((double)angle);
            f->rope_sin[(size_t)p * half + i] = (float)sin((double)angle);
        }
}

void forward_free(Forward *f) {
    attention_free(&f->attn);
    if (f->use_feat) keyfeat_free(&f->feat);
    if (f->rank.score) keyrank_free(&f->rank);
    kv_free(&f->kv);
    qacts_free(&f->xq);
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->logits, f->rope_cos, f->rope_sin};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmc_free(bufs[i]);
    memset(f, 0, sizeof *f);
}

void model_embed(const Model *m, int token, float *out) {
    size_t H = (size_t)m->cfg.hidden, bytes = H * st_dtype_size(m->embed_dtype);
    /* the row's bytes land at the end of out (all of it for f32); widening front to back reads
     * each 16-bit value before out[j] is written, and out[j] never covers a value still unread */
    uint8_t *raw = (uint8_t *)out + (H * sizeof(float) - bytes);
    int64_t at = m->embed_offset + (int64_t)token * (int64_t)bytes;
    for (size_t got = 0; got < bytes;) {
        ssize_t n = pread(m->embed_fd, raw + got, bytes - got, (off_t)(at + (int64_t)got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            lmc_die_runtime("cannot read the embedding of token %d from %s: %s", token, m->embed_file,
                            n < 0 ? strerror(errno) : "the file is shorter than when it was loaded");
        got += (size_t)n;
    }
    if (m->embed_dtype == ST_F32) return; /* as st_to_f32: the file's bytes are the floats */
    for (size_t j = 0; j < H; j++) {
        uint16_t h;
        memcpy(&h, raw + 2 * j, 2);
        out[j] = m->embed_dtype == ST_F16 ? lmc_f16_to_f32(h) : lmc_bf16_to_f32(h);
    }
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
static void norm_rope_heads(float *v, int n_heads, const float *norm, const Config *c, const Forward *f, int pos) {
    int D = c->head_dim, half = D / 2;
    const float *cos_row = f->rope_cos + (size_t)pos * half, *sin_row = f->rope_sin + (size_t)pos * half;
    for (int h = 0; h < n_heads; h++) {
        float *vh = v + (size_t)h * D;
        if (norm) rmsnorm(vh, vh, norm, D, c->rms_eps);
        rope_apply(vh, D, cos_row, sin_row);
    }
}

float *forward(Forward *f, const int *tokens, int n, int pos, int phase, int want, SelStats *stats) {
    const Model *m = f->m;
    const Config *c = &m->cfg;
    if (n < 1 || n > f->chunk || (want == LOGITS_ALL && n > f->logit_rows))
        lmc_die_runtime("forward: %d tokens for a runner of %d", n, f->chunk);
    int H = c->hidden, Q = c->n_heads * c->head_dim, KV = c->n_kv_heads * c->head_dim, I = c->intermediate;
    size_t nH = (size_t)n * H;
    for (int t = 0; t < n; t++) {
        model_embed(m, tokens[t], f->x + (size_t)t * H);
        if (f->use_feat) keyfeat_append(&f->feat, tokens[t], f->x + (size_t)t * H);
    }
    if (c->embed_scale != 1.0f) scale_by(f->x, nH, c->embed_scale);
    f->attn_ms = 0.0;
    int evicting = phase == ATTN_PREFILL && !stats && attention_tiles_evicting(&f->attn);
    int tiles = !evicting && phase == ATTN_PREFILL && !stats && attention_tiles_prefill(&f->attn);

    for (int l = 0; l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];

        /* ---- attention block */
        for (int t = 0; t < n; t++) rmsnorm(f->xb + (size_t)t * H, f->x + (size_t)t * H, L->attn_norm, H, c->rms_eps);
        MatOut qkv[3] = {{&L->q, f->q, Q}, {&L->k, f->k, KV}, {&L->v, f->v, KV}};
        matmul(qkv, 3, f->xb, H, n, &f->xq, f->pool);
        for (int t = 0; t < n; t++) {
            norm_rope_heads(f->q + (size_t)t * Q, c->n_heads, L->q_norm, c, f, pos + t);
            norm_rope_heads(f->k + (size_t)t * KV, c->n_kv_heads, L->k_norm, c, f, pos + t);
        }
        if (tiles) {
            /* exact prefill: the chunk's keys and values first, then its queries a tile at a
             * time, each over the positions up to its own (same bits as token by token) */
            for (int t = 0; t < n; t++)
                kv_write(&f->kv, l, pos + t, f->k + (size_t)t * KV, f->v + (size_t)t * KV);
            double t0 = lmc_now_ms();
            attend_prefill_tile(&f->attn, l, pos, n, f->q, f->att);
            f->attn_ms += lmc_now_ms() - t0;
        } else if (evicting)
            /* under a budget a block's queries keep the same blocks: per block of the chunk, its
             * keys and values and evictions position by position, then its queries as a tile */
            for (int t0 = 0, t1; t0 < n; t0 = t1) {
                for (t1 = t0 + 1; t1 < n && (pos + t1) % f->kv.block; t1++) {}
                double ms = lmc_now_ms();
                for (int t = t0; t < t1; t++) {
                    kv_write(&f->kv, l, pos + t, f->k + (size_t)t * KV, f->v + (size_t)t * KV);
                    attend_evict(&f->attn, l, pos + t, f->q + (size_t)t * Q);
                }
                attend_prefill_tile(&f->attn, l, pos + t0, t1 - t0, f->q + (size_t)t0 * Q, f->att + (size_t)t0 * Q);
                f->attn_ms += lmc_now_ms() - ms;
            }
        else
            /* token by token, in order: each query sees exactly the positions up to its own,
             * and policy state (importance, H2O mass, block summaries) evolves as in decode */
            for (int t = 0; t < n; t++) {
                kv_write(&f->kv, l, pos + t, f->k + (size_t)t * KV, f->v + (size_t)t * KV);
                double t0 = lmc_now_ms();
                attend_layer(&f->attn, l, pos + t, f->q + (size_t)t * Q, f->att + (size_t)t * Q, phase, stats);
                f->attn_ms += lmc_now_ms() - t0;
            }
        MatOut o = {&L->o, f->xb, H};
        matmul(&o, 1, f->att, Q, n, &f->xq, f->pool);
        add_into(f->x, f->xb, nH, c->residual_scale);

        /* ---- MLP block (SwiGLU) */
        for (int t = 0; t < n; t++) rmsnorm(f->xb + (size_t)t * H, f->x + (size_t)t * H, L->ffn_norm, H, c->rms_eps);
        MatOut gate = {&L->gate, f->hb, I}, up = {&L->up, f->hb2, I};
        matmul_swiglu(&gate, &up, f->xb, H, n, &f->xq, f->pool); /* hb = silu(gate) * up */
        MatOut down = {&L->down, f->xb, H};
        matmul(&down, 1, f->hb, I, n, &f->xq, f->pool);
        add_into(f->x, f->xb, nH, c->residual_scale);
    }
    if (want == LOGITS_NONE) return NULL;
    int first = want == LOGITS_LAST ? n - 1 : 0;
    for (int t = first; t < n; t++) {
        float *xt = f->x + (size_t)t * H;
        rmsnorm(xt, xt, m->final_norm, H, c->rms_eps);
        if (c->logit_div != 1.0f)
            for (int i = 0; i < H; i++) xt[i] /= c->logit_div;
    }
    MatOut head = {&m->lm_head, f->logits, c->vocab};
    matmul(&head, 1, f->x + (size_t)first * H, H, n - first, &f->xq, f->pool);
    return f->logits;
}
