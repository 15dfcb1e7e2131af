/* proto/wire.c - control messages over nng: a rep0 server with worker threads, a req0 client. */
#include "proto.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#define WIRE_DEFAULT_WORKERS 4u
/* proto_client_close's wait for nng_close (wire_close_bounded) */
#define WIRE_CLIENT_CLOSE_MS 5000u
#define WIRE_IPC_PREFIX      "ipc://"

/* Maps an nng error to a common_err. */
static int wire_err(int rv)
{
    switch (rv) {
    case 0:
        return COMMON_OK;
    case NNG_ENOMEM:
        return COMMON_ENOMEM;
    case NNG_ETIMEDOUT:
        return COMMON_ETIMEDOUT;
    case NNG_ECLOSED:
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
        return COMMON_ECLOSED;
    case NNG_EADDRINUSE:
        return COMMON_EBUSY;
    default:
        return COMMON_EIO;
    }
}

/* ---- server --------------------------------------------------------------------------------- */

/* One context of the server and the thread that serves it, one request at a time. */
struct wire_worker {
    struct proto_server *server;  /* borrowed: the owner */
    nng_ctx              ctx;     /* a context of server->sock */
    nng_aio             *aio;     /* owned: waited on synchronously by the thread */
    struct proto_msg    *req;     /* owned: decoded request (large: on the heap) */
    struct proto_msg    *rep;     /* owned: reply being built */
    pthread_t            thread;  /* valid when started */
    bool                 started; /* the thread runs and must be joined */
};

struct proto_server {
    nng_socket          sock;      /* rep0 */
    proto_handler_fn    handler;   /* called from the workers */
    void               *arg;       /* borrowed: handler argument */
    uint32_t            n_workers; /* entries of workers */
    struct wire_worker *workers;   /* owned: n_workers */
    _Atomic uint64_t    served;    /* requests that reached the handler */
    _Atomic uint64_t    refused;   /* requests that did not decode */
    _Atomic uint64_t    restarts;  /* listeners replaced by the watchdog */

    /* The listener and its watchdog (see wire_watchdog_main). */
    char           *url;         /* owned: copy of the url */
    nng_listener    listener;    /* valid while listening */
    bool            listening;   /* listener is started (watchdog thread only after start) */
    _Atomic int     listener_id; /* id of listener: pipe events of other listeners are ignored */
    pthread_mutex_t mu;          /* guards the fields below */
    pthread_cond_t  cond;        /* signals stopping and pipe events (CLOCK_MONOTONIC) */
    bool            sync_ready;  /* mu and cond are initialized */
    bool            stopping;    /* proto_server_stop was called */
    uint64_t        added;       /* pipes of listener that completed the handshake */
    pthread_t       watchdog;    /* valid when watchdog_started */
    bool            watchdog_started;
};

/* Builds the reply to one inbound message in w->rep, encoded into (*buf, *len). Never fails: a
 * reply that does not encode becomes an ERROR reply. */
static void wire_serve_one(struct wire_worker *w, const void *body, size_t body_len, uint8_t **buf,
                           size_t *len)
{
    struct proto_server *s = w->server;
    struct proto_msg    *req = w->req, *rep = w->rep;
    int                  rc = proto_decode(body, body_len, req);
    if (rc != COMMON_OK) {
        atomic_fetch_add_explicit(&s->refused, 1, memory_order_relaxed);
        proto_msg_error(rep, 0, rc == COMMON_ENOMEM ? COMMON_ENOMEM : COMMON_EPROTO,
                        "malformed request of %zu bytes refused", body_len);
    } else {
        atomic_fetch_add_explicit(&s->served, 1, memory_order_relaxed);
        memset(rep, 0, sizeof(*rep));
        rep->kind = PROTO_KIND_OK;
        rep->request_id = req->request_id;
        rc = s->handler(s->arg, req, rep);
        uint64_t id = req->request_id;
        proto_msg_clear(req);
        if (rc < 0) {
            char text[PROTO_MAX_ERROR_TEXT] = "";
            if (rep->kind == PROTO_KIND_ERROR &&
                memchr(rep->u.error.message, '\0', sizeof(rep->u.error.message)))
                memcpy(text, rep->u.error.message, sizeof(text));
            proto_msg_clear(rep);
            proto_msg_error(rep, id, rc, "%s", text[0] ? text : common_strerror(rc));
        }
    }
    rc = proto_encode(rep, buf, len);
    if (rc != COMMON_OK) {
        uint64_t        id = rep->request_id;
        enum proto_kind kind = rep->kind;
        proto_msg_clear(rep);
        proto_msg_error(rep, id, rc, "reply (%s) does not encode: %s", proto_kind_name(kind),
                        common_strerror(rc));
        rc = proto_encode(rep, buf, len);
        if (rc != COMMON_OK) {
            *buf = NULL;
            *len = 0;
        }
    }
    proto_msg_clear(rep);
}

