/* tests/router/test_client.c - the sluice client library against an in-process router and a
 * fake executor: streamed pieces in order, result stats, cancel, clear errors. */
#include <criterion/criterion.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "fake_exec.h"
#include "fixture.h"
#include "router.h"
#include "sluice_client.h"

#define MODEL "moe-tiny/moe-tiny-q8_0.gguf"

static char                *t_dir;
static char                *t_model;
static char                 t_sock[700];
static struct fake_exec     t_exec;
static struct router_serve *t_serve;
static struct router_vocab *t_vocab;

static void client_setup(void)
{
    t_model = fixture_path(MODEL);
    if (!t_model)
        return;
    t_dir = fixture_tmpdir();
    cr_assert_eq(fake_exec_start(&t_exec, t_dir), 0);
    struct router_serve_opts o = {
        .model_path = t_model, .run_dir = t_dir, .n_ctx = 64, .n_seq = 2, .connect_timeout_s = 5};
    struct common_errmsg e = {{0}};
    cr_assert_eq(router_serve_create(&o, &t_serve, &e), 0, "%s", e.text);
    snprintf(t_sock, sizeof(t_sock), "%s/router.sock", t_dir);
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(t_model, NULL, &g, NULL), 0);
    cr_assert_eq(router_vocab_load(g, &t_vocab, NULL), 0);
    common_gguf_close(g);
}

static void client_teardown(void)
{
    if (!t_model)
        return;
    router_serve_destroy(t_serve);
    fake_exec_stop(&t_exec);
    router_vocab_destroy(t_vocab);
    fixture_rmtree(t_dir);
    free(t_dir);
    free(t_model);
    t_model = NULL;
}

#define SKIP_WITHOUT_MODEL()                                                                       \
    if (!t_model)                                                                                  \
    cr_skip_test("fixture %s not found: skipped", MODEL)

struct collect {
    struct router_tokens toks;
    struct router_text   text;
    int                  calls;
    int                  cancel_after; /* return 1 after this many tokens; 0 = never */
};

static int collect_piece(void *arg, const char *text, size_t len, const int32_t *tokens,
                         size_t n_tokens)
{
    struct collect *c = arg;
    c->calls++;
    router_text_append(&c->text, text, len);
    for (size_t i = 0; i < n_tokens; i++)
        router_tokens_push(&c->toks, tokens[i]);
    return c->cancel_after && c->toks.n >= (size_t)c->cancel_after;
}

static struct sluice_generate_opts greedy(const char *prompt, uint32_t n)
{
    struct sluice_generate_opts o;
    sluice_generate_opts_init(&o);
    o.prompt = prompt;
    o.temp = 0.0f;
    o.max_tokens = n;
    return o;
}

Test(router_client, generate_streams_in_order, .init = client_setup, .fini = client_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 3000); /* several polls, several pieces */
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0, "%s", sluice_last_error());
    struct sluice_generate_opts   o = greedy("Once upon a time", 20);
    struct collect                col = {0};
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, collect_piece, &col, &res), 0, "%s",
                 sluice_last_error());
    cr_assert_eq(res.reason, SLUICE_STOP_LENGTH);
    cr_assert_eq(res.n_generated, 20);
    cr_assert_eq(col.toks.n, 20);
    cr_assert_gt(col.calls, 1, "streamed in one piece");
    struct router_tokens p = {0};
    router_tokenize(t_vocab, o.prompt, strlen(o.prompt),
                    &(struct router_tokenize_opts){.add_special = true}, &p);
    cr_assert_eq(res.n_prompt, p.n);
    int32_t want[20];
    fake_expected(p.ids, (uint32_t)p.n, 20, router_vocab_n_tokens(t_vocab), want);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(col.toks.ids[i], want[i], "token %d out of order or wrong", i);
    struct router_text text = {0};
    cr_assert_eq(router_detokenize(t_vocab, col.toks.ids, col.toks.n,
                                   &(struct router_detok_opts){.keep_leading_space = true}, &text),
                 0);
    cr_assert_eq(col.text.len, text.len);
    cr_assert(text.len == 0 || memcmp(col.text.ptr, text.ptr, text.len) == 0);
    cr_assert_geq(res.decode_ms, 0.0);
    cr_assert_geq(res.prompt_ms, 0.0);
    router_tokens_fini(&p);
    router_tokens_fini(&col.toks);
    router_text_fini(&col.text);
    router_text_fini(&text);
    sluice_client_close(c);
}

/* A byte token <0x00> puts a NUL in the text; every byte after it still reaches the client
 * (text used to travel as a C string and was cut at the first NUL). */
