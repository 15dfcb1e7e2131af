/* cli/cmd_run.c - `sluice run`: generate a continuation of a prompt in one process. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "router.h"

#define RUN_PROG "sluice run"

static const char run_description[] =
    "Generates a continuation of the prompt on the CPU and prints it as it is made.";

static const char run_epilog[] =
    "Without --ids, stdout gets the text of the generated tokens only (not the prompt), flushed "
    "after each token, then a newline. With --ids, stdout has one line 'prompt_ids: ID ID ...', "
    "then one line 'gen: ID' per generated token, printed as soon as it is chosen. Timings go to "
    "stderr. Generation stops after -n tokens, at an end-of-generation token (unless "
    "--ignore-eos) or when the context is full. A prompt longer than the context is refused, "
    "never truncated.";

/* What the command line asked for. */
struct run_args {
    struct cli_session_opts so;         /* shared options; strings borrowed from argv */
    const char             *prompt;     /* -p: borrowed from argv */
    const char             *file;       /* -f: borrowed from argv */
    const char             *prompt_ids; /* --prompt-ids: borrowed from argv */
    bool                    ids;        /* --ids */
    bool                    ignore_eos; /* --ignore-eos */
    int32_t                *tokens;     /* owned: the ids of --prompt-ids, malloc'd */
    uint32_t                n_tokens;   /* entries of tokens */
};

