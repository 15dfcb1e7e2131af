/* cli/cmd_bench.c - `sluice bench`: prefill and decode tokens/s against memory bandwidth. */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "executor.h"

static const char bench_description[] =
    "Measures, like llama-bench, prefill speed (a P-token prompt in one go) and decode speed (N "
    "fresh pseudo-random tokens one at a time after a 1-token prompt: none repeats the prompt's "
    "or an earlier repetition's, so a MoE decode routes as on new text), REPS times each, and in "
    "the same run the "
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
    a->np_v[0] = 1;
    a->np = (struct common_opt_u32_list){.v = a->np_v, .cap = BENCH_MAX_VALUES, .n = 1};
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
        {.name = "n-parallel",
         .short_name = "npl",
         .type = COMMON_OPT_U32_LIST,
         .target = &a->np,
         .min = 1,
         .max = 256,
         .help = "sequences of each decode test, decoded as one batch per step (continuous "
                 "batching; t/s is then their aggregate): every decode test runs at each value",
         .def = "1"},
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
         .parse = common_cache_type_opt,
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
    struct executor_gpu_pool_stats gs;
    if (en->ctx && executor_ctx_gpu_pool_stats(en->ctx, &gs)) {
        b->vram_hits = gs.hits;
        b->vram_misses = gs.misses;
        b->vram_cpu = gs.cpu_misses;
        b->vram_copied = gs.copied_bytes;
        b->vram_busy_ns = gs.copy_busy_ns;
        b->vram_stall_ns = gs.copy_stall_ns;
        b->vram_staged = gs.staged;
    }
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
    d->vram_hits += now.vram_hits - a->vram_hits;
    d->vram_misses += now.vram_misses - a->vram_misses;
    d->vram_cpu += now.vram_cpu - a->vram_cpu;
    d->vram_copied += now.vram_copied - a->vram_copied;
    d->vram_busy_ns += now.vram_busy_ns - a->vram_busy_ns;
    d->vram_stall_ns += now.vram_stall_ns - a->vram_stall_ns;
    d->vram_staged += now.vram_staged - a->vram_staged;
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
    const uint32_t           n_slots = a->p.n + a->n.n * a->np.n;
    r->tests = calloc(n_slots, sizeof(*r->tests));
    if (!r->tests)
        return COMMON_ENOMEM;
    r->n_slots = n_slots;
    r->max_np = 1;
    for (uint32_t k = 0; k < n_slots; k++) {
        bool     gen = k >= a->p.n;
        uint32_t g = gen ? (k - a->p.n) / a->np.n : 0,
                 np = gen ? a->np_v[(k - a->p.n) % a->np.n] : 1;
        uint32_t n = gen ? a->n_v[g] : a->p_v[k];
        if (n == 0)
            continue;
        struct bench_test *t = &r->tests[r->n_tests++];
        t->gen = gen;
        t->n = n;
        t->np = np;
        if (np > r->max_np)
            r->max_np = np;
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
        .logit_rows = r->max_np,
        .populate = !r->stream,
        .n_seqs = r->max_np};
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
    r->gpu_layers = executor_ctx_gpu_layers(r->en.ctx, r->gpu_name, sizeof(r->gpu_name));
    /* The CPU backend's "device" reads RAM with the CPU's threads: the CPU's probe is its limit. */
    r->gpu_bw = r->gpu_layers > (int32_t)d->hp.n_layer && !executor_gpu_in_ram();
    struct executor_gpu_pool_stats gs;
    if (executor_ctx_gpu_pool_stats(r->en.ctx, &gs) && gs.n_slots) {
        r->vram_pool = true;
        r->vram_copy_bw = gs.copy_gbps * 1e9;
    }
    r->io_name = !r->en.fetcher      ? "none"
                 : a->so.mmap_advise ? "mmap-advise"
                                     : fetcher_io_mode_name(fetcher_get_io_mode(r->en.fetcher));
    r->tokens = malloc((size_t)(r->max_p + 1) * sizeof(*r->tokens));
    r->logits = malloc((size_t)r->max_np * n_vocab * sizeof(*r->logits));
    r->batch = calloc(r->max_np, sizeof(*r->batch));
    r->batch_tok = calloc(r->max_np, sizeof(*r->batch_tok));
    if (!r->tokens || !r->logits || !r->batch || !r->batch_tok) {
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

/* Token i of repetition `rep` of decode test `test`: a fresh pseudo-random id (splitmix64 of
 * the three), as llama-bench feeds random tokens; replaying the prompt's own ids would find
 * their experts loaded by the prefill and flatter a streamed decode. */
static int32_t bench_fresh_token(uint32_t test, uint32_t rep, uint32_t i, uint32_t n_vocab)
{
    uint64_t z = ((uint64_t)test << 48 ^ (uint64_t)rep << 32 ^ i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (int32_t)((z ^ (z >> 31)) % n_vocab);
}

/* One step of the first np sequences, sequence s fed r->batch_tok[s]: one batch. */
static int bench_decode_seqs(struct bench_run *r, uint32_t np)
{
    const uint32_t n_vocab = executor_ctx_n_vocab(r->en.ctx);
    for (uint32_t s = 0; s < np; s++)
        r->batch[s] = (struct executor_batch_seq){.ctx = r->en.seqs[s],
                                                  .tokens = &r->batch_tok[s],
                                                  .n = 1,
                                                  .logits = r->logits + (size_t)s * n_vocab};
    struct common_errmsg e = {{0}};
    int                  rc = executor_ctx_decode_batch(r->en.ctx, r->batch, np, &e);
    if (rc < 0)
        cli_error(BENCH_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
    return rc;
}

/* Repetition `rep` of a decode test of np > 1 sequences: each gets a 1-token prompt of its own
 * (one batch, untimed), then n steps in which every sequence is fed a fresh token, all of a
 * step in one batch (as the executor daemon runs a round of the router's requests). */
static int bench_run_decode_par(struct bench_run *r, struct bench_test *t, uint32_t rep)
{
    struct bench_io mark;
    const uint32_t  test = (uint32_t)(t - r->tests), n_vocab = executor_ctx_n_vocab(r->en.ctx);
    for (uint32_t s = 0; s < t->np; s++) {
        executor_ctx_reset(r->en.seqs[s]);
        r->batch_tok[s] = bench_fresh_token(test, rep, 0x80000000u + s, n_vocab);
    }
    int rc = bench_decode_seqs(r, t->np);
    if (rc < 0)
        return rc;
    bench_io_mark(&r->en, &mark);
    if (r->logging)
        t->log_from[rep] = fetcher_load_log_count(r->en.fetcher);
    uint64_t t0 = common_now_ns();
    for (uint32_t i = 0; i < t->n && rc >= 0; i++) {
        for (uint32_t s = 0; s < t->np; s++)
            r->batch_tok[s] = bench_fresh_token(test, rep, i * t->np + s, n_vocab);
        rc = bench_decode_seqs(r, t->np);
    }
    t->ns[rep] = common_now_ns() - t0;
    bench_io_since(&r->en, &mark, &t->io);
    if (r->logging)
        t->log_to[rep] = fetcher_load_log_count(r->en.fetcher);
    return rc;
}

/* Repetition `rep` of a decode test: after a 1-token prompt, n fresh tokens one at a time. */
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
    const uint32_t test = (uint32_t)(t - r->tests), n_vocab = executor_ctx_n_vocab(r->en.ctx);
    uint64_t       t0 = common_now_ns();
    for (uint32_t i = 0; i < t->n && rc >= 0; i++) {
        const int32_t tok = bench_fresh_token(test, rep, i, n_vocab);
        rc = bench_decode(r, &tok, 1);
    }
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
            steps += (uint64_t)(r->tests[k].n + 1) * r->tests[k].np * r->a->reps;
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
            if ((rc = !t->gen     ? bench_run_prefill(r, t, rep)
                      : t->np > 1 ? bench_run_decode_par(r, t, rep)
                                  : bench_run_decode(r, t, rep)) < 0)
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
    if (!r->stream && r->gpu_bw) {
        /* The whole model on the device: its memory bandwidth is the limit. */
        r->membw = executor_ctx_gpu_membw(r->en.ctx, r->a->membw_bytes);
        if (!(r->membw > 0.0))
            cli_error(BENCH_PROG, "device bandwidth probe failed");
        return r->membw > 0.0 ? COMMON_OK : COMMON_EIO;
    }
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

static void bench_run_fini(struct bench_run *r)
{
    for (uint32_t k = 0; r->tests && k < r->n_slots; k++) {
        free(r->tests[k].ns);
        free(r->tests[k].log_from);
        free(r->tests[k].log_to);
    }
    free(r->tests);
    free(r->log);
    free(r->tokens);
    free(r->logits);
    free(r->batch);
    free(r->batch_tok);
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
    if (rc >= 0 && (rc = cli_bench_print(&r)) < 0)
        cli_error(BENCH_PROG, "cannot write the results: %s", common_strerror(rc));
    int status = rc < 0 ? 1 : r.status;
    bench_run_fini(&r);
    return status;
}
