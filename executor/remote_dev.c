/* executor/remote_dev.c - the fetchers' device expert pools, seen from the executor: one per
 * device, filled by the fetchers whose shards hold experts of the device's layers (its members; a
 * fetcher is a member of one pool at most, as it serves one); the memory made by the first
 * member (the lead) and mapped here and in every other member, each member's events and control
 * page imported over "fetcher-<i>.dev", copies, marks and waits asked for on each member's ring
 * (proto.h: the fetcher's device pool). */
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

#define DEV_REPLY_MS 10000 /* PIECE's and ADOPT's replies */
/* OPEN's: a fetcher's first OPEN registers its whole RAM pool with the device as pinned memory,
 * which faults in and locks every page (seconds per ten GB); a fetcher that died closes the
 * socket, which ends the wait at once. */
#define DEV_OPEN_REPLY_MS 120000
#define DEV_WAIT_MS  50    /* a mark's wait between checks of the fetcher */

/* One fetcher's side of the pool. */
struct dev_fetcher {
    int                         sock; /* its pool connection */
    uint64_t                    instance;
    uint32_t                    pid;
    struct common_devmem_event *ev[EXECUTOR_DEV_MAX_EVENTS]; /* its events */
    void                       *ctl_page;
    _Atomic uint32_t           *ctl;         /* its last mark */
    _Atomic uint64_t           *ctl_busy;    /* its copy time */
    _Atomic uint32_t           *ctl_failed;  /* the last mark after a failed read */
    uint32_t                    failed_seen; /* its value as last seen */
    uint32_t                    seq;         /* the last mark asked of it */
    uint32_t pend[EXECUTOR_DEV_MAX_EVENTS];  /* event k's last mark not yet waited for, 0 = none */
    bool     dirty[EXECUTOR_DEV_MAX_EVENTS]; /* copies asked since its last mark of event k */
};

struct remote_dev {
    struct executor_remote      *r;
    pthread_mutex_t              mu; /* the sockets and pieces */
    _Atomic bool                 gone;
    /* The pieces are this process's (a retake after a loss): made here and adopted by every
     * member, the lead included. */
    bool                         own;
    int                          dev; /* the device and bytes OPEN asked */
    size_t                       asked;
    struct executor_dev_pool     p;
    uint32_t                     n_events;
    struct common_devmem_piece **pieces; /* p.bytes / p.gran entries, NULL = not mapped */
    uint32_t                     n_pieces;
    uint64_t                     busy; /* the fetchers' copy time, as last seen */
    uint32_t                     lead; /* the member whose memory the pool is */
    bool                         in[EXECUTOR_DEV_MAX_FETCHERS]; /* the members */
    /* each member's pool k (its socket k, the records' prio): a fetcher serves the pools of
     * several devices with --device-pools */
    uint32_t                     pidx[EXECUTOR_DEV_MAX_FETCHERS];
    uint32_t                     n_f;
    struct dev_fetcher           f[]; /* one per link (only the members' are used) */
};

/* Ends this process's side of fetcher f's pool: its connection, events and control page (its
 * sequence of marks goes on). */
static void dev_fetcher_close(struct dev_fetcher *f)
{
    for (uint32_t k = 0; k < EXECUTOR_DEV_MAX_EVENTS; k++) {
        common_devmem_event_destroy(f->ev[k]);
        f->ev[k] = NULL;
        f->pend[k] = 0;
        f->dirty[k] = false;
    }
    if (f->ctl_page)
        munmap(f->ctl_page, PROTO_DEVPOOL_CTL_BYTES);
    f->ctl_page = NULL;
    f->ctl = NULL;
    f->ctl_busy = NULL;
    f->ctl_failed = NULL;
    if (f->sock >= 0)
        close(f->sock);
    f->sock = -1;
}

