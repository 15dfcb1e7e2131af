/* common/devmem_host.c - the host's emulation of shared device memory: memfd pieces mapped into
 * reserved address space, a copy thread for the copy stream, events as counters in a shared page
 * waited on as futexes, so the VRAM tier runs in CI without a device. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "devmem_impl.h"

#define HOST_GRAN       ((size_t)64 << 10) /* the pieces' and reservations' multiple */
#define HOST_MAX_RESV   64
#define HOST_EV_MAGIC   0x56454d44u /* "DMEV" read as a little-endian u32 */
#define HOST_EV_VERSION 1u
#define HOST_POLL_MS    50 /* how often a waiter checks that the recorder still lives */

/* ---- address space: reservations and the pieces mapped in them ---------------------------- */

struct common_devmem_piece {
    int                         fd; /* the memfd, sealed at its size */
    size_t                      bytes;
    uint8_t                    *at; /* where it is mapped here; NULL when not */
    struct common_devmem_piece *next_mapped;
};

struct host_resv {
    uint8_t *base;
    size_t   bytes;
};

static pthread_mutex_t             g_va_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_resv            g_resv[HOST_MAX_RESV];
static struct common_devmem_piece *g_mapped; /* every piece mapped in this process */

static void *host_reserve(size_t bytes, struct common_errmsg *e)
{
    size_t   span = bytes + HOST_GRAN;
    uint8_t *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        common_errmsg_set(e, COMMON_ENOMEM, "device memory: reserving %zu bytes: %s", bytes,
                          strerror(errno));
        return NULL;
    }
    /* Aligned to the granularity: the slack before and after goes back. */
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + HOST_GRAN - 1) & ~(uintptr_t)(HOST_GRAN - 1));
    if (base > raw)
        munmap(raw, (size_t)(base - raw));
    if (raw + span > base + bytes)
        munmap(base + bytes, (size_t)(raw + span - (base + bytes)));
    pthread_mutex_lock(&g_va_mu);
    for (int i = 0; i < HOST_MAX_RESV; i++) {
        if (!g_resv[i].base) {
            g_resv[i] = (struct host_resv){base, bytes};
            pthread_mutex_unlock(&g_va_mu);
            return base;
        }
    }
    pthread_mutex_unlock(&g_va_mu);
    munmap(base, bytes);
    common_errmsg_set(e, COMMON_ENOMEM, "device memory: more than %d reservations", HOST_MAX_RESV);
    return NULL;
}

static void host_unreserve(void *base, size_t bytes)
{
    pthread_mutex_lock(&g_va_mu);
    for (int i = 0; i < HOST_MAX_RESV; i++) {
        if (g_resv[i].base == base && g_resv[i].bytes == bytes) {
            munmap(base, bytes);
            g_resv[i] = (struct host_resv){0};
            break;
        }
    }
    pthread_mutex_unlock(&g_va_mu);
}

/* [p, p + n) lies inside one reservation. Under g_va_mu. */
static bool host_in_resv(const uint8_t *p, size_t n)
{
    for (int i = 0; i < HOST_MAX_RESV; i++) {
        const struct host_resv *r = &g_resv[i];
        if (r->base && p >= r->base && n <= r->bytes && (size_t)(p - r->base) <= r->bytes - n)
            return true;
    }
    return false;
}

/* The piece mapped over [p, p + n), or NULL (also when the range overlaps one only in part).
 * `any`: the first piece overlapping the range at all. Under g_va_mu. */
static struct common_devmem_piece *host_mapped_at(const uint8_t *p, size_t n, bool any)
{
    for (struct common_devmem_piece *q = g_mapped; q; q = q->next_mapped) {
        bool overlap = p < q->at + q->bytes && q->at < p + n;
        bool inside = p >= q->at && n <= q->bytes && (size_t)(p - q->at) <= q->bytes - n;
        if (any ? overlap : inside)
            return q;
    }
    return NULL;
}

/* ---- the copy stream: a thread running jobs in queue order --------------------------------- */

/* An event's shared page. recorded: records made so far; done: the last record whose copies are
 * done; pid: the process recording it. A record t is done when done - t >= 0 (wrapping). */
struct host_evpage {
    uint32_t         magic, version;
    _Atomic uint32_t recorded;
    _Atomic uint32_t done;
    _Atomic int32_t  pid;
};

