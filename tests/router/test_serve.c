/* tests/router/test_serve.c - the router service against a fake executor: generation, cancel,
 * bad requests, garbage, executor restart. */
#include <criterion/criterion.h>
#include <math.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "fake_exec.h"
#include "fixture.h"
#include "router.h"

#define MODEL "moe-tiny/moe-tiny-q8_0.gguf"

static char                *t_dir;
static char                *t_model;
static char                 t_url[600];
static struct fake_exec     t_exec;
static struct router_serve *t_serve;
static struct router_vocab *t_vocab;
static uint32_t             t_n_vocab;

static uint32_t t_prefill_chunk; /* router_serve_opts.prefill_chunk of the next setup */

static void serve_setup_with(uint32_t n_seq, uint32_t queue, uint32_t client_timeout_s)
{
    t_model = fixture_path(MODEL);
    if (!t_model)
        return;
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    cr_assert_eq(fake_exec_start(&t_exec, t_dir), 0);
    struct router_serve_opts o = {.model_path = t_model,
                                  .run_dir = t_dir,
                                  .n_ctx = 64,
                                  .n_seq = n_seq,
                                  .queue_max = queue,
                                  .client_timeout_s = client_timeout_s,
                                  .prefill_chunk = t_prefill_chunk,
                                  .connect_timeout_s = 5};
    struct common_errmsg     e = {{0}};
    int                      rc = router_serve_create(&o, &t_serve, &e);
    cr_assert_eq(rc, 0, "router_serve_create: %s", e.text);
    snprintf(t_url, sizeof(t_url), "%s", router_serve_url(t_serve));
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(t_model, NULL, &g, NULL), 0);
    cr_assert_eq(router_vocab_load(g, &t_vocab, NULL), 0);
    common_gguf_close(g);
    t_n_vocab = router_vocab_n_tokens(t_vocab);
}

static void serve_setup(void)
{
    serve_setup_with(2, 2, 60);
}

static void serve_teardown(void)
{
    if (!t_model)
        return;
    router_serve_destroy(t_serve);
    t_serve = NULL;
    fake_exec_stop(&t_exec);
    router_vocab_destroy(t_vocab);
    t_vocab = NULL;
    fixture_rmtree(t_dir);
    free(t_dir);
    free(t_model);
    t_model = NULL;
}

#define SKIP_WITHOUT_MODEL()                                                                       \
    if (!t_model)                                                                                  \
    cr_skip_test("fixture %s not found: skipped", MODEL)

static struct proto_msg greedy_req(uint64_t id, const char *prompt, uint32_t max_tokens)
{
    struct proto_msg m = {.kind = PROTO_KIND_GENERATE, .request_id = id};
    m.u.generate.prompt = (char *)(uintptr_t)prompt;
    m.u.generate.sampling = (struct proto_sampling){.temp = 0.0f, .top_p = 1.0f};
    m.u.generate.max_tokens = max_tokens;
    m.u.generate.stream = true;
    return m;
}

/* Sends `m` and returns the reply kind (ERROR code in *code). */
static int call(const struct proto_msg *m, struct proto_msg *rep)
{
    struct common_errmsg e = {{0}};
    int                  rc = proto_call(t_url, m, rep, 10000, &e);
    cr_assert_eq(rc, 0, "call failed: %s", e.text);
    return rep->kind == PROTO_KIND_ERROR ? rep->u.error.code : 0;
}

static int submit(const struct proto_msg *m)
{
    struct proto_msg rep;
    int              rc = call(m, &rep);
    if (rc == 0)
        cr_assert_eq(rep.kind, PROTO_KIND_OK);
    proto_msg_clear(&rep);
    return rc;
}

/* Polls `id` to the end; collects tokens and text. Returns the stop reason. */
static enum proto_stop_reason poll_all(uint64_t id, struct router_tokens *toks,
                                       struct router_text *text, struct proto_final_stats *st)
{
    for (int i = 0; i < 1000; i++) {
        struct proto_msg m = {.kind = PROTO_KIND_POLL, .request_id = id}, rep;
        m.u.poll.timeout_ms = 500;
        cr_assert_eq(call(&m, &rep), 0, "poll: %s", rep.u.error.message);
        cr_assert_eq(rep.kind, PROTO_KIND_EVENTS);
        for (uint32_t k = 0; k < rep.u.events.n_tokens; k++)
            router_tokens_push(toks, rep.u.events.tokens[k]);
        if (rep.u.events.text)
            router_text_append(text, rep.u.events.text, strlen(rep.u.events.text));
        bool                   done = rep.u.events.done;
        enum proto_stop_reason r = rep.u.events.reason;
        if (st)
            *st = rep.u.events.stats;
        proto_msg_clear(&rep);
        if (done)
            return r;
    }
    cr_assert_fail("request %llu never finished", (unsigned long long)id);
    return PROTO_STOP_NONE;
}

