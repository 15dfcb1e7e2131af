/* fetcher/fetcher.c - the fetcher front: prioritised requests, an I/O thread, pinned loans. */
#include "fetcher.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io.h"
#include "pool.h"

#define FRONT_NONE UINT32_MAX

/* Where one part of a bundle lives in the file and in its slot. */
struct front_part {
    uint32_t file;     /* split index */
    uint64_t offset;   /* file offset of the part's bytes */
    uint64_t size;     /* bytes */
    uint64_t data_off; /* offset of the bytes in the slot (region start + offset % ALIGN) */
};

/* One load in progress or queued, indexed by slot. Under f->mu. */
struct front_load {
    uint32_t              layer, expert;
    uint32_t              gen;        /* slot generation the load was claimed with */
    uint32_t              prio;       /* enum fetcher_priority; queue it sits in */
    bool                  queued;     /* in the list of `prio` */
    uint32_t              prev, next; /* list links (slot indices), FRONT_NONE at the ends */
    uint32_t              next_part;  /* next part to submit (3 = all submitted) */
    uint32_t              parts_done; /* parts completed (ok or not) */
    int                   err;        /* first errno of a failed part, 0 */
    struct fetcher_io_cqe err_cqe;    /* its completion, for the message */
    uint64_t              epoch;      /* token at which it was asked for (prefetch staleness) */
    uint64_t              t_submit;   /* ns of the first part's submission */
    uint64_t              bytes;      /* bytes read so far */
    uint32_t              pf_parts;   /* parts submitted as prefetch and still in flight */
};

struct fetcher {
    const struct common_gguf  *g; /* borrowed: must outlive the fetcher */
    const struct common_model *m; /* borrowed: must outlive the fetcher */
    struct fetcher_opts        o;
    struct fetcher_plan        plan;
    enum fetcher_io_mode       mode; /* resolved: URING, PREAD or MMAP */
    uint32_t                   n_layer, n_expert;
    struct front_part         *parts;   /* owned: n_layer * n_expert * 3 */
    struct fetcher_pool       *pool;    /* owned (NULL in mmap mode) */
    struct fetcher_io         *io;      /* owned (NULL in mmap mode) */
    struct fetcher_trace      *trace;   /* owned */
    uint8_t                  **maps;    /* owned: mmap mode, one mapping per split (munmap) */
    uint64_t                  *map_len; /* owned: bytes of each mapping */
    uint32_t                   n_splits;
    pthread_mutex_t            mu; /* guards everything below */
    pthread_cond_t             cv; /* wakes the I/O thread when idle */
    bool                       sync_init;
    struct front_load         *loads; /* owned: one per slot */
    uint32_t                   head[FETCHER_PRIO_COUNT], tail[FETCHER_PRIO_COUNT];
    uint32_t                   n_queued[FETCHER_PRIO_COUNT];
    uint32_t                   qd;              /* reads in flight at most */
    uint32_t                   in_flight;       /* reads submitted, not reaped */
    uint32_t                   in_flight_pf;    /* of which prefetch */
    uint64_t                   epoch;           /* tokens begun */
    uint64_t                   token_tick;      /* pool tick when the token began */
    bool                       explicit_tokens; /* fetcher_token_begin() was called */
    uint32_t                   last_layer;      /* layer of the latest demand (auto tokens) */
    uint64_t                  *seen;            /* owned: per bundle, epoch + 1 of its access */
    bool                       stop;            /* the I/O thread exits when idle */
    bool                       io_blocked;      /* the I/O thread waits in fetcher_io_reap */
    pthread_t                  thread;
    bool                       thread_started;
    struct fetcher_io_req     *reqs; /* owned: qd, the I/O thread's submit batch */
    struct fetcher_io_cqe     *cqes; /* owned: qd, the I/O thread's completions */
    struct common_errmsg       last_error;
    /* Load log (fetcher_load_log_start): keys of the completed loads, in completion order. */
    struct fetcher_probe_key *log;
    uint64_t                  log_n, log_cap;
};

/* ---- names -------------------------------------------------------------------------------- */

static const char *const g_policy_names[] = {"lru", "lfu"};
static const char *const g_io_names[] = {"auto", "uring", "pread", "mmap"};
static const char *const g_prio_names[] = {"demand", "postfetch", "prefetch"};