static void dev_free(struct remote_dev *d)
{
    if (!d)
        return;
    for (uint32_t k = 0; d->pieces && k < d->n_pieces; k++)
        common_devmem_piece_destroy(d->pieces[k]);
    free(d->pieces);
    common_devmem_unreserve(d->p.base, d->p.bytes);
    common_devmem_event_destroy(d->p.kev);
    for (uint32_t i = 0; i < d->n_f; i++)
        if (d->in[i])
            dev_fetcher_close(&d->f[i]);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* A fetcher that copies into the pool is gone (or unusable): every later copy is refused until a
 * retake; the memory stays mapped. */
static void dev_gone(struct remote_dev *d, uint32_t i, const char *why)
{
    if (atomic_exchange(&d->gone, true))
        return;
    COMMON_LOG_WARN("executor.remote",
                    "the fetchers' device pool is gone (fetcher=%u: %s); the executor fills its "
                    "memory itself until every fetcher runs again",
                    i, why);
}

/* Text of an ERROR reply (a string of the blob). */
static const char *dev_error_text(struct common_devmem_handle *h)
{
    if (h->len == 0 || h->len > COMMON_DEVMEM_BLOB)
        return "an error";
    h->blob[h->len - 1] = 0;
    return (const char *)h->blob;
}

/* Opens fetcher i's side of the pool (adopts: the memory is the lead's). *g: what it granted.
 * 0 or a negative common_err (e says what). */
static int dev_open_fetcher(struct executor_remote *r, struct remote_dev *d, uint32_t i, int dev,
                            size_t bytes, uint32_t n_events, bool adopts,
                            struct proto_devpool_granted *g, struct common_errmsg *e)
{
    struct dev_fetcher *f = &d->f[i];
    char                path[PROTO_MAX_PATH];
    if (proto_devpool_path(path, sizeof(path), r->run_dir, i, d->pidx[i]) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "run dir path too long");
    int rc = common_unix_connect(path, &f->sock);
    if (rc != COMMON_OK) {
        f->sock = -1;
        if (d->pidx[i])
            return common_errmsg_set(e, COMMON_ENOTSUP,
                                     "fetcher %u serves the pools of %u other devices, no more "
                                     "(--device-pools; %s: %s)",
                                     i, d->pidx[i], path, common_strerror(rc));
        return common_errmsg_set(e, COMMON_ENOTSUP, "fetcher %u serves no device pool (%s: %s)", i,
                                 path, common_strerror(rc));
    }
    const struct proto_devpool_open o = {.magic = PROTO_DEVPOOL_MAGIC,
                                         .device = dev,
                                         .bytes = bytes,
                                         .n_events = n_events,
                                         .flags = adopts ? PROTO_DEVPOOL_ADOPTS : 0};
    struct common_devmem_handle     h = {.fd = -1, .len = sizeof(o)};
    memcpy(h.blob, &o, sizeof(o));
    uint64_t tag = 0;
    rc = common_devmem_handle_send(f->sock, &h, PROTO_DEVPOOL_OPEN);
    if (rc == COMMON_OK)
        rc = common_devmem_handle_recv(f->sock, &h, &tag, DEV_OPEN_REPLY_MS);
    if (rc == COMMON_OK && h.fd >= 0)
        close(h.fd);
    if (rc == COMMON_OK && tag == PROTO_DEVPOOL_ERROR)
        return common_errmsg_set(e, COMMON_ENOTSUP, "fetcher %u refused the pool: %s", i,
                                 dev_error_text(&h));
    if (rc == COMMON_OK && (tag != PROTO_DEVPOOL_GRANTED || h.len != sizeof(*g)))
        return common_errmsg_set(e, COMMON_EPROTO, "fetcher %u's device pool: an unexpected reply",
                                 i);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, rc, "fetcher %u's device pool: %s", i, common_strerror(rc));
    memcpy(g, h.blob, sizeof(*g));
    g->backend[sizeof(g->backend) - 1] = 0;
    if (g->granularity == 0 || g->bytes < bytes || g->bytes % g->granularity ||
        g->bytes / g->granularity > UINT32_MAX || strcmp(g->backend, common_devmem_backend()))
        return common_errmsg_set(e, COMMON_EPROTO,
                                 "fetcher %u's device pool is not this process's kind (%s)", i,
                                 g->backend);
    /* The control page, then the fetcher's events, then our kernels' event. */
    if ((rc = common_devmem_handle_recv(f->sock, &h, &tag, DEV_REPLY_MS)) != COMMON_OK)
        return common_errmsg_set(e, rc, "fetcher %u's device pool: %s", i, common_strerror(rc));
    if (tag == PROTO_DEVPOOL_CTL && h.fd >= 0) {
        void *p = mmap(NULL, PROTO_DEVPOOL_CTL_BYTES, PROT_READ, MAP_SHARED, h.fd, 0);
        if (p != MAP_FAILED) {
            f->ctl_page = p;
            f->ctl = p;
            f->ctl_busy = (_Atomic uint64_t *)((uint8_t *)p + 8);
            f->ctl_failed = (_Atomic uint32_t *)((uint8_t *)p + 16);
            f->failed_seen = atomic_load_explicit(f->ctl_failed, memory_order_relaxed);
        }
    }
    if (h.fd >= 0)
        close(h.fd);
    if (!f->ctl_page)
        return common_errmsg_set(e, COMMON_EPROTO, "fetcher %u's device pool: no control page", i);
    for (uint32_t k = 0; k < n_events; k++) {
        if ((rc = common_devmem_handle_recv(f->sock, &h, &tag, DEV_REPLY_MS)) != COMMON_OK)
            return common_errmsg_set(e, rc, "fetcher %u's device pool: %s", i, common_strerror(rc));
        if (tag != PROTO_DEVPOOL_EVENT) {
            if (h.fd >= 0)
                close(h.fd);
            return common_errmsg_set(e, COMMON_EPROTO, "fetcher %u's device pool: no event %u", i,
                                     k);
        }
        if ((rc = common_devmem_event_import(&h, &f->ev[k], e)) != COMMON_OK)
            return rc;
    }
    if ((rc = common_devmem_event_export(d->p.kev, &h, e)) != COMMON_OK)
        return rc;
    rc = common_devmem_handle_send(f->sock, &h, PROTO_DEVPOOL_KEVENT);
    close(h.fd);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, rc, "fetcher %u's device pool: %s", i, common_strerror(rc));
    struct remote_link *L = &r->links[i];
    pthread_mutex_lock(&L->mu);
    f->instance = L->instance;
    f->pid = L->pid;
    pthread_mutex_unlock(&L->mu);
    return COMMON_OK;
}

