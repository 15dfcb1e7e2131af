/* tests/fetcher/test_pool.c - expert pool: loans, eviction order, generations, failures, attach. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pool.h"

static struct fetcher_pool *t_pool;

static struct fetcher_pool *make_pool(uint32_t n_slots, enum fetcher_policy policy,
                                      uint32_t halflife)
{
    struct fetcher_pool_opts o = {.slot_bytes = 3 * FETCHER_ALIGN,
                                  .n_slots = n_slots,
                                  .n_layer = 4,
                                  .n_expert = 8,
                                  .policy = policy,
                                  .lfu_halflife = halflife};
    struct fetcher_pool     *p = NULL;
    struct common_errmsg     e = {{0}};
    cr_assert_eq(fetcher_pool_create(&o, &p, &e), COMMON_OK, "%s", e.text);
    return p;
}

static void teardown(void)
{
    fetcher_pool_destroy(t_pool);
    t_pool = NULL;
}

static struct common_pool_key key(uint32_t layer, uint32_t expert)
{
    return (struct common_pool_key){layer, expert, COMMON_POOL_BUNDLE};
}

/* Claims and completes (layer, expert); returns its slot and, through *victim, what it evicted. */
static uint32_t load(struct fetcher_pool *p, uint32_t layer, uint32_t expert,
                     struct fetcher_pool_victim *victim)
{
    struct common_pool_key     k = key(layer, expert);
    struct fetcher_pool_victim v;
    uint32_t                   slot, gen;
    cr_assert_eq(fetcher_pool_claim(p, &k, 0, 0, &slot, &gen, &v), COMMON_OK,
                 "claim of (%u,%u) failed", layer, expert);
    for (uint32_t part = 0; part < COMMON_EXPERT_PART_COUNT; part++)
        fetcher_pool_set_part(p, slot, part, part * FETCHER_ALIGN, 100 + part);
    fetcher_pool_complete(p, slot);
    if (victim)
        *victim = v;
    return slot;
}

static void use(struct fetcher_pool *p, uint32_t layer, uint32_t expert)
{
    struct common_pool_key  k = key(layer, expert);
    struct common_pool_loan l;
    cr_assert_eq(fetcher_pool_try_acquire(p, &k, COMMON_EXPERT_GATE, &l), COMMON_OK);
    fetcher_pool_release(p, l.slot);
}

Test(fetcher_pool, create_rejects_zero_fields)
{
    struct fetcher_pool_opts o = {.slot_bytes = 4096, .n_slots = 0, .n_layer = 1, .n_expert = 1};
    struct fetcher_pool     *p = NULL;
    cr_assert_eq(fetcher_pool_create(&o, &p, NULL), COMMON_EINVAL);
    cr_assert_null(p);
}

Test(fetcher_pool, slots_are_aligned, .fini = teardown)
{
    t_pool = make_pool(3, FETCHER_POLICY_LRU, 0);
    cr_assert_eq(fetcher_pool_slot_bytes(t_pool) % FETCHER_ALIGN, 0);
    for (uint32_t i = 0; i < 3; i++)
        cr_assert_eq((uintptr_t)fetcher_pool_slot_data(t_pool, i) % FETCHER_ALIGN, 0);
    cr_assert_geq(fetcher_pool_fd(t_pool), 0, "a memfd backs the pool by default");
}

Test(fetcher_pool, acquire_release_pins_and_unpins, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    uint32_t                   slot = load(t_pool, 1, 2, NULL);
    struct common_pool_key     k = key(1, 2);
    struct common_pool_loan    l = {0};
    struct fetcher_pool_counts c;
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_EXPERT_UP, &l), COMMON_OK);
    cr_assert_eq(l.slot, slot);
    cr_assert_eq(l.data, fetcher_pool_slot_data(t_pool, slot) + FETCHER_ALIGN);
    cr_assert_eq(l.size, 101);
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_pinned, 1);
    cr_assert_eq(c.n_ready, 1);
    fetcher_pool_release(t_pool, l.slot);
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_pinned, 0);
}

