/* router/main.c - sluice-router: the router daemon (tokenizer, scheduler, client API). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "router.h"

static volatile sig_atomic_t router_stop_flag;

static void router_on_signal(int sig)
{
    (void)sig;
    router_stop_flag = 1;
}

static void router_usage(FILE *f)
{
    fprintf(f, "usage: sluice-router -m MODEL.gguf --run-dir DIR [options]\n\n"
               "Serves generation requests on DIR/router.sock: tokenizes with the model's\n"
               "tokenizer, schedules sequences on the executor (DIR/executor.ctl), samples and\n"
               "streams the text back. Start it after sluice-executor.\n\n"
               "  -m, --model PATH         GGUF model (its tokenizer and chat template)\n"
               "  --run-dir DIR            run directory shared by the daemons (mode 0700)\n"
               "  -c, --ctx-size N         positions per sequence; the executor must have at\n"
               "                           least as many              [min(4096, model's)]\n"
               "  --parallel N             sequences generated at once              [4]\n"
               "  --queue N                requests waiting for a sequence at most  [64]\n"
               "  --client-timeout SEC     drop a request its client stopped polling [60]\n"
               "  --connect-timeout SEC    wait this long for the executor          [30]\n"
               "  --stream-interval MS     a streaming client gets the tokens made during\n"
               "                           each interval together; 0 = every token at once [50]\n"
               "  --log-level LEVEL        err, warn, info or debug                 [info]\n"
               "  --config FILE            'key = value' lines (long option names), then the\n"
               "                           command line overrides them\n"
               "  -h, --help               this text\n\n"
               "SIGTERM/SIGINT: stop taking requests, finish the active ones, remove router.sock,\n"
               "router.pid and the router-exec.* segments, exit 0.\n");
}

static int router_parse_u32(const char *name, const char *v, uint32_t min, uint32_t max,
                            uint32_t *out)
{
    char         *end = NULL;
    unsigned long x;
    errno = 0;
    x = v && *v != '-' ? strtoul(v, &end, 10) : 0;
    if (!v || !*v || *v == '-' || errno || *end || x < min || x > max) {
        fprintf(stderr, "sluice-router: %s expects an integer in %u..%u, got '%s'\n", name, min,
                max, v ? v : "");
        return -1;
    }
    *out = (uint32_t)x;
    return 0;
}

static int router_write_pid(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    char buf[32];
    int  n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    int  rc = write(fd, buf, (size_t)n) == n ? 0 : -1;
    close(fd);
    return rc;
}

int main(int argc, char **argv)
{
    struct router_serve_opts o = {.stream_ms = 50};
    int                      cargc;
    char                   **cargv, **owned;
    if (common_config_load("sluice-router", argc, argv, &cargc, &cargv, &owned) < 0)
        return 2;
    int status = 2;
    for (int i = 1; i < cargc; i++) {
        const char *a = cargv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            router_usage(stdout);
            free(owned);
            return 0;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (i + 1 >= cargc) {
            fprintf(stderr, "sluice-router: %s needs a value (or is unknown); see --help\n", a);
            goto out;
        }
        const char *v = cargv[++i];
        int         bad = 0;
        if (strcmp(a, "--config") == 0)
            continue;
        else if (strcmp(a, "-m") == 0 || strcmp(a, "--model") == 0)
            o.model_path = v;
        else if (strcmp(a, "--run-dir") == 0)
            o.run_dir = v;
        else if (strcmp(a, "-c") == 0 || strcmp(a, "--ctx-size") == 0)
            bad = router_parse_u32(a, v, 1, 1u << 20, &o.n_ctx);
        else if (strcmp(a, "--parallel") == 0)
            bad = router_parse_u32(a, v, 1, 256, &o.n_seq);
        else if (strcmp(a, "--queue") == 0)
            bad = router_parse_u32(a, v, 1, 100000, &o.queue_max);
        else if (strcmp(a, "--client-timeout") == 0)
            bad = router_parse_u32(a, v, 1, 86400, &o.client_timeout_s);
        else if (strcmp(a, "--connect-timeout") == 0)
            bad = router_parse_u32(a, v, 1, 86400, &o.connect_timeout_s);
        else if (strcmp(a, "--stream-interval") == 0)
            bad = router_parse_u32(a, v, 0, 1000, &o.stream_ms);
        else if (strcmp(a, "--log-level") == 0) {
            enum common_log_level lvl;
            if ((bad = common_log_parse_level(v, &lvl)) < 0)
                fprintf(stderr, "sluice-router: --log-level expects err|warn|info|debug\n");
            else
                common_log_set_level(lvl);
        } else {
            fprintf(stderr, "sluice-router: unknown option '%s'; see --help\n", a);
            goto out;
        }
        if (bad)
            goto out;
    }
    if (!o.model_path || !o.run_dir) {
        fprintf(stderr, "sluice-router: -m MODEL.gguf and --run-dir DIR are required\n");
        goto out;
    }
    status = 1;
    if (mkdir(o.run_dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "sluice-router: cannot create %s: %s\n", o.run_dir, strerror(errno));
        goto out;
    }
    struct sigaction sa = {.sa_handler = router_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct common_errmsg e = {{0}};
    struct router_serve *s = NULL;
    int                  rc = router_serve_create(&o, &s, &e);
    if (rc < 0) {
        fprintf(stderr, "sluice-router: %s\n", e.text[0] ? e.text : common_strerror(rc));
        goto out;
    }
    char pid_path[4096];
    snprintf(pid_path, sizeof(pid_path), "%s/router.pid", o.run_dir);
    if (router_write_pid(pid_path) < 0)
        COMMON_LOG_WARN("router", "cannot write %s: %s", pid_path, strerror(errno));
    COMMON_LOG_INFO("router", "ready on %s", router_serve_url(s));
    router_serve_wait_stop(s, &router_stop_flag);
    COMMON_LOG_INFO("router", "draining");
    router_serve_drain(s);
    router_serve_wait_idle(s, -1);
    router_serve_destroy(s);
    unlink(pid_path);
    COMMON_LOG_INFO("router", "stopped");
    status = 0;
out:
    free(owned);
    return status;
}
