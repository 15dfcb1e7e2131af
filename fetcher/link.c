/* fetcher/link.c - one executor link: ring pair, reader thread, non-blocking replies, loans. */
#include "link.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ACQUIREs a link has outstanding (being answered, or their replies in the backlog); the reader
 * stops popping records at this many. */
#define LINK_MAX_ACQUIRES    4096u
#define LINK_POLL_MS         200 /* reader's waits: how soon stop and executor death show */
#define LINK_BACKLOG_POLL_MS 1   /* reader's waits while a reply may wait for room in the ring */
#define LINK_NONE            UINT32_MAX

/* One ACQUIRE from its record to its reply: being answered by the fetcher (one link reference
 * held), its reply in the backlog, or free. */
struct link_acq {
    struct fetcher_link   *link; /* borrowed: the link whose table holds this entry */
    struct proto_fetch_req req;  /* the record */
    struct proto_fetch_rep rep;  /* its reply, once answered */
    uint32_t               next; /* free list or backlog link (table index), LINK_NONE at the end */
};

struct fetcher_link {
    const struct fetcher_link_host *h;       /* borrowed: the service's, outlives the link */
    struct common_ring_segment      req_seg; /* mapped: executor -> fetcher records */
    struct common_ring_segment      rep_seg; /* mapped: fetcher -> executor replies */
    struct common_ring              req;     /* consumer side, used by the reader thread only */
    struct common_ring              rep;     /* producer side, under push_mu */
    uint32_t                        pid;     /* executor pid from ATTACH (0 = not told) */
    uint32_t                       *pins;    /* owned: loans held per pool slot; under h->mu */
    uint64_t                        n_pins;  /* sum of pins; under h->mu */
    /* References: the service's and one per ACQUIRE being answered. Increments are relaxed (the
     * incrementer holds a reference already); the decrement is acq_rel so that the last holder,
     * which frees the link, sees every other holder's writes (pairs with itself). */
    _Atomic uint32_t refs;
    _Atomic bool     dead;      /* set once under h->mu, with the pins released; relaxed reads */
    _Atomic bool     stop;      /* asks the reader thread to exit; read under push_mu or polled */
    pthread_mutex_t  push_mu;   /* guards rep (one producer), the backlog and the free list */
    pthread_cond_t   cv;        /* an entry was freed or backlogged, or stop: wakes a reader
                                   waiting for a free entry */
    bool             sync_init; /* push_mu and cv initialised */
    struct link_acq *acq;       /* owned: LINK_MAX_ACQUIRES entries */
    uint32_t         free_head; /* free entries; under push_mu */
    uint32_t         n_free;    /* entries on the free list; under push_mu */
    /* The backlog: replies that found the ring full, oldest first, pushed by the reader before
     * it pops a record; a later reply joins its end rather than overtake it. */
    uint32_t  backlog_head;   /* oldest entry, LINK_NONE when empty; under push_mu */
    uint32_t  backlog_tail;   /* newest entry; under push_mu */
    uint32_t  n_backlog;      /* entries in the backlog; under push_mu */
    uint64_t  pid_check_ns;   /* reader's last look at the executor's pid (monotonic ns) */
    pthread_t thread;         /* the reader */
    bool      thread_started; /* `thread` runs: join it */
};

/* ---- lifetime ----------------------------------------------------------------------------- */

static void link_free(struct fetcher_link *l)
{
    common_ring_segment_close(&l->req_seg);
    common_ring_segment_close(&l->rep_seg);
    if (l->sync_init) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->push_mu);
    }
    free(l->acq);
    free(l->pins);
    free(l);
}

static void link_unref(struct fetcher_link *l)
{
    /* Acq_rel: see `refs`. */
    if (atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) == 1)
        link_free(l);
}

