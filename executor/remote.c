/* executor/remote.c - the expert source backed by fetcher daemons: pools, rings, relinks. */
#include "executor.h"
#include "proto.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REMOTE_WAIT_MS      200  /* silence on a link before its fetcher is checked */
#define REMOTE_POLL_MS      50   /* a waiter's reply-ring wait between its own checks */
#define REMOTE_WATCH_MS     50   /* the reader thread's period (liveness, stray replies) */
#define REMOTE_PUSH_WAIT_MS 50   /* request-ring wait (full ring) between checks */
#define REMOTE_CALL_MS      1000 /* HELLO / ATTACH reply deadline */
#define REMOTE_FD_MS        2000 /* pool descriptor deadline */
#define REMOTE_RETRY_MS     100  /* pause between connection attempts */
#define REMOTE_HELLO_NS     (2ull * 1000000000ull) /* idle HELLO probe period */
#define REMOTE_PRE_EXPERTS  16u /* most experts prefetched (pinned ahead) per link */
/* ThreadSanitizer cannot tell a seqlock read from a race (the bytes are read while an eviction
 * may overwrite them; the generation check throws such results away): under it, every part is
 * pinned. */
#if defined(__SANITIZE_THREAD__)
#define REMOTE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define REMOTE_TSAN 1
#endif
#endif
#ifndef REMOTE_TSAN
#define REMOTE_TSAN 0
#endif
#define REMOTE_QUIET_MAX     (PROTO_FETCH_RING_SLOTS / 2) /* quiet pushes before one wakes */
#define REMOTE_LOAN_IDX_BITS 20u
#define REMOTE_LOAN_IDX_MASK ((1u << REMOTE_LOAN_IDX_BITS) - 1u)
#define REMOTE_LOAN_SEQ_MASK ((1u << (32u - REMOTE_LOAN_IDX_BITS)) - 1u)

/* One mapping of one fetcher's pool (a pool generation). */
struct remote_map {
    const uint8_t          *base;    /* mapped: read-only, unmapped by remote_map_free() */
    size_t                  bytes;   /* mapped length */
    struct common_pool_view view;    /* owned: checked read-only view for read_begin (is_ready) */
    uint32_t                n_loans; /* loans handed out on it and not yet released (link mu) */
    struct remote_map      *next;    /* retired list of the link */
};

/* An ACQUIRE waiting for its reply; lives on the waiter's stack, listed in its link. A prefetched
 * ACQUIRE (sent with a POSTFETCH hint, `pre`) is allocated, listed in its link until an acquire()
 * claims it (then it is that waiter's), token_begin or a break ends it; a cancelled one waits in
 * the list for its reply, whose loan is then released. */
struct remote_wait {
    uint32_t            tag;
    uint32_t            layer, expert, part;
    bool                pre;       /* allocated prefetch entry */
    bool                claimed;   /* pre: an acquire() waits for it / took it */
    bool                cancelled; /* pre: unused; release the loan when the reply comes */
    bool                done;      /* the reply came (fields below valid) */
    int32_t             status;    /* 0 or a negative common_err */
    uint32_t            loan;      /* the fetcher's loan id */
    uint32_t            gen;       /* link generation of the reply */
    uint64_t            offset, size;
    struct remote_map  *map; /* borrowed (counted in map->n_loans) when done with status 0 */
    struct remote_wait *next;
};

/* The link to fetcher i. Lock order: the reply ring's consumer role (`popping`, taken under mu
 * and held without it), then push_mu, then mu. */
struct remote_link {
    struct executor_remote *r; /* borrowed: the owner */
    uint32_t                index;
    char                    url[PROTO_MAX_PATH]; /* ipc://RUNDIR/fetcher-<i>.ctl */
    char                    pool_path[PROTO_MAX_PATH];
    char                    req_name[32], rep_name[32];
    struct proto_client    *client; /* owned */
    pthread_t               thread;
    bool                    thread_started;

    pthread_mutex_t push_mu;    /* the request ring's producer side */
    pthread_mutex_t mu;         /* everything below */
    pthread_cond_t  cond;       /* replies and link changes */
    _Atomic bool    broken;     /* set before relinking: pushers on a full ring give up */
    _Atomic bool    want_break; /* a pusher found the request ring corrupt: relink */

    bool                       up;  /* linked: rings and map valid */
    uint32_t                   gen; /* bumped at every link */
    uint32_t                   pid; /* fetcher's pid (0 = unknown) */
    uint64_t                   instance;
    struct proto_shard         shard;
    struct remote_map         *map;              /* owned: current pool */
    struct remote_map         *retired;          /* owned: older pools with loans out */
    struct common_ring_segment req_seg, rep_seg; /* owned: files in RUNDIR */
    struct common_ring         req, rep;
    struct remote_wait        *waits;   /* ACQUIREs in flight, and prefetched replies */
    uint32_t                   n_pre;   /* unclaimed prefetch entries in `waits` */
    uint32_t                   pre_cap; /* most unclaimed prefetch entries (pool pins) */
    bool popping; /* a thread consumes the reply ring (rep and its cached indices are its own) */
    uint32_t pop_wanted; /* relinks/breaks waiting for the consumer role: waiters leave it */
    uint32_t next_tag;
    uint32_t quiet_n;        /* quiet pushes since the fetcher was last woken (push mu) */
    uint64_t evictions_seen; /* the pool's eviction count at the last token_begin */
    /* Parts READY in the pool are read straight from the mapping (no ACQUIRE, no pin) during
     * this token: the pool evicted nothing during the previous one. Atomic: read unlocked. */
    _Atomic bool direct;
    /* Direct reads of one expert not yet reported: a USE with the mask of its parts is pushed
     * when its down part is released, or another expert's or the next token's comes first
     * (push mu and mu). */
    uint32_t                     use_layer, use_expert, use_mask, use_gen;
    uint64_t                     down_since_ns;
    _Atomic uint64_t             last_seen_ns; /* last reply or HELLO */
    uint32_t                     hello_misses;
    bool                         missing_logged;
    struct executor_remote_stats st;
};

/* A loan handed to the forward pass: a fetcher's loan, or a direct read of a READY slot (no
 * pin: checked for reuse at release, seqlock style). */
struct remote_loan {
    bool                    used;
    bool                    direct; /* a direct read: `pl` names the slot and its generation */
    struct common_pool_loan pl;
    uint32_t                layer, expert, part; /* direct: what was read (for the USE) */
    uint16_t                seq;                 /* bumped at every reuse: stale ids are refused */
    uint32_t                link;                /* fetcher index */
    uint32_t                gen;                 /* link generation it came from */
    uint32_t                floan;               /* the fetcher's loan id */
    struct remote_map      *map;                 /* borrowed: counted in map->n_loans */
};

struct executor_remote {
    char                      *run_dir; /* owned */
    const struct common_model *model;   /* borrowed */
    uint32_t                   connect_timeout_ms, acquire_timeout_ms;
    uint64_t                   instance;
    bool (*cancelled)(void); /* startup wait ends when it returns true; may be NULL */
    uint32_t            n_links;
    struct remote_link *links; /* owned: n_links */
    uint32_t           *owner; /* owned: fetcher index per expert */
    _Atomic bool        stop;
    bool                no_direct; /* every part is pinned through an ACQUIRE */

