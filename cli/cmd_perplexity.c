/* cli/cmd_perplexity.c - `sluice perplexity`: llama-perplexity's protocol on a text file. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "router.h"

#define PPL_PROG "sluice perplexity"

/* Largest text file perplexity reads (wikitext-2's test split is 1.3 MB). */
#define PPL_MAX_BYTES (1ull << 30)

/* What the command line asked for. */
struct ppl_args {
    const char            *model;      /* -m: borrowed from argv */
    const char            *file;       /* -f: borrowed from argv */
    uint32_t               n_ctx;      /* -c: chunk length */
    uint32_t               n_batch;    /* -b */
    uint32_t               n_threads;  /* -t: 0 = physical cores */
    uint32_t               max_chunks; /* --chunks: 0 = all */
    enum common_cache_type cache;      /* --cache-type */
    struct cli_stream_opts so;         /* the streaming options */
};

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int ppl_parse(int argc, char **argv, struct ppl_args *a)
{
    struct cli_stream_table st;
    *a = (struct ppl_args){.n_ctx = 512, .n_batch = 2048, .cache = COMMON_CACHE_F16};
    cli_stream_table_init(&st, &a->so);
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->model,
         .metavar = "PATH",
         .help = "GGUF model",
         .required = true},
        {.name = "file",
         .short_name = "f",
         .type = COMMON_OPT_STR,
         .target = &a->file,
         .metavar = "FILE",
         .help = "text file (a regular file of at most 1 GiB)",
         .required = true},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &a->n_ctx,
         .min = 4,
         .max = 1u << 20,
         .help = "chunk length",
         .def = "512"},
        {.name = "batch-size",
         .short_name = "b",
         .type = COMMON_OPT_U32,
         .target = &a->n_batch,
         .min = 1,
         .max = 1u << 20,
         .help = "tokens per forward batch",
         .def = "2048"},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &a->n_threads,
         .min = 1,
         .max = 256,
         .help = "threads",
         .def = "physical cores"},
        {.name = "chunks",
         .type = COMMON_OPT_U32,
         .target = &a->max_chunks,
         .help = "score only the first N chunks; 0 = all",
         .def = "0"},
        {.name = "cache-type",
         .short_name = "ctk",
         .type = COMMON_OPT_CALLBACK,
         .target = &a->cache,
         .parse = cli_parse_cache_type,
         .metavar = "f16|q8_0",
         .help = "KV cache type",
         .def = "f16"},
        {0},
    };
    const struct common_opt_group groups[] = {{.title = CLI_STREAM_TITLE, .opts = st.rows}, {0}};
    const struct common_opts_spec spec = {
        .prog = PPL_PROG,
        .usage = PPL_PROG " -m MODEL.gguf -f TEXT [-c CTX] [options]",
        .description =
            "Computes perplexity exactly as llama-perplexity does: the whole file is tokenized "
            "with "
            "BOS, cut into chunks of CTX tokens, the first token of each chunk is replaced by BOS, "
            "and the predictions of positions CTX/2 .. CTX-2 of each chunk are scored. Prints the "
            "running estimate after each chunk as [1]17.1234,[2]... and ends with 'Final "
            "estimate: PPL = <ppl> +/- <stderr>' (the +/- as llama.cpp computes it).",
        .opts = rows,
        .groups = groups,
    };
    return common_opts_parse(&spec, argc, argv);
}

static void ppl_on_chunk(void *arg, uint32_t chunk, double ppl)
{
    (void)arg;
    printf("[%u]%.4f,", chunk + 1, ppl);
    fflush(stdout);
}