const char *fetcher_policy_name(enum fetcher_policy p)
{
    return (unsigned)p < 2 ? g_policy_names[p] : "?";
}

int fetcher_policy_parse(const char *s, enum fetcher_policy *out)
{
    for (unsigned i = 0; i < 2; i++)
        if (strcasecmp(s, g_policy_names[i]) == 0) {
            *out = (enum fetcher_policy)i;
            return COMMON_OK;
        }
    return COMMON_EINVAL;
}

const char *fetcher_io_mode_name(enum fetcher_io_mode m)
{
    return (unsigned)m < 4 ? g_io_names[m] : "?";
}

int fetcher_io_mode_parse(const char *s, enum fetcher_io_mode *out)
{
    for (unsigned i = 0; i < 4; i++)
        if (strcasecmp(s, g_io_names[i]) == 0) {
            *out = (enum fetcher_io_mode)i;
            return COMMON_OK;
        }
    if (strcasecmp(s, "io_uring") == 0) {
        *out = FETCHER_IO_URING;
        return COMMON_OK;
    }
    return COMMON_EINVAL;
}

const char *fetcher_priority_name(enum fetcher_priority p)
{
    return (unsigned)p < FETCHER_PRIO_COUNT ? g_prio_names[p] : "?";
}

/* ---- queues (under f->mu) ----------------------------------------------------------------- */

static void front_enqueue(struct fetcher *f, uint32_t slot, uint32_t prio)
{
    struct front_load *ld = &f->loads[slot];
    ld->prio = prio;
    ld->queued = true;
    ld->next = FRONT_NONE;
    ld->prev = f->tail[prio];
    if (f->tail[prio] != FRONT_NONE)
        f->loads[f->tail[prio]].next = slot;
    else
        f->head[prio] = slot;
    f->tail[prio] = slot;
    f->n_queued[prio]++;
}

static void front_unlink(struct fetcher *f, uint32_t slot)
{
    struct front_load *ld = &f->loads[slot];
    if (ld->prev != FRONT_NONE)
        f->loads[ld->prev].next = ld->next;
    else
        f->head[ld->prio] = ld->next;
    if (ld->next != FRONT_NONE)
        f->loads[ld->next].prev = ld->prev;
    else
        f->tail[ld->prio] = ld->prev;
    f->n_queued[ld->prio]--;
    ld->queued = false;
}

/* Moves a queued load of `slot` (generation gen) up to `prio` if that is more urgent. */
static void front_promote(struct fetcher *f, uint32_t slot, uint32_t gen, uint32_t prio)
{
    struct front_load *ld = &f->loads[slot];
    if (ld->gen != gen || prio >= ld->prio)
        return;
    if (ld->queued) {
        front_unlink(f, slot);
        front_enqueue(f, slot, prio);
    } else {
        ld->prio = prio; /* in flight: only the accounting class changes */
    }
}

static void front_kick(struct fetcher *f)
{
    pthread_cond_signal(&f->cv);
    if (f->io_blocked)
        fetcher_io_wake(f->io);
}

/* Frees the slot of a queued load that was never submitted (stale or displaced prefetch). */
static void front_drop(struct fetcher *f, uint32_t slot)
{
    struct front_load *ld = &f->loads[slot];
    if (ld->queued)
        front_unlink(f, slot);
    fetcher_pool_abandon(f->pool, slot);
    fetcher_trace_prefetch_dropped(f->trace, ld->layer, ld->expert);
    fetcher_trace_resident(f->trace, ld->layer, -1);
}

/* ---- accesses and claims (under f->mu) ---------------------------------------------------- */

static void front_new_token(struct fetcher *f)
{
    f->epoch++;
    f->token_tick = f->pool ? fetcher_pool_tick(f->pool) : 0;
    fetcher_trace_token(f->trace);
}

static bool front_mmap_resident(struct fetcher *f, const struct front_part *pp)
{
    long          page = sysconf(_SC_PAGESIZE);
    uint64_t      start = pp->offset / (uint64_t)page * (uint64_t)page;
    uint64_t      end = pp->offset + pp->size;
    unsigned char vec[256];
    for (uint64_t at = start; at < end;) {
        uint64_t n = (end - at + (uint64_t)page - 1) / (uint64_t)page;
        if (n > sizeof(vec))
            n = sizeof(vec);
        if (mincore(f->maps[pp->file] + at, n * (uint64_t)page, vec) != 0)
            return false;
        for (uint64_t i = 0; i < n; i++)
            if (!(vec[i] & 1))
                return false;
        at += n * (uint64_t)page;
    }
    return true;
}