    pthread_mutex_t     loan_mu; /* the loan table */
    struct remote_loan *loans;   /* owned: cap entries */
    uint32_t            n_cap;
    uint32_t            next_free; /* search start */
};

/* ---- small helpers ----------------------------------------------------------------------- */

static void remote_sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void remote_cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *m, uint32_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(c, m, &ts);
}

static void remote_map_free(struct remote_map *m)
{
    if (!m)
        return;
    if (m->base)
        munmap((void *)(uintptr_t)m->base, m->bytes);
    common_pool_view_detach(&m->view);
    free(m);
}

/* Drops the current map: freed now, or kept on the retired list while loans are out. Link mu. */
static void remote_retire_map(struct remote_link *L)
{
    struct remote_map *m = L->map;
    L->map = NULL;
    if (!m)
        return;
    if (m->n_loans == 0) {
        remote_map_free(m);
        return;
    }
    m->next = L->retired;
    L->retired = m;
}

/* One loan on `m` ended. Link mu. */
static void remote_map_unref(struct remote_link *L, struct remote_map *m)
{
    if (m->n_loans > 0)
        m->n_loans--;
    if (m->n_loans > 0 || m == L->map)
        return;
    for (struct remote_map **pp = &L->retired; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            remote_map_free(m);
            return;
        }
}

/* Pushes a record that is not urgent without waking the fetcher: it rides along with the next
 * record that does (or the fetcher's own timeout); a full ring falls back to remote_push().
 * Push mu. */
static int remote_push_quiet(struct remote_link *L, const struct proto_fetch_req *rec);

/* Pushes one request record. With `wait`, waits for room while the link stays up. Push mu. */
static int remote_push(struct remote_link *L, const struct proto_fetch_req *rec, bool wait)
{
    if (!L->req.hdr)
        return COMMON_ECLOSED;
    for (;;) {
        int rc = common_ring_push_wait(&L->req, rec, sizeof(*rec), wait ? REMOTE_PUSH_WAIT_MS : 0);
        if (rc == COMMON_OK) {
            L->quiet_n = 0;
            return rc;
        }
        if (rc != COMMON_ETIMEDOUT && rc != COMMON_EAGAIN) {
            atomic_store_explicit(&L->want_break, true, memory_order_release);
            return rc;
        }
        if (!wait || atomic_load_explicit(&L->broken, memory_order_acquire) ||
            atomic_load_explicit(&L->r->stop, memory_order_acquire))
            return COMMON_EAGAIN;
    }
}

static int remote_push_quiet(struct remote_link *L, const struct proto_fetch_req *rec)
{
    if (!L->req.hdr)
        return COMMON_ECLOSED;
    /* The fetcher is woken now and then so that quiet records never fill the ring (a producer
     * then waits for the fetcher's next wake-up). */
    if (L->quiet_n >= REMOTE_QUIET_MAX)
        return remote_push(L, rec, true);
    int rc = common_ring_push_quiet(&L->req, rec, sizeof(*rec));
    if (rc == COMMON_OK)
        L->quiet_n++;
    return rc == COMMON_EAGAIN ? remote_push(L, rec, true) : rc;
}

/* ---- connecting ---------------------------------------------------------------------------- */

/* What one connection attempt produced, before it is installed. */
struct remote_conn {
    uint32_t                   pid;
    uint64_t                   instance;
    struct proto_shard         shard;
    struct remote_map         *map;
    struct common_ring_segment req_seg, rep_seg;
    struct common_ring         req, rep;
};

static void remote_conn_fini(struct remote_conn *c)
{
    remote_map_free(c->map);
    common_ring_segment_close(&c->req_seg);
    common_ring_segment_close(&c->rep_seg);
    memset(c, 0, sizeof(*c));
}

/* HELLO to fetcher i: checks role, version and its shard. */
static int remote_hello(struct remote_link *L, struct proto_msg *rep, struct common_errmsg *e)
{
    struct proto_msg req = {.kind = PROTO_KIND_HELLO};
    proto_hello_init(&req.u.hello, PROTO_ROLE_EXECUTOR, "executor", L->r->instance);
    int rc = proto_client_call(L->client, &req, rep, REMOTE_CALL_MS, e);
    if (rc < 0)
        return rc;
    if (rep->kind == PROTO_KIND_ERROR) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher %u refused HELLO: %s", L->index,
                               rep->u.error.message);
        proto_msg_clear(rep);
        return rc;
    }
    if (rep->kind != PROTO_KIND_HELLO) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher %u answered HELLO with %s", L->index,
                               proto_kind_name(rep->kind));
        proto_msg_clear(rep);
        return rc;
    }
    struct common_errmsg he = {{0}};
    if ((rc = proto_hello_check(&rep->u.hello, PROTO_ROLE_FETCHER, &he)) < 0) {
        proto_msg_clear(rep);
        return common_errmsg_set(e, rc, "%s: %s", L->url, he.text);
    }
    return COMMON_OK;
}

/* Finds fetcher i's own shard in its HELLO and checks it against the model. */
static int remote_hello_shard(struct remote_link *L, const struct proto_hello *h,
                              struct proto_shard *out, struct common_errmsg *e)
{
    uint32_t n_expert = L->r->model->hp.n_expert;
    for (uint32_t k = 0; k < h->n_shards && k < PROTO_MAX_SHARDS; k++) {
        const struct proto_shard *s = &h->shards[k];
        if (s->fetcher != L->index)
            continue;
        if (s->n_experts == 0 || s->first_expert >= n_expert ||
            s->n_experts > n_expert - s->first_expert)
            return common_errmsg_set(
                e, COMMON_EPROTO, "fetcher %u announces experts [%u, %u+%u) of a model with %u",
                L->index, s->first_expert, s->first_expert, s->n_experts, n_expert);
        *out = *s;
        return COMMON_OK;
    }
    return common_errmsg_set(e, COMMON_EPROTO, "fetcher %u's HELLO has no shard for index %u",
                             L->index, L->index);
}

/* Receives and maps the pool of the instance that answered HELLO. */
static int remote_get_pool(struct remote_link *L, uint64_t instance, struct remote_map **out,
                           struct common_errmsg *e)
{
    int sock = -1, fd = -1, rc;
    if ((rc = common_unix_connect(L->pool_path, &sock)) < 0)
        return common_errmsg_set(e, rc, "cannot connect to %s: %s", L->pool_path,
                                 common_strerror(rc));
    uint64_t tag = 0;
    rc = common_fd_recv(sock, &fd, &tag, REMOTE_FD_MS);
    close(sock);
    if (rc < 0)
        return common_errmsg_set(e, rc, "no pool descriptor from %s: %s", L->pool_path,
                                 common_strerror(rc));
    if (tag != instance) {
        close(fd);
        return common_errmsg_set(
            e, COMMON_EAGAIN, "pool of %s belongs to instance %llx, HELLO said %llx", L->pool_path,
            (unsigned long long)tag, (unsigned long long)instance);
    }
    struct remote_map *m = calloc(1, sizeof(*m));
    struct stat        st;
    if (!m) {
        close(fd);
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    }
    if ((rc = common_pool_view_attach(fd, &m->view, e)) < 0)
        goto out_free;
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || (uint64_t)st.st_size > SIZE_MAX) {
        rc = common_errmsg_set(e, COMMON_EIO, "fstat of fetcher %u's pool failed", L->index);
        goto out_free;
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = common_errmsg_set(e, COMMON_EIO, "mmap of fetcher %u's pool failed: %s", L->index,
                               strerror(errno));
        goto out_free;
    }
    m->base = base;
    m->bytes = (size_t)st.st_size;
    close(fd);
    *out = m;
    return COMMON_OK;

