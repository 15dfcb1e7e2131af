/* cli/cmd_bench.c - `sluice bench`: prefill and decode tokens/s against memory bandwidth. */
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
            "  --membw-size SIZE    bandwidth probe buffer                   [1G]\n"
            "  --io-probe           also measure the storage limit with the fetcher's engine:\n"
            "                       cold random expert-part reads at the queue depth used and\n"
            "                       at 1 (before the run), and the decode's own loads read\n"
            "                       again at that depth, nothing computed (after it)\n"
            "  --probe-size SIZE    bytes read by each storage probe          [512M]\n\n"
            "With --ram-budget or --io the experts stream through the fetcher: no warm-up run\n"
            "(drop the page cache first for a cold run), no memory-bandwidth probe; each phase\n"
            "reports bytes read from storage per token (/proc/self/io) and the expert hit rate,\n"
            "and a last line 'result: key=value ...' sums the run up for scripts.\n");
    fputs(CLI_STREAM_USAGE, f);
}

/* Storage bytes this process has read (/proc/self/io read_bytes), 0 when unknown. */
static uint64_t bench_read_bytes(void)
{
    FILE              *f = fopen("/proc/self/io", "r");
    char               line[128];
    unsigned long long v = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "read_bytes: %llu", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* What one phase (prefill or decode) cost in I/O. */
struct bench_io {
    uint64_t read_bytes;              /* storage bytes (/proc/self/io) */
    uint64_t accesses, hits, fetched; /* expert trace deltas (fetched: bytes the fetcher read) */
};

static void bench_io_mark(struct cli_engine *en, struct bench_io *b)
{
    b->read_bytes = bench_read_bytes();
    b->accesses = b->hits = b->fetched = 0;
    if (en->fetcher) {
        struct fetcher_trace_totals t;
        fetcher_trace_totals(fetcher_get_trace(en->fetcher), &t);
        b->accesses = t.accesses;
        b->hits = t.hits;
        b->fetched = t.bytes_read;
    }
}

static void bench_io_since(struct cli_engine *en, const struct bench_io *a, struct bench_io *d)
{
    struct bench_io now;
    bench_io_mark(en, &now);
    d->read_bytes += now.read_bytes - a->read_bytes;
    d->accesses += now.accesses - a->accesses;
    d->hits += now.hits - a->hits;
    d->fetched += now.fetched - a->fetched;
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

/* The storage limit with the fetcher's engine, on its own model handle while no engine exists
 * (its buffers count against the same memory cap): without keys, cold random reads at queue
 * depth qd into *pr and at depth 1 into *pr1; with keys, a replay of those loads at qd into *pr.
 */
static int bench_probe(const char *path, const struct cli_stream_opts *so, uint64_t probe_bytes,
                       const struct fetcher_probe_key *keys, uint64_t n_keys,
                       struct fetcher_probe_result *pr, struct fetcher_probe_result *pr1)
{
    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    struct common_model  d;
    int                  rc = common_gguf_open(path, NULL, &g, &e);
    if (rc < 0 || (rc = common_model_init(&d, g, &e)) < 0) {
        fprintf(stderr, "error: %s: %s\n", path, e.text[0] ? e.text : common_strerror(rc));
        common_gguf_close(g);
        return rc;
    }
    enum fetcher_io_mode pm = so->io_set && so->io != FETCHER_IO_MMAP ? so->io : FETCHER_IO_AUTO;
    uint32_t             qd = so->queue_depth ? so->queue_depth : 32;
    if (keys)
        rc = fetcher_probe_read(g, &d,
                                &(struct fetcher_probe_opts){
                                    .io = pm, .queue_depth = qd, .keys = keys, .n_keys = n_keys},
                                pr, &e);
    else if ((rc = fetcher_probe_read(g, &d,
                                      &(struct fetcher_probe_opts){
                                          .io = pm, .queue_depth = qd, .max_bytes = probe_bytes},
                                      pr, &e)) >= 0)
        rc = fetcher_probe_read(
            g, &d,
            &(struct fetcher_probe_opts){
                .io = pm, .queue_depth = 1, .max_bytes = probe_bytes / 4, .seed = 2},
            pr1, &e);
    if (rc < 0)
        fprintf(stderr, "error: storage probe: %s\n", e.text[0] ? e.text : common_strerror(rc));
    common_model_fini(&d);
    common_gguf_close(g);
    return rc;
}

int cli_cmd_bench(int argc, char **argv)
{
    const char            *model = NULL;
    uint32_t               n_prompt = 512, n_gen = 128, n_threads = 0, reps = 5, n_batch = 0;
    uint64_t               membw_bytes = 1ull << 30, probe_bytes = 512ull << 20;
    enum common_cache_type cache = COMMON_CACHE_F16;
    struct cli_stream_opts so = {0};
    bool                   io_probe = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            bench_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--io-probe") == 0) {
            io_probe = true;
            continue;
        }
        int taken = cli_take_option(argc, argv, &i, &so, &v);
        if (taken < 0)
            return 2;
        if (taken > 0)
            continue;
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
            ok = common_cache_type_parse(v, &cache) == 0;
            if (!ok)
                fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
        } else if (strcmp(a, "--membw-size") == 0) {
            ok = common_parse_size(v, &membw_bytes) == 0 && membw_bytes > 0;
            if (!ok)
                fprintf(stderr, "error: --membw-size expects a size like 1G, got '%s'\n", v);
        } else if (strcmp(a, "--probe-size") == 0) {
            ok = common_parse_size(v, &probe_bytes) == 0 && probe_bytes > 0;
            if (!ok)
                fprintf(stderr, "error: --probe-size expects a size like 512M, got '%s'\n", v);
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
    const bool           stream = cli_stream_is_on(&so);
    int                  status = 1, rc;
    struct common_errmsg e = {{0}};
    struct cli_engine    en = {0};
    int32_t             *tokens = NULL;
    float               *logits = NULL;
    double              *pp = calloc(reps, sizeof(double)), *tg = calloc(reps, sizeof(double));
    struct bench_io      io_pp = {0}, io_tg = {0}, mark;
    struct fetcher_probe_result rp = {0};
    struct fetcher_probe_key   *log = NULL; /* the timed decode steps' loads (--io-probe) */
    uint64_t                    n_log = 0;
    /* [log_from[r], log_to[r]) of the load log: repetition r's timed decode steps */
    uint64_t *log_from = calloc(reps, sizeof(uint64_t)), *log_to = calloc(reps, sizeof(uint64_t));
    if (!pp || !tg)
        goto out;
    executor_kernels_init();
    struct fetcher_probe_result pr = {0}, pr1 = {0};
    if (io_probe && stream && bench_probe(model, &so, probe_bytes, NULL, 0, &pr, &pr1) < 0)
        goto out;
    uint32_t               n_ctx = (n_prompt > n_gen + 1 ? n_prompt : n_gen + 1);
    struct cli_engine_opts eo = {.n_threads = n_threads,
                                 .ctx = {.n_ctx = n_ctx, .n_batch = n_batch, .cache_type = cache},
                                 .logit_rows = 1,
                                 .populate = !stream};
    if (cli_engine_open(&en, model, &so, &eo) < 0)
        goto out;
    struct executor_ctx        *c = en.ctx;
    struct executor_threadpool *pool = en.pool;
    const struct common_model  *d = executor_model_desc(en.model);
    const uint32_t              n_vocab = executor_ctx_n_vocab(c);
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
           executor_threadpool_n_threads(pool), executor_isa_name(executor_kernels_active()),
           common_cache_type_name(cache));
    fflush(stdout);
    /* Warm-up: one short run so page faults and first-touch costs stay out of the timings
     * (not when streaming: the cold start is part of what is measured). */
    if (!stream) {
        executor_ctx_reset(c);
        if ((rc = executor_ctx_decode(c, tokens, n_prompt ? (n_prompt < 16 ? n_prompt : 16) : 1,
                                      logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text);
            goto out;
        }
    }
    for (uint32_t r = 0; r < reps && n_prompt; r++) {
        executor_ctx_reset(c);
        bench_io_mark(&en, &mark);
        uint64_t t0 = common_now_ns();
        if ((rc = executor_ctx_decode(c, tokens, n_prompt, logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text);
            goto out;
        }
        pp[r] = n_prompt / ((double)(common_now_ns() - t0) / 1e9);
        bench_io_since(&en, &mark, &io_pp);
    }
    /* The loads of the timed decode steps are logged for the replay probe. */
    bool logging = io_probe && stream && n_gen && en.fetcher && log_from && log_to &&
                   fetcher_load_log_start(en.fetcher, (uint64_t)(n_gen + 1) * reps * d->hp.n_layer *
                                                          d->hp.n_expert) == 0;
    for (uint32_t r = 0; r < reps && n_gen; r++) {
        executor_ctx_reset(c);
        int32_t id = tokens[0];
        if ((rc = executor_ctx_decode(c, &id, 1, logits, NULL, &e)) < 0) {
            fprintf(stderr, "error: %s\n", e.text);
            goto out;
        }
        bench_io_mark(&en, &mark);
        if (logging)
            log_from[r] = fetcher_load_log_count(en.fetcher);
        uint64_t t0 = common_now_ns();
        for (uint32_t i = 0; i < n_gen; i++) {
            id = tokens[(i + 1) % (n_prompt + 1)];
            if ((rc = executor_ctx_decode(c, &id, 1, logits, NULL, &e)) < 0) {
                fprintf(stderr, "error: %s\n", e.text);
                goto out;
            }
        }
        tg[r] = n_gen / ((double)(common_now_ns() - t0) / 1e9);
        bench_io_since(&en, &mark, &io_tg);
        if (logging)
            log_to[r] = fetcher_load_log_count(en.fetcher);
    }
    if (logging) { /* keep the timed steps' loads only */
        n_log = fetcher_load_log_take(en.fetcher, &log);
        uint64_t k = 0;
        for (uint32_t r = 0; r < reps && log; r++)
            for (uint64_t i = log_from[r]; i < log_to[r] && i < n_log; i++)
                log[k++] = log[i];
        n_log = log ? k : 0;
    }
    struct bench_stat sp = bench_stats(pp, reps), sg = bench_stats(tg, reps);
    if (n_prompt)
        printf("pp%-6u %10.2f ± %.2f tok/s  (prefill, %u reps)\n", n_prompt, sp.mean, sp.sd, reps);
    if (n_gen)
        printf("tg%-6u %10.2f ± %.2f tok/s  (decode, %u reps)\n", n_gen, sg.mean, sg.sd, reps);
    if (!stream) {
        double bw = 0.0;
        if ((rc = executor_membw_measure(
                 &(struct executor_membw_opts){.bytes = membw_bytes, .pool = pool}, &bw)) < 0) {
            fprintf(stderr, "error: bandwidth probe: %s\n", common_strerror(rc));
            goto out;
        }
        printf("memory bandwidth (streaming read, %u threads): %.2f GB/s\n",
               executor_threadpool_n_threads(pool), bw / 1e9);
        printf("weights touched per token: %llu bytes (%s)\n", (unsigned long long)d->bytes_active,
               common_format_size(d->bytes_active, act, sizeof(act)));
        if (n_gen)
            printf("decode vs bandwidth limit: %.2f tok/s * %s / %.2f GB/s = %.3f (limit %.2f "
                   "tok/s)\n",
                   sg.mean, act, bw / 1e9, sg.mean * (double)d->bytes_active / bw,
                   bw / (double)d->bytes_active);
        status = 0;
        goto out;
    }

    /* Streaming: I/O per phase, the storage limit, the ratios. */
    const double pp_tok = (double)n_prompt * reps, tg_tok = (double)n_gen * reps;
    const double pp_bpt = pp_tok > 0 ? (double)io_pp.read_bytes / pp_tok : 0.0;
    const double tg_bpt = tg_tok > 0 ? (double)io_tg.read_bytes / tg_tok : 0.0;
    const double tg_hit = io_tg.accesses ? (double)io_tg.hits / (double)io_tg.accesses : 0.0;
    const double pp_hit = io_pp.accesses ? (double)io_pp.hits / (double)io_pp.accesses : 0.0;
    printf("prefill: %.0f bytes read per token, expert hit rate %.1f%%\n", pp_bpt, 100.0 * pp_hit);
    printf("decode:  %.0f bytes read per token (%s), expert hit rate %.1f%%\n", tg_bpt,
           common_format_size((uint64_t)tg_bpt, act, sizeof(act)), 100.0 * tg_hit);
    fflush(stdout);
    (void)cli_engine_report(&en);
    const char *io_name =
        so.mmap_advise ? "mmap-advise" : fetcher_io_mode_name(fetcher_get_io_mode(en.fetcher));
    if (io_probe) {
        printf("storage limit, cold (%s%s, random expert parts of %s): %.1f MB/s at queue depth "
               "%u, %.1f MB/s at depth 1\n",
               fetcher_io_mode_name(pr.mode), pr.direct ? " O_DIRECT" : "",
               common_format_size(pr.read_bytes, sz, sizeof(sz)), pr.bytes_per_s / 1e6,
               pr.queue_depth, pr1.bytes_per_s / 1e6);
        fflush(stdout);
        /* The decode's own loads read again, same order and depth, nothing computed: the storage
         * limit for exactly these reads (with whatever caches below us hold them, as they did
         * during the run). The engine is closed first: the probe's buffers fit the same cap. */
        cli_engine_close(&en);
        if (n_log > 0 && bench_probe(model, &so, 0, log, n_log, &rp, NULL) < 0)
            goto out;
        if (n_log > 0)
            printf("storage limit, replay of the decode's %llu loads (%s in %s reads, queue depth "
                   "%u): %.1f MB/s\n",
                   (unsigned long long)n_log, common_format_size(rp.bytes, sz, sizeof(sz)),
                   common_format_size(rp.read_bytes, act, sizeof(act)), rp.queue_depth,
                   rp.bytes_per_s / 1e6);
        const double lim = n_log > 0 ? rp.bytes_per_s : pr.bytes_per_s;
        if (n_gen && tg_bpt > 0 && lim > 0)
            printf("decode vs storage limit (%s): %.2f tok/s vs %.2f MB/s / %.0f bytes per token "
                   "= %.2f tok/s: ratio %.3f\n",
                   n_log > 0 ? "replay" : "cold", sg.mean, lim / 1e6, tg_bpt, lim / tg_bpt,
                   sg.mean * tg_bpt / lim);
    }
    printf(
        "result: io=%s pp_tok_s=%.3f pp_sd=%.3f tg_tok_s=%.3f tg_sd=%.3f pp_bytes_per_tok=%.0f "
        "tg_bytes_per_tok=%.0f pp_hit_rate=%.4f tg_hit_rate=%.4f probe_bw=%.0f probe_bw_qd1=%.0f "
        "probe_read_bytes=%llu replay_bw=%.0f replay_loads=%llu\n",
        io_name, sp.mean, sp.sd, sg.mean, sg.sd, pp_bpt, tg_bpt, pp_hit, tg_hit, pr.bytes_per_s,
        pr1.bytes_per_s, (unsigned long long)pr.read_bytes, rp.bytes_per_s,
        (unsigned long long)n_log);
    status = 0;
out:
    free(log);
    free(log_from);
    free(log_to);
    free(pp);
    free(tg);
    free(tokens);
    free(logits);
    cli_engine_close(&en);
    return status;
}