/* Records the first access of bundle (layer, expert) in the current token. */
static void front_note_access(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    if (!f->explicit_tokens && layer < f->last_layer)
        front_new_token(f);
    f->last_layer = layer;
    uint64_t k = (uint64_t)layer * f->n_expert + expert;
    if (f->seen[k] == f->epoch + 1)
        return;
    f->seen[k] = f->epoch + 1;
    enum fetcher_trace_outcome outcome = FETCHER_TRACE_MISS;
    if (f->mode == FETCHER_IO_MMAP) {
        const struct front_part *pp = &f->parts[k * COMMON_EXPERT_PART_COUNT];
        outcome = FETCHER_TRACE_HIT;
        for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
            if (!front_mmap_resident(f, &pp[p]))
                outcome = FETCHER_TRACE_MISS;
    } else {
        struct common_pool_key   key = {layer, expert, COMMON_POOL_BUNDLE};
        struct fetcher_pool_peek pk;
        fetcher_pool_peek(f->pool, &key, &pk);
        const struct front_load *ld = pk.slot != COMMON_POOL_NO_SLOT ? &f->loads[pk.slot] : NULL;
        /* A load still queued and not started gains nothing over a fault: count a miss. */
        bool unstarted =
            ld && pk.state == COMMON_POOL_SLOT_LOADING && ld->queued && ld->next_part == 0;
        if (ld && !unstarted)
            outcome = pk.origin == FETCHER_PRIO_PREFETCH && pk.n_uses == 0
                          ? FETCHER_TRACE_PREFETCH_HIT
                          : FETCHER_TRACE_HIT;
    }
    fetcher_trace_access(f->trace, layer, expert, outcome);
}

/* Makes sure bundle (layer, expert) is in the pool or on its way: claims a slot and queues the
 * load, or promotes a queued one. Returns 0 or COMMON_EAGAIN (no slot can be freed). */
static int front_ensure(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t prio)
{
    struct common_pool_key     key = {layer, expert, COMMON_POOL_BUNDLE};
    struct fetcher_pool_victim victim;
    uint32_t                   slot, gen;
    uint64_t                   protect = prio == FETCHER_PRIO_PREFETCH ? f->token_tick + 1 : 0;
    int rc = fetcher_pool_claim(f->pool, &key, prio, protect, &slot, &gen, &victim);
    if (rc == 1) {
        front_promote(f, slot, gen, prio);
        return COMMON_OK;
    }
    if (rc == COMMON_EAGAIN && prio != FETCHER_PRIO_PREFETCH) {
        /* A demand outranks a prefetch that has not started: take its slot. */
        uint32_t pf = f->tail[FETCHER_PRIO_PREFETCH];
        while (pf != FRONT_NONE && f->loads[pf].next_part > 0)
            pf = f->loads[pf].prev;
        if (pf != FRONT_NONE) {
            front_drop(f, pf);
            rc = fetcher_pool_claim(f->pool, &key, prio, protect, &slot, &gen, &victim);
        }
    }
    if (rc == COMMON_EAGAIN && prio == FETCHER_PRIO_PREFETCH)
        fetcher_trace_prefetch_dropped(f->trace, layer, expert);
    if (rc != COMMON_OK)
        return rc;
    if (victim.valid) {
        fetcher_trace_evict(f->trace, victim.key.layer, victim.key.expert,
                            victim.origin == FETCHER_PRIO_PREFETCH && victim.n_uses == 0);
        fetcher_trace_resident(f->trace, victim.key.layer, -1);
    }
    fetcher_trace_resident(f->trace, layer, +1);
    if (prio == FETCHER_PRIO_PREFETCH)
        fetcher_trace_prefetch(f->trace, layer, expert);
    const struct front_part *pp =
        &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT];
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
        fetcher_pool_set_part(f->pool, slot, p, pp[p].data_off, pp[p].size);
    f->loads[slot] =
        (struct front_load){.layer = layer, .expert = expert, .gen = gen, .epoch = f->epoch};
    front_enqueue(f, slot, prio);
    front_kick(f);
    return COMMON_OK;
}

/* ---- the I/O thread ----------------------------------------------------------------------- */