out_free:
    close(fd);
    remote_map_free(m);
    return rc;
}

/* Creates a fresh, formatted ring segment `name` in the run directory (removing a stale one). */
static int remote_ring_create(struct remote_link *L, const char *name, uint32_t slot_bytes,
                              struct common_ring_segment *seg, struct common_ring *ring,
                              struct common_errmsg *e)
{
    size_t bytes = common_ring_bytes(slot_bytes, PROTO_FETCH_RING_SLOTS);
    char   path[PROTO_MAX_PATH];
    snprintf(path, sizeof(path), "%s/%s", L->r->run_dir, name);
    (void)unlink(path); /* a previous executor's, or our previous link's */
    int rc = common_ring_segment_create(L->r->run_dir, name, bytes, seg);
    if (rc < 0)
        return common_errmsg_set(e, rc, "cannot create ring %s: %s", path, common_strerror(rc));
    if ((rc = common_ring_init(seg->mem, seg->bytes, slot_bytes, PROTO_FETCH_RING_SLOTS)) < 0 ||
        (rc = common_ring_attach(seg->mem, seg->bytes, slot_bytes, PROTO_FETCH_RING_SLOTS, ring)) <
            0) {
        common_ring_segment_close(seg);
        return common_errmsg_set(e, rc, "cannot format ring %s", path);
    }
    return COMMON_OK;
}

/* One connection attempt: HELLO, pool, rings, ATTACH. */
static int remote_try_connect(struct remote_link *L, struct remote_conn *c, struct common_errmsg *e)
{
    struct proto_msg rep;
    int              rc;
    memset(c, 0, sizeof(*c));
    if ((rc = remote_hello(L, &rep, e)) < 0)
        return rc;
    c->pid = rep.u.hello.pid;
    c->instance = rep.u.hello.instance;
    rc = remote_hello_shard(L, &rep.u.hello, &c->shard, e);
    proto_msg_clear(&rep);
    if (rc < 0)
        return rc;
    if ((rc = remote_get_pool(L, c->instance, &c->map, e)) < 0)
        goto out_fini;
    if ((rc = remote_ring_create(L, L->req_name, sizeof(struct proto_fetch_req), &c->req_seg,
                                 &c->req, e)) < 0 ||
        (rc = remote_ring_create(L, L->rep_name, sizeof(struct proto_fetch_rep), &c->rep_seg,
                                 &c->rep, e)) < 0)
        goto out_fini;
    struct proto_msg req = {.kind = PROTO_KIND_ATTACH};
    req.u.attach = (struct proto_attach){.role = PROTO_ROLE_EXECUTOR,
                                         .pid = (uint32_t)getpid(),
                                         .instance = L->r->instance,
                                         .n_segments = 2,
                                         .params = {PROTO_FETCH_RING_SLOTS}};
    snprintf(req.u.attach.segments[0], PROTO_MAX_NAME, "%s", L->req_name);
    snprintf(req.u.attach.segments[1], PROTO_MAX_NAME, "%s", L->rep_name);
    if ((rc = proto_client_call(L->client, &req, &rep, REMOTE_CALL_MS, e)) < 0)
        goto out_fini;
    if (rep.kind != PROTO_KIND_OK) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "fetcher %u refused ATTACH: %s", L->index,
                               rep.kind == PROTO_KIND_ERROR ? rep.u.error.message
                                                            : proto_kind_name(rep.kind));
        proto_msg_clear(&rep);
        goto out_fini;
    }
    proto_msg_clear(&rep);
    return COMMON_OK;

out_fini:
    remote_conn_fini(c);
    return rc;
}

/* Takes the reply ring's consumer role, waiting for the thread that has it. Without locks. */
static void remote_pop_claim(struct remote_link *L)
{
    pthread_mutex_lock(&L->mu);
    L->pop_wanted++;
    while (L->popping)
        pthread_cond_wait(&L->cond, &L->mu);
    L->pop_wanted--;
    L->popping = true;
    pthread_mutex_unlock(&L->mu);
}

/* Gives the consumer role back and wakes the waiters (one of them may take it). Link mu. */
static void remote_pop_unclaim_locked(struct remote_link *L)
{
    L->popping = false;
    pthread_cond_broadcast(&L->cond);
}

/* Installs a connection: rings, map, ids; re-sends the ACQUIREs in flight. */
static void remote_install(struct remote_link *L, struct remote_conn *c)
{
    remote_pop_claim(L); /* nobody reads the old reply ring while it is replaced */
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    remote_retire_map(L);
    common_ring_segment_close(&L->req_seg);
    common_ring_segment_close(&L->rep_seg);
    L->map = c->map;
    L->req_seg = c->req_seg;
    L->rep_seg = c->rep_seg;
    L->req = c->req;
    L->rep = c->rep;
    if (L->gen != 0 && L->instance != c->instance)
        L->st.relinks++;
    L->pid = c->pid;
    L->instance = c->instance;
    L->shard = c->shard;
    L->gen++;
    L->up = true;
    L->quiet_n = 0;
    /* A new pool: parts are pinned until a token has gone by without an eviction. */
    L->evictions_seen = UINT64_MAX;
    atomic_store_explicit(&L->direct, false, memory_order_relaxed);
    /* Prefetched loans pin slots: at most half the pool (16 experts), the rest stays free for
     * the acquires of every sequence. */
    uint32_t slots = L->map && L->map->view.base ? common_pool_n_slots(&L->map->view) : 0;
    L->pre_cap = (slots / 2 < REMOTE_PRE_EXPERTS ? slots / 2 : REMOTE_PRE_EXPERTS) *
                 COMMON_EXPERT_PART_COUNT;
    L->st.up = true;
    L->hello_misses = 0;
    L->missing_logged = false;
    atomic_store_explicit(&L->last_seen_ns, common_now_ns(), memory_order_relaxed);
    memset(c, 0, sizeof(*c));
    atomic_store_explicit(&L->broken, false, memory_order_release);
    for (struct remote_wait *w = L->waits; w; w = w->next) {
        if (w->done)
            continue;
        struct proto_fetch_req rec = {.op = PROTO_FETCH_ACQUIRE,
                                      .tag = w->tag,
                                      .layer = w->layer,
                                      .expert = w->expert,
                                      .part = w->part};
        (void)common_ring_push(&L->req, &rec, sizeof(rec)); /* a fresh ring has room */
    }
    remote_pop_unclaim_locked(L);
    pthread_mutex_unlock(&L->mu);
    pthread_mutex_unlock(&L->push_mu);
}

