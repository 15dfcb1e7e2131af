/* proto/service.c - the daemon skeleton: control socket, common messages, pid file, signals. */
#include "proto.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SERVICE_POLL_MS 100 /* how often proto_service_run() looks at the stop flag */

/* Process singleton: set once SIGTERM or SIGINT arrived (by the signal thread started by
 * proto_daemon_signals(), or its handler), read by proto_service_run() and startup waits. */
static _Atomic int g_stop;

struct proto_service {
    struct proto_service_opts       o;          /* strings below are owned copies */
    const struct proto_service_ops *ops;        /* borrowed: static table of the daemon */
    void                           *arg;        /* borrowed: the daemon's state */
    char                           *run_dir;    /* owned */
    char                           *name;       /* owned */
    char                           *model_path; /* owned: o.model_path's copy, or NULL */
    char                           *model;      /* owned: realpath of the model, or NULL */
    char                            url[PROTO_MAX_PATH + 16];
    char                            pid_name[PROTO_MAX_NAME + 8];   /* NAME.pid */
    char                            sock_path[PROTO_MAX_PATH + 16]; /* ipc socket file we own */
    struct proto_server            *server;                         /* owned */
    bool                            pid_written; /* remove the pid file at stop */
    uint64_t                        instance;
    uint64_t                        t_start_ns;
    pthread_mutex_t                 mu;        /* guards the flags below */
    pthread_cond_t                  cv;        /* broadcast when shutdown is set */
    bool                            draining;  /* DRAIN or SHUTDOWN seen */
    bool                            shutdown;  /* SHUTDOWN seen */
    bool                            sync_init; /* mu and cv initialised */
};

/* ---- signals ------------------------------------------------------------------------------ */

static void service_on_signal(int sig)
{
    (void)sig;
    atomic_store_explicit(&g_stop, 1, memory_order_relaxed);
}

/* Takes SIGTERM and SIGINT for the whole process (every other thread blocks them, so no system
 * call of theirs is interrupted) and raises the stop flag. */
static void *service_signal_thread(void *arg)
{
    const sigset_t *set = arg;
    for (;;) {
        int sig = 0;
        if (sigwait(set, &sig) == 0)
            atomic_store_explicit(&g_stop, 1, memory_order_relaxed);
    }
    return NULL;
}

void proto_daemon_signals(void)
{
    /* Process singleton: the signals the signal thread waits for; written once, here. */
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* threads started later inherit the mask */
    pthread_t      th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, service_signal_thread, &set);
    pthread_attr_destroy(&attr);
    if (rc != 0) { /* no thread: take the signals with a handler instead */
        struct sigaction sa = {.sa_handler = service_on_signal, .sa_flags = SA_RESTART};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    }
}

bool proto_daemon_stopping(void)
{
    return atomic_load_explicit(&g_stop, memory_order_relaxed) != 0;
}

/* ---- HELLO and STATS helpers -------------------------------------------------------------- */

void proto_hello_init(struct proto_hello *h, enum proto_role role, const char *name,
                      uint64_t instance)
{
    memset(h, 0, sizeof(*h));
    h->major = PROTO_VERSION_MAJOR;
    h->minor = PROTO_VERSION_MINOR;
    h->role = role;
    snprintf(h->name, sizeof(h->name), "%s", name ? name : "");
    h->pid = (uint32_t)getpid();
    h->instance = instance;
}

static const char *service_role_name(int role)
{
    switch (role) {
    case PROTO_ROLE_FETCHER:
        return "fetcher";
    case PROTO_ROLE_EXECUTOR:
        return "executor";
    case PROTO_ROLE_ROUTER:
        return "router";
    case PROTO_ROLE_CLIENT:
        return "client";
    default:
        return "unknown";
    }
}

