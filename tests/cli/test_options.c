/* tests/cli/test_options.c - every sluice subcommand parses its options with one table-driven
 * parser: usage errors in one style with exit status 2, --name=value, generated --help. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"

/* Every subcommand, and an option each one's --help must list. */
static const struct {
    const char *name;
    const char *option;
} t_commands[] = {
    {"inspect", "--json"},  {"mkmodel", "--output"},  {"run", "--repeat-penalty"},
    {"chat", "--template"}, {"tokenize", "--prompt"}, {"perplexity", "--chunks"},
    {"bench", "--output"},  {"generate", "--socket"}, {"ctl", "--timeout"},
};
#define N_COMMANDS (sizeof(t_commands) / sizeof(t_commands[0]))

/* Runs `sluice ARGS` and returns what it wrote to stderr (stdout dropped) and its exit status. */
static char *sluice_stderr(const char *args, int *status)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "env -u SLUICE_RUN_DIR %s %s 2>&1 >/dev/null", SLUICE, args);
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

/* Runs `sluice ARGS` and returns its stdout (stderr dropped) and its exit status. */
static char *sluice_stdout(const char *args, int *status)
{
    char cmd[4096];
    snprintf(cmd, sizeof(cmd), "%s %s 2>/dev/null", SLUICE, args);
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

/* The usage error of `sluice CMD`: one error line and the hint, exactly. */
static void expect_usage_error(const char *cmd, const char *args, const char *message)
{
    char line[1024], want[2048];
    int  st = 0;
    snprintf(line, sizeof(line), "%s %s", cmd, args);
    char *err = sluice_stderr(line, &st);
    snprintf(want, sizeof(want),
             "sluice %s: error: %s\nTry 'sluice %s --help' for more information.\n", cmd, message,
             cmd);
    cr_expect_eq(st, 2, "'sluice %s' exited %d", line, st);
    cr_expect_str_eq(err, want, "'sluice %s'", line);
    free(err);
}

Test(cli_options, unknown_option_is_named_with_exit_2)
{
    for (size_t i = 0; i < N_COMMANDS; i++)
        expect_usage_error(t_commands[i].name, "--verbose-prompt",
                           "unknown option '--verbose-prompt'");
}

Test(cli_options, unknown_option_after_valid_ones_is_not_taken_for_a_value)
{
    /* The old loop said "option --verbose-prompt needs a value" here. */
    expect_usage_error("run", "-m m.gguf -p hi --verbose-prompt",
                       "unknown option '--verbose-prompt'");
}

Test(cli_options, missing_value_is_reported)
{
    expect_usage_error("run", "-p hi -m", "option '-m' needs a value");
    expect_usage_error("bench", "-m m.gguf -p", "option '-p' needs a value");
    expect_usage_error("tokenize", "-m m.gguf --file", "option '--file' needs a value");
}

Test(cli_options, bad_value_names_what_was_expected)
{
    expect_usage_error("run", "-m m.gguf -p hi --temp=warm",
                       "--temp expects a number >= 0, got 'warm'");
    expect_usage_error("run", "-m m.gguf -p hi --io disk",
                       "--io expects uring, pread or mmap, got 'disk'");
    expect_usage_error("bench", "-m m.gguf -p 16,,32",
                       "-p expects comma-separated numbers in [0, 1048576], got '16,,32' (item 2 "
                       "is empty)");
    expect_usage_error("bench", "-m m.gguf -o xml", "-o expects md, csv or json, got 'xml'");
}

Test(cli_options, missing_required_option_is_reported)
{
    expect_usage_error("run", "-p hi", "option '--model' is required");
    expect_usage_error("mkmodel", "--preset tiny", "option '--output' is required");
}

Test(cli_options, exclusive_prompt_sources_are_refused)
{
    expect_usage_error("run", "-m m.gguf -p hi -f prompt.txt",
                       "give one of -p, -f and --prompt-ids, not several");
    expect_usage_error("tokenize", "-m m.gguf -p hi there", "give the text once: TEXT or -p TEXT");
}

Test(cli_options, unknown_command_exits_2)
{
    int   st = 0;
    char *err = sluice_stderr("frobnicate", &st);
    cr_assert_eq(st, 2);
    cr_assert_str_eq(err, "sluice: error: unknown command 'frobnicate'\n"
                          "Try 'sluice --help' for more information.\n");
    free(err);
    err = sluice_stderr("", &st);
    cr_assert_eq(st, 2);
    cr_assert_str_eq(err, "sluice: error: missing COMMAND\n"
                          "Try 'sluice --help' for more information.\n");
    free(err);
}

Test(cli_options, help_exits_0_and_lists_an_option)
{
    for (size_t i = 0; i < N_COMMANDS; i++) {
        char args[256], usage[256];
        int  st = 0;
        snprintf(args, sizeof(args), "%s --help", t_commands[i].name);
        char *out = sluice_stdout(args, &st);
        snprintf(usage, sizeof(usage), "usage: sluice %s", t_commands[i].name);
        cr_expect_eq(st, 0, "'sluice %s' exited %d", args, st);
        cr_expect(strncmp(out, usage, strlen(usage)) == 0, "'sluice %s' starts with: %.80s", args,
                  out);
        cr_expect(strstr(out, t_commands[i].option), "'sluice %s' lists %s", args,
                  t_commands[i].option);
        free(out);
    }
}

Test(cli_options, main_help_lists_every_command)
{
    int   st = 0, st2 = 0;
    char *out = sluice_stdout("--help", &st);
    char *again = sluice_stdout("help", &st2);
    cr_assert_eq(st, 0);
    cr_assert_eq(st2, 0);
    cr_assert_str_eq(out, again, "'sluice help' is 'sluice --help'");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        char line[64];
        snprintf(line, sizeof(line), "\n  %s ", t_commands[i].name);
        cr_expect(strstr(out, line), "'%s' not listed:\n%s", t_commands[i].name, out);
    }
    free(out);
    free(again);
}

