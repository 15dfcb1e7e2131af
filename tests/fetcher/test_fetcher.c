/* tests/fetcher/test_fetcher.c - the front: loans match the file, eviction, budget, read errors,
 * asynchronous acquires. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fetcher.h"
#include "fixture.h"

static struct common_gguf *t_g;
static struct common_model t_m;
static struct fetcher     *t_f;
static char               *t_dir;

#define OPEN_MODEL()                                                                               \
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");                                          \
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);                             \
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);                                   \
    free(path)

static void teardown(void)
{
    fetcher_destroy(t_f);
    t_f = NULL;
    common_model_fini(&t_m);
    common_gguf_close(t_g);
    t_g = NULL;
    if (t_dir) {
        fixture_rmtree(t_dir);
        free(t_dir);
        t_dir = NULL;
    }
}

static struct fetcher *make(const struct fetcher_opts *o)
{
    struct fetcher      *f = NULL;
    struct common_errmsg e = {{0}};
    int                  rc = fetcher_create(t_g, &t_m, o, &f, &e);
    if (rc == COMMON_ENOTSUP && o->io == FETCHER_IO_URING)
        cr_skip_test("io_uring unavailable: %s", e.text);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    return f;
}

/* Acquires every part of every expert (token by token, layer order) and compares the bytes. */
static void sweep_and_compare(struct fetcher *f)
{
    uint8_t *ref = malloc(t_m.bytes_expert_bundle);
    for (uint32_t l = 0; l < t_m.hp.n_layer; l++)
        for (uint32_t x = 0; x < t_m.hp.n_expert; x++)
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                const void *data = NULL;
                uint32_t    loan = 0;
                cr_assert_eq(fetcher_acquire(f, l, x, (enum common_expert_part)p, &data, &loan),
                             COMMON_OK, "acquire (%u,%u,%d)", l, x, p);
                struct common_span s;
                cr_assert_eq(common_model_expert_span(&t_m, l, x, (enum common_expert_part)p, &s),
                             COMMON_OK);
                cr_assert_eq(common_gguf_read_span(t_g, &s, ref, NULL), COMMON_OK);
                cr_assert_eq(memcmp(data, ref, s.size), 0, "bytes of (%u,%u,%d)", l, x, p);
                fetcher_release(f, loan);
            }
    free(ref);
}

static void sweep_case(enum fetcher_io_mode mode, enum fetcher_direct direct)
{
    t_f = make(&(struct fetcher_opts){.io = mode, .direct = direct, .n_slots = 4});
    cr_assert_eq(fetcher_get_io_mode(t_f), mode);
    sweep_and_compare(t_f);
    sweep_and_compare(t_f); /* second pass: everything was evicted again (4 slots, 32 bundles) */
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    uint64_t n = 2ull * t_m.hp.n_layer * t_m.hp.n_expert;
    cr_assert_eq(s.accesses, n, "one access per bundle per token (got %llu)",
                 (unsigned long long)s.accesses);
    cr_assert_eq(s.tokens, 2, "a lower layer after a higher one starts a token");
    if (mode != FETCHER_IO_MMAP) {
        cr_assert_eq(s.misses, n, "a 4-slot pool cannot hold a sweep");
        cr_assert_eq(s.loads, n);
        cr_assert_geq(s.bytes_read, n * (t_m.bytes_expert_bundle / 3 * 3) / 2);
        struct fetcher_pool_counts c;
        fetcher_get_pool_counts(t_f, &c);
        cr_assert_eq(c.n_slots, 4);
        cr_assert_eq(c.n_pinned, 0);
        cr_assert_eq(c.n_ready, 4);
    }
}

Test(fetcher_front, uring_sweep_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    sweep_case(FETCHER_IO_URING, FETCHER_DIRECT_AUTO);
}

Test(fetcher_front, uring_buffered_sweep_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    sweep_case(FETCHER_IO_URING, FETCHER_DIRECT_OFF);
}

Test(fetcher_front, pread_sweep_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    sweep_case(FETCHER_IO_PREAD, FETCHER_DIRECT_AUTO);
}

Test(fetcher_front, mmap_sweep_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    sweep_case(FETCHER_IO_MMAP, FETCHER_DIRECT_AUTO);
}

Test(fetcher_front, queue_depth_one_works, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .queue_depth = 1, .n_slots = 5});
    sweep_and_compare(t_f);
}

