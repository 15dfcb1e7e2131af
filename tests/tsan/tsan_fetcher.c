/* tests/tsan/tsan_fetcher.c - the fetcher's pool and front (blocking and asynchronous acquires)
 * under many threads, as a plain program so it runs under ThreadSanitizer. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "fetcher.h"
#include "fixture.h"
#include "pool.h"

static _Atomic uint64_t g_bad; /* relaxed counter: read after join */

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* ---- pool: claim, fill, complete, pin, check, release from 6 threads ------------------------ */

static struct fetcher_pool *g_pool;

static void *pool_worker(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 7919 + 1;
    for (int i = 0; i < 3000; i++) {
        uint32_t                k = (uint32_t)(rng_next(&s) % 12);
        uint32_t                part = (uint32_t)(rng_next(&s) % 3);
        struct common_pool_key  key = {k / 4, k % 4, COMMON_POOL_BUNDLE};
        struct common_pool_loan l;
        int                     rc = fetcher_pool_try_acquire(g_pool, &key, part, &l);
        if (rc == COMMON_ENOENT) {
            uint32_t slot, gen;
            if (fetcher_pool_claim(g_pool, &key, 0, 0, &slot, &gen, NULL) == COMMON_OK) {
                uint8_t *d = fetcher_pool_slot_data(g_pool, slot);
                for (uint32_t p = 0; p < 3; p++) {
                    memset(d + p * FETCHER_ALIGN, (int)(k * 3 + p), FETCHER_ALIGN);
                    fetcher_pool_set_part(g_pool, slot, p, p * FETCHER_ALIGN, FETCHER_ALIGN);
                    fetcher_pool_part_ready(g_pool, slot, p);
                }
                if (rng_next(&s) % 8 == 0)
                    fetcher_pool_fail(g_pool, slot); /* now and then a load fails */
                else
                    fetcher_pool_complete(g_pool, slot);
            } else {
                sched_yield();
            }
            continue;
        }
        if (rc == COMMON_EAGAIN && fetcher_pool_wait_acquire(g_pool, l.slot, l.gen, part, &l))
            continue;
        const uint8_t *b = l.data;
        if (b[0] != (uint8_t)(k * 3 + part) || b[FETCHER_ALIGN - 1] != (uint8_t)(k * 3 + part))
            atomic_fetch_add_explicit(&g_bad, 1, memory_order_relaxed);
        fetcher_pool_release(g_pool, l.slot);
    }
    return NULL;
}

static void pool_threads(void)
{
    struct fetcher_pool_opts o = {.slot_bytes = 3 * FETCHER_ALIGN,
                                  .n_slots = 5,
                                  .n_layer = 3,
                                  .n_expert = 4,
                                  .policy = FETCHER_POLICY_LFU,
                                  .lfu_halflife = 16};
    CHECK(fetcher_pool_create(&o, &g_pool, NULL) == COMMON_OK, "pool_create");
    atomic_store(&g_bad, 0);
    pthread_t th[6];
    for (uintptr_t i = 0; i < 6; i++)
        pthread_create(&th[i], NULL, pool_worker, (void *)i);
    for (int i = 0; i < 6; i++)
        pthread_join(th[i], NULL);
    CHECK(atomic_load(&g_bad) == 0, "%llu pinned reads saw other bytes",
          (unsigned long long)atomic_load(&g_bad));
    struct fetcher_pool_counts c;
    fetcher_pool_counts(g_pool, &c);
    CHECK(c.n_pinned == 0 && c.n_loading == 0, "pinned %u loading %u", c.n_pinned, c.n_loading);
    fetcher_pool_destroy(g_pool);
}

/* ---- front: acquire/release, prefetch and token marks from 4 threads ------------------------ */

static struct common_gguf *g_g;
static struct common_model g_m;
static struct fetcher     *g_f;
static uint8_t           **g_ref; /* per (layer, expert, part) bytes from common_gguf_read_span */

