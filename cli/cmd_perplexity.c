/* cli/cmd_perplexity.c - `sluice perplexity`: llama-perplexity's protocol on a text file. */
#include "cli.h"

#include <errno.h>
#include <math.h>
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
    const char            *kld_base;   /* --kl-divergence-base: borrowed from argv */
    bool                   kld;        /* --kl-divergence: compare with kld_base */
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
         .help = "text file (a regular file of at most 1 GiB); not with --kl-divergence"},
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
         .parse = common_cache_type_opt,
         .metavar = "f16|q8_0",
         .help = "KV cache type",
         .def = "f16"},
        {.name = "kl-divergence-base",
         .type = COMMON_OPT_STR,
         .target = &a->kld_base,
         .metavar = "FILE",
         .help = "save every scored position's log-probabilities here (llama-perplexity's file); "
                 "with --kl-divergence, the file to compare with"},
        {.name = "kl-divergence",
         .type = COMMON_OPT_SWITCH,
         .target = &a->kld,
         .help = "compare with --kl-divergence-base FILE on its own tokens and chunk length: mean "
                 "KL divergence, same top token, perplexity ratio"},
        {0},
    };
    const struct common_opt_group groups[] = {{.title = CLI_STREAM_TITLE, .opts = st.rows}, {0}};
    const struct common_opts_spec spec = {
        .prog = PPL_PROG,
        .usage = PPL_PROG " -m MODEL.gguf -f TEXT [-c CTX] [--kl-divergence-base OUT] [options]\n"
                          "       " PPL_PROG
                          " -m MODEL.gguf --kl-divergence-base BASE --kl-divergence [options]",
        .description =
            "Computes perplexity exactly as llama-perplexity does: the whole file is tokenized "
            "with "
            "BOS, cut into chunks of CTX tokens, the first token of each chunk is replaced by BOS, "
            "and the predictions of positions CTX/2 .. CTX-2 of each chunk are scored. Prints the "
            "running estimate after each chunk as [1]17.1234,[2]... and ends with 'Final "
            "estimate: PPL = <ppl> +/- <stderr>' (the +/- as llama.cpp computes it). The "
            "--kl-divergence-base and --kl-divergence files are llama-perplexity's: a base saved "
            "by either program can be compared by either.",
        .opts = rows,
        .groups = groups,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return rc;
    if (a->kld && !a->kld_base)
        return common_opts_error(&spec, "--kl-divergence needs --kl-divergence-base FILE");
    if (a->kld && a->file)
        return common_opts_error(&spec,
                                 "--kl-divergence reads its tokens from the base file; drop -f");
    if (!a->kld && !a->file)
        return common_opts_error(&spec,
                                 "-f FILE is required (or --kl-divergence with a base file)");
    return 0;
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

/* What the chunk callbacks share: the base file written or read, the comparison's sums. */
struct ppl_kld {
    FILE                     *out;  /* base being written, or NULL */
    struct executor_kld_base *base; /* base being compared with, or NULL */
    uint16_t                 *rows; /* owned: one chunk's rows */
    struct executor_kld_stats st;
    struct common_errmsg      e; /* why a callback stopped the run */
};

/* Writes one chunk's rows of log-probabilities to the base file. */
static int ppl_save_rows(void *arg, uint32_t chunk, const float *logits, const int32_t *next,
                         uint32_t n, uint32_t n_vocab)
{
    struct ppl_kld *k = arg;
    const size_t    nv = executor_kld_row_len(n_vocab);
    (void)chunk;
    for (uint32_t r = 0; r < n; r++)
        executor_kld_encode_row(logits + (size_t)r * n_vocab, n_vocab, next[r],
                                k->rows + (size_t)r * nv);
    if (fwrite(k->rows, sizeof(*k->rows) * nv, n, k->out) != n)
        return common_errmsg_set(&k->e, COMMON_EIO, "writing the log-probabilities failed");
    return 0;
}

/* mean and its uncertainty as llama-perplexity computes them */
static void ppl_mean_unc(double sum, double sum2, uint64_t count, double *mean, double *unc)
{
    *mean = count ? sum / (double)count : 0.0;
    double d = count ? sum2 / (double)count - *mean * *mean : 0.0;
    *unc = d > 0 && count > 10 ? sqrt(d / (double)(count - 1)) : 0.0;
}

static double ppl_cov(double a, double b, double ab, uint64_t count)
{
    if (count < 10)
        return 0.0;
    return (ab / (double)count - (a / (double)count) * (b / (double)count)) / (double)(count - 1);
}

/* Compares one chunk with the base's rows and prints llama-perplexity's running line. */
static int ppl_compare_rows(void *arg, uint32_t chunk, const float *logits, const int32_t *next,
                            uint32_t n, uint32_t n_vocab)
{
    struct ppl_kld *k = arg;
    const size_t    nv = executor_kld_row_len(n_vocab);
    int             rc = executor_kld_base_next(k->base, k->rows, &k->e);
    if (rc < 0)
        return rc;
    for (uint32_t r = 0; r < n; r++)
        executor_kld_accumulate(&k->st, logits + (size_t)r * n_vocab, n_vocab,
                                k->rows + (size_t)r * nv, next[r]);
    const struct executor_kld_stats *s = &k->st;
    double                           lp, lpu, lb, lbu, kl, klu, pm, pmu;
    ppl_mean_unc(s->sum_nll, s->sum_nll2, s->count, &lp, &lpu);
    ppl_mean_unc(s->sum_nll_base, s->sum_nll_base2, s->count, &lb, &lbu);
    ppl_mean_unc(s->sum_kld, s->sum_kld2, s->count, &kl, &klu);
    ppl_mean_unc(s->sum_p_diff2, s->sum_p_diff4, s->count, &pm, &pmu);
    const double cov = ppl_cov(s->sum_nll, s->sum_nll_base, s->sum_nll_nll_base, s->count);
    const double rms = sqrt(pm), top = (double)s->n_same_top / (double)s->count;
    printf(
        "%4u    %9.4f \u00b1 %9.4f    %10.5f \u00b1 %10.5f    %10.5f \u00b1 %10.5f    %6.3f \u00b1 "
        "%6.3f %%    %6.3f \u00b1 %6.3f %%\n",
        chunk + 1, exp(lp), exp(lp) * lpu, lp - lb, sqrt(lpu * lpu + lbu * lbu - 2.0 * cov), kl,
        klu, 100.0 * rms, rms > 0 ? 100.0 * 0.5 / rms * pmu : 0.0, 100.0 * top,
        s->count > 1 ? 100.0 * sqrt(top * (1 - top) / (double)(s->count - 1)) : 0.0);
    fflush(stdout);
    return 0;
}

static int ppl_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* llama-perplexity's percentile: linear between the two nearest sorted values. */
static double ppl_percentile(const float *v, uint64_t n, double fraction)
{
    if (fraction <= 0)
        return (double)v[0];
    if (fraction >= 1)
        return (double)v[n - 1];
    double   p = fraction * (double)(n - 1);
    uint64_t ip = (uint64_t)p;
    p -= (double)ip;
    return (1 - p) * (double)v[ip] + p * (double)v[ip + 1 < n ? ip + 1 : n - 1];
}

/* The closing statistics of a comparison, in llama-perplexity's words. */
static void ppl_kld_summary(struct executor_kld_stats *s)
{
    if (s->count < 100) {
        printf("\n(fewer than 100 positions compared: no summary statistics)\n");
        return;
    }
    const uint64_t n = s->count < s->capacity ? s->count : s->capacity;
    qsort(s->kld_values, n, sizeof(float), ppl_cmp_float);
    qsort(s->p_diff_values, n, sizeof(float), ppl_cmp_float);
    double lp, lpu, lb, lbu, kl, klu, pd, pdu, pm, pmu;
    ppl_mean_unc(s->sum_nll, s->sum_nll2, s->count, &lp, &lpu);
    ppl_mean_unc(s->sum_nll_base, s->sum_nll_base2, s->count, &lb, &lbu);
    const double cov = ppl_cov(s->sum_nll, s->sum_nll_base, s->sum_nll_nll_base, s->count);
    const double ppl = exp(lp), ppl_u = ppl * lpu, base = exp(lb), base_u = base * lbu;
    const double ratio_unc = sqrt(lpu * lpu + lbu * lbu - 2.0 * cov);
    printf("\n====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6f \u00b1 %10.6f\n", ppl, ppl_u);
    printf("Mean PPL(base)                : %10.6f \u00b1 %10.6f\n", base, base_u);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%\n",
           lpu > 0 && lbu > 0 ? 100.0 * cov / (lpu * lbu) : 0.0);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f \u00b1 %10.6f\n", lp - lb, ratio_unc);
    printf("Mean PPL(Q)/PPL(base)         : %10.6f \u00b1 %10.6f\n", exp(lp - lb),
           exp(lp - lb) * ratio_unc);
    printf("Mean PPL(Q)-PPL(base)         : %10.6f \u00b1 %10.6f\n", ppl - base,
           sqrt(ppl_u * ppl_u + base_u * base_u - 2.0 * ppl * base * cov));
    ppl_mean_unc(s->sum_kld, s->sum_kld2, s->count, &kl, &klu);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6f \u00b1 %10.6f\n", kl, klu);
    static const double kq[] = {0.999, 0.99, 0.95, 0.9, 0.5, 0.1, 0.05, 0.01, 0.001};
    static const char  *kn[] = {"99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "Median ",
                                "10.0%  ", " 5.0%  ", " 1.0%  ", " 0.1%  "};
    printf("Maximum KLD: %10.6f\n", (double)s->kld_values[n - 1]);
    for (size_t i = 0; i < sizeof(kq) / sizeof(kq[0]); i++)
        printf("%s KLD: %10.6f\n", kn[i], ppl_percentile(s->kld_values, n, kq[i]));
    printf("Minimum KLD: %10.6f\n", (double)s->kld_values[0]);
    ppl_mean_unc(s->sum_p_diff, s->sum_p_diff2, s->count, &pd, &pdu);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    \u0394p: %6.3f \u00b1 %5.3f %%\n", 100.0 * pd, 100.0 * pdu);
    static const double pq[] = {0.999, 0.99, 0.95, 0.9, 0.75, 0.5, 0.25, 0.1, 0.05, 0.01, 0.001};
    static const char  *pn[] = {"99.9%  ", "99.0%  ", "95.0%  ", "90.0%  ", "75.0%  ", "Median ",
                                "25.0%  ", "10.0%  ", " 5.0%  ", " 1.0%  ", " 0.1%  "};
    printf("Maximum \u0394p: %6.3f%%\n", 100.0 * (double)s->p_diff_values[n - 1]);
    for (size_t i = 0; i < sizeof(pq) / sizeof(pq[0]); i++)
        printf("%s \u0394p: %6.3f%%\n", pn[i], 100.0 * ppl_percentile(s->p_diff_values, n, pq[i]));
    printf("Minimum \u0394p: %6.3f%%\n", 100.0 * (double)s->p_diff_values[0]);
    ppl_mean_unc(s->sum_p_diff2, s->sum_p_diff4, s->count, &pm, &pmu);
    const double rms = sqrt(pm), top = (double)s->n_same_top / (double)s->count;
    printf("RMS \u0394p    : %6.3f \u00b1 %5.3f %%\n", 100.0 * rms,
           rms > 0 ? 100.0 * 0.5 / rms * pmu : 0.0);
    printf("Same top p: %6.3f \u00b1 %5.3f %%\n", 100.0 * top,
           100.0 * sqrt(top * (1.0 - top) / (double)(s->count - 1)));
}

