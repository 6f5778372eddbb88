/* session.h — what `lmc generate` and `lmc ppl` share: the model and its token file, checked
 * against each other, the forward pass over them, and the "config" both report. */
#ifndef LMC_SESSION_H
#define LMC_SESSION_H

#include <stdio.h>

#include "cli.h"
#include "model.h"

typedef struct {
    Model model;
    int *tokens;
    int n_tokens;
    int capacity; /* the cache: what this run can reach, not the model's whole context */
    ThreadPool *pool;
    Forward fwd;
    AttnOptions attn;
    Gbm gbm; /* --predictor */
} Session;

/* load the model (o->model) and the token file (tokens_path, given as tokens_flag), check the
 * options and the tokens, size the cache for the tokens + extra positions; exits 2 on bad input.
 * all_logits: forward may be asked for every position's logits. */
void session_open(Session *s, const Options *o, const char *tokens_flag, const char *tokens_path,
                  int extra, int all_logits);
void session_close(Session *s);
/* the "config" member: the model path, the attention options, weights, context, generation
 * limits and the model's configuration */
void session_write_config(FILE *f, const Options *o, const Session *s);
/* ", \"kv_memory\": {...}, \"peak_rss_kb\": N": the KV cache's bytes (kvcache.h: reserved,
 * touched, held now and at most) and the process's peak resident set (getrusage) */
void session_write_memory(FILE *f, const Session *s);

#endif