static void *front_worker(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 104729 + 3;
    uint32_t nl = g_m.hp.n_layer, ne = g_m.hp.n_expert;
    for (int i = 0; i < 200; i++) {
        uint32_t l = (uint32_t)(rng_next(&s) % nl), x = (uint32_t)(rng_next(&s) % ne);
        uint32_t p = (uint32_t)(rng_next(&s) % 3);
        if (rng_next(&s) % 4 == 0)
            fetcher_request(g_f, (l + 1) % nl, (x + 3) % ne, FETCHER_PRIO_PREFETCH);
        if (rng_next(&s) % 8 == 0)
            fetcher_request(g_f, l, (x + 1) % ne, FETCHER_PRIO_POSTFETCH);
        if (rng_next(&s) % 30 == 0)
            fetcher_token_begin(g_f);
        const void *d;
        uint32_t    loan;
        int         rc = fetcher_acquire(g_f, l, x, (enum common_expert_part)p, &d, &loan);
        if (rc == COMMON_EAGAIN) {
            sched_yield();
            continue;
        }
        struct common_span sp;
        common_model_expert_span(&g_m, l, x, (enum common_expert_part)p, &sp);
        if (rc != COMMON_OK || memcmp(d, g_ref[(l * ne + x) * 3 + p], sp.size) != 0)
            atomic_fetch_add_explicit(&g_bad, 1, memory_order_relaxed);
        if (rc == COMMON_OK)
            fetcher_release(g_f, loan);
    }
    return NULL;
}

/* ---- front: asynchronous acquires from 4 threads, answered inline or on the I/O thread ------- */

static _Atomic uint64_t g_async_left; /* accepted and not yet answered: acq_rel, see async_cb */

/* Checks an answer and releases its loan; `arg` encodes the part's index in g_ref. */
static void async_cb(void *arg, int rc, const void *data, uint32_t loan)
{
    uint32_t           k = (uint32_t)(uintptr_t)arg;
    uint32_t           ne = g_m.hp.n_expert;
    struct common_span sp;
    common_model_expert_span(&g_m, k / 3 / ne, k / 3 % ne, (enum common_expert_part)(k % 3), &sp);
    if (rc == COMMON_OK) {
        if (memcmp(data, g_ref[k], sp.size) != 0)
            atomic_fetch_add_explicit(&g_bad, 1, memory_order_relaxed);
        fetcher_release(g_f, loan);
    } else if (rc != COMMON_EAGAIN && rc != COMMON_ECLOSED) {
        atomic_fetch_add_explicit(&g_bad, 1, memory_order_relaxed);
    }
    /* Release: this answer's reads and writes happen before the waiter sees the count drop;
     * pairs with the acquire load in async_phase(). */
    atomic_fetch_sub_explicit(&g_async_left, 1, memory_order_release);
}

static void *async_worker(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 15485863 + 5;
    uint32_t nl = g_m.hp.n_layer, ne = g_m.hp.n_expert;
    for (int i = 0; i < 300; i++) {
        uint32_t l = (uint32_t)(rng_next(&s) % nl), x = (uint32_t)(rng_next(&s) % ne);
        uint32_t p = (uint32_t)(rng_next(&s) % 3);
        if (rng_next(&s) % 6 == 0)
            fetcher_request(g_f, (l + 1) % nl, (x + 2) % ne, FETCHER_PRIO_PREFETCH);
        if (rng_next(&s) % 40 == 0)
            fetcher_token_begin(g_f);
        if (rng_next(&s) % 5 == 0) { /* a blocking acquire among the asynchronous ones */
            const void *d;
            uint32_t    loan;
            if (fetcher_acquire(g_f, l, x, (enum common_expert_part)p, &d, &loan) == COMMON_OK)
                fetcher_release(g_f, loan);
            continue;
        }
        uint32_t k = (l * ne + x) * 3 + p;
        atomic_fetch_add_explicit(&g_async_left, 1, memory_order_relaxed);
        if (fetcher_acquire_async(g_f, l, x, (enum common_expert_part)p, async_cb,
                                  (void *)(uintptr_t)k) != COMMON_OK) {
            atomic_fetch_add_explicit(&g_bad, 1, memory_order_relaxed);
            atomic_fetch_sub_explicit(&g_async_left, 1, memory_order_relaxed);
        }
    }
    return NULL;
}

/* Four threads of asynchronous (and some blocking) acquires on g_f; with `wait`, until every
 * one is answered, else the answers still due are left to fetcher_destroy(). */
static void async_phase(bool wait)
{
    atomic_store(&g_async_left, 0);
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, async_worker, (void *)(i + (wait ? 0 : 4)));
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    /* Acquire: pairs with the release decrement in async_cb(). */
    while (wait && atomic_load_explicit(&g_async_left, memory_order_acquire) > 0)
        sched_yield();
}