struct common_devmem_event {
    int                 fd;
    struct host_evpage *pg;
    _Atomic int         refs; /* the owner's, and one per queued job */
};

enum host_job_kind { JOB_COPY, JOB_RECORD, JOB_WAIT };
struct host_job {
    enum host_job_kind          kind;
    void                       *dst;
    const void                 *src;
    size_t                      bytes;
    struct common_devmem_event *ev;
    uint32_t                    t;
    struct host_job            *next;
};

static struct {
    pthread_mutex_t  mu;
    pthread_cond_t   cv, idle;
    struct host_job *head, *tail;
    unsigned         running; /* jobs taken, not yet finished */
} g_q = {.mu = PTHREAD_MUTEX_INITIALIZER,
         .cv = PTHREAD_COND_INITIALIZER,
         .idle = PTHREAD_COND_INITIALIZER};

static _Atomic uint64_t g_busy_ns; /* the copier's time in memcpy */

static uint64_t host_copy_busy_ns(void)
{
    return atomic_load_explicit(&g_busy_ns, memory_order_relaxed);
}

static void host_ev_unref(struct common_devmem_event *ev)
{
    if (atomic_fetch_sub(&ev->refs, 1) == 1) {
        munmap(ev->pg, sizeof(*ev->pg));
        close(ev->fd);
        free(ev);
    }
}

static bool host_reached(const struct host_evpage *pg, uint32_t t)
{
    return (int32_t)(atomic_load_explicit(&pg->done, memory_order_acquire) - t) >= 0;
}

/* Whether the process recording pg is gone (its records will never be done). */
static bool host_recorder_gone(const struct host_evpage *pg)
{
    pid_t pid = atomic_load(&pg->pid);
    return pid > 0 && pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH;
}

/* Waits until record t of pg is done: 0, or COMMON_ECLOSED when its recorder died first. */
static int host_wait_for(struct host_evpage *pg, uint32_t t)
{
    for (;;) {
        uint32_t d = atomic_load_explicit(&pg->done, memory_order_acquire);
        if ((int32_t)(d - t) >= 0)
            return COMMON_OK;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = HOST_POLL_MS * 1000000L};
        long            r = syscall(SYS_futex, &pg->done, FUTEX_WAIT, d, &ts, NULL, 0);
        if (r != 0 && errno == ETIMEDOUT && host_recorder_gone(pg) && !host_reached(pg, t))
            return COMMON_ECLOSED;
    }
}

static void *host_copier(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_q.mu);
    for (;;) {
        while (!g_q.head)
            pthread_cond_wait(&g_q.cv, &g_q.mu);
        struct host_job *j = g_q.head;
        g_q.head = j->next;
        if (!g_q.head)
            g_q.tail = NULL;
        g_q.running++;
        pthread_mutex_unlock(&g_q.mu);
        if (j->kind == JOB_COPY) {
            const uint64_t t0 = common_now_ns();
            memcpy(j->dst, j->src, j->bytes);
            atomic_fetch_add_explicit(&g_busy_ns, common_now_ns() - t0, memory_order_relaxed);
        } else if (j->kind == JOB_RECORD) {
            atomic_store_explicit(&j->ev->pg->done, j->t, memory_order_release);
            syscall(SYS_futex, &j->ev->pg->done, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        } else {
            /* A recorder that died never finishes its record: the copies after it go on, as a
             * stream's wait for a dead process's event does not hold the stream for ever. */
            (void)host_wait_for(j->ev->pg, j->t);
        }
        if (j->ev)
            host_ev_unref(j->ev);
        free(j);
        pthread_mutex_lock(&g_q.mu);
        if (--g_q.running == 0 && !g_q.head)
            pthread_cond_broadcast(&g_q.idle);
    }
    return NULL;
}

static int host_push(const struct host_job *tmpl, struct common_errmsg *e)
{
    struct host_job *j = malloc(sizeof(*j));
    if (!j)
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: out of host memory");
    *j = *tmpl;
    j->next = NULL;
    if (j->ev)
        atomic_fetch_add(&j->ev->refs, 1);
    pthread_mutex_lock(&g_q.mu);
    if (g_q.tail)
        g_q.tail->next = j;
    else
        g_q.head = j;
    g_q.tail = j;
    pthread_cond_signal(&g_q.cv);
    pthread_mutex_unlock(&g_q.mu);
    return COMMON_OK;
}

