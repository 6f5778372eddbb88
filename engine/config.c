/* config.c — config.json into a Config: the architecture and its switches, validated.
 *
 * Both the older form (top-level rope_theta, rope_scaling, torch_dtype) and transformers 5's
 * (rope_parameters {"rope_theta", "rope_type", ...}, dtype) are read. Architectures:
 *   qwen3     — per-head q_norm/k_norm before RoPE
 *   qwen3_vl  — the Qwen3 text tower of Qwen3-VL: its config under "text_config", its tensors
 *               under "model.language_model."; multimodal RoPE gives every section the same
 *               position on text-only input, which is ordinary RoPE (the vision tower is not run)
 *   llama     — no q/k norm; RoPE "default" or Llama 3's "llama3" frequency scaling
 *   minicpm   — llama plus scale_emb (embeddings), scale_depth / sqrt(layers) (each residual
 *               branch) and hidden_size / dim_model_base (divides the final hidden state) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "model.h"
#include "util.h"

static const struct {
    const char *name;
    Arch arch;
    int qk_norm;
    const char *prefix; /* of the text model's tensors */
    int tied;           /* tie_word_embeddings when config.json does not say (the config class's
                         * default: MiniCPM's is true, and its 2B checkpoint has no lm_head) */
} ARCHS[] = {
    {"qwen3", ARCH_QWEN3, 1, "model.", 0},
    {"qwen3_vl", ARCH_QWEN3_VL, 1, "model.language_model.", 0},
    {"llama", ARCH_LLAMA, 0, "model.", 0},
    {"minicpm", ARCH_MINICPM, 0, "model.", 1},
};
#define N_ARCHS (sizeof ARCHS / sizeof ARCHS[0])
#define ALLOWED_ARCHS "qwen3, qwen3_vl, llama, minicpm"

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

/* a number in [lo, hi]: the values that keep every derived float finite (a rope_theta of
 * 1e-320 made the frequencies infinite; an rms_norm_eps of 1e39 is infinite as a float) */
static int get_bounded(const JsonValue *obj, const char *key, double lo, double hi, const char *path,
                       double *out) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_NUMBER || !(v->number >= lo && v->number <= hi)) {
        lmc_set_error("%s: '%s' must be a number in [%g, %g]", path, key, lo, hi);
        return -1;
    }
    *out = v->number;
    return 0;
}

/* the bounds of the scaling factors (RoPE's, MiniCPM's): far beyond any model's, and floats */
#define FACTOR_MIN 1e-6
#define FACTOR_MAX 1e6

static int is_true(const JsonValue *obj, const char *key) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type == JSON_BOOL && v->boolean;
}

/* mixture-of-experts models are refused by name: lmc has no expert routing */
static int refuse_moe(const JsonValue *obj, const char *model_type, const char *path) {
    if (model_type && strstr(model_type, "moe")) {
        lmc_set_error("%s: model_type '%.40s' is a mixture-of-experts model, which lmc does not run "
                      "(allowed: " ALLOWED_ARCHS ")", path, model_type);
        return -1;
    }
    const char *keys[] = {"num_experts", "num_local_experts", "n_routed_experts"};
    for (int i = 0; i < 3; i++) {
        const JsonValue *v = json_get(obj, keys[i]);
        if (v && v->type == JSON_NUMBER && v->number > 0) {
            lmc_set_error("%s: '%s' = %g: mixture-of-experts models are not supported (lmc runs "
                          "dense models)", path, keys[i], v->number);
            return -1;
        }
    }
    return 0;
}

static const JsonValue *rope_object(const JsonValue *obj, const char *key, const char *path, int *bad) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type == JSON_NULL) return NULL;
    if (v->type != JSON_OBJECT) {
        lmc_set_error("%s: '%s' must be an object", path, key);
        *bad = 1;
    }
    return v;
}

static const JsonValue *type_of(const JsonValue *rope, const char **key) {
    const char *keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        const JsonValue *t = rope ? json_get(rope, keys[i]) : NULL;
        if (t) {
            *key = keys[i];
            return t;
        }
    }
    return NULL;
}