/* Scores the chunks and prints the running and final estimates; with k->out set, saves the
 * log-probabilities; with k->base set, compares with them instead. */
static int ppl_score(struct cli_engine *en, const struct router_vocab *vocab,
                     const struct ppl_args *a, const int32_t *ids, size_t n_ids, struct ppl_kld *k)
{
    struct common_errmsg        e = {{0}};
    struct router_vocab_special sp;
    router_vocab_special(vocab, &sp);
    const size_t n_chunks = a->max_chunks && a->max_chunks < n_ids / a->n_ctx
                                ? (size_t)a->max_chunks
                                : n_ids / a->n_ctx;
    fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%u, threads=%u\n",
            n_chunks, a->n_ctx, executor_threadpool_n_threads(en->pool));
    const uint32_t n_vocab = executor_ctx_n_vocab(en->ctx);
    const size_t   rows =
        (size_t)executor_kld_rows_per_chunk(a->n_ctx) * executor_kld_row_len(n_vocab);
    if ((k->out || k->base) && !(k->rows = malloc(rows * sizeof(*k->rows))))
        return COMMON_ENOMEM;
    if (k->out &&
        executor_kld_write_header(k->out, a->n_ctx, n_vocab, (uint32_t)n_chunks, ids) < 0) {
        cli_error(PPL_PROG, "%s: writing the header failed", a->kld_base);
        return COMMON_EIO;
    }
    if (k->base) {
        if (executor_kld_stats_init(&k->st,
                                    (uint64_t)n_chunks * executor_kld_rows_per_chunk(a->n_ctx)) < 0)
            return COMMON_ENOMEM;
        printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence   "
               "           \u0394p RMS            Same top p\n");
    }
    struct executor_ppl_result res = {0};
    uint64_t                   t1 = common_now_ns();
    int                        rc =
        executor_perplexity(en->ctx, ids, n_ids,
                            &(struct executor_ppl_opts){.n_ctx = a->n_ctx,
                                                        .bos = sp.add_bos ? sp.bos : -1,
                                                        .max_chunks = a->max_chunks,
                                                        .on_chunk = k->base ? NULL : ppl_on_chunk,
                                                        .on_logits = k->base  ? ppl_compare_rows
                                                                     : k->out ? ppl_save_rows
                                                                              : NULL,
                                                        .arg = k},
                            &res, &e);
    printf("\n");
    if (rc < 0) {
        const char *why = k->e.text[0] ? k->e.text : e.text[0] ? e.text : common_strerror(rc);
        cli_error(PPL_PROG, "%s", why);
        return rc;
    }
    double secs = (double)(common_now_ns() - t1) / 1e9;
    if (k->base)
        ppl_kld_summary(&k->st);
    else
        printf("Final estimate: PPL = %.4f +/- %.5f\n", res.ppl, res.ppl_err);
    fprintf(stderr, "perplexity: %u chunks, %llu predictions scored, %.2f s (%.1f tok/s)\n",
            res.n_chunks, (unsigned long long)res.n_scored, secs,
            (double)res.n_chunks * a->n_ctx / secs);
    return COMMON_OK;
}