/* Whether link i's shard holds experts of layers [l0, l1). */
static bool dev_shard_meets(const struct executor_remote *r, uint32_t i, uint32_t l0, uint32_t l1)
{
    const struct proto_shard *sh = &r->links[i].shard;
    if (sh->n_layers == 0) /* every layer */
        return true;
    return sh->first_layer < l1 && l0 < sh->first_layer + sh->n_layers;
}

static int dev_open(void *arg, int dev, uint32_t first_layer, uint32_t n_layers, size_t bytes,
                    uint32_t n_events, struct executor_dev_pool *out, void **pool,
                    struct common_errmsg *e)
{
    struct executor_remote *r = arg;
    *pool = NULL;
    if (r->n_links > EXECUTOR_DEV_MAX_FETCHERS)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "the experts come from %u fetchers, more than %u", r->n_links,
                                 EXECUTOR_DEV_MAX_FETCHERS);
    if (n_events == 0 || n_events > EXECUTOR_DEV_MAX_EVENTS ||
        n_events > PROTO_DEVPOOL_MAX_EVENTS || bytes == 0 || n_layers == 0)
        return common_errmsg_set(e, COMMON_EINVAL, "a bad request for a device pool");
    uint32_t slot = 0; /* the first free one */
    while (slot < EXECUTOR_DEV_MAX_FETCHERS && r->devs[slot])
        slot++;
    if (slot == EXECUTOR_DEV_MAX_FETCHERS)
        return common_errmsg_set(e, COMMON_ENOTSUP, "every fetcher serves a device pool");
    /* Its members: the fetchers holding experts of these layers, each through its first pool
     * (socket) no other device's pool uses. */
    const uint32_t l1 = first_layer + n_layers;
    bool           in[EXECUTOR_DEV_MAX_FETCHERS] = {false};
    uint32_t       n_in = 0, lead = 0, pidx[EXECUTOR_DEV_MAX_FETCHERS] = {0};
    for (uint32_t i = 0; i < r->n_links; i++) {
        if (!dev_shard_meets(r, i, first_layer, l1))
            continue;
        for (bool used = true; used && pidx[i] < PROTO_DEVPOOL_MAX_POOLS; pidx[i] += used) {
            used = false;
            for (uint32_t k = 0; k < EXECUTOR_DEV_MAX_FETCHERS; k++)
                used = used || (r->devs[k] && r->devs[k]->in[i] && r->devs[k]->pidx[i] == pidx[i]);
        }
        if (pidx[i] == PROTO_DEVPOOL_MAX_POOLS)
            return common_errmsg_set(e, COMMON_ENOTSUP, "fetcher %u serves %u device pools already",
                                     i, PROTO_DEVPOOL_MAX_POOLS);
        lead = n_in++ ? lead : i;
        in[i] = true;
    }
    if (n_in == 0)
        return common_errmsg_set(e, COMMON_ENOTSUP, "no fetcher holds experts of layers %u..%u",
                                 first_layer, l1 - 1);
    int rc = common_devmem_open(dev, e);
    if (rc != COMMON_OK)
        return rc;
    struct remote_dev *d = calloc(1, sizeof(*d) + (size_t)r->n_links * sizeof(d->f[0]));
    if (!d || pthread_mutex_init(&d->mu, NULL) != 0) {
        free(d);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    atomic_init(&d->gone, false);
    d->r = r;
    d->n_f = r->n_links;
    d->n_events = n_events;
    d->dev = dev;
    d->asked = bytes;
    d->lead = lead;
    memcpy(d->in, in, sizeof(in));
    memcpy(d->pidx, pidx, sizeof(pidx));
    for (uint32_t i = 0; i < d->n_f; i++)
        d->f[i].sock = -1;
    rc = common_devmem_event_create(&d->p.kev, e);
    struct proto_devpool_granted g0 = {0};
    bool                         stages = true;
    for (uint32_t i = 0; rc == COMMON_OK && i < d->n_f; i++) {
        if (!d->in[i])
            continue;
        struct proto_devpool_granted g = {0};
        rc = dev_open_fetcher(r, d, i, dev, bytes, n_events, i != lead, &g, e);
        stages = stages && (g.flags & PROTO_DEVPOOL_STAGES);
        if (rc == COMMON_OK && i == lead)
            g0 = g;
        else if (rc == COMMON_OK && (g.bytes != g0.bytes || g.granularity != g0.granularity))
            rc = common_errmsg_set(e, COMMON_EPROTO,
                                   "fetcher %u's device pool differs from fetcher %u's", i, lead);
    }
    if (rc == COMMON_OK) {
        d->n_pieces = (uint32_t)(g0.bytes / g0.granularity);
        d->pieces = calloc(d->n_pieces, sizeof(*d->pieces));
        d->p.bytes = g0.bytes;
        d->p.gran = g0.granularity;
        d->p.n_fetchers = n_in;
        d->p.lead = lead;
        d->p.stages = stages;
        snprintf(d->p.backend, sizeof(d->p.backend), "%s", g0.backend);
        if (!d->pieces || !(d->p.base = common_devmem_reserve(g0.bytes, e)))
            rc = common_errmsg_set(e, COMMON_ENOMEM, "the device pool's address space: %s",
                                   e && e->text[0] ? e->text : "out of memory");
    }
    if (rc != COMMON_OK) {
        dev_free(d);
        return rc;
    }
    r->devs[slot] = d;
    *out = d->p;
    *pool = d;
    return COMMON_OK;
}

