/* fetcher/fetcher.h - public front door of fetcher/: streaming experts into a budgeted pool. */
#ifndef FETCHER_FETCHER_H
#define FETCHER_FETCHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "proto.h"

/* O_DIRECT granularity: slots, part regions inside slots and direct reads are aligned to it. */
#define FETCHER_ALIGN 4096u

/* A loan id that fetcher_release() ignores (given out by the mmap mode, which pins nothing). */
#define FETCHER_LOAN_NONE UINT32_MAX

/* ------------------------------------------------------------------------------------------ */
/* Options shared by the pool, the I/O engine and the front                                    */
/* ------------------------------------------------------------------------------------------ */

/* Which READY, unpinned slot the pool gives up when it needs room. */
enum fetcher_policy {
    FETCHER_POLICY_LRU = 0, /* least recently used (default) */
    FETCHER_POLICY_LFU,     /* least frequently used, counts halved every `lfu_halflife` uses */
};

/* How expert bytes reach memory. */
enum fetcher_io_mode {
    FETCHER_IO_AUTO = 0, /* io_uring when the kernel allows it, else the pread thread pool */
    FETCHER_IO_URING,    /* io_uring (fails at create when unavailable) */
    FETCHER_IO_PREAD,    /* a pool of threads doing preadv (forced fallback) */
    FETCHER_IO_MMAP,     /* baseline: map the files and let the page cache decide; no pool */
};

/* Whether reads bypass the page cache. */
enum fetcher_direct {
    FETCHER_DIRECT_AUTO = 0, /* O_DIRECT where the file system accepts it, else buffered */
    FETCHER_DIRECT_OFF,      /* always buffered */
};

/* Request classes, most urgent first. A prefetch never delays a demand. The values are those of
 * the HINT records on the wire (enum proto_fetch_prio). */
enum fetcher_priority {
    FETCHER_PRIO_DEMAND = PROTO_FETCH_PRIO_DEMAND,       /* needed now by the forward pass */
    FETCHER_PRIO_POSTFETCH = PROTO_FETCH_PRIO_POSTFETCH, /* picked by the router for this layer */
    FETCHER_PRIO_PREFETCH = PROTO_FETCH_PRIO_PREFETCH,   /* a guess; dropped when stale */
    FETCHER_PRIO_COUNT = PROTO_FETCH_PRIO_COUNT,
};

/* Static names ("lru", "uring", "demand", ...) and their parsers (0 or COMMON_EINVAL). */
const char *fetcher_policy_name(enum fetcher_policy p);
int         fetcher_policy_parse(const char *s, enum fetcher_policy *out);
const char *fetcher_io_mode_name(enum fetcher_io_mode m);
int         fetcher_io_mode_parse(const char *s, enum fetcher_io_mode *out);
const char *fetcher_priority_name(enum fetcher_priority p);

/* ------------------------------------------------------------------------------------------ */
/* Memory budget plan (fetcher/plan.c)                                                         */
/* ------------------------------------------------------------------------------------------ */

struct fetcher_plan_opts {
    uint64_t ram_budget;  /* bytes for everything (resident + pool + KV + overhead); required */
    uint64_t kv_bytes;    /* KV caches, computed by the caller (executor) */
    uint64_t act_bytes;   /* activations and scratch; 0 = one default context (common_ctx_layout) */
    uint64_t base_bytes;  /* code, stacks, allocator slack; 0 = 16 MiB */
    uint64_t staging_bytes; /* pinned staging of a device pool fed from storage (--vram-fill) */
    uint32_t queue_depth; /* I/O queue depth, for ring memory; 0 = 32 */
    uint32_t min_slots;   /* smallest useful pool; 0 = 2 * n_expert_used */
};

/* What a budget buys. All byte counts are what the plan reserves, not measured RSS. */
struct fetcher_plan {
    uint64_t ram_budget;     /* as given */
    uint64_t resident_bytes; /* non-expert weights (attention, norms, embeddings, router) */
    uint64_t kv_bytes;       /* as given */
    uint64_t act_bytes;      /* activations and scratch */
    uint64_t io_bytes;       /* rings, slot table, key index */
    uint64_t base_bytes;     /* fixed overhead */
    uint64_t staging_bytes;  /* as given */
    uint64_t slot_bytes;     /* one slot: the largest bundle with its O_DIRECT padding */
    uint32_t n_slots;        /* pool slots */
    uint32_t n_bundles;      /* routed expert bundles in the model (n_layer * n_expert) */
    uint64_t pool_bytes;     /* n_slots * slot_bytes */
    uint64_t min_budget;     /* smallest budget that fits min_slots */
    uint32_t min_slots;      /* the minimum pool used for min_budget */
};

/* Bytes of one pool slot for model `m`: the largest sum, over the experts of one layer, of the
 * 4096-aligned ranges that enclose its gate, up and down parts. 0 for a dense model. */
