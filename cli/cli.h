/* cli/cli.h - the sluice CLI: one entry point per subcommand, shared option helpers. */
#ifndef CLI_CLI_H
#define CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "executor.h"
#include "fetcher.h"
#include "router.h"

/* Each subcommand gets argv with argv[0] = subcommand name; returns the process exit code. */
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_mkmodel(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_chat(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);
int cli_cmd_generate(int argc, char **argv); /* cli/cmd_generate.c: via sluice-router */
int cli_cmd_ctl(int argc, char **argv);      /* cli/cmd_ctl.c: daemon control messages */

/* Parses a decimal unsigned integer in [min, max] for option `name`; prints an error and
 * returns false when it is not one. */
bool cli_parse_u32(const char *name, const char *s, uint32_t min, uint32_t max, uint32_t *out);
bool cli_parse_u64(const char *name, const char *s, uint64_t *out);
bool cli_parse_f32(const char *name, const char *s, float *out);

/* Returns the value following option argv[*i] (advancing *i), or prints an error and returns
 * NULL when it is missing. */
const char *cli_next_arg(int argc, char **argv, int *i);

/* ---- model loading shared by run, chat, perplexity and bench (cli/session.c) ------- */

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
};

/* Usage lines of the options above, for the commands' --help. */
#define CLI_STREAM_USAGE                                                                           \
    "  --ram-budget SIZE    bound everything resident (weights, expert pool, KV, scratch, i/o)\n"  \
    "                       to SIZE (e.g. 1.5G); prints the plan, refuses below the minimum\n"     \
    "  --io MODE            expert reads: uring (O_DIRECT), pread, or mmap (page cache decides,\n" \
    "                       as llama.cpp)                            [uring when a budget]\n"      \
    "  --mmap-advise        with --io mmap: madvise(WILLNEED) each expert the router picks or\n"   \
    "                       the predictor guesses (llama.cpp only faults pages in at use)\n"       \
    "  --policy P           expert pool eviction: lru or lfu         [lru]\n"                      \
    "  --io-depth N         reads in flight                          [32]\n"                       \
    "  --trace-out FILE     write the expert trace as JSON (docs/fetcher.md) on exit\n"            \
    "  --trace-names        log each expert tensor as used (stderr)\n"                             \
    "  --prefetch MODE      gate: hint the next layer's experts from its router on the\n"          \
    "                       current state; all: also the previous token's choices and the\n"       \
    "                       next token's first layers; none                [gate]\n"               \
    "  --prefetch-top N     hint the gate predictor's best N per token      [1]\n"                 \
    "  --no-prefetch        same as --prefetch none\n"                                             \
    "  --no-postfetch       do not request a layer's experts before computing them\n"              \
    "  --report-rss         print the peak resident set (VmHWM) on exit\n"

/* Applies value option `a` = `v` when it is one of the options above: returns 1 when consumed,
 * 0 when not ours, -1 on a bad value (message printed). */
int cli_stream_parse_flag(struct cli_stream_opts *o, const char *a, const char *v);
/* Same for the options without a value (--trace-names, --report-rss, --no-prefetch, ...). */
int cli_stream_parse_switch(struct cli_stream_opts *o, const char *a);
/* The common part of every command's option loop, called after the command's own switches:
 * applies the stream switches, refuses a positional argument, fetches the value of option
 * argv[*i] (advancing *i) and applies the stream options that take one. Returns 1 when the
 * option was consumed (go on), 0 when *value holds the value of an option for the command to
 * parse, -1 on an error (message printed; exit with status 2). */
int cli_take_option(int argc, char **argv, int *i, struct cli_stream_opts *so, const char **value);

/* True when the options ask for the fetcher (a budget or --io). */
bool cli_stream_is_on(const struct cli_stream_opts *o);

/* A model, its weight source (mapped, or streamed through a fetcher), a thread pool and one
 * context. Caller-owned; fields are read-only for callers. */