Test(fetcher_pool, acquire_absent_and_bad_keys, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_key  k = key(0, 0);
    struct common_pool_key  bad = key(4, 0);
    struct common_pool_loan l;
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_ENOENT);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &bad, 0, &l), COMMON_EINVAL);
    uint32_t slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &bad, 0, 0, &slot, &gen, NULL), COMMON_EINVAL);
}

Test(fetcher_pool, parts_readable_while_loading, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_key  k = key(0, 3);
    struct common_pool_loan l;
    uint32_t                slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), COMMON_OK);
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), 1,
                 "a second claim of the same key finds it");
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_EXPERT_GATE, &l), COMMON_EAGAIN);
    cr_assert_eq(l.slot, slot);
    cr_assert_eq(l.gen, gen);
    fetcher_pool_part_ready(t_pool, slot, COMMON_EXPERT_GATE);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_EXPERT_GATE, &l), COMMON_OK);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_EXPERT_DOWN, &l), COMMON_EAGAIN);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_POOL_WHOLE, &l), COMMON_EAGAIN);
    fetcher_pool_complete(t_pool, slot);
    cr_assert_eq(fetcher_pool_wait_acquire(t_pool, slot, gen, COMMON_EXPERT_DOWN, &l), COMMON_OK);
    fetcher_pool_release(t_pool, slot);
    fetcher_pool_release(t_pool, slot);
}

Test(fetcher_pool, eviction_never_evicts_pinned, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    load(t_pool, 0, 0, NULL); /* oldest: LRU's first choice */
    load(t_pool, 0, 1, NULL);
    struct common_pool_key  k0 = key(0, 0), k1 = key(0, 1), k2 = key(0, 2), k3 = key(0, 3);
    struct common_pool_loan l0, l1;
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k0, 0, &l0), COMMON_OK);
    fetcher_pool_release(t_pool, l0.slot);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k1, 0, &l1), COMMON_OK); /* pin (0,1) */
    struct fetcher_pool_victim v;
    uint32_t                   slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k2, 0, 0, &slot, &gen, &v), COMMON_OK);
    cr_assert(v.valid);
    cr_assert_eq(v.key.expert, 0, "the unpinned slot goes even though it is more recent");
    cr_assert_eq(fetcher_pool_claim(t_pool, &k3, 0, 0, &slot, &gen, &v), COMMON_EAGAIN,
                 "one slot pinned, one loading: nothing to evict");
    fetcher_pool_release(t_pool, l1.slot);
}

Test(fetcher_pool, generation_bumps_on_reuse, .fini = teardown)
{
    t_pool = make_pool(1, FETCHER_POLICY_LRU, 0);
    uint32_t                s0 = load(t_pool, 2, 5, NULL);
    struct common_pool_key  k = key(2, 5);
    struct common_pool_loan l;
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_OK);
    cr_assert(fetcher_pool_loan_is_valid(t_pool, &l));
    fetcher_pool_release(t_pool, l.slot);
    cr_assert(fetcher_pool_loan_is_valid(t_pool, &l), "release alone does not reuse the slot");
    struct fetcher_pool_victim v;
    uint32_t                   s1 = load(t_pool, 2, 6, &v);
    cr_assert_eq(s1, s0);
    cr_assert(v.valid);
    cr_assert_eq(v.n_uses, 1);
    cr_assert_not(fetcher_pool_loan_is_valid(t_pool, &l), "reuse must change the generation");
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_ENOENT);
}

Test(fetcher_pool, lru_evicts_least_recent, .fini = teardown)
{
    t_pool = make_pool(3, FETCHER_POLICY_LRU, 0);
    load(t_pool, 0, 0, NULL);
    load(t_pool, 0, 1, NULL);
    load(t_pool, 0, 2, NULL);
    use(t_pool, 0, 0);
    use(t_pool, 0, 2);
    use(t_pool, 0, 1);
    use(t_pool, 0, 0); /* recency now: 0 (newest), 1, 2 (oldest) */
    struct fetcher_pool_victim v;
    load(t_pool, 1, 0, &v);
    cr_assert_eq(v.key.expert, 2);
    load(t_pool, 1, 1, &v);
    cr_assert_eq(v.key.expert, 1);
    use(t_pool, 0, 0);
    load(t_pool, 1, 2, &v);
    cr_assert_eq(v.key.layer, 1, "(1,0) is now the least recent");
    cr_assert_eq(v.key.expert, 0);
}