uint64_t fetcher_plan_slot_bytes(const struct common_model *m);

/* Computes the plan for `m` under o->ram_budget: the pool gets what is left after resident
 * weights, KV, activations, I/O and base overhead, capped at one slot per bundle. Returns 0;
 * COMMON_ERANGE when fewer than the minimum slots fit, with a message naming the minimum budget
 * (plan->min_budget is filled in either case); COMMON_EINVAL for a dense model or a zero budget.
 * Pure function: thread-safe. */
int fetcher_plan_compute(const struct common_model *m, const struct fetcher_plan_opts *o,
                         struct fetcher_plan *plan, struct common_errmsg *e);

/* Formats the plan as a few lines of text for printing at start. Returns the length that was
 * (or would have been) written, as snprintf does. */
int fetcher_plan_format(const struct fetcher_plan *plan, char *buf, size_t len);

/* ------------------------------------------------------------------------------------------ */
/* Expert-usage tracing (fetcher/trace.c)                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Counters per (layer, expert), faults per token, steady state after a warm-up, peak resident
 * bundles per layer, the access sequence for an optimal (Belady) replay. Opaque; every function
 * is thread-safe (one internal mutex, held briefly). */
struct fetcher_trace;

/* log2 latency buckets: bucket i counts loads of [2^i, 2^(i+1)) microseconds (0 also < 1 us). */
#define FETCHER_TRACE_LAT_BUCKETS 24

/* Reuse-distance buckets: bucket 0 counts accesses whose bundle was last used 1 token before,
 * bucket i >= 1 those of [2^i, 2^(i+1)) tokens before, the last one also everything farther;
 * first uses are counted apart. */
#define FETCHER_TRACE_REUSE_BUCKETS 16

struct fetcher_trace_opts {
    uint32_t n_layer;       /* required */
    uint32_t n_expert;      /* required */
    uint32_t n_slots;       /* pool slots, for the Belady replay; 0 = no replay */
    uint32_t warmup_tokens; /* tokens counted as cold start; 0 = 8 */
    uint64_t max_accesses;  /* access sequence kept for Belady; 0 = 4 Mi (16 MiB) */
};

/* How a bundle access (the first use of (layer, expert) in a token) was served. */
enum fetcher_trace_outcome {
    FETCHER_TRACE_HIT = 0,      /* resident (or loading) before the access, not by a prefetch */
    FETCHER_TRACE_MISS,         /* not in the pool: a fault */
    FETCHER_TRACE_PREFETCH_HIT, /* first use of a bundle a prefetch brought in */
};

int fetcher_trace_create(const struct fetcher_trace_opts *o, struct fetcher_trace **out);
/* Frees the trace; accepts NULL. */
void fetcher_trace_destroy(struct fetcher_trace *t);

/* Recording (called by the front; usable alone by other weight sources). Out-of-range layer or
 * expert ids are ignored. */
void fetcher_trace_token(struct fetcher_trace *t); /* a new token starts */
void fetcher_trace_access(struct fetcher_trace *t, uint32_t layer, uint32_t expert,
                          enum fetcher_trace_outcome outcome);
void fetcher_trace_load(struct fetcher_trace *t, uint32_t layer, uint32_t expert, uint64_t bytes,
                        uint64_t latency_ns);
void fetcher_trace_load_error(struct fetcher_trace *t, uint32_t layer, uint32_t expert);
void fetcher_trace_prefetch(struct fetcher_trace *t, uint32_t layer, uint32_t expert);
/* A prefetch was dropped (stale, or no slot to spare) before it was read. */
void fetcher_trace_prefetch_dropped(struct fetcher_trace *t, uint32_t layer, uint32_t expert);
/* A bundle left the pool; `unused_prefetch` when a prefetch loaded it and nobody used it. */
void fetcher_trace_evict(struct fetcher_trace *t, uint32_t layer, uint32_t expert,
                         bool unused_prefetch);
/* Resident bundles of `layer` changed by `delta` (+1 on load start, -1 on eviction/failure). */
void fetcher_trace_resident(struct fetcher_trace *t, uint32_t layer, int delta);

struct fetcher_trace_totals {
    uint64_t accesses, hits, misses, prefetch_hits;
    uint64_t prefetch_issued, prefetch_wasted, prefetch_dropped;
    uint64_t loads, load_errors, bytes_read, evictions;
    uint64_t tokens, faults, max_faults;                      /* every token */
    uint64_t steady_tokens, steady_faults, steady_max_faults; /* after the warm-up */
    uint64_t belady_accesses, belady_hits; /* optimal replay of the recorded sequence */
    bool     belady_truncated;             /* more accesses than max_accesses: replay is partial */
    /* Which case a run was: how evenly each layer's accesses spread over its experts (Shannon
     * entropy of the access counts over log2(n_expert): 1 = uniform, 0 = one expert; layers
     * without accesses left out), and how many tokens passed between two uses of a bundle. */
    double   entropy_min, entropy_mean, entropy_max;
    uint64_t reuse[FETCHER_TRACE_REUSE_BUCKETS]; /* tokens since the bundle's previous use */
    uint64_t first_uses;                         /* accesses of a bundle never used before */
};

