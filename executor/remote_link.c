/* executor/remote_link.c - one link to a fetcher daemon: connect, pool map, rings, relinks. */
#include "remote_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ----------------------------------------------------------------------- */

static void remote_sleep_ms(uint32_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void executor_remote_cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *m, uint32_t ms)
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

void executor_remote_map_free(struct remote_map *m)
{
    if (!m)
        return;
    if (m->base)
        munmap((void *)(uintptr_t)m->base, m->bytes);
    common_pool_view_detach(&m->view);
    free(m);
}

void executor_remote_map_hook(struct executor_remote *r, struct remote_map *m)
{
    pthread_mutex_lock(&r->hooks_mu);
    if (r->hooks.add && m->hooked != r->hooks_gen) {
        /* read-only here; a failure leaves it pageable, which the device reports */
        (void)r->hooks.add(r->hooks.arg, m->base, m->bytes, true);
        m->hooked = r->hooks_gen;
    }
    pthread_mutex_unlock(&r->hooks_mu);
}

void executor_remote_map_drop(struct executor_remote *r, struct remote_map *m)
{
    if (m && m->hooked) {
        pthread_mutex_lock(&r->hooks_mu);
        if (r->hooks.remove && m->hooked == r->hooks_gen)
            r->hooks.remove(r->hooks.arg, m->base);
        pthread_mutex_unlock(&r->hooks_mu);
    }
    executor_remote_map_free(m);
}

/* Drops the current map: freed now, or kept on the retired list while loans are out. Link mu. */
static void remote_retire_map(struct remote_link *L)
{
    struct remote_map *m = L->map;
    L->map = NULL;
    if (!m)
        return;
    if (m->n_loans == 0) {
        executor_remote_map_drop(L->r, m);
        return;
    }
    m->next = L->retired;
    L->retired = m;
}

/* One loan on `m` ended. Link mu. */
void executor_remote_map_unref(struct remote_link *L, struct remote_map *m)
{
    if (m->n_loans > 0)
        m->n_loans--;
    if (m->n_loans > 0 || m == L->map)
        return;
    for (struct remote_map **pp = &L->retired; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            executor_remote_map_drop(L->r, m);
            return;
        }
}

/* Pushes a record that is not urgent without waking the fetcher: it rides along with the next
 * record that does (or the fetcher's own timeout); a full ring falls back to
 * executor_remote_push(). Push mu. */

/* Pushes one request record. With `wait`, waits for room while the link stays up. Push mu. */
int executor_remote_push(struct remote_link *L, const struct proto_fetch_req *rec, bool wait)
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

int executor_remote_push_quiet(struct remote_link *L, const struct proto_fetch_req *rec)
{
    if (!L->req.hdr)
        return COMMON_ECLOSED;
    /* The fetcher is woken now and then so that quiet records never fill the ring (a producer
     * then waits for the fetcher's next wake-up). */
    if (L->quiet_n >= REMOTE_QUIET_MAX)
        return executor_remote_push(L, rec, true);
    int rc = common_ring_push_quiet(&L->req, rec, sizeof(*rec));
    if (rc == COMMON_OK)
        L->quiet_n++;
    return rc == COMMON_EAGAIN ? executor_remote_push(L, rec, true) : rc;
}

/* ---- connecting ---------------------------------------------------------------------------- */

