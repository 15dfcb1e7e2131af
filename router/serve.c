/* router/serve.c - the router service: client requests on router.sock, a scheduler stepping
 * every active sequence on the executor's rings, replay after an executor restart. */
#include "router.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto.h"

#define SERVE_COMP        "router"
#define SERVE_MAX_POLL_MS 30000u
#define SERVE_SEG_REQ     0
#define SERVE_SEG_REP     1
#define SERVE_SEG_TOKENS  2
#define SERVE_SEG_LOGITS  3
#define SERVE_N_SEG       4

static const char *const serve_seg_names[SERVE_N_SEG] = {
    "router-exec.req", "router-exec.rep", "router-exec.tokens", "router-exec.logits"};

enum rq_state { RQ_QUEUED, RQ_ACTIVE, RQ_DONE };

/* One generation request. Fields marked (sched) belong to the scheduler thread once the request
 * is active; the rest are guarded by the service mutex. Only the scheduler frees requests. */
struct rq {
    struct rq    *next;
    uint64_t      id;
    enum rq_state state;
    int           seq; /* slot while active, else -1 */
    /* set by the GENERATE handler, read-only afterwards */
    struct proto_sampling sampling;
    uint32_t              max_tokens;
    char                 *stops[PROTO_MAX_STOPS];
    uint32_t              n_stops;
    bool                  stream;
    uint32_t              n_prompt;
    /* (sched) */
    struct router_tokens  all;    /* prompt, then every generated token */
    uint32_t              n_past; /* positions the executor holds for this request */
    uint64_t              tag;    /* step in flight, 0 = none */
    struct router_sampler sampler;
    bool                  sampler_ok, stop_ok, greedy;
    struct router_stop    stop;
    /* shared */
    struct router_tokens   ev_tokens; /* tokens not yet polled */
    struct router_tokens   ev_off;    /* end offset in ev_text of each pending token's text */
    struct router_text     ev_text;   /* text not yet polled */
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
    uint64_t c_steps, step_wall_ns;
    double   step_exec_ms;

    pthread_t             sched;
    bool                  sched_started;
    struct proto_service *svc; /* owned: router.sock (clients and control), pid file */
};

/* ---- small helpers ------------------------------------------------------------------------ */

static double ms_between(uint64_t a, uint64_t b)
{
    return b > a ? (double)(b - a) / 1e6 : 0.0;
}

static void deadline_after(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0)
        return COMMON_ENOMEM;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc == 0 ? 0 : COMMON_ENOMEM;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- requests ----------------------------------------------------------------------------- */

static void rq_free(struct rq *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    router_tokens_fini(&r->all);
    if (r->sampler_ok)
        router_sampler_fini(&r->sampler);
    if (r->stop_ok)
        router_stop_fini(&r->stop);
    router_tokens_fini(&r->ev_tokens);
    router_tokens_fini(&r->ev_off);
    router_text_fini(&r->ev_text);
    free(r);
}

/* Under the lock: the request with `id` that a client may still poll, or NULL. */
static struct rq *rq_find(struct router_serve *s, uint64_t id)
{
    for (struct rq *r = s->head; r; r = r->next)
        if (r->id == id && !r->delivered)
            return r;
    return NULL;
}

/* Under the lock: ends a request (first reason wins) and wakes its pollers. */
static void rq_finish(struct router_serve *s, struct rq *r, enum proto_stop_reason reason, int code,
                      const char *text)
{
    if (r->done)
        return;
    r->done = true;
    r->reason = reason;
    r->t_end = common_now_ns();
    if (reason == PROTO_STOP_ERROR) {
        r->err_code = code;
        snprintf(r->err_text, sizeof(r->err_text), "%s", text ? text : "");
        s->c_failed++;
    } else if (reason == PROTO_STOP_CANCEL) {
        s->c_cancelled++;
    } else {
        s->c_done++;
    }
    pthread_cond_broadcast(&s->cv_events);
    pthread_cond_signal(&s->cv_sched);
}

/* Under the lock: queues the text and token of one step for the pollers. */
static int rq_emit(struct rq *r, const int32_t *id, const char *text, size_t len)
{
    int rc = 0;
    if (len && (rc = router_text_append(&r->ev_text, text, len)) < 0)
        return rc;
    if (id) {
        if ((rc = router_tokens_push(&r->ev_tokens, *id)) < 0)
            return rc;
        if ((rc = router_tokens_push(&r->ev_off, (int32_t)r->ev_text.len)) < 0) {
            r->ev_tokens.n--;
            return rc;
        }
    } else if (r->ev_off.n) {
        r->ev_off.ids[r->ev_off.n - 1] = (int32_t)r->ev_text.len; /* tail text rides along */
    }
    return 0;
}

/* ---- executor link ------------------------------------------------------------------------ */

static int exec_hello(struct router_serve *s, int timeout_ms, uint32_t *pid, uint64_t *instance,
                      struct common_errmsg *e)
{
    struct proto_msg req = {.kind = PROTO_KIND_HELLO, .request_id = common_random_id()}, rep;
    proto_hello_init(&req.u.hello, PROTO_ROLE_ROUTER, "router", s->instance);
    int rc = proto_client_call(s->exec, &req, &rep, timeout_ms, e);
    if (rc < 0)
        return rc;
    if (rep.kind == PROTO_KIND_ERROR) {
        rc = common_errmsg_set(e, rep.u.error.code < 0 ? rep.u.error.code : COMMON_EPROTO,
                               "executor refused HELLO: %s", rep.u.error.message);
    } else if (rep.kind != PROTO_KIND_HELLO) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "%s: answered HELLO with %s", s->exec_url,
                               proto_kind_name(rep.kind));
    } else if ((rc = proto_hello_check(&rep.u.hello, PROTO_ROLE_EXECUTOR, e)) < 0) {
        /* a peer that is not a compatible executor: e says what it is */
    } else {
        *pid = rep.u.hello.pid;
        *instance = rep.u.hello.instance;
    }
    proto_msg_clear(&rep);
    return rc;
}

