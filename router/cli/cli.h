/* router/cli/cli.h - the sluice CLI: one entry point per subcommand, shared option helpers. */
#ifndef ROUTER_CLI_CLI_H
#define ROUTER_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "executor.h"
#include "router.h"

/* Each subcommand gets argv with argv[0] = subcommand name; returns the process exit code. */
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_mkmodel(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_chat(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);

/* Parses a decimal unsigned integer in [min, max] for option `name`; prints an error and
 * returns false when it is not one. */
bool cli_parse_u32(const char *name, const char *s, uint32_t min, uint32_t max, uint32_t *out);
bool cli_parse_u64(const char *name, const char *s, uint64_t *out);
bool cli_parse_f32(const char *name, const char *s, float *out);

/* Returns the value following option argv[*i] (advancing *i), or prints an error and returns
 * NULL when it is missing. */
const char *cli_next_arg(int argc, char **argv, int *i);

/* ---- one-process generation shared by run and chat (router/cli/session.c) ---------------- */

/* Options common to the generating commands (-m -n -t -c -b --cache-type and the sampler). */
struct cli_session_opts {
    const char                *model;     /* -m */
    uint32_t                   n_predict; /* -n: tokens to generate per reply */
    uint32_t                   n_threads; /* -t: 0 = physical cores */
    uint32_t                   n_ctx;     /* -c: 0 = the model's, capped by the executor */
    uint32_t                   n_batch;   /* -b: 0 = executor default */
    enum executor_cache_type   cache;     /* --cache-type */
    struct router_sampler_opts sampler;   /* --temp --top-k --top-p --min-p --seed */
};

/* Fills llama.cpp's defaults: -n 128, --temp 0.8, --top-k 40, --top-p 0.95, --min-p 0.05. */
void cli_session_opts_default(struct cli_session_opts *o);

/* Applies option `a` with value `v` when it is one of the shared options. Returns 1 when it was
 * consumed, 0 when `a` is not a shared option, -1 when the value is bad (message printed). */
int cli_session_parse_flag(struct cli_session_opts *o, const char *a, const char *v);

/* A model loaded for generation. Caller-owned; fields are read-only for callers. */
struct cli_session {
    struct executor_pool  *pool;    /* owned */
    struct executor_model *model;   /* owned */
    struct executor_ctx   *ctx;     /* owned: one sequence */
    struct router_vocab   *vocab;   /* owned; NULL when the model has no usable tokenizer */
    struct router_sampler  sampler; /* owned */
    float                 *logits;  /* owned: n_vocab logits of the last fed token */
    uint32_t               n_vocab;
    bool                   greedy; /* --temp 0: argmax, ties to the lowest id */
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

#endif /* ROUTER_CLI_CLI_H */