/* The tokens `sluice run` would feed: BOS + the prompt. */
static struct router_tokens tokenize(const char *prompt)
{
    struct router_tokens t = {0};
    cr_assert_eq(router_tokenize(t_vocab, prompt, strlen(prompt),
                                 &(struct router_tokenize_opts){.add_special = true}, &t),
                 0);
    return t;
}

static void check_greedy(const char *prompt, const struct router_tokens *got, uint32_t n)
{
    struct router_tokens p = tokenize(prompt);
    int32_t              want[64];
    cr_assert_leq(n, 64);
    fake_expected(p.ids, (uint32_t)p.n, n, t_n_vocab, want);
    cr_assert_eq(got->n, n, "%zu tokens, want %u", got->n, n);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(got->ids[i], want[i], "token %u: %d, want %d", i, got->ids[i], want[i]);
    router_tokens_fini(&p);
}

Test(router_serve, generate_matches_greedy_decoding, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct proto_msg m = greedy_req(11, "Once upon a time", 12);
    cr_assert_eq(submit(&m), 0);
    struct router_tokens     toks = {0};
    struct router_text       text = {0};
    struct proto_final_stats st;
    cr_assert_eq(poll_all(11, &toks, &text, &st), PROTO_STOP_LENGTH);
    check_greedy("Once upon a time", &toks, 12);
    /* The text is the streaming detokenization of the tokens. */
    struct router_text         want = {0};
    struct router_detok_stream ds;
    router_detok_stream_init(&ds, t_vocab, &(struct router_detok_opts){.keep_leading_space = true});
    for (size_t i = 0; i < toks.n; i++)
        router_detok_stream_push(&ds, toks.ids[i], &want);
    router_detok_stream_flush(&ds, &want);
    cr_assert_eq(text.len, want.len);
    if (want.len)
        cr_assert_arr_eq(text.ptr, want.ptr, want.len);
    struct router_tokens p = tokenize("Once upon a time");
    cr_assert_eq(st.n_prompt, p.n);
    cr_assert_eq(st.n_generated, 12);
    /* Finished and polled: the id is gone. */
    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 11}, rep;
    cr_assert_eq(call(&q, &rep), COMMON_ENOENT);
    router_tokens_fini(&p);
    router_tokens_fini(&toks);
    router_text_fini(&text);
    router_text_fini(&want);
}

Test(router_serve, no_stream_replies_once_when_done, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct proto_msg m = greedy_req(12, "Hello world", 8);
    m.u.generate.stream = false;
    cr_assert_eq(submit(&m), 0);
    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 12}, rep;
    q.u.poll.timeout_ms = 10000;
    cr_assert_eq(call(&q, &rep), 0);
    cr_assert(rep.u.events.done);
    cr_assert_eq(rep.u.events.n_tokens, 8);
    struct router_tokens got = {0};
    for (uint32_t i = 0; i < 8; i++)
        router_tokens_push(&got, rep.u.events.tokens[i]);
    check_greedy("Hello world", &got, 8);
    proto_msg_clear(&rep);
    router_tokens_fini(&got);
}

struct poller {
    uint64_t               id;
    struct router_tokens   toks;
    struct router_text     text;
    enum proto_stop_reason reason;
};

static void *poller_main(void *arg)
{
    struct poller *p = arg;
    p->reason = poll_all(p->id, &p->toks, &p->text, NULL);
    return NULL;
}

/* Polls two submitted greedy requests at once, each on its own thread; both must run to their
 * max_tokens with the tokens greedy decoding gives. */