/* Marks the link down: rings closed (their files removed), the pool retired. */
static void remote_break(struct remote_link *L, const char *why)
{
    atomic_store_explicit(&L->broken, true, memory_order_release);
    remote_pop_claim(L); /* a waiter polling the reply ring finishes its turn first */
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    if (L->up)
        COMMON_LOG_WARN("executor.remote", "fetcher=%u lost (%s) pid=%u; relinking", L->index, why,
                        L->pid);
    L->up = false;
    L->st.up = false;
    atomic_store_explicit(&L->direct, false, memory_order_relaxed);
    L->down_since_ns = common_now_ns();
    /* Unused prefetched loans of the dead link are dropped (the fetcher releases what the old
     * link held); one an acquire() claimed is re-sent at the relink like any wait. */
    for (struct remote_wait **pp = &L->waits; *pp;) {
        struct remote_wait *w = *pp;
        if (!w->pre || w->claimed) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        if (w->done && w->map)
            remote_map_unref(L, w->map);
        L->n_pre--;
        free(w);
    }
    remote_retire_map(L);
    common_ring_segment_close(&L->req_seg);
    common_ring_segment_close(&L->rep_seg);
    memset(&L->req, 0, sizeof(L->req));
    memset(&L->rep, 0, sizeof(L->rep));
    remote_pop_unclaim_locked(L);
    pthread_mutex_unlock(&L->mu);
    pthread_mutex_unlock(&L->push_mu);
}

/* ---- reader thread ------------------------------------------------------------------------- */

/* Hands a reply to its waiter, or releases a loan nobody waits for any more. Called by the
 * holder of the consumer role. True when the reply was the one `mine` waits for. */
static bool remote_dispatch(struct remote_link *L, const struct proto_fetch_rep *rec,
                            const struct remote_wait *mine)
{
    bool orphan = false;
    atomic_store_explicit(&L->last_seen_ns, common_now_ns(), memory_order_relaxed);
    pthread_mutex_lock(&L->mu);
    struct remote_wait **pp = &L->waits;
    while (*pp && ((*pp)->tag != rec->tag || (*pp)->done))
        pp = &(*pp)->next;
    struct remote_wait *w = *pp;
    if (w && w->pre && w->cancelled) { /* an unused prefetch: ours, its loan ends now */
        *pp = w->next;
        L->n_pre--;
        free(w);
        w = NULL;
        orphan = rec->status == 0;
    } else if (w) {
        w->done = true;
        w->status = rec->status > 0 ? COMMON_EPROTO : rec->status;
        w->loan = rec->loan;
        w->offset = rec->offset;
        w->size = rec->size;
        w->gen = L->gen;
        w->map = NULL;
        if (rec->status == 0 && L->map) {
            w->map = L->map;
            L->map->n_loans++;
        }
        if (w != mine)
            pthread_cond_broadcast(&L->cond);
    } else {
        L->st.bad_replies++;
        orphan = rec->status == 0;
    }
    pthread_mutex_unlock(&L->mu);
    if (orphan) { /* its waiter gave up: the fetcher still pins the slot */
        struct proto_fetch_req rel = {.op = PROTO_FETCH_RELEASE, .loan = rec->loan};
        pthread_mutex_lock(&L->push_mu);
        (void)remote_push(L, &rel, true);
        pthread_mutex_unlock(&L->push_mu);
    }
    return w && w == mine;
}

/* Pops replies and dispatches them until `mine` (may be NULL) has its reply, or `ms` passed
 * (0: only what is there now). Called by the holder of the consumer role on a link that is up.
 * A corrupt ring is left to the reader thread (want_break). */
static void remote_poll(struct remote_link *L, const struct remote_wait *mine, uint32_t ms)
{
    uint64_t deadline = common_now_ns() + (uint64_t)ms * 1000000u;
    for (;;) {
        struct proto_fetch_rep rec;
        uint64_t               now = common_now_ns();
        int                    left = now >= deadline ? 0 : (int)((deadline - now) / 1000000u) + 1;
        int                    rc = ms == 0 ? common_ring_pop(&L->rep, &rec, sizeof(rec))
                                            : common_ring_pop_wait(&L->rep, &rec, sizeof(rec), left);
        if (rc == (int)sizeof(rec)) {
            if (remote_dispatch(L, &rec, mine))
                return;
            continue;
        }
        if (rc >= 0) { /* a record of another size */
            pthread_mutex_lock(&L->mu);
            L->st.bad_replies++;
            pthread_mutex_unlock(&L->mu);
            continue;
        }
        if (rc != COMMON_ETIMEDOUT && rc != COMMON_EAGAIN)
            atomic_store_explicit(&L->want_break, true, memory_order_release);
        return;
    }
}

/* Checks a silent fetcher: dead pid, or a HELLO from another instance. True when it is gone. */
static bool remote_is_gone(struct remote_link *L, const char **why)
{
    if (common_pid_gone(L->pid)) {
        *why = "process gone";
        return true;
    }
    uint64_t now = common_now_ns();
    if (now - atomic_load_explicit(&L->last_seen_ns, memory_order_relaxed) < REMOTE_HELLO_NS)
        return false;
    struct proto_msg rep;
    int              rc = remote_hello(L, &rep, NULL);
    atomic_store_explicit(&L->last_seen_ns, now, memory_order_relaxed);
    if (rc < 0) {
        /* Three silent probes in a row (6 s): gone, whatever its pid says. */
        if (++L->hello_misses >= 3) {
            *why = "no HELLO reply";
            return true;
        }
        return false;
    }
    L->hello_misses = 0;
    bool other = rep.u.hello.instance != L->instance;
    proto_msg_clear(&rep);
    if (other)
        *why = "restarted (new instance)";
    return other;
}

/* Reconnects until a fetcher answers, or the service stops. */
static void remote_relink(struct remote_link *L)
{
    struct executor_remote *r = L->r;
    while (!atomic_load_explicit(&r->stop, memory_order_acquire)) {
        struct remote_conn   c;
        struct common_errmsg e = {{0}};
        int                  rc = remote_try_connect(L, &c, &e);
        if (rc == COMMON_OK && (c.shard.first_expert != L->shard.first_expert ||
                                c.shard.n_experts != L->shard.n_experts)) {
            rc = common_errmsg_set(
                &e, COMMON_EPROTO, "restarted with experts [%u,+%u), was [%u,+%u)",
                c.shard.first_expert, c.shard.n_experts, L->shard.first_expert, L->shard.n_experts);
            remote_conn_fini(&c);
        }
        if (rc == COMMON_OK) {
            remote_install(L, &c);
            COMMON_LOG_INFO("executor.remote", "fetcher=%u linked pid=%u instance=%llx", L->index,
                            L->pid, (unsigned long long)L->instance);
            return;
        }
        if (rc == COMMON_ETIMEDOUT) /* silent: the next try dials afresh (proto_client_reopen) */
            (void)proto_client_reopen(L->client, NULL);
        pthread_mutex_lock(&L->mu);
        bool late = common_now_ns() - L->down_since_ns > (uint64_t)r->connect_timeout_ms * 1000000u;
        bool log = late && !L->missing_logged;
        if (log)
            L->missing_logged = true;
        pthread_mutex_unlock(&L->mu);
        if (log)
            COMMON_LOG_ERR("executor.remote", "fetcher=%u missing for %u s (%s); still trying",
                           L->index, r->connect_timeout_ms / 1000,
                           e.text[0] ? e.text : common_strerror(rc));
        remote_sleep_ms(REMOTE_RETRY_MS);
    }
}

