/* tests/common/test_ring.c - shared-memory SPSC rings: header checks, full/empty, corruption,
 * index wraparound, futex timeouts, runtime-directory rules and a two-process stress run. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* A 64-byte aligned, zeroed buffer big enough for a ring of (slot_bytes, n_slots). */
static void *ring_buf(uint32_t slot_bytes, uint32_t n_slots, size_t *len)
{
    size_t n = common_ring_bytes(slot_bytes, n_slots);
    cr_assert_gt(n, 0);
    n = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n);
    cr_assert_not_null(p);
    memset(p, 0, n);
    *len = n;
    return p;
}

/* A formatted ring and one attached view. */
static void *ring_new(uint32_t slot_bytes, uint32_t n_slots, struct common_ring *r)
{
    size_t len;
    void  *mem = ring_buf(slot_bytes, n_slots, &len);
    cr_assert_eq(common_ring_init(mem, len, slot_bytes, n_slots), COMMON_OK);
    cr_assert_eq(common_ring_attach(mem, len, slot_bytes, n_slots, r), COMMON_OK);
    return mem;
}

/* A fresh private temp directory (mode 0700 from mkdtemp); caller removes it. */
static void tmp_dir(char *buf, size_t len)
{
    snprintf(buf, len, "/tmp/sluice-ring-XXXXXX");
    cr_assert_not_null(mkdtemp(buf));
}

/* ---- init / attach -------------------------------------------------------------------------- */

Test(common_ring, bytes_rejects_bad_sizes)
{
    cr_assert_eq(common_ring_bytes(16, 3), 0);
    cr_assert_eq(common_ring_bytes(16, 0), 0);
    cr_assert_eq(common_ring_bytes(0, 8), 0);
    cr_assert_eq(common_ring_bytes(COMMON_RING_MAX_SLOT_BYTES + 1, 8), 0);
    cr_assert_eq(common_ring_bytes(16, COMMON_RING_MAX_SLOTS * 2), 0);
    cr_assert_eq(common_ring_bytes(16, 8), sizeof(struct common_ring_hdr) + 8 * 24);
}

Test(common_ring, init_rejects_non_power_of_two)
{
    size_t len;
    void  *mem = ring_buf(16, 8, &len);
    cr_assert_eq(common_ring_init(mem, len, 16, 6), COMMON_EINVAL);
    cr_assert_eq(common_ring_init(mem, len, 16, 0), COMMON_EINVAL);
    free(mem);
}

Test(common_ring, init_rejects_short_buffer)
{
    size_t len;
    void  *mem = ring_buf(16, 8, &len);
    cr_assert_eq(common_ring_init(mem, common_ring_bytes(16, 8) - 1, 16, 8), COMMON_EINVAL);
    cr_assert_eq(common_ring_init((char *)mem + 8, len - 8, 16, 4), COMMON_EINVAL,
                 "unaligned memory");
    free(mem);
}

Test(common_ring, init_attach_round_trip)
{
    struct common_ring r;
    void              *mem = ring_new(32, 8, &r);
    cr_assert_eq(r.n_slots, 8);
    cr_assert_eq(r.slot_bytes, 32);
    const char *recs[] = {"a", "hello ring", "", "exactly-thirty-two-bytes-long!!"};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(common_ring_push(&r, recs[i], strlen(recs[i]) + (i != 2)), COMMON_OK);
    for (int i = 0; i < 4; i++) {
        char buf[32] = {0};
        int  n = common_ring_pop(&r, buf, sizeof(buf));
        cr_assert_eq(n, (int)(strlen(recs[i]) + (i != 2)), "record %d length %d", i, n);
        if (i != 2)
            cr_assert_str_eq(buf, recs[i]);
    }
    free(mem);
}

/* Two views (producer, consumer) of the same memory, attached separately. */
Test(common_ring, attach_two_views_share_records)
{
    struct common_ring p, c;
    void              *mem = ring_new(16, 4, &p);
    cr_assert_eq(common_ring_attach(mem, common_ring_bytes(16, 4), 16, 4, &c), COMMON_OK);
    uint64_t v = 42, w = 0;
    cr_assert_eq(common_ring_push(&p, &v, sizeof(v)), COMMON_OK);
    cr_assert_eq(common_ring_pop(&c, &w, sizeof(w)), (int)sizeof(w));
    cr_assert_eq(w, 42);
    free(mem);
}