/* Ends the link's loans and marks it dead (replies stop, the reader exits). Takes h->mu. */
static void link_kill(struct fetcher_link *l)
{
    const struct fetcher_link_host *h = l->h;
    pthread_mutex_lock(h->mu);
    if (!atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        atomic_store_explicit(&l->dead, true, memory_order_relaxed);
        for (uint32_t slot = 0; slot < h->n_slots; slot++)
            while (l->pins[slot] > 0) {
                l->pins[slot]--;
                fetcher_release(h->f, slot);
            }
        l->n_pins = 0;
        h->c->links_dropped++;
    }
    pthread_mutex_unlock(h->mu);
}

/* Drops the link after `rc` from its `what` ring (COMMON_ECLOSED: the executor is gone). */
static void link_fail(struct fetcher_link *l, int rc, const char *what)
{
    if (rc == COMMON_ECLOSED)
        COMMON_LOG_WARN("fetcher.serve", "executor pid=%u is gone: link dropped", l->pid);
    else
        COMMON_LOG_WARN("fetcher.serve", "%s ring of executor pid=%u unusable (%s): link dropped",
                        what, l->pid, common_strerror(rc));
    link_kill(l);
}

/* True when the executor's pid is gone, looking at most once per LINK_POLL_MS (reader only). */
static bool link_peer_gone(struct fetcher_link *l)
{
    uint64_t now = common_now_ns();
    if (l->pid_check_ns != 0 && now - l->pid_check_ns < (uint64_t)LINK_POLL_MS * 1000000u)
        return false;
    l->pid_check_ns = now;
    return common_pid_gone(l->pid);
}

/* ---- replies: the ring, then the backlog (under push_mu unless said) ----------------------- */

static void link_acq_put_locked(struct fetcher_link *l, struct link_acq *a)
{
    a->next = l->free_head;
    l->free_head = (uint32_t)(a - l->acq);
    l->n_free++;
    pthread_cond_signal(&l->cv);
}

/* True when a reply may be waiting in the backlog or may land there: the backlog is not empty,
 * or the ACQUIREs being answered outnumber the room left in the ring. The reader then looks again
 * every LINK_BACKLOG_POLL_MS (it sleeps on the request ring, where no reply can wake it). */
static bool link_is_tight_locked(struct fetcher_link *l)
{
    if (l->n_backlog > 0)
        return true;
    /* Relaxed: a snapshot for a heuristic. head is ours (written under push_mu); tail is the
     * executor's and untrusted: a difference above the ring size counts as full. */
    uint32_t used = atomic_load_explicit(&l->rep.hdr->head, memory_order_relaxed) -
                    atomic_load_explicit(&l->rep.hdr->tail, memory_order_relaxed);
    uint32_t room = used > l->rep.n_slots ? 0 : l->rep.n_slots - used;
    return LINK_MAX_ACQUIRES - l->n_free >= room;
}

/* Pushes the backlog's replies, oldest first, while the ring has room. Returns 0, or the ring's
 * error (COMMON_ECORRUPT, COMMON_EINVAL: the link must be dropped). */
static int link_flush_locked(struct fetcher_link *l)
{
    while (l->backlog_head != LINK_NONE) {
        struct link_acq *a = &l->acq[l->backlog_head];
        int              rc = common_ring_push(&l->rep, &a->rep, sizeof(a->rep));
        if (rc == COMMON_EAGAIN)
            return COMMON_OK;
        if (rc != COMMON_OK)
            return rc;
        l->backlog_head = a->next;
        if (l->backlog_head == LINK_NONE)
            l->backlog_tail = LINK_NONE;
        l->n_backlog--;
        link_acq_put_locked(l, a);
    }
    return COMMON_OK;
}

/* Sends a->rep without waiting: into the ring when the backlog is empty and the ring has room,
 * else at the end of the backlog (the reader pushes it later); dropped when the link is dead.
 * Takes push_mu; any thread. */
