/* tests/executor/test_forward.c - forward pass against llama.cpp reference figures on fixtures. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "fixture.h"
#include "tjson.h"

#define FWD_TEST_THREADS 2

/* Greedy continuation of `prompt` (n_prompt ids) for n_gen tokens; returns 0 or an error. */
static int greedy(struct executor_ctx *c, const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen,
                  int32_t *out)
{
    uint32_t n_vocab = executor_ctx_n_vocab(c);
    float   *logits = malloc(n_vocab * sizeof(*logits));
    int      rc = logits ? 0 : COMMON_ENOMEM;
    executor_ctx_reset(c);
    if (rc == 0)
        rc = executor_ctx_decode(c, prompt, n_prompt, logits, NULL, NULL);
    for (uint32_t i = 0; rc == 0 && i < n_gen; i++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < n_vocab; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        out[i] = best;
        if (i + 1 < n_gen)
            rc = executor_ctx_decode(c, &best, 1, logits, NULL, NULL);
    }
    free(logits);
    return rc;
}

/* Converts a JSON array of numbers to a malloc'd int array. */
static int32_t *json_ids(const struct tjson *arr, uint32_t *n)
{
    cr_assert(arr && arr->kind == TJSON_ARR, "expected an id array in reference.json");
    int32_t *ids = malloc((arr->len ? arr->len : 1) * sizeof(*ids));
    for (size_t i = 0; i < arr->len; i++)
        ids[i] = (int32_t)tjson_at(arr, i)->num;
    *n = (uint32_t)arr->len;
    return ids;
}

/* Checks every greedy continuation listed under reference.json "greedy"/<quant>. */
static void check_greedy(const char *quant, const char *file, enum executor_cache_type cache)
{
    FIXTURE_OR_SKIP(ref_path, "moe-tiny/reference.json");
    char rel[128];
    snprintf(rel, sizeof(rel), "moe-tiny/%s", file);
    FIXTURE_OR_SKIP(model_path, rel);
    struct tjson *ref = tjson_load(ref_path);
    cr_assert_not_null(ref, "reference.json unreadable");
    const struct tjson *cases = tjson_get(tjson_get(ref, "greedy"), quant);
    cr_assert(cases && cases->kind == TJSON_ARR && cases->len > 0, "no greedy cases for %s", quant);

    struct executor_pool  *pool = NULL;
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_pool_create(FWD_TEST_THREADS, &pool), 0);
    cr_assert_eq(executor_model_open(model_path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_create(
                     m,
                     &(struct executor_ctx_opts){.n_ctx = 256, .cache_type = cache, .pool = pool},
                     &c, &e),
                 0, "%s", e.text);
    for (size_t k = 0; k < cases->len; k++) {
        uint32_t n_prompt, n_gen;
        int32_t *prompt = json_ids(tjson_get(tjson_at(cases, k), "prompt_ids"), &n_prompt);
        int32_t *want = json_ids(tjson_get(tjson_at(cases, k), "gen_ids"), &n_gen);
        int32_t *got = calloc(n_gen, sizeof(*got));
        cr_assert_eq(greedy(c, prompt, n_prompt, n_gen, got), 0);
        for (uint32_t i = 0; i < n_gen; i++)
            cr_expect_eq(got[i], want[i], "%s case %zu: token %u is %d, llama.cpp gives %d", quant,
                         k, i, got[i], want[i]);
        free(prompt);
        free(want);
        free(got);
    }
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    executor_pool_destroy(pool);
    tjson_free(ref);
    free(ref_path);
    free(model_path);
}

Test(executor_forward, greedy_f32_matches_llama_cpp, .timeout = 300)
{
    check_greedy("f32", "moe-tiny-f32.gguf", EXECUTOR_CACHE_F16);
}

Test(executor_forward, greedy_q8_0_matches_llama_cpp, .timeout = 300)
{
    check_greedy("q8_0", "moe-tiny-q8_0.gguf", EXECUTOR_CACHE_F16);
}