/* Picks the next load to submit a part of: demand, then post-fetch, then prefetch while
 * prefetch reads use at most half the queue. Drops stale prefetches on the way. */
static uint32_t front_pick(struct fetcher *f)
{
    for (uint32_t prio = 0; prio < FETCHER_PRIO_COUNT; prio++) {
        while (f->head[prio] != FRONT_NONE) {
            uint32_t           slot = f->head[prio];
            struct front_load *ld = &f->loads[slot];
            if (prio == FETCHER_PRIO_PREFETCH) {
                if (ld->next_part == 0 && f->epoch > ld->epoch + f->o.prefetch_age) {
                    front_drop(f, slot);
                    continue;
                }
                if (2 * f->in_flight_pf >= f->qd && f->in_flight_pf > 0)
                    return FRONT_NONE;
            }
            return slot;
        }
    }
    return FRONT_NONE;
}

/* Handles one completion (under f->mu). */
static void front_complete(struct fetcher *f, const struct fetcher_io_cqe *c)
{
    uint32_t           slot = (uint32_t)(c->user >> 2);
    uint32_t           part = (uint32_t)(c->user & 3);
    struct front_load *ld = &f->loads[slot];
    f->in_flight--;
    if (ld->pf_parts > 0) {
        ld->pf_parts--;
        f->in_flight_pf--;
    }
    if (c->err) {
        if (!ld->err) {
            ld->err = c->err;
            ld->err_cqe = *c;
        }
    } else {
        ld->bytes += c->bytes;
        fetcher_pool_part_ready(f->pool, slot, part);
    }
    if (++ld->parts_done < COMMON_EXPERT_PART_COUNT)
        return;
    if (ld->err) {
        /* Nothing half-loaded becomes READY: the slot goes back to FREE. */
        fetcher_io_describe_error(f->io, &ld->err_cqe, &f->last_error);
        COMMON_LOG_ERR("fetcher", "expert load failed layer=%u expert=%u: %s", ld->layer,
                       ld->expert, f->last_error.text);
        fetcher_pool_fail(f->pool, slot);
        fetcher_trace_load_error(f->trace, ld->layer, ld->expert);
        fetcher_trace_resident(f->trace, ld->layer, -1);
    } else {
        fetcher_pool_complete(f->pool, slot);
        if (f->log && f->log_n < f->log_cap)
            f->log[f->log_n++] = (struct fetcher_probe_key){ld->layer, ld->expert};
        fetcher_trace_load(f->trace, ld->layer, ld->expert, ld->bytes,
                           common_now_ns() - ld->t_submit);
    }
}

