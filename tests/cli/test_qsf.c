/* tests/cli/test_qsf.c - `sluice convert` and `sluice verify`, and every path that reads a QSF
 * file (mapped, streamed through the fetcher by io_uring or pread, LZ4 bundles) giving the
 * GGUF's tokens; a corrupt bundle is an error naming it, never a token. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "fixture.h"

#define SLUICE SLUICE_BINARY_DIR "/bin/sluice"

static char *sh(const char *cmd, int *status)
{
    char *out = fixture_run(cmd, status);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

/* Greedy ids of `sluice run -m MODEL ARGS`; asserts it succeeded. */
static char *greedy_ids(const char *model, const char *args)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd),
             "%s run -m %s -p 'In the beginning God created' %s --ids --temp 0 -n 24 -t 2 "
             "2>/dev/null",
             SLUICE, model, args);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s exited %d", cmd, st);
    cr_assert(strstr(out, "gen: "), "no tokens from %s:\n%s", cmd, out);
    return out;
}

/* `sluice convert IN OUT ARGS`: asserts success; returns its stdout. */
/* Converts `in` to `out` with `args`; its output must contain `want` (NULL: anything). */
static void convert(const char *in, const char *out, const char *args, const char *want)
{
    char cmd[4096];
    int  st = 0;
    snprintf(cmd, sizeof(cmd), "%s convert %s %s %s 2>&1", SLUICE, args, in, out);
    char *o = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s exited %d:\n%s", cmd, st, o);
    cr_assert(!want || strstr(o, want), "%s", o);
    free(o);
}

/* Every way of running the QSF file gives the GGUF's greedy tokens. */
static void assert_runs_like(const char *gguf, const char *qsf)
{
    char *want = greedy_ids(gguf, "");
    char *b = greedy_ids(gguf, "--ram-budget 26M");
    cr_assert_str_eq(b, want, "the GGUF streamed differs from itself mapped");
    static const char *ways[] = {"", "--ram-budget 26M", "--ram-budget 26M --io pread",
                                 "--ram-budget 40M --io uring"};
    for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
        char *got = greedy_ids(qsf, ways[i]);
        cr_assert_str_eq(got, want, "QSF with '%s' differs from the GGUF:\n%s\nvs\n%s", ways[i],
                         got, want);
        free(got);
    }
    free(b);
    free(want);
}

Test(cli_qsf, converted_model_runs_like_the_gguf, .timeout = 180)
{
    FIXTURE_OR_SKIP(gguf, "moe-tiny/moe-tiny-q4_0.gguf");
    char *dir = fixture_tmpdir(), qsf[4096], cmd[8192];
    snprintf(qsf, sizeof(qsf), "%s/m.qsf", dir);
    convert(gguf, qsf, "", "bundles:   32 (0 LZ4)");
    assert_runs_like(gguf, qsf);
    int st = 0;
    snprintf(cmd, sizeof(cmd), "%s verify %s 2>&1", SLUICE, qsf);
    char *o = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", o);
    cr_assert(strstr(o, "every checksum holds"), "%s", o);
    free(o);
    snprintf(cmd, sizeof(cmd), "%s inspect %s 2>&1", SLUICE, qsf);
    o = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", o);
    cr_assert(strstr(o, "format:         QSF v1"), "%s", o);
    free(o);
    snprintf(cmd, sizeof(cmd), "%s inspect --json %s 2>&1", SLUICE, qsf);
    o = sh(cmd, &st);
    cr_assert_eq(st, 0, "%s", o);
    cr_assert(strstr(o, "\"container\": \"qsf\""), "%s", o);
    free(o);
    /* The page cache path cannot check bundles: refused with one line saying what to use. */
    snprintf(cmd, sizeof(cmd), "%s run -m %s -p hi -n 2 --io mmap 2>&1", SLUICE, qsf);
    o = sh(cmd, &st);
    cr_assert_eq(st, 1, "%s", o);
    cr_assert(strstr(o, "not mapped"), "%s", o);
    free(o);
    /* verify on a GGUF file, convert of a missing file: one clear line, exit 1. */
    snprintf(cmd, sizeof(cmd), "%s verify %s 2>&1", SLUICE, gguf);
    o = sh(cmd, &st);
    cr_assert_eq(st, 1, "%s", o);
    cr_assert(strstr(o, "not a QSF file"), "%s", o);
    free(o);
    snprintf(cmd, sizeof(cmd), "%s convert %s/none.gguf %s/x.qsf 2>&1", SLUICE, dir, dir);
    o = sh(cmd, &st);
    cr_assert_eq(st, 1, "%s", o);
    free(o);
    fixture_rmtree(dir);
    free(dir);
    free(gguf);
}

/* Bundle files in two directories (two devices): the same tokens every way. */
Test(cli_qsf, bundle_files_in_two_directories_run_like_the_gguf, .timeout = 180)
{
    FIXTURE_OR_SKIP(gguf, "moe-tiny/moe-tiny-q4_0.gguf");
    char *dir = fixture_tmpdir(), qsf[4096], args[8192], cmd[8192];
    snprintf(qsf, sizeof(qsf), "%s/m.qsf", dir);
    snprintf(args, sizeof(args), "--shards 2 --shard-dir %s/d1 --shard-dir %s/d2", dir, dir);
    snprintf(cmd, sizeof(cmd), "mkdir %s/d1 %s/d2", dir, dir);
    int st = system(cmd);
    cr_assert_eq(st, 0);
    convert(gguf, qsf, args, NULL);
    snprintf(cmd, sizeof(cmd), "%s/d2/m-experts-00002-of-00002.qsf", dir);
    FILE *f = fopen(cmd, "rb");
    cr_assert_not_null(f, "no bundle file %s", cmd);
    fclose(f);
    assert_runs_like(gguf, qsf);
    /* Usage errors: one line, exit 2. */
    snprintf(cmd, sizeof(cmd), "%s convert --shards 3 --shard-dir %s %s %s/x.qsf 2>&1", SLUICE, dir,
             gguf, dir);
    char *o = sh(cmd, &st);
    cr_assert_eq(st, 2, "%s", o);
    cr_assert(strstr(o, "once per file"), "%s", o);
    free(o);
    fixture_rmtree(dir);
    free(dir);
    free(gguf);
}