/* Expert predictors (of the executor's prefetch) the trace reports, at most this many. */
#define FETCHER_TRACE_MAX_PREDICTORS 8

/* Sets the counts of predictor `name` (at most 23 bytes): `predicted` guesses, `correct` of them
 * picked by the router, `actual` picks; precision = correct / predicted, recall = correct /
 * actual. A later call with the same name replaces the counts. Returns 0, COMMON_EINVAL (bad name,
 * correct above predicted or actual), COMMON_ENOMEM (FETCHER_TRACE_MAX_PREDICTORS names used). */
int fetcher_trace_predictor(struct fetcher_trace *t, const char *name, uint64_t predicted,
                            uint64_t correct, uint64_t actual);

/* Snapshot of the totals (runs the Belady replay: O(n log n) in the recorded accesses). */
void fetcher_trace_totals(const struct fetcher_trace *t, struct fetcher_trace_totals *out);

/* Hits of Belady's optimal offline policy (evict the key used farthest in the future) on
 * `keys[0..n)` with a cache of `n_slots` entries. Returns the hit count, or COMMON_ENOMEM as a
 * negative value. Pure function. */
int64_t fetcher_trace_belady_hits(const uint32_t *keys, size_t n, uint32_t n_slots);

/* Writes the trace as one JSON object (schema "sluice.fetcher.trace/1", docs/fetcher.md).
 * Returns 0 or COMMON_EIO. */
int fetcher_trace_write_json(const struct fetcher_trace *t, FILE *out);
/* Writes a few lines of text: hit rates, faults per token, Belady, prefetch, bytes, latency. */
void fetcher_trace_write_summary(const struct fetcher_trace *t, FILE *out);

/* ------------------------------------------------------------------------------------------ */
/* The fetcher front (fetcher/fetcher.c)                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Serves "expert e of layer L part P, pinned until released" from a budgeted pool of bundle
 * slots (one slot holds gate, up and down of one expert), filled by an I/O thread in priority
 * order. Opaque; every function is thread-safe unless noted. */
struct fetcher;

struct fetcher_opts {
    uint64_t ram_budget;                /* pool from fetcher_plan_compute(); 0 = no budget */
    uint64_t kv_bytes;                  /* for the plan */
    uint64_t act_bytes;                 /* for the plan; 0 = estimate */
    uint32_t n_slots;                   /* explicit pool size, overrides the plan; 0 = from the
                                           budget, or one slot per bundle without a budget */
    enum fetcher_policy  policy;        /* eviction policy; 0 = LRU */
    uint32_t             lfu_halflife;  /* LFU decay in pool uses; 0 = 4 * n_slots */
    enum fetcher_io_mode io;            /* 0 = auto */
    enum fetcher_direct  direct;        /* 0 = O_DIRECT where possible */
    uint32_t             queue_depth;   /* reads in flight; 0 = 32 */
    uint32_t             io_threads;    /* pread mode threads; 0 = min(queue_depth, 8) */
    uint32_t             prefetch_age;  /* tokens a queued prefetch stays valid; 0 = 1 */
    uint32_t             warmup_tokens; /* trace warm-up; 0 = 8 */
    bool                 no_memfd;      /* pool in MAP_SHARED|MAP_ANONYMOUS, not a memfd */
    bool                 mmap_advise;   /* io mmap: madvise(WILLNEED) each requested bundle (our
                                           routing's knowledge given to the page cache); off =
                                           plain page faults, as llama.cpp */
    uint64_t staging_bytes; /* for the plan: device pools' staging (fetcher_devpool_local_open) */
};

/* Creates a fetcher for model `m` (parsed from `g`, both borrowed: they must outlive it): lays out
 * the slots, sizes the pool (opts->n_slots, or the plan for opts->ram_budget), opens O_DIRECT
 * descriptors, starts the I/O thread. Returns 0, COMMON_EINVAL (dense model, model parsed from
 * memory, bad option), COMMON_ERANGE (budget too small: the minimum is named in e),
 * COMMON_ENOTSUP (io_uring forced but unavailable), COMMON_ENOMEM, COMMON_EIO, with a message.
 * `o` may be NULL. */
int fetcher_create(const struct common_gguf *g, const struct common_model *m,
                   const struct fetcher_opts *o, struct fetcher **out, struct common_errmsg *e);

