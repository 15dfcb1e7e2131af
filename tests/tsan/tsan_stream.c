/* tests/tsan/tsan_stream.c - the fetcher behind the executor (post-fetch, prefetch, the I/O thread
 * and a 2-thread forward pass) as a plain program so it runs under ThreadSanitizer. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fetcher.h"
#include "fixture.h"

/* The glue cli/session.c uses: fetcher calls behind the executor's expert source. */
static int ts_acquire(void *arg, uint32_t l, uint32_t x, enum common_expert_part p,
                      const void **data, uint32_t *loan)
{
    return fetcher_acquire(arg, l, x, p, data, loan);
}

static int ts_release(void *arg, uint32_t loan)
{
    fetcher_release(arg, loan);
    return COMMON_OK;
}

static int ts_request(void *arg, uint32_t l, uint32_t x, enum executor_expert_hint h)
{
    return fetcher_request(
        arg, l, x, h == EXECUTOR_HINT_PREFETCH ? FETCHER_PRIO_PREFETCH : FETCHER_PRIO_POSTFETCH);
}

static bool ts_is_ready(void *arg, uint32_t l, uint32_t x)
{
    return fetcher_is_ready(arg, l, x);
}

static void ts_token_begin(void *arg)
{
    fetcher_token_begin(arg);
}

/* Prefill in waves then decode, with a pool of `n_slots` bundles, 2 threads, both policies and
 * both engines: the logits equal those of the mapped model. */
static void stream_matches(const char *path, const float *ref_prefill, const float *ref_decode,
                           enum fetcher_io_mode io, enum fetcher_policy policy, uint32_t n_slots,
                           bool history)
{
    struct common_gguf         *g = NULL;
    struct common_model         d;
    struct fetcher             *f = NULL;
    struct executor_weights    *w = NULL;
    struct executor_model      *m = NULL;
    struct executor_threadpool *p = NULL;
    struct executor_ctx        *c = NULL;
    struct common_errmsg        e = {{0}};
    if (common_gguf_open(path, NULL, &g, &e) != 0 || common_model_init(&d, g, &e) != 0) {
        CHECK(0, "open: %s", e.text);
        return;
    }
    int rc = fetcher_create(
        g, &d, &(struct fetcher_opts){.io = io, .policy = policy, .n_slots = n_slots}, &f, &e);
    if (rc == COMMON_ENOTSUP) {
        printf("SKIP io %s: %s\n", fetcher_io_mode_name(io), e.text);
        common_model_fini(&d);
        common_gguf_close(g);
        return;
    }
    CHECK(rc == 0, "fetcher_create: %s", e.text);
    struct executor_expert_source src = {.acquire = ts_acquire,
                                         .release = ts_release,
                                         .request = ts_request,
                                         .is_ready = ts_is_ready,
                                         .token_begin = ts_token_begin,
                                         .arg = f};
    CHECK(executor_weights_stream_create(
              &d, &(struct executor_weights_opts){.read_span = common_gguf_read_span}, &src, &w,
              &e) == 0,
          "stream: %s", e.text);
    CHECK(executor_model_create(&d, w, &m, &e) == 0, "model: %s", e.text);
    CHECK(executor_threadpool_create(2, &p) == 0, "pool");
    CHECK(executor_ctx_create(m,
                              &(struct executor_ctx_opts){.n_ctx = 64,
                                                          .n_batch = 16,
                                                          .pool = p,
                                                          .prefetch_history = history,
                                                          .fetch_window = n_slots / 2},
                              &c, &e) == 0,
          "ctx: %s", e.text);
    uint32_t nv = d.hp.n_vocab;
    float   *l = malloc((size_t)nv * 40 * sizeof(*l));
    int32_t  t[40];
    for (int i = 0; i < 40; i++)
        t[i] = 3 + i * 17;
    CHECK(executor_ctx_decode(c, t, 40, l, &(struct executor_decode_opts){.all_logits = true},
                              &e) == 0,
          "prefill: %s", e.text);
    CHECK(memcmp(l, ref_prefill, (size_t)nv * 40 * sizeof(*l)) == 0,
          "prefill logits differ (io %s, policy %s, %u slots)", fetcher_io_mode_name(io),
          fetcher_policy_name(policy), n_slots);
    for (int i = 0; i < 8; i++) {
        int32_t id = 5 + i;
        CHECK(executor_ctx_decode(c, &id, 1, l, NULL, &e) == 0, "decode: %s", e.text);
        CHECK(memcmp(l, ref_decode + (size_t)i * nv, nv * sizeof(*l)) == 0,
              "decode %d logits differ (io %s, policy %s)", i, fetcher_io_mode_name(io),
              fetcher_policy_name(policy));
    }
    struct fetcher_pool_counts pc;
    fetcher_get_pool_counts(f, &pc);
    CHECK(pc.n_pinned == 0, "%u slots still pinned", pc.n_pinned);
    free(l);
    executor_ctx_destroy(c);
    executor_threadpool_destroy(p);
    executor_model_destroy(m);
    executor_weights_destroy(w);
    fetcher_destroy(f);
    common_model_fini(&d);
    common_gguf_close(g);
}

static void stream_all(const char *path)
{
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    if (executor_model_open(path, NULL, &m, &e) != 0 ||
        executor_ctx_create(m, &(struct executor_ctx_opts){.n_ctx = 64, .n_batch = 16}, &c, &e) !=
            0) {
        CHECK(0, "reference: %s", e.text);
        executor_model_destroy(m);
        return;
    }
    uint32_t nv = executor_ctx_n_vocab(c);
    float   *pre = malloc((size_t)nv * 40 * sizeof(*pre));
    float   *dec = malloc((size_t)nv * 8 * sizeof(*dec));
    int32_t  t[40];
    for (int i = 0; i < 40; i++)
        t[i] = 3 + i * 17;
    CHECK(executor_ctx_decode(c, t, 40, pre, &(struct executor_decode_opts){.all_logits = true},
                              &e) == 0,
          "ref prefill");
    for (int i = 0; i < 8; i++) {
        int32_t id = 5 + i;
        CHECK(executor_ctx_decode(c, &id, 1, dec + (size_t)i * nv, NULL, &e) == 0, "ref decode");
    }
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    const enum fetcher_io_mode io[2] = {FETCHER_IO_PREAD, FETCHER_IO_URING};
    for (int i = 0; i < 2; i++)
        for (int pol = 0; pol < 2; pol++) {
            stream_matches(path, pre, dec, io[i], (enum fetcher_policy)pol, 3, false);
            stream_matches(path, pre, dec, io[i], (enum fetcher_policy)pol, 12, pol == 1);
        }
    free(pre);
    free(dec);
}

int main(void)
{
    executor_kernels_init();
    char *path = fixture_path("moe-tiny/moe-tiny-q4_0.gguf");
    if (path)
        stream_all(path);
    else
        printf("SKIP stream_all: fixture moe-tiny/moe-tiny-q4_0.gguf absent\n");
    free(path);
    return check_report();
}
