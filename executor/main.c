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
#include "proto.h"

struct main_config {
    const char               *model;
    const char               *run_dir;
    uint32_t                  n_fetchers;
    uint32_t                  n_threads;
    uint32_t                  n_ctx;
    uint32_t                  n_seq;
    uint32_t                  n_batch;
    enum common_cache_type    cache_type;
    uint32_t                  connect_timeout_s;
    bool                      direct_reads;
    bool                      stream_dense;
    bool                      probe_device; /* --probe-device: print the device's layers, exit */
    int32_t                   n_gpu_layers;
    struct executor_devices   devices;
    int32_t                   n_cpu_moe;
    uint64_t                  vram_budget;
    enum executor_expert_miss expert_miss;
    enum executor_pool_policy pool_policy; /* --policy */
};

#define PROG "sluice-executor"

/* Parses the command line (after the config file's words). Returns 0 (run), COMMON_OPTS_HELP or
 * a negative common_err (printed). */
/* --policy: the fetchers' names, in enum executor_pool_policy order. */
static const char *const k_policies[] = {"lru", "lfu", NULL};

static int main_parse(int argc, char **argv, struct main_config *c, char ***owned)
{
    const struct common_opt rows[] = {
        {.name = "fetchers",
         .type = COMMON_OPT_U32,
         .target = &c->n_fetchers,
         .min = 1,
         .max = 64,
         .help = "fetcher daemons serving the experts",
         .def = "1"},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &c->n_threads,
         .min = 1,
         .max = 256,
         .help = "threads of the forward pass",
         .def = "physical cores"},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &c->n_ctx,
         .max = 1u << 24,
         .help = "positions per sequence; 0 = model's, at most 4096",
         .def = "0"},
        {.name = "parallel",
         .type = COMMON_OPT_U32,
         .target = &c->n_seq,
         .min = 1,
         .max = 256,
         .help = "sequences served at once (KV caches)",
         .def = "4"},
        {.name = "batch-size",
         .short_name = "b",
         .type = COMMON_OPT_U32,
         .target = &c->n_batch,
         .min = 1,
         .max = 1u << 16,
         .help = "prompt tokens per forward batch",
         .def = "512"},
        {.name = "cache-type",
         .type = COMMON_OPT_CALLBACK,
         .target = &c->cache_type,
         .parse = common_cache_type_opt,
         .metavar = "T",
         .help = "KV cache type: f16 or q8_0",
         .def = "f16"},
        {.name = "connect-timeout",
         .type = COMMON_OPT_U32,
         .target = &c->connect_timeout_s,
         .min = 1,
         .max = 86400,
         .metavar = "SEC",
         .help = "wait this long for the fetchers",
         .def = "30"},
        {.name = "direct-reads",
         .type = COMMON_OPT_BOOL,
         .target = &c->direct_reads,
         .metavar = "on|off",
         .help = "read experts already in a fetcher's pool in place, while the pool evicts "
                 "nothing, instead of pinning each part by a request",
         .def = "on"},
        {.name = "n-gpu-layers",
         .short_name = "ngl",
         .type = COMMON_OPT_I32,
         .target = &c->n_gpu_layers,
         .max = 1u << 20,
         .metavar = "N",
         .help = "put the last N layers on the CUDA devices (and the output head when N exceeds "
                 "the layers; 999 = all), shared by every sequence; without a usable device the "
                 "CPU runs them",
         .def = "0"},
        EXECUTOR_DEVICE_OPTS(&c->devices, &c->n_cpu_moe, &c->vram_budget),
        EXECUTOR_EXPERT_MISS_OPT(&c->expert_miss),
        {.name = "policy",
         .type = COMMON_OPT_CHOICE,
         .target = &c->pool_policy,
         .choices = k_policies,
         .help = "with --vram-budget, which expert the device pool gives up: the least recently "
                 "(lru) or frequently (lfu) used, as the fetchers' --policy",
         .def = "lru"},
        {.name = "stream-dense",
         .type = COMMON_OPT_SWITCH,
         .target = &c->stream_dense,
         .help = "a dense model: take each layer's FFN from the fetchers (which serve it as one "
                 "expert per layer) instead of mapping the whole file"},
        {.name = "probe-device",
         .type = COMMON_OPT_SWITCH,
         .target = &c->probe_device,
         .help = "print how many layers -ngl puts on the devices for this model (0 when no "
                 "device is usable or the device path does not take the model), over how many "
                 "devices, and the bytes of RAM a sequence's device scratch takes on the CPU (the "
                 "CPU backend's or the CPU device's), and exit: sluicectl up plans the fetchers' "
                 "memory without those layers' KV and with that scratch, and their device pools"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = PROG,
        .usage = PROG " -m MODEL.gguf --run-dir DIR [options]",
        .description =
            "The executor daemon: holds the resident weights and one KV cache per sequence, runs "
            "the forward pass for the router (EVAL steps over shared-memory rings) and takes the "
            "routed experts of a MoE model from the fetcher daemons of DIR. A dense model needs "
            "no fetcher, unless --stream-dense takes its FFNs from them. Listens on "
            "ipc://DIR/executor.ctl.",
        .epilog = "SIGTERM or SIGINT (or a SHUTDOWN request) drains, removes the socket, pid file "
                  "and rings it created, and exits 0. Exit status 2: a usage error; 1: an "
                  "unusable model, or a fetcher that did not answer within --connect-timeout.",
        .opts = rows,
    };
    struct proto_daemon_args da = {0};
    int                      rc = proto_daemon_parse(&spec, "executor", argc, argv, &da, owned);
    c->model = da.model;
    c->run_dir = da.run_dir;
    return rc;
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
    if (!common_model_is_moe(st->desc) && c->stream_dense)
        (void)common_model_stream_dense(st->desc);
    if (!common_model_is_moe(st->desc)) {
        common_model_fini(st->desc);
        free(st->desc);
        st->desc = NULL;
        common_gguf_close(st->gguf);
        st->gguf = NULL;
        COMMON_LOG_INFO("executor", "dense model: weights mapped, no fetcher needed");
        return executor_model_open(c->model, NULL, &st->model, e);
    }
    /* The contexts' size, resolved as executor_serve_start() will: the fetchers check it
     * against the memory plan their --ram-budget was divided by. */
    struct common_ctx_layout lay;
    if ((rc = common_ctx_layout_compute(
             &st->desc->hp,
             &(struct common_ctx_layout_opts){.n_ctx = c->n_ctx, .n_batch = c->n_batch}, &lay, e)) <
        0)
        return rc;
    struct executor_remote_opts ro = {.run_dir = c->run_dir,
                                      .n_fetchers = c->n_fetchers,
                                      .model = st->desc,
                                      .connect_timeout_ms = c->connect_timeout_s * 1000u,
                                      .instance = instance,
                                      .n_seq = c->n_seq,
                                      .n_ctx = lay.n_ctx,
                                      .cancelled = proto_daemon_stopping,
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
        fprintf(stderr, PROG ": error: thread pool: %s\n", common_strerror(rc));
        return 1;
    }
    if ((rc = main_load(&st, c, instance, &e)) < 0) {
        main_close(&st);
        if (proto_daemon_stopping()) /* SIGTERM while waiting for the fetchers: a clean stop */
            return 0;
        fprintf(stderr, PROG ": error: %s\n", e.text[0] ? e.text : common_strerror(rc));
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
                                     .instance = instance,
                                     .n_gpu_layers = c->n_gpu_layers,
                                     .devices = c->devices,
                                     .n_cpu_moe = c->n_cpu_moe,
                                     .vram_budget = c->vram_budget,
                                     .expert_miss = c->expert_miss,
                                     .pool_policy = c->pool_policy};
    if ((rc = executor_serve_start(&so, &st.serve, &e)) < 0) {
        fprintf(stderr, PROG ": error: cannot serve in %s: %s\n", c->run_dir,
                e.text[0] ? e.text : common_strerror(rc));
        main_close(&st);
        return 1;
    }
    COMMON_LOG_INFO("executor", "ready pid=%ld run_dir=%s sequences=%u n_ctx=%u", (long)getpid(),
                    c->run_dir, executor_serve_n_seq(st.serve), executor_serve_n_ctx(st.serve));
    (void)proto_service_run(executor_serve_service(st.serve));
    COMMON_LOG_INFO("executor", "draining and exiting");
    main_close(&st);
    return 0;
}

