/* tests/common/test_opts.c - the table-driven option parser: values, usage errors, --help. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Fixture state (Criterion fixtures take no arguments): the streams the parser writes to. */
static FILE *t_out;
static FILE *t_err;
static char  t_text[2][32768]; /* what t_out / t_err received, read back by captured() */

static void opts_setup(void)
{
    t_out = tmpfile();
    t_err = tmpfile();
    cr_assert(t_out && t_err);
}

static void opts_teardown(void)
{
    fclose(t_out);
    fclose(t_err);
}

TestSuite(common_opts, .init = opts_setup, .fini = opts_teardown);

/* Returns everything written so far to t_out (which = 0) or t_err (which = 1). */
static const char *captured(int which)
{
    FILE *f = which ? t_err : t_out;
    fflush(f);
    rewind(f);
    size_t n = fread(t_text[which], 1, sizeof(t_text[which]) - 1, f);
    t_text[which][n] = '\0';
    fseek(f, 0, SEEK_END);
    return t_text[which];
}

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__, NULL})

/* Parses the NULL-terminated words of `argv` with `spec`, its streams pointed at the captures. */
static int parse(struct common_opts_spec spec, char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    spec.prog = spec.prog ? spec.prog : "prog";
    spec.out = t_out;
    spec.err = t_err;
    return common_opts_parse(&spec, argc, argv);
}

/* Expects a usage error whose first line is "prog: error: MESSAGE" followed by the hint. */
static void expect_usage_error(int rc, const char *message)
{
    char want[1024];
    snprintf(want, sizeof(want), "prog: error: %s\nTry 'prog --help' for more information.\n",
             message);
    cr_assert_eq(rc, COMMON_EINVAL, "rc %d", rc);
    cr_assert_str_eq(captured(1), want);
    cr_assert_str_empty(captured(0), "a usage error prints nothing on stdout");
}

/* ---- one program used by most tests ---------------------------------------------------------- */

struct t_opts {
    const char                *model;
    bool                       ids, bos, direct;
    uint32_t                   threads;
    uint64_t                   seed, budget;
    int32_t                    offset;
    int64_t                    big;
    float                      temp;
    int                        io;
    const char                *stop_v[2];
    struct common_opt_strs     stops;
    uint32_t                   prompt_v[4];
    struct common_opt_u32_list prompts;
    uint32_t                   shard, n_shards;
    bool                       temp_seen, model_seen;
};

static int shard_parse(void *arg, const char *value, struct common_errmsg *e)
{
    struct t_opts *o = arg;
    unsigned       a = 0, b = 0;
    char           c = 0;
    if (sscanf(value, "%u/%u%c", &a, &b, &c) != 2 || b == 0 || a >= b)
        return common_errmsg_set(e, COMMON_EINVAL, "expects I/N with 0 <= I < N, got '%s'", value);
    o->shard = a;
    o->n_shards = b;
    return COMMON_OK;
}

static const char *const io_names[] = {"uring", "pread", "mmap", NULL};
static const int         io_values[] = {10, 20, 30};

static struct t_opts t_o;