Test(fetcher_pool, lfu_evicts_least_frequent, .fini = teardown)
{
    t_pool = make_pool(3, FETCHER_POLICY_LFU, 1u << 30); /* no decay to speak of */
    load(t_pool, 0, 0, NULL);
    load(t_pool, 0, 1, NULL);
    load(t_pool, 0, 2, NULL);
    for (int i = 0; i < 3; i++)
        use(t_pool, 0, 0);
    use(t_pool, 0, 1);
    use(t_pool, 0, 2);
    use(t_pool, 0, 2); /* uses: e0 3, e1 1, e2 2; e1 is also not the least recent */
    use(t_pool, 0, 0);
    struct fetcher_pool_victim v;
    load(t_pool, 1, 0, &v);
    cr_assert_eq(v.key.expert, 1);
    load(t_pool, 1, 1, &v);
    cr_assert_eq(v.key.layer, 1, "the newcomer (1,0) has the lowest count");
    cr_assert_eq(v.key.expert, 0);
}

Test(fetcher_pool, lfu_decay_forgets_old_counts, .fini = teardown)
{
    /* (0,0) is used a lot early, (0,1) and (0,2) less but lately: without decay (0,1) goes,
     * with a short half-life the old counts fade and (0,0) goes. */
    for (int decay = 0; decay < 2; decay++) {
        struct fetcher_pool *p = make_pool(3, FETCHER_POLICY_LFU, decay ? 2 : 1u << 30);
        load(p, 0, 0, NULL);
        load(p, 0, 1, NULL);
        load(p, 0, 2, NULL);
        for (int i = 0; i < 10; i++)
            use(p, 0, 0);
        for (int i = 0; i < 5; i++) {
            use(p, 0, 1);
            use(p, 0, 2);
        }
        struct fetcher_pool_victim v;
        load(p, 1, 0, &v);
        cr_assert_eq(v.key.expert, decay ? 0u : 1u, "decay=%d evicted expert %u", decay,
                     v.key.expert);
        fetcher_pool_destroy(p);
    }
}

Test(fetcher_pool, claim_respects_protect_since, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    load(t_pool, 0, 0, NULL);
    load(t_pool, 0, 1, NULL);
    uint64_t t = fetcher_pool_tick(t_pool);
    use(t_pool, 0, 0);
    use(t_pool, 0, 1);
    struct common_pool_key k = key(3, 3);
    uint32_t               slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, t + 1, &slot, &gen, NULL), COMMON_EAGAIN,
                 "both slots were used since the protection tick");
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), COMMON_OK);
}

Test(fetcher_pool, fail_frees_slot_and_wakes_with_eio, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_key  k = key(1, 1);
    struct common_pool_loan l;
    uint32_t                slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), COMMON_OK);
    fetcher_pool_fail(t_pool, slot);
    struct fetcher_pool_counts c;
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_free, 2);
    cr_assert_eq(fetcher_pool_wait_acquire(t_pool, slot, gen, 0, &l), COMMON_EIO);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_ENOENT);
}

Test(fetcher_pool, abandon_frees_slot_and_waiters_look_again, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_key  k = key(1, 2);
    struct common_pool_loan l;
    uint32_t                slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), COMMON_OK);
    fetcher_pool_abandon(t_pool, slot);
    cr_assert_eq(fetcher_pool_wait_acquire(t_pool, slot, gen, 0, &l), COMMON_EAGAIN);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_ENOENT);
}