static void exec_segments_close(struct router_serve *s)
{
    for (int i = 0; i < SERVE_N_SEG; i++)
        common_ring_segment_close(&s->seg[i]);
    memset(s->seg, 0, sizeof(s->seg));
    s->tokens = NULL;
    s->logits = NULL;
}

static size_t slab_bytes(uint64_t rows, uint64_t cols)
{
    uint64_t b = rows * cols * 4u;
    return (size_t)(b < 4096 ? 4096 : (b + 4095) & ~(uint64_t)4095);
}

/* Creates the four segments (replacing stale files of a dead router) and ATTACHes them. */
static int exec_attach(struct router_serve *s, struct common_errmsg *e)
{
    const uint32_t rs = (uint32_t)sizeof(struct proto_step_req);
    const uint32_t ps = (uint32_t)sizeof(struct proto_step_rep);
    size_t         bytes[SERVE_N_SEG] = {common_ring_bytes(rs, PROTO_STEP_RING_SLOTS),
                                         common_ring_bytes(ps, PROTO_STEP_RING_SLOTS),
                                         slab_bytes(s->n_seq, s->n_ctx), slab_bytes(s->n_seq, s->n_vocab)};
    int            rc;
    exec_segments_close(s);
    for (int i = 0; i < SERVE_N_SEG; i++) {
        rc = common_ring_segment_create(s->run_dir, serve_seg_names[i], bytes[i], &s->seg[i]);
        if (rc == COMMON_EBUSY) {
            char path[PROTO_MAX_PATH + 64];
            snprintf(path, sizeof(path), "%s/%s", s->run_dir, serve_seg_names[i]);
            unlink(path);
            rc = common_ring_segment_create(s->run_dir, serve_seg_names[i], bytes[i], &s->seg[i]);
        }
        if (rc < 0) {
            exec_segments_close(s);
            return common_errmsg_set(e, rc, "cannot create segment %s/%s: %s", s->run_dir,
                                     serve_seg_names[i], common_strerror(rc));
        }
    }
    if ((rc = common_ring_init(s->seg[0].mem, s->seg[0].bytes, rs, PROTO_STEP_RING_SLOTS)) < 0 ||
        (rc = common_ring_init(s->seg[1].mem, s->seg[1].bytes, ps, PROTO_STEP_RING_SLOTS)) < 0 ||
        (rc = common_ring_attach(s->seg[0].mem, s->seg[0].bytes, rs, PROTO_STEP_RING_SLOTS,
                                 &s->req_ring)) < 0 ||
        (rc = common_ring_attach(s->seg[1].mem, s->seg[1].bytes, ps, PROTO_STEP_RING_SLOTS,
                                 &s->rep_ring)) < 0) {
        exec_segments_close(s);
        return common_errmsg_set(e, rc, "cannot format the step rings");
    }
    s->tokens = s->seg[SERVE_SEG_TOKENS].mem;
    s->logits = s->seg[SERVE_SEG_LOGITS].mem;

    struct proto_msg req = {.kind = PROTO_KIND_ATTACH, .request_id = common_random_id()}, rep;
    req.u.attach.role = PROTO_ROLE_ROUTER;
    req.u.attach.pid = (uint32_t)getpid();
    req.u.attach.instance = s->instance;
    req.u.attach.n_segments = SERVE_N_SEG;
    for (int i = 0; i < SERVE_N_SEG; i++)
        snprintf(req.u.attach.segments[i], PROTO_MAX_NAME, "%s", serve_seg_names[i]);
    req.u.attach.params[0] = PROTO_STEP_RING_SLOTS;
    req.u.attach.params[1] = s->n_seq;
    req.u.attach.params[2] = s->n_ctx;
    req.u.attach.params[3] = s->n_vocab;
    if ((rc = proto_client_call(s->exec, &req, &rep, 10000, e)) < 0) {
        exec_segments_close(s);
        return rc;
    }
    if (rep.kind == PROTO_KIND_ERROR) {
        rc = common_errmsg_set(e, rep.u.error.code < 0 ? rep.u.error.code : COMMON_EPROTO,
                               "executor refused ATTACH (n_seq %u, n_ctx %u, n_vocab %u): %s",
                               s->n_seq, s->n_ctx, s->n_vocab, rep.u.error.message);
    } else if (rep.kind != PROTO_KIND_OK) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "executor answered ATTACH with %s",
                               proto_kind_name(rep.kind));
    }
    proto_msg_clear(&rep);
    if (rc < 0)
        exec_segments_close(s);
    return rc;
}

/* Waits for the executor (any HELLO) until `timeout_s` passes or the service stops. */
static int exec_connect(struct router_serve *s, uint32_t timeout_s, bool want_new,
                        struct common_errmsg *e)
{
    uint64_t deadline = common_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    uint64_t old = s->exec_instance;
    uint32_t old_pid = s->exec_pid;
    for (;;) {
        uint32_t pid = 0;
        uint64_t inst = 0;
        int      rc = exec_hello(s, 500, &pid, &inst, e);
        if (rc == 0 && (!want_new || inst != old || !common_pid_gone(old_pid))) {
            s->exec_pid = pid;
            s->exec_instance = inst;
            return 0;
        }
        if (rc == COMMON_EPROTO && !want_new)
            return rc;
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping)
            return COMMON_ECLOSED;
        if (common_now_ns() >= deadline)
            return common_errmsg_set(e, COMMON_ETIMEDOUT,
                                     "no executor at %s after %u s (start sluice-executor first)",
                                     s->exec_url, timeout_s);
        if (rc != COMMON_ETIMEDOUT)
            sleep_ms(100);
        else /* silent: the next try dials afresh (proto_client_reopen) */
            (void)proto_client_reopen(s->exec, NULL);
    }
}

/* ---- scheduler ---------------------------------------------------------------------------- */

