/* router/http.c - the router's OpenAI-compatible HTTP front end on nng's HTTP server: routes,
 * API key, body limit, and one thread per generation that runs it through the scheduler. */
#include "serve_impl.h"

#include <arpa/inet.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "metrics.h"
#include "openai.h"

#define HTTP_COMP             "router.http"
#define HTTP_DEFAULT_MAX_BODY (1u << 20)
#define HTTP_POLL_MS          1000u /* a generation's worker looks at `stopping` this often */
#define HTTP_IO_MS            30000 /* a client that sends or takes nothing this long is dropped */
#define HTTP_GONE_WAIT_MS     5000u /* at stop: how long nng may take to release the handler */

/* The server. Handler callbacks run on nng's threads and only read it; n_busy and gone are
 * guarded by mu. */
struct router_http {
    struct router_serve *s;                             /* borrowed: owns this */
    nng_http_server     *server;                        /* owned: held, started */
    char                 url[256];                      /* "http://HOST:PORT" with the bound port */
    char                 url_file[PROTO_MAX_PATH + 32]; /* RUN_DIR/router.http */
    char                 model_id[256];                 /* file name without ".gguf" */
    char                 file_name[256];                /* file name */
    const char          *models[4]; /* names a request may give, NULL-terminated */
    uint64_t             max_body;  /* bytes */
    pthread_mutex_t      mu;
    pthread_cond_t       cv;     /* n_busy dropped, or the handler is gone */
    uint32_t             n_busy; /* exchanges alive (body reads, generation threads) */
    bool                 gone;   /* nng released the handler: no callback runs any more */
    bool                 added;  /* the handler was handed to the server */
};

/* A completion request past its headers: its body to read, then its generation. */
struct http_xchg {
    struct router_http *h;        /* borrowed */
    nng_aio            *aio;      /* borrowed: the handler's; finished once, then NULL */
    nng_http_req       *req;      /* borrowed from the server; owned after a hijack */
    nng_http_conn      *conn;     /* borrowed from the server; owned after a hijack */
    nng_aio            *rd;       /* owned: the body read */
    nng_aio            *wr;       /* owned: the stream's writes (waited for) */
    enum openai_kind    kind;     /* which endpoint */
    char               *body;     /* owned: body_len bytes, then a NUL */
    size_t              body_len; /* from Content-Length, <= max_body */
    struct openai_req   oreq;     /* the parsed request */
    uint64_t            id;       /* the router request's id */
    char                oid[48];  /* "cmpl-<hex>" / "chatcmpl-<hex>" */
    int64_t             created;  /* unix seconds */
};

/* ---- replies ------------------------------------------------------------------------------ */

/* Finishes the handler's aio with a JSON answer (takes `json`; NULL: out of memory, the
 * connection is closed instead). `close`: the connection closes after it. `allow`: the method
 * a 405 names, else NULL. */