static int32_t *run_parse_ids(const char *s, uint32_t *n);

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int run_parse(int argc, char **argv, struct run_args *a)
{
    struct cli_session_table t;
    cli_session_opts_default(&a->so, RUN_PROG);
    cli_session_table_init(&t, &a->so);
    const struct common_opt rows[] = {
        {.name = "prompt",
         .short_name = "p",
         .type = COMMON_OPT_STR,
         .target = &a->prompt,
         .help = "prompt text (tokenized with the model's tokenizer, BOS added)"},
        {.name = "file",
         .short_name = "f",
         .type = COMMON_OPT_STR,
         .target = &a->file,
         .metavar = "FILE",
         .help = "read the prompt from a regular file (at most 64 MiB; one trailing newline is "
                 "dropped, as llama.cpp does)"},
        {.name = "prompt-ids",
         .type = COMMON_OPT_STR,
         .target = &a->prompt_ids,
         .metavar = "ID,ID,...",
         .help = "prompt as comma-separated token ids (no tokenizer needed)"},
        {.name = "ignore-eos",
         .type = COMMON_OPT_SWITCH,
         .target = &a->ignore_eos,
         .help = "keep generating after an end-of-sequence token"},
        {.name = "ids",
         .type = COMMON_OPT_SWITCH,
         .target = &a->ids,
         .help = "print token ids instead of text (format below)"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = RUN_PROG,
        .usage = RUN_PROG " -m MODEL.gguf (-p PROMPT | -f FILE | --prompt-ids 1,2,3) [options]",
        .description = run_description,
        .epilog = run_epilog,
        .opts = rows,
        .groups = t.groups,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return rc;
    int n_sources = (a->prompt != NULL) + (a->file != NULL) + (a->prompt_ids != NULL);
    if (n_sources == 0)
        return common_opts_error(&spec, "no prompt (-p TEXT, -f FILE or --prompt-ids 1,2,3)");
    if (n_sources > 1)
        return common_opts_error(&spec, "give one of -p, -f and --prompt-ids, not several");
    if (a->prompt_ids && !(a->tokens = run_parse_ids(a->prompt_ids, &a->n_tokens)))
        return common_opts_error(&spec, "--prompt-ids expects comma-separated token ids, got '%s'",
                                 a->prompt_ids);
    return 0;
}

/* Parses "1,2,3" into a malloc'd array; NULL when it is not a list of ids (or out of memory). */
static int32_t *run_parse_ids(const char *s, uint32_t *n)
{
    size_t   cap = 16, len = 0;
    int32_t *ids = malloc(cap * sizeof(*ids));
    while (ids && *s) {
        char *end = NULL;
        long  v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            free(ids);
            return NULL;
        }
        if (len == cap) {
            int32_t *p = realloc(ids, (cap *= 2) * sizeof(*ids));
            if (!p) {
                free(ids);
                return NULL;
            }
            ids = p;
        }
        ids[len++] = (int32_t)v;
        s = *end ? end + 1 : end;
    }
    if (ids && len == 0) {
        free(ids);
        return NULL;
    }
    *n = (uint32_t)len;
    return ids;
}

/* Tokenizes `text` with BOS into a malloc'd array (*tokens, *n); prints why not. */
static int run_tokenize(const struct cli_session *s, const char *text, size_t len, int32_t **tokens,
                        uint32_t *n)
{
    struct router_tokens toks = {0};
    int                  rc = router_tokenize(s->vocab, text, len,
                                              &(struct router_tokenize_opts){.add_special = true}, &toks);
    if (rc < 0 || toks.n == 0 || toks.n > UINT32_MAX) {
        cli_error(RUN_PROG, "tokenizing the prompt failed%s", rc < 0 ? "" : " (no tokens)");
        router_tokens_fini(&toks);
        return rc < 0 ? rc : COMMON_EINVAL;
    }
    *tokens = toks.ids; /* taken over */
    *n = (uint32_t)toks.n;
    return COMMON_OK;
}

/* Prints one generated token: its id with --ids, else its text (or [id] without a tokenizer). */
static void run_print_token(const struct cli_session *s, bool ids, struct router_detok_stream *ds,
                            struct router_text *piece, int32_t id)
{
    if (ids) {
        printf("gen: %d\n", id);
    } else if (s->vocab) {
        router_text_clear(piece);
        if (router_detok_stream_push(ds, id, piece) > 0)
            fwrite(piece->ptr, 1, piece->len, stdout);
    } else {
        printf("[%d]", id);
    }
    fflush(stdout);
}

/* Feeds the prompt, then generates and prints up to -n tokens; timings on stderr. */
static int run_generate(struct cli_session *s, const struct run_args *a, const int32_t *tokens,
                        uint32_t n_prompt)
{
    struct router_detok_stream ds;
    struct router_text         piece = {0};
    int                        rc = COMMON_OK;
    if (s->vocab)
        router_detok_stream_init(&ds, s->vocab,
                                 &(struct router_detok_opts){.keep_leading_space = true});
    if (a->ids) {
        printf("prompt_ids:");
        for (uint32_t i = 0; i < n_prompt; i++)
            printf(" %d", tokens[i]);
        printf("\n");
        fflush(stdout);
    }
    uint64_t t0 = common_now_ns();
    if ((rc = cli_session_feed(s, tokens, n_prompt)) < 0)
        goto out;
    uint64_t t1 = common_now_ns(), t_gen = 0;
    uint32_t n_gen = 0;
    while (n_gen < a->so.n_predict) {
        int32_t id = 0;
        if ((rc = cli_session_pick(s, &id)) < 0)
            goto out;
        run_print_token(s, a->ids, &ds, &piece, id);
        n_gen++;
        if ((!a->ignore_eos && s->vocab && router_vocab_is_eog(s->vocab, id)) ||
            n_gen == a->so.n_predict)
            break;
        if (cli_session_is_full(s)) {
            fprintf(stderr, "\n" RUN_PROG ": warning: the context is full after %u tokens\n",
                    executor_ctx_n_past(s->ctx));
            break;
        }
        uint64_t ts = common_now_ns();
        if ((rc = cli_session_feed(s, &id, 1)) < 0)
            goto out;
        t_gen += common_now_ns() - ts;
    }
    if (!a->ids) {
        router_text_clear(&piece);
        if (s->vocab && router_detok_stream_flush(&ds, &piece) > 0)
            fwrite(piece.ptr, 1, piece.len, stdout);
        printf("\n");
    }
    fflush(stdout); /* the text ends before the timing line on a shared terminal */
    fprintf(stderr,
            "run: prompt %u tokens in %.1f ms (%.2f tok/s); generated %u tokens, decode %.2f "
            "tok/s; %u threads, isa %s\n",
            n_prompt, (double)(t1 - t0) / 1e6, (double)n_prompt / ((double)(t1 - t0) / 1e9), n_gen,
            n_gen > 1 ? (double)(n_gen - 1) / ((double)t_gen / 1e9) : 0.0,
            executor_threadpool_n_threads(s->pool), executor_isa_name(executor_kernels_active()));
out:
    router_text_fini(&piece);
    return rc;
}

int cli_cmd_run(int argc, char **argv)
{
    struct run_args a = {0};
    int             rc = run_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);
    uint32_t n_prompt = a.n_tokens;
    int32_t *tokens = a.tokens; /* taken over */
    char    *text = NULL;
    size_t   len = 0;
    if (a.file) {
        if (cli_text_file_read(RUN_PROG, a.file, CLI_PROMPT_MAX_BYTES, &text, &len) < 0)
            return 1;
        if (len > 0 && text[len - 1] == '\n')
            text[--len] = '\0'; /* llama.cpp's -f drops one trailing newline */
    }

    int                status = 1;
    struct cli_session s;
    if (cli_session_open(&s, &a.so, a.prompt_ids == NULL) < 0)
        goto out;
    if (a.prompt && run_tokenize(&s, a.prompt, strlen(a.prompt), &tokens, &n_prompt) < 0)
        goto out;
    if (a.file && run_tokenize(&s, text, len, &tokens, &n_prompt) < 0)
        goto out;
    if (n_prompt > executor_ctx_n_ctx(s.ctx)) {
        cli_error(RUN_PROG, "the prompt has %u tokens but the context holds %u (use -c)", n_prompt,
                  executor_ctx_n_ctx(s.ctx));
        goto out;
    }
    if (run_generate(&s, &a, tokens, n_prompt) == COMMON_OK)
        status = 0;
out:
    if (cli_session_close(&s) < 0)
        status = 1; /* the trace (--trace-out) was not written */
    free(tokens);
    free(text);
    return status;
}
