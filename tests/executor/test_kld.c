/* tests/executor/test_kld.c - llama-perplexity's KL-divergence files: rows, sums, bad files. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "fixture.h"

#define KLD_VOCAB 33u /* odd: the row carries a pad entry */
#define KLD_CTX   8u  /* rows per chunk: 8 - 1 - 4 = 3 */

static void random_logits(float *l, uint32_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1u;
    for (uint32_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        l[i] = (float)(x >> 8) / (float)(1u << 24) * 12.0f - 6.0f;
    }
}

Test(executor_kld, a_row_compared_with_its_own_logits_diverges_by_rounding_only)
{
    const size_t nv = executor_kld_row_len(KLD_VOCAB);
    cr_assert_eq(nv, 2u * 17u + 4u);
    cr_assert_eq(executor_kld_rows_per_chunk(KLD_CTX), 3u);
    float                     l[KLD_VOCAB];
    uint16_t                  row[2 * 17 + 4];
    struct executor_kld_stats s;
    cr_assert_eq(executor_kld_stats_init(&s, 64), 0);
    uint64_t near_ties = 0;
    for (uint32_t k = 0; k < 64; k++) {
        random_logits(l, KLD_VOCAB, k);
        double nll = executor_kld_encode_row(l, KLD_VOCAB, (int32_t)(k % KLD_VOCAB), row);
        cr_assert(nll > 0.0 && isfinite(nll));
        cr_assert_eq(row[4 + KLD_VOCAB], 0, "the pad entry is zero");
        /* Two best logits closer than one 16-bit step may swap: the stored argmax is the first. */
        float best = -INFINITY, second = -INFINITY, step;
        memcpy(&step, row, sizeof(step));
        for (uint32_t i = 0; i < KLD_VOCAB; i++) {
            second = l[i] > best ? best : (l[i] > second ? l[i] : second);
            best = l[i] > best ? l[i] : best;
        }
        near_ties += best - second <= step;
        executor_kld_accumulate(&s, l, KLD_VOCAB, row, (int32_t)(k % KLD_VOCAB));
        cr_assert(fabsf(s.kld_values[k]) < 2.0f * step, "KLD %g, step %g", (double)s.kld_values[k],
                  (double)step);
    }
    cr_assert_eq(s.count, 64u);
    cr_assert_geq(s.n_same_top + near_ties, 64u, "the argmax survives the 16-bit rounding");
    cr_assert_lt(fabs(s.sum_kld / 64.0), 1e-4, "mean KLD %g", s.sum_kld / 64.0);
    cr_assert_lt(fabs(s.sum_nll - s.sum_nll_base) / 64.0, 1e-3);
    executor_kld_stats_fini(&s);
}

Test(executor_kld, different_logits_diverge_and_can_change_the_top_token)
{
    const size_t              nv = executor_kld_row_len(KLD_VOCAB);
    float                     a[KLD_VOCAB], b[KLD_VOCAB];
    uint16_t                 *row = calloc(nv, sizeof(*row));
    struct executor_kld_stats s;
    cr_assert_eq(executor_kld_stats_init(&s, 4), 0);
    random_logits(a, KLD_VOCAB, 1);
    random_logits(b, KLD_VOCAB, 2);
    executor_kld_encode_row(a, KLD_VOCAB, 0, row);
    executor_kld_accumulate(&s, b, KLD_VOCAB, row, 0);
    cr_assert_gt(s.sum_kld, 0.1, "KLD %g", s.sum_kld);
    /* Shifting every logit by a constant changes no probability. */
    for (uint32_t i = 0; i < KLD_VOCAB; i++)
        b[i] = a[i] + 3.0f;
    executor_kld_accumulate(&s, b, KLD_VOCAB, row, 0);
    cr_assert_lt(fabsf(s.kld_values[1]), 1e-3f, "KLD %g", (double)s.kld_values[1]);
    executor_kld_stats_fini(&s);
    free(row);
}

