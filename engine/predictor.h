/* predictor.h — a gradient-boosted tree ensemble per layer (seed 004's attention predictor),
 * trained in Python (harness/predictor) and evaluated here.
 *
 * File (text, written by harness.predictor.export; floats as C99 hex so nothing is rounded):
 *   lmc-gbm 1
 *   features N name_0 ... name_{N-1}        key features the trees read, by name (keyfeat.h)
 *   layers L
 *   then per layer:  layer l baseline B trees T
 *     and per tree:  tree M
 *       M nodes:     feature threshold left right is_leaf value missing_left
 * A node sends x to `left` when x <= threshold (or, for NaN, when missing_left), else to
 * `right`; children come after their parent (index > parent), so every walk ends. The
 * prediction is B + the leaf values, summed in tree order in double: the same operations as
 * scikit-learn's HistGradientBoostingRegressor. Its thresholds are doubles; the exporter
 * stores the largest float not above each, so for a float feature x `x <= threshold` decides
 * exactly as scikit-learn's `double(x) <= threshold` does: bit-identical predictions. */
#ifndef LMC_PREDICTOR_H
#define LMC_PREDICTOR_H

/* the largest magnitude of a baseline, threshold or leaf value: 2^20 trees of them still sum to
 * a finite double; nan and inf are refused (file, line and field named) */
#define GBM_MAX_VALUE 1e30

/* the most features one predictor reads (a stack row per key) */
#define GBM_MAX_FEATURES 256

typedef struct {
    int feature, left, right, leaf, missing_left;
    float threshold;
    double value;
} GbmNode;

typedef struct {
    double baseline;
    int n_trees;
    int *tree_start; /* [n_trees + 1] into nodes */
    GbmNode *nodes;
} GbmLayer;

typedef struct {
    int n_features, n_layers;
    char **names; /* [n_features] */
    GbmLayer *layers;
} Gbm;

/* -1 + lmc_set_error naming the file and line on a malformed file */
int gbm_load(Gbm *g, const char *path);
/* parse a predictor file's NUL-terminated text (modified in place); path names it in errors */
int gbm_parse(Gbm *g, char *text, const char *path);
void gbm_free(Gbm *g);
/* the raw prediction of one layer's ensemble for x[n_features] */
double gbm_predict(const Gbm *g, int layer, const float *x);

#endif
