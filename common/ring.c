/* common/ring.c - single-producer/single-consumer record rings in shared memory, futex wake-ups. */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Polls of the peer's index before a blocking call sleeps (kept short: on 2 cores a spinning
 * reader takes the compute threads' CPU; 32 measured better than 256): a peer in a burst
 * answers within this, and a futex round trip costs far more than these loads. */
#define RING_SPIN 32

/* Each slot: the record length as a u32, padding to 8 bytes, then the record. */
#define RING_SLOT_DATA 8u

static bool ring_is_pow2(uint32_t n)
{
    return n != 0 && (n & (n - 1)) == 0;
}

static void ring_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

uint32_t common_ring_stride(uint32_t slot_bytes)
{
    if (slot_bytes == 0 || slot_bytes > COMMON_RING_MAX_SLOT_BYTES)
        return 0;
    return RING_SLOT_DATA + ((slot_bytes + 7u) & ~7u);
}

size_t common_ring_bytes(uint32_t slot_bytes, uint32_t n_slots)
{
    uint32_t stride = common_ring_stride(slot_bytes);
    if (stride == 0 || !ring_is_pow2(n_slots) || n_slots > COMMON_RING_MAX_SLOTS)
        return 0;
    if ((size_t)stride > (SIZE_MAX - sizeof(struct common_ring_hdr)) / n_slots)
        return 0;
    return sizeof(struct common_ring_hdr) + (size_t)stride * n_slots;
}

int common_ring_init(void *mem, size_t len, uint32_t slot_bytes, uint32_t n_slots)
{
    size_t need = common_ring_bytes(slot_bytes, n_slots);
    if (mem == NULL || need == 0 || len < need || ((uintptr_t)mem & 63u) != 0)
        return COMMON_EINVAL;
    struct common_ring_hdr *h = mem;
    h->magic = COMMON_RING_MAGIC;
    h->version = COMMON_RING_VERSION;
    h->slot_bytes = slot_bytes;
    h->n_slots = n_slots;
    atomic_init(&h->head, 0);
    atomic_init(&h->cons_waiting, 0);
    atomic_init(&h->tail, 0);
    atomic_init(&h->prod_waiting, 0);
    memset((unsigned char *)mem + sizeof(*h), 0, need - sizeof(*h));
    return COMMON_OK;
}

int common_ring_attach(void *mem, size_t len, uint32_t slot_bytes, uint32_t n_slots,
                       struct common_ring *out)
{
    size_t need = common_ring_bytes(slot_bytes, n_slots);
    if (mem == NULL || out == NULL || need == 0 || ((uintptr_t)mem & 63u) != 0)
        return COMMON_EINVAL;
    if (len < sizeof(struct common_ring_hdr))
        return COMMON_ECORRUPT;
    struct common_ring_hdr *h = mem;
    if (h->magic != COMMON_RING_MAGIC || h->version != COMMON_RING_VERSION ||
        h->slot_bytes != slot_bytes || h->n_slots != n_slots || len < need)
        return COMMON_ECORRUPT;
    /* Acquire: slots published before this head are visible to a consumer that starts from it;
     * pairs with the release (seq_cst) store of head in common_ring_push(). */
    uint32_t head = atomic_load_explicit(&h->head, memory_order_acquire);
    /* Acquire: the consumer's reads of slots below this tail are done before a producer that
     * starts from it reuses them; pairs with the release (seq_cst) store of tail in
     * common_ring_pop(). */
    uint32_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
    if (head - tail > n_slots)
        return COMMON_ECORRUPT;
    *out = (struct common_ring){
        .hdr = h,
        .slots = (unsigned char *)mem + sizeof(*h),
        .slot_bytes = slot_bytes,
        .n_slots = n_slots,
        .stride = common_ring_stride(slot_bytes),
        .tail_seen = tail,
        .head_seen = head,
    };
    return COMMON_OK;
}

