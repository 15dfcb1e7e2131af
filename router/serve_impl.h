/* router/serve_impl.h - private to router/: the router service's state, shared by its files. */
#ifndef ROUTER_SERVE_IMPL_H
#define ROUTER_SERVE_IMPL_H

/* Not for use outside router/: other folders go through struct router_serve in router.h. The
 * service is split along its seams: serve.c (lifetime, control, dispatch), sched.c (requests and
 * the scheduler thread), exec_link.c (the executor's handshake and rings), handlers.c (the
 * client API: GENERATE, POLL, CANCEL), http.c and openai.c (OpenAI-compatible HTTP over the
 * same requests). */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "common.h"
#include "proto.h"
#include "router.h"

#define SERVE_COMP        "router"
#define SERVE_MAX_POLL_MS 30000u
/* A finished request whose final events went out to a client that acknowledges (protocol 0.2)
 * stays this long after its last poll, so a retry of a lost final reply gets it again. */
#define SERVE_DONE_LINGER_MS 10000u
#define SERVE_SEG_REQ        0
#define SERVE_SEG_REP        1
#define SERVE_SEG_TOKENS     2
#define SERVE_SEG_LOGITS     3
#define SERVE_N_SEG          4

/* How long a wait for the executor may go without a pass of its loops before the watchdog takes
 * it for stuck in a call (the longest call of a pass, ATTACH, gives up after 10 s). */
#define SERVE_WEDGE_S 20u

enum rq_state { RQ_QUEUED, RQ_ACTIVE, RQ_DONE };

/* One generation request. Fields marked (sched) belong to the scheduler thread once the request
 * is active; the rest are guarded by the service mutex. Only the scheduler frees requests. */
struct rq {
    struct rq    *next;
    uint64_t      id;
    uint64_t      fingerprint; /* of the GENERATE: a re-sent one is recognised */
    enum rq_state state;
    int           seq; /* slot while active, else -1 */
    /* set by the GENERATE handler, read-only afterwards */
    struct proto_sampling sampling;
    float                 presence_penalty;  /* HTTP requests only (GENERATE carries none) */
    float                 frequency_penalty; /* HTTP requests only */
    uint32_t              max_tokens;
    char                 *stops[PROTO_MAX_STOPS];
    uint32_t              n_stops;
    bool                  stream;
    uint32_t              n_prompt;
    uint32_t              n_resume; /* tokens after the prompt in `all` the client already has
                                       (a GENERATE resumed after a router restart) */
    /* (sched) */
    struct router_tokens  all;    /* prompt, then every generated token */
    uint32_t              n_past; /* positions the executor holds for this request */
    uint64_t              tag;    /* step in flight, 0 = none */
    uint32_t              step_n; /* tokens of the step in flight */
    struct router_sampler sampler;
    bool                  sampler_ok, stop_ok;
    struct router_stop    stop;
    /* shared */
    struct router_tokens   ev_tokens; /* tokens not yet acknowledged (or polled, for 0.1) */
    struct router_tokens   ev_off;    /* end offset in ev_text of each pending token's text */
    struct router_text     ev_text;   /* text not yet acknowledged */
    uint64_t               ev_base_tokens, ev_base_bytes; /* acknowledged before ev_* */
    bool                   acks;       /* its client acknowledges (POLL with ack) */
    bool                   superseded; /* a new GENERATE took its id after it was delivered */
    bool                   done, delivered, counted;
    enum proto_stop_reason reason;
    int32_t                err_code;
    char                   err_text[PROTO_MAX_ERROR_TEXT];
    uint32_t               n_pollers;
    uint32_t               n_generated;
    uint64_t               last_seen_ns;
    uint64_t               last_reply_ns; /* the latest poll answered with tokens (0 = none) */
    bool                   gathering;     /* a poller waits out its stream interval: tokens do
                                             not wake it */
    uint64_t t_submit, t_start, t_prompt, t_end;
    uint64_t t_push; /* when the pending EVAL was pushed */
};

struct router_serve {
    struct router_serve_opts o;
    char                     run_dir[PROTO_MAX_PATH];
    char                     listen_url[PROTO_MAX_PATH + 64];
    char                     exec_url[PROTO_MAX_PATH + 64];
    struct router_vocab     *vocab;
    enum router_chat_tmpl    tmpl;
    char                     model_name[128]; /* general.name, "" when the model has none */
    uint32_t                 n_vocab, n_ctx, n_seq;
    uint64_t                 instance;

    /* executor link (scheduler thread after create) */
    struct proto_client       *exec;
    uint32_t                   exec_pid;
    uint64_t                   exec_instance;
    struct common_ring_segment seg[SERVE_N_SEG];
    struct common_ring         req_ring, rep_ring;
    int32_t                   *tokens; /* n_seq rows of n_ctx */
    float                     *logits; /* n_seq rows of n_vocab */
    uint64_t                   next_tag;

    pthread_mutex_t mu;
    pthread_cond_t  cv_events; /* a request got events or finished; work count changed */
    pthread_cond_t  cv_sched;  /* new work or a cancel */
    struct rq      *head;
    struct rq     **slots;
    uint32_t        n_queued, n_active;
    bool            draining, stopping, degraded;
    uint64_t c_submitted, c_done, c_cancelled, c_failed, c_dropped, c_prompt_tokens, c_gen_tokens,
        c_replays, c_exec_restarts;
    /* Step round trips: EVAL records answered, wall time from push to reply, and the executor's
     * own time for them (the difference is the cost of the rings and wake-ups). */
    uint64_t c_steps, step_wall_ns;   /* EVAL records answered; their push-to-reply times */
    uint64_t c_rounds, round_wall_ns; /* rounds (one executor batch each) and their wall time */
    double   step_exec_ms;

