/* router/metrics.c - GET /metrics: the counters of the router, the executor and the fetchers of
 * the run directory in Prometheus's text format, headline metrics first. */
#include "metrics.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define METRICS_TIMEOUT_MS 300 /* per daemon asked: a scrape never waits long on one */
#define METRICS_MAX_DAEMON 66  /* the router, the executor and up to 64 fetchers */

/* What one daemon said (or that it did not answer). */
struct metrics_daemon {
    char                      name[32]; /* "router", "executor", "fetcher-I" */
    bool                      up;
    struct proto_health_reply health;
    struct proto_stats_reply  stats;
};

/* Asks the daemon at ipc://RUN_DIR/<name>.ctl for its health and counters. */
static void metrics_ask(const struct router_serve *s, struct metrics_daemon *d)
{
    char             url[PROTO_MAX_PATH + 96];
    struct proto_msg req, rep;
    snprintf(url, sizeof(url), "ipc://%s/%s.ctl", s->run_dir, d->name);
    memset(&req, 0, sizeof(req));
    memset(&rep, 0, sizeof(rep));
    req.kind = PROTO_KIND_HEALTH;
    if (proto_call(url, &req, &rep, METRICS_TIMEOUT_MS, NULL) < 0 ||
        rep.kind != PROTO_KIND_HEALTH_REPLY) {
        proto_msg_clear(&rep);
        return;
    }
    d->health = rep.u.health;
    proto_msg_clear(&rep);
    req.kind = PROTO_KIND_STATS;
    if (proto_call(url, &req, &rep, METRICS_TIMEOUT_MS, NULL) == 0 &&
        rep.kind == PROTO_KIND_STATS_REPLY)
        d->stats = rep.u.stats;
    proto_msg_clear(&rep);
    d->up = true;
}

static int metrics_cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct metrics_daemon *)a)->name,
                  ((const struct metrics_daemon *)b)->name);
}

/* The fetchers of the run directory: every fetcher-I.ctl socket, in name order. */
static size_t metrics_fetchers(const struct router_serve *s, struct metrics_daemon *out, size_t cap)
{
    DIR   *dir = opendir(s->run_dir);
    size_t n = 0;
    if (!dir)
        return 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL && n < cap) {
        unsigned idx;
        char     tail[8];
        if (sscanf(de->d_name, "fetcher-%u%7s", &idx, tail) == 2 && strcmp(tail, ".ctl") == 0) {
            memset(&out[n], 0, sizeof(out[n]));
            snprintf(out[n].name, sizeof(out[n].name), "fetcher-%u", idx);
            n++;
        }
    }
    closedir(dir);
    qsort(out, n, sizeof(*out), metrics_cmp_name);
    return n;
}

/* A counter of daemon d by name; 0 when absent. */
static double metrics_stat(const struct metrics_daemon *d, const char *name)
{
    for (uint32_t i = 0; i < d->stats.n_stats; i++)
        if (strcmp(d->stats.stats[i].name, name) == 0)
            return d->stats.stats[i].value;
    return 0.0;
}

