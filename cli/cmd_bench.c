/* cli/cmd_bench.c - `sluice bench`: prefill and decode tokens/s against memory bandwidth. */
#include "cli.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "executor.h"

#define BENCH_PROG       "sluice bench"
#define BENCH_MAX_VALUES 32   /* values of one -p or -n list */
#define BENCH_MAX_REPS   1000 /* most repetitions (-r) */

static const char bench_description[] =
    "Measures, like llama-bench, prefill speed (a P-token prompt in one go) and decode speed (N "
    "tokens one at a time after a 1-token prompt), REPS times each, and in the same run the "
    "memory bandwidth limit (a multi-threaded streaming read of a buffer far larger than the "
    "caches). Decode reads every active weight once per token, so decode_tok_s * bytes_per_token "
    "/ bandwidth says how close decode is to the limit. -p and -n take comma-separated lists, as "
    "llama-bench's: one prefill test per value of -p, one decode test per value of -n, in one "
    "table.";

static const char bench_epilog[] =
    "With --ram-budget or --io the experts stream through the fetcher: no warm-up run (drop the "
    "page cache first for a cold run), no memory-bandwidth probe; each test reports bytes read "
    "from storage per token (/proc/self/io) and the expert hit rate. In the md format, the table "
    "is followed by the bandwidth or storage limits and a last line 'result: key=value ...' that "
    "sums up the first prefill and the first decode test for scripts. csv and json have one "
    "record per test (json adds the samples), nothing else on stdout.";

enum bench_format { BENCH_MD, BENCH_CSV, BENCH_JSON };

/* What the command line asked for. */
struct bench_args {
    const char                *model;                    /* -m: borrowed from argv */
    uint32_t                   p_v[BENCH_MAX_VALUES];    /* -p values */
    uint32_t                   n_v[BENCH_MAX_VALUES];    /* -n values */
    struct common_opt_u32_list p, n;                     /* -p, -n: into p_v, n_v */
    uint32_t                   n_threads;                /* -t: 0 = physical cores */
    uint32_t                   reps;                     /* -r */
    uint32_t                   n_batch;                  /* -b: 0 = executor default */
    uint64_t                   membw_bytes, probe_bytes; /* --membw-size, --probe-size */
    enum common_cache_type     cache;                    /* --cache-type */
    int                        format;                   /* -o: enum bench_format */
    bool                       io_probe;                 /* --io-probe */
    struct cli_stream_opts     so;                       /* the streaming options */
};

/* What one phase (the repetitions of one test) cost in I/O. */
struct bench_io {
    uint64_t read_bytes;              /* storage bytes (/proc/self/io) */
    uint64_t accesses, hits, fetched; /* expert trace deltas (fetched: bytes the fetcher read) */
};

/* One row of the table: a prefill or a decode test and its samples. */
struct bench_test {
    bool            gen;      /* decode (tgN) when true, prefill (ppN) otherwise */
    uint32_t        n;        /* prompt tokens (pp) or generated tokens (tg) */
    uint64_t       *ns;       /* owned: one duration per repetition */
    uint64_t       *log_from; /* owned: per repetition, its first load in the load log */
    uint64_t       *log_to;   /* owned: per repetition, the end of its loads in the load log */
    struct bench_io io;       /* I/O of all repetitions */
    char            time[32]; /* start, RFC 3339 (test_time) */
};

/* What the model is, kept after the engine is closed (the replay probe closes it). */
struct bench_model {
    char     type[64];     /* "llama moe" */
    uint64_t bytes_total;  /* tensor data */
    uint64_t bytes_active; /* weights touched per token */
    uint32_t n_threads;    /* threads of the pool */
    uint64_t log_keys;     /* load-log keys one decode token can add (n_layer * n_expert) */
};

/* A run: the engine, the tests and the limits measured around them. */
struct bench_run {
    const struct bench_args    *a;       /* borrowed: the options */
    bool                        stream;  /* experts stream through the fetcher */
    struct cli_engine           en;      /* owned: model, pool, context */
    struct bench_model          model;   /* copied at open */
    int32_t                    *tokens;  /* owned: max_p + 1 prompt ids */
    float                      *logits;  /* owned: n_vocab */
    uint32_t                    max_p;   /* longest prefill */
    struct bench_test          *tests;   /* owned: n_tests rows, prefills first */
    uint32_t                    n_tests; /* rows */
    double                      membw;   /* bytes/s; 0 = not measured (streaming) */
    struct fetcher_probe_result pr, pr1; /* cold storage probes (--io-probe) */
    struct fetcher_probe_result rp;      /* replay of the decode's loads (--io-probe) */
    struct fetcher_probe_key   *log;     /* owned: the timed decode steps' loads */
    uint64_t                    n_log;   /* keys in log */
    bool                        logging; /* the load log is on */
    const char                 *io_name; /* static: "none" or the fetcher's mode */
    int                         status;  /* exit status so far */
};