/* Writes a base file of `n_chunk` chunks to `path`; returns its tokens (malloc'd). */
static int32_t *write_base(const char *path, uint32_t n_chunk)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    int32_t *toks = malloc(n_chunk * KLD_CTX * sizeof(*toks));
    for (uint32_t i = 0; i < n_chunk * KLD_CTX; i++)
        toks[i] = (int32_t)((i * 7u) % KLD_VOCAB);
    cr_assert_eq(executor_kld_write_header(f, KLD_CTX, KLD_VOCAB, n_chunk, toks), 0);
    const size_t nv = executor_kld_row_len(KLD_VOCAB);
    uint16_t    *row = calloc(nv, sizeof(*row));
    float        l[KLD_VOCAB];
    for (uint32_t c = 0; c < n_chunk; c++)
        for (uint32_t r = 0; r < executor_kld_rows_per_chunk(KLD_CTX); r++) {
            random_logits(l, KLD_VOCAB, c * 10 + r);
            executor_kld_encode_row(l, KLD_VOCAB, 1, row);
            cr_assert_eq(fwrite(row, sizeof(*row), nv, f), nv);
        }
    free(row);
    cr_assert_eq(fclose(f), 0);
    return toks;
}

Test(executor_kld, base_file_round_trips)
{
    char *dir = fixture_tmpdir();
    char  path[4096];
    snprintf(path, sizeof(path), "%s/base.kld", dir);
    int32_t                  *toks = write_base(path, 2);
    struct executor_kld_base *b = NULL;
    struct common_errmsg      e = {{0}};
    cr_assert_eq(executor_kld_base_open(path, &b, &e), 0, "%s", e.text);
    uint32_t       n_ctx, n_vocab, n_chunk;
    const int32_t *got;
    executor_kld_base_info(b, &n_ctx, &n_vocab, &n_chunk, &got);
    cr_assert_eq(n_ctx, KLD_CTX);
    cr_assert_eq(n_vocab, KLD_VOCAB);
    cr_assert_eq(n_chunk, 2u);
    cr_assert_arr_eq(got, toks, 2 * KLD_CTX * sizeof(*toks));
    uint16_t *rows = calloc(3 * executor_kld_row_len(KLD_VOCAB), sizeof(*rows));
    cr_assert_eq(executor_kld_base_next(b, rows, &e), 0, "%s", e.text);
    cr_assert_eq(executor_kld_base_next(b, rows, &e), 0, "%s", e.text);
    cr_assert_eq(executor_kld_base_next(b, rows, &e), COMMON_ERANGE, "only two chunks");
    executor_kld_base_close(b);
    free(rows);
    free(toks);
    fixture_rmtree(dir);
    free(dir);
}

/* Overwrites `len` bytes at `off` of the file at `path`. */
static void patch(const char *path, long off, const void *bytes, size_t len)
{
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, off, SEEK_SET), 0);
    cr_assert_eq(fwrite(bytes, 1, len, f), len);
    fclose(f);
}

/* Opens `path`, expects `rc` and a message containing `want`. */
static void expect_refused(const char *path, int rc, const char *want)
{
    struct executor_kld_base *b = NULL;
    struct common_errmsg      e = {{0}};
    cr_assert_eq(executor_kld_base_open(path, &b, &e), rc, "%s", e.text);
    cr_assert_null(b);
    cr_assert_not_null(strstr(e.text, want), "message: %s", e.text);
}

Test(executor_kld, bad_files_are_refused_with_the_reason)
{
    char *dir = fixture_tmpdir();
    char  path[4096];
    snprintf(path, sizeof(path), "%s/base.kld", dir);

    free(write_base(path, 2));
    patch(path, 0, "_logitz_", 8);
    expect_refused(path, COMMON_ECORRUPT, "_logits_");

    free(write_base(path, 2));
    const int32_t three = 3; /* n_chunk 3: the file is one chunk short */
    patch(path, 16, &three, sizeof(three));
    expect_refused(path, COMMON_ECORRUPT, "need");

    free(write_base(path, 2));
    const int32_t huge = 1 << 30; /* n_vocab */
    patch(path, 12, &huge, sizeof(huge));
    expect_refused(path, COMMON_ECORRUPT, "implausible");

    free(write_base(path, 2));
    const int32_t bad_tok = (int32_t)KLD_VOCAB;
    patch(path, 20 + 4 * 5, &bad_tok, sizeof(bad_tok));
    expect_refused(path, COMMON_ECORRUPT, "token 5");

    free(write_base(path, 2));
    const float nan = NAN; /* the scale of chunk 1, row 0 */
    patch(path, 20 + 4 * 2 * KLD_CTX, &nan, sizeof(nan));
    struct executor_kld_base *b = NULL;
    struct common_errmsg      e = {{0}};
    cr_assert_eq(executor_kld_base_open(path, &b, &e), 0, "%s", e.text);
    uint16_t *rows = calloc(3 * executor_kld_row_len(KLD_VOCAB), sizeof(*rows));
    cr_assert_eq(executor_kld_base_next(b, rows, &e), COMMON_ECORRUPT);
    cr_assert_not_null(strstr(e.text, "scale"), "%s", e.text);
    executor_kld_base_close(b);
    free(rows);

    expect_refused(dir, COMMON_EINVAL, "regular file");
    fixture_rmtree(dir);
    free(dir);
}