/* The link's watcher: relinks, checks a silent fetcher, and collects replies nobody is polling
 * for (waiters pop their own replies: the fetcher's push wakes the waiting thread directly). */
static void *remote_reader(void *arg)
{
    struct remote_link     *L = arg;
    struct executor_remote *r = L->r;
    while (!atomic_load_explicit(&r->stop, memory_order_acquire)) {
        if (!L->up) { /* only this thread changes `up` after the first link */
            remote_relink(L);
            continue;
        }
        if (atomic_exchange_explicit(&L->want_break, false, memory_order_acq_rel)) {
            remote_break(L, "ring corrupt");
            continue;
        }
        remote_sleep_ms(REMOTE_WATCH_MS);
        pthread_mutex_lock(&L->mu);
        bool mine = !L->popping && L->up;
        if (mine)
            L->popping = true;
        pthread_mutex_unlock(&L->mu);
        if (mine) {
            remote_poll(L, NULL, 0);
            pthread_mutex_lock(&L->mu);
            remote_pop_unclaim_locked(L);
            pthread_mutex_unlock(&L->mu);
        }
        const char *why = NULL;
        uint64_t    seen = atomic_load_explicit(&L->last_seen_ns, memory_order_relaxed);
        if (common_now_ns() - seen >= (uint64_t)REMOTE_WAIT_MS * 1000000u &&
            remote_is_gone(L, &why))
            remote_break(L, why);
    }
    return NULL;
}

/* ---- the expert source --------------------------------------------------------------------- */

static struct remote_link *remote_owner(struct executor_remote *r, uint32_t layer, uint32_t expert)
{
    if (layer >= r->model->hp.n_layer || expert >= r->model->hp.n_expert)
        return NULL;
    return &r->links[r->owner[expert]];
}

/* Takes a free loan id for (link, gen, floan, map); returns 0 or COMMON_ENOMEM. */
static int remote_loan_take(struct executor_remote *r, const struct remote_loan *l, uint32_t *id)
{
    pthread_mutex_lock(&r->loan_mu);
    uint32_t i = r->next_free, n = r->n_cap;
    uint32_t k = 0;
    for (; k < n; k++)
        if (!r->loans[(i + k) % n].used)
            break;
    if (k == n) {
        uint32_t            cap = n * 2;
        struct remote_loan *nl =
            cap <= REMOTE_LOAN_IDX_MASK + 1u ? realloc(r->loans, (size_t)cap * sizeof(*nl)) : NULL;
        if (!nl) {
            pthread_mutex_unlock(&r->loan_mu);
            return COMMON_ENOMEM;
        }
        memset(nl + n, 0, (size_t)(cap - n) * sizeof(*nl));
        r->loans = nl;
        r->n_cap = cap;
        i = n;
        k = 0;
        n = cap;
    }
    uint32_t            idx = (i + k) % n;
    struct remote_loan *s = &r->loans[idx];
    uint16_t            seq = (uint16_t)((s->seq + 1u) & REMOTE_LOAN_SEQ_MASK);
    *s = *l;
    s->used = true;
    s->seq = seq;
    r->next_free = (idx + 1) % r->n_cap;
    *id = idx | ((uint32_t)seq << REMOTE_LOAN_IDX_BITS);
    pthread_mutex_unlock(&r->loan_mu);
    return COMMON_OK;
}

/* Ends a fetcher loan of generation `gen` on map `m`: RELEASE when the link is the same. */
static void remote_end_loan(struct remote_link *L, uint32_t gen, uint32_t floan,
                            struct remote_map *m)
{
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    bool same = L->up && L->gen == gen;
    if (m)
        remote_map_unref(L, m);
    pthread_mutex_unlock(&L->mu);
    if (same) { /* a loan of a dead fetcher's pool is just dropped */
        struct proto_fetch_req rel = {.op = PROTO_FETCH_RELEASE, .loan = floan};
        (void)remote_push_quiet(L, &rel); /* the next ACQUIRE or TOKEN delivers it */
    }
    pthread_mutex_unlock(&L->push_mu);
}

/* Takes the pending USE (direct reads of one expert) into *rec; true when there is one to push
 * on the link the reads were made on. Link mu. */
static bool remote_use_take_locked(struct remote_link *L, struct proto_fetch_req *rec)
{
    bool push = L->use_mask && L->up && L->gen == L->use_gen;
    if (push)
        *rec = (struct proto_fetch_req){.op = PROTO_FETCH_USE,
                                        .layer = L->use_layer,
                                        .expert = L->use_expert,
                                        .part = L->use_mask};
    L->use_mask = 0;
    return push;
}

/* A fresh ACQUIRE tag. Link mu. */
static uint32_t remote_next_tag_locked(struct remote_link *L)
{
    if (++L->next_tag == 0)
        L->next_tag = 1;
    return L->next_tag;
}

/* The unclaimed, live prefetch entry of (layer, expert, part), or NULL. Link mu. */
static struct remote_wait *remote_pre_find_locked(struct remote_link *L, uint32_t layer,
                                                  uint32_t expert, uint32_t part)
{
    if (L->n_pre == 0)
        return NULL;
    for (struct remote_wait *w = L->waits; w; w = w->next)
        if (w->pre && !w->claimed && !w->cancelled && w->layer == layer && w->expert == expert &&
            w->part == part)
            return w;
    return NULL;
}

/* Sends the ACQUIREs of every part of (layer, expert) ahead of its acquire() calls, within the
 * link's cap, unless they are out already. Push mu. */
static void remote_prefetch_locked(struct remote_link *L, uint32_t layer, uint32_t expert)
{
    struct remote_wait *e[COMMON_EXPERT_PART_COUNT] = {NULL};
    pthread_mutex_lock(&L->mu);
    bool go = L->up && L->n_pre + COMMON_EXPERT_PART_COUNT <= L->pre_cap;
    for (uint32_t p = 0; go && p < COMMON_EXPERT_PART_COUNT; p++)
        if (remote_pre_find_locked(L, layer, expert, p))
            go = false;
    for (uint32_t p = 0; go && p < COMMON_EXPERT_PART_COUNT; p++) {
        e[p] = calloc(1, sizeof(*e[p]));
        go = e[p] != NULL;
    }
    if (!go) {
        pthread_mutex_unlock(&L->mu);
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
            free(e[p]);
        return;
    }
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        *e[p] = (struct remote_wait){.tag = remote_next_tag_locked(L),
                                     .layer = layer,
                                     .expert = expert,
                                     .part = p,
                                     .pre = true,
                                     .next = L->waits};
        L->waits = e[p];
        L->n_pre++;
    }
    uint32_t tags[COMMON_EXPERT_PART_COUNT];
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
        tags[p] = e[p]->tag; /* e[] may be claimed and freed once mu is let go */
    pthread_mutex_unlock(&L->mu);
    /* If a push gives up, the link is breaking: the break drops the unclaimed entries and the
     * relink re-sends the claimed ones. */
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        struct proto_fetch_req rec = {
            .op = PROTO_FETCH_ACQUIRE, .tag = tags[p], .layer = layer, .expert = expert, .part = p};
        if (remote_push(L, &rec, true) != COMMON_OK)
            break;
    }
}