/* ---- options --------------------------------------------------------------------------------- */

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int bench_parse(int argc, char **argv, struct bench_args *a)
{
    static const char *const formats[] = {"md", "csv", "json", NULL};
    struct cli_stream_table  st;
    *a = (struct bench_args){.p_v = {512},
                             .n_v = {128},
                             .reps = 5,
                             .membw_bytes = 1ull << 30,
                             .probe_bytes = 512ull << 20,
                             .cache = COMMON_CACHE_F16,
                             .format = BENCH_MD};
    a->p = (struct common_opt_u32_list){.v = a->p_v, .cap = BENCH_MAX_VALUES, .n = 1};
    a->n = (struct common_opt_u32_list){.v = a->n_v, .cap = BENCH_MAX_VALUES, .n = 1};
    cli_stream_table_init(&st, &a->so);
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->model,
         .metavar = "PATH",
         .help = "GGUF model",
         .required = true},
        {.name = "n-prompt",
         .short_name = "p",
         .type = COMMON_OPT_U32_LIST,
         .target = &a->p,
         .max = 1u << 20,
         .help = "prompt tokens of each prefill test; 0 = none",
         .def = "512"},
        {.name = "n-gen",
         .short_name = "n",
         .type = COMMON_OPT_U32_LIST,
         .target = &a->n,
         .max = 1u << 20,
         .help = "generated tokens of each decode test; 0 = none",
         .def = "128"},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &a->n_threads,
         .min = 1,
         .max = 256,
         .help = "threads",
         .def = "physical cores"},
        {.name = "repetitions",
         .short_name = "r",
         .type = COMMON_OPT_U32,
         .target = &a->reps,
         .min = 1,
         .max = BENCH_MAX_REPS,
         .help = "runs of each test",
         .def = "5"},
        {.name = "batch-size",
         .short_name = "b",
         .type = COMMON_OPT_U32,
         .target = &a->n_batch,
         .min = 1,
         .max = 1u << 16,
         .help = "prompt tokens per forward batch",
         .def = "512"},
        {.name = "cache-type",
         .short_name = "ctk",
         .type = COMMON_OPT_CALLBACK,
         .target = &a->cache,
         .parse = cli_parse_cache_type,
         .metavar = "f16|q8_0",
         .help = "KV cache type",
         .def = "f16"},
        {.name = "output",
         .short_name = "o",
         .type = COMMON_OPT_CHOICE,
         .target = &a->format,
         .choices = formats,
         .help = "md: a markdown table and the limits; csv or json: one record per test",
         .def = "md"},
        {.name = "membw-size",
         .type = COMMON_OPT_SIZE,
         .target = &a->membw_bytes,
         .min = 1,
         .help = "bandwidth probe buffer",
         .def = "1G"},
        {.name = "io-probe",
         .type = COMMON_OPT_SWITCH,
         .target = &a->io_probe,
         .help = "also measure the storage limit with the fetcher's engine: cold random "
                 "expert-part reads at the queue depth used and at 1 (before the run), and the "
                 "decode's own loads read again at that depth, nothing computed (after it)"},
        {.name = "probe-size",
         .type = COMMON_OPT_SIZE,
         .target = &a->probe_bytes,
         .min = 1,
         .help = "bytes read by each storage probe",
         .def = "512M"},
        {0},
    };
    const struct common_opt_group groups[] = {{.title = CLI_STREAM_TITLE, .opts = st.rows}, {0}};
    const struct common_opts_spec spec = {
        .prog = BENCH_PROG,
        .usage = BENCH_PROG " -m MODEL.gguf [-p P,P,...] [-n N,N,...] [-t T] [-r REPS] "
                            "[-o md|csv|json]",
        .description = bench_description,
        .epilog = bench_epilog,
        .opts = rows,
        .groups = groups,
    };
    return common_opts_parse(&spec, argc, argv);
}

/* ---- measuring ------------------------------------------------------------------------------- */

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
        cli_error_path(BENCH_PROG, path, rc, &e);
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
        cli_error(BENCH_PROG, "storage probe: %s", e.text[0] ? e.text : common_strerror(rc));
    common_model_fini(&d);
    common_gguf_close(g);
    return rc;
}

/* One prefill test or decode test per value of -p and -n (0 skipped), prefills first. */
static int bench_plan(struct bench_run *r)
{
    const struct bench_args *a = r->a;
    r->tests = calloc(a->p.n + a->n.n, sizeof(*r->tests));
    if (!r->tests)
        return COMMON_ENOMEM;
    for (uint32_t k = 0; k < a->p.n + a->n.n; k++) {
        bool     gen = k >= a->p.n;
        uint32_t n = gen ? a->n_v[k - a->p.n] : a->p_v[k];
        if (n == 0)
            continue;
        struct bench_test *t = &r->tests[r->n_tests++];
        t->gen = gen;
        t->n = n;
        t->ns = calloc(a->reps, sizeof(*t->ns));
        t->log_from = calloc(a->reps, sizeof(*t->log_from));
        t->log_to = calloc(a->reps, sizeof(*t->log_to));
        if (!t->ns || !t->log_from || !t->log_to)
            return COMMON_ENOMEM;
        if (!gen && n > r->max_p)
            r->max_p = n;
    }
    return COMMON_OK;
}

/* Opens the engine with a context for the longest test and the prompt ids; prints the model
 * line (stdout for md, stderr otherwise). */