/* Hands piece k (the lead's handle h, still ours) to fetcher i to map. 0 or a negative
 * common_err: ECLOSED and the like (the fetcher is gone), EDEVICE (it refused). */
static int dev_adopt(struct remote_dev *d, uint32_t i, uint32_t k,
                     const struct common_devmem_handle *h, struct common_errmsg *e)
{
    struct common_devmem_handle c = *h;
    if ((c.fd = dup(h->fd)) < 0)
        return common_errmsg_set(e, COMMON_EIO, "dup: %s", strerror(errno));
    uint64_t tag = 0;
    int rc = common_devmem_handle_send(d->f[i].sock, &c, PROTO_DEVPOOL_ADOPT | (uint64_t)k << 32);
    close(c.fd);
    if (rc == COMMON_OK)
        rc = common_devmem_handle_recv(d->f[i].sock, &c, &tag, DEV_REPLY_MS);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, rc, "fetcher %u: %s", i, common_strerror(rc));
    if (c.fd >= 0)
        close(c.fd);
    if (tag != (PROTO_DEVPOOL_ADOPTED | (uint64_t)k << 32))
        return common_errmsg_set(e, COMMON_EDEVICE, "fetcher %u could not map piece %u: %s", i, k,
                                 tag == PROTO_DEVPOOL_ERROR ? dev_error_text(&c) : "no reply");
    return COMMON_OK;
}

