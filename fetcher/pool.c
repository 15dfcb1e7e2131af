/* fetcher/pool.c - expert pool: fixed-size slots, slot table, key index in one shared segment. */
#include "pool.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The segment layout is common.h's (struct common_pool_hdr); this file is its only writer. It
 * changes the slot table under pool->mu; readers of other processes use the atomics only. */
struct fetcher_pool {
    struct common_pool_view  v;         /* the segment, bound over base */
    uint8_t                 *base;      /* mapped: the segment, unmapped by fetcher_pool_destroy */
    uint64_t                 map_bytes; /* length of the mapping */
    int                      fd;        /* owned: memfd, or -1 */
    struct common_pool_hdr  *hdr;       /* borrowed: v.hdr */
    struct common_pool_slot *slots;     /* borrowed: v.slots */
    _Atomic uint32_t        *index;     /* borrowed: v.index */
    enum fetcher_policy      policy;
    double                   halflife;   /* LFU decay, in ticks */
    pthread_mutex_t          mu;         /* guards the table, tick and change_seq (creator only) */
    pthread_cond_t           cv;         /* broadcast on every state change and release */
    bool                     sync_init;  /* mu and cv initialised */
    uint64_t                 tick;       /* use clock; under mu */
    uint64_t                 change_seq; /* under mu */
    uint64_t                *failed_gen; /* owned: per slot, 1 + the generation whose load failed
                                            (0 = none); under mu, creator only */
    bool    *retired;                    /* owned: per slot, never used again; under mu */
    uint32_t n_retired, retire_want;     /* under mu */
};

static bool pool_key_ok(const struct fetcher_pool *p, const struct common_pool_key *k)
{
    return common_pool_key_ok(&p->v, k);
}

static uint64_t pool_key_index(const struct fetcher_pool *p, const struct common_pool_key *k)
{
    return common_pool_key_index(&p->v, k);
}

static void pool_bind(struct fetcher_pool *p)
{
    common_pool_view_bind(&p->v, p->base, p->map_bytes);
    p->hdr = p->v.hdr;
    p->slots = p->v.slots;
    p->index = p->v.index;
}

int fetcher_pool_create(const struct fetcher_pool_opts *o, struct fetcher_pool **out,
                        struct common_errmsg *e)
{
    if (!o || o->slot_bytes == 0 || o->n_slots == 0 || o->n_layer == 0 || o->n_expert == 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "pool: slot_bytes, n_slots, n_layer and "
                                 "n_expert must be non-zero");
    if (o->n_slots >= COMMON_POOL_NO_SLOT - 1 || o->slot_bytes > (UINT64_C(1) << 40))
        return common_errmsg_set(e, COMMON_EINVAL, "pool: %u slots of %llu bytes is too large",
                                 o->n_slots, (unsigned long long)o->slot_bytes);
    struct common_pool_hdr h = {
        .magic = COMMON_POOL_MAGIC,
        .version = COMMON_POOL_VERSION,
        .n_slots = o->n_slots,
        .n_layer = o->n_layer,
        .n_expert = o->n_expert,
        .policy = (uint32_t)o->policy,
        .slot_bytes = (o->slot_bytes + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN,
    };
    if (common_pool_layout(&h) != COMMON_OK || h.segment_bytes > (uint64_t)SIZE_MAX)
        return common_errmsg_set(e, COMMON_EINVAL, "pool: segment size overflows");