/* The rows of the test program, pointing into t_o (reset each time). */
static const struct common_opt *t_rows(void)
{
    static struct common_opt rows[32];
    memset(&t_o, 0, sizeof(t_o));
    t_o.threads = 7;
    t_o.temp = 0.8f;
    t_o.bos = true;
    t_o.stops = (struct common_opt_strs){.v = t_o.stop_v, .cap = 2};
    t_o.prompts = (struct common_opt_u32_list){.v = t_o.prompt_v, .cap = 4};
    const struct common_opt r[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &t_o.model,
         .metavar = "PATH",
         .help = "GGUF model",
         .seen = &t_o.model_seen},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &t_o.threads,
         .min = 1,
         .max = 256,
         .help = "threads",
         .def = "physical cores"},
        {.name = "seed",
         .short_name = "s",
         .type = COMMON_OPT_U64,
         .target = &t_o.seed,
         .help = "sampler seed"},
        {.name = "offset", .type = COMMON_OPT_I32, .target = &t_o.offset, .min = -10, .max = 10},
        {.name = "big", .type = COMMON_OPT_I64, .target = &t_o.big, .min = -1e18},
        {.name = "temp",
         .type = COMMON_OPT_F32,
         .target = &t_o.temp,
         .max = 100,
         .help = "temperature",
         .def = "0.8",
         .seen = &t_o.temp_seen},
        {.name = "ram-budget", .type = COMMON_OPT_SIZE, .target = &t_o.budget, .min = 1},
        {.name = "io",
         .type = COMMON_OPT_CHOICE,
         .target = &t_o.io,
         .choices = io_names,
         .choice_values = io_values,
         .help = "expert reads"},
        {.name = "ids", .type = COMMON_OPT_SWITCH, .target = &t_o.ids, .help = "print ids"},
        {.name = "no-bos", .type = COMMON_OPT_SWITCH_OFF, .target = &t_o.bos},
        {.name = "direct-reads", .type = COMMON_OPT_BOOL, .target = &t_o.direct},
        {.name = "stop", .type = COMMON_OPT_STRS, .target = &t_o.stops},
        {.name = "n-prompt",
         .short_name = "p",
         .type = COMMON_OPT_U32_LIST,
         .target = &t_o.prompts,
         .max = 4096,
         .def = "512"},
        {.name = "shard",
         .type = COMMON_OPT_CALLBACK,
         .target = &t_o,
         .parse = shard_parse,
         .metavar = "I/N"},
        {.name = "system", .short_name = "sys", .type = COMMON_OPT_STR, .target = &t_o.model},
        {.name = "config", .type = COMMON_OPT_STR, .metavar = "FILE", .help = "read first"},
        {.name = "n-gpu", .short_name = "ngl", .type = COMMON_OPT_U32},
        {0},
    };
    memcpy(rows, r, sizeof(r));
    return rows;
}

static struct common_opts_spec t_spec(void)
{
    return (struct common_opts_spec){.opts = t_rows()};
}

/* ---- values ---------------------------------------------------------------------------------- */

Test(common_opts, parse_fills_every_type)
{
    int rc = parse(t_spec(),
                   ARGV("-m", "a.gguf", "--threads", "16", "-s", "18446744073709551615", "--offset",
                        "-10", "--big", "-5", "--temp", "0.25", "--ram-budget", "1.5G", "--io",
                        "mmap", "--ids", "--no-bos", "--direct-reads", "on", "--stop", "A", "-p",
                        "16,64,128", "--shard", "1/4", "--config", "x.conf", "-ngl", "99"));
    cr_assert_eq(rc, 0, "%s", captured(1));
    cr_assert_str_eq(t_o.model, "a.gguf");
    cr_assert_eq(t_o.threads, 16);
    cr_assert_eq(t_o.seed, UINT64_MAX);
    cr_assert_eq(t_o.offset, -10);
    cr_assert_eq(t_o.big, -5);
    cr_assert_float_eq(t_o.temp, 0.25f, 1e-7f);
    cr_assert_eq(t_o.budget, 3ull << 29);
    cr_assert_eq(t_o.io, 30, "a choice writes its mapped value");
    cr_assert(t_o.ids);
    cr_assert_not(t_o.bos);
    cr_assert(t_o.direct);
    cr_assert_eq(t_o.stops.n, 1);
    cr_assert_str_eq(t_o.stop_v[0], "A");
    cr_assert_eq(t_o.prompts.n, 3);
    cr_assert_eq(t_o.prompt_v[0], 16);
    cr_assert_eq(t_o.prompt_v[2], 128);
    cr_assert_eq(t_o.shard, 1);
    cr_assert_eq(t_o.n_shards, 4);
    cr_assert_str_empty(captured(1));
    cr_assert_str_empty(captured(0));
}

