/* tests/common/test_config.c - daemon config files turned into option words. */
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

/* Runs common_config_argv on the file and `argv`; checks the words against `want`. */
static void expect_words(char **argv, int argc, const char *const *want, int n_want)
{
    int                  out_argc = 0;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_config_argv(t_path, argc, argv, &out_argc, &out_argv, &e), COMMON_OK, "%s",
                 e.text);
    cr_assert_eq(out_argc, n_want, "got %d words", out_argc);
    for (int i = 0; i < n_want; i++)
        cr_assert_str_eq(out_argv[i], want[i], "word %d", i);
    cr_assert_null(out_argv[out_argc]);
    free(out_argv);
}

Test(common_config, lines_become_option_words_before_the_command_line)
{
    write_file("# a fetcher\n"
               "\n"
               "run-dir = /tmp/run   # trailing comment\n"
               "  pool_slots=256\n"
               "verbose\n"
               "log.level = debug\n"
               "   # indented comment\n"
               "name = a b c\n");
    char             *argv[] = {"fetcherd", "--config", t_path, "--pool-slots", "8", NULL};
    const char *const want[] = {"fetcherd", "--run-dir", "/tmp/run",     "--pool-slots",
                                "256",      "--verbose", "--log.level",  "debug",
                                "--name",   "a b c",     "--pool-slots", "8"};
    expect_words(argv, 5, want, (int)(sizeof(want) / sizeof(want[0])));
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
        cr_assert_eq(common_config_argv(t_path, 1, argv, &out_argc, &out_argv, &e), COMMON_EINVAL,
                     "case %zu accepted", i);
        cr_assert_null(out_argv);
        cr_assert_eq(out_argc, -1);
        char where[256];
        snprintf(where, sizeof(where), "%s:3:", t_path);
        cr_assert_not_null(strstr(e.text, where), "case %zu: %s", i, e.text);
    }
}

Test(common_config, missing_file_is_enoent)
{
    char                *argv[] = {"d", NULL};
    int                  out_argc = 0;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_config_argv("/nonexistent/sluice.conf", 1, argv, &out_argc, &out_argv, &e),
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
    cr_assert_eq(common_config_load("prog", 3, plain, &argc2, &argv2, &owned), COMMON_OK);
    cr_assert_eq(argv2, plain);
    cr_assert_null(owned);
    cr_assert_eq(argc2, 3);

    char *dangling[] = {"prog", "--config", NULL};
    cr_assert_eq(common_config_load("prog", 2, dangling, &argc2, &argv2, &owned), COMMON_EINVAL);
    cr_assert_null(owned);

    write_file("model = m.gguf\n");
    char *with[] = {"prog", "--config", t_path, "-t", "2", NULL};
    cr_assert_eq(common_config_load("prog", 5, with, &argc2, &argv2, &owned), COMMON_OK);
    cr_assert_eq(argv2, owned);
    const char *const want[] = {"prog", "--model", "m.gguf", "-t", "2"};
    cr_assert_eq(argc2, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_str_eq(argv2[i], want[i], "word %d", i);
    free(owned);

    char *missing[] = {"prog", "--config", "/nonexistent/sluice.conf", NULL};
    cr_assert_eq(common_config_load("prog", 3, missing, &argc2, &argv2, &owned), COMMON_ENOENT);
    cr_assert_null(owned);
}