static void attach_corrupt(void (*poke)(struct common_ring_hdr *), const char *what)
{
    size_t len;
    void  *mem = ring_buf(16, 8, &len);
    cr_assert_eq(common_ring_init(mem, len, 16, 8), COMMON_OK);
    poke(mem);
    struct common_ring r;
    memset(&r, 0xab, sizeof(r));
    cr_assert_eq(common_ring_attach(mem, len, 16, 8, &r), COMMON_ECORRUPT, "%s", what);
    cr_assert_eq(((unsigned char *)&r)[0], 0xab, "%s: out must stay unchanged", what);
    free(mem);
}

static void poke_magic(struct common_ring_hdr *h)
{
    h->magic ^= 1;
}
static void poke_version(struct common_ring_hdr *h)
{
    h->version = COMMON_RING_VERSION + 1;
}
static void poke_slot_bytes(struct common_ring_hdr *h)
{
    h->slot_bytes = 1u << 30;
}
static void poke_n_slots(struct common_ring_hdr *h)
{
    h->n_slots = 1u << 31;
}
static void poke_head(struct common_ring_hdr *h)
{
    atomic_store(&h->head, 9);
}

Test(common_ring, attach_rejects_bad_magic)
{
    attach_corrupt(poke_magic, "magic");
}
Test(common_ring, attach_rejects_bad_version)
{
    attach_corrupt(poke_version, "version");
}
Test(common_ring, attach_rejects_bad_slot_bytes)
{
    attach_corrupt(poke_slot_bytes, "slot_bytes");
}
Test(common_ring, attach_rejects_bad_n_slots)
{
    attach_corrupt(poke_n_slots, "n_slots");
}
Test(common_ring, attach_rejects_head_past_tail)
{
    attach_corrupt(poke_head, "head - tail > n_slots");
}

/* The caller expects a different geometry than the segment holds. */
Test(common_ring, attach_rejects_unexpected_geometry)
{
    size_t len;
    void  *mem = ring_buf(16, 16, &len);
    cr_assert_eq(common_ring_init(mem, len, 16, 8), COMMON_OK);
    struct common_ring r;
    cr_assert_eq(common_ring_attach(mem, len, 24, 8, &r), COMMON_ECORRUPT);
    cr_assert_eq(common_ring_attach(mem, len, 16, 16, &r), COMMON_ECORRUPT);
    cr_assert_eq(common_ring_attach(mem, len, 16, 6, &r), COMMON_EINVAL);
    free(mem);
}

/* A mapping shorter than the ring its (valid) header describes, or than a header. */
Test(common_ring, attach_rejects_truncated_segment)
{
    size_t len;
    void  *mem = ring_buf(16, 8, &len);
    cr_assert_eq(common_ring_init(mem, len, 16, 8), COMMON_OK);
    struct common_ring r;
    cr_assert_eq(common_ring_attach(mem, common_ring_bytes(16, 8) - 1, 16, 8, &r), COMMON_ECORRUPT);
    cr_assert_eq(common_ring_attach(mem, 10, 16, 8, &r), COMMON_ECORRUPT);
    cr_assert_eq(common_ring_attach(mem, 0, 16, 8, &r), COMMON_ECORRUPT);
    free(mem);
}

/* ---- push / pop ----------------------------------------------------------------------------- */

Test(common_ring, push_full_eagain)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    for (uint64_t i = 0; i < 8; i++)
        cr_assert_eq(common_ring_push(&r, &i, sizeof(i)), COMMON_OK);
    uint64_t x = 99;
    cr_assert_eq(common_ring_push(&r, &x, sizeof(x)), COMMON_EAGAIN);
    uint64_t y;
    cr_assert_eq(common_ring_pop(&r, &y, sizeof(y)), 8);
    cr_assert_eq(y, 0);
    cr_assert_eq(common_ring_push(&r, &x, sizeof(x)), COMMON_OK, "one slot freed");
    cr_assert_eq(common_ring_push(&r, &x, sizeof(x)), COMMON_EAGAIN);
    free(mem);
}

Test(common_ring, pop_empty_eagain)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    char               buf[16];
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_EAGAIN);
    cr_assert_eq(common_ring_push(&r, "x", 1), COMMON_OK);
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), 1);
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_EAGAIN);
    free(mem);
}

Test(common_ring, push_oversize_einval)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    char               big[17] = {0};
    cr_assert_eq(common_ring_push(&r, big, sizeof(big)), COMMON_EINVAL);
    cr_assert_eq(common_ring_pop(&r, big, sizeof(big)), COMMON_EAGAIN, "nothing was pushed");
    free(mem);
}