static void *wire_worker_main(void *p)
{
    struct wire_worker *w = p;
    for (;;) {
        nng_ctx_recv(w->ctx, w->aio);
        nng_aio_wait(w->aio);
        int rv = nng_aio_result(w->aio);
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            break;
        if (rv != 0)
            continue; /* a transient receive error: nothing was taken */
        nng_msg *msg = nng_aio_get_msg(w->aio);
        uint8_t *buf = NULL;
        size_t   len = 0;
        wire_serve_one(w, nng_msg_body(msg), nng_msg_len(msg), &buf, &len);
        nng_msg_clear(msg);
        if (!buf || nng_msg_append(msg, buf, len) != 0) {
            /* Out of memory: no reply; the client times out. */
            free(buf);
            nng_msg_free(msg);
            continue;
        }
        free(buf);
        nng_aio_set_msg(w->aio, msg);
        nng_ctx_send(w->ctx, w->aio);
        nng_aio_wait(w->aio);
        rv = nng_aio_result(w->aio);
        if (rv != 0) {
            nng_msg_free(msg); /* a failed send leaves the message with us */
            if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
                break;
        }
    }
    return NULL;
}

/* True when an SP server answers at `url`: a full nng handshake. A raw connect() closed at once
 * must not be used as a probe: nng 1.5.2 stops accepting on a listener whose peer disconnects
 * during the handshake (nng issue #1518). */
static bool wire_is_served(const char *url)
{
    nng_socket s;
    if (nng_req0_open(&s) != 0)
        return false;
    int rv = nng_dial(s, url, NULL, 0); /* synchronous: returns once the handshake is done */
    nng_close(s);
    return rv == 0 || rv == NNG_ETIMEDOUT;
}

/* For ipc:// urls: COMMON_EBUSY when a live server answers at the socket file; removes a stale
 * socket file nobody answers on. */
static int wire_ipc_prepare(const char *url, struct common_errmsg *e)
{
    if (strncmp(url, WIRE_IPC_PREFIX, strlen(WIRE_IPC_PREFIX)) != 0)
        return COMMON_OK;
    const char *path = url + strlen(WIRE_IPC_PREFIX);
    struct stat st;
    if (lstat(path, &st) != 0)
        return COMMON_OK; /* nothing there */
    if (!S_ISSOCK(st.st_mode))
        return common_errmsg_set(e, COMMON_EBUSY, "%s: exists and is not a socket", url);
    if (wire_is_served(url))
        return common_errmsg_set(e, COMMON_EBUSY, "%s: another server is listening there", url);
    if (unlink(path) != 0 && errno != ENOENT)
        return common_errmsg_set(e, COMMON_EIO, "%s: cannot remove the stale socket: %s", url,
                                 strerror(errno));
    return COMMON_OK;
}

