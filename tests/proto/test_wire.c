/* tests/proto/test_wire.c - the nng request/reply server and client over ipc:// in a temp dir. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "common.h"
#include "fixture.h"
#include "proto.h"

/* Fixture state (Criterion fixtures take no arguments). */
static char *t_dir;
static char  t_url[300];
static char  t_path[100];

static void wire_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    snprintf(t_path, sizeof(t_path), "%s/test.ctl", t_dir);
    snprintf(t_url, sizeof(t_url), "ipc://%s", t_path);
}

static void wire_teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
    t_dir = NULL;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The blocking LOAD_MODEL handler's state, reset by each test that uses it. */
static struct {
    _Atomic bool entered; /* the handler runs */
    _Atomic bool release; /* the test lets it return */
    _Atomic bool done;    /* slow_call() got its reply */
} t_slow;

/* A test server: answers by kind (see the cases). */
static int test_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    (void)arg;
    switch (req->kind) {
    case PROTO_KIND_HELLO:
        rep->kind = PROTO_KIND_HELLO;
        rep->u.hello.major = PROTO_VERSION_MAJOR;
        rep->u.hello.role = PROTO_ROLE_ROUTER;
        snprintf(rep->u.hello.name, sizeof(rep->u.hello.name), "srv:%.50s", req->u.hello.name);
        rep->u.hello.pid = (uint32_t)getpid();
        return 0;
    case PROTO_KIND_CONFIGURE:
        if (strcmp(req->u.configure.key, "log.level") == 0)
            return 0; /* rep is OK by default */
        proto_msg_error(rep, req->request_id, COMMON_EINVAL, "unknown key %s",
                        req->u.configure.key);
        return COMMON_EINVAL;
    case PROTO_KIND_HEALTH:
        return COMMON_EBUSY; /* no text: the server names the code */
    case PROTO_KIND_POLL: {
        /* Echo: the request id and max_events come back; malloc'd text is handed over. */
        rep->kind = PROTO_KIND_EVENTS;
        rep->u.events.n_tokens = 1;
        rep->u.events.tokens[0] = (int32_t)req->u.poll.max_events;
        char *text = malloc(32);
        if (!text)
            return COMMON_ENOMEM;
        snprintf(text, 32, "id=%llu", (unsigned long long)req->request_id);
        rep->u.events.text = text;
        rep->u.events.text_len = (uint32_t)strlen(text);
        return 0;
    }
    case PROTO_KIND_LOAD_MODEL:
        /* A blocking handler: it holds its worker until the test lets it go (or 10 s pass, so
         * that a broken test cannot hang the server). */
        atomic_store(&t_slow.entered, true);
        for (int i = 0; i < 10000 && !atomic_load(&t_slow.release); i++)
            sleep_ms(1);
        return 0;
    case PROTO_KIND_DRAIN:
        sleep_ms(2600); /* a long poll: longer than the watchdog's full-probe period */
        return 0;
    case PROTO_KIND_GENERATE:
        rep->kind = PROTO_KIND_EVENTS;
        rep->u.events.n_tokens = PROTO_MAX_EVENT_TOKENS + 1; /* a reply that does not encode */
        return 0;
    default:
        return COMMON_ENOTSUP;
    }
}

static struct proto_server *start_server(const struct proto_server_opts *o)
{
    struct proto_server *s = NULL;
    struct common_errmsg e = {{0}};
    int                  rc = proto_server_start(t_url, o, test_handler, NULL, &s, &e);
    cr_assert_eq(rc, COMMON_OK, "server start: %s", e.text);
    return s;
}

static struct proto_msg hello_req(uint64_t id)
{
    struct proto_msg m = {.kind = PROTO_KIND_HELLO, .request_id = id};
    m.u.hello.major = PROTO_VERSION_MAJOR;
    m.u.hello.role = PROTO_ROLE_CLIENT;
    snprintf(m.u.hello.name, sizeof(m.u.hello.name), "client");
    return m;
}

TestSuite(proto_wire, .init = wire_setup, .fini = wire_teardown, .timeout = 30);

