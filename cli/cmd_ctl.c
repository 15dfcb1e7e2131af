/* cli/cmd_ctl.c - `sluice ctl`: one control message to a running daemon, reply printed. */
#include "cli.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "proto.h"

/* Declared in cli.h by the dispatch table's owner; repeated here so this file stands alone. */
int cli_cmd_ctl(int argc, char **argv);

#define CTL_DEFAULT_TIMEOUT_MS 2000u
#define CTL_MAX_TIMEOUT_MS     600000u
#define CTL_EXIT_NOT_READY     3

#define CTL_PROG "sluice ctl"

static const char ctl_epilog[] =
    "Commands:\n"
    "  hello            who the daemon is: role, name, version, pid, instance, shards\n"
    "  health           state (STARTING, READY, DRAINING, DEGRADED), pid, uptime;\n"
    "                   exits 0 only when READY (3 when the daemon answers otherwise)\n"
    "  stats            the daemon's counters\n"
    "  drain            stop taking new work, finish what is in flight\n"
    "  shutdown         drain, then exit\n"
    "  configure KEY VALUE  set a runtime setting (e.g. log.level debug)\n"
    "  load-model PATH  confirm the loaded model (another one needs a restart)\n"
    "\n"
    "Exit status: 0 ok, 1 error reply or no reply, 2 usage, 3 health not READY.";

/* What the command line asked for. */
struct ctl_args {
    const char            *socket;     /* --socket: borrowed from argv */
    const char            *run_dir;    /* --run-dir: borrowed from argv */
    const char            *daemon;     /* --daemon: borrowed from argv */
    uint32_t               timeout_ms; /* --timeout */
    bool                   json;       /* --json */
    const char            *words_v[3]; /* COMMAND [ARGS]: borrowed from argv */
    struct common_opt_strs words;      /* into words_v */
};

static const char *ctl_role_name(enum proto_role r)
{
    switch (r) {
    case PROTO_ROLE_FETCHER:
        return "fetcher";
    case PROTO_ROLE_EXECUTOR:
        return "executor";
    case PROTO_ROLE_ROUTER:
        return "router";
    case PROTO_ROLE_CLIENT:
        return "client";
    }
    return "?";
}

static const char *ctl_state_name(enum proto_health_state s)
{
    switch (s) {
    case PROTO_HEALTH_STARTING:
        return "STARTING";
    case PROTO_HEALTH_READY:
        return "READY";
    case PROTO_HEALTH_DRAINING:
        return "DRAINING";
    case PROTO_HEALTH_DEGRADED:
        return "DEGRADED";
    }
    return "?";
}

/* True when `name` is fetcher-<digits>, executor or router. */
static bool ctl_daemon_is_valid(const char *name)
{
    if (!strcmp(name, "executor") || !strcmp(name, "router"))
        return true;
    if (strncmp(name, "fetcher-", 8) != 0 || name[8] == '\0' || strlen(name) > 8 + 5)
        return false;
    for (const char *p = name + 8; *p; p++)
        if (*p < '0' || *p > '9')
            return false;
    return true;
}

/* Builds the control URL into buf; reports a bad combination as a usage error and returns
 * false. */
static bool ctl_make_url(const struct common_opts_spec *spec, char *buf, size_t cap,
                         const char *socket, const char *run_dir, const char *daemon)
{
    int n;
    if (socket) {
        if (run_dir || daemon) {
            common_opts_error(spec, "--socket and --run-dir/--daemon exclude each other");
            return false;
        }
        n = strstr(socket, "://") ? snprintf(buf, cap, "%s", socket)
                                  : snprintf(buf, cap, "ipc://%s", socket);
    } else {
        if (!run_dir)
            run_dir = getenv("SLUICE_RUN_DIR");
        if (!run_dir || !*run_dir) {
            common_opts_error(spec, "need --socket URL or --run-dir DIR (or $SLUICE_RUN_DIR)");
            return false;
        }
        if (!daemon)
            daemon = "router";
        if (!ctl_daemon_is_valid(daemon)) {
            common_opts_error(spec, "--daemon expects fetcher-<i>, executor or router, got '%s'",
                              daemon);
            return false;
        }
        const char *file = strcmp(daemon, "router") == 0 ? "router.sock" : NULL;
        n = file ? snprintf(buf, cap, "ipc://%s/%s", run_dir, file)
                 : snprintf(buf, cap, "ipc://%s/%s.ctl", run_dir, daemon);
    }
    if (n < 0 || (size_t)n >= cap) {
        common_opts_error(spec, "socket address too long");
        return false;
    }
    return true;
}

