/* executor/main.c - sluice-executor: the forward pass as a daemon between fetchers and router. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "executor.h"

/* Process singleton: set by the SIGTERM/SIGINT handler, read by the main loop. */
static volatile sig_atomic_t g_stop;

static void main_on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

struct main_config {
    const char            *model;
    const char            *run_dir;
    uint32_t               n_fetchers;
    uint32_t               n_threads;
    uint32_t               n_ctx;
    uint32_t               n_seq;
    uint32_t               n_batch;
    enum common_cache_type cache_type;
    uint32_t               connect_timeout_s;
    bool                   direct_reads;
    enum common_log_level  log_level;
};

static void main_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice-executor -m MODEL.gguf --run-dir DIR [options]\n\n"
            "The executor daemon: holds the resident weights and one KV cache per sequence, runs\n"
            "the forward pass for the router (EVAL steps over shared-memory rings) and takes the\n"
            "routed experts of a MoE model from the fetcher daemons of DIR. A dense model needs\n"
            "no fetcher. Listens on ipc://DIR/executor.ctl.\n\n"
            "  -m, --model PATH         GGUF model (first split of a split model)\n"
            "  --run-dir DIR            run directory shared by the daemons (mode 0700)\n"
            "  --fetchers N             fetcher daemons serving the experts      [1]\n"
            "  -t, --threads N          threads of the forward pass          [physical cores]\n"
            "  -c, --ctx-size N         positions per sequence; 0 = model's, at most 4096 [0]\n"
            "  --parallel N             sequences served at once (KV caches)     [4]\n"
            "  -b, --batch-size N       prompt tokens per forward batch          [512]\n"
            "  --cache-type T           KV cache type: f16 or q8_0               [f16]\n"
            "  --connect-timeout SEC    wait this long for the fetchers          [30]\n"
            "  --direct-reads on|off    read experts already in a fetcher's pool in place,\n"
            "                           while the pool evicts nothing, instead of pinning\n"
            "                           each part by a request                   [on]\n"
            "  --log-level L            err, warn, info or debug                 [info]\n"
            "  --config FILE            'key = value' lines (long option names); the command\n"
            "                           line overrides them\n"
            "  -h, --help               this text\n\n"
            "SIGTERM or SIGINT (or a SHUTDOWN request) drains, removes the socket, pid file and\n"
            "rings it created, and exits 0. Exit status 1: bad options, an unusable model, or a\n"
            "fetcher that did not answer within --connect-timeout.\n");
}

static bool main_u32(const char *name, const char *v, uint32_t min, uint32_t max, uint32_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *end != '\0' || errno != 0 || v[0] == '-' || x < min || x > max) {
        fprintf(stderr, "error: %s expects a number in %u..%u, got '%s'\n", name, min, max,
                v ? v : "");
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

/* Parses argv; returns 1 to run, 0 for --help, -1 on a bad option. */
static int main_parse(int argc, char **argv, struct main_config *c)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
            return 0;
        char        name[64];
        const char *v = NULL;
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof(name)) { /* --key=value */
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            a = name;
            v = eq + 1;
        } else if (a[0] != '-') {
            fprintf(stderr, "error: unexpected argument '%s'\n", a);
            return -1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            fprintf(stderr, "error: %s needs a value\n", a);
            return -1;
        }
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            c->model = v;
        else if (strcmp(a, "--run-dir") == 0)
            c->run_dir = v;
        else if (strcmp(a, "--config") == 0)
            ; /* read before parsing */
        else if (strcmp(a, "--fetchers") == 0)
            ok = main_u32(a, v, 1, 64, &c->n_fetchers);
        else if (strcmp(a, "-t") == 0 || strcmp(a, "--threads") == 0)
            ok = main_u32(a, v, 1, 256, &c->n_threads);
        else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0)
            ok = main_u32(a, v, 0, 1u << 24, &c->n_ctx);
        else if (strcmp(a, "--parallel") == 0)
            ok = main_u32(a, v, 1, 256, &c->n_seq);
        else if (strcmp(a, "-b") == 0 || strcmp(a, "--batch-size") == 0)
            ok = main_u32(a, v, 1, 1u << 16, &c->n_batch);
        else if (strcmp(a, "--connect-timeout") == 0)
            ok = main_u32(a, v, 1, 86400, &c->connect_timeout_s);
        else if (strcmp(a, "--direct-reads") == 0) {
            ok = strcmp(v, "on") == 0 || strcmp(v, "off") == 0;
            c->direct_reads = strcmp(v, "on") == 0;
            if (!ok)
                fprintf(stderr, "error: --direct-reads expects on or off, got '%s'\n", v);
        } else if (strcmp(a, "--cache-type") == 0) {
            ok = common_cache_type_parse(v, &c->cache_type) == 0;
            if (!ok)
                fprintf(stderr, "error: --cache-type expects f16 or q8_0, got '%s'\n", v);
        } else if (strcmp(a, "--log-level") == 0) {
            ok = common_log_parse_level(v, &c->log_level) == 0;
            if (!ok)
                fprintf(stderr, "error: --log-level expects err, warn, info or debug, got '%s'\n",
                        v);
        } else {
            fprintf(stderr, "error: unknown option '%s' (see --help)\n", a);
            ok = false;
        }
        if (!ok)
            return -1;
    }
    if (!c->model || !c->run_dir) {
        fprintf(stderr, "error: -m MODEL and --run-dir DIR are required (see --help)\n");
        return -1;
    }
    return 1;
}