Test(proto_wire, call_gets_the_handler_reply)
{
    struct proto_server *s = start_server(NULL);
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    struct proto_msg req = hello_req(77), rep;
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    cr_assert_eq(rep.request_id, 77, "the reply's request_id defaults to the request's");
    cr_assert_str_eq(rep.u.hello.name, "srv:client");
    cr_assert_eq(rep.u.hello.pid, (uint32_t)getpid());
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_CONFIGURE, .request_id = 3};
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "log.level");
    snprintf(req.u.configure.value, sizeof(req.u.configure.value), "debug");
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_OK);
    cr_assert_eq(rep.request_id, 3);

    req = (struct proto_msg){.kind = PROTO_KIND_POLL, .request_id = 12345};
    req.u.poll.max_events = 9;
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_EVENTS);
    cr_assert_eq(rep.u.events.tokens[0], 9);
    cr_assert_str_eq(rep.u.events.text, "id=12345");
    proto_msg_clear(&rep);

    uint64_t served = 0, refused = 0;
    proto_server_counts(s, &served, &refused);
    cr_assert_eq(served, 3);
    cr_assert_eq(refused, 0);
    proto_client_close(c);
    proto_server_stop(s);
}

Test(proto_wire, handler_error_becomes_an_error_reply)
{
    struct proto_server *s = start_server(NULL);
    struct common_errmsg e = {{0}};
    struct proto_msg     req = {.kind = PROTO_KIND_CONFIGURE, .request_id = 5}, rep;
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "no.such.key");
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_assert_eq(rep.request_id, 5);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    cr_assert_str_eq(rep.u.error.message, "unknown key no.such.key");

    req = (struct proto_msg){.kind = PROTO_KIND_HEALTH, .request_id = 6};
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EBUSY);
    cr_assert_str_eq(rep.u.error.message, common_strerror(COMMON_EBUSY));

    /* A reply the codec refuses becomes an ERROR reply too. */
    req = (struct proto_msg){.kind = PROTO_KIND_GENERATE, .request_id = 7};
    req.u.generate.prompt = (char *)"hi";
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_assert_eq(rep.request_id, 7);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    proto_server_stop(s);
}

/* Sends raw bytes with a plain nng req socket; returns the reply (malloc'd) or NULL. */
static uint8_t *raw_call(const void *bytes, size_t n, size_t *reply_len, int *rv_out)
{
    nng_socket sock;
    cr_assert_eq(nng_req0_open(&sock), 0);
    cr_assert_eq(nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 3000), 0);
    cr_assert_eq(nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, 3000), 0);
    cr_assert_eq(nng_dial(sock, t_url, NULL, 0), 0);
    uint8_t *out = NULL;
    void    *copy = malloc(n ? n : 1);
    memcpy(copy, bytes, n);
    int rv = nng_send(sock, copy, n, 0);
    free(copy);
    if (rv == 0) {
        void  *r = NULL;
        size_t rn = 0;
        rv = nng_recv(sock, &r, &rn, NNG_FLAG_ALLOC);
        if (rv == 0) {
            out = malloc(rn ? rn : 1);
            memcpy(out, r, rn);
            *reply_len = rn;
            nng_free(r, rn);
        }
    }
    *rv_out = rv;
    nng_close(sock);
    return out;
}

Test(proto_wire, garbage_gets_an_error_reply_and_the_server_carries_on)
{
    struct proto_server *s = start_server(NULL);
    const char           junk[] = "this is not a flatbuffer at all, SLC1 or not";
    for (int i = 0; i < 3; i++) {
        size_t   n = 0;
        int      rv = 0;
        uint8_t *r = raw_call(junk, sizeof(junk) - (size_t)i * 7, &n, &rv);
        cr_assert_eq(rv, 0, "no reply to garbage: %s", nng_strerror(rv));
        struct proto_msg rep;
        cr_assert_eq(proto_decode(r, n, &rep), COMMON_OK);
        cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
        cr_assert_eq(rep.u.error.code, COMMON_EPROTO);
        free(r);
    }
    size_t   n = 0;
    int      rv = 0;
    uint8_t *r = raw_call("", 0, &n, &rv); /* an empty message */
    cr_assert_eq(rv, 0);
    free(r);

    struct common_errmsg e = {{0}};
    struct proto_msg     req = hello_req(1), rep;
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    uint64_t served = 0, refused = 0;
    proto_server_counts(s, &served, &refused);
    cr_assert_eq(served, 1);
    cr_assert_eq(refused, 4);
    proto_server_stop(s);
}

