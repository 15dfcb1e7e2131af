/* tests/executor/test_threadpool.c - the thread pool: every item once, wake-ups after sleeping. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "executor.h"

struct pool_count {
    _Atomic uint32_t *hits;   /* one counter per item */
    _Atomic uint32_t  max_th; /* largest thread index seen + 1 */
    int64_t           chunk;  /* expected largest piece */
    _Atomic bool      too_big;
};

static void count_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    struct pool_count *c = arg;
    if (c->chunk > 0 && i1 - i0 > c->chunk)
        atomic_store(&c->too_big, true);
    for (int64_t i = i0; i < i1; i++)
        atomic_fetch_add(&c->hits[i], 1);
    uint32_t seen = atomic_load(&c->max_th);
    while (ith + 1 > seen && !atomic_compare_exchange_weak(&c->max_th, &seen, ith + 1))
        ;
}

static void run_and_check(struct executor_threadpool *p, int64_t n, int64_t chunk)
{
    struct pool_count c = {.hits = calloc((size_t)n + 1, sizeof(*c.hits)), .chunk = chunk};
    executor_threadpool_for(p, n, chunk, count_piece, &c);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(atomic_load(&c.hits[i]), 1, "item %lld ran %u times", (long long)i,
                     atomic_load(&c.hits[i]));
    cr_assert_leq(atomic_load(&c.max_th), executor_threadpool_n_threads(p));
    cr_assert(!atomic_load(&c.too_big), "a piece was larger than the chunk");
    free(c.hits);
}

Test(executor_threadpool, covers_every_item_once, .timeout = 60)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(4, &p), 0);
    cr_assert_eq(executor_threadpool_n_threads(p), 4);
    for (int64_t n = 1; n < 300; n += 7)
        for (int64_t chunk = 0; chunk < 9; chunk += 4)
            run_and_check(p, n, chunk);
    executor_threadpool_destroy(p);
}

Test(executor_threadpool, many_small_jobs_back_to_back, .timeout = 60)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(3, &p), 0);
    for (int i = 0; i < 2000; i++)
        run_and_check(p, 16, 1);
    executor_threadpool_destroy(p);
}

Test(executor_threadpool, wakes_sleeping_workers, .timeout = 60)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(2, &p), 0);
    for (int i = 0; i < 5; i++) {
        /* Longer than the spin window, so the workers are asleep on the condition variable. */
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
        run_and_check(p, 64, 1);
    }
    executor_threadpool_destroy(p);
}

Test(executor_threadpool, null_and_single_thread_pools_run_inline)
{
    run_and_check(NULL, 10, 3);
    cr_assert_eq(executor_threadpool_n_threads(NULL), 1);
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(1, &p), 0);
    run_and_check(p, 10, 3);
    executor_threadpool_destroy(p);
    executor_threadpool_destroy(NULL);
}

Test(executor_threadpool, create_rejects_too_many_threads)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(100000, &p), COMMON_EINVAL);
    cr_assert_null(p);
    cr_assert_geq(executor_physical_cores(), 1);
}

Test(executor_threadpool, default_is_physical_cores)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(0, &p), 0);
    cr_assert_eq(executor_threadpool_n_threads(p), executor_physical_cores());
    executor_threadpool_destroy(p);
}

Test(executor_threadpool, membw_probe_reports_a_rate, .timeout = 60)
{
    struct executor_threadpool *p = NULL;
    cr_assert_eq(executor_threadpool_create(2, &p), 0);
    double bw = 0;
    cr_assert_eq(executor_membw_measure(
                     &(struct executor_membw_opts){.bytes = 8u << 20, .reps = 2, .pool = p}, &bw),
                 0);
    cr_assert_gt(bw, 1e8, "implausible bandwidth %g B/s", bw);
    executor_threadpool_destroy(p);
}