static void *front_thread(void *arg)
{
    struct fetcher        *f = arg;
    struct fetcher_io_req *reqs = f->reqs;
    struct fetcher_io_cqe *cqes = f->cqes;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        uint32_t n = 0;
        while (f->in_flight + n < f->qd) {
            uint32_t slot = front_pick(f);
            if (slot == FRONT_NONE)
                break;
            struct front_load       *ld = &f->loads[slot];
            uint32_t                 p = ld->next_part++;
            const struct front_part *pp =
                &f->parts[((uint64_t)ld->layer * f->n_expert + ld->expert) *
                              COMMON_EXPERT_PART_COUNT +
                          p];
            if (p == 0)
                ld->t_submit = common_now_ns();
            if (ld->next_part == COMMON_EXPERT_PART_COUNT)
                front_unlink(f, slot);
            if (ld->prio == FETCHER_PRIO_PREFETCH) {
                ld->pf_parts++;
                f->in_flight_pf++;
            }
            reqs[n++] = (struct fetcher_io_req){
                .file = pp->file,
                .offset = pp->offset,
                .len = pp->size,
                .buf = fetcher_pool_slot_data(f->pool, slot) + pp->data_off,
                .user = (uint64_t)slot << 2 | p,
            };
        }
        if (n == 0 && f->in_flight == 0) {
            if (f->stop)
                break;
            pthread_cond_wait(&f->cv, &f->mu);
            continue;
        }
        f->in_flight += n;
        f->io_blocked = true;
        pthread_mutex_unlock(&f->mu);

        int      rc = n ? fetcher_io_submit(f->io, reqs, n) : COMMON_OK;
        uint32_t nc = 0;
        if (rc == COMMON_OK)
            nc = fetcher_io_reap(f->io, cqes, f->qd, true);

        pthread_mutex_lock(&f->mu);
        f->io_blocked = false;
        if (rc != COMMON_OK) {
            for (uint32_t i = 0; i < n; i++) {
                struct fetcher_io_cqe c = {.user = reqs[i].user,
                                           .err = EIO,
                                           .file = reqs[i].file,
                                           .offset = reqs[i].offset,
                                           .len = reqs[i].len};
                front_complete(f, &c);
            }
        }
        for (uint32_t i = 0; i < nc; i++)
            front_complete(f, &cqes[i]);
        if (f->stop) {
            /* Shutting down: loads not yet started are abandoned (their waiters get EIO). */
            for (uint32_t prio = 0; prio < FETCHER_PRIO_COUNT; prio++)
                while (f->head[prio] != FRONT_NONE) {
                    uint32_t           slot = f->head[prio];
                    struct front_load *ld = &f->loads[slot];
                    if (ld->next_part > 0)
                        break; /* partly submitted: let it finish */
                    front_unlink(f, slot);
                    fetcher_pool_abandon(f->pool, slot);
                    fetcher_trace_resident(f->trace, ld->layer, -1);
                }
        }
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

/* ---- create / destroy --------------------------------------------------------------------- */

static int front_layout(struct fetcher *f, struct common_errmsg *e)
{
    uint64_t n = (uint64_t)f->n_layer * f->n_expert;
    f->parts = calloc(n * COMMON_EXPERT_PART_COUNT, sizeof(*f->parts));
    f->seen = calloc(n, sizeof(*f->seen));
    if (!f->parts || !f->seen)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    for (uint32_t l = 0; l < f->n_layer; l++) {
        for (uint32_t x = 0; x < f->n_expert; x++) {
            uint64_t region = 0;
            for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                struct common_span s;
                int rc = common_model_expert_span(f->m, l, x, (enum common_expert_part)p, &s);
                if (rc != COMMON_OK)
                    return common_errmsg_set(e, rc, "fetcher: no span for layer %u expert %u", l,
                                             x);
                struct front_part *pp =
                    &f->parts[((uint64_t)l * f->n_expert + x) * COMMON_EXPERT_PART_COUNT + p];
                uint64_t start = s.offset / FETCHER_ALIGN * FETCHER_ALIGN;
                uint64_t end =
                    (s.offset + s.size + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
                pp->file = s.split;
                pp->offset = s.offset;
                pp->size = s.size;
                pp->data_off = region + (s.offset - start);
                region += end - start;
            }
        }
    }
    return COMMON_OK;
}

static int front_mmap_init(struct fetcher *f, struct common_errmsg *e)
{
    f->maps = calloc(f->n_splits, sizeof(*f->maps));
    f->map_len = calloc(f->n_splits, sizeof(*f->map_len));
    if (!f->maps || !f->map_len)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    for (uint32_t s = 0; s < f->n_splits; s++) {
        uint64_t len = common_gguf_split_size(f->g, s);
        void *p = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, common_gguf_split_fd(f->g, s), 0);
        if (p == MAP_FAILED)
            return common_errmsg_set(e, COMMON_EIO, "%s: mmap failed: %s",
                                     common_gguf_split_path(f->g, s), strerror(errno));
        f->maps[s] = p;
        f->map_len[s] = len;
    }
    return COMMON_OK;
}