/* Ends the unclaimed prefetches of a link: loans that came are released, the others are
 * released when their replies come. */
static void remote_pre_drop(struct remote_link *L)
{
    for (;;) {
        pthread_mutex_lock(&L->mu);
        struct remote_wait *got = NULL;
        if (L->n_pre > 0)
            for (struct remote_wait **pp = &L->waits; *pp; pp = &(*pp)->next) {
                struct remote_wait *w = *pp;
                if (!w->pre || w->claimed || w->cancelled)
                    continue;
                if (!w->done) {
                    w->cancelled = true;
                    continue;
                }
                *pp = w->next;
                L->n_pre--;
                got = w;
                break;
            }
        pthread_mutex_unlock(&L->mu);
        if (!got)
            return;
        if (got->status == 0 && got->map)
            remote_end_loan(L, got->gen, got->loan, got->map);
        free(got);
    }
}

/* A direct read of part `part` of (layer, expert) when its slot is READY in the current pool:
 * a loan without a pin, checked at release. Returns 0 or COMMON_ENOENT (take the ACQUIRE path).
 * Link mu. */
static int remote_direct_locked(struct executor_remote *r, struct remote_link *L, uint32_t layer,
                                uint32_t expert, uint32_t part, uint64_t size, const void **data,
                                uint32_t *loan)
{
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan pl;
    if (!L->up || !L->map || !L->map->view.base ||
        common_pool_read_begin(&L->map->view, &key, part, &pl) != COMMON_OK || pl.size != size)
        return COMMON_ENOENT;
    struct remote_loan l = {.direct = true,
                            .pl = pl,
                            .layer = layer,
                            .expert = expert,
                            .part = part,
                            .link = L->index,
                            .gen = L->gen,
                            .map = L->map};
    if (remote_loan_take(r, &l, loan) < 0)
        return COMMON_ENOENT;
    L->map->n_loans++;
    L->st.direct++;
    *data = pl.data;
    return COMMON_OK;
}

static int remote_acquire(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                          const void **data, uint32_t *loan)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = remote_owner(r, layer, expert);
    struct common_span      span;
    if (!L || common_model_expert_span(r->model, layer, expert, part, &span) < 0)
        return COMMON_EINVAL;
    struct remote_wait  own = {.layer = layer, .expert = expert, .part = (uint32_t)part};
    struct remote_wait *w = &own;
    uint64_t            t0 = common_now_ns();

    /* A prefetched ACQUIRE for this part is taken over (its reply may be there already); else,
     * while the pool is settled, a READY part is read in place and the fetcher only told of
     * the use at its release, without waking it (DESIGN.md section 3: the seqlock read). */
    pthread_mutex_lock(&L->mu);
    struct remote_wait *pre = remote_pre_find_locked(L, layer, expert, (uint32_t)part);
    if (pre) {
        pre->claimed = true;
        L->n_pre--;
        w = pre;
    } else if (atomic_load_explicit(&L->direct, memory_order_relaxed) &&
               remote_direct_locked(r, L, layer, expert, (uint32_t)part, span.size, data, loan) ==
                   COMMON_OK) {
        pthread_mutex_unlock(&L->mu);
        return COMMON_OK;
    }
    pthread_mutex_unlock(&L->mu);

    if (!pre) {
        pthread_mutex_lock(&L->push_mu);
        pthread_mutex_lock(&L->mu);
        own.tag = remote_next_tag_locked(L);
        own.next = L->waits;
        L->waits = &own;
        bool up = L->up;
        pthread_mutex_unlock(&L->mu);
        if (up) { /* when down (or the push gives up), the relink sends it */
            struct proto_fetch_req rec = {.op = PROTO_FETCH_ACQUIRE,
                                          .tag = own.tag,
                                          .layer = layer,
                                          .expert = expert,
                                          .part = part};
            (void)remote_push(L, &rec, true);
        }
        pthread_mutex_unlock(&L->push_mu);
    }

    pthread_mutex_lock(&L->mu);
    int rc = COMMON_OK;
    while (!w->done) {
        uint64_t now = common_now_ns();
        if (atomic_load_explicit(&r->stop, memory_order_acquire)) {
            rc = COMMON_ECLOSED;
            break;
        }
        if (L->up && now - t0 > (uint64_t)r->acquire_timeout_ms * 1000000u) {
            rc = COMMON_ETIMEDOUT;
            break;
        }
        if (!L->up && now - (L->down_since_ns > t0 ? L->down_since_ns : t0) >
                          (uint64_t)r->connect_timeout_ms * 1000000u) {
            rc = COMMON_ECLOSED;
            break;
        }
        /* Pop the replies here (no hand-over from the reader thread), unless a relink or break
         * waits for the ring. */
        if (L->up && !L->popping && L->pop_wanted == 0) {
            L->popping = true;
            pthread_mutex_unlock(&L->mu);
            remote_poll(L, w, REMOTE_POLL_MS);
            pthread_mutex_lock(&L->mu);
            remote_pop_unclaim_locked(L);
            continue;
        }
        remote_cond_wait_ms(&L->cond, &L->mu, REMOTE_WAIT_MS);
    }
    for (struct remote_wait **pp = &L->waits; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    if (w != &own) {
        own = *w;
        free(w);
    }
    L->st.wait_ns += common_now_ns() - t0;
    if (rc == COMMON_OK && own.status < 0)
        rc = own.status;
    if (rc == COMMON_OK && !own.map)
        rc = COMMON_ECLOSED; /* the reply came on a link without a pool: cannot happen */
    if (rc == COMMON_OK && (own.size != span.size || own.offset > own.map->bytes ||
                            own.size > own.map->bytes - own.offset)) {
        L->st.bad_replies++;
        COMMON_LOG_ERR("executor.remote",
                       "fetcher=%u bad reply layer=%u expert=%u part=%d offset=%llu size=%llu "
                       "(expected %llu bytes in a pool of %zu)",
                       L->index, layer, expert, (int)part, (unsigned long long)own.offset,
                       (unsigned long long)own.size, (unsigned long long)span.size, own.map->bytes);
        rc = COMMON_EPROTO;
    }
    if (rc < 0)
        L->st.errors++;
    else
        L->st.acquires++;
    pthread_mutex_unlock(&L->mu);

    if (rc == COMMON_EPROTO && own.map) { /* a loan we cannot use */
        remote_end_loan(L, own.gen, own.loan, own.map);
        return rc;
    }
    if (rc < 0)
        return rc;
    struct remote_loan l = {.link = L->index, .gen = own.gen, .floan = own.loan, .map = own.map};
    if ((rc = remote_loan_take(r, &l, loan)) < 0) {
        remote_end_loan(L, own.gen, own.loan, own.map);
        return rc;
    }
    *data = own.map->base + own.offset;
    return COMMON_OK;
}

