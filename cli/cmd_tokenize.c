/* cli/cmd_tokenize.c - `sluice tokenize`: text to token ids, like llama-tokenize. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"

#define TOKENIZE_PROG "sluice tokenize"

/* What the command line asked for. */
struct tokenize_args {
    const char *model;    /* -m: borrowed from argv */
    const char *file;     /* -f: borrowed from argv */
    const char *prompt;   /* -p, or the positional TEXT: borrowed from argv */
    bool        ids_only; /* --ids */
    bool        no_bos;   /* --no-bos */
    bool        special;  /* --special */
    bool        bench;    /* --bench */
};

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int tokenize_parse(int argc, char **argv, struct tokenize_args *a)
{
    const char             *words_v[1];
    struct common_opt_strs  words = {.v = words_v, .cap = 1};
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->model,
         .metavar = "PATH",
         .help = "GGUF model (only its tokenizer.* metadata is read)",
         .required = true},
        {.name = "prompt",
         .short_name = "p",
         .type = COMMON_OPT_STR,
         .target = &a->prompt,
         .help = "the text (same as the positional TEXT)"},
        {.name = "file",
         .short_name = "f",
         .type = COMMON_OPT_STR,
         .target = &a->file,
         .metavar = "FILE",
         .help = "read the text from a regular file, byte for byte (at most 64 MiB)"},
        {.name = "ids",
         .type = COMMON_OPT_SWITCH,
         .target = &a->ids_only,
         .help = "print only the ids, as [id, id, ...]"},
        {.name = "no-bos",
         .type = COMMON_OPT_SWITCH,
         .target = &a->no_bos,
         .help = "do not add BOS / EOS even if the model asks for them"},
        {.name = "special",
         .type = COMMON_OPT_SWITCH,
         .target = &a->special,
         .help = "recognise control-token text such as <|im_start|>"},
        {.name = "bench",
         .type = COMMON_OPT_SWITCH,
         .target = &a->bench,
         .help = "encode the text repeated to ~1 MiB and print MB/s"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = TOKENIZE_PROG,
        .usage = TOKENIZE_PROG " -m MODEL.gguf [options] (TEXT | -p TEXT | -f FILE)",
        .description = "Prints the tokens of the text as the model's tokenizer makes them, like "
                       "llama-tokenize: one line per token, its id, '->' and its text quoted.",
        .opts = rows,
        .positional = &words,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return rc;
    if (words.n && a->prompt)
        return common_opts_error(&spec, "give the text once: TEXT or -p TEXT");
    if (words.n)
        a->prompt = words_v[0];
    if (!a->prompt && !a->file)
        return common_opts_error(&spec, "no text (TEXT, -p TEXT or -f FILE)");
    if (a->prompt && a->file)
        return common_opts_error(&spec, "give either a text or -f FILE, not both");
    return 0;
}

/* Prints bytes between quotes as llama-tokenize does (raw, the terminal renders UTF-8). */
static void print_piece(const char *p, size_t n)
{
    fputc('\'', stdout);
    fwrite(p, 1, n, stdout);
    fputc('\'', stdout);
}

static int tokenize_bench(const struct router_vocab *v, const char *text, size_t len,
                          const struct router_tokenize_opts *o)
{
    const size_t target = (size_t)1 << 20;
    if (len == 0) {
        cli_error(TOKENIZE_PROG, "--bench needs a non-empty text");
        return 1;
    }
    struct router_text big = {0};
    while (big.len < target) {
        if (router_text_append(&big, text, len) < 0) {
            cli_error(TOKENIZE_PROG, "out of memory");
            router_text_fini(&big);
            return 1;
        }
    }
    struct router_tokens toks = {0};
    double               best = 1e30;
    for (int run = 0; run < 3; run++) {
        router_tokens_clear(&toks);
        const uint64_t t0 = common_now_ns();
        if (router_tokenize(v, big.ptr, big.len, o, &toks) < 0) {
            cli_error(TOKENIZE_PROG, "out of memory");
            break;
        }
        const double s = (double)(common_now_ns() - t0) / 1e9;
        if (s < best)
            best = s;
    }
    printf("bench: %zu bytes -> %zu tokens in %.1f ms (best of 3): %.2f MB/s\n", big.len, toks.n,
           best * 1e3, (double)big.len / 1e6 / best);
    router_tokens_fini(&toks);
    router_text_fini(&big);
    return 0;
}

/* Prints each token as "ID -> 'piece'", or with --ids the list of ids. */
static void tokenize_print(const struct router_vocab *v, const struct router_tokens *toks,
                           bool ids_only)
{
    if (ids_only) {
        fputc('[', stdout);
        for (size_t i = 0; i < toks->n; i++)
            printf(i ? ", %d" : "%d", toks->ids[i]);
        fputs("]\n", stdout);
        return;
    }
    const struct router_detok_opts dopts = {.render_special = true};
    for (size_t i = 0; i < toks->n; i++) {
        const char *p;
        size_t      n;
        router_token_piece(v, toks->ids[i], &dopts, &p, &n);
        printf("%6d -> ", toks->ids[i]);
        print_piece(p, n);
        fputc('\n', stdout);
    }
}

int cli_cmd_tokenize(int argc, char **argv)
{
    struct tokenize_args a = {0};
    int                  rc = tokenize_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);

    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    struct router_vocab *v = NULL;
    struct router_tokens toks = {0};
    char                *buf = NULL;
    const char          *in = a.prompt;
    size_t               len = a.prompt ? strlen(a.prompt) : 0;
    int                  status = 1;
    if (a.file) {
        if (cli_text_file_read(TOKENIZE_PROG, a.file, CLI_PROMPT_MAX_BYTES, &buf, &len) < 0)
            return 1;
        in = buf;
    }
    if ((rc = common_gguf_open(a.model, NULL, &g, &e)) < 0 ||
        (rc = router_vocab_load(g, &v, &e)) < 0) {
        cli_error_path(TOKENIZE_PROG, a.model, rc, &e);
        goto out;
    }
    const struct router_tokenize_opts o = {.add_special = !a.no_bos, .parse_special = a.special};
    if (a.bench) {
        status = tokenize_bench(v, in, len, &o);
        goto out;
    }
    if (router_tokenize(v, in, len, &o, &toks) < 0) {
        cli_error(TOKENIZE_PROG, "out of memory");
        goto out;
    }
    tokenize_print(v, &toks, a.ids_only);
    status = 0;
out:
    router_tokens_fini(&toks);
    free(buf);
    router_vocab_destroy(v);
    common_gguf_close(g);
    return status;
}