static unsigned char *ring_slot(const struct common_ring *r, uint32_t idx)
{
    return r->slots + (size_t)(idx & (r->n_slots - 1)) * r->stride;
}

/* Wakes the peer sleeping on `word` if its sleep counter `waiting` is odd. `woken` remembers the
 * sleep that our last successful FUTEX_WAKE ended, so a peer that is slow to get going again costs
 * one system call, not one per record. Called right after the seq_cst store of our index; see
 * ring_sleep() for why that store and the load below are seq_cst. */
static void ring_wake(_Atomic uint32_t *waiting, _Atomic uint32_t *word, uint32_t *woken)
{
    /* Seq_cst: not reordered before our index store above; pairs with the seq_cst store of
     * `waiting` and load of `word` in ring_sleep() (either the sleeper sees our new index or we
     * see its odd counter, so no wake-up is lost). */
    uint32_t w = atomic_load_explicit(waiting, memory_order_seq_cst);
    if ((w & 1u) == 0 || w == *woken)
        return;
    /* Only a wake that reached a sleeper may suppress later ones: when none was in the kernel yet
     * (0 woken), the peer may still sleep on an index it read after our store, so we wake again
     * on the next record. */
    if (syscall(SYS_futex, word, FUTEX_WAKE, 1, NULL, NULL, 0) > 0)
        *woken = w;
}

static int ring_push(struct common_ring *r, const void *rec, size_t len, bool wake)
{
    if (len > r->slot_bytes)
        return COMMON_EINVAL;
    struct common_ring_hdr *h = r->hdr;
    /* Relaxed: head is written only by this side. */
    uint32_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
    uint32_t used = head - r->tail_seen;
    if (used >= r->n_slots) {
        /* Acquire: the consumer has finished copying out every slot below tail before we reuse
         * one; pairs with the release (seq_cst) store of tail in common_ring_pop(). */
        uint32_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);
        used = head - tail;
        if (used > r->n_slots)
            return COMMON_ECORRUPT;
        r->tail_seen = tail;
        if (used == r->n_slots)
            return COMMON_EAGAIN;
    }
    unsigned char *slot = ring_slot(r, head);
    uint32_t       len32 = (uint32_t)len;
    memcpy(slot, &len32, sizeof(len32));
    if (len != 0)
        memcpy(slot + RING_SLOT_DATA, rec, len);
    /* Seq_cst, a release plus: the slot bytes written above become visible before the new head
     * (pairs with the acquire load of head in common_ring_pop() and common_ring_attach()), and
     * the store is ordered before ring_wake()'s load of cons_waiting (pairs with ring_sleep()). */
    atomic_store_explicit(&h->head, head + 1, memory_order_seq_cst);
    if (wake)
        ring_wake(&h->cons_waiting, &h->head, &r->cons_woken);
    return COMMON_OK;
}

int common_ring_push(struct common_ring *r, const void *rec, size_t len)
{
    return ring_push(r, rec, len, true);
}

int common_ring_push_quiet(struct common_ring *r, const void *rec, size_t len)
{
    return ring_push(r, rec, len, false);
}

