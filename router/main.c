/* router/main.c - sluice-router: the router daemon (tokenizer, scheduler, client API). */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "proto.h"
#include "router.h"

#define PROG "sluice-router"

/* Parses the command line (after the config file's words). Returns 0 (run), COMMON_OPTS_HELP or
 * a negative common_err (printed). */
static int router_parse(int argc, char **argv, struct router_serve_opts *o, char ***owned)
{
    const struct common_opt rows[] = {
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
        {.name = "watchdog",
         .type = COMMON_OPT_U32,
         .target = &o->watchdog_s,
         .min = 1,
         .max = 86400,
         .metavar = "SEC",
         .help = "a wait for the executor that makes no progress this long is stuck in a call: "
                 "exit, for the monitor to restart the router (clients resend their requests)",
         .def = "20"},
        {.name = "stream-interval",
         .type = COMMON_OPT_U32,
         .target = &o->stream_ms,
         .max = 1000,
         .metavar = "MS",
         .help = "a streaming client gets the tokens made during each interval together; 0 = "
                 "every token at once",
         .def = "50"},
        {.name = "prefill-chunk",
         .type = COMMON_OPT_U32,
         .target = &o->prefill_chunk,
         .min = 1,
         .max = 1u << 20,
         .metavar = "N",
         .help = "prompt tokens of one request per step: a long prompt is evaluated in pieces "
                 "that share the executor's batches with the other requests' next tokens",
         .def = "512"},
        {.name = "http",
         .type = COMMON_OPT_STR,
         .target = &o->http_addr,
         .metavar = "HOST:PORT",
         .help = "also serve the OpenAI-compatible HTTP API there (/v1/completions, "
                 "/v1/chat/completions, /v1/models, /health); \":PORT\" listens on "
                 "127.0.0.1, port 0 on a free port; the url is written to DIR/router.http",
         .def = "off"},
        {.name = "api-key",
         .type = COMMON_OPT_STR,
         .target = &o->api_key,
         .metavar = "KEY",
         .help = "HTTP requests (but /health) must carry 'Authorization: Bearer KEY', else 401; "
                 "put it in the config file to keep it out of the process list"},
        {.name = "http-max-body",
         .type = COMMON_OPT_SIZE,
         .target = &o->http_max_body,
         .min = 64,
         .max = 1u << 30,
         .help = "HTTP request bodies larger than this get 413",
         .def = "1M"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = PROG,
        .usage = PROG " -m MODEL.gguf --run-dir DIR [options]",
        .description = "Serves generation requests on DIR/router.sock: tokenizes with the model's "
                       "tokenizer, schedules sequences on the executor (DIR/executor.ctl), "
                       "samples and streams the text back. Start it after sluice-executor.",
        .epilog = "SIGTERM/SIGINT (or a SHUTDOWN message): stop taking requests, finish the "
                  "active ones, remove router.sock, router.pid, router.http and the router-exec.* "
                  "segments, exit 0. Exit status 2 for a usage error, 1 for a failure.",
        .opts = rows,
    };
    struct proto_daemon_args da = {0};
    int                      rc = proto_daemon_parse(&spec, "router", argc, argv, &da, owned);
    o->model_path = da.model;
    o->run_dir = da.run_dir;
    return rc;
}

int main(int argc, char **argv)
{
    struct router_serve_opts o = {.stream_ms = 50};
    char                   **owned = NULL;
    int                      rc = router_parse(argc, argv, &o, &owned);
    if (rc != 0) {
        free(owned);
        return common_opts_exit_status(rc);
    }
    proto_daemon_signals();

    struct common_errmsg e = {{0}};
    struct router_serve *s = NULL;
    if ((rc = router_serve_create(&o, &s, &e)) < 0) {
        fprintf(stderr, PROG ": error: %s\n", e.text[0] ? e.text : common_strerror(rc));
        free(owned);
        return 1;
    }
    COMMON_LOG_INFO("router", "ready on %s%s%s", router_serve_url(s),
                    router_serve_http_url(s) ? " and " : "",
                    router_serve_http_url(s) ? router_serve_http_url(s) : "");
    (void)proto_service_run(router_serve_service(s));
    COMMON_LOG_INFO("router", "draining");
    router_serve_wait_idle(s, -1);
    router_serve_destroy(s);
    COMMON_LOG_INFO("router", "stopped");
    free(owned);
    return 0;
}