Test(common_ring, pop_small_buffer_einval_keeps_record)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    cr_assert_eq(common_ring_push(&r, "0123456789", 10), COMMON_OK);
    char buf[16] = {0};
    cr_assert_eq(common_ring_pop(&r, buf, 9), COMMON_EINVAL);
    cr_assert_eq(common_ring_pop(&r, buf, 10), 10);
    cr_assert_eq(memcmp(buf, "0123456789", 10), 0);
    free(mem);
}

Test(common_ring, pop_corrupt_head_ecorrupt)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    atomic_store(&r.hdr->head, 1000);
    char buf[16];
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_ECORRUPT);
    cr_assert_eq(atomic_load(&r.hdr->tail), 0, "tail untouched");
    free(mem);
}

Test(common_ring, push_corrupt_head_ecorrupt)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    atomic_store(&r.hdr->head, 1000);
    cr_assert_eq(common_ring_push(&r, "x", 1), COMMON_ECORRUPT);
    cr_assert_eq(atomic_load(&r.hdr->head), 1000, "head untouched");
    free(mem);
}

/* A tail moved past head reads as a huge head - tail difference, on either side. */
Test(common_ring, corrupt_tail_ahead_of_head_ecorrupt)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(common_ring_push(&r, "x", 1), COMMON_OK);
    atomic_store(&r.hdr->tail, 100);
    cr_assert_eq(common_ring_push(&r, "x", 1), COMMON_ECORRUPT);
    char buf[16];
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_ECORRUPT);
    cr_assert_eq(atomic_load(&r.hdr->head), 8, "head untouched");
    free(mem);
}

Test(common_ring, pop_corrupt_length_ecorrupt)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    cr_assert_eq(common_ring_push(&r, "x", 1), COMMON_OK);
    uint32_t bad = 17;
    memcpy(r.slots, &bad, sizeof(bad));
    char buf[64];
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_ECORRUPT);
    bad = UINT32_MAX;
    memcpy(r.slots, &bad, sizeof(bad));
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_ECORRUPT);
    free(mem);
}

/* Indices start 5 below UINT32_MAX and run across the 2^32 overflow several times round. */
Test(common_ring, wraparound_across_u32_overflow)
{
    size_t len;
    void  *mem = ring_buf(16, 8, &len);
    cr_assert_eq(common_ring_init(mem, len, 16, 8), COMMON_OK);
    struct common_ring_hdr *h = mem;
    atomic_store(&h->head, UINT32_MAX - 5);
    atomic_store(&h->tail, UINT32_MAX - 5);
    struct common_ring r;
    cr_assert_eq(common_ring_attach(mem, len, 16, 8, &r), COMMON_OK);
    uint64_t next_push = 0, next_pop = 0;
    for (int round = 0; round < 6; round++) {
        while (common_ring_push(&r, &next_push, sizeof(next_push)) == COMMON_OK)
            next_push++;
        cr_assert_eq(next_push - next_pop, 8, "full after %llu pushes",
                     (unsigned long long)next_push);
        for (int k = 0; k < 5; k++) {
            uint64_t v;
            cr_assert_eq(common_ring_pop(&r, &v, sizeof(v)), 8);
            cr_assert_eq(v, next_pop, "order kept across the overflow");
            next_pop++;
        }
    }
    uint64_t v;
    while (common_ring_pop(&r, &v, sizeof(v)) == 8)
        cr_assert_eq(v, next_pop++);
    cr_assert_eq(next_pop, next_push);
    cr_assert_lt(atomic_load(&h->head), 100u, "head wrapped past 2^32");
    free(mem);
}

/* ---- blocking ------------------------------------------------------------------------------- */

Test(common_ring, pop_wait_timeout, .timeout = 10)
{
    struct common_ring r;
    void              *mem = ring_new(16, 8, &r);
    char               buf[16];
    uint64_t           t0 = common_now_ns();
    cr_assert_eq(common_ring_pop_wait(&r, buf, sizeof(buf), 50), COMMON_ETIMEDOUT);
    uint64_t ms = (common_now_ns() - t0) / 1000000u;
    cr_assert_geq(ms, 50);
    cr_assert_lt(ms, 2000);
    cr_assert_eq(common_ring_pop_wait(&r, buf, sizeof(buf), 0), COMMON_ETIMEDOUT);
    cr_assert_eq(atomic_load(&r.hdr->cons_waiting) & 1u, 0, "counter even on the way out");
    cr_assert_eq(common_ring_push(&r, "ab", 2), COMMON_OK);
    cr_assert_eq(common_ring_pop_wait(&r, buf, sizeof(buf), 50), 2);
    free(mem);
}

