/* router/cli/cmd_bench.c - `sluice bench`: prefill and decode tokens/s against memory bandwidth. */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"

static void bench_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice bench -m MODEL.gguf [-p P] [-n N] [-t T] [-r REPS]\n\n"
            "Measures, like llama-bench, prefill speed (a P-token prompt in one go) and decode\n"
            "speed (N tokens one at a time after a 1-token prompt), REPS times each, and in the\n"
            "same run the memory bandwidth limit (a multi-threaded streaming read of a buffer far\n"
            "larger than the caches). Decode reads every active weight once per token, so\n"
            "decode_tok_s * bytes_per_token / bandwidth says how close decode is to the limit.\n\n"
            "  -m, --model PATH     GGUF model\n"
            "  -p, --n-prompt P     prompt tokens for prefill; 0 = skip      [512]\n"
            "  -n, --n-gen N        generated tokens for decode; 0 = skip    [128]\n"
            "  -t, --threads N      threads                                  [physical cores]\n"
            "  -r, --repetitions R  runs of each test                        [5]\n"
            "  -b, --batch-size N   prompt tokens per forward batch          [512]\n"
            "  --cache-type T       KV cache type: f16 or q8_0               [f16]\n"
            "  --membw-size SIZE    bandwidth probe buffer                   [1G]\n");
}

struct bench_stat {
    double mean, sd;
};

static struct bench_stat bench_stats(const double *v, uint32_t n)
{
    struct bench_stat s = {0, 0};
    for (uint32_t i = 0; i < n; i++)
        s.mean += v[i];
    s.mean /= n;
    for (uint32_t i = 0; i < n && n > 1; i++)
        s.sd += (v[i] - s.mean) * (v[i] - s.mean);
    s.sd = n > 1 ? sqrt(s.sd / (n - 1)) : 0.0;
    return s;
}

