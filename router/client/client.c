/* router/client/client.c - the sluice client library: GENERATE, then long POLLs until done. */
#include "sluice_client.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "proto.h"

#define CLIENT_POLL_MS       250   /* router-side long poll; also the cancel-flag latency */
#define CLIENT_CALL_SLACK_MS 5000  /* on top of the poll, for a busy router */
#define CLIENT_RETRY_MS      30000 /* no answer this long (calls retried): the router is gone */
#define CLIENT_GONE_MS       2000  /* its socket file missing this long: it is not running */
#define CLIENT_PAUSE_MS      50    /* between retries after a closed connection */
#define CLIENT_SUBMIT_MS     8000  /* one GENERATE call, then it goes out again (see below) */
#define CLIENT_RESUME_MS     60000 /* a router that died mid-request: wait this long for it */
                                   /* (unless the request's resume_wait_s says otherwise) */
#define CLIENT_RESUME_MINOR 3      /* routers from protocol 0.3 on resume a request */

_Static_assert((int)SLUICE_ECLOSED == (int)COMMON_ECLOSED &&
                   (int)SLUICE_ERANGE == (int)COMMON_ERANGE &&
                   (int)SLUICE_ENOENT == (int)COMMON_ENOENT &&
                   (int)SLUICE_EBUSY == (int)COMMON_EBUSY,
               "sluice_status mirrors common_err");

struct sluice_client {
    struct proto_client *pc;
    char                 url[PROTO_MAX_PATH + 16];
    char                 sock_path[PROTO_MAX_PATH]; /* ipc socket file, "" for tcp */
    _Atomic uint64_t     current_id;                /* generation running, 0 = none */
    uint32_t             router_minor;              /* the router's protocol minor version */
    atomic_int           cancel_flag;               /* set by sluice_client_request_cancel */
};

static _Thread_local char client_err[512];

const char *sluice_last_error(void)
{
    return client_err;
}

static int client_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int client_fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(client_err, sizeof(client_err), fmt, ap);
    va_end(ap);
    return code;
}

const char *sluice_strerror(int status)
{
    return common_strerror(status);
}

/* The proto structs hold `char *` for borrowed strings on encode. */
static char *client_unconst(const char *p)
{
    char *q;
    memcpy(&q, &p, sizeof(q));
    return q;
}

static bool client_socket_exists(const struct sluice_client *c)
{
    struct stat st;
    return !c->sock_path[0] || (stat(c->sock_path, &st) == 0 && S_ISSOCK(st.st_mode));
}

/* True when some process listens on the socket file. Linux lists listening Unix sockets in
 * /proc/net/unix with the flag __SO_ACCEPTCON (00010000) and their path; a stale file left by a
 * killed router is listed by nobody. True as well when that cannot be told (no /proc, a tcp://
 * url): the caller then waits its full time. */
static bool client_socket_listened(const struct sluice_client *c)
{
    char want[PATH_MAX];
    if (!c->sock_path[0] || !realpath(c->sock_path, want))
        return true;
    FILE *f = fopen("/proc/net/unix", "r");
    if (!f)
        return true;
    char line[PATH_MAX + 128];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long flags = 0;
        int           off = -1;
        if (sscanf(line, "%*s %*s %*s %lx %*s %*s %*s %n", &flags, &off) < 1 || off < 0)
            continue;
        line[strcspn(line, "\n")] = '\0';
        found = (flags & 0x10000ul) && strcmp(line + off, want) == 0;
    }
    fclose(f);
    return found;
}

/* A call that survives a lost connection or a lost reply: the router's listener may be replaced
 * (which closes every connection) or the router paused; nng reconnects and the call goes out
 * again, until `give_up_ms` pass without an answer (CLIENT_GONE_MS once the socket file is
 * gone). Only for requests the router treats as
 * idempotent: HELLO, GENERATE (same id, same content), POLL with acknowledgements, CANCEL. ERROR
 * replies become their code with the router's message. */