static uint32_t client_timeout_ms(const struct router_serve *s)
{
    return (s->o.client_timeout_s ? s->o.client_timeout_s : 60) * 1000u;
}

/* Under the lock: releases finished requests' slots, drops abandoned ones, frees polled ones. */
static void sched_reap(struct router_serve *s, uint64_t now)
{
    struct rq **pp = &s->head;
    while (*pp) {
        struct rq *r = *pp;
        bool       stale = r->n_pollers == 0 && now > r->last_seen_ns &&
                     now - r->last_seen_ns > (uint64_t)client_timeout_ms(s) * 1000000ull;
        if (stale && !r->done) {
            COMMON_LOG_INFO(SERVE_COMP, "dropping request id=%llu: no poll for %u s",
                            (unsigned long long)r->id, client_timeout_ms(s) / 1000);
            s->c_dropped++;
            rq_finish(s, r, PROTO_STOP_CANCEL, 0, NULL);
        }
        if (r->done && r->state == RQ_ACTIVE && r->tag == 0) {
            s->slots[r->seq] = NULL;
            r->seq = -1;
            r->state = RQ_DONE;
            s->n_active--;
            pthread_cond_broadcast(&s->cv_events);
        } else if (r->done && r->state == RQ_QUEUED) {
            r->state = RQ_DONE;
            s->n_queued--;
            pthread_cond_broadcast(&s->cv_events);
        }
        if (r->state == RQ_DONE && r->n_pollers == 0 && (r->delivered || stale)) {
            *pp = r->next;
            rq_free(r);
            pthread_cond_broadcast(&s->cv_events);
            continue;
        }
        pp = &r->next;
    }
}

/* Sets up sampler and stop tracking of a request becoming active. Scheduler, unlocked. */
static int sched_activate(struct router_serve *s, struct rq *r, char *err, size_t err_len)
{
    const struct proto_sampling *p = &r->sampling;
    struct router_sampler_opts   so = {
          .temperature = p->temp,
          .top_k = p->top_k,
          .top_p = p->top_p,
          .min_p = p->min_p,
          .repeat_penalty = p->repeat_penalty,
          .penalty_last_n = (int32_t)p->repeat_last_n,
          .seed = p->seed,
    };
    int rc = router_sampler_init(&r->sampler, &so, s->n_vocab);
    if (rc < 0) {
        snprintf(err, err_len, "sampler options rejected: %s", common_strerror(rc));
        return rc;
    }
    r->sampler_ok = true;
    /* Greedy as the one-process session picks it (argmax, ties to the lowest id); with a
     * repeat penalty the sampler's argmax after the penalty. */
    r->greedy = p->temp <= 0.0f && (p->repeat_penalty == 0.0f || p->repeat_penalty == 1.0f);
    for (uint32_t i = 0; i < r->n_prompt; i++)
        router_sampler_accept(&r->sampler, r->all.ids[i]);
    struct router_stop_opts to = {
        .stop = (const char *const *)r->stops, .n_stop = r->n_stops, .max_tokens = r->max_tokens};
    if ((rc = router_stop_init(&r->stop, s->vocab, &to)) < 0) {
        snprintf(err, err_len, "stop strings rejected: %s", common_strerror(rc));
        return rc;
    }
    r->stop_ok = true;
    return 0;
}

/* Under the lock: moves queued requests into free slots, in arrival order. */
static void sched_assign(struct router_serve *s)
{
    for (struct rq *r = s->head; r && s->n_queued; r = r->next) {
        if (r->state != RQ_QUEUED || r->done)
            continue;
        uint32_t slot = 0;
        while (slot < s->n_seq && s->slots[slot])
            slot++;
        if (slot == s->n_seq)
            return;
        char err[PROTO_MAX_ERROR_TEXT];
        pthread_mutex_unlock(&s->mu);
        int rc = sched_activate(s, r, err, sizeof(err));
        pthread_mutex_lock(&s->mu);
        r->state = RQ_ACTIVE;
        r->seq = (int)slot;
        s->slots[slot] = r;
        s->n_queued--;
        s->n_active++;
        if (rc < 0)
            rq_finish(s, r, PROTO_STOP_ERROR, rc, err);
    }
}

static bool exec_is_alive(struct router_serve *s, uint64_t *last_hello_ns)
{
    if (common_pid_gone(s->exec_pid))
        return false;
    uint64_t now = common_now_ns();
    if (now - *last_hello_ns < 2000000000ull)
        return true;
    *last_hello_ns = now;
    uint32_t pid = 0;
    uint64_t inst = 0;
    int      rc = exec_hello(s, 500, &pid, &inst, NULL);
    if (rc == 0 && inst != s->exec_instance) {
        COMMON_LOG_WARN(SERVE_COMP, "executor restarted (instance %llx -> %llx)",
                        (unsigned long long)s->exec_instance, (unsigned long long)inst);
        return false;
    }
    return true; /* busy or alive */
}

/* The executor died or restarted: wait for it, re-create the link, and rewind every active
 * request so the next rounds replay its prompt and tokens. */
