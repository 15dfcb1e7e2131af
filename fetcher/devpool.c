/* fetcher/devpool.c - the fetcher's device expert pool: memory and events made with
 * common_devmem, handed to the executor over a Unix socket, filled from the RAM pool on the
 * fetcher's copy stream as the executor's ring records ask. */
#include "devpool.h"

#include "front.h"
#include "io.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEVPOOL_POLL_MS 200 /* socket waits: how soon stop shows */
/* How long a dropped pool's queued copies may take before the copy stream counts as stuck (see
 * devpool_drain): about 30 s. */
#define DEVPOOL_DRAIN_MS 30000

/* A staging slot's state. */
enum devpool_stage_state {
    STAGE_EMPTY = 0,
    STAGE_QUEUED, /* its bundle is to be read at the next flush */
    STAGE_READY,  /* holds the bundle, checked */
    STAGE_FAILED, /* its read or check failed */
};

struct devpool_stage {
    uint32_t                    layer, expert;
    enum devpool_stage_state    state;
    uint64_t                    tick;    /* last use, for reuse in LRU order */
    struct common_devmem_event *ev;      /* recorded after the copies from it */
    bool                        copying; /* ev recorded and not yet waited for */
    uint32_t                    pending; /* deferred copies from it */
    uint32_t                    reads;   /* a flush's reads of it */
    uint32_t                    done;    /* of which completed */
    uint64_t                    bytes;   /* their bytes read */
    int                         err;     /* a flush's first failed completion */
    struct fetcher_io_cqe       err_cqe;
};

/* A DEV_READ waiting for its bundle's read: the copy it asks for. */
struct devpool_defer {
    uint32_t slot, part;
    uint64_t dst, bytes;
    bool     issued; /* queued (or told failed) by the flush under way */
};

struct fetcher_devpool {
    char           *path;      /* owned: the socket file */
    int             listen_fd; /* owned */
    pthread_t       thread;
    bool            started;
    _Atomic bool    stop;
    uint64_t        budget;
    const uint8_t  *ram; /* borrowed: the RAM pool's mapping */
    uint64_t        ram_bytes;
    pthread_mutex_t mu; /* everything below */
    /* The open pool (open: every field valid). */
    bool                          open;
    bool                          adopts; /* the memory is another fetcher's (ADOPT) */
    uint8_t                      *base; /* reserved: bytes */
    uint64_t                      bytes, gran;
    uint32_t                      n_pieces; /* bytes / gran */
    struct common_devmem_piece  **pieces;   /* owned: n_pieces entries, NULL = not made */
    struct common_devmem_event   *ev[PROTO_DEVPOOL_MAX_EVENTS];
    uint32_t                      n_events;
    struct common_devmem_event   *kev;      /* imported: the executor's kernels */
    void                         *ctl_page; /* mapped control page */
    _Atomic uint32_t             *ctl;      /* its first word: the last mark's sequence */
    _Atomic uint64_t             *ctl_busy; /* at offset 8: copy time since OPEN */
    uint64_t                      busy0;    /* copy time at OPEN */
    int                           dev;      /* the device opened (-1: none yet) */
    bool                          pinned;   /* ram registered with the device (once it is open) */
    struct fetcher_devpool_counts c;
    /* Staging (stage_from set): bundles read from storage for DEV_READ. */
    struct fetcher        *f;     /* borrowed */
    uint8_t               *stage; /* owned: n_stage * stage_bytes, mapped */
    uint64_t               stage_bytes;
    uint32_t               n_stage;
    bool                   stage_pinned;
    struct fetcher_io     *io; /* owned: reads into `stage` */
    struct devpool_stage   st[FETCHER_DEVPOOL_STAGE_SLOTS];
    struct devpool_defer  *defer; /* owned: DEV_READs waiting for the next flush */
    uint32_t               n_defer, cap_defer;
    uint64_t               tick;
    bool failed; /* a copy or read refused or failed since the last mark: the mark says so */
    _Atomic uint32_t      *ctl_failed;  /* the control page's word at offset 16 */
    struct fetcher_io_req *reqs;        /* owned: a flush's reads */
    struct fetcher_io_cqe *cqes;        /* owned: their completions */
    /* A pool of this process (fetcher_devpool_local_open): no socket; its records are done in
     * order on `worker`, as a fetcher's link thread does a ring's, and the caller's marks and
     * waits go through the control page as an executor's do. */
    bool                    local;
    struct fetcher_devpool_pin *pin;    /* borrowed: the RAM pool's registration, shared */
    bool                        select; /* each record selects the device first */
    pthread_t               worker;
    bool                    worker_started;
    pthread_mutex_t         qmu; /* everything below */
    pthread_cond_t          qcv;
    struct proto_fetch_req *q; /* owned: a ring of q_cap records, q_n of them from q_head */
    uint32_t                q_head, q_n, q_cap;
    bool                    q_stop;
    uint32_t                seq;                             /* the last mark asked */
    uint32_t                pend[PROTO_DEVPOOL_MAX_EVENTS];  /* event k's last mark, 0 = none */
    bool                    dirty[PROTO_DEVPOOL_MAX_EVENTS]; /* copies since event k's mark */
    uint32_t                failed_seen; /* the control page's failure word, as last seen */
};

/* ---- the pool ----------------------------------------------------------------------------- */

/* Waits until the copy stream has passed ev, giving up after about DEVPOOL_DRAIN_MS. The stream may
 * hold a wait on the executor's event (DEV_WAIT): if the executor died before that event was
 * done, CUDA does not say the wait ever ends (an interprocess event whose process is gone is
 * undefined), and every copy after it, for any executor, would wait behind it. A fetcher whose
 * stream is stuck so ends, for its supervisor to restart it with a fresh one, rather than hang. */
static void devpool_drain(const struct fetcher_devpool *d, struct common_devmem_event *ev)
{
    for (unsigned waited = 0; !common_devmem_event_is_done(ev); waited++) {
        if (waited >= DEVPOOL_DRAIN_MS) {
            COMMON_LOG_ERR("fetcher.devpool",
                           "device %d: the copy stream has not moved for %d s after its "
                           "executor went (a wait on that executor's event that never ends); "
                           "exiting, for the supervisor to restart this fetcher",
                           d->dev, DEVPOOL_DRAIN_MS / 1000);
            _exit(EXIT_FAILURE);
        }
        usleep(1000);
    }
}

