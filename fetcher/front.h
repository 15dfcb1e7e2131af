/* fetcher/front.h - private to fetcher/: the fetcher front's state, shared by the API
 * (fetcher.c) and its machinery (front.c: queues, waiters, claims, the I/O thread). */
#ifndef FETCHER_FRONT_H
#define FETCHER_FRONT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fetcher.h"
#include "io.h"
#include "pool.h"

#define FRONT_NONE UINT32_MAX

/* Waiter nodes allocated at a time when the free list runs dry. */
#define FRONT_WAITER_CHUNK 64u

/* One fetcher_acquire_async() not answered yet. A node is on exactly one list: a load's waiters,
 * `pending`, `ready` or the free list; every list is under f->mu except `ready` once the I/O
 * thread has taken it to run the callbacks. */
#define FRONT_RECENT_ERRORS 16 /* failed loads whose messages are kept by bundle */

struct front_waiter {
    struct front_waiter *next;   /* list link */
    uint32_t             layer;  /* the bundle and part asked for */
    uint32_t             expert; /* model expert id */
    uint32_t             part;   /* enum common_expert_part */
    fetcher_acquire_cb   cb;     /* called once with the outcome */
    void                *arg;    /* borrowed: the caller's, handed back to cb */
    int                  rc;     /* outcome once answered: 0 or a negative common_err */
    const void          *data;   /* mapped (the pool): the part's bytes when rc is 0 */
    uint32_t             loan;   /* the pinned slot when rc is 0 */
};

/* A FIFO of waiters. */
struct front_wlist {
    struct front_waiter *head; /* borrowed: first node, NULL when empty */
    struct front_waiter *tail; /* borrowed: last node */
};

/* A block of waiter nodes; the blocks are kept until fetcher_destroy(). */
struct front_chunk {
    struct front_chunk *next;                  /* owned: the block allocated before */
    struct front_waiter w[FRONT_WAITER_CHUNK]; /* nodes, lent through the free list */
};

/* What front_waiter_step() found for a waiter. */
enum front_wstep {
    FRONT_W_DONE = 0, /* answered: rc (and data, loan) set */
    FRONT_W_SLOT,     /* wait on the load of the slot it names */
    FRONT_W_PENDING,  /* no slot can be claimed now, but one may free up: retry later */
};

/* The error a load fails with when its QSF bundle fails its checksum or does not decode. */
#define FRONT_ECHECK EBADMSG

/* Where one part of a bundle lives in the file and in its slot, and the read that brings it:
 * for GGUF the part itself; for QSF part 0 reads the whole bundle and the others read nothing. */
struct front_part {
    uint32_t file;     /* split index */
    uint64_t offset;   /* file offset of the read */
    uint64_t size;     /* bytes of the part */
    uint64_t data_off; /* offset of the part's bytes in the slot (region start + offset % ALIGN) */
    uint64_t read_len; /* bytes to read from `offset` (0: none) */
    uint64_t read_off; /* where in the slot they land */
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
    struct front_wlist    waiters;    /* fetcher_acquire_async() callers waiting on this load */
};

struct fetcher {
    const struct common_gguf  *g; /* borrowed: must outlive the fetcher */
    const struct common_model *m; /* borrowed: must outlive the fetcher */
    struct fetcher_opts        o;
    struct fetcher_plan        plan;
    enum fetcher_io_mode       mode; /* resolved: URING, PREAD or MMAP */
    uint32_t                   n_layer, n_expert;
    struct front_part         *parts;   /* owned: n_layer * n_expert * 3 */
    struct common_qsf_bundle  *bundles; /* owned: QSF, n_layer * n_expert (checked after each
                                           read and decoded in its slot); NULL for GGUF */
    struct fetcher_pool  *pool;         /* owned (NULL in mmap mode) */
    struct fetcher_io    *io;           /* owned (NULL in mmap mode) */
    struct fetcher_trace *trace;        /* owned */
    uint8_t             **maps;         /* owned: mmap mode, one mapping per split (munmap) */
    uint64_t             *map_len;      /* owned: bytes of each mapping */
    uint32_t              n_splits;
    pthread_mutex_t       mu; /* guards everything below */
    pthread_cond_t        cv; /* wakes the I/O thread when idle */
    bool                  sync_init;
    struct front_load    *loads; /* owned: one per slot */
    uint32_t              head[FETCHER_PRIO_COUNT], tail[FETCHER_PRIO_COUNT];
    uint32_t              n_queued[FETCHER_PRIO_COUNT];
    uint32_t              qd;              /* reads in flight at most */
    uint32_t              in_flight;       /* reads submitted, not reaped */
    uint32_t              in_flight_pf;    /* of which prefetch */
    uint64_t              epoch;           /* tokens begun */
    uint64_t              token_tick;      /* pool tick when the token began */
    bool                  explicit_tokens; /* fetcher_token_begin() was called */
    uint32_t              last_layer;      /* layer of the latest demand (auto tokens) */
    uint64_t             *seen;            /* owned: per bundle, epoch + 1 of its access */
    bool                 *failed;          /* owned: per bundle, its latest load failed */
    bool checked;    /* QSF: each read is checked (front_check_bundle) before its load completes */
    bool stop;       /* the I/O thread exits when idle */
    bool io_blocked; /* the I/O thread waits in fetcher_io_reap */
    pthread_t              thread;
    bool                   thread_started;
    struct fetcher_io_req *reqs; /* owned: qd, the I/O thread's submit batch */
    struct fetcher_io_cqe *cqes; /* owned: qd, the I/O thread's completions */
    struct common_errmsg   last_error;
    /* The latest failed loads' messages by bundle (a ring; fetcher_expert_error), under mu. */
    struct {
        uint32_t             layer, expert;
        struct common_errmsg msg;
    } recent_errors[FRONT_RECENT_ERRORS];
    uint32_t n_recent_errors; /* written so far (the ring's next index modulo its size) */
    /* Asynchronous acquires (fetcher_acquire_async), under mu unless noted. */
    struct front_wlist pending;        /* waiters no slot could be claimed for: retried by the
                                          I/O thread after completions and releases */
    struct front_wlist   ready;        /* answered waiters: the I/O thread runs their callbacks */
    struct front_waiter *free_waiters; /* free list of nodes */
    struct front_chunk  *chunks;       /* owned: every node block */
    bool                 retry;        /* the I/O thread retries `pending` at its next turn */
    /* Waiters on `pending` plus any step about to park there; written under mu, read without it
     * by fetcher_release(), which the pool mutex orders after the increment (see
     * front_waiter_step). */
    _Atomic uint32_t n_pending;
    /* Load log (fetcher_load_log_start): keys of the completed loads, in completion order. */
    struct fetcher_probe_key *log;
    uint64_t                  log_n, log_cap;
};