int fetcher_create(const struct common_gguf *g, const struct common_model *m,
                   const struct fetcher_opts *o, struct fetcher **out, struct common_errmsg *e)
{
    if (!g || !m || !common_model_is_moe(m))
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model has no routed experts");
    struct fetcher_opts opts = o ? *o : (struct fetcher_opts){0};
    if (opts.queue_depth == 0)
        opts.queue_depth = 32;
    if (opts.prefetch_age == 0)
        opts.prefetch_age = 1;
    if ((unsigned)opts.io > FETCHER_IO_MMAP || (unsigned)opts.policy > FETCHER_POLICY_LFU)
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: bad io mode or policy");
    uint32_t n_splits = common_gguf_n_splits(g);
    for (uint32_t s = 0; s < n_splits; s++)
        if (common_gguf_split_fd(g, s) < 0)
            return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model has no file to read");

    struct fetcher *f = calloc(1, sizeof(*f));
    if (!f)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    f->g = g;
    f->m = m;
    f->o = opts;
    f->n_layer = m->hp.n_layer;
    f->n_expert = m->hp.n_expert;
    f->n_splits = n_splits;
    f->qd = opts.queue_depth;
    for (uint32_t p = 0; p < FETCHER_PRIO_COUNT; p++)
        f->head[p] = f->tail[p] = FRONT_NONE;
    int rc = front_layout(f, e);
    if (rc != COMMON_OK)
        goto out_destroy;

    /* Pool size: explicit, else the budget plan, else one slot per bundle. */
    uint32_t n_bundles = f->n_layer * f->n_expert;
    f->plan.slot_bytes = fetcher_plan_slot_bytes(m);
    f->plan.n_bundles = n_bundles;
    if (opts.n_slots) {
        f->plan.n_slots = opts.n_slots;
    } else if (opts.ram_budget) {
        struct fetcher_plan_opts po = {.ram_budget = opts.ram_budget,
                                       .kv_bytes = opts.kv_bytes,
                                       .act_bytes = opts.act_bytes,
                                       .queue_depth = opts.queue_depth};
        rc = fetcher_plan_compute(m, &po, &f->plan, e);
        if (rc != COMMON_OK)
            goto out_destroy;
    } else {
        f->plan.n_slots = n_bundles;
    }
    f->plan.pool_bytes = (uint64_t)f->plan.n_slots * f->plan.slot_bytes;

    struct fetcher_trace_opts to = {.n_layer = f->n_layer,
                                    .n_expert = f->n_expert,
                                    .n_slots = opts.io == FETCHER_IO_MMAP ? 0 : f->plan.n_slots,
                                    .warmup_tokens = opts.warmup_tokens};
    rc = fetcher_trace_create(&to, &f->trace);
    if (rc != COMMON_OK) {
        common_errmsg_set(e, rc, "fetcher: trace: out of memory");
        goto out_destroy;
    }
    if (pthread_mutex_init(&f->mu, NULL) != 0 || pthread_cond_init(&f->cv, NULL) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: mutex init failed");
        goto out_destroy;
    }
    f->sync_init = true;

    if (opts.io == FETCHER_IO_MMAP) {
        f->mode = FETCHER_IO_MMAP;
        rc = front_mmap_init(f, e);
        if (rc != COMMON_OK)
            goto out_destroy;
        *out = f;
        return COMMON_OK;
    }

    struct fetcher_pool_opts pool_o = {.slot_bytes = f->plan.slot_bytes,
                                       .n_slots = f->plan.n_slots,
                                       .n_layer = f->n_layer,
                                       .n_expert = f->n_expert,
                                       .policy = opts.policy,
                                       .lfu_halflife = opts.lfu_halflife,
                                       .no_memfd = opts.no_memfd};
    rc = fetcher_pool_create(&pool_o, &f->pool, e);
    if (rc != COMMON_OK)
        goto out_destroy;
    f->loads = calloc(f->plan.n_slots, sizeof(*f->loads));
    f->reqs = calloc(f->qd, sizeof(*f->reqs));
    f->cqes = calloc(f->qd, sizeof(*f->cqes));
    struct fetcher_io_file *files = calloc(n_splits, sizeof(*files));
    if (!f->loads || !f->reqs || !f->cqes || !files) {
        free(files);
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
        goto out_destroy;
    }
    for (uint32_t s = 0; s < n_splits; s++)
        files[s] = (struct fetcher_io_file){.fd = common_gguf_split_fd(g, s),
                                            .path = common_gguf_split_path(g, s)};
    struct fetcher_io_opts io_o = {.mode = opts.io,
                                   .direct = opts.direct,
                                   .queue_depth = opts.queue_depth,
                                   .n_threads = opts.io_threads,
                                   .reg_base = fetcher_pool_slot_data(f->pool, 0),
                                   .reg_bytes = f->plan.pool_bytes};
    rc = fetcher_io_create(&io_o, files, n_splits, &f->io, e);
    free(files);
    if (rc != COMMON_OK)
        goto out_destroy;
    f->mode = fetcher_io_get_mode(f->io);
    if (pthread_create(&f->thread, NULL, front_thread, f) != 0) {
        rc = common_errmsg_set(e, COMMON_EAGAIN, "fetcher: cannot start the I/O thread");
        goto out_destroy;
    }
    f->thread_started = true;
    *out = f;
    return COMMON_OK;

out_destroy:
    fetcher_destroy(f);
    return rc;
}

