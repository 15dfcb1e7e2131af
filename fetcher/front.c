/* fetcher/front.c - the fetcher front's machinery: priority queues, waiters of asynchronous
 * acquires, accesses and claims, and the I/O thread that submits reads and answers completions. */
#include "front.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

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
void fetcher_front_promote(struct fetcher *f, uint32_t slot, uint32_t gen, uint32_t prio)
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

void fetcher_front_kick(struct fetcher *f)
{
    pthread_cond_signal(&f->cv);
    if (f->io_blocked)
        fetcher_io_wake(f->io);
}

/* ---- waiters of asynchronous acquires (under f->mu) --------------------------------------- */

static void wlist_push(struct front_wlist *q, struct front_waiter *w)
{
    w->next = NULL;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
}

/* Moves every node of `src` to the end of `dst`. */
void fetcher_front_wlist_splice(struct front_wlist *dst, struct front_wlist *src)
{
    if (!src->head)
        return;
    if (dst->tail)
        dst->tail->next = src->head;
    else
        dst->head = src->head;
    dst->tail = src->tail;
    *src = (struct front_wlist){0};
}

/* A free node (the free list grows by a block when empty), or NULL when out of memory. */
struct front_waiter *fetcher_front_waiter_get(struct fetcher *f)
{
    if (!f->free_waiters) {
        struct front_chunk *c = calloc(1, sizeof(*c));
        if (!c)
            return NULL;
        c->next = f->chunks;
        f->chunks = c;
        for (uint32_t i = 0; i < FRONT_WAITER_CHUNK; i++) {
            c->w[i].next = f->free_waiters;
            f->free_waiters = &c->w[i];
        }
    }
    struct front_waiter *w = f->free_waiters;
    f->free_waiters = w->next;
    return w;
}

/* Gives every node of `q` back to the free list. */
void fetcher_front_waiters_put(struct fetcher *f, struct front_wlist *q)
{
    if (!q->head)
        return;
    q->tail->next = f->free_waiters;
    f->free_waiters = q->head;
    *q = (struct front_wlist){0};
}

/* Puts `w` on the pending list for the I/O thread to retry. */
static void front_waiter_defer(struct fetcher *f, struct front_waiter *w)
{
    atomic_fetch_add_explicit(&f->n_pending, 1, memory_order_relaxed);
    wlist_push(&f->pending, w);
    f->retry = true;
}

/* Answers what the waiters of the load in `slot` can be answered now: each whose part became
 * readable gets it pinned, a failed load gives COMMON_EIO, a load given up without an error
 * sends its waiters back to the pending list to look again. The answered go to f->ready, whose
 * callbacks the I/O thread runs once it has let go of f->mu. */
static void front_wake_slot(struct fetcher *f, uint32_t slot)
{
    struct front_load   *ld = &f->loads[slot];
    struct front_waiter *w = ld->waiters.head;
    ld->waiters = (struct front_wlist){0};
    while (w) {
        struct front_waiter    *next = w->next;
        struct common_pool_loan l;
        int                     rc = fetcher_pool_poll_acquire(f->pool, slot, ld->gen, w->part, &l);
        if (rc == COMMON_EAGAIN) {
            wlist_push(&ld->waiters, w);
        } else if (rc == COMMON_ENOENT) {
            front_waiter_defer(f, w);
        } else {
            w->rc = rc;
            w->data = rc == COMMON_OK ? l.data : NULL;
            w->loan = rc == COMMON_OK ? l.slot : FETCHER_LOAN_NONE;
            wlist_push(&f->ready, w);
        }
        w = next;
    }
    fetcher_front_kick(f); /* the I/O thread runs f->ready and retries f->pending */
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
    front_wake_slot(f, slot);
}

/* ---- accesses and claims (under f->mu) ---------------------------------------------------- */