/* Copies `src` into dst[cap]; reports a usage error naming `what` when it does not fit. */
static bool ctl_copy(const struct common_opts_spec *spec, char *dst, size_t cap, const char *src,
                     const char *what)
{
    size_t n = strlen(src);
    if (n >= cap) {
        common_opts_error(spec, "%s too long (%zu bytes, at most %zu)", what, n, cap - 1);
        return false;
    }
    memcpy(dst, src, n + 1);
    return true;
}

/* Fills *req from the command words; returns false (message printed) on a usage error. */
static bool ctl_make_request(const struct common_opts_spec *spec, int argc, const char *const *argv,
                             struct proto_msg *req)
{
    const char *cmd = argv[0];
    int         want = 1;
    memset(req, 0, sizeof(*req));
    req->request_id = ((uint64_t)getpid() << 20) ^ (common_now_ns() & 0xfffffu);
    if (!strcmp(cmd, "hello")) {
        req->kind = PROTO_KIND_HELLO;
        req->u.hello.major = PROTO_VERSION_MAJOR;
        req->u.hello.minor = PROTO_VERSION_MINOR;
        req->u.hello.role = PROTO_ROLE_CLIENT;
        snprintf(req->u.hello.name, sizeof(req->u.hello.name), "sluice-ctl");
        req->u.hello.pid = (uint32_t)getpid();
    } else if (!strcmp(cmd, "health")) {
        req->kind = PROTO_KIND_HEALTH;
    } else if (!strcmp(cmd, "stats")) {
        req->kind = PROTO_KIND_STATS;
    } else if (!strcmp(cmd, "drain")) {
        req->kind = PROTO_KIND_DRAIN;
    } else if (!strcmp(cmd, "shutdown")) {
        req->kind = PROTO_KIND_SHUTDOWN;
    } else if (!strcmp(cmd, "configure")) {
        want = 3;
        if (argc != want) {
            common_opts_error(spec, "configure needs KEY VALUE");
            return false;
        }
        req->kind = PROTO_KIND_CONFIGURE;
        if (!ctl_copy(spec, req->u.configure.key, sizeof(req->u.configure.key), argv[1], "key") ||
            !ctl_copy(spec, req->u.configure.value, sizeof(req->u.configure.value), argv[2],
                      "value"))
            return false;
    } else if (!strcmp(cmd, "load-model")) {
        want = 2;
        if (argc != want) {
            common_opts_error(spec, "load-model needs PATH");
            return false;
        }
        req->kind = PROTO_KIND_LOAD_MODEL;
        /* The daemon's working directory is not ours: send an absolute path when we
         * can. */
        char        abs[PATH_MAX];
        const char *path = realpath(argv[1], abs) ? abs : argv[1];
        if (!ctl_copy(spec, req->u.load_model.path, sizeof(req->u.load_model.path), path, "path"))
            return false;
    } else {
        common_opts_error(spec, "unknown command '%s'", cmd);
        return false;
    }
    if (argc != want) {
        common_opts_error(spec, "%s takes no argument", cmd);
        return false;
    }
    return true;
}

static json_t *ctl_json_cstr(const char *s)
{
    return cli_json_str(s, strlen(s));
}

static void ctl_print_hello(const struct proto_hello *h, bool json)
{
    const uint32_t n = h->n_shards < PROTO_MAX_SHARDS ? h->n_shards : PROTO_MAX_SHARDS;
    if (json) {
        json_t *shards = json_array();
        for (uint32_t i = 0; i < n; i++)
            json_array_append_new(shards,
                                  json_pack("{s:I,s:I,s:I,s:I,s:I}", "fetcher",
                                            (json_int_t)h->shards[i].fetcher, "first_expert",
                                            (json_int_t)h->shards[i].first_expert, "n_experts",
                                            (json_int_t)h->shards[i].n_experts, "first_layer",
                                            (json_int_t)h->shards[i].first_layer, "n_layers",
                                            (json_int_t)h->shards[i].n_layers));
        (void)cli_json_print(json_pack("{s:s,s:o,s:s,s:I,s:I,s:I,s:I,s:o}", "kind", "hello", "name",
                                       ctl_json_cstr(h->name), "role", ctl_role_name(h->role),
                                       "major", (json_int_t)h->major, "minor", (json_int_t)h->minor,
                                       "pid", (json_int_t)h->pid, "instance",
                                       (json_int_t)h->instance, "shards", shards),
                             stdout);
        return;
    }
    printf("name      %s\n", h->name);
    printf("role      %s\n", ctl_role_name(h->role));
    printf("version   %u.%u%s\n", h->major, h->minor,
           proto_version_is_compatible(h->major, h->minor) ? ""
                                                           : " (incompatible with this build)");
    printf("pid       %u\n", h->pid);
    printf("instance  %llu\n", (unsigned long long)h->instance);
    if (n == 0)
        printf("shards    -\n");
    for (uint32_t i = 0; i < n; i++) {
        const struct proto_shard *s = &h->shards[i];
        printf("%s fetcher-%u: experts %u..%u (%u)", i ? "         " : "shards   ", s->fetcher,
               s->first_expert, s->first_expert + s->n_experts - (s->n_experts ? 1u : 0u),
               s->n_experts);
        if (s->n_layers)
            printf(" of layers %u..%u", s->first_layer, s->first_layer + s->n_layers - 1);
        putchar('\n');
    }
}

