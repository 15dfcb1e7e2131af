/* executor/remote_impl.h - private to executor/: the fetcher-daemon expert source's state. */
#ifndef EXECUTOR_REMOTE_IMPL_H
#define EXECUTOR_REMOTE_IMPL_H

/* Not for use outside executor/: other folders go through struct executor_remote in
 * executor.h. The source is split along its seam: remote_link.c (a link's lifecycle:
 * connecting, the pool mapping, the rings, the reader thread, relinks) and remote.c (the expert
 * source over the links: loans, prefetch, direct reads, create and destroy). */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "executor.h"
#include "proto.h"

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
    uint32_t                hooked;  /* the region hooks' generation told of it; 0 = none */
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
    uint32_t                   n_seq, n_ctx; /* told to each fetcher in ATTACH */
    bool (*cancelled)(void); /* startup wait ends when it returns true; may be NULL */
    uint32_t            n_links;
    struct remote_link *links; /* owned: n_links */
    uint32_t           *owner; /* owned: fetcher index per (layer, expert), layer * n_expert +
                                  expert; UINT32_MAX for a dense layer's */
    _Atomic bool stop;
    bool         no_direct; /* every part is pinned through an ACQUIRE */
    /* Layers whose KV the executor keeps on a device (DEVICE_LAYERS, sent after each ATTACH);
     * -1 = not told yet. */
    _Atomic int64_t device_layers;

    /* A device's registration of the pools' mappings (executor_region_hooks): told of every
     * link's map as it is installed, and before one is unmapped. hooks_mu is taken under a
     * link's mu and takes no other of ours. */
    pthread_mutex_t              hooks_mu;
    struct executor_region_hooks hooks;     /* .add NULL = none */
    uint32_t                     hooks_gen; /* bumped by each new set of hooks */

    /* Owned: the fetchers' device pools (remote_dev.c), one per device at most; NULL = none. */
    struct remote_dev *devs[EXECUTOR_DEV_MAX_FETCHERS];

    pthread_mutex_t     loan_mu; /* the loan table */
    struct remote_loan *loans;   /* owned: cap entries */
    uint32_t            n_cap;
    uint32_t            next_free; /* search start */
};

/* What one connection attempt produced, before it is installed. */
struct remote_conn {
    uint32_t                   pid;
    uint64_t                   instance;
    struct proto_shard         shard;
    struct remote_map         *map;
    struct common_ring_segment req_seg, rep_seg;
    struct common_ring         req, rep;
};

/* ---- shared by remote.c, remote_link.c and remote_dev.c ---------------------------------------
 */

/* The link of the fetcher that serves (layer, expert), or NULL for ids out of range. */
struct remote_link *executor_remote_owner(struct executor_remote *r, uint32_t layer,
                                          uint32_t expert);
/* Waits on `c` (CLOCK_MONOTONIC) at most `ms` milliseconds. */
void executor_remote_cond_wait_ms(pthread_cond_t *c, pthread_mutex_t *m, uint32_t ms);

/* First connection of every fetcher, within the deadline. */
int executor_remote_connect_all(struct executor_remote *r, struct common_errmsg *e);

/* Unmaps one pool mapping and frees it; accepts NULL. */
void executor_remote_map_free(struct remote_map *m);
/* The same for a map that was installed: the region hooks told first. Link mu. */
void executor_remote_map_drop(struct executor_remote *r, struct remote_map *m);
/* Tells the region hooks of m, the link's map now. Link mu. */
void executor_remote_map_hook(struct executor_remote *r, struct remote_map *m);

/* One loan on `m` ended. Link mu. */
void executor_remote_map_unref(struct remote_link *L, struct remote_map *m);

/* Pops replies and dispatches them until `mine` (may be NULL) has its reply, or `ms` passed
 * (0: only what is there now). Called by the holder of the consumer role on a link that is up.
 * A corrupt ring is left to the reader thread (want_break). */
void executor_remote_poll(struct remote_link *L, const struct remote_wait *mine, uint32_t ms);

/* Gives the consumer role back and wakes the waiters (one of them may take it). Link mu. */
void executor_remote_pop_unclaim_locked(struct remote_link *L);

/* Pushes one request record. With `wait`, waits for room while the link stays up. Push mu. */
int executor_remote_push(struct remote_link *L, const struct proto_fetch_req *rec, bool wait);

/* As executor_remote_push() without waking the fetcher (it sees the record at its next wake;
 * every REMOTE_QUIET_MAX quiet pushes one wakes it). Push mu. */
int executor_remote_push_quiet(struct remote_link *L, const struct proto_fetch_req *rec);

/* The link's watcher: relinks, checks a silent fetcher, and collects replies nobody is polling
 * for (waiters pop their own replies: the fetcher's push wakes the waiting thread directly). */
void *executor_remote_reader(void *arg);

/* ---- the fetcher's device pool (remote_dev.c) --------------------------------------------- */

/* Its operations for the devices' expert pools (open's arg: the struct executor_remote; the
 * others': the pool open made). */
extern const struct executor_dev_ops executor_remote_dev_ops;
/* Frees what remains of it (after the links' threads stopped). */
void executor_remote_dev_free(struct executor_remote *r);

#endif /* EXECUTOR_REMOTE_IMPL_H */