Test(router_client, nul_byte_token_reaches_the_client, .init = client_setup,
     .fini = client_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    int32_t nul = -1;
    for (uint32_t v = 0; v < router_vocab_n_tokens(t_vocab); v++) {
        const char *s = NULL;
        size_t      len = 0;
        if (router_vocab_text(t_vocab, (int32_t)v, &s, &len) == 0 && len == 6 &&
            memcmp(s, "<0x00>", 6) == 0)
            nul = (int32_t)v;
    }
    cr_assert_geq(nul, 0, "the fixture's vocabulary has no <0x00> byte token");
    atomic_store(&t_exec.force_plus1, nul + 1);
    atomic_store(&t_exec.step_delay_us, 2000); /* several polls, several pieces */
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0, "%s", sluice_last_error());
    struct sluice_generate_opts   o = greedy("Once upon a time", 16);
    struct collect                col = {0};
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, collect_piece, &col, &res), 0, "%s",
                 sluice_last_error());
    cr_assert_eq(col.toks.n, 16);
    size_t n_nul = 0;
    for (size_t i = 0; i < col.toks.n; i++)
        n_nul += col.toks.ids[i] == nul;
    cr_assert_geq(n_nul, 4, "the forced byte token came %zu times", n_nul);
    struct router_text text = {0};
    cr_assert_eq(router_detokenize(t_vocab, col.toks.ids, col.toks.n,
                                   &(struct router_detok_opts){.keep_leading_space = true}, &text),
                 0);
    cr_assert(memchr(text.ptr, '\0', text.len), "the detokenized text holds a NUL");
    cr_assert_eq(col.text.len, text.len, "client got %zu bytes of %zu", col.text.len, text.len);
    cr_assert(memcmp(col.text.ptr, text.ptr, text.len) == 0);
    router_tokens_fini(&col.toks);
    router_text_fini(&col.text);
    router_text_fini(&text);
    sluice_client_close(c);
}

/* ---- a bare connection every 100 ms ---------------------------------------------------------
 * nng 1.5.2 (#1518): a peer that connects and closes before the SP handshake can stop the
 * listener from accepting; the router's watchdog then replaces the listener, which closes every
 * client connection. A client must lose no token to that: it reconnects and sends its call again
 * (GENERATE is recognised, POLL carries acknowledgements). */

#define N_GEN     8
#define GEN_TOKEN 24

struct gen_job {
    char                          prompt[64];
    struct collect                col;
    struct sluice_generate_result res;
    int                           rc;
    char                          err[256];
};

static void *gen_thread(void *arg)
{
    struct gen_job       *j = arg;
    struct sluice_client *c = NULL;
    j->rc = sluice_client_connect(t_sock, &c);
    if (j->rc == 0) {
        struct sluice_generate_opts o = greedy(j->prompt, GEN_TOKEN);
        j->rc = sluice_client_generate(c, &o, collect_piece, &j->col, &j->res);
        sluice_client_close(c);
    }
    snprintf(j->err, sizeof(j->err), "%s", sluice_last_error());
    return NULL;
}

struct prober {
    atomic_bool stop;
    unsigned    n;
};

static void *probe_thread(void *arg)
{
    struct prober     *p = arg;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.*s", (int)sizeof(sa.sun_path) - 1, t_sock);
    while (!atomic_load(&p->stop)) {
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd >= 0) {
            if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
                p->n++;
            close(fd);
        }
        usleep(100000);
    }
    return NULL;
}

Test(router_client, bare_connections_cost_no_token, .init = client_setup, .fini = client_teardown,
     .timeout = 300)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 20000); /* generations outlast several probes */
    struct prober p = {0};
    pthread_t     pt, gt[N_GEN];
    cr_assert_eq(pthread_create(&pt, NULL, probe_thread, &p), 0);
    static struct gen_job jobs[N_GEN];
    for (int i = 0; i < N_GEN; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        snprintf(jobs[i].prompt, sizeof(jobs[i].prompt), "story number %d begins", i);
        cr_assert_eq(pthread_create(&gt[i], NULL, gen_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < N_GEN; i++)
        pthread_join(gt[i], NULL);
    atomic_store(&p.stop, true);
    pthread_join(pt, NULL);
    cr_log_info("%u bare connections, %llu listener restarts", p.n,
                (unsigned long long)proto_server_listener_restarts(
                    proto_service_server(router_serve_service(t_serve))));
    for (int i = 0; i < N_GEN; i++) {
        struct gen_job *j = &jobs[i];
        cr_assert_eq(j->rc, 0, "generation %d: %s", i, j->err);
        cr_assert_eq(j->res.n_generated, GEN_TOKEN);
        struct router_tokens pr = {0};
        router_tokenize(t_vocab, j->prompt, strlen(j->prompt),
                        &(struct router_tokenize_opts){.add_special = true}, &pr);
        int32_t want[GEN_TOKEN];
        fake_expected(pr.ids, (uint32_t)pr.n, GEN_TOKEN, router_vocab_n_tokens(t_vocab), want);
        cr_assert_eq(j->col.toks.n, GEN_TOKEN, "generation %d got %zu tokens", i, j->col.toks.n);
        for (int k = 0; k < GEN_TOKEN; k++)
            cr_assert_eq(j->col.toks.ids[k], want[k], "generation %d token %d", i, k);
        struct router_text text = {0};
        cr_assert_eq(router_detokenize(t_vocab, j->col.toks.ids, j->col.toks.n,
                                       &(struct router_detok_opts){.keep_leading_space = true},
                                       &text),
                     0);
        cr_assert_eq(j->col.text.len, text.len, "generation %d text", i);
        cr_assert(memcmp(j->col.text.ptr, text.ptr, text.len) == 0);
        router_text_fini(&text);
        router_tokens_fini(&pr);
        router_tokens_fini(&j->col.toks);
        router_text_fini(&j->col.text);
    }
}

Test(router_client, no_stream_gives_one_piece, .init = client_setup, .fini = client_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0, "%s", sluice_last_error());
    struct sluice_generate_opts o = greedy("Hello", 10);
    o.no_stream = true;
    struct collect                col = {0};
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, collect_piece, &col, &res), 0);
    cr_assert_eq(col.calls, 1);
    cr_assert_eq(col.toks.n, 10);
    router_tokens_fini(&col.toks);
    router_text_fini(&col.text);
    sluice_client_close(c);
}