Test(fetcher_front, bad_ids_are_invalid, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 4});
    const void *data = NULL;
    uint32_t    loan = 0;
    cr_assert_eq(fetcher_acquire(t_f, t_m.hp.n_layer, 0, COMMON_EXPERT_GATE, &data, &loan),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_acquire(t_f, 0, t_m.hp.n_expert, COMMON_EXPERT_GATE, &data, &loan),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_acquire(t_f, 0, 0, COMMON_EXPERT_PART_COUNT, &data, &loan), COMMON_EINVAL);
    cr_assert_eq(fetcher_request(t_f, 0, 99, FETCHER_PRIO_DEMAND), COMMON_EINVAL);
    cr_assert_null(data);
}

Test(fetcher_front, every_slot_pinned_gives_eagain, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 2});
    const void *d[3] = {0};
    uint32_t    l[3] = {0};
    cr_assert_eq(fetcher_acquire(t_f, 0, 0, COMMON_EXPERT_GATE, &d[0], &l[0]), COMMON_OK);
    cr_assert_eq(fetcher_acquire(t_f, 0, 1, COMMON_EXPERT_UP, &d[1], &l[1]), COMMON_OK);
    cr_assert_eq(fetcher_acquire(t_f, 0, 2, COMMON_EXPERT_GATE, &d[2], &l[2]), COMMON_EAGAIN);
    cr_assert_eq(fetcher_request(t_f, 0, 2, FETCHER_PRIO_PREFETCH), COMMON_EAGAIN);
    fetcher_release(t_f, l[0]);
    cr_assert_eq(fetcher_acquire(t_f, 0, 2, COMMON_EXPERT_GATE, &d[2], &l[2]), COMMON_OK);
    fetcher_release(t_f, l[1]);
    fetcher_release(t_f, l[2]);
}

static void wait_idle(struct fetcher *f)
{
    struct fetcher_pool_counts c;
    do {
        usleep(1000);
        fetcher_get_pool_counts(f, &c);
    } while (c.n_loading > 0);
}

Test(fetcher_front, prefetch_then_acquire_is_a_prefetch_hit, .fini = teardown, .timeout = 30)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 8});
    fetcher_token_begin(t_f);
    cr_assert_eq(fetcher_request(t_f, 2, 5, FETCHER_PRIO_PREFETCH), COMMON_OK);
    wait_idle(t_f);
    const void *d;
    uint32_t    l;
    cr_assert_eq(fetcher_acquire(t_f, 2, 5, COMMON_EXPERT_DOWN, &d, &l), COMMON_OK);
    fetcher_release(t_f, l);
    cr_assert_eq(fetcher_acquire(t_f, 2, 5, COMMON_EXPERT_GATE, &d, &l), COMMON_OK);
    fetcher_release(t_f, l);
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    cr_assert_eq(s.prefetch_issued, 1);
    cr_assert_eq(s.accesses, 1, "two parts of one bundle in one token: one access");
    cr_assert_eq(s.hits, 1);
    cr_assert_eq(s.prefetch_hits, 1);
    cr_assert_eq(s.misses, 0);
}

Test(fetcher_front, unused_prefetch_counts_as_wasted, .fini = teardown, .timeout = 30)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 4});
    fetcher_token_begin(t_f);
    cr_assert_eq(fetcher_request(t_f, 1, 1, FETCHER_PRIO_PREFETCH), COMMON_OK);
    wait_idle(t_f);
    fetcher_token_begin(t_f);
    for (uint32_t x = 2; x < 6; x++) { /* four demands through four slots evict it */
        cr_assert_eq(fetcher_request(t_f, 3, x, FETCHER_PRIO_DEMAND), COMMON_OK);
        wait_idle(t_f);
    }
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    cr_assert_eq(s.prefetch_wasted, 1);
    cr_assert_eq(s.misses, 4);
    cr_assert_eq(s.evictions, 1);
}

Test(fetcher_front, demand_request_then_acquire, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_AUTO, .n_slots = 6});
    for (uint32_t x = 0; x < 3; x++)
        cr_assert_eq(fetcher_request(t_f, 0, x, FETCHER_PRIO_POSTFETCH), COMMON_OK);
    for (uint32_t x = 0; x < 3; x++)
        cr_assert_eq(fetcher_request(t_f, 1, x, FETCHER_PRIO_PREFETCH), COMMON_OK);
    const void *d;
    uint32_t    l;
    for (uint32_t x = 0; x < 3; x++) {
        cr_assert_eq(fetcher_acquire(t_f, 0, x, COMMON_EXPERT_DOWN, &d, &l), COMMON_OK);
        fetcher_release(t_f, l);
    }
    for (uint32_t x = 0; x < 3; x++) {
        cr_assert_eq(fetcher_acquire(t_f, 1, x, COMMON_EXPERT_UP, &d, &l), COMMON_OK);
        fetcher_release(t_f, l);
    }
}