/* ---- listener watchdog ---------------------------------------------------------------------
 * nng 1.5.2 (nanomsg/nng#1518): when a peer connects and disconnects (with or without sending a
 * few bytes) before the SP handshake completes, the transport fails the listener's pending accept
 * with an error after which the core does not accept again (a silent peer that times out does no
 * harm; a reset one sometimes does not either, it depends on the error seen first): the
 * listener stays bound, the kernel still queues connections and the transport still completes
 * their handshakes (so a client's dial succeeds), but no new pipe ever reaches the socket and
 * every request on it times out. No option of the ipc transport avoids it.
 *
 * Detection: every WIRE_WATCH_TICK_MS the watchdog reads the listener's error counters (nng
 * statistics); when they moved (each such failure bumps one), or every WIRE_WATCH_FULL_MS anyway,
 * it probes: a private req0 socket dials the url and the watchdog waits for the server socket's
 * NNG_PIPE_EV_ADD_POST of this listener. That event is fired by nng itself once the pipe is
 * attached, whether or not a worker is free, so busy or blocked handlers never look like a broken
 * listener. When the probe's own dial completed its handshake but the server socket got no pipe
 * within WIRE_PROBE_MS, the listener is broken: it is closed (which also closes the connections
 * accepted through it: calls in flight on them fail with COMMON_ECLOSED and nng reconnects the
 * clients) and a new one is started on the same url. Recovery takes about a second (the tick,
 * then the probe's wait). nng 1.5.2 leaks a few KB per replaced listener when connections were
 * stuck in it (its transport never reaps them); ASan builds report that at exit. */

#if defined(__SANITIZE_ADDRESS__)
/* LeakSanitizer hook of every program that links this file (ASan builds only): nng 1.5.2 never
 * frees a replaced listener that had connections stuck in the handshake (reproduced without
 * sluice), and the watchdog replaces listeners by design, in any daemon whose listener broke.
 * Those leaks lie wholly inside libnng; sluice's own allocations are still checked. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libnng.so\n";
}
#endif

#define WIRE_WATCH_TICK_MS 500u
#define WIRE_WATCH_FULL_MS 2000u
#define WIRE_PROBE_MS      500u

/* Creates and starts s->listener on s->url (mode 0600 for ipc://). On failure names the step in
 * *what and leaves s->listening false. */
static int wire_listen(struct proto_server *s, const char **what)
{
    nng_listener l;
    *what = "listener";
    int rv = nng_listener_create(&l, s->sock, s->url);
    if (rv != 0)
        return rv;
    atomic_store(&s->listener_id, nng_listener_id(l));
    if (strncmp(s->url, WIRE_IPC_PREFIX, strlen(WIRE_IPC_PREFIX)) == 0) {
        *what = "ipc permissions";
        rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600);
    }
    if (rv == 0) {
        *what = "listen";
        rv = nng_listener_start(l, 0);
    }
    if (rv != 0) {
        nng_listener_close(l);
        return rv;
    }
    s->listener = l;
    s->listening = true;
    return 0;
}

