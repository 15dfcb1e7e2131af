/* router/serve.c - the router service: its lifetime, control messages and dispatch on router.sock.
 */
#include "serve_impl.h"

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

/* A condition variable on CLOCK_MONOTONIC (deadlines of serve_deadline_after()). */
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

void router_serve_stats(void *arg, struct proto_stats_reply *st)
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
    proto_stats_add(st, "rounds", (double)s->c_rounds);
    proto_stats_add(st, "rounds.wall_ms", (double)s->round_wall_ns / 1e6);
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
        return router_handle_generate(s, req, rep);
    case PROTO_KIND_POLL:
        return router_handle_poll(s, req, rep);
    case PROTO_KIND_CANCEL:
        return router_handle_cancel(s, req, rep);
    default:
        return proto_reply_error(rep, COMMON_EPROTO, "the router does not take %s messages",
                                 proto_kind_name(req->kind));
    }
}

/* The router's part of the daemon skeleton. */
static const struct proto_service_ops g_router_ops = {
    .health = serve_health,
    .stats = router_serve_stats,
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
    struct common_gguf_str name;
    if (common_gguf_get_str(g, "general.name", &name) == 0 && name.len < sizeof(s->model_name))
        snprintf(s->model_name, sizeof(s->model_name), "%.*s", (int)name.len, name.ptr);
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

/* The scheduler's safety net. A wait for the executor whose loops make no pass for --watchdog
 * seconds (SERVE_WEDGE_S) is stuck in a call that does not return (nng 1.5.2 was seen never to
 * return from closing a socket whose dial failed in the handshake, and the scheduler then waited
 * for ever): the router exits with a clear line, its monitor restarts it, and clients send their
 * requests again to the new one with the tokens they have (nothing is lost). A wait that goes on
 * because the executor is gone for good keeps passing its loops: that router stays. */
static void *router_watch_main(void *arg)
{
    struct router_serve *s = arg;
    const uint64_t       limit_ns =
        (uint64_t)(s->o.watchdog_s ? s->o.watchdog_s : SERVE_WEDGE_S) * 1000000000ull;
    while (!atomic_load(&s->watch_stop)) {
        serve_sleep_ms(250);
        uint64_t beat = atomic_load(&s->recover_beat_ns), now = common_now_ns();
        if (beat && now > beat && now - beat > limit_ns) {
            COMMON_LOG_ERR(SERVE_COMP,
                           "the wait for the executor is stuck in a call (no progress for %llu "
                           "s): exiting for the monitor to restart the router",
                           (unsigned long long)((now - beat) / 1000000000ull));
            _exit(1);
        }
    }
    return NULL;
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
    if ((rc = router_exec_connect(s, o->connect_timeout_s ? o->connect_timeout_s : 30, false, e)) <
        0)
        goto fail;
    if ((rc = router_exec_attach(s, e)) < 0)
        goto fail;
    COMMON_LOG_INFO(SERVE_COMP, "attached to the executor (pid %u)", s->exec_pid);
    if (pthread_create(&s->sched, NULL, router_sched_main, s) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "cannot start the scheduler thread");
        goto fail;
    }
    s->sched_started = true;
    if (pthread_create(&s->watch, NULL, router_watch_main, s) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "cannot start the watchdog thread");
        goto fail;
    }
    s->watch_started = true;
    if (o->http_addr && o->http_addr[0] && (rc = router_http_start(s, e)) < 0)
        goto fail;
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
    serve_deadline_after(&ts, timeout_ms < 0 ? 365ull * 86400000ull : (uint64_t)timeout_ms);
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
    serve_deadline_after(&grace, 3000);
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

const char *router_serve_http_url(const struct router_serve *s)
{
    return s->http ? router_http_url(s->http) : NULL;
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
    router_http_stop(s->http); /* its exchanges see `stopping` and end */
    s->http = NULL;
    proto_service_stop(s->svc); /* waits for handlers: none touches s afterwards */
    s->svc = NULL;
    if (s->sched_started)
        pthread_join(s->sched, NULL); /* still watched: a stuck wait ends the process */
    atomic_store(&s->watch_stop, true);
    if (s->watch_started)
        pthread_join(s->watch, NULL);
    router_exec_segments_close(s);
    proto_client_close(s->exec);
    while (s->head) {
        struct rq *r = s->head;
        s->head = r->next;
        router_rq_free(r);
    }
    free(s->slots);
    router_vocab_destroy(s->vocab);
    pthread_cond_destroy(&s->cv_events);
    pthread_cond_destroy(&s->cv_sched);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
