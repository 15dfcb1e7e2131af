/* fetcher/main.c - sluice-fetcher: serves one shard of a GGUF MoE model's experts to the executor.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "fetcher.h"

static void usage(FILE *f)
{
    fprintf(
        f, "usage: sluice-fetcher -m MODEL.gguf --run-dir DIR [options]\n\n"
           "Serves the routed experts of a GGUF MoE model (one shard of them) to sluice-executor:\n"
           "a budgeted pool in shared memory, filled from the model file on demand.\n\n"
           "  -m, --model FILE      GGUF model (first split of a split model)        (required)\n"
           "  --run-dir DIR         run directory, created with mode 0700            (required)\n"
           "  --shard I/N           serve experts [I*E/N, (I+1)*E/N) of each layer   [0/1]\n"
           "  --ram-budget SIZE     memory of the whole system (all daemons), e.g. 8G; this\n"
           "                        fetcher's pool is 1/N of the plan's pool\n"
           "  --pool-slots N        pool slots (overrides --ram-budget)     [one per bundle]\n"
           "  -c, --ctx-size N      executor context per sequence, for the KV estimate  [0 = "
           "model's, at most 4096]\n"
           "  --parallel N          executor sequences, for the KV estimate          [1]\n"
           "  --io MODE             uring or pread (auto picks); mmap has no pool    [auto]\n"
           "  --policy P            eviction policy: lru or lfu                      [lru]\n"
           "  --io-depth N          reads in flight                                  [32]\n"
           "  --workers N           threads serving ACQUIREs                         [8]\n"
           "  --trace-out FILE      write the expert trace JSON at exit\n"
           "  --log-level L         err, warn, info or debug                         [info]\n"
           "  --config FILE         'key = value' lines (long option names), before the flags\n"
           "  -h, --help            this text\n\n"
           "Files in DIR: fetcher-I.ctl (control socket), fetcher-I.pool (hands the pool memfd),\n"
           "fetcher-I.pid. SIGTERM/SIGINT or a SHUTDOWN message: stop, print the trace summary,\n"
           "remove those files, exit 0.\n");
}

static bool parse_u32(const char *opt, const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char              *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || v[0] == '-' || x < lo || x > hi) {
        fprintf(stderr, "sluice-fetcher: error: %s expects a number in [%u, %u], got '%s'\n", opt,
                lo, hi, v);
        return false;
    }
    *out = (uint32_t)x;
    return true;
}

static bool parse_shard(const char *v, uint32_t *i, uint32_t *n)
{
    unsigned a = 0, b = 0;
    char     c = 0;
    if (sscanf(v, "%u/%u%c", &a, &b, &c) != 2 || b == 0 || a >= b) {
        fprintf(stderr, "sluice-fetcher: error: --shard expects I/N with 0 <= I < N, got '%s'\n",
                v);
        return false;
    }
    *i = a;
    *n = b;
    return true;
}

/* Parses the options; returns 0 (run), 1 (error, printed), 2 (help printed). */
static int parse_args(int argc, char **argv, struct fetcher_serve_opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        char        name[64];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 2;
        }
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof(name)) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            a = name;
            v = eq + 1;
        }
        static const char *const takes[] = {
            "-m",          "--model",     "--run-dir",  "--shard",  "--ram-budget", "--pool-slots",
            "-c",          "--ctx-size",  "--parallel", "--io",     "--policy",     "--io-depth",
            "--trace-out", "--log-level", "--config",   "--workers"};
        bool known = false;
        for (size_t k = 0; k < sizeof(takes) / sizeof(takes[0]); k++)
            known = known || strcmp(a, takes[k]) == 0;
        if (!known) {
            fprintf(stderr, "sluice-fetcher: error: unknown option '%s' (see --help)\n", argv[i]);
            return 1;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "sluice-fetcher: error: %s needs a value\n", a);
                return 1;
            }
            v = argv[++i];
        }
        bool ok = true;
        if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0) {
            o->model_path = v;
        } else if (strcmp(a, "--run-dir") == 0) {
            o->run_dir = v;
        } else if (strcmp(a, "--shard") == 0) {
            ok = parse_shard(v, &o->shard, &o->n_shards);
        } else if (strcmp(a, "--ram-budget") == 0) {
            ok = common_parse_size(v, &o->ram_budget) == COMMON_OK && o->ram_budget > 0;
            if (!ok)
                fprintf(stderr,
                        "sluice-fetcher: error: --ram-budget expects a size like 1.5G, got '%s'\n",
                        v);
        } else if (strcmp(a, "--pool-slots") == 0) {
            ok = parse_u32(a, v, 1, 1u << 24, &o->n_slots);
        } else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0) {
            ok = parse_u32(a, v, 0, 1u << 24, &o->n_ctx);
        } else if (strcmp(a, "--parallel") == 0) {
            ok = parse_u32(a, v, 1, 4096, &o->n_seq);
        } else if (strcmp(a, "--io") == 0) {
            ok = fetcher_io_mode_parse(v, &o->io) == COMMON_OK;
            if (!ok)
                fprintf(stderr, "sluice-fetcher: error: --io expects uring or pread, got '%s'\n",
                        v);
            else if (o->io == FETCHER_IO_MMAP) {
                fprintf(
                    stderr,
                    "sluice-fetcher: error: --io mmap has no pool to share with the "
                    "executor (use uring or pread; mmap is for the one-process `sluice run`)\n");
                ok = false;
            }
        } else if (strcmp(a, "--policy") == 0) {
            ok = fetcher_policy_parse(v, &o->policy) == COMMON_OK;
            if (!ok)
                fprintf(stderr, "sluice-fetcher: error: --policy expects lru or lfu, got '%s'\n",
                        v);
        } else if (strcmp(a, "--io-depth") == 0) {
            ok = parse_u32(a, v, 1, 4096, &o->queue_depth);
        } else if (strcmp(a, "--workers") == 0) {
            ok = parse_u32(a, v, 1, 256, &o->n_workers);
        } else if (strcmp(a, "--trace-out") == 0) {
            o->trace_out = v;
        } else if (strcmp(a, "--log-level") == 0) {
            enum common_log_level lv;
            ok = common_log_parse_level(v, &lv) == COMMON_OK;
            if (ok)
                common_log_set_level(lv);
            else
                fprintf(stderr,
                        "sluice-fetcher: error: --log-level expects err, warn, info or debug, "
                        "got '%s'\n",
                        v);
        } /* --config: read before parsing */
        if (!ok)
            return 1;
    }
    if (!o->model_path || !o->run_dir) {
        fprintf(stderr, "sluice-fetcher: error: %s is required (see --help)\n",
                !o->model_path ? "-m/--model" : "--run-dir");
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct common_errmsg e = {{0}};
    int                  cargc;
    char               **cargv, **owned;
    if (common_config_load("sluice-fetcher", argc, argv, &cargc, &cargv, &owned) < 0)
        return 1;
    struct fetcher_serve_opts o = {.plan_out = stderr, .summary_out = stderr};
    int                       prc = parse_args(cargc, cargv, &o);
    if (prc != 0) {
        free(owned);
        return prc == 2 ? 0 : 1;
    }

    /* SIGTERM/SIGINT are taken synchronously by main; every thread started below blocks them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct fetcher_server *srv = NULL;
    int                    rc = fetcher_serve_start(&o, &srv, &e);
    if (rc != COMMON_OK) {
        fprintf(stderr, "sluice-fetcher: error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        free(owned);
        return 1;
    }
    fprintf(stderr, "sluice-fetcher: serving %s in %s (pid %d)\n", o.model_path, o.run_dir,
            (int)getpid());
    struct timespec tick = {.tv_sec = 0, .tv_nsec = 200 * 1000000L};
    for (;;) {
        int sig = sigtimedwait(&set, NULL, &tick);
        if (sig == SIGTERM || sig == SIGINT) {
            COMMON_LOG_INFO("fetcher", "signal %d: stopping", sig);
            break;
        }
        if (fetcher_serve_wait(srv, 0)) {
            COMMON_LOG_INFO("fetcher", "shutdown requested: stopping");
            break;
        }
    }
    rc = fetcher_serve_stop(srv, &e);
    if (rc != COMMON_OK)
        fprintf(stderr, "sluice-fetcher: error: %s\n", e.text);
    free(owned);
    return rc == COMMON_OK ? 0 : 1;
}
