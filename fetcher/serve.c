/* fetcher/serve.c - the fetcher daemon's service: control socket, pool fd, executor rings. */
#include "fetcher.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

#define SERVE_DEFAULT_WORKERS 8u
#define SERVE_MAX_WORKERS     256u
#define SERVE_JOB_CAP         4096u /* queued ACQUIREs; the ring reader waits when full */
#define SERVE_POLL_MS         200   /* ring and socket waits: how soon stop and peer death show */
#define SERVE_PUSH_MS         100   /* reply push waits on a full ring */
#define SERVE_PATH_MAX        1024u

/* One executor link: its ring pair and the loans it holds. Found by the server (current link)
 * and by queued jobs; refs counts both, under srv->mu. */
struct serve_link {
    struct fetcher_server     *srv;     /* borrowed: owns the link */
    struct common_ring_segment req_seg; /* mapped: executor -> fetcher records */
    struct common_ring_segment rep_seg; /* mapped: fetcher -> executor replies */
    struct common_ring         req;     /* consumer side, used by the reader thread only */
    struct common_ring         rep;     /* producer side, under push_mu */
    uint32_t                   pid;     /* executor pid from ATTACH (0 = not told) */
    uint64_t                   instance;
    uint32_t                  *pins;    /* owned: loans held per pool slot; under srv->mu */
    uint64_t                   n_pins;  /* sum of pins; under srv->mu */
    uint32_t                   refs;    /* under srv->mu */
    _Atomic bool               dead;    /* set under srv->mu once; pins are released then */
    _Atomic bool               stop;    /* asks the reader thread to exit */
    pthread_mutex_t            push_mu; /* the rep ring has one producer: workers take turns */
    pthread_t                  thread;
    bool                       thread_started;
};

/* An ACQUIRE waiting for a worker. */
struct serve_job {
    struct serve_link     *link; /* shared: one ref held by the job */
    struct proto_fetch_req req;
    bool                   done; /* acquired by the reader already: only `rep` is to be pushed */
    struct proto_fetch_rep rep;
};

struct fetcher_server {
    struct fetcher_serve_opts   o;
    char                       *run_dir;    /* owned */
    char                       *model_path; /* owned: as given */
    struct common_gguf         *g;          /* owned */
    struct common_model         m;
    bool                        m_init;
    struct fetcher             *f;                             /* owned */
    uint32_t                    shard, n_shards, first, n_exp; /* this fetcher's experts */
    uint32_t                    n_layer, n_expert, n_slots;
    uint64_t                    instance;
    const uint8_t              *pool_base; /* borrowed: the fetcher's pool mapping */
    uint64_t                    pool_bytes;
    char                        name[PROTO_MAX_NAME];
    char                        pool_path[SERVE_PATH_MAX];
    struct proto_service       *svc;         /* owned: control socket, pid file */
    int                         pool_listen; /* owned: -1 when not listening */
    pthread_t                   pool_thread; /* hands the pool fd */
    bool                        pool_started;
    pthread_t                  *workers;       /* owned: n_workers */
    uint32_t                    n_workers_run; /* started */
    pthread_mutex_t             attach_mu;     /* one ATTACH at a time */
    pthread_mutex_t             mu;            /* guards everything below and the links' pins */
    pthread_cond_t              cv;            /* jobs queued, stop, shutdown */
    pthread_cond_t              cv_space;      /* room in the job queue */
    bool                        sync_init;
    struct serve_job           *jobs; /* owned: SERVE_JOB_CAP, a circular queue */
    uint32_t                    job_head, job_n;
    struct serve_link          *link; /* the current link (one ref), NULL */
    bool                        stopping, draining;
    struct fetcher_serve_counts c;
    _Atomic bool                stop_flag; /* mirrors `stopping` for threads that poll */
};

/* ---- helpers ------------------------------------------------------------------------------ */

static bool serve_in_shard(const struct fetcher_server *s, uint32_t layer, uint32_t expert)
{
    return layer < s->n_layer && expert >= s->first && expert - s->first < s->n_exp;
}

/* Experts of shard i of n over E experts: [i*E/n, (i+1)*E/n). */
static void serve_shard_range(uint32_t i, uint32_t n, uint32_t n_expert, uint32_t *first,
                              uint32_t *count)
{
    uint32_t a = (uint32_t)((uint64_t)i * n_expert / n);
    uint32_t b = (uint32_t)((uint64_t)(i + 1) * n_expert / n);
    *first = a;
    *count = b - a;
}

static int serve_path(char *buf, size_t len, const char *dir, const char *name, uint32_t i,
                      const char *suffix)
{
    int n = snprintf(buf, len, "%s/%s-%u%s", dir, name, i, suffix);
    return n > 0 && (size_t)n < len ? COMMON_OK : COMMON_EINVAL;
}

/* ---- links -------------------------------------------------------------------------------- */