static void ctl_print_health(const struct proto_health_reply *h, bool json)
{
    if (json) {
        (void)cli_json_print(
            json_pack("{s:s,s:s,s:s,s:I,s:I,s:o,s:o}", "kind", "health", "state",
                      ctl_state_name(h->state), "role", ctl_role_name(h->role), "pid",
                      (json_int_t)h->pid, "instance", (json_int_t)h->instance, "uptime_s",
                      cli_json_num(h->uptime_s), "message", ctl_json_cstr(h->message)),
            stdout);
        return;
    }
    printf("state     %s\n", ctl_state_name(h->state));
    printf("role      %s\n", ctl_role_name(h->role));
    printf("pid       %u\n", h->pid);
    printf("instance  %llu\n", (unsigned long long)h->instance);
    printf("uptime    %.1f s\n", h->uptime_s);
    if (h->message[0])
        printf("message   %s\n", h->message);
}

static void ctl_print_stats(const struct proto_stats_reply *s, bool json)
{
    const uint32_t n = s->n_stats < PROTO_MAX_STATS ? s->n_stats : PROTO_MAX_STATS;
    if (json) {
        json_t *stats = json_object();
        for (uint32_t i = 0; i < n; i++) {
            char name[PROTO_MAX_KEY + 1];
            snprintf(name, sizeof(name), "%.*s", (int)PROTO_MAX_KEY, s->stats[i].name);
            json_t *v = cli_json_num(s->stats[i].value);
            /* A name that is not UTF-8 is repaired as strings are. */
            size_t ln = 0;
            char  *key = common_utf8_repair(name, strlen(name), &ln);
            if (key)
                json_object_set_new(stats, key, v);
            else
                json_decref(v);
            free(key);
        }
        (void)cli_json_print(json_pack("{s:s,s:o}", "kind", "stats", "stats", stats), stdout);
        return;
    }
    int width = 0;
    for (uint32_t i = 0; i < n; i++) {
        int len = (int)strnlen(s->stats[i].name, PROTO_MAX_KEY);
        if (len > width)
            width = len;
    }
    for (uint32_t i = 0; i < n; i++) {
        const double v = s->stats[i].value;
        if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0)
            printf("%-*s  %.0f\n", width, s->stats[i].name, v);
        else
            printf("%-*s  %g\n", width, s->stats[i].name, v);
    }
}

/* Prints the reply; returns the exit status. */
static int ctl_print_reply(const char *url, const struct proto_msg *req,
                           const struct proto_msg *rep, bool json)
{
    if (rep->kind == PROTO_KIND_ERROR) {
        cli_error(CTL_PROG, "%s: %s: %s", url, common_strerror(rep->u.error.code),
                  rep->u.error.message[0] ? rep->u.error.message : "(no message)");
        if (json)
            (void)cli_json_print(json_pack("{s:s,s:i,s:s,s:o}", "kind", "error", "code",
                                           rep->u.error.code, "error",
                                           common_strerror(rep->u.error.code), "message",
                                           ctl_json_cstr(rep->u.error.message)),
                                 stdout);
        return 1;
    }
    enum proto_kind want;
    switch (req->kind) {
    case PROTO_KIND_HELLO:
        want = PROTO_KIND_HELLO;
        break;
    case PROTO_KIND_STATS:
        want = PROTO_KIND_STATS_REPLY;
        break;
    case PROTO_KIND_HEALTH:
        want = PROTO_KIND_HEALTH_REPLY;
        break;
    default:
        want = PROTO_KIND_OK;
        break;
    }
    if (rep->kind != want) {
        cli_error(CTL_PROG, "%s: unexpected reply '%s' to '%s'", url, proto_kind_name(rep->kind),
                  proto_kind_name(req->kind));
        return 1;
    }
    switch (rep->kind) {
    case PROTO_KIND_HELLO:
        ctl_print_hello(&rep->u.hello, json);
        return 0;
    case PROTO_KIND_STATS_REPLY:
        ctl_print_stats(&rep->u.stats, json);
        return 0;
    case PROTO_KIND_HEALTH_REPLY:
        ctl_print_health(&rep->u.health, json);
        return rep->u.health.state == PROTO_HEALTH_READY ? 0 : CTL_EXIT_NOT_READY;
    default:
        if (json)
            fputs("{\"kind\":\"ok\"}\n", stdout);
        else
            printf("ok\n");
        return 0;
    }
}

