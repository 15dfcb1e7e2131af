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
static void check_greedy(const char *quant, const char *file, enum common_cache_type cache)
{
    FIXTURE_OR_SKIP(ref_path, "moe-tiny/reference.json");
    char rel[128];
    snprintf(rel, sizeof(rel), "moe-tiny/%s", file);
    FIXTURE_OR_SKIP(model_path, rel);
    struct tjson *ref = tjson_load(ref_path);
    cr_assert_not_null(ref, "reference.json unreadable");
    const struct tjson *cases = tjson_get(tjson_get(ref, "greedy"), quant);
    cr_assert(cases && cases->kind == TJSON_ARR && cases->len > 0, "no greedy cases for %s", quant);

    struct executor_threadpool *pool = NULL;
    struct executor_model      *m = NULL;
    struct executor_ctx        *c = NULL;
    struct common_errmsg        e = {{0}};
    cr_assert_eq(executor_threadpool_create(FWD_TEST_THREADS, &pool), 0);
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
    executor_threadpool_destroy(pool);
    tjson_free(ref);
    free(ref_path);
    free(model_path);
}

Test(executor_forward, greedy_f32_matches_llama_cpp, .timeout = 300)
{
    check_greedy("f32", "moe-tiny-f32.gguf", COMMON_CACHE_F16);
}

Test(executor_forward, greedy_q8_0_matches_llama_cpp, .timeout = 300)
{
    check_greedy("q8_0", "moe-tiny-q8_0.gguf", COMMON_CACHE_F16);
}

/* One prompt of llama-2-tiny-random.reference.txt: ids, then per greedy step the chosen id and
 * the top-5 (id, logit) pairs. */
struct tiny_case {
    int32_t  prompt[64];
    uint32_t n_prompt;
    int32_t  step_id[8];
    int32_t  top_id[8][5];
    float    top_logit[8][5];
    uint32_t n_steps;
};

/* Parses the reference text; returns the number of prompts read (at most max). */
static size_t tiny_parse(char *text, struct tiny_case *cases, size_t max)
{
    size_t            n = 0;
    struct tiny_case *cur = NULL;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "### prompt:", 11) == 0) {
            if (n == max)
                break;
            cur = &cases[n++];
            memset(cur, 0, sizeof(*cur));
        } else if (cur && strncmp(line, "prompt_ids:", 11) == 0) {
            char *p = line + 11, *end;
            for (long v = strtol(p, &end, 10); end != p && cur->n_prompt < 64;
                 v = strtol(p, &end, 10)) {
                cur->prompt[cur->n_prompt++] = (int32_t)v;
                p = end;
            }
        } else if (cur && line[0] >= '0' && line[0] <= '9' && cur->n_steps < 8) {
            uint32_t s = cur->n_steps++;
            char    *p = line, *end;
            cur->step_id[s] = (int32_t)strtol(p, &end, 10);
            p = end;
            for (int k = 0; k < 5; k++) {
                cur->top_id[s][k] = (int32_t)strtol(p, &end, 10);
                p = end + 1; /* ':' */
                cur->top_logit[s][k] = strtof(p, &end);
                p = end;
            }
        }
    }
    return n;
}

Test(executor_forward, llama2_tiny_first_token_and_top5_logits, .timeout = 60)
{
    FIXTURE_OR_SKIP(ref_path, "models/llama-2-tiny-random.reference.txt");
    FIXTURE_OR_SKIP(model_path, "models/llama-2-tiny-random.gguf");
    char *text = fixture_read_all(ref_path, NULL);
    cr_assert_not_null(text);
    struct tiny_case cases[8];
    size_t           n_cases = tiny_parse(text, cases, 8);
    cr_assert_gt(n_cases, 0, "no prompts in the reference file");

    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(model_path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_create(m, &(struct executor_ctx_opts){.n_ctx = 128}, &c, &e), 0, "%s",
                 e.text);
    uint32_t n_vocab = executor_ctx_n_vocab(c);
    float   *logits = malloc(n_vocab * sizeof(*logits));
    for (size_t k = 0; k < n_cases; k++) {
        struct tiny_case *tc = &cases[k];
        cr_assert_gt(tc->n_steps, 0);
        executor_ctx_reset(c);
        cr_assert_eq(executor_ctx_decode(c, tc->prompt, tc->n_prompt, logits, NULL, &e), 0, "%s",
                     e.text);
        /* The first step is a robust target: argmax and the five best logits. */
        int32_t best = 0;
        for (uint32_t v = 1; v < n_vocab; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        cr_expect_eq(best, tc->step_id[0], "prompt %zu: first token %d, llama.cpp %d", k, best,
                     tc->step_id[0]);
        for (int j = 0; j < 5; j++)
            cr_expect(fabsf(logits[tc->top_id[0][j]] - tc->top_logit[0][j]) <= 1e-3f,
                      "prompt %zu: logit of %d is %.5f, llama.cpp %.4f", k, tc->top_id[0][j],
                      (double)logits[tc->top_id[0][j]], (double)tc->top_logit[0][j]);
    }
    free(logits);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    free(text);
    free(ref_path);
    free(model_path);
}
