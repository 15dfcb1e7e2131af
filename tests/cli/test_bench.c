/* tests/cli/test_bench.c - `sluice bench`: -p and -n lists give one test each, in the md, csv and
 * json formats. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"
#define MODEL  "moe-tiny/moe-tiny-q4_0.gguf"
/* Small and quick: two prefill and two decode tests, one repetition, a small bandwidth probe. */
#define LISTS "-p 16,32 -n 4,8 -r 1 -t 2 --membw-size 16M"

/* `sluice bench -m MODEL ARGS`: stdout. */
static char *bench(const char *model, const char *args)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s bench -m %s %s 2>/dev/null", SLUICE, model, args);
    char *out = fixture_run(cmd, &st);
    cr_assert_not_null(out, "could not run %s", cmd);
    cr_assert_eq(st, 0, "%s exited %d:\n%s", cmd, st, out);
    return out;
}

/* Lines of `s`, and in *commas the number of commas of each (-1 when they differ). */
static int count_lines(const char *s, int *commas)
{
    int lines = 0, c = 0;
    *commas = -2;
    for (; *s; s++) {
        c += *s == ',';
        if (*s == '\n') {
            *commas = *commas == -2 || *commas == c ? c : -1;
            lines++;
            c = 0;
        }
    }
    return lines;
}

Test(cli_bench, csv_has_one_header_and_a_row_per_test, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char *out = bench(model, LISTS " -o csv");
    int   commas = 0;
    cr_assert_eq(count_lines(out, &commas), 5, "a header and 4 rows expected:\n%s", out);
    cr_assert_gt(commas, 10, "every line has the same fields:\n%s", out);
    cr_assert(strncmp(out, "model_filename,", 15) == 0, "%s", out);
    free(out);
    free(model);
}

Test(cli_bench, json_is_an_array_of_one_record_per_test, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char        *out = bench(model, LISTS " -o json");
    json_error_t err;
    json_t      *root = json_loads(out, 0, &err);
    cr_assert_not_null(root, "invalid JSON (line %d: %s):\n%s", err.line, err.text, out);
    cr_assert(json_is_array(root));
    cr_assert_eq(json_array_size(root), 4);
    static const struct {
        const char *key;
        int         value;
    } want[] = {{"n_prompt", 16}, {"n_prompt", 32}, {"n_gen", 4}, {"n_gen", 8}};
    for (size_t i = 0; i < 4; i++) {
        json_t *rec = json_array_get(root, i);
        cr_assert_eq(json_integer_value(json_object_get(rec, want[i].key)), want[i].value,
                     "record %zu", i);
        cr_assert_gt(json_real_value(json_object_get(rec, "avg_ts")), 0.0, "record %zu", i);
        cr_assert_eq(json_array_size(json_object_get(rec, "samples_ns")), 1, "record %zu", i);
    }
    /* Decode tests carry the memory-bandwidth ratio; prefill tests do not. */
    cr_assert(json_is_null(json_object_get(json_array_get(root, 0), "bw_ratio")));
    cr_assert_gt(json_real_value(json_object_get(json_array_get(root, 2), "bw_ratio")), 0.0);
    json_decref(root);
    free(out);
    free(model);
}

Test(cli_bench, md_has_a_row_per_test_and_the_result_line, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char       *out = bench(model, LISTS);
    int         rows = 0;
    const char *tests[] = {"| pp16 ", "| pp32 ", "| tg4 ", "| tg8 "};
    for (size_t i = 0; i < 4; i++)
        cr_expect(strstr(out, tests[i]), "no row %s:\n%s", tests[i], out);
    for (const char *p = out; (p = strstr(p, "\n| llama")) != NULL; p++)
        rows++;
    cr_assert_eq(rows, 4, "%s", out);
    cr_assert(strstr(out, "bw ratio"), "the bandwidth ratio column is missing:\n%s", out);
    cr_assert(strstr(out, "\nresult: io=none pp_tok_s="), "%s", out);
    free(out);
    free(model);
}

/* -npl: every decode test at each number of sequences decoded together; t/s is their aggregate,
 * the bandwidth columns stay empty for more than one (the bytes a batch touches are not the
 * model's active bytes), and the md output compares each with one sequence. */
