/* cli/cmd_serve.c - `sluice serve`: the OpenAI-compatible HTTP server in one process, like
 * llama-server: the executor's step service and the router (its scheduler and HTTP front end)
 * run as threads of this process over a private run directory, with the weights mapped. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor.h"
#include "router.h"

#define SERVE_PROG "sluice serve"

struct serve_args {
    const char               *model;       /* -m: borrowed from argv */
    const char               *http;        /* --http HOST:PORT: borrowed */
    const char               *api_key;     /* --api-key: borrowed */
    uint64_t                  max_body;    /* --http-max-body */
    uint32_t                  n_threads;   /* -t: 0 = physical cores */
    uint32_t                  n_ctx;       /* -c: 0 = the model's, at most 4096 */
    uint32_t                  n_seq;       /* --parallel */
    uint32_t                  n_batch;     /* -b */
    enum common_cache_type    cache;       /* --cache-type */
    int32_t                   ngl;         /* -ngl */
    int32_t                   n_cpu_moe;   /* --n-cpu-moe */
    uint64_t                  vram_budget; /* --vram-budget */
    enum executor_expert_miss expert_miss; /* --expert-miss */
    struct executor_devices   devices;     /* --device, --split-mode, --tensor-split, -mg */
};

static int serve_parse(int argc, char **argv, struct serve_args *a)
{
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->model,
         .metavar = "FILE",
         .help = "GGUF model (first split)",
         .required = true},
        {.name = "http",
         .type = COMMON_OPT_STR,
         .target = &a->http,
         .metavar = "HOST:PORT",
         .help = "listen on HOST:PORT (\":PORT\" = 127.0.0.1; port 0 = a free one, printed)",
         .def = "127.0.0.1:8080"},
        {.name = "api-key",
         .type = COMMON_OPT_STR,
         .target = &a->api_key,
         .metavar = "KEY",
         .help = "requests (but GET /health) must send 'Authorization: Bearer KEY'"},
        {.name = "http-max-body",
         .type = COMMON_OPT_SIZE,
         .target = &a->max_body,
         .min = 1,
         .help = "larger request bodies get 413",
         .def = "1M"},
        {.name = "threads",
         .short_name = "t",
         .type = COMMON_OPT_U32,
         .target = &a->n_threads,
         .min = 1,
         .max = 256,
         .help = "threads of the forward pass",
         .def = "physical cores"},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &a->n_ctx,
         .max = 1u << 24,
         .help = "positions per sequence; 0 = the model's, at most 4096",
         .def = "0"},
        {.name = "parallel",
         .short_name = "np",
         .type = COMMON_OPT_U32,
         .target = &a->n_seq,
         .min = 1,
         .max = 256,
         .help = "sequences served at once (one KV cache each)",
         .def = "4"},
        {.name = "batch-size",
         .short_name = "b",
         .type = COMMON_OPT_U32,
         .target = &a->n_batch,
         .min = 1,
         .max = 1u << 16,
         .help = "prompt tokens per forward batch; a long prompt is read in pieces of this many "
                 "tokens that share the steps of the other requests (continuous batching)",
         .def = "512"},
        {.name = "cache-type",
         .short_name = "ctk",
         .type = COMMON_OPT_CALLBACK,
         .target = &a->cache,
         .parse = common_cache_type_opt,
         .metavar = "f16|q8_0",
         .help = "KV cache type",
         .def = "f16"},
        {.name = "n-gpu-layers",
         .short_name = "ngl",
         .type = COMMON_OPT_I32,
         .target = &a->ngl,
         .max = 1u << 20,
         .metavar = "N",
         .help = "the last N layers on the CUDA devices (999 = all; without a usable device the "
                 "CPU runs them)",
         .def = "0"},
        EXECUTOR_DEVICE_OPTS(&a->devices, &a->n_cpu_moe, &a->vram_budget),
        EXECUTOR_EXPERT_MISS_OPT(&a->expert_miss),
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = SERVE_PROG,
        .usage = SERVE_PROG " -m MODEL.gguf [--http HOST:PORT] [options]",
        .description =
            "Serves the OpenAI-compatible HTTP API (POST /v1/chat/completions and "
            "/v1/completions, streamed or not; GET /v1/models, /health, /metrics) in one "
            "process, as llama-server does: the same server as sluice-router --http, over an "
            "executor in this process with the weights mapped (docs/serving.md). For streaming "
            "experts under a memory budget and surviving a crash, run the daemons "
            "(deploy/sluicectl up --http).",
        .epilog = "SIGINT or SIGTERM finishes the requests in flight and exits 0. Exit status 2: a "
                  "usage error; 1: an unusable model or address.",
        .opts = rows,
    };
    return common_opts_parse(&spec, argc, argv);
}