static void poll_two_greedy(const struct proto_msg *a, const struct proto_msg *b)
{
    struct poller p[2] = {{.id = a->request_id}, {.id = b->request_id}};
    pthread_t     th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, poller_main, &p[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    const struct proto_msg *m[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(p[i].reason, PROTO_STOP_LENGTH);
        check_greedy(m[i]->u.generate.prompt, &p[i].toks, m[i]->u.generate.max_tokens);
        router_tokens_fini(&p[i].toks);
        router_text_fini(&p[i].text);
    }
}

Test(router_serve, two_concurrent_requests, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 500);
    struct proto_msg a = greedy_req(21, "The quick brown fox", 20);
    struct proto_msg b = greedy_req(22, "A completely different prompt", 16);
    cr_assert_eq(submit(&a), 0);
    cr_assert_eq(submit(&b), 0);
    poll_two_greedy(&a, &b);
}

static void serve_setup_chunked(void)
{
    t_prefill_chunk = 3;
    serve_setup_with(2, 2, 60);
    t_prefill_chunk = 0;
}

/* Prompts go to the executor in pieces of --prefill-chunk tokens, in rounds shared with the other
 * request (every record of a round but the last flagged "more"): the tokens do not change. */
Test(router_serve, chunked_prompts_share_rounds, .init = serve_setup_chunked,
     .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct proto_msg a = greedy_req(31, "The quick brown fox jumps over the lazy dog", 10);
    struct proto_msg b = greedy_req(32, "A completely different prompt", 10);
    atomic_store(&t_exec.hang, true); /* both are active before the first step is answered */
    cr_assert_eq(submit(&a), 0);
    cr_assert_eq(submit(&b), 0);
    atomic_store(&t_exec.hang, false);
    poll_two_greedy(&a, &b);
    cr_expect_eq(atomic_load(&t_exec.max_n), 3u, "an EVAL carried %u tokens",
                 atomic_load(&t_exec.max_n));
    cr_expect_gt(atomic_load(&t_exec.n_more), 0u, "no round had two records");
}

Test(router_serve, cancel_ends_with_cancel, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 20000);
    struct proto_msg m = greedy_req(31, "Once upon a time", 0);
    cr_assert_eq(submit(&m), 0);
    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 31}, rep;
    q.u.poll.timeout_ms = 5000;
    cr_assert_eq(call(&q, &rep), 0);
    cr_assert_not(rep.u.events.done);
    proto_msg_clear(&rep);
    struct proto_msg c = {.kind = PROTO_KIND_CANCEL, .request_id = 31};
    cr_assert_eq(call(&c, &rep), 0);
    cr_assert_eq(rep.kind, PROTO_KIND_OK);
    struct router_tokens toks = {0};
    struct router_text   text = {0};
    cr_assert_eq(poll_all(31, &toks, &text, NULL), PROTO_STOP_CANCEL);
    cr_assert_eq(call(&c, &rep), COMMON_ENOENT);
    router_tokens_fini(&toks);
    router_text_fini(&text);
}

Test(router_serve, context_full_stops, .init = serve_setup, .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct proto_msg m = greedy_req(32, "Once upon a time", 0); /* until the context is full */
    cr_assert_eq(submit(&m), 0);
    struct router_tokens toks = {0};
    struct router_text   text = {0};
    cr_assert_eq(poll_all(32, &toks, &text, NULL), PROTO_STOP_CONTEXT);
    struct router_tokens p = tokenize("Once upon a time");
    /* As `sluice run`: the last token is picked when every position is used. */
    cr_assert_eq(p.n + toks.n, 64 + 1);
    check_greedy("Once upon a time", &toks, (uint32_t)toks.n);
    router_tokens_fini(&p);
    router_tokens_fini(&toks);
    router_text_fini(&text);
}

static int generate_error(struct proto_msg *m, char *msg, size_t len)
{
    struct proto_msg rep;
    int              rc = call(m, &rep);
    if (msg)
        snprintf(msg, len, "%s", rc ? rep.u.error.message : "");
    proto_msg_clear(&rep);
    return rc;
}

/* One POLL with acknowledgements (protocol 0.2). */
static void poll_acked(uint64_t id, uint64_t ack_tokens, uint64_t ack_bytes, struct proto_msg *rep)
{
    struct proto_msg m = {.kind = PROTO_KIND_POLL, .request_id = id};
    m.u.poll.timeout_ms = 500;
    m.u.poll.max_events = 3; /* several replies for a short generation */
    m.u.poll.ack = true;
    m.u.poll.ack_tokens = ack_tokens;
    m.u.poll.ack_bytes = ack_bytes;
    cr_assert_eq(call(&m, rep), 0, "poll: %s", rep->u.error.message);
    cr_assert_eq(rep->kind, PROTO_KIND_EVENTS);
}

