/* cli/main.c - the sluice command: dispatches to one subcommand per file. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct cli_command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
};

static const struct cli_command commands[] = {
    {"inspect", cli_cmd_inspect, "print a GGUF model's architecture, tensors and byte totals"},
    {"mkmodel", cli_cmd_mkmodel, "write a GGUF model with random weights (demo, benchmarks)"},
    {"run", cli_cmd_run, "generate text from a prompt"},
    {"chat", cli_cmd_chat, "chat with a model using its chat template"},
    {"tokenize", cli_cmd_tokenize, "print the token ids of a text, like llama-tokenize"},
    {"perplexity", cli_cmd_perplexity,
     "perplexity of a text file, as llama-perplexity computes it"},
    {"bench", cli_cmd_bench, "prefill/decode tokens per second against measured memory bandwidth"},
    {"generate", cli_cmd_generate, "generate text through a running sluice-router"},
    {"ctl", cli_cmd_ctl, "send one control message to a daemon (health, stats, drain, ...)"},
};

static void cli_usage(FILE *f)
{
    fprintf(f, "usage: sluice COMMAND [options]   (sluice COMMAND --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
}

bool cli_parse_u64(const char *name, const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (!s || !*s || *s == '-') {
        fprintf(stderr, "error: %s expects a non-negative integer, got '%s'\n", name, s ? s : "");
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0') {
        fprintf(stderr, "error: %s expects a non-negative integer, got '%s'\n", name, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u32(const char *name, const char *s, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t v;
    if (!cli_parse_u64(name, s, &v))
        return false;
    if (v < min || v > max) {
        fprintf(stderr, "error: %s must be in %u..%u, got %s\n", name, min, max, s);
        return false;
    }
    *out = (uint32_t)v;
    return true;
}

bool cli_parse_f32(const char *name, const char *s, float *out)
{
    char *end = NULL;
    errno = 0;
    float v = s ? strtof(s, &end) : 0.0f;
    if (!s || !*s || errno != 0 || *end != '\0' || v != v) {
        fprintf(stderr, "error: %s expects a number, got '%s'\n", name, s ? s : "");
        return false;
    }
    *out = v;
    return true;
}

const char *cli_next_arg(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "error: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        cli_usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        cli_usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("sluice 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n\n", argv[1]);
    cli_usage(stderr);
    return 2;
}
