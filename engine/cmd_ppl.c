/* cmd_ppl.c — `lmc ppl`: teacher-forced perplexity of a text (position i predicts token i+1),
 * and with --measure-keys the ranking metrics of the policy's keep scores. */
#include <math.h>
#include <stdio.h>

#include "session.h"
#include "util.h"

int cmd_ppl(const Options *o) {
    Session s;
    session_open(&s, o, "--text", o->text, 0, 1);
    const Config *c = &s.model.cfg;
    if (s.n_tokens < 2) lmc_die_input("--text %s needs at least 2 tokens to score", o->text);
    /* teacher forcing: position i predicts token i+1; the text runs as a prefill, so
     * --prefill-attn sparse applies the --attn policy to every position */
    double t0 = lmc_now_ms();
    double nll = 0.0;
    int scored = s.n_tokens - 1;
    for (int i = 0; i < scored; i += s.fwd.chunk) {
        int n = scored - i < s.fwd.chunk ? scored - i : s.fwd.chunk;
        float *logits = forward(&s.fwd, s.tokens + i, n, i, ATTN_PREFILL, LOGITS_ALL, NULL);
        for (int t = 0; t < n; t++) {
            const float *lt = logits + (size_t)t * c->vocab;
            float max = lt[argmax(lt, c->vocab)];
            double sum = 0.0;
            for (int v = 0; v < c->vocab; v++) sum += exp((double)(lt[v] - max));
            nll += -((double)(lt[s.tokens[i + t + 1]] - max) - log(sum));
        }
    }
    double elapsed = lmc_now_ms() - t0;
    nll /= scored;
    /* never a document that is not JSON (nan, inf): NaN weights or values end the run here */
    if (!isfinite(nll))
        lmc_die_runtime("the negative log-likelihood is not finite (%g): the model's weights or config "
                        "give NaN or infinite logits", nll);
    printf("{\"schema\": \"%s\", \"command\": \"ppl\", ", LMC_SCHEMA);
    session_write_config(stdout, o, &s);
    printf(", \"tokens\": %d, \"scored\": %d, \"nll\": %.9g, \"ppl\": %.9g, \"ms\": %.4f", s.n_tokens,
           scored, nll, exp(nll), elapsed);
    session_write_memory(stdout, &s);
    if (s.fwd.attn.keys.rank) {
        printf(", ");
        keyrank_write_json(stdout, s.fwd.attn.keys.rank);
    }
    printf("}\n");
    session_close(&s);
    return 0;
}