/* Drops the open pool once its queued copies are done. mu held. */
static void devpool_drop_locked(struct fetcher_devpool *d)
{
    if (!d->open && !d->base && !d->pieces)
        return;
    d->open = false;
    if (d->n_events && d->ev[0] && common_devmem_event_record(d->ev[0], NULL) == 0)
        devpool_drain(d, d->ev[0]);
    for (uint32_t i = 0; i < d->n_stage; i++) {
        common_devmem_event_destroy(d->st[i].ev); /* the copies from it are done (above) */
        d->st[i] = (struct devpool_stage){0};
    }
    d->n_defer = 0;
    d->failed = false;
    for (uint32_t k = 0; d->pieces && k < d->n_pieces; k++)
        common_devmem_piece_destroy(d->pieces[k]);
    free(d->pieces);
    d->pieces = NULL;
    if (d->base)
        common_devmem_unreserve(d->base, d->bytes);
    d->base = NULL;
    for (uint32_t k = 0; k < d->n_events; k++)
        common_devmem_event_destroy(d->ev[k]);
    memset(d->ev, 0, sizeof(d->ev));
    d->n_events = 0;
    common_devmem_event_destroy(d->kev);
    d->kev = NULL;
    if (d->ctl_page)
        munmap(d->ctl_page, PROTO_DEVPOOL_CTL_BYTES);
    d->ctl_page = NULL;
    d->ctl = NULL;
    d->ctl_busy = NULL;
    d->ctl_failed = NULL;
    d->c.bytes = 0;
}

static int devpool_send_error(int sock, const char *text)
{
    struct common_devmem_handle h = {.fd = -1};
    size_t                      n = strlen(text);
    n = n < COMMON_DEVMEM_BLOB - 1 ? n : COMMON_DEVMEM_BLOB - 1;
    memcpy(h.blob, text, n);
    h.len = (uint32_t)n + 1;
    return common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_ERROR);
}

static void devpool_count_refused(struct fetcher_devpool *d)
{
    pthread_mutex_lock(&d->mu);
    d->c.refused++;
    pthread_mutex_unlock(&d->mu);
}

/* Receives one message, waiting while the service runs. COMMON_ECLOSED when it stops. */
static int devpool_recv(struct fetcher_devpool *d, int sock, struct common_devmem_handle *h,
                        uint64_t *tag)
{
    for (;;) {
        if (atomic_load_explicit(&d->stop, memory_order_relaxed))
            return COMMON_ECLOSED;
        int rc = common_devmem_handle_recv(sock, h, tag, DEVPOOL_POLL_MS);
        if (rc != COMMON_ETIMEDOUT)
            return rc;
    }
}

/* Makes the pool's memory (address space; pieces come later), events and control page for `bytes`
 * on device dev, the RAM pool and staging registered with the device once. *ctl_fd: the control
 * page's descriptor (NULL: closed here). mu held; on failure the caller drops what was made. */
static int devpool_make_locked(struct fetcher_devpool *d, int dev, uint64_t bytes,
                               uint32_t n_events, bool adopts, int *ctl_fd, struct common_errmsg *e)
{
    int rc = d->dev < 0 || d->dev == dev ? common_devmem_open(dev, e) : COMMON_EINVAL;
    if (rc == COMMON_EINVAL && !(e && e->text[0]))
        rc = common_errmsg_set(e, rc, "this fetcher serves device %d", d->dev);
    if (rc == 0)
        d->dev = dev;
    if (rc == 0 && !d->local && !d->pinned) { /* the copies' source as pinned memory: DMA */
        struct common_errmsg pe = {{0}};
        if (d->pin)
            pthread_mutex_lock(&d->pin->mu);
        if (d->pin && d->pin->pinned)
            d->pinned = true; /* by another pool of this fetcher */
        else
            d->pinned = common_devmem_host_register(d->ram, d->ram_bytes, &pe) == 0;
        if (d->pin) {
            d->pin->pinned = d->pinned;
            pthread_mutex_unlock(&d->pin->mu);
        }
        if (!d->pinned)
            COMMON_LOG_WARN("fetcher.devpool",
                            "pinning the RAM pool for the device failed (%s): its copies read "
                            "pageable memory",
                            pe.text);
    }
    if (rc == 0 && d->stage && !d->stage_pinned) {
        struct common_errmsg pe = {{0}};
        d->stage_pinned =
            common_devmem_host_register(d->stage, (size_t)d->n_stage * d->stage_bytes, &pe) == 0;
        if (!d->stage_pinned)
            COMMON_LOG_WARN("fetcher.devpool",
                            "pinning the staging for the device failed (%s): its copies read "
                            "pageable memory",
                            pe.text);
    }
    const uint64_t gran = rc == 0 ? common_devmem_granularity() : 0;
    const uint64_t want = gran ? (bytes + gran - 1) / gran * gran : 0;
    /* mapped: rounded up to a piece; another fetcher's memory is not charged here */
    if (rc == 0 && bytes > d->budget && !adopts)
        rc = common_errmsg_set(e, COMMON_ERANGE, "asks %llu bytes, --vram-budget %llu",
                               (unsigned long long)bytes, (unsigned long long)d->budget);
    if (rc == 0) {
        d->gran = gran;
        d->bytes = want;
        d->n_pieces = (uint32_t)(want / gran);
        d->pieces = calloc(d->n_pieces, sizeof(*d->pieces));
        d->base = d->pieces ? common_devmem_reserve(want, e) : NULL;
        rc = d->base ? 0 : d->pieces ? COMMON_EDEVICE : COMMON_ENOMEM;
    }
    for (uint32_t k = 0; rc == 0 && k < n_events; k++, d->n_events++)
        rc = common_devmem_event_create(&d->ev[k], e);
    for (uint32_t i = 0; rc == 0 && d->stage && i < d->n_stage; i++) /* after base: drop frees */
        rc = common_devmem_event_create(&d->st[i].ev, e);
    if (rc == 0) {
        const int fd = memfd_create("sluice-devpool-ctl", MFD_CLOEXEC);
        void     *p = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, PROTO_DEVPOOL_CTL_BYTES) == 0)
            p = mmap(NULL, PROTO_DEVPOOL_CTL_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            rc = common_errmsg_set(e, COMMON_EIO, "control page: %s", strerror(errno));
        } else {
            d->ctl_page = p;
            d->ctl = p;
            d->ctl_busy = (_Atomic uint64_t *)((uint8_t *)p + 8);
            d->ctl_failed = (_Atomic uint32_t *)((uint8_t *)p + 16);
            (void)common_devmem_copy_time(&d->busy0);
        }
        if (fd >= 0 && ctl_fd && rc == 0)
            *ctl_fd = fd;
        else if (fd >= 0)
            close(fd);
    }
    return rc;
}

