/* cli/main.c - the sluice command: dispatches to one subcommand per file. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct cli_command {
    const char *name;                 /* the word after "sluice" */
    int (*fn)(int argc, char **argv); /* argv[0] is the name; returns the exit status */
    const char *summary;              /* one line for `sluice --help` */
};

static const struct cli_command commands[] = {
    {"inspect", cli_cmd_inspect, "print a GGUF model's architecture, tensors and byte totals"},
    {"convert", cli_cmd_convert, "rewrite a GGUF model as QSF, the streaming container"},
    {"verify", cli_cmd_verify, "check every checksum of a QSF file"},
    {"mkmodel", cli_cmd_mkmodel, "write a GGUF model with random weights (demo, benchmarks)"},
    {"run", cli_cmd_run, "generate text from a prompt"},
    {"chat", cli_cmd_chat, "chat with a model using its chat template"},
    {"tokenize", cli_cmd_tokenize, "print the token ids of a text, like llama-tokenize"},
    {"perplexity", cli_cmd_perplexity,
     "perplexity of a text file, as llama-perplexity computes it"},
    {"bench", cli_cmd_bench, "prefill/decode tokens per second against measured memory bandwidth"},
    {"serve", cli_cmd_serve, "serve the OpenAI-compatible HTTP API in one process"},
    {"generate", cli_cmd_generate, "generate text through a running sluice-router"},
    {"ctl", cli_cmd_ctl, "send one control message to a daemon (health, stats, drain, ...)"},
};
#define CLI_N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

/* The list of commands for --help, from the table above. */
static void main_describe(char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "Commands:\n");
    for (size_t i = 0; i < CLI_N_COMMANDS && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "  %-12s %s\n", commands[i].name,
                              commands[i].summary);
}

static const struct cli_command *main_find(const char *name)
{
    for (size_t i = 0; i < CLI_N_COMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

/* `sluice help [COMMAND]`: the command's --help, or the list of commands. */
static int main_help(const struct common_opts_spec *spec, int argc, char **argv)
{
    if (argc < 2) {
        common_opts_help(spec, stdout);
        return 0;
    }
    const struct cli_command *c = main_find(argv[1]);
    if (!c || argc > 2)
        return common_opts_exit_status(
            c ? common_opts_error(spec, "help takes one command, got '%s'", argv[2])
              : common_opts_error(spec, "unknown command '%s'", argv[1]));
    char *help_argv[] = {argv[1], "--help", NULL};
    return c->fn(2, help_argv);
}

int main(int argc, char **argv)
{
    char                    desc[2048];
    bool                    version = false;
    struct common_opt_strs  words = {.v = calloc((size_t)argc, sizeof(char *)),
                                     .cap = (uint32_t)argc};
    const struct common_opt rows[] = {
        {.name = "version",
         .type = COMMON_OPT_SWITCH,
         .target = &version,
         .help = "print the version and exit"},
        {0},
    };
    main_describe(desc, sizeof(desc));
    struct common_opts_spec spec = {
        .prog = "sluice",
        .usage = "sluice COMMAND [options]",
        .description = desc,
        .epilog = "Run 'sluice COMMAND --help' (or 'sluice help COMMAND') for the options of a "
                  "command.\nExit status: 0 success, 1 a failure, 2 a usage error.",
        .opts = rows,
        .positional = &words,
        .stop_at_positional = true, /* the command's own options follow it */
    };
    if (!words.v) {
        cli_error("sluice", "out of memory");
        return 1;
    }
    int rc = common_opts_parse(&spec, argc, argv);
    int status;
    if (rc != 0) {
        status = common_opts_exit_status(rc);
    } else if (version) {
        printf("sluice 0.1.0\n");
        status = 0;
    } else if (words.n == 0) {
        status = common_opts_exit_status(common_opts_error(&spec, "missing COMMAND"));
    } else {
        /* Every word from the command on is a positional: the command is argv[argc - n]. */
        char                    **sub = argv + (argc - (int)words.n);
        const struct cli_command *c = main_find(sub[0]);
        if (strcmp(sub[0], "help") == 0)
            status = main_help(&spec, (int)words.n, sub);
        else if (!c)
            status =
                common_opts_exit_status(common_opts_error(&spec, "unknown command '%s'", sub[0]));
        else
            status = c->fn((int)words.n, sub);
    }
    free(words.v);
    return status;
}