Test(fetcher_pool, fail_while_pinned_frees_on_last_release, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_key  k = key(1, 1);
    struct common_pool_loan l;
    uint32_t                slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k, 0, 0, &slot, &gen, NULL), COMMON_OK);
    fetcher_pool_part_ready(t_pool, slot, COMMON_EXPERT_GATE);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, COMMON_EXPERT_GATE, &l), COMMON_OK);
    fetcher_pool_fail(t_pool, slot); /* e.g. the down part's read failed */
    struct fetcher_pool_counts c;
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_failed, 1);
    cr_assert(fetcher_pool_loan_is_valid(t_pool, &l), "the pinned gate bytes stay valid");
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k, 0, &l), COMMON_ENOENT);
    fetcher_pool_release(t_pool, slot);
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_free, 2);
    cr_assert_eq(c.n_failed, 0);
}

/* Copies the pool segment into a new memfd, lets `edit` change it, and attaches to it. */
static int attach_copy(struct fetcher_pool  *p, void (*edit)(uint8_t *seg, size_t *len),
                       struct common_errmsg *e)
{
    int   src = fetcher_pool_fd(p);
    off_t len = lseek(src, 0, SEEK_END);
    cr_assert_gt(len, 0);
    uint8_t *buf = malloc((size_t)len);
    cr_assert_not_null(buf);
    cr_assert_eq(pread(src, buf, (size_t)len, 0), len);
    size_t n = (size_t)len;
    if (edit)
        edit(buf, &n);
    int fd = memfd_create("test-pool", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    free(buf);
    struct common_pool_view a = {0};
    int                     rc = common_pool_view_attach(fd, &a, e);
    common_pool_view_detach(&a);
    close(fd);
    return rc;
}

static void bad_magic(uint8_t *seg, size_t *len)
{
    (void)len;
    seg[0] ^= 0xff;
}

static void bad_version(uint8_t *seg, size_t *len)
{
    (void)len;
    uint32_t v = COMMON_POOL_VERSION + 1;
    memcpy(seg + 4, &v, 4);
}

static void truncated(uint8_t *seg, size_t *len)
{
    (void)seg;
    *len -= FETCHER_ALIGN;
}

static void tiny(uint8_t *seg, size_t *len)
{
    (void)seg;
    *len = 10;
}

static void bad_slot_count(uint8_t *seg, size_t *len)
{
    (void)len;
    uint32_t n;
    memcpy(&n, seg + 8, 4);
    n += 1;
    memcpy(seg + 8, &n, 4);
}

/* Retiring: free slots first, then the LRU victims among the unpinned READY ones (reported, so
 * that the caller traces them); a pinned slot stays until a later call; a retired slot is never
 * claimed again, its memory is zero (given back), and the counts leave it out. */
Test(fetcher_pool, retire_gives_up_free_then_unpinned_slots_for_good, .fini = teardown)
{
    t_pool = make_pool(6, FETCHER_POLICY_LRU, 0);
    uint32_t s0 = load(t_pool, 0, 0, NULL), s1 = load(t_pool, 0, 1, NULL);
    uint32_t s2 = load(t_pool, 0, 2, NULL), s3 = load(t_pool, 0, 3, NULL);
    (void)s1;
    use(t_pool, 0, 0); /* (0,1) is now the least recent */
    memset(fetcher_pool_slot_data(t_pool, s2), 0x5a, FETCHER_ALIGN);
    struct common_pool_key  k3 = key(0, 3);
    struct common_pool_loan pinned;
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k3, COMMON_EXPERT_GATE, &pinned), COMMON_OK);

    /* 2 free slots, then (0,1) and (0,2) by recency; (0,3) is pinned, (0,0) the most recent. */
    struct fetcher_pool_victim ev[8];
    cr_assert_eq(fetcher_pool_retire(t_pool, 4, ev, 8), 2);
    cr_assert(ev[0].valid && ev[0].key.expert == 1, "first victim (0,%u)", ev[0].key.expert);
    cr_assert(ev[1].valid && ev[1].key.expert == 2, "second victim (0,%u)", ev[1].key.expert);
    uint32_t n = 0, want = 0;
    fetcher_pool_retired(t_pool, &n, &want);
    cr_assert_eq(n, 4);
    cr_assert_eq(want, 4);
    cr_assert_eq(((const uint8_t *)fetcher_pool_slot_data(t_pool, s2))[0], 0,
                 "a retired slot's memory is given back (reads as zero)");
    struct common_pool_loan l;
    struct common_pool_key  k2 = key(0, 2);
    cr_assert_eq(fetcher_pool_try_acquire(t_pool, &k2, COMMON_EXPERT_GATE, &l), COMMON_ENOENT);

    /* Wanting 5 of 6: (0,0) goes, (0,3) is pinned: it stays until released. */
    cr_assert_eq(fetcher_pool_retire(t_pool, 5, ev, 8), 1);
    cr_assert_eq(ev[0].key.expert, 0);
    fetcher_pool_retired(t_pool, &n, &want);
    cr_assert_eq(n, 5);
    /* A new key now takes the one usable slot: the pinned one cannot be, so the claim waits. */
    struct common_pool_key k9 = key(1, 1);
    uint32_t               slot, gen;
    cr_assert_eq(fetcher_pool_claim(t_pool, &k9, 0, 0, &slot, &gen, NULL), COMMON_EAGAIN);
    fetcher_pool_release(t_pool, pinned.slot);
    /* Fewer than before is no change; the count of usable slots is 1. */
    cr_assert_eq(fetcher_pool_retire(t_pool, 2, ev, 8), 0);
    struct fetcher_pool_counts c;
    fetcher_pool_counts(t_pool, &c);
    cr_assert_eq(c.n_retired, 5);
    cr_assert_eq(c.n_free + c.n_ready + c.n_loading + c.n_failed, 1);
    cr_assert_eq(fetcher_pool_claim(t_pool, &k9, 0, 0, &slot, &gen, NULL), COMMON_OK);
    cr_assert_eq(slot, s3, "the one slot not retired");
    (void)s0;
}