struct cli_engine {
    struct common_gguf         *gguf;    /* owned when streaming (else inside model) */
    struct common_model        *desc;    /* owned when streaming (else inside model) */
    struct fetcher             *fetcher; /* owned; NULL without streaming */
    struct executor_threadpool *pool;    /* owned */
    struct executor_model      *model; /* owned (owns desc, gguf and weights when not streaming) */
    struct executor_ctx        *ctx;   /* owned */
    struct cli_stream_opts      so;    /* copied at open; trace_out borrowed from argv */
    bool                        reported;
};

/* What the engine's context looks like and what else the command will allocate. */
struct cli_engine_opts {
    uint32_t                 n_threads;   /* 0 = physical cores */
    struct executor_ctx_opts ctx;         /* pool is filled in by cli_engine_open */
    uint64_t                 extra_bytes; /* buffers of the command, for the plan */
    uint32_t                 logit_rows;  /* n_vocab-float rows the command keeps (plan) */
    bool                     populate;    /* mapped (non-streaming) model: prefault it */
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
/* Reports (if not done) and frees everything; accepts an empty engine. */
void cli_engine_close(struct cli_engine *en);

/* ---- one-process generation shared by run and chat (cli/session.c) ---------------- */

/* Options common to the generating commands (-m -n -t -c -b --cache-type and the sampler). */
struct cli_session_opts {
    const char                *model;     /* -m */
    uint32_t                   n_predict; /* -n: tokens to generate per reply */
    uint32_t                   n_threads; /* -t: 0 = physical cores */
    uint32_t                   n_ctx;     /* -c: 0 = the model's, capped by the executor */
    uint32_t                   n_batch;   /* -b: 0 = executor default */
    enum common_cache_type     cache;     /* --cache-type */
    struct router_sampler_opts sampler;   /* --temp --top-k --top-p --min-p --seed */
    struct cli_stream_opts     stream;    /* --ram-budget --io --policy --trace-* ... */
};

/* Fills llama.cpp's defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05. */
void cli_session_opts_default(struct cli_session_opts *o);

/* Applies option `a` with value `v` when it is one of the shared options (the stream options
 * with a value included). Returns 1 when it was consumed, 0 when `a` is not a shared option, -1
 * when the value is bad (message printed). */
int cli_session_parse_flag(struct cli_session_opts *o, const char *a, const char *v);

/* A model loaded for generation. Caller-owned; fields are read-only for callers. */
struct cli_session {
    struct cli_engine           engine;  /* owned: model, weights, pool, ctx */
    struct executor_threadpool *pool;    /* borrowed from engine */
    struct executor_model      *model;   /* borrowed from engine */
    struct executor_ctx        *ctx;     /* borrowed from engine: one sequence */
    struct router_vocab        *vocab;   /* owned; NULL when the model has no usable tokenizer */
    struct router_sampler       sampler; /* owned */
    float                      *logits;  /* owned: n_vocab logits of the last fed token */
    uint32_t                    n_vocab;
    bool                        greedy; /* --temp 0: argmax, ties to the lowest id */
};

/* Opens the model, tokenizer (required when need_vocab), thread pool, context and sampler,
 * printing what went wrong. Returns 0 or a negative common_err (the session is then empty). */
int  cli_session_open(struct cli_session *s, const struct cli_session_opts *o, bool need_vocab);
void cli_session_close(struct cli_session *s);
/* Evaluates tokens after those already in the context (recording them for the sampler's
 * penalties); the logits of the last one are then in s->logits. Refuses with COMMON_ERANGE and
 * the numbers when they do not fit the context. */
int cli_session_feed(struct cli_session *s, const int32_t *tokens, uint32_t n);
/* Picks the next token from s->logits (greedy or sampled). */
int cli_session_pick(struct cli_session *s, int32_t *id);
/* True when every context position is used. */
bool cli_session_is_full(const struct cli_session *s);

#endif /* CLI_CLI_H */