/* Waits until every queued job ran (before memory the jobs may touch goes away). */
static void host_drain(void)
{
    pthread_mutex_lock(&g_q.mu);
    while (g_q.head || g_q.running)
        pthread_cond_wait(&g_q.idle, &g_q.mu);
    pthread_mutex_unlock(&g_q.mu);
}

int common_host_device_count(void)
{
    const char *v = getenv("SLUICE_GPU_HOST_DEVICES");
    char       *end = NULL;
    const long  n = v ? strtol(v, &end, 10) : 1;
    return v && end != v && !*end && n >= 1 && n <= COMMON_HOST_MAX_DEVICES ? (int)n : 1;
}

static int host_open(int dev, size_t *granularity, struct common_errmsg *e)
{
    const int n = common_host_device_count(); /* as many as the executor's host backend */
    if (dev >= n)
        return common_errmsg_set(e, COMMON_EINVAL, "device %d: the host backend has HOST0..HOST%d",
                                 dev, n - 1);
    *granularity = HOST_GRAN;
    static bool started; /* one copy thread for every device (open runs under devmem.c's lock) */
    if (started)
        return COMMON_OK;
    pthread_t      th;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &a, host_copier, NULL);
    pthread_attr_destroy(&a);
    if (rc != 0)
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: no copy thread: %s",
                                 strerror(rc));
    started = true;
    return COMMON_OK;
}

/* ---- pieces -------------------------------------------------------------------------------- */

static int host_piece_create(size_t bytes, struct common_devmem_piece **out,
                             struct common_errmsg *e)
{
    int fd = memfd_create("sluice-devmem", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: memfd: %s", strerror(errno));
    struct common_devmem_piece *p = calloc(1, sizeof(*p));
    if (!p || ftruncate(fd, (off_t)bytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int err = errno;
        free(p);
        close(fd);
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: a piece of %zu bytes: %s", bytes,
                                 strerror(err));
    }
    p->fd = fd;
    p->bytes = bytes;
    *out = p;
    return COMMON_OK;
}

/* A handle of the memfd fd: a new descriptor of it, no bytes. */
static int host_export_fd(int fd, const char *what, struct common_devmem_handle *h,
                          struct common_errmsg *e)
{
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return common_errmsg_set(e, COMMON_EIO, "%s: dup: %s", what, strerror(errno));
    h->fd = dup;
    h->len = 0;
    return COMMON_OK;
}

static int host_piece_export(const struct common_devmem_piece *p, struct common_devmem_handle *h,
                             struct common_errmsg *e)
{
    return host_export_fd(p->fd, "device memory", h, e);
}

/* fd is a sealed memfd of exactly `bytes` (so a mapping of it can never fault for want of
 * pages): 0, or COMMON_EINVAL naming what is wrong. */
static int host_check_memfd(int fd, size_t bytes, const char *what, struct common_errmsg *e)
{
    struct stat st;
    int         seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || seals < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "%s: the descriptor is not shared memory", what);
    if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return common_errmsg_set(e, COMMON_EINVAL, "%s: the shared memory's size is not sealed",
                                 what);
    if ((uint64_t)st.st_size != bytes)
        return common_errmsg_set(e, COMMON_EINVAL, "%s: %lld bytes, not the %zu expected", what,
                                 (long long)st.st_size, bytes);
    return COMMON_OK;
}

static int host_piece_import(int fd, size_t bytes, struct common_devmem_piece **out,
                             struct common_errmsg *e)
{
    int                         rc = host_check_memfd(fd, bytes, "device memory", e);
    struct common_devmem_piece *p = rc == COMMON_OK ? calloc(1, sizeof(*p)) : NULL;
    if (!p) {
        close(fd);
        return rc != COMMON_OK
                   ? rc
                   : common_errmsg_set(e, COMMON_ENOMEM, "device memory: out of memory");
    }
    p->fd = fd;
    p->bytes = bytes;
    *out = p;
    return COMMON_OK;
}