Test(router_client, callback_cancels, .init = client_setup, .fini = client_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 10000);
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0);
    struct sluice_generate_opts   o = greedy("Once upon a time", 0);
    struct collect                col = {.cancel_after = 3};
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, collect_piece, &col, &res), 0, "%s",
                 sluice_last_error());
    cr_assert_eq(res.reason, SLUICE_STOP_CANCEL);
    cr_assert_lt(res.n_generated, 60);
    cr_assert_eq(sluice_client_cancel(c, 0), SLUICE_ENOENT); /* nothing running */
    router_tokens_fini(&col.toks);
    router_text_fini(&col.text);
    sluice_client_close(c);
}

struct canceller {
    struct sluice_client *c;
    _Atomic bool          started; /* the first piece of text arrived */
};

/* Cancels once the generation has produced its first piece (progress, not a clock). */
static void *cancel_later(void *arg)
{
    struct canceller *k = arg;
    while (!atomic_load(&k->started))
        usleep(1000);
    sluice_client_request_cancel(k->c);
    return NULL;
}

static int mark_started(void *arg, const char *text, size_t len, const int32_t *ids, size_t n_ids)
{
    (void)text;
    (void)len;
    (void)ids;
    (void)n_ids;
    atomic_store(&((struct canceller *)arg)->started, true);
    return 0;
}

Test(router_client, request_cancel_from_another_thread, .init = client_setup,
     .fini = client_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    /* 100 ms a step: the whole context (64 positions) would take seconds, so the cancel sent
     * after the first token always lands before the end. */
    atomic_store(&t_exec.step_delay_us, 100000);
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0);
    struct canceller k = {.c = c};
    pthread_t        t;
    pthread_create(&t, NULL, cancel_later, &k);
    struct sluice_generate_opts   o = greedy("Once upon a time", 0);
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, mark_started, &k, &res), 0);
    pthread_join(t, NULL);
    cr_assert_eq(res.reason, SLUICE_STOP_CANCEL);
    sluice_client_close(c);
}

Test(router_client, refused_request_has_code_and_message, .init = client_setup,
     .fini = client_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0);
    char big[1024] = {0};
    for (size_t i = 0; i + 4 < sizeof(big); i += 4)
        memcpy(big + i, "abc ", 4);
    struct sluice_generate_opts   o = greedy(big, 4);
    struct sluice_generate_result res;
    cr_assert_eq(sluice_client_generate(c, &o, NULL, NULL, &res), SLUICE_ERANGE);
    cr_assert(strstr(sluice_last_error(), "context holds 64"), "%s", sluice_last_error());
    o = greedy("x", 4);
    o.top_p = 3.0f;
    cr_assert_eq(sluice_client_generate(c, &o, NULL, NULL, &res), SLUICE_EINVAL);
    sluice_client_close(c);
}

