/* cli/bench_report.c - `sluice bench` results: statistics, the md table, csv and json records. */
#include "bench.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Tokens per second of each repetition into ts[reps] (of every sequence together). */
static void bench_samples_ts(const struct bench_test *t, uint32_t reps, double *ts)
{
    for (uint32_t i = 0; i < reps; i++)
        ts[i] = t->ns[i] ? (double)t->n * t->np * 1e9 / (double)t->ns[i] : 0.0;
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
    return (double)t->io.read_bytes / ((double)t->n * t->np * r->a->reps);
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
    BF_N_GPU_LAYERS,
    BF_TYPE_K,
    BF_TYPE_V,
    BF_IO,
    BF_RAM_BUDGET,
    BF_N_PROMPT,
    BF_N_GEN,
    BF_N_PARALLEL,
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
    [BF_N_GPU_LAYERS] = "n_gpu_layers",
    [BF_TYPE_K] = "type_k",
    [BF_TYPE_V] = "type_v",
    [BF_IO] = "io",
    [BF_RAM_BUDGET] = "ram_budget",
    [BF_N_PROMPT] = "n_prompt",
    [BF_N_GEN] = "n_gen",
    [BF_N_PARALLEL] = "n_parallel",
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
    /* A batch of sequences reads the dense weights once for all of them and the experts their
     * tokens share once: its bytes per token are not the model's active bytes. */
    if (!t->gen || is_mem == r->stream || !(bw > 0.0) || !(bpt > 0.0) || (is_mem && t->np > 1))
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
    case BF_N_GPU_LAYERS:
        return bench_int(r->gpu_layers);
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
    case BF_N_PARALLEL:
        return bench_int(t->np);
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
    BC_NGL,
    BC_TEST,
    BC_SEQS,
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
    "model",        "size",     "threads",  "ngl",      "test",         "seqs",     "t/s",
    "bw limit t/s", "bw ratio", "read/tok", "hit rate", "io limit t/s", "io ratio",
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
    case BC_NGL:
        return r->gpu_layers > 0;
    case BC_SEQS:
        return r->max_np > 1;
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
    case BC_NGL:
        snprintf(cell, BENCH_CELL, "%d", r->gpu_layers);
        break;
    case BC_TEST:
        snprintf(cell, BENCH_CELL, "%s%u", t->gen ? "tg" : "pp", t->n);
        break;
    case BC_SEQS:
        snprintf(cell, BENCH_CELL, "%u", t->np);
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
    if (!r->stream && r->gpu_bw) {
        /* several devices ("A + B"): the first's, as their layers run one after the other */
        const char *plus = strstr(r->gpu_name, " + ");
        printf("device memory bandwidth (%.*s, a device-to-device copy, bytes read + written%s): "
               "%.2f GB/s\n",
               plus ? (int)(plus - r->gpu_name) : (int)strlen(r->gpu_name), r->gpu_name,
               plus ? "; the first of the devices, which run their layers in turn" : "",
               r->membw / 1e9);
        printf("weights touched per token: %llu bytes (%s); bw limit t/s = bandwidth / that, bw "
               "ratio = t/s / bw limit\n",
               (unsigned long long)r->model.bytes_active,
               common_format_size(r->model.bytes_active, a, sizeof(a)));
        return;
    }
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

/* md: the device pool's share of each test (--vram-budget), a line each, and a 'result_vram:'
 * line each for scripts; the decode against the pool's copy probe, the limit of its copies. */
static void bench_print_vram(const struct bench_run *r)
{
    if (!r->vram_pool)
        return;
    printf("device expert pool: copies at %.2f GB/s (probe: a slot copied from where the pool's "
           "copies come)\n",
           r->vram_copy_bw / 1e9);
    for (uint32_t k = 0; k < r->n_tests; k++) {
        const struct bench_test *t = &r->tests[k];
        const struct bench_io   *io = &t->io;
        const uint64_t           picks = io->vram_hits + io->vram_misses + io->vram_cpu;
        const double             toks = (double)t->n * t->np * r->a->reps;
        const double             cpt = (double)io->vram_copied / toks; /* bytes copied per token */
        const double             ts = bench_ts(r, t).mean;
        const double             hidden =
            io->vram_busy_ns && io->vram_stall_ns < io->vram_busy_ns
                            ? (double)(io->vram_busy_ns - io->vram_stall_ns) / (double)io->vram_busy_ns
                            : 0.0;
        if (!picks)
            continue;
        printf("device pool %s%u: %.1f%% found, %.1f%% copied in, %.1f%% on the CPU; %.0f bytes "
               "copied per token",
               t->gen ? "tg" : "pp", t->n, 100.0 * (double)io->vram_hits / (double)picks,
               100.0 * (double)io->vram_misses / (double)picks,
               100.0 * (double)io->vram_cpu / (double)picks, cpt);
        if (t->gen && cpt > 0 && r->vram_copy_bw > 0)
            printf(" = a copy limit of %.2f tok/s: ratio %.3f", r->vram_copy_bw / cpt,
                   ts * cpt / r->vram_copy_bw);
        printf("; %.0f%% of the copy time hidden\n", 100.0 * hidden);
        printf("result_vram: test=%s%u hits=%llu copied=%llu cpu=%llu copied_bytes_per_tok=%.0f "
               "copy_bw=%.0f copy_ratio=%.4f copy_busy_ms=%.3f copy_stall_ms=%.3f staged=%llu\n",
               t->gen ? "tg" : "pp", t->n, (unsigned long long)io->vram_hits,
               (unsigned long long)io->vram_misses, (unsigned long long)io->vram_cpu, cpt,
               r->vram_copy_bw, r->vram_copy_bw > 0 ? ts * cpt / r->vram_copy_bw : 0.0,
               (double)io->vram_busy_ns / 1e6, (double)io->vram_stall_ns / 1e6,
               (unsigned long long)io->vram_staged);
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

/* md: each decode test of several sequences against the same test of one, and a
 * 'result_parallel:' line per test for scripts. */
static void bench_print_parallel(const struct bench_run *r)
{
    if (r->max_np < 2)
        return;
    for (uint32_t k = 0; k < r->n_tests; k++) {
        const struct bench_test *t = &r->tests[k], *one = NULL;
        if (!t->gen)
            continue;
        for (uint32_t j = 0; j < r->n_tests && !one; j++)
            if (r->tests[j].gen && r->tests[j].n == t->n && r->tests[j].np == 1)
                one = &r->tests[j];
        const struct bench_stat s = bench_ts(r, t);
        const double            base = one ? bench_ts(r, one).mean : 0.0;
        if (t->np > 1 && base > 0.0)
            printf("parallel: tg%u with %u sequences: %.2f t/s together, %.2fx one sequence's "
                   "%.2f t/s\n",
                   t->n, t->np, s.mean, s.mean / base, base);
    }
    for (uint32_t k = 0; k < r->n_tests; k++) {
        const struct bench_test *t = &r->tests[k];
        if (!t->gen)
            continue;
        const struct bench_stat s = bench_ts(r, t);
        printf("result_parallel: io=%s n_gen=%u n_parallel=%u tok_s=%.3f sd=%.3f "
               "bytes_per_tok=%.0f hit_rate=%.4f\n",
               r->io_name, t->n, t->np, s.mean, s.sd, bench_bytes_per_token(r, t),
               bench_hit_rate(t));
    }
}

int cli_bench_print(const struct bench_run *r)
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
    bench_print_vram(r);
    bench_print_parallel(r);
    bench_print_result(r);
    return fflush(stdout) == 0 ? COMMON_OK : COMMON_EIO;
}