/* Hands piece k (made or imported here) to every member to map. 0, or a negative common_err
 * (e says which fetcher and why). d->mu held. */
static int dev_adopt_all(struct remote_dev *d, uint32_t k, struct common_errmsg *e)
{
    struct common_devmem_handle h = {.fd = -1};
    int                         rc = common_devmem_piece_export(d->pieces[k], &h, e);
    for (uint32_t i = 0; rc == COMMON_OK && i < d->n_f; i++)
        if (d->in[i])
            rc = dev_adopt(d, i, k, &h, e);
    if (h.fd >= 0)
        close(h.fd);
    return rc;
}

static int dev_back(void *arg, uint32_t k, struct common_errmsg *e)
{
    struct remote_dev *d = arg;
    if (!d || k >= d->n_pieces)
        return common_errmsg_set(e, COMMON_EINVAL, "no such piece of the device pool");
    pthread_mutex_lock(&d->mu);
    int rc = common_devmem_open(d->dev, e); /* its pieces are its device's */
    if (rc == COMMON_OK && !d->pieces[k] && !d->own && !atomic_load(&d->gone)) {
        struct common_devmem_handle h = {.fd = -1, .len = sizeof(k)};
        uint64_t                    tag = 0;
        memcpy(h.blob, &k, sizeof(k));
        rc = common_devmem_handle_send(d->f[d->lead].sock, &h, PROTO_DEVPOOL_PIECE);
        if (rc == COMMON_OK)
            rc = common_devmem_handle_recv(d->f[d->lead].sock, &h, &tag, DEV_REPLY_MS);
        if (rc == COMMON_OK && tag == PROTO_DEVPOOL_PIECE && h.fd >= 0) {
            /* every other member maps it too, then we do */
            for (uint32_t i = 0; rc == COMMON_OK && i < d->n_f; i++)
                if (i != d->lead && d->in[i] && (rc = dev_adopt(d, i, k, &h, e)) != COMMON_OK &&
                    rc != COMMON_EDEVICE) {
                    dev_gone(d, i, e && e->text[0] ? e->text : common_strerror(rc));
                    rc = COMMON_OK;
                    break;
                }
            struct common_devmem_piece *p = NULL;
            if (rc != COMMON_OK) {
                close(h.fd);
            } else if ((rc = common_devmem_piece_import(&h, d->p.gran, &p, e)) == COMMON_OK &&
                       (rc = common_devmem_piece_map(p, d->p.base + (size_t)k * d->p.gran, e)) !=
                           COMMON_OK) {
                common_devmem_piece_destroy(p);
            }
            if (rc == COMMON_OK)
                d->pieces[k] = p;
        } else if (rc == COMMON_OK) {
            if (h.fd >= 0)
                close(h.fd);
            rc = common_errmsg_set(e, COMMON_EDEVICE, "fetcher %u's device pool: piece %u: %s",
                                   d->lead, k,
                                   tag == PROTO_DEVPOOL_ERROR ? dev_error_text(&h) : "no piece");
        } else {
            dev_gone(d, d->lead, common_strerror(rc)); /* made here below */
            rc = COMMON_OK;
        }
    }
    if (rc == COMMON_OK && !d->pieces[k]) { /* a piece of our own: the fetchers gone, or taken
                                                back (then every fetcher maps it too) */
        struct common_devmem_piece *p = NULL;
        if ((rc = common_devmem_piece_create(d->p.gran, &p, e)) == COMMON_OK &&
            (rc = common_devmem_piece_map(p, d->p.base + (size_t)k * d->p.gran, e)) != COMMON_OK)
            common_devmem_piece_destroy(p);
        if (rc == COMMON_OK)
            d->pieces[k] = p;
        struct common_errmsg ae = {{0}};
        if (rc == COMMON_OK && d->own && !atomic_load(&d->gone) &&
            dev_adopt_all(d, k, &ae) != COMMON_OK)
            dev_gone(d, d->lead, ae.text[0] ? ae.text : "a fetcher could not map a piece");
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

/* Whether link i still runs the fetcher instance the pool was opened with. */
static bool dev_same(struct executor_remote *r, struct remote_dev *d, uint32_t i)
{
    struct remote_link *L = &r->links[i];
    pthread_mutex_lock(&L->mu);
    const bool same = L->up && L->instance == d->f[i].instance;
    pthread_mutex_unlock(&L->mu);
    return same;
}

/* Pushes a device record to fetcher i while the pool lives. 0 or COMMON_ECLOSED. */
static int dev_push(struct executor_remote *r, struct remote_dev *d, uint32_t i,
                    const struct proto_fetch_req *rec)
{
    struct remote_link *L = &r->links[i];
    if (atomic_load(&d->gone))
        return COMMON_ECLOSED;
    struct proto_fetch_req rk = *rec;
    rk.prio = d->pidx[i]; /* the fetcher's pool */
    pthread_mutex_lock(&L->push_mu);
    const bool same = dev_same(r, d, i);
    int        rc = same ? executor_remote_push(L, &rk, true) : COMMON_ECLOSED;
    pthread_mutex_unlock(&L->push_mu);
    if (rc != COMMON_OK) {
        dev_gone(d, i, same ? common_strerror(rc) : "it restarted");
        return COMMON_ECLOSED;
    }
    return COMMON_OK;
}

static int dev_copy(void *arg, size_t dst, const void *src, size_t bytes)
{
    struct remote_dev      *d = arg;
    struct executor_remote *r = d->r;
    if (atomic_load(&d->gone))
        return COMMON_ECLOSED;
    /* The fetcher whose pool src lies in: its mapping for loans, or its view's for direct reads
     * (both map the segment from its start). */
    const uint8_t *s = src;
    uint32_t       owner = UINT32_MAX;
    uint64_t       off = 0;
    for (uint32_t i = 0; i < d->n_f && owner == UINT32_MAX; i++) {
        if (!d->in[i])
            continue;
        struct remote_link *L = &r->links[i];
        pthread_mutex_lock(&L->mu);
        const struct remote_map *m = L->instance == d->f[i].instance ? L->map : NULL;
        const uint8_t           *bases[2] = {m ? m->base : NULL, m ? m->view.base : NULL};
        const size_t             lens[2] = {m ? m->bytes : 0, m ? m->view.map_bytes : 0};
        for (int j = 0; j < 2 && owner == UINT32_MAX; j++)
            if (bases[j] && s >= bases[j] && bytes <= lens[j] &&
                (size_t)(s - bases[j]) <= lens[j] - bytes && bytes <= UINT32_MAX) {
                owner = i;
                off = (uint64_t)(s - bases[j]);
            }
        pthread_mutex_unlock(&L->mu);
    }
    if (owner == UINT32_MAX) { /* (a member that restarted maps its pool anew) */
        uint32_t gone = UINT32_MAX;
        for (uint32_t i = 0; i < d->n_f && gone == UINT32_MAX; i++)
            if (d->in[i] && !dev_same(r, d, i))
                gone = i;
        dev_gone(d, gone == UINT32_MAX ? d->lead : gone,
                 gone == UINT32_MAX ? "an expert outside the members' pools" : "it restarted");
        return COMMON_ECLOSED;
    }
    const struct proto_fetch_req rec = {
        .op = PROTO_FETCH_DEV_COPY, .bytes = (uint32_t)bytes, .src = off, .dst = dst};
    if (dev_push(r, d, owner, &rec) != COMMON_OK)
        return COMMON_ECLOSED;
    for (uint32_t k = 0; k < d->n_events; k++)
        d->f[owner].dirty[k] = true;
    return COMMON_OK;
}

static int dev_read(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                    size_t dst, size_t bytes)
{
    struct remote_dev      *d = arg;
    struct executor_remote *r = d->r;
    if (atomic_load(&d->gone))
        return COMMON_ECLOSED;
    const struct remote_link *L = executor_remote_owner(r, layer, expert);
    const uint32_t            i = L ? (uint32_t)(L - r->links) : UINT32_MAX;
    if (!d->p.stages || i >= d->n_f || !d->in[i] || bytes > UINT32_MAX) {
        dev_gone(d, d->lead, "a read the fetchers cannot stage");
        return COMMON_ECLOSED;
    }
    const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEV_READ,
                                        .layer = layer,
                                        .expert = expert,
                                        .part = (uint32_t)part,
                                        .bytes = (uint32_t)bytes,
                                        .dst = dst};
    if (dev_push(r, d, i, &rec) != COMMON_OK)
        return COMMON_ECLOSED;
    for (uint32_t k = 0; k < d->n_events; k++)
        d->f[i].dirty[k] = true;
    return COMMON_OK;
}

static int dev_mark(void *arg, uint32_t k)
{
    struct remote_dev      *d = arg;
    struct executor_remote *r = d->r;
    if (k >= d->n_events)
        return COMMON_ECLOSED;
    for (uint32_t i = 0; i < d->n_f; i++) {
        struct dev_fetcher *f = &d->f[i];
        if (!d->in[i] || !f->dirty[k])
            continue;
        const uint32_t               seq = ++f->seq ? f->seq : ++f->seq; /* never 0 */
        const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEV_MARK, .tag = k, .loan = seq};
        if (dev_push(r, d, i, &rec) != COMMON_OK)
            return COMMON_ECLOSED;
        f->dirty[k] = false;
        f->pend[k] = seq;
    }
    return COMMON_OK;
}

