/* tests/tsan/tsan_pipeline.c - the whole pipeline in one process (two fetcher services, the
 * executor service, the router service, 16 client threads and a canceller), as a plain program
 * so it runs under ThreadSanitizer: a soak of sampled requests, then the greedy tokens again. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "executor.h"
#include "fetcher.h"
#include "fixture.h"
#include "router.h"
#include "sluice_client.h"

#define P_MODEL      "moe-tiny/moe-tiny-q8_0.gguf"
#define P_FETCHERS   2u
#define P_SLOTS      4u /* per fetcher: 16 bundles per shard, so the pool evicts all the time */
#define P_N_SEQ      4u /* --parallel 4 */
#define P_N_CTX      128u
#define P_THREADS    2u
#define P_CLIENTS    16
#define P_OVERDUE_S  60  /* a call running this long is cancelled by the watchdog */
#define P_HANG_S     120 /* ... and counted as hung if it is still running this long */
#define P_GREEDY_LEN 16u

static const char *const p_prompts[] = {"In the beginning", "And God said",
                                        "The LORD is my shepherd", "Blessed are the",
                                        "Then Jesus answered and said unto them"};
#define P_N_PROMPTS (sizeof(p_prompts) / sizeof(p_prompts[0]))

/* The services, started and stopped by main. */
struct p_env {
    char                       *model_path;
    char                       *dir;
    char                        sock[600];
    struct fetcher_server      *fetchers[P_FETCHERS];
    struct common_gguf         *gguf;
    struct common_model         desc;
    bool                        desc_ok;
    struct executor_remote     *remote;
    struct executor_model      *model;
    struct executor_threadpool *pool;
    struct executor_serve      *exec;
    struct router_serve        *router;
};

/* One client thread: its connection (opened and closed by main), the request it runs now and
 * its counts (written by the thread, read after join). */
struct p_client {
    int                   idx; /* 1..P_CLIENTS: also the sampling seed */
    struct sluice_client *c;
    _Atomic uint64_t      cur_id;     /* request running now, 0 = none */
    _Atomic uint64_t      start_ns;   /* start of the running call, 0 = none */
    atomic_uint           cur_tokens; /* tokens the running request has received so far */
    _Atomic uint64_t      cancel_id;  /* the latest request the canceller cancelled */
    atomic_bool           overdue;    /* the watchdog cancelled the running call */
    uint64_t              rng;
    unsigned              done, cancelled, errors, bad;
};

static struct p_client g_cl[P_CLIENTS];
static uint64_t        g_deadline_ns;   /* end of the soak */
static atomic_bool     g_watch_stop;    /* ends the watchdog */
static atomic_uint     g_overdue;       /* calls the watchdog had to cancel */
static atomic_uint     g_hung;          /* calls still running P_HANG_S after they started */
static atomic_uint     g_cancel_sent;   /* cancels the canceller issued */
static atomic_uint     g_cancel_acked;  /* ... that the router acknowledged */
static atomic_uint     g_cancel_missed; /* ... answered ENOENT (the request had just ended) */
static atomic_uint     g_cancel_failed; /* ... that failed otherwise */
static const char     *g_sock;