/* Server socket: a pipe completed its handshake and was attached. */
static void wire_pipe_added(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct proto_server *s = arg;
    if (ev != NNG_PIPE_EV_ADD_POST ||
        nng_listener_id(nng_pipe_listener(p)) != atomic_load(&s->listener_id))
        return;
    pthread_mutex_lock(&s->mu);
    s->added++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

/* One probe's socket and what its pipe callback sets. The callback gets this, never the server:
 * the socket is closed on a thread of its own (wire_close_detached), which may outlive the server
 * when nng_close() hangs. */
struct wire_probe_sock {
    nng_socket  sock;
    atomic_bool added; /* the probe's own handshake completed (client side) */
};

/* Probe socket: its own handshake completed. */
static void wire_probe_added(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    struct wire_probe_sock *ps = arg;
    if (ev == NNG_PIPE_EV_ADD_POST)
        atomic_store(&ps->added, true);
}

/* A socket to close, and what to free once it is closed (what its callbacks may use until); with
 * a waiter (wire_close_bounded), done and refs under mu: the last of closer and waiter frees it. */
struct wire_closing {
    nng_socket      sock;
    void           *owned;
    bool            waited;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    bool            done;
    int             refs;
};

/* Drops one of the closer's and the waiter's references; frees c with the last. */
static void wire_closing_put(struct wire_closing *c)
{
    bool last = true;
    if (c->waited) {
        pthread_mutex_lock(&c->mu);
        last = --c->refs == 0;
        pthread_mutex_unlock(&c->mu);
    }
    if (last) {
        if (c->waited) {
            pthread_mutex_destroy(&c->mu);
            pthread_cond_destroy(&c->cv);
        }
        free(c);
    }
}

static void *wire_closer_main(void *arg)
{
    struct wire_closing *c = arg;
    nng_close(c->sock);
    free(c->owned);
    if (c->waited) {
        pthread_mutex_lock(&c->mu);
        c->done = true;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    wire_closing_put(c);
    return NULL;
}

/* Runs the closer of c on a detached thread; false when none can be made. */
static bool wire_closer_spawn(struct wire_closing *c)
{
    pthread_attr_t attr;
    pthread_t      t;
    bool           started = false;
    if (pthread_attr_init(&attr) == 0) {
        if (pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0)
            started = pthread_create(&t, &attr, wire_closer_main, c) == 0;
        pthread_attr_destroy(&attr);
    }
    return started;
}

/* Closes `sock` without waiting for it, then frees `owned`: nng 1.5.2's nng_close() hangs for
 * good on a socket whose dialer saw a handshake fail (its ipc transport frees the failed pipe but
 * leaves it on the endpoint's list that close walks; fixed upstream in 2024). That happens to a
 * probe (a router resumed after a 20 s SIGSTOP) and to a client whose server was killed while it
 * connected (a router waiting for an executor killed right after its start, seen in CI): the
 * caller must go on. When no thread can be made, it closes here. */
static void wire_close_detached(nng_socket sock, void *owned)
{
    struct wire_closing *c = calloc(1, sizeof(*c));
    if (!c) {
        nng_close(sock);
        free(owned);
        return;
    }
    c->sock = sock;
    c->owned = owned;
    if (!wire_closer_spawn(c))
        wire_closer_main(c);
}

/* A CLOCK_MONOTONIC deadline `ms` from now. */
static struct timespec wire_deadline(unsigned ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000u);
    ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* wire_close_detached, waiting up to ms for the close: as nng_close() for the caller whenever it
 * returns, and a return all the same when it hangs (the hang above; seen in CI as a client whose
 * dialer met a flood of bare connections). */
static void wire_close_bounded(nng_socket sock, unsigned ms)
{
    struct wire_closing *c = calloc(1, sizeof(*c));
    pthread_condattr_t   ca;
    bool                 ok = c && pthread_condattr_init(&ca) == 0;
    if (ok) {
        ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
             pthread_cond_init(&c->cv, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (ok && pthread_mutex_init(&c->mu, NULL) != 0) {
        pthread_cond_destroy(&c->cv);
        ok = false;
    }
    if (!ok) {
        free(c);
        nng_close(sock);
        return;
    }
    c->sock = sock;
    c->waited = true;
    c->refs = 2;
    if (!wire_closer_spawn(c)) {
        c->refs = 1;
        wire_closer_main(c); /* frees c */
        return;
    }
    const struct timespec dl = wire_deadline(ms);
    pthread_mutex_lock(&c->mu);
    while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &dl) == 0)
        ;
    pthread_mutex_unlock(&c->mu);
    wire_closing_put(c);
}

/* Sum of the listener's failed-accept counters, or -1 when nng keeps no statistics for it. */
static int64_t wire_listener_errors(struct proto_server *s)
{
    nng_stat *root = NULL;
    if (nng_stats_get(&root) != 0)
        return -1;
    int64_t   sum = -1;
    nng_stat *ls = nng_stat_find_listener(root, s->listener);
    if (ls) {
        sum = 0;
        for (nng_stat *x = nng_stat_child(ls); x; x = nng_stat_next(x))
            if (nng_stat_type(x) == NNG_STAT_COUNTER && strcmp(nng_stat_name(x), "accept") != 0)
                sum += (int64_t)nng_stat_value(x);
    }
    nng_stats_free(root);
    return sum;
}

/* 1: the listener attaches new pipes; 0: it is broken (a dial completed its handshake, the
 * socket got no pipe); -1: no answer either way (the dial did not complete, or stopping). */
static int wire_probe(struct proto_server *s)
{
    struct wire_probe_sock *ps = calloc(1, sizeof(*ps));
    if (!ps)
        return -1;
    if (nng_req0_open(&ps->sock) != 0) {
        free(ps);
        return -1;
    }
    pthread_mutex_lock(&s->mu);
    uint64_t base = s->added;
    pthread_mutex_unlock(&s->mu);
    int rv = nng_pipe_notify(ps->sock, NNG_PIPE_EV_ADD_POST, wire_probe_added, ps);
    if (rv == 0)
        rv = nng_dial(ps->sock, s->url, NULL, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        wire_close_detached(ps->sock, ps);
        return -1;
    }
    struct timespec until = wire_deadline(WIRE_PROBE_MS);
    pthread_mutex_lock(&s->mu);
    /* Also wait for the probe's own side: nng 1.5.2 leaks the dialer's pipe when its socket is
     * closed before the dialer finished the handshake. Its flag is polled (every 10 ms): its
     * callback does not signal the server's condition. */
    while (!s->stopping && (s->added == base || !atomic_load(&ps->added))) {
        struct timespec slice = wire_deadline(10);
        bool            last = slice.tv_sec > until.tv_sec ||
                    (slice.tv_sec == until.tv_sec && slice.tv_nsec >= until.tv_nsec);
        if (pthread_cond_timedwait(&s->cond, &s->mu, last ? &until : &slice) == ETIMEDOUT && last)
            break;
    }
    bool probe_added = atomic_load(&ps->added);
    int  result = s->added != base ? 1 : s->stopping || !probe_added ? -1 : 0;
    pthread_mutex_unlock(&s->mu);
    wire_close_detached(ps->sock, ps);
    return result;
}

/* Replaces a broken listener: close it (nng removes its socket file), start a new one. */
static void wire_relisten(struct proto_server *s)
{
    if (s->listening) {
        nng_listener_close(s->listener);
        s->listening = false;
        atomic_fetch_add(&s->restarts, 1);
    }
    if (strncmp(s->url, WIRE_IPC_PREFIX, strlen(WIRE_IPC_PREFIX)) == 0) {
        const char *path = s->url + strlen(WIRE_IPC_PREFIX);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
            unlink(path);
    }
    const char *what = "";
    int         rv = wire_listen(s, &what);
    if (rv != 0)
        COMMON_LOG_ERR("wire", "%s: restarting the listener: %s: %s (retrying)", s->url, what,
                       nng_strerror(rv));
    else
        COMMON_LOG_WARN("wire", "%s: the listener stopped accepting (nng#1518); restarted it",
                        s->url);
}

static void *wire_watchdog_main(void *p)
{
    struct proto_server *s = p;
    int64_t              base = wire_listener_errors(s);
    unsigned             since_full = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stopping) {
        struct timespec until = wire_deadline(WIRE_WATCH_TICK_MS);
        while (!s->stopping && pthread_cond_timedwait(&s->cond, &s->mu, &until) != ETIMEDOUT) {
        }
        if (s->stopping)
            break;
        pthread_mutex_unlock(&s->mu);
        since_full += WIRE_WATCH_TICK_MS;
        if (!s->listening) {
            wire_relisten(s); /* the last restart failed */
            base = 0;
        } else {
            /* Read before probing: a failure after this read moves the counters again. */
            int64_t errs = wire_listener_errors(s);
            if (errs < 0 || errs != base || since_full >= WIRE_WATCH_FULL_MS) {
                since_full = 0;
                if (wire_probe(s) == 0) {
                    wire_relisten(s);
                    errs = 0; /* a new listener's counters start at 0 */
                }
            }
            base = errs;
        }
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int proto_server_start(const char *url, const struct proto_server_opts *o, proto_handler_fn handler,
                       void *arg, struct proto_server **out, struct common_errmsg *e)
{
    uint32_t n_workers = o && o->n_workers ? o->n_workers : WIRE_DEFAULT_WORKERS;
    uint32_t recv_max = o && o->recv_max ? o->recv_max : PROTO_MAX_MESSAGE_BYTES;
    if (!url || !handler || !out)
        return common_errmsg_set(e, COMMON_EINVAL, "proto_server_start: missing argument");
    int rc = wire_ipc_prepare(url, e);
    if (rc != COMMON_OK)
        return rc;

    struct proto_server *s = calloc(1, sizeof(*s));
    if (!s)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", url);
    s->handler = handler;
    s->arg = arg;
    s->n_workers = n_workers;
    s->workers = calloc(n_workers, sizeof(*s->workers));
    s->url = strdup(url);
    pthread_condattr_t ca;
    bool               sync_ok = false;
    if (pthread_condattr_init(&ca) == 0) {
        if (pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
            pthread_mutex_init(&s->mu, NULL) == 0) {
            sync_ok = pthread_cond_init(&s->cond, &ca) == 0;
            if (!sync_ok)
                pthread_mutex_destroy(&s->mu);
        }
        pthread_condattr_destroy(&ca);
    }
    if (!s->workers || !s->url || !sync_ok) {
        if (sync_ok) {
            pthread_cond_destroy(&s->cond);
            pthread_mutex_destroy(&s->mu);
        }
        free(s->workers);
        free(s->url);
        free(s);
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", url);
    }
    s->sync_ready = true;
    atomic_store(&s->listener_id, -1);
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->mu);
        free(s->workers);
        free(s->url);
        free(s);
        return common_errmsg_set(e, wire_err(rv), "%s: rep socket: %s", url, nng_strerror(rv));
    }
    const char *what = "pipe notify";
    rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, wire_pipe_added, s);
    if (rv == 0) {
        what = "recv-size-max";
        rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, recv_max);
    }
    for (uint32_t i = 0; rv == 0 && i < n_workers; i++) {
        struct wire_worker *w = &s->workers[i];
        w->server = s;
        w->req = calloc(1, sizeof(*w->req));
        w->rep = calloc(1, sizeof(*w->rep));
        what = "context";
        if (!w->req || !w->rep)
            rv = NNG_ENOMEM;
        if (rv == 0)
            rv = nng_aio_alloc(&w->aio, NULL, NULL);
        if (rv == 0)
            rv = nng_ctx_open(&w->ctx, s->sock);
    }
    if (rv == 0)
        rv = wire_listen(s, &what);
    if (rv != 0) {
        rc = wire_err(rv);
        common_errmsg_set(e,
                          rc == COMMON_EBUSY    ? COMMON_EBUSY
                          : rc == COMMON_ENOMEM ? rc
                                                : COMMON_EIO,
                          "%s: %s: %s", url, what, nng_strerror(rv));
        proto_server_stop(s);
        return rc == COMMON_EBUSY || rc == COMMON_ENOMEM ? rc : COMMON_EIO;
    }
    for (uint32_t i = 0; i < n_workers; i++) {
        struct wire_worker *w = &s->workers[i];
        if (pthread_create(&w->thread, NULL, wire_worker_main, w) != 0) {
            proto_server_stop(s);
            return common_errmsg_set(e, COMMON_ENOMEM, "%s: cannot start worker threads", url);
        }
        w->started = true;
    }
    /* Only ipc:// urls are watched: a tcp:// listener may be bound to a wildcard address that
     * cannot be dialed as it is written. */
    if (strncmp(url, WIRE_IPC_PREFIX, strlen(WIRE_IPC_PREFIX)) == 0) {
        if (pthread_create(&s->watchdog, NULL, wire_watchdog_main, s) != 0) {
            proto_server_stop(s);
            return common_errmsg_set(e, COMMON_ENOMEM, "%s: cannot start the watchdog", url);
        }
        s->watchdog_started = true;
    }
    *out = s;
    return COMMON_OK;
}