static int bench_open(struct bench_run *r)
{
    const struct bench_args *a = r->a;
    uint32_t                 n_ctx = r->max_p > 1 ? r->max_p : 1;
    for (uint32_t k = 0; k < r->n_tests; k++)
        if (r->tests[k].gen && r->tests[k].n + 1 > n_ctx)
            n_ctx = r->tests[k].n + 1;
    struct cli_engine_opts eo = {
        .prog = BENCH_PROG,
        .n_threads = a->n_threads,
        .ctx = {.n_ctx = n_ctx, .n_batch = a->n_batch, .cache_type = a->cache},
        .logit_rows = 1,
        .populate = !r->stream};
    int rc = cli_engine_open(&r->en, a->model, &a->so, &eo);
    if (rc < 0)
        return rc;
    const struct common_model *d = executor_model_desc(r->en.model);
    const uint32_t             n_vocab = executor_ctx_n_vocab(r->en.ctx);
    snprintf(r->model.type, sizeof(r->model.type), "%s %s", d->arch_name,
             common_model_is_moe(d) ? "moe" : "dense");
    r->model.bytes_total = d->bytes_total;
    r->model.bytes_active = d->bytes_active;
    r->model.n_threads = executor_threadpool_n_threads(r->en.pool);
    r->model.log_keys = (uint64_t)d->hp.n_layer * d->hp.n_expert;
    r->io_name = !r->en.fetcher      ? "none"
                 : a->so.mmap_advise ? "mmap-advise"
                                     : fetcher_io_mode_name(fetcher_get_io_mode(r->en.fetcher));
    r->tokens = malloc((size_t)(r->max_p + 1) * sizeof(*r->tokens));
    r->logits = malloc((size_t)n_vocab * sizeof(*r->logits));
    if (!r->tokens || !r->logits) {
        cli_error(BENCH_PROG, "out of memory");
        return COMMON_ENOMEM;
    }
    /* Deterministic spread of ids; llama-bench uses random ones too. */
    for (uint32_t i = 0; i <= r->max_p; i++)
        r->tokens[i] = (int32_t)(((uint64_t)i * 7919u + 1u) % n_vocab);
    char sz[32];
    fprintf(a->format == BENCH_MD ? stdout : stderr,
            "model: %s (%s, %s, %s), %u threads, isa %s, cache %s\n", a->model, d->arch_name,
            common_model_is_moe(d) ? "moe" : "dense", common_format_size(d->bytes_total, sz, 32),
            r->model.n_threads, executor_isa_name(executor_kernels_active()),
            common_cache_type_name(a->cache));
    fflush(a->format == BENCH_MD ? stdout : stderr);
    return COMMON_OK;
}