static void link_reply(struct fetcher_link *l, struct link_acq *a)
{
    int rc = COMMON_EAGAIN;
    pthread_mutex_lock(&l->push_mu);
    if (atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        link_acq_put_locked(l, a);
        rc = COMMON_OK;
    } else {
        if (l->n_backlog == 0)
            rc = common_ring_push(&l->rep, &a->rep, sizeof(a->rep));
        if (rc == COMMON_EAGAIN) {
            uint32_t i = (uint32_t)(a - l->acq);
            a->next = LINK_NONE;
            if (l->backlog_tail != LINK_NONE)
                l->acq[l->backlog_tail].next = i;
            else
                l->backlog_head = i;
            l->backlog_tail = i;
            l->n_backlog++;
            pthread_cond_signal(&l->cv); /* a reader waiting for an entry polls faster now */
            rc = COMMON_OK;
        } else {
            link_acq_put_locked(l, a); /* pushed, or the ring is unusable */
        }
    }
    pthread_mutex_unlock(&l->push_mu);
    if (rc != COMMON_OK)
        link_fail(l, rc, "reply");
}

/* Pushes what the backlog can (reader thread). Returns link_is_tight_locked() after it. */
static bool link_flush(struct fetcher_link *l)
{
    pthread_mutex_lock(&l->push_mu);
    int  rc = link_flush_locked(l);
    bool tight = link_is_tight_locked(l);
    pthread_mutex_unlock(&l->push_mu);
    if (rc != COMMON_OK)
        link_fail(l, rc, "reply");
    return tight;
}

static void link_wait_locked(struct fetcher_link *l, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    (void)pthread_cond_timedwait(&l->cv, &l->push_mu, &ts);
}

/* A free entry for one reply (reader thread). While every entry is taken it waits, pushing the
 * backlog as the executor makes room and watching the executor's pid. NULL when the link stops
 * or dies first. */
static struct link_acq *link_acq_get(struct fetcher_link *l)
{
    struct link_acq *a = NULL;
    int              rc = COMMON_OK;
    pthread_mutex_lock(&l->push_mu);
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed) &&
           !atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        if (l->free_head != LINK_NONE) {
            a = &l->acq[l->free_head];
            l->free_head = a->next;
            l->n_free--;
            break;
        }
        if ((rc = link_flush_locked(l)) != COMMON_OK)
            break;
        if (l->free_head != LINK_NONE)
            continue;
        if (link_peer_gone(l)) {
            rc = COMMON_ECLOSED;
            break;
        }
        link_wait_locked(l, link_is_tight_locked(l) ? LINK_BACKLOG_POLL_MS : LINK_POLL_MS);
    }
    pthread_mutex_unlock(&l->push_mu);
    if (rc != COMMON_OK)
        link_fail(l, rc, "reply");
    return a;
}

/* ---- ACQUIRE ------------------------------------------------------------------------------ */

/* The reply to ACQUIRE a->req, which the fetcher answered with `rc` (and `data`, `loan` when 0),
 * into a->rep; the pin is counted on the link. False (nothing to send) when the link died
 * meanwhile: the pin is released. */
static bool link_answer(struct fetcher_link *l, struct link_acq *a, int rc, const void *data,
                        uint32_t loan)
{
    const struct fetcher_link_host *h = l->h;
    const struct proto_fetch_req   *r = &a->req;
    struct proto_fetch_rep          rep = {.tag = r->tag, .status = rc, .loan = FETCHER_LOAN_NONE};
    if (rc == COMMON_OK) {
        struct common_span sp;
        const uint8_t     *p = data;
        if (loan >= h->n_slots || p < h->pool_base || p >= h->pool_base + h->pool_bytes ||
            common_model_expert_span(h->m, r->layer, r->expert, (enum common_expert_part)r->part,
                                     &sp) != COMMON_OK) {
            fetcher_release(h->f, loan);
            rc = COMMON_EIO;
            rep.status = rc;
        } else {
            rep.loan = loan;
            rep.offset = (uint64_t)(p - h->pool_base);
            rep.size = sp.size;
        }
    }
    pthread_mutex_lock(h->mu);
    if (rc == COMMON_OK) {
        if (atomic_load_explicit(&l->dead, memory_order_relaxed)) {
            fetcher_release(h->f, loan);
            pthread_mutex_unlock(h->mu);
            return false;
        }
        l->pins[loan]++;
        l->n_pins++;
        h->c->acquires++;
    } else {
        h->c->acquire_errors++;
    }
    pthread_mutex_unlock(h->mu);
    a->rep = rep;
    return true;
}