static void remote_conn_fini(struct remote_conn *c)
{
    executor_remote_map_free(c->map);
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
    uint32_t n_expert = L->r->model->hp.n_expert, n_layer = L->r->model->hp.n_layer;
    for (uint32_t k = 0; k < h->n_shards && k < PROTO_MAX_SHARDS; k++) {
        const struct proto_shard *s = &h->shards[k];
        if (s->fetcher != L->index)
            continue;
        if (s->n_experts == 0 || s->first_expert >= n_expert ||
            s->n_experts > n_expert - s->first_expert)
            return common_errmsg_set(
                e, COMMON_EPROTO, "fetcher %u announces experts [%u, %u+%u) of a model with %u",
                L->index, s->first_expert, s->first_expert, s->n_experts, n_expert);
        if (s->n_layers && (s->first_layer >= n_layer || s->n_layers > n_layer - s->first_layer))
            return common_errmsg_set(
                e, COMMON_EPROTO, "fetcher %u announces layers [%u, %u+%u) of a model with %u",
                L->index, s->first_layer, s->first_layer, s->n_layers, n_layer);
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
    executor_remote_map_free(m);
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
    req.u.attach =
        (struct proto_attach){.role = PROTO_ROLE_EXECUTOR,
                              .pid = (uint32_t)getpid(),
                              .instance = L->r->instance,
                              .n_segments = 2,
                              .params = {PROTO_FETCH_RING_SLOTS, L->r->n_seq, L->r->n_ctx}};
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
void executor_remote_pop_unclaim_locked(struct remote_link *L)
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
    executor_remote_map_hook(L->r, L->map);
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
    const int64_t dl = atomic_load_explicit(&L->r->device_layers, memory_order_relaxed);
    if (dl >= 0) { /* a new fetcher learns where the KV is (its plan may have left it out) */
        struct proto_fetch_req rec = {.op = PROTO_FETCH_DEVICE_LAYERS, .layer = (uint32_t)dl};
        (void)common_ring_push(&L->req, &rec, sizeof(rec));
    }
    executor_remote_pop_unclaim_locked(L);
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
            executor_remote_map_unref(L, w->map);
        L->n_pre--;
        free(w);
    }
    remote_retire_map(L);
    common_ring_segment_close(&L->req_seg);
    common_ring_segment_close(&L->rep_seg);
    memset(&L->req, 0, sizeof(L->req));
    memset(&L->rep, 0, sizeof(L->rep));
    executor_remote_pop_unclaim_locked(L);
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
        (void)executor_remote_push(L, &rel, true);
        pthread_mutex_unlock(&L->push_mu);
    }
    return w && w == mine;
}

/* Pops replies and dispatches them until `mine` (may be NULL) has its reply, or `ms` passed
 * (0: only what is there now). Called by the holder of the consumer role on a link that is up.
 * A corrupt ring is left to the reader thread (want_break). */
void executor_remote_poll(struct remote_link *L, const struct remote_wait *mine, uint32_t ms)
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
                                c.shard.n_experts != L->shard.n_experts ||
                                c.shard.first_layer != L->shard.first_layer ||
                                c.shard.n_layers != L->shard.n_layers)) {
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
void *executor_remote_reader(void *arg)
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
            executor_remote_poll(L, NULL, 0);
            pthread_mutex_lock(&L->mu);
            executor_remote_pop_unclaim_locked(L);
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

/* First connection of every fetcher, within the deadline. */
int executor_remote_connect_all(struct executor_remote *r, struct common_errmsg *e)
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
        const uint32_t l0 = L->shard.n_layers ? L->shard.first_layer : 0;
        const uint32_t l1 = L->shard.n_layers ? l0 + L->shard.n_layers : r->model->hp.n_layer;
        COMMON_LOG_INFO("executor.remote",
                        "fetcher=%u linked pid=%u instance=%llx experts=[%u,%u) layers=[%u,%u)", i,
                        L->pid, (unsigned long long)L->instance, L->shard.first_expert,
                        L->shard.first_expert + L->shard.n_experts, l0, l1);
    }
    /* Every expert of every layer with experts must have exactly one owner. */
    const uint32_t n_expert = r->model->hp.n_expert, n_layer = r->model->hp.n_layer;
    for (size_t k = 0; k < (size_t)n_layer * n_expert; k++)
        r->owner[k] = UINT32_MAX;
    for (uint32_t i = 0; i < r->n_links; i++) {
        const struct proto_shard *s = &r->links[i].shard;
        const uint32_t            l0 = s->n_layers ? s->first_layer : 0;
        const uint32_t            l1 = s->n_layers ? l0 + s->n_layers : n_layer;
        for (uint32_t l = l0; l < l1; l++)
            for (uint32_t x = s->first_expert; x < s->first_expert + s->n_experts; x++) {
                uint32_t *o = &r->owner[(size_t)l * n_expert + x];
                if (*o != UINT32_MAX)
                    return common_errmsg_set(e, COMMON_EPROTO,
                                             "layer %u expert %u is claimed by fetchers %u and %u",
                                             l, x, *o, i);
                *o = i;
            }
    }
    for (uint32_t l = 0; l < n_layer; l++)
        for (uint32_t x = 0; x < n_expert; x++) {
            struct common_span sp;
            if (r->owner[(size_t)l * n_expert + x] == UINT32_MAX &&
                common_model_expert_span(r->model, l, x, COMMON_EXPERT_GATE, &sp) == COMMON_OK)
                return common_errmsg_set(e, COMMON_EPROTO,
                                         "layer %u expert %u has no fetcher (%u fetchers linked: "
                                         "are --fetchers and --shard-by the same for every "
                                         "daemon?)",
                                         l, x, r->n_links);
        }
    return COMMON_OK;
}