/* Ends `link`'s loans and marks it dead (replies stop). Takes srv->mu. */
static void link_kill(struct serve_link *l)
{
    struct fetcher_server *s = l->srv;
    pthread_mutex_lock(&s->mu);
    if (!atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        atomic_store_explicit(&l->dead, true, memory_order_relaxed);
        for (uint32_t slot = 0; slot < s->n_slots; slot++)
            while (l->pins[slot] > 0) {
                l->pins[slot]--;
                fetcher_release(s->f, slot);
            }
        l->n_pins = 0;
        s->c.links_dropped++;
    }
    pthread_mutex_unlock(&s->mu);
}

static void link_free(struct serve_link *l)
{
    common_ring_segment_close(&l->req_seg);
    common_ring_segment_close(&l->rep_seg);
    pthread_mutex_destroy(&l->push_mu);
    free(l->pins);
    free(l);
}

/* Drops one reference; under srv->mu. Returns true when the caller must free the link (after
 * unlocking). */
static bool link_unref_locked(struct serve_link *l)
{
    return --l->refs == 0;
}

static void link_unref(struct serve_link *l)
{
    struct fetcher_server *s = l->srv;
    pthread_mutex_lock(&s->mu);
    bool last = link_unref_locked(l);
    pthread_mutex_unlock(&s->mu);
    if (last)
        link_free(l);
}

/* Stops the reader thread, ends the loans and drops the server's reference. */
static void link_drop(struct serve_link *l)
{
    if (!l)
        return;
    struct fetcher_server *s = l->srv;
    pthread_mutex_lock(&s->mu);
    atomic_store_explicit(&l->stop, true, memory_order_relaxed);
    pthread_cond_broadcast(&s->cv_space); /* the reader may wait for room in the job queue */
    pthread_mutex_unlock(&s->mu);
    if (l->thread_started)
        pthread_join(l->thread, NULL);
    l->thread_started = false;
    link_kill(l);
    link_unref(l);
}

/* Pushes one reply (rep ring: one producer at a time). A full ring is waited on while the link
 * lives; a corrupt one kills the link. */
static void link_reply(struct serve_link *l, const struct proto_fetch_rep *rep)
{
    struct fetcher_server *s = l->srv;
    int                    rc;
    pthread_mutex_lock(&l->push_mu);
    for (;;) {
        if (atomic_load_explicit(&l->dead, memory_order_relaxed)) {
            rc = COMMON_ECLOSED;
            break;
        }
        rc = common_ring_push_wait(&l->rep, rep, sizeof(*rep), SERVE_PUSH_MS);
        if (rc != COMMON_ETIMEDOUT)
            break;
        /* The executor does not read its replies: give up when the link is being replaced or
         * stopped, or when the executor is gone (the reader thread may be blocked meanwhile). */
        if (atomic_load_explicit(&s->stop_flag, memory_order_relaxed) ||
            atomic_load_explicit(&l->stop, memory_order_relaxed))
            break;
        if (common_pid_gone(l->pid)) {
            rc = COMMON_ECLOSED;
            break;
        }
    }
    pthread_mutex_unlock(&l->push_mu);
    if (rc == COMMON_ECLOSED && common_pid_gone(l->pid)) {
        COMMON_LOG_WARN("fetcher.serve", "executor pid=%u is gone: link dropped", l->pid);
        link_kill(l);
        return;
    }
    if (rc == COMMON_ECORRUPT || rc == COMMON_EINVAL || rc == COMMON_EIO) {
        COMMON_LOG_WARN("fetcher.serve",
                        "reply ring of executor pid=%u unusable (%s): link dropped", l->pid,
                        common_strerror(rc));
        link_kill(l);
    }
}

static void link_reply_error(struct serve_link *l, uint32_t tag, int status)
{
    struct proto_fetch_rep rep = {.tag = tag, .status = status, .loan = FETCHER_LOAN_NONE};
    link_reply(l, &rep);
}

static bool link_req_valid(const struct fetcher_server *s, const struct proto_fetch_req *r)
{
    switch (r->op) {
    case PROTO_FETCH_ACQUIRE:
        return serve_in_shard(s, r->layer, r->expert) && r->part < COMMON_EXPERT_PART_COUNT;
    case PROTO_FETCH_HINT:
        return serve_in_shard(s, r->layer, r->expert) && r->prio < PROTO_FETCH_PRIO_COUNT;
    case PROTO_FETCH_USE:
        return serve_in_shard(s, r->layer, r->expert) && r->part != 0 &&
               r->part < (1u << COMMON_EXPERT_PART_COUNT);
    case PROTO_FETCH_RELEASE:
    case PROTO_FETCH_TOKEN:
        return true;
    default:
        return false;
    }
}

/* Queues an ACQUIRE for the workers, or with `rep` its reply to push; waits for room. Returns
 * false when stopping. */
static bool link_enqueue(struct serve_link *l, const struct proto_fetch_req *r,
                         const struct proto_fetch_rep *rep)
{
    struct fetcher_server *s = l->srv;
    pthread_mutex_lock(&s->mu);
    while (s->job_n == SERVE_JOB_CAP && !s->stopping &&
           !atomic_load_explicit(&l->stop, memory_order_relaxed))
        pthread_cond_wait(&s->cv_space, &s->mu);
    if (s->stopping || atomic_load_explicit(&l->stop, memory_order_relaxed)) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    uint32_t at = (s->job_head + s->job_n) % SERVE_JOB_CAP;
    s->jobs[at] = (struct serve_job){.link = l, .req = *r, .done = rep != NULL};
    if (rep)
        s->jobs[at].rep = *rep;
    s->job_n++;
    l->refs++;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return true;
}