int cli_cmd_bench(int argc, char **argv)
{
    const char              *model = NULL;
    uint32_t                 n_prompt = 512, n_gen = 128, n_threads = 0, reps = 5, n_batch = 0;
    uint64_t                 membw_bytes = 1ull << 30;
    enum executor_cache_type cache = EXECUTOR_CACHE_F16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bench_usage(stdout);
            return 0;
        }
        if (a[0] != '-') {
            fprintf(stderr, "error: unexpected argument '%s'\n", a);
            return 2;
        }
        if (!(v = cli_next_arg(argc, argv, &i)))
            return 2;
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            model = v;
        else if (strcmp(a, "-p") == 0 || strcmp(a, "--n-prompt") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 20, &n_prompt);
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-gen") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 20, &n_gen);
        else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0)
            ok = cli_parse_u32(a, v, 1, 256, &n_threads);
        else if (strcmp(a, "-r") == 0 || strcmp(a, "--repetitions") == 0)
            ok = cli_parse_u32(a, v, 1, 1000, &reps);
        else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch-size") == 0)
            ok = cli_parse_u32(a, v, 1, 1u << 16, &n_batch);
        else if (strcmp(a, "--cache-type") == 0) {
            ok = executor_cache_type_parse(v, &cache) == 0;
            if (!ok)
                fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
        } else if (strcmp(a, "--membw-size") == 0) {
            ok = common_parse_size(v, &membw_bytes) == 0 && membw_bytes > 0;
            if (!ok)
                fprintf(stderr, "error: --membw-size expects a size like 1G, got '%s'\n", v);
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            bench_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!model) {
        fprintf(stderr, "error: no model given (-m MODEL.gguf); see sluice bench --help\n");
        return 2;
    }
    int                    status = 1, rc;
    struct common_errmsg   e = {{0}};
    struct executor_model *m = NULL;
    struct executor_pool  *pool = NULL;
    struct executor_ctx   *c = NULL;
    int32_t               *tokens = NULL;
    float                 *logits = NULL;
    double                *pp = calloc(reps, sizeof(double)), *tg = calloc(reps, sizeof(double));
    if (!pp || !tg)
        goto out;
    executor_kernels_init();
    if ((rc = executor_model_open(model, &(struct executor_model_opts){.populate = true}, &m, &e)) <
        0) {
        fprintf(stderr, "error: %s: %s\n", model, e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    if ((rc = executor_pool_create(n_threads, &pool)) < 0) {
        fprintf(stderr, "error: thread pool: %s\n", common_strerror(rc));
        goto out;
    }
    const struct common_model *d = executor_model_desc(m);
    uint32_t                   n_ctx = (n_prompt > n_gen + 1 ? n_prompt : n_gen + 1);
    struct executor_ctx_opts   co = {
          .n_ctx = n_ctx, .n_batch = n_batch, .cache_type = cache, .pool = pool};
    if ((rc = executor_ctx_create(m, &co, &c, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    const uint32_t n_vocab = executor_ctx_n_vocab(c);
    tokens = malloc((size_t)(n_prompt + 1) * sizeof(*tokens));
    logits = malloc((size_t)n_vocab * sizeof(*logits));
    if (!tokens || !logits)
        goto out;
    /* Deterministic spread of ids; llama-bench uses random ones too. */
    for (uint32_t i = 0; i <= n_prompt; i++)
        tokens[i] = (int32_t)(((uint64_t)i * 7919u + 1u) % n_vocab);

    char sz[32], act[32];
    printf("model: %s (%s, %s, %s), %u threads, isa %s, cache %s\n", model, d->arch_name,
           common_model_is_moe(d) ? "moe" : "dense", common_format_size(d->bytes_total, sz, 32),
           executor_pool_n_threads(pool), executor_isa_name(executor_kernels_active()),
           executor_cache_type_name(cache));
    fflush(stdout);
    /* Warm-up: one short run so page faults and first-touch costs stay out of the timings. */
    executor_ctx_reset(c);
    if ((rc = executor_ctx_decode(c, tokens, n_prompt ? (n_prompt < 16 ? n_prompt : 16) : 1, logits,
                                  NULL, &e)) < 0) {
        fprintf(stderr, "error: %s\n", e.text);
        goto out;
    }
    for (uint32_t r = 0; r < reps && n_prompt; r++) {
        executor_ctx_reset(c);
        uint64_t t0 = common_now_ns();
        if ((rc = executor_ctx_decode(c, tokens, n_prompt, logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text);
            goto out;
        }
        pp[r] = n_prompt / ((double)(common_now_ns() - t0) / 1e9);
    }
    for (uint32_t r = 0; r < reps && n_gen; r++) {
        executor_ctx_reset(c);
        int32_t id = tokens[0];
        if ((rc = executor_ctx_decode(c, &id, 1, logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text);
            goto out;
        }
        uint64_t t0 = common_now_ns();
        for (uint32_t i = 0; i < n_gen; i++) {
            id = tokens[(i + 1) % (n_prompt + 1)];
            if ((rc = executor_ctx_decode(c, &id, 1, logits, NULL, &e)) < 0) {
                fprintf(stderr, "error: %s\n", e.text);
                goto out;
            }
        }
        tg[r] = n_gen / ((double)(common_now_ns() - t0) / 1e9);
    }
    double bw = 0.0;
    if ((rc = executor_membw_measure(
             &(struct executor_membw_opts){.bytes = membw_bytes, .pool = pool}, &bw)) < 0) {
        fprintf(stderr, "error: bandwidth probe: %s\n", common_strerror(rc));
        goto out;
    }
    struct bench_stat sp = bench_stats(pp, reps), sg = bench_stats(tg, reps);
    if (n_prompt)
        printf("pp%-6u %10.2f ± %.2f tok/s  (prefill, %u reps)\n", n_prompt, sp.mean, sp.sd, reps);
    if (n_gen)
        printf("tg%-6u %10.2f ± %.2f tok/s  (decode, %u reps)\n", n_gen, sg.mean, sg.sd, reps);
    printf("memory bandwidth (streaming read, %u threads): %.2f GB/s\n",
           executor_pool_n_threads(pool), bw / 1e9);
    printf("weights touched per token: %llu bytes (%s)\n", (unsigned long long)d->bytes_active,
           common_format_size(d->bytes_active, act, sizeof(act)));
    if (n_gen)
        printf("decode vs bandwidth limit: %.2f tok/s * %s / %.2f GB/s = %.3f (limit %.2f tok/s)\n",
               sg.mean, act, bw / 1e9, sg.mean * (double)d->bytes_active / bw,
               bw / (double)d->bytes_active);
    status = 0;
out:
    free(pp);
    free(tg);
    free(tokens);
    free(logits);
    executor_ctx_destroy(c);
    executor_pool_destroy(pool);
    executor_model_destroy(m);
    return status;
}
