/* model.h — a Qwen3 model: configuration, weights, and the forward pass. */
#ifndef LMC_MODEL_H
#define LMC_MODEL_H

#include <stddef.h>

#include "attend.h"
#include "kvcache.h"
#include "ops.h"
#include "safetensors.h"
#include "threads.h"

typedef struct {
    int hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim, vocab, max_pos;
    float rms_eps;
    double rope_theta;
    int tied;         /* tie_word_embeddings */
    char dtype[16];   /* torch_dtype / dtype, informational */
} Config;

typedef struct {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm;
    Mat q, k, v, o, gate, up, down;
} Layer;

typedef struct {
    Config cfg;
    float *embed; /* [vocab x hidden], f32 always (a row lookup per token) */
    float *final_norm;
    Mat lm_head;  /* aliases embed when tied and f32 */
    Layer *layers;
    char weights_dtype[8]; /* dtype of the safetensors tensors, e.g. "BF16" */
    int tied_used;         /* 1 when lm_head came from embed_tokens */
} Model;

/* ---- loader.c */
/* Parse config.json text; -1 + error naming the key on failure. */
int config_parse(Config *c, const char *text, size_t len, const char *path);
/* Check tensors in an open safetensors file against the config (names, shapes, dtypes). */
int model_check_tensors(const Config *c, const SafeTensors *st);
/* Load DIR/config.json + DIR/model.safetensors; weights as f32 or q8 (wq8). */
int model_load(Model *m, const char *dir, int wq8);
void model_free(Model *m);

/* ---- model.c: the forward pass */
typedef struct {
    const Model *m;
    KVCache kv;
    Attention attn;
    ThreadPool *pool;
    /* activations, allocated once: nothing is allocated in the decode loop */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
    float *rope_cos, *rope_sin; /* [capacity x head_dim/2] */
    int capacity;
    double attn_ms; /* attention time (all layers) of the last forward */
} Runner;

void runner_init(Runner *r, const Model *m, int capacity, const AttnOptions *opt, int kv_q8,
                 ThreadPool *pool);
void runner_free(Runner *r);
/* Run one token at position pos. phase: ATTN_PREFILL or ATTN_DECODE. Returns the logits
 * when want_logits, else NULL (the lm_head is skipped). stats may be NULL. */
float *forward(Runner *r, int token, int pos, int phase, int want_logits, SelStats *stats);

#endif
