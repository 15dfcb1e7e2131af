/* tests/tsan/tsan_cpu_backend.c - the CPU backend (SLUICE_GPU_BACKEND=cpu) under
 * ThreadSanitizer: two contexts decoding at once on threads of their own, each with a pool of
 * three threads that its steps' kernels share out (gpu_threads), over one model's weights used in
 * place; a prompt long enough for the routed experts' grouped products, then greedy steps. Both
 * give the logits of a context alone on one thread. Then the same with one pass (one_pass, -ngl
 * 2): each step's first two layers on the CPU device, the last two on the backend's device, so
 * each thread switches devices, hence backends, in every step. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fixture.h"
#include "greedy.h"

#define CB_THREADS 2
#define CB_PROMPT  40
#define CB_STEPS   6

struct cb_job {
    struct executor_model *m;
    int32_t                ngl;
    bool                   one_pass;
    uint32_t               n_threads; /* of the context's pool; 1 = the caller alone */
    float                 *logits;
    char                   err[600];
};

static void *cb_run(void *arg)
{
    struct cb_job              *j = arg;
    struct executor_threadpool *pool = NULL;
    struct executor_ctx        *c = NULL;
    struct common_errmsg        e = {{0}};
    if (j->n_threads > 1 && executor_threadpool_create(j->n_threads, &pool) != COMMON_OK) {
        snprintf(j->err, sizeof(j->err), "threadpool_create");
        return NULL;
    }
    if (executor_ctx_create(
            j->m,
            &(struct executor_ctx_opts){
                .n_ctx = 64, .n_gpu_layers = j->ngl, .one_pass = j->one_pass, .pool = pool},
            &c, &e) != COMMON_OK) {
        snprintf(j->err, sizeof(j->err), "ctx_create: %s", e.text);
        executor_threadpool_destroy(pool);
        return NULL;
    }
    const int rc = tsan_greedy(c, CB_PROMPT, CB_STEPS, &j->logits, &e);
    if (rc != COMMON_OK)
        snprintf(j->err, sizeof(j->err), "decode: %s", e.text);
    executor_ctx_destroy(c);
    executor_threadpool_destroy(pool);
    return NULL;
}

int main(void)
{
    executor_kernels_init();
    if (setenv("SLUICE_GPU_BACKEND", "cpu", 1) != 0) {
        CHECK(0, "setenv");
        return check_report();
    }
    struct executor_model *m = tsan_model_open("moe-tiny/moe-tiny-q4_k_m.gguf", "cpu_backend");
    if (!m)
        return check_report();
    for (int one = 0; one < 2; one++) {
        const int32_t ngl = one ? 2 : 999;
        struct cb_job alone = {.m = m, .ngl = ngl, .one_pass = one, .n_threads = 1};
        cb_run(&alone);
        CHECK(alone.err[0] == '\0', "alone (one pass %d): %s", one, alone.err);
        struct cb_job jobs[CB_THREADS];
        pthread_t     th[CB_THREADS];
        for (int k = 0; k < CB_THREADS; k++) {
            jobs[k] = (struct cb_job){.m = m, .ngl = ngl, .one_pass = one, .n_threads = 3};
            CHECK(pthread_create(&th[k], NULL, cb_run, &jobs[k]) == 0, "pthread_create");
        }
        for (int k = 0; k < CB_THREADS; k++)
            pthread_join(th[k], NULL);
        const uint32_t nv = executor_model_hparams(m)->n_vocab;
        for (int k = 0; k < CB_THREADS; k++) {
            CHECK(jobs[k].err[0] == '\0', "thread %d (one pass %d): %s", k, one, jobs[k].err);
            CHECK(jobs[k].logits && alone.logits &&
                      memcmp(jobs[k].logits, alone.logits, nv * sizeof(float)) == 0,
                  "thread %d's logits differ from a context's alone (one pass %d)", k, one);
            free(jobs[k].logits);
        }
        free(alone.logits);
    }
    executor_model_destroy(m);
    return check_report();
}