/* Evaluates `n` tokens after those in the context; prints why not. */
static int bench_decode(struct bench_run *r, const int32_t *tokens, uint32_t n)
{
    struct common_errmsg e = {{0}};
    int                  rc = executor_ctx_decode(r->en.ctx, tokens, n, r->logits, NULL, &e);
    if (rc < 0)
        cli_error(BENCH_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
    return rc;
}

/* Repetition `rep` of a prefill test: the whole prompt in one go from an empty context. */
static int bench_run_prefill(struct bench_run *r, struct bench_test *t, uint32_t rep)
{
    struct bench_io mark;
    executor_ctx_reset(r->en.ctx);
    bench_io_mark(&r->en, &mark);
    uint64_t t0 = common_now_ns();
    int      rc = bench_decode(r, r->tokens, t->n);
    t->ns[rep] = common_now_ns() - t0;
    bench_io_since(&r->en, &mark, &t->io);
    return rc;
}

/* Repetition `rep` of a decode test: after a 1-token prompt, n tokens one at a time. */
static int bench_run_decode(struct bench_run *r, struct bench_test *t, uint32_t rep)
{
    struct bench_io mark;
    executor_ctx_reset(r->en.ctx);
    int rc = bench_decode(r, r->tokens, 1);
    if (rc < 0)
        return rc;
    bench_io_mark(&r->en, &mark);
    if (r->logging)
        t->log_from[rep] = fetcher_load_log_count(r->en.fetcher);
    uint64_t t0 = common_now_ns();
    for (uint32_t i = 0; i < t->n && rc >= 0; i++)
        rc = bench_decode(r, &r->tokens[(i + 1) % (r->max_p + 1)], 1);
    t->ns[rep] = common_now_ns() - t0;
    bench_io_since(&r->en, &mark, &t->io);
    if (r->logging)
        t->log_to[rep] = fetcher_load_log_count(r->en.fetcher);
    return rc;
}

/* Starts the load log for the replay probe, sized for every timed decode step. */
static void bench_log_start(struct bench_run *r)
{
    uint64_t steps = 0;
    for (uint32_t k = 0; k < r->n_tests; k++)
        if (r->tests[k].gen)
            steps += (uint64_t)(r->tests[k].n + 1) * r->a->reps;
    r->logging = r->a->io_probe && r->stream && steps > 0 && r->en.fetcher &&
                 fetcher_load_log_start(r->en.fetcher, steps * r->model.log_keys) == 0;
}

/* Takes the load log, keeping the loads of the timed decode steps only. */
static void bench_log_take(struct bench_run *r)
{
    if (!r->logging)
        return;
    uint64_t n = fetcher_load_log_take(r->en.fetcher, &r->log), k = 0;
    for (uint32_t i = 0; i < r->n_tests && r->log; i++) {
        const struct bench_test *t = &r->tests[i];
        for (uint32_t rep = 0; t->gen && rep < r->a->reps; rep++)
            for (uint64_t j = t->log_from[rep]; j < t->log_to[rep] && j < n; j++)
                r->log[k++] = r->log[j];
    }
    r->n_log = r->log ? k : 0;
    r->logging = false;
}

/* Warm-up (mapped models only), then every repetition of every test. */
static int bench_run_tests(struct bench_run *r)
{
    int rc;
    /* Warm-up: one short run so page faults and first-touch costs stay out of the timings (not
     * when streaming: the cold start is part of what is measured). */
    if (!r->stream) {
        executor_ctx_reset(r->en.ctx);
        if ((rc = bench_decode(r, r->tokens, r->max_p ? (r->max_p < 16 ? r->max_p : 16) : 1)) < 0)
            return rc;
    }
    bench_log_start(r);
    for (uint32_t k = 0; k < r->n_tests; k++) {
        struct bench_test *t = &r->tests[k];
        time_t             now = time(NULL);
        strftime(t->time, sizeof(t->time), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        for (uint32_t rep = 0; rep < r->a->reps; rep++)
            if ((rc = t->gen ? bench_run_decode(r, t, rep) : bench_run_prefill(r, t, rep)) < 0)
                return rc;
    }
    bench_log_take(r);
    return COMMON_OK;
}

/* After the tests: the memory bandwidth (mapped), or the replay of the decode's loads
 * (streaming with --io-probe: the engine is closed first, the probe's buffers fit the same
 * cap). Reports the engine (trace summary, peak RSS) before it closes. */
static int bench_limits(struct bench_run *r)
{
    int rc;
    if (cli_engine_report(&r->en) < 0)
        r->status = 1;
    if (!r->stream) {
        rc = executor_membw_measure(
            &(struct executor_membw_opts){.bytes = r->a->membw_bytes, .pool = r->en.pool},
            &r->membw);
        if (rc < 0)
            cli_error(BENCH_PROG, "bandwidth probe: %s", common_strerror(rc));
        return rc;
    }
    if (!r->a->io_probe)
        return COMMON_OK;
    cli_engine_close(&r->en);
    if (r->n_log > 0)
        return bench_probe(r->a->model, &r->a->so, 0, r->log, r->n_log, &r->rp, NULL);
    return COMMON_OK;
}

/* ---- results --------------------------------------------------------------------------------- */

/* Mean and sample standard deviation. */
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

/* Tokens per second of each repetition into ts[reps]. */
static void bench_samples_ts(const struct bench_test *t, uint32_t reps, double *ts)
{
    for (uint32_t i = 0; i < reps; i++)
        ts[i] = t->ns[i] ? (double)t->n * 1e9 / (double)t->ns[i] : 0.0;
}

/* Tokens per second over the repetitions. */
static struct bench_stat bench_ts(const struct bench_run *r, const struct bench_test *t)
{
    double ts[BENCH_MAX_REPS];
    bench_samples_ts(t, r->a->reps, ts);
    return bench_stats(ts, r->a->reps);
}

/* Storage bytes read per token of a test, and its expert hit rate. */
static double bench_bytes_per_token(const struct bench_run *r, const struct bench_test *t)
{
    return (double)t->io.read_bytes / ((double)t->n * r->a->reps);
}

static double bench_hit_rate(const struct bench_test *t)
{
    return t->io.accesses ? (double)t->io.hits / (double)t->io.accesses : 0.0;
}

/* The storage limit (bytes/s) a decode is compared with: the replay, else the cold probe. */
static double bench_storage_bw(const struct bench_run *r)
{
    return r->n_log > 0 ? r->rp.bytes_per_s : r->pr.bytes_per_s;
}

/* One value of a record: a number, a string, or nothing (not applicable). */
struct bench_value {
    enum { BENCH_NULL, BENCH_INT, BENCH_REAL, BENCH_STR } kind; /* which member holds it */
    long long   i;                                              /* BENCH_INT */
    double      d;                                              /* BENCH_REAL: finite */
    const char *s; /* BENCH_STR: borrowed from the run or argv */
};

/* The fields of a csv or json record, as llama-bench names those it has too. */
enum bench_field {
    BF_MODEL_FILENAME,
    BF_MODEL_TYPE,
    BF_MODEL_SIZE,
    BF_MODEL_ACTIVE_BYTES,
    BF_N_BATCH,
    BF_N_THREADS,
    BF_ISA,
    BF_TYPE_K,
    BF_TYPE_V,
    BF_IO,
    BF_RAM_BUDGET,
    BF_N_PROMPT,
    BF_N_GEN,
    BF_TEST_TIME,
    BF_AVG_NS,
    BF_STDDEV_NS,
    BF_AVG_TS,
    BF_STDDEV_TS,
    BF_MEMBW,
    BF_BW_LIMIT_TS,
    BF_BW_RATIO,
    BF_READ_BPT,
    BF_HIT_RATE,
    BF_STORAGE_BW,
    BF_STORAGE_LIMIT_TS,
    BF_STORAGE_RATIO,
    BF_COUNT
};

static const char *const bench_field_names[BF_COUNT] = {
    [BF_MODEL_FILENAME] = "model_filename",
    [BF_MODEL_TYPE] = "model_type",
    [BF_MODEL_SIZE] = "model_size",
    [BF_MODEL_ACTIVE_BYTES] = "model_active_bytes",
    [BF_N_BATCH] = "n_batch",
    [BF_N_THREADS] = "n_threads",
    [BF_ISA] = "isa",
    [BF_TYPE_K] = "type_k",
    [BF_TYPE_V] = "type_v",
    [BF_IO] = "io",
    [BF_RAM_BUDGET] = "ram_budget",
    [BF_N_PROMPT] = "n_prompt",
    [BF_N_GEN] = "n_gen",
    [BF_TEST_TIME] = "test_time",
    [BF_AVG_NS] = "avg_ns",
    [BF_STDDEV_NS] = "stddev_ns",
    [BF_AVG_TS] = "avg_ts",
    [BF_STDDEV_TS] = "stddev_ts",
    [BF_MEMBW] = "membw_bytes_per_s",
    [BF_BW_LIMIT_TS] = "bw_limit_ts",
    [BF_BW_RATIO] = "bw_ratio",
    [BF_READ_BPT] = "read_bytes_per_token",
    [BF_HIT_RATE] = "expert_hit_rate",
    [BF_STORAGE_BW] = "storage_bytes_per_s",
    [BF_STORAGE_LIMIT_TS] = "storage_limit_ts",
    [BF_STORAGE_RATIO] = "storage_ratio",
};

static struct bench_value bench_int(long long i)
{
    return (struct bench_value){.kind = BENCH_INT, .i = i};
}

static struct bench_value bench_real(double d)
{
    return (struct bench_value){.kind = isfinite(d) ? BENCH_REAL : BENCH_NULL, .d = d};
}

static struct bench_value bench_str(const char *s)
{
    return (struct bench_value){.kind = BENCH_STR, .s = s};
}

/* The limits of a decode test: memory bandwidth (mapped) or storage (streaming, --io-probe).
 * Prefill tests and unmeasured limits give nothing. */
static struct bench_value bench_limit_value(const struct bench_run *r, const struct bench_test *t,
                                            enum bench_field f)
{
    const double bpt = r->stream ? bench_bytes_per_token(r, t) : (double)r->model.bytes_active;
    const double bw = r->stream ? bench_storage_bw(r) : r->membw;
    const bool   is_mem = f == BF_BW_LIMIT_TS || f == BF_BW_RATIO;
    if (!t->gen || is_mem == r->stream || !(bw > 0.0) || !(bpt > 0.0))
        return (struct bench_value){.kind = BENCH_NULL};
    if (f == BF_BW_LIMIT_TS || f == BF_STORAGE_LIMIT_TS)
        return bench_real(bw / bpt);
    return bench_real(bench_ts(r, t).mean * bpt / bw);
}

/* Field f of the record of test t. */
static struct bench_value bench_field(const struct bench_run *r, const struct bench_test *t,
                                      enum bench_field f)
{
    const struct bench_args *a = r->a;
    double                   ns[BENCH_MAX_REPS];
    for (uint32_t i = 0; i < a->reps; i++)
        ns[i] = (double)t->ns[i];
    switch (f) {
    case BF_MODEL_FILENAME:
        return bench_str(a->model);
    case BF_MODEL_TYPE:
        return bench_str(r->model.type);
    case BF_MODEL_SIZE:
        return bench_int((long long)r->model.bytes_total);
    case BF_MODEL_ACTIVE_BYTES:
        return bench_int((long long)r->model.bytes_active);
    case BF_N_BATCH:
        return bench_int(a->n_batch ? a->n_batch : 512);
    case BF_N_THREADS:
        return bench_int(r->model.n_threads);
    case BF_ISA:
        return bench_str(executor_isa_name(executor_kernels_active()));
    case BF_TYPE_K:
    case BF_TYPE_V:
        return bench_str(common_cache_type_name(a->cache));
    case BF_IO:
        return bench_str(r->io_name);
    case BF_RAM_BUDGET:
        return bench_int((long long)a->so.ram_budget);
    case BF_N_PROMPT:
        return bench_int(t->gen ? 0 : t->n);
    case BF_N_GEN:
        return bench_int(t->gen ? t->n : 0);
    case BF_TEST_TIME:
        return bench_str(t->time);
    case BF_AVG_NS:
        return bench_int((long long)llround(bench_stats(ns, a->reps).mean));
    case BF_STDDEV_NS:
        return bench_int((long long)llround(bench_stats(ns, a->reps).sd));
    case BF_AVG_TS:
        return bench_real(bench_ts(r, t).mean);
    case BF_STDDEV_TS:
        return bench_real(bench_ts(r, t).sd);
    case BF_MEMBW:
        return r->stream ? (struct bench_value){.kind = BENCH_NULL} : bench_real(r->membw);
    case BF_READ_BPT:
        return r->stream ? bench_real(bench_bytes_per_token(r, t))
                         : (struct bench_value){.kind = BENCH_NULL};
    case BF_HIT_RATE:
        return r->stream ? bench_real(bench_hit_rate(t)) : (struct bench_value){.kind = BENCH_NULL};
    case BF_STORAGE_BW:
        return r->stream && a->io_probe ? bench_real(bench_storage_bw(r))
                                        : (struct bench_value){.kind = BENCH_NULL};
    case BF_BW_LIMIT_TS:
    case BF_BW_RATIO:
    case BF_STORAGE_LIMIT_TS:
    case BF_STORAGE_RATIO:
        return bench_limit_value(r, t, f);
    case BF_COUNT:
        break;
    }
    return (struct bench_value){.kind = BENCH_NULL};
}

/* A CSV cell: strings quoted (quotes doubled), numbers bare, nothing empty. */
static void bench_csv_value(const struct bench_value *v)
{
    switch (v->kind) {
    case BENCH_NULL:
        break;
    case BENCH_INT:
        printf("%lld", v->i);
        break;
    case BENCH_REAL:
        printf("%.6f", v->d);
        break;
    case BENCH_STR:
        putchar('"');
        for (const char *p = v->s; *p; p++) {
            if (*p == '"')
                putchar('"');
            putchar(*p);
        }
        putchar('"');
        break;
    }
}

/* csv: one header line, one line per test. */
static int bench_print_csv(const struct bench_run *r)
{
    for (int f = 0; f < BF_COUNT; f++)
        printf("%s%s", f ? "," : "", bench_field_names[f]);
    putchar('\n');
    for (uint32_t k = 0; k < r->n_tests; k++) {
        for (int f = 0; f < BF_COUNT; f++) {
            struct bench_value v = bench_field(r, &r->tests[k], (enum bench_field)f);
            if (f)
                putchar(',');
            bench_csv_value(&v);
        }
        putchar('\n');
    }
    return fflush(stdout) == 0 ? COMMON_OK : COMMON_EIO;
}

/* The json record of one test: the csv fields, then the samples as llama-bench writes them. */
static json_t *bench_json_record(const struct bench_run *r, const struct bench_test *t)
{
    json_t *o = json_object(), *ns = json_array(), *ts = json_array();
    double  tsv[BENCH_MAX_REPS];
    if (!o || !ns || !ts) {
        json_decref(o);
        json_decref(ns);
        json_decref(ts);
        return NULL;
    }
    for (int f = 0; f < BF_COUNT; f++) {
        struct bench_value v = bench_field(r, t, (enum bench_field)f);
        json_t            *j = v.kind == BENCH_INT    ? json_integer(v.i)
                               : v.kind == BENCH_REAL ? json_real(v.d)
                               : v.kind == BENCH_STR  ? json_string(v.s)
                                                      : json_null();
        json_object_set_new(o, bench_field_names[f], j);
    }
    bench_samples_ts(t, r->a->reps, tsv);
    for (uint32_t i = 0; i < r->a->reps; i++) {
        json_array_append_new(ns, json_integer((json_int_t)t->ns[i]));
        json_array_append_new(ts, json_real(tsv[i]));
    }
    json_object_set_new(o, "samples_ns", ns);
    json_object_set_new(o, "samples_ts", ts);
    return o;
}

/* json: an array of one object per test. */
static int bench_print_json(const struct bench_run *r)
{
    json_t *root = json_array();
    int     rc = root ? COMMON_OK : COMMON_ENOMEM;
    for (uint32_t k = 0; k < r->n_tests && rc == COMMON_OK; k++) {
        json_t *rec = bench_json_record(r, &r->tests[k]);
        if (!rec || json_array_append_new(root, rec) < 0)
            rc = COMMON_ENOMEM;
    }
    if (rc == COMMON_OK && json_dumpf(root, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) < 0)
        rc = COMMON_EIO;
    json_decref(root);
    if (rc == COMMON_OK)
        putchar('\n');
    return fflush(stdout) == 0 ? rc : COMMON_EIO;
}

/* ---- the markdown table ---------------------------------------------------------------------- */

/* Columns of the md table; which appear depends on the run (mapped or streaming, --io-probe). */
enum bench_col {
    BC_MODEL,
    BC_SIZE,
    BC_THREADS,
    BC_TEST,
    BC_TS,
    BC_BW_LIMIT,
    BC_BW_RATIO,
    BC_READ,
    BC_HIT,
    BC_IO_LIMIT,
    BC_IO_RATIO,
    BC_COUNT
};

static const char *const bench_col_titles[BC_COUNT] = {
    "model",    "size",     "threads",  "test",         "t/s",      "bw limit t/s",
    "bw ratio", "read/tok", "hit rate", "io limit t/s", "io ratio",
};

#define BENCH_CELL 80 /* bytes of one cell */

static bool bench_col_is_shown(const struct bench_run *r, enum bench_col c)
{
    switch (c) {
    case BC_BW_LIMIT:
    case BC_BW_RATIO:
        return !r->stream;
    case BC_READ:
    case BC_HIT:
        return r->stream;
    case BC_IO_LIMIT:
    case BC_IO_RATIO:
        return r->stream && r->a->io_probe;
    default:
        return true;
    }
}

/* A numeric cell with `digits` decimals, "-" when not applicable. */
static void bench_cell_num(char *cell, const struct bench_value *v, int digits)
{
    if (v->kind == BENCH_REAL)
        snprintf(cell, BENCH_CELL, "%.*f", digits, v->d);
    else
        snprintf(cell, BENCH_CELL, "-");
}

/* The text of cell (test t, column c). */
static void bench_cell(const struct bench_run *r, const struct bench_test *t, enum bench_col c,
                       char *cell)
{
    struct bench_value v;
    struct bench_stat  s;
    switch (c) {
    case BC_MODEL:
        snprintf(cell, BENCH_CELL, "%s", r->model.type);
        break;
    case BC_SIZE:
        common_format_size(r->model.bytes_total, cell, BENCH_CELL);
        break;
    case BC_THREADS:
        snprintf(cell, BENCH_CELL, "%u", r->model.n_threads);
        break;
    case BC_TEST:
        snprintf(cell, BENCH_CELL, "%s%u", t->gen ? "tg" : "pp", t->n);
        break;
    case BC_TS:
        s = bench_ts(r, t);
        snprintf(cell, BENCH_CELL, "%.2f ± %.2f", s.mean, s.sd);
        break;
    case BC_READ:
        common_format_size((uint64_t)bench_bytes_per_token(r, t), cell, BENCH_CELL);
        break;
    case BC_HIT:
        snprintf(cell, BENCH_CELL, "%.1f%%", 100.0 * bench_hit_rate(t));
        break;
    case BC_BW_LIMIT:
    case BC_IO_LIMIT:
        v = bench_field(r, t, c == BC_BW_LIMIT ? BF_BW_LIMIT_TS : BF_STORAGE_LIMIT_TS);
        bench_cell_num(cell, &v, 2);
        break;
    case BC_BW_RATIO:
    case BC_IO_RATIO:
        v = bench_field(r, t, c == BC_BW_RATIO ? BF_BW_RATIO : BF_STORAGE_RATIO);
        bench_cell_num(cell, &v, 3);
        break;
    case BC_COUNT:
        cell[0] = '\0';
        break;
    }
}

/* Columns a string takes on a terminal: UTF-8 continuation bytes take none ("±"). */
static size_t bench_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

/* One table line: text columns left-aligned, numbers right-aligned. */
static void bench_md_line(const struct bench_run *r, char cells[BC_COUNT][BENCH_CELL],
                          const size_t *width)
{
    putchar('|');
    for (int c = 0; c < BC_COUNT; c++) {
        if (!bench_col_is_shown(r, (enum bench_col)c))
            continue;
        size_t pad = width[c] - bench_width(cells[c]);
        bool   left = c == BC_MODEL || c == BC_TEST;
        printf(" %*s%s%*s |", left ? 0 : (int)pad, "", cells[c], left ? (int)pad : 0, "");
    }
    putchar('\n');
}

/* md: the table, one row per test. */
static void bench_print_table(const struct bench_run *r)
{
    char(*cells)[BC_COUNT][BENCH_CELL] = calloc(r->n_tests + 1, sizeof(*cells));
    size_t width[BC_COUNT] = {0};
    if (!cells)
        return;
    for (int c = 0; c < BC_COUNT; c++)
        snprintf(cells[0][c], BENCH_CELL, "%s", bench_col_titles[c]);
    for (uint32_t k = 0; k < r->n_tests; k++)
        for (int c = 0; c < BC_COUNT; c++)
            bench_cell(r, &r->tests[k], (enum bench_col)c, cells[k + 1][c]);
    for (uint32_t k = 0; k <= r->n_tests; k++)
        for (int c = 0; c < BC_COUNT; c++)
            if (bench_width(cells[k][c]) > width[c])
                width[c] = bench_width(cells[k][c]);
    putchar('\n');
    bench_md_line(r, cells[0], width);
    putchar('|');
    for (int c = 0; c < BC_COUNT; c++) {
        if (!bench_col_is_shown(r, (enum bench_col)c))
            continue;
        bool left = c == BC_MODEL || c == BC_TEST;
        putchar(' ');
        for (size_t i = 0; i + 1 < width[c]; i++)
            putchar('-');
        printf("%s |", left ? "-" : ":");
    }
    putchar('\n');
    for (uint32_t k = 1; k <= r->n_tests; k++)
        bench_md_line(r, cells[k], width);
    putchar('\n');
    free(cells);
}

/* md: what the limits were measured as. */
static void bench_print_limits(const struct bench_run *r)
{
    char a[32], b[32];
    if (!r->stream) {
        printf("memory bandwidth (streaming read, %u threads): %.2f GB/s\n", r->model.n_threads,
               r->membw / 1e9);
        printf("weights touched per token: %llu bytes (%s); bw limit t/s = bandwidth / that, bw "
               "ratio = t/s / bw limit\n",
               (unsigned long long)r->model.bytes_active,
               common_format_size(r->model.bytes_active, a, sizeof(a)));
        return;
    }
    if (!r->a->io_probe)
        return;
    printf("storage limit, cold (%s%s, random expert parts of %s): %.1f MB/s at queue depth %u, "
           "%.1f MB/s at depth 1\n",
           fetcher_io_mode_name(r->pr.mode), r->pr.direct ? " O_DIRECT" : "",
           common_format_size(r->pr.read_bytes, a, sizeof(a)), r->pr.bytes_per_s / 1e6,
           r->pr.queue_depth, r->pr1.bytes_per_s / 1e6);
    if (r->n_log > 0)
        printf("storage limit, replay of the decode's %llu loads (%s in %s reads, queue depth %u): "
               "%.1f MB/s\n",
               (unsigned long long)r->n_log, common_format_size(r->rp.bytes, a, sizeof(a)),
               common_format_size(r->rp.read_bytes, b, sizeof(b)), r->rp.queue_depth,
               r->rp.bytes_per_s / 1e6);
    const double lim = bench_storage_bw(r);
    for (uint32_t k = 0; k < r->n_tests; k++) {
        const struct bench_test *t = &r->tests[k];
        const double             bpt = bench_bytes_per_token(r, t);
        if (t->gen && bpt > 0 && lim > 0)
            printf("decode vs storage limit (%s) tg%u: %.2f tok/s vs %.2f MB/s / %.0f bytes per "
                   "token = %.2f tok/s: ratio %.3f\n",
                   r->n_log > 0 ? "replay" : "cold", t->n, bench_ts(r, t).mean, lim / 1e6, bpt,
                   lim / bpt, bench_ts(r, t).mean * bpt / lim);
    }
}

/* md: the 'result:' line of the first prefill and the first decode test, for scripts. */
static void bench_print_result(const struct bench_run *r)
{
    const struct bench_test *pp = NULL, *tg = NULL;
    for (uint32_t k = 0; k < r->n_tests; k++) {
        if (r->tests[k].gen && !tg)
            tg = &r->tests[k];
        if (!r->tests[k].gen && !pp)
            pp = &r->tests[k];
    }
    struct bench_stat sp = pp ? bench_ts(r, pp) : (struct bench_stat){0, 0};
    struct bench_stat sg = tg ? bench_ts(r, tg) : (struct bench_stat){0, 0};
    printf("result: io=%s pp_tok_s=%.3f pp_sd=%.3f tg_tok_s=%.3f tg_sd=%.3f pp_bytes_per_tok=%.0f "
           "tg_bytes_per_tok=%.0f pp_hit_rate=%.4f tg_hit_rate=%.4f probe_bw=%.0f "
           "probe_bw_qd1=%.0f probe_read_bytes=%llu replay_bw=%.0f replay_loads=%llu\n",
           r->io_name, sp.mean, sp.sd, sg.mean, sg.sd, pp ? bench_bytes_per_token(r, pp) : 0.0,
           tg ? bench_bytes_per_token(r, tg) : 0.0, pp ? bench_hit_rate(pp) : 0.0,
           tg ? bench_hit_rate(tg) : 0.0, r->pr.bytes_per_s, r->pr1.bytes_per_s,
           (unsigned long long)r->pr.read_bytes, r->rp.bytes_per_s, (unsigned long long)r->n_log);
}

/* Prints the results in the format asked for. */
static int bench_print(const struct bench_run *r)
{
    switch (r->a->format) {
    case BENCH_CSV:
        return bench_print_csv(r);
    case BENCH_JSON:
        return bench_print_json(r);
    default:
        break;
    }
    bench_print_table(r);
    bench_print_limits(r);
    bench_print_result(r);
    return fflush(stdout) == 0 ? COMMON_OK : COMMON_EIO;
}

static void bench_run_fini(struct bench_run *r)
{
    for (uint32_t k = 0; r->tests && k < r->a->p.n + r->a->n.n; k++) {
        free(r->tests[k].ns);
        free(r->tests[k].log_from);
        free(r->tests[k].log_to);
    }
    free(r->tests);
    free(r->log);
    free(r->tokens);
    free(r->logits);
    cli_engine_close(&r->en);
}

int cli_cmd_bench(int argc, char **argv)
{
    struct bench_args a;
    int               rc = bench_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);
    struct bench_run r = {.a = &a, .stream = cli_stream_is_on(&a.so), .status = 0};
    executor_kernels_init();
    if ((rc = bench_plan(&r)) < 0)
        cli_error(BENCH_PROG, "out of memory");
    else if (a.io_probe && r.stream)
        rc = bench_probe(a.model, &a.so, a.probe_bytes, NULL, 0, &r.pr, &r.pr1);
    if (rc >= 0)
        rc = bench_open(&r);
    if (rc >= 0)
        rc = bench_run_tests(&r);
    if (rc >= 0)
        rc = bench_limits(&r);
    if (rc >= 0 && (rc = bench_print(&r)) < 0)
        cli_error(BENCH_PROG, "cannot write the results: %s", common_strerror(rc));
    int status = rc < 0 ? 1 : r.status;
    bench_run_fini(&r);
    return status;
}
