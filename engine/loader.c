/* loader.c — config.json and model.safetensors into a Model, validating everything.
 *
 * config.json: both the older form (top-level rope_theta, torch_dtype) and transformers 5's
 * (rope_parameters {"rope_theta", "rope_type"}, dtype). Tensors are checked by name, dtype
 * and shape against the config before any is converted. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "model.h"
#include "safetensors.h"
#include "util.h"

/* ---------------------------------------------------------------- config.json */

static int get_int(const JsonValue *root, const char *key, int required, int dflt, int lo, int hi,
                   const char *path, int *out) {
    const JsonValue *v = json_get(root, key);
    if (!v || v->type == JSON_NULL) {
        if (required) {
            lmc_set_error("%s: missing key '%s'", path, key);
            return -1;
        }
        *out = dflt;
        return 0;
    }
    if (v->type != JSON_NUMBER || floor(v->number) != v->number || v->number < lo || v->number > hi) {
        lmc_set_error("%s: '%s' must be an integer in [%d, %d]", path, key, lo, hi);
        return -1;
    }
    *out = (int)v->number;
    return 0;
}

static int get_positive(const JsonValue *obj, const char *key, const char *path, double *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !(v->number > 0.0)) {
        lmc_set_error("%s: '%s' must be a positive number", path, key);
        return -1;
    }
    *out = v->number;
    return 0;
}

/* only plain RoPE is implemented: anything that rescales positions is refused */
static int check_rope_type(const JsonValue *obj, const char *where, const char *path) {
    if (!obj || obj->type == JSON_NULL) return 0;
    if (obj->type != JSON_OBJECT) {
        lmc_set_error("%s: '%s' must be an object", path, where);
        return -1;
    }
    const char *keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        const JsonValue *t = json_get(obj, keys[i]);
        if (t && t->type == JSON_STRING && strcmp(t->string, "default") != 0) {
            lmc_set_error("%s: %s.%s '%.40s' is not supported (allowed: default)", path, where,
                          keys[i], t->string);
            return -1;
        }
    }
    return 0;
}