/* theta and the frequency scaling: "default" (none) or Llama 3's "llama3" */
static int parse_rope(Config *c, const JsonValue *tc, const char *path) {
    int bad = 0;
    const JsonValue *rp = rope_object(tc, "rope_parameters", path, &bad);
    const JsonValue *rs = bad ? NULL : rope_object(tc, "rope_scaling", path, &bad);
    if (bad) return -1;
    if (rp && json_get(rp, "rope_theta")) {
        if (get_bounded(rp, "rope_theta", 1.0, 1e30, path, &c->rope_theta)) return -1;
    } else if (json_get(tc, "rope_theta")) {
        if (get_bounded(tc, "rope_theta", 1.0, 1e30, path, &c->rope_theta)) return -1;
    } else {
        lmc_set_error("%s: missing key 'rope_theta' (top level or in rope_parameters)", path);
        return -1;
    }
    /* transformers 5 keeps the scaling in rope_parameters; older files in rope_scaling */
    const char *tkey = NULL, *where = "rope_parameters";
    const JsonValue *scaling = rp, *t = type_of(rp, &tkey);
    if (!t && rs) {
        scaling = rs;
        where = "rope_scaling";
        t = type_of(rs, &tkey);
    }
    const char *type = t && t->type == JSON_STRING ? t->string : "default";
    if (t && t->type != JSON_STRING) {
        lmc_set_error("%s: %s.%s must be a string", path, where, tkey);
        return -1;
    }
    snprintf(c->rope_type, sizeof c->rope_type, "%.15s", type);
    if (strcmp(type, "default") == 0) return 0;
    if (strcmp(type, "llama3") != 0) {
        lmc_set_error("%s: %s.%s '%.40s' is not supported (allowed: default, llama3)", path, where,
                      tkey, type);
        return -1;
    }
    if (get_bounded(scaling, "factor", FACTOR_MIN, FACTOR_MAX, path, &c->rope_factor) ||
        get_bounded(scaling, "low_freq_factor", FACTOR_MIN, FACTOR_MAX, path, &c->rope_low_freq) ||
        get_bounded(scaling, "high_freq_factor", FACTOR_MIN, FACTOR_MAX, path, &c->rope_high_freq) ||
        get_int(scaling, "original_max_position_embeddings", 1, 0, 1, 1 << 24, path, &c->rope_orig_max))
        return -1;
    if (!(c->rope_high_freq > c->rope_low_freq)) {
        lmc_set_error("%s: %s: high_freq_factor must be above low_freq_factor", path, where);
        return -1;
    }
    c->rope_llama3 = 1;
    return 0;
}