int common_ring_pop(struct common_ring *r, void *rec, size_t cap)
{
    struct common_ring_hdr *h = r->hdr;
    /* Relaxed: tail is written only by this side. */
    uint32_t tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
    uint32_t avail = r->head_seen - tail;
    if (avail == 0 || avail > r->n_slots) {
        /* Acquire: the producer's slot bytes are visible once we see its head; pairs with the
         * release (seq_cst) store of head in common_ring_push(). */
        uint32_t head = atomic_load_explicit(&h->head, memory_order_acquire);
        avail = head - tail;
        if (avail > r->n_slots)
            return COMMON_ECORRUPT;
        r->head_seen = head;
        if (avail == 0)
            return COMMON_EAGAIN;
    }
    const unsigned char *slot = ring_slot(r, tail);
    uint32_t             len;
    memcpy(&len, slot, sizeof(len)); /* written by the peer: checked before use */
    if (len > r->slot_bytes)
        return COMMON_ECORRUPT;
    if (len > cap)
        return COMMON_EINVAL;
    if (len != 0)
        memcpy(rec, slot + RING_SLOT_DATA, len);
    /* Seq_cst, a release plus: our reads of the slot are done before the producer may reuse it
     * (pairs with the acquire load of tail in common_ring_push() and common_ring_attach()), and
     * the store is ordered before ring_wake()'s load of prod_waiting (pairs with ring_sleep()). */
    atomic_store_explicit(&h->tail, tail + 1, memory_order_seq_cst);
    ring_wake(&h->prod_waiting, &h->tail, &r->prod_woken);
    return (int)len;
}

/* Deadline in common_now_ns() time for `timeout_ms`; UINT64_MAX means never. */
static uint64_t ring_deadline(int timeout_ms)
{
    if (timeout_ms < 0)
        return UINT64_MAX;
    return common_now_ns() + (uint64_t)timeout_ms * 1000000u;
}

/* Makes our sleep counter `waiting` odd and sleeps while the peer's index `word` still equals
 * `seen`, at most until `deadline`, then makes the counter even again. Returns 0 to retry,
 * COMMON_ETIMEDOUT or COMMON_EIO. Dekker-style handshake: we store the counter then load the
 * index, the peer stores the index then loads the counter, all seq_cst, so at least one side sees
 * the other's store; FUTEX_WAIT re-checks the word in the kernel, so a wake that comes between
 * our load and the sleep is not lost either. Only this side writes `waiting`: a peer acting on a
 * stale view can never lower a flag raised for a later sleep. */
static int ring_sleep(_Atomic uint32_t *waiting, _Atomic uint32_t *word, uint32_t seen,
                      uint64_t deadline)
{
    /* Relaxed: only this side writes the counter. */
    uint32_t w = atomic_load_explicit(waiting, memory_order_relaxed) | 1u;
    /* Seq_cst: ordered before the load of the index below; pairs with the seq_cst index store
     * and counter load in common_ring_push()/common_ring_pop() via ring_wake(). */
    atomic_store_explicit(waiting, w, memory_order_seq_cst);
    int rc = COMMON_OK;
    /* Seq_cst: see the store above. */
    if (atomic_load_explicit(word, memory_order_seq_cst) != seen)
        goto out;
    struct timespec  ts;
    struct timespec *tsp = NULL;
    if (deadline != UINT64_MAX) {
        uint64_t now = common_now_ns();
        if (now >= deadline) {
            rc = COMMON_ETIMEDOUT;
            goto out;
        }
        uint64_t left = deadline - now;
        ts.tv_sec = (time_t)(left / 1000000000u);
        ts.tv_nsec = (long)(left % 1000000000u);
        tsp = &ts;
    }
    /* Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes. */
    if (syscall(SYS_futex, word, FUTEX_WAIT, seen, tsp, NULL, 0) == -1 && errno != EAGAIN &&
        errno != EINTR && errno != ETIMEDOUT)
        rc = COMMON_EIO;
out:
    /* Relaxed: going back to even only spares the peer wake-ups; if it sees the odd value late,
     * it makes one needless FUTEX_WAKE. */
    atomic_store_explicit(waiting, w + 1u, memory_order_relaxed);
    return rc;
}

int common_ring_push_wait(struct common_ring *r, const void *rec, size_t len, int timeout_ms)
{
    uint64_t deadline = ring_deadline(timeout_ms);
    for (;;) {
        for (int i = 0; i <= RING_SPIN; i++) { /* one try at least */
            int rc = common_ring_push(r, rec, len);
            if (rc != COMMON_EAGAIN)
                return rc;
            ring_relax();
        }
        int rc = ring_sleep(&r->hdr->prod_waiting, &r->hdr->tail, r->tail_seen, deadline);
        if (rc != COMMON_OK)
            return rc;
    }
}