int proto_hello_check(const struct proto_hello *h, int want_role, struct common_errmsg *e)
{
    if (!proto_version_is_compatible(h->major, h->minor))
        return common_errmsg_set(e, COMMON_EPROTO, "%s speaks protocol %u.%u, this build %u.%u",
                                 h->name[0] ? h->name : "the peer", h->major, h->minor,
                                 PROTO_VERSION_MAJOR, PROTO_VERSION_MINOR);
    if (want_role >= 0 && (int)h->role != want_role)
        return common_errmsg_set(e, COMMON_EPROTO, "expected a %s, %s is a %s",
                                 service_role_name(want_role), h->name[0] ? h->name : "the peer",
                                 service_role_name((int)h->role));
    if (h->n_shards > PROTO_MAX_SHARDS)
        return common_errmsg_set(e, COMMON_EPROTO, "%u shards in a HELLO (at most %u)", h->n_shards,
                                 PROTO_MAX_SHARDS);
    return COMMON_OK;
}

void proto_stats_add(struct proto_stats_reply *st, const char *name, double value)
{
    if (st->n_stats >= PROTO_MAX_STATS)
        return;
    snprintf(st->stats[st->n_stats].name, PROTO_MAX_KEY, "%s", name);
    st->stats[st->n_stats].value = value;
    st->n_stats++;
}

void proto_stats_addf(struct proto_stats_reply *st, double value, const char *fmt, ...)
{
    char    name[PROTO_MAX_KEY];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    proto_stats_add(st, name, value);
}

/* ---- the control messages every daemon answers -------------------------------------------- */

static double service_uptime_s(const struct proto_service *s)
{
    return (double)(common_now_ns() - s->t_start_ns) / 1e9;
}

static void service_set_drain(struct proto_service *s, bool shutdown)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    if (shutdown)
        s->shutdown = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->ops->drain)
        s->ops->drain(s->arg);
}

static int service_configure(struct proto_service *s, const struct proto_configure *c,
                             struct proto_msg *rep)
{
    if (strcmp(c->key, "log.level") == 0) {
        enum common_log_level lvl;
        if (common_log_parse_level(c->value, &lvl) < 0)
            return proto_reply_error(rep, COMMON_EINVAL,
                                     "configure: log.level expects err, warn, info or debug, got "
                                     "'%.64s'",
                                     c->value);
        common_log_set_level(lvl);
        rep->kind = PROTO_KIND_OK;
        return COMMON_OK;
    }
    if (s->ops->configure)
        return s->ops->configure(s->arg, c, rep);
    return proto_reply_error(rep, COMMON_EINVAL,
                             "configure: unknown key '%.64s' (known: log.level)", c->key);
}

static int service_load_model(struct proto_service *s, const struct proto_load_model *m,
                              struct proto_msg *rep)
{
    char real[PATH_MAX];
    bool same =
        s->o.model_path && (strcmp(m->path, s->o.model_path) == 0 ||
                            (s->model && realpath(m->path, real) && strcmp(real, s->model) == 0));
    if (!same)
        return proto_reply_error(
            rep, COMMON_ENOTSUP,
            "load model: this %s serves %s; restart it with -m to load another", s->name,
            s->o.model_path ? s->o.model_path : "no model");
    rep->kind = PROTO_KIND_OK;
    return COMMON_OK;
}