Test(fetcher_front, destroy_with_queued_prefetches, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_AUTO, .n_slots = 32, .queue_depth = 2});
    for (uint32_t l = 0; l < t_m.hp.n_layer; l++)
        for (uint32_t x = 0; x < t_m.hp.n_expert; x++)
            fetcher_request(t_f, l, x, FETCHER_PRIO_PREFETCH);
    fetcher_destroy(t_f);
    t_f = NULL;
}

Test(fetcher_front, budget_sizes_the_pool, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .ram_budget = 1ull << 30});
    const struct fetcher_plan *p = fetcher_get_plan(t_f);
    cr_assert_eq(p->n_slots, t_m.hp.n_layer * t_m.hp.n_expert);
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_slots, p->n_slots);
    cr_assert_eq(c.slot_bytes, p->slot_bytes);
}

Test(fetcher_front, budget_too_small_is_refused, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher      *f = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(fetcher_create(t_g, &t_m, &(struct fetcher_opts){.ram_budget = 1 << 20}, &f, &e),
                 COMMON_ERANGE);
    cr_assert_null(f);
    cr_assert(strstr(e.text, "minimum"), "%s", e.text);
}

/* Copies the moe-tiny q4_0 fixture to `name` in a fresh t_dir (flushed to disk, so its pages can
 * be dropped from the page cache) and opens the copy as t_g / t_m; `path` gets its path. */
static void open_copy(const char *name, char *path, size_t path_len)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-q4_0.gguf");
    size_t len = 0;
    char  *data = fixture_read_all(src, &len);
    cr_assert_not_null(data);
    free(src);
    t_dir = fixture_tmpdir();
    snprintf(path, path_len, "%s/%s", t_dir, name);
    FILE *out = fopen(path, "wb");
    cr_assert_not_null(out);
    cr_assert_eq(fwrite(data, 1, len, out), len);
    cr_assert_eq(fflush(out), 0);
    cr_assert_eq(fsync(fileno(out)), 0);
    fclose(out);
    free(data);
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);
}

/* A model file truncated after it was opened: the expert past the new end fails with a message
 * naming the file, and its slot goes back to FREE; the rest keeps working. */
static void truncated_case(enum fetcher_io_mode mode)
{
    char path[1024];
    open_copy("cut.gguf", path, sizeof(path));
    t_f = make(&(struct fetcher_opts){.io = mode, .n_slots = 4});

    uint32_t           last = t_m.hp.n_layer - 1;
    struct common_span s;
    cr_assert_eq(common_model_expert_span(&t_m, last, 7, COMMON_EXPERT_DOWN, &s), COMMON_OK);
    uint64_t cut = s.offset + s.size / 2;
    cr_assert_eq(truncate(path, (off_t)cut), 0);

    const void *d = NULL;
    uint32_t    l = 0;
    cr_assert_eq(fetcher_acquire(t_f, last, 7, COMMON_EXPERT_DOWN, &d, &l), COMMON_EIO);
    cr_assert_null(d, "no bytes are lent on failure");
    struct common_errmsg e;
    fetcher_last_error(t_f, &e);
    cr_assert(strstr(e.text, path), "message names the file: %s", e.text);
    cr_assert(strstr(e.text, "offset"), "%s", e.text);
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_free, c.n_slots, "the failed slot is FREE again");
    cr_assert_eq(c.n_loading + c.n_ready + c.n_failed, 0);
    struct fetcher_trace_totals t;
    fetcher_trace_totals(fetcher_get_trace(t_f), &t);
    cr_assert_eq(t.load_errors, 1);

    cr_assert_eq(fetcher_acquire(t_f, 0, 0, COMMON_EXPERT_GATE, &d, &l), COMMON_OK);
    fetcher_release(t_f, l);
}

Test(fetcher_front, uring_truncated_file_fails_cleanly, .fini = teardown)
{
    truncated_case(FETCHER_IO_URING);
}

Test(fetcher_front, pread_truncated_file_fails_cleanly, .fini = teardown)
{
    truncated_case(FETCHER_IO_PREAD);
}

/* Pages of bundle (l, x) in the page cache, seen through `map` (the whole file mapped); the
 * bundle's page count in *total. */
