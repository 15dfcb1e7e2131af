/* tests/reference/peer_greedy.c - the reference side of the architecture tests: greedy token ids
 * from llama.cpp (the peer), built against its libllama by make-arch-refs.sh, never by the
 * project's build. Decodes the prompt ids in one batch, then N greedy steps one token at a time,
 * and prints the N ids comma-separated, then on a second line each step's gap between the best and
 * the second-best logit (how close that step came to a tie).
 * usage: peer_greedy MODEL.gguf N ID,ID,... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: peer_greedy MODEL.gguf N ID,ID,...\n");
        return 2;
    }
    int         n_predict = atoi(argv[2]);
    llama_token prompt[512];
    int         n_prompt = 0;
    for (char *s = argv[3]; *s && n_prompt < 512;) {
        prompt[n_prompt++] = (llama_token)strtol(s, &s, 10);
        if (*s == ',')
            s++;
    }
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false; /* no repacked (AMX) buffers: the VM cannot run AMX tiles */
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    const int             n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    struct llama_batch    batch = llama_batch_get_one(prompt, n_prompt);
    llama_token           tok;
    float                 margin[512];
    if (n_predict < 1 || n_predict > 512)
        return 2;
    for (int step = 0; step < n_predict; step++) {
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        const float *l = llama_get_logits_ith(ctx, -1);
        int          best = 0, second = -1;
        for (int i = 1; i < n_vocab; i++) {
            if (l[i] > l[best]) {
                second = best;
                best = i;
            } else if (second < 0 || l[i] > l[second]) {
                second = i;
            }
        }
        margin[step] = l[best] - l[second];
        tok = best;
        printf("%s%d", step ? "," : "", tok);
        batch = llama_batch_get_one(&tok, 1);
    }
    printf("\n");
    for (int step = 0; step < n_predict; step++)
        printf("%s%.4f", step ? "," : "", (double)margin[step]);
    printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