/* A load into the load log, when one is kept (and has room). f->mu held. */
static inline void front_log_load_locked(struct fetcher *f, uint32_t layer, uint32_t expert)
{
    if (f->log && f->log_n < f->log_cap)
        f->log[f->log_n++] = (struct fetcher_probe_key){layer, expert};
}

/* front_log_load_locked for a load done outside the pool (a device pool's staging). Takes
 * f->mu. */
void fetcher_front_log_load(struct fetcher *f, uint32_t layer, uint32_t expert);

/* ---- the machinery (front.c); under f->mu unless said otherwise --------------------------- */

/* Makes sure bundle (layer, expert) is in the pool or on its way: claims a slot and queues the
 * load, or promotes a queued one. Returns 0 or COMMON_EAGAIN (no slot can be freed). */
int fetcher_front_ensure(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t prio);

void fetcher_front_kick(struct fetcher *f);

void fetcher_front_new_token(struct fetcher *f);

/* Records the first access of bundle (layer, expert) in the current token. */
void fetcher_front_note_access(struct fetcher *f, uint32_t layer, uint32_t expert);

/* Moves a queued load of `slot` (generation gen) up to `prio` if that is more urgent. */
void fetcher_front_promote(struct fetcher *f, uint32_t slot, uint32_t gen, uint32_t prio);

/* The I/O thread: submits parts in priority order, reaps completions and answers the waiters
 * they complete; no one else blocks on the engine. */
void *fetcher_front_thread(void *arg);

/* A free node (the free list grows by a block when empty), or NULL when out of memory. */
struct front_waiter *fetcher_front_waiter_get(struct fetcher *f);

/* Puts `w` where fetcher_front_waiter_step() sent it (`st`, `slot`): an answered one on `done`,
 * else among the waiters of the load in `slot`, or on the pending list (already counted). */
void fetcher_front_waiter_place(struct fetcher *f, struct front_waiter *w, enum front_wstep st,
                                uint32_t slot, struct front_wlist *done);

/* Tries to answer waiter `w` (under f->mu): pins its part when readable, else makes sure its
 * bundle is loading as a demand. Returns FRONT_W_DONE (w->rc, data, loan set: 0, or
 * COMMON_EAGAIN when every slot is pinned and none is loading or failed, as fetcher_acquire()),
 * FRONT_W_SLOT (*slot is loading the bundle: wait on it) or FRONT_W_PENDING (no slot can be
 * claimed now but one may free up; n_pending already counts w). */
enum front_wstep fetcher_front_waiter_step(struct fetcher *f, struct front_waiter *w,
                                           uint32_t *slot);

/* ---- reads outside the pool (the device pool's staging, fetcher/devpool.c); no lock -------- */

/* The reads (at most COMMON_EXPERT_PART_COUNT, into out) that bring bundle (layer, expert) into
 * `region`, laid out as a pool slot (plan.slot_bytes, FETCHER_ALIGN-aligned; part p's bytes then
 * at f->parts[...].data_off once fetcher_front_check_region passed), each with cookie `user`.
 * Returns their count; 0 when the layer has no such bundle (ids out of range, a dense layer, a
 * dense model's streamed FFN). */
uint32_t fetcher_front_bundle_reads(const struct fetcher *f, uint32_t layer, uint32_t expert,
                                    uint8_t *region, uint64_t user, struct fetcher_io_req *out);
/* QSF: checks the bundle (or part, for a dense model's streamed FFN) just read into `region`
 * against its checksum and decodes it there. COMMON_OK (and always for GGUF), else the check's
 * error. */
int fetcher_front_check_region(const struct fetcher *f, uint32_t layer, uint32_t expert,
                               uint32_t part, uint8_t *region);

/* Gives every node of `q` back to the free list. */
void fetcher_front_waiters_put(struct fetcher *f, struct front_wlist *q);

/* Moves every node of `src` to the end of `dst`. */
void fetcher_front_wlist_splice(struct front_wlist *dst, struct front_wlist *src);

#endif /* FETCHER_FRONT_H */