static int service_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct proto_service *s = arg;
    struct common_errmsg  e = {{0}};
    switch (req->kind) {
    case PROTO_KIND_HELLO: {
        int rc = proto_hello_check(&req->u.hello, -1, &e);
        if (rc < 0)
            return proto_reply_error(rep, rc, "hello: %s", e.text);
        rep->kind = PROTO_KIND_HELLO;
        proto_hello_init(&rep->u.hello, s->o.role, s->name, s->instance);
        if (s->ops->hello)
            s->ops->hello(s->arg, &rep->u.hello);
        return COMMON_OK;
    }
    case PROTO_KIND_HEALTH: {
        struct proto_health_reply *h = &rep->u.health;
        rep->kind = PROTO_KIND_HEALTH_REPLY;
        memset(h, 0, sizeof(*h));
        h->role = s->o.role;
        h->pid = (uint32_t)getpid();
        h->instance = s->instance;
        h->uptime_s = service_uptime_s(s);
        h->state = PROTO_HEALTH_READY;
        if (s->ops->health)
            s->ops->health(s->arg, h);
        if (proto_service_is_draining(s)) {
            h->state = PROTO_HEALTH_DRAINING;
            if (!h->message[0])
                snprintf(h->message, sizeof(h->message), "draining");
        }
        return COMMON_OK;
    }
    case PROTO_KIND_STATS: {
        struct proto_stats_reply *st = &rep->u.stats;
        uint64_t                  served = 0, refused = 0;
        rep->kind = PROTO_KIND_STATS_REPLY;
        memset(st, 0, sizeof(*st));
        if (s->ops->stats)
            s->ops->stats(s->arg, st);
        proto_server_counts(s->server, &served, &refused);
        proto_stats_add(st, "ctl.requests", (double)served);
        proto_stats_add(st, "ctl.refused", (double)refused);
        proto_stats_add(st, "ctl.listener_restarts",
                        (double)proto_server_listener_restarts(s->server));
        proto_stats_add(st, "uptime_s", service_uptime_s(s));
        return COMMON_OK;
    }
    case PROTO_KIND_DRAIN:
    case PROTO_KIND_SHUTDOWN:
        service_set_drain(s, req->kind == PROTO_KIND_SHUTDOWN);
        rep->kind = PROTO_KIND_OK;
        return COMMON_OK;
    case PROTO_KIND_CONFIGURE:
        return service_configure(s, &req->u.configure, rep);
    case PROTO_KIND_LOAD_MODEL:
        return service_load_model(s, &req->u.load_model, rep);
    default:
        if (s->ops->handle)
            return s->ops->handle(s->arg, req, rep);
        return proto_reply_error(rep, COMMON_EPROTO, "the %s does not take %s messages",
                                 service_role_name((int)s->o.role), proto_kind_name(req->kind));
    }
}

/* ---- lifetime ----------------------------------------------------------------------------- */

int proto_service_start(const struct proto_service_opts *o, const struct proto_service_ops *ops,
                        void *arg, struct proto_service **out, struct common_errmsg *e)
{
    if (!o || !o->run_dir || !o->name || !*o->name || !ops || !out ||
        strlen(o->name) >= PROTO_MAX_NAME || strchr(o->name, '/'))
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "service: a run dir and a plain name are needed");
    int rc = common_run_dir_prepare(o->run_dir, e);
    if (rc < 0)
        return rc;
    struct proto_service *s = calloc(1, sizeof(*s));
    if (!s)
        return common_errmsg_set(e, COMMON_ENOMEM, "service: out of memory");
    s->o = *o;
    s->ops = ops;
    s->arg = arg;
    s->instance = o->instance ? o->instance : common_random_id();
    s->t_start_ns = common_now_ns();
    s->run_dir = strdup(o->run_dir);
    s->name = strdup(o->name);
    s->model_path = o->model_path ? strdup(o->model_path) : NULL;
    s->o.model_path = s->model_path;
    s->model = o->model_path ? realpath(o->model_path, NULL) : NULL;
    if (!s->run_dir || !s->name || (o->model_path && !s->model_path)) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "service: out of memory");
        goto out_free;
    }
    s->o.run_dir = s->run_dir;
    s->o.name = s->name;
    s->o.url = NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->sync_init = true;
    int n;
    if (o->url)
        n = snprintf(s->url, sizeof(s->url), "%s", o->url);
    else
        n = snprintf(s->url, sizeof(s->url), "ipc://%s/%s.ctl", s->run_dir, s->name);
    snprintf(s->pid_name, sizeof(s->pid_name), "%s.pid", s->name);
    if (n < 0 || (size_t)n >= sizeof(s->url)) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "run dir %s: path too long", s->run_dir);
        goto out_free;
    }
    if ((rc = proto_server_start(s->url, &(struct proto_server_opts){.n_workers = o->n_workers},
                                 service_handler, s, &s->server, e)) < 0)
        goto out_free; /* the socket file may be a live peer's: leave it */
    if (strncmp(s->url, "ipc://", 6) == 0)
        snprintf(s->sock_path, sizeof(s->sock_path), "%s", s->url + 6);
    if (!o->no_pidfile) {
        if ((rc = common_pid_file_write(s->run_dir, s->pid_name, e)) < 0)
            goto out_free;
        s->pid_written = true;
    }
    *out = s;
    return COMMON_OK;