    pthread_t             sched;
    bool                  sched_started;
    _Atomic uint64_t      recover_beat_ns; /* the wait for the executor's last pass (0: none) */
    pthread_t             watch;           /* the watchdog (serve.c) */
    bool                  watch_started;
    atomic_bool           watch_stop; /* set once the scheduler was joined */
    struct proto_service *svc;        /* owned: router.sock (clients and control), pid file */
    struct router_http   *http;       /* owned: the HTTP front end (http.c); NULL without --http */
};

/* The router's counters (its STATS answer; `arg` is the struct router_serve). */
void router_serve_stats(void *arg, struct proto_stats_reply *st);

/* Names of the four router-exec segments in the run directory, by SERVE_SEG_*. */
extern const char *const router_serve_seg_names[SERVE_N_SEG];

/* Milliseconds from a to b (0 when b is not later). */
static inline double serve_ms_between(uint64_t a, uint64_t b)
{
    return b > a ? (double)(b - a) / 1e6 : 0.0;
}

/* An absolute CLOCK_MONOTONIC deadline `ms` from now (the service's condition variables use it). */
static inline void serve_deadline_after(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Sleeps `ms` milliseconds, through signals. */
static inline void serve_sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- requests (sched.c); each under s->mu unless said otherwise --------------------------- */

/* Frees a request and everything it owns; accepts NULL. */
void router_rq_free(struct rq *r);
/* The request with `id` that a client may still poll (a delivered one while it lingers), or
 * NULL. Under the lock. */
struct rq *router_rq_find(struct router_serve *s, uint64_t id);
/* Ends a request (the first reason wins) and wakes its pollers. Under the lock. */
void router_rq_finish(struct router_serve *s, struct rq *r, enum proto_stop_reason reason, int code,
                      const char *text);
/* Queues the text and token of one step for the pollers. Under the lock. */
int router_rq_emit(struct rq *r, const int32_t *id, const char *text, size_t len);

/* The scheduler thread: assigns queued requests to sequences, steps them on the executor, samples
 * and emits tokens, replays after an executor restart. `arg` is the service. */
void *router_sched_main(void *arg);

/* ---- the executor link (exec_link.c); scheduler thread, or create before it starts ---------- */

/* HELLO to the executor: its pid and instance. Returns 0 or a negative common_err (e says why). */
int router_exec_hello(struct router_serve *s, int timeout_ms, uint32_t *pid, uint64_t *instance,
                      struct common_errmsg *e);
/* Unmaps and removes the four segments. */
void router_exec_segments_close(struct router_serve *s);
/* Creates the four segments (replacing stale files of a dead router) and ATTACHes them. */
int router_exec_attach(struct router_serve *s, struct common_errmsg *e);
/* Waits for the executor (any HELLO; a new instance when want_new) up to timeout_s or a stop. */
int router_exec_connect(struct router_serve *s, uint32_t timeout_s, bool want_new,
                        struct common_errmsg *e);
/* True while the executor is alive and the same instance (HELLO every 2 s of silence). */
bool router_exec_is_alive(struct router_serve *s, uint64_t *last_hello_ns);

/* ---- the client API (handlers.c); server threads ------------------------------------------ */

/* What a request may carry beyond a GENERATE message (the HTTP API's fields). */
struct serve_gen_extra {
    float presence_penalty;  /* 0 = off; subtracted once if the token was seen */
    float frequency_penalty; /* 0 = off; subtracted once per occurrence */
};

/* Validates, tokenizes and queues the generation `g` under `id` (as a GENERATE of that id
 * would; `x` may be NULL). Returns 0 with rep an OK, or a negative common_err with rep an
 * ERROR that says why. Any thread; takes the lock. */
int router_rq_submit(struct router_serve *s, uint64_t id, const struct proto_generate *g,
                     const struct serve_gen_extra *x, struct proto_msg *rep);

int router_handle_generate(struct router_serve *s, const struct proto_msg *req,
                           struct proto_msg *rep);
int router_handle_poll(struct router_serve *s, const struct proto_msg *req, struct proto_msg *rep);
int router_handle_cancel(struct router_serve *s, const struct proto_msg *req,
                         struct proto_msg *rep);

/* ---- OpenAI-compatible HTTP (http.c) ------------------------------------------------------ */

struct router_http;

/* Starts the HTTP server on s->o.http_addr (routes, auth, body limit) and writes the bound url
 * to RUN_DIR/router.http. Returns 0, or a negative common_err with a message in e (bad address,
 * port in use). Call after the scheduler started. */
int router_http_start(struct router_serve *s, struct common_errmsg *e);
/* The url it serves ("http://127.0.0.1:8080"); static while s->http lives. */
const char *router_http_url(const struct router_http *h);
/* Stops accepting, waits for the exchanges in flight (they end once s->stopping is set: their
 * requests are cancelled), removes router.http and frees; accepts NULL. */
void router_http_stop(struct router_http *h);

#endif /* ROUTER_SERVE_IMPL_H */