Test(fetcher_pool, attach_checks_header, .fini = teardown)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_errmsg e = {{0}};
    cr_assert_eq(attach_copy(t_pool, NULL, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(attach_copy(t_pool, bad_magic, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "magic"), "%s", e.text);
    cr_assert_eq(attach_copy(t_pool, bad_version, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "version"), "%s", e.text);
    cr_assert_eq(attach_copy(t_pool, truncated, &e), COMMON_ECORRUPT);
    cr_assert_eq(attach_copy(t_pool, tiny, &e), COMMON_ECORRUPT);
    cr_assert_eq(attach_copy(t_pool, bad_slot_count, &e), COMMON_ECORRUPT);
}

Test(fetcher_pool, attached_reader_sees_ready_slots_and_reuse, .fini = teardown)
{
    t_pool = make_pool(1, FETCHER_POLICY_LRU, 0);
    uint32_t slot = load(t_pool, 3, 7, NULL);
    uint8_t *data = fetcher_pool_slot_data(t_pool, slot);
    memcpy(data + FETCHER_ALIGN, "expert-3-7", 10); /* the up part */
    struct common_pool_view a = {0};
    cr_assert_eq(common_pool_view_attach(fetcher_pool_fd(t_pool), &a, NULL), COMMON_OK);
    struct common_pool_key  k = key(3, 7);
    struct common_pool_loan l;
    cr_assert_eq(common_pool_read_begin(&a, &k, COMMON_EXPERT_UP, &l), COMMON_OK);
    cr_assert_eq(memcmp(l.data, "expert-3-7", 10), 0);
    cr_assert_eq(l.size, 101);
    cr_assert(common_pool_read_valid(&a, &l));
    load(t_pool, 0, 0, NULL); /* evicts (3,7) */
    cr_assert_not(common_pool_read_valid(&a, &l), "reuse is visible through the generation");
    cr_assert_eq(common_pool_read_begin(&a, &k, COMMON_EXPERT_UP, &l), COMMON_ENOENT);
    common_pool_view_detach(&a);
}

/* ---- seqlock reads racing with reuse ------------------------------------------------------ */

struct reuse_race {
    struct fetcher_pool *p;
    _Atomic bool         stop;
    _Atomic uint64_t     loads;    /* loads completed by the writer */
    _Atomic uint64_t     attempts; /* read attempts made by the reader */
};

/* Loads (0, e) for e = 0, 1, 2, ... into a 2-slot pool: every load evicts; each slot's bytes
 * are all equal to the expert id. After each load it waits for one more read attempt of the
 * reader, so that however the threads are scheduled (a busy machine, one core) both make
 * progress and their steps interleave. */
static void *reuse_writer(void *arg)
{
    struct reuse_race *r = arg;
    for (uint32_t e = 0; !atomic_load(&r->stop); e = (e + 1) % 8) {
        struct common_pool_key k = key(0, e);
        uint32_t               slot, gen;
        int                    rc = fetcher_pool_claim(r->p, &k, 0, 0, &slot, &gen, NULL);
        if (rc != COMMON_OK)
            continue; /* still indexed (rc 1) */
        memset(fetcher_pool_slot_data(r->p, slot), (int)e, 3 * FETCHER_ALIGN);
        for (uint32_t part = 0; part < COMMON_EXPERT_PART_COUNT; part++)
            fetcher_pool_set_part(r->p, slot, part, part * FETCHER_ALIGN, FETCHER_ALIGN);
        fetcher_pool_complete(r->p, slot);
        atomic_fetch_add(&r->loads, 1);
        uint64_t seen = atomic_load(&r->attempts);
        while (atomic_load(&r->attempts) == seen && !atomic_load(&r->stop))
            sched_yield();
    }
    return NULL;
}

/* A reader of an attached view that copies a part and finds the generation unchanged has the
 * bytes of the key it asked for, however the writer's reuse interleaves with it. The loop is
 * bounded by progress (valid reads and writer loads), never by a count of iterations or time. */
Test(fetcher_pool, seqlock_reads_racing_reuse_are_exact_or_refused, .fini = teardown,
     .timeout = 600)
{
    t_pool = make_pool(2, FETCHER_POLICY_LRU, 0);
    struct common_pool_view a = {0};
    cr_assert_eq(common_pool_view_attach(fetcher_pool_fd(t_pool), &a, NULL), COMMON_OK);
    static struct reuse_race r;
    r.p = t_pool;
    atomic_store(&r.stop, false);
    atomic_store(&r.loads, 0);
    atomic_store(&r.attempts, 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, reuse_writer, &r), 0);
    static uint8_t copy[FETCHER_ALIGN];
    uint64_t       valid = 0, refused = 0, wrong = 0;
    for (uint32_t i = 0; valid < 2000 || atomic_load(&r.loads) < 20000; i++) {
        uint32_t                e = i % 8;
        struct common_pool_key  k = key(0, e);
        struct common_pool_loan l;
        int                     rc = common_pool_read_begin(&a, &k, (uint32_t)(i % 3), &l);
        atomic_fetch_add(&r.attempts, 1);
        if (rc != COMMON_OK)
            continue;
        memcpy(copy, l.data, l.size < sizeof(copy) ? l.size : sizeof(copy));
        if (!common_pool_read_valid(&a, &l)) {
            refused++;
            continue;
        }
        valid++;
        for (size_t b = 0; b < sizeof(copy); b++)
            if (copy[b] != e) {
                wrong++;
                break;
            }
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    common_pool_view_detach(&a);
    cr_log_info("seqlock race: %llu loads, %llu valid reads, %llu refused",
                (unsigned long long)atomic_load(&r.loads), (unsigned long long)valid,
                (unsigned long long)refused);
    cr_assert_eq(wrong, 0, "%llu of %llu reads accepted bytes of another expert",
                 (unsigned long long)wrong, (unsigned long long)valid);
    cr_assert_gt(valid, 0);
}
