/* predictor.c — see predictor.h */
#include "predictor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* a parse cursor over the whole file: tokens are separated by white space */
typedef struct {
    const char *path;
    char *text;
    char *at;
    int line;     /* the line the cursor is on */
    int tok_line; /* the line of the last token read (what errors name) */
} Cursor;

static char *next_token(Cursor *c) {
    while (*c->at == ' ' || *c->at == '\t' || *c->at == '\n' || *c->at == '\r') {
        if (*c->at == '\n') c->line++;
        c->at++;
    }
    c->tok_line = c->line;
    if (!*c->at) return NULL;
    char *tok = c->at;
    while (*c->at && *c->at != ' ' && *c->at != '\t' && *c->at != '\n' && *c->at != '\r') c->at++;
    if (*c->at) {
        if (*c->at == '\n') c->line++;
        *c->at++ = '\0';
    }
    return tok;
}

static int expect_word(Cursor *c, const char *word) {
    char *t = next_token(c);
    if (!t || strcmp(t, word) != 0) {
        lmc_set_error("--predictor %s: line %d: expected '%s', got '%.32s'", c->path, c->tok_line, word, t ? t : "end of file");
        return -1;
    }
    return 0;
}

static int read_int(Cursor *c, const char *what, int lo, int hi, int *out) {
    char *t = next_token(c), *end;
    long v = t ? strtol(t, &end, 10) : 0;
    if (!t || *end || v < lo || v > hi) {
        lmc_set_error("--predictor %s: line %d: %s must be an integer in [%d, %d], got '%.32s'", c->path, c->tok_line,
                      what, lo, hi, t ? t : "end of file");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* a finite number of magnitude at most GBM_MAX_VALUE: nan, inf and values whose sum over the
 * trees could overflow would make every prediction meaningless */
static int read_double(Cursor *c, const char *what, double *out) {
    char *t = next_token(c), *end;
    double v = t ? strtod(t, &end) : 0.0;
    if (!t || *end) {
        lmc_set_error("--predictor %s: line %d: %s must be a number, got '%.32s'", c->path, c->tok_line, what,
                      t ? t : "end of file");
        return -1;
    }
    if (!(fabs(v) <= GBM_MAX_VALUE)) {
        lmc_set_error("--predictor %s: line %d: %s must be a finite number of magnitude at most %g, got '%.32s'",
                      c->path, c->tok_line, what, GBM_MAX_VALUE, t);
        return -1;
    }
    *out = v;
    return 0;
}

/* one node; its children must come after it and inside the tree */
static int read_node(Cursor *c, GbmNode *n, int index, int n_nodes, int n_features) {
    double thr, value;
    if (read_int(c, "node feature", 0, n_features - 1, &n->feature) || read_double(c, "node threshold", &thr) ||
        read_int(c, "node left", 0, n_nodes - 1, &n->left) || read_int(c, "node right", 0, n_nodes - 1, &n->right) ||
        read_int(c, "node is_leaf", 0, 1, &n->leaf) || read_double(c, "node value", &value) ||
        read_int(c, "node missing_left", 0, 1, &n->missing_left))
        return -1;
    if (!n->leaf && (n->left <= index || n->right <= index)) {
        lmc_set_error("--predictor %s: line %d: node %d has a child at or before itself", c->path, c->tok_line, index);
        return -1;
    }
    /* exact: the exporter wrote a float value (the largest float not above the split) */
    n->threshold = (float)thr;
    if ((double)n->threshold != thr) {
        lmc_set_error("--predictor %s: line %d: threshold %.17g is not a float32 value", c->path, c->tok_line, thr);
        return -1;
    }
    n->value = value;
    return 0;
}

static int read_layer(Cursor *c, GbmLayer *L, int l, int n_features) {
    int index;
    if (expect_word(c, "layer") || read_int(c, "layer index", l, l, &index) || expect_word(c, "baseline") ||
        read_double(c, "baseline", &L->baseline) || expect_word(c, "trees") ||
        read_int(c, "tree count", 0, 1 << 20, &L->n_trees))
        return -1;
    L->tree_start = lmc_alloc((size_t)L->n_trees + 1, sizeof(int), "predictor trees");
    size_t cap = 64, used = 0;
    L->nodes = lmc_alloc(cap, sizeof(GbmNode), "predictor nodes");
    for (int t = 0; t < L->n_trees; t++) {
        int n_nodes;
        if (expect_word(c, "tree") || read_int(c, "node count", 1, 1 << 20, &n_nodes)) return -1;
        L->tree_start[t] = (int)used;
        if (used + (size_t)n_nodes > cap) {
            while (used + (size_t)n_nodes > cap) cap *= 2;
            GbmNode *grown = lmc_alloc(cap, sizeof(GbmNode), "predictor nodes");
            memcpy(grown, L->nodes, used * sizeof(GbmNode));
            lmc_free(L->nodes);
            L->nodes = grown;
        }
        for (int i = 0; i < n_nodes; i++)
            if (read_node(c, &L->nodes[used + (size_t)i], i, n_nodes, n_features)) return -1;
        used += (size_t)n_nodes;
    }
    L->tree_start[L->n_trees] = (int)used;
    return 0;
}

int gbm_load(Gbm *g, const char *path) {
    memset(g, 0, sizeof *g);
    char *text;
    size_t len;
    if (lmc_read_file(path, &text, &len) != 0) {
        char why[512]; /* the error names the path already */
        snprintf(why, sizeof why, "%s", lmc_last_error());
        lmc_set_error("--predictor: %s", why);
        return -1;
    }
    int rc = gbm_parse(g, text, path);
    free(text);
    return rc;
}

int gbm_parse(Gbm *g, char *text, const char *path) {
    memset(g, 0, sizeof *g);
    Cursor c = {path, text, text, 1, 1};
    int version, rc = -1;
    if (expect_word(&c, "lmc-gbm") || read_int(&c, "format version", 1, 1, &version) || expect_word(&c, "features") ||
        read_int(&c, "feature count", 1, GBM_MAX_FEATURES, &g->n_features))
        goto done;
    g->names = lmc_alloc((size_t)g->n_features, sizeof(char *), "predictor feature names");
    for (int i = 0; i < g->n_features; i++) {
        char *name = next_token(&c);
        if (!name) {
            lmc_set_error("--predictor %s: %d feature names expected, file ends", path, g->n_features);
            goto done;
        }
        g->names[i] = lmc_alloc(strlen(name) + 1, 1, "predictor feature names");
        memcpy(g->names[i], name, strlen(name));
    }
    if (expect_word(&c, "layers") || read_int(&c, "layer count", 1, 4096, &g->n_layers)) goto done;
    g->layers = lmc_alloc((size_t)g->n_layers, sizeof(GbmLayer), "predictor layers");
    for (int l = 0; l < g->n_layers; l++)
        if (read_layer(&c, &g->layers[l], l, g->n_features)) goto done;
    if (next_token(&c)) {
        lmc_set_error("--predictor %s: line %d: unexpected text after the last layer", path, c.tok_line);
        goto done;
    }
    rc = 0;
done:
    if (rc) gbm_free(g);
    return rc;
}

void gbm_free(Gbm *g) {
    for (int i = 0; g->names && i < g->n_features; i++) lmc_free(g->names[i]);
    lmc_free(g->names);
    for (int l = 0; g->layers && l < g->n_layers; l++) {
        lmc_free(g->layers[l].tree_start);
        lmc_free(g->layers[l].nodes);
    }
    lmc_free(g->layers);
    memset(g, 0, sizeof *g);
}

double gbm_predict(const Gbm *g, int layer, const float *x) {
    const GbmLayer *L = &g->layers[layer];
    double sum = 0.0;
    sum += L->baseline; /* scikit-learn starts from zeros and adds the baseline */
    for (int t = 0; t < L->n_trees; t++) {
        const GbmNode *nodes = L->nodes + L->tree_start[t];
        int i = 0;
        while (!nodes[i].leaf) {
            float v = x[nodes[i].feature];
            int left = isnan(v) ? nodes[i].missing_left : v <= nodes[i].threshold;
            i = left ? nodes[i].left : nodes[i].right;
        }
        sum += nodes[i].value;
    }
    return sum;
}