static int host_piece_map(struct common_devmem_piece *p, void *at, struct common_errmsg *e)
{
    uint8_t *u = at;
    int      rc = COMMON_OK;
    pthread_mutex_lock(&g_va_mu);
    if (p->at)
        rc = common_errmsg_set(e, COMMON_EBUSY, "device memory: the piece is mapped already");
    else if (!host_in_resv(u, p->bytes))
        rc = common_errmsg_set(e, COMMON_EINVAL,
                               "device memory: [%p, +%zu) is not inside a reservation", at,
                               p->bytes);
    else if (host_mapped_at(u, p->bytes, true))
        rc = common_errmsg_set(e, COMMON_EBUSY,
                               "device memory: [%p, +%zu) overlaps a piece mapped there", at,
                               p->bytes);
    else if (mmap(u, p->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, p->fd, 0) ==
             MAP_FAILED)
        rc = common_errmsg_set(e, COMMON_ENOMEM, "device memory: mapping %zu bytes: %s", p->bytes,
                               strerror(errno));
    if (rc == COMMON_OK) {
        p->at = u;
        p->next_mapped = g_mapped;
        g_mapped = p;
    }
    pthread_mutex_unlock(&g_va_mu);
    return rc;
}

static void host_piece_destroy(struct common_devmem_piece *p)
{
    host_drain(); /* no queued copy writes into it any more */
    pthread_mutex_lock(&g_va_mu);
    if (p->at) {
        for (struct common_devmem_piece **q = &g_mapped; *q; q = &(*q)->next_mapped) {
            if (*q == p) {
                *q = p->next_mapped;
                break;
            }
        }
        /* Back to reserved address space, nothing behind it. */
        (void)mmap(p->at, p->bytes, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    }
    pthread_mutex_unlock(&g_va_mu);
    close(p->fd);
    free(p);
}

static size_t host_piece_bytes(const struct common_devmem_piece *p)
{
    return p->bytes;
}

/* Registrations of host memory, checked as CUDA checks them: mapped, not overlapping one. */
#define HOST_MAX_REGS 64
static struct {
    uintptr_t p;
    size_t    bytes;
} g_regs[HOST_MAX_REGS];
static unsigned        g_n_regs;
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;

static int host_host_register(const void *p, size_t bytes, struct common_errmsg *e)
{
    const uintptr_t a = (uintptr_t)p;
    const void     *hole = common_unmapped_page(p, bytes);
    if (hole)
        return common_errmsg_set(e, COMMON_EINVAL, "registering host memory: %p is not mapped",
                                 hole);
    int rc = COMMON_OK;
    pthread_mutex_lock(&g_reg_mu);
    for (unsigned i = 0; i < g_n_regs && rc == COMMON_OK; i++)
        if (a < g_regs[i].p + g_regs[i].bytes && g_regs[i].p < a + bytes)
            rc = common_errmsg_set(e, COMMON_EINVAL,
                                   "registering host memory: part of it is registered already");
    if (rc == COMMON_OK && g_n_regs == HOST_MAX_REGS)
        rc = common_errmsg_set(e, COMMON_ENOMEM, "registering host memory: too many");
    if (rc == COMMON_OK) {
        g_regs[g_n_regs].p = a;
        g_regs[g_n_regs++].bytes = bytes;
    }
    pthread_mutex_unlock(&g_reg_mu);
    return rc;
}

static void host_host_unregister(const void *p)
{
    pthread_mutex_lock(&g_reg_mu);
    for (unsigned i = 0; i < g_n_regs; i++)
        if (g_regs[i].p == (uintptr_t)p) {
            g_regs[i] = g_regs[--g_n_regs];
            break;
        }
    pthread_mutex_unlock(&g_reg_mu);
}

static int host_copy_async(void *dst, const void *src, size_t bytes, struct common_errmsg *e)
{
    pthread_mutex_lock(&g_va_mu);
    bool ok = host_mapped_at(dst, bytes, false) != NULL;
    pthread_mutex_unlock(&g_va_mu);
    if (!ok)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "device memory: a copy to [%p, +%zu), which no mapped piece holds",
                                 dst, bytes);
    return host_push(&(struct host_job){.kind = JOB_COPY, .dst = dst, .src = src, .bytes = bytes},
                     e);
}

/* ---- events --------------------------------------------------------------------------------- */