/* fetcher_acquire_async()'s callback: on the reader thread (answered at once) or the fetcher's
 * I/O thread. Replies without blocking, then drops the reference the ACQUIRE held. */
static void link_acquired(void *arg, int rc, const void *data, uint32_t loan)
{
    struct link_acq     *a = arg;
    struct fetcher_link *l = a->link;
    if (link_answer(l, a, rc, data, loan)) {
        link_reply(l, a);
    } else {
        pthread_mutex_lock(&l->push_mu);
        link_acq_put_locked(l, a);
        pthread_mutex_unlock(&l->push_mu);
    }
    link_unref(l);
}

static void link_acquire(struct fetcher_link *l, const struct proto_fetch_req *r)
{
    struct link_acq *a = link_acq_get(l);
    if (!a)
        return;
    a->req = *r;
    /* Relaxed: see `refs`; the reader's own reference is the service's, held until it joins. */
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
    int rc = fetcher_acquire_async(l->h->f, r->layer, r->expert, (enum common_expert_part)r->part,
                                   link_acquired, a);
    if (rc != COMMON_OK)
        link_acquired(a, rc, NULL, FETCHER_LOAN_NONE); /* refused: answered with the error */
}

static void link_reply_error(struct fetcher_link *l, uint32_t tag, int status)
{
    struct link_acq *a = link_acq_get(l);
    if (!a)
        return;
    a->rep = (struct proto_fetch_rep){.tag = tag, .status = status, .loan = FETCHER_LOAN_NONE};
    link_reply(l, a);
}

/* ---- the reader --------------------------------------------------------------------------- */

static bool link_req_valid(const struct fetcher_link_host *h, const struct proto_fetch_req *r)
{
    bool in_shard = r->layer < h->n_layer && r->layer >= h->first_layer &&
                    r->layer - h->first_layer < h->n_layers && r->expert >= h->first &&
                    r->expert - h->first < h->n_exp;
    switch (r->op) {
    case PROTO_FETCH_ACQUIRE:
        return in_shard && r->part < COMMON_EXPERT_PART_COUNT;
    case PROTO_FETCH_HINT:
        return in_shard && r->prio < PROTO_FETCH_PRIO_COUNT;
    case PROTO_FETCH_USE:
        return in_shard && r->part != 0 && r->part < (1u << COMMON_EXPERT_PART_COUNT);
    case PROTO_FETCH_RELEASE:
    case PROTO_FETCH_TOKEN:
        return true;
    case PROTO_FETCH_DEVICE_LAYERS:
        return r->layer <= h->n_layer;
    case PROTO_FETCH_DEV_COPY:
    case PROTO_FETCH_DEV_MARK:
    case PROTO_FETCH_DEV_WAIT:
        return h->dev_record != NULL; /* the pool checks the rest */
    case PROTO_FETCH_DEV_READ:
        return in_shard && r->part < COMMON_EXPERT_PART_COUNT && h->dev_record != NULL;
    default:
        return false;
    }
}

static void link_release(struct fetcher_link *l, uint32_t loan)
{
    const struct fetcher_link_host *h = l->h;
    pthread_mutex_lock(h->mu);
    if (loan < h->n_slots && l->pins[loan] > 0 &&
        !atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        l->pins[loan]--;
        l->n_pins--;
        fetcher_release(h->f, loan);
        h->c->releases++;
    } else {
        h->c->bad_records++;
    }
    pthread_mutex_unlock(h->mu);
}

