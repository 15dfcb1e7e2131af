/* router/main.c - sluice-router: the router daemon (tokenizer, scheduler, client API). */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "proto.h"
#include "router.h"

#define PROG "sluice-router"

/* Parses the command line (after the config file's words). Returns 0 (run), COMMON_OPTS_HELP or
 * a negative common_err (printed). */
static int router_parse(int argc, char **argv, struct router_serve_opts *o,
                        enum common_log_level *level)
{
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &o->model_path,
         .metavar = "PATH",
         .help = "GGUF model (its tokenizer and chat template)",
         .required = true},
        {.name = "run-dir",
         .type = COMMON_OPT_STR,
         .target = &o->run_dir,
         .metavar = "DIR",
         .help = "run directory shared by the daemons (mode 0700)",
         .required = true},
        {.name = "ctx-size",
         .short_name = "c",
         .type = COMMON_OPT_U32,
         .target = &o->n_ctx,
         .min = 1,
         .max = 1u << 20,
         .help = "positions per sequence; the executor must have at least as many",
         .def = "min(4096, model's)"},
        {.name = "parallel",
         .type = COMMON_OPT_U32,
         .target = &o->n_seq,
         .min = 1,
         .max = 256,
         .help = "sequences generated at once",
         .def = "4"},
        {.name = "queue",
         .type = COMMON_OPT_U32,
         .target = &o->queue_max,
         .min = 1,
         .max = 100000,
         .help = "requests waiting for a sequence at most",
         .def = "64"},
        {.name = "client-timeout",
         .type = COMMON_OPT_U32,
         .target = &o->client_timeout_s,
         .min = 1,
         .max = 86400,
         .metavar = "SEC",
         .help = "drop a request its client stopped polling",
         .def = "60"},
        {.name = "connect-timeout",
         .type = COMMON_OPT_U32,
         .target = &o->connect_timeout_s,
         .min = 1,
         .max = 86400,
         .metavar = "SEC",
         .help = "wait this long for the executor",
         .def = "30"},
        {.name = "stream-interval",
         .type = COMMON_OPT_U32,
         .target = &o->stream_ms,
         .max = 1000,
         .metavar = "MS",
         .help = "a streaming client gets the tokens made during each interval together; 0 = "
                 "every token at once",
         .def = "50"},
        {.name = "log-level",
         .type = COMMON_OPT_CALLBACK,
         .target = level,
         .parse = common_log_level_opt,
         .metavar = "L",
         .help = "err, warn, info or debug",
         .def = "info"},
        {.name = "config",
         .type = COMMON_OPT_STR,
         .metavar = "FILE",
         .help = "settings file: global keys and a [router] section of 'key = value' lines "
                 "(long option names); the command line overrides them"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = PROG,
        .usage = PROG " -m MODEL.gguf --run-dir DIR [options]",
        .description = "Serves generation requests on DIR/router.sock: tokenizes with the model's "
                       "tokenizer, schedules sequences on the executor (DIR/executor.ctl), "
                       "samples and streams the text back. Start it after sluice-executor.",
        .epilog = "SIGTERM/SIGINT (or a SHUTDOWN message): stop taking requests, finish the "
                  "active ones, remove router.sock, router.pid and the router-exec.* segments, "
                  "exit 0. Exit status 2 for a usage error, 1 for a failure.",
        .opts = rows,
    };
    return common_opts_parse(&spec, argc, argv);
}

int main(int argc, char **argv)
{
    struct router_serve_opts o = {.stream_ms = 50};
    enum common_log_level    level = COMMON_LOG_LEVEL_INFO;
    int                      cargc;
    char                   **cargv, **owned;
    int rc = common_config_load(PROG, "router", argc, argv, &cargc, &cargv, &owned);
    if (rc < 0)
        return common_opts_exit_status(rc);
    if ((rc = router_parse(cargc, cargv, &o, &level)) != 0) {
        free(owned);
        return common_opts_exit_status(rc);
    }
    common_log_set_level(level);
    proto_daemon_signals();

    struct common_errmsg e = {{0}};
    struct router_serve *s = NULL;
    if ((rc = router_serve_create(&o, &s, &e)) < 0) {
        fprintf(stderr, PROG ": error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        free(owned);
        return 1;
    }
    COMMON_LOG_INFO("router", "ready on %s", router_serve_url(s));
    (void)proto_service_run(router_serve_service(s));
    COMMON_LOG_INFO("router", "draining");
    router_serve_wait_idle(s, -1);
    router_serve_destroy(s);
    COMMON_LOG_INFO("router", "stopped");
    free(owned);
    return 0;
}
