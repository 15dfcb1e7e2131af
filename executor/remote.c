/* executor/remote.c - the expert source backed by fetcher daemons: loans, prefetch, lifetime. */
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

/* ---- the expert source --------------------------------------------------------------------- */

struct remote_link *executor_remote_owner(struct executor_remote *r, uint32_t layer,
                                          uint32_t expert)
{
    if (layer >= r->model->hp.n_layer || expert >= r->model->hp.n_expert)
        return NULL;
    const uint32_t i = r->owner[(size_t)layer * r->model->hp.n_expert + expert];
    return i < r->n_links ? &r->links[i] : NULL;
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
        executor_remote_map_unref(L, m);
    pthread_mutex_unlock(&L->mu);
    if (same) { /* a loan of a dead fetcher's pool is just dropped */
        struct proto_fetch_req rel = {.op = PROTO_FETCH_RELEASE, .loan = floan};
        (void)executor_remote_push_quiet(L, &rel); /* the next ACQUIRE or TOKEN delivers it */
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
        if (executor_remote_push(L, &rec, true) != COMMON_OK)
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

/* Sends the ACQUIRE of waiter `own` (registered first, so that a relink re-sends it when the
 * link is down or the push gives up). */
static void remote_send_acquire(struct remote_link *L, struct remote_wait *own)
{
    pthread_mutex_lock(&L->push_mu);
    pthread_mutex_lock(&L->mu);
    own->tag = remote_next_tag_locked(L);
    own->next = L->waits;
    L->waits = own;
    bool up = L->up;
    pthread_mutex_unlock(&L->mu);
    if (up) {
        struct proto_fetch_req rec = {.op = PROTO_FETCH_ACQUIRE,
                                      .tag = own->tag,
                                      .layer = own->layer,
                                      .expert = own->expert,
                                      .part = own->part};
        (void)executor_remote_push(L, &rec, true);
    }
    pthread_mutex_unlock(&L->push_mu);
}

/* Waits until waiter `w` has its reply (popping replies itself when nobody else does), the
 * source stops, or a deadline passes; then takes `w` off the list. Returns 0 or the reason it
 * gave up. Link mu held on entry and on return. */
static int remote_wait_reply_locked(struct executor_remote *r, struct remote_link *L,
                                    struct remote_wait *w, uint64_t t0)
{
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
            executor_remote_poll(L, w, REMOTE_POLL_MS);
            pthread_mutex_lock(&L->mu);
            executor_remote_pop_unclaim_locked(L);
            continue;
        }
        executor_remote_cond_wait_ms(&L->cond, &L->mu, REMOTE_WAIT_MS);
    }
    for (struct remote_wait **pp = &L->waits; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    return rc;
}

/* Checks the reply `own` got for a part of `span_size` bytes. Link mu. */
static int remote_check_reply_locked(struct remote_link *L, const struct remote_wait *own,
                                     uint64_t span_size)
{
    if (own->status < 0)
        return own->status;
    if (!own->map)
        return COMMON_ECLOSED; /* the reply came on a link without a pool: cannot happen */
    if (own->size != span_size || own->offset > own->map->bytes ||
        own->size > own->map->bytes - own->offset) {
        L->st.bad_replies++;
        COMMON_LOG_ERR("executor.remote",
                       "fetcher=%u bad reply layer=%u expert=%u part=%u offset=%llu size=%llu "
                       "(expected %llu bytes in a pool of %zu)",
                       L->index, own->layer, own->expert, own->part,
                       (unsigned long long)own->offset, (unsigned long long)own->size,
                       (unsigned long long)span_size, own->map->bytes);
        return COMMON_EPROTO;
    }
    return COMMON_OK;
}

static int remote_acquire(void *arg, uint32_t layer, uint32_t expert, enum common_expert_part part,
                          const void **data, uint32_t *loan)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = executor_remote_owner(r, layer, expert);
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
    if (!pre)
        remote_send_acquire(L, &own);

    pthread_mutex_lock(&L->mu);
    int rc = remote_wait_reply_locked(r, L, w, t0);
    if (w != &own) {
        own = *w;
        free(w);
    }
    L->st.wait_ns += common_now_ns() - t0;
    if (rc == COMMON_OK)
        rc = remote_check_reply_locked(L, &own, span.size);
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
    executor_remote_map_unref(L, l.map);
    pthread_mutex_unlock(&L->mu);
    for (int i = 0; i < n_use; i++)
        (void)executor_remote_push_quiet(L, &use[i]);
    pthread_mutex_unlock(&L->push_mu);
    return valid ? COMMON_OK : COMMON_EAGAIN;
}

static bool remote_is_ready(void *arg, uint32_t layer, uint32_t expert);

static int remote_request(void *arg, uint32_t layer, uint32_t expert,
                          enum executor_expert_hint hint)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = executor_remote_owner(r, layer, expert);
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
                                           : executor_remote_push(L, &rec, false);
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
    struct remote_link     *L = executor_remote_owner(r, layer, expert);
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
            (void)executor_remote_push_quiet(L, &use);
        /* Not urgent: the fetcher sees it before the token's first ACQUIRE or USE. */
        if (up)
            (void)executor_remote_push_quiet(L, &rec);
        pthread_mutex_unlock(&L->push_mu);
    }
}

