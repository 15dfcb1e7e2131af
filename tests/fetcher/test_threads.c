/* tests/fetcher/test_threads.c - many threads acquiring and releasing the pool and the front. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "pool.h"

#define POOL_THREADS 8
#define POOL_ITERS   4000
#define POOL_SLOTS   6
#define POOL_KEYS    16

static struct fetcher_pool *t_pool;
static _Atomic uint64_t     t_bad;   /* relaxed counter: checked after join */
static _Atomic uint64_t     t_loads; /* relaxed counter: checked after join */

static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Each thread acquires random keys; a miss claims a slot, fills it with the key's pattern and
 * completes it; every pinned slot must hold its key's pattern until released. */
static void *pool_worker(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 7919 + 1;
    for (int i = 0; i < POOL_ITERS; i++) {
        uint32_t                k = (uint32_t)(rng_next(&s) % POOL_KEYS);
        struct common_pool_key  key = {k / 8, k % 8, COMMON_POOL_BUNDLE};
        uint32_t                part = (uint32_t)(rng_next(&s) % 3);
        struct common_pool_loan l;
        int                     rc = fetcher_pool_try_acquire(t_pool, &key, part, &l);
        if (rc == COMMON_ENOENT) {
            uint32_t slot, gen;
            rc = fetcher_pool_claim(t_pool, &key, 0, 0, &slot, &gen, NULL);
            if (rc == COMMON_OK) {
                uint8_t *d = fetcher_pool_slot_data(t_pool, slot);
                for (uint32_t p = 0; p < 3; p++) {
                    memset(d + p * FETCHER_ALIGN, (int)(k * 3 + p), FETCHER_ALIGN);
                    fetcher_pool_set_part(t_pool, slot, p, p * FETCHER_ALIGN, FETCHER_ALIGN);
                    fetcher_pool_part_ready(t_pool, slot, p);
                }
                fetcher_pool_complete(t_pool, slot);
                atomic_fetch_add_explicit(&t_loads, 1, memory_order_relaxed);
            }
            if (rc == COMMON_EAGAIN)
                sched_yield();
            i--;
            continue;
        }
        if (rc == COMMON_EAGAIN) {
            rc = fetcher_pool_wait_acquire(t_pool, l.slot, l.gen, part, &l);
            if (rc != COMMON_OK) {
                i--;
                continue;
            }
        }
        const uint8_t *b = l.data;
        if (l.size != FETCHER_ALIGN || b[0] != (uint8_t)(k * 3 + part) ||
            b[FETCHER_ALIGN - 1] != (uint8_t)(k * 3 + part))
            atomic_fetch_add_explicit(&t_bad, 1, memory_order_relaxed);
        if (!fetcher_pool_loan_is_valid(t_pool, &l))
            atomic_fetch_add_explicit(&t_bad, 1, memory_order_relaxed);
        if (rng_next(&s) % 4 == 0)
            sched_yield(); /* hold the pin a little */
        fetcher_pool_release(t_pool, l.slot);
    }
    return NULL;
}

Test(fetcher_threads, pool_concurrent_acquire_release, .timeout = 120)
{
    struct fetcher_pool_opts o = {
        .slot_bytes = 3 * FETCHER_ALIGN, .n_slots = POOL_SLOTS, .n_layer = 2, .n_expert = 8};
    cr_assert_eq(fetcher_pool_create(&o, &t_pool, NULL), COMMON_OK);
    pthread_t th[POOL_THREADS];
    for (uintptr_t i = 0; i < POOL_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, pool_worker, (void *)i), 0);
    for (int i = 0; i < POOL_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&t_bad), 0, "a pinned slot changed under its reader");
    cr_assert_gt(atomic_load(&t_loads), POOL_KEYS, "keys were evicted and loaded again");
    struct fetcher_pool_counts c;
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_pinned, 0);
    cr_assert_eq(c.n_loading, 0);
    fetcher_pool_destroy(t_pool);
}

/* ---- the front ---------------------------------------------------------------------------- */

