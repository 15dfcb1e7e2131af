/* tests/reference/peer_bench.c - llama.cpp's side of a side-by-side benchmark, built against the
 * peer's libllama (never by the project's build): llama-bench's pp and tg tests (a P-token prompt
 * in one batch from an empty cache; N single-token decodes after a 1-token prompt), R times each,
 * with the repacked (AMX) weight buffers off, which this VM's kernel cannot run and llama-bench
 * cannot turn off. Prints "pp P: mean tok/s" and "tg N: mean tok/s".
 * usage: peer_bench MODEL.gguf P N R THREADS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: peer_bench MODEL.gguf P N R THREADS\n");
        return 2;
    }
    const int n_p = atoi(argv[2]), n_g = atoi(argv[3]), reps = atoi(argv[4]), th = atoi(argv[5]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.use_extra_bufts = false;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model)
        return 1;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_p + n_g + 16);
    cp.n_batch = cp.n_ubatch = (uint32_t)(n_p > 1 ? n_p : 1);
    cp.n_threads = cp.n_threads_batch = th;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    const int             n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_token          *toks = malloc(sizeof(*toks) * (size_t)(n_p > 1 ? n_p : 1));
    for (int i = 0; i < n_p; i++)
        toks[i] = (llama_token)(rand() % n_vocab);
    double pp = 0, tg = 0;
    for (int r = 0; r <= reps; r++) { /* run 0 warms up */
        llama_memory_clear(llama_get_memory(ctx), true);
        double t0 = now_s();
        if (n_p > 0 && llama_decode(ctx, llama_batch_get_one(toks, n_p)) != 0)
            return 1;
        llama_synchronize(ctx);
        double t1 = now_s();
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_token t = 1;
        if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0)
            return 1;
        double t2 = now_s();
        for (int i = 0; i < n_g; i++) {
            t = (llama_token)(rand() % n_vocab);
            if (llama_decode(ctx, llama_batch_get_one(&t, 1)) != 0)
                return 1;
        }
        llama_synchronize(ctx);
        double t3 = now_s();
        if (r > 0) {
            pp += n_p / (t1 - t0);
            tg += n_g / (t3 - t2);
        }
    }
    printf("pp %d: %.2f tok/s\ntg %d: %.2f tok/s\n", n_p, pp / reps, n_g, tg / reps);
    free(toks);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