/* --probe-device: the layers -ngl puts on the devices (their KV lives there), as
 * executor_serve_start will place them, the devices they are split over, and the RAM of a
 * sequence's device scratch on the CPU (the CPU backend's, or the CPU device's in one pass), on
 * stdout ("4 2 0").
 * The model is mapped, not read. A device error at start or later still moves them to the CPU,
 * with their KV in RAM: the fetchers, told so (DEVICE_LAYERS), shrink pools planned from this
 * count. */
static int main_probe(const struct main_config *c)
{
    uint32_t n = 0, n_dev = 0;
    uint64_t scratch = 0;
    /* The CPU backend's device is RAM: its KV is the fetchers' to plan for, as the CPU's, and
     * without --vram-budget it has no device pool (it reads the experts in the RAM pool). */
    const bool in_ram = executor_gpu_in_ram() && !c->vram_budget;
    const bool on_device =
        c->n_gpu_layers > 0 && !in_ram && executor_gpu_usable(NULL, &c->devices, 0, NULL, 0);
    /* The RAM a sequence's device scratch takes on the CPU: the CPU backend's with -ngl, the CPU
     * device's with the layers -ngl leaves to the CPU in one pass (SLUICE_ONE_PASS=1). */
    const bool cpu_scratch =
        (executor_gpu_in_ram() && c->n_gpu_layers > 0) || executor_gpu_one_pass();
    if (!on_device && !cpu_scratch) {
        printf("0 0 0\n");
        return 0;
    }
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    if (executor_model_open(c->model, NULL, &m, &e) < 0) {
        fprintf(stderr, PROG ": error: %s\n", e.text);
        return 1;
    }
    const struct common_hparams *hp = executor_model_hparams(m);
    if (on_device) {
        if (executor_gpu_usable(m, &c->devices, c->n_cpu_moe, NULL, 0))
            n = (uint32_t)c->n_gpu_layers < hp->n_layer ? (uint32_t)c->n_gpu_layers : hp->n_layer;
        int32_t   ids[EXECUTOR_MAX_DEVICES];
        const int k = c->devices.single ? 1 : executor_devices_resolve(&c->devices, ids, NULL, 0);
        n_dev = n && k > 0 ? (uint32_t)(k < (int)n ? k : (int)n) : 0;
    }
    struct common_ctx_layout lay;
    if ((executor_gpu_in_ram() && c->n_gpu_layers > 0) ||
        (executor_gpu_one_pass() && n < hp->n_layer)) {
        if (common_ctx_layout_compute(
                hp, &(struct common_ctx_layout_opts){.n_ctx = c->n_ctx, .n_batch = c->n_batch},
                &lay, &e) < 0) {
            fprintf(stderr, PROG ": error: %s\n", e.text);
            executor_model_destroy(m);
            return 1;
        }
        scratch = executor_gpu_scratch_bytes(hp, lay.n_ctx, lay.n_batch);
    }
    executor_model_destroy(m);
    printf("%u %u %llu\n", n, n_dev, (unsigned long long)scratch);
    return 0;
}

int main(int argc, char **argv)
{
    struct main_config c = {
        .n_fetchers = 1, .n_seq = 4, .connect_timeout_s = 30, .direct_reads = true};
    char **owned = NULL;
    int    rc = main_parse(argc, argv, &c, &owned);
    if (rc != 0) {
        free(owned);
        return common_opts_exit_status(rc);
    }
    if (c.probe_device) {
        rc = main_probe(&c);
        free(owned);
        return rc;
    }
    proto_daemon_signals();
    rc = main_run(&c);
    free(owned);
    return rc;
}