static int remote_release(void *arg, uint32_t loan)
{
    struct executor_remote *r = arg;
    uint32_t                idx = loan & REMOTE_LOAN_IDX_MASK;
    uint16_t                seq = (uint16_t)(loan >> REMOTE_LOAN_IDX_BITS);
    pthread_mutex_lock(&r->loan_mu);
    if (idx >= r->n_cap || !r->loans[idx].used || r->loans[idx].seq != seq) {
        pthread_mutex_unlock(&r->loan_mu);
        COMMON_LOG_WARN("executor.remote", "release of unknown loan %u ignored", loan);
        return COMMON_OK;
    }
    struct remote_loan l = r->loans[idx];
    r->loans[idx].used = false;
    pthread_mutex_unlock(&r->loan_mu);
    struct remote_link *L = &r->links[l.link];
    if (!l.direct) {
        remote_end_loan(L, l.gen, l.floan, l.map);
        return COMMON_OK;
    }
    /* A direct read: valid when the slot kept its generation all along (a dead fetcher's pool
     * stays mapped and unchanged). A reuse means the caller computed from changing bytes: it
     * computes again, and parts are pinned until the pool is settled again. A valid read is
     * reported to the fetcher with the expert's other parts, in one USE. */
    struct proto_fetch_req use[2];
    int                    n_use = 0;
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    bool valid = common_pool_read_valid(&l.map->view, &l.pl);
    if (!valid) {
        L->st.torn++;
        atomic_store_explicit(&L->direct, false, memory_order_relaxed);
    } else {
        if (L->use_mask &&
            (L->use_layer != l.layer || L->use_expert != l.expert || L->use_gen != l.gen) &&
            remote_use_take_locked(L, &use[n_use]))
            n_use++;
        L->use_layer = l.layer;
        L->use_expert = l.expert;
        L->use_gen = l.gen;
        L->use_mask |= 1u << l.part;
        /* Down is the forward pass's last part of an expert. */
        if (l.part == COMMON_EXPERT_DOWN && remote_use_take_locked(L, &use[n_use]))
            n_use++;
    }
    remote_map_unref(L, l.map);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < n_use; i++)
        (void)remote_push_quiet(L, &use[i]);
    pthread_mutex_unlock(&L->push_mu);
    return valid ? COMMON_OK : COMMON_EAGAIN;
}

static bool remote_is_ready(void *arg, uint32_t layer, uint32_t expert);

static int remote_request(void *arg, uint32_t layer, uint32_t expert,
                          enum executor_expert_hint hint)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = remote_owner(r, layer, expert);
    if (!L)
        return COMMON_EINVAL;
    /* While the pool is settled, an expert already READY needs nothing: its parts are read in
     * place and their uses reported then. */
    if (atomic_load_explicit(&L->direct, memory_order_relaxed) &&
        remote_is_ready(arg, layer, expert))
        return COMMON_OK;
    struct proto_fetch_req rec = {.op = PROTO_FETCH_HINT,
                                  .layer = layer,
                                  .expert = expert,
                                  .prio = hint == EXECUTOR_HINT_PREFETCH
                                              ? PROTO_FETCH_PRIO_PREFETCH
                                              : PROTO_FETCH_PRIO_POSTFETCH};
    pthread_mutex_lock(&L->push_mu);
    /* Hints are never waited for; a post-fetch hint is followed by the expert's ACQUIREs, whose
     * push wakes the fetcher, so the hint itself does not. */
    int rc = COMMON_EAGAIN;
    if (L->up) {
        pthread_mutex_lock(&L->mu);
        bool acquires_follow =
            hint == EXECUTOR_HINT_POSTFETCH && L->n_pre + COMMON_EXPERT_PART_COUNT <= L->pre_cap;
        pthread_mutex_unlock(&L->mu);
        rc = acquires_follow && L->req.hdr ? common_ring_push_quiet(&L->req, &rec, sizeof(rec))
                                           : remote_push(L, &rec, false);
    }
    /* Post-fetch: the expert is computed next, its parts are asked for now (pipelining). */
    if (rc == COMMON_OK && hint == EXECUTOR_HINT_POSTFETCH)
        remote_prefetch_locked(L, layer, expert);
    pthread_mutex_unlock(&L->push_mu);
    if (rc == COMMON_OK) {
        pthread_mutex_lock(&L->mu);
        L->st.hints++;
        pthread_mutex_unlock(&L->mu);
    }
    return rc;
}

static bool remote_is_ready(void *arg, uint32_t layer, uint32_t expert)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = remote_owner(r, layer, expert);
    if (!L)
        return false;
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan pl;
    pthread_mutex_lock(&L->mu);
    bool ready =
        L->up && L->map && common_pool_read_begin(&L->map->view, &key, COMMON_POOL_WHOLE, &pl) == 0;
    pthread_mutex_unlock(&L->mu);
    return ready;
}

static void remote_token_begin(void *arg)
{
    struct executor_remote *r = arg;
    struct proto_fetch_req  rec = {.op = PROTO_FETCH_TOKEN};
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        remote_pre_drop(L);
        pthread_mutex_lock(&L->push_mu);
        pthread_mutex_lock(&L->mu);
        /* Direct reads for this token when the pool evicted nothing during the previous one. */
        if (L->up && L->map && L->map->view.base) {
            uint64_t ev = common_pool_evictions(&L->map->view);
            atomic_store_explicit(&L->direct, !r->no_direct && ev == L->evictions_seen,
                                  memory_order_relaxed);
            L->evictions_seen = ev;
        }
        /* The previous token's last uses come before TOKEN. */
        struct proto_fetch_req use;
        bool                   have_use = remote_use_take_locked(L, &use);
        bool                   up = L->up;
        pthread_mutex_unlock(&L->mu);
        if (have_use)
            (void)remote_push_quiet(L, &use);
        /* Not urgent: the fetcher sees it before the token's first ACQUIRE or USE. */
        if (up)
            (void)remote_push_quiet(L, &rec);
        pthread_mutex_unlock(&L->push_mu);
    }
}

void executor_remote_source(struct executor_remote *r, struct executor_expert_source *out)
{
    *out = (struct executor_expert_source){.acquire = remote_acquire,
                                           .release = remote_release,
                                           .request = remote_request,
                                           .is_ready = remote_is_ready,
                                           .token_begin = remote_token_begin,
                                           .arg = r};
}

/* ---- lifetime ------------------------------------------------------------------------------ */