void proto_server_stop(struct proto_server *s)
{
    if (!s)
        return;
    if (s->watchdog_started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->watchdog, NULL);
    }
    /* Stopping an aio cancels its pending receive or send and makes every later operation on it
     * fail with NNG_ECANCELED, so each worker leaves after its current handler. The socket is
     * closed only once no thread can touch its contexts: in nng 1.5.2 an operation on a context
     * racing with nng_close() can use freed memory. */
    for (uint32_t i = 0; i < s->n_workers; i++)
        if (s->workers[i].aio)
            nng_aio_stop(s->workers[i].aio);
    for (uint32_t i = 0; i < s->n_workers; i++) {
        struct wire_worker *w = &s->workers[i];
        if (w->started)
            pthread_join(w->thread, NULL);
    }
    nng_close(s->sock);
    for (uint32_t i = 0; i < s->n_workers; i++) {
        struct wire_worker *w = &s->workers[i];
        if (w->aio)
            nng_aio_free(w->aio);
        free(w->req);
        free(w->rep);
    }
    if (s->sync_ready) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->mu);
    }
    free(s->workers);
    free(s->url);
    free(s);
}

void proto_server_counts(const struct proto_server *s, uint64_t *served, uint64_t *refused)
{
    if (served)
        *served = atomic_load_explicit(&s->served, memory_order_relaxed);
    if (refused)
        *refused = atomic_load_explicit(&s->refused, memory_order_relaxed);
}