Test(common_opts, equals_form_sets_long_and_short_options)
{
    int rc = parse(t_spec(), ARGV("--temp=1.5", "-t=3", "--model=", "--io=pread"));
    cr_assert_eq(rc, 0, "%s", captured(1));
    cr_assert_float_eq(t_o.temp, 1.5f, 1e-7f);
    cr_assert_eq(t_o.threads, 3);
    cr_assert_str_eq(t_o.model, "", "an explicit empty value is a value");
    cr_assert_eq(t_o.io, 20);
}

Test(common_opts, bool_accepts_on_off_words)
{
    char *on[] = {"on", "true", "yes", "1"}, *off[] = {"off", "false", "no", "0"};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(parse(t_spec(), ARGV("--direct-reads", on[i])), 0);
        cr_assert(t_o.direct, "%s", on[i]);
        cr_assert_eq(parse(t_spec(), ARGV("--direct-reads", "on", "--direct-reads", off[i])), 0);
        cr_assert_not(t_o.direct, "%s", off[i]);
    }
    expect_usage_error(parse(t_spec(), ARGV("--direct-reads", "maybe")),
                       "--direct-reads expects on or off, got 'maybe'");
}

Test(common_opts, choice_without_values_writes_the_index)
{
    int                     v = -1;
    const struct common_opt rows[] = {
        {.name = "io", .type = COMMON_OPT_CHOICE, .target = &v, .choices = io_names}, {0}};
    cr_assert_eq(parse((struct common_opts_spec){.opts = rows}, ARGV("--io", "pread")), 0);
    cr_assert_eq(v, 1);
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("--io", "aio")),
                       "--io expects uring, pread or mmap, got 'aio'");
    cr_assert_eq(v, 1, "a bad value leaves the target unchanged");
}

Test(common_opts, repeated_scalar_takes_the_last_value)
{
    cr_assert_eq(parse(t_spec(), ARGV("-t", "2", "--threads", "5", "-t=9")), 0);
    cr_assert_eq(t_o.threads, 9);
    cr_assert_eq(parse(t_spec(), ARGV("-p", "1,2,3", "-p", "8")), 0);
    cr_assert_eq(t_o.prompts.n, 1, "a repeated list replaces the earlier one");
    cr_assert_eq(t_o.prompt_v[0], 8);
}

Test(common_opts, repeated_list_option_appends_up_to_its_cap)
{
    cr_assert_eq(parse(t_spec(), ARGV("--stop", "a", "--stop", "b")), 0);
    cr_assert_eq(t_o.stops.n, 2);
    cr_assert_str_eq(t_o.stop_v[1], "b");
    expect_usage_error(parse(t_spec(), ARGV("--stop", "a", "--stop", "b", "--stop", "c")),
                       "--stop may be given at most 2 times");
}

Test(common_opts, seen_is_set_only_for_given_options)
{
    cr_assert_eq(parse(t_spec(), ARGV("--temp", "0.8")), 0);
    cr_assert(t_o.temp_seen, "given with its default value: still seen");
    cr_assert_not(t_o.model_seen);
}

Test(common_opts, value_starting_with_dash_is_taken)
{
    cr_assert_eq(parse(t_spec(), ARGV("-m", "-weird-name.gguf")), 0);
    cr_assert_str_eq(t_o.model, "-weird-name.gguf");
    expect_usage_error(parse(t_spec(), ARGV("--temp", "-1")),
                       "--temp expects a number in [0, 100], got '-1'");
}

Test(common_opts, multi_letter_short_names_are_whole_words)
{
    cr_assert_eq(parse(t_spec(), ARGV("-sys", "be brief", "-s", "5", "-ngl", "3")), 0);
    cr_assert_str_eq(t_o.model, "be brief");
    cr_assert_eq(t_o.seed, 5);
    expect_usage_error(parse(t_spec(), ARGV("-t4")), "unknown option '-t4'");
}

Test(common_opts, null_target_checks_then_drops_the_value)
{
    cr_assert_eq(parse(t_spec(), ARGV("--config", "x.conf", "-ngl", "7")), 0);
    expect_usage_error(parse(t_spec(), ARGV("-ngl", "x")),
                       "-ngl expects a number in [0, 4294967295], got 'x'");
}

