/* keyfeat.c — see keyfeat.h */
#include "keyfeat.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ops.h"
#include "util.h"

static const char *BASE_NAMES[] = {"distance", "rel_pos", "pos", "s64", "s128", "s256", "s_glob", "freq",
                                   "same_token", "emb_dot", "emb_norm", "prev_mass", "prev2_mass"};
static const int WINDOWS[3] = {64, 128, 256};

void keyfeat_init(KeyFeat *f, int n_layers, int n_heads, int capacity, int hidden, int vocab) {
    memset(f, 0, sizeof *f);
    f->n_layers = n_layers;
    f->n_heads = n_heads;
    f->capacity = capacity;
    f->hidden = hidden;
    f->vocab = vocab;
    f->dump_every = 1;
    size_t C = (size_t)capacity;
    f->token = lmc_alloc(C, sizeof(int), "key features");
    f->count = lmc_alloc((size_t)vocab, sizeof(int), "key features");
    f->window = lmc_alloc(C * 3, sizeof(float), "key features");
    f->emb = lmc_alloc(C * (size_t)hidden, sizeof(float), "key features");
    f->emb_norm = lmc_alloc(C, sizeof(float), "key features");
    f->emb_dot = lmc_alloc(C, sizeof(float), "key features");
    f->mass = lmc_alloc((size_t)n_layers * (size_t)n_heads * C, sizeof(float), "key features");
}

void keyfeat_free(KeyFeat *f) {
    void *bufs[] = {f->token, f->count, f->window, f->emb, f->emb_norm, f->emb_dot, f->mass};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmc_free(bufs[i]);
    memset(f, 0, sizeof *f);
}

int keyfeat_count(const KeyFeat *f) { return KF_PREV_HEAD0 + f->n_heads; }

int keyfeat_lookup(const KeyFeat *f, const char *name) {
    for (int i = 0; i < KF_PREV_HEAD0; i++)
        if (strcmp(name, BASE_NAMES[i]) == 0) return i;
    int h, used = 0;
    if (sscanf(name, "prev_head%d%n", &h, &used) == 1 && name[used] == '\0' && h >= 0 && h < f->n_heads)
        return KF_PREV_HEAD0 + h;
    return -1;
}

void keyfeat_dump_header(KeyFeat *f) {
    /* line 1: format, columns, heads; line 2: the column names; then float32 rows */
    fprintf(f->dump, "lmc-keyfeat 1 %d %d\nquery layer key", keyfeat_count(f) + 4, f->n_heads);
    for (int i = 0; i < KF_PREV_HEAD0; i++) fprintf(f->dump, " %s", BASE_NAMES[i]);
    for (int h = 0; h < f->n_heads; h++) fprintf(f->dump, " prev_head%d", h);
    fprintf(f->dump, " target\n");
}

void keyfeat_append(KeyFeat *f, int token, const float *embedding) {
    int p = f->n_pos++, H = f->hidden;
    f->token[p] = token;
    f->count[token]++;
    float *e = f->emb + (size_t)p * H;
    memcpy(e, embedding, sizeof(float) * (size_t)H);
    f->emb_norm[p] = sqrtf(dot_f32(e, e, H));
    /* the window counts, one backward scan over the widest window */
    int c = 0, w = 0;
    for (int back = 1; back <= WINDOWS[2] && back <= p; back++) {
        c += f->token[p - back] == token;
        while (w < 3 && back == WINDOWS[w]) {
            f->window[(size_t)p * 3 + w] = (float)log((double)(back + 1) / (double)(c + 1));
            w++;
        }
    }
    for (; w < 3; w++) f->window[(size_t)p * 3 + w] = (float)log((double)(p + 1) / (double)(c + 1));
    /* the new query against every key */
    for (int j = 0; j <= p; j++) f->emb_dot[j] = dot_f32(e, f->emb + (size_t)j * H, H);
}

/* mean over heads of layer l's probabilities at key j, summed in head order */
static float head_mean(const KeyFeat *f, int layer, int j) {
    if (layer < 0) return 0.0f;
    float s = 0.0f;
    for (int h = 0; h < f->n_heads; h++) s += f->mass[((size_t)layer * f->n_heads + h) * f->capacity + j];
    return s / (float)f->n_heads;
}

float keyfeat_mass(const KeyFeat *f, int layer, int j) { return head_mean(f, layer, j); }

float keyfeat_value(const KeyFeat *f, int layer, int j, int id) {
    int t = f->n_pos - 1;
    switch (id) {
    case KF_DISTANCE: return (float)(t - j);
    case KF_REL_POS: return (float)j / (float)(t + 1);
    case KF_POS: return (float)j;
    case KF_S64: case KF_S128: case KF_S256: return f->window[(size_t)j * 3 + (id - KF_S64)];
    case KF_SGLOB: return (float)log((double)(t + 1) / (double)f->count[f->token[j]]);
    case KF_FREQ: return (float)f->count[f->token[j]];
    case KF_SAME_TOKEN: return f->token[j] == f->token[t] ? 1.0f : 0.0f;
    case KF_EMB_DOT: return f->emb_dot[j];
    case KF_EMB_NORM: return f->emb_norm[j];
    case KF_PREV_MASS: return head_mean(f, layer - 1, j);
    case KF_PREV2_MASS: return head_mean(f, layer - 2, j);
    default:
        if (layer == 0) return 0.0f;
        return f->mass[((size_t)(layer - 1) * f->n_heads + (id - KF_PREV_HEAD0)) * f->capacity + j];
    }
}

void keyfeat_record(KeyFeat *f, int layer, int head, const int *blocks, int n_blocks, int block,
                    const float *probs) {
    int n_pos = f->n_pos;
    float *m = f->mass + ((size_t)layer * f->n_heads + head) * f->capacity;
    memset(m, 0, sizeof(float) * (size_t)n_pos);
    for (int i = 0; i < n_blocks; i++) {
        int p0 = blocks[i] * block, p1 = p0 + block < n_pos ? p0 + block : n_pos;
        memcpy(m + p0, probs + p0, sizeof(float) * (size_t)(p1 - p0));
    }
}

void keyfeat_dump_query(KeyFeat *f) {
    int t = f->n_pos - 1, n = keyfeat_count(f), cols = n + 4;
    if (!f->dump || (t + 1) % f->dump_every != 0) return;
    float row[KF_PREV_HEAD0 + 4 + 1024];
    for (int l = 0; l < f->n_layers; l++)
        for (int j = 0; j <= t; j++) {
            row[0] = (float)t;
            row[1] = (float)l;
            row[2] = (float)j;
            for (int id = 0; id < n; id++) row[3 + id] = keyfeat_value(f, l, j, id);
            row[cols - 1] = head_mean(f, l, j);
            if (fwrite(row, sizeof(float), (size_t)cols, f->dump) != (size_t)cols)
                lmc_die_runtime("cannot write the --dump-features file");
        }
}