/* Stops the I/O thread (waiting for reads in flight; their waiters are answered), answers every
 * asynchronous acquire still waiting with COMMON_ECLOSED (on the calling thread), and frees
 * everything; accepts NULL. Every loan must have been released (or be released by those
 * callbacks), and no other thread may call into f meanwhile. */
void fetcher_destroy(struct fetcher *f);

/* Asks for the bundle of expert `expert` of layer `layer` without waiting. A demand or
 * post-fetch counts as an access for the trace; a prefetch is a hint (dropped when stale or
 * when no slot is free to spare). A queued lower-priority load of the same bundle is promoted.
 * Returns 0 (resident, loading or queued), COMMON_EINVAL (ids out of range), COMMON_EAGAIN (no
 * slot could be freed: every slot is pinned or loading; prefetches are then dropped). */
int fetcher_request(struct fetcher *f, uint32_t layer, uint32_t expert, enum fetcher_priority prio);

/* Waits until part `part` of expert `expert` of layer `layer` is in the pool (loading it as a
 * demand if absent; gate and up may be handed out while down is still being read), pins its
 * slot and stores the bytes (rows x cols of the part's type, exactly the span in the file) in
 * *data and the loan id in *loan. The bytes stay valid and unchanged until
 * fetcher_release(f, *loan). Returns 0, COMMON_EINVAL (ids out of range), COMMON_EAGAIN (every
 * slot is pinned), COMMON_EIO (the read failed; fetcher_last_error() names file, offset and
 * errno; the slot went back to FREE). Outputs are unchanged on failure. */
int fetcher_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                    enum common_expert_part part, const void **data, uint32_t *loan);

/* Outcome of fetcher_acquire_async(): rc 0 with the part's bytes in `data` (valid until
 * fetcher_release(f, loan)), or a negative common_err with data NULL and loan FETCHER_LOAN_NONE.
 * Runs on the thread that called fetcher_acquire_async() (an answer known at once) or on the
 * fetcher's I/O thread, never with a fetcher lock held: it must not block (it holds up every
 * other read's completion), it may take its own locks, call fetcher_release() and call
 * fetcher_acquire_async() again; it must not call fetcher_destroy(). */
typedef void (*fetcher_acquire_cb)(void *arg, int rc, const void *data, uint32_t loan);

/* fetcher_acquire() without the wait: the access is traced the same way and an absent bundle is
 * loaded as a demand (a queued or in-flight load of it is promoted), then `cb(arg, ...)` is
 * called exactly once with the outcome. Before this returns when the answer is known now: the
 * part is readable (rc 0, pinned) or every slot is pinned and none is loading (COMMON_EAGAIN);
 * in mmap mode always (rc 0, loan FETCHER_LOAN_NONE). Otherwise later, on the I/O thread: rc 0
 * once the part is read (gate and up may be answered while down is still in flight), COMMON_EIO
 * when the load failed (fetcher_last_error() says why), COMMON_EAGAIN when every slot ends up
 * pinned with none loading, or COMMON_ECLOSED from fetcher_destroy() for a call still waiting
 * then. When no slot can be claimed but loads are in flight or failed slots await their last
 * release, the call waits for a completion or a release and tries again. Returns 0 (accepted),
 * COMMON_EINVAL (ids out of range, NULL cb) or COMMON_ENOMEM (no memory for the waiter); cb is
 * not called then. No allocation in steady state (waiter nodes are reused). Thread-safe. */
int fetcher_acquire_async(struct fetcher *f, uint32_t layer, uint32_t expert,
                          enum common_expert_part part, fetcher_acquire_cb cb, void *arg);

/* fetcher_acquire() when part `part` is readable in the pool right now: pins it and returns 0
 * (the access counts as with fetcher_acquire()). Otherwise returns COMMON_EAGAIN at once (absent,
 * loading or failed: nothing is pinned, nothing is loaded; call fetcher_acquire() to wait), or
 * COMMON_EINVAL (ids out of range). In mmap mode the same as fetcher_acquire(). */
int fetcher_try_acquire(struct fetcher *f, uint32_t layer, uint32_t expert,
                        enum common_expert_part part, const void **data, uint32_t *loan);

/* Counts the use of `n_parts` parts of (layer, expert) that its reader made straight from the
 * shared pool, without a loan (another process reading a READY slot seqlock style): the access
 * is traced and the slot's recency and frequency are updated as n_parts acquires would. Returns
 * 0, COMMON_ENOENT (the expert is no longer READY: only the access is traced), COMMON_EINVAL
 * (ids out of range, n_parts 0). */
int fetcher_note_use(struct fetcher *f, uint32_t layer, uint32_t expert, uint32_t n_parts);

/* True when every part of the bundle of expert `expert` of layer `layer` is in the pool now
 * (an acquire would not wait); in mmap mode always true (the page cache is not asked). False for
 * ids out of range. Does not count as an access. */
