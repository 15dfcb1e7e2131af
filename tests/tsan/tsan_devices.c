/* tests/tsan/tsan_devices.c - forward passes on several devices of the host backend at once, as
 * a plain program so it runs under ThreadSanitizer: the device current per thread (gpu_use), the
 * backend's record of which device owns which memory, and the chained parts of a split. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fixture.h"
#include "greedy.h"

#define DEV_THREADS 3
#define DEV_PROMPT  24
#define DEV_STEPS   6

struct dev_job {
    struct executor_model  *m;
    struct executor_devices d; /* where this thread's layers go */
    float                  *logits;
    char                    err[600];
};

/* A prompt and greedy steps with every layer on the job's devices; the last logits kept. */
static void *dev_run(void *arg)
{
    struct dev_job      *j = arg;
    struct executor_ctx *c = NULL;
    struct common_errmsg e = {{0}};
    if (executor_ctx_create(
            j->m, &(struct executor_ctx_opts){.n_ctx = 64, .n_gpu_layers = 999, .devices = j->d},
            &c, &e) != COMMON_OK) {
        snprintf(j->err, sizeof(j->err), "ctx_create: %s", e.text);
        return NULL;
    }
    const int rc = tsan_greedy(c, DEV_PROMPT, DEV_STEPS, &j->logits, &e);
    if (rc != COMMON_OK)
        snprintf(j->err, sizeof(j->err), "decode: %s", e.text);
    executor_ctx_destroy(c);
    return NULL;
}

int main(void)
{
    executor_kernels_init();
    if (setenv("SLUICE_GPU_BACKEND", "host", 1) != 0 ||
        setenv("SLUICE_GPU_HOST_DEVICES", "3", 1) != 0) {
        CHECK(0, "setenv");
        return check_report();
    }
    struct executor_model *m = tsan_model_open("moe-tiny/moe-tiny-q8_0.gguf", "devices");
    if (!m)
        return check_report();
    /* Two threads each on a device of its own (--split-mode none), one over all three. */
    struct dev_job jobs[DEV_THREADS] = {
        {.m = m, .d = {.single = true, .main_gpu = 0}},
        {.m = m, .d = {.single = true, .main_gpu = 2}},
        {.m = m, .d = {.n = 3, .id = {1, 2, 0}}},
    };
    pthread_t th[DEV_THREADS];
    for (int k = 0; k < DEV_THREADS; k++)
        CHECK(pthread_create(&th[k], NULL, dev_run, &jobs[k]) == 0, "pthread_create");
    for (int k = 0; k < DEV_THREADS; k++)
        pthread_join(th[k], NULL);
    const uint32_t nv = executor_model_hparams(m)->n_vocab;
    for (int k = 0; k < DEV_THREADS; k++) {
        CHECK(jobs[k].err[0] == '\0', "thread %d: %s", k, jobs[k].err);
        CHECK(jobs[k].logits && jobs[0].logits &&
                  memcmp(jobs[k].logits, jobs[0].logits, nv * sizeof(float)) == 0,
              "thread %d's logits differ from thread 0's", k);
    }
    for (int k = 0; k < DEV_THREADS; k++)
        free(jobs[k].logits);
    executor_model_destroy(m);
    return check_report();
}