/* What the executor loaded; freed in reverse order by main_close(). */
struct main_state {
    struct common_gguf         *gguf;   /* owned (MoE: the remote path) */
    struct common_model        *desc;   /* owned (MoE) */
    struct executor_remote     *remote; /* owned (MoE) */
    struct executor_model      *model;  /* owned */
    struct executor_threadpool *pool;   /* owned */
    struct executor_serve      *serve;  /* owned */
};

static void main_close(struct main_state *st)
{
    executor_serve_stop(st->serve);
    if (st->desc) {
        struct executor_weights *w = st->model ? executor_model_weights(st->model) : NULL;
        executor_model_destroy(st->model);
        executor_weights_destroy(w);
        executor_remote_destroy(st->remote);
        common_model_fini(st->desc);
        free(st->desc);
    } else {
        executor_model_destroy(st->model);
    }
    common_gguf_close(st->gguf);
    executor_threadpool_destroy(st->pool);
    memset(st, 0, sizeof(*st));
}

/* Loads the model: dense from a mapping, MoE with experts from the fetchers. */
static int main_load(struct main_state *st, const struct main_config *c, uint64_t instance,
                     struct common_errmsg *e)
{
    int rc;
    if ((rc = common_gguf_open(c->model, NULL, &st->gguf, e)) < 0)
        return rc;
    if (!(st->desc = calloc(1, sizeof(*st->desc))))
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    if ((rc = common_model_init(st->desc, st->gguf, e)) < 0) {
        free(st->desc);
        st->desc = NULL;
        return rc;
    }
    if (!common_model_is_moe(st->desc)) {
        common_model_fini(st->desc);
        free(st->desc);
        st->desc = NULL;
        common_gguf_close(st->gguf);
        st->gguf = NULL;
        COMMON_LOG_INFO("executor", "dense model: weights mapped, no fetcher needed");
        return executor_model_open(c->model, NULL, &st->model, e);
    }
    struct executor_remote_opts ro = {.run_dir = c->run_dir,
                                      .n_fetchers = c->n_fetchers,
                                      .model = st->desc,
                                      .connect_timeout_ms = c->connect_timeout_s * 1000u,
                                      .instance = instance,
                                      .cancel = &g_stop,
                                      .direct_reads = c->direct_reads};
    if ((rc = executor_remote_create(&ro, &st->remote, e)) < 0)
        return rc;
    struct executor_expert_source src;
    executor_remote_source(st->remote, &src);
    struct executor_weights_opts wo = {.read_span = common_gguf_read_span, .progress = stderr};
    struct executor_weights     *w = NULL;
    if ((rc = executor_weights_stream_create(st->desc, &wo, &src, &w, e)) < 0)
        return rc;
    if ((rc = executor_model_create(st->desc, w, &st->model, e)) < 0) {
        executor_weights_destroy(w);
        return rc;
    }
    return COMMON_OK;
}

static int main_run(const struct main_config *c)
{
    struct main_state    st = {0};
    struct common_errmsg e = {{0}};
    uint64_t             instance = common_random_id();
    int                  rc;
    executor_kernels_init();
    if ((rc = executor_threadpool_create(c->n_threads, &st.pool)) < 0) {
        fprintf(stderr, "error: thread pool: %s\n", common_strerror(rc));
        return 1;
    }
    if ((rc = main_load(&st, c, instance, &e)) < 0) {
        main_close(&st);
        if (g_stop) /* SIGTERM while waiting for the fetchers: a clean stop */
            return 0;
        fprintf(stderr, "error: %s: %s\n", c->model, e.text[0] ? e.text : common_strerror(rc));
        return 1;
    }
    struct executor_serve_opts so = {.run_dir = c->run_dir,
                                     .model_path = c->model,
                                     .model = st.model,
                                     .remote = st.remote,
                                     .pool = st.pool,
                                     .n_seq = c->n_seq,
                                     .n_ctx = c->n_ctx,
                                     .n_batch = c->n_batch,
                                     .cache_type = c->cache_type,
                                     .instance = instance};
    if ((rc = executor_serve_start(&so, &st.serve, &e)) < 0) {
        fprintf(stderr, "error: cannot serve in %s: %s\n", c->run_dir,
                e.text[0] ? e.text : common_strerror(rc));
        main_close(&st);
        return 1;
    }
    COMMON_LOG_INFO("executor", "ready pid=%ld run_dir=%s sequences=%u n_ctx=%u", (long)getpid(),
                    c->run_dir, executor_serve_n_seq(st.serve), executor_serve_n_ctx(st.serve));
    while (!g_stop && !executor_serve_shutdown_requested(st.serve)) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    COMMON_LOG_INFO("executor", "draining and exiting");
    executor_serve_drain(st.serve);
    main_close(&st);
    return 0;
}

int main(int argc, char **argv)
{
    struct main_config c = {.n_fetchers = 1,
                            .n_seq = 4,
                            .connect_timeout_s = 30,
                            .direct_reads = true,
                            .log_level = COMMON_LOG_LEVEL_INFO};
    char             **cargv = NULL;
    int                cargc;
    if (common_config_load("sluice-executor", argc, argv, &cargc, &argv, &cargv) < 0)
        return 1;
    int p = main_parse(cargc, argv, &c);
    if (p <= 0) {
        if (p == 0)
            main_usage(stdout);
        free(cargv);
        return p == 0 ? 0 : 1;
    }
    common_log_set_level(c.log_level);
    struct sigaction sa = {.sa_handler = main_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    int rc = main_run(&c);
    free(cargv);
    return rc;
}