/* Tokenizes the text with BOS; checks there are two chunks at least. */
static int ppl_tokenize(const struct router_vocab *vocab, const struct ppl_args *a,
                        const char *text, size_t len, struct router_tokens *toks)
{
    uint64_t t0 = common_now_ns();
    if (router_tokenize(vocab, text, len, &(struct router_tokenize_opts){.add_special = true},
                        toks) < 0) {
        cli_error(PPL_PROG, "tokenizing '%s' failed", a->file);
        return COMMON_ENOMEM;
    }
    fprintf(stderr, "perplexity: tokenized %zu bytes into %zu tokens in %.1f ms\n", len, toks->n,
            (double)(common_now_ns() - t0) / 1e6);
    if (toks->n < 2 * (size_t)a->n_ctx) {
        cli_error(PPL_PROG,
                  "you need at least %u tokens to evaluate perplexity with a context of %u (the "
                  "file has %zu)",
                  2 * a->n_ctx, a->n_ctx, toks->n);
        return COMMON_ERANGE;
    }
    return COMMON_OK;
}

/* Scores the chunks and prints the running and final estimates. */
static int ppl_score(struct cli_engine *en, const struct router_vocab *vocab,
                     const struct ppl_args *a, const struct router_tokens *toks)
{
    struct common_errmsg        e = {{0}};
    struct router_vocab_special sp;
    router_vocab_special(vocab, &sp);
    fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%u, threads=%u\n",
            a->max_chunks && a->max_chunks < toks->n / a->n_ctx ? (size_t)a->max_chunks
                                                                : toks->n / a->n_ctx,
            a->n_ctx, executor_threadpool_n_threads(en->pool));
    struct executor_ppl_result res = {0};
    uint64_t                   t1 = common_now_ns();
    int                        rc = executor_perplexity(en->ctx, toks->ids, toks->n,
                                                        &(struct executor_ppl_opts){.n_ctx = a->n_ctx,
                                                                                    .bos = sp.add_bos ? sp.bos : -1,
                                                                                    .max_chunks = a->max_chunks,
                                                                                    .on_chunk = ppl_on_chunk},
                                                        &res, &e);
    printf("\n");
    if (rc < 0) {
        cli_error(PPL_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
        return rc;
    }
    double secs = (double)(common_now_ns() - t1) / 1e9;
    printf("Final estimate: PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_err);
    fprintf(stderr, "perplexity: %u chunks, %llu predictions scored, %.2f s (%.1f tok/s)\n",
            res.n_chunks, (unsigned long long)res.n_scored, secs,
            (double)res.n_chunks * a->n_ctx / secs);
    return COMMON_OK;
}

int cli_cmd_perplexity(int argc, char **argv)
{
    struct ppl_args a;
    int             rc = ppl_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);

    int                  status = 1;
    struct common_errmsg e = {{0}};
    struct cli_engine    en = {0};
    struct router_vocab *vocab = NULL;
    struct router_tokens toks = {0};
    char                *text = NULL;
    size_t               len = 0;
    if (cli_text_file_read(PPL_PROG, a.file, PPL_MAX_BYTES, &text, &len) < 0)
        return 1;
    executor_kernels_init();
    struct cli_engine_opts eo = {
        .prog = PPL_PROG,
        .n_threads = a.n_threads,
        .ctx = {.n_ctx = a.n_ctx, .n_batch = a.n_batch, .cache_type = a.cache},
        .logit_rows = a.n_ctx + 1}; /* executor_perplexity keeps every position's logits */
    if (cli_engine_open(&en, a.model, &a.so, &eo) < 0)
        goto out;
    if ((rc = router_vocab_load(executor_model_desc(en.model)->gguf, &vocab, &e)) < 0) {
        cli_error(PPL_PROG, "%s: tokenizer: %s", a.model, e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    if (ppl_tokenize(vocab, &a, text, len, &toks) < 0 || ppl_score(&en, vocab, &a, &toks) < 0)
        goto out;
    status = cli_engine_report(&en) < 0 ? 1 : 0;
out:
    router_tokens_fini(&toks);
    router_vocab_destroy(vocab);
    cli_engine_close(&en);
    free(text);
    return status;
}