Test(cli_bench, parallel_list_runs_each_decode_test_per_value, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    char        *out = bench(model, "-p 0 -n 4 -npl 1,3 -r 1 -t 2 --membw-size 16M -o json");
    json_error_t err;
    json_t      *root = json_loads(out, 0, &err);
    cr_assert_not_null(root, "invalid JSON (line %d: %s):\n%s", err.line, err.text, out);
    cr_assert_eq(json_array_size(root), 2, "%s", out);
    for (size_t i = 0; i < 2; i++) {
        json_t *rec = json_array_get(root, i);
        cr_expect_eq(json_integer_value(json_object_get(rec, "n_gen")), 4);
        cr_expect_eq(json_integer_value(json_object_get(rec, "n_parallel")), i ? 3 : 1);
        cr_expect_gt(json_real_value(json_object_get(rec, "avg_ts")), 0.0);
    }
    cr_expect_gt(json_real_value(json_object_get(json_array_get(root, 0), "bw_ratio")), 0.0);
    cr_expect(json_is_null(json_object_get(json_array_get(root, 1), "bw_ratio")));
    json_decref(root);
    free(out);
    out = bench(model, "-p 0 -n 4 -npl 1,3 -r 1 -t 2 --membw-size 16M");
    cr_expect(strstr(out, "| seqs |"), "no seqs column:\n%s", out);
    cr_expect(strstr(out, "\nparallel: tg4 with 3 sequences: "), "%s", out);
    cr_expect(strstr(out, "\nresult_parallel: io=none n_gen=4 n_parallel=3 tok_s="), "%s", out);
    free(out);
    /* With layers on a device (the host backend here) the sequences share its weights and its
     * steps. The host backend's limit is its copy probe; the CPU backend's the CPU's own probe:
     * its weights are read from RAM. */
    static const char *const backends[][2] = {
        {"host", "\ndevice memory bandwidth (HOST0 "},
        {"cpu", "\nmemory bandwidth (streaming read, 2 threads): "}};
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", backends[i][0], 1), 0);
        out = bench(model, "-p 0 -n 4 -npl 1,3 -r 1 -t 2 --membw-size 16M -ngl 999");
        cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
        cr_expect(strstr(out, "\nparallel: tg4 with 3 sequences: "), "%s -ngl 999:\n%s",
                  backends[i][0], out);
        cr_expect(strstr(out, backends[i][1]), "%s -ngl 999:\n%s", backends[i][0], out);
        free(out);
    }
    free(model);
}

/* --vram-budget on the device (the host backend): each test's share of the device pool's picks
 * (found, copied in, on the CPU) adds up to its picks, and a decode test that copies is set
 * against the pool's copy probe; with every miss on the CPU nothing is copied. */
Test(cli_bench, device_pool_lines_account_for_every_pick, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    char *copy = bench(model, "-p 8 -n 4 -r 1 -t 2 --membw-size 16M -ngl 999 --vram-budget 400K");
    char *cpu = bench(model, "-p 8 -n 4 -r 1 -t 2 --membw-size 16M -ngl 999 --vram-budget 400K "
                             "--expert-miss cpu");
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    const struct {
        const char *out, *mode;
    } runs[] = {{copy, "copy"}, {cpu, "cpu"}};
    for (size_t i = 0; i < 2; i++) {
        const char *out = runs[i].out;
        cr_assert(strstr(out, "\ndevice expert pool: copies at "), "%s:\n%s", runs[i].mode, out);
        cr_assert(strstr(out, "\ndevice pool tg4: ") &&
                      (i == 1 || strstr(out, "= a copy limit of ")),
                  "%s:\n%s", runs[i].mode, out);
        const char        *rv = strstr(out, "\nresult_vram: test=tg4 ");
        unsigned long long hits, copied, on_cpu;
        cr_assert(rv && sscanf(rv, "\nresult_vram: test=tg4 hits=%llu copied=%llu cpu=%llu", &hits,
                               &copied, &on_cpu) == 3,
                  "%s:\n%s", runs[i].mode, out);
        /* moe-tiny: 4 layers, 2 experts a token, 4 decode tokens. */
        cr_expect_eq(hits + copied + on_cpu, 4ull * 2 * 4, "%s: %llu + %llu + %llu picks",
                     runs[i].mode, hits, copied, on_cpu);
        if (i == 1)
            cr_expect(copied == 0 && on_cpu > 0, "cpu: %llu copied, %llu on the CPU", copied,
                      on_cpu);
    }
    free(copy);
    free(cpu);
    free(model);
}

/* The storage limit of a run whose device pool reads its misses from storage through staging
 * (--vram-fill storage): the replay probe reads those bundles too, and the decode is set against
 * it; the pool's line counts the staged parts. */
Test(cli_bench, staged_reads_are_replayed_by_the_storage_probe, .timeout = 120)
{
    FIXTURE_OR_SKIP(model, MODEL);
    cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    char *out = bench(model, "-p 8 -n 4 -r 1 -t 2 --membw-size 16M -ngl 999 --vram-budget 324K "
                             "--ram-budget 27M --vram-fill storage --io-probe");
    cr_assert_eq(unsetenv("SLUICE_GPU_BACKEND"), 0);
    const char        *r = strstr(out, "\nresult: ");
    const char        *rl = r ? strstr(r, " replay_loads=") : NULL;
    unsigned long long loads = 0;
    cr_assert(rl && sscanf(rl, " replay_loads=%llu", &loads) == 1 && loads > 0,
              "no staged load replayed:\n%s", out);
    cr_assert(strstr(out, "\ndecode vs storage limit (replay) tg4: "), "%s", out);
    /* every part the decode copied in came through staging (3 parts an expert) */
    const char        *rv = strstr(out, "\nresult_vram: test=tg4 ");
    const char        *sg = rv ? strstr(rv, " staged=") : NULL;
    unsigned long long hits = 0, copied = 0, on_cpu = 0, staged = 0;
    cr_assert(rv && sg &&
                  sscanf(rv, "\nresult_vram: test=tg4 hits=%llu copied=%llu cpu=%llu", &hits,
                         &copied, &on_cpu) == 3 &&
                  sscanf(sg, " staged=%llu", &staged) == 1,
              "%s", out);
    cr_expect(copied > 0 && staged == 3 * copied, "tg4: %llu copied, %llu parts staged", copied,
              staged);
    free(out);
    free(model);
}