static bool link_acquired(struct serve_link *l, const struct proto_fetch_req *r, int rc,
                          const void *data, uint32_t loan, struct proto_fetch_rep *rep);

/* Pushes one reply when the ring has room now (or drops it when the link is dead): true; false
 * when the ring is full or a worker is pushing (it may wait there for room). */
static bool link_reply_now(struct serve_link *l, const struct proto_fetch_rep *rep)
{
    if (pthread_mutex_trylock(&l->push_mu) != 0)
        return false;
    int rc = atomic_load_explicit(&l->dead, memory_order_relaxed)
                 ? COMMON_ECLOSED
                 : common_ring_push(&l->rep, rep, sizeof(*rep));
    pthread_mutex_unlock(&l->push_mu);
    if (rc == COMMON_EAGAIN)
        return false;
    if (rc == COMMON_ECORRUPT || rc == COMMON_EINVAL) {
        COMMON_LOG_WARN("fetcher.serve",
                        "reply ring of executor pid=%u unusable (%s): link dropped", l->pid,
                        common_strerror(rc));
        link_kill(l);
    }
    return true;
}

static void link_handle(struct serve_link *l, const struct proto_fetch_req *r)
{
    struct fetcher_server *s = l->srv;
    if (!link_req_valid(s, r)) {
        pthread_mutex_lock(&s->mu);
        s->c.bad_records++;
        if (r->op == PROTO_FETCH_ACQUIRE)
            s->c.acquire_errors++;
        pthread_mutex_unlock(&s->mu);
        if (r->op == PROTO_FETCH_ACQUIRE)
            link_reply_error(l, r->tag, COMMON_EINVAL);
        return;
    }
    switch (r->op) {
    case PROTO_FETCH_ACQUIRE: {
        /* Fast path: a part already readable is pinned and answered here, without a hand-over
         * to a worker (two thread wake-ups fewer); only acquires that must wait go to workers. */
        const void *data = NULL;
        uint32_t    loan = FETCHER_LOAN_NONE;
        int rc = fetcher_try_acquire(s->f, r->layer, r->expert, (enum common_expert_part)r->part,
                                     &data, &loan);
        /* A full reply ring (an executor that does not read) must not stall this reader: the
         * reply then waits in a worker. */
        struct proto_fetch_rep rep;
        if (rc == COMMON_EAGAIN)
            (void)link_enqueue(l, r, NULL);
        else if (link_acquired(l, r, rc, data, loan, &rep) && !link_reply_now(l, &rep))
            (void)link_enqueue(l, r, &rep);
        break;
    }
    case PROTO_FETCH_RELEASE:
        pthread_mutex_lock(&s->mu);
        if (r->loan < s->n_slots && l->pins[r->loan] > 0 &&
            !atomic_load_explicit(&l->dead, memory_order_relaxed)) {
            l->pins[r->loan]--;
            l->n_pins--;
            fetcher_release(s->f, r->loan);
            s->c.releases++;
        } else {
            s->c.bad_records++;
        }
        pthread_mutex_unlock(&s->mu);
        break;
    case PROTO_FETCH_HINT:
        (void)fetcher_request(s->f, r->layer, r->expert, (enum fetcher_priority)r->prio);
        pthread_mutex_lock(&s->mu);
        s->c.hints++;
        pthread_mutex_unlock(&s->mu);
        break;
    case PROTO_FETCH_USE: {
        uint32_t n = (uint32_t)__builtin_popcount(r->part); /* parts read */
        (void)fetcher_note_use(s->f, r->layer, r->expert, n);
        pthread_mutex_lock(&s->mu);
        s->c.uses += n;
        pthread_mutex_unlock(&s->mu);
        break;
    }
    case PROTO_FETCH_TOKEN:
        fetcher_token_begin(s->f);
        pthread_mutex_lock(&s->mu);
        s->c.tokens++;
        pthread_mutex_unlock(&s->mu);
        break;
    default:
        break;
    }
}

/* The link's reader: pops records until stopped, the peer dies or the ring is corrupt. */
static void *link_thread(void *arg)
{
    struct serve_link *l = arg;
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed) &&
           !atomic_load_explicit(&l->dead, memory_order_relaxed)) {
        struct proto_fetch_req r;
        int                    n = common_ring_pop_wait(&l->req, &r, sizeof(r), SERVE_POLL_MS);
        if (n == COMMON_ETIMEDOUT) {
            if (common_pid_gone(l->pid)) {
                COMMON_LOG_WARN("fetcher.serve", "executor pid=%u is gone: link dropped", l->pid);
                link_kill(l);
                break;
            }
            continue;
        }
        if (n < 0) {
            COMMON_LOG_WARN("fetcher.serve",
                            "request ring of executor pid=%u unusable (%s): link dropped", l->pid,
                            common_strerror(n));
            link_kill(l);
            break;
        }
        if ((size_t)n != sizeof(r)) {
            struct fetcher_server *s = l->srv;
            pthread_mutex_lock(&s->mu);
            s->c.bad_records++;
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        link_handle(l, &r);
    }
    return NULL;
}