static int client_call_retry(struct sluice_client *c, const struct proto_msg *req,
                             struct proto_msg *rep, int timeout_ms, unsigned give_up_ms)
{
    uint64_t first_fail = 0; /* when the first unanswered call of this streak went out */
    uint64_t gone_since = 0; /* when the socket file was first seen missing, 0 = present */
    for (;;) {
        struct common_errmsg e = {{0}};
        uint64_t             sent = common_now_ns();
        int                  rc = COMMON_ECLOSED;
        /* No socket file: nothing to connect to, the call would only wait out its timeout. */
        if (client_socket_exists(c)) {
            gone_since = 0;
            rc = proto_client_call(c->pc, req, rep, timeout_ms, &e);
        } else
            common_errmsg_set(&e, rc, "no socket at %s", c->sock_path);
        if (rc != COMMON_ECLOSED && rc != COMMON_ETIMEDOUT) {
            if (rc < 0)
                return client_fail(rc, "%s", e.text[0] ? e.text : common_strerror(rc));
            if (rep->kind == PROTO_KIND_ERROR) {
                int code = rep->u.error.code < 0 ? rep->u.error.code : SLUICE_EPROTO;
                client_fail(code, "router: %s (%s)", rep->u.error.message, common_strerror(code));
                proto_msg_clear(rep);
                return code;
            }
            return 0;
        }
        uint64_t now = common_now_ns();
        if (!first_fail)
            first_fail = sent;
        bool gone = !client_socket_exists(c);
        /* Silence from a file nobody listens on (checked twice, 100 ms apart, to let a listener
         * being replaced come back): the router is not running, waiting would not help. */
        if (!gone && rc == COMMON_ETIMEDOUT && !client_socket_listened(c)) {
            struct timespec ts = {0, 100 * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
            if (!client_socket_listened(c))
                return client_fail(SLUICE_ECLOSED, "router not running: nobody listens on %s",
                                   c->sock_path);
        }
        if (!gone)
            gone_since = 0;
        else if (!gone_since)
            gone_since = now;
        uint64_t waited_ms = (now - first_fail) / 1000000u;
        /* The watchdog's listener replacement removes the file for an instant: only a file
         * missing for a while means the router is gone. */
        if (gone && (now - gone_since) / 1000000u >= CLIENT_GONE_MS)
            return client_fail(SLUICE_ECLOSED, "router not running: %s is gone", c->sock_path);
        if (waited_ms >= give_up_ms)
            return client_fail(SLUICE_ECLOSED, "router not answering for %u s: %s",
                               (give_up_ms + 999) / 1000, e.text);
        /* Silence: the next try dials afresh. Under a listener replaced again and again (nng
         * 1.5.2's #1518) a dialer was seen to stay stuck, every call of a client timing out for
         * 30 s while new connections were served, as the router's link to its executor does. */
        if (rc == COMMON_ETIMEDOUT)
            (void)proto_client_reopen(c->pc, NULL);
        if (rc == COMMON_ECLOSED || gone) {
            struct timespec ts = {0, CLIENT_PAUSE_MS * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
    }
}

int sluice_client_connect(const char *path_or_url, struct sluice_client **out)
{
    client_err[0] = '\0';
    if (!path_or_url || !*path_or_url || !out)
        return client_fail(SLUICE_EINVAL, "no router socket given");
    struct sluice_client *c = calloc(1, sizeof(*c));
    if (!c)
        return client_fail(SLUICE_ENOMEM, "out of memory");
    const char *path = NULL;
    if (!strstr(path_or_url, "://"))
        path = path_or_url;
    else if (strncmp(path_or_url, "ipc://", 6) == 0)
        path = path_or_url + 6;
    if ((path && strlen(path) >= sizeof(c->sock_path)) ||
        strlen(path_or_url) + 7 > sizeof(c->url)) {
        free(c);
        return client_fail(SLUICE_EINVAL, "router socket path too long");
    }
    if (path) {
        snprintf(c->sock_path, sizeof(c->sock_path), "%s", path);
        snprintf(c->url, sizeof(c->url), "ipc://%s", path);
    } else {
        snprintf(c->url, sizeof(c->url), "%s", path_or_url);
    }
    if (!client_socket_exists(c)) {
        int rc = client_fail(SLUICE_ECLOSED, "router not running: no socket at %s", c->sock_path);
        free(c);
        return rc;
    }
    struct common_errmsg e = {{0}};
    int                  rc = proto_client_open(c->url, &c->pc, &e);
    if (rc < 0) {
        free(c);
        return client_fail(rc, "%s", e.text);
    }
    struct proto_msg req = {.kind = PROTO_KIND_HELLO, .request_id = common_random_id()}, rep;
    req.u.hello.major = PROTO_VERSION_MAJOR;
    req.u.hello.minor = PROTO_VERSION_MINOR;
    req.u.hello.role = PROTO_ROLE_CLIENT;
    snprintf(req.u.hello.name, sizeof(req.u.hello.name), "client");
    req.u.hello.pid = (uint32_t)getpid();
    /* A closed connection or silence is retried (the listener may be being replaced); a socket
     * file nobody listens on is reported after the first silent HELLO. */
    rc = client_call_retry(c, &req, &rep, 2000, CLIENT_RETRY_MS);
    if (rc == 0) {
        if (rep.kind != PROTO_KIND_HELLO || rep.u.hello.role != PROTO_ROLE_ROUTER)
            rc = client_fail(SLUICE_EPROTO, "%s is not a sluice router", c->url);
        else if (!proto_version_is_compatible(rep.u.hello.major, rep.u.hello.minor))
            rc = client_fail(SLUICE_EPROTO, "the router speaks protocol %u.%u, this is %u.%u",
                             rep.u.hello.major, rep.u.hello.minor, PROTO_VERSION_MAJOR,
                             PROTO_VERSION_MINOR);
        else
            c->router_minor = rep.u.hello.minor;
        proto_msg_clear(&rep);
    }
    if (rc < 0) {
        sluice_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void sluice_client_close(struct sluice_client *c)
{
    if (!c)
        return;
    proto_client_close(c->pc);
    free(c);
}

void sluice_generate_opts_init(struct sluice_generate_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_tokens = 128;
    o->temp = 0.8f;
    o->top_k = 40;
    o->top_p = 0.95f;
    o->min_p = 0.05f;
    o->repeat_penalty = 1.0f;
}

static int client_send_cancel(struct sluice_client *c, uint64_t id)
{
    struct proto_msg req = {.kind = PROTO_KIND_CANCEL, .request_id = id}, rep;
    int              rc = client_call_retry(c, &req, &rep, 2000, CLIENT_RETRY_MS);
    if (rc == 0)
        proto_msg_clear(&rep);
    return rc;
}

int sluice_client_cancel(struct sluice_client *c, uint64_t id)
{
    if (!c)
        return client_fail(SLUICE_EINVAL, "no client");
    if (id == 0)
        id = atomic_load_explicit(&c->current_id, memory_order_acquire);
    if (id == 0)
        return client_fail(SLUICE_ENOENT, "no generation is running");
    return client_send_cancel(c, id);
}

void sluice_client_request_cancel(struct sluice_client *c)
{
    if (c)
        atomic_store_explicit(&c->cancel_flag, 1, memory_order_release);
}

/* The tokens a generation received, for resuming it on a restarted router. */
struct client_got {
    int32_t *ids;
    size_t   n, cap;
    uint64_t bytes;
};

static int client_got_add(struct client_got *g, const int32_t *ids, size_t n)
{
    if (g->n + n > g->cap) {
        size_t   cap = g->cap ? g->cap * 2 : 256;
        int32_t *p;
        while (cap < g->n + n)
            cap *= 2;
        if (!(p = realloc(g->ids, cap * sizeof(*p))))
            return SLUICE_ENOMEM;
        g->ids = p;
        g->cap = cap;
    }
    if (n)
        memcpy(g->ids + g->n, ids, n * sizeof(*ids));
    g->n += n;
    return 0;
}

/* Sends GENERATE `id` (with `got` NULL), or resumes it after the tokens and bytes in `got`. */
static int client_submit(struct sluice_client *c, const struct sluice_generate_opts *o, uint64_t id,
                         const struct client_got *got)
{
    if ((o->prompt != NULL) == (o->n_messages != 0))
        return client_fail(SLUICE_EINVAL, "give a prompt or messages");
    if (o->n_messages > PROTO_MAX_MESSAGES || o->n_stops > PROTO_MAX_STOPS)
        return client_fail(SLUICE_EINVAL, "at most %u messages and %u stop strings",
                           PROTO_MAX_MESSAGES, PROTO_MAX_STOPS);
    struct proto_msg *req = calloc(1, sizeof(*req));
    if (!req)
        return client_fail(SLUICE_ENOMEM, "out of memory");
    req->kind = PROTO_KIND_GENERATE;
    req->request_id = id;
    struct proto_generate *g = &req->u.generate;
    int                    rc = 0;
    g->prompt = o->prompt ? client_unconst(o->prompt) : NULL;
    for (size_t i = 0; i < o->n_messages && rc == 0; i++) {
        const struct sluice_chat_message *m = &o->messages[i];
        if (!m->role || !m->content || strlen(m->role) >= PROTO_MAX_ROLE)
            rc = client_fail(SLUICE_EINVAL, "message %zu: missing or too long role/content", i);
        else {
            snprintf(g->messages[i].role, PROTO_MAX_ROLE, "%s", m->role);
            g->messages[i].content = client_unconst(m->content);
        }
    }
    g->n_messages = (uint32_t)o->n_messages;
    for (size_t i = 0; i < o->n_stops && rc == 0; i++) {
        if (!o->stops[i] || strlen(o->stops[i]) >= PROTO_MAX_STOP_LEN)
            rc = client_fail(SLUICE_EINVAL, "stop string %zu missing or longer than %u bytes", i,
                             PROTO_MAX_STOP_LEN - 1);
        else
            snprintf(g->stops[i], PROTO_MAX_STOP_LEN, "%s", o->stops[i]);
    }
    g->n_stops = (uint32_t)o->n_stops;
    g->sampling = (struct proto_sampling){.temp = o->temp,
                                          .top_k = o->top_k,
                                          .top_p = o->top_p,
                                          .min_p = o->min_p,
                                          .repeat_penalty = o->repeat_penalty,
                                          .repeat_last_n = o->repeat_last_n,
                                          .seed = o->seed};
    g->max_tokens = o->max_tokens;
    g->stream = !o->no_stream;
    g->special = o->special;
    if (got) {
        g->resume = got->ids;
        g->n_resume = (uint32_t)got->n;
        g->resume_bytes = got->bytes;
    }
    struct proto_msg rep;
    /* nng 1.5.2 loses a request whose connection closes after the send and before the wait for
     * the reply begins (no error, the reply never comes): a router replaced at that instant
     * would fail the request after the whole CLIENT_RETRY_MS. The router answers GENERATE at
     * once and takes a repeat (same id, same content) as the same request, so a silent call is
     * sent again after CLIENT_SUBMIT_MS. */
    if (rc == 0 && (rc = client_call_retry(c, req, &rep, CLIENT_SUBMIT_MS, CLIENT_RETRY_MS)) == 0) {
        if (rep.kind != PROTO_KIND_OK)
            rc = client_fail(SLUICE_EPROTO, "router answered GENERATE with %s",
                             proto_kind_name(rep.kind));
        proto_msg_clear(&rep);
    }
    free(req); /* borrowed strings: never proto_msg_clear'd */
    return rc;
}

/* Resubmits request `id` after the tokens in `got` until a router takes it (one being
 * restarted is waited for, resume_wait_s or CLIENT_RESUME_MS at most). Returns 0 or the last
 * failure. */
static int client_resume(struct sluice_client *c, const struct sluice_generate_opts *o, uint64_t id,
                         const struct client_got *got)
{
    const uint64_t t0 = common_now_ns();
    const uint64_t wait_ms =
        o->resume_wait_s ? (uint64_t)o->resume_wait_s * 1000u : CLIENT_RESUME_MS;
    for (;;) {
        /* Nothing listening yet: no call (it would wait out its timeout), look again soon. */
        int rc = !client_socket_exists(c)
                     ? client_fail(SLUICE_ECLOSED, "router not running: %s is gone", c->sock_path)
                 : !client_socket_listened(c)
                     ? client_fail(SLUICE_ECLOSED, "router not running: nobody listens on %s",
                                   c->sock_path)
                     : client_submit(c, o, id, got);
        if (rc != SLUICE_ECLOSED && rc != SLUICE_ETIMEDOUT && rc != SLUICE_EBUSY)
            return rc;
        if ((common_now_ns() - t0) / 1000000u >= wait_ms)
            return rc;
        struct timespec ts = {0, 200 * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
}

int sluice_client_generate(struct sluice_client *c, const struct sluice_generate_opts *o,
                           sluice_piece_fn cb, void *arg, struct sluice_generate_result *out)
{
    client_err[0] = '\0';
    if (!c || !o || !out)
        return client_fail(SLUICE_EINVAL, "missing client, options or result");
    memset(out, 0, sizeof(*out));
    uint64_t id = o->id ? o->id : common_random_id();
    out->id = id;
    /* A seed of our own when the router would pick one: a resumed request draws on. */
    struct sluice_generate_opts oo = *o;
    if (oo.seed == 0 && oo.temp > 0.0f)
        oo.seed = common_random_id() | 1u;
    o = &oo;
    atomic_store_explicit(&c->cancel_flag, 0, memory_order_relaxed);
    int rc = client_submit(c, o, id, NULL);
    if (rc < 0)
        return rc;
    atomic_store_explicit(&c->current_id, id, memory_order_release);
    bool              cancel_sent = false;
    uint64_t          got_tokens = 0, got_bytes = 0; /* acknowledged in the next POLL */
    struct client_got got = {0};                     /* what came, for a resume */
    for (;;) {
        if (!cancel_sent && atomic_load_explicit(&c->cancel_flag, memory_order_acquire)) {
            cancel_sent = true;
            if ((rc = client_send_cancel(c, id)) < 0 && rc != SLUICE_ENOENT)
                break;
        }
        struct proto_msg req = {.kind = PROTO_KIND_POLL, .request_id = id}, rep;
        req.u.poll.timeout_ms = CLIENT_POLL_MS;
        req.u.poll.ack = true;
        req.u.poll.ack_tokens = got_tokens;
        req.u.poll.ack_bytes = got_bytes;
        rc = client_call_retry(c, &req, &rep, CLIENT_POLL_MS + CLIENT_CALL_SLACK_MS,
                               CLIENT_RETRY_MS);
        if ((rc == SLUICE_ENOENT || rc == SLUICE_ECLOSED) && !cancel_sent &&
            c->router_minor >= CLIENT_RESUME_MINOR && got.n <= PROTO_MAX_RESUME) {
            /* The router lost the request (it was restarted, or dropped it): send it again
             * with what came so far, waiting for a router that is being restarted. */
            rc = client_resume(c, o, id, &got);
            if (rc == 0)
                continue;
        }
        if (rc == SLUICE_ENOENT) {
            client_fail(rc,
                        "the router no longer knows request %llu (restarted, or dropped "
                        "it after the client timeout)",
                        (unsigned long long)id);
            break;
        }
        if (rc < 0)
            break;
        if (rep.kind != PROTO_KIND_EVENTS) {
            proto_msg_clear(&rep);
            rc = client_fail(SLUICE_EPROTO, "router answered POLL with %s",
                             proto_kind_name(rep.kind));
            break;
        }
        const struct proto_events *ev = &rep.u.events;
        size_t                     tlen = ev->text ? ev->text_len : 0;
        got_tokens += ev->n_tokens;
        got_bytes += tlen;
        if ((rc = client_got_add(&got, ev->tokens, ev->n_tokens)) < 0) {
            proto_msg_clear(&rep);
            client_fail(rc, "out of memory");
            break;
        }
        got.bytes = got_bytes;
        if ((tlen || ev->n_tokens) && cb && !cancel_sent &&
            cb(arg, ev->text ? ev->text : "", tlen, ev->tokens, ev->n_tokens) != 0)
            sluice_client_request_cancel(c);
        bool done = ev->done;
        if (done) {
            out->reason = (enum sluice_stop)ev->reason;
            out->n_prompt = ev->stats.n_prompt;
            out->n_generated = ev->stats.n_generated;
            out->queue_ms = ev->stats.queue_ms;
            out->prompt_ms = ev->stats.prompt_ms;
            out->decode_ms = ev->stats.decode_ms;
            out->error_code = ev->error_code;
            snprintf(out->error, sizeof(out->error), "%s", ev->error_text);
        }
        proto_msg_clear(&rep);
        if (done) {
            rc = 0;
            break;
        }
    }
    atomic_store_explicit(&c->current_id, 0, memory_order_release);
    free(got.ids);
    return rc;
}