int common_ring_pop_wait(struct common_ring *r, void *rec, size_t cap, int timeout_ms)
{
    uint64_t deadline = ring_deadline(timeout_ms);
    for (;;) {
        for (int i = 0; i <= RING_SPIN; i++) { /* one try at least */
            int rc = common_ring_pop(r, rec, cap);
            if (rc != COMMON_EAGAIN)
                return rc;
            ring_relax();
        }
        int rc = ring_sleep(&r->hdr->cons_waiting, &r->hdr->head, r->head_seen, deadline);
        if (rc != COMMON_OK)
            return rc;
    }
}

/* ---- segments ------------------------------------------------------------------------------ */

static bool ring_name_ok(const char *name)
{
    return name != NULL && name[0] != '\0' && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

/* Checks that `dir` is a real directory owned by us without group/other permissions, creating it
 * with mode 0700 first when `create` and it is missing. */
static int ring_dir_check(const char *dir, bool create)
{
    struct stat st;
    if (!create && lstat(dir, &st) != 0)
        return common_err_from_errno(errno);
    return common_run_dir_prepare(dir, NULL);
}

static char *ring_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char  *p = malloc(n);
    if (p != NULL)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int common_ring_segment_create(const char *dir, const char *name, size_t bytes,
                               struct common_ring_segment *seg)
{
    if (dir == NULL || seg == NULL || !ring_name_ok(name) || bytes == 0 ||
        bytes > (size_t)INT64_MAX)
        return COMMON_EINVAL;
    int rc = ring_dir_check(dir, true);
    if (rc != COMMON_OK)
        return rc;
    char *path = ring_path(dir, name);
    if (path == NULL)
        return COMMON_ENOMEM;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = errno == EEXIST ? COMMON_EBUSY : common_err_from_errno(errno);
        goto out_free_path;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        rc = common_err_from_errno(errno);
        goto out_unlink;
    }
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        rc = common_err_from_errno(errno);
        goto out_unlink;
    }
    close(fd);
    *seg = (struct common_ring_segment){.mem = mem, .bytes = bytes, .path = path};
    return COMMON_OK;

out_unlink:
    unlink(path);
    close(fd);
out_free_path:
    free(path);
    return rc;
}

int common_ring_segment_open(const char *dir, const char *name, struct common_ring_segment *seg)
{
    if (dir == NULL || seg == NULL || !ring_name_ok(name))
        return COMMON_EINVAL;
    int rc = ring_dir_check(dir, false);
    if (rc != COMMON_OK)
        return rc;
    char *path = ring_path(dir, name);
    if (path == NULL)
        return COMMON_ENOMEM;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    free(path);
    if (fd < 0)
        return common_err_from_errno(errno);
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = common_err_from_errno(errno);
        goto out_close_fd;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        rc = COMMON_EINVAL;
        goto out_close_fd;
    }
    if (st.st_size < (off_t)sizeof(struct common_ring_hdr) ||
        (uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        rc = COMMON_ECORRUPT;
        goto out_close_fd;
    }
    size_t bytes = (size_t)st.st_size;
    void  *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) {
        rc = common_err_from_errno(errno);
        goto out_close_fd;
    }
    close(fd);
    *seg = (struct common_ring_segment){.mem = mem, .bytes = bytes, .path = NULL};
    return COMMON_OK;

out_close_fd:
    close(fd);
    return rc;
}

void common_ring_segment_close(struct common_ring_segment *seg)
{
    if (seg == NULL)
        return;
    if (seg->mem != NULL && seg->mem != MAP_FAILED)
        munmap(seg->mem, seg->bytes);
    if (seg->path != NULL) {
        unlink(seg->path);
        free(seg->path);
    }
    *seg = (struct common_ring_segment){0};
}