/* ---- workers ------------------------------------------------------------------------------ */

/* The reply to ACQUIRE `r`, which the fetcher answered with `rc` (and `data`, `loan` when 0),
 * in *out: the pin is counted on the link. False (nothing to send) when the link died
 * meanwhile: the pin is released. */
static bool link_acquired(struct serve_link *l, const struct proto_fetch_req *r, int rc,
                          const void *data, uint32_t loan, struct proto_fetch_rep *out)
{
    struct fetcher_server *s = l->srv;
    struct proto_fetch_rep rep = {.tag = r->tag, .status = rc, .loan = FETCHER_LOAN_NONE};
    if (rc == COMMON_OK) {
        struct common_span sp;
        const uint8_t     *p = data;
        if (loan >= s->n_slots || p < s->pool_base || p >= s->pool_base + s->pool_bytes ||
            common_model_expert_span(&s->m, r->layer, r->expert, (enum common_expert_part)r->part,
                                     &sp) != COMMON_OK) {
            fetcher_release(s->f, loan);
            rc = COMMON_EIO;
            rep.status = rc;
        } else {
            rep.loan = loan;
            rep.offset = (uint64_t)(p - s->pool_base);
            rep.size = sp.size;
        }
    }
    pthread_mutex_lock(&s->mu);
    if (rc == COMMON_OK) {
        if (atomic_load_explicit(&l->dead, memory_order_relaxed)) {
            fetcher_release(s->f, loan);
            pthread_mutex_unlock(&s->mu);
            return false;
        }
        l->pins[loan]++;
        l->n_pins++;
        s->c.acquires++;
    } else {
        s->c.acquire_errors++;
    }
    pthread_mutex_unlock(&s->mu);
    *out = rep;
    return true;
}

static void worker_run(struct fetcher_server *s, const struct serve_job *j)
{
    struct serve_link            *l = j->link;
    const struct proto_fetch_req *r = &j->req;
    if (atomic_load_explicit(&l->dead, memory_order_relaxed))
        return;
    if (j->done) {
        link_reply(l, &j->rep);
        return;
    }
    const void *data = NULL;
    uint32_t    loan = FETCHER_LOAN_NONE;
    int         rc =
        fetcher_acquire(s->f, r->layer, r->expert, (enum common_expert_part)r->part, &data, &loan);
    struct proto_fetch_rep rep;
    if (link_acquired(l, r, rc, data, loan, &rep))
        link_reply(l, &rep);
}