void executor_remote_device_layers(struct executor_remote *r, uint32_t n)
{
    atomic_store_explicit(&r->device_layers, (int64_t)n, memory_order_relaxed);
    const struct proto_fetch_req rec = {.op = PROTO_FETCH_DEVICE_LAYERS, .layer = n};
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        pthread_mutex_lock(&L->push_mu);
        pthread_mutex_lock(&L->mu);
        bool up = L->up;
        pthread_mutex_unlock(&L->mu);
        if (up) /* else the next ATTACH's install sends it */
            (void)executor_remote_push(L, &rec, true);
        pthread_mutex_unlock(&L->push_mu);
    }
}

/* Why the acquire of (layer, expert) failed, as its fetcher tells it (EXPERT_ERROR: the file,
 * layer, expert and what was wrong); out is left empty when the fetcher is gone, older than 0.4
 * (it refuses the message with COMMON_EPROTO) or knows of no failure. A fresh socket, so that
 * the link's client may be reopened meanwhile; called only after a failure. */
static void remote_error(void *arg, uint32_t layer, uint32_t expert, struct common_errmsg *out)
{
    struct executor_remote *r = arg;
    struct remote_link     *L = executor_remote_owner(r, layer, expert);
    out->text[0] = '\0';
    if (!L)
        return;
    struct proto_msg req = {.kind = PROTO_KIND_EXPERT_ERROR,
                            .request_id = 1,
                            .u.expert_error = {.layer = layer, .expert = expert}},
                     rep = {0};
    struct common_errmsg e;
    if (proto_call(L->url, &req, &rep, REMOTE_CALL_MS, &e) == 0 && rep.kind == PROTO_KIND_ERROR &&
        rep.u.error.code == COMMON_EIO && rep.u.error.message[0])
        common_errmsg_set(out, COMMON_EIO, "fetcher %u: %s", L->index, rep.u.error.message);
    proto_msg_clear(&rep);
}

/* The fetchers' pools as a device registers them: each link's current map now, and every map
 * installed later (remote_install), until the hooks are cleared. */
static void remote_regions(void *arg, const struct executor_region_hooks *h)
{
    struct executor_remote *r = arg;
    pthread_mutex_lock(&r->hooks_mu);
    if (h) {
        r->hooks = *h;
        if (++r->hooks_gen == 0)
            r->hooks_gen = 1;
    } else {
        r->hooks = (struct executor_region_hooks){0};
    }
    pthread_mutex_unlock(&r->hooks_mu);
    for (uint32_t i = 0; h && i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        pthread_mutex_lock(&L->mu);
        if (L->map)
            executor_remote_map_hook(r, L->map);
        pthread_mutex_unlock(&L->mu);
    }
}

void executor_remote_source(struct executor_remote *r, struct executor_expert_source *out)
{
    *out = (struct executor_expert_source){.acquire = remote_acquire,
                                           .release = remote_release,
                                           .request = remote_request,
                                           .is_ready = remote_is_ready,
                                           .token_begin = remote_token_begin,
                                           .error = remote_error,
                                           .regions = remote_regions,
                                           .dev = &executor_remote_dev_ops,
                                           .arg = r};
}

/* ---- lifetime ------------------------------------------------------------------------------ */

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
    r->n_seq = o->n_seq;
    r->n_ctx = o->n_ctx;
    r->cancelled = o->cancelled;
    r->no_direct = !o->direct_reads || REMOTE_TSAN;
    atomic_init(&r->device_layers, -1);
    r->n_cap = 1024;
    pthread_mutex_init(&r->loan_mu, NULL);
    pthread_mutex_init(&r->hooks_mu, NULL);
    r->run_dir = strdup(o->run_dir);
    r->links = calloc(n, sizeof(*r->links));
    r->owner = calloc((size_t)o->model->hp.n_layer * o->model->hp.n_expert, sizeof(*r->owner));
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
    if ((rc = executor_remote_connect_all(r, e)) < 0)
        goto out_destroy;
    for (uint32_t i = 0; i < n; i++) {
        struct remote_link *L = &r->links[i];
        if (pthread_create(&L->thread, NULL, executor_remote_reader, L) != 0) {
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
    executor_remote_dev_free(r); /* if the device's pool did not close it */
    for (uint32_t i = 0; i < r->n_links; i++) {
        struct remote_link *L = &r->links[i];
        while (L->waits) { /* only prefetch entries are left */
            struct remote_wait *w = L->waits;
            L->waits = w->next;
            if (w->done && w->map)
                executor_remote_map_unref(L, w->map);
            if (w->pre)
                free(w);
        }
        proto_client_close(L->client);
        common_ring_segment_close(&L->req_seg);
        common_ring_segment_close(&L->rep_seg);
        executor_remote_map_drop(r, L->map);
        while (L->retired) {
            struct remote_map *m = L->retired;
            L->retired = m->next;
            executor_remote_map_drop(r, m);
        }
        pthread_cond_destroy(&L->cond);
        pthread_mutex_destroy(&L->mu);
        pthread_mutex_destroy(&L->push_mu);
    }
    pthread_mutex_destroy(&r->loan_mu);
    pthread_mutex_destroy(&r->hooks_mu);
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