void fetcher_destroy(struct fetcher *f)
{
    if (!f)
        return;
    if (f->thread_started) {
        pthread_mutex_lock(&f->mu);
        f->stop = true;
        front_kick(f);
        pthread_mutex_unlock(&f->mu);
        pthread_join(f->thread, NULL);
    }
    fetcher_io_destroy(f->io);
    fetcher_pool_destroy(f->pool);
    fetcher_trace_destroy(f->trace);
    for (uint32_t s = 0; f->maps && s < f->n_splits; s++)
        if (f->maps[s])
            munmap(f->maps[s], (size_t)f->map_len[s]);
    free(f->maps);
    free(f->map_len);
    if (f->sync_init) {
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
    }
    free(f->log);
    free(f->loads);
    free(f->reqs);
    free(f->cqes);
    free(f->parts);
    free(f->seen);
    free(f);
}

/* ---- requests and loans ------------------------------------------------------------------- */

static bool front_ids_ok(const struct fetcher *f, uint32_t layer, uint32_t expert)
{
    return layer < f->n_layer && expert < f->n_expert;
}

int fetcher_request(struct fetcher *f, uint32_t layer, uint32_t expert, enum fetcher_priority prio)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)prio >= FETCHER_PRIO_COUNT)
        return COMMON_EINVAL;
    int rc = COMMON_OK;
    pthread_mutex_lock(&f->mu);
    if (prio != FETCHER_PRIO_PREFETCH)
        front_note_access(f, layer, expert);
    if (f->mode == FETCHER_IO_MMAP) {
        if (f->o.mmap_advise) { /* else plain faults at use, as llama.cpp */
            const struct front_part *pp =
                &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT];
            long page = sysconf(_SC_PAGESIZE);
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                uint64_t start = pp[p].offset / (uint64_t)page * (uint64_t)page;
                (void)madvise(f->maps[pp[p].file] + start, pp[p].offset + pp[p].size - start,
                              MADV_WILLNEED);
            }
        }
    } else {
        rc = front_ensure(f, layer, expert, prio);
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int fetcher_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                    enum common_expert_part part, const void **data, uint32_t *loan)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    pthread_mutex_lock(&f->mu);
    front_note_access(f, layer, expert);
    pthread_mutex_unlock(&f->mu);
    if (f->mode == FETCHER_IO_MMAP) {
        const struct front_part *pp =
            &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT + part];
        *data = f->maps[pp->file] + pp->offset;
        *loan = FETCHER_LOAN_NONE;
        return COMMON_OK;
    }
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan l;
    for (;;) {
        uint64_t seq = fetcher_pool_change_seq(f->pool);
        int      rc = fetcher_pool_try_acquire(f->pool, &key, part, &l);
        if (rc == COMMON_OK)
            break;
        if (rc == COMMON_EAGAIN) {
            /* Loading: make sure it is loading as a demand, then wait for the part. */
            pthread_mutex_lock(&f->mu);
            front_promote(f, l.slot, l.gen, FETCHER_PRIO_DEMAND);
            front_kick(f);
            pthread_mutex_unlock(&f->mu);
            rc = fetcher_pool_wait_acquire(f->pool, l.slot, l.gen, part, &l);
            if (rc == COMMON_OK)
                break;
            if (rc == COMMON_EAGAIN)
                continue; /* evicted before we ran, or a stale prefetch dropped: ask again */
            return rc;
        }
        pthread_mutex_lock(&f->mu);
        rc = front_ensure(f, layer, expert, FETCHER_PRIO_DEMAND);
        pthread_mutex_unlock(&f->mu);
        if (rc == COMMON_EAGAIN) {
            struct fetcher_pool_counts c;
            fetcher_pool_counts(f->pool, &c);
            if (c.n_loading == 0 && c.n_failed == 0)
                return COMMON_EAGAIN; /* every slot is pinned */
            fetcher_pool_wait_change(f->pool, seq);
        }
    }
    *data = l.data;
    *loan = l.slot;
    return COMMON_OK;
}