Test(proto_wire, oversized_message_is_refused)
{
    struct proto_server *s = start_server(&(struct proto_server_opts){.recv_max = 1024});
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    struct proto_msg big = {.kind = PROTO_KIND_EVENTS, .request_id = 1}, rep;
    char            *text = malloc(4097);
    memset(text, 'x', 4096);
    text[4096] = '\0';
    big.u.events.text = text;
    big.u.events.text_len = 4096;
    int rc = proto_client_call(c, &big, &rep, 1000, &e);
    cr_assert(rc == COMMON_ECLOSED || rc == COMMON_ETIMEDOUT, "oversized: %s (%s)",
              common_strerror(rc), e.text);
    free(text);
    /* The server and the same client carry on (nng reconnects). */
    struct proto_msg req = hello_req(2);
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    proto_client_close(c);
    proto_server_stop(s);
}

Test(proto_wire, socket_file_has_mode_0600)
{
    struct proto_server *s = start_server(NULL);
    struct stat          st;
    cr_assert_eq(stat(t_path, &st), 0);
    cr_assert(S_ISSOCK(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", (unsigned)(st.st_mode & 0777));
    proto_server_stop(s);
}

Test(proto_wire, second_server_on_the_same_url_is_busy)
{
    struct proto_server *s = start_server(NULL);
    struct proto_server *s2 = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_server_start(t_url, NULL, test_handler, NULL, &s2, &e), COMMON_EBUSY);
    cr_assert_null(s2);
    cr_assert_neq(e.text[0], '\0');
    /* The first one still serves. */
    struct proto_msg req = hello_req(1), rep;
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    proto_server_stop(s);
}

Test(proto_wire, stale_socket_file_is_replaced)
{
    /* A socket file nobody listens on, as left by a process killed with SIGKILL. */
    int                fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, t_path, strlen(t_path) + 1);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    close(fd);
    struct stat st;
    cr_assert_eq(stat(t_path, &st), 0);

    struct proto_server *s = start_server(NULL);
    struct common_errmsg e = {{0}};
    struct proto_msg     req = hello_req(1), rep;
    cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    proto_server_stop(s);
}

Test(proto_wire, a_regular_file_in_the_way_is_busy)
{
    FILE *f = fopen(t_path, "w");
    cr_assert_not_null(f);
    fclose(f);
    struct proto_server *s = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_server_start(t_url, NULL, test_handler, NULL, &s, &e), COMMON_EBUSY);
    struct stat st;
    cr_assert_eq(stat(t_path, &st), 0, "a file that is not a socket must not be removed");
}

Test(proto_wire, call_without_a_server_times_out)
{
    struct common_errmsg e = {{0}};
    struct proto_msg     req = hello_req(1), rep = {.kind = (enum proto_kind)0};
    uint64_t             t0 = common_now_ns();
    cr_assert_eq(proto_call(t_url, &req, &rep, 300, &e), COMMON_ETIMEDOUT);
    uint64_t ms = (common_now_ns() - t0) / 1000000u;
    cr_assert_geq(ms, 250);
    cr_assert_lt(ms, 3000);
    cr_assert_eq(rep.kind, 0, "a failed call leaves *rep alone");
    cr_assert_not_null(strstr(e.text, t_url), "%s", e.text);
    cr_assert_not_null(strstr(e.text, "300 ms"), "%s", e.text);
}