void fetcher_front_new_token(struct fetcher *f)
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
void fetcher_front_note_access(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    if (!f->explicit_tokens && layer < f->last_layer)
        fetcher_front_new_token(f);
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
int fetcher_front_ensure(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t prio)
{
    struct common_pool_key     key = {layer, expert, COMMON_POOL_BUNDLE};
    struct fetcher_pool_victim victim;
    uint32_t                   slot, gen;
    uint64_t                   protect = prio == FETCHER_PRIO_PREFETCH ? f->token_tick + 1 : 0;
    int rc = fetcher_pool_claim(f->pool, &key, prio, protect, &slot, &gen, &victim);
    if (rc == 1) {
        fetcher_front_promote(f, slot, gen, prio);
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
    /* A load's waiters are all answered or moved before its slot can be claimed again. */
    assert(!f->loads[slot].waiters.head);
    f->loads[slot] =
        (struct front_load){.layer = layer, .expert = expert, .gen = gen, .epoch = f->epoch};
    front_enqueue(f, slot, prio);
    fetcher_front_kick(f);
    return COMMON_OK;
}

/* Tries to answer waiter `w` (under f->mu): pins its part when readable, else makes sure its
 * bundle is loading as a demand. Returns FRONT_W_DONE (w->rc, data, loan set: 0, or
 * COMMON_EAGAIN when every slot is pinned and none is loading or failed, as fetcher_acquire()),
 * FRONT_W_SLOT (*slot is loading the bundle: wait on it) or FRONT_W_PENDING (no slot can be
 * claimed now but one may free up; n_pending already counts w). */
enum front_wstep fetcher_front_waiter_step(struct fetcher *f, struct front_waiter *w,
                                           uint32_t *slot)
{
    struct common_pool_key key = {w->layer, w->expert, COMMON_POOL_BUNDLE};
    for (;;) {
        struct common_pool_loan l;
        int                     rc = fetcher_pool_try_acquire(f->pool, &key, w->part, &l);
        if (rc == COMMON_OK) {
            w->rc = COMMON_OK;
            w->data = l.data;
            w->loan = l.slot;
            return FRONT_W_DONE;
        }
        if (rc == COMMON_EAGAIN) {
            /* Loading (every claim and load end happens under f->mu, so its load is live). */
            assert(f->loads[l.slot].gen == l.gen);
            fetcher_front_promote(f, l.slot, l.gen, FETCHER_PRIO_DEMAND);
            fetcher_front_kick(f);
            *slot = l.slot;
            return FRONT_W_SLOT;
        }
        if (fetcher_front_ensure(f, w->layer, w->expert, FETCHER_PRIO_DEMAND) == COMMON_OK)
            continue;
        /* No slot. Count the waiter before looking again: fetcher_release() unpins under the
         * pool mutex and then reads n_pending, so either that look (claim and counts, under the
         * same mutex) sees the unpinned slot, or the release sees the count and asks the I/O
         * thread for a retry. */
        atomic_fetch_add_explicit(&f->n_pending, 1, memory_order_relaxed);
        if (fetcher_front_ensure(f, w->layer, w->expert, FETCHER_PRIO_DEMAND) == COMMON_OK) {
            atomic_fetch_sub_explicit(&f->n_pending, 1, memory_order_relaxed);
            continue;
        }
        struct fetcher_pool_counts c;
        fetcher_pool_counts(f->pool, &c);
        /* As in fetcher_acquire(): a failed bundle with nothing loading is answered with the
         * failure (its failed slot may be pinned by this waiter's own caller). */
        bool failed = f->failed[(uint64_t)w->layer * f->n_expert + w->expert] && !c.n_loading;
        if ((c.n_loading > 0 || c.n_failed > 0) && !failed)
            return FRONT_W_PENDING;
        atomic_fetch_sub_explicit(&f->n_pending, 1, memory_order_relaxed);
        w->rc = failed ? COMMON_EIO : COMMON_EAGAIN;
        w->data = NULL;
        w->loan = FETCHER_LOAN_NONE;
        return FRONT_W_DONE;
    }
}

/* Puts `w` where fetcher_front_waiter_step() sent it (`st`, `slot`): an answered one on `done`,
 * else among the waiters of the load in `slot`, or on the pending list (already counted). */
void fetcher_front_waiter_place(struct fetcher *f, struct front_waiter *w, enum front_wstep st,
                                uint32_t slot, struct front_wlist *done)
{
    if (st == FRONT_W_DONE)
        wlist_push(done, w);
    else if (st == FRONT_W_SLOT)
        wlist_push(&f->loads[slot].waiters, w);
    else
        wlist_push(&f->pending, w);
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

/* Handles one completion (under f->mu); answers the waiters it made readable. */
static void front_complete(struct fetcher *f, const struct fetcher_io_cqe *c)
{
    uint32_t           slot = (uint32_t)(c->user >> 2);
    uint32_t           part = (uint32_t)(c->user & 3);
    struct front_load *ld = &f->loads[slot];
    const uint32_t     inc = f->bundles ? COMMON_EXPERT_PART_COUNT : 1; /* QSF: one read */
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
        /* The last part of a sound load is not made readable alone: fetcher_pool_complete()
         * below marks every part readable and the slot READY under one lock, so whoever waited
         * for that part sees the bundle READY (fetcher_is_ready) when it wakes. */
        if (ld->parts_done + inc < COMMON_EXPERT_PART_COUNT || ld->err)
            fetcher_pool_part_ready(f->pool, slot, part);
    }
    ld->parts_done += inc;
    if (ld->parts_done < COMMON_EXPERT_PART_COUNT) {
        if (ld->waiters.head && !c->err)
            front_wake_slot(f, slot);
        return;
    }
    f->failed[(uint64_t)ld->layer * f->n_expert + ld->expert] = ld->err != 0;
    if (ld->err) {
        /* Nothing half-loaded becomes READY: the slot goes back to FREE. */
        if (ld->err == FRONT_ECHECK)
            common_errmsg_set(&f->last_error, COMMON_ECORRUPT,
                              "%s: layer %u expert %u: the data read at offset %llu fails its "
                              "checksum or does not decode (sluice verify names every bad one)",
                              common_gguf_split_path(f->g, ld->err_cqe.file), ld->layer, ld->expert,
                              (unsigned long long)ld->err_cqe.offset);
        else
            fetcher_io_describe_error(f->io, &ld->err_cqe, &f->last_error);
        COMMON_LOG_ERR("fetcher", "expert load failed layer=%u expert=%u: %s", ld->layer,
                       ld->expert, f->last_error.text);
        const uint32_t r = f->n_recent_errors++ % FRONT_RECENT_ERRORS;
        f->recent_errors[r].layer = ld->layer;
        f->recent_errors[r].expert = ld->expert;
        f->recent_errors[r].msg = f->last_error;
        fetcher_pool_fail(f->pool, slot);
        fetcher_trace_load_error(f->trace, ld->layer, ld->expert);
        fetcher_trace_resident(f->trace, ld->layer, -1);
    } else {
        /* counted before it is published: whoever sees the bundle READY (an acquire that polls
         * the pool) finds the load in the trace */
        fetcher_trace_load(f->trace, ld->layer, ld->expert, ld->bytes,
                           common_now_ns() - ld->t_submit);
        fetcher_pool_complete(f->pool, slot);
        front_log_load_locked(f, ld->layer, ld->expert);
    }
    if (ld->waiters.head)
        front_wake_slot(f, slot);
}

int fetcher_front_check_region(const struct fetcher *f, uint32_t layer, uint32_t expert,
                               uint32_t part, uint8_t *region)
{
    uint64_t k = (uint64_t)layer * f->n_expert + expert;
    if (!f->checked)
        return COMMON_OK; /* GGUF: nothing to check */
    if (f->bundles)
        return common_qsf_bundle_finish(&f->bundles[k], region, NULL);
    /* A dense model's FFN streamed from a QSF file: each part is a whole resident tensor,
     * checked against its own checksum. */
    int64_t idx = f->m->layers[layer].tensor[COMMON_ROLE_FFN_GATE_EXPS + (int)part];
    return idx < 0 ? COMMON_OK
                   : common_gguf_check_tensor(
                         f->g, (uint64_t)idx,
                         region + f->parts[k * COMMON_EXPERT_PART_COUNT + part].data_off, NULL);
}

uint32_t fetcher_front_bundle_reads(const struct fetcher *f, uint32_t layer, uint32_t expert,
                                    uint8_t *region, uint64_t user, struct fetcher_io_req *out)
{
    if (layer >= f->n_layer || expert >= f->n_expert || !common_model_layer_is_moe(f->m, layer) ||
        (f->checked && !f->bundles))
        return 0;
    const struct front_part *pp =
        &f->parts[((uint64_t)layer * f->n_expert + expert) * COMMON_EXPERT_PART_COUNT];
    const uint32_t n = f->bundles ? 1 : COMMON_EXPERT_PART_COUNT; /* QSF: one read */
    for (uint32_t p = 0; p < n; p++)
        out[p] = (struct fetcher_io_req){.file = pp[p].file,
                                         .offset = pp[p].offset,
                                         .len = pp[p].read_len,
                                         .buf = region + pp[p].read_off,
                                         .user = user};
    return n;
}

/* QSF: checks a bundle just read against its checksum and decodes it in its slot (or, for a
 * dense model's streamed FFN, the part's tensor against its own), before the load completes (on
 * the I/O thread, f->mu not held: the slot is this load's until then). A bad read fails the load
 * with FRONT_ECHECK. */
static void front_check_bundle(struct fetcher *f, struct fetcher_io_cqe *c)
{
    if (c->err)
        return;
    uint32_t                 slot = (uint32_t)(c->user >> 2);
    const struct front_load *ld = &f->loads[slot];
    if (fetcher_front_check_region(f, ld->layer, ld->expert, (uint32_t)(c->user & 3),
                                   fetcher_pool_slot_data(f->pool, slot)) != COMMON_OK)
        c->err = FRONT_ECHECK;
}

/* Fills the submit batch f->reqs with parts of the loads front_pick() chooses, as far as the
 * queue depth allows (under f->mu). Returns the count. */
static uint32_t front_fill(struct fetcher *f)
{
    uint32_t n = 0;
    while (f->in_flight + n < f->qd) {
        uint32_t slot = front_pick(f);
        if (slot == FRONT_NONE)
            break;
        struct front_load       *ld = &f->loads[slot];
        uint32_t                 p = ld->next_part++;
        const struct front_part *pp =
            &f->parts[((uint64_t)ld->layer * f->n_expert + ld->expert) * COMMON_EXPERT_PART_COUNT +
                      p];
        if (p == 0)
            ld->t_submit = common_now_ns();
        if (f->bundles)
            ld->next_part = COMMON_EXPERT_PART_COUNT; /* QSF: one read brings the bundle */
        if (ld->next_part == COMMON_EXPERT_PART_COUNT)
            front_unlink(f, slot);
        if (ld->prio == FETCHER_PRIO_PREFETCH) {
            ld->pf_parts++;
            f->in_flight_pf++;
        }
        f->reqs[n++] = (struct fetcher_io_req){
            .file = pp->file,
            .offset = pp->offset,
            .len = pp->read_len,
            .buf = fetcher_pool_slot_data(f->pool, slot) + pp->read_off,
            .user = (uint64_t)slot << 2 | p,
        };
    }
    return n;
}

/* Shutting down: loads not yet started are abandoned (their waiters go to the pending list,
 * answered COMMON_ECLOSED by fetcher_destroy). Under f->mu. */
static void front_abandon_queued(struct fetcher *f)
{
    for (uint32_t prio = 0; prio < FETCHER_PRIO_COUNT; prio++)
        while (f->head[prio] != FRONT_NONE) {
            uint32_t           slot = f->head[prio];
            struct front_load *ld = &f->loads[slot];
            if (ld->next_part > 0)
                break; /* partly submitted: let it finish */
            front_unlink(f, slot);
            fetcher_pool_abandon(f->pool, slot);
            fetcher_trace_resident(f->trace, ld->layer, -1);
            front_wake_slot(f, slot);
        }
}

/* Tries every pending waiter again (under f->mu, on the I/O thread). */
static void front_retry_pending(struct fetcher *f)
{
    struct front_wlist todo = f->pending;
    f->pending = (struct front_wlist){0};
    f->retry = false;
    for (struct front_waiter *w = todo.head, *next; w; w = next) {
        next = w->next;
        atomic_fetch_sub_explicit(&f->n_pending, 1, memory_order_relaxed);
        uint32_t         slot = FRONT_NONE;
        enum front_wstep st = fetcher_front_waiter_step(f, w, &slot);
        fetcher_front_waiter_place(f, w, st, slot, &f->ready);
    }
}

/* Runs the callbacks of f->ready with f->mu let go (a callback may take its own locks, release
 * loans or acquire again), then takes the nodes back. Called and returns with f->mu held. */
static void front_run_ready(struct fetcher *f)
{
    while (f->ready.head) {
        struct front_wlist run = f->ready;
        f->ready = (struct front_wlist){0};
        pthread_mutex_unlock(&f->mu);
        for (struct front_waiter *w = run.head; w; w = w->next)
            w->cb(w->arg, w->rc, w->data, w->loan);
        pthread_mutex_lock(&f->mu);
        fetcher_front_waiters_put(f, &run);
    }
}

/* The I/O thread: submits parts in priority order, reaps completions and answers the waiters
 * they complete; no one else blocks on the engine. */
void *fetcher_front_thread(void *arg)
{
    struct fetcher        *f = arg;
    struct fetcher_io_req *reqs = f->reqs;
    struct fetcher_io_cqe *cqes = f->cqes;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        if (f->retry && !f->stop)
            front_retry_pending(f);
        if (f->ready.head) {
            front_run_ready(f);
            continue;
        }
        uint32_t n = front_fill(f);
        if (n == 0 && f->in_flight == 0) {
            if (f->stop)
                break;
            if (!f->retry)
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

        if (f->checked)
            for (uint32_t i = 0; i < nc; i++)
                front_check_bundle(f, &cqes[i]);
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
        if (f->stop)
            front_abandon_queued(f);
        if (f->pending.head)
            f->retry = true; /* slots may have become claimable */
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}