static uint64_t bundle_cached_pages(uint8_t *map, uint32_t l, uint32_t x, uint64_t *total)
{
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t       in = 0;
    *total = 0;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        struct common_span sp;
        cr_assert_eq(common_model_expert_span(&t_m, l, x, (enum common_expert_part)p, &sp),
                     COMMON_OK);
        uint64_t       a = sp.offset / page * page, n = (sp.offset + sp.size - a + page - 1) / page;
        unsigned char *v = malloc(n);
        cr_assert_not_null(v);
        cr_assert_eq(mincore(map + a, n * page, v), 0);
        for (uint64_t i = 0; i < n; i++)
            in += v[i] & 1;
        *total += n;
        free(v);
    }
    return in;
}

/* io mmap: a request reads nothing ahead unless mmap_advise is on (then the bundle comes into the
 * page cache without being touched); plain mmap is the llama.cpp baseline, pages come in at use. */
Test(fetcher_front, mmap_requests_read_ahead_only_when_advised, .fini = teardown, .timeout = 60)
{
    char path[1024];
    open_copy("advise.gguf", path, sizeof(path));
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    uint8_t *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    const uint32_t l = t_m.hp.n_layer - 1, x = t_m.hp.n_expert - 1;
    uint64_t       total = 0;
    for (int advise = 0; advise <= 1; advise++) {
        cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        if (bundle_cached_pages(map, l, x, &total) != 0) {
            munmap(map, (size_t)st.st_size);
            close(fd);
            cr_skip_test("the page cache of %s cannot be dropped here (tmpfs?)", path);
        }
        t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_MMAP, .mmap_advise = advise});
        cr_assert_eq(fetcher_request(t_f, l, x, FETCHER_PRIO_POSTFETCH), COMMON_OK);
        uint64_t in = 0;
        for (int ms = 0; in < total;
             ms += 10) { /* advised: until it is all in (the timeout bounds it) */
            usleep(10000);
            in = bundle_cached_pages(map, l, x, &total);
            if (!advise && ms >= 200)
                break;
        }
        if (advise)
            cr_assert_eq(in, total, "advised: %llu of %llu pages cached", (unsigned long long)in,
                         (unsigned long long)total);
        else
            cr_assert_eq(in, 0, "plain: %llu of %llu pages read ahead", (unsigned long long)in,
                         (unsigned long long)total);
        const void *d = NULL;
        uint32_t    loan = 0;
        cr_assert_eq(fetcher_acquire(t_f, l, x, COMMON_EXPERT_DOWN, &d, &loan), COMMON_OK);
        fetcher_release(t_f, loan);
        fetcher_destroy(t_f);
        t_f = NULL;
    }
    munmap(map, (size_t)st.st_size);
    close(fd);
}

Test(fetcher_front, option_names_parse)
{
    enum fetcher_policy  p;
    enum fetcher_io_mode m;
    cr_assert_eq(fetcher_policy_parse("LFU", &p), COMMON_OK);
    cr_assert_eq(p, FETCHER_POLICY_LFU);
    cr_assert_eq(fetcher_policy_parse("mru", &p), COMMON_EINVAL);
    cr_assert_eq(fetcher_io_mode_parse("io_uring", &m), COMMON_OK);
    cr_assert_eq(m, FETCHER_IO_URING);
    cr_assert_eq(fetcher_io_mode_parse("mmap", &m), COMMON_OK);
    cr_assert_str_eq(fetcher_io_mode_name(m), "mmap");
    cr_assert_str_eq(fetcher_priority_name(FETCHER_PRIO_POSTFETCH), "postfetch");
}

/* ---- asynchronous acquires ---------------------------------------------------------------- */

/* One fetcher_acquire_async() call and what its callback saw (under t_amu). */
struct async_req {
    int         calls;   /* callbacks so far: must end at exactly one */
    int         rc;      /* the outcome */
    const void *data;    /* the part's bytes when rc is 0 */
    uint32_t    loan;    /* the loan when rc is 0 */
    pthread_t   thread;  /* where the callback ran */
    uint32_t    release; /* a loan the callback releases first (FETCHER_LOAN_NONE: none) */
};

static pthread_mutex_t t_amu = PTHREAD_MUTEX_INITIALIZER; /* guards every async_req */
static pthread_cond_t  t_acv = PTHREAD_COND_INITIALIZER;  /* a callback ran */

/* Gate of the stuck callback (async_stuck_cb): the I/O thread waits in it until t_unstick. */
static bool t_stuck, t_unstick; /* under t_amu */