Test(proto_wire, client_reaches_a_server_started_later_and_restarted)
{
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    struct proto_msg req = hello_req(1), rep;
    cr_assert_eq(proto_client_call(c, &req, &rep, 100, &e), COMMON_ETIMEDOUT);
    struct proto_server *s = start_server(NULL);
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    proto_server_stop(s);
    s = start_server(NULL);
    /* A request sent on the connection to the old server is not re-sent behind the caller's
     * back: it fails with COMMON_ECLOSED, and the caller's retry reaches the new server. */
    int rc = proto_client_call(c, &req, &rep, 5000, &e);
    if (rc == COMMON_ECLOSED)
        rc = proto_client_call(c, &req, &rep, 5000, &e);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    proto_client_close(c);
    proto_server_stop(s);
}

/* A reopened client dials afresh: it reaches the server whether it was reopened while the server
 * was down or up, and keeps its url for messages. */
Test(proto_wire, reopened_client_reaches_the_server)
{
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    struct proto_msg req = hello_req(1), rep;
    cr_assert_eq(proto_client_call(c, &req, &rep, 100, &e), COMMON_ETIMEDOUT);
    cr_assert_eq(proto_client_reopen(c, &e), COMMON_OK, "%s", e.text); /* server down */
    struct proto_server *s = start_server(NULL);
    /* A server restarts a listener it finds not accepting (nng#1518, "restarted it" in the log),
     * which cuts the connections it has: a loaded parallel ctest run once lost this call so
     * ("closed the connection before replying"). Every caller retries COMMON_ECLOSED, as here. */
    int rc = proto_client_call(c, &req, &rep, 5000, &e);
    if (rc == COMMON_ECLOSED)
        rc = proto_client_call(c, &req, &rep, 5000, &e);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    proto_msg_clear(&rep);
    cr_assert_eq(proto_client_reopen(c, &e), COMMON_OK, "%s", e.text); /* server up */
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    proto_msg_clear(&rep);
    proto_server_stop(s);
    cr_assert_eq(proto_client_call(c, &req, &rep, 100, &e) < 0, true);
    cr_assert_not_null(strstr(e.text, t_url), "%s", e.text);
    proto_client_close(c);
}

/* A LOAD_MODEL call (its handler blocks until released) on its own client; *arg gets the
 * result. */
static void *slow_call(void *arg)
{
    struct proto_msg     slow = {.kind = PROTO_KIND_LOAD_MODEL, .request_id = 9}, r;
    struct common_errmsg e;
    int                  rc = proto_call(t_url, &slow, &r, 15000, &e);
    *(int *)arg = rc == COMMON_OK && r.kind != PROTO_KIND_OK ? COMMON_EPROTO : rc;
    atomic_store(&t_slow.done, true);
    return NULL;
}

/* While one worker is held by a blocking handler, another request is answered: the fast call
 * returns while the slow one is still inside its handler (ordered by the handler's flags, not by
 * a clock). */
