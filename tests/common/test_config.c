/* tests/common/test_config.c - daemon config files (global keys, per-daemon sections) turned into
 * option words. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fixture.h"

/* Fixture state (Criterion fixtures take no arguments). */
static char *t_dir;
static char  t_path[200];

static void config_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    snprintf(t_path, sizeof(t_path), "%.150s/d.conf", t_dir);
}

static void config_teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
}

TestSuite(common_config, .init = config_setup, .fini = config_teardown);

static void write_file(const char *text)
{
    FILE *f = fopen(t_path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

/* Runs common_config_argv on the file for `section` and `argv`; checks the words against `want`. */
static void expect_section_words(const char *section, char **argv, int argc,
                                 const char *const *want, int n_want)
{
    int                  out_argc = 0;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_config_argv(t_path, section, argc, argv, &out_argc, &out_argv, &e),
                 COMMON_OK, "%s", e.text);
    cr_assert_eq(out_argc, n_want, "got %d words", out_argc);
    for (int i = 0; i < n_want; i++)
        cr_assert_str_eq(out_argv[i], want[i], "word %d", i);
    cr_assert_null(out_argv[out_argc]);
    free(out_argv);
}

static void expect_words(char **argv, int argc, const char *const *want, int n_want)
{
    expect_section_words(NULL, argv, argc, want, n_want);
}

/* Expects the file to be refused with COMMON_EINVAL and exactly "config PATH:LINE: why". */
static void expect_line_error(const char *section, int line, const char *why)
{
    char                *argv[] = {"d", NULL};
    int                  out_argc = -1;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_config_argv(t_path, section, 1, argv, &out_argc, &out_argv, &e),
                 COMMON_EINVAL);
    cr_assert_null(out_argv, "nothing is returned on failure");
    cr_assert_eq(out_argc, -1);
    char want[512];
    snprintf(want, sizeof(want), "config %s:%d: %s", t_path, line, why);
    cr_assert_str_eq(e.text, want);
}

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

Test(common_config, lines_become_option_words_before_the_command_line)
{
    write_file("# a fetcher\n"
               "\n"
               "run-dir = /tmp/run\n"
               "  pool_slots=256\n"
               "verbose\n"
               "log.level = debug\n"
               "   # indented comment\n"
               "name = a b c\n");
    char             *argv[] = {"fetcherd", "--config", t_path, "--pool-slots", "8", NULL};
    const char *const want[] = {"fetcherd", "--run-dir", "/tmp/run",     "--pool-slots",
                                "256",      "--verbose", "--log.level",  "debug",
                                "--name",   "a b c",     "--pool-slots", "8"};
    expect_words(argv, 5, want, N_OF(want));
}

Test(common_config, hash_after_the_start_of_a_value_is_part_of_it)
{
    write_file("model = /m/a#b.gguf\n"
               "run-dir = /tmp/run   # not a comment\n"
               "prompt = x#\n");
    char             *argv[] = {"d", NULL};
    const char *const want[] = {
        "d", "--model", "/m/a#b.gguf", "--run-dir", "/tmp/run   # not a comment", "--prompt", "x#"};
    expect_words(argv, 1, want, N_OF(want));
}

Test(common_config, comment_may_follow_a_key_or_a_section_header)
{
    write_file("verbose # a switch\n"
               "[fetcher]   # the fetcher's keys\n"
               "mlock#no blank needed\n");
    char             *argv[] = {"d", NULL};
    const char *const want[] = {"d", "--verbose", "--mlock"};
    expect_section_words("fetcher", argv, 1, want, N_OF(want));
}

Test(common_config, quoted_values_keep_hashes_and_unescape)
{
    write_file("a = \"x # y\"\n"
               "b = \"say \\\"hi\\\" \\\\ ok\"   # a comment after the quote\n"
               "c = \"\"\n"
               "d=\"  padded  \"\n"
               "e = \"#start\"\n");
    char             *argv[] = {"d", NULL};
    const char *const want[] = {"d",     "--a", "x # y", "--b",        "say \"hi\" \\ ok",
                                "--c",   "",    "--d",   "  padded  ", "--e",
                                "#start"};
    expect_words(argv, 1, want, N_OF(want));
}