static void link_handle(struct fetcher_link *l, const struct proto_fetch_req *r)
{
    const struct fetcher_link_host *h = l->h;
    if (!link_req_valid(h, r)) {
        pthread_mutex_lock(h->mu);
        h->c->bad_records++;
        if (r->op == PROTO_FETCH_ACQUIRE)
            h->c->acquire_errors++;
        pthread_mutex_unlock(h->mu);
        if (r->op == PROTO_FETCH_ACQUIRE)
            link_reply_error(l, r->tag, COMMON_EINVAL);
        return;
    }
    switch (r->op) {
    case PROTO_FETCH_ACQUIRE:
        link_acquire(l, r);
        break;
    case PROTO_FETCH_RELEASE:
        link_release(l, r->loan);
        break;
    case PROTO_FETCH_HINT:
        (void)fetcher_request(h->f, r->layer, r->expert, (enum fetcher_priority)r->prio);
        pthread_mutex_lock(h->mu);
        h->c->hints++;
        pthread_mutex_unlock(h->mu);
        break;
    case PROTO_FETCH_USE: {
        uint32_t n = (uint32_t)__builtin_popcount(r->part); /* parts read */
        (void)fetcher_note_use(h->f, r->layer, r->expert, n);
        pthread_mutex_lock(h->mu);
        h->c->uses += n;
        pthread_mutex_unlock(h->mu);
        break;
    }
    case PROTO_FETCH_TOKEN:
        fetcher_token_begin(h->f);
        pthread_mutex_lock(h->mu);
        h->c->tokens++;
        pthread_mutex_unlock(h->mu);
        break;
    case PROTO_FETCH_DEVICE_LAYERS:
        if (h->device_layers)
            h->device_layers(h->device_layers_arg, r->layer);
        break;
    case PROTO_FETCH_DEV_COPY:
    case PROTO_FETCH_DEV_MARK:
    case PROTO_FETCH_DEV_WAIT:
    case PROTO_FETCH_DEV_READ:
        h->dev_record(h->dev_record_arg, r);
        break;
    default:
        break;
    }
}

/* The link's reader: pushes the backlog, then pops records, until stopped, the peer dies or a
 * ring is corrupt. Never waits on the reply ring: replies that find it full wait in the
 * backlog, and while one may (link_is_tight_locked) the reader looks again every
 * LINK_BACKLOG_POLL_MS, else every LINK_POLL_MS at most. */
static void *link_thread(void *arg)
{
    struct fetcher_link *l = arg;
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed) &&
           !atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        bool                   tight = link_flush(l);
        struct proto_fetch_req r;
        int                    n = common_ring_pop_wait(&l->req, &r, sizeof(r),
                                     tight ? LINK_BACKLOG_POLL_MS : LINK_POLL_MS);
        if (n == COMMON_ETIMEDOUT) {
            if (link_peer_gone(l)) {
                link_fail(l, COMMON_ECLOSED, NULL);
                break;
            }
            continue;
        }
        if (n < 0) {
            link_fail(l, n, "request");
            break;
        }
        if ((size_t)n != sizeof(r)) {
            pthread_mutex_lock(l->h->mu);
            l->h->c->bad_records++;
            pthread_mutex_unlock(l->h->mu);
            continue;
        }
        link_handle(l, &r);
    }
    return NULL;
}

/* ---- the link's front door ---------------------------------------------------------------- */