Test(common_opts, options_of_every_group_are_parsed)
{
    uint32_t                depth = 0;
    bool                    flag = false;
    const struct common_opt own[] = {{.name = "flag", .type = COMMON_OPT_SWITCH, .target = &flag},
                                     {0}};
    const struct common_opt shared[] = {
        {.name = "io-depth", .type = COMMON_OPT_U32, .target = &depth, .min = 1, .max = 4096}, {0}};
    const struct common_opt_group groups[] = {{.title = "Streaming", .opts = shared}, {0}};
    int rc = parse((struct common_opts_spec){.opts = own, .groups = groups},
                   ARGV("--io-depth", "64", "--flag"));
    cr_assert_eq(rc, 0, "%s", captured(1));
    cr_assert_eq(depth, 64);
    cr_assert(flag);
}

/* ---- usage errors ---------------------------------------------------------------------------- */

Test(common_opts, unknown_option_is_named)
{
    expect_usage_error(parse(t_spec(), ARGV("--verbose-prompt")),
                       "unknown option '--verbose-prompt'");
}

Test(common_opts, unknown_option_with_value_is_named_without_it)
{
    expect_usage_error(parse(t_spec(), ARGV("--verbose=2")), "unknown option '--verbose'");
}

Test(common_opts, missing_value_is_reported)
{
    expect_usage_error(parse(t_spec(), ARGV("--temp")), "option '--temp' needs a value");
}

Test(common_opts, missing_value_of_short_name_is_reported_as_typed)
{
    expect_usage_error(parse(t_spec(), ARGV("-t")), "option '-t' needs a value");
}

Test(common_opts, switch_with_value_is_rejected)
{
    expect_usage_error(parse(t_spec(), ARGV("--ids=1")), "option '--ids' takes no value");
}

Test(common_opts, float_out_of_range_or_junk_is_rejected)
{
    char *bad[] = {"abc", "101", "nan", "inf", "1e50", "", " 1", "1x", "0.5 "};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[256];
        snprintf(want, sizeof(want), "--temp expects a number in [0, 100], got '%s'", bad[i]);
        opts_teardown();
        opts_setup();
        expect_usage_error(parse(t_spec(), ARGV("--temp", bad[i])), want);
        cr_assert_float_eq(t_o.temp, 0.8f, 1e-7f, "case %zu changed the target", i);
    }
}

Test(common_opts, float_without_max_accepts_any_finite_value_above_min)
{
    float                   x = 0;
    const struct common_opt rows[] = {{.name = "x", .type = COMMON_OPT_F32, .target = &x}, {0}};
    cr_assert_eq(parse((struct common_opts_spec){.opts = rows}, ARGV("--x", "3e38")), 0);
    cr_assert_float_eq(x, 3e38f, 1e31f);
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("--x", "-0.5")),
                       "--x expects a number >= 0, got '-0.5'");
    opts_teardown();
    opts_setup();
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("--x", "1e39")),
                       "--x expects a number >= 0, got '1e39'");
}

Test(common_opts, unsigned_rejects_sign_junk_and_overflow)
{
    char *bad[] = {"-1", "+1", "1.5", "12abc", "0x10",
                   "",   " 1", "257", "0",     "99999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char want[256];
        snprintf(want, sizeof(want), "-t expects a number in [1, 256], got '%s'", bad[i]);
        opts_teardown();
        opts_setup();
        expect_usage_error(parse(t_spec(), ARGV("-t", bad[i])), want);
        cr_assert_eq(t_o.threads, 7, "case %zu changed the target", i);
    }
}

Test(common_opts, u64_full_range_rejects_overflow)
{
    expect_usage_error(parse(t_spec(), ARGV("--seed", "18446744073709551616")),
                       "--seed expects a number in [0, 18446744073709551615], got "
                       "'18446744073709551616'");
}