Test(proto_wire, blocking_handler_does_not_stall_other_workers, .timeout = 60)
{
    struct proto_server *s = start_server(&(struct proto_server_opts){.n_workers = 2});
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    atomic_store(&t_slow.entered, false);
    atomic_store(&t_slow.release, false);
    atomic_store(&t_slow.done, false);
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    struct proto_msg req = hello_req(1), rep;
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);

    pthread_t th;
    int       slow_rc = -100;
    cr_assert_eq(pthread_create(&th, NULL, slow_call, &slow_rc), 0);
    while (!atomic_load(&t_slow.entered))
        sleep_ms(1); /* the slow call is in its handler now */
    cr_assert_eq(proto_client_call(c, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    cr_assert_not(atomic_load(&t_slow.done), "the fast call waited for the slow one");
    atomic_store(&t_slow.release, true);
    pthread_join(th, NULL);
    cr_assert_eq(slow_rc, COMMON_OK);
    proto_client_close(c);
    proto_server_stop(s);
}

/* ---- concurrency ---------------------------------------------------------------------------- */

#define CONC_THREADS 8
#define CONC_CALLS   200

struct conc_arg {
    struct proto_client *c;
    int                  id;
    int                  ok; /* calls answered correctly */
};

static void *conc_main(void *p)
{
    struct conc_arg *a = p;
    for (int i = 0; i < CONC_CALLS; i++) {
        uint64_t         rid = (uint64_t)a->id * 1000000u + (uint64_t)i;
        struct proto_msg req = {.kind = PROTO_KIND_POLL, .request_id = rid}, rep;
        req.u.poll.max_events = (uint32_t)(a->id * 1000 + i);
        struct common_errmsg e;
        if (proto_client_call(a->c, &req, &rep, 10000, &e) != COMMON_OK)
            continue;
        char want[32];
        snprintf(want, sizeof(want), "id=%llu", (unsigned long long)rid);
        if (rep.kind == PROTO_KIND_EVENTS && rep.request_id == rid &&
            rep.u.events.tokens[0] == a->id * 1000 + i && rep.u.events.text &&
            strcmp(rep.u.events.text, want) == 0)
            a->ok++;
        proto_msg_clear(&rep);
    }
    return NULL;
}

Test(proto_wire, concurrent_calls_are_all_answered, .timeout = 120)
{
    struct proto_server *s = start_server(NULL);
    struct proto_client *shared = NULL, *own = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_client_open(t_url, &shared, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(proto_client_open(t_url, &own, &e), COMMON_OK, "%s", e.text);
    pthread_t       th[CONC_THREADS];
    struct conc_arg args[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        /* Half the threads share one client, the other half another one. */
        args[i] = (struct conc_arg){.c = i % 2 ? shared : own, .id = i + 1};
        cr_assert_eq(pthread_create(&th[i], NULL, conc_main, &args[i]), 0);
    }
    for (int i = 0; i < CONC_THREADS; i++) {
        pthread_join(th[i], NULL);
        cr_assert_eq(args[i].ok, CONC_CALLS, "thread %d: %d of %d answered", i, args[i].ok,
                     CONC_CALLS);
    }
    uint64_t served = 0;
    proto_server_counts(s, &served, NULL);
    cr_assert_eq(served, CONC_THREADS * CONC_CALLS);
    proto_client_close(shared);
    proto_client_close(own);
    proto_server_stop(s);
}

/* ---- the listener watchdog (nng#1518) -------------------------------------------------------- */

/* A raw AF_UNIX connection to the server's socket file that writes `n` bytes and closes at once,
 * as `nc -U` or a client killed while connecting does. */
static void raw_connect_close(const void *bytes, size_t n)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, t_path, strlen(t_path) + 1);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    if (n)
        cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

/* Calls HELLO on c until it is answered or `ms` passed: a connection made while the listener was
 * broken is closed by the restart (COMMON_ECLOSED), the retry reaches the new listener. Returns
 * the last result and the time taken in *took_ms. */
static int hello_within(struct proto_client *c, int ms, uint64_t *took_ms)
{
    uint64_t             t0 = common_now_ns();
    struct common_errmsg e = {{0}};
    int                  rc = COMMON_ETIMEDOUT;
    for (;;) {
        uint64_t spent = (common_now_ns() - t0) / 1000000u;
        if (spent >= (uint64_t)ms)
            break;
        struct proto_msg req = hello_req(42), rep;
        rc = proto_client_call(c, &req, &rep, ms - (int)spent, &e);
        if (rc == COMMON_OK) {
            cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
            break;
        }
        cr_assert(rc == COMMON_ECLOSED || rc == COMMON_ETIMEDOUT, "%s", e.text);
    }
    *took_ms = (common_now_ns() - t0) / 1000000u;
    return rc;
}

/* Breaks the listener the way nng 1.5.2 does not survive: peers that leave before or during the
 * SP handshake, with nothing, a partial header or garbage. */
static void break_listener(void)
{
    static const char partial[] = {0, 'S', 'P'};
    for (int i = 0; i < 3; i++) {
        raw_connect_close(NULL, 0);
        raw_connect_close(partial, sizeof(partial));
        raw_connect_close("garbage!", 8);
    }
}

Test(proto_wire, peer_leaving_during_the_handshake_does_not_wedge_the_listener, .timeout = 60)
{
    struct proto_server *s = start_server(NULL);
    struct proto_client *before = NULL, *after = NULL;
    struct common_errmsg e = {{0}};
    uint64_t             took = 0;
    cr_assert_eq(proto_client_open(t_url, &before, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(hello_within(before, 5000, &took), COMMON_OK);
    cr_assert_eq(proto_server_listener_restarts(s), 0);

    /* A peer leaving does not always break nng's listener (it depends on the error the socket
     * reports first), so the faults are repeated until the watchdog repaired two listeners.
     * Whatever the listener's state, a new client is answered within a few seconds. */
    for (int round = 1; round <= 10 && proto_server_listener_restarts(s) < 2; round++) {
        break_listener();
        cr_assert_eq(proto_client_open(t_url, &after, &e), COMMON_OK, "%s", e.text);
        int rc = hello_within(after, 5000, &took);
        cr_assert_eq(rc, COMMON_OK, "round %d: a new client got no reply in %llu ms", round,
                     (unsigned long long)took);
        cr_log_info("round %d: new client answered after %llu ms (%llu restarts)", round,
                    (unsigned long long)took,
                    (unsigned long long)proto_server_listener_restarts(s));
        proto_client_close(after);
        /* A client connected before the fault carries on (one COMMON_ECLOSED at most). */
        cr_assert_eq(hello_within(before, 5000, &took), COMMON_OK, "round %d", round);
        /* One-shot calls (a fresh connection each) are answered too. */
        struct proto_msg req = hello_req(7), rep;
        cr_assert_eq(proto_call(t_url, &req, &rep, 5000, &e), COMMON_OK, "%s", e.text);
    }
    cr_assert_geq(proto_server_listener_restarts(s), 2);
    /* The replacement socket file is still private, and removed at stop. */
    struct stat st;
    cr_assert_eq(stat(t_path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", (unsigned)(st.st_mode & 0777));
    proto_client_close(before);
    proto_server_stop(s);
    cr_assert_neq(stat(t_path, &st), 0, "the socket file outlived the server");
}

/* A long poll on the only worker, run on its own client. */
static void *long_poll_call(void *arg)
{
    struct proto_msg     req = {.kind = PROTO_KIND_DRAIN, .request_id = 5}, rep;
    struct common_errmsg e;
    *(int *)arg = proto_call(t_url, &req, &rep, 10000, &e);
    return NULL;
}

Test(proto_wire, busy_workers_are_not_a_broken_listener, .timeout = 60)
{
    struct proto_server *s = start_server(&(struct proto_server_opts){.n_workers = 1});
    pthread_t            th;
    int                  rc = -100;
    cr_assert_eq(pthread_create(&th, NULL, long_poll_call, &rc), 0);
    pthread_join(th, NULL); /* the only worker was blocked for 2.6 s: the watchdog probed */
    cr_assert_eq(rc, COMMON_OK);
    cr_assert_eq(proto_server_listener_restarts(s), 0);

    /* Broken while the only worker is blocked: detected and repaired all the same. */
    uint64_t detect_ms = 0;
    for (int round = 0; round < 5 && proto_server_listener_restarts(s) == 0; round++) {
        cr_assert_eq(pthread_create(&th, NULL, long_poll_call, &rc), 0);
        sleep_ms(100);
        break_listener();
        uint64_t t0 = common_now_ns();
        while (proto_server_listener_restarts(s) == 0 && (common_now_ns() - t0) / 1000000u < 2000u)
            sleep_ms(10);
        detect_ms = (common_now_ns() - t0) / 1000000u;
        pthread_join(th, NULL);
        /* The long poll's connection came through the old listener: closed by a restart. */
        cr_assert(rc == COMMON_OK || rc == COMMON_ECLOSED, "%s", common_strerror(rc));
    }
    cr_assert_geq(proto_server_listener_restarts(s), 1);
    cr_log_info("repaired %llu ms after the fault", (unsigned long long)detect_ms);
    struct proto_client *c = NULL;
    struct common_errmsg e = {{0}};
    uint64_t             took = 0;
    cr_assert_eq(proto_client_open(t_url, &c, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(hello_within(c, 5000, &took), COMMON_OK);
    proto_client_close(c);
    proto_server_stop(s);
}
