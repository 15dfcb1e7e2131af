/* fetcher/serve.c - the fetcher daemon's service: control socket, pool fd, start and stop. */
#include "fetcher.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "devpool.h"
#include "link.h"
#include "proto.h"

#define SERVE_POLL_MS  200 /* pool socket waits: how soon stop shows */
#define SERVE_PATH_MAX 1024u

struct fetcher_server {
    struct fetcher_serve_opts o;           /* as given; strings point at the copies below */
    char                     *run_dir;     /* owned */
    char                     *model_path;  /* owned: as given */
    struct common_gguf       *g;           /* owned */
    struct common_model       m;           /* parsed from g */
    bool                      m_init;      /* m needs common_model_fini */
    struct fetcher           *f;           /* owned */
    uint32_t                  shard;       /* this fetcher's index */
    uint32_t                  n_shards;    /* fetchers in all */
    uint32_t                  first;       /* first expert of this shard */
    uint32_t                  n_exp;       /* experts of this shard */
    uint32_t                  first_layer; /* first layer of this shard */
    uint32_t                  n_layers;    /* layers of this shard */
    struct proto_shard        shards[PROTO_MAX_SHARDS]; /* every fetcher's, for HELLO */
    uint32_t                  n_layer;                  /* of the model */
    uint32_t                  n_expert;                 /* of the model */
    uint32_t                  n_slots;                  /* pool slots of this shard */
    bool           stages; /* the device pool's misses are read from storage (--vram-fill) */
    uint32_t       plan_n_seq, plan_n_ctx; /* contexts the --ram-budget plan holds (0 = no plan) */
    uint32_t       device_layers_seen;   /* the fewest device layers an executor told (under mu) */
    uint64_t       instance;             /* random id, the pool fd's tag */
    const uint8_t *pool_base;            /* borrowed: the fetcher's pool mapping */
    uint64_t       pool_bytes;           /* its length */
    char           name[PROTO_MAX_NAME]; /* "fetcher-I" */
    char           pool_path[SERVE_PATH_MAX]; /* RUN_DIR/fetcher-I.pool */
    char           dev_path[SERVE_PATH_MAX];  /* RUN_DIR/fetcher-I.dev (--vram-budget) */
    /* owned, with --vram-budget: pool k on proto_devpool_path's socket k (--device-pools) */
    struct fetcher_devpool     *devpool[PROTO_DEVPOOL_MAX_POOLS];
    uint32_t                    n_devpools;
    struct fetcher_devpool_pin  pin;          /* the RAM pool's registration, shared by them */
    struct proto_service       *svc;          /* owned: control socket, pid file */
    int                         pool_listen;  /* owned: -1 when not listening */
    pthread_t                   pool_thread;  /* hands the pool fd */
    bool                        pool_started; /* pool_thread runs */
    struct fetcher_link_host    host;         /* what the links borrow; filled once f exists */
    pthread_mutex_t             attach_mu;    /* one ATTACH at a time */
    pthread_mutex_t             mu;           /* guards everything below and the links' pins */
    bool                        sync_init;    /* mu and attach_mu initialised */
    struct fetcher_link        *link;         /* shared: the current link (one ref), NULL */
    bool                        stopping;     /* fetcher_serve_stop() began */
    bool                        draining;     /* no new ATTACH */
    struct fetcher_serve_counts c;            /* data-plane counters (the links write them) */
    _Atomic bool                stop_flag;    /* mirrors `stopping` for threads that poll */
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* Experts of shard i of n over E experts: [i*E/n, (i+1)*E/n). */
static void serve_shard_range(uint32_t i, uint32_t n, uint32_t n_expert, uint32_t *first,
                              uint32_t *count)
{
    uint32_t a = (uint32_t)((uint64_t)i * n_expert / n);
    uint32_t b = (uint32_t)((uint64_t)(i + 1) * n_expert / n);
    *first = a;
    *count = b - a;
}

/* The directory of the real path of file k of the model (a symlink beside the first split
 * followed): where the file lives, one directory per device. */
static int serve_file_dir(const struct common_gguf *g, uint32_t k, char *dir, size_t len)
{
    char real[PATH_MAX];
    if (!realpath(common_gguf_split_path(g, k), real))
        return COMMON_EIO;
    char *slash = strrchr(real, '/');
    if (slash)
        *slash = '\0';
    return snprintf(dir, len, "%s", slash && real[0] ? real : "/") < (int)len ? COMMON_OK
                                                                              : COMMON_EINVAL;
}

/* --shard-by file: fetcher i serves the experts whose gate part lies in a file of the i-th
 * directory of the model's files (in the order their experts come, layer by layer), so that
 * each fetcher reads one device. Each directory's experts must be a rectangle of layers and
 * experts (GGUF splits: a range of layers, every expert; QSF bundle files of convert --shards:
 * every layer, a range of experts). Fills s->shards. */
static int serve_file_shards(struct fetcher_server *s, uint32_t n_shards, struct common_errmsg *e)
{
    const uint32_t n_files = common_gguf_n_splits(s->g), L = s->n_layer, E = s->n_expert;
    char(*dirs)[PATH_MAX] = calloc(n_files ? n_files : 1, sizeof(*dirs));
    int32_t *group = malloc((size_t)(n_files ? n_files : 1) * sizeof(*group));
    int32_t *cell = malloc((size_t)L * E * sizeof(*cell)); /* (layer, expert) -> group, -1 */
    uint32_t n_groups = 0;
    int      rc = dirs && group && cell ? COMMON_OK : COMMON_ENOMEM;
    for (uint32_t k = 0; rc == COMMON_OK && k < n_files; k++) {
        group[k] = -1;
        if (serve_file_dir(s->g, k, dirs[k], sizeof(dirs[k])) != COMMON_OK)
            rc = common_errmsg_set(e, COMMON_EIO, "--shard-by file: %s: cannot resolve its path",
                                   common_gguf_split_path(s->g, k));
    }
    for (uint32_t l = 0; rc == COMMON_OK && l < L; l++)
        for (uint32_t x = 0; x < E; x++) {
            struct common_span sp;
            cell[(size_t)l * E + x] = -1;
            if (common_model_expert_span(&s->m, l, x, COMMON_EXPERT_GATE, &sp) != COMMON_OK ||
                sp.split >= n_files)
                continue;              /* a dense layer */
            if (group[sp.split] < 0) { /* a directory seen before, or the next one */
                uint32_t gi = 0;
                for (uint32_t k = 0; k < n_files; k++)
                    if (group[k] >= 0 && strcmp(dirs[k], dirs[sp.split]) == 0)
                        gi = (uint32_t)group[k] + 1;
                group[sp.split] = gi ? (int32_t)gi - 1 : (int32_t)n_groups++;
            }
            cell[(size_t)l * E + x] = group[sp.split];
        }
    if (rc == COMMON_OK && n_groups != n_shards)
        rc = common_errmsg_set(e, COMMON_EINVAL,
                               "--shard-by file: the model's experts lie in %u director%s, for %u "
                               "fetchers: run one fetcher per directory (device)",
                               n_groups, n_groups == 1 ? "y" : "ies", n_shards);
    for (uint32_t gi = 0; rc == COMMON_OK && gi < n_groups; gi++) {
        uint32_t l0 = L, l1 = 0, x0 = E, x1 = 0; /* its bounding box */
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t x = 0; x < E; x++)
                if (cell[(size_t)l * E + x] == (int32_t)gi) {
                    l0 = l < l0 ? l : l0;
                    l1 = l + 1 > l1 ? l + 1 : l1;
                    x0 = x < x0 ? x : x0;
                    x1 = x + 1 > x1 ? x + 1 : x1;
                }
        for (uint32_t l = l0; l < l1 && rc == COMMON_OK; l++)
            for (uint32_t x = x0; x < x1 && rc == COMMON_OK; x++)
                if (cell[(size_t)l * E + x] != (int32_t)gi && cell[(size_t)l * E + x] >= 0)
                    rc = common_errmsg_set(
                        e, COMMON_EINVAL,
                        "--shard-by file: the experts in directory %u (layers %u..%u, experts "
                        "%u..%u) are not a range of layers or of experts: shard by expert",
                        gi, l0, l1 - 1, x0, x1 - 1);
        s->shards[gi] = (struct proto_shard){.fetcher = gi,
                                             .first_expert = x0,
                                             .n_experts = x1 - x0,
                                             .first_layer = l0,
                                             .n_layers = l1 - l0};
    }
    free(dirs);
    free(group);
    free(cell);
    return rc == COMMON_ENOMEM ? common_errmsg_set(e, rc, "fetcher: out of memory") : rc;
}