Test(common_config, crlf_lines_are_read_like_lf_lines)
{
    write_file("model = m.gguf\r\nverbose\r\n[router]\r\nparallel = 4\r\n");
    char             *argv[] = {"d", NULL};
    const char *const want[] = {"d", "--model", "m.gguf", "--verbose", "--parallel", "4"};
    expect_section_words("router", argv, 1, want, N_OF(want));
}

Test(common_config, daemon_takes_global_keys_and_its_own_section)
{
    write_file("model = m.gguf\n"
               "log-level = info\n"
               "[fetcher]\n"
               "ram-budget = 8G\n"
               "[executor]\n"
               "threads = 8\n"
               "[ router ]\n"
               "parallel = 4\n"
               "[fetcher]\n"
               "policy = lfu\n");
    char             *argv[] = {"d", "--threads", "2", NULL};
    const char *const fetcher[] = {"d",    "--model",      "m.gguf", "--log-level",
                                   "info", "--ram-budget", "8G",     "--policy",
                                   "lfu",  "--threads",    "2"};
    expect_section_words("fetcher", argv, 3, fetcher, N_OF(fetcher));
    const char *const executor[] = {"d", "--model",   "m.gguf", "--log-level", "info", "--threads",
                                    "8", "--threads", "2"};
    expect_section_words("executor", argv, 3, executor, N_OF(executor));
    const char *const router[] = {"d", "--model",   "m.gguf", "--log-level", "info", "--parallel",
                                  "4", "--threads", "2"};
    expect_section_words("router", argv, 3, router, N_OF(router));
    const char *const globals[] = {"d",    "--model",   "m.gguf", "--log-level",
                                   "info", "--threads", "2"};
    expect_section_words(NULL, argv, 3, globals, N_OF(globals));
}

Test(common_config, unknown_section_is_named_with_file_and_line)
{
    write_file("model = m.gguf\n\n[fetcher]\n[sluice]\nx = 1\n");
    expect_line_error("fetcher", 4,
                      "unknown section '[sluice]' (expected [fetcher], [executor] or [router])");
}

Test(common_config, error_in_another_daemons_section_still_stops_the_file)
{
    write_file("[router]\nparallel = 4\ntemplate = \"chatml\n");
    expect_line_error("fetcher", 3, "unterminated quoted value (a closing '\"' is missing)");
}

Test(common_config, unknown_requested_section_is_einval)
{
    write_file("model = m.gguf\n");
    char                *argv[] = {"d", NULL};
    int                  out_argc = -1;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_config_argv(t_path, "sluice", 1, argv, &out_argc, &out_argv, &e),
                 COMMON_EINVAL);
    cr_assert_null(out_argv);
    cr_assert_not_null(strstr(e.text, "unknown section 'sluice'"), "%s", e.text);
}