/* Makes the pool an OPEN asks for and sends its handles. 0, or a negative common_err (the
 * reason sent as ERROR where the connection still works). */
static int devpool_open(struct fetcher_devpool *d, int sock, const struct common_devmem_handle *h)
{
    struct common_errmsg      e = {{0}};
    struct proto_devpool_open o;
    if (h->len != sizeof(o)) {
        devpool_count_refused(d);
        (void)devpool_send_error(sock, "OPEN: a malformed message");
        return COMMON_EPROTO;
    }
    memcpy(&o, h->blob, sizeof(o));
    if (o.magic != PROTO_DEVPOOL_MAGIC || o.bytes == 0 || o.n_events == 0 ||
        o.n_events > PROTO_DEVPOOL_MAX_EVENTS || o.device < 0 ||
        (o.flags & ~PROTO_DEVPOOL_ADOPTS)) {
        devpool_count_refused(d);
        (void)devpool_send_error(sock, "OPEN: bad fields");
        return COMMON_EPROTO;
    }
    pthread_mutex_lock(&d->mu);
    int ctl_fd = -1;
    int rc = devpool_make_locked(d, o.device, o.bytes, o.n_events,
                                 (o.flags & PROTO_DEVPOOL_ADOPTS) != 0, &ctl_fd, &e);
    if (rc != 0) {
        devpool_drop_locked(d);
        d->c.refused++;
        pthread_mutex_unlock(&d->mu);
        if (ctl_fd >= 0)
            close(ctl_fd);
        (void)devpool_send_error(sock, e.text[0] ? e.text : common_strerror(rc));
        return rc;
    }
    struct proto_devpool_granted g = {
        .bytes = d->bytes, .granularity = d->gran, .flags = d->stage ? PROTO_DEVPOOL_STAGES : 0};
    snprintf(g.backend, sizeof(g.backend), "%s", common_devmem_backend());
    struct common_devmem_handle out = {.fd = -1, .len = sizeof(g)};
    memcpy(out.blob, &g, sizeof(g));
    rc = common_devmem_handle_send(sock, &out, PROTO_DEVPOOL_GRANTED);
    out = (struct common_devmem_handle){.fd = ctl_fd};
    if (rc == 0)
        rc = common_devmem_handle_send(sock, &out, PROTO_DEVPOOL_CTL);
    close(ctl_fd);
    for (uint32_t k = 0; rc == 0 && k < d->n_events; k++) {
        if ((rc = common_devmem_event_export(d->ev[k], &out, NULL)) != 0)
            break;
        rc = common_devmem_handle_send(sock, &out, PROTO_DEVPOOL_EVENT);
        if (out.fd >= 0)
            close(out.fd);
    }
    if (rc != 0)
        devpool_drop_locked(d);
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        return rc;
    /* The executor's kernels' event. */
    struct common_devmem_handle kh;
    uint64_t                    tag = 0;
    if ((rc = devpool_recv(d, sock, &kh, &tag)) != 0)
        return rc;
    pthread_mutex_lock(&d->mu);
    if (tag != PROTO_DEVPOOL_KEVENT) {
        if (kh.fd >= 0)
            close(kh.fd);
        rc = COMMON_EPROTO;
    } else {
        rc = common_devmem_event_import(&kh, &d->kev, &e);
    }
    if (rc == 0) {
        d->open = true;
        d->adopts = (o.flags & PROTO_DEVPOOL_ADOPTS) != 0;
        d->c.opens++;
        char a[32], b[32], c[32], st[96] = "";
        if (d->stage)
            snprintf(st, sizeof(st), " and from storage through %u %sstaging slots of %s",
                     d->n_stage, d->stage_pinned ? "pinned " : "",
                     common_format_size(d->stage_bytes, c, sizeof(c)));
        COMMON_LOG_INFO("fetcher.devpool",
                        "device pool open: %s of %s%d address space for the executor's experts "
                        "(%s, --vram-budget %s), its copies from %s%s",
                        common_format_size(d->bytes, a, sizeof(a)), common_devmem_backend(), d->dev,
                        d->adopts ? "fetcher 0's memory" : "mapped as it fills",
                        common_format_size(d->budget, b, sizeof(b)),
                        d->pinned ? "the pinned RAM pool" : "the RAM pool, pageable", st);
    } else {
        devpool_drop_locked(d);
        d->c.refused++;
    }
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        (void)devpool_send_error(sock, e.text[0] ? e.text : "KEVENT: expected the kernels' event");
    return rc;
}

/* Makes piece k of the open pool and maps it in place, unless it is there. mu held. */
static int devpool_piece_make_locked(struct fetcher_devpool *d, uint32_t k, struct common_errmsg *e)
{
    if (d->pieces[k])
        return COMMON_OK;
    struct common_devmem_piece *p = NULL;
    int                         rc = common_devmem_piece_create(d->gran, &p, e);
    if (rc == COMMON_OK &&
        (rc = common_devmem_piece_map(p, d->base + (size_t)k * d->gran, e)) != COMMON_OK)
        common_devmem_piece_destroy(p);
    if (rc == COMMON_OK) {
        d->pieces[k] = p;
        d->c.bytes += d->gran;
    }
    return rc;
}

/* Makes, maps and hands over piece k. 0, or a negative common_err (ERROR sent). */
static int devpool_piece(struct fetcher_devpool *d, int sock, const struct common_devmem_handle *h)
{
    struct common_errmsg        e = {{0}};
    struct common_devmem_handle out = {.fd = -1};
    uint32_t                    k = UINT32_MAX;
    if (h->len == sizeof(k))
        memcpy(&k, h->blob, sizeof(k));
    pthread_mutex_lock(&d->mu);
    int rc = d->open && !d->adopts && k < d->n_pieces ? devpool_piece_make_locked(d, k, &e)
                                                      : COMMON_EINVAL;
    if (rc == 0)
        rc = common_devmem_piece_export(d->pieces[k], &out, &e);
    if (rc == 0)
        d->c.pieces++;
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        return devpool_send_error(sock, e.text[0] ? e.text : "PIECE: no such piece"), rc;
    rc = common_devmem_handle_send(sock, &out, PROTO_DEVPOOL_PIECE);
    close(out.fd);
    return rc;
}

