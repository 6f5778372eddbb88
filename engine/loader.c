/* loader.c — config.json (config.c) and the checkpoint (checkpoint.c) into a Model.
 *
 * Tensors are checked by name, dtype and shape against the config before any is converted.
 * Names are the text model's prefix (Config.prefix) + the Llama/Qwen3 layout; tensors outside
 * it (Qwen3-VL's vision tower) are not read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"
#include "util.h"

/* ---------------------------------------------------------------- tensor checks */

typedef struct {
    char name[96];
    int64_t rows, cols; /* cols = 0: a vector of `rows` */
} Expect;

static int expect_tensor(const Checkpoint *ck, const Expect *e) {
    const StTensor *t = ckpt_find(ck, e->name);
    if (!t) {
        lmc_set_error("%s: missing tensor '%s'", ck->path, e->name);
        return -1;
    }
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16) {
        lmc_set_error("%s: tensor '%s' has unsupported dtype %s (allowed: F32, BF16, F16)",
                      ck->path, e->name, st_dtype_name(t->dtype));
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
            lmc_set_error("%s: tensor '%s' has shape [%s], config needs [%lld, %lld]", ck->path,
                          e->name, got, (long long)e->rows, (long long)e->cols);
        else
            lmc_set_error("%s: tensor '%s' has shape [%s], config needs [%lld]", ck->path, e->name,
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

/* the per-layer tensors: suffix, rows, cols (0 = vector); q_norm and k_norm (5, 6) only
 * exist with qk_norm */
static void layer_expects(const Config *c, int l, Expect out[11]) {
    int64_t H = c->hidden, D = c->head_dim, q = (int64_t)c->n_heads * D, kv = (int64_t)c->n_kv_heads * D;
    int64_t I = c->intermediate;
    char p[64];
    snprintf(p, sizeof p, "%slayers.%d.", c->prefix, l);
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

static Expect named(const Config *c, const char *suffix, int64_t rows, int64_t cols) {
    char n[96];
    snprintf(n, sizeof n, "%s%s", c->prefix, suffix);
    return mk(n, rows, cols);
}

static int is_qk_norm(int i) { return i == 5 || i == 6; }

int model_check_tensors(const Config *c, const Checkpoint *ck) {
    Expect e = named(c, "embed_tokens.weight", c->vocab, c->hidden);
    if (expect_tensor(ck, &e)) return -1;
    e = named(c, "norm.weight", c->hidden, 0);
    if (expect_tensor(ck, &e)) return -1;
    if (ckpt_find(ck, "lm_head.weight") || !c->tied) {
        e = mk("lm_head.weight", c->vocab, c->hidden);
        if (expect_tensor(ck, &e)) return -1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        Expect le[11];
        layer_expects(c, l, le);
        for (int i = 0; i < 11; i++)
            if ((c->qk_norm || !is_qk_norm(i)) && expect_tensor(ck, &le[i])) return -1;
    }
    return 0;
}

/* a multimodal checkpoint holds more than the text model: say what is left unused */
static void note_unused(const Config *c, const Checkpoint *ck, const char *dir) {
    if (c->arch != ARCH_QWEN3_VL) return;
    size_t plen = strlen(c->prefix);
    int unused = 0;
    for (int s = 0; s < ck->n_shards; s++)
        for (int t = 0; t < ck->shards[s].count; t++) {
            const char *name = ck->shards[s].tensors[t].name;
            unused += strncmp(name, c->prefix, plen) != 0 && strcmp(name, "lm_head.weight") != 0;
        }
    if (unused)
        fprintf(stderr, "lmc: note: %s: %d tensors outside %s* (the vision tower) are ignored; "
                        "lmc runs the text model on token ids only\n", dir, unused, c->prefix);
}

/* ---------------------------------------------------------------- conversion */

/* Tensors are converted a chunk of the file at a time, and each chunk's mapped pages are given
 * back as soon as it is converted (ckpt_release): the loader's peak is the weights as they stay
 * resident plus one chunk, not plus the whole checkpoint (which the mapping would otherwise
 * keep resident until ckpt_close). */
#define LOAD_CHUNK_BYTES ((size_t)1 << 20)

static void convert_f32(const Checkpoint *ck, const StTensor *t, float *out, size_t n) {
    size_t esize = st_dtype_size(t->dtype), step = LOAD_CHUNK_BYTES / esize;
    for (size_t i = 0; i < n; i += step) {
        StTensor slice = *t;
        size_t count = n - i < step ? n - i : step;
        slice.data = t->data + i * esize;
        slice.nbytes = count * esize;
        st_to_f32(&slice, out + i, count); /* sizes checked by model_check_tensors */
        ckpt_release(ck, slice.data, slice.nbytes);
    }
}

static float *load_vector(const Checkpoint *ck, const char *name, size_t n) {
    float *v = lmc_alloc((size_t)n, sizeof(float), name);
    convert_f32(ck, ckpt_find(ck, name), v, n);
    return v;
}

/* n 16-bit values of a bf16 or f16 tensor, copied as stored */
static uint16_t *load_as_stored(const Checkpoint *ck, const StTensor *t, size_t n, const char *name) {
    uint16_t *out = lmc_alloc(n, sizeof(uint16_t), name);
    size_t bytes = n * sizeof(uint16_t);
    for (size_t off = 0; off < bytes; off += LOAD_CHUNK_BYTES) {
        size_t len = bytes - off < LOAD_CHUNK_BYTES ? bytes - off : LOAD_CHUNK_BYTES;
        memcpy((uint8_t *)out + off, t->data + off, len);
        ckpt_release(ck, t->data + off, len);
    }
    return out;
}

/* converting (f32 -> bf16) or quantising (q8) rows first.. of a matrix, split over the pool */
typedef struct {
    Mat *m;
    const StTensor *t;
    int wq;
    int first;
} ConvertJob;

static void convert_rows(void *arg, int begin, int end) {
    const ConvertJob *job = arg;
    Mat *m = job->m;
    int cols = m->cols;
    float *row = lmc_alloc((size_t)cols, sizeof(float), "weight row");
    size_t esize = st_dtype_size(job->t->dtype);
    for (int r = job->first + begin; r < job->first + end; r++) {
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

static void load_mat(Mat *m, const Checkpoint *ck, const char *name, int rows, int cols, int wq,
                     ThreadPool *pool) {
    memset(m, 0, sizeof *m);
    m->rows = rows;
    m->cols = cols;
    const StTensor *t = ckpt_find(ck, name);
    size_t n = (size_t)rows * (size_t)cols;
    if (wq == WQ_F32) {
        m->f = lmc_alloc(n, sizeof(float), name);
        convert_f32(ck, t, m->f, n);
        mat_pack(m);
        return;
    }
    if (wq == WQ_BF16 && t->dtype == ST_BF16) { /* as stored: no rounding at all */
        m->h = load_as_stored(ck, t, n, name);
        mat_pack(m);
        return;
    }
    if (wq == WQ_BF16) m->h = lmc_alloc(n, sizeof(uint16_t), name);
    else mat_alloc_q8(m, rows, cols, name);
    size_t row_bytes = (size_t)cols * st_dtype_size(t->dtype);
    int step = row_bytes >= LOAD_CHUNK_BYTES ? 1 : (int)(LOAD_CHUNK_BYTES / row_bytes);
    for (int first = 0; first < rows; first += step) {
        int count = rows - first < step ? rows - first : step;
        ConvertJob job = {m, t, wq, first};
        pool_run(pool, convert_rows, &job, count); /* rows are independent: same bits for any split */
        ckpt_release(ck, t->data + (size_t)first * row_bytes, (size_t)count * row_bytes);
    }
    mat_pack(m);
}

int model_load(Model *m, const char *dir, int wq, ThreadPool *pool) {
    memset(m, 0, sizeof *m);
    m->embed_fd = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    if (lmc_read_file(path, &text, &len) != 0) return -1;
    int rc = config_parse(&m->cfg, text, len, path);
    free(text);
    if (rc != 0) return -1;
    const Config *c = &m->cfg;

    Checkpoint ck;
    if (ckpt_open(&ck, dir) != 0) return -1;
    if (model_check_tensors(c, &ck) != 0) {
        ckpt_close(&ck);
        return -1;
    }
    note_unused(c, &ck, dir);
    Expect emb = named(c, "embed_tokens.weight", c->vocab, c->hidden);
    Expect norm = named(c, "norm.weight", c->hidden, 0);
    const StTensor *et = ckpt_find(&ck, emb.name);
    snprintf(m->weights_dtype, sizeof m->weights_dtype, "%s", st_dtype_name(et->dtype));
    int H = c->hidden, D = c->head_dim, Q = c->n_heads * D, KV = c->n_kv_heads * D, I = c->intermediate;
    /* the embedding table stays in the file: a looked-up row is read from it (model_embed) */
    m->embed_fd = ckpt_tensor_file(&ck, et, &m->embed_offset, m->embed_file, sizeof m->embed_file);
    if (m->embed_fd < 0) {
        ckpt_close(&ck);
        return -1;
    }
    m->embed_dtype = et->dtype;
    ckpt_read_begin(&ck);
    m->final_norm = load_vector(&ck, norm.name, H);
    m->tied_used = !ckpt_find(&ck, "lm_head.weight");
    load_mat(&m->lm_head, &ck, m->tied_used ? emb.name : "lm_head.weight", c->vocab, H, wq, pool);
    m->layers = lmc_alloc((size_t)c->n_layers, sizeof(Layer), "layers");
    for (int l = 0; l < c->n_layers; l++) {
        Expect e[11];
        layer_expects(c, l, e);
        Layer *L = &m->layers[l];
        L->attn_norm = load_vector(&ck, e[0].name, H);
        load_mat(&L->q, &ck, e[1].name, Q, H, wq, pool);
        load_mat(&L->k, &ck, e[2].name, KV, H, wq, pool);
        load_mat(&L->v, &ck, e[3].name, KV, H, wq, pool);
        load_mat(&L->o, &ck, e[4].name, H, Q, wq, pool);
        if (c->qk_norm) {
            L->q_norm = load_vector(&ck, e[5].name, D);
            L->k_norm = load_vector(&ck, e[6].name, D);
        }
        L->ffn_norm = load_vector(&ck, e[7].name, H);
        load_mat(&L->gate, &ck, e[8].name, I, H, wq, pool);
        load_mat(&L->up, &ck, e[9].name, I, H, wq, pool);
        load_mat(&L->down, &ck, e[10].name, H, I, wq, pool);
    }
    rc = ckpt_read_end(&ck);
    ckpt_close(&ck);
    if (rc) model_free(m);
    return rc;
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
    lmc_free(m->final_norm);
    if (m->embed_fd >= 0) close(m->embed_fd);
    memset(m, 0, sizeof *m);
    m->embed_fd = -1;
}

size_t model_weight_bytes(const Model *m) {
    const Config *c = &m->cfg;
    size_t H = (size_t)c->hidden, vectors = H; /* the final norm */
    size_t total = mat_bytes(&m->lm_head);
    for (int l = 0; m->layers && l < c->n_layers; l++) {
        const Layer *L = &m->layers[l];
        const Mat *mats[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; i++) total += mat_bytes(mats[i]);
        vectors += 2 * H + (c->qk_norm ? 2 * (size_t)c->head_dim : 0);
    }
    return total + vectors * sizeof(float);
}