int config_parse(Config *c, const char *text, size_t len, const char *path) {
    memset(c, 0, sizeof *c);
    JsonValue *root = json_parse(text, len, path);
    if (!root) return -1;
    int rc = -1;
    if (root->type != JSON_OBJECT) {
        lmc_set_error("%s: expected a JSON object, found a %s", path, json_type_name(root->type));
        goto done;
    }
    const JsonValue *mt = json_get(root, "model_type");
    if (mt && (mt->type != JSON_STRING || strcmp(mt->string, "qwen3") != 0)) {
        lmc_set_error("%s: model_type %s%.40s%s is not supported (allowed: qwen3)", path,
                      mt->type == JSON_STRING ? "'" : "", mt->type == JSON_STRING ? mt->string : "(not a string)",
                      mt->type == JSON_STRING ? "'" : "");
        goto done;
    }
    if (get_int(root, "hidden_size", 1, 0, 1, 65536, path, &c->hidden) ||
        get_int(root, "intermediate_size", 1, 0, 1, 1 << 20, path, &c->intermediate) ||
        get_int(root, "num_hidden_layers", 1, 0, 1, 1024, path, &c->n_layers) ||
        get_int(root, "num_attention_heads", 1, 0, 1, 1024, path, &c->n_heads) ||
        get_int(root, "vocab_size", 1, 0, 1, 1 << 22, path, &c->vocab) ||
        get_int(root, "max_position_embeddings", 1, 0, 1, 1 << 24, path, &c->max_pos))
        goto done;
    if (get_int(root, "num_key_value_heads", 0, c->n_heads, 1, 1024, path, &c->n_kv_heads) ||
        get_int(root, "head_dim", 0, c->hidden / c->n_heads, 2, LMC_MAX_HEAD_DIM, path, &c->head_dim))
        goto done;
    if (c->head_dim % 2 != 0 || c->head_dim < 2) {
        lmc_set_error("%s: 'head_dim' %d must be even (RoPE rotates pairs)", path, c->head_dim);
        goto done;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        lmc_set_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    const JsonValue *eps = json_get(root, "rms_norm_eps");
    double d;
    if (eps) {
        if (get_positive(root, "rms_norm_eps", path, &d)) goto done;
        c->rms_eps = (float)d;
    } else {
        c->rms_eps = 1e-6f;
    }
    /* rope_theta: transformers 5 nests it in rope_parameters; older files keep it top level */
    const JsonValue *rp = json_get(root, "rope_parameters");
    if (check_rope_type(rp, "rope_parameters", path) ||
        check_rope_type(json_get(root, "rope_scaling"), "rope_scaling", path))
        goto done;
    if (rp && rp->type == JSON_OBJECT && json_get(rp, "rope_theta")) {
        if (get_positive(rp, "rope_theta", path, &c->rope_theta)) goto done;
    } else if (json_get(root, "rope_theta")) {
        if (get_positive(root, "rope_theta", path, &c->rope_theta)) goto done;
    } else {
        lmc_set_error("%s: missing key 'rope_theta' (top level or in rope_parameters)", path);
        goto done;
    }
    const JsonValue *tie = json_get(root, "tie_word_embeddings");
    if (tie && tie->type != JSON_BOOL) {
        lmc_set_error("%s: 'tie_word_embeddings' must be true or false", path);
        goto done;
    }
    c->tied = tie ? tie->boolean : 0;
    const JsonValue *bias = json_get(root, "attention_bias");
    if (bias && bias->type == JSON_BOOL && bias->boolean) {
        lmc_set_error("%s: attention_bias=true is not supported (Qwen3 has no attention bias)", path);
        goto done;
    }
    const JsonValue *act = json_get(root, "hidden_act");
    if (act && (act->type != JSON_STRING || strcmp(act->string, "silu") != 0)) {
        lmc_set_error("%s: hidden_act must be \"silu\"", path);
        goto done;
    }
    const JsonValue *dt = json_get(root, "dtype");
    if (!dt) dt = json_get(root, "torch_dtype");
    snprintf(c->dtype, sizeof c->dtype, "%s", dt && dt->type == JSON_STRING ? dt->string : "unknown");
    rc = 0;
done:
    json_free(root);
    return rc;
}

/* ---------------------------------------------------------------- tensor checks */

typedef struct {
    char name[96];
    int64_t rows, cols; /* cols = 0: a vector of `rows` */
} Expect;

static int expect_tensor(const SafeTensors *st, const Expect *e) {
    const StTensor *t = st_find(st, e->name);
    if (!t) {
        lmc_set_error("%s: missing tensor '%s'", st->path, e->name);
        return -1;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
        lmc_set_error("%s: tensor '%s' has unsupported dtype %s (allowed: F32, BF16, F16)",
                      st->path, e->name, st_dtype_name(t->dtype));
        return -1;
    }
    int ok = e->cols ? (t->ndim == 2 && t->shape[0] == e->rows && t->shape[1] == e->cols)
                     : (t->ndim == 1 && t->shape[0] == e->rows);
    if (!ok) {
        char got[96] = "";
        size_t n = 0;
        for (int d = 0; d < t->ndim && n < sizeof got - 24; d++)
            n += (size_t)snprintf(got + n, sizeof got - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (e->cols)
            lmc_set_error("%s: tensor '%s' has shape [%s], config needs [%lld, %lld]", st->path,
                          e->name, got, (long long)e->rows, (long long)e->cols);
        else
            lmc_set_error("%s: tensor '%s' has shape [%s], config needs [%lld]", st->path, e->name,
                          got, (long long)e->rows);
        return -1;
    }
    return 0;
}

static Expect mk(const char *name, int64_t rows, int64_t cols) {
    Expect e;
    snprintf(e.name, sizeof e.name, "%s", name);
    e.rows = rows;
    e.cols = cols;
    return e;
}

/* the per-layer tensors: suffix, rows, cols (0 = vector) */
static void layer_expects(const Config *c, int l, Expect out[11]) {
    int64_t H = c->hidden, D = c->head_dim, q = (int64_t)c->n_heads * D, kv = (int64_t)c->n_kv_heads * D;
    int64_t I = c->intermediate;
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d.", l);
    char n[96];
#define E(i, suffix, r, cc) (snprintf(n, sizeof n, "%s%s", p, suffix), out[i] = mk(n, r, cc))
    E(0, "input_layernorm.weight", H, 0);
    E(1, "self_attn.q_proj.weight", q, H);
    E(2, "self_attn.k_proj.weight", kv, H);
    E(3, "self_attn.v_proj.weight", kv, H);
    E(4, "self_attn.o_proj.weight", H, q);
    E(5, "self_attn.q_norm.weight", D, 0);
    E(6, "self_attn.k_norm.weight", D, 0);
    E(7, "post_attention_layernorm.weight", H, 0);
    E(8, "mlp.gate_proj.weight", I, H);
    E(9, "mlp.up_proj.weight", I, H);
    E(10, "mlp.down_proj.weight", H, I);
#undef E
}

int model_check_tensors(const Config *c, const SafeTensors *st) {
    Expect e = mk("model.embed_tokens.weight", c->vocab, c->hidden);
    if (expect_tensor(st, &e)) return -1;
    e = mk("model.norm.weight", c->hidden, 0);
    if (expect_tensor(st, &e)) return -1;
    if (st_find(st, "lm_head.weight") || !c->tied) {
        e = mk("lm_head.weight", c->vocab, c->hidden);
        if (expect_tensor(st, &e)) return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        Expect le[11];
        layer_expects(c, l, le);
        for (int i = 0; i < 11; i++)
            if (expect_tensor(st, &le[i])) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- conversion */

static float *load_vector(const SafeTensors *st, const char *name, size_t n) {
    float *v = lmc_alloc((size_t)n, sizeof(float), name);
    st_to_f32(st_find(st, name), v, n); /* checked by model_check_tensors */
    return v;
}

/* converting (f32 -> bf16) or quantising (q8) a matrix, rows split over the pool */
typedef struct {
    Mat *m;
    const StTensor *t;
    int wq;
} ConvertJob;

static void convert_rows(void *arg, int begin, int end) {
    const ConvertJob *job = arg;
    Mat *m = job->m;
    int cols = m->cols;
    float *row = lmc_alloc((size_t)cols, sizeof(float), "weight row");
    size_t esize = st_dtype_size(job->t->dtype);
    for (int r = begin; r < end; r++) {
        StTensor slice = *job->t;
        slice.data = job->t->data + (size_t)r * (size_t)cols * esize;
        slice.nbytes = (size_t)cols * esize;
        st_to_f32(&slice, row, (size_t)cols);
        if (job->wq == WQ_BF16)
            for (int j = 0; j < cols; j++) m->h[(size_t)r * (size_t)cols + (size_t)j] = lmc_f32_to_bf16(row[j]);
        else mat_quantize_row(m, r, row);
    }
    lmc_free(row);
}

static void load_mat(Mat *m, const SafeTensors *st, const char *name, int rows, int cols, int wq,
                     ThreadPool *pool) {
    memset(m, 0, sizeof *m);
    m->rows = rows;
    m->cols = cols;
    const StTensor *t = st_find(st, name);
    if (wq == WQ_F32) {
        m->f = lmc_alloc((size_t)rows * (size_t)cols, sizeof(float), name);
        st_to_f32(t, m->f, (size_t)rows * (size_t)cols);
        mat_pack(m);
        return;
    }
    if (wq == WQ_BF16 && t->dtype == ST_BF16) { /* as stored: no rounding at all */
        m->h = lmc_alloc((size_t)rows * (size_t)cols, sizeof(uint16_t), name);
        memcpy(m->h, t->data, (size_t)rows * (size_t)cols * sizeof(uint16_t));
        mat_pack(m);
        return;
    }
    if (wq == WQ_BF16) m->h = lmc_alloc((size_t)rows * (size_t)cols, sizeof(uint16_t), name);
    else mat_alloc_q8(m, rows, cols, name);
    ConvertJob job = {m, t, wq};
    pool_run(pool, convert_rows, &job, rows); /* rows are independent: same bits for any split */
    mat_pack(m);
}

int model_load(Model *m, const char *dir, int wq, ThreadPool *pool) {
    memset(m, 0, sizeof *m);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    if (lmc_read_file(path, &text, &len) != 0) return -1;
    int rc = config_parse(&m->cfg, text, len, path);
    free(text);
    if (rc != 0) return -1;
    const Config *c = &m->cfg;

    SafeTensors st;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_open(&st, path) != 0) return -1;
    if (model_check_tensors(c, &st) != 0) {
        st_close(&st);
        return -1;
    }
    const StTensor *emb = st_find(&st, "model.embed_tokens.weight");
    snprintf(m->weights_dtype, sizeof m->weights_dtype, "%s", st_dtype_name(emb->dtype));
    int H = c->hidden, D = c->head_dim, Q = c->n_heads * D, KV = c->n_kv_heads * D, I = c->intermediate;
    m->embed = load_vector(&st, "model.embed_tokens.weight", (size_t)c->vocab * (size_t)H);
    m->final_norm = load_vector(&st, "model.norm.weight", H);
    if (st_find(&st, "lm_head.weight")) {
        load_mat(&m->lm_head, &st, "lm_head.weight", c->vocab, H, wq, pool);
    } else if (wq != WQ_F32) {
        m->tied_used = 1;
        load_mat(&m->lm_head, &st, "model.embed_tokens.weight", c->vocab, H, wq, pool);
    } else {
        m->tied_used = 1;
        /* one copy serves both: the lm_head takes the embedding (packed), and embedding
         * lookups read its rows back (model_embed) */
        m->lm_head = (Mat){.rows = c->vocab, .cols = H, .f = m->embed};
        m->embed = NULL;
        mat_pack(&m->lm_head);
    }
    m->layers = lmc_alloc((size_t)c->n_layers, sizeof(Layer), "layers");
    for (int l = 0; l < c->n_layers; l++) {
        Expect e[11];
        layer_expects(c, l, e);
        Layer *L = &m->layers[l];
        L->attn_norm = load_vector(&st, e[0].name, H);
        load_mat(&L->q, &st, e[1].name, Q, H, wq, pool);
        load_mat(&L->k, &st, e[2].name, KV, H, wq, pool);
        load_mat(&L->v, &st, e[3].name, KV, H, wq, pool);
        load_mat(&L->o, &st, e[4].name, H, Q, wq, pool);
        L->q_norm = load_vector(&st, e[5].name, D);
        L->k_norm = load_vector(&st, e[6].name, D);
        L->ffn_norm = load_vector(&st, e[7].name, H);
        load_mat(&L->gate, &st, e[8].name, I, H, wq, pool);
        load_mat(&L->up, &st, e[9].name, I, H, wq, pool);
        load_mat(&L->down, &st, e[10].name, H, I, wq, pool);
    }
    st_close(&st);
    return 0;
}

void model_free(Model *m) {
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        Layer *L = &m->layers[l];
        lmc_free(L->attn_norm);
        lmc_free(L->ffn_norm);
        lmc_free(L->q_norm);
        lmc_free(L->k_norm);
        Mat *mats[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++) mat_free(mats[i]);
    }
    lmc_free(m->layers);
    mat_free(&m->lm_head);
    lmc_free(m->embed);
    lmc_free(m->final_norm);
    memset(m, 0, sizeof *m);
}
