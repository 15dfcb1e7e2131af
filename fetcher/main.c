/* fetcher/main.c - sluice-fetcher: serves one shard of a GGUF MoE model's experts to the executor.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "fetcher.h"
#include "proto.h"

#define PROG "sluice-fetcher"

/* --shard I/N. */
static int parse_shard(void *arg, const char *v, struct common_errmsg *e)
{
    struct fetcher_serve_opts *o = arg;
    unsigned                   a = 0, b = 0;
    char                       c = 0;
    if (sscanf(v, "%u/%u%c", &a, &b, &c) != 2 || b == 0 || a >= b)
        return common_errmsg_set(e, COMMON_EINVAL, "expects I/N with 0 <= I < N, got '%s'", v);
    o->shard = a;
    o->n_shards = b;
    return COMMON_OK;
}

/* --layer-split 3,1: each fetcher's share of the layers (--shard-by layer). */
static int parse_layer_split(void *arg, const char *v, struct common_errmsg *e)
{
    struct fetcher_serve_opts *o = arg;
    return common_opts_parse_shares(v, o->layer_split,
                                    sizeof(o->layer_split) / sizeof(o->layer_split[0]),
                                    &o->n_layer_split, e);
}

/* --io: uring or pread (auto picks); mmap has no pool to share. */
static int parse_io(void *arg, const char *v, struct common_errmsg *e)
{
    enum fetcher_io_mode *io = arg;
    if (fetcher_io_mode_parse(v, io) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "expects auto, uring or pread, got '%s'", v);
    if (*io == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "mmap has no pool to share with the executor (use uring or pread; "
                                 "mmap is for the one-process `sluice run`)");
    return COMMON_OK;
}

/* --policy lru|lfu. */
static int parse_policy(void *arg, const char *v, struct common_errmsg *e)
{
    if (fetcher_policy_parse(v, arg) != COMMON_OK)
        return common_errmsg_set(e, COMMON_EINVAL, "expects lru or lfu, got '%s'", v);
    return COMMON_OK;
}

static const char *const g_shard_by[] = {"expert", "file", "layer", NULL};

/* Parses the config file and the command line into *o (*owned: the config words). Returns 0
 * (run), COMMON_OPTS_HELP or a negative common_err (printed). */