uint64_t proto_server_listener_restarts(const struct proto_server *s)
{
    return s ? atomic_load_explicit(&s->restarts, memory_order_relaxed) : 0;
}

/* ---- client --------------------------------------------------------------------------------- */

#define WIRE_MAX_URL 512u

struct proto_client {
    nng_socket sock;              /* req0, dialed in the background */
    char       url[WIRE_MAX_URL]; /* for messages */
};

/* Opens a req0 socket dialing `url` in the background into *out. */
static int wire_client_sock(const char *url, nng_socket *out, struct common_errmsg *e)
{
    nng_socket  sock;
    const char *what = "req socket";
    int         rv = nng_req0_open(&sock);
    if (rv != 0)
        return common_errmsg_set(e, wire_err(rv) == COMMON_ENOMEM ? COMMON_ENOMEM : COMMON_EIO,
                                 "%s: %s: %s", url, what, nng_strerror(rv));
    /* A request goes out once: after a reconnection to a restarted server it is not re-sent
     * behind the caller's back (the call fails with COMMON_ECLOSED instead). */
    what = "resend time";
    rv = nng_socket_set_ms(sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0) {
        what = "recv-size-max";
        rv = nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, PROTO_MAX_MESSAGE_BYTES);
    }
    if (rv == 0) {
        what = "reconnect time";
        rv = nng_socket_set_ms(sock, NNG_OPT_RECONNMINT, 20);
    }
    if (rv == 0)
        rv = nng_socket_set_ms(sock, NNG_OPT_RECONNMAXT, 500);
    if (rv == 0) {
        what = "dial";
        rv = nng_dial(sock, url, NULL, NNG_FLAG_NONBLOCK);
    }
    if (rv != 0) {
        nng_close(sock);
        return common_errmsg_set(e, wire_err(rv) == COMMON_ENOMEM ? COMMON_ENOMEM : COMMON_EIO,
                                 "%s: %s: %s", url, what, nng_strerror(rv));
    }
    *out = sock;
    return COMMON_OK;
}

