/* router/serve.h - the router service: client API on router.sock, step scheduler over the
 * executor's rings. */
#ifndef ROUTER_SERVE_H
#define ROUTER_SERVE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"

struct router_serve_opts {
    const char *model_path;        /* -m: GGUF holding the tokenizer and chat template */
    const char *run_dir;           /* --run-dir: executor.ctl, router.sock, segments */
    uint32_t    n_ctx;             /* -c: positions per sequence; 0 = min(4096, model's) */
    uint32_t    n_seq;             /* --parallel: sequences at once; 0 = 4 */
    uint32_t    queue_max;         /* --queue: requests waiting for a sequence; 0 = 64 */
    uint32_t    client_timeout_s;  /* --client-timeout: drop a request nobody polls; 0 = 60 */
    uint32_t    connect_timeout_s; /* --connect-timeout: wait for the executor; 0 = 30 */
    uint32_t    poll_default_ms;   /* long poll when the client says 0; 0 = 2000 */
    uint32_t    stream_ms;         /* --stream-interval: a streaming poll answered less than this
                                      long ago waits out the rest of the interval to gather tokens
                                      (one round trip per interval, not per token); 0 = none */
    uint32_t    exec_wait_ms;      /* ring wait before checking the executor; 0 = 200 */
    const char *listen_url;        /* NULL = "ipc://RUN_DIR/router.sock" */
    const char *executor_url;      /* NULL = "ipc://RUN_DIR/executor.ctl" */
};

struct router_serve;

/* Loads the tokenizer, waits for the executor (HELLO) up to connect_timeout_s, creates and
 * ATTACHes the four router-exec segments, starts the scheduler and listens. Returns 0, or a
 * negative common_err with a message in e (bad model, executor missing, socket busy). */
int router_serve_create(const struct router_serve_opts *o, struct router_serve **out,
                        struct common_errmsg *e);

/* Stops taking new requests (GENERATE -> COMMON_EBUSY); queued and active ones finish. */
void router_serve_drain(struct router_serve *s);

/* True once a SHUTDOWN message asked the service to exit. */
bool router_serve_shutdown_requested(struct router_serve *s);

/* Waits up to timeout_ms (< 0 = forever) until no request is queued or active, or a SHUTDOWN
 * was asked for and the work drained. Returns true when idle. */
bool router_serve_wait_idle(struct router_serve *s, int timeout_ms);

/* Sleeps until SHUTDOWN arrives or `stop` (set from a signal handler) becomes true, polling
 * every 100 ms. */
void router_serve_wait_stop(struct router_serve *s, volatile sig_atomic_t *stop);

/* The url it listens on (static while s lives). */
const char *router_serve_url(const struct router_serve *s);

/* Stops listening and the scheduler, removes router.sock's file and the segments, frees;
 * accepts NULL. Call router_serve_drain() + router_serve_wait_idle() first for a clean exit. */
void router_serve_destroy(struct router_serve *s);

#endif /* ROUTER_SERVE_H */