#define FRONT_THREADS 4
#define FRONT_ITERS   300

static struct common_gguf *t_g;
static struct common_model t_m;
static struct fetcher     *t_f;
static uint8_t **t_ref; /* per (layer, expert, part): the bytes from common_gguf_read_span */

static void *front_worker(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg * 104729 + 3;
    uint32_t nl = t_m.hp.n_layer, ne = t_m.hp.n_expert;
    for (int i = 0; i < FRONT_ITERS; i++) {
        uint32_t l = (uint32_t)(rng_next(&s) % nl), x = (uint32_t)(rng_next(&s) % ne);
        uint32_t p = (uint32_t)(rng_next(&s) % 3);
        if (rng_next(&s) % 5 == 0)
            fetcher_request(t_f, (l + 1) % nl, (x + 1) % ne, FETCHER_PRIO_PREFETCH);
        if (rng_next(&s) % 50 == 0)
            fetcher_token_begin(t_f);
        const void *d;
        uint32_t    loan;
        int         rc = fetcher_acquire(t_f, l, x, (enum common_expert_part)p, &d, &loan);
        if (rc == COMMON_EAGAIN) {
            sched_yield();
            continue;
        }
        if (rc != COMMON_OK) {
            atomic_fetch_add_explicit(&t_bad, 1, memory_order_relaxed);
            continue;
        }
        struct common_span sp;
        common_model_expert_span(&t_m, l, x, (enum common_expert_part)p, &sp);
        if (memcmp(d, t_ref[(l * ne + x) * 3 + p], sp.size) != 0)
            atomic_fetch_add_explicit(&t_bad, 1, memory_order_relaxed);
        fetcher_release(t_f, loan);
    }
    return NULL;
}

static void front_case(enum fetcher_io_mode mode, enum fetcher_policy policy)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);
    free(path);
    uint32_t n = t_m.hp.n_layer * t_m.hp.n_expert * 3;
    t_ref = calloc(n, sizeof(*t_ref));
    for (uint32_t i = 0; i < n; i++) {
        struct common_span sp;
        common_model_expert_span(&t_m, i / 3 / t_m.hp.n_expert, i / 3 % t_m.hp.n_expert,
                                 (enum common_expert_part)(i % 3), &sp);
        t_ref[i] = malloc(sp.size);
        cr_assert_eq(common_gguf_read_span(t_g, &sp, t_ref[i], NULL), COMMON_OK);
    }
    struct common_errmsg e = {{0}};
    struct fetcher_opts  o = {.io = mode, .policy = policy, .n_slots = 6, .queue_depth = 8};
    int                  rc = fetcher_create(t_g, &t_m, &o, &t_f, &e);
    if (rc == COMMON_ENOTSUP)
        cr_skip_test("io_uring unavailable: %s", e.text);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    atomic_store(&t_bad, 0);
    pthread_t th[FRONT_THREADS];
    for (uintptr_t i = 0; i < FRONT_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, front_worker, (void *)i), 0);
    for (int i = 0; i < FRONT_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&t_bad), 0, "wrong bytes or failed acquires");
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_pinned, 0);
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    cr_assert_eq(s.hits + s.misses, s.accesses);
    cr_assert_eq(s.load_errors, 0);
    cr_assert_geq(s.belady_hits, s.hits - s.prefetch_hits,
                  "the optimum never loses to LRU without prefetch help");
    fetcher_destroy(t_f);
    t_f = NULL;
    for (uint32_t i = 0; i < n; i++)
        free(t_ref[i]);
    free(t_ref);
    common_model_fini(&t_m);
    common_gguf_close(t_g);
}

Test(fetcher_threads, front_uring_concurrent_acquire_release, .timeout = 120)
{
    front_case(FETCHER_IO_URING, FETCHER_POLICY_LRU);
}

Test(fetcher_threads, front_pread_concurrent_acquire_release, .timeout = 120)
{
    front_case(FETCHER_IO_PREAD, FETCHER_POLICY_LFU);
}