/* --shard-by layer: shard i every expert of a range of layers, even, or in --layer-split's
 * shares (common_shares_starts, as the executor splits its layers over devices). */
static int serve_layer_shards(struct fetcher_server *s, const struct fetcher_serve_opts *o,
                              uint32_t n_shards, struct common_errmsg *e)
{
    if (o->n_layer_split && o->n_layer_split != n_shards)
        return common_errmsg_set(e, COMMON_EINVAL, "--layer-split gives %u shares for %u fetchers",
                                 o->n_layer_split, n_shards);
    double   share[PROTO_MAX_SHARDS];
    uint32_t start[PROTO_MAX_SHARDS + 1];
    for (uint32_t i = 0; i < o->n_layer_split; i++)
        share[i] = (double)o->layer_split[i];
    if (o->n_layer_split) /* as the executor splits its layers over devices */
        common_shares_starts(share, n_shards, s->n_layer, start);
    for (uint32_t i = 0; i < n_shards; i++) {
        s->shards[i] =
            (struct proto_shard){.fetcher = i, .first_expert = 0, .n_experts = s->n_expert};
        if (!o->n_layer_split) {
            serve_shard_range(i, n_shards, s->n_layer, &s->shards[i].first_layer,
                              &s->shards[i].n_layers);
            continue;
        }
        s->shards[i].first_layer = start[i];
        s->shards[i].n_layers = start[i + 1] - start[i];
        if (s->shards[i].n_layers == 0)
            return common_errmsg_set(e, COMMON_EINVAL,
                                     "--layer-split leaves fetcher %u no layer of %u: give it a "
                                     "larger share, or run fewer fetchers",
                                     i, s->n_layer);
    }
    return COMMON_OK;
}

static int serve_path(char *buf, size_t len, const char *dir, const char *name, uint32_t i,
                      const char *suffix)
{
    int n = snprintf(buf, len, "%s/%s-%u%s", dir, name, i, suffix);
    return n > 0 && (size_t)n < len ? COMMON_OK : COMMON_EINVAL;
}

/* The device pools a fetcher serves (--device-pools). */
static uint64_t serve_device_pools(const struct fetcher_serve_opts *o)
{
    return o->device_pools ? o->device_pools : 1;
}

