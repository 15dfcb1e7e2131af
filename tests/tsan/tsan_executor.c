/* tests/tsan/tsan_executor.c - the executor's thread pool and a multi-threaded forward pass, as a
 * plain program so it runs under ThreadSanitizer. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fixture.h"

static void add_one(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    int *v = arg;
    for (int64_t i = i0; i < i1; i++)
        v[i] += 1;
}

/* Every item is visited exactly once per loop, across thousands of loops with idle gaps that let
 * the workers fall asleep and wake again. */
static void pool_loops(void)
{
    struct executor_threadpool *p = NULL;
    CHECK(executor_threadpool_create(3, &p) == COMMON_OK, "pool_create");
    int *v = calloc(1000, sizeof(*v));
    for (int it = 0; it < 3000; it++) {
        executor_threadpool_for(p, 1000, 7, add_one, v);
        if (it % 500 == 0)
            nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    int bad = 0;
    for (int i = 0; i < 1000; i++)
        bad += v[i] != 3000;
    CHECK(bad == 0, "%d items not visited 3000 times", bad);
    free(v);
    executor_threadpool_destroy(p);
}

/* A 2-thread forward pass (prefill in batches, then decode) on the MoE fixture, both cache types,
 * gives the same logits as a single-threaded one. */
static void forward_threads(const char *path)
{
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    if (executor_model_open(path, NULL, &m, &e) != COMMON_OK) {
        CHECK(0, "open %s: %s", path, e.text);
        return;
    }
    struct executor_threadpool *p = NULL;
    CHECK(executor_threadpool_create(2, &p) == COMMON_OK, "pool_create");
    for (int ct = 0; ct < 2; ct++) {
        float *last[2] = {NULL, NULL};
        for (int threaded = 0; threaded < 2; threaded++) {
            struct executor_ctx *c = NULL;
            int                  rc = executor_ctx_create(
                                 m,
                                 &(struct executor_ctx_opts){.n_ctx = 64,
                                                             .n_batch = 16,
                                                             .cache_type = (enum common_cache_type)ct,
                                                             .pool = threaded ? p : NULL},
                                 &c, &e);
            CHECK(rc == COMMON_OK, "ctx_create: %s", e.text);
            if (rc)
                continue;
            uint32_t nv = executor_ctx_n_vocab(c);
            float   *l = malloc(nv * sizeof(*l));
            int32_t  t[40];
            for (int i = 0; i < 40; i++)
                t[i] = 3 + i * 17;
            CHECK(executor_ctx_decode(c, t, 40, l, NULL, &e) == COMMON_OK, "prefill: %s", e.text);
            for (int i = 0; i < 5; i++) {
                int32_t id = 5 + i;
                CHECK(executor_ctx_decode(c, &id, 1, l, NULL, &e) == COMMON_OK, "decode: %s",
                      e.text);
            }
            last[threaded] = l;
            executor_ctx_destroy(c);
        }
        if (last[0] && last[1]) {
            uint32_t nv = executor_model_hparams(m)->n_vocab;
            int      diff = 0;
            for (uint32_t i = 0; i < nv; i++)
                diff += last[0][i] != last[1][i];
            CHECK(diff == 0, "cache %d: %d logits differ between 1 and 2 threads", ct, diff);
        }
        free(last[0]);
        free(last[1]);
    }
    executor_threadpool_destroy(p);
    executor_model_destroy(m);
}

/* Three sequences in shared batches (executor_ctx_decode_batch) on the 2-thread pool, one of
 * them joining with its prompt while the others decode: the rows of different caches run on
 * both threads; each sequence's logits equal its run alone. */
static void batch_threads(const char *path)
{
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    if (executor_model_open(path, NULL, &m, &e) != COMMON_OK) {
        CHECK(0, "open %s: %s", path, e.text);
        return;
    }
    struct executor_threadpool *p = NULL;
    CHECK(executor_threadpool_create(2, &p) == COMMON_OK, "pool_create");
    const struct executor_ctx_opts o = {.n_ctx = 64, .n_batch = 8, .pool = p};
    struct executor_ctx           *cs[3] = {NULL, NULL, NULL}, *alone = NULL;
    int                            ok = executor_ctx_create(m, &o, &alone, &e) == COMMON_OK;
    for (int s = 0; s < 3 && ok; s++)
        ok = executor_ctx_create(m, &o, &cs[s], &e) == COMMON_OK;
    CHECK(ok, "ctx_create: %s", e.text);
    const uint32_t nv = executor_model_hparams(m)->n_vocab;
    float         *l = calloc(3 * (size_t)nv, sizeof(*l)), *ref = calloc(nv, sizeof(*ref));
    int32_t        prompt[3][12];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < 12; i++)
            prompt[s][i] = (int32_t)((3 + s * 31 + i * 17) % (int32_t)nv);
    for (int step = 0; ok && step < 6; step++) {
        struct executor_batch_seq q[3];
        int32_t                   tok[3];
        uint32_t                  n = 0;
        for (int s = 0; s < 3; s++) {
            if (s == 2 && step < 2)
                continue; /* joins at step 2 */
            const bool first = step == 0 || (s == 2 && step == 2);
            tok[s] = (int32_t)(5 + step + s);
            q[n++] = (struct executor_batch_seq){.ctx = cs[s],
                                                 .tokens = first ? prompt[s] : &tok[s],
                                                 .n = first ? 12 : 1,
                                                 .logits = l + (size_t)s * nv};
        }
        CHECK(executor_ctx_decode_batch(cs[0], q, n, &e) == COMMON_OK, "batch: %s", e.text);
    }
    /* Sequence 2 alone: its prompt, then its tokens of steps 3..5. */
    CHECK(!ok || executor_ctx_decode(alone, prompt[2], 12, ref, NULL, &e) == COMMON_OK, "alone: %s",
          e.text);
    for (int step = 3; ok && step < 6; step++) {
        int32_t id = (int32_t)(5 + step + 2);
        CHECK(executor_ctx_decode(alone, &id, 1, ref, NULL, &e) == COMMON_OK, "alone: %s", e.text);
    }
    CHECK(!ok || memcmp(ref, l + 2 * (size_t)nv, nv * sizeof(float)) == 0,
          "the batched sequence's logits differ from its run alone");
    free(l);
    free(ref);
    for (int s = 0; s < 3; s++)
        executor_ctx_destroy(cs[s]);
    executor_ctx_destroy(alone);
    executor_threadpool_destroy(p);
    executor_model_destroy(m);
}

int main(void)
{
    executor_kernels_init();
    pool_loops();
    char *path = fixture_path("moe-tiny/moe-tiny-q8_0.gguf");
    if (path) {
        forward_threads(path);
        batch_threads(path);
    } else
        printf("SKIP forward_threads: fixture moe-tiny/moe-tiny-q8_0.gguf absent\n");
    free(path);
    return check_report();
}
