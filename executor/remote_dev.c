/* executor/remote_dev.c - fetcher 0's device expert pool, seen from the executor: the pool's
 * memory and events imported over "fetcher-0.dev", its copies, marks and waits asked for on the
 * link's ring, the marks' sequence read from the shared control page (proto.h). */
#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "remote_impl.h"

#define DEV_REPLY_MS 10000 /* OPEN's and PIECE's replies */
#define DEV_WAIT_MS  50    /* a mark's wait between checks of the fetcher */

struct remote_dev {
    pthread_mutex_t              mu;   /* the socket and pieces */
    int                          sock; /* the pool's connection; -1 once gone */
    uint64_t                     instance;
    uint32_t                     pid;
    _Atomic bool                 gone;
    struct executor_dev_pool     p;
    struct common_devmem_piece **pieces; /* p.bytes / p.gran entries, NULL = not mapped */
    uint32_t                     n_pieces;
    void                        *ctl_page;
    _Atomic uint32_t            *ctl;      /* the fetcher's last mark */
    _Atomic uint64_t            *ctl_busy; /* the fetcher's copy time */
    uint64_t                     busy;     /* its last value seen */
    uint32_t                     seq; /* the last mark asked for */
};

static void dev_free(struct remote_dev *d)
{
    if (!d)
        return;
    for (uint32_t k = 0; d->pieces && k < d->n_pieces; k++)
        common_devmem_piece_destroy(d->pieces[k]);
    free(d->pieces);
    common_devmem_unreserve(d->p.base, d->p.bytes);
    for (uint32_t k = 0; k < d->p.n_events; k++)
        common_devmem_event_destroy(d->p.ev[k]);
    common_devmem_event_destroy(d->p.kev);
    if (d->ctl_page)
        munmap(d->ctl_page, PROTO_DEVPOOL_CTL_BYTES);
    if (d->sock >= 0)
        close(d->sock);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* The fetcher that made the pool is gone (or unusable): its connection closed, every later copy
 * refused; the memory stays mapped. */
static void dev_gone(struct remote_dev *d, const char *why)
{
    if (atomic_exchange(&d->gone, true))
        return;
    COMMON_LOG_WARN("executor.remote",
                    "fetcher=0's device pool is gone (%s); the executor fills its memory itself "
                    "from now on",
                    why);
}

/* Receives one message of the pool's connection. */
static int dev_recv(struct remote_dev *d, struct common_devmem_handle *h, uint64_t *tag)
{
    return common_devmem_handle_recv(d->sock, h, tag, DEV_REPLY_MS);
}

/* Text of an ERROR reply (a string of the blob). */
static const char *dev_error_text(struct common_devmem_handle *h)
{
    if (h->len == 0 || h->len > COMMON_DEVMEM_BLOB)
        return "an error";
    h->blob[h->len - 1] = 0;
    return (const char *)h->blob;
}

static int dev_open(void *arg, int dev, size_t bytes, uint32_t n_events,
                    struct executor_dev_pool *out, struct common_errmsg *e)
{
    struct executor_remote *r = arg;
    if (r->n_links != 1)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "the experts come from %u fetchers, the pool is the executor's",
                                 r->n_links);
    if (r->dev || n_events == 0 || n_events > EXECUTOR_DEV_MAX_EVENTS ||
        n_events > PROTO_DEVPOOL_MAX_EVENTS || bytes == 0)
        return common_errmsg_set(e, COMMON_EINVAL, "a device pool is open, or a bad request");
    int rc = common_devmem_open(dev, e);
    if (rc != COMMON_OK)
        return rc;
    char path[PROTO_MAX_PATH];
    if (snprintf(path, sizeof(path), "%s/fetcher-0.dev", r->run_dir) >= (int)sizeof(path))
        return common_errmsg_set(e, COMMON_EINVAL, "run dir path too long");
    struct remote_dev *d = calloc(1, sizeof(*d));
    if (!d || pthread_mutex_init(&d->mu, NULL) != 0) {
        free(d);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    d->sock = -1;
    atomic_init(&d->gone, false);
    if ((rc = common_unix_connect(path, &d->sock)) != COMMON_OK) {
        d->sock = -1;
        dev_free(d);
        return common_errmsg_set(e, COMMON_ENOTSUP, "fetcher 0 serves no device pool (%s: %s)",
                                 path, common_strerror(rc));
    }
    struct proto_devpool_open o = {
        .magic = PROTO_DEVPOOL_MAGIC, .device = dev, .bytes = bytes, .n_events = n_events};
    struct common_devmem_handle h = {.fd = -1, .len = sizeof(o)};
    memcpy(h.blob, &o, sizeof(o));
    uint64_t                     tag = 0;
    struct proto_devpool_granted g = {0};
    rc = common_devmem_handle_send(d->sock, &h, PROTO_DEVPOOL_OPEN);
    if (rc == COMMON_OK)
        rc = dev_recv(d, &h, &tag);
    if (rc == COMMON_OK && h.fd >= 0)
        close(h.fd);
    if (rc == COMMON_OK && tag == PROTO_DEVPOOL_ERROR)
        rc = common_errmsg_set(e, COMMON_ENOTSUP, "fetcher 0 refused the pool: %s",
                               dev_error_text(&h));
    else if (rc == COMMON_OK && (tag != PROTO_DEVPOOL_GRANTED || h.len != sizeof(g)))
        rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher 0's device pool: an unexpected reply");
    else if (rc != COMMON_OK)
        rc = common_errmsg_set(e, rc, "fetcher 0's device pool: %s", common_strerror(rc));
    if (rc == COMMON_OK) {
        memcpy(&g, h.blob, sizeof(g));
        g.backend[sizeof(g.backend) - 1] = 0;
        if (g.granularity == 0 || g.bytes < bytes || g.bytes % g.granularity ||
            g.bytes / g.granularity > UINT32_MAX || strcmp(g.backend, common_devmem_backend()))
            rc = common_errmsg_set(e, COMMON_EPROTO,
                                   "fetcher 0's device pool is not this process's kind (%s)",
                                   g.backend);
    }
    /* The control page, then the fetcher's events. */
    if (rc == COMMON_OK && (rc = dev_recv(d, &h, &tag)) == COMMON_OK) {
        if (tag == PROTO_DEVPOOL_CTL && h.fd >= 0) {
            void *p = mmap(NULL, PROTO_DEVPOOL_CTL_BYTES, PROT_READ, MAP_SHARED, h.fd, 0);
            if (p != MAP_FAILED) {
                d->ctl_page = p;
                d->ctl = p;
                d->ctl_busy = (_Atomic uint64_t *)((uint8_t *)p + 8);
            }
        }
        if (h.fd >= 0)
            close(h.fd);
        if (!d->ctl_page)
            rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher 0's device pool: no control page");
    }
    for (uint32_t k = 0; rc == COMMON_OK && k < n_events; k++) {
        if ((rc = dev_recv(d, &h, &tag)) != COMMON_OK)
            break;
        if (tag != PROTO_DEVPOOL_EVENT) {
            if (h.fd >= 0)
                close(h.fd);
            rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher 0's device pool: no event %u", k);
            break;
        }
        if ((rc = common_devmem_event_import(&h, &d->p.ev[k], e)) == COMMON_OK)
            d->p.n_events++;
    }
    if (rc == COMMON_OK && (rc = common_devmem_event_create(&d->p.kev, e)) == COMMON_OK &&
        (rc = common_devmem_event_export(d->p.kev, &h, e)) == COMMON_OK) {
        rc = common_devmem_handle_send(d->sock, &h, PROTO_DEVPOOL_KEVENT);
        close(h.fd);
    }
    if (rc == COMMON_OK) {
        d->n_pieces = (uint32_t)(g.bytes / g.granularity);
        d->pieces = calloc(d->n_pieces, sizeof(*d->pieces));
        d->p.bytes = g.bytes;
        d->p.gran = g.granularity;
        snprintf(d->p.backend, sizeof(d->p.backend), "%s", g.backend);
        if (!d->pieces || !(d->p.base = common_devmem_reserve(g.bytes, e)))
            rc = common_errmsg_set(e, COMMON_ENOMEM, "the device pool's address space: %s",
                                   e && e->text[0] ? e->text : "out of memory");
    }
    if (rc != COMMON_OK) {
        dev_free(d);
        return rc;
    }
    struct remote_link *L = &r->links[0];
    pthread_mutex_lock(&L->mu);
    d->instance = L->instance;
    d->pid = L->pid;
    pthread_mutex_unlock(&L->mu);
    r->dev = d;
    *out = d->p;
    return COMMON_OK;
}

static int dev_back(void *arg, uint32_t k, struct common_errmsg *e)
{
    struct executor_remote *r = arg;
    struct remote_dev      *d = r->dev;
    if (!d || k >= d->n_pieces)
        return common_errmsg_set(e, COMMON_EINVAL, "no such piece of the device pool");
    pthread_mutex_lock(&d->mu);
    int rc = COMMON_OK;
    if (!d->pieces[k] && !atomic_load(&d->gone)) {
        struct common_devmem_handle h = {.fd = -1, .len = sizeof(k)};
        uint64_t                    tag = 0;
        memcpy(h.blob, &k, sizeof(k));
        rc = common_devmem_handle_send(d->sock, &h, PROTO_DEVPOOL_PIECE);
        if (rc == COMMON_OK)
            rc = dev_recv(d, &h, &tag);
        if (rc == COMMON_OK && tag == PROTO_DEVPOOL_PIECE && h.fd >= 0) {
            struct common_devmem_piece *p = NULL;
            if ((rc = common_devmem_piece_import(&h, d->p.gran, &p, e)) == COMMON_OK &&
                (rc = common_devmem_piece_map(p, d->p.base + (size_t)k * d->p.gran, e)) !=
                    COMMON_OK)
                common_devmem_piece_destroy(p);
            if (rc == COMMON_OK)
                d->pieces[k] = p;
        } else if (rc == COMMON_OK) {
            if (h.fd >= 0)
                close(h.fd);
            rc = common_errmsg_set(e, COMMON_EDEVICE, "fetcher 0's device pool: piece %u: %s", k,
                                   tag == PROTO_DEVPOOL_ERROR ? dev_error_text(&h) : "no piece");
        } else {
            dev_gone(d, common_strerror(rc)); /* made here below */
            rc = COMMON_OK;
        }
    }
    if (rc == COMMON_OK && !d->pieces[k]) { /* the fetcher is gone: a piece of our own */
        struct common_devmem_piece *p = NULL;
        if ((rc = common_devmem_piece_create(d->p.gran, &p, e)) == COMMON_OK &&
            (rc = common_devmem_piece_map(p, d->p.base + (size_t)k * d->p.gran, e)) != COMMON_OK)
            common_devmem_piece_destroy(p);
        if (rc == COMMON_OK)
            d->pieces[k] = p;
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* Pushes a device record to fetcher 0 while its pool lives. 0 or COMMON_ECLOSED. */
static int dev_push(struct executor_remote *r, struct remote_dev *d,
                    const struct proto_fetch_req *rec)
{
    struct remote_link *L = &r->links[0];
    if (atomic_load(&d->gone))
        return COMMON_ECLOSED;
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    const bool same = L->up && L->instance == d->instance;
    pthread_mutex_unlock(&L->mu);
    int rc = same ? executor_remote_push(L, rec, true) : COMMON_ECLOSED;
    pthread_mutex_unlock(&L->push_mu);
    if (rc != COMMON_OK) {
        dev_gone(d, same ? common_strerror(rc) : "fetcher 0 restarted");
        return COMMON_ECLOSED;
    }
    return COMMON_OK;
}

static int dev_copy(void *arg, size_t dst, const void *src, size_t bytes)
{
    struct executor_remote *r = arg;
    struct remote_dev      *d = r->dev;
    struct remote_link     *L = &r->links[0];
    if (!d || atomic_load(&d->gone))
        return COMMON_ECLOSED;
    /* src lies in the link's pool: its mapping for loans, or its view's for direct reads
     * (both map the segment from its start). */
    pthread_mutex_lock(&L->mu);
    const struct remote_map *m = L->instance == d->instance ? L->map : NULL;
    const uint8_t           *s = src;
    const uint8_t           *bases[2] = {m ? m->base : NULL, m ? m->view.base : NULL};
    const size_t             lens[2] = {m ? m->bytes : 0, m ? m->view.map_bytes : 0};
    bool                     in = false;
    uint64_t                 off = 0;
    for (int i = 0; i < 2 && !in; i++)
        if (bases[i] && s >= bases[i] && bytes <= lens[i] &&
            (size_t)(s - bases[i]) <= lens[i] - bytes && bytes <= UINT32_MAX) {
            in = true;
            off = (uint64_t)(s - bases[i]);
        }
    pthread_mutex_unlock(&L->mu);
    if (!in) {
        dev_gone(d, "an expert outside fetcher 0's pool");
        return COMMON_ECLOSED;
    }
    const struct proto_fetch_req rec = {
        .op = PROTO_FETCH_DEV_COPY, .bytes = (uint32_t)bytes, .src = off, .dst = dst};
    return dev_push(r, d, &rec);
}

static int dev_mark(void *arg, uint32_t k, uint32_t *seq)
{
    struct executor_remote *r = arg;
    struct remote_dev      *d = r->dev;
    if (!d || k >= d->p.n_events)
        return COMMON_ECLOSED;
    *seq = ++d->seq;
    const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEV_MARK, .tag = k, .loan = *seq};
    return dev_push(r, d, &rec);
}

static int dev_ready(void *arg, uint32_t seq)
{
    struct executor_remote *r = arg;
    struct remote_dev      *d = r->dev;
    struct remote_link     *L = &r->links[0];
    const uint64_t          t0 = common_now_ns();
    if (!d)
        return COMMON_ECLOSED;
    for (;;) {
        const uint32_t v = atomic_load_explicit(d->ctl, memory_order_acquire);
        if ((int32_t)(v - seq) >= 0)
            return COMMON_OK;
        if (atomic_load(&d->gone))
            return COMMON_ECLOSED;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = DEV_WAIT_MS * 1000000L};
        (void)syscall(SYS_futex, d->ctl_page, FUTEX_WAIT, v, &ts, NULL, 0);
        if (atomic_load_explicit(d->ctl, memory_order_acquire) != v)
            continue;
        pthread_mutex_lock(&L->mu);
        const bool same = L->up && L->instance == d->instance;
        pthread_mutex_unlock(&L->mu);
        const char *why = !same                     ? "fetcher 0 restarted"
                          : common_pid_gone(d->pid) ? "fetcher 0 died"
                          : common_now_ns() - t0 > (uint64_t)r->acquire_timeout_ms * 1000000ull
                              ? "a mark did not come in time"
                              : NULL;
        if (why) {
            dev_gone(d, why);
            return COMMON_ECLOSED;
        }
    }
}

static void dev_copy_time(void *arg, uint64_t *ns)
{
    struct executor_remote *r = arg;
    struct remote_dev      *d = r->dev;
    if (d && !atomic_load(&d->gone))
        d->busy = atomic_load_explicit(d->ctl_busy, memory_order_relaxed);
    *ns = d ? d->busy : 0;
}

static int dev_after(void *arg)
{
    struct executor_remote      *r = arg;
    const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEV_WAIT};
    return r->dev ? dev_push(r, r->dev, &rec) : COMMON_ECLOSED;
}

static void dev_close(void *arg)
{
    struct executor_remote *r = arg;
    dev_free(r->dev);
    r->dev = NULL;
}

const struct executor_dev_ops executor_remote_dev_ops = {.open = dev_open,
                                                         .back = dev_back,
                                                         .copy = dev_copy,
                                                         .mark = dev_mark,
                                                         .ready = dev_ready,
                                                         .after = dev_after,
                                                         .copy_time = dev_copy_time,
                                                         .close = dev_close};

void executor_remote_dev_free(struct executor_remote *r)
{
    dev_close(r);
}