static void sched_recover(struct router_serve *s)
{
    pthread_mutex_lock(&s->mu);
    s->degraded = true;
    pthread_mutex_unlock(&s->mu);
    exec_segments_close(s);
    COMMON_LOG_WARN(SERVE_COMP, "executor lost (pid %u); waiting for it to come back", s->exec_pid);
    uint32_t timeout_s = s->o.connect_timeout_s ? s->o.connect_timeout_s : 30;
    bool     failed = false;
    for (;;) {
        struct common_errmsg e = {{0}};
        int                  rc = exec_connect(s, timeout_s, true, &e);
        if (rc == 0)
            rc = exec_attach(s, &e);
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        if (rc < 0 && !failed && !stopping) {
            /* Too long: fail the work in flight, keep waiting for new work's sake. */
            COMMON_LOG_ERR(SERVE_COMP, "executor did not come back: %s", e.text);
            for (struct rq *r = s->head; r; r = r->next)
                if (!r->done)
                    rq_finish(s, r, PROTO_STOP_ERROR, COMMON_ECLOSED,
                              "the executor died and did not come back");
            failed = true;
        }
        if (rc == 0 || stopping) {
            if (rc == 0) {
                s->degraded = false;
                s->c_exec_restarts++;
                for (uint32_t i = 0; i < s->n_seq; i++) {
                    struct rq *r = s->slots[i];
                    if (r) {
                        r->tag = 0;
                        if (r->n_past) {
                            r->n_past = 0;
                            s->c_replays++;
                        }
                    }
                }
                COMMON_LOG_INFO(SERVE_COMP, "executor back (pid %u); replaying %u sequences",
                                s->exec_pid, s->n_active);
            }
            pthread_mutex_unlock(&s->mu);
            return;
        }
        pthread_mutex_unlock(&s->mu);
        sleep_ms(200);
    }
}

/* Picks and records the next token of `r` from its logits row; emits it. Scheduler thread. */
static void sched_sample(struct router_serve *s, struct rq *r, struct router_text *piece)
{
    const float *row = s->logits + (size_t)r->seq * s->n_vocab;
    int32_t      id = 0;
    int          rc = 0;
    if (r->greedy) {
        for (uint32_t i = 1; i < s->n_vocab; i++)
            if (row[i] > row[id])
                id = (int32_t)i;
    } else {
        rc = router_sampler_pick(&r->sampler, row, &id);
    }
    router_text_clear(piece);
    int reason = ROUTER_STOP_NONE;
    if (rc == 0 && (rc = router_tokens_push(&r->all, id)) == 0) {
        router_sampler_accept(&r->sampler, id);
        reason = router_stop_push(&r->stop, id, piece);
        if (reason < 0)
            rc = reason;
    }
    enum proto_stop_reason pr = PROTO_STOP_NONE;
    if (rc == 0) {
        if (reason == ROUTER_STOP_EOS)
            pr = PROTO_STOP_EOS;
        else if (reason == ROUTER_STOP_STRING)
            pr = PROTO_STOP_STRING;
        else if (reason == ROUTER_STOP_MAX_TOKENS)
            pr = PROTO_STOP_LENGTH;
        else if (r->all.n - 1 >= s->n_ctx)
            pr = PROTO_STOP_CONTEXT; /* every position used: the token cannot be fed */
    }
    size_t tail = piece->len;
    if (rc == 0 && pr != PROTO_STOP_NONE && pr != PROTO_STOP_STRING)
        rc = router_stop_finish(&r->stop, piece);
    pthread_mutex_lock(&s->mu);
    if (!r->done) {
        if (rc == 0) {
            r->n_generated++;
            s->c_gen_tokens++;
            rc = rq_emit(r, &id, piece->ptr, tail);
            if (rc == 0 && piece->len > tail)
                rc = rq_emit(r, NULL, piece->ptr + tail, piece->len - tail);
        }
        if (rc < 0)
            rq_finish(s, r, PROTO_STOP_ERROR, rc, "sampling failed");
        else if (pr != PROTO_STOP_NONE)
            rq_finish(s, r, pr, 0, NULL);
        else if (!r->gathering)
            pthread_cond_broadcast(&s->cv_events);
    }
    pthread_mutex_unlock(&s->mu);
}

/* One round: an EVAL for every request in batch[0..n), then their replies. Returns false when
 * the executor was lost (the caller recovers). */
static bool sched_round(struct router_serve *s, struct rq **batch, uint32_t n,
                        struct router_text *piece)
{
    uint32_t outstanding = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct rq            *r = batch[i];
        int32_t              *row = s->tokens + (size_t)r->seq * s->n_ctx;
        struct proto_step_req q = {.op = PROTO_STEP_EVAL, .seq = (uint32_t)r->seq};
        if (r->n_past == 0) {
            memcpy(row, r->all.ids, (size_t)r->n_prompt * sizeof(*row));
            q.pos = 0;
            q.n = r->n_prompt;
        } else {
            row[r->n_past] = r->all.ids[r->n_past];
            q.pos = r->n_past;
            q.n = 1;
        }
        q.tag = ++s->next_tag;
        if (r->t_start == 0) {
            pthread_mutex_lock(&s->mu);
            r->t_start = common_now_ns();
            pthread_mutex_unlock(&s->mu);
        }
        r->t_push = common_now_ns();
        int rc = common_ring_push_wait(&s->req_ring, &q, sizeof(q), 5000);
        if (rc < 0) {
            COMMON_LOG_WARN(SERVE_COMP, "step ring push failed: %s", common_strerror(rc));
            return false;
        }
        r->tag = q.tag;
        outstanding++;
    }
    uint64_t last_hello = common_now_ns();
    int      wait_ms = (int)(s->o.exec_wait_ms ? s->o.exec_wait_ms : 200);
    while (outstanding) {
        struct proto_step_rep p;
        int                   rc = common_ring_pop_wait(&s->rep_ring, &p, sizeof(p), wait_ms);
        if (rc == COMMON_ETIMEDOUT) {
            pthread_mutex_lock(&s->mu);
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (stopping || !exec_is_alive(s, &last_hello))
                return false;
            continue;
        }
        if (rc < 0) {
            COMMON_LOG_WARN(SERVE_COMP, "step ring broken: %s", common_strerror(rc));
            return false;
        }
        if (rc != (int)sizeof(p)) {
            COMMON_LOG_WARN(SERVE_COMP, "step reply of %d bytes ignored", rc);
            continue;
        }
        struct rq *r = NULL;
        for (uint32_t i = 0; i < n && !r; i++)
            if (batch[i]->tag == p.tag && p.tag != 0 && batch[i]->seq == (int)p.seq)
                r = batch[i];
        if (!r) {
            COMMON_LOG_DEBUG(SERVE_COMP, "stale step reply tag=%llu ignored",
                             (unsigned long long)p.tag);
            continue;
        }
        outstanding--;
        r->tag = 0;
        pthread_mutex_lock(&s->mu);
        s->c_steps++;
        s->step_wall_ns += common_now_ns() - r->t_push;
        s->step_exec_ms += p.ms;
        pthread_mutex_unlock(&s->mu);
        uint32_t want = r->n_past == 0 ? r->n_prompt : r->n_past + 1;
        if (p.status < 0 || p.n_past != want) {
            char msg[PROTO_MAX_ERROR_TEXT];
            if (p.status < 0)
                snprintf(msg, sizeof(msg), "executor step failed: %s", common_strerror(p.status));
            else
                snprintf(msg, sizeof(msg), "executor holds %u positions, expected %u", p.n_past,
                         want);
            pthread_mutex_lock(&s->mu);
            rq_finish(s, r, PROTO_STOP_ERROR, p.status < 0 ? p.status : COMMON_EPROTO, msg);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        r->n_past = want;
        if (r->n_past == r->n_prompt && r->t_prompt == 0) {
            pthread_mutex_lock(&s->mu);
            r->t_prompt = common_now_ns();
            pthread_mutex_unlock(&s->mu);
        }
        if (r->n_past < r->all.n)
            continue; /* replaying after an executor restart */
        pthread_mutex_lock(&s->mu);
        bool done = r->done;
        pthread_mutex_unlock(&s->mu);
        if (!done)
            sched_sample(s, r, piece);
    }
    return true;
}