int fetcher_try_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                        enum common_expert_part part, const void **data, uint32_t *loan)
{
    if (!front_ids_ok(f, layer, expert) || (unsigned)part >= COMMON_EXPERT_PART_COUNT)
        return COMMON_EINVAL;
    if (f->mode == FETCHER_IO_MMAP)
        return fetcher_acquire(f, layer, expert, part, data, loan);
    struct common_pool_key  key = {layer, expert, COMMON_POOL_BUNDLE};
    struct common_pool_loan l;
    pthread_mutex_lock(&f->mu);
    front_note_access(f, layer, expert); /* once per token and expert: a later acquire skips it */
    pthread_mutex_unlock(&f->mu);
    if (fetcher_pool_try_acquire(f->pool, &key, part, &l) != COMMON_OK)
        return COMMON_EAGAIN;
    *data = l.data;
    *loan = l.slot;
    return COMMON_OK;
}

int fetcher_note_use(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t n_parts)
{
    if (!front_ids_ok(f, layer, expert) || n_parts == 0)
        return COMMON_EINVAL;
    pthread_mutex_lock(&f->mu);
    front_note_access(f, layer, expert);
    pthread_mutex_unlock(&f->mu);
    if (f->mode == FETCHER_IO_MMAP)
        return COMMON_OK;
    struct common_pool_key key = {layer, expert, COMMON_POOL_BUNDLE};
    return fetcher_pool_touch(f->pool, &key, n_parts);
}

bool fetcher_is_ready(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    if (!front_ids_ok(f, layer, expert))
        return false;
    if (f->mode == FETCHER_IO_MMAP)
        return true;
    struct common_pool_key   key = {layer, expert, COMMON_POOL_BUNDLE};
    struct fetcher_pool_peek pk;
    fetcher_pool_peek(f->pool, &key, &pk);
    return pk.slot != COMMON_POOL_NO_SLOT && pk.state == COMMON_POOL_SLOT_READY;
}

void fetcher_release(struct fetcher *f, uint32_t loan)
{
    if (loan == FETCHER_LOAN_NONE || !f->pool)
        return;
    fetcher_pool_release(f->pool, loan);
}

void fetcher_token_begin(struct fetcher *f)
{
    pthread_mutex_lock(&f->mu);
    f->explicit_tokens = true;
    front_new_token(f);
    pthread_mutex_unlock(&f->mu);
}

struct fetcher_trace *fetcher_get_trace(struct fetcher *f)
{
    return f->trace;
}

const struct fetcher_plan *fetcher_get_plan(const struct fetcher *f)
{
    return &f->plan;
}

enum fetcher_io_mode fetcher_get_io_mode(const struct fetcher *f)
{
    return f->mode;
}

bool fetcher_is_direct(const struct fetcher *f)
{
    return f->io && fetcher_io_is_direct(f->io, 0);
}

void fetcher_last_error(struct fetcher *f, struct common_errmsg *out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->last_error;
    pthread_mutex_unlock(&f->mu);
}

void fetcher_get_pool_counts(struct fetcher *f, struct fetcher_pool_counts *out)
{
    if (!f->pool) {
        *out = (struct fetcher_pool_counts){0};
        return;
    }
    fetcher_pool_counts(f->pool, out);
}

int fetcher_get_pool_fd(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_fd(f->pool) : -1;
}

const void *fetcher_get_pool_base(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_base(f->pool) : NULL;
}

uint64_t fetcher_get_pool_bytes(const struct fetcher *f)
{
    return f->pool ? fetcher_pool_segment_bytes(f->pool) : 0;
}

int fetcher_load_log_start(struct fetcher *f, uint64_t cap)
{
    if (!f || cap == 0 || cap > (UINT64_C(1) << 32))
        return COMMON_EINVAL;
    struct fetcher_probe_key *log = calloc((size_t)cap, sizeof(*log));
    if (!log)
        return COMMON_ENOMEM;
    pthread_mutex_lock(&f->mu);
    free(f->log);
    f->log = log;
    f->log_n = 0;
    f->log_cap = cap;
    pthread_mutex_unlock(&f->mu);
    return COMMON_OK;
}

uint64_t fetcher_load_log_count(struct fetcher *f)
{
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->log_n;
    pthread_mutex_unlock(&f->mu);
    return n;
}

uint64_t fetcher_load_log_take(struct fetcher *f, struct fetcher_probe_key **out)
{
    pthread_mutex_lock(&f->mu);
    *out = f->log;
    uint64_t n = f->log_n;
    f->log = NULL;
    f->log_n = f->log_cap = 0;
    pthread_mutex_unlock(&f->mu);
    return n;
}
