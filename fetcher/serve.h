/* fetcher/serve.h - the fetcher daemon's service: control socket, pool fd, executor rings. */
#ifndef FETCHER_SERVE_H
#define FETCHER_SERVE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "fetcher.h"

/* Sizes of the executor's KV caches and scratch for `n_seq` sequences of `n_ctx` positions, so
 * the plan counts what the executor will allocate (the daemon asks the executor library; tests
 * may leave it NULL). Returns 0 or a negative common_err. */
typedef int (*fetcher_serve_mem_fn)(const struct common_hparams *hp, uint32_t n_ctx, uint32_t n_seq,
                                    uint64_t *kv_bytes, uint64_t *act_bytes);

struct fetcher_serve_opts {
    const char *model_path; /* borrowed: GGUF file (first split); required */
    const char *run_dir;    /* borrowed: run directory; created 0700 when missing; required */
    uint32_t    shard;      /* this fetcher's index i, < n_shards */
    uint32_t    n_shards;   /* N fetchers; 0 = 1 */
    uint64_t    ram_budget; /* budget of the whole system; 0 = none (see n_slots) */
    uint32_t    n_slots;    /* explicit pool slots (overrides the budget); 0 = from the budget,
                               or one slot per bundle of the shard without a budget */
    uint32_t
        n_ctx; /* executor context per sequence, for the KV estimate; 0 = the executor's default */
    uint32_t             n_seq;        /* executor sequences, for the KV estimate; 0 = 1 */
    fetcher_serve_mem_fn mem_estimate; /* KV/activation estimate; NULL = no KV in the plan */
    enum fetcher_policy  policy;       /* 0 = LRU */
    enum fetcher_io_mode io;           /* AUTO, URING or PREAD (MMAP is refused: no pool) */
    uint32_t             queue_depth;  /* reads in flight; 0 = 32 */
    uint32_t             n_workers;    /* threads running ACQUIREs; 0 = 8 */
    FILE                *plan_out;     /* borrowed: the plan is printed here; NULL = silent */
    const char          *trace_out;    /* borrowed: trace JSON written at stop; NULL = none */
    FILE                *summary_out;  /* borrowed: trace summary printed at stop; NULL = none */
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

/* Waits up to timeout_ms (< 0 = forever) for a SHUTDOWN request; true when one came. */
bool fetcher_serve_wait(struct fetcher_server *s, int timeout_ms);

/* Stops: refuses new work, drops the executor link (releasing its loans), waits for the worker
 * threads, closes the sockets and removes the socket and pid files, writes the trace JSON and
 * summary if asked, frees everything. Returns 0, or COMMON_EIO when the trace file could not be
 * written (named in e; everything is freed anyway). Accepts NULL. */
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

#endif /* FETCHER_SERVE_H */
