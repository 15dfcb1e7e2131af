/* tests/tsan/greedy.h - what the thread programs that decode share: their fixture model opened
 * (or the skip said), and a prompt of ids spread over the vocabulary, then greedy steps, the last
 * step's logits kept. */
#ifndef TESTS_TSAN_GREEDY_H
#define TESTS_TSAN_GREEDY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fixture.h"

/* The fixture model `name` (under ../shared/fixtures), opened; NULL when it is absent (a SKIP line
 * for program `who` printed) or does not open (a failed CHECK). */
static inline struct executor_model *tsan_model_open(const char *name, const char *who)
{
    char *path = fixture_path(name);
    if (!path) {
        printf("SKIP %s: fixture %s absent\n", who, name);
        return NULL;
    }
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    if (executor_model_open(path, NULL, &m, &e) != COMMON_OK)
        CHECK(0, "open %s: %s", path, e.text);
    free(path);
    return m;
}

/* Decodes n_prompt ids, then n_steps greedy tokens; *logits (malloc'd, n_vocab floats; freed by
 * the caller even on failure) holds the last logits. Returns COMMON_OK or the first error (e). */
static inline int tsan_greedy(struct executor_ctx *c, uint32_t n_prompt, uint32_t n_steps,
                              float **logits, struct common_errmsg *e)
{
    const uint32_t nv = executor_ctx_n_vocab(c);
    int32_t       *t = malloc((n_prompt ? n_prompt : 1) * sizeof(int32_t));
    *logits = malloc(nv * sizeof(float));
    if (!t || !*logits) {
        free(t);
        return COMMON_ENOMEM;
    }
    for (uint32_t i = 0; i < n_prompt; i++)
        t[i] = (int32_t)(1 + (i * 37 + 11) % (nv - 1));
    int rc = executor_ctx_decode(c, t, n_prompt, *logits, NULL, e);
    for (uint32_t s = 0; rc == COMMON_OK && s < n_steps; s++) {
        int32_t best = 0;
        for (uint32_t i = 1; i < nv; i++)
            best = (*logits)[i] > (*logits)[best] ? (int32_t)i : best;
        rc = executor_ctx_decode(c, &best, 1, *logits, NULL, e);
    }
    free(t);
    return rc;
}

#endif /* TESTS_TSAN_GREEDY_H */