Test(common_config, bad_quoting_is_named_with_file_and_line)
{
    const struct {
        const char *text, *why;
    } bad[] = {
        {"a = 1\nb = 2\nc = \"x\" y\n", "unexpected text after the closing quote"},
        {"a = 1\nb = 2\nc = \"x\\n\"\n",
         "unknown escape '\\n' in a quoted value (only \\\" and \\\\ are escapes)"},
        {"a = 1\nb = 2\nc = \"x\\\n", "unterminated quoted value (a closing '\"' is missing)"},
        {"a = 1\nb = 2\nc = # no value\n",
         "expected a value after '=' (write \"\" for an empty one)"},
        {"a = 1\nb = 2\n[fetcher\n", "expected ']' to close the section header"},
        {"a = 1\nb = 2\n[fetcher] x\n", "unexpected text after the section header"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(bad[i].text);
        expect_line_error("fetcher", 3, bad[i].why);
    }
}

Test(common_config, config_equals_form_is_removed_too)
{
    write_file("threads = 2\n");
    char arg[256];
    snprintf(arg, sizeof(arg), "--config=%s", t_path);
    char             *argv[] = {"d", arg, "-v", NULL};
    const char *const want[] = {"d", "--threads", "2", "-v"};
    expect_words(argv, 3, want, 4);
}

Test(common_config, empty_file_keeps_the_command_line)
{
    write_file("");
    char             *argv[] = {"d", "--x", "1", NULL};
    const char *const want[] = {"d", "--x", "1"};
    expect_words(argv, 3, want, 3);
}

Test(common_config, bad_line_is_named_with_its_number)
{
    const char *bad[] = {"ok = 1\n\n = value\n", "ok = 1\nx\nkey =\n", "a\nb\nbad key = 1\n",
                         "a\nb\nconfig = other.conf\n", "a\nb\nk$y = 1\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_file(bad[i]);
        char                *argv[] = {"d", NULL};
        int                  out_argc = -1;
        char               **out_argv = NULL;
        struct common_errmsg e = {{0}};
        cr_assert_eq(common_config_argv(t_path, NULL, 1, argv, &out_argc, &out_argv, &e),
                     COMMON_EINVAL, "case %zu accepted", i);
        cr_assert_null(out_argv);
        cr_assert_eq(out_argc, -1);
        char where[256];
        snprintf(where, sizeof(where), "config %s:3: ", t_path);
        cr_assert(strncmp(e.text, where, strlen(where)) == 0, "case %zu: %s", i, e.text);
    }
}

Test(common_config, missing_file_is_enoent)
{
    char                *argv[] = {"d", NULL};
    int                  out_argc = 0;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(
        common_config_argv("/nonexistent/sluice.conf", NULL, 1, argv, &out_argc, &out_argv, &e),
        COMMON_ENOENT);
    cr_assert_not_null(strstr(e.text, "/nonexistent/sluice.conf"));
}

Test(common_config, find_reads_both_forms)
{
    char *a1[] = {"d", "-x", "--config", "f.conf", NULL};
    cr_assert_str_eq(common_config_find(4, a1), "f.conf");
    char *a2[] = {"d", "--config=g.conf", NULL};
    cr_assert_str_eq(common_config_find(2, a2), "g.conf");
    char *a3[] = {"d", "--config", NULL};
    cr_assert_null(common_config_find(2, a3));
    char *a4[] = {"d", "--other", NULL};
    cr_assert_null(common_config_find(2, a4));
}

Test(common_config, load_passes_argv_through_or_reads_the_file)
{
    char  *plain[] = {"prog", "-m", "x", NULL};
    int    argc2;
    char **argv2, **owned;
    cr_assert_eq(common_config_load("prog", "fetcher", 3, plain, &argc2, &argv2, &owned),
                 COMMON_OK);
    cr_assert_eq(argv2, plain);
    cr_assert_null(owned);
    cr_assert_eq(argc2, 3);

    char *dangling[] = {"prog", "--config", NULL};
    cr_assert_eq(common_config_load("prog", "fetcher", 2, dangling, &argc2, &argv2, &owned),
                 COMMON_EINVAL);
    cr_assert_null(owned);

    write_file("model = m.gguf\n[router]\nparallel = 2\n");
    char *with[] = {"prog", "--config", t_path, "-t", "2", NULL};
    cr_assert_eq(common_config_load("prog", "fetcher", 5, with, &argc2, &argv2, &owned), COMMON_OK);
    cr_assert_eq(argv2, owned);
    const char *const want[] = {"prog", "--model", "m.gguf", "-t", "2"};
    cr_assert_eq(argc2, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_str_eq(argv2[i], want[i], "word %d", i);
    free(owned);

    char *missing[] = {"prog", "--config", "/nonexistent/sluice.conf", NULL};
    cr_assert_eq(common_config_load("prog", "fetcher", 3, missing, &argc2, &argv2, &owned),
                 COMMON_ENOENT);
    cr_assert_null(owned);
}