/* Maps another fetcher's piece k (the handle h, its descriptor taken) and answers ADOPTED. */
static int devpool_adopt(struct fetcher_devpool *d, int sock, uint32_t k,
                         struct common_devmem_handle *h)
{
    struct common_errmsg e = {{0}};
    pthread_mutex_lock(&d->mu);
    int rc =
        d->open && d->adopts && k < d->n_pieces && !d->pieces[k] && h->fd >= 0 ? 0 : COMMON_EINVAL;
    struct common_devmem_piece *p = NULL;
    if (rc != 0) {
        if (h->fd >= 0)
            close(h->fd);
    } else if ((rc = common_devmem_piece_import(h, d->gran, &p, &e)) == 0 &&
               (rc = common_devmem_piece_map(p, d->base + (size_t)k * d->gran, &e)) != 0) {
        common_devmem_piece_destroy(p);
    }
    h->fd = -1;
    if (rc == 0) {
        d->pieces[k] = p;
        d->c.bytes += d->gran;
        d->c.pieces++;
    }
    pthread_mutex_unlock(&d->mu);
    if (rc != 0)
        return devpool_send_error(sock, e.text[0] ? e.text : "ADOPT: not here"), rc;
    const struct common_devmem_handle ok = {.fd = -1};
    return common_devmem_handle_send(sock, &ok, PROTO_DEVPOOL_ADOPTED | (uint64_t)k << 32);
}

/* One executor's connection: OPEN, then PIECEs, until it closes or the service stops. */
static void devpool_serve(struct fetcher_devpool *d, int sock)
{
    struct common_devmem_handle h;
    uint64_t                    tag = 0;
    if (devpool_recv(d, sock, &h, &tag) != 0)
        return;
    if (h.fd >= 0) /* neither OPEN nor PIECE carries one */
        close(h.fd);
    h.fd = -1;
    if (tag != PROTO_DEVPOOL_OPEN) {
        devpool_count_refused(d);
        (void)devpool_send_error(sock, "expected OPEN");
        return;
    }
    if (devpool_open(d, sock, &h) != 0)
        return; /* refused (counted there) */
    for (;;) {
        int rc = devpool_recv(d, sock, &h, &tag);
        if (rc == COMMON_EPROTO)
            continue; /* not a handle: dropped */
        if (rc != 0)
            break;
        if ((uint32_t)tag == PROTO_DEVPOOL_ADOPT) {
            (void)devpool_adopt(d, sock, (uint32_t)(tag >> 32), &h);
            continue;
        }
        if (h.fd >= 0)
            close(h.fd);
        h.fd = -1;
        if (tag != PROTO_DEVPOOL_PIECE)
            (void)devpool_send_error(sock, "expected PIECE");
        else
            (void)devpool_piece(d, sock, &h);
    }
}

static void *devpool_thread(void *arg)
{
    struct fetcher_devpool *d = arg;
    while (!atomic_load_explicit(&d->stop, memory_order_relaxed)) {
        int conn = -1;
        int rc = common_unix_accept(d->listen_fd, DEVPOOL_POLL_MS, &conn);
        if (rc == COMMON_ETIMEDOUT)
            continue;
        if (rc != COMMON_OK) {
            usleep(10000);
            continue;
        }
        devpool_serve(d, conn);
        close(conn);
        pthread_mutex_lock(&d->mu);
        devpool_drop_locked(d);
        pthread_mutex_unlock(&d->mu);
    }
    return NULL;
}

/* ---- the ring's records ------------------------------------------------------------------- */

/* Whether [off, off + n) lies in pieces that are mapped. mu held. */
static bool devpool_backed_locked(const struct fetcher_devpool *d, uint64_t off, uint64_t n)
{
    if (n == 0 || off > d->bytes || n > d->bytes - off)
        return false;
    for (uint64_t k = off / d->gran; k <= (off + n - 1) / d->gran; k++)
        if (!d->pieces[k])
            return false;
    return true;
}

/* Queues the copy of n bytes from host memory src to pool offset dst, piece by piece (a copy
 * stays within one mapping). mu held; the range is backed. */
static int devpool_copy_locked(struct fetcher_devpool *d, uint64_t dst, const uint8_t *src,
                               uint64_t bytes)
{
    int rc = 0;
    for (uint64_t at = 0, n; rc == 0 && at < bytes; at += n) {
        const uint64_t o = dst + at;
        n = d->gran - o % d->gran;
        n = n < bytes - at ? n : bytes - at;
        rc = common_devmem_copy_async(d->base + o, src + at, n, NULL);
    }
    return rc;
}

/* Where part `part` of bundle (layer, expert) lies in a slot (the front's layout); ids checked. */
static const struct front_part *devpool_part(const struct fetcher_devpool *d, uint32_t layer,
                                             uint32_t expert, uint32_t part)
{
    return &d->f->parts[((uint64_t)layer * d->f->n_expert + expert) * COMMON_EXPERT_PART_COUNT +
                        part];
}

/* Staging slot i's bytes. */
static uint8_t *devpool_stage_at(const struct fetcher_devpool *d, uint32_t i)
{
    return d->stage + (size_t)i * d->stage_bytes;
}

/* Slot i's reads are all in: checks the bundle (QSF), makes the slot READY or FAILED (logged,
 * counted). mu held. */
static void devpool_stage_landed(struct fetcher_devpool *d, uint32_t i, uint64_t t0)
{
    struct devpool_stage *st = &d->st[i];
    d->c.stage_reads++;
    if (!st->err && fetcher_front_check_region(d->f, st->layer, st->expert, 0,
                                               devpool_stage_at(d, i)) != COMMON_OK)
        st->err = EBADMSG;
    st->state = st->err ? STAGE_FAILED : STAGE_READY;
    if (!st->err) {
        fetcher_trace_load(fetcher_get_trace(d->f), st->layer, st->expert, st->bytes,
                           common_now_ns() - t0);
        fetcher_front_log_load(d->f, st->layer, st->expert); /* a replay probe reads it too */
        return;
    }
    struct common_errmsg m = {{0}};
    if (st->err_cqe.len)
        fetcher_io_describe_error(d->io, &st->err_cqe, &m);
    else
        snprintf(m.text, sizeof(m.text),
                 "the bundle fails its checksum or does not decode (sluice verify names every "
                 "bad one)");
    COMMON_LOG_ERR("fetcher.devpool", "staging read failed layer=%u expert=%u: %s", st->layer,
                   st->expert, m.text);
    fetcher_trace_load_error(fetcher_get_trace(d->f), st->layer, st->expert);
    d->c.stage_failed++;
}

