/* fuzz_loader.c — libFuzzer target for the parsers that read untrusted files:
 * config.json (json.c + config.c), the safetensors header (safetensors.c), a sharded
 * checkpoint's index (checkpoint.c), plus the tensor checks against the parsed config, and
 * the attention predictor's text file (predictor.c).
 *
 * The first input byte picks what the rest is: odd -> config.json text; 2 mod 4 ->
 * model.safetensors.index.json text (its shards are looked for in a directory that does not
 * exist, so no file is opened); 4 mod 8 -> a predictor file, whose loaded trees are then
 * evaluated on a fixed feature row; 0 mod 8 -> a safetensors file image checked against a
 * fixed small config. Build and run: see engine/README.md. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../model.h"
#include "../checkpoint.h"
#include "../predictor.h"

/* parse a predictor file; every accepted one must evaluate in bounds to a finite value */
static void fuzz_predictor(const uint8_t *body, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return;
    memcpy(text, body, n);
    text[n] = '\0';
    Gbm g;
    if (gbm_parse(&g, text, "fuzz/predictor.gbm") == 0) {
        float x[GBM_MAX_FEATURES];
        for (int i = 0; i < GBM_MAX_FEATURES; i++) x[i] = i % 3 ? (float)i : NAN;
        for (int l = 0; l < g.n_layers; l++)
            if (!isfinite(gbm_predict(&g, l, x))) __builtin_trap();
        gbm_free(&g);
    }
    free(text);
}

static const char CONFIG[] =
    "{\"model_type\": \"qwen3\", \"hidden_size\": 8, \"intermediate_size\": 16, "
    "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
    "\"head_dim\": 4, \"vocab_size\": 16, \"max_position_embeddings\": 64, "
    "\"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}, "
    "\"tie_word_embeddings\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t *body = data + 1;
    size_t n = size - 1;
    Config config;
    if (data[0] & 1) {
        config_parse(&config, (const char *)body, n, "fuzz/config.json");
        return 0;
    }
    if ((data[0] & 3) == 2) {
        Checkpoint index;
        ckpt_open_index(&index, "/nonexistent/lmc-fuzz", (const char *)body, n,
                        "fuzz/model.safetensors.index.json");
        return 0;
    }
    if ((data[0] & 7) == 4) {
        fuzz_predictor(body, n);
        return 0;
    }
    if (config_parse(&config, CONFIG, sizeof CONFIG - 1, "fixed config") != 0) __builtin_trap();
    SafeTensors st;
    if (st_parse(&st, body, n, "fuzz/model.safetensors") != 0) return 0;
    Checkpoint ck = {.shards = &st, .n_shards = 1, .path = "fuzz/model.safetensors"};
    if (model_check_tensors(&config, &ck) == 0) {
        /* every tensor that passed the checks must convert without reading out of bounds */
        float buf[256];
        for (int i = 0; i < st.count; i++) {
            const StTensor *t = &st.tensors[i];
            size_t esize = st_dtype_size(t->dtype);
            size_t count = esize ? t->nbytes / esize : 0;
            if (count <= 256) st_to_f32(t, buf, count);
        }
    }
    st_close(&st);
    return 0;
}