bool fetcher_is_ready(struct fetcher *f, uint32_t layer, uint32_t expert);

/* Ends one loan made by fetcher_acquire(), fetcher_try_acquire() or fetcher_acquire_async().
 * FETCHER_LOAN_NONE is ignored. Never runs a callback; when asynchronous acquires wait for a
 * slot it wakes the I/O thread, which retries them. */
void fetcher_release(struct fetcher *f, uint32_t loan);

/* Marks the start of a token (a decode step or one forward pass of a batch): splits faults per
 * token and ages queued prefetches. Without explicit marks, a demand for a lower layer than the
 * previous one starts a new token. */
void fetcher_token_begin(struct fetcher *f);

/* The trace this fetcher records into (owned by f; valid until fetcher_destroy). */
struct fetcher_trace *fetcher_get_trace(struct fetcher *f);
/* The plan used to size the pool (zeroed except slot_bytes / n_slots without a budget). */
const struct fetcher_plan *fetcher_get_plan(const struct fetcher *f);
/* The I/O mode actually used (AUTO resolved), and whether O_DIRECT is in use for split 0. */
enum fetcher_io_mode fetcher_get_io_mode(const struct fetcher *f);
bool                 fetcher_is_direct(const struct fetcher *f);
/* Copies the message of the latest read error into `out` (empty when none). */
void fetcher_last_error(struct fetcher *f, struct common_errmsg *out);
/* Copies the message of the latest failed load of expert `expert` of `layer` into `out`: the
 * file, offset and why (empty when none of the latest few failures was that bundle's). */
void fetcher_expert_error(struct fetcher *f, uint32_t layer, uint32_t expert,
                          struct common_errmsg *out);

/* Pool state, for tests and stats: slots, slot size, and how many slots are in each state. */
struct fetcher_pool_counts {
    uint32_t n_slots, n_free, n_loading, n_ready, n_failed, n_pinned;
    uint32_t n_retired; /* given up for good (fetcher_shrink_pool); in no other count */
    uint64_t slot_bytes;
};
void fetcher_get_pool_counts(struct fetcher *f, struct fetcher_pool_counts *out);

/* Shrinks the pool to n_keep usable slots (at least 1; never grows it back): free slots are
 * given up first, then the policy's victims among those not pinned (traced as evictions), their
 * memory returned to the system; slots pinned or loading now are given up at the next tokens.
 * Returns the slots given up so far. Thread-safe. */
uint32_t fetcher_shrink_pool(struct fetcher *f, uint32_t n_keep);

/* The pool segment, for handing it to another process: its memfd (owned by f: do not close;
 * -1 in mmap mode or with no_memfd), the start of its mapping in this process (NULL in mmap mode)
 * and its length in bytes. A loan's bytes lie at (data - base) from the segment start. */
int         fetcher_get_pool_fd(const struct fetcher *f);
const void *fetcher_get_pool_base(const struct fetcher *f);
uint64_t    fetcher_get_pool_bytes(const struct fetcher *f);

/* ------------------------------------------------------------------------------------------ */
/* A device expert pool of this process (fetcher/devpool.c)                                    */
/* ------------------------------------------------------------------------------------------ */

/* One process (sluice run -ngl N --vram-budget SIZE under --ram-budget) fills its device pool of
 * experts as a fetcher daemon fills an executor's: the misses that its RAM pool does not hold are
 * read from storage into FETCHER_DEVPOOL_STAGE_SLOTS pinned staging slots of the plan's slot size
 * (fetcher_opts.staging_bytes counts them) and copied from there, on the pool's own thread and
 * copy stream, the RAM pool keeping what it holds. The calls follow struct executor_dev_ops
 * (executor.h), which the caller implements with them; any thread may make them. */
#define FETCHER_DEVPOOL_STAGE_SLOTS 8u /* bundles in flight at once */

struct fetcher_devpool; /* also a fetcher daemon's (fetcher/devpool.h) */

struct fetcher_devpool_counts {
    uint64_t opens;        /* pools made */
    uint64_t refused;      /* OPENs refused (budget, no device, bad message) */
    uint64_t pieces;       /* pieces of device memory made and handed over */
    uint64_t copies;       /* DEV_COPYs queued */
    uint64_t copied_bytes; /* their bytes */
    uint64_t marks;        /* DEV_MARKs recorded */
    uint64_t waits;        /* DEV_WAITs queued */
    uint64_t bad;          /* device records refused (no pool, out of range, device error) */
    uint64_t bytes;        /* the open pool's device memory mapped now */
    uint64_t copy_busy_ns; /* the copy stream's time copying (this process's, all pools) */
    uint64_t staged;       /* DEV_READs served: parts copied from staging */
    uint64_t stage_reads;  /* bundles read from storage into staging */
    uint64_t stage_bytes;  /* their bytes read */
    uint64_t stage_hits;   /* DEV_READs of a bundle already in staging (no read) */
    uint64_t stage_failed; /* bundles whose read or check failed */
    bool     open;         /* a pool is open now */
    bool     pinned;       /* the RAM pool is registered with the device as pinned memory */
};