static int host_ev_map(int fd, struct common_devmem_event **out, struct common_errmsg *e)
{
    struct host_evpage *pg = mmap(NULL, sizeof(*pg), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    struct common_devmem_event *ev = pg != MAP_FAILED ? calloc(1, sizeof(*ev)) : NULL;
    if (!ev) {
        if (pg != MAP_FAILED)
            munmap(pg, sizeof(*pg));
        return common_errmsg_set(e, COMMON_ENOMEM, "device event: out of memory");
    }
    ev->fd = fd;
    ev->pg = pg;
    atomic_init(&ev->refs, 1);
    *out = ev;
    return COMMON_OK;
}

static int host_event_create(struct common_devmem_event **out, struct common_errmsg *e)
{
    int fd = memfd_create("sluice-devmem-event", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, sizeof(struct host_evpage)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return common_errmsg_set(e, COMMON_ENOMEM, "device event: %s", strerror(err));
    }
    int rc = host_ev_map(fd, out, e);
    if (rc != COMMON_OK) {
        close(fd);
        return rc;
    }
    (*out)->pg->magic = HOST_EV_MAGIC;
    (*out)->pg->version = HOST_EV_VERSION;
    return COMMON_OK;
}

static int host_event_export(const struct common_devmem_event *ev, struct common_devmem_handle *h,
                             struct common_errmsg *e)
{
    return host_export_fd(ev->fd, "device event", h, e);
}

static int host_event_import(struct common_devmem_handle *h, struct common_devmem_event **out,
                             struct common_errmsg *e)
{
    if (h->fd < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "device event: the handle has no descriptor");
    int rc = host_check_memfd(h->fd, sizeof(struct host_evpage), "device event", e);
    if (rc == COMMON_OK && (rc = host_ev_map(h->fd, out, e)) == COMMON_OK) {
        h->fd = -1; /* taken */
        if ((*out)->pg->magic != HOST_EV_MAGIC || (*out)->pg->version != HOST_EV_VERSION) {
            host_ev_unref(*out);
            *out = NULL;
            rc = common_errmsg_set(e, COMMON_EINVAL, "device event: not an event's page");
        }
    }
    return rc;
}

static int host_event_record(struct common_devmem_event *ev, struct common_errmsg *e)
{
    atomic_store(&ev->pg->pid, (int32_t)getpid());
    uint32_t t = atomic_fetch_add(&ev->pg->recorded, 1) + 1;
    return host_push(&(struct host_job){.kind = JOB_RECORD, .ev = ev, .t = t}, e);
}

static int host_event_wait(struct common_devmem_event *ev, struct common_errmsg *e)
{
    uint32_t t = atomic_load(&ev->pg->recorded);
    if (host_reached(ev->pg, t))
        return COMMON_OK;
    return host_push(&(struct host_job){.kind = JOB_WAIT, .ev = ev, .t = t}, e);
}

static int host_event_sync(struct common_devmem_event *ev, struct common_errmsg *e)
{
    if (host_wait_for(ev->pg, atomic_load(&ev->pg->recorded)) != COMMON_OK)
        return common_errmsg_set(e, COMMON_ECLOSED,
                                 "device event: the process recording it (pid %d) is gone",
                                 (int)atomic_load(&ev->pg->pid));
    return COMMON_OK;
}

static bool host_event_is_done(struct common_devmem_event *ev)
{
    return host_reached(ev->pg, atomic_load(&ev->pg->recorded)) || host_recorder_gone(ev->pg);
}

static void host_event_destroy(struct common_devmem_event *ev)
{
    host_ev_unref(ev);
}

static void *host_event_native(struct common_devmem_event *ev)
{
    (void)ev;
    return NULL;
}

static const struct devmem_backend g_host = {
    .name = "HOST",
    .open = host_open,
    .reserve = host_reserve,
    .unreserve = host_unreserve,
    .piece_create = host_piece_create,
    .piece_export = host_piece_export,
    .piece_import = host_piece_import,
    .piece_map = host_piece_map,
    .piece_destroy = host_piece_destroy,
    .piece_bytes = host_piece_bytes,
    .copy_async = host_copy_async,
    .copy_busy_ns = host_copy_busy_ns,
    .host_register = host_host_register,
    .host_unregister = host_host_unregister,
    .event_create = host_event_create,
    .event_export = host_event_export,
    .event_import = host_event_import,
    .event_record = host_event_record,
    .event_wait = host_event_wait,
    .event_sync = host_event_sync,
    .event_is_done = host_event_is_done,
    .event_destroy = host_event_destroy,
    .event_native = host_event_native,
};

const struct devmem_backend *devmem_host_backend(void)
{
    return &g_host;
}