/* A POLL whose reply was lost (the connection closed, the client timed out) is sent again with
 * the same acknowledgements and gets the same events again: every token arrives exactly once,
 * the final reply included. A re-sent GENERATE is recognised; another one with the id is not. */
Test(router_serve, acknowledged_polls_are_idempotent, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 2000);
    const char      *prompt = "Once upon a time";
    struct proto_msg g = greedy_req(77, prompt, 16);
    cr_assert_eq(submit(&g), 0);
    cr_assert_eq(submit(&g), 0, "the same GENERATE again (its reply lost) is accepted");
    struct proto_msg other = greedy_req(77, "another prompt", 16);
    cr_assert_eq(generate_error(&other, NULL, 0), COMMON_EINVAL, "a different request, same id");

    struct router_tokens toks = {0};
    struct router_text   text = {0};
    uint64_t             got_t = 0, got_b = 0;
    uint32_t             n_generated = 0;
    for (int i = 0; i < 1000 && !n_generated; i++) {
        struct proto_msg lost, again;
        poll_acked(77, got_t, got_b, &lost);
        poll_acked(77, got_t, got_b, &again); /* as if `lost` never arrived */
        const struct proto_events *a = &lost.u.events, *b = &again.u.events;
        cr_assert_geq(b->n_tokens, a->n_tokens, "a retried poll lost tokens");
        cr_assert(memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t)) == 0);
        cr_assert_geq(b->text_len, a->text_len);
        cr_assert(a->text_len == 0 || memcmp(a->text, b->text, a->text_len) == 0);
        if (a->done) {
            cr_assert(b->done, "the final reply comes again");
            cr_assert_eq(a->n_tokens, b->n_tokens);
            cr_assert_eq(a->stats.n_generated, b->stats.n_generated);
        }
        for (uint32_t k = 0; k < b->n_tokens; k++)
            router_tokens_push(&toks, b->tokens[k]);
        if (b->text_len)
            router_text_append(&text, b->text, b->text_len);
        got_t += b->n_tokens;
        got_b += b->text_len;
        if (b->done)
            n_generated = b->stats.n_generated;
        proto_msg_clear(&lost);
        proto_msg_clear(&again);
    }
    cr_assert_eq(n_generated, 16);
    check_greedy(prompt, &toks, 16);
    struct router_text want = {0};
    cr_assert_eq(router_detokenize(t_vocab, toks.ids, toks.n,
                                   &(struct router_detok_opts){.keep_leading_space = true}, &want),
                 0);
    cr_assert_eq(text.len, want.len);
    cr_assert(memcmp(text.ptr, want.ptr, want.len) == 0);

    /* A late copy of an older POLL changes nothing and is refused; so is an ack of more than
     * was sent. */
    struct proto_msg m = {.kind = PROTO_KIND_POLL, .request_id = 77}, rep;
    m.u.poll.ack = true;
    m.u.poll.ack_tokens = got_t + 1;
    m.u.poll.ack_bytes = got_b;
    cr_assert_eq(call(&m, &rep), COMMON_EINVAL);
    struct proto_msg fin;
    poll_acked(77, got_t, got_b, &fin);
    cr_assert(fin.u.events.done && fin.u.events.n_tokens == 0, "the request still answers done");
    proto_msg_clear(&fin);
    /* Once delivered, the id may start a new request. */
    cr_assert_eq(submit(&other), 0);
    struct router_tokens toks2 = {0};
    struct router_text   text2 = {0};
    cr_assert_eq(poll_all(77, &toks2, &text2, NULL), PROTO_STOP_LENGTH);
    check_greedy("another prompt", &toks2, 16);
    router_tokens_fini(&toks2);
    router_text_fini(&text2);
    router_tokens_fini(&toks);
    router_text_fini(&text);
    router_text_fini(&want);
}