Test(common_opts, signed_range_is_checked)
{
    cr_assert_eq(parse(t_spec(), ARGV("--offset", "10")), 0);
    cr_assert_eq(t_o.offset, 10);
    expect_usage_error(parse(t_spec(), ARGV("--offset", "-11")),
                       "--offset expects a number in [-10, 10], got '-11'");
    opts_teardown();
    opts_setup();
    expect_usage_error(parse(t_spec(), ARGV("--offset", "--5")),
                       "--offset expects a number in [-10, 10], got '--5'");
}

Test(common_opts, size_checks_syntax_and_range)
{
    cr_assert_eq(parse(t_spec(), ARGV("--ram-budget", "512MiB")), 0);
    cr_assert_eq(t_o.budget, 512ull << 20);
    expect_usage_error(parse(t_spec(), ARGV("--ram-budget", "lots")),
                       "--ram-budget expects a size like 512M or 1.5G of at least 1 B, got "
                       "'lots'");
    opts_teardown();
    opts_setup();
    expect_usage_error(parse(t_spec(), ARGV("--ram-budget", "0")),
                       "--ram-budget expects a size like 512M or 1.5G of at least 1 B, got '0'");
    uint64_t                v = 0;
    const struct common_opt rows[] = {
        {.name = "probe", .type = COMMON_OPT_SIZE, .target = &v, .min = 1 << 20, .max = 1 << 30},
        {0}};
    opts_teardown();
    opts_setup();
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("--probe", "2G")),
                       "--probe expects a size like 512M or 1.5G in [1.00 MiB, 1.00 GiB], got "
                       "'2G'");
}

Test(common_opts, callback_message_follows_the_option_name)
{
    expect_usage_error(parse(t_spec(), ARGV("--shard", "3/2")),
                       "--shard expects I/N with 0 <= I < N, got '3/2'");
}

static int silent_refusal(void *arg, const char *value, struct common_errmsg *e)
{
    (void)arg;
    (void)value;
    (void)e;
    return COMMON_ERANGE;
}

static int no_memory(void *arg, const char *value, struct common_errmsg *e)
{
    (void)arg;
    (void)value;
    return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
}

Test(common_opts, callback_without_message_gets_a_generic_one)
{
    const struct common_opt rows[] = {
        {.name = "x", .type = COMMON_OPT_CALLBACK, .parse = silent_refusal}, {0}};
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("--x", "v")),
                       "--x: invalid value 'v'");
}

Test(common_opts, callback_out_of_memory_is_not_a_usage_error)
{
    const struct common_opt rows[] = {
        {.name = "x", .type = COMMON_OPT_CALLBACK, .parse = no_memory}, {0}};
    int rc = parse((struct common_opts_spec){.opts = rows}, ARGV("--x", "v"));
    cr_assert_eq(rc, COMMON_ENOMEM);
    cr_assert_str_eq(captured(1), "prog: error: --x out of memory\n", "no --help hint");
    cr_assert_eq(common_opts_exit_status(rc), 1);
}

Test(common_opts, required_option_missing_is_reported)
{
    const char             *m = NULL;
    const struct common_opt rows[] = {{.name = "model",
                                       .short_name = "m",
                                       .type = COMMON_OPT_STR,
                                       .target = &m,
                                       .required = true},
                                      {0}};
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, ARGV("x")),
                       "unexpected argument 'x'");
    opts_teardown();
    opts_setup();
    char *none[] = {"prog", NULL};
    expect_usage_error(parse((struct common_opts_spec){.opts = rows}, none),
                       "option '--model' is required");
    cr_assert_eq(parse((struct common_opts_spec){.opts = rows}, ARGV("-m", "a")), 0);
}

Test(common_opts, error_helper_prints_in_the_parser_style)
{
    struct common_opts_spec spec = {.prog = "sluice run", .err = t_err};
    cr_assert_eq(common_opts_error(&spec, "give either -p or --prompt-ids, not %s", "both"),
                 COMMON_EINVAL);
    cr_assert_str_eq(captured(1), "sluice run: error: give either -p or --prompt-ids, not both\n"
                                  "Try 'sluice run --help' for more information.\n");
}