/* Waits until fetcher i published mark seq. 0 or COMMON_ECLOSED. */
static int dev_wait_mark(struct executor_remote *r, struct remote_dev *d, uint32_t i, uint32_t seq)
{
    struct dev_fetcher *f = &d->f[i];
    const uint64_t      t0 = common_now_ns();
    for (;;) {
        const uint32_t v = atomic_load_explicit(f->ctl, memory_order_acquire);
        if ((int32_t)(v - seq) >= 0)
            return COMMON_OK;
        if (atomic_load(&d->gone))
            return COMMON_ECLOSED;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = DEV_WAIT_MS * 1000000L};
        (void)syscall(SYS_futex, f->ctl_page, FUTEX_WAIT, v, &ts, NULL, 0);
        if (atomic_load_explicit(f->ctl, memory_order_acquire) != v)
            continue;
        const char *why = !dev_same(r, d, i)        ? "it restarted"
                          : common_pid_gone(f->pid) ? "it died"
                          : common_now_ns() - t0 > (uint64_t)r->acquire_timeout_ms * 1000000ull
                              ? "a mark did not come in time"
                              : NULL;
        if (why) {
            dev_gone(d, i, why);
            return COMMON_ECLOSED;
        }
    }
}

static int dev_ready(void *arg, uint32_t k, struct common_devmem_event **evs, uint32_t *n)
{
    struct remote_dev      *d = arg;
    struct executor_remote *r = d->r;
    *n = 0;
    if (k >= d->n_events)
        return COMMON_ECLOSED;
    bool failed = false;
    for (uint32_t i = 0; i < d->n_f; i++) {
        struct dev_fetcher *f = &d->f[i];
        if (!d->in[i] || !f->pend[k])
            continue;
        if (dev_wait_mark(r, d, i, f->pend[k]) != COMMON_OK)
            return COMMON_ECLOSED;
        f->pend[k] = 0;
        evs[(*n)++] = f->ev[k];
        /* a read that failed since the last look (the mark's store published it) */
        const uint32_t fs = atomic_load_explicit(f->ctl_failed, memory_order_relaxed);
        failed = failed || fs != f->failed_seen;
        f->failed_seen = fs;
    }
    return failed ? COMMON_EIO : COMMON_OK;
}