static void front_threads(const char *path, enum fetcher_io_mode mode, enum fetcher_policy pol)
{
    CHECK(common_gguf_open(path, NULL, &g_g, NULL) == COMMON_OK, "open");
    CHECK(common_model_init(&g_m, g_g, NULL) == COMMON_OK, "model");
    uint32_t n = g_m.hp.n_layer * g_m.hp.n_expert * 3;
    g_ref = calloc(n, sizeof(*g_ref));
    for (uint32_t i = 0; i < n; i++) {
        struct common_span sp;
        common_model_expert_span(&g_m, i / 3 / g_m.hp.n_expert, i / 3 % g_m.hp.n_expert,
                                 (enum common_expert_part)(i % 3), &sp);
        g_ref[i] = malloc(sp.size);
        common_gguf_read_span(g_g, &sp, g_ref[i], NULL);
    }
    struct fetcher_opts  o = {.io = mode, .policy = pol, .n_slots = 6, .queue_depth = 4};
    struct common_errmsg e = {{0}};
    int                  rc = fetcher_create(g_g, &g_m, &o, &g_f, &e);
    if (rc == COMMON_ENOTSUP) {
        printf("skip %s: %s\n", fetcher_io_mode_name(mode), e.text);
    } else {
        CHECK(rc == COMMON_OK, "fetcher_create: %s", e.text);
        atomic_store(&g_bad, 0);
        pthread_t th[4];
        for (uintptr_t i = 0; i < 4; i++)
            pthread_create(&th[i], NULL, front_worker, (void *)i);
        for (int i = 0; i < 4; i++)
            pthread_join(th[i], NULL);
        CHECK(atomic_load(&g_bad) == 0, "%s: %llu bad acquires", fetcher_io_mode_name(mode),
              (unsigned long long)atomic_load(&g_bad));
        struct fetcher_trace_totals t;
        fetcher_trace_totals(fetcher_get_trace(g_f), &t);
        CHECK(t.hits + t.misses == t.accesses, "trace totals add up");
        async_phase(true);
        CHECK(atomic_load(&g_bad) == 0, "%s: %llu bad async answers", fetcher_io_mode_name(mode),
              (unsigned long long)atomic_load(&g_bad));
        struct fetcher_pool_counts c;
        fetcher_get_pool_counts(g_f, &c);
        CHECK(c.n_pinned == 0, "%s: %u slots still pinned", fetcher_io_mode_name(mode), c.n_pinned);
        async_phase(false); /* then destroy with answers still due */
        fetcher_destroy(g_f);
        g_f = NULL;
        CHECK(atomic_load(&g_async_left) == 0, "%s: %llu async acquires never answered",
              fetcher_io_mode_name(mode), (unsigned long long)atomic_load(&g_async_left));
        CHECK(atomic_load(&g_bad) == 0, "%s: %llu bad async answers at destroy",
              fetcher_io_mode_name(mode), (unsigned long long)atomic_load(&g_bad));
    }
    for (uint32_t i = 0; i < n; i++)
        free(g_ref[i]);
    free(g_ref);
    common_model_fini(&g_m);
    common_gguf_close(g_g);
}

int main(void)
{
    pool_threads();
    char *path = fixture_path("moe-tiny/moe-tiny-q4_0.gguf");
    if (!path) {
        printf("skip front: fixture moe-tiny/moe-tiny-q4_0.gguf not found\n");
    } else {
        front_threads(path, FETCHER_IO_URING, FETCHER_POLICY_LRU);
        front_threads(path, FETCHER_IO_PREAD, FETCHER_POLICY_LFU);
        /* The same on the model as QSF: each bundle checked by the I/O thread after its read,
         * outside the fetcher's lock, while the workers acquire. */
        char               *dir = fixture_tmpdir(), qsf[4096];
        struct common_gguf *g = NULL;
        struct common_model m;
        snprintf(qsf, sizeof(qsf), "%s/m.qsf", dir);
        CHECK(common_gguf_open(path, NULL, &g, NULL) == COMMON_OK, "open");
        CHECK(common_model_init(&m, g, NULL) == COMMON_OK, "model");
        struct common_qsf_stats st;
        CHECK(common_qsf_convert(g, &m, qsf, NULL, &st, NULL) == COMMON_OK, "convert");
        common_model_fini(&m);
        common_gguf_close(g);
        front_threads(qsf, FETCHER_IO_URING, FETCHER_POLICY_LRU);
        fixture_rmtree(dir);
        free(dir);
        free(path);
    }
    return check_report();
}