/* The counters of struct fetcher_devpool_counts that add up over several pools, as X(field). */
#define FETCHER_DEVPOOL_SUMS(X)                                                                    \
    X(opens)                                                                                       \
    X(refused) X(bytes) X(pieces) X(copies) X(copied_bytes) X(marks) X(waits) X(bad) X(staged)     \
        X(stage_reads) X(stage_bytes) X(stage_hits) X(stage_failed)

/* What fetcher_devpool_local_open made. */
struct fetcher_devpool_local {
    uint8_t                    *base; /* reserved: bytes, mapped piece by piece (_piece) */
    uint64_t                    bytes, gran;
    struct common_devmem_event *kev;        /* the caller records it after its kernels (_after) */
    char                        backend[8]; /* common_devmem_backend() */
    bool                        stages;     /* _read may be used */
};

/* Staging bytes of one pool fed from storage, for fetcher_opts.staging_bytes. */
uint64_t fetcher_devpool_staging_bytes(const struct common_model *m);

/* Makes a pool of `bytes` (at most `budget`) on device dev with n_events events, copying from f's
 * RAM pool (which the caller registers with the device itself) and, with stage, reading from f's
 * storage into its own staging. 0, or a negative common_err with e (COMMON_EINVAL: f has no RAM
 * pool; COMMON_ERANGE: over the budget; COMMON_EDEVICE). Freed by fetcher_devpool_stop, which
 * waits for the copies queued. */
int fetcher_devpool_local_open(struct fetcher *f, bool stage, int dev, uint64_t bytes,
                               uint64_t budget, uint32_t n_events,
                               struct fetcher_devpool_local *out, struct fetcher_devpool **pool,
                               struct common_errmsg *e);
/* Maps piece k (gran bytes at base + k * gran). 0 or a negative common_err. */
int fetcher_devpool_local_piece(struct fetcher_devpool *d, uint32_t k, struct common_errmsg *e);
/* Queues the copy of `bytes` from src (in a loan of f, held until a later mark is ready and its
 * event done) to base + dst. 0, COMMON_EINVAL (src not in the RAM pool), COMMON_ENOMEM. */
int fetcher_devpool_local_copy(struct fetcher_devpool *d, uint64_t dst, const void *src,
                               uint64_t bytes);
/* Queues the read of (layer, expert)'s bundle into staging (unless there already) and the copy
 * of part `part` (`bytes`) from there to base + dst. 0, COMMON_EINVAL (a pool that does not
 * stage), COMMON_ENOMEM; a read or copy that fails makes the next ready COMMON_EIO. */
int fetcher_devpool_local_read(struct fetcher_devpool *d, uint32_t layer, uint32_t expert,
                               enum common_expert_part part, uint64_t dst, uint64_t bytes);
/* Event k is to be recorded after the copies queued so far. 0 or a negative common_err. */
int fetcher_devpool_local_mark(struct fetcher_devpool *d, uint32_t k);
/* Waits until event k's last mark is recorded: *ev is event k to wait for (NULL: no mark since
 * the last ready). 0, or COMMON_EIO: the same, but a copy or read queued since the last look
 * failed (its part is not there). */
int fetcher_devpool_local_ready(struct fetcher_devpool *d, uint32_t k,
                                struct common_devmem_event **ev);
/* The copies queued next wait for kev (recorded by the caller just before). 0 or COMMON_ENOMEM. */
int fetcher_devpool_local_after(struct fetcher_devpool *d);
/* Nanoseconds the copy stream spent copying into the pool, as of the last mark. */
uint64_t fetcher_devpool_local_copy_ns(struct fetcher_devpool *d);
/* The pool's counters (a daemon's too). */
void fetcher_devpool_counts(struct fetcher_devpool *d, struct fetcher_devpool_counts *out);
/* Stops the pool (a daemon's: its socket too), its copies waited for. Accepts NULL. */
void fetcher_devpool_stop(struct fetcher_devpool *d);

/* ------------------------------------------------------------------------------------------ */
/* Storage limit probe (fetcher/probe.c)                                                       */
/* ------------------------------------------------------------------------------------------ */

/* An expert of one layer, as the load log records it and a replay probe reads it. */
struct fetcher_probe_key {
    uint32_t layer, expert;
};