    struct fetcher_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return common_errmsg_set(e, COMMON_ENOMEM, "pool: out of memory");
    p->fd = -1;
    p->map_bytes = h.segment_bytes;
    int flags = MAP_SHARED;
    if (!o->no_memfd) {
        p->fd = memfd_create("sluice-pool", MFD_CLOEXEC);
        if (p->fd >= 0 && ftruncate(p->fd, (off_t)h.segment_bytes) != 0) {
            close(p->fd);
            p->fd = -1;
        }
    }
    if (p->fd < 0)
        flags |= MAP_ANONYMOUS;
    void *base = mmap(NULL, (size_t)h.segment_bytes, PROT_READ | PROT_WRITE, flags, p->fd, 0);
    if (base == MAP_FAILED) {
        int err = errno;
        fetcher_pool_destroy(p);
        return common_errmsg_set(e, COMMON_ENOMEM, "pool: mmap of %llu bytes failed: %s",
                                 (unsigned long long)h.segment_bytes, strerror(err));
    }
    p->base = base;
    memcpy(p->base, &h, sizeof(h));
    pool_bind(p);
    /* A fresh mapping is zero: every slot FREE, generation 0, index empty. */
    p->policy = o->policy;
    p->halflife = o->lfu_halflife ? (double)o->lfu_halflife : 4.0 * (double)o->n_slots;
    if (pthread_mutex_init(&p->mu, NULL) != 0 || pthread_cond_init(&p->cv, NULL) != 0) {
        fetcher_pool_destroy(p);
        return common_errmsg_set(e, COMMON_ENOMEM, "pool: mutex init failed");
    }
    p->sync_init = true;
    p->failed_gen = calloc(o->n_slots, sizeof(*p->failed_gen));
    p->retired = calloc(o->n_slots, sizeof(*p->retired));
    if (!p->failed_gen || !p->retired) {
        fetcher_pool_destroy(p);
        return common_errmsg_set(e, COMMON_ENOMEM, "pool: out of memory");
    }
    *out = p;
    return COMMON_OK;
}

void fetcher_pool_destroy(struct fetcher_pool *p)
{
    if (!p)
        return;
    if (p->base)
        munmap(p->base, (size_t)p->map_bytes);
    if (p->fd >= 0)
        close(p->fd);
    if (p->sync_init) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    free(p->failed_gen);
    free(p->retired);
    free(p);
}

int fetcher_pool_fd(const struct fetcher_pool *p)
{
    return p->fd;
}

uint32_t fetcher_pool_n_slots(const struct fetcher_pool *p)
{
    return p->hdr->n_slots;
}

uint64_t fetcher_pool_slot_bytes(const struct fetcher_pool *p)
{
    return p->hdr->slot_bytes;
}

const uint8_t *fetcher_pool_base(const struct fetcher_pool *p)
{
    return p->base;
}

uint64_t fetcher_pool_segment_bytes(const struct fetcher_pool *p)
{
    return p->map_bytes;
}

uint8_t *fetcher_pool_slot_data(const struct fetcher_pool *p, uint32_t slot)
{
    return common_pool_slot_data(&p->v, slot);
}

const struct common_pool_view *fetcher_pool_view(const struct fetcher_pool *p)
{
    return &p->v;
}

/* ---- helpers under p->mu ------------------------------------------------------------------ */

static void pool_changed(struct fetcher_pool *p)
{
    p->change_seq++;
    pthread_cond_broadcast(&p->cv);
}

static bool pool_readable(const struct common_pool_slot *s, uint32_t part)
{
    uint32_t st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (st == COMMON_POOL_SLOT_READY)
        return true;
    if (st != COMMON_POOL_SLOT_LOADING || part >= COMMON_EXPERT_PART_COUNT)
        return false;
    return (atomic_load_explicit(&s->ready_mask, memory_order_relaxed) >> part) & 1u;
}

static double pool_lfu_now(const struct fetcher_pool *p, const struct common_pool_slot *s)
{
    double age = (double)(p->tick - s->lfu_tick);
    return s->lfu_score * exp2(-age / p->halflife);
}

/* One use of a slot: the use clock, its recency, its decayed frequency and its use count. */
static void pool_count_use(struct fetcher_pool *p, struct common_pool_slot *s)
{
    p->tick++;
    s->last_use = p->tick;
    s->lfu_score = pool_lfu_now(p, s) + 1.0;
    s->lfu_tick = p->tick;
    s->n_uses++;
}

static void pool_pin(struct fetcher_pool *p, uint32_t slot, uint32_t part,
                     struct common_pool_loan *out)
{
    struct common_pool_slot *s = &p->slots[slot];
    atomic_fetch_add_explicit(&s->pins, 1, memory_order_relaxed);
    pool_count_use(p, s);
    out->slot = slot;
    out->gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
    if (part < COMMON_EXPERT_PART_COUNT) {
        out->data = fetcher_pool_slot_data(p, slot) + s->part_off[part];
        out->size = s->part_size[part];
    } else {
        out->data = fetcher_pool_slot_data(p, slot);
        out->size = p->hdr->slot_bytes;
    }
}

/* Bumps the generation and frees the slot (no key, no pins). */
static void pool_free_slot(struct fetcher_pool *p, struct common_pool_slot *s)
{
    atomic_store_explicit(&s->ready_mask, 0, memory_order_relaxed);
    /* The state leaves READY before the generation moves: a reader that sees the new
     * generation sees the slot not READY (see fetcher_pool_claim). */
    atomic_store_explicit(&s->state, COMMON_POOL_SLOT_FREE, memory_order_relaxed);
    /* Release: pairs with the acquire loads of gen in common_pool_read_begin() and
     * common_pool_read_valid(). */
    atomic_fetch_add_explicit(&s->gen, 1, memory_order_release);
    (void)p;
}

static void pool_unindex(struct fetcher_pool *p, const struct common_pool_slot *s)
{
    struct common_pool_key k = {s->layer, s->expert, s->part};
    /* Release: pairs with the acquire load of the index in common_pool_read_begin(). */
    atomic_store_explicit(&p->index[pool_key_index(p, &k)], 0, memory_order_release);
}

/* ---- readers ------------------------------------------------------------------------------ */

int fetcher_pool_try_acquire(struct fetcher_pool *p, const struct common_pool_key *key,
                             uint32_t part, struct common_pool_loan *out)
{
    if (!pool_key_ok(p, key) || part > COMMON_POOL_WHOLE)
        return COMMON_EINVAL;
    int rc;
    pthread_mutex_lock(&p->mu);
    uint32_t v = atomic_load_explicit(&p->index[pool_key_index(p, key)], memory_order_relaxed);
    if (v == 0) {
        rc = COMMON_ENOENT;
    } else if (pool_readable(&p->slots[v - 1], part)) {
        pool_pin(p, v - 1, part, out);
        rc = COMMON_OK;
    } else {
        out->slot = v - 1;
        out->gen = atomic_load_explicit(&p->slots[v - 1].gen, memory_order_relaxed);
        rc = COMMON_EAGAIN;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* Pins slot `slot` of generation `gen` when part `part` is readable (under p->mu). Returns 0,
 * COMMON_EAGAIN (still loading, part not readable yet), COMMON_EIO (that load failed) or
 * COMMON_ENOENT (the slot changed hands without a failure). */
static int pool_slot_acquire(struct fetcher_pool *p, uint32_t slot, uint32_t gen, uint32_t part,
                             struct common_pool_loan *out)
{
    struct common_pool_slot *s = &p->slots[slot];
    uint32_t                 st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (atomic_load_explicit(&s->gen, memory_order_relaxed) != gen || st == COMMON_POOL_SLOT_FREE ||
        st == COMMON_POOL_SLOT_FAILED) {
        /* Failed loads give EIO; a slot that completed and was then evicted, or a load
         * abandoned without an error, asks the caller to look again. */
        return p->failed_gen[slot] == (uint64_t)gen + 1 ? COMMON_EIO : COMMON_ENOENT;
    }
    if (!pool_readable(s, part))
        return COMMON_EAGAIN;
    pool_pin(p, slot, part, out);
    return COMMON_OK;
}

int fetcher_pool_wait_acquire(struct fetcher_pool *p, uint32_t slot, uint32_t gen, uint32_t part,
                              struct common_pool_loan *out)
{
    if (slot >= p->hdr->n_slots || part > COMMON_POOL_WHOLE)
        return COMMON_EINVAL;
    int rc;
    pthread_mutex_lock(&p->mu);
    while ((rc = pool_slot_acquire(p, slot, gen, part, out)) == COMMON_EAGAIN)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return rc == COMMON_ENOENT ? COMMON_EAGAIN : rc;
}

int fetcher_pool_poll_acquire(struct fetcher_pool *p, uint32_t slot, uint32_t gen, uint32_t part,
                              struct common_pool_loan *out)
{
    if (slot >= p->hdr->n_slots || part > COMMON_POOL_WHOLE)
        return COMMON_EINVAL;
    pthread_mutex_lock(&p->mu);
    int rc = pool_slot_acquire(p, slot, gen, part, out);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fetcher_pool_release(struct fetcher_pool *p, uint32_t slot)
{
    if (slot >= p->hdr->n_slots)
        return;
    struct common_pool_slot *s = &p->slots[slot];
    pthread_mutex_lock(&p->mu);
    uint32_t pins = atomic_load_explicit(&s->pins, memory_order_relaxed);
    if (pins == 0)
        common_log_write(COMMON_LOG_LEVEL_ERR, "fetcher.pool", "release of unpinned slot=%u", slot);
    else
        atomic_store_explicit(&s->pins, pins - 1, memory_order_relaxed);
    if (pins == 1 &&
        atomic_load_explicit(&s->state, memory_order_relaxed) == COMMON_POOL_SLOT_FAILED)
        pool_free_slot(p, s);
    pool_changed(p);
    pthread_mutex_unlock(&p->mu);
}

bool fetcher_pool_loan_is_valid(const struct fetcher_pool *p, const struct common_pool_loan *l)
{
    return common_pool_loan_is_valid(&p->v, l);
}

void fetcher_pool_peek(struct fetcher_pool *p, const struct common_pool_key *key,
                       struct fetcher_pool_peek *out)
{
    *out = (struct fetcher_pool_peek){.slot = COMMON_POOL_NO_SLOT};
    if (!pool_key_ok(p, key))
        return;
    pthread_mutex_lock(&p->mu);
    uint32_t v = atomic_load_explicit(&p->index[pool_key_index(p, key)], memory_order_relaxed);
    if (v != 0) {
        const struct common_pool_slot *s = &p->slots[v - 1];
        out->slot = v - 1;
        out->state = atomic_load_explicit(&s->state, memory_order_relaxed);
        out->n_uses = s->n_uses;
        out->origin = s->origin;
    }
    pthread_mutex_unlock(&p->mu);
}

int fetcher_pool_touch(struct fetcher_pool *p, const struct common_pool_key *key, uint32_t n)
{
    if (!pool_key_ok(p, key))
        return COMMON_EINVAL;
    int rc = COMMON_ENOENT;
    pthread_mutex_lock(&p->mu);
    uint32_t v = atomic_load_explicit(&p->index[pool_key_index(p, key)], memory_order_relaxed);
    if (v != 0 && pool_readable(&p->slots[v - 1], COMMON_POOL_WHOLE)) {
        for (uint32_t i = 0; i < n; i++)
            pool_count_use(p, &p->slots[v - 1]);
        rc = COMMON_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* ---- loader side -------------------------------------------------------------------------- */

/* Picks the slot to reuse: the first FREE one, else the policy's minimum among READY unpinned
 * slots not used since `protect_since`. Returns COMMON_POOL_NO_SLOT when none qualifies. */
static uint32_t pool_pick_victim(struct fetcher_pool *p, uint64_t protect_since)
{
    uint32_t best = COMMON_POOL_NO_SLOT;
    double   best_score = 0.0;
    uint64_t best_tick = 0;
    for (uint32_t i = 0; i < p->hdr->n_slots; i++) {
        const struct common_pool_slot *s = &p->slots[i];
        uint32_t                       st = atomic_load_explicit(&s->state, memory_order_relaxed);
        if (p->retired[i])
            continue;
        if (st == COMMON_POOL_SLOT_FREE)
            return i;
        if (st != COMMON_POOL_SLOT_READY || atomic_load_explicit(&s->pins, memory_order_relaxed))
            continue;
        if (protect_since != 0 && s->last_use >= protect_since)
            continue;
        double score = p->policy == FETCHER_POLICY_LFU ? pool_lfu_now(p, s) : 0.0;
        if (best == COMMON_POOL_NO_SLOT || score < best_score ||
            (score == best_score && s->last_use < best_tick)) {
            best = i;
            best_score = score;
            best_tick = s->last_use;
        }
    }
    return best;
}

int fetcher_pool_claim(struct fetcher_pool *p, const struct common_pool_key *key, uint32_t origin,
                       uint64_t protect_since, uint32_t *slot, uint32_t *gen,
                       struct fetcher_pool_victim *victim)
{
    if (!pool_key_ok(p, key))
        return COMMON_EINVAL;
    int rc;
    if (victim)
        *victim = (struct fetcher_pool_victim){0};
    pthread_mutex_lock(&p->mu);
    uint64_t ki = pool_key_index(p, key);
    uint32_t v = atomic_load_explicit(&p->index[ki], memory_order_relaxed);
    if (v != 0) {
        *slot = v - 1;
        *gen = atomic_load_explicit(&p->slots[v - 1].gen, memory_order_relaxed);
        rc = 1;
        goto out_unlock;
    }
    uint32_t i = pool_pick_victim(p, protect_since);
    if (i == COMMON_POOL_NO_SLOT) {
        rc = COMMON_EAGAIN;
        goto out_unlock;
    }
    struct common_pool_slot *s = &p->slots[i];
    if (atomic_load_explicit(&s->state, memory_order_relaxed) == COMMON_POOL_SLOT_READY) {
        if (victim)
            *victim = (struct fetcher_pool_victim){
                .valid = true,
                .key = {s->layer, s->expert, s->part},
                .n_uses = s->n_uses,
                .origin = s->origin,
            };
        pool_unindex(p, s);
        atomic_fetch_add_explicit(&p->hdr->evictions, 1, memory_order_release);
    }
    /* Seqlock write side: the slot stops being READY, then the generation moves, before the
     * slot gets its new key and bytes. In that order, a reader that loads the new generation
     * (acquire) then the state cannot see the old READY with the old key, and take bytes about
     * to be overwritten under a generation that will not change again.
     * Release: pairs with the acquire loads of gen in common_pool_read_begin() and
     * common_pool_read_valid(). */
    atomic_store_explicit(&s->state, COMMON_POOL_SLOT_LOADING, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->gen, 1, memory_order_release);
    /* And the new bytes (written after this returns) are not seen before the new generation:
     * pairs with the acquire fence in common_pool_read_valid(). */
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&s->ready_mask, 0, memory_order_relaxed);
    s->layer = key->layer;
    s->expert = key->expert;
    s->part = key->part;
    s->origin = origin;
    s->n_uses = 0;
    p->tick++;
    s->last_use = p->tick;
    s->lfu_tick = p->tick;
    s->lfu_score = 1.0;
    memset(s->part_off, 0, sizeof(s->part_off));
    memset(s->part_size, 0, sizeof(s->part_size));
    /* Release: pairs with the acquire load of state in common_pool_read_begin(). */
    atomic_store_explicit(&s->state, COMMON_POOL_SLOT_LOADING, memory_order_release);
    /* Release: pairs with the acquire load of the index in common_pool_read_begin(). */
    atomic_store_explicit(&p->index[ki], i + 1, memory_order_release);
    *slot = i;
    *gen = atomic_load_explicit(&s->gen, memory_order_relaxed);
    rc = COMMON_OK;
    pool_changed(p);
out_unlock:
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void fetcher_pool_set_part(struct fetcher_pool *p, uint32_t slot, uint32_t part, uint64_t offset,
                           uint64_t size)
{
    if (slot >= p->hdr->n_slots || part >= COMMON_EXPERT_PART_COUNT)
        return;
    pthread_mutex_lock(&p->mu);
    p->slots[slot].part_off[part] = offset;
    p->slots[slot].part_size[part] = size;
    pthread_mutex_unlock(&p->mu);
}

void fetcher_pool_part_ready(struct fetcher_pool *p, uint32_t slot, uint32_t part)
{
    if (slot >= p->hdr->n_slots || part >= COMMON_EXPERT_PART_COUNT)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_fetch_or_explicit(&p->slots[slot].ready_mask, 1u << part, memory_order_relaxed);
    pool_changed(p);
    pthread_mutex_unlock(&p->mu);
}

void fetcher_pool_complete(struct fetcher_pool *p, uint32_t slot)
{
    if (slot >= p->hdr->n_slots)
        return;
    pthread_mutex_lock(&p->mu);
    struct common_pool_slot *s = &p->slots[slot];
    if (atomic_load_explicit(&s->state, memory_order_relaxed) == COMMON_POOL_SLOT_LOADING) {
        atomic_store_explicit(&s->ready_mask, (1u << COMMON_EXPERT_PART_COUNT) - 1,
                              memory_order_relaxed);
        /* Release: the slot bytes and part layout are visible to an attached reader that
         * sees READY; pairs with the acquire load of state in common_pool_read_begin(). */
        atomic_store_explicit(&s->state, COMMON_POOL_SLOT_READY, memory_order_release);
    }
    pool_changed(p);
    pthread_mutex_unlock(&p->mu);
}

/* Takes a LOADING (or READY) slot out of the index; FREE now, or FAILED until unpinned. */
static void pool_drop(struct fetcher_pool *p, uint32_t slot, bool failed)
{
    if (slot >= p->hdr->n_slots)
        return;
    pthread_mutex_lock(&p->mu);
    struct common_pool_slot *s = &p->slots[slot];
    uint32_t                 st = atomic_load_explicit(&s->state, memory_order_relaxed);
    if (st == COMMON_POOL_SLOT_LOADING || st == COMMON_POOL_SLOT_READY) {
        if (failed)
            p->failed_gen[slot] = (uint64_t)atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
        pool_unindex(p, s);
        if (atomic_load_explicit(&s->pins, memory_order_relaxed) == 0)
            pool_free_slot(p, s);
        else
            atomic_store_explicit(&s->state, COMMON_POOL_SLOT_FAILED, memory_order_release);
    }
    pool_changed(p);
    pthread_mutex_unlock(&p->mu);
}

void fetcher_pool_fail(struct fetcher_pool *p, uint32_t slot)
{
    pool_drop(p, slot, true);
}

void fetcher_pool_abandon(struct fetcher_pool *p, uint32_t slot)
{
    pool_drop(p, slot, false);
}

uint64_t fetcher_pool_tick(struct fetcher_pool *p)
{
    pthread_mutex_lock(&p->mu);
    uint64_t t = p->tick;
    pthread_mutex_unlock(&p->mu);
    return t;
}

uint32_t fetcher_pool_retire(struct fetcher_pool *p, uint32_t want,
                             struct fetcher_pool_victim *evicted, uint32_t cap)
{
    uint32_t n_ev = 0;
    pthread_mutex_lock(&p->mu);
    const uint32_t before = p->n_retired;
    if (want > p->hdr->n_slots)
        want = p->hdr->n_slots;
    if (want > p->retire_want)
        p->retire_want = want;
    while (p->n_retired < p->retire_want) {
        uint32_t i = pool_pick_victim(p, 0); /* FREE first, then the policy's READY victim */
        if (i == COMMON_POOL_NO_SLOT)
            break; /* the rest is pinned or loading: a later call */
        struct common_pool_slot *s = &p->slots[i];
        if (atomic_load_explicit(&s->state, memory_order_relaxed) == COMMON_POOL_SLOT_READY) {
            if (n_ev == cap)
                break;
            evicted[n_ev++] = (struct fetcher_pool_victim){
                .valid = true,
                .key = {s->layer, s->expert, s->part},
                .n_uses = s->n_uses,
                .origin = s->origin,
            };
            pool_unindex(p, s);
            pool_free_slot(p, s);
        }
        p->retired[i] = true;
        p->n_retired++;
        /* Its pages go back (the segment is shared memory: a memfd or shared anonymous). */
        (void)madvise(fetcher_pool_slot_data(p, i), (size_t)p->hdr->slot_bytes, MADV_REMOVE);
    }
    if (p->n_retired != before)
        pool_changed(p);
    pthread_mutex_unlock(&p->mu);
    return n_ev;
}

void fetcher_pool_retired(struct fetcher_pool *p, uint32_t *n_retired, uint32_t *want)
{
    pthread_mutex_lock(&p->mu);
    *n_retired = p->n_retired;
    *want = p->retire_want;
    pthread_mutex_unlock(&p->mu);
}

void fetcher_pool_counts(struct fetcher_pool *p, struct fetcher_pool_counts *out)
{
    *out =
        (struct fetcher_pool_counts){.n_slots = p->hdr->n_slots, .slot_bytes = p->hdr->slot_bytes};
    pthread_mutex_lock(&p->mu);
    out->n_retired = p->n_retired;
    for (uint32_t i = 0; i < p->hdr->n_slots; i++) {
        const struct common_pool_slot *s = &p->slots[i];
        if (p->retired[i])
            continue;
        switch (atomic_load_explicit(&s->state, memory_order_relaxed)) {
        case COMMON_POOL_SLOT_FREE:
            out->n_free++;
            break;
        case COMMON_POOL_SLOT_LOADING:
            out->n_loading++;
            break;
        case COMMON_POOL_SLOT_READY:
            out->n_ready++;
            break;
        default:
            out->n_failed++;
            break;
        }
        if (atomic_load_explicit(&s->pins, memory_order_relaxed))
            out->n_pinned++;
    }
    pthread_mutex_unlock(&p->mu);
}

uint64_t fetcher_pool_change_seq(struct fetcher_pool *p)
{
    pthread_mutex_lock(&p->mu);
    uint64_t v = p->change_seq;
    pthread_mutex_unlock(&p->mu);
    return v;
}

void fetcher_pool_wait_change(struct fetcher_pool *p, uint64_t seen)
{
    pthread_mutex_lock(&p->mu);
    while (p->change_seq == seen)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
