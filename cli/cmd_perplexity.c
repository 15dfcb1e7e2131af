/* cli/cmd_perplexity.c - `sluice perplexity`: llama-perplexity's protocol on a text file. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "router.h"

static void ppl_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice perplexity -m MODEL.gguf -f TEXT [-c CTX] [options]\n\n"
            "Computes perplexity exactly as llama-perplexity does: the whole file is tokenized\n"
            "with BOS, cut into chunks of CTX tokens, the first token of each chunk is replaced\n"
            "by BOS, and the predictions of positions CTX/2 .. CTX-2 of each chunk are scored.\n"
            "Prints the running estimate after each chunk as [1]17.1234,[2]... and ends with\n"
            "'Final estimate: PPL = <ppl> +/- <stderr>' (the +/- as llama.cpp computes it).\n\n"
            "  -m, --model PATH     GGUF model\n"
            "  -f, --file PATH      text file\n"
            "  -c, --ctx-size N     chunk length                              [512]\n"
            "  -b, --batch-size N   tokens per forward batch                  [2048]\n"
            "  -t, --threads N      threads                                   [physical cores]\n"
            "  --chunks N           score only the first N chunks; 0 = all    [0]\n"
            "  --cache-type T       KV cache type: f16 or q8_0                [f16]\n");
    fputs(CLI_STREAM_USAGE, f);
}

static void ppl_on_chunk(void *arg, uint32_t chunk, double ppl)
{
    (void)arg;
    printf("[%u]%.4f,", chunk + 1, ppl);
    fflush(stdout);
}

int cli_cmd_perplexity(int argc, char **argv)
{
    const char            *model = NULL, *file = NULL;
    uint32_t               n_ctx = 512, n_batch = 2048, n_threads = 0, max_chunks = 0;
    enum common_cache_type cache = COMMON_CACHE_F16;
    struct cli_stream_opts so = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            ppl_usage(stdout);
            return 0;
        }
        int taken = cli_take_option(argc, argv, &i, &so, &v);
        if (taken < 0)
            return 2;
        if (taken > 0)
            continue;
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "-f") == 0 || strcmp(a, "--file") == 0)
            file = v;
        else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0)
            ok = cli_parse_u32(a, v, 4, 1u << 20, &n_ctx);
        else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch-size") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 20, &n_batch);
        else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0)
            ok = cli_parse_u32(a, v, 1, 256, &n_threads);
        else if (strcmp(a, "--chunks") == 0)
            ok = cli_parse_u32(a, v, 0, UINT32_MAX, &max_chunks);
        else if (strcmp(a, "--cache-type") == 0 || strcmp(a, "-ctk") == 0) {
            ok = common_cache_type_parse(v, &cache) == 0;
            if (!ok)
                fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            ppl_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!model || !file) {
        fprintf(stderr, "error: need -m MODEL and -f TEXT; see sluice perplexity --help\n");
        return 2;
    }

    int                  status = 1, rc;
    struct common_errmsg e = {{0}};
    struct cli_engine    en = {0};
    struct executor_ctx *c = NULL;
    struct router_vocab *vocab = NULL;
    struct router_tokens toks = {0};
    char                *text = NULL;
    size_t               len = 0;

    FILE *f = fopen(file, "rb");
    if (!f) {
        fprintf(stderr, "error: cannot open '%s'\n", file);
        return 1;
    }
    for (;;) {
        char *p = realloc(text, len + 65536 + 1);
        if (!p) {
            fclose(f);
            goto out;
        }
        text = p;
        size_t r = fread(text + len, 1, 65536, f);
        len += r;
        if (r < 65536)
            break;
    }
    fclose(f);
    text[len] = '\0';

    executor_kernels_init();
    struct cli_engine_opts eo = {
        .n_threads = n_threads,
        .ctx = {.n_ctx = n_ctx, .n_batch = n_batch, .cache_type = cache},
        .logit_rows = n_ctx + 1}; /* executor_perplexity keeps every position's logits */
    if (cli_engine_open(&en, model, &so, &eo) < 0)
        goto out;
    c = en.ctx;
    if ((rc = router_vocab_load(executor_model_desc(en.model)->gguf, &vocab, &e)) < 0) {
        fprintf(stderr, "error: %s: tokenizer: %s\n", model,
                e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    uint64_t t0 = common_now_ns();
    if (router_tokenize(vocab, text, len, &(struct router_tokenize_opts){.add_special = true},
                        &toks) < 0) {
        fprintf(stderr, "error: tokenizing '%s' failed\n", file);
        goto out;
    }
    fprintf(stderr, "perplexity: tokenized %zu bytes into %zu tokens in %.1f ms\n", len, toks.n,
            (double)(common_now_ns() - t0) / 1e6);
    if (toks.n < 2 * (size_t)n_ctx) {
        fprintf(stderr,
                "error: you need at least %u tokens to evaluate perplexity with a context of %u "
                "(the file has %zu)\n",
                2 * n_ctx, n_ctx, toks.n);
        goto out;
    }
    struct router_vocab_special sp;
    router_vocab_special(vocab, &sp);
    fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%u, threads=%u\n",
            max_chunks && max_chunks < toks.n / n_ctx ? (size_t)max_chunks : toks.n / n_ctx, n_ctx,
            executor_threadpool_n_threads(en.pool));
    struct executor_ppl_result res = {0};
    uint64_t                   t1 = common_now_ns();
    rc = executor_perplexity(c, toks.ids, toks.n,
                             &(struct executor_ppl_opts){.n_ctx = n_ctx,
                                                         .bos = sp.add_bos ? sp.bos : -1,
                                                         .max_chunks = max_chunks,
                                                         .on_chunk = ppl_on_chunk},
                             &res, &e);
    printf("\n");
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    double secs = (double)(common_now_ns() - t1) / 1e9;
    printf("Final estimate: PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_err);
    fprintf(stderr, "perplexity: %u chunks, %llu predictions scored, %.2f s (%.1f tok/s)\n",
            res.n_chunks, (unsigned long long)res.n_scored, secs,
            (double)res.n_chunks * n_ctx / secs);
    status = 0;
    if (cli_engine_report(&en) < 0)
        status = 1;
out:
    router_tokens_fini(&toks);
    router_vocab_destroy(vocab);
    cli_engine_close(&en);
    free(text);
    return status;
}