struct fetcher_probe_opts {
    enum fetcher_io_mode io;          /* AUTO, URING or PREAD: the engine the fetcher uses */
    enum fetcher_direct  direct;      /* 0 = O_DIRECT where possible, as the fetcher */
    uint32_t             queue_depth; /* reads in flight; 0 = 32 */
    uint64_t             max_bytes;   /* stop after about this many bytes; 0 = 1 GiB (random
                                         order only: a replay reads every key) */
    uint64_t seed;                    /* order of the reads; 0 = 1 */
    /* Replay: read the three parts of each of these experts, in this order (repeats included),
     * instead of every part once in a random order. Borrowed. */
    const struct fetcher_probe_key *keys;
    uint64_t                        n_keys;
};

struct fetcher_probe_result {
    double               bytes_per_s; /* storage bytes read per second */
    uint64_t             bytes;       /* storage bytes read (aligned ranges when direct) */
    uint64_t             reads;       /* expert parts read */
    uint64_t             read_bytes;  /* mean bytes per read */
    double               seconds;
    uint32_t             queue_depth;
    enum fetcher_io_mode mode; /* engine used (AUTO resolved) */
    bool                 direct;
};

/* Measures the read bandwidth the fetcher can get from the model's storage: expert parts (the
 * read size the fetcher uses), each at most once in a random order, through the same engine at
 * o->queue_depth reads in flight, until o->max_bytes or every part is read. Drop the page cache
 * first for a buffered engine. Returns 0, COMMON_EINVAL (dense model, mmap mode), COMMON_ENOTSUP
 * (io_uring forced but unavailable), COMMON_EIO (a read failed: named in e), COMMON_ENOMEM.
 * Thread-safe for distinct calls (own engine and buffers). */
int fetcher_probe_read(const struct common_gguf *g, const struct common_model *m,
                       const struct fetcher_probe_opts *o, struct fetcher_probe_result *out,
                       struct common_errmsg *e);

/* Load log: from fetcher_load_log_start() on, the key of every completed load is recorded (at
 * most `cap`, in completion order), so that a benchmark can replay a run's reads with the probe
 * (o->keys) and get the storage limit for exactly those reads. start returns 0, COMMON_EINVAL,
 * COMMON_ENOMEM (and restarts an active log); count returns the keys recorded so far; take hands
 * over the array (free() it; NULL when none) and stops the log. Thread-safe. */
int      fetcher_load_log_start(struct fetcher *f, uint64_t cap);
uint64_t fetcher_load_log_count(struct fetcher *f);
uint64_t fetcher_load_log_take(struct fetcher *f, struct fetcher_probe_key **out);

/* ------------------------------------------------------------------------------------------ */
/* The fetcher daemon: control socket, pool fd (fetcher/serve.c), executor rings (link.c)      */
/* ------------------------------------------------------------------------------------------ */

/* --vram-fill: where the experts the device pool misses come from. */
enum fetcher_vram_fill {
    FETCHER_VRAM_FILL_AUTO = 0, /* storage when this fetcher's RAM pool is no bigger than its
                                   share of the device pool (an inclusive RAM tier that small only
                                   duplicates it), else ram */
    FETCHER_VRAM_FILL_RAM,      /* through the RAM pool: read into a slot, copied from there */
    FETCHER_VRAM_FILL_STORAGE,  /* those not in the RAM pool read from storage into pinned
                                   staging and copied from there; the RAM pool keeps its own */
};
extern const char *const fetcher_vram_fill_names[]; /* "auto", "ram", "storage", NULL */
/* The --vram-fill option (target: an enum fetcher_vram_fill), with the caller's help line. */
#define FETCHER_VRAM_FILL_OPT(tgt, help_)                                                          \
    {                                                                                              \
        .name = "vram-fill", .type = COMMON_OPT_CHOICE, .target = (tgt),                           \
        .choices = fetcher_vram_fill_names, .help = (help_), .def = "auto"                         \
    }