static void async_cb(void *arg, int rc, const void *data, uint32_t loan)
{
    struct async_req *r = arg;
    if (r->release != FETCHER_LOAN_NONE)
        fetcher_release(t_f, r->release);
    pthread_mutex_lock(&t_amu);
    r->calls++;
    r->rc = rc;
    r->data = data;
    r->loan = loan;
    r->thread = pthread_self();
    pthread_cond_broadcast(&t_acv);
    pthread_mutex_unlock(&t_amu);
}

/* A callback that holds the I/O thread until the test lets it go: while it waits, no read
 * completes and no queued load is submitted, so the test can set up a pool state for certain.
 * (Real callbacks must not block.) */
static void async_stuck_cb(void *arg, int rc, const void *data, uint32_t loan)
{
    async_cb(arg, rc, data, loan);
    pthread_mutex_lock(&t_amu);
    t_stuck = true;
    pthread_cond_broadcast(&t_acv);
    while (!t_unstick)
        pthread_cond_wait(&t_acv, &t_amu);
    pthread_mutex_unlock(&t_amu);
}

static int async_calls(struct async_req *r)
{
    pthread_mutex_lock(&t_amu);
    int n = r->calls;
    pthread_mutex_unlock(&t_amu);
    return n;
}

/* Waits (bounded by the test's .timeout) for r's callback. */
static void async_wait(struct async_req *r)
{
    pthread_mutex_lock(&t_amu);
    while (r->calls == 0)
        pthread_cond_wait(&t_acv, &t_amu);
    pthread_mutex_unlock(&t_amu);
}

static struct async_req *async_start(struct async_req *r, uint32_t l, uint32_t x, int part,
                                     fetcher_acquire_cb cb)
{
    *r = (struct async_req){.loan = FETCHER_LOAN_NONE, .release = FETCHER_LOAN_NONE};
    cr_assert_eq(fetcher_acquire_async(t_f, l, x, (enum common_expert_part)part, cb, r), COMMON_OK,
                 "acquire_async (%u,%u,%d)", l, x, part);
    return r;
}

static bool part_matches(uint32_t l, uint32_t x, int part, const void *data)
{
    struct common_span s;
    cr_assert_eq(common_model_expert_span(&t_m, l, x, (enum common_expert_part)part, &s),
                 COMMON_OK);
    uint8_t *ref = malloc(s.size);
    cr_assert_not_null(ref);
    cr_assert_eq(common_gguf_read_span(t_g, &s, ref, NULL), COMMON_OK);
    bool ok = memcmp(data, ref, s.size) == 0;
    free(ref);
    return ok;
}

/* Waits (bounded by the test's .timeout) until a failed load has left a FAILED slot behind. */
static void wait_failed_slot(void)
{
    struct fetcher_pool_counts c;
    for (fetcher_get_pool_counts(t_f, &c); c.n_failed == 0; fetcher_get_pool_counts(t_f, &c))
        usleep(1000);
}

Test(fetcher_front, acquire_async_ready_part_calls_back_inline, .fini = teardown, .timeout = 60)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 4});
    const void *d = NULL;
    uint32_t    loan = 0;
    cr_assert_eq(fetcher_acquire(t_f, 1, 2, COMMON_EXPERT_UP, &d, &loan), COMMON_OK);
    while (!fetcher_is_ready(t_f, 1, 2)) /* down may still be in flight */
        usleep(1000);
    struct async_req r;
    async_start(&r, 1, 2, COMMON_EXPERT_DOWN, async_cb);
    cr_assert_eq(async_calls(&r), 1, "a readable part is answered before the call returns");
    cr_assert(pthread_equal(r.thread, pthread_self()), "on the caller's thread");
    cr_assert_eq(r.rc, COMMON_OK);
    cr_assert_eq(r.loan, loan, "the same slot");
    cr_assert(part_matches(1, 2, COMMON_EXPERT_DOWN, r.data));
    fetcher_release(t_f, r.loan);
    fetcher_release(t_f, loan);
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_pinned, 0);
}

static void cold_case(enum fetcher_io_mode mode)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = mode, .n_slots = 4});
    for (uint32_t x = 0; x < t_m.hp.n_expert; x++)
        for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            struct async_req r;
            async_start(&r, x % t_m.hp.n_layer, x, p, async_cb);
            async_wait(&r);
            cr_assert_eq(async_calls(&r), 1);
            cr_assert_eq(r.rc, COMMON_OK, "(%u,%d): %d", x, p, r.rc);
            if (p == 0)
                cr_assert_not(pthread_equal(r.thread, pthread_self()),
                              "a cold part is answered by the I/O thread");
            cr_assert(part_matches(x % t_m.hp.n_layer, x, p, r.data), "bytes of (%u,%d)", x, p);
            fetcher_release(t_f, r.loan);
        }
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    cr_assert_eq(s.loads, t_m.hp.n_expert, "one load per bundle");
    cr_assert_eq(s.misses, t_m.hp.n_expert, "each first access is a miss");
}