static void *worker_thread(void *arg)
{
    struct fetcher_server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->job_n == 0 && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->job_n == 0)
            break;
        struct serve_job j = s->jobs[s->job_head];
        s->job_head = (s->job_head + 1) % SERVE_JOB_CAP;
        s->job_n--;
        pthread_cond_signal(&s->cv_space);
        pthread_mutex_unlock(&s->mu);
        worker_run(s, &j);
        pthread_mutex_lock(&s->mu);
        if (link_unref_locked(j.link)) {
            pthread_mutex_unlock(&s->mu);
            link_free(j.link);
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- pool descriptor socket --------------------------------------------------------------- */

static void *pool_thread(void *arg)
{
    struct fetcher_server *s = arg;
    int                    fd = fetcher_get_pool_fd(s->f);
    while (!atomic_load_explicit(&s->stop_flag, memory_order_relaxed)) {
        int conn = -1;
        int rc = common_unix_accept(s->pool_listen, SERVE_POLL_MS, &conn);
        if (rc == COMMON_ETIMEDOUT)
            continue;
        if (rc != COMMON_OK) {
            usleep(10000);
            continue;
        }
        rc = common_fd_send(conn, fd, s->instance);
        close(conn);
        pthread_mutex_lock(&s->mu);
        if (rc == COMMON_OK)
            s->c.pool_fds_sent++;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- control messages --------------------------------------------------------------------- */

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void ctl_stats(void *arg, struct proto_stats_reply *st)
{
    struct fetcher_server      *s = arg;
    struct fetcher_pool_counts  pc;
    struct fetcher_trace_totals t;
    struct fetcher_serve_counts c;
    fetcher_get_pool_counts(s->f, &pc);
    fetcher_trace_totals(fetcher_get_trace(s->f), &t);
    fetcher_serve_counts(s, &c);
    proto_stats_add(st, "shard.index", s->shard);
    proto_stats_add(st, "shard.count", s->n_shards);
    proto_stats_add(st, "shard.first_expert", s->first);
    proto_stats_add(st, "shard.n_experts", s->n_exp);
    proto_stats_add(st, "pool.slots", pc.n_slots);
    proto_stats_add(st, "pool.slot_bytes", (double)pc.slot_bytes);
    proto_stats_add(st, "pool.free", pc.n_free);
    proto_stats_add(st, "pool.loading", pc.n_loading);
    proto_stats_add(st, "pool.ready", pc.n_ready);
    proto_stats_add(st, "pool.failed", pc.n_failed);
    proto_stats_add(st, "pool.pinned", pc.n_pinned);
    proto_stats_add(st, "trace.accesses", (double)t.accesses);
    proto_stats_add(st, "trace.hits", (double)t.hits);
    proto_stats_add(st, "trace.misses", (double)t.misses);
    proto_stats_add(st, "trace.prefetch_hits", (double)t.prefetch_hits);
    proto_stats_add(st, "trace.hit_rate", ratio(t.hits + t.prefetch_hits, t.accesses));
    proto_stats_add(st, "trace.prefetch_issued", (double)t.prefetch_issued);
    proto_stats_add(st, "trace.prefetch_wasted", (double)t.prefetch_wasted);
    proto_stats_add(st, "trace.prefetch_dropped", (double)t.prefetch_dropped);
    proto_stats_add(st, "trace.loads", (double)t.loads);
    proto_stats_add(st, "trace.load_errors", (double)t.load_errors);
    proto_stats_add(st, "trace.bytes_read", (double)t.bytes_read);
    proto_stats_add(st, "trace.evictions", (double)t.evictions);
    proto_stats_add(st, "trace.tokens", (double)t.tokens);
    proto_stats_add(st, "trace.faults", (double)t.faults);
    proto_stats_add(st, "trace.belady_accesses", (double)t.belady_accesses);
    proto_stats_add(st, "trace.belady_hits", (double)t.belady_hits);
    proto_stats_add(st, "trace.belady_hit_rate", ratio(t.belady_hits, t.belady_accesses));
    proto_stats_add(st, "serve.acquires", (double)c.acquires);
    proto_stats_add(st, "serve.acquire_errors", (double)c.acquire_errors);
    proto_stats_add(st, "serve.releases", (double)c.releases);
    proto_stats_add(st, "serve.hints", (double)c.hints);
    proto_stats_add(st, "serve.uses", (double)c.uses);
    proto_stats_add(st, "serve.tokens", (double)c.tokens);
    proto_stats_add(st, "serve.bad_records", (double)c.bad_records);
    proto_stats_add(st, "serve.attaches", (double)c.attaches);
    proto_stats_add(st, "serve.links_dropped", (double)c.links_dropped);
    proto_stats_add(st, "serve.link_pins", (double)c.link_pins);
    proto_stats_add(st, "serve.pool_fds_sent", (double)c.pool_fds_sent);
}

static void ctl_health(void *arg, struct proto_health_reply *h)
{
    struct fetcher_server *s = arg;
    pthread_mutex_lock(&s->mu);
    const struct serve_link *l = s->link;
    bool                     live = l && !atomic_load_explicit(&l->dead, memory_order_relaxed);
    uint32_t                 pid = l ? l->pid : 0;
    pthread_mutex_unlock(&s->mu);
    if (live)
        snprintf(h->message, sizeof(h->message),
                 "shard %u/%u experts [%u,%u) pool %u slots; executor pid %u attached", s->shard,
                 s->n_shards, s->first, s->first + s->n_exp, s->n_slots, pid);
    else
        snprintf(h->message, sizeof(h->message),
                 "shard %u/%u experts [%u,%u) pool %u slots; no executor attached", s->shard,
                 s->n_shards, s->first, s->first + s->n_exp, s->n_slots);
}

static void ctl_hello(void *arg, struct proto_hello *h)
{
    struct fetcher_server *s = arg;
    h->n_shards = s->n_shards;
    for (uint32_t i = 0; i < s->n_shards; i++) {
        h->shards[i].fetcher = i;
        serve_shard_range(i, s->n_shards, s->n_expert, &h->shards[i].first_expert,
                          &h->shards[i].n_experts);
    }
}

static void ctl_drain(void *arg)
{
    struct fetcher_server *s = arg;
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
}

static int ctl_attach(struct fetcher_server *s, const struct proto_attach *a, struct proto_msg *rep)
{
    if (a->role != PROTO_ROLE_EXECUTOR)
        return proto_reply_error(rep, COMMON_EINVAL,
                                 "attach: only an executor attaches to a fetcher");
    if (a->n_segments < 2)
        return proto_reply_error(rep, COMMON_EINVAL, "attach: needs 2 segments (req, rep), got %u",
                                 a->n_segments);
    uint32_t n = a->params[0];
    if (n == 0 || n > COMMON_RING_MAX_SLOTS || (n & (n - 1)) != 0)
        return proto_reply_error(rep, COMMON_EINVAL, "attach: ring slots %u not a power of two", n);

    struct serve_link *l = calloc(1, sizeof(*l));
    if (!l)
        return proto_reply_error(rep, COMMON_ENOMEM, "attach: out of memory");
    l->srv = s;
    l->pid = a->pid;
    l->instance = a->instance;
    l->refs = 1;
    l->pins = calloc(s->n_slots, sizeof(*l->pins));
    if (!l->pins || pthread_mutex_init(&l->push_mu, NULL) != 0) {
        free(l->pins);
        free(l);
        return proto_reply_error(rep, COMMON_ENOMEM, "attach: out of memory");
    }
    int rc = common_ring_segment_open(s->run_dir, a->segments[0], &l->req_seg);
    if (rc != COMMON_OK) {
        proto_reply_error(rep, rc, "attach: segment %s: %s", a->segments[0], common_strerror(rc));
        goto out_free;
    }
    rc = common_ring_segment_open(s->run_dir, a->segments[1], &l->rep_seg);
    if (rc != COMMON_OK) {
        proto_reply_error(rep, rc, "attach: segment %s: %s", a->segments[1], common_strerror(rc));
        goto out_free;
    }
    rc = common_ring_attach(l->req_seg.mem, l->req_seg.bytes, sizeof(struct proto_fetch_req), n,
                            &l->req);
    if (rc != COMMON_OK) {
        proto_reply_error(rep, rc, "attach: ring %s is not a ring of %u records of %zu bytes",
                          a->segments[0], n, sizeof(struct proto_fetch_req));
        goto out_free;
    }
    rc = common_ring_attach(l->rep_seg.mem, l->rep_seg.bytes, sizeof(struct proto_fetch_rep), n,
                            &l->rep);
    if (rc != COMMON_OK) {
        proto_reply_error(rep, rc, "attach: ring %s is not a ring of %u records of %zu bytes",
                          a->segments[1], n, sizeof(struct proto_fetch_rep));
        goto out_free;
    }

    pthread_mutex_lock(&s->attach_mu);
    pthread_mutex_lock(&s->mu);
    bool refuse = s->stopping || s->draining;
    pthread_mutex_unlock(&s->mu);
    if (refuse) {
        pthread_mutex_unlock(&s->attach_mu);
        rc = proto_reply_error(rep, COMMON_EBUSY, "attach: fetcher is draining");
        goto out_free;
    }
    if (pthread_create(&l->thread, NULL, link_thread, l) != 0) {
        pthread_mutex_unlock(&s->attach_mu);
        rc = proto_reply_error(rep, COMMON_EAGAIN, "attach: cannot start the ring thread");
        goto out_free;
    }
    l->thread_started = true;
    pthread_mutex_lock(&s->mu);
    struct serve_link *old = s->link;
    s->link = l;
    s->c.attaches++;
    pthread_mutex_unlock(&s->mu);
    link_drop(old); /* releases every loan the old link held */
    pthread_mutex_unlock(&s->attach_mu);
    COMMON_LOG_INFO("fetcher.serve", "executor pid=%u attached ring=%u slots%s", a->pid, n,
                    old ? " (replaced the previous link)" : "");
    rep->kind = PROTO_KIND_OK;
    return COMMON_OK;

out_free:
    link_free(l);
    return rc;
}

static int ctl_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct fetcher_server *s = arg;
    if (req->kind == PROTO_KIND_ATTACH)
        return ctl_attach(s, &req->u.attach, rep);
    return proto_reply_error(rep, COMMON_EPROTO, "a fetcher does not serve '%s'",
                             proto_kind_name(req->kind));
}

/* The fetcher's part of the daemon skeleton. */
static const struct proto_service_ops g_fetcher_ops = {
    .hello = ctl_hello,
    .health = ctl_health,
    .stats = ctl_stats,
    .drain = ctl_drain,
    .handle = ctl_handler,
};

/* ---- start and stop ----------------------------------------------------------------------- */

static int serve_open_model(struct fetcher_server *s, struct common_errmsg *e)
{
    int rc = common_gguf_open(s->model_path, NULL, &s->g, e);
    if (rc != COMMON_OK)
        return rc;
    rc = common_model_init(&s->m, s->g, e);
    if (rc != COMMON_OK)
        return rc;
    s->m_init = true;
    if (!common_model_is_moe(&s->m))
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "%s: dense model (no routed experts): nothing to serve",
                                 s->model_path);
    s->n_layer = s->m.hp.n_layer;
    s->n_expert = s->m.hp.n_expert;
    return COMMON_OK;
}

/* This shard's pool slots: explicit, else its share of the plan for the whole budget. */
static int serve_size_pool(struct fetcher_server *s, struct common_errmsg *e)
{
    const struct fetcher_serve_opts *o = &s->o;
    uint32_t                         shard_bundles = s->n_layer * s->n_exp;
    if (o->n_slots) {
        s->n_slots = o->n_slots;
    } else if (o->ram_budget) {
        /* The executor's contexts, sized by the same table it allocates from. */
        long                     ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        uint32_t                 n_seq = o->n_seq ? o->n_seq : 1;
        struct common_ctx_layout lay;
        int                      lrc = common_ctx_layout_compute(
                                 &s->m.hp,
                                 &(struct common_ctx_layout_opts){
                                     .n_ctx = o->n_ctx,
                                     .n_threads = o->n_threads ? o->n_threads : (ncpu > 0 ? (uint32_t)ncpu : 1)},
                                 &lay, e);
        if (lrc != COMMON_OK)
            return lrc;
        uint64_t                 kv = lay.kv_bytes * n_seq;
        uint64_t                 act = (lay.scratch_bytes + lay.logits_bytes) * n_seq;
        struct fetcher_plan      plan;
        struct fetcher_plan_opts po = {.ram_budget = o->ram_budget,
                                       .kv_bytes = kv,
                                       .act_bytes = act,
                                       .queue_depth = o->queue_depth};
        int                      rc = fetcher_plan_compute(&s->m, &po, &plan, e);
        if (rc != COMMON_OK)
            return rc;
        uint32_t n = plan.n_slots / s->n_shards;
        uint32_t min = (plan.min_slots + s->n_shards - 1) / s->n_shards;
        s->n_slots = n > min ? n : min;
        if (o->plan_out) {
            char buf[2048];
            fetcher_plan_format(&plan, buf, sizeof(buf));
            fputs(buf, o->plan_out);
        }
    } else {
        s->n_slots = shard_bundles;
    }
    if (s->n_slots > shard_bundles)
        s->n_slots = shard_bundles;
    if (s->n_slots == 0)
        s->n_slots = 1;
    return COMMON_OK;
}

int fetcher_serve_start(const struct fetcher_serve_opts *o, struct fetcher_server **out,
                        struct common_errmsg *e)
{
    if (!o || !o->model_path || !o->run_dir || !out)
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model and run dir are required");
    uint32_t n_shards = o->n_shards ? o->n_shards : 1;
    if (o->shard >= n_shards || n_shards > PROTO_MAX_SHARDS)
        return common_errmsg_set(e, COMMON_EINVAL, "shard %u/%u: need 0 <= I < N <= %u", o->shard,
                                 n_shards, PROTO_MAX_SHARDS);
    if (o->io == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "--io mmap has no pool to share with the executor: use uring or "
                                 "pread");
    if (o->n_workers > SERVE_MAX_WORKERS)
        return common_errmsg_set(e, COMMON_EINVAL, "workers %u: at most %u", o->n_workers,
                                 SERVE_MAX_WORKERS);
    int rc = common_run_dir_prepare(o->run_dir, e);
    if (rc != COMMON_OK)
        return rc;

    struct fetcher_server *s = calloc(1, sizeof(*s));
    if (!s)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    s->o = *o;
    s->pool_listen = -1;
    s->shard = o->shard;
    s->n_shards = n_shards;
    s->instance = common_random_id();
    snprintf(s->name, sizeof(s->name), "fetcher-%u", s->shard);
    s->run_dir = strdup(o->run_dir);
    s->model_path = strdup(o->model_path);
    s->jobs = calloc(SERVE_JOB_CAP, sizeof(*s->jobs));
    if (!s->run_dir || !s->model_path || !s->jobs) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
        goto out_stop;
    }
    s->o.model_path = s->model_path;
    s->o.run_dir = s->run_dir;
    if (serve_path(s->pool_path, sizeof(s->pool_path), s->run_dir, "fetcher", s->shard, ".pool")) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "run dir %s: path too long", s->run_dir);
        goto out_stop;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_mutex_init(&s->attach_mu, NULL) != 0 ||
        pthread_cond_init(&s->cv, NULL) != 0 || pthread_cond_init(&s->cv_space, NULL) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: mutex init failed");
        goto out_stop;
    }
    s->sync_init = true;

    if ((rc = serve_open_model(s, e)) != COMMON_OK)
        goto out_stop;
    if (n_shards > s->n_expert) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "%u shards for %u experts: at most one per expert",
                               n_shards, s->n_expert);
        goto out_stop;
    }
    serve_shard_range(s->shard, n_shards, s->n_expert, &s->first, &s->n_exp);
    if ((rc = serve_size_pool(s, e)) != COMMON_OK)
        goto out_stop;
    struct fetcher_opts fo = {
        .n_slots = s->n_slots, .policy = o->policy, .io = o->io, .queue_depth = o->queue_depth};
    if ((rc = fetcher_create(s->g, &s->m, &fo, &s->f, e)) != COMMON_OK)
        goto out_stop;
    s->pool_base = fetcher_get_pool_base(s->f);
    s->pool_bytes = fetcher_get_pool_bytes(s->f);
    if (fetcher_get_pool_fd(s->f) < 0 || !s->pool_base) {
        rc = common_errmsg_set(e, COMMON_ENOTSUP, "fetcher: the pool is not a memfd: cannot share");
        goto out_stop;
    }
    if (o->plan_out) {
        char sz[2][32];
        fprintf(o->plan_out,
                "shard %u/%u: experts [%u,%u) of each layer, pool %u slots x %s = %s, io %s%s, "
                "policy %s\n",
                s->shard, n_shards, s->first, s->first + s->n_exp, s->n_slots,
                common_format_size(fetcher_get_plan(s->f)->slot_bytes, sz[0], 32),
                common_format_size(fetcher_get_plan(s->f)->pool_bytes, sz[1], 32),
                fetcher_io_mode_name(fetcher_get_io_mode(s->f)),
                fetcher_is_direct(s->f) ? " (O_DIRECT)" : "", fetcher_policy_name(o->policy));
    }

    uint32_t nw = o->n_workers ? o->n_workers : SERVE_DEFAULT_WORKERS;
    if (!(s->workers = calloc(nw, sizeof(*s->workers)))) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
        goto out_stop;
    }
    for (; s->n_workers_run < nw; s->n_workers_run++)
        if (pthread_create(&s->workers[s->n_workers_run], NULL, worker_thread, s) != 0) {
            rc = common_errmsg_set(e, COMMON_EAGAIN, "fetcher: cannot start worker threads");
            goto out_stop;
        }

    rc = common_unix_listen(s->pool_path, &s->pool_listen);
    if (rc != COMMON_OK) {
        s->pool_listen = -1;
        rc = common_errmsg_set(e, rc, "%s: %s", s->pool_path,
                               rc == COMMON_EBUSY ? "another fetcher listens there"
                                                  : common_strerror(rc));
        goto out_stop;
    }
    if (pthread_create(&s->pool_thread, NULL, pool_thread, s) != 0) {
        rc = common_errmsg_set(e, COMMON_EAGAIN, "fetcher: cannot start the pool socket thread");
        goto out_stop;
    }
    s->pool_started = true;
    struct proto_service_opts so = {.run_dir = s->run_dir,
                                    .name = s->name,
                                    .role = PROTO_ROLE_FETCHER,
                                    .model_path = s->model_path,
                                    .instance = s->instance,
                                    .no_pidfile = o->no_pidfile};
    if ((rc = proto_service_start(&so, &g_fetcher_ops, s, &s->svc, e)) != COMMON_OK)
        goto out_stop;
    COMMON_LOG_INFO("fetcher.serve", "%s ready pid=%d ctl=%s pool=%s", s->name, (int)getpid(),
                    proto_service_url(s->svc), s->pool_path);
    *out = s;
    return COMMON_OK;