static void *sched_main(void *arg)
{
    struct router_serve *s = arg;
    struct router_text   piece = {0};
    struct rq          **batch = calloc(s->n_seq, sizeof(*batch));
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && batch) {
        sched_reap(s, common_now_ns());
        if (!s->degraded)
            sched_assign(s);
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->n_seq; i++)
            if (s->slots[i] && !s->slots[i]->done)
                batch[n++] = s->slots[i];
        if (n == 0) {
            struct timespec ts;
            deadline_after(&ts, 100);
            pthread_cond_timedwait(&s->cv_sched, &s->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        bool ok = sched_round(s, batch, n, &piece);
        if (!ok) {
            pthread_mutex_lock(&s->mu);
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (!stopping)
                sched_recover(s);
        }
        pthread_mutex_lock(&s->mu);
        if (!ok && s->stopping) {
            for (uint32_t i = 0; i < n; i++)
                batch[i]->tag = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(batch);
    router_text_fini(&piece);
    return NULL;
}

/* ---- client API handlers ------------------------------------------------------------------ */

static bool finite_in(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

static int handle_generate(struct router_serve *s, const struct proto_msg *req,
                           struct proto_msg *rep)
{
    const struct proto_generate *g = &req->u.generate;
    const struct proto_sampling *p = &g->sampling;
    if (req->request_id == 0)
        return proto_reply_error(rep, COMMON_EINVAL, "request id 0 is reserved");
    if (!finite_in(p->temp, -1e9f, 100.0f) || p->top_k < 0 || !finite_in(p->top_p, 0.0f, 1.0f) ||
        !finite_in(p->min_p, 0.0f, 1.0f) || !finite_in(p->repeat_penalty, 0.0f, 100.0f) ||
        p->repeat_last_n > 4096)
        return proto_reply_error(rep, COMMON_EINVAL,
                                 "sampling values out of range: temp <= 100, top_k >= 0, top_p and "
                                 "min_p in 0..1, repeat_penalty in 0..100, repeat_last_n <= 4096");
    if (!g->prompt && g->n_messages == 0)
        return proto_reply_error(rep, COMMON_EINVAL, "no prompt and no messages");
    if (g->prompt && g->n_messages)
        return proto_reply_error(rep, COMMON_EINVAL, "give a prompt or messages, not both");
    if (g->prompt && !g->prompt[0])
        return proto_reply_error(rep, COMMON_EINVAL, "empty prompt");
    if (g->n_stops > PROTO_MAX_STOPS)
        return proto_reply_error(rep, COMMON_EINVAL, "too many stop strings");
    for (uint32_t i = 0; i < g->n_stops; i++)
        if (!g->stops[i][0] || !memchr(g->stops[i], 0, PROTO_MAX_STOP_LEN))
            return proto_reply_error(rep, COMMON_EINVAL, "stop string %u is empty or too long", i);

    struct router_text   text = {0};
    struct router_tokens toks = {0};
    int                  rc = 0;
    const char          *src = g->prompt;
    size_t               src_len = g->prompt ? strlen(g->prompt) : 0;
    bool                 parse_special = g->special;
    if (g->n_messages) {
        struct router_chat_msg msgs[PROTO_MAX_MESSAGES];
        uint32_t               nm = g->n_messages < PROTO_MAX_MESSAGES ? g->n_messages : 0;
        for (uint32_t i = 0; i < nm; i++) {
            const struct proto_chat_msg *m = &g->messages[i];
            if (!memchr(m->role, 0, sizeof(m->role)) || !m->role[0] || !m->content)
                return proto_reply_error(rep, COMMON_EINVAL, "message %u has no role or content",
                                         i);
            msgs[i] = (struct router_chat_msg){.role = m->role, .content = m->content};
        }
        rc = router_chat_render(s->tmpl, msgs, nm,
                                &(struct router_chat_opts){.add_generation_prompt = true}, &text);
        if (rc < 0) {
            router_text_fini(&text);
            return proto_reply_error(rep, rc, "chat template %s failed", router_chat_name(s->tmpl));
        }
        src = text.ptr ? text.ptr : "";
        src_len = text.len;
        parse_special = true; /* as `sluice chat` tokenizes a rendered conversation */
    }
    rc = router_tokenize(
        s->vocab, src, src_len,
        &(struct router_tokenize_opts){.add_special = true, .parse_special = parse_special}, &toks);
    router_text_fini(&text);
    if (rc < 0) {
        router_tokens_fini(&toks);
        return proto_reply_error(rep, rc, "tokenizing the prompt failed");
    }
    if (toks.n == 0) {
        router_tokens_fini(&toks);
        return proto_reply_error(rep, COMMON_EINVAL, "the prompt has no tokens");
    }
    if (toks.n > s->n_ctx) {
        size_t n = toks.n;
        router_tokens_fini(&toks);
        return proto_reply_error(rep, COMMON_ERANGE,
                                 "the prompt has %zu tokens but the context holds %u", n, s->n_ctx);
    }

    struct rq *r = calloc(1, sizeof(*r));
    if (!r) {
        router_tokens_fini(&toks);
        return COMMON_ENOMEM;
    }
    r->id = req->request_id;
    r->seq = -1;
    r->sampling = *p;
    r->max_tokens = g->max_tokens;
    r->stream = g->stream;
    r->all = toks;
    r->n_prompt = (uint32_t)toks.n;
    for (uint32_t i = 0; i < g->n_stops; i++) {
        if (!(r->stops[i] = strdup(g->stops[i]))) {
            rq_free(r);
            return COMMON_ENOMEM;
        }
        r->n_stops++;
    }
    r->t_submit = r->last_seen_ns = common_now_ns();

    pthread_mutex_lock(&s->mu);
    uint32_t queue_max = s->o.queue_max ? s->o.queue_max : 64;
    if (s->draining) {
        rc = proto_reply_error(rep, COMMON_EBUSY, "the router is draining: no new requests");
    } else if (s->n_queued >= queue_max) {
        rc = proto_reply_error(rep, COMMON_EBUSY, "queue full: %u requests waiting (--queue)",
                               s->n_queued);
    } else if (rq_find(s, r->id)) {
        rc = proto_reply_error(rep, COMMON_EINVAL, "request id %llu is in use",
                               (unsigned long long)r->id);
    } else {
        struct rq **pp = &s->head;
        while (*pp)
            pp = &(*pp)->next;
        *pp = r;
        s->n_queued++;
        s->c_submitted++;
        s->c_prompt_tokens += r->n_prompt;
        pthread_cond_signal(&s->cv_sched);
        r = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (r) {
        rq_free(r);
        return rc;
    }
    rep->kind = PROTO_KIND_OK;
    return 0;
}

static int handle_poll(struct router_serve *s, const struct proto_msg *req, struct proto_msg *rep)
{
    uint32_t max_events = req->u.poll.max_events;
    if (max_events == 0 || max_events > PROTO_MAX_EVENT_TOKENS)
        max_events = PROTO_MAX_EVENT_TOKENS;
    uint32_t timeout_ms = req->u.poll.timeout_ms;
    if (timeout_ms == 0)
        timeout_ms = s->o.poll_default_ms ? s->o.poll_default_ms : 2000;
    if (timeout_ms > SERVE_MAX_POLL_MS)
        timeout_ms = SERVE_MAX_POLL_MS;
    struct timespec ts;
    deadline_after(&ts, timeout_ms);

    pthread_mutex_lock(&s->mu);
    struct rq *r = rq_find(s, req->request_id);
    if (!r) {
        pthread_mutex_unlock(&s->mu);
        return proto_reply_error(rep, COMMON_ENOENT, "no request with id %llu",
                                 (unsigned long long)req->request_id);
    }
    r->n_pollers++;
    for (;;) {
        bool ready = r->done || (r->stream && r->ev_tokens.n > 0);
        if (ready || s->stopping)
            break;
        if (pthread_cond_timedwait(&s->cv_events, &s->mu, &ts) == ETIMEDOUT)
            break;
    }
    /* A stream answered less than stream_ms ago gathers tokens until the interval ends (or the
     * request ends, or max_events are there): a fast generation then costs its client one
     * round trip per interval instead of one per token. */
    if (s->o.stream_ms && r->stream && r->last_reply_ns && !r->done && !s->stopping) {
        uint64_t until = r->last_reply_ns + (uint64_t)s->o.stream_ms * 1000000ull;
        if (until > common_now_ns()) {
            struct timespec gts;
            deadline_after(&gts, (until - common_now_ns()) / 1000000ull + 1);
            r->gathering = true;
            while (!r->done && !s->stopping && r->ev_tokens.n < max_events &&
                   pthread_cond_timedwait(&s->cv_events, &s->mu, &gts) != ETIMEDOUT)
                ;
            r->gathering = false;
        }
    }
    struct proto_events *ev = &rep->u.events;
    memset(ev, 0, sizeof(*ev));
    rep->kind = PROTO_KIND_EVENTS;
    int rc = 0;
    if (r->stream || r->done) {
        size_t k = r->ev_tokens.n < max_events ? r->ev_tokens.n : max_events;
        bool   all = k == r->ev_tokens.n;
        size_t tlen = all ? r->ev_text.len : (size_t)r->ev_off.ids[k - 1];
        if (tlen) {
            if (!(ev->text = malloc(tlen + 1))) {
                rc = COMMON_ENOMEM;
                goto out;
            }
            memcpy(ev->text, r->ev_text.ptr, tlen);
            ev->text[tlen] = '\0';
        }
        ev->n_tokens = (uint32_t)k;
        if (k) { /* ids is NULL until a token came (memcpy/memmove want non-NULL) */
            memcpy(ev->tokens, r->ev_tokens.ids, k * sizeof(int32_t));
            memmove(r->ev_tokens.ids, r->ev_tokens.ids + k, (r->ev_tokens.n - k) * sizeof(int32_t));
        }
        r->ev_tokens.n -= k;
        for (size_t i = k; i < r->ev_off.n; i++)
            r->ev_off.ids[i - k] = r->ev_off.ids[i] - (int32_t)tlen;
        r->ev_off.n -= k;
        if (tlen)
            memmove(r->ev_text.ptr, r->ev_text.ptr + tlen, r->ev_text.len - tlen);
        r->ev_text.len -= tlen;
        if (r->ev_text.ptr)
            r->ev_text.ptr[r->ev_text.len] = '\0';
        if (r->done && r->ev_tokens.n == 0 && r->ev_text.len == 0) {
            ev->done = true;
            ev->reason = r->reason;
            ev->error_code = r->err_code;
            snprintf(ev->error_text, sizeof(ev->error_text), "%s", r->err_text);
            ev->stats = (struct proto_final_stats){
                .n_prompt = r->n_prompt,
                .n_generated = r->n_generated,
                .queue_ms = ms_between(r->t_submit, r->t_start ? r->t_start : r->t_end),
                .prompt_ms = r->t_prompt ? ms_between(r->t_start, r->t_prompt) : 0.0,
                .decode_ms = r->t_prompt ? ms_between(r->t_prompt, r->t_end) : 0.0,
            };
            r->delivered = true;
            pthread_cond_signal(&s->cv_sched);
        }
    }
out:
    r->n_pollers--;
    r->last_seen_ns = common_now_ns();
    if (rep->u.events.n_tokens)
        r->last_reply_ns = r->last_seen_ns;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int handle_cancel(struct router_serve *s, const struct proto_msg *req, struct proto_msg *rep)
{
    pthread_mutex_lock(&s->mu);
    struct rq *r = rq_find(s, req->request_id);
    if (r) {
        r->last_seen_ns = common_now_ns();
        rq_finish(s, r, PROTO_STOP_CANCEL, 0, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    if (!r)
        return proto_reply_error(rep, COMMON_ENOENT, "no request with id %llu",
                                 (unsigned long long)req->request_id);
    rep->kind = PROTO_KIND_OK;
    return 0;
}

static void serve_stats(void *arg, struct proto_stats_reply *st)
{
    struct router_serve *s = arg;
    pthread_mutex_lock(&s->mu);
    proto_stats_add(st, "requests.queued", s->n_queued);
    proto_stats_add(st, "requests.active", s->n_active);
    proto_stats_add(st, "requests.submitted", (double)s->c_submitted);
    proto_stats_add(st, "requests.done", (double)s->c_done);
    proto_stats_add(st, "requests.cancelled", (double)s->c_cancelled);
    proto_stats_add(st, "requests.failed", (double)s->c_failed);
    proto_stats_add(st, "requests.dropped", (double)s->c_dropped);
    proto_stats_add(st, "tokens.prompt", (double)s->c_prompt_tokens);
    proto_stats_add(st, "tokens.generated", (double)s->c_gen_tokens);
    proto_stats_add(st, "replays", (double)s->c_replays);
    proto_stats_add(st, "steps", (double)s->c_steps);
    proto_stats_add(st, "steps.wall_ms", (double)s->step_wall_ns / 1e6);
    proto_stats_add(st, "steps.exec_ms", s->step_exec_ms);
    proto_stats_add(st, "executor.restarts", (double)s->c_exec_restarts);
    proto_stats_add(st, "sequences", s->n_seq);
    proto_stats_add(st, "n_ctx", s->n_ctx);
    pthread_mutex_unlock(&s->mu);
}

static void serve_health(void *arg, struct proto_health_reply *h)
{
    struct router_serve *s = arg;
    pthread_mutex_lock(&s->mu);
    if (s->degraded) {
        h->state = PROTO_HEALTH_DEGRADED;
        snprintf(h->message, sizeof(h->message), "waiting for the executor");
    } else {
        snprintf(h->message, sizeof(h->message), "%u active, %u queued, %u sequences", s->n_active,
                 s->n_queued, s->n_seq);
    }
    pthread_mutex_unlock(&s->mu);
}

static void serve_drain(void *arg)
{
    router_serve_drain(arg);
}

/* The client API beside the skeleton's control messages. */
static int serve_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct router_serve *s = arg;
    switch (req->kind) {
    case PROTO_KIND_GENERATE:
        return handle_generate(s, req, rep);
    case PROTO_KIND_POLL:
        return handle_poll(s, req, rep);
    case PROTO_KIND_CANCEL:
        return handle_cancel(s, req, rep);
    default:
        return proto_reply_error(rep, COMMON_EPROTO, "the router does not take %s messages",
                                 proto_kind_name(req->kind));
    }
}

/* The router's part of the daemon skeleton. */
static const struct proto_service_ops g_router_ops = {
    .health = serve_health,
    .stats = serve_stats,
    .drain = serve_drain,
    .handle = serve_handler,
};

/* ---- lifetime ----------------------------------------------------------------------------- */

/* min(4096, the model's trained context) when -c is not given. */
static uint32_t model_n_ctx(const struct common_gguf *g)
{
    struct common_gguf_str arch;
    uint32_t               n = 0;
    if (common_gguf_get_str(g, "general.architecture", &arch) == 0 && arch.len < 64) {
        char key[128];
        snprintf(key, sizeof(key), "%.*s.context_length", (int)arch.len, arch.ptr);
        if (common_gguf_get_u32(g, key, &n) < 0)
            n = 0;
    }
    return n && n < 4096 ? n : 4096;
}

static int serve_load_model(struct router_serve *s, struct common_errmsg *e)
{
    struct common_gguf *g = NULL;
    int                 rc = common_gguf_open(s->o.model_path, NULL, &g, e);
    if (rc < 0)
        return rc;
    if ((rc = router_vocab_load(g, &s->vocab, e)) < 0) {
        common_gguf_close(g);
        return rc;
    }
    router_chat_for_model(g, &s->tmpl);
    s->n_vocab = router_vocab_n_tokens(s->vocab);
    /* The logits rows are the model's output width, which may pad the token list. */
    uint32_t            hp_vocab = 0;
    struct common_model m;
    if (common_model_init(&m, g, NULL) == 0) {
        hp_vocab = m.hp.n_vocab;
        common_model_fini(&m);
    }
    if (hp_vocab > s->n_vocab)
        s->n_vocab = hp_vocab;
    if (!s->n_ctx)
        s->n_ctx = model_n_ctx(g);
    common_gguf_close(g);
    return 0;
}

int router_serve_create(const struct router_serve_opts *o, struct router_serve **out,
                        struct common_errmsg *e)
{
    if (!o || !o->model_path || !o->run_dir || strlen(o->run_dir) >= PROTO_MAX_PATH - 64)
        return common_errmsg_set(e, COMMON_EINVAL, "a model (-m) and a run directory are needed");
    struct router_serve *s = calloc(1, sizeof(*s));
    if (!s)
        return COMMON_ENOMEM;
    s->o = *o;
    snprintf(s->run_dir, sizeof(s->run_dir), "%s", o->run_dir);
    s->n_seq = o->n_seq ? o->n_seq : 4;
    s->n_ctx = o->n_ctx;
    s->instance = common_random_id();
    if (o->listen_url) {
        snprintf(s->listen_url, sizeof(s->listen_url), "%s", o->listen_url);
    } else {
        snprintf(s->listen_url, sizeof(s->listen_url), "ipc://%s/router.sock", s->run_dir);
    }
    if (o->executor_url)
        snprintf(s->exec_url, sizeof(s->exec_url), "%s", o->executor_url);
    else
        snprintf(s->exec_url, sizeof(s->exec_url), "ipc://%s/executor.ctl", s->run_dir);
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return COMMON_ENOMEM;
    }
    if (cond_init_mono(&s->cv_events) < 0 || cond_init_mono(&s->cv_sched) < 0) {
        free(s);
        return COMMON_ENOMEM;
    }
    int rc;
    if (s->n_seq > PROTO_STEP_RING_SLOTS) {
        rc = common_errmsg_set(e, COMMON_ERANGE, "--parallel %u is above %u", s->n_seq,
                               PROTO_STEP_RING_SLOTS);
        goto fail;
    }
    if ((rc = serve_load_model(s, e)) < 0)
        goto fail;
    if (!(s->slots = calloc(s->n_seq, sizeof(*s->slots)))) {
        rc = COMMON_ENOMEM;
        goto fail;
    }
    COMMON_LOG_INFO(SERVE_COMP, "model %s: %u tokens, template %s; %u sequences of %u positions",
                    s->o.model_path, s->n_vocab, router_chat_name(s->tmpl), s->n_seq, s->n_ctx);
    if ((rc = proto_client_open(s->exec_url, &s->exec, e)) < 0)
        goto fail;
    if ((rc = exec_connect(s, o->connect_timeout_s ? o->connect_timeout_s : 30, false, e)) < 0)
        goto fail;
    if ((rc = exec_attach(s, e)) < 0)
        goto fail;
    COMMON_LOG_INFO(SERVE_COMP, "attached to the executor (pid %u)", s->exec_pid);
    if (pthread_create(&s->sched, NULL, sched_main, s) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "cannot start the scheduler thread");
        goto fail;
    }
    s->sched_started = true;
    /* Long polls hold a worker each but return within their timeout; requests beyond the
     * workers wait in nng's queue. */
    uint32_t                  workers = 2 * s->n_seq + 8;
    struct proto_service_opts so = {.run_dir = s->run_dir,
                                    .name = "router",
                                    .role = PROTO_ROLE_ROUTER,
                                    .url = s->listen_url,
                                    .model_path = s->o.model_path,
                                    .instance = s->instance,
                                    .n_workers = workers > 64 ? 64 : workers,
                                    .no_pidfile = o->no_pidfile};
    if ((rc = proto_service_start(&so, &g_router_ops, s, &s->svc, e)) < 0)
        goto fail; /* the socket file may be another router's: leave it */
    COMMON_LOG_INFO(SERVE_COMP, "listening on %s", s->listen_url);
    *out = s;
    return 0;
fail:
    router_serve_destroy(s);
    return rc;
}

void router_serve_drain(struct router_serve *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_cond_broadcast(&s->cv_events);
    pthread_mutex_unlock(&s->mu);
}

struct proto_service *router_serve_service(struct router_serve *s)
{
    return s->svc;
}

bool router_serve_wait_idle(struct router_serve *s, int timeout_ms)
{
    struct timespec ts;
    deadline_after(&ts, timeout_ms < 0 ? 365ull * 86400000ull : (uint64_t)timeout_ms);
    pthread_mutex_lock(&s->mu);
    bool idle = false;
    for (;;) {
        if (s->n_queued + s->n_active == 0) {
            idle = true;
            break;
        }
        if (pthread_cond_timedwait(&s->cv_events, &s->mu, &ts) == ETIMEDOUT)
            break;
    }
    /* Give clients a moment to poll their final events. */
    struct timespec grace;
    deadline_after(&grace, 3000);
    while (idle) {
        bool pending = false;
        for (struct rq *r = s->head; r; r = r->next)
            pending = pending || !r->delivered;
        if (!pending || pthread_cond_timedwait(&s->cv_events, &s->mu, &grace) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&s->mu);
    return idle;
}

const char *router_serve_url(const struct router_serve *s)
{
    return s->listen_url;
}

void router_serve_destroy(struct router_serve *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    s->draining = true;
    pthread_cond_broadcast(&s->cv_events);
    pthread_cond_broadcast(&s->cv_sched);
    pthread_mutex_unlock(&s->mu);
    proto_service_stop(s->svc); /* waits for handlers: none touches s afterwards */
    s->svc = NULL;
    if (s->sched_started)
        pthread_join(s->sched, NULL);
    exec_segments_close(s);
    proto_client_close(s->exec);
    while (s->head) {
        struct rq *r = s->head;
        s->head = r->next;
        rq_free(r);
    }
    free(s->slots);
    router_vocab_destroy(s->vocab);
    pthread_cond_destroy(&s->cv_events);
    pthread_cond_destroy(&s->cv_sched);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
