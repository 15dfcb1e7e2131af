/* cli/cli.h - the sluice CLI: one entry point per subcommand, shared option helpers. */
#ifndef CLI_CLI_H
#define CLI_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "executor.h"
#include "fetcher.h"
#include "router.h"

/* Each subcommand gets argv with argv[0] = subcommand name, parses it with common_opts_parse()
 * against its option tables (--help generated from them) and returns the process exit status:
 * 0 success (and --help), 1 a failure, 2 a usage error (ctl: 3 when health is not READY;
 * generate: 130 when cancelled). Every message is "sluice CMD: error: ..." on stderr. */
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_convert(int argc, char **argv);
int cli_cmd_verify(int argc, char **argv);
int cli_cmd_mkmodel(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_chat(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_generate(int argc, char **argv); /* cli/cmd_generate.c: via sluice-router */
int cli_cmd_ctl(int argc, char **argv);      /* cli/cmd_ctl.c: daemon control messages */
int cli_cmd_serve(int argc, char **argv);    /* cli/cmd_serve.c: HTTP API in one process */

/* ---- --json outputs (cli/json_out.c, jansson) ------------------------------------------------ */

/* A JSON string of `len` bytes of `s` (invalid UTF-8 bytes become U+0080..U+00FF, so any bytes
 * make one); json null only when out of memory. */
json_t *cli_json_str(const char *s, size_t len);
/* A finite number (an integer when it is one below 2^53), else null. */
json_t *cli_json_num(double v);
/* Writes `v` compactly and a newline to `f`, then releases it; 0, or -1 (NULL v, write error). */
int cli_json_print(json_t *v, FILE *f);

/* ---- errors (cli/error.c) -------------------------------------------------------------------- */

/* Prints "PROG: error: MESSAGE" and a newline on stderr: the style of every error a subcommand
 * reports once its options are parsed (usage errors go through common_opts_error(), which adds
 * the "Try 'PROG --help'" line). `prog` is the subcommand's name in messages ("sluice run"). */
void cli_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reports a failure to open or read `path` with cli_error(), naming the file once: the message
 * alone when it already names it (common_gguf_open's messages do), else "PATH: MESSAGE". */
void cli_error_path(const char *prog, const char *path, int rc, const struct common_errmsg *e);

/* ---- text files given with -f (cli/text_file.c) ---------------------------------------------- */

/* Largest prompt `sluice run -f` and `sluice tokenize -f` read. */
#define CLI_PROMPT_MAX_BYTES (64u << 20)

/* Reads the regular file `path` (at most `max_bytes`) into *text, malloc'd and NUL-terminated,
 * its length in *len. Anything but a regular file (a FIFO, /dev/zero, a directory) is refused
 * without blocking or reading. Prints what went wrong with cli_error() and returns COMMON_ENOENT
 * / COMMON_EIO (open or read failed), COMMON_EINVAL (not a regular file), COMMON_ERANGE (larger
 * than max_bytes) or COMMON_ENOMEM; the out-parameters are unchanged on failure. */
int cli_text_file_read(const char *prog, const char *path, size_t max_bytes, char **text,
                       size_t *len);

/* ---- model loading shared by run, chat, perplexity and bench (cli/session.c) ----------------- */

/* Where weights come from and how much memory they may use (--ram-budget, --io, --policy, the
 * trace flags). All zero = the whole model mapped, as before (no fetcher). */
struct cli_stream_opts {
    uint64_t             ram_budget;   /* --ram-budget SIZE: 0 = none */
    bool                 io_set;       /* --io was given */
    enum fetcher_io_mode io;           /* --io uring|pread|mmap (auto when only a budget) */
    enum fetcher_policy  policy;       /* --policy lru|lfu */
    uint32_t             queue_depth;  /* --io-depth N: reads in flight; 0 = 32 */
    const char          *trace_out;    /* --trace-out FILE.json; NULL = none */
    bool                 trace_names;  /* --trace-names: log each expert tensor as used */
    bool                 report_rss;   /* --report-rss: print peak RSS (VmHWM) on exit */
    bool                 no_prefetch;  /* --no-prefetch / --prefetch none */
    bool                 prefetch_all; /* --prefetch all: the history predictors hint too */
    uint32_t             prefetch_top; /* --prefetch-top N: gate predictor's best N; 0 = 1 */
    bool                 no_postfetch; /* --no-postfetch */
    bool                 mmap_advise;  /* --mmap-advise: io mmap madvises requested experts */
    int32_t              n_gpu_layers; /* -ngl N: the last N layers (and the head past n_layer)
                                          on the CUDA device; 0 = none */
    struct executor_devices devices;      /* --device, --split-mode, --tensor-split, --main-gpu */
    int32_t  n_cpu_moe;                /* --n-cpu-moe N: the first N layers' MoE on the CPU */
    uint64_t vram_budget; /* --vram-budget SIZE: the device's experts in a pool; 0 = all */
    enum executor_expert_miss expert_miss; /* --expert-miss */
    enum fetcher_vram_fill    vram_fill;   /* --vram-fill: the device pool's misses from storage
                                              through staging, or through the RAM pool */
};

/* Rows of the streaming options in a struct cli_stream_opts (--ram-budget, --io, --policy, ...). */
#define CLI_STREAM_N_ROWS 21

/* The option table of the streaming options that run, chat, perplexity and bench share. */
struct cli_stream_table {
    struct common_opt rows[CLI_STREAM_N_ROWS + 1]; /* targets borrow the options; zeroed last row */
};

/* Fills `t` with rows writing into `o` (which must outlive the parse); list it as a group:
 * {.title = CLI_STREAM_TITLE, .opts = t->rows}. */
void cli_stream_table_init(struct cli_stream_table *t, struct cli_stream_opts *o);

/* Title of the streaming group in --help. */
#define CLI_STREAM_TITLE                                                                           \
    "Placement options (layers on a GPU; experts read from storage under a memory budget)"

/* True when the options ask for the fetcher (a budget or --io). */
bool cli_stream_is_on(const struct cli_stream_opts *o);

/* A model, its weight source (mapped, or streamed through a fetcher), a thread pool and one
 * context. Caller-owned; fields are read-only for callers. */
struct cli_engine {
    struct common_gguf         *gguf;    /* owned when streaming (else inside model) */
    struct common_model        *desc;    /* owned when streaming (else inside model) */
    struct fetcher             *fetcher; /* owned; NULL without streaming */
    struct executor_threadpool *pool;    /* owned */
    struct executor_model      *model;  /* owned (owns desc, gguf and weights when not streaming) */
    struct executor_ctx        *ctx;    /* owned */
    struct executor_ctx       **seqs;   /* owned: n_seqs contexts for batched sequences, seqs[0]
                                           being ctx; NULL when the command asked for one */
    struct executor_gpu_weights *gpu_w; /* owned: the device weights the n_seqs contexts share
                                           (-ngl with several sequences), else NULL */
    uint32_t               n_seqs;
    struct cli_stream_opts so;       /* copied at open; trace_out borrowed from argv */
    bool stages; /* the device pools read their misses from storage (--vram-fill) */
    const char            *prog;     /* borrowed (static): the subcommand, for messages */
    bool                   reported; /* the exit report was printed (or nothing ran) */
};

/* What the engine's context looks like and what else the command will allocate. */
struct cli_engine_opts {
    const char              *prog;        /* static: subcommand name in messages ("sluice run") */
    uint32_t                 n_threads;   /* 0 = physical cores */
    struct executor_ctx_opts ctx;         /* pool is filled in by cli_engine_open */
    uint64_t                 extra_bytes; /* buffers of the command, for the plan */
    uint32_t                 logit_rows;  /* n_vocab-float rows the command keeps (plan) */
    bool                     populate;    /* mapped (non-streaming) model: prefault it */
    uint32_t                 n_seqs;      /* contexts (sequences decoded as one batch); 0 = 1;
                                             the memory plan counts each one's KV and scratch */
};

/* Opens `path` as `so` asks: without streaming, the mapped model as before; with it, the plan
 * for the budget (printed to stderr; refused with the minimum when it does not fit), the fetcher,
 * resident weights read once (progress for large models), the model and the context. Prints what
 * went wrong. Returns 0 or a negative common_err (the engine is then empty). */
int cli_engine_open(struct cli_engine *en, const char *path, const struct cli_stream_opts *so,
                    const struct cli_engine_opts *o);
/* On exit: the expert trace summary (stderr) with the predictors' precision and recall, the JSON
 * trace (--trace-out) and the peak RSS (--report-rss). Once per engine; returns 0 or COMMON_EIO
 * (trace file not written). */
int cli_engine_report(struct cli_engine *en);
/* Reports (if not done) and frees everything; accepts an empty engine. Returns the report's
 * result (0, or COMMON_EIO when the trace file could not be written: the command then exits 1). */
int cli_engine_close(struct cli_engine *en);

/* ---- one-process generation shared by run and chat (cli/session.c) --------------------------- */

/* Options common to the generating commands (-m -n -t -c -b --cache-type and the sampler). */
struct cli_session_opts {
    const char                *prog;      /* static: subcommand name in messages ("sluice run") */
    const char                *model;     /* -m */
    uint32_t                   n_predict; /* -n: tokens to generate per reply */
    uint32_t                   n_threads; /* -t: 0 = physical cores */
    uint32_t                   n_ctx;     /* -c: 0 = the model's, capped by the executor */
    uint32_t                   n_batch;   /* -b: 0 = executor default */
    enum common_cache_type     cache;     /* --cache-type */
    struct router_sampler_opts sampler;   /* --temp --top-k --top-p --min-p --seed and the
                                             penalties; penalty_last_n comes from the field below */
    uint32_t repeat_last_n;               /* --repeat-last-n: penalty window as llama.cpp's, 0 =
                                             no penalties (the sampler keeps at most 4096) */
    struct cli_stream_opts stream;        /* --ram-budget --io --policy --trace-* ... */
};

/* Fills llama.cpp's defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05,
 * --repeat-penalty 1 (off), --repeat-last-n 64; `prog` names the subcommand in messages. */
void cli_session_opts_default(struct cli_session_opts *o, const char *prog);

/* Option tables of the shared options, writing into one struct cli_session_opts. */
struct cli_session_table {
    struct common_opt       model[8];     /* -m -n -t -c -b --cache-type; zeroed last row */
    struct common_opt       sampling[10]; /* --temp ... --frequency-penalty; zeroed last row */
    struct cli_stream_table stream;       /* the streaming options */
    struct common_opt_group groups[4];    /* the three tables above, then the end */
};

/* Fills `t` with rows writing into `o` (which must outlive the parse); pass t->groups as the
 * spec's groups. The sampling values are range-checked as they are parsed. */
void cli_session_table_init(struct cli_session_table *t, struct cli_session_opts *o);

/* A model loaded for generation. Caller-owned; fields are read-only for callers. */
struct cli_session {
    struct cli_engine           engine;  /* owned: model, weights, pool, ctx */
    struct executor_threadpool *pool;    /* borrowed from engine */
    struct executor_model      *model;   /* borrowed from engine */
    struct executor_ctx        *ctx;     /* borrowed from engine: one sequence */
    struct router_vocab        *vocab;   /* owned; NULL when the model has no usable tokenizer */
    struct router_sampler       sampler; /* owned */
    float                      *logits;  /* owned: n_vocab logits of the last fed token */
    uint32_t                    n_vocab; /* logits per token */
};

/* Opens the model, tokenizer (required when need_vocab), thread pool, context and sampler,
 * printing what went wrong. Returns 0 or a negative common_err (the session is then empty). */
int cli_session_open(struct cli_session *s, const struct cli_session_opts *o, bool need_vocab);
/* Frees the session (reporting as cli_engine_close() does); returns its result. */
int cli_session_close(struct cli_session *s);
/* Evaluates tokens after those already in the context (recording them for the sampler's
 * penalties); the logits of the last one are then in s->logits. Refuses with COMMON_ERANGE and
 * the numbers when they do not fit the context. */
int cli_session_feed(struct cli_session *s, const int32_t *tokens, uint32_t n);
/* Picks the next token from s->logits with the sampler (--temp 0: the argmax, ties to the lowest
 * id, after the penalties if any); prints why not. */
int cli_session_pick(struct cli_session *s, int32_t *id);
/* True when every context position is used. */
bool cli_session_is_full(const struct cli_session *s);

#endif /* CLI_CLI_H */