/* Queues the deferred copies from slot `slot` (every slot's not yet queued: UINT32_MAX): from a
 * READY slot each is copied (*touched[slot] set), from any other the next mark says it failed.
 * mu held. Returns 0 or the first copy error. */
static int devpool_issue_locked(struct fetcher_devpool *d, uint32_t slot, bool *touched)
{
    int                   rc = 0;
    for (uint32_t k = 0; k < d->n_defer; k++) {
        struct devpool_defer *q = &d->defer[k];
        if (q->issued || (slot != UINT32_MAX && q->slot != slot))
            continue;
        struct devpool_stage *st = &d->st[q->slot];
        q->issued = true;
        st->pending--;
        if (st->state != STAGE_READY) {
            d->failed = true;
            continue;
        }
        const struct front_part *pp = devpool_part(d, st->layer, st->expert, q->part);
        if (rc == 0)
            rc = devpool_copy_locked(d, q->dst, devpool_stage_at(d, q->slot) + pp->data_off,
                                     q->bytes);
        touched[q->slot] = true;
        d->c.staged++;
        d->c.copied_bytes += q->bytes;
    }
    return rc;
}

/* Reads every QUEUED slot's bundle (at the engine's depth); as each one lands it is checked and
 * its deferred copies are queued, while the other reads go on; then the copies from slots that
 * held their bundle already. Each slot's event is recorded after its copies. A failed bundle's
 * copies are skipped and the next mark says so. mu held. Returns 0 or COMMON_EDEVICE. */
static int devpool_flush_locked(struct fetcher_devpool *d)
{
    const struct fetcher *f = d->f;
    uint32_t              n_req = 0, next = 0, in_flight = 0;
    int                   rc = 0;
    bool                  touched[FETCHER_DEVPOOL_STAGE_SLOTS] = {false};
    for (uint32_t i = 0; i < d->n_stage; i++) {
        struct devpool_stage *st = &d->st[i];
        if (st->state != STAGE_QUEUED)
            continue;
        st->reads = fetcher_front_bundle_reads(f, st->layer, st->expert, devpool_stage_at(d, i), i,
                                               d->reqs + n_req);
        st->done = 0;
        st->bytes = 0;
        st->err = st->reads ? 0 : EINVAL;
        st->err_cqe = (struct fetcher_io_cqe){0};
        n_req += st->reads;
    }
    const uint64_t t0 = common_now_ns();
    const uint32_t qd = fetcher_io_queue_depth(d->io);
    while (next < n_req || in_flight) {
        const uint32_t n = n_req - next < qd - in_flight ? n_req - next : qd - in_flight;
        uint32_t       got = 0;
        if (n && fetcher_io_submit(d->io, d->reqs + next, n) == COMMON_OK) {
            next += n;
            in_flight += n;
        } else if (n && !in_flight) { /* they cannot start: they fail */
            for (uint32_t k = 0; k < n; k++, next++)
                d->cqes[got++] = (struct fetcher_io_cqe){.user = d->reqs[next].user,
                                                         .err = EIO,
                                                         .file = d->reqs[next].file,
                                                         .offset = d->reqs[next].offset,
                                                         .len = d->reqs[next].len};
        }
        if (!got && in_flight) {
            got = fetcher_io_reap(d->io, d->cqes, qd, true);
            in_flight -= got;
        }
        for (uint32_t k = 0; k < got; k++) {
            const uint32_t        i = (uint32_t)d->cqes[k].user;
            struct devpool_stage *st = &d->st[i];
            if (d->cqes[k].err && !st->err) {
                st->err = d->cqes[k].err;
                st->err_cqe = d->cqes[k];
            }
            st->bytes += d->cqes[k].bytes;
            d->c.stage_bytes += d->cqes[k].bytes;
            if (++st->done < st->reads)
                continue;
            devpool_stage_landed(d, i, t0); /* its copies start while the others read */
            const int irc = devpool_issue_locked(d, i, touched);
            rc = rc ? rc : irc;
        }
    }
    for (uint32_t i = 0; i < d->n_stage; i++) /* a bundle that had nothing to read */
        if (d->st[i].state == STAGE_QUEUED)
            devpool_stage_landed(d, i, t0);
    const int irc = devpool_issue_locked(d, UINT32_MAX, touched);
    rc = rc ? rc : irc;
    d->n_defer = 0;
    for (uint32_t i = 0; i < d->n_stage; i++)
        if (touched[i] && rc == 0 && (rc = common_devmem_event_record(d->st[i].ev, NULL)) == 0)
            d->st[i].copying = true;
    return rc ? COMMON_EDEVICE : 0;
}

/* A staging slot for bundle (layer, expert): the one that holds it or is to read it, else one
 * that nothing waits on (free first, then the least recently used; its copies waited for), made
 * QUEUED; the gathered reads and copies are done first when every slot is waited on. *fresh: the
 * bundle is to be read. mu held. Returns the slot or -1 (device). */
static int32_t devpool_stage_take(struct fetcher_devpool *d, uint32_t layer, uint32_t expert,
                                  bool *fresh)
{
    int32_t s = -1;
    *fresh = false;
    for (uint32_t i = 0; i < d->n_stage && s < 0; i++)
        if ((d->st[i].state == STAGE_QUEUED || d->st[i].state == STAGE_READY) &&
            d->st[i].layer == layer && d->st[i].expert == expert)
            s = (int32_t)i;
    if (s >= 0) {
        d->st[s].tick = ++d->tick;
        return s;
    }
    for (int pass = 0; pass < 2 && s < 0; pass++) {
        for (uint32_t i = 0; i < d->n_stage; i++)
            if (d->st[i].state != STAGE_QUEUED && !d->st[i].pending &&
                (s < 0 || d->st[i].tick < d->st[s].tick))
                s = (int32_t)i;
        if (s < 0 && devpool_flush_locked(d) != 0)
            return -1;
    }
    if (s < 0)
        return -1;
    struct devpool_stage *st = &d->st[s];
    if (st->copying && common_devmem_event_sync(st->ev, NULL) != 0)
        return -1;
    st->copying = false;
    st->layer = layer;
    st->expert = expert;
    st->state = STAGE_QUEUED;
    st->tick = ++d->tick;
    *fresh = true;
    return s;
}

/* DEV_READ: its copy deferred to the next flush (the next other record), its bundle read then
 * unless in staging already. mu held. */