/* Allocates the link's tables and locks (one reference, every entry free). */
static int link_alloc(const struct fetcher_link_host *h, uint32_t pid, struct fetcher_link **out)
{
    struct fetcher_link *l = calloc(1, sizeof(*l));
    if (!l)
        return COMMON_ENOMEM;
    l->h = h;
    l->pid = pid;
    atomic_init(&l->refs, 1);
    l->backlog_head = l->backlog_tail = LINK_NONE;
    l->pins = calloc(h->n_slots, sizeof(*l->pins));
    l->acq = calloc(LINK_MAX_ACQUIRES, sizeof(*l->acq));
    pthread_condattr_t ca;
    bool               ca_ok = pthread_condattr_init(&ca) == 0;
    if (!l->pins || !l->acq || !ca_ok || pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) != 0 ||
        pthread_mutex_init(&l->push_mu, NULL) != 0) {
        if (ca_ok)
            pthread_condattr_destroy(&ca);
        link_free(l);
        return COMMON_ENOMEM;
    }
    if (pthread_cond_init(&l->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&l->push_mu);
        link_free(l);
        return COMMON_ENOMEM;
    }
    pthread_condattr_destroy(&ca);
    l->sync_init = true;
    l->free_head = LINK_NONE;
    for (uint32_t i = LINK_MAX_ACQUIRES; i-- > 0;) {
        l->acq[i].link = l;
        l->acq[i].next = l->free_head;
        l->free_head = i;
    }
    l->n_free = LINK_MAX_ACQUIRES;
    *out = l;
    return COMMON_OK;
}

int fetcher_link_create(const struct fetcher_link_host *h, const struct proto_attach *a,
                        struct fetcher_link **out, struct common_errmsg *e)
{
    uint32_t n = a->params[0];
    if (n == 0 || n > COMMON_RING_MAX_SLOTS || (n & (n - 1)) != 0)
        return common_errmsg_set(e, COMMON_EINVAL, "attach: ring slots %u not a power of two", n);
    struct fetcher_link *l = NULL;
    if (link_alloc(h, a->pid, &l) != COMMON_OK)
        return common_errmsg_set(e, COMMON_ENOMEM, "attach: out of memory");
    int rc = common_ring_segment_open(h->run_dir, a->segments[0], &l->req_seg);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "attach: segment %s: %s", a->segments[0], common_strerror(rc));
        goto out_free;
    }
    rc = common_ring_segment_open(h->run_dir, a->segments[1], &l->rep_seg);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "attach: segment %s: %s", a->segments[1], common_strerror(rc));
        goto out_free;
    }
    rc = common_ring_attach(l->req_seg.mem, l->req_seg.bytes, sizeof(struct proto_fetch_req), n,
                            &l->req);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "attach: ring %s is not a ring of %u records of %zu bytes",
                          a->segments[0], n, sizeof(struct proto_fetch_req));
        goto out_free;
    }
    rc = common_ring_attach(l->rep_seg.mem, l->rep_seg.bytes, sizeof(struct proto_fetch_rep), n,
                            &l->rep);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "attach: ring %s is not a ring of %u records of %zu bytes",
                          a->segments[1], n, sizeof(struct proto_fetch_rep));
        goto out_free;
    }
    *out = l;
    return COMMON_OK;

out_free:
    link_free(l);
    return rc;
}

int fetcher_link_start(struct fetcher_link *l)
{
    if (pthread_create(&l->thread, NULL, link_thread, l) != 0)
        return COMMON_EAGAIN;
    l->thread_started = true;
    return COMMON_OK;
}

void fetcher_link_drop(struct fetcher_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->push_mu);
    atomic_store_explicit(&l->stop, true, memory_order_relaxed);
    pthread_cond_broadcast(&l->cv); /* the reader may wait for a free entry */
    pthread_mutex_unlock(&l->push_mu);
    if (l->thread_started) {
        pthread_join(l->thread, NULL);
        l->thread_started = false;
        link_kill(l); /* releases every loan the link held */
    }
    link_unref(l);
}

bool fetcher_link_is_live(const struct fetcher_link *l)
{
    return !atomic_load_explicit(&l->dead, memory_order_relaxed);
}

uint32_t fetcher_link_pid(const struct fetcher_link *l)
{
    return l->pid;
}

uint64_t fetcher_link_pins(const struct fetcher_link *l)
{
    return l->n_pins;
}
