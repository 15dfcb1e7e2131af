/* fetcher/pool.h - expert pool: fixed-size slots and their table in one shared-memory arena. */
#ifndef FETCHER_POOL_H
#define FETCHER_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "fetcher.h"

/* The expert pool, writer side: a segment (memfd or anonymous shared mapping) in the layout of
 * common.h (struct common_pool_hdr: header, slot table, key index and slot data, all addressed by
 * offsets). This process owns the mutex and condition variable; another process maps the segment
 * with common_pool_view_attach() and reads READY slots seqlock style. Opaque. */
struct fetcher_pool;

struct fetcher_pool_opts {
    uint64_t            slot_bytes;   /* required; rounded up to FETCHER_ALIGN */
    uint32_t            n_slots;      /* required */
    uint32_t            n_layer;      /* key space; required */
    uint32_t            n_expert;     /* key space; required */
    enum fetcher_policy policy;       /* 0 = LRU */
    uint32_t            lfu_halflife; /* LFU: uses after which a count is halved; 0 = 4*n_slots */
    bool                no_memfd;     /* anonymous shared mapping instead of a memfd */
};

/* What a claim displaced, for tracing. */
struct fetcher_pool_victim {
    bool                   valid;  /* a READY slot was evicted */
    struct common_pool_key key;    /* its key */
    uint32_t               n_uses; /* acquires since it was loaded */
    uint32_t               origin; /* what its loader passed to fetcher_pool_claim() */
};

/* State of a slot by key, without pinning. */
struct fetcher_pool_peek {
    uint32_t slot;   /* COMMON_POOL_NO_SLOT when the key is not in the pool */
    uint32_t state;  /* enum common_pool_slot_state */
    uint32_t n_uses; /* acquires since load */
    uint32_t origin; /* loader's tag */
};

/* Creates the segment (memfd "sluice-pool", or anonymous) and formats it. Returns 0,
 * COMMON_EINVAL (a zero or oversized field), COMMON_ENOMEM (mapping failed), with a message. */
int fetcher_pool_create(const struct fetcher_pool_opts *o, struct fetcher_pool **out,
                        struct common_errmsg *e);
/* Unmaps and frees; accepts NULL. */
void fetcher_pool_destroy(struct fetcher_pool *p);

/* The memfd of the segment (owned by the pool), or -1 for an anonymous one. */
int      fetcher_pool_fd(const struct fetcher_pool *p);
uint32_t fetcher_pool_n_slots(const struct fetcher_pool *p);
uint64_t fetcher_pool_slot_bytes(const struct fetcher_pool *p);
/* Start of the whole segment in this process's mapping, and its length in bytes. */
const uint8_t *fetcher_pool_base(const struct fetcher_pool *p);
uint64_t       fetcher_pool_segment_bytes(const struct fetcher_pool *p);
/* Start of slot `slot`'s bytes (FETCHER_ALIGN-aligned) in this process's mapping. */
uint8_t *fetcher_pool_slot_data(const struct fetcher_pool *p, uint32_t slot);

/* ---- readers (creator process) ----------------------------------------------------------- */

/* Pins the slot holding `key` if part `part` (0..2, or COMMON_POOL_WHOLE) is readable, and
 * counts a use. Returns 0 (pinned, *out filled), COMMON_EAGAIN (loading, part not ready yet:
 * out->slot and out->gen name what to wait on), COMMON_ENOENT (not in the pool),
 * COMMON_EINVAL (bad key). Thread-safe. */
int fetcher_pool_try_acquire(struct fetcher_pool *p, const struct common_pool_key *key,
                             uint32_t part, struct common_pool_loan *out);

/* Blocks until slot `slot` of generation `gen` has part `part` readable, then pins it as
 * fetcher_pool_try_acquire() does. Returns 0, COMMON_EIO when that load failed
 * (fetcher_pool_fail), or COMMON_EAGAIN when the slot changed hands without a failure (the load
 * was abandoned, or it completed and was evicted before this waiter ran): look up the key
 * again. Thread-safe. */
int fetcher_pool_wait_acquire(struct fetcher_pool *p, uint32_t slot, uint32_t gen, uint32_t part,
                              struct common_pool_loan *out);

/* fetcher_pool_wait_acquire() without the wait: pins slot `slot` of generation `gen` if part
 * `part` is readable now. Returns 0 (pinned, *out filled), COMMON_EAGAIN (still loading, the part
 * is not readable yet), COMMON_EIO (that load failed), COMMON_ENOENT (the slot changed hands
 * without a failure: look up the key again), COMMON_EINVAL (bad slot or part). Thread-safe. */