/* A dense model as QSF: no bundles; streamed under a budget its FFN tensors are checked after
 * each read, and a flipped byte in one is an error. */
Test(cli_qsf, dense_model_streams_checked, .timeout = 180)
{
    FIXTURE_OR_SKIP(gguf, "models/llama-2-tiny-random.gguf");
    char *dir = fixture_tmpdir(), qsf[4096], cmd[8192];
    snprintf(qsf, sizeof(qsf), "%s/d.qsf", dir);
    convert(gguf, qsf, "", "bundles:   0 (0 LZ4)");
    char *want = greedy_ids(gguf, "");
    char *got = greedy_ids(qsf, "");
    cr_assert_str_eq(got, want);
    free(got);
    got = greedy_ids(qsf, "--ram-budget 64M");
    cr_assert_str_eq(got, want, "dense QSF streamed differs");
    free(got);
    free(want);
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(qsf, NULL, &g, NULL), COMMON_OK);
    const struct common_gguf_tensor *t = common_gguf_tensor_find(g, "blk.0.ffn_up.weight");
    cr_assert_not_null(t);
    FILE *f = fopen(qsf, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, (long)(t->offset + 8), SEEK_SET), 0);
    int c = fgetc(f);
    cr_assert_eq(fseek(f, (long)(t->offset + 8), SEEK_SET), 0);
    fputc(c ^ 0x10, f);
    fclose(f);
    common_gguf_close(g);
    int                st = 0;
    static const char *ways[] = {"", "--ram-budget 64M"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "%s run -m %s -p 'Hello' -n 4 --temp 0 %s 2>&1", SLUICE, qsf,
                 ways[i]);
        char *o = sh(cmd, &st);
        cr_assert_eq(st, 1, "'%s' exited %d:\n%s", ways[i], st, o);
        cr_assert(strstr(o, "checksum"), "'%s':\n%s", ways[i], o);
        free(o);
    }
    fixture_rmtree(dir);
    free(dir);
    free(gguf);
}

Test(cli_qsf, lz4_model_runs_like_the_gguf, .timeout = 240)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-f32.gguf");
    char *dir = fixture_tmpdir(), gguf[4096], qsf[4096];
    snprintf(gguf, sizeof(gguf), "%s/coarse.gguf", dir);
    snprintf(qsf, sizeof(qsf), "%s/coarse.qsf", dir);
    cr_assert_eq(fixture_write_coarse_experts(src, gguf), 0);
    convert(gguf, qsf, "--lz4 auto", "bundles:   32 (32 LZ4)");
    char              *want = greedy_ids(gguf, "");
    static const char *ways[] = {"", "--ram-budget 60M", "--ram-budget 60M --io pread"};
    for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
        char *got = greedy_ids(qsf, ways[i]);
        cr_assert_str_eq(got, want, "LZ4 QSF with '%s' differs from the GGUF", ways[i]);
        free(got);
    }
    free(want);
    fixture_rmtree(dir);
    free(dir);
    free(src);
}

Test(cli_qsf, corrupt_bundle_is_an_error_naming_it, .timeout = 180)
{
    FIXTURE_OR_SKIP(gguf, "moe-tiny/moe-tiny-q4_0.gguf");
    char *dir = fixture_tmpdir(), qsf[4096], cmd[8192];
    snprintf(qsf, sizeof(qsf), "%s/m.qsf", dir);
    convert(gguf, qsf, "", NULL);
    /* One byte flipped in every bundle of layer 1, so the first token needs a bad one. */
    cr_assert_eq(fixture_flip_bundles(qsf, 1), 8, "not the 8 bundles of layer 1 changed");
    int   st = 0;
    char *o;
    snprintf(cmd, sizeof(cmd), "%s verify %s 2>&1", SLUICE, qsf);
    o = sh(cmd, &st);
    cr_assert_eq(st, 1, "%s", o);
    cr_assert(strstr(o, "8 bad") && strstr(o, "layer 1 expert 0"), "%s", o);
    free(o);
    static const char *ways[] = {"", "--ram-budget 26M", "--ram-budget 26M --io pread"};
    for (size_t i = 0; i < sizeof(ways) / sizeof(ways[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s run -m %s -p 'In the beginning' -n 8 --temp 0 %s 2>&1",
                 SLUICE, qsf, ways[i]);
        o = sh(cmd, &st);
        cr_assert_eq(st, 1, "'%s' exited %d:\n%s", ways[i], st, o);
        /* The error line itself names the bundle, its file and the checksum. */
        const char *line = strstr(o, "sluice run: error: ");
        cr_assert_not_null(line, "'%s': no error line:\n%s", ways[i], o);
        char err[1024];
        snprintf(err, sizeof(err), "%.*s", (int)strcspn(line, "\n"), line);
        cr_assert(strstr(err, "layer 1 expert") && strstr(err, "checksum") && strstr(err, qsf),
                  "'%s': %s", ways[i], err);
        free(o);
    }
    fixture_rmtree(dir);
    free(dir);
    free(gguf);
}