/* A device record of the link's ring: its device pool's, counted as bad without one. */
static void serve_dev_record(void *arg, const struct proto_fetch_req *r)
{
    struct fetcher_server *s = arg;
    struct fetcher_devpool *d = r->prio < s->n_devpools ? s->devpool[r->prio] : NULL;
    if (!d || fetcher_devpool_record(d, r) != COMMON_OK) {
        pthread_mutex_lock(&s->mu);
        s->c.bad_records++;
        pthread_mutex_unlock(&s->mu);
    }
}

/* ---- pool descriptor socket --------------------------------------------------------------- */

static void *pool_thread(void *arg)
{
    struct fetcher_server *s = arg;
    int                    fd = fetcher_get_pool_fd(s->f);
    while (!atomic_load_explicit(&s->stop_flag, memory_order_relaxed)) {
        int conn = -1;
        int rc = common_unix_accept(s->pool_listen, SERVE_POLL_MS, &conn);
        if (rc == COMMON_ETIMEDOUT)
            continue;
        if (rc != COMMON_OK) {
            usleep(10000);
            continue;
        }
        rc = common_fd_send(conn, fd, s->instance);
        close(conn);
        pthread_mutex_lock(&s->mu);
        if (rc == COMMON_OK)
            s->c.pool_fds_sent++;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---- control messages --------------------------------------------------------------------- */

static double ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

static void ctl_stats(void *arg, struct proto_stats_reply *st)
{
    struct fetcher_server      *s = arg;
    struct fetcher_pool_counts  pc;
    struct fetcher_trace_totals t;
    struct fetcher_serve_counts c;
    fetcher_get_pool_counts(s->f, &pc);
    fetcher_trace_totals(fetcher_get_trace(s->f), &t);
    fetcher_serve_counts(s, &c);
    proto_stats_add(st, "shard.index", s->shard);
    proto_stats_add(st, "shard.count", s->n_shards);
    proto_stats_add(st, "shard.first_expert", s->first);
    proto_stats_add(st, "shard.n_experts", s->n_exp);
    proto_stats_add(st, "shard.first_layer", s->first_layer);
    proto_stats_add(st, "shard.n_layers", s->n_layers);
    proto_stats_add(st, "pool.slots", pc.n_slots);
    proto_stats_add(st, "pool.slot_bytes", (double)pc.slot_bytes);
    proto_stats_add(st, "pool.free", pc.n_free);
    proto_stats_add(st, "pool.loading", pc.n_loading);
    proto_stats_add(st, "pool.ready", pc.n_ready);
    proto_stats_add(st, "pool.failed", pc.n_failed);
    proto_stats_add(st, "pool.pinned", pc.n_pinned);
    proto_stats_add(st, "pool.retired", pc.n_retired);
    proto_stats_add(st, "trace.accesses", (double)t.accesses);
    proto_stats_add(st, "trace.hits", (double)t.hits);
    proto_stats_add(st, "trace.misses", (double)t.misses);
    proto_stats_add(st, "trace.prefetch_hits", (double)t.prefetch_hits);
    proto_stats_add(st, "trace.hit_rate", ratio(t.hits, t.accesses));
    proto_stats_add(st, "trace.prefetch_issued", (double)t.prefetch_issued);
    proto_stats_add(st, "trace.prefetch_wasted", (double)t.prefetch_wasted);
    proto_stats_add(st, "trace.prefetch_dropped", (double)t.prefetch_dropped);
    proto_stats_add(st, "trace.loads", (double)t.loads);
    proto_stats_add(st, "trace.load_errors", (double)t.load_errors);
    proto_stats_add(st, "trace.bytes_read", (double)t.bytes_read);
    proto_stats_add(st, "trace.evictions", (double)t.evictions);
    proto_stats_add(st, "trace.tokens", (double)t.tokens);
    proto_stats_add(st, "trace.faults", (double)t.faults);
    proto_stats_add(st, "trace.belady_accesses", (double)t.belady_accesses);
    proto_stats_add(st, "trace.belady_hits", (double)t.belady_hits);
    proto_stats_add(st, "trace.belady_hit_rate", ratio(t.belady_hits, t.belady_accesses));
    proto_stats_add(st, "serve.acquires", (double)c.acquires);
    proto_stats_add(st, "serve.acquire_errors", (double)c.acquire_errors);
    proto_stats_add(st, "serve.releases", (double)c.releases);
    proto_stats_add(st, "serve.hints", (double)c.hints);
    proto_stats_add(st, "serve.uses", (double)c.uses);
    proto_stats_add(st, "serve.tokens", (double)c.tokens);
    proto_stats_add(st, "serve.bad_records", (double)c.bad_records);
    proto_stats_add(st, "serve.attaches", (double)c.attaches);
    proto_stats_add(st, "serve.links_dropped", (double)c.links_dropped);
    proto_stats_add(st, "serve.link_pins", (double)c.link_pins);
    proto_stats_add(st, "serve.pool_fds_sent", (double)c.pool_fds_sent);
    if (s->n_devpools) { /* the sums over the pools */
        struct fetcher_devpool_counts dc = {0};
        uint32_t                      open = 0;
        for (uint32_t k = 0; k < s->n_devpools; k++) {
            struct fetcher_devpool_counts q;
            fetcher_devpool_counts(s->devpool[k], &q);
            open += q.open;
            dc.pinned = dc.pinned || q.pinned;
#define DEVPOOL_ADD(f) dc.f += q.f;
            FETCHER_DEVPOOL_SUMS(DEVPOOL_ADD)
#undef DEVPOOL_ADD
            dc.copy_busy_ns = q.copy_busy_ns; /* the process's */
        }
        proto_stats_add(st, "devpool.pools", s->n_devpools);
        proto_stats_add(st, "devpool.open", open);
        proto_stats_add(st, "devpool.pinned", dc.pinned);
#define DEVPOOL_STAT(f) proto_stats_add(st, "devpool." #f, (double)dc.f);
        FETCHER_DEVPOOL_SUMS(DEVPOOL_STAT)
#undef DEVPOOL_STAT
        proto_stats_add(st, "devpool.copy_busy_ms", (double)dc.copy_busy_ns / 1e6);
        proto_stats_add(st, "devpool.stages", s->stages);
    }
}

static void ctl_health(void *arg, struct proto_health_reply *h)
{
    struct fetcher_server *s = arg;
    pthread_mutex_lock(&s->mu);
    const struct fetcher_link *l = s->link;
    bool                       live = l && fetcher_link_is_live(l);
    uint32_t                   pid = l ? fetcher_link_pid(l) : 0;
    pthread_mutex_unlock(&s->mu);
    if (live)
        snprintf(h->message, sizeof(h->message),
                 "shard %u/%u experts [%u,%u) layers [%u,%u) pool %u slots; executor pid %u "
                 "attached",
                 s->shard, s->n_shards, s->first, s->first + s->n_exp, s->first_layer,
                 s->first_layer + s->n_layers, s->n_slots, pid);
    else
        snprintf(h->message, sizeof(h->message),
                 "shard %u/%u experts [%u,%u) layers [%u,%u) pool %u slots; no executor "
                 "attached",
                 s->shard, s->n_shards, s->first, s->first + s->n_exp, s->first_layer,
                 s->first_layer + s->n_layers, s->n_slots);
    /* Serving from a file that shrank fails every read past its new end: not READY. */
    struct common_errmsg e = {{0}};
    if (common_gguf_check_files(s->g, &e) != COMMON_OK) {
        h->state = PROTO_HEALTH_DEGRADED;
        snprintf(h->message, sizeof(h->message), "%.*s", (int)sizeof(h->message) - 1, e.text);
    }
}

static void ctl_hello(void *arg, struct proto_hello *h)
{
    struct fetcher_server *s = arg;
    h->n_shards = s->n_shards;
    for (uint32_t i = 0; i < s->n_shards; i++)
        h->shards[i] = s->shards[i];
}

static void ctl_drain(void *arg)
{
    struct fetcher_server *s = arg;
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
}

static int ctl_attach(struct fetcher_server *s, const struct proto_attach *a, struct proto_msg *rep)
{
    if (a->role != PROTO_ROLE_EXECUTOR)
        return proto_reply_error(rep, COMMON_EINVAL,
                                 "attach: only an executor attaches to a fetcher");
    if (a->n_segments < 2)
        return proto_reply_error(rep, COMMON_EINVAL, "attach: needs 2 segments (req, rep), got %u",
                                 a->n_segments);
    /* One budget for all daemons: an executor with bigger contexts than the plan would take
     * memory the pool was given. */
    if (s->plan_n_seq && a->params[1] &&
        (a->params[1] > s->plan_n_seq || a->params[2] > s->plan_n_ctx))
        return proto_reply_error(
            rep, COMMON_ERANGE,
            "the executor holds %u sequences of %u positions but this fetcher's "
            "--ram-budget plan counted %u of %u; give every daemon the same --parallel and -c",
            a->params[1], a->params[2], s->plan_n_seq, s->plan_n_ctx);
    struct fetcher_link *l = NULL;
    struct common_errmsg e = {{0}};
    int                  rc = fetcher_link_create(&s->host, a, &l, &e);
    if (rc != COMMON_OK)
        return proto_reply_error(rep, rc, "%s", e.text);

    pthread_mutex_lock(&s->attach_mu);
    pthread_mutex_lock(&s->mu);
    bool refuse = s->stopping || s->draining;
    pthread_mutex_unlock(&s->mu);
    if (refuse) {
        rc = proto_reply_error(rep, COMMON_EBUSY, "attach: fetcher is draining");
        goto out_drop;
    }
    if (fetcher_link_start(l) != COMMON_OK) {
        rc = proto_reply_error(rep, COMMON_EAGAIN, "attach: cannot start the ring thread");
        goto out_drop;
    }
    pthread_mutex_lock(&s->mu);
    struct fetcher_link *old = s->link;
    s->link = l;
    s->c.attaches++;
    pthread_mutex_unlock(&s->mu);
    fetcher_link_drop(old); /* releases every loan the old link held */
    pthread_mutex_unlock(&s->attach_mu);
    COMMON_LOG_INFO("fetcher.serve", "executor pid=%u attached ring=%u slots%s", a->pid,
                    a->params[0], old ? " (replaced the previous link)" : "");
    rep->kind = PROTO_KIND_OK;
    return COMMON_OK;

out_drop:
    pthread_mutex_unlock(&s->attach_mu);
    fetcher_link_drop(l);
    return rc;
}

static int ctl_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct fetcher_server *s = arg;
    if (req->kind == PROTO_KIND_ATTACH)
        return ctl_attach(s, &req->u.attach, rep);
    if (req->kind == PROTO_KIND_EXPERT_ERROR) {
        /* the reason of the last failed load of the expert, as in one process */
        struct common_errmsg why = {{0}};
        if (s->f)
            fetcher_expert_error(s->f, req->u.expert_error.layer, req->u.expert_error.expert, &why);
        if (!why.text[0]) {
            rep->kind = PROTO_KIND_OK;
            return COMMON_OK;
        }
        return proto_reply_error(rep, COMMON_EIO, "%s", why.text);
    }
    return proto_reply_error(rep, COMMON_EPROTO, "a fetcher does not serve '%s'",
                             proto_kind_name(req->kind));
}

/* The fetcher's part of the daemon skeleton. */
static const struct proto_service_ops g_fetcher_ops = {
    .hello = ctl_hello,
    .health = ctl_health,
    .stats = ctl_stats,
    .drain = ctl_drain,
    .handle = ctl_handler,
};

/* ---- start and stop ----------------------------------------------------------------------- */

static int serve_open_model(struct fetcher_server *s, struct common_errmsg *e)
{
    int rc = common_gguf_open(s->model_path, NULL, &s->g, e);
    if (rc != COMMON_OK)
        return rc;
    rc = common_model_init(&s->m, s->g, e);
    if (rc != COMMON_OK)
        return rc;
    s->m_init = true;
    /* A dense model: its FFNs are served, one expert per layer (the executor's --stream-dense). */
    if (!common_model_is_moe(&s->m))
        (void)common_model_stream_dense(&s->m);
    s->n_layer = s->m.hp.n_layer;
    s->n_expert = s->m.hp.n_expert;
    return COMMON_OK;
}

/* This shard's share of the --ram-budget plan in which the executor keeps the KV of its last
 * `device_layers` layers on a device (none of theirs in RAM): *n_slots, at least its share of the
 * plan's minimum. The plan goes to `plan_out` when not NULL. */
static int serve_plan_slots(struct fetcher_server *s, uint32_t device_layers, FILE *plan_out,
                            uint32_t *n_slots, struct common_errmsg *e)
{
    const struct fetcher_serve_opts *o = &s->o;
    /* The executor's contexts, sized by the same table it allocates from. */
    long                     ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t                 n_seq = o->n_seq ? o->n_seq : 4; /* the executor's default */
    struct common_ctx_layout lay;
    int                      lrc = common_ctx_layout_compute(
                             &s->m.hp,
                             &(struct common_ctx_layout_opts){
                                 .n_ctx = o->n_ctx,
                                 .n_threads = o->n_threads ? o->n_threads : (ncpu > 0 ? (uint32_t)ncpu : 1),
                                 .n_device_layers = device_layers,
                                 .cache_type = o->cache_type},
                             &lay, e);
    if (lrc != COMMON_OK)
        return lrc;
    uint64_t                 kv = lay.kv_bytes * n_seq;
    uint64_t act = (lay.scratch_bytes + lay.logits_bytes + o->device_scratch) * n_seq;
    struct fetcher_plan      plan = {0};
    /* every fetcher's staging, when they stage */
    const uint64_t stage_bytes = s->stages ? (uint64_t)s->n_shards * serve_device_pools(o) *
                                                 fetcher_devpool_staging_bytes(&s->m)
                                           : 0;
    struct fetcher_plan_opts po = {.ram_budget = o->ram_budget,
                                   .kv_bytes = kv,
                                   .act_bytes = act,
                                   .staging_bytes = stage_bytes,
                                   .queue_depth = o->queue_depth};
    /* A budget under the plan's minimum is COMMON_ERANGE with the plan filled in: *n_slots is
     * then the share of the minimum. */
    int rc = fetcher_plan_compute(&s->m, &po, &plan, e);
    if (rc != COMMON_OK && (rc != COMMON_ERANGE || plan.min_slots == 0))
        return rc;
    s->plan_n_seq = n_seq;
    s->plan_n_ctx = lay.n_ctx;
    uint32_t n = plan.n_slots / s->n_shards;
    uint32_t min = (plan.min_slots + s->n_shards - 1) / s->n_shards;
    *n_slots = n > min ? n : min;
    if (plan_out && rc == COMMON_OK) {
        char buf[2048];
        fetcher_plan_format(&plan, buf, sizeof(buf));
        fputs(buf, plan_out);
    }
    return rc;
}

/* This shard's pool slots: explicit, else its share of the plan for the whole budget (printed
 * to plan_out). */
static int serve_size_once(struct fetcher_server *s, FILE *plan_out, struct common_errmsg *e)
{
    const struct fetcher_serve_opts *o = &s->o;
    uint32_t                         shard_bundles = s->n_layers * s->n_exp;
    if (o->n_slots) {
        s->n_slots = o->n_slots;
    } else if (o->ram_budget) {
        int rc = serve_plan_slots(s, o->n_device_layers, plan_out, &s->n_slots, e);
        if (rc != COMMON_OK)
            return rc;
    } else {
        s->n_slots = shard_bundles;
    }
    if (s->n_slots > shard_bundles)
        s->n_slots = shard_bundles;
    if (s->n_slots == 0)
        s->n_slots = 1;
    return COMMON_OK;
}

/* The pool's size and, with --vram-budget and routed experts, whether the device pools' misses
 * come from storage (--vram-fill; auto: when the RAM pool is no bigger than this shard's share of
 * the device pools), the staging then in the plan. */
static int serve_size_pool(struct fetcher_server *s, struct common_errmsg *e)
{
    const struct fetcher_serve_opts *o = &s->o;
    /* (a dense model's streamed FFN has no device pool of experts to stage for) */
    const bool pool = o->vram_budget && !s->m.ffn_streamed;
    const bool auto_fill = pool && o->vram_fill == FETCHER_VRAM_FILL_AUTO;
    s->stages = pool && o->vram_fill == FETCHER_VRAM_FILL_STORAGE;
    int rc = serve_size_once(s, auto_fill ? NULL : o->plan_out, e);
    if (rc != COMMON_OK || !auto_fill)
        return rc;
    s->stages = (uint64_t)s->n_slots * fetcher_plan_slot_bytes(&s->m) <=
                serve_device_pools(o) * (o->vram_budget / s->n_shards);
    return serve_size_once(s, o->plan_out, e); /* with the staging */
}

/* DEVICE_LAYERS(n) from the executor: with fewer layers' KV on its device than the plan left out
 * of RAM (it dropped its device, or could not use it), their KV is in RAM now, so the pool
 * shrinks to the plan with n device layers, and the process stays within --ram-budget. A reader
 * thread's; takes s->mu. */
static void serve_device_layers(void *arg, uint32_t n)
{
    struct fetcher_server           *s = arg;
    const struct fetcher_serve_opts *o = &s->o;
    if (!o->ram_budget || o->n_slots || n >= o->n_device_layers)
        return; /* no plan, or one that counted this KV already */
    pthread_mutex_lock(&s->mu);
    if (n < s->device_layers_seen) {
        struct common_errmsg e = {{0}};
        uint32_t             keep = 0;
        int                  rc = serve_plan_slots(s, n, NULL, &keep, &e);
        if (rc == COMMON_OK || rc == COMMON_ERANGE) { /* ERANGE: the minimum is kept */
            if (keep > s->n_slots)
                keep = s->n_slots;
            const uint32_t retired = fetcher_shrink_pool(s->f, keep);
            char           b[32];
            COMMON_LOG_WARN(
                "fetcher",
                "the executor keeps the KV of %u layer(s) on its device, not the %u "
                "the plan left out of RAM: the pool gives up %u of its %u slots "
                "(%s) for their KV%s, to stay within --ram-budget%s",
                n, o->n_device_layers, s->n_slots - keep, s->n_slots,
                common_format_size((uint64_t)(s->n_slots - keep) * fetcher_plan_slot_bytes(&s->m),
                                   b, sizeof(b)),
                retired < s->n_slots - keep ? " (the pinned ones at the next tokens)" : "",
                rc == COMMON_ERANGE ? "; the budget is now under the plan's "
                                      "minimum, whose slots are kept"
                                    : "");
        } else {
            COMMON_LOG_WARN("fetcher",
                            "the executor keeps the KV of %u layer(s) on its device: "
                            "no plan for it: %s",
                            n, e.text);
        }
        s->device_layers_seen = n;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Creates the fetcher over this shard's pool, checks that the pool can be shared, prints the
 * shard's line to o->plan_out and fills what the links borrow. */
static int serve_open_fetcher(struct fetcher_server *s, struct common_errmsg *e)
{
    const struct fetcher_serve_opts *o = &s->o;

    struct fetcher_opts fo = {
        .n_slots = s->n_slots, .policy = o->policy, .io = o->io, .queue_depth = o->queue_depth};
    int rc = fetcher_create(s->g, &s->m, &fo, &s->f, e);
    if (rc != COMMON_OK)
        return rc;
    s->pool_base = fetcher_get_pool_base(s->f);
    s->pool_bytes = fetcher_get_pool_bytes(s->f);
    if (fetcher_get_pool_fd(s->f) < 0 || !s->pool_base)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "fetcher: the pool is not a memfd: cannot share");
    if (o->plan_out) {
        char sz[2][32], layers[48] = "each layer";
        if (s->n_layers < s->n_layer)
            snprintf(layers, sizeof(layers), "layers [%u,%u)", s->first_layer,
                     s->first_layer + s->n_layers);
        fprintf(o->plan_out,
                "shard %u/%u: experts [%u,%u) of %s, pool %u slots x %s = %s, io %s%s, "
                "policy %s\n",
                s->shard, s->n_shards, s->first, s->first + s->n_exp, layers, s->n_slots,
                common_format_size(fetcher_get_plan(s->f)->slot_bytes, sz[0], 32),
                common_format_size(fetcher_get_plan(s->f)->pool_bytes, sz[1], 32),
                fetcher_io_mode_name(fetcher_get_io_mode(s->f)),
                fetcher_is_direct(s->f) ? " (O_DIRECT)" : "", fetcher_policy_name(o->policy));
        /* The files of several (QSF bundle files, GGUF splits) this shard reads its experts
         * from: one each, one device per fetcher, when the conversion's --shards matches the
         * fetchers or with --shard-by file. */
        const bool qsf = common_gguf_is_qsf(s->g);
        for (uint32_t k = qsf ? 1 : 0;
             common_gguf_n_splits(s->g) > 1 && k < common_gguf_n_splits(s->g); k++) {
            bool reads = false;
            for (uint32_t l = s->first_layer; l < s->first_layer + s->n_layers && !reads; l++)
                for (uint32_t x = s->first; x < s->first + s->n_exp && !reads; x++) {
                    struct common_span sp;
                    reads = common_model_expert_span(&s->m, l, x, COMMON_EXPERT_GATE, &sp) ==
                                COMMON_OK &&
                            sp.split == k;
                }
            char real[PATH_MAX]; /* where it lives: a symlink followed */
            if (reads)
                fprintf(o->plan_out, "shard %u/%u reads %s %s\n", s->shard, s->n_shards,
                        qsf ? "bundle file" : "split file",
                        realpath(common_gguf_split_path(s->g, k), real)
                            ? real
                            : common_gguf_split_path(s->g, k));
        }
    }
    s->host = (struct fetcher_link_host){.f = s->f,
                                         .m = &s->m,
                                         .pool_base = s->pool_base,
                                         .pool_bytes = s->pool_bytes,
                                         .n_slots = s->n_slots,
                                         .n_layer = s->n_layer,
                                         .first = s->first,
                                         .n_exp = s->n_exp,
                                         .first_layer = s->first_layer,
                                         .n_layers = s->n_layers,
                                         .run_dir = s->run_dir,
                                         .mu = &s->mu,
                                         .c = &s->c,
                                         .device_layers = serve_device_layers,
                                         .device_layers_arg = s,
                                         .dev_record = serve_dev_record,
                                         .dev_record_arg = s};
    s->device_layers_seen = o->n_device_layers;
    return COMMON_OK;
}

int fetcher_serve_start(const struct fetcher_serve_opts *o, struct fetcher_server **out,
                        struct common_errmsg *e)
{
    if (!o || !o->model_path || !o->run_dir || !out)
        return common_errmsg_set(e, COMMON_EINVAL, "fetcher: model and run dir are required");
    uint32_t n_shards = o->n_shards ? o->n_shards : 1;
    if (o->shard >= n_shards || n_shards > PROTO_MAX_SHARDS)
        return common_errmsg_set(e, COMMON_EINVAL, "shard %u/%u: need 0 <= I < N <= %u", o->shard,
                                 n_shards, PROTO_MAX_SHARDS);
    if (o->io == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "--io mmap has no pool to share with the executor: use uring or "
                                 "pread");
    int rc = common_run_dir_prepare(o->run_dir, e);
    if (rc != COMMON_OK)
        return rc;

    struct fetcher_server *s = calloc(1, sizeof(*s));
    if (!s)
        return common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
    s->o = *o;
    s->pool_listen = -1;
    s->shard = o->shard;
    s->n_shards = n_shards;
    s->instance = common_random_id();
    snprintf(s->name, sizeof(s->name), "fetcher-%u", s->shard);
    s->run_dir = strdup(o->run_dir);
    s->model_path = strdup(o->model_path);
    if (!s->run_dir || !s->model_path) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: out of memory");
        goto out_stop;
    }
    s->o.model_path = s->model_path;
    s->o.run_dir = s->run_dir;
    if (serve_path(s->pool_path, sizeof(s->pool_path), s->run_dir, "fetcher", s->shard, ".pool")) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "run dir %s: path too long", s->run_dir);
        goto out_stop;
    }
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_mutex_init(&s->attach_mu, NULL) != 0 ||
        pthread_mutex_init(&s->pin.mu, NULL) != 0) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "fetcher: mutex init failed");
        goto out_stop;
    }
    s->sync_init = true;

    if ((rc = serve_open_model(s, e)) != COMMON_OK)
        goto out_stop;
    if (o->shard_by == 2 ? n_shards > s->n_layer : n_shards > s->n_expert) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "%u shards for %u %s: at most one per %s",
                               n_shards, o->shard_by == 2 ? s->n_layer : s->n_expert,
                               o->shard_by == 2 ? "layers" : "experts",
                               o->shard_by == 2 ? "layer" : "expert");
        goto out_stop;
    }
    if (o->shard_by == 1) {
        if ((rc = serve_file_shards(s, n_shards, e)) != COMMON_OK)
            goto out_stop;
    } else if (o->shard_by == 2) { /* every expert of a range of layers */
        if ((rc = serve_layer_shards(s, o, n_shards, e)) != COMMON_OK)
            goto out_stop;
    } else {
        for (uint32_t i = 0; i < n_shards; i++) {
            s->shards[i] = (struct proto_shard){.fetcher = i};
            serve_shard_range(i, n_shards, s->n_expert, &s->shards[i].first_expert,
                              &s->shards[i].n_experts);
        }
    }
    s->first = s->shards[s->shard].first_expert;
    s->n_exp = s->shards[s->shard].n_experts;
    s->first_layer = s->shards[s->shard].n_layers ? s->shards[s->shard].first_layer : 0;
    s->n_layers = s->shards[s->shard].n_layers ? s->shards[s->shard].n_layers : s->n_layer;
    if ((rc = serve_size_pool(s, e)) != COMMON_OK)
        goto out_stop;
    if ((rc = serve_open_fetcher(s, e)) != COMMON_OK)
        goto out_stop;
    rc = common_unix_listen(s->pool_path, &s->pool_listen);
    if (rc != COMMON_OK) {
        s->pool_listen = -1;
        rc = common_errmsg_set(e, rc, "%s: %s", s->pool_path,
                               rc == COMMON_EBUSY ? "another fetcher listens there"
                                                  : common_strerror(rc));
        goto out_stop;
    }
    if (pthread_create(&s->pool_thread, NULL, pool_thread, s) != 0) {
        rc = common_errmsg_set(e, COMMON_EAGAIN, "fetcher: cannot start the pool socket thread");
        goto out_stop;
    }
    s->pool_started = true;
    if (o->vram_budget) {
        const uint32_t n_pools = (uint32_t)serve_device_pools(o);
        if (n_pools > PROTO_DEVPOOL_MAX_POOLS) {
            rc = common_errmsg_set(e, COMMON_EINVAL, "--device-pools %u: at most %u", n_pools,
                                   PROTO_DEVPOOL_MAX_POOLS);
            goto out_stop;
        }
        for (uint32_t k = 0; k < n_pools; k++) {
            char path[SERVE_PATH_MAX];
            if (proto_devpool_path(k ? path : s->dev_path, SERVE_PATH_MAX, s->run_dir, s->shard,
                                   k) != COMMON_OK) {
                rc = common_errmsg_set(e, COMMON_EINVAL, "run dir path too long");
                goto out_stop;
            }
            const struct fetcher_devpool_opts dopts = {.path = k ? path : s->dev_path,
                                                       .budget = o->vram_budget,
                                                       .ram = s->pool_base,
                                                       .ram_bytes = s->pool_bytes,
                                                       .stage_from = s->stages ? s->f : NULL,
                                                       .pin = &s->pin,
                                                       .select = n_pools > 1};
            if ((rc = fetcher_devpool_start(&dopts, &s->devpool[k], e)) != COMMON_OK)
                goto out_stop;
            s->n_devpools = k + 1;
        }
        char vb[32], sb[32], more[64] = "";
        if (n_pools > 1)
            snprintf(more, sizeof(more), ", and as many for %u more devices (.dev1..)",
                     n_pools - 1);
        if (o->plan_out)
            fprintf(o->plan_out,
                    "device pool: up to %s of device memory (--vram-budget) for the executor's "
                    "experts, made when it asks (%s)%s; its misses %s (--vram-fill %s)\n",
                    common_format_size(o->vram_budget, vb, sizeof(vb)), s->dev_path, more,
                    s->stages ? "not in the RAM pool read from storage through pinned staging"
                              : "read into the RAM pool and copied from there",
                    fetcher_vram_fill_names[o->vram_fill]);
        if (o->plan_out && s->stages)
            fprintf(o->plan_out, "device staging: %u slots of %s%s\n", FETCHER_DEVPOOL_STAGE_SLOTS,
                    common_format_size(fetcher_plan_slot_bytes(&s->m), sb, sizeof(sb)),
                    n_pools > 1 ? " per device pool" : "");
    }
    struct proto_service_opts so = {.run_dir = s->run_dir,
                                    .name = s->name,
                                    .role = PROTO_ROLE_FETCHER,
                                    .model_path = s->model_path,
                                    .instance = s->instance,
                                    .no_pidfile = o->no_pidfile};
    if ((rc = proto_service_start(&so, &g_fetcher_ops, s, &s->svc, e)) != COMMON_OK)
        goto out_stop;
    COMMON_LOG_INFO("fetcher.serve", "%s ready pid=%d ctl=%s pool=%s", s->name, (int)getpid(),
                    proto_service_url(s->svc), s->pool_path);
    *out = s;
    return COMMON_OK;