Test(fetcher_front, acquire_async_cold_part_calls_back_with_the_file_bytes, .fini = teardown,
     .timeout = 60)
{
    cold_case(FETCHER_IO_PREAD);
}

Test(fetcher_front, acquire_async_uring_cold_part_calls_back_with_the_file_bytes, .fini = teardown,
     .timeout = 60)
{
    cold_case(FETCHER_IO_URING);
}

#define ASYNC_THREADS 4
#define ASYNC_CALLS   64

static struct async_req t_many[ASYNC_THREADS][ASYNC_CALLS];   /* under t_amu once started */
static uint8_t         *t_many_ref[COMMON_EXPERT_PART_COUNT]; /* bytes of expert (2, 5) */
static _Atomic int      t_many_bad;                           /* relaxed: read after the wait */

/* Checks the bytes and releases the loan at once, on whichever thread answers. */
static void many_cb(void *arg, int rc, const void *data, uint32_t loan)
{
    struct async_req  *r = arg;
    int                part = (int)((r - &t_many[0][0]) % COMMON_EXPERT_PART_COUNT);
    struct common_span s;
    common_model_expert_span(&t_m, 2, 5, (enum common_expert_part)part, &s);
    if (rc != COMMON_OK || memcmp(data, t_many_ref[part], s.size) != 0)
        atomic_fetch_add_explicit(&t_many_bad, 1, memory_order_relaxed);
    if (rc == COMMON_OK)
        fetcher_release(t_f, loan);
    async_cb(arg, rc, NULL, FETCHER_LOAN_NONE);
}

static void *many_thread(void *arg)
{
    struct async_req *row = arg;
    for (int i = 0; i < ASYNC_CALLS; i++) {
        int part = (int)((&row[i] - &t_many[0][0]) % COMMON_EXPERT_PART_COUNT);
        row[i] = (struct async_req){.loan = FETCHER_LOAN_NONE, .release = FETCHER_LOAN_NONE};
        if (fetcher_acquire_async(t_f, 2, 5, (enum common_expert_part)part, many_cb, &row[i]) !=
            COMMON_OK)
            atomic_fetch_add_explicit(&t_many_bad, 1, memory_order_relaxed);
    }
    return NULL;
}

Test(fetcher_front, acquire_async_same_expert_from_threads_calls_back_once_each, .fini = teardown,
     .timeout = 60)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_AUTO, .n_slots = 2});
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        struct common_span s;
        cr_assert_eq(common_model_expert_span(&t_m, 2, 5, (enum common_expert_part)p, &s),
                     COMMON_OK);
        t_many_ref[p] = malloc(s.size);
        cr_assert_eq(common_gguf_read_span(t_g, &s, t_many_ref[p], NULL), COMMON_OK);
    }
    atomic_store(&t_many_bad, 0);
    pthread_t th[ASYNC_THREADS];
    for (int i = 0; i < ASYNC_THREADS; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, many_thread, t_many[i]), 0);
    for (int i = 0; i < ASYNC_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < ASYNC_THREADS; i++)
        for (int j = 0; j < ASYNC_CALLS; j++)
            async_wait(&t_many[i][j]);
    for (int i = 0; i < ASYNC_THREADS; i++)
        for (int j = 0; j < ASYNC_CALLS; j++)
            cr_assert_eq(async_calls(&t_many[i][j]), 1, "request %d/%d: %d callbacks", i, j,
                         async_calls(&t_many[i][j]));
    cr_assert_eq(atomic_load(&t_many_bad), 0, "bad answers");
    struct fetcher_trace_totals s;
    fetcher_trace_totals(fetcher_get_trace(t_f), &s);
    cr_assert_eq(s.loads, 1, "one bundle, loaded once");
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_pinned, 0);
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
        free(t_many_ref[p]);
}