/* `sluice perplexity` saves a base and compares a model with it: the same model agrees at every
 * position, another quantization of it diverges a little. */
Test(executor_kld, cli_saves_and_compares_a_base, .timeout = 300)
{
    FIXTURE_OR_SKIP(eval, "moe-tiny/eval.txt");
    FIXTURE_OR_SKIP(q8, "moe-tiny/moe-tiny-q8_0.gguf");
    FIXTURE_OR_SKIP(q4, "moe-tiny/moe-tiny-q4_0.gguf");
    char *dir = fixture_tmpdir();
    char  cmd[8192];
    int   st;
    snprintf(cmd, sizeof(cmd),
             "'%s/bin/sluice' perplexity -m '%s' -f '%s' -c 128 --chunks 4 -t 2 "
             "--kl-divergence-base '%s/base.kld' 2>&1",
             SLUICE_BINARY_DIR, q8, eval, dir);
    char *out = fixture_run(cmd, &st);
    cr_assert_eq(st, 0, "%s", out);
    free(out);
    const char *models[2] = {q8, q4};
    double      kld[2] = {-1, -1}, top[2] = {-1, -1};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd),
                 "'%s/bin/sluice' perplexity -m '%s' --kl-divergence-base '%s/base.kld' "
                 "--kl-divergence -t 2 2>&1",
                 SLUICE_BINARY_DIR, models[i], dir);
        out = fixture_run(cmd, &st);
        cr_assert_eq(st, 0, "%s", out);
        const char *k = strstr(out, "Mean    KLD:");
        const char *t = strstr(out, "Same top p:");
        cr_assert(k && t, "%s", out);
        sscanf(k, "Mean    KLD: %lf", &kld[i]);
        sscanf(t, "Same top p: %lf", &top[i]);
        free(out);
    }
    cr_log_info("q8_0 vs itself: KLD %.6f, same top %.3f%%; q4_0: KLD %.6f, same top %.3f%%",
                kld[0], top[0], kld[1], top[1]);
    cr_expect_lt(fabs(kld[0]), 1e-4);
    cr_expect_eq(top[0], 100.0);
    cr_expect_gt(kld[1], 1e-3, "q4_0 differs from q8_0");
    cr_expect_lt(top[1], 100.0);

    /* Usage: --kl-divergence without a base, or with -f, is a usage error (exit 2). */
    snprintf(cmd, sizeof(cmd), "'%s/bin/sluice' perplexity -m '%s' --kl-divergence 2>&1",
             SLUICE_BINARY_DIR, q8);
    out = fixture_run(cmd, &st);
    cr_expect_eq(st, 2, "%s", out);
    cr_expect_not_null(strstr(out, "--kl-divergence-base"), "%s", out);
    free(out);
    /* A base of another vocabulary is refused with both sizes. */
    FIXTURE_OR_SKIP(llama2, "models/llama-2-tiny-random.gguf");
    snprintf(cmd, sizeof(cmd),
             "'%s/bin/sluice' perplexity -m '%s' --kl-divergence-base '%s/base.kld' "
             "--kl-divergence 2>&1",
             SLUICE_BINARY_DIR, llama2, dir);
    out = fixture_run(cmd, &st);
    cr_expect_eq(st, 1, "%s", out);
    cr_expect_not_null(strstr(out, "1024 tokens, the model has 32000"), "%s", out);
    free(out);
    free(llama2);
    fixture_rmtree(dir);
    free(dir);
    free(eval);
    free(q8);
    free(q4);
}
