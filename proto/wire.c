/* proto/wire.c - control messages over nng: a rep0 server with worker threads, a req0 client. */
#include "wire.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#define WIRE_DEFAULT_WORKERS 4u
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
    if (!s->workers) {
        free(s);
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", url);
    }
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        free(s->workers);
        free(s);
        return common_errmsg_set(e, wire_err(rv), "%s: rep socket: %s", url, nng_strerror(rv));
    }
    rv = nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, recv_max);
    const char *what = "recv-size-max";
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
    nng_listener l;
    if (rv == 0) {
        what = "listener";
        rv = nng_listener_create(&l, s->sock, url);
    }
    if (rv == 0 && strncmp(url, WIRE_IPC_PREFIX, strlen(WIRE_IPC_PREFIX)) == 0) {
        what = "ipc permissions";
        rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, 0600);
    }
    if (rv == 0) {
        what = "listen";
        rv = nng_listener_start(l, 0);
    }
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
    *out = s;
    return COMMON_OK;
}

void proto_server_stop(struct proto_server *s)
{
    if (!s)
        return;
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
    free(s->workers);
    free(s);
}

void proto_server_counts(const struct proto_server *s, uint64_t *served, uint64_t *refused)
{
    if (served)
        *served = atomic_load_explicit(&s->served, memory_order_relaxed);
    if (refused)
        *refused = atomic_load_explicit(&s->refused, memory_order_relaxed);
}

/* ---- client --------------------------------------------------------------------------------- */

#define WIRE_MAX_URL 512u

struct proto_client {
    nng_socket sock;              /* req0, dialed in the background */
    char       url[WIRE_MAX_URL]; /* for messages */
};

int proto_client_open(const char *url, struct proto_client **out, struct common_errmsg *e)
{
    if (!url || !out || strlen(url) >= WIRE_MAX_URL)
        return common_errmsg_set(e, COMMON_EIO, "bad url");
    struct proto_client *c = calloc(1, sizeof(*c));
    if (!c)
        return common_errmsg_set(e, COMMON_ENOMEM, "%s: out of memory", url);
    memcpy(c->url, url, strlen(url) + 1);
    const char *what = "req socket";
    int         rv = nng_req0_open(&c->sock);
    if (rv != 0) {
        free(c);
        return common_errmsg_set(e, wire_err(rv) == COMMON_ENOMEM ? COMMON_ENOMEM : COMMON_EIO,
                                 "%s: %s: %s", url, what, nng_strerror(rv));
    }
    /* A request goes out once: after a reconnection to a restarted server it is not re-sent
     * behind the caller's back (the call fails with COMMON_ECLOSED instead). */
    what = "resend time";
    rv = nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    if (rv == 0) {
        what = "recv-size-max";
        rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, PROTO_MAX_MESSAGE_BYTES);
    }
    if (rv == 0) {
        what = "reconnect time";
        rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20);
    }
    if (rv == 0)
        rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500);
    if (rv == 0) {
        what = "dial";
        rv = nng_dial(c->sock, url, NULL, NNG_FLAG_NONBLOCK);
    }
    if (rv != 0) {
        nng_close(c->sock);
        free(c);
        return common_errmsg_set(e, wire_err(rv) == COMMON_ENOMEM ? COMMON_ENOMEM : COMMON_EIO,
                                 "%s: %s: %s", url, what, nng_strerror(rv));
    }
    *out = c;
    return COMMON_OK;
}

void proto_client_close(struct proto_client *c)
{
    if (!c)
        return;
    nng_close(c->sock);
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
    proto_client_close(c);
    return rc;
}