Test(fetcher_front, acquire_async_every_slot_pinned_gives_eagain, .fini = teardown, .timeout = 60)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 2});
    const void *d[2];
    uint32_t    l[2];
    cr_assert_eq(fetcher_acquire(t_f, 0, 0, COMMON_EXPERT_GATE, &d[0], &l[0]), COMMON_OK);
    cr_assert_eq(fetcher_acquire(t_f, 0, 1, COMMON_EXPERT_UP, &d[1], &l[1]), COMMON_OK);
    while (!fetcher_is_ready(t_f, 0, 0) || !fetcher_is_ready(t_f, 0, 1))
        usleep(1000); /* the other parts may still be in flight */
    struct async_req r;
    async_start(&r, 0, 2, COMMON_EXPERT_GATE, async_cb);
    cr_assert_eq(async_calls(&r), 1, "answered at once: nothing is loading");
    cr_assert_eq(r.rc, COMMON_EAGAIN);
    cr_assert_null(r.data);
    cr_assert_eq(r.loan, FETCHER_LOAN_NONE);
    fetcher_release(t_f, l[0]);
    fetcher_release(t_f, l[1]);
}

Test(fetcher_front, acquire_async_bad_ids_are_invalid_without_a_callback, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 2});
    struct async_req r = {0};
    cr_assert_eq(fetcher_acquire_async(t_f, t_m.hp.n_layer, 0, COMMON_EXPERT_GATE, async_cb, &r),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_acquire_async(t_f, 0, t_m.hp.n_expert, COMMON_EXPERT_GATE, async_cb, &r),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_acquire_async(t_f, 0, 0, COMMON_EXPERT_PART_COUNT, async_cb, &r),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_acquire_async(t_f, 0, 0, COMMON_EXPERT_GATE, NULL, &r), COMMON_EINVAL);
    cr_assert_eq(r.calls, 0);
}

Test(fetcher_front, acquire_async_mmap_calls_back_inline, .fini = teardown)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_MMAP});
    struct async_req r;
    async_start(&r, 3, 7, COMMON_EXPERT_UP, async_cb);
    cr_assert_eq(async_calls(&r), 1);
    cr_assert_eq(r.rc, COMMON_OK);
    cr_assert_eq(r.loan, FETCHER_LOAN_NONE);
    cr_assert(part_matches(3, 7, COMMON_EXPERT_UP, r.data));
}

/* Three slots: A pinned by the test, B pinned by a callback that holds the I/O thread, C claimed
 * but not submitted (the I/O thread is held). A fourth bundle then has no slot while C loads:
 * it waits, and gets A once the test releases A. */
Test(fetcher_front, acquire_async_pending_gets_a_slot_released_while_loading, .fini = teardown,
     .timeout = 60)
{
    OPEN_MODEL();
    t_f = make(&(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 3});
    t_stuck = t_unstick = false;
    const void *da;
    uint32_t    la;
    cr_assert_eq(fetcher_acquire(t_f, 0, 0, COMMON_EXPERT_GATE, &da, &la), COMMON_OK);
    struct async_req rb, rc, rw;
    async_start(&rb, 0, 1, COMMON_EXPERT_GATE, async_stuck_cb);
    pthread_mutex_lock(&t_amu);
    while (!t_stuck)
        pthread_cond_wait(&t_acv, &t_amu);
    pthread_mutex_unlock(&t_amu);
    cr_assert_eq(rb.rc, COMMON_OK);
    async_start(&rc, 0, 2, COMMON_EXPERT_GATE, async_cb);
    async_start(&rw, 0, 3, COMMON_EXPERT_DOWN, async_cb);
    cr_assert_eq(async_calls(&rc), 0, "C cannot be read while the I/O thread is held");
    cr_assert_eq(async_calls(&rw), 0, "no slot for the fourth: it waits");
    fetcher_release(t_f, la);
    pthread_mutex_lock(&t_amu);
    t_unstick = true;
    pthread_cond_broadcast(&t_acv);
    pthread_mutex_unlock(&t_amu);
    async_wait(&rw);
    async_wait(&rc);
    cr_assert_eq(rw.rc, COMMON_OK, "the waiter got the released slot: %d", rw.rc);
    cr_assert_eq(rw.loan, la, "slot A");
    cr_assert(part_matches(0, 3, COMMON_EXPERT_DOWN, rw.data));
    cr_assert_eq(rc.rc, COMMON_OK);
    cr_assert(part_matches(0, 2, COMMON_EXPERT_GATE, rc.data));
    cr_assert_eq(async_calls(&rb) + async_calls(&rc) + async_calls(&rw), 3);
    fetcher_release(t_f, rb.loan);
    fetcher_release(t_f, rc.loan);
    fetcher_release(t_f, rw.loan);
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(t_f, &c);
    cr_assert_eq(c.n_pinned, 0);
}

static int t_cut_part; /* failed_slot_setup(): the part of expert 7 of the last layer cut off */