int proto_client_open(const char *url, struct proto_client **out, struct common_errmsg *e)
{
    if (!url || !out || strlen(url) >= WIRE_MAX_URL)
        return common_errmsg_set(e, COMMON_EIO, "bad url");
    struct proto_client *c = calloc(1, sizeof(*c));
    if (!c)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", url);
    memcpy(c->url, url, strlen(url) + 1);
    int rc = wire_client_sock(url, &c->sock, e);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return COMMON_OK;
}

int proto_client_reopen(struct proto_client *c, struct common_errmsg *e)
{
    nng_socket fresh;
    int        rc = wire_client_sock(c->url, &fresh, e);
    if (rc < 0)
        return rc;
    wire_close_detached(c->sock, NULL); /* the old one may be stuck in a failed handshake */
    c->sock = fresh;
    return COMMON_OK;
}

void proto_client_close(struct proto_client *c)
{
    if (!c)
        return;
    wire_close_bounded(c->sock, WIRE_CLIENT_CLOSE_MS);
    free(c);
}

/* Maps a failed send/receive of a call to a common_err with a message naming the url. */
static int wire_call_err(const struct proto_client *c, int rv, int timeout_ms,
                         struct common_errmsg *e)
{
    switch (rv) {
    case NNG_ETIMEDOUT:
        return common_errmsg_set(e, COMMON_ETIMEDOUT, "no reply from %s in %d ms", c->url,
                                 timeout_ms);
    case NNG_ECONNRESET:
    case NNG_ECONNSHUT:
        return common_errmsg_set(e, COMMON_ECLOSED, "%s closed the connection before replying",
                                 c->url);
    case NNG_ECLOSED:
        return common_errmsg_set(e, COMMON_ECLOSED, "%s: client closed", c->url);
    case NNG_ENOMEM:
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", c->url);
    default:
        return common_errmsg_set(e, COMMON_EIO, "%s: %s", c->url, nng_strerror(rv));
    }
}