int fetcher_pool_poll_acquire(struct fetcher_pool *p, uint32_t slot, uint32_t gen, uint32_t part,
                              struct common_pool_loan *out);

/* Unpins one loan of `slot`. Thread-safe. */
void fetcher_pool_release(struct fetcher_pool *p, uint32_t slot);

/* True while the generation of the loaned slot is unchanged (the bytes are those lent). */
bool fetcher_pool_loan_is_valid(const struct fetcher_pool *p, const struct common_pool_loan *l);

/* Looks up `key` without pinning or counting a use. Thread-safe. */
void fetcher_pool_peek(struct fetcher_pool *p, const struct common_pool_key *key,
                       struct fetcher_pool_peek *out);

/* This process's view of the segment (borrowed from p): what another process's attached view
 * sees, for tests and for reading evictions. */
const struct common_pool_view *fetcher_pool_view(const struct fetcher_pool *p);

/* Counts `n` uses of the READY slot holding `key` (as n acquires do) without pinning it: what a
 * cross-process reader reports after reading n parts of the slot directly. Returns 0,
 * COMMON_ENOENT (not READY in the pool), COMMON_EINVAL (bad key, attached view). Thread-safe. */
int fetcher_pool_touch(struct fetcher_pool *p, const struct common_pool_key *key, uint32_t n);

/* ---- loader side ------------------------------------------------------------------------- */

/* Claims a slot for `key`: a FREE slot, else the policy's victim among READY unpinned slots not
 * used at or after tick `protect_since` (0 = protect nothing). The slot becomes LOADING with a
 * new generation; `origin` is stored for tracing. Returns 0 (claimed: *slot, *gen, *victim set),
 * 1 (the key is already in the pool: *slot and *gen name it), COMMON_EAGAIN (no slot can be
 * freed), COMMON_EINVAL (bad key). Thread-safe. */
int fetcher_pool_claim(struct fetcher_pool *p, const struct common_pool_key *key, uint32_t origin,
                       uint64_t protect_since, uint32_t *slot, uint32_t *gen,
                       struct fetcher_pool_victim *victim);

/* Records where part `part` lies inside a LOADING slot (offset from the slot start, bytes). */
void fetcher_pool_set_part(struct fetcher_pool *p, uint32_t slot, uint32_t part, uint64_t offset,
                           uint64_t size);
/* Marks one part of a LOADING slot readable and wakes waiters. */
void fetcher_pool_part_ready(struct fetcher_pool *p, uint32_t slot, uint32_t part);
/* LOADING -> READY (every part readable); wakes waiters. */
void fetcher_pool_complete(struct fetcher_pool *p, uint32_t slot);
/* A load failed: the slot's key leaves the index, and it becomes FREE with a new generation
 * (or FAILED until its last pin is released). Wakes waiters, which get COMMON_EIO. */
void fetcher_pool_fail(struct fetcher_pool *p, uint32_t slot);
/* As fetcher_pool_fail() for a load given up without an error (a stale prefetch): waiters get
 * COMMON_EAGAIN and look again. */
void fetcher_pool_abandon(struct fetcher_pool *p, uint32_t slot);

/* The pool's use clock (bumped by every acquire and claim). */
uint64_t fetcher_pool_tick(struct fetcher_pool *p);

/* Retires slots until `want` of them are retired (never fewer than the most wanted before, so
 * want 0 retires what an earlier call could not; a retired slot is never used again): FREE ones
 * first, then READY unpinned ones in the policy's order of eviction, whose keys go to
 * evicted[0..cap) (the caller traces them); the memory of a retired slot goes back to the system
 * (MADV_REMOVE). Slots pinned or loading now stay until a later call. Returns the READY slots
 * evicted (at most cap are reported; the call stops there). */
uint32_t fetcher_pool_retire(struct fetcher_pool *p, uint32_t want,
                             struct fetcher_pool_victim *evicted, uint32_t cap);
/* Retired slots, and how many are wanted retired. */
void fetcher_pool_retired(struct fetcher_pool *p, uint32_t *n_retired, uint32_t *want);
/* Counts slots by state; for tests and stats. */
void fetcher_pool_counts(struct fetcher_pool *p, struct fetcher_pool_counts *out);
/* Change counter bumped by every state change and release; fetcher_pool_wait_change() blocks
 * until it differs from `seen`. */
uint64_t fetcher_pool_change_seq(struct fetcher_pool *p);
void     fetcher_pool_wait_change(struct fetcher_pool *p, uint64_t seen);

#endif /* FETCHER_POOL_H */