Test(common_opts, exit_status_maps_results)
{
    cr_assert_eq(common_opts_exit_status(COMMON_OPTS_HELP), 0);
    cr_assert_eq(common_opts_exit_status(COMMON_OK), 0);
    cr_assert_eq(common_opts_exit_status(COMMON_EINVAL), 2);
    cr_assert_eq(common_opts_exit_status(COMMON_ENOMEM), 1);
}

/* ---- positionals ----------------------------------------------------------------------------- */

Test(common_opts, double_dash_ends_options)
{
    const char             *v[4] = {0};
    struct common_opt_strs  pos = {.v = v, .cap = 4};
    struct common_opts_spec spec = t_spec();
    spec.positional = &pos;
    int rc = parse(spec, ARGV("a", "--ids", "--", "--temp", "-x"));
    cr_assert_eq(rc, 0, "%s", captured(1));
    cr_assert(t_o.ids);
    cr_assert_eq(pos.n, 3);
    cr_assert_str_eq(v[0], "a");
    cr_assert_str_eq(v[1], "--temp");
    cr_assert_str_eq(v[2], "-x");
    cr_assert_float_eq(t_o.temp, 0.8f, 1e-7f);
}

Test(common_opts, dash_alone_is_a_positional)
{
    const char             *v[1] = {0};
    struct common_opt_strs  pos = {.v = v, .cap = 1};
    struct common_opts_spec spec = t_spec();
    spec.positional = &pos;
    cr_assert_eq(parse(spec, ARGV("-")), 0);
    cr_assert_str_eq(v[0], "-");
}

Test(common_opts, positional_beyond_room_is_rejected)
{
    const char             *v[1] = {0};
    struct common_opt_strs  pos = {.v = v, .cap = 1};
    struct common_opts_spec spec = t_spec();
    spec.positional = &pos;
    expect_usage_error(parse(spec, ARGV("model.gguf", "extra")), "unexpected argument 'extra'");
}

Test(common_opts, positional_without_a_list_is_rejected)
{
    expect_usage_error(parse(t_spec(), ARGV("--ids", "stray")), "unexpected argument 'stray'");
}

Test(common_opts, stop_at_positional_leaves_later_words_alone)
{
    const char             *v[4] = {0};
    struct common_opt_strs  pos = {.v = v, .cap = 4};
    struct common_opts_spec spec = t_spec();
    spec.positional = &pos;
    spec.stop_at_positional = true;
    cr_assert_eq(parse(spec, ARGV("--ids", "configure", "--temp", "x")), 0);
    cr_assert(t_o.ids);
    cr_assert_eq(pos.n, 3);
    cr_assert_str_eq(v[1], "--temp");
}

/* ---- help ------------------------------------------------------------------------------------ */

Test(common_opts, help_prints_rows_and_returns_help)
{
    const struct common_opt shared[] = {
        {.name = "io-depth", .type = COMMON_OPT_U32, .help = "reads in flight", .def = "32"}, {0}};
    const struct common_opt_group groups[] = {{.title = "Streaming options", .opts = shared}, {0}};
    struct common_opts_spec       spec = t_spec();
    spec.usage = "prog -m MODEL [options]";
    spec.description = "Runs a model.";
    spec.epilog = "Exit status: 0 ok, 2 usage.";
    spec.groups = groups;
    int rc = parse(spec, ARGV("--temp", "1", "--help", "--bogus"));
    cr_assert_eq(rc, COMMON_OPTS_HELP);
    cr_assert_eq(common_opts_exit_status(rc), 0);
    cr_assert_str_empty(captured(1));
    const char *h = captured(0);
    cr_assert(strncmp(h, "usage: prog -m MODEL [options]\n\nRuns a model.\n\nOptions:\n", 56) == 0,
              "%s", h);
    cr_assert_not_null(strstr(h, "\n  -m,   --model PATH "), "%s", h);
    cr_assert_not_null(strstr(h, "\n  -sys, --system TEXT\n"), "%s", h);
    cr_assert_not_null(strstr(h, "\n        --ids "), "%s", h);
    cr_assert_not_null(strstr(h, "[physical cores]"), "%s", h);
    cr_assert_not_null(strstr(h, "--io uring|pread|mmap "), "%s", h);
    cr_assert_not_null(strstr(h, "-p,   --n-prompt N,N,..."), "%s", h);
    cr_assert_not_null(strstr(h, "--shard I/N"), "%s", h);
    cr_assert_not_null(strstr(h, "\n  -h,   --help "), "%s", h);
    cr_assert_not_null(strstr(h, "\n\nStreaming options:\n        --io-depth N "), "%s", h);
    cr_assert_not_null(strstr(h, "[32]\n\nExit status: 0 ok, 2 usage.\n"), "%s", h);
    cr_assert(strstr(h, "--help ") < strstr(h, "Streaming"), "-h is listed with the first table");
}