static void dev_copy_time(void *arg, uint64_t *ns)
{
    struct remote_dev *d = arg;
    if (!atomic_load(&d->gone)) {
        uint64_t sum = 0;
        for (uint32_t i = 0; i < d->n_f; i++)
            if (d->in[i])
                sum += atomic_load_explicit(d->f[i].ctl_busy, memory_order_relaxed);
        d->busy = sum;
    }
    *ns = d->busy;
}

static int dev_after(void *arg)
{
    struct remote_dev           *d = arg;
    const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEV_WAIT};
    for (uint32_t i = 0; i < d->n_f; i++)
        if (d->in[i] && dev_push(d->r, d, i, &rec) != COMMON_OK)
            return COMMON_ECLOSED;
    return COMMON_OK;
}

/* Every fetcher is up again after the pool was lost: each one opens its side anew (ADOPTS: the
 * memory is now this process's, mapped from the pieces held here), maps every piece made so far,
 * and copies again from then on; later pieces are made here. 0 (*out updated), COMMON_EAGAIN
 * (a fetcher is still down), or another negative common_err (e says what; the pool stays lost,
 * to be tried again). */
static int dev_retake(void *arg, struct executor_dev_pool *out, struct common_errmsg *e)
{
    struct remote_dev      *d = arg;
    struct executor_remote *r = d->r;
    dev_gone(d, d->lead, "the executor lost it"); /* where only the caller saw it go */
    for (uint32_t i = 0; i < d->n_f; i++) {
        if (!d->in[i])
            continue;
        struct remote_link *L = &r->links[i];
        pthread_mutex_lock(&L->mu);
        const bool up = L->up && !(L->pid && common_pid_gone(L->pid)); /* not yet relinked */
        pthread_mutex_unlock(&L->mu);
        if (!up)
            return common_errmsg_set(e, COMMON_EAGAIN, "fetcher %u is down", i);
    }
    pthread_mutex_lock(&d->mu);
    int  rc = common_devmem_open(d->dev, e); /* its events and pieces are its device's */
    bool stages = true;
    for (uint32_t i = 0; rc == COMMON_OK && i < d->n_f; i++) {
        if (!d->in[i])
            continue;
        struct proto_devpool_granted g = {0};
        dev_fetcher_close(&d->f[i]);
        rc = dev_open_fetcher(r, d, i, d->dev, d->asked, d->n_events, true, &g, e);
        if (rc == COMMON_OK && (g.bytes != d->p.bytes || g.granularity != d->p.gran))
            rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher %u's device pool differs", i);
        stages = stages && (g.flags & PROTO_DEVPOOL_STAGES);
    }
    for (uint32_t k = 0; rc == COMMON_OK && k < d->n_pieces; k++)
        if (d->pieces[k])
            rc = dev_adopt_all(d, k, e);
    if (rc == COMMON_OK) {
        for (uint32_t i = 0; i < d->n_f; i++)
            if (d->in[i])
                d->f[i].failed_seen =
                    atomic_load_explicit(d->f[i].ctl_failed, memory_order_relaxed);
        d->own = true;
        d->p.stages = stages;
        atomic_store(&d->gone, false);
        *out = d->p;
    } else {
        for (uint32_t i = 0; i < d->n_f; i++)
            if (d->in[i])
                dev_fetcher_close(&d->f[i]);
    }
    pthread_mutex_unlock(&d->mu);
    return rc;
}

static void dev_close(void *arg)
{
    struct remote_dev *d = arg;
    if (!d)
        return;
    for (uint32_t k = 0; k < EXECUTOR_DEV_MAX_FETCHERS; k++)
        if (d->r->devs[k] == d)
            d->r->devs[k] = NULL;
    dev_free(d);
}

const struct executor_dev_ops executor_remote_dev_ops = {.open = dev_open,
                                                         .back = dev_back,
                                                         .copy = dev_copy,
                                                         .read = dev_read,
                                                         .mark = dev_mark,
                                                         .ready = dev_ready,
                                                         .after = dev_after,
                                                         .retake = dev_retake,
                                                         .copy_time = dev_copy_time,
                                                         .close = dev_close};

void executor_remote_dev_free(struct executor_remote *r)
{
    for (uint32_t k = 0; k < EXECUTOR_DEV_MAX_FETCHERS; k++)
        dev_close(r->devs[k]);
}
