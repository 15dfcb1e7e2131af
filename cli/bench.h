/* cli/bench.h - private to cli/: the state of a `sluice bench` run, shared by its two files. */
#ifndef CLI_BENCH_H
#define CLI_BENCH_H

/* cmd_bench.c parses the options and measures; bench_report.c turns the measurements into the
 * md table, csv or json records and the summary lines. */

#include <stdbool.h>
#include <stdint.h>

#include "cli.h"

#define BENCH_PROG       "sluice bench"
#define BENCH_MAX_VALUES 32   /* values of one -p or -n list */
#define BENCH_MAX_REPS   1000 /* most repetitions (-r) */

enum bench_format { BENCH_MD, BENCH_CSV, BENCH_JSON };

/* What the command line asked for. */
struct bench_args {
    const char                *model;                    /* -m: borrowed from argv */
    uint32_t                   p_v[BENCH_MAX_VALUES];    /* -p values */
    uint32_t                   n_v[BENCH_MAX_VALUES];    /* -n values */
    uint32_t                   np_v[BENCH_MAX_VALUES];   /* -npl values */
    struct common_opt_u32_list p, n, np;                 /* -p, -n, -npl: into p_v, n_v, np_v */
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
    /* The device's expert pool (--vram-budget): picks found, copied in, computed on the CPU,
     * bytes copied, the copy stream's busy time and the kernels' waits for it, parts read from
     * storage through staging (--vram-fill). */
    uint64_t vram_hits, vram_misses, vram_cpu, vram_copied, vram_busy_ns, vram_stall_ns;
    uint64_t vram_staged;
};

/* One row of the table: a prefill or a decode test and its samples. */
struct bench_test {
    bool            gen;      /* decode (tgN) when true, prefill (ppN) otherwise */
    uint32_t        n;        /* prompt tokens (pp) or generated tokens (tg) */
    uint32_t        np;       /* sequences decoded at once (tg; each generates n); 1 = one */
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
    const struct bench_args   *a;          /* borrowed: the options */
    bool                       stream;     /* experts stream through the fetcher */
    struct cli_engine          en;         /* owned: model, pool, context */
    struct bench_model         model;      /* copied at open */
    int32_t                   *tokens;     /* owned: max_p + 1 prompt ids */
    float                     *logits;     /* owned: n_vocab */
    uint32_t                   max_p;      /* longest prefill */
    uint32_t                   max_np;     /* most sequences of a decode test */
    uint32_t                   n_slots;    /* tests allocated (some may be skipped: 0 tokens) */
    struct executor_batch_seq *batch;      /* owned: max_np sequences of a batched step */
    int32_t                   *batch_tok;  /* owned: max_np tokens of a batched step */
    struct bench_test         *tests;      /* owned: n_tests rows, prefills first */
    uint32_t                   n_tests;    /* rows */
    double                     membw;      /* bytes/s; 0 = not measured (streaming) */
    int32_t                    gpu_layers; /* layers the engine put on a device (-ngl) */
    bool                       vram_pool;  /* the device's experts are in a pool (--vram-budget) */
    double                     vram_copy_bw; /* its copy probe, bytes/s (the limit of its copies) */
    bool gpu_bw;        /* membw is the device's: every layer and the head are on it */
    char gpu_name[128]; /* the device, when gpu_bw */
    struct fetcher_probe_result pr, pr1; /* cold storage probes (--io-probe) */
    struct fetcher_probe_result rp;      /* replay of the decode's loads (--io-probe) */
    struct fetcher_probe_key   *log;     /* owned: the timed decode steps' loads */
    uint64_t                    n_log;   /* keys in log */
    bool                        logging; /* the load log is on */
    const char                 *io_name; /* static: "none" or the fetcher's mode */
    int                         status;  /* exit status so far */
};

/* Prints the results in the format asked for (-o): the md table with the limits and the
 * 'result:' line, or one csv / json record per test. Returns 0 or COMMON_EIO (stdout). */
int cli_bench_print(const struct bench_run *r);

#endif /* CLI_BENCH_H */