out_stop:
    s->o.trace_out = NULL;
    s->o.summary_out = NULL;
    fetcher_serve_stop(s, NULL);
    return rc;
}

struct proto_service *fetcher_serve_service(struct fetcher_server *s)
{
    return s->svc;
}

int fetcher_serve_stop(struct fetcher_server *s, struct common_errmsg *e)
{
    int rc = COMMON_OK;
    if (!s)
        return rc;
    if (s->sync_init) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        s->draining = true;
        atomic_store_explicit(&s->stop_flag, true, memory_order_relaxed);
        pthread_mutex_unlock(&s->mu);
    }
    /* Control first: no ATTACH can install a link after this. */
    proto_service_stop(s->svc);
    s->svc = NULL;
    if (s->sync_init) {
        pthread_mutex_lock(&s->mu);
        struct fetcher_link *l = s->link;
        s->link = NULL;
        pthread_mutex_unlock(&s->mu);
        fetcher_link_drop(l); /* ACQUIREs still waiting are answered by fetcher_destroy() */
    }
    for (uint32_t k = 0; k < s->n_devpools; k++) /* after the link: no record reaches them */
        fetcher_devpool_stop(s->devpool[k]);
    if (s->n_devpools)
        fetcher_devpool_unpin(&s->pin, s->pool_base);
    s->n_devpools = 0;
    if (s->pool_started)
        pthread_join(s->pool_thread, NULL);
    s->pool_started = false;
    if (s->pool_listen >= 0) {
        close(s->pool_listen);
        unlink(s->pool_path);
    }
    if (s->f) {
        struct fetcher_trace *t = fetcher_get_trace(s->f);
        if (s->o.trace_out) {
            FILE *f = fopen(s->o.trace_out, "w");
            int   wrc = f ? fetcher_trace_write_json(t, f) : COMMON_EIO;
            if (f && fclose(f) != 0)
                wrc = COMMON_EIO;
            if (wrc != COMMON_OK)
                rc = common_errmsg_set(e, COMMON_EIO, "trace %s: cannot write", s->o.trace_out);
        }
        if (s->o.summary_out)
            fetcher_trace_write_summary(t, s->o.summary_out);
    }
    fetcher_destroy(s->f);
    if (s->m_init)
        common_model_fini(&s->m);
    common_gguf_close(s->g);
    if (s->sync_init) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->attach_mu);
        pthread_mutex_destroy(&s->pin.mu);
    }
    free(s->run_dir);
    free(s->model_path);
    free(s);
    return rc;
}

struct fetcher *fetcher_serve_fetcher(struct fetcher_server *s)
{
    return s->f;
}

void fetcher_serve_shard(const struct fetcher_server *s, uint32_t *first, uint32_t *n)
{
    *first = s->first;
    *n = s->n_exp;
}

void fetcher_serve_counts(struct fetcher_server *s, struct fetcher_serve_counts *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->c;
    out->link_pins = s->link ? fetcher_link_pins(s->link) : 0;
    pthread_mutex_unlock(&s->mu);
}