static int devpool_read_locked(struct fetcher_devpool *d, const struct proto_fetch_req *r)
{
    struct fetcher_io_req reqs[COMMON_EXPERT_PART_COUNT];
    if (!d->stage || r->part >= COMMON_EXPERT_PART_COUNT ||
        !fetcher_front_bundle_reads(d->f, r->layer, r->expert, d->stage, 0, reqs))
        return COMMON_EINVAL;
    const struct front_part *pp = devpool_part(d, r->layer, r->expert, r->part);
    if (pp->size != r->bytes || pp->data_off + pp->size > d->stage_bytes ||
        !devpool_backed_locked(d, r->dst, r->bytes))
        return COMMON_EINVAL;
    if (d->n_defer == d->cap_defer) {
        uint32_t              cap = d->cap_defer ? 2 * d->cap_defer : 64;
        struct devpool_defer *q = realloc(d->defer, cap * sizeof(*q));
        if (!q)
            return COMMON_EDEVICE;
        d->defer = q;
        d->cap_defer = cap;
    }
    bool          fresh = false;
    const int32_t s = devpool_stage_take(d, r->layer, r->expert, &fresh);
    if (s < 0)
        return COMMON_EDEVICE;
    if (!fresh)
        d->c.stage_hits++;
    d->st[s].pending++;
    d->defer[d->n_defer++] = (struct devpool_defer){
        .slot = (uint32_t)s, .part = r->part, .dst = r->dst, .bytes = r->bytes};
    return 0;
}

/* Publishes mark `loan` on the control page (failed: the copies before it did not all happen)
 * and wakes its waiters. mu held. */