int proto_client_call(struct proto_client *c, const struct proto_msg *req, struct proto_msg *rep,
                      int timeout_ms, struct common_errmsg *e)
{
    uint8_t *buf = NULL;
    size_t   len = 0;
    int      rc = proto_encode(req, &buf, &len);
    if (rc != COMMON_OK)
        return common_errmsg_set(e, rc, "%s: request (%s) does not encode: %s", c->url,
                                 proto_kind_name(req->kind), common_strerror(rc));
    uint64_t deadline = common_now_ns() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0) * 1000000u;
    nng_duration tmo = timeout_ms < 0 ? NNG_DURATION_INFINITE : timeout_ms;
    nng_ctx      ctx;
    nng_aio     *aio = NULL;
    nng_msg     *msg = NULL;
    int          rv = nng_ctx_open(&ctx, c->sock);
    if (rv != 0) {
        free(buf);
        return wire_call_err(c, rv, timeout_ms, e);
    }
    rv = nng_aio_alloc(&aio, NULL, NULL);
    if (rv == 0)
        rv = nng_msg_alloc(&msg, 0);
    if (rv == 0)
        rv = nng_msg_append(msg, buf, len);
    free(buf);
    if (rv == 0) {
        nng_aio_set_timeout(aio, tmo);
        nng_aio_set_msg(aio, msg);
        nng_ctx_send(ctx, aio);
        nng_aio_wait(aio);
        rv = nng_aio_result(aio);
        if (rv == 0)
            msg = NULL; /* taken by the send */
    }
    if (rv == 0) {
        if (timeout_ms >= 0) {
            uint64_t now = common_now_ns();
            tmo = now >= deadline ? 0 : (nng_duration)((deadline - now + 999999u) / 1000000u);
        }
        nng_aio_set_timeout(aio, tmo);
        nng_ctx_recv(ctx, aio);
        nng_aio_wait(aio);
        rv = nng_aio_result(aio);
        if (rv == 0)
            msg = nng_aio_get_msg(aio);
    }
    if (rv == 0) {
        rc = proto_decode(nng_msg_body(msg), nng_msg_len(msg), rep);
        if (rc != COMMON_OK)
            common_errmsg_set(e, rc, "%s: the reply (%zu bytes) does not decode: %s", c->url,
                              nng_msg_len(msg), common_strerror(rc));
    } else {
        rc = wire_call_err(c, rv, timeout_ms, e);
    }
    if (msg)
        nng_msg_free(msg);
    if (aio)
        nng_aio_free(aio);
    nng_ctx_close(ctx);
    return rc;
}

int proto_call(const char *url, const struct proto_msg *req, struct proto_msg *rep, int timeout_ms,
               struct common_errmsg *e)
{
    struct proto_client *c = NULL;
    int                  rc = proto_client_open(url, &c, e);
    if (rc != COMMON_OK)
        return rc;
    rc = proto_client_call(c, req, rep, timeout_ms, e);
    if (rc == COMMON_OK) /* its one pipe's handshake completed: a plain close, at once */
        nng_close(c->sock);
    else /* its pipe may be stuck in a handshake, where nng_close() never returns (seen:
            `sluice ctl health` of a router starting on a loaded machine, for minutes) */
        wire_close_detached(c->sock, NULL);
    free(c);
    return rc;
}