/* --kl-divergence: opens the base, takes its chunk length, checks its vocabulary is the
 * model's. */
static int ppl_kld_open(struct ppl_args *a, struct ppl_kld *k)
{
    struct common_errmsg e = {{0}};
    int                  rc = executor_kld_base_open(a->kld_base, &k->base, &e);
    if (rc < 0) {
        cli_error(PPL_PROG, "%s: %s", a->kld_base, e.text[0] ? e.text : common_strerror(rc));
        return rc;
    }
    uint32_t       n_ctx, n_vocab, n_chunk;
    const int32_t *toks;
    executor_kld_base_info(k->base, &n_ctx, &n_vocab, &n_chunk, &toks);
    if (a->n_ctx != n_ctx)
        fprintf(stderr, "perplexity: %s was computed with chunks of %u tokens: using -c %u\n",
                a->kld_base, n_ctx, n_ctx);
    a->n_ctx = n_ctx;
    return 0;
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
    struct ppl_kld       k = {0};
    char                *text = NULL;
    size_t               len = 0;
    if (a.kld) {
        if (ppl_kld_open(&a, &k) < 0)
            return 1;
    } else if (cli_text_file_read(PPL_PROG, a.file, PPL_MAX_BYTES, &text, &len) < 0) {
        return 1;
    }
    if (a.kld_base && !a.kld && !(k.out = fopen(a.kld_base, "wb"))) {
        cli_error(PPL_PROG, "cannot write %s: %s", a.kld_base, strerror(errno));
        goto out;
    }
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
    if (k.base) {
        uint32_t       n_ctx, n_vocab, n_chunk;
        const int32_t *ids;
        executor_kld_base_info(k.base, &n_ctx, &n_vocab, &n_chunk, &ids);
        if (n_vocab != executor_ctx_n_vocab(en.ctx)) {
            cli_error(PPL_PROG, "%s holds a vocabulary of %u tokens, the model has %u", a.kld_base,
                      n_vocab, executor_ctx_n_vocab(en.ctx));
            goto out;
        }
        if (ppl_score(&en, vocab, &a, ids, (size_t)n_chunk * n_ctx, &k) < 0)
            goto out;
    } else if (ppl_tokenize(vocab, &a, text, len, &toks) < 0 ||
               ppl_score(&en, vocab, &a, toks.ids, toks.n, &k) < 0) {
        goto out;
    }
    if (k.out) {
        FILE *f = k.out;
        k.out = NULL;
        if (fclose(f) != 0) {
            cli_error(PPL_PROG, "writing %s failed: %s", a.kld_base, strerror(errno));
            goto out;
        }
        fprintf(stderr, "perplexity: saved the log-probabilities to %s\n", a.kld_base);
    }
    status = cli_engine_report(&en) < 0 ? 1 : 0;
out:
    if (k.out) {
        fclose(k.out);
        remove(a.kld_base); /* never leave a truncated base behind */
    }
    executor_kld_base_close(k.base);
    executor_kld_stats_fini(&k.st);
    free(k.rows);
    router_tokens_fini(&toks);
    router_vocab_destroy(vocab);
    cli_engine_close(&en);
    free(text);
    return status;
}