/* A copy of the fixture cut inside the last (in the file) part of expert 7 of the last layer,
 * the other two staying whole, opened with one slot and one read in flight, so that parts are
 * read one at a time in order: an async acquire of the first whole part is answered (pinned)
 * before the load fails, and the slot then stays FAILED until that loan is released. Returns
 * the loan. */
static uint32_t failed_slot_setup(void)
{
    char path[1024];
    open_copy("cut.gguf", path, sizeof(path));
    uint32_t           last = t_m.hp.n_layer - 1;
    struct common_span s[COMMON_EXPERT_PART_COUNT];
    t_cut_part = 0;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        cr_assert_eq(common_model_expert_span(&t_m, last, 7, (enum common_expert_part)p, &s[p]),
                     COMMON_OK);
        if (s[p].offset > s[t_cut_part].offset)
            t_cut_part = p;
    }
    int      keep = t_cut_part == 0 ? 1 : 0; /* read before the last part, whatever the order */
    uint64_t cut = s[t_cut_part].offset + s[t_cut_part].size / 2;
    t_f = make(&(struct fetcher_opts){
        .io = FETCHER_IO_PREAD, .n_slots = 1, .queue_depth = 1, .direct = FETCHER_DIRECT_OFF});
    cr_assert_eq(truncate(path, (off_t)cut), 0);
    struct async_req r;
    async_start(&r, last, 7, keep, async_cb);
    async_wait(&r);
    cr_assert_eq(r.rc, COMMON_OK, "part %d is whole: %d", keep, r.rc);
    cr_assert(part_matches(last, 7, keep, r.data));
    wait_failed_slot();
    return r.loan;
}

Test(fetcher_front, acquire_async_read_error_gives_eio, .fini = teardown, .timeout = 60)
{
    uint32_t         gate = failed_slot_setup();
    uint32_t         last = t_m.hp.n_layer - 1;
    struct async_req r;
    fetcher_release(t_f, gate); /* the FAILED slot becomes FREE */
    async_start(&r, last, 7, t_cut_part, async_cb);
    async_wait(&r);
    cr_assert_eq(r.rc, COMMON_EIO);
    cr_assert_null(r.data);
    cr_assert_eq(r.loan, FETCHER_LOAN_NONE);
    struct common_errmsg e;
    fetcher_last_error(t_f, &e);
    cr_assert(strstr(e.text, "offset"), "%s", e.text);
    struct fetcher_trace_totals t;
    fetcher_trace_totals(fetcher_get_trace(t_f), &t);
    cr_assert_eq(t.load_errors, 2);
}

Test(fetcher_front, acquire_async_pending_gets_the_failed_slot_once_released, .fini = teardown,
     .timeout = 60)
{
    uint32_t         gate = failed_slot_setup();
    struct async_req r;
    async_start(&r, 0, 0, COMMON_EXPERT_UP, async_cb);
    cr_assert_eq(async_calls(&r), 0, "the only slot is FAILED and pinned: the acquire waits");
    fetcher_release(t_f, gate);
    async_wait(&r);
    cr_assert_eq(r.rc, COMMON_OK, "%d", r.rc);
    cr_assert(part_matches(0, 0, COMMON_EXPERT_UP, r.data));
    fetcher_release(t_f, r.loan);
}

Test(fetcher_front, destroy_answers_pending_async_acquires_with_eclosed, .fini = teardown,
     .timeout = 60)
{
    uint32_t gate = failed_slot_setup();
    /* The first one answered lets go of the failed slot's loan, as a caller would; until then no
     * slot can free up, so none of the three is answered before the destroy. */
    struct async_req r[3];
    r[0] = (struct async_req){.loan = FETCHER_LOAN_NONE, .release = gate};
    cr_assert_eq(fetcher_acquire_async(t_f, 0, 0, COMMON_EXPERT_UP, async_cb, &r[0]), COMMON_OK);
    async_start(&r[1], 1, 1, COMMON_EXPERT_GATE, async_cb);
    async_start(&r[2], 0, 0, COMMON_EXPERT_DOWN, async_cb);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(async_calls(&r[i]), 0, "waiter %d answered early", i);
    fetcher_destroy(t_f);
    t_f = NULL;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(r[i].calls, 1, "waiter %d: %d callbacks", i, r[i].calls);
        cr_assert_eq(r[i].rc, COMMON_ECLOSED, "waiter %d: %d", i, r[i].rc);
        cr_assert_null(r[i].data);
        cr_assert_eq(r[i].loan, FETCHER_LOAN_NONE);
    }
}