out_stop:
    s->o.trace_out = NULL;
    s->o.summary_out = NULL;
    fetcher_serve_stop(s, NULL);
    return rc;
}

struct proto_service *fetcher_serve_service(struct fetcher_server *s)
{
    return s->svc;
}

int fetcher_serve_stop(struct fetcher_server *s, struct common_errmsg *e)
{
    int rc = COMMON_OK;
    if (!s)
        return rc;
    if (s->sync_init) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        s->draining = true;
        atomic_store_explicit(&s->stop_flag, true, memory_order_relaxed);
        pthread_cond_broadcast(&s->cv);
        pthread_cond_broadcast(&s->cv_space);
        pthread_mutex_unlock(&s->mu);
    }
    /* Control first: no ATTACH can install a link after this. */
    proto_service_stop(s->svc);
    s->svc = NULL;
    if (s->sync_init) {
        pthread_mutex_lock(&s->mu);
        struct serve_link *l = s->link;
        s->link = NULL;
        pthread_mutex_unlock(&s->mu);
        link_drop(l);
    }
    for (uint32_t i = 0; i < s->n_workers_run; i++)
        pthread_join(s->workers[i], NULL);
    s->n_workers_run = 0;
    if (s->pool_started)
        pthread_join(s->pool_thread, NULL);
    s->pool_started = false;
    if (s->pool_listen >= 0) {
        close(s->pool_listen);
        unlink(s->pool_path);
    }
    if (s->f) {
        struct fetcher_trace *t = fetcher_get_trace(s->f);
        if (s->o.trace_out) {
            FILE *f = fopen(s->o.trace_out, "w");
            int   wrc = f ? fetcher_trace_write_json(t, f) : COMMON_EIO;
            if (f && fclose(f) != 0)
                wrc = COMMON_EIO;
            if (wrc != COMMON_OK)
                rc = common_errmsg_set(e, COMMON_EIO, "trace %s: cannot write", s->o.trace_out);
        }
        if (s->o.summary_out)
            fetcher_trace_write_summary(t, s->o.summary_out);
    }
    fetcher_destroy(s->f);
    if (s->m_init)
        common_model_fini(&s->m);
    common_gguf_close(s->g);
    if (s->sync_init) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->attach_mu);
        pthread_cond_destroy(&s->cv);
        pthread_cond_destroy(&s->cv_space);
    }
    free(s->workers);
    free(s->jobs);
    free(s->run_dir);
    free(s->model_path);
    free(s);
    return rc;
}

struct fetcher *fetcher_serve_fetcher(struct fetcher_server *s)
{
    return s->f;
}

void fetcher_serve_shard(const struct fetcher_server *s, uint32_t *first, uint32_t *n)
{
    *first = s->first;
    *n = s->n_exp;
}

void fetcher_serve_counts(struct fetcher_server *s, struct fetcher_serve_counts *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->c;
    out->link_pins = s->link ? s->link->n_pins : 0;
    pthread_mutex_unlock(&s->mu);
}