Test(common_opts, help_short_form_and_value_form)
{
    cr_assert_eq(parse(t_spec(), ARGV("-h")), COMMON_OPTS_HELP);
    cr_assert_not_null(strstr(captured(0), "usage: prog [options]\n"));
    opts_teardown();
    opts_setup();
    expect_usage_error(parse(t_spec(), ARGV("--help=yes")), "option '--help' takes no value");
}

/* Column of the first '[' on the line of `h` that contains `key`. */
static long def_column(const char *h, const char *key)
{
    const char *p = strstr(h, key);
    cr_assert_not_null(p, "%s", key);
    const char *line = p;
    while (line > h && line[-1] != '\n')
        line--;
    const char *br = strchr(p, '[');
    cr_assert(br && !memchr(p, '\n', (size_t)(br - p)), "no default on the line of %s", key);
    return br - line;
}

Test(common_opts, help_aligns_defaults_and_wraps_at_100_columns)
{
    const struct common_opt rows[] = {
        {.name = "a", .type = COMMON_OPT_U32, .help = "short", .def = "1"},
        {.name = "bbbbbb", .type = COMMON_OPT_U32, .help = "a longer line of help", .def = "2"},
        {.name = "long",
         .type = COMMON_OPT_STR,
         .def = "none",
         .help = "a help text long enough that it cannot fit on one line of one hundred columns "
                 "so the parser has to wrap it onto a second line under the help column"},
        {.name = "a-very-long-option-name-indeed",
         .type = COMMON_OPT_STR,
         .metavar = "SOMETHING",
         .help = "below"},
        {.name = "multi", .type = COMMON_OPT_SWITCH, .help = "first\nsecond"},
        {0}};
    struct common_opts_spec spec = {
        .opts = rows,
        .description =
            "   A description line that is longer than one hundred columns, so it gets wrapped by "
            "the parser at spaces.\nA short line.",
    };
    cr_assert_eq(parse(spec, ARGV("--help")), COMMON_OPTS_HELP);
    const char *h = captured(0);
    for (const char *l = h; *l;) {
        size_t n = strcspn(l, "\n");
        cr_assert_leq(n, 100, "line longer than 100 columns: %.*s", (int)n, l);
        l += n + (l[n] == '\n');
    }
    cr_assert_eq(def_column(h, "--a N"), def_column(h, "--bbbbbb N"), "%s", h);
    cr_assert_not_null(strstr(h, "[none]\n"), "%s", h);
    cr_assert_not_null(strstr(h, "--a-very-long-option-name-indeed SOMETHING\n"), "%s", h);
    cr_assert_not_null(strstr(h, "first\n"), "%s", h);
    cr_assert_not_null(strstr(h, "\n   A description line"), "%s", h);
    cr_assert_not_null(strstr(h, "\n   spaces.\nA short line.\n"), "kept indent: %s", h);
    /* Continuation lines of help texts start at the help column. */
    const char *help_start = strstr(h, "short  ");
    const char *line = help_start;
    while (line > h && line[-1] != '\n')
        line--;
    size_t      col = (size_t)(help_start - line);
    const char *conts[] = {"[none]", "below", "second"};
    for (size_t i = 0; i < 3; i++) {
        const char *p = strstr(h, conts[i]);
        cr_assert_not_null(p);
        const char *l = p;
        while (l > h && l[-1] != '\n')
            l--;
        cr_assert_eq(strspn(l, " "), col, "%s: %s", conts[i], h);
    }
}

