/* cmd_predict.c — `lmc predict`: one layer's predictor over rows of features from a file, so the
 * tests can hold the C trees against scikit-learn's on the same inputs, bit for bit.
 * --inputs: little-endian f32 rows of the predictor's n_features columns (in its order);
 * --dump-out: the raw predictions, f64, one per row. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "predictor.h"
#include "util.h"

int cmd_predict(const Options *o) {
    if (!o->predictor || !o->inputs || !o->dump_out)
        lmc_die_input("predict needs --predictor FILE, --inputs FILE and --dump-out FILE");
    Gbm g;
    if (gbm_load(&g, o->predictor) != 0) lmc_die_input("%s", lmc_last_error());
    if (o->layer >= g.n_layers)
        lmc_die_input("--layer %d: --predictor %s has %d layers", o->layer, o->predictor, g.n_layers);
    char *data;
    size_t len, row_bytes = sizeof(float) * (size_t)g.n_features;
    if (lmc_read_file(o->inputs, &data, &len) != 0) lmc_die_input("%s", lmc_last_error());
    if (len % row_bytes)
        lmc_die_input("--inputs %s has %zu bytes, not a whole number of rows of %d f32 features", o->inputs, len,
                      g.n_features);
    size_t rows = len / row_bytes;
    FILE *out = fopen(o->dump_out, "wb");
    if (!out) lmc_die_input("cannot write --dump-out file %s: %s", o->dump_out, strerror(errno));
    float x[GBM_MAX_FEATURES];
    for (size_t r = 0; r < rows; r++) {
        memcpy(x, data + r * row_bytes, row_bytes);
        double y = gbm_predict(&g, o->layer, x);
        if (fwrite(&y, sizeof y, 1, out) != 1) lmc_die_runtime("cannot write --dump-out file %s", o->dump_out);
    }
    if (fclose(out) != 0) lmc_die_runtime("cannot write --dump-out file %s", o->dump_out);
    printf("{\"schema\": \"%s\", \"command\": \"predict\", \"layer\": %d, \"features\": %d, \"rows\": %zu}\n",
           LMC_SCHEMA, o->layer, g.n_features, rows);
    free(data);
    gbm_free(&g);
    return 0;
}