Test(common_ring, push_wait_timeout, .timeout = 10)
{
    struct common_ring r;
    void              *mem = ring_new(16, 2, &r);
    cr_assert_eq(common_ring_push(&r, "a", 1), COMMON_OK);
    cr_assert_eq(common_ring_push(&r, "b", 1), COMMON_OK);
    uint64_t t0 = common_now_ns();
    cr_assert_eq(common_ring_push_wait(&r, "c", 1, 30), COMMON_ETIMEDOUT);
    cr_assert_geq((common_now_ns() - t0) / 1000000u, 30);
    cr_assert_eq(common_ring_push_wait(&r, "c", 100, 30), COMMON_EINVAL, "not a timeout");
    free(mem);
}

/* ---- segments ------------------------------------------------------------------------------- */

Test(common_ring, segment_create_makes_private_dir)
{
    char tmp[64], dir[96];
    tmp_dir(tmp, sizeof(tmp));
    snprintf(dir, sizeof(dir), "%s/run", tmp);
    struct common_ring_segment seg = {0};
    cr_assert_eq(common_ring_segment_create(dir, "r0", 4096, &seg), COMMON_OK);
    struct stat st;
    cr_assert_eq(stat(dir, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    char path[128];
    snprintf(path, sizeof(path), "%s/r0", dir);
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    cr_assert_eq(st.st_size, 4096);

    struct common_ring_segment dup = {0};
    cr_assert_eq(common_ring_segment_create(dir, "r0", 4096, &dup), COMMON_EBUSY);
    struct common_ring_segment other = {0};
    cr_assert_eq(common_ring_segment_open(dir, "r0", &other), COMMON_OK);
    cr_assert_eq(other.bytes, 4096);
    ((char *)seg.mem)[100] = 7;
    cr_assert_eq(((char *)other.mem)[100], 7, "both map the same file");
    common_ring_segment_close(&other);
    common_ring_segment_close(&other); /* idempotent */
    common_ring_segment_close(&seg);
    cr_assert_neq(stat(path, &st), 0, "creator's close removes the file");
    cr_assert_eq(common_ring_segment_open(dir, "r0", &other), COMMON_ENOENT);
    rmdir(dir);
    rmdir(tmp);
}

Test(common_ring, segment_refuses_open_dir)
{
    char tmp[64];
    tmp_dir(tmp, sizeof(tmp));
    cr_assert_eq(chmod(tmp, 0750), 0);
    struct common_ring_segment seg = {0};
    cr_assert_eq(common_ring_segment_create(tmp, "r0", 4096, &seg), COMMON_EINVAL);
    cr_assert_eq(common_ring_segment_open(tmp, "r0", &seg), COMMON_EINVAL);
    cr_assert_null(seg.mem);
    cr_assert_eq(chmod(tmp, 0701), 0);
    cr_assert_eq(common_ring_segment_create(tmp, "r0", 4096, &seg), COMMON_EINVAL);
    rmdir(tmp);
}

Test(common_ring, segment_rejects_bad_names)
{
    char tmp[64];
    tmp_dir(tmp, sizeof(tmp));
    struct common_ring_segment seg = {0};
    cr_assert_eq(common_ring_segment_create(tmp, "", 4096, &seg), COMMON_EINVAL);
    cr_assert_eq(common_ring_segment_create(tmp, "a/b", 4096, &seg), COMMON_EINVAL);
    cr_assert_eq(common_ring_segment_create(tmp, "..", 4096, &seg), COMMON_EINVAL);
    cr_assert_eq(common_ring_segment_create(tmp, "r", 0, &seg), COMMON_EINVAL);
    rmdir(tmp);
}

/* ---- two processes -------------------------------------------------------------------------- */

#define STRESS_N     10000000u
#define STRESS_SLOTS 4096u

struct stress_rec {
    uint64_t seq;   /* 0, 1, 2, ... */
    uint64_t check; /* seq * golden ratio constant: catches torn or stale slots */
};

#define STRESS_K 0x9e3779b97f4a7c15ull

/* Child: opens the segment by name, as another daemon would, and pushes STRESS_N records. */
static int stress_producer(const char *dir)
{
    struct common_ring_segment seg = {0};
    if (common_ring_segment_open(dir, "stress", &seg) != COMMON_OK)
        return 2;
    struct common_ring r;
    if (common_ring_attach(seg.mem, seg.bytes, sizeof(struct stress_rec), STRESS_SLOTS, &r) !=
        COMMON_OK)
        return 3;
    for (uint64_t i = 0; i < STRESS_N; i++) {
        struct stress_rec rec = {i, i * STRESS_K};
        if (common_ring_push_wait(&r, &rec, sizeof(rec), 10000) != COMMON_OK)
            return 4;
    }
    common_ring_segment_close(&seg);
    return 0;
}

Test(common_ring, two_process_stress, .timeout = 300)
{
    char tmp[64], dir[96];
    tmp_dir(tmp, sizeof(tmp));
    snprintf(dir, sizeof(dir), "%s/run", tmp);
    size_t                     bytes = common_ring_bytes(sizeof(struct stress_rec), STRESS_SLOTS);
    struct common_ring_segment seg = {0};
    cr_assert_eq(common_ring_segment_create(dir, "stress", bytes, &seg), COMMON_OK);
    cr_assert_eq(common_ring_init(seg.mem, seg.bytes, sizeof(struct stress_rec), STRESS_SLOTS),
                 COMMON_OK);
    struct common_ring r;
    cr_assert_eq(
        common_ring_attach(seg.mem, seg.bytes, sizeof(struct stress_rec), STRESS_SLOTS, &r),
        COMMON_OK);

    uint64_t t0 = common_now_ns();
    pid_t    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(stress_producer(dir));

    uint64_t got = 0, bad = 0, first_bad = UINT64_MAX;
    int      rc = COMMON_OK;
    for (; got < STRESS_N; got++) {
        struct stress_rec rec;
        rc = common_ring_pop_wait(&r, &rec, sizeof(rec), 10000);
        if (rc != (int)sizeof(rec))
            break;
        if (rec.seq != got || rec.check != got * STRESS_K) {
            if (bad++ == 0)
                first_bad = got;
        }
    }
    uint64_t ns = common_now_ns() - t0;
    int      status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "producer status %d", status);
    cr_assert_eq(got, STRESS_N, "popped %llu of %u records (last rc %s)", (unsigned long long)got,
                 STRESS_N, common_strerror(rc));
    cr_assert_eq(bad, 0, "%llu records out of order or damaged, first at %llu",
                 (unsigned long long)bad, (unsigned long long)first_bad);
    char buf[16];
    cr_assert_eq(common_ring_pop(&r, buf, sizeof(buf)), COMMON_EAGAIN, "nothing extra");
    fprintf(stderr, "two_process_stress: %u records of %zu bytes in %.3f s = %.2f M records/s\n",
            STRESS_N, sizeof(struct stress_rec), (double)ns / 1e9,
            (double)STRESS_N / ((double)ns / 1e9) / 1e6);
    common_ring_segment_close(&seg);
    rmdir(dir);
    rmdir(tmp);
}

/* ---- quiet pushes -----------------------------------------------------------------------------
 */

static void *quiet_pusher(void *arg)
{
    usleep(50 * 1000);
    uint64_t x = 77;
    return (void *)(intptr_t)common_ring_push_quiet(arg, &x, sizeof(x));
}

/* Quiet pushes keep FIFO order with ordinary ones, report a full ring, and a consumer asleep in
 * pop_wait still gets a quietly pushed record (at the latest when its wait times out). */
Test(common_ring, quiet_push_keeps_order_and_is_seen_by_a_sleeper, .timeout = 30)
{
    struct common_ring p, c;
    void              *mem = ring_new(16, 4, &p);
    cr_assert_eq(common_ring_attach(mem, common_ring_bytes(16, 4), 16, 4, &c), COMMON_OK);
    for (uint64_t v = 1; v <= 4; v++)
        cr_assert_eq((v & 1) ? common_ring_push_quiet(&p, &v, sizeof(v))
                             : common_ring_push(&p, &v, sizeof(v)),
                     COMMON_OK);
    uint64_t v = 5, w = 0;
    cr_assert_eq(common_ring_push_quiet(&p, &v, sizeof(v)), COMMON_EAGAIN, "the ring is full");
    for (uint64_t k = 1; k <= 4; k++) {
        cr_assert_eq(common_ring_pop(&c, &w, sizeof(w)), (int)sizeof(w));
        cr_assert_eq(w, k);
    }
    /* Nothing queued: the consumer sleeps; a quiet push lands while it waits. */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, quiet_pusher, &p), 0);
    /* Each wait sleeps (nothing wakes it: the push is quiet) and looks again when it times out;
     * however late the pusher runs, a wait after its push finds the record. */
    int rc;
    while ((rc = common_ring_pop_wait(&c, &w, sizeof(w), 100)) == COMMON_ETIMEDOUT)
        ;
    void *pushed = NULL;
    pthread_join(t, &pushed);
    cr_assert_eq((intptr_t)pushed, COMMON_OK);
    cr_assert_eq(rc, (int)sizeof(w), "pop_wait returned %d", rc);
    cr_assert_eq(w, 77);
    free(mem);
}