Test(router_serve, bad_requests_get_error_codes, .init = serve_setup, .fini = serve_teardown,
     .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    struct proto_msg m = greedy_req(41, "Hello", 4);
    m.u.generate.sampling.temp = NAN;
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "Hello", 4);
    m.u.generate.sampling.temp = -1.0f; /* as the CLI: a negative temperature is refused */
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "Hello", 4);
    m.u.generate.sampling.top_p = 2.0f;
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "Hello", 4);
    m.u.generate.sampling.min_p = -0.5f;
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "Hello", 4);
    m.u.generate.sampling.top_k = -3;
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "", 4);
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, NULL, 4);
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);
    m = greedy_req(41, "Hello", 4);
    m.u.generate.n_stops = 1; /* an empty stop string */
    cr_assert_eq(generate_error(&m, NULL, 0), COMMON_EINVAL);

    char big[2048] = {0};
    for (size_t i = 0; i + 6 < sizeof(big); i += 6)
        memcpy(big + i, "hello ", 6);
    m = greedy_req(42, big, 4);
    char msg[PROTO_MAX_ERROR_TEXT];
    cr_assert_eq(generate_error(&m, msg, sizeof(msg)), COMMON_ERANGE);
    cr_assert(strstr(msg, "context holds 64"), "message: %s", msg);

    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 999}, rep;
    cr_assert_eq(call(&q, &rep), COMMON_ENOENT);
    q.kind = PROTO_KIND_CANCEL;
    cr_assert_eq(call(&q, &rep), COMMON_ENOENT);
    q.kind = PROTO_KIND_ATTACH; /* not the router's business */
    memset(&q.u, 0, sizeof(q.u));
    cr_assert_eq(call(&q, &rep), COMMON_EPROTO);
    struct proto_msg cfg = {.kind = PROTO_KIND_CONFIGURE};
    snprintf(cfg.u.configure.key, PROTO_MAX_KEY, "no.such.key");
    cr_assert_eq(call(&cfg, &rep), COMMON_EINVAL);
    snprintf(cfg.u.configure.key, PROTO_MAX_KEY, "log.level");
    snprintf(cfg.u.configure.value, PROTO_MAX_VALUE, "warn");
    cr_assert_eq(call(&cfg, &rep), 0);
    struct proto_msg lm = {.kind = PROTO_KIND_LOAD_MODEL};
    snprintf(lm.u.load_model.path, PROTO_MAX_PATH, "/nonexistent.gguf");
    cr_assert_eq(call(&lm, &rep), COMMON_ENOTSUP);
    snprintf(lm.u.load_model.path, PROTO_MAX_PATH, "%s", t_model);
    cr_assert_eq(call(&lm, &rep), 0);
}

Test(router_serve, garbage_gets_error_and_service_continues, .init = serve_setup,
     .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000);
    cr_assert_eq(nng_dial(s, t_url, NULL, 0), 0);
    const char junk[] = "\x01\x02garbage, not a flatbuffer\xff\xfe";
    cr_assert_eq(nng_send(s, (void *)(uintptr_t)junk, sizeof(junk), 0), 0);
    void  *buf = NULL;
    size_t len = 0;
    cr_assert_eq(nng_recv(s, &buf, &len, NNG_FLAG_ALLOC), 0);
    struct proto_msg rep;
    cr_assert_eq(proto_decode(buf, len, &rep), 0);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EPROTO);
    nng_free(buf, len);
    nng_close(s);
    struct proto_msg h = {.kind = PROTO_KIND_HELLO}, hr;
    h.u.hello.major = PROTO_VERSION_MAJOR;
    h.u.hello.role = PROTO_ROLE_CLIENT;
    cr_assert_eq(call(&h, &hr), 0);
    cr_assert_eq(hr.kind, PROTO_KIND_HELLO);
    cr_assert_eq(hr.u.hello.role, PROTO_ROLE_ROUTER);
    struct proto_msg m = greedy_req(51, "Still alive", 3);
    cr_assert_eq(submit(&m), 0);
    struct router_tokens toks = {0};
    struct router_text   text = {0};
    cr_assert_eq(poll_all(51, &toks, &text, NULL), PROTO_STOP_LENGTH);
    router_tokens_fini(&toks);
    router_text_fini(&text);
}