static int parse_args(int argc, char **argv, struct fetcher_serve_opts *o, char ***owned)
{
    const struct common_opt rows[] = {
        {.name = "shard",
         .type = COMMON_OPT_CALLBACK,
         .target = o,
         .parse = parse_shard,
         .metavar = "I/N",
         .help = "serve experts [I*E/N, (I+1)*E/N) of each layer (or, with --shard-by file, "
                 "those of the I-th directory; with --shard-by layer, every expert of layers "
                 "[I*L/N, (I+1)*L/N))",
         .def = "0/1"},
        {.name = "shard-by",
         .type = COMMON_OPT_CHOICE,
         .target = &o->shard_by,
         .choices = g_shard_by,
         .help = "expert: a range of experts of every layer; file: the experts stored in the I-th "
                 "directory of the model's files (real paths of its GGUF splits or QSF bundle "
                 "files, in order): one fetcher per device; layer: a range of layers, every "
                 "expert of them: one fetcher per GPU, each GPU's layers (sluicectl up --devices)",
         .def = "expert"},
        {.name = "layer-split",
         .type = COMMON_OPT_CALLBACK,
         .target = o,
         .parse = parse_layer_split,
         .metavar = "N0,N1,...",
         .help = "with --shard-by layer: each fetcher's share of the layers, one per fetcher "
                 "(sluicectl up --devices with --tensor-split)",
         .def = "even"},
        {.name = "ram-budget",
         .type = COMMON_OPT_SIZE,
         .target = &o->ram_budget,
         .min = 1,
         .help = "memory of the whole system (all daemons), e.g. 8G; this fetcher's pool is 1/N "
                 "of the plan's pool"},
        {.name = "vram-budget",
         .type = COMMON_OPT_SIZE,
         .target = &o->vram_budget,
         .min = 1,
         .help = "serve the executor a device expert pool of at most this much device memory "
                 "(e.g. 10G): fetcher 0 makes it, every fetcher copies its experts into it from "
                 "its RAM pool (the executor's --vram-budget sizes it)"},
        FETCHER_VRAM_FILL_OPT(&o->vram_fill,
                              "where the device pool's misses come from: ram (read into the RAM "
                              "pool, copied from there), storage (those not in the RAM pool read "
                              "into pinned staging, the RAM pool left to what it holds), auto "
                              "(storage when the RAM pool is no bigger than this fetcher's share "
                              "of --vram-budget)"),
        {.name = "device-pools",
         .type = COMMON_OPT_U32,
         .target = &o->device_pools,
         .min = 1,
         .max = PROTO_DEVPOOL_MAX_POOLS,
         .metavar = "N",
         .help = "with --vram-budget, serve the device pools of N of the executor's devices at "
                 "once, each up to --vram-budget with its own staging (sluicectl up gives the "
                 "executor's device count)",
         .def = "1"},
        {.name = "pool-slots",
         .type = COMMON_OPT_U32,
         .target = &o->n_slots,
         .min = 1,
         .max = 1u << 24,
         .help = "pool slots (overrides --ram-budget)",
         .def = "one per bundle"},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &o->n_ctx,
         .max = 1u << 24,
         .help = "executor context per sequence, for the KV estimate (checked at attach)",
         .def = "0 = model's, at most 4096"},
        {.name = "parallel",
         .type = COMMON_OPT_U32,
         .target = &o->n_seq,
         .min = 1,
         .max = 4096,
         .help =
             "executor sequences, for the KV estimate (the executor refuses to attach with more)",
         .def = "4, as the executor and the router"},
        {.name = "cache-type",
         .short_name = "ctk",
         .type = COMMON_OPT_CALLBACK,
         .target = &o->cache_type,
         .parse = common_cache_type_opt,
         .metavar = "T",
         .help = "the executor's KV cache type (f16 or q8_0), for the KV estimate",
         .def = "f16"},
        {.name = "device-layers",
         .type = COMMON_OPT_U32,
         .target = &o->n_device_layers,
         .max = 1u << 20,
         .metavar = "N",
         .help = "the executor's last N layers keep their KV on a device (sluicectl up -ngl, "
                 "through sluice-executor --probe-device): left out of the KV estimate",
         .def = "0"},
        {.name = "device-scratch",
         .type = COMMON_OPT_SIZE,
         .target = &o->device_scratch,
         .help = "RAM each executor sequence's device scratch takes on the CPU (its CPU backend "
                 "or CPU device; sluicectl up, through sluice-executor --probe-device): in the "
                 "plan",
         .def = "0"},
        {.name = "io",
         .type = COMMON_OPT_CALLBACK,
         .target = &o->io,
         .parse = parse_io,
         .metavar = "MODE",
         .help = "uring or pread (auto picks); mmap has no pool",
         .def = "auto"},
        {.name = "policy",
         .type = COMMON_OPT_CALLBACK,
         .target = &o->policy,
         .parse = parse_policy,
         .metavar = "P",
         .help = "eviction policy: lru or lfu",
         .def = "lru"},
        {.name = "io-depth",
         .type = COMMON_OPT_U32,
         .target = &o->queue_depth,
         .min = 1,
         .max = 4096,
         .help = "reads in flight",
         .def = "32"},
        {.name = "trace-out",
         .type = COMMON_OPT_STR,
         .target = &o->trace_out,
         .metavar = "FILE",
         .help = "write the expert trace JSON at exit"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = PROG,
        .usage = PROG " -m MODEL.gguf --run-dir DIR [options]",
        .description = "Serves the routed experts of a GGUF MoE model (one shard of them) to "
                       "sluice-executor: a budgeted pool in shared memory, filled from the model "
                       "file on demand.",
        .epilog = "Files in DIR: fetcher-I.ctl (control socket), fetcher-I.pool (hands the pool "
                  "memfd), fetcher-I.pid. SIGTERM/SIGINT or a SHUTDOWN message: stop, print the "
                  "trace summary, remove those files, exit 0. Exit status 2 for a usage error, 1 "
                  "for a failure.",
        .opts = rows,
    };
    struct proto_daemon_args da = {0};
    int                      rc = proto_daemon_parse(&spec, "fetcher", argc, argv, &da, owned);
    o->model_path = da.model;
    o->run_dir = da.run_dir;
    return rc;
}

int main(int argc, char **argv)
{
    struct common_errmsg      e = {{0}};
    char                    **owned = NULL;
    struct fetcher_serve_opts o = {.plan_out = stderr, .summary_out = stderr};
    int                       rc = parse_args(argc, argv, &o, &owned);
    if (rc != 0) {
        free(owned);
        return common_opts_exit_status(rc);
    }
    proto_daemon_signals();

    struct fetcher_server *srv = NULL;
    if ((rc = fetcher_serve_start(&o, &srv, &e)) != COMMON_OK) {
        fprintf(stderr, PROG ": error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        free(owned);
        return 1;
    }
    fprintf(stderr, PROG ": serving %s in %s (pid %d)\n", o.model_path, o.run_dir, (int)getpid());
    int why = proto_service_run(fetcher_serve_service(srv));
    COMMON_LOG_INFO("fetcher", "%s: stopping",
                    why == PROTO_SERVICE_STOP_MESSAGE ? "shutdown requested" : "signal");
    rc = fetcher_serve_stop(srv, &e);
    if (rc != COMMON_OK)
        fprintf(stderr, PROG ": error: %s\n", e.text);
    free(owned);
    return rc == COMMON_OK ? 0 : 1;
}
