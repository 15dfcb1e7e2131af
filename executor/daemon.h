/* executor/daemon.h - the executor as a daemon: experts from fetcher daemons, steps for the router.
 */
#ifndef EXECUTOR_DAEMON_H
#define EXECUTOR_DAEMON_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "executor.h"
#include "proto.h"

/* ------------------------------------------------------------------------------------------ */
/* Expert source backed by fetcher daemons (executor/remote.c)                                 */
/* ------------------------------------------------------------------------------------------ */

/* Links to N fetcher daemons of one run directory (pipeline-brief.md): for each, HELLO on
 * ipc://RUNDIR/fetcher-<i>.ctl (version, pid, instance, shard map), the pool memfd received over
 * RUNDIR/fetcher-<i>.pool and mapped read-only, a ring pair exec-fetch-<i>.req/.rep created in
 * RUNDIR and announced with ATTACH. One reader thread per fetcher pops replies, watches the
 * fetcher (kill(pid, 0) every 200 ms of silence, HELLO now and then) and relinks after a restart:
 * new pool mapped (old mappings kept while loans on them are out), fresh rings, ACQUIREs in
 * flight sent again. Opaque; every function is thread-safe. */
struct executor_remote;

struct executor_remote_opts {
    const char                *run_dir;            /* required; borrowed during create */
    uint32_t                   n_fetchers;         /* 1..PROTO_MAX_SHARDS; 0 = 1 */
    const struct common_model *model;              /* required; borrowed: must outlive it */
    uint32_t                   connect_timeout_ms; /* startup and relink deadline; 0 = 30 s */
    uint32_t                   acquire_timeout_ms; /* an ACQUIRE unanswered by a live fetcher;
                                                      0 = 120 s */
    uint64_t                     instance;         /* this executor's instance id, for ATTACH */
    const volatile sig_atomic_t *cancel; /* borrowed: the startup wait gives up (COMMON_ECLOSED)
                                            once *cancel is set (a signal); NULL = never */
    bool direct_reads; /* read READY parts of a settled pool in place instead of pinning them
                          through an ACQUIRE (never under ThreadSanitizer); experimental */
};

/* Connects to every fetcher (retrying until the deadline), checks that their shards cover each
 * expert of the model exactly once and starts the reader threads. Returns 0, COMMON_ETIMEDOUT
 * (a fetcher did not answer in time: named in e), COMMON_EPROTO (bad HELLO, version, shard map,
 * pool or ATTACH refused: named), COMMON_EINVAL, COMMON_ENOMEM, COMMON_EIO. */
int executor_remote_create(const struct executor_remote_opts *o, struct executor_remote **out,
                           struct common_errmsg *e);
/* Stops the readers, closes the links, removes the ring files it created, unmaps the pools.
 * Every loan must have been released. Accepts NULL. */
void executor_remote_destroy(struct executor_remote *r);

/* The expert source to give executor_weights_stream_create() (arg = r: r must outlive it). */
void executor_remote_source(struct executor_remote *r, struct executor_expert_source *out);

/* The shard map in use (one entry per fetcher, by fetcher index); returns the count. */
uint32_t executor_remote_shards(struct executor_remote *r, struct proto_shard *out, uint32_t cap);

/* Number of fetchers not linked right now (0 = all serving). */
uint32_t executor_remote_n_down(struct executor_remote *r);

/* Counters of one fetcher link. */
struct executor_remote_stats {
    uint64_t acquires;    /* ACQUIREs answered with a loan */
    uint64_t errors;      /* ACQUIREs failed (fetcher error, bad reply, timeout, link down) */
    uint64_t wait_ns;     /* time spent waiting for ACQUIRE replies */
    uint64_t hints;       /* HINTs sent */
    uint64_t direct;      /* parts read in place from the pool (no ACQUIRE, no pin) */
    uint64_t torn;        /* direct reads whose slot was reused meanwhile (computed again) */
    uint64_t relinks;     /* restarts of the fetcher followed */
    uint64_t bad_replies; /* replies refused (unknown tag, out-of-bounds offsets) */
    bool     up;          /* linked now */
};
/* Copies the counters of fetcher `i`; returns 0 or COMMON_EINVAL. */
int executor_remote_stats(struct executor_remote *r, uint32_t i, struct executor_remote_stats *out);

/* ------------------------------------------------------------------------------------------ */
/* Step service for the router (executor/serve.c)                                              */
/* ------------------------------------------------------------------------------------------ */

/* The control socket ipc://RUNDIR/executor.ctl (HELLO, STATS, HEALTH, DRAIN, SHUTDOWN,
 * CONFIGURE, LOAD_MODEL, ATTACH) and one step thread serving the router's step rings (EVAL,
 * FREE) with one executor_ctx per sequence. Opaque. */
struct executor_serve;

struct executor_serve_opts {
    const char                  *run_dir;    /* required; borrowed during start */
    const char                  *model_path; /* what LOAD_MODEL compares; borrowed during start */
    const char                  *name;       /* HELLO name; NULL = "executor" */
    const struct executor_model *model;      /* borrowed: must outlive the service */
    struct executor_remote      *remote;     /* borrowed, NULL for a dense model */
    struct executor_pool        *pool;       /* borrowed: threads of the forward pass */
    uint32_t                     n_seq;      /* sequences (contexts); 0 = 4 */
    uint32_t                     n_ctx;      /* positions per sequence; 0 = min(train, 4096) */
    uint32_t                     n_batch;    /* 0 = 512 */
    enum executor_cache_type     cache_type;
    uint64_t                     instance;   /* 0 = derived from the clock and pid */
    bool                         no_pidfile; /* do not write RUNDIR/executor.pid (tests) */
};

/* Creates the contexts, writes the pid file, starts the step thread and listens on
 * ipc://RUNDIR/executor.ctl. Returns 0, COMMON_EBUSY (another executor listens there),
 * COMMON_EINVAL (options unusable for the model: named in e), COMMON_ENOMEM, COMMON_EIO. */
int executor_serve_start(const struct executor_serve_opts *o, struct executor_serve **out,
                         struct common_errmsg *e);
/* True once a SHUTDOWN request was answered (the caller then stops the service). */
bool executor_serve_shutdown_requested(struct executor_serve *s);
/* Stops taking new work (ATTACH refused; steps already queued are served). */
void executor_serve_drain(struct executor_serve *s);
/* Stops listening and the step thread (finishing the step in progress), closes the router link,
 * removes the socket and pid file. Accepts NULL. */
void executor_serve_stop(struct executor_serve *s);
/* The n_ctx and n_seq in use (after defaults). */
uint32_t executor_serve_n_ctx(const struct executor_serve *s);
uint32_t executor_serve_n_seq(const struct executor_serve *s);
/* The service's instance id. */
uint64_t executor_serve_instance(const struct executor_serve *s);

#endif /* EXECUTOR_DAEMON_H */