Test(router_client, missing_socket_fails_fast, .timeout = 20)
{
    char *dir = fixture_tmpdir();
    char  path[600];
    snprintf(path, sizeof(path), "%s/router.sock", dir);
    struct sluice_client *c = NULL;
    /* "Fast" is bounded by the test's .timeout, never measured: a busy machine is slow. */
    cr_assert_eq(sluice_client_connect(path, &c), SLUICE_ECLOSED);
    cr_assert(strstr(sluice_last_error(), "not running"), "%s", sluice_last_error());
    cr_assert_null(c);
    /* A socket file nobody listens on: still a clear error, within the HELLO timeout. */
    struct proto_server *srv = NULL;
    char                 url[700];
    snprintf(url, sizeof(url), "ipc://%s", path);
    cr_assert_eq(proto_server_start(url, NULL, fake_exec_handler, NULL, &srv, NULL), 0);
    proto_server_stop(srv); /* a stale socket file, or none */
    cr_assert_eq(sluice_client_connect(path, &c), SLUICE_ECLOSED);
    /* A stale socket file for sure (bound, never listened on, left behind): "nobody listens",
     * after one silent HELLO, not after the 30 s the client waits for a router that pauses. */
    unlink(path);
    int                fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%.*s", (int)sizeof(sa.sun_path) - 1, path);
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    cr_assert_eq(sluice_client_connect(path, &c), SLUICE_ECLOSED);
    cr_assert(strstr(sluice_last_error(), "nobody listens"), "%s", sluice_last_error());
    fixture_rmtree(dir);
    free(dir);
}

Test(router_client, router_gone_mid_generation_is_closed, .init = client_setup,
     .fini = client_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 10000);
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(t_sock, &c), 0);
    struct sluice_generate_opts   o = greedy("Once upon a time", 0);
    struct sluice_generate_result res;
    struct collect                col = {0};
    router_serve_destroy(t_serve); /* the router goes away after the client connected */
    t_serve = NULL;
    int rc = sluice_client_generate(c, &o, collect_piece, &col, &res);
    cr_assert(rc == SLUICE_ECLOSED || rc == SLUICE_ETIMEDOUT, "rc %d: %s", rc, sluice_last_error());
    router_tokens_fini(&col.toks);
    router_text_fini(&col.text);
    sluice_client_close(c);
}

/* A router that answers the first GENERATE only once the same request came again: to the client
 * the first is lost, as nng 1.5.2 loses a request whose connection closes between its send and
 * the wait for the reply (seen in CI when a restarted router replaced its listener). The client
 * sends a silent GENERATE again well before it gives up on the router (30 s); the repeat gets
 * OK and the request completes. */
struct lost_router {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             n_generate;
    bool            repeated;
};

static int lost_router_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct lost_router *l = arg;
    switch (req->kind) {
    case PROTO_KIND_HELLO:
        rep->kind = PROTO_KIND_HELLO;
        rep->u.hello = (struct proto_hello){.major = PROTO_VERSION_MAJOR,
                                            .minor = PROTO_VERSION_MINOR,
                                            .role = PROTO_ROLE_ROUTER,
                                            .name = "router"};
        return 0;
    case PROTO_KIND_GENERATE: {
        pthread_mutex_lock(&l->mu);
        if (++l->n_generate == 1) {
            /* Held until the repeat came (or 60 s, past the client's patience). */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 60;
            while (!l->repeated && pthread_cond_timedwait(&l->cv, &l->mu, &until) == 0) {
            }
        } else {
            l->repeated = true;
            pthread_cond_broadcast(&l->cv);
        }
        pthread_mutex_unlock(&l->mu);
        rep->kind = PROTO_KIND_OK;
        return 0;
    }
    case PROTO_KIND_POLL:
        rep->kind = PROTO_KIND_EVENTS;
        rep->u.events = (struct proto_events){.n_tokens = 1,
                                              .tokens = {7},
                                              .done = true,
                                              .reason = PROTO_STOP_LENGTH,
                                              .stats = {.n_generated = 1}};
        return 0;
    default:
        return COMMON_EPROTO;
    }
}

Test(router_client, lost_generate_is_sent_again, .timeout = 120)
{
    char *dir = fixture_tmpdir();
    char  path[600], url[700];
    snprintf(path, sizeof(path), "%s/router.sock", dir);
    snprintf(url, sizeof(url), "ipc://%s", path);
    struct lost_router   l = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct proto_server *srv = NULL;
    cr_assert_eq(proto_server_start(url, NULL, lost_router_handler, &l, &srv, NULL), 0);
    struct sluice_client *c = NULL;
    cr_assert_eq(sluice_client_connect(path, &c), 0, "%s", sluice_last_error());
    struct sluice_generate_opts   o = greedy("x", 1);
    struct sluice_generate_result res;
    int                           rc = sluice_client_generate(c, &o, NULL, NULL, &res);
    sluice_client_close(c);
    pthread_mutex_lock(&l.mu);
    const int  n = l.n_generate;
    const bool repeated = l.repeated;
    pthread_mutex_unlock(&l.mu);
    proto_server_stop(srv);
    cr_assert_eq(rc, 0, "%s", sluice_last_error());
    cr_assert(repeated && n == 2, "GENERATE came %d times", n);
    cr_assert_eq(res.reason, SLUICE_STOP_LENGTH);
    cr_assert_eq(res.n_generated, 1);
    fixture_rmtree(dir);
    free(dir);
}