static void devpool_publish_locked(struct fetcher_devpool *d, uint32_t loan, bool failed)
{
    if (failed)
        atomic_store_explicit(d->ctl_failed, loan, memory_order_relaxed);
    atomic_store_explicit(&d->ctl[0], loan, memory_order_release);
    syscall(SYS_futex, d->ctl_page, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int fetcher_devpool_record(struct fetcher_devpool *d, const struct proto_fetch_req *r)
{
    int                          rc = COMMON_EINVAL;
    const struct proto_fetch_req rec = *r;
    pthread_mutex_lock(&d->mu);
    if (d->select && d->open) /* the link's thread serves the pools of several devices */
        (void)common_devmem_select(d->dev, NULL);
    /* every other record comes after the reads gathered before it */
    if (d->open && r->op != PROTO_FETCH_DEV_READ && d->n_defer && devpool_flush_locked(d) != 0)
        r = NULL;
    if (d->open && r) {
        switch (r->op) {
        case PROTO_FETCH_DEV_COPY:
            if (r->src <= d->ram_bytes && r->bytes <= d->ram_bytes - r->src &&
                devpool_backed_locked(d, r->dst, r->bytes)) {
                rc = devpool_copy_locked(d, r->dst, d->ram + r->src, r->bytes);
                if (rc == 0) {
                    d->c.copies++;
                    d->c.copied_bytes += r->bytes;
                }
            }
            break;
        case PROTO_FETCH_DEV_READ:
            rc = devpool_read_locked(d, r);
            break;
        case PROTO_FETCH_DEV_MARK:
            if (r->tag < d->n_events) {
                rc = common_devmem_event_record(d->ev[r->tag], NULL);
                if (rc == 0) {
                    uint64_t busy = 0;
                    (void)common_devmem_copy_time(&busy);
                    atomic_store_explicit(d->ctl_busy, busy - d->busy0, memory_order_relaxed);
                    devpool_publish_locked(d, r->loan, d->failed);
                    d->failed = false;
                    d->c.marks++;
                }
            }
            break;
        case PROTO_FETCH_DEV_WAIT:
            rc = common_devmem_event_wait(d->kev, NULL);
            if (rc == 0)
                d->c.waits++;
            break;
        default:
            break;
        }
    }
    if (rc != 0)
        d->c.bad++;
    if (rc != 0 && d->open && rec.op != PROTO_FETCH_DEV_MARK)
        d->failed = true; /* never a mark over copies that did not happen */
    if (rc != 0 && rec.op == PROTO_FETCH_DEV_MARK && d->ctl) {
        /* a mark that could not be recorded: published as failed, never waited on for ever */
        devpool_publish_locked(d, rec.loan, true);
        d->failed = false;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

void fetcher_devpool_counts(struct fetcher_devpool *d, struct fetcher_devpool_counts *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->c;
    out->open = d->open;
    out->pinned = d->pinned;
    (void)common_devmem_copy_time(&out->copy_busy_ns);
    pthread_mutex_unlock(&d->mu);
}

/* ---- lifetime ----------------------------------------------------------------------------- */

/* The staging of a pool fed from storage: its slots (mapped, O_DIRECT-aligned) and an I/O
 * engine over the fetcher's files reading into them. */
static int devpool_stage_init(struct fetcher_devpool *d, struct fetcher *f, struct common_errmsg *e)
{
    d->f = f;
    d->n_stage = FETCHER_DEVPOOL_STAGE_SLOTS;
    d->stage_bytes = (f->plan.slot_bytes + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
    const size_t total = (size_t)d->n_stage * d->stage_bytes;
    if (!f->pool || !d->stage_bytes)
        return common_errmsg_set(e, COMMON_EINVAL, "staging: the fetcher has no pool to lay out");
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return common_errmsg_set(e, COMMON_ENOMEM, "staging: %s", strerror(errno));
    d->stage = p;
    const uint32_t qd = 3 * d->n_stage; /* every part of every slot in flight */
    d->reqs = calloc(qd, sizeof(*d->reqs));
    d->cqes = calloc(qd, sizeof(*d->cqes));
    struct fetcher_io_file *files = calloc(f->n_splits, sizeof(*files));
    if (!d->reqs || !d->cqes || !files) {
        free(files);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    for (uint32_t s = 0; s < f->n_splits; s++)
        files[s] = (struct fetcher_io_file){.fd = common_gguf_split_fd(f->g, s),
                                            .path = common_gguf_split_path(f->g, s)};
    const struct fetcher_io_opts io_o = {.mode = f->mode,
                                         .direct = f->o.direct,
                                         .queue_depth = qd,
                                         .n_threads = f->o.io_threads,
                                         .reg_base = d->stage,
                                         .reg_bytes = total};
    int                          rc = fetcher_io_create(&io_o, files, f->n_splits, &d->io, e);
    free(files);
    return rc;
}

/* A pool service with no socket yet: its options, lock and staging. */
static int devpool_new(const struct fetcher_devpool_opts *o, bool local,
                       struct fetcher_devpool **out, struct common_errmsg *e)
{
    struct fetcher_devpool *d = calloc(1, sizeof(*d));
    if (!d || (o->path && !(d->path = strdup(o->path)))) {
        free(d);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    d->budget = o->budget;
    d->ram = o->ram;
    d->ram_bytes = o->ram_bytes;
    d->dev = -1;
    d->listen_fd = -1;
    d->local = local;
    d->pin = o->pin;
    d->select = o->select;
    atomic_init(&d->stop, false);
    if (pthread_mutex_init(&d->mu, NULL) != 0) {
        free(d->path);
        free(d);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    if (pthread_mutex_init(&d->qmu, NULL) != 0 || pthread_cond_init(&d->qcv, NULL) != 0) {
        pthread_mutex_destroy(&d->mu);
        free(d->path);
        free(d);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    *out = d;
    const int rc = o->stage_from ? devpool_stage_init(d, o->stage_from, e) : COMMON_OK;
    if (rc != COMMON_OK) {
        fetcher_devpool_stop(d);
        *out = NULL;
    }
    return rc;
}

int fetcher_devpool_start(const struct fetcher_devpool_opts *o, struct fetcher_devpool **out,
                          struct common_errmsg *e)
{
    struct fetcher_devpool *d = NULL;
    int                     rc = o->path ? devpool_new(o, false, &d, e)
                                         : common_errmsg_set(e, COMMON_EINVAL, "no socket path");
    if (rc != COMMON_OK)
        return rc;
    if ((rc = common_unix_listen(o->path, &d->listen_fd)) != COMMON_OK)
        rc = common_errmsg_set(e, rc, "%s: %s", o->path, common_strerror(rc));
    else if (pthread_create(&d->thread, NULL, devpool_thread, d) != 0)
        rc = common_errmsg_set(e, COMMON_ENOMEM, "%s: cannot start its thread", o->path);
    else {
        d->started = true;
        *out = d;
        return COMMON_OK;
    }
    fetcher_devpool_stop(d);
    return rc;
}

void fetcher_devpool_stop(struct fetcher_devpool *d)
{
    if (!d)
        return;
    atomic_store_explicit(&d->stop, true, memory_order_relaxed);
    if (d->started)
        pthread_join(d->thread, NULL);
    pthread_mutex_lock(&d->qmu);
    d->q_stop = true; /* the worker does what is queued first */
    pthread_cond_broadcast(&d->qcv);
    pthread_mutex_unlock(&d->qmu);
    if (d->worker_started)
        pthread_join(d->worker, NULL);
    if (d->listen_fd >= 0) {
        close(d->listen_fd);
        (void)unlink(d->path);
    }
    pthread_mutex_lock(&d->mu);
    devpool_drop_locked(d); /* its copies done */
    if (d->pinned && !d->pin)
        common_devmem_host_unregister(d->ram);
    if (d->stage_pinned)
        common_devmem_host_unregister(d->stage);
    pthread_mutex_unlock(&d->mu);
    fetcher_io_destroy(d->io);
    if (d->stage)
        munmap(d->stage, (size_t)d->n_stage * d->stage_bytes);
    free(d->reqs);
    free(d->cqes);
    free(d->defer);
    free(d->q);
    pthread_cond_destroy(&d->qcv);
    pthread_mutex_destroy(&d->qmu);
    pthread_mutex_destroy(&d->mu);
    free(d->path);
    free(d);
}

/* ---- a pool of this process ---------------------------------------------------------------- */

#define DEVPOOL_LOCAL_WAIT_MS 50 /* a mark's wait between looks */

uint64_t fetcher_devpool_staging_bytes(const struct common_model *m)
{
    const uint64_t slot = fetcher_plan_slot_bytes(m);
    return FETCHER_DEVPOOL_STAGE_SLOTS *
           ((slot + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN);
}

/* Does the queued records in order, as a fetcher's link thread does a ring's. */
static void *devpool_worker(void *arg)
{
    struct fetcher_devpool *d = arg;
    (void)common_devmem_open(d->dev, NULL); /* this thread's copies go to the pool's device */
    pthread_mutex_lock(&d->qmu);
    for (;;) {
        while (!d->q_n && !d->q_stop)
            pthread_cond_wait(&d->qcv, &d->qmu);
        if (!d->q_n)
            break;
        const struct proto_fetch_req r = d->q[d->q_head];
        d->q_head = (d->q_head + 1) % d->q_cap;
        d->q_n--;
        pthread_mutex_unlock(&d->qmu);
        (void)fetcher_devpool_record(d, &r); /* a mark it cannot record it publishes as failed */
        pthread_mutex_lock(&d->qmu);
    }
    pthread_mutex_unlock(&d->qmu);
    return NULL;
}

/* Queues a record for the worker. qmu held. 0 or COMMON_ENOMEM. */
static int devpool_push_locked(struct fetcher_devpool *d, const struct proto_fetch_req *r)
{
    if (d->q_n == d->q_cap) {
        const uint32_t          cap = d->q_cap ? 2 * d->q_cap : 256;
        struct proto_fetch_req *q = malloc(cap * sizeof(*q));
        if (!q)
            return COMMON_ENOMEM;
        for (uint32_t i = 0; i < d->q_n; i++)
            q[i] = d->q[(d->q_head + i) % d->q_cap];
        free(d->q);
        d->q = q;
        d->q_head = 0;
        d->q_cap = cap;
    }
    d->q[(d->q_head + d->q_n) % d->q_cap] = *r;
    d->q_n++;
    pthread_cond_signal(&d->qcv);
    return COMMON_OK;
}

int fetcher_devpool_local_open(struct fetcher *f, bool stage, int dev, uint64_t bytes,
                               uint64_t budget, uint32_t n_events,
                               struct fetcher_devpool_local *out, struct fetcher_devpool **pool,
                               struct common_errmsg *e)
{
    *pool = NULL;
    if (!f || !f->pool || bytes == 0 || n_events == 0 || n_events > PROTO_DEVPOOL_MAX_EVENTS ||
        dev < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "a bad request for a device pool");
    const struct fetcher_devpool_opts o = {.budget = budget,
                                           .ram = fetcher_get_pool_base(f),
                                           .ram_bytes = fetcher_get_pool_bytes(f),
                                           .stage_from = stage ? f : NULL};
    struct fetcher_devpool           *d = NULL;
    int                               rc = devpool_new(&o, true, &d, e);
    if (rc != COMMON_OK)
        return rc;
    pthread_mutex_lock(&d->mu);
    rc = devpool_make_locked(d, dev, bytes, n_events, false, NULL, e);
    if (rc == COMMON_OK)
        rc = common_devmem_event_create(&d->kev, e);
    if (rc == COMMON_OK) {
        d->open = true;
        d->c.opens++;
        *out = (struct fetcher_devpool_local){
            .base = d->base, .bytes = d->bytes, .gran = d->gran, .kev = d->kev, .stages = stage};
        snprintf(out->backend, sizeof(out->backend), "%s", common_devmem_backend());
    }
    pthread_mutex_unlock(&d->mu);
    if (rc == COMMON_OK && pthread_create(&d->worker, NULL, devpool_worker, d) != 0)
        rc = common_errmsg_set(e, COMMON_ENOMEM, "the device pool's copy thread cannot start");
    if (rc != COMMON_OK) {
        fetcher_devpool_stop(d); /* drops what was made */
        return rc;
    }
    d->worker_started = true;
    *pool = d;
    return COMMON_OK;
}

int fetcher_devpool_local_piece(struct fetcher_devpool *d, uint32_t k, struct common_errmsg *e)
{
    pthread_mutex_lock(&d->mu);
    int rc = d->open && k < d->n_pieces ? common_devmem_open(d->dev, e) : COMMON_EINVAL;
    const bool had = rc == COMMON_OK && d->pieces[k];
    if (rc == COMMON_OK && (rc = devpool_piece_make_locked(d, k, e)) == COMMON_OK && !had)
        d->c.pieces++;
    pthread_mutex_unlock(&d->mu);
    return rc == COMMON_EINVAL && !(e && e->text[0])
               ? common_errmsg_set(e, rc, "no such piece of the device pool")
               : rc;
}

/* Queues r; a copy or read dirties every event. 0 or COMMON_ENOMEM. */
static int devpool_local_push(struct fetcher_devpool *d, const struct proto_fetch_req *r)
{
    pthread_mutex_lock(&d->qmu);
    const int rc = devpool_push_locked(d, r);
    for (uint32_t k = 0; rc == COMMON_OK && k < d->n_events; k++)
        d->dirty[k] = true;
    pthread_mutex_unlock(&d->qmu);
    return rc;
}

int fetcher_devpool_local_copy(struct fetcher_devpool *d, uint64_t dst, const void *src,
                               uint64_t bytes)
{
    const uint8_t *s = src;
    if (s < d->ram || bytes > d->ram_bytes || (uint64_t)(s - d->ram) > d->ram_bytes - bytes ||
        bytes > UINT32_MAX)
        return COMMON_EINVAL; /* not in the RAM pool */
    const struct proto_fetch_req r = {.op = PROTO_FETCH_DEV_COPY,
                                      .bytes = (uint32_t)bytes,
                                      .src = (uint64_t)(s - d->ram),
                                      .dst = dst};
    return devpool_local_push(d, &r);
}

int fetcher_devpool_local_read(struct fetcher_devpool *d, uint32_t layer, uint32_t expert,
                               enum common_expert_part part, uint64_t dst, uint64_t bytes)
{
    if (!d->stage || bytes > UINT32_MAX)
        return COMMON_EINVAL;
    const struct proto_fetch_req r = {.op = PROTO_FETCH_DEV_READ,
                                      .layer = layer,
                                      .expert = expert,
                                      .part = (uint32_t)part,
                                      .bytes = (uint32_t)bytes,
                                      .dst = dst};
    return devpool_local_push(d, &r);
}

int fetcher_devpool_local_mark(struct fetcher_devpool *d, uint32_t k)
{
    if (k >= d->n_events)
        return COMMON_EINVAL;
    pthread_mutex_lock(&d->qmu);
    int rc = COMMON_OK;
    if (d->dirty[k]) {
        const uint32_t               seq = ++d->seq ? d->seq : ++d->seq; /* never 0 */
        const struct proto_fetch_req r = {.op = PROTO_FETCH_DEV_MARK, .tag = k, .loan = seq};
        if ((rc = devpool_push_locked(d, &r)) == COMMON_OK) {
            d->dirty[k] = false;
            d->pend[k] = seq;
        }
    }
    pthread_mutex_unlock(&d->qmu);
    return rc;
}

int fetcher_devpool_local_ready(struct fetcher_devpool *d, uint32_t k,
                                struct common_devmem_event **ev)
{
    *ev = NULL;
    if (k >= d->n_events)
        return COMMON_EINVAL;
    pthread_mutex_lock(&d->qmu);
    const uint32_t seq = d->pend[k];
    d->pend[k] = 0;
    pthread_mutex_unlock(&d->qmu);
    if (!seq)
        return COMMON_OK;
    for (;;) { /* the worker publishes every mark, recorded or failed */
        const uint32_t v = atomic_load_explicit(d->ctl, memory_order_acquire);
        if ((int32_t)(v - seq) >= 0)
            break;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = DEVPOOL_LOCAL_WAIT_MS * 1000000L};
        (void)syscall(SYS_futex, d->ctl_page, FUTEX_WAIT, v, &ts, NULL, 0);
    }
    *ev = d->ev[k];
    pthread_mutex_lock(&d->qmu);
    const uint32_t fs = atomic_load_explicit(d->ctl_failed, memory_order_relaxed);
    const bool     failed = fs != d->failed_seen;
    d->failed_seen = fs;
    pthread_mutex_unlock(&d->qmu);
    return failed ? COMMON_EIO : COMMON_OK;
}

int fetcher_devpool_local_after(struct fetcher_devpool *d)
{
    const struct proto_fetch_req r = {.op = PROTO_FETCH_DEV_WAIT};
    pthread_mutex_lock(&d->qmu);
    const int rc = devpool_push_locked(d, &r);
    pthread_mutex_unlock(&d->qmu);
    return rc;
}

uint64_t fetcher_devpool_local_copy_ns(struct fetcher_devpool *d)
{
    return atomic_load_explicit(d->ctl_busy, memory_order_relaxed);
}

void fetcher_devpool_unpin(struct fetcher_devpool_pin *p, const void *ram)
{
    pthread_mutex_lock(&p->mu);
    if (p->pinned)
        common_devmem_host_unregister(ram);
    p->pinned = false;
    pthread_mutex_unlock(&p->mu);
}