static void metrics_head(FILE *b, const char *name, const char *type, const char *help)
{
    fprintf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A counter's name as a label value: quotes, backslashes and newlines become '_'. */
static void metrics_label_value(char *dst, size_t len, const char *src)
{
    size_t j = 0;
    for (size_t i = 0; src[i] && j + 1 < len; i++)
        dst[j++] = (src[i] == '"' || src[i] == '\\' || src[i] == '\n') ? '_' : src[i];
    dst[j] = '\0';
}

char *router_metrics_text(struct router_serve *s)
{
    struct metrics_daemon *ds = calloc(METRICS_MAX_DAEMON, sizeof(*ds));
    char                  *text = NULL;
    size_t                 len = 0;
    FILE                  *b = ds ? open_memstream(&text, &len) : NULL;
    if (!b) {
        free(ds);
        return NULL;
    }
    /* The router itself, then its peers. */
    snprintf(ds[0].name, sizeof(ds[0].name), "router");
    ds[0].up = true;
    router_serve_stats(s, &ds[0].stats);
    snprintf(ds[1].name, sizeof(ds[1].name), "executor");
    metrics_ask(s, &ds[1]);
    size_t n = 2 + metrics_fetchers(s, ds + 2, METRICS_MAX_DAEMON - 2);
    for (size_t i = 2; i < n; i++)
        metrics_ask(s, &ds[i]);
    const struct metrics_daemon *r = &ds[0];

    metrics_head(b, "sluice_requests_total", "counter",
                 "Generation requests by what became of them (submitted counts every one).");
    const char *states[] = {"submitted", "done", "cancelled", "failed", "dropped"};
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        char key[32];
        snprintf(key, sizeof(key), "requests.%s", states[i]);
        fprintf(b, "sluice_requests_total{state=\"%s\"} %.0f\n", states[i], metrics_stat(r, key));
    }
    metrics_head(b, "sluice_queue_depth", "gauge", "Requests waiting for a free sequence.");
    fprintf(b, "sluice_queue_depth %.0f\n", metrics_stat(r, "requests.queued"));
    metrics_head(b, "sluice_requests_active", "gauge", "Requests holding a sequence.");
    fprintf(b, "sluice_requests_active %.0f\n", metrics_stat(r, "requests.active"));
    metrics_head(b, "sluice_tokens_total", "counter",
                 "Tokens: prompt tokens evaluated, tokens generated.");
    fprintf(b, "sluice_tokens_total{kind=\"prompt\"} %.0f\n", metrics_stat(r, "tokens.prompt"));
    fprintf(b, "sluice_tokens_total{kind=\"generated\"} %.0f\n",
            metrics_stat(r, "tokens.generated"));
    const double wall_s = metrics_stat(r, "rounds.wall_ms") / 1e3;
    metrics_head(b, "sluice_generated_tokens_per_second", "gauge",
                 "Tokens generated per second of executor steps since the router started (all "
                 "the requests of a batched step together).");
    fprintf(b, "sluice_generated_tokens_per_second %.6g\n",
            wall_s > 0.0 ? metrics_stat(r, "tokens.generated") / wall_s : 0.0);

    if (ds[1].up) {
        metrics_head(b, "sluice_batch_sequences", "gauge",
                     "Sequences per executor batch since the executor started (continuous "
                     "batching: every active request's step in one batch).");
        fprintf(b, "sluice_batch_sequences %.6g\n", metrics_stat(&ds[1], "batch_seqs_mean"));
    }

    /* The fetchers together: the expert pool and storage. */
    double acc = 0, hits = 0, bytes = 0, faults = 0, tokens = 0;
    bool   any = false;
    for (size_t i = 2; i < n; i++) {
        if (!ds[i].up)
            continue;
        any = true;
        acc += metrics_stat(&ds[i], "trace.accesses");
        hits += metrics_stat(&ds[i], "trace.hits"); /* prefetch hits included */
        bytes += metrics_stat(&ds[i], "trace.bytes_read");
        faults += metrics_stat(&ds[i], "trace.faults");
        const double t = metrics_stat(&ds[i], "trace.tokens");
        tokens = t > tokens ? t : tokens; /* every fetcher counts the same tokens */
    }
    if (any) {
        metrics_head(b, "sluice_expert_hit_rate", "gauge",
                     "Expert parts found in the pool (or prefetched) per part asked for.");
        fprintf(b, "sluice_expert_hit_rate %.6g\n", acc > 0 ? hits / acc : 0.0);
        metrics_head(b, "sluice_storage_read_bytes_total", "counter",
                     "Bytes the fetchers read from storage.");
        fprintf(b, "sluice_storage_read_bytes_total %.0f\n", bytes);
        metrics_head(b, "sluice_faults_per_token", "gauge",
                     "Expert parts a token waited for (not in the pool when computed).");
        fprintf(b, "sluice_faults_per_token %.6g\n", tokens > 0 ? faults / tokens : 0.0);
    }

    metrics_head(b, "sluice_daemon_restarts_total", "counter",
                 "Executor restarts the router has seen (it reconnected to a new one).");
    fprintf(b, "sluice_daemon_restarts_total{daemon=\"executor\"} %.0f\n",
            metrics_stat(r, "executor.restarts"));
    metrics_head(b, "sluice_up", "gauge", "Whether the daemon answered this scrape.");
    for (size_t i = 0; i < n; i++)
        fprintf(b, "sluice_up{daemon=\"%s\"} %d\n", ds[i].name, ds[i].up ? 1 : 0);
    metrics_head(b, "sluice_start_time_seconds", "gauge",
                 "When the daemon started, in seconds since the epoch (a restart changes it).");
    const double now = (double)time(NULL);
    for (size_t i = 1; i < n; i++)
        if (ds[i].up)
            fprintf(b, "sluice_start_time_seconds{daemon=\"%s\"} %.0f\n", ds[i].name,
                    now - ds[i].health.uptime_s);

    /* Everything each daemon counts, by its own names (sluice ctl ... stats). */
    metrics_head(b, "sluice_stat", "gauge",
                 "Every counter of every daemon, named as `sluice ctl --daemon D stats` names it.");
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; ds[i].up && k < ds[i].stats.n_stats; k++) {
            char name[PROTO_MAX_KEY];
            metrics_label_value(name, sizeof(name), ds[i].stats.stats[k].name);
            fprintf(b, "sluice_stat{daemon=\"%s\",name=\"%s\"} %.17g\n", ds[i].name, name,
                    ds[i].stats.stats[k].value);
        }
    free(ds);
    const bool bad = ferror(b) != 0;
    if (fclose(b) != 0 || bad) {
        free(text);
        return NULL;
    }
    return text;
}