int cli_cmd_serve(int argc, char **argv)
{
    struct serve_args a = {.http = "127.0.0.1:8080", .n_seq = 4, .cache = COMMON_CACHE_F16};
    int               rc = serve_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);
    executor_kernels_init();
    proto_daemon_signals();
    /* A private run directory for the two services' sockets and rings. */
    const char *base = getenv("XDG_RUNTIME_DIR");
    char        run_dir[512];
    snprintf(run_dir, sizeof(run_dir), "%s/sluice-serve-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(run_dir)) {
        cli_error(SERVE_PROG, "cannot create a run directory under %s",
                  base && *base ? base : "/tmp");
        return 1;
    }
    struct common_errmsg        e = {{0}};
    struct executor_threadpool *pool = NULL;
    struct executor_model      *model = NULL;
    struct executor_serve      *exec = NULL;
    struct router_serve        *router = NULL;
    int                         status = 1;
    const uint32_t              nth = a.n_threads ? a.n_threads : executor_physical_cores();
    if ((rc = executor_threadpool_create(nth, &pool)) < 0) {
        cli_error(SERVE_PROG, "cannot start %u threads: %s", nth, common_strerror(rc));
        goto out;
    }
    if ((rc = executor_model_open(a.model, NULL, &model, &e)) < 0) {
        cli_error_path(SERVE_PROG, a.model, rc, &e);
        goto out;
    }
    struct executor_serve_opts xo = {.run_dir = run_dir,
                                     .model_path = a.model,
                                     .model = model,
                                     .pool = pool,
                                     .n_seq = a.n_seq,
                                     .n_ctx = a.n_ctx,
                                     .n_batch = a.n_batch,
                                     .cache_type = a.cache,
                                     .no_pidfile = true,
                                     .n_gpu_layers = a.ngl,
                                     .devices = a.devices,
                                     .n_cpu_moe = a.n_cpu_moe,
                                     .vram_budget = a.vram_budget,
                                     .expert_miss = a.expert_miss};
    if ((rc = executor_serve_start(&xo, &exec, &e)) < 0) {
        cli_error(SERVE_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    struct router_serve_opts ro = {.model_path = a.model,
                                   .run_dir = run_dir,
                                   .n_ctx = a.n_ctx,
                                   .n_seq = a.n_seq,
                                   .prefill_chunk = a.n_batch,
                                   .stream_ms = 50,
                                   .no_pidfile = true,
                                   .http_addr = a.http,
                                   .api_key = a.api_key,
                                   .http_max_body = a.max_body};
    if ((rc = router_serve_create(&ro, &router, &e)) < 0) {
        cli_error(SERVE_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    fprintf(stderr, "%s: listening on %s (%u sequences, %u threads)\n", SERVE_PROG,
            router_serve_http_url(router), executor_serve_n_seq(exec), nth);
    (void)proto_service_run(router_serve_service(router));
    router_serve_drain(router);
    router_serve_wait_idle(router, -1);
    status = 0;
out:
    router_serve_destroy(router);
    executor_serve_stop(exec);
    executor_model_destroy(model);
    executor_threadpool_destroy(pool);
    char url_file[600]; /* the router leaves its HTTP url there */
    snprintf(url_file, sizeof(url_file), "%s/router.http", run_dir);
    (void)unlink(url_file);
    if (rmdir(run_dir) != 0)
        fprintf(stderr, "%s: warning: %s was left behind\n", SERVE_PROG, run_dir);
    return status;
}