out_free:
    proto_service_stop(s);
    return rc;
}

void proto_service_stop(struct proto_service *s)
{
    if (!s)
        return;
    proto_server_stop(s->server); /* waits for handlers in flight: none runs after this */
    if (s->sock_path[0])
        unlink(s->sock_path);
    if (s->pid_written)
        common_pid_file_remove(s->run_dir, s->pid_name);
    if (s->sync_init) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
    }
    free(s->model_path);
    free(s->model);
    free(s->name);
    free(s->run_dir);
    free(s);
}

bool proto_service_is_draining(struct proto_service *s)
{
    pthread_mutex_lock(&s->mu);
    bool v = s->draining;
    pthread_mutex_unlock(&s->mu);
    return v;
}

bool proto_service_shutdown_requested(struct proto_service *s)
{
    pthread_mutex_lock(&s->mu);
    bool v = s->shutdown;
    pthread_mutex_unlock(&s->mu);
    return v;
}

void proto_service_request_shutdown(struct proto_service *s)
{
    service_set_drain(s, true);
}

uint64_t proto_service_instance(const struct proto_service *s)
{
    return s->instance;
}

const char *proto_service_url(const struct proto_service *s)
{
    return s->url;
}

struct proto_server *proto_service_server(struct proto_service *s)
{
    return s->server;
}

int proto_service_run(struct proto_service *s)
{
    pthread_mutex_lock(&s->mu);
    while (!s->shutdown && !proto_daemon_stopping()) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SERVICE_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        (void)pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    bool by_message = s->shutdown;
    pthread_mutex_unlock(&s->mu);
    if (!by_message)
        service_set_drain(s, true);
    return by_message ? PROTO_SERVICE_STOP_MESSAGE : PROTO_SERVICE_STOP_SIGNAL;
}

/* ---- the command line of a daemon --------------------------------------------------------- */

int proto_daemon_parse(const struct common_opts_spec *spec, const char *section, int argc,
                       char **argv, struct proto_daemon_args *a, char ***owned)
{
    char config_help[160];
    snprintf(config_help, sizeof(config_help),
             "settings file: global keys and a [%s] section of 'key = value' lines (long option "
             "names), read before the command line, which overrides them",
             section);
    const struct common_opt rows[] = {
        {.name = "model",
         .short_name = "m",
         .type = COMMON_OPT_STR,
         .target = &a->model,
         .metavar = "PATH",
         .help = "GGUF model (first split of a split model)",
         .required = true},
        {.name = "run-dir",
         .type = COMMON_OPT_STR,
         .target = &a->run_dir,
         .metavar = "DIR",
         .help = "run directory shared by the daemons: created with mode 0700 when absent, else "
                 "it must be this user's with mode 0700",
         .required = true},
        {.name = "log-level",
         .type = COMMON_OPT_CALLBACK,
         .target = &a->log_level,
         .parse = common_log_level_opt,
         .metavar = "L",
         .help = "err, warn, info or debug",
         .def = "info"},
        {.name = "config", .type = COMMON_OPT_STR, .metavar = "FILE", .help = config_help},
        {0},
    };
    const struct common_opt_group groups[] = {{.title = "Options of every daemon", .opts = rows},
                                              {0}};
    struct common_opts_spec       full = *spec;
    full.groups = groups;
    int    cargc;
    char **cargv;
    a->log_level = COMMON_LOG_LEVEL_INFO;
    int rc = common_config_load(spec->prog, section, argc, argv, &cargc, &cargv, owned);
    if (rc < 0)
        return rc;
    if ((rc = common_opts_parse(&full, cargc, cargv)) == 0)
        common_log_set_level(a->log_level);
    return rc;
}