/* the text model's shape, norms, RoPE, embeddings tie (tied: the default) and activation */
static int parse_text(Config *c, const JsonValue *tc, int tied, const char *path) {
    if (get_int(tc, "hidden_size", 1, 0, 1, 65536, path, &c->hidden) ||
        get_int(tc, "intermediate_size", 1, 0, 1, 1 << 20, path, &c->intermediate) ||
        get_int(tc, "num_hidden_layers", 1, 0, 1, 1024, path, &c->n_layers) ||
        get_int(tc, "num_attention_heads", 1, 0, 1, 1024, path, &c->n_heads) ||
        get_int(tc, "vocab_size", 1, 0, 1, 1 << 22, path, &c->vocab) ||
        get_int(tc, "max_position_embeddings", 1, 0, 1, 1 << 24, path, &c->max_pos))
        return -1;
    if (get_int(tc, "num_key_value_heads", 0, c->n_heads, 1, 1024, path, &c->n_kv_heads) ||
        get_int(tc, "head_dim", 0, c->hidden / c->n_heads, 2, LMC_MAX_HEAD_DIM, path, &c->head_dim))
        return -1;
    if (c->head_dim % 2 != 0 || c->head_dim < 2) {
        lmc_set_error("%s: 'head_dim' %d must be even (RoPE rotates pairs)", path, c->head_dim);
        return -1;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        lmc_set_error("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                      path, c->n_heads, c->n_kv_heads);
        return -1;
    }
    double d = 1e-6;
    if (json_get(tc, "rms_norm_eps") && get_bounded(tc, "rms_norm_eps", 1e-30, 1.0, path, &d)) return -1;
    c->rms_eps = (float)d;
    if (parse_rope(c, tc, path)) return -1;
    const JsonValue *tie = json_get(tc, "tie_word_embeddings");
    if (tie && tie->type != JSON_BOOL) {
        lmc_set_error("%s: 'tie_word_embeddings' must be true or false", path);
        return -1;
    }
    c->tied = tie ? tie->boolean : tied;
    const char *biases[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++)
        if (is_true(tc, biases[i])) {
            lmc_set_error("%s: %s=true is not supported (lmc's projections have no bias)", path,
                          biases[i]);
            return -1;
        }
    const JsonValue *act = json_get(tc, "hidden_act");
    if (act && (act->type != JSON_STRING || strcmp(act->string, "silu") != 0)) {
        lmc_set_error("%s: hidden_act must be \"silu\"", path);
        return -1;
    }
    return 0;
}

/* MiniCPM's three scaling factors, all required */
static int parse_minicpm(Config *c, const JsonValue *root, const char *path) {
    double scale_emb, scale_depth, dim_base;
    if (get_bounded(root, "scale_emb", FACTOR_MIN, FACTOR_MAX, path, &scale_emb) ||
        get_bounded(root, "scale_depth", FACTOR_MIN, FACTOR_MAX, path, &scale_depth) ||
        get_bounded(root, "dim_model_base", FACTOR_MIN, FACTOR_MAX, path, &dim_base))
        return -1;
    /* as MiniCPM's modelling code: python doubles, applied to float32 tensors */
    c->embed_scale = (float)scale_emb;
    c->residual_scale = (float)(scale_depth / sqrt((double)c->n_layers));
    c->logit_div = (float)((double)c->hidden / dim_base);
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
    if (mt && mt->type != JSON_STRING) {
        lmc_set_error("%s: model_type must be a string (allowed: " ALLOWED_ARCHS ")", path);
        goto done;
    }
    const char *type = mt ? mt->string : "qwen3"; /* files without one are read as Qwen3 */
    if (refuse_moe(root, type, path)) goto done;
    size_t a = 0;
    while (a < N_ARCHS && strcmp(ARCHS[a].name, type) != 0) a++;
    if (a == N_ARCHS) {
        lmc_set_error("%s: model_type '%.40s' is not supported (allowed: " ALLOWED_ARCHS ")", path, type);
        goto done;
    }
    c->arch = ARCHS[a].arch;
    c->qk_norm = ARCHS[a].qk_norm;
    snprintf(c->model_type, sizeof c->model_type, "%s", ARCHS[a].name);
    snprintf(c->prefix, sizeof c->prefix, "%s", ARCHS[a].prefix);
    c->embed_scale = c->residual_scale = c->logit_div = 1.0f;
    const JsonValue *tc = root;
    if (c->arch == ARCH_QWEN3_VL) {
        tc = json_get(root, "text_config");
        if (!tc || tc->type != JSON_OBJECT) {
            lmc_set_error("%s: model_type qwen3_vl needs the object 'text_config'", path);
            goto done;
        }
        if (refuse_moe(tc, NULL, path)) goto done;
    }
    if (parse_text(c, tc, ARCHS[a].tied, path)) goto done;
    if (tc != root && is_true(root, "tie_word_embeddings")) c->tied = 1;
    if (c->arch == ARCH_MINICPM && parse_minicpm(c, root, path)) goto done;
    const JsonValue *dt = json_get(root, "dtype");
    if (!dt) dt = json_get(root, "torch_dtype");
    snprintf(c->dtype, sizeof c->dtype, "%s", dt && dt->type == JSON_STRING ? dt->string : "unknown");
    rc = 0;
done:
    json_free(root);
    return rc;
}