/* First connection of every fetcher, within the deadline. */
static int remote_connect_all(struct executor_remote *r, struct common_errmsg *e)
{
    uint64_t deadline = common_now_ns() + (uint64_t)r->connect_timeout_ms * 1000000u;
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link  *L = &r->links[i];
        struct common_errmsg le = {{0}};
        int                  rc;
        for (;;) {
            struct remote_conn c;
            memset(&le, 0, sizeof(le));
            rc = remote_try_connect(L, &c, &le);
            if (rc == COMMON_OK) {
                remote_install(L, &c);
                break;
            }
            /* A refusal that a retry cannot fix ends the wait now. */
            if (rc == COMMON_EPROTO || rc == COMMON_EINVAL || rc == COMMON_ENOMEM)
                return common_errmsg_set(e, rc, "fetcher %u: %s", i, le.text);
            if (r->cancelled && r->cancelled())
                return common_errmsg_set(e, COMMON_ECLOSED,
                                         "interrupted while waiting for fetcher %u", i);
            if (common_now_ns() > deadline)
                return common_errmsg_set(e, COMMON_ETIMEDOUT,
                                         "fetcher %u (%s) did not answer within %u s: %s", i,
                                         L->url, r->connect_timeout_ms / 1000,
                                         le.text[0] ? le.text : common_strerror(rc));
            remote_sleep_ms(REMOTE_RETRY_MS);
        }
        COMMON_LOG_INFO("executor.remote", "fetcher=%u linked pid=%u instance=%llx experts=[%u,%u)",
                        i, L->pid, (unsigned long long)L->instance, L->shard.first_expert,
                        L->shard.first_expert + L->shard.n_experts);
    }
    /* Every expert must have exactly one owner. */
    uint32_t n_expert = r->model->hp.n_expert;
    for (uint32_t x = 0; x < n_expert; x++)
        r->owner[x] = UINT32_MAX;
    for (uint32_t i = 0; i < r->n_links; i++) {
        const struct proto_shard *s = &r->links[i].shard;
        for (uint32_t x = s->first_expert; x < s->first_expert + s->n_experts; x++) {
            if (r->owner[x] != UINT32_MAX)
                return common_errmsg_set(e, COMMON_EPROTO,
                                         "expert %u is claimed by fetchers %u and %u", x,
                                         r->owner[x], i);
            r->owner[x] = i;
        }
    }
    for (uint32_t x = 0; x < n_expert; x++)
        if (r->owner[x] == UINT32_MAX)
            return common_errmsg_set(e, COMMON_EPROTO,
                                     "expert %u has no fetcher (%u fetchers linked: is --fetchers "
                                     "the same for every daemon?)",
                                     x, r->n_links);
    return COMMON_OK;
}

int executor_remote_create(const struct executor_remote_opts *o, struct executor_remote **out,
                           struct common_errmsg *e)
{
    if (!o || !o->run_dir || !o->model || !common_model_is_moe(o->model))
        return common_errmsg_set(e, COMMON_EINVAL, "remote experts need a run dir and a MoE model");
    uint32_t n = o->n_fetchers ? o->n_fetchers : 1;
    if (n > PROTO_MAX_SHARDS || n > o->model->hp.n_expert)
        return common_errmsg_set(e, COMMON_EINVAL, "%u fetchers: at most %u for this model", n,
                                 o->model->hp.n_expert < PROTO_MAX_SHARDS ? o->model->hp.n_expert
                                                                          : PROTO_MAX_SHARDS);
    struct executor_remote *r = calloc(1, sizeof(*r));
    if (!r)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    int rc = COMMON_ENOMEM;
    r->model = o->model;
    r->connect_timeout_ms = o->connect_timeout_ms ? o->connect_timeout_ms : 30000;
    r->acquire_timeout_ms = o->acquire_timeout_ms ? o->acquire_timeout_ms : 120000;
    r->instance = o->instance;
    r->cancelled = o->cancelled;
    r->no_direct = !o->direct_reads || REMOTE_TSAN;
    r->n_cap = 1024;
    pthread_mutex_init(&r->loan_mu, NULL);
    r->run_dir = strdup(o->run_dir);
    r->links = calloc(n, sizeof(*r->links));
    r->owner = calloc(o->model->hp.n_expert, sizeof(*r->owner));
    r->loans = calloc(r->n_cap, sizeof(*r->loans));
    if (!r->run_dir || !r->links || !r->owner || !r->loans) {
        common_errmsg_set(e, rc, "out of memory");
        goto out_destroy;
    }
    for (uint32_t i = 0; i < n; i++) {
        struct remote_link *L = &r->links[i];
        L->r = r;
        L->index = i;
        pthread_mutex_init(&L->push_mu, NULL);
        pthread_mutex_init(&L->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&L->cond, &ca);
        pthread_condattr_destroy(&ca);
        r->n_links = i + 1;
        if ((size_t)snprintf(L->url, sizeof(L->url), "ipc://%s/fetcher-%u.ctl", r->run_dir, i) >=
                sizeof(L->url) ||
            (size_t)snprintf(L->pool_path, sizeof(L->pool_path), "%s/fetcher-%u.pool", r->run_dir,
                             i) >= sizeof(L->pool_path)) {
            rc = common_errmsg_set(e, COMMON_EINVAL, "run dir path too long");
            goto out_destroy;
        }
        snprintf(L->req_name, sizeof(L->req_name), "exec-fetch-%u.req", i);
        snprintf(L->rep_name, sizeof(L->rep_name), "exec-fetch-%u.rep", i);
        if ((rc = proto_client_open(L->url, &L->client, e)) < 0)
            goto out_destroy;
    }
    if ((rc = remote_connect_all(r, e)) < 0)
        goto out_destroy;
    for (uint32_t i = 0; i < n; i++) {
        struct remote_link *L = &r->links[i];
        if (pthread_create(&L->thread, NULL, remote_reader, L) != 0) {
            rc = common_errmsg_set(e, COMMON_EAGAIN, "cannot start a reader thread");
            goto out_destroy;
        }
        L->thread_started = true;
    }
    *out = r;
    return COMMON_OK;

out_destroy:
    executor_remote_destroy(r);
    return rc;
}

void executor_remote_destroy(struct executor_remote *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_links; i++)
        if (r->links[i].thread_started)
            remote_pre_drop(&r->links[i]); /* prefetched loans nobody took */
    atomic_store_explicit(&r->stop, true, memory_order_release);
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        atomic_store_explicit(&L->broken, true, memory_order_release);
        if (L->thread_started)
            pthread_join(L->thread, NULL);
    }
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        while (L->waits) { /* only prefetch entries are left */
            struct remote_wait *w = L->waits;
            L->waits = w->next;
            if (w->done && w->map)
                remote_map_unref(L, w->map);
            if (w->pre)
                free(w);
        }
        proto_client_close(L->client);
        common_ring_segment_close(&L->req_seg);
        common_ring_segment_close(&L->rep_seg);
        remote_map_free(L->map);
        while (L->retired) {
            struct remote_map *m = L->retired;
            L->retired = m->next;
            remote_map_free(m);
        }
        pthread_cond_destroy(&L->cond);
        pthread_mutex_destroy(&L->mu);
        pthread_mutex_destroy(&L->push_mu);
    }
    pthread_mutex_destroy(&r->loan_mu);
    free(r->loans);
    free(r->owner);
    free(r->links);
    free(r->run_dir);
    free(r);
}

uint32_t executor_remote_shards(struct executor_remote *r, struct proto_shard *out, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_links && n < cap; i++) {
        pthread_mutex_lock(&r->links[i].mu);
        out[n++] = r->links[i].shard;
        pthread_mutex_unlock(&r->links[i].mu);
    }
    return n;
}

uint32_t executor_remote_n_down(struct executor_remote *r)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_links; i++) {
        pthread_mutex_lock(&r->links[i].mu);
        n += !r->links[i].up;
        pthread_mutex_unlock(&r->links[i].mu);
    }
    return n;
}

int executor_remote_stats(struct executor_remote *r, uint32_t i, struct executor_remote_stats *out)
{
    if (i >= r->n_links)
        return COMMON_EINVAL;
    pthread_mutex_lock(&r->links[i].mu);
    *out = r->links[i].st;
    pthread_mutex_unlock(&r->links[i].mu);
    return COMMON_OK;
}