/* ---- comma lists ----------------------------------------------------------------------------- */

Test(common_opts, u32_list_parses_items)
{
    uint32_t                   v[4] = {0};
    struct common_opt_u32_list l = {.v = v, .cap = 4};
    struct common_errmsg       e = {{0}};
    cr_assert_eq(common_opt_parse_u32_list("16,64,128,0", 0, 4096, &l, &e), 0, "%s", e.text);
    cr_assert_eq(l.n, 4);
    cr_assert_eq(v[0], 16);
    cr_assert_eq(v[1], 64);
    cr_assert_eq(v[2], 128);
    cr_assert_eq(v[3], 0);
    cr_assert_eq(common_opt_parse_u32_list("7", 0, 4096, &l, &e), 0);
    cr_assert_eq(l.n, 1);
    cr_assert_eq(v[0], 7);
}

Test(common_opts, u32_list_rejects_empty_items_and_leaves_the_list)
{
    const char *bad[] = {"", ",", "16,,64", "16,", ",16"};
    const char *item[] = {"1", "1", "2", "2", "1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint32_t                   v[4] = {5, 5, 5, 5};
        struct common_opt_u32_list l = {.v = v, .cap = 4, .n = 1};
        struct common_errmsg       e = {{0}};
        cr_assert_eq(common_opt_parse_u32_list(bad[i], 0, 4096, &l, &e), COMMON_EINVAL, "'%s'",
                     bad[i]);
        char want[256];
        snprintf(want, sizeof(want),
                 "expects comma-separated numbers in [0, 4096], got '%s' (item %s is empty)",
                 bad[i], item[i]);
        cr_assert_str_eq(e.text, want);
        cr_assert_eq(l.n, 1);
        cr_assert_eq(v[0], 5);
    }
}

Test(common_opts, u32_list_rejects_bad_and_out_of_range_numbers)
{
    const char *bad[] = {"16,x", "16,4097", "16,-1", "16, 2", "16,99999999999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint32_t                   v[4] = {0};
        struct common_opt_u32_list l = {.v = v, .cap = 4};
        struct common_errmsg       e = {{0}};
        cr_assert_eq(common_opt_parse_u32_list(bad[i], 0, 4096, &l, &e), COMMON_EINVAL, "'%s'",
                     bad[i]);
        char want[256];
        snprintf(want, sizeof(want),
                 "expects comma-separated numbers in [0, 4096], got '%s' (item 2 is '%s')", bad[i],
                 strchr(bad[i], ',') + 1);
        cr_assert_str_eq(e.text, want);
        cr_assert_eq(l.n, 0);
        cr_assert_eq(v[0], 0, "nothing written on failure");
    }
}

Test(common_opts, u32_list_with_too_many_items_is_erange)
{
    uint32_t                   v[2] = {0};
    struct common_opt_u32_list l = {.v = v, .cap = 2};
    struct common_errmsg       e = {{0}};
    cr_assert_eq(common_opt_parse_u32_list("1,2,3", 0, 10, &l, &e), COMMON_ERANGE);
    cr_assert_str_eq(e.text, "takes at most 2 comma-separated numbers, got '1,2,3'");
    cr_assert_eq(l.n, 0);
    cr_assert_eq(v[0], 0);
}

Test(common_opts, u32_list_option_reports_in_the_parser_style)
{
    expect_usage_error(parse(t_spec(), ARGV("-p", "16,,64")),
                       "-p expects comma-separated numbers in [0, 4096], got '16,,64' (item 2 is "
                       "empty)");
    opts_teardown();
    opts_setup();
    expect_usage_error(parse(t_spec(), ARGV("-p", "1,2,3,4,5")),
                       "-p takes at most 4 comma-separated numbers, got '1,2,3,4,5'");
}