static void http_reply_allow(nng_aio *aio, uint16_t status, char *json, bool close,
                             const char *allow)
{
    nng_http_res *res = NULL;
    if (!json || nng_http_res_alloc(&res) != 0 || nng_http_res_set_status(res, status) != 0 ||
        nng_http_res_set_header(res, "Content-Type", "application/json") != 0 ||
        (close && nng_http_res_set_header(res, "Connection", "close") != 0) ||
        (status == 401 && nng_http_res_set_header(res, "WWW-Authenticate", "Bearer") != 0) ||
        (allow && nng_http_res_set_header(res, "Allow", allow) != 0) ||
        nng_http_res_copy_data(res, json, strlen(json)) != 0) {
        if (res)
            nng_http_res_free(res);
        free(json);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    free(json);
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

/* Finishes the handler's aio with a 200 of `text` (taken; NULL: out of memory) as `type`. */
static void http_reply_text(nng_aio *aio, char *text, const char *type, bool close)
{
    nng_http_res *res = NULL;
    if (!text || nng_http_res_alloc(&res) != 0 ||
        nng_http_res_set_header(res, "Content-Type", type) != 0 ||
        (close && nng_http_res_set_header(res, "Connection", "close") != 0) ||
        nng_http_res_copy_data(res, text, strlen(text)) != 0) {
        if (res)
            nng_http_res_free(res);
        free(text);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    free(text);
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void http_reply(nng_aio *aio, uint16_t status, char *json, bool close)
{
    http_reply_allow(aio, status, json, close, NULL);
}

static void http_reply_err(nng_aio *aio, const struct openai_err *err, bool close)
{
    http_reply(aio, err->status, openai_error_json(err), close);
}

/* The HTTP answer to a router error (a common_err code and its text). */
static void http_err_from(struct openai_err *err, int code, const char *text)
{
    switch (code) {
    case COMMON_EINVAL:
        openai_err_set(err, 400, "invalid_request_error", NULL, NULL, "%s", text);
        break;
    case COMMON_ERANGE:
        openai_err_set(err, 400, "invalid_request_error", "context_length_exceeded", NULL, "%s",
                       text);
        break;
    case COMMON_EBUSY:
        openai_err_set(err, 503, "server_error", "server_busy", NULL, "%s", text);
        break;
    default:
        openai_err_set(err, 500, "server_error", NULL, NULL, "%s", text);
        break;
    }
}

/* ---- exchanges ---------------------------------------------------------------------------- */

static void http_busy(struct router_http *h, int delta)
{
    pthread_mutex_lock(&h->mu);
    h->n_busy = (uint32_t)((int)h->n_busy + delta);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static bool serve_is_stopping(struct router_serve *s)
{
    pthread_mutex_lock(&s->mu);
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->mu);
    return stopping;
}

/* Frees an exchange whose handler aio is finished (or hijacked). */
static void xchg_free(struct http_xchg *x)
{
    struct router_http *h = x->h;
    if (x->rd)
        nng_aio_free(x->rd);
    if (x->wr)
        nng_aio_free(x->wr);
    openai_req_fini(&x->oreq);
    free(x->body);
    free(x);
    http_busy(h, -1);
}

/* Writes n bytes on the hijacked connection; returns 0 or an nng error. */
static int xchg_write(struct http_xchg *x, char *p, size_t n)
{
    nng_iov iov = {.iov_buf = p, .iov_len = n};
    if (nng_aio_set_iov(x->wr, 1, &iov) != 0)
        return NNG_ENOMEM;
    nng_aio_set_timeout(x->wr, HTTP_IO_MS);
    nng_http_conn_write_all(x->conn, x->wr);
    nng_aio_wait(x->wr);
    return nng_aio_result(x->wr);
}

/* Writes one server-sent event "data: JSON\n\n" (takes `json`). */
static int xchg_event(struct http_xchg *x, char *json)
{
    if (!json)
        return NNG_ENOMEM;
    size_t n = strlen(json);
    char  *ev = malloc(n + 9);
    int    rc = NNG_ENOMEM;
    if (ev) {
        memcpy(ev, "data: ", 6);
        memcpy(ev + 6, json, n);
        memcpy(ev + 6 + n, "\n\n", 3);
        rc = xchg_write(x, ev, n + 8);
    }
    free(ev);
    free(json);
    return rc;
}

static void rq_cancel(struct router_serve *s, uint64_t id)
{
    struct proto_msg q = {.kind = PROTO_KIND_CANCEL, .request_id = id}, rep = {0};
    (void)router_handle_cancel(s, &q, &rep);
}

/* One long poll of the request; returns 0 with the events in *rep, or a negative common_err
 * with rep an ERROR. */
static int rq_poll(struct router_serve *s, uint64_t id, struct proto_msg *rep)
{
    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = id};
    q.u.poll.timeout_ms = HTTP_POLL_MS;
    memset(rep, 0, sizeof(*rep));
    return router_handle_poll(s, &q, rep);
}

static const char *finish_name(enum proto_stop_reason r)
{
    return r == PROTO_STOP_LENGTH || r == PROTO_STOP_CONTEXT ? "length" : "stop";
}

/* A non-streamed generation: polls to the end, answers one JSON object. */
static void xchg_run_whole(struct http_xchg *x)
{
    struct router_serve *s = x->h->s;
    struct router_text   text = {0};
    struct openai_err    err = {0};
    struct proto_msg     rep;
    bool                 failed = false;
    for (;;) {
        int rc = rq_poll(s, x->id, &rep);
        if (rc < 0) {
            http_err_from(&err, rc, rep.u.error.message);
            failed = true;
            break;
        }
        struct proto_events *ev = &rep.u.events;
        if (rep.kind == PROTO_KIND_EVENTS && ev->text_len &&
            router_text_append(&text, ev->text, ev->text_len) < 0) {
            proto_msg_clear(&rep);
            rq_cancel(s, x->id);
            http_err_from(&err, COMMON_ENOMEM, "out of memory");
            failed = true;
            break;
        }
        if (rep.kind == PROTO_KIND_EVENTS && ev->done) {
            if (ev->reason == PROTO_STOP_ERROR || ev->reason == PROTO_STOP_CANCEL) {
                http_err_from(&err, ev->reason == PROTO_STOP_ERROR ? ev->error_code : COMMON_EBUSY,
                              ev->reason == PROTO_STOP_ERROR ? ev->error_text
                                                             : "the request was cancelled");
                failed = true;
            } else {
                struct openai_out o = {.kind = x->kind,
                                       .id = x->oid,
                                       .created = x->created,
                                       .model = x->h->model_id,
                                       .text = text.ptr,
                                       .text_len = text.len,
                                       .finish = finish_name(ev->reason),
                                       .usage = true,
                                       .n_prompt = ev->stats.n_prompt,
                                       .n_generated = ev->stats.n_generated};
                char             *json = openai_result_json(&o);
                proto_msg_clear(&rep);
                router_text_fini(&text);
                http_reply(x->aio, 200, json, false);
                x->aio = NULL;
                return;
            }
            proto_msg_clear(&rep);
            break;
        }
        proto_msg_clear(&rep);
        if (serve_is_stopping(s)) {
            rq_cancel(s, x->id);
            http_err_from(&err, COMMON_EBUSY, "the router is stopping");
            failed = true;
            break;
        }
    }
    router_text_fini(&text);
    if (failed) {
        http_reply_err(x->aio, &err, false);
        x->aio = NULL;
    }
}

/* A streamed generation: takes the connection over and writes server-sent events. */
static void xchg_run_stream(struct http_xchg *x)
{
    struct router_serve *s = x->h->s;
    /* After the hijack the connection and the request are ours; the server forgets them. */
    nng_http_hijack(x->conn);
    nng_aio_set_output(x->aio, 0, NULL);
    nng_aio_finish(x->aio, 0);
    x->aio = NULL;
    char head[] = "HTTP/1.1 200 OK\r\n"
                  "Content-Type: text/event-stream\r\n"
                  "Cache-Control: no-cache\r\n"
                  "Connection: close\r\n\r\n";
    int  rc = nng_aio_alloc(&x->wr, NULL, NULL);
    if (rc == 0)
        rc = xchg_write(x, head, sizeof(head) - 1);
    struct openai_out o = {
        .kind = x->kind, .id = x->oid, .created = x->created, .model = x->h->model_id};
    if (rc == 0 && x->kind == OPENAI_CHAT) { /* OpenAI's first chunk: the role, no text */
        o.role = true;
        rc = xchg_event(x, openai_chunk_json(&o));
        o.role = false;
    }
    bool done = false;
    while (rc == 0 && !done) {
        struct proto_msg rep;
        int              prc = rq_poll(s, x->id, &rep);
        if (prc < 0) {
            struct openai_err err;
            http_err_from(&err, prc, rep.u.error.message);
            rc = xchg_event(x, openai_error_json(&err));
            break;
        }
        struct proto_events *ev = &rep.u.events;
        if (rep.kind == PROTO_KIND_EVENTS && ev->text_len) {
            o.text = ev->text;
            o.text_len = ev->text_len;
            rc = xchg_event(x, openai_chunk_json(&o));
            o.text = NULL;
            o.text_len = 0;
        }
        if (rc == 0 && rep.kind == PROTO_KIND_EVENTS && ev->done) {
            done = true;
            if (ev->reason == PROTO_STOP_ERROR || ev->reason == PROTO_STOP_CANCEL) {
                struct openai_err err;
                http_err_from(&err, ev->reason == PROTO_STOP_ERROR ? ev->error_code : COMMON_EBUSY,
                              ev->reason == PROTO_STOP_ERROR ? ev->error_text
                                                             : "the request was cancelled");
                rc = xchg_event(x, openai_error_json(&err));
            } else {
                o.finish = finish_name(ev->reason);
                o.usage = true;
                o.n_prompt = ev->stats.n_prompt;
                o.n_generated = ev->stats.n_generated;
                rc = xchg_event(x, openai_chunk_json(&o));
                char fin[] = "data: [DONE]\n\n";
                if (rc == 0)
                    rc = xchg_write(x, fin, sizeof(fin) - 1);
            }
        }
        proto_msg_clear(&rep);
        if (!done && rc == 0 && serve_is_stopping(s)) {
            struct openai_err err;
            http_err_from(&err, COMMON_EBUSY, "the router is stopping");
            (void)xchg_event(x, openai_error_json(&err));
            rc = NNG_ECLOSED;
        }
    }
    if (!done) {
        COMMON_LOG_INFO(HTTP_COMP, "stream %s ended early: %s", x->oid, nng_strerror(rc));
        rq_cancel(s, x->id); /* the client went away: free its sequence */
    }
    nng_http_conn_close(x->conn);
    nng_http_req_free(x->req);
}

/* The thread of one generation: queues it with the scheduler, answers, frees the exchange. */
static void *xchg_main(void *arg)
{
    struct http_xchg    *x = arg;
    struct router_serve *s = x->h->s;
    struct proto_msg     rep = {0};
    x->id = common_random_id() | 1u; /* 0 is reserved */
    snprintf(x->oid, sizeof(x->oid), "%s-%016llx", x->kind == OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)x->id);
    x->created = (int64_t)time(NULL);
    int rc = router_rq_submit(s, x->id, &x->oreq.gen, &x->oreq.extra, &rep);
    if (rc < 0) {
        struct openai_err err;
        http_err_from(&err, rc, rep.u.error.message);
        http_reply_err(x->aio, &err, false);
        x->aio = NULL;
    } else if (x->oreq.stream) {
        xchg_run_stream(x);
    } else {
        xchg_run_whole(x);
    }
    xchg_free(x);
    return NULL;
}

/* The body arrived (nng's thread): parse it and hand the generation to its own thread. */
static void xchg_body_done(void *arg)
{
    struct http_xchg   *x = arg;
    struct openai_err   err;
    struct router_http *h = x->h;
    int                 rv = nng_aio_result(x->rd);
    if (rv != 0) {
        COMMON_LOG_DEBUG(HTTP_COMP, "body read failed: %s", nng_strerror(rv));
        nng_aio_finish(x->aio, rv); /* closes the connection */
    } else if (openai_parse(x->kind, x->body, x->body_len, h->models, &x->oreq, &err) < 0) {
        http_reply_err(x->aio, &err, false);
    } else {
        pthread_attr_t attr;
        pthread_t      t;
        bool           ok = pthread_attr_init(&attr) == 0;
        if (ok) {
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            ok = pthread_create(&t, &attr, xchg_main, x) == 0;
            pthread_attr_destroy(&attr);
        }
        if (ok)
            return; /* the thread frees x (and x->rd: not from inside its own callback) */
        openai_err_set(&err, 503, "server_error", NULL, NULL, "cannot start a thread");
        http_reply_err(x->aio, &err, false);
    }
    nng_aio_reap(x->rd);
    x->rd = NULL;
    xchg_free(x);
}

/* ---- routing ------------------------------------------------------------------------------ */

enum http_route { ROUTE_HEALTH, ROUTE_MODELS, ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_METRICS };

static const struct {
    const char     *path;
    const char     *method;
    enum http_route route;
} g_routes[] = {
    {"/health", "GET", ROUTE_HEALTH},
    {"/v1/models", "GET", ROUTE_MODELS},
    {"/v1/completions", "POST", ROUTE_COMPLETIONS},
    {"/v1/chat/completions", "POST", ROUTE_CHAT},
    {"/metrics", "GET", ROUTE_METRICS},
};

/* True when the request carries "Authorization: Bearer KEY" (compared in constant time). */
static bool http_authorized(const char *key, nng_http_req *req)
{
    const char *a = nng_http_req_get_header(req, "Authorization");
    if (!key || !key[0])
        return true;
    if (!a || strncasecmp(a, "Bearer ", 7) != 0)
        return false;
    a += 7;
    while (*a == ' ')
        a++;
    size_t        na = strlen(a), nk = strlen(key);
    unsigned char diff = na != nk;
    for (size_t i = 0; i < nk; i++)
        diff |= (unsigned char)(key[i] ^ (i < na ? a[i] : 0));
    return diff == 0;
}

/* Starts reading the body of a completion request (the generation follows in a thread). */
static void http_post(struct router_http *h, nng_aio *aio, nng_http_req *req, nng_http_conn *conn,
                      enum openai_kind kind)
{
    struct openai_err  err;
    const char        *cl = nng_http_req_get_header(req, "Content-Length");
    char              *end = NULL;
    unsigned long long len = cl ? strtoull(cl, &end, 10) : 0;
    if (nng_http_req_get_header(req, "Transfer-Encoding") || (cl && (end == cl || *end))) {
        openai_err_set(&err, 411, "invalid_request_error", NULL, NULL,
                       "send the body with a Content-Length (no chunked encoding)");
        http_reply_err(aio, &err, true);
        return;
    }
    if (len > h->max_body) {
        /* The body stays unread: the connection closes after the answer. */
        openai_err_set(&err, 413, "invalid_request_error", "request_too_large", NULL,
                       "the body has %llu bytes, more than the %llu this server takes "
                       "(--http-max-body)",
                       len, (unsigned long long)h->max_body);
        http_reply_err(aio, &err, true);
        return;
    }
    struct http_xchg *x = calloc(1, sizeof(*x));
    if (!x || !(x->body = malloc(len + 1)) || nng_aio_alloc(&x->rd, xchg_body_done, x) != 0) {
        if (x)
            free(x->body);
        free(x);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    x->h = h;
    x->aio = aio;
    x->req = req;
    x->conn = conn;
    x->kind = kind;
    x->body_len = len;
    x->body[len] = '\0';
    http_busy(h, +1);
    if (len == 0) {
        /* Nothing to read: complete the read at once (the parser says what is missing). */
        if (nng_aio_begin(x->rd))
            nng_aio_finish(x->rd, 0);
        return;
    }
    nng_iov iov = {.iov_buf = x->body, .iov_len = len};
    nng_aio_set_iov(x->rd, 1, &iov);
    nng_aio_set_timeout(x->rd, HTTP_IO_MS);
    nng_http_conn_read_all(conn, x->rd);
}

/* The one handler of the server (every path, every method), on nng's threads. */
static void http_handle(nng_aio *aio)
{
    nng_http_req       *req = nng_aio_get_input(aio, 0);
    nng_http_handler   *hd = nng_aio_get_input(aio, 1);
    nng_http_conn      *conn = nng_aio_get_input(aio, 2);
    struct router_http *h = nng_http_handler_get_data(hd);
    struct openai_err   err;
    const char         *method = nng_http_req_get_method(req);
    const char         *uri = nng_http_req_get_uri(req);
    size_t              plen = strcspn(uri, "?#");
    const char         *cl = nng_http_req_get_header(req, "Content-Length");
    /* An answer that leaves a body unread closes the connection (the bytes are no request). */
    bool unread = (cl && strcmp(cl, "0") != 0) || nng_http_req_get_header(req, "Transfer-Encoding");
    while (plen > 1 && uri[plen - 1] == '/')
        plen--;
    size_t i = 0, n_routes = sizeof(g_routes) / sizeof(g_routes[0]);
    while (i < n_routes &&
           (strlen(g_routes[i].path) != plen || strncmp(g_routes[i].path, uri, plen) != 0))
        i++;
    if (i == n_routes) {
        openai_err_set(&err, 404, "invalid_request_error", "not_found", NULL,
                       "no such endpoint: %s %.*s", method, (int)(plen < 200 ? plen : 200), uri);
        http_reply_err(aio, &err, unread);
        return;
    }
    bool get = strcmp(g_routes[i].method, "GET") == 0;
    if (strcmp(method, g_routes[i].method) != 0 && !(get && strcmp(method, "HEAD") == 0)) {
        openai_err_set(&err, 405, "invalid_request_error", "method_not_allowed", NULL,
                       "%s takes %s, not %s", g_routes[i].path, g_routes[i].method, method);
        http_reply_allow(aio, err.status, openai_error_json(&err), unread,
                         get ? "GET, HEAD" : g_routes[i].method);
        return;
    }
    if (g_routes[i].route != ROUTE_HEALTH && !http_authorized(h->s->o.api_key, req)) {
        openai_err_set(&err, 401, "invalid_request_error", "invalid_api_key", NULL,
                       nng_http_req_get_header(req, "Authorization")
                           ? "Incorrect API key provided"
                           : "You didn't provide an API key: send 'Authorization: Bearer KEY'");
        http_reply_err(aio, &err, unread);
        return;
    }
    switch (g_routes[i].route) {
    case ROUTE_HEALTH: {
        struct router_serve *s = h->s;
        pthread_mutex_lock(&s->mu);
        const char *why = s->degraded   ? "waiting for the executor"
                          : s->draining ? "draining"
                                        : NULL;
        pthread_mutex_unlock(&s->mu);
        http_reply(aio, why ? 503 : 200, openai_health_json(why), unread);
        return;
    }
    case ROUTE_MODELS:
        http_reply(aio, 200, openai_models_json(h->model_id, (int64_t)time(NULL)), unread);
        return;
    case ROUTE_COMPLETIONS:
        http_post(h, aio, req, conn, OPENAI_COMPLETION);
        return;
    case ROUTE_CHAT:
        http_post(h, aio, req, conn, OPENAI_CHAT);
        return;
    case ROUTE_METRICS:
        http_reply_text(aio, router_metrics_text(h->s), "text/plain; version=0.0.4; charset=utf-8",
                        unread);
        return;
    }
}

/* ---- lifetime ----------------------------------------------------------------------------- */

/* nng dropped the handler's last reference: no callback of ours runs any more. */
static void http_handler_gone(void *arg)
{
    struct router_http *h = arg;
    pthread_mutex_lock(&h->mu);
    h->gone = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* "HOST:PORT" or ":PORT" into "http://HOST:PORT" (IPv6 hosts in brackets). */
static int http_parse_addr(const char *addr, char *url, size_t len, struct common_errmsg *e)
{
    const char   *colon = strrchr(addr, ':');
    char         *end = NULL;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || !colon[1] || *end || port > 65535 || (size_t)(colon - addr) > 200)
        return common_errmsg_set(e, COMMON_EINVAL, "--http expects HOST:PORT or :PORT, got '%s'",
                                 addr);
    int host_len = (int)(colon - addr);
    snprintf(url, len, "http://%.*s:%lu", host_len ? host_len : 9, host_len ? addr : "127.0.0.1",
             port);
    return 0;
}

int router_http_start(struct router_serve *s, struct common_errmsg *e)
{
    char want[256];
    int  rc = http_parse_addr(s->o.http_addr, want, sizeof(want), e);
    if (rc < 0)
        return rc;
    struct router_http *h = calloc(1, sizeof(*h));
    if (!h)
        return COMMON_ENOMEM;
    h->s = s;
    h->max_body = s->o.http_max_body ? s->o.http_max_body : HTTP_DEFAULT_MAX_BODY;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        free(h);
        return COMMON_ENOMEM;
    }
    if (pthread_cond_init(&h->cv, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        free(h);
        return COMMON_ENOMEM;
    }
    const char *base = strrchr(s->o.model_path, '/');
    base = base ? base + 1 : s->o.model_path;
    snprintf(h->file_name, sizeof(h->file_name), "%s", base);
    snprintf(h->model_id, sizeof(h->model_id), "%s", base);
    size_t n = strlen(h->model_id);
    if (n > 5 && strcmp(h->model_id + n - 5, ".gguf") == 0)
        h->model_id[n - 5] = '\0';
    size_t k = 0;
    h->models[k++] = h->model_id;
    h->models[k++] = h->file_name;
    if (s->model_name[0])
        h->models[k++] = s->model_name;
    h->models[k] = NULL;
    s->http = h; /* router_http_stop() undoes a partial start */

    nng_url          *url = NULL;
    nng_http_handler *hd = NULL;
    nng_sockaddr      sa;
    if ((rc = nng_url_parse(&url, want)) != 0 ||
        (rc = nng_http_server_hold(&h->server, url)) != 0 ||
        (rc = nng_http_handler_alloc(&hd, "/", http_handle)) != 0) {
        nng_url_free(url);
        return common_errmsg_set(e, COMMON_EINVAL, "--http %s: %s", s->o.http_addr,
                                 nng_strerror(rc));
    }
    nng_url_free(url);
    if ((rc = nng_http_handler_set_method(hd, NULL)) != 0 ||
        (rc = nng_http_handler_set_tree(hd)) != 0 ||
        (rc = nng_http_handler_collect_body(hd, false, 0)) != 0 ||
        (rc = nng_http_handler_set_data(hd, h, http_handler_gone)) != 0 ||
        (rc = nng_http_server_add_handler(h->server, hd)) != 0) {
        nng_http_handler_free(hd);
        return common_errmsg_set(e, COMMON_ENOMEM, "--http: %s", nng_strerror(rc));
    }
    h->added = true;
    if ((rc = nng_http_server_start(h->server)) != 0)
        return common_errmsg_set(e, COMMON_EBUSY, "--http %s: cannot listen: %s", s->o.http_addr,
                                 nng_strerror(rc));
    /* The bound port (the asked one, or the kernel's pick for port 0). */
    if (nng_http_server_get_addr(h->server, &sa) == 0 && sa.s_family == NNG_AF_INET) {
        const uint8_t *a = (const uint8_t *)&sa.s_in.sa_addr; /* network order */
        unsigned       port = ntohs(sa.s_in.sa_port);
        snprintf(h->url, sizeof(h->url), "http://%u.%u.%u.%u:%u", a[0], a[1], a[2], a[3], port);
    } else {
        snprintf(h->url, sizeof(h->url), "%s", want);
    }
    snprintf(h->url_file, sizeof(h->url_file), "%s/router.http", s->run_dir);
    FILE *f = fopen(h->url_file, "w");
    if (!f || fprintf(f, "%s\n", h->url) < 0 || fclose(f) != 0) {
        h->url_file[0] = '\0';
        return common_errmsg_set(e, COMMON_EIO, "cannot write %s/router.http", s->run_dir);
    }
    COMMON_LOG_INFO(HTTP_COMP, "serving OpenAI-compatible HTTP on %s (model '%s'%s)", h->url,
                    h->model_id, s->o.api_key && s->o.api_key[0] ? ", API key required" : "");
    return 0;
}

const char *router_http_url(const struct router_http *h)
{
    return h->url;
}

void router_http_stop(struct router_http *h)
{
    if (!h)
        return;
    if (h->server) {
        nng_http_server_stop(h->server); /* no new connections; idle ones close */
        pthread_mutex_lock(&h->mu);
        while (h->n_busy)
            pthread_cond_wait(&h->cv, &h->mu);
        pthread_mutex_unlock(&h->mu);
        nng_http_server_release(h->server);
    }
    bool gone = true;
    if (h->added) { /* the server holds the handler: wait until nng lets it go */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += HTTP_GONE_WAIT_MS / 1000;
        pthread_mutex_lock(&h->mu);
        while (!h->gone && pthread_cond_timedwait(&h->cv, &h->mu, &ts) == 0)
            ;
        gone = h->gone;
        pthread_mutex_unlock(&h->mu);
    }
    if (h->url_file[0])
        unlink(h->url_file);
    if (!gone) { /* nng still holds it: leak rather than free under a callback */
        COMMON_LOG_WARN(HTTP_COMP, "the HTTP server did not release its handler");
        return;
    }
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
