/* model.h — a Qwen3-family or Llama-family model: configuration, weights, the forward pass. */
#ifndef LMC_MODEL_H
#define LMC_MODEL_H

#include <stddef.h>

#include "attend_layer.h"
#include "kvcache.h"
#include "matmul.h"
#include "ops.h"
#include "checkpoint.h"
#include "threads.h"

typedef enum { ARCH_QWEN3, ARCH_QWEN3_VL, ARCH_LLAMA, ARCH_MINICPM } Arch;

typedef struct {
    Arch arch;
    char model_type[16];
    char prefix[32]; /* tensor names of the text model: "model." or "model.language_model." */
    int hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim, vocab, max_pos;
    float rms_eps;
    double rope_theta;
    char rope_type[16]; /* "default" or "llama3" */
    int rope_llama3;    /* Llama 3 frequency scaling, with these parameters: */
    double rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_max;  /* original_max_position_embeddings */
    int qk_norm;        /* per-head RMSNorm of q and k before RoPE (Qwen3, Qwen3-VL) */
    /* MiniCPM's factors, 1 elsewhere: embeddings are multiplied by embed_scale, each residual
     * branch by residual_scale, and the final hidden state divided by logit_div */
    float embed_scale, residual_scale, logit_div;
    int tied;         /* tie_word_embeddings */
    char dtype[16];   /* torch_dtype / dtype, informational */
} Config;

typedef struct {
    float *attn_norm, *ffn_norm, *q_norm, *k_norm; /* q_norm, k_norm: NULL without qk_norm */
    Mat q, k, v, o, gate, up, down;
} Layer;

typedef struct {
    Config cfg;
    /* the embedding table [vocab x hidden] stays in the checkpoint's file, as stored (f32,
     * bf16 or f16): a looked-up row is read from it (pread, through the page cache) and widened
     * to f32, exactly (model_embed), so the table is never part of the resident set */
    int embed_fd;         /* the file, open for the model's life; -1 before loading */
    int64_t embed_offset; /* where the table starts in it */
    StDtype embed_dtype;
    char embed_file[512];
    float *final_norm;
    Mat lm_head;  /* from the embedding when tied, in the --wq format */
    Layer *layers;
    char weights_dtype[8]; /* dtype of the safetensors tensors, e.g. "BF16" */
    int tied_used;         /* 1 when lm_head came from embed_tokens */
} Model;

/* ---- model.c */
/* the embedding of token into out[hidden] */
void model_embed(const Model *m, int token, float *out);

/* ---- config.c */
/* Parse config.json text; -1 + error naming the key on failure. */
int config_parse(Config *c, const char *text, size_t len, const char *path);

/* ---- loader.c */
/* Check a checkpoint's tensors against the config (names, shapes, dtypes). */
int model_check_tensors(const Config *c, const Checkpoint *ck);
/* Load DIR/config.json + the checkpoint (model.safetensors or its shards); matrices stored as
 * wq (WQ_F32, WQ_Q8, WQ_BF16). */
int model_load(Model *m, const char *dir, int wq, ThreadPool *pool);
void model_free(Model *m);
/* the bytes of the weights as they stay resident after loading (matrices in their format,
 * norms in f32; the embedding table stays in the file, see Model.embed) */
size_t model_weight_bytes(const Model *m);

/* ---- model.c: the forward pass */
/* tokens per forward call: a prefill runs its prompt in chunks of this many tokens, so each
 * weight row is read once per chunk instead of once per token */
#define LMC_PREFILL_CHUNK 64

enum { LOGITS_NONE = 0, LOGITS_LAST = 1, LOGITS_ALL = 2 };

/* what the forward pass over one model keeps between calls: its KV cache, the attention of its
 * layers, the activations of a chunk and the RoPE tables */
typedef struct {
    const Model *m;
    KVCache kv;
    Attention attn;
    ThreadPool *pool;
    int chunk;      /* most tokens per forward */
    int logit_rows; /* rows of `logits`: chunk when LOGITS_ALL is allowed, else 1 */
    /* activations [chunk][...], allocated once: nothing is allocated in the decode loop */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
    QActs xq;                   /* activations quantised for q8 weights */
    float *rope_cos, *rope_sin; /* [capacity x head_dim/2] */
    int capacity;
    double attn_ms; /* attention time (all layers, all tokens) of the last forward */
    KeyFeat feat;   /* key features (h2o-prev, gbm, --dump-features); then chunk is 1, so the
                     * features of a query never see a later token */
    int use_feat;
    KeyRank rank; /* --measure-keys (with the features), see keyrank.h */
} Forward;

/* all_logits: forward may be asked for LOGITS_ALL (sizes the logits buffer for a chunk);
 * bf16_acts: --bf16-acts (QActs, matmul.h) */
void forward_init(Forward *f, const Model *m, int capacity, const AttnOptions *opt, int kv_q8, int bf16_acts,
                  int all_logits, ThreadPool *pool);
void forward_free(Forward *f);
/* Run n tokens (1 <= n <= f->chunk) at positions pos .. pos + n - 1, in order. phase:
 * ATTN_PREFILL or ATTN_DECODE. want: LOGITS_NONE (returns NULL, the lm_head is skipped),
 * LOGITS_LAST (the last token's [vocab] logits) or LOGITS_ALL ([n][vocab]). stats may be NULL.
 * Every token's result is bit-identical to running the tokens one at a time. */
float *forward(Forward *f, const int *tokens, int n, int pos, int phase, int want, SelStats *stats);

#endif