static double stat_of(const char *name)
{
    struct proto_msg m = {.kind = PROTO_KIND_STATS}, rep;
    cr_assert_eq(call(&m, &rep), 0);
    cr_assert_eq(rep.kind, PROTO_KIND_STATS_REPLY);
    for (uint32_t i = 0; i < rep.u.stats.n_stats; i++)
        if (strcmp(rep.u.stats.stats[i].name, name) == 0)
            return rep.u.stats.stats[i].value;
    cr_assert_fail("no stat %s", name);
    return -1;
}

static void serve_setup_small(void)
{
    serve_setup_with(1, 1, 60);
}

Test(router_serve, queue_full_is_busy_and_drain_refuses, .init = serve_setup_small,
     .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 20000);
    struct proto_msg a = greedy_req(61, "one", 0), b = greedy_req(62, "two", 0),
                     c = greedy_req(63, "three", 0);
    cr_assert_eq(submit(&a), 0);
    while (stat_of("requests.active") < 1)
        usleep(10000);
    cr_assert_eq(submit(&b), 0); /* queued */
    char msg[PROTO_MAX_ERROR_TEXT];
    cr_assert_eq(generate_error(&c, msg, sizeof(msg)), COMMON_EBUSY);
    cr_assert(strstr(msg, "queue"), "message: %s", msg);
    struct proto_msg d = {.kind = PROTO_KIND_DRAIN}, rep;
    cr_assert_eq(call(&d, &rep), 0);
    struct proto_msg h = {.kind = PROTO_KIND_HEALTH};
    cr_assert_eq(call(&h, &rep), 0);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_DRAINING);
    struct proto_msg e = greedy_req(64, "four", 1);
    cr_assert_eq(generate_error(&e, NULL, 0), COMMON_EBUSY);
    struct proto_msg x = {.kind = PROTO_KIND_CANCEL, .request_id = 61};
    cr_assert_eq(call(&x, &rep), 0);
    x.request_id = 62;
    cr_assert_eq(call(&x, &rep), 0);
    cr_assert_eq(stat_of("requests.cancelled"), 2.0);
}

Test(router_serve, executor_restart_replays_bit_identical, .init = serve_setup,
     .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 2000);
    /* The executor stops answering after the prompt's step and 7 tokens' (of 30), however fast
     * or slow this machine is; the router gets a restarted one. */
    atomic_store(&t_exec.hang_at, atomic_load(&t_exec.n_steps) + 8);
    struct proto_msg m = greedy_req(71, "Once upon a time there was", 30);
    cr_assert_eq(submit(&m), 0);
    struct router_tokens toks = {0};
    struct router_text   text = {0};
    /* Wait for a few tokens, then "restart" the executor. */
    while (toks.n < 5) {
        struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 71}, rep;
        q.u.poll.timeout_ms = 2000;
        cr_assert_eq(call(&q, &rep), 0);
        for (uint32_t k = 0; k < rep.u.events.n_tokens; k++)
            router_tokens_push(&toks, rep.u.events.tokens[k]);
        cr_assert_not(rep.u.events.done);
        proto_msg_clear(&rep);
    }
    fake_exec_restart(&t_exec);
    cr_assert_eq(poll_all(71, &toks, &text, NULL), PROTO_STOP_LENGTH);
    check_greedy("Once upon a time there was", &toks, 30);
    cr_assert_geq(atomic_load(&t_exec.n_attaches), 2);
    cr_assert_geq(stat_of("replays"), 1.0);
    cr_assert_geq(stat_of("executor.restarts"), 1.0);
    router_tokens_fini(&toks);
    router_text_fini(&text);
}

static void serve_setup_short_timeout(void)
{
    serve_setup_with(1, 4, 1);
}

Test(router_serve, abandoned_request_is_dropped, .init = serve_setup_short_timeout,
     .fini = serve_teardown, .timeout = 60)
{
    SKIP_WITHOUT_MODEL();
    atomic_store(&t_exec.step_delay_us, 20000);
    struct proto_msg m = greedy_req(81, "nobody polls this", 0);
    cr_assert_eq(submit(&m), 0);
    while (stat_of("requests.dropped") < 1)
        usleep(10000);
    cr_assert_eq(stat_of("requests.dropped"), 1.0);
    cr_assert_eq(stat_of("requests.active"), 0.0);
    struct proto_msg q = {.kind = PROTO_KIND_POLL, .request_id = 81}, rep;
    cr_assert_eq(call(&q, &rep), COMMON_ENOENT);
}