int cli_cmd_ctl(int argc, char **argv)
{
    struct ctl_args a = {.timeout_ms = CTL_DEFAULT_TIMEOUT_MS};
    a.words = (struct common_opt_strs){.v = a.words_v, .cap = 3};
    const struct common_opt rows[] = {
        {.name = "socket",
         .type = COMMON_OPT_STR,
         .target = &a.socket,
         .metavar = "URL",
         .help = "the daemon's control socket: ipc:///run/dir/executor.ctl, tcp://HOST:PORT; a "
                 "plain path means ipc://PATH"},
        {.name = "run-dir",
         .type = COMMON_OPT_STR,
         .target = &a.run_dir,
         .metavar = "DIR",
         .help = "the daemons' run directory ...",
         .def = "$SLUICE_RUN_DIR"},
        {.name = "daemon",
         .type = COMMON_OPT_STR,
         .target = &a.daemon,
         .metavar = "NAME",
         .help = "... and the daemon in it: fetcher-<i>, executor or router (router.sock for the "
                 "router, NAME.ctl for the others)",
         .def = "router"},
        {.name = "timeout",
         .type = COMMON_OPT_U32,
         .target = &a.timeout_ms,
         .min = 1,
         .max = CTL_MAX_TIMEOUT_MS,
         .metavar = "MS",
         .help = "how long to wait for the reply",
         .def = "2000"},
        {.name = "json",
         .type = COMMON_OPT_SWITCH,
         .target = &a.json,
         .help = "print the reply as one JSON object"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = CTL_PROG,
        .usage = CTL_PROG " [--socket URL | --run-dir DIR --daemon NAME] [--timeout MS] [--json] "
                          "COMMAND [ARGS]",
        .description = "Sends one control message to a running daemon and prints its reply.",
        .epilog = ctl_epilog,
        .opts = rows,
        .positional = &a.words,
        .stop_at_positional = true, /* a configure VALUE may start with '-' */
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return common_opts_exit_status(rc);
    if (a.words.n == 0)
        return common_opts_exit_status(common_opts_error(&spec, "missing COMMAND"));
    char url[PROTO_MAX_PATH + 64];
    if (!ctl_make_url(&spec, url, sizeof(url), a.socket, a.run_dir, a.daemon))
        return 2;
    struct proto_msg req;
    if (!ctl_make_request(&spec, (int)a.words.n, a.words_v, &req))
        return 2;

    struct proto_msg     rep;
    struct common_errmsg e = {{0}};
    memset(&rep, 0, sizeof(rep));
    /* A connection closed before the reply (the daemon's listener watchdog replaced the
     * listener) is tried again within the timeout: every control command is idempotent. */
    uint64_t start = common_now_ns();
    for (;;) {
        uint64_t spent_ms = (common_now_ns() - start) / 1000000u;
        int      left = spent_ms >= a.timeout_ms ? 0 : (int)(a.timeout_ms - spent_ms);
        rc = proto_call(url, &req, &rep, left, &e);
        if (rc != COMMON_ECLOSED || left == 0)
            break;
        usleep(50 * 1000);
    }
    if (rc < 0) {
        if (rc == COMMON_ETIMEDOUT)
            cli_error(CTL_PROG, "no reply from %s in %u ms (is the daemon running?)", url,
                      a.timeout_ms);
        else
            cli_error(CTL_PROG, "no reply from %s in %u ms (is the daemon running?): %s%s%s", url,
                      a.timeout_ms, common_strerror(rc), e.text[0] ? ": " : "", e.text);
        return 1;
    }
    int status = ctl_print_reply(url, &req, &rep, a.json);
    proto_msg_clear(&rep);
    return status;
}