Test(cli_options, help_word_shows_the_command_help)
{
    int   st = 0, st2 = 0;
    char *out = sluice_stdout("help bench", &st);
    char *want = sluice_stdout("bench --help", &st2);
    cr_assert_eq(st, 0);
    cr_assert_str_eq(out, want);
    free(out);
    free(want);
}

Test(cli_options, equals_form_sets_the_value, .timeout = 60)
{
    char *dir = fixture_tmpdir();
    char  args[1024];
    int   st = 0;
    snprintf(args, sizeof(args), "mkmodel --output=%s/m.gguf --preset=tiny --n-layer=1 -q", dir);
    char *out = sluice_stdout(args, &st);
    cr_assert_eq(st, 0, "%s", args);
    free(out);
    snprintf(args, sizeof(args), "inspect --json %s/m.gguf", dir);
    out = sluice_stdout(args, &st);
    cr_assert_eq(st, 0);
    cr_assert(strstr(out, "\"n_layer\": 1,"), "--n-layer=1 was not applied:\n%s", out);
    free(out);
    fixture_rmtree(dir);
    free(dir);
}

/* A model that cannot be opened is named once in the error, whichever command loads it. */
Test(cli_options, load_error_names_the_path_once, .timeout = 60)
{
    /* The command and its words before and after the path. */
    static const char *const uses[][2] = {
        {"run -m", "-p hi"},  {"chat -m", "-p hi"}, {"tokenize -m", "hi"},
        {"bench -m", "-r 1"}, {"inspect", ""},
    };
    const char *path = "/nonexistent-sluice-dir/missing-model.gguf";
    for (size_t i = 0; i < sizeof(uses) / sizeof(uses[0]); i++) {
        char args[1024];
        int  st = 0;
        snprintf(args, sizeof(args), "%s %s %s", uses[i][0], path, uses[i][1]);
        char *err = sluice_stderr(args, &st);
        char  prefix[64];
        snprintf(prefix, sizeof(prefix), "sluice %.*s: error: ", (int)strcspn(uses[i][0], " "),
                 uses[i][0]);
        cr_expect_eq(st, 1, "'sluice %s' exited %d", args, st);
        cr_expect(strncmp(err, prefix, strlen(prefix)) == 0, "'sluice %s': %s", args, err);
        const char *first = strstr(err, path);
        cr_expect(first, "'sluice %s' does not name the file: %s", args, err);
        cr_expect(!first || !strstr(first + 1, path), "'sluice %s' names it twice: %s", args, err);
        free(err);
    }
}