static uint64_t p_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void p_sleep_ms(unsigned ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* ---- services ---------------------------------------------------------------------------- */

static bool p_start(struct p_env *v)
{
    struct common_errmsg e = {{0}};
    v->dir = fixture_tmpdir();
    if (!v->dir) {
        CHECK(0, "mkdtemp failed");
        return false;
    }
    for (uint32_t i = 0; i < P_FETCHERS; i++) {
        struct fetcher_serve_opts fo = {.model_path = v->model_path,
                                        .run_dir = v->dir,
                                        .shard = i,
                                        .n_shards = P_FETCHERS,
                                        .n_slots = P_SLOTS,
                                        .io = FETCHER_IO_PREAD};
        int                       rc = fetcher_serve_start(&fo, &v->fetchers[i], &e);
        CHECK(rc == 0, "fetcher %u: %s", i, e.text);
        if (rc)
            return false;
    }
    executor_kernels_init();
    if (common_gguf_open(v->model_path, NULL, &v->gguf, &e) ||
        common_model_init(&v->desc, v->gguf, &e)) {
        CHECK(0, "model: %s", e.text);
        return false;
    }
    v->desc_ok = true;
    struct executor_remote_opts ro = {.run_dir = v->dir,
                                      .n_fetchers = P_FETCHERS,
                                      .model = &v->desc,
                                      .connect_timeout_ms = 10000,
                                      .instance = 42};
    if (executor_remote_create(&ro, &v->remote, &e)) {
        CHECK(0, "executor_remote_create: %s", e.text);
        return false;
    }
    struct executor_expert_source src;
    executor_remote_source(v->remote, &src);
    struct executor_weights *w = NULL;
    if (executor_weights_stream_create(
            &v->desc, &(struct executor_weights_opts){.read_span = common_gguf_read_span}, &src, &w,
            &e) ||
        executor_model_create(&v->desc, w, &v->model, &e)) {
        executor_weights_destroy(w);
        CHECK(0, "executor model: %s", e.text);
        return false;
    }
    if (executor_threadpool_create(P_THREADS, &v->pool)) {
        CHECK(0, "executor_threadpool_create");
        return false;
    }
    struct executor_serve_opts so = {.run_dir = v->dir,
                                     .model_path = v->model_path,
                                     .model = v->model,
                                     .remote = v->remote,
                                     .pool = v->pool,
                                     .n_seq = P_N_SEQ,
                                     .n_ctx = P_N_CTX};
    if (executor_serve_start(&so, &v->exec, &e)) {
        CHECK(0, "executor_serve_start: %s", e.text);
        return false;
    }
    struct router_serve_opts o = {.model_path = v->model_path,
                                  .run_dir = v->dir,
                                  .n_ctx = P_N_CTX,
                                  .n_seq = P_N_SEQ,
                                  .connect_timeout_s = 10};
    if (router_serve_create(&o, &v->router, &e)) {
        CHECK(0, "router_serve_create: %s", e.text);
        return false;
    }
    snprintf(v->sock, sizeof(v->sock), "%s/router.sock", v->dir);
    return true;
}

/* Stops everything in the order of the daemons (router first); accepts a partial start. */
static void p_stop(struct p_env *v)
{
    if (v->router) {
        router_serve_drain(v->router);
        CHECK(router_serve_wait_idle(v->router, 30000), "router not idle 30 s after the soak");
        router_serve_destroy(v->router);
    }
    if (v->exec) {
        executor_serve_drain(v->exec);
        executor_serve_stop(v->exec);
    }
    struct executor_weights *w = v->model ? executor_model_weights(v->model) : NULL;
    executor_model_destroy(v->model);
    executor_weights_destroy(w);
    if (v->remote) {
        for (uint32_t i = 0; i < P_FETCHERS; i++) {
            struct executor_remote_stats st;
            if (executor_remote_stats(v->remote, i, &st) == 0) {
                printf("executor link %u: %llu acquires, %llu errors, %llu relinks, %llu bad\n", i,
                       (unsigned long long)st.acquires, (unsigned long long)st.errors,
                       (unsigned long long)st.relinks, (unsigned long long)st.bad_replies);
                CHECK(st.errors == 0 && st.bad_replies == 0 && st.relinks == 0,
                      "link %u: %llu errors, %llu bad replies, %llu relinks", i,
                      (unsigned long long)st.errors, (unsigned long long)st.bad_replies,
                      (unsigned long long)st.relinks);
            }
        }
    }
    executor_remote_destroy(v->remote);
    executor_threadpool_destroy(v->pool);
    if (v->desc_ok)
        common_model_fini(&v->desc);
    common_gguf_close(v->gguf);
    for (uint32_t i = 0; i < P_FETCHERS; i++) {
        if (!v->fetchers[i])
            continue;
        struct fetcher_serve_counts fc;
        fetcher_serve_counts(v->fetchers[i], &fc);
        CHECK(fc.bad_records == 0 && fc.acquire_errors == 0,
              "fetcher %u: %llu bad records, %llu acquire errors", i,
              (unsigned long long)fc.bad_records, (unsigned long long)fc.acquire_errors);
        struct common_errmsg e = {{0}};
        CHECK(fetcher_serve_stop(v->fetchers[i], &e) == 0, "fetcher %u stop: %s", i, e.text);
    }
    if (v->dir) {
        fixture_rmtree(v->dir);
        free(v->dir);
    }
}

/* ---- clients ----------------------------------------------------------------------------- */

struct p_collect {
    int32_t          ids[64];
    size_t           n;        /* tokens received (may exceed the array: only 64 are kept) */
    struct p_client *progress; /* cur_tokens published here; NULL = none */
};

static int p_piece(void *arg, const char *text, size_t len, const int32_t *tokens, size_t n_tokens)
{
    struct p_collect *k = arg;
    (void)text;
    (void)len;
    for (size_t i = 0; i < n_tokens; i++, k->n++)
        if (k->n < sizeof(k->ids) / sizeof(k->ids[0]))
            k->ids[k->n] = tokens[i];
    if (k->progress)
        atomic_store(&k->progress->cur_tokens, (unsigned)k->n);
    return 0;
}

/* A greedy generation on a fresh connection; returns the token count, or -1. */
static int p_greedy(const char *prompt, int32_t *out)
{
    struct sluice_client *c = NULL;
    if (sluice_client_connect(g_sock, &c)) {
        CHECK(0, "connect: %s", sluice_last_error());
        return -1;
    }
    struct sluice_generate_opts o;
    sluice_generate_opts_init(&o);
    o.prompt = prompt;
    o.temp = 0.0f;
    o.max_tokens = P_GREEDY_LEN;
    struct p_collect              k = {{0}, 0, NULL};
    struct sluice_generate_result r;
    int                           rc = sluice_client_generate(c, &o, p_piece, &k, &r);
    sluice_client_close(c);
    CHECK(rc == 0, "greedy: %s", sluice_last_error());
    if (rc)
        return -1;
    CHECK(r.reason == SLUICE_STOP_LENGTH && r.n_generated == P_GREEDY_LEN && k.n == P_GREEDY_LEN,
          "greedy ended with reason %d after %u tokens (%zu received): %s", (int)r.reason,
          r.n_generated, k.n, r.error);
    memcpy(out, k.ids, P_GREEDY_LEN * sizeof(*out));
    return (int)k.n;
}

static void *p_client_main(void *arg)
{
    struct p_client *cl = arg;
    uint64_t         seq = 0;
    while (common_now_ns() < g_deadline_ns) {
        struct sluice_generate_opts o;
        sluice_generate_opts_init(&o);
        o.prompt = p_prompts[p_rng(&cl->rng) % P_N_PROMPTS];
        o.temp = 0.7f;
        o.seed = (uint64_t)cl->idx;
        o.max_tokens = 4 + (uint32_t)(p_rng(&cl->rng) % 17); /* 4..20 */
        o.id = ((uint64_t)cl->idx << 32) | ++seq;
        struct p_collect              k = {{0}, 0, cl};
        struct sluice_generate_result r;
        atomic_store(&cl->overdue, false);
        atomic_store(&cl->cur_tokens, 0);
        atomic_store(&cl->start_ns, common_now_ns());
        atomic_store(&cl->cur_id, o.id);
        int rc = sluice_client_generate(cl->c, &o, p_piece, &k, &r);
        atomic_store(&cl->cur_id, 0);
        atomic_store(&cl->start_ns, 0);
        if (rc < 0) {
            /* An explicit error from the library: a status and a message. */
            cl->errors++;
            fprintf(stderr, "client %d request %llu: %s (%s)\n", cl->idx, (unsigned long long)o.id,
                    sluice_strerror(rc), sluice_last_error());
            continue;
        }
        switch (r.reason) {
        case SLUICE_STOP_CANCEL:
            cl->cancelled++;
            /* Tokens the router made after the client sent CANCEL are not handed to the
             * callback (sluice_client drops output once it cancels), so fewer may arrive. */
            if (k.n > r.n_generated || r.n_generated > o.max_tokens) {
                cl->bad++;
                fprintf(stderr, "client %d: cancelled after %u tokens, %zu received\n", cl->idx,
                        r.n_generated, k.n);
            }
            break;
        case SLUICE_STOP_ERROR:
            cl->errors++;
            fprintf(stderr, "client %d request %llu: router error %d: %s\n", cl->idx,
                    (unsigned long long)o.id, r.error_code, r.error);
            break;
        case SLUICE_STOP_LENGTH:
        case SLUICE_STOP_EOS:
        case SLUICE_STOP_CONTEXT:
            cl->done++;
            /* A cancel that lost the race with the end: the library stopped handing pieces to
             * the callback when it sent the cancel, so fewer may have arrived. */
            if ((atomic_load(&cl->cancel_id) == o.id ? k.n > r.n_generated
                                                     : k.n != r.n_generated) ||
                (r.reason == SLUICE_STOP_LENGTH ? r.n_generated != o.max_tokens
                                                : r.n_generated > o.max_tokens)) {
                cl->bad++;
                fprintf(stderr, "client %d: reason %d, %u tokens generated, %zu received, max %u\n",
                        cl->idx, (int)r.reason, r.n_generated, k.n, o.max_tokens);
            }
            break;
        default:
            cl->bad++;
            fprintf(stderr, "client %d: unexpected end reason %d\n", cl->idx, (int)r.reason);
            break;
        }
    }
    return NULL;
}

/* Cancels requests mid-way (some tokens already streamed; one in four regardless, queued ones
 * included) at random moments, three ways: by id over its own connection, through the client's
 * own connection, and with the async-signal-safe flag. */
static void *p_canceller_main(void *arg)
{
    (void)arg;
    struct sluice_client *own = NULL;
    if (sluice_client_connect(g_sock, &own)) {
        fprintf(stderr, "canceller: connect: %s\n", sluice_last_error());
        atomic_fetch_add(&g_cancel_failed, 1);
        return NULL;
    }
    uint64_t rng = 99;
    unsigned n = 0;
    while (common_now_ns() < g_deadline_ns) {
        p_sleep_ms(250 + (unsigned)(p_rng(&rng) % 750));
        bool             any = p_rng(&rng) % 4 == 0;
        uint64_t         first = p_rng(&rng), id = 0;
        struct p_client *cl = NULL;
        for (unsigned i = 0; i < P_CLIENTS && !id; i++) {
            cl = &g_cl[(first + i) % P_CLIENTS];
            id = atomic_load(&cl->cur_id);
            if (!any && atomic_load(&cl->cur_tokens) == 0)
                id = 0;
        }
        if (!id)
            continue;
        atomic_store(&cl->cancel_id, id);
        int rc = 0;
        switch (n++ % 3) {
        case 0:
            rc = sluice_client_cancel(own, id);
            break;
        case 1:
            rc = sluice_client_cancel(cl->c, 0);
            break;
        default:
            sluice_client_request_cancel(cl->c);
            break;
        }
        atomic_fetch_add(&g_cancel_sent, 1);
        if (rc == 0)
            atomic_fetch_add(&g_cancel_acked, 1);
        else if (rc == SLUICE_ENOENT)
            atomic_fetch_add(&g_cancel_missed, 1);
        else {
            atomic_fetch_add(&g_cancel_failed, 1);
            fprintf(stderr, "canceller: %s (%s)\n", sluice_strerror(rc), sluice_last_error());
        }
    }
    sluice_client_close(own);
    return NULL;
}

/* Cancels calls that run too long and counts the ones that still do not end. */
static void *p_watchdog_main(void *arg)
{
    (void)arg;
    bool hung[P_CLIENTS] = {false};
    while (!atomic_load(&g_watch_stop)) {
        p_sleep_ms(200);
        uint64_t now = common_now_ns();
        for (int i = 0; i < P_CLIENTS; i++) {
            struct p_client *cl = &g_cl[i];
            uint64_t         t0 = atomic_load(&cl->start_ns);
            if (!t0 || now < t0) {
                hung[i] = false;
                continue;
            }
            uint64_t age = now - t0;
            if (age > (uint64_t)P_OVERDUE_S * 1000000000ull && !atomic_load(&cl->overdue)) {
                atomic_store(&cl->overdue, true);
                atomic_fetch_add(&g_overdue, 1);
                fprintf(stderr, "client %d: request %llu still running after %d s: cancelling\n",
                        cl->idx, (unsigned long long)atomic_load(&cl->cur_id), P_OVERDUE_S);
                sluice_client_request_cancel(cl->c);
            }
            if (age > (uint64_t)P_HANG_S * 1000000000ull && !hung[i]) {
                hung[i] = true;
                atomic_fetch_add(&g_hung, 1);
                fprintf(stderr, "client %d: request %llu hung (%d s)\n", cl->idx,
                        (unsigned long long)atomic_load(&cl->cur_id), P_HANG_S);
            }
        }
    }
    return NULL;
}

/* Joins `t`, waiting at most until abs_s (CLOCK_REALTIME seconds); false when it did not end. */
static bool p_join(pthread_t t, time_t abs_s)
{
    return pthread_timedjoin_np(t, NULL, &(struct timespec){abs_s, 0}) == 0;
}

static unsigned p_soak_seconds(void)
{
    const char *s = getenv("SLUICE_SOAK_SECONDS");
    if (!s || !*s)
        return 20;
    char         *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (*end || v == 0 || v > 86400) {
        fprintf(stderr, "SLUICE_SOAK_SECONDS=%s ignored: using 20\n", s);
        return 20;
    }
    return (unsigned)v;
}

static void p_soak(unsigned seconds)
{
    g_deadline_ns = common_now_ns() + (uint64_t)seconds * 1000000000ull;
    pthread_t threads[P_CLIENTS], canceller, watchdog;
    bool      started[P_CLIENTS] = {false};
    bool      canceller_started = false;
    for (int i = 0; i < P_CLIENTS; i++) {
        g_cl[i].idx = i + 1;
        g_cl[i].rng = 1000u + (uint64_t)i;
        int rc = sluice_client_connect(g_sock, &g_cl[i].c);
        CHECK(rc == 0, "client %d connect: %s", i + 1, sluice_last_error());
    }
    CHECK(pthread_create(&watchdog, NULL, p_watchdog_main, NULL) == 0, "watchdog thread");
    for (int i = 0; i < P_CLIENTS; i++)
        if (g_cl[i].c)
            started[i] = pthread_create(&threads[i], NULL, p_client_main, &g_cl[i]) == 0;
    canceller_started = pthread_create(&canceller, NULL, p_canceller_main, NULL) == 0;
    CHECK(canceller_started, "canceller thread");

    time_t limit = time(NULL) + (time_t)seconds + P_HANG_S + 30;
    bool   all_joined = true;
    for (int i = 0; i < P_CLIENTS; i++)
        if (started[i] && !p_join(threads[i], limit)) {
            CHECK(0, "client %d did not end %d s after the soak", i + 1, P_HANG_S + 30);
            all_joined = false;
        }
    if (canceller_started && !p_join(canceller, limit)) {
        CHECK(0, "canceller did not end");
        all_joined = false;
    }
    atomic_store(&g_watch_stop, true);
    pthread_join(watchdog, NULL);
    if (!all_joined) {
        /* Threads still hold the services: tearing them down would crash. */
        fflush(stderr);
        check_report();
        _exit(1);
    }

    unsigned done = 0, cancelled = 0, errors = 0, bad = 0;
    for (int i = 0; i < P_CLIENTS; i++) {
        done += g_cl[i].done;
        cancelled += g_cl[i].cancelled;
        errors += g_cl[i].errors;
        bad += g_cl[i].bad;
        sluice_client_close(g_cl[i].c);
    }
    unsigned total = done + cancelled + errors + bad;
    printf("soak %u s, %d clients: %u requests: %u completed, %u cancelled, %u errors, %u bad; "
           "cancels sent %u (acknowledged %u, already ended %u, failed %u); watchdog: %u overdue, "
           "%u hung\n",
           seconds, P_CLIENTS, total, done, cancelled, errors, bad, atomic_load(&g_cancel_sent),
           atomic_load(&g_cancel_acked), atomic_load(&g_cancel_missed),
           atomic_load(&g_cancel_failed), atomic_load(&g_overdue), atomic_load(&g_hung));
    CHECK(done > 0, "no request completed");
    CHECK(bad == 0, "%u requests ended inconsistently", bad);
    CHECK(errors == 0, "%u requests failed (explicit errors, listed above)", errors);
    CHECK(atomic_load(&g_hung) == 0, "%u requests hung", atomic_load(&g_hung));
    CHECK(atomic_load(&g_overdue) == 0, "%u requests overdue", atomic_load(&g_overdue));
    CHECK(atomic_load(&g_cancel_failed) == 0, "%u cancels failed", atomic_load(&g_cancel_failed));
    CHECK(atomic_load(&g_cancel_sent) == 0 || cancelled > 0,
          "%u cancels sent, no request ended cancelled", atomic_load(&g_cancel_sent));
}

int main(void)
{
    struct p_env v;
    memset(&v, 0, sizeof(v));
    v.model_path = fixture_path(P_MODEL);
    if (!v.model_path) {
        printf("SKIP tsan_pipeline: fixture %s absent\n", P_MODEL);
        return check_report();
    }
    if (p_start(&v)) {
        g_sock = v.sock;
        int32_t before[P_GREEDY_LEN], after[P_GREEDY_LEN];
        int     nb = p_greedy(p_prompts[0], before);
        p_soak(p_soak_seconds());
        int na = p_greedy(p_prompts[0], after);
        if (nb > 0 && na > 0)
            CHECK(memcmp(before, after, sizeof(before)) == 0,
                  "greedy tokens after the soak differ from the ones before it");
    }
    p_stop(&v);
    free(v.model_path);
    int rc = check_report();
    fflush(stdout); /* LeakSanitizer ends the process without flushing stdio */
    return rc;
}