struct fetcher_serve_opts {
    const char *model_path; /* borrowed: GGUF file (first split); required */
    const char *run_dir;    /* borrowed: run directory; created 0700 when missing; required */
    uint32_t    shard;      /* this fetcher's index i, < n_shards */
    uint32_t    n_shards;   /* N fetchers; 0 = 1 */
    int         shard_by;   /* 1 (--shard-by file): fetcher i serves the experts stored in the i-th
                               directory of the model's files (GGUF splits or QSF bundle files, their real
                               paths): one fetcher per device; 2 (--shard-by layer): every expert of
                               a range of layers (one fetcher per GPU); 0: a range of experts of
                               every layer */
    uint32_t    n_layer_split; /* --layer-split, with shard_by 2: each fetcher's share of the layers
                                  (n_shards of them); 0 = even */
    float    layer_split[PROTO_MAX_SHARDS];
    uint64_t ram_budget;    /* budget of the whole system; 0 = none (see n_slots) */
    uint32_t n_slots;       /* explicit pool slots (overrides the budget); 0 = from the budget,
                               or one slot per bundle of the shard without a budget */
    uint32_t
        n_ctx; /* executor context per sequence, for the KV estimate; 0 = the executor's default */
    uint32_t n_seq;                    /* executor sequences, for the KV estimate; 0 = 4 */
    uint32_t n_device_layers;          /* the executor's last layers whose KV lives on a device
                                          (sluicectl up -ngl): left out of the KV estimate */
    enum common_cache_type cache_type; /* the executor's KV cache type, for the KV estimate */
    uint64_t device_scratch; /* RAM of each executor sequence's device scratch on the CPU (the
                                CPU backend's, the CPU device's: sluicectl up, from
                                sluice-executor --probe-device), in the plan; 0 = none */
    uint32_t               n_threads;  /* executor threads, for its per-thread scratch in the
                                          plan; 0 = the CPUs online */
    enum fetcher_policy  policy;       /* 0 = LRU */
    enum fetcher_io_mode io;           /* AUTO, URING or PREAD (MMAP is refused: no pool) */
    uint32_t             queue_depth;  /* reads in flight; 0 = 32 */
    FILE                *plan_out;     /* borrowed: the plan is printed here; NULL = silent */
    const char          *trace_out;    /* borrowed: trace JSON written at stop; NULL = none */
    FILE                *summary_out;  /* borrowed: trace summary printed at stop; NULL = none */
    bool                 no_pidfile;   /* do not write RUN_DIR/fetcher-I.pid (tests) */
    uint64_t vram_budget; /* > 0: serve a device expert pool of at most this many bytes to the
                             executor (RUN_DIR/fetcher-I.dev; fetcher/devpool.h) */
    enum fetcher_vram_fill vram_fill; /* how the device pool's misses arrive; 0 = auto */
    uint32_t device_pools; /* device pools served at once, one per executor device (sockets
                              proto_devpool_path k), each up to vram_budget; 0 = 1 */
};

/* A running fetcher service. Opaque. */
struct fetcher_server;

/* Opens the model, sizes this shard's pool (printing the plan to o->plan_out), creates the
 * fetcher, then listens on ipc://RUN_DIR/fetcher-I.ctl (control messages, proto/wire.h) and on
 * the Unix socket RUN_DIR/fetcher-I.pool (hands the pool memfd, tag = instance id), and writes
 * RUN_DIR/fetcher-I.pid. An executor ATTACHes its ring pair (proto/records.h) to be served.
 * Returns 0; COMMON_EINVAL (bad option, dense model, run dir unusable), COMMON_ERANGE (budget too
 * small: e names the minimum), COMMON_ENOENT / COMMON_EIO / COMMON_ECORRUPT / COMMON_ENOTSUP
 * (model file), COMMON_EBUSY (another live fetcher I in the run dir), COMMON_ENOMEM; e says what.
 */
int fetcher_serve_start(const struct fetcher_serve_opts *o, struct fetcher_server **out,
                        struct common_errmsg *e);

/* The control service of the fetcher (owned by s): proto_service_run() waits for SHUTDOWN or a
 * signal. */
struct proto_service *fetcher_serve_service(struct fetcher_server *s);

/* Stops: refuses new work, drops the executor link (releasing its loans), closes the sockets
 * and removes the socket and pid files, writes the trace JSON and summary if asked, frees
 * everything (ACQUIREs still waiting for a read go unanswered). Returns 0, or COMMON_EIO when
 * the trace file could not be written (named in e; everything is freed anyway). Accepts NULL. */
int fetcher_serve_stop(struct fetcher_server *s, struct common_errmsg *e);

/* The fetcher behind the service (owned by s; valid until fetcher_serve_stop). */
struct fetcher *fetcher_serve_fetcher(struct fetcher_server *s);

/* The experts this fetcher serves: [*first, *first + *n) of every layer. */
void fetcher_serve_shard(const struct fetcher_server *s, uint32_t *first, uint32_t *n);

/* Counters of the data plane. */
struct fetcher_serve_counts {
    uint64_t acquires;       /* ACQUIREs answered with a loan */
    uint64_t acquire_errors; /* ACQUIREs answered with an error status */
    uint64_t releases;       /* RELEASEs of loans the link held */
    uint64_t hints;          /* HINTs passed to fetcher_request */
    uint64_t uses;           /* USEs (direct reads of the pool) passed to fetcher_note_use */
    uint64_t tokens;         /* TOKENs */
    uint64_t bad_records;    /* records refused: unknown op, ids out of range, foreign shard,
                                bad length, a RELEASE of a loan the link does not hold */
    uint64_t attaches;       /* links accepted */
    uint64_t links_dropped;  /* links ended (replaced, peer gone, ring corrupt, stop) */
    uint64_t link_pins;      /* loans the current link holds now */
    uint64_t pool_fds_sent;  /* pool descriptors handed out */
};
void fetcher_serve_counts(struct fetcher_server *s, struct fetcher_serve_counts *out);

#endif /* FETCHER_FETCHER_H */
