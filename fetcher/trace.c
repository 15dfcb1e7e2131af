/* fetcher/trace.c - expert-usage tracing: counters, faults per token, Belady, JSON export. */
#include "fetcher.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct trace_cell {
    uint64_t activations;                    /* accesses (first use of the bundle in a token) */
    uint64_t hits;                           /* served from the pool (prefetch hits included) */
    uint64_t misses;                         /* faults */
    uint64_t prefetch_hits;                  /* first use of a prefetched bundle */
    uint64_t prefetch_issued;                /* prefetch hints that started a load */
    uint64_t prefetch_wasted;                /* prefetched, evicted unused */
    uint64_t prefetch_dropped;               /* hints dropped before reading */
    uint64_t loads;                          /* completed loads */
    uint64_t load_errors;                    /* failed loads */
    uint64_t bytes_read;                     /* bytes read from storage */
    uint64_t evictions;                      /* times the bundle left the pool */
    uint64_t last_token;                     /* token of the last access; 0 = never */
    uint32_t lat[FETCHER_TRACE_LAT_BUCKETS]; /* load latency histogram, log2 microseconds */
};

struct fetcher_trace {
    struct fetcher_trace_opts opts;
    pthread_mutex_t           mu;       /* guards everything below */
    struct trace_cell        *cells;    /* owned: n_layer * n_expert */
    int64_t                  *resident; /* owned: n_layer current resident bundles */
    int64_t                  *peak;     /* owned: n_layer peak of resident */
    uint32_t                  lat_all[FETCHER_TRACE_LAT_BUCKETS];
    uint64_t                  tokens;     /* tokens begun */
    uint64_t                  cur_faults; /* faults of the open token */
    uint64_t                  faults, max_faults;
    uint64_t                  steady_faults, steady_max_faults;
    uint32_t                 *log; /* owned: access keys (layer * n_expert + expert) */
    uint64_t                  n_log;
    bool                      truncated; /* accesses beyond max_accesses were not logged */
    uint64_t                  reuse[FETCHER_TRACE_REUSE_BUCKETS]; /* see fetcher_trace_totals */
    uint64_t                  first_uses;
    struct trace_pred {
        char     name[24];                   /* "" = unused entry */
        uint64_t predicted, correct, actual; /* as given to fetcher_trace_predictor */
    } preds[FETCHER_TRACE_MAX_PREDICTORS];
};

int fetcher_trace_create(const struct fetcher_trace_opts *o, struct fetcher_trace **out)
{
    if (!o || o->n_layer == 0 || o->n_expert == 0)
        return COMMON_EINVAL;
    struct fetcher_trace *t = calloc(1, sizeof(*t));
    if (!t)
        return COMMON_ENOMEM;
    t->opts = *o;
    if (t->opts.warmup_tokens == 0)
        t->opts.warmup_tokens = 8;
    if (t->opts.max_accesses == 0)
        t->opts.max_accesses = UINT64_C(4) << 20;
    uint64_t n_cells = (uint64_t)o->n_layer * o->n_expert;
    t->cells = calloc(n_cells, sizeof(*t->cells));
    t->resident = calloc(o->n_layer, sizeof(*t->resident));
    t->peak = calloc(o->n_layer, sizeof(*t->peak));
    if (!t->cells || !t->resident || !t->peak || pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t->cells);
        free(t->resident);
        free(t->peak);
        free(t);
        return COMMON_ENOMEM;
    }
    *out = t;
    return COMMON_OK;
}

void fetcher_trace_destroy(struct fetcher_trace *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->cells);
    free(t->resident);
    free(t->peak);
    free(t->log);
    free(t);
}

static struct trace_cell *trace_cell(struct fetcher_trace *t, uint32_t layer, uint32_t expert)
{
    if (layer >= t->opts.n_layer || expert >= t->opts.n_expert)
        return NULL;
    return &t->cells[(uint64_t)layer * t->opts.n_expert + expert];
}

/* Closes the open token's fault count into the totals (under mu). */
static void trace_close_token(struct fetcher_trace *t)
{
    if (t->tokens == 0)
        return;
    t->faults += t->cur_faults;
    if (t->cur_faults > t->max_faults)
        t->max_faults = t->cur_faults;
    if (t->tokens > t->opts.warmup_tokens) {
        t->steady_faults += t->cur_faults;
        if (t->cur_faults > t->steady_max_faults)
            t->steady_max_faults = t->cur_faults;
    }
    t->cur_faults = 0;
}

void fetcher_trace_token(struct fetcher_trace *t)
{
    pthread_mutex_lock(&t->mu);
    trace_close_token(t);
    t->tokens++;
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_access(struct fetcher_trace *t, uint32_t layer, uint32_t expert,
                          enum fetcher_trace_outcome outcome)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c) {
        if (t->tokens == 0)
            t->tokens = 1; /* accesses before any mark belong to a first token */
        c->activations++;
        if (c->last_token == 0) {
            t->first_uses++;
        } else {
            /* 1 token -> bucket 0, [2^i, 2^(i+1)) -> i; a second use in one token counts as 1 */
            const uint64_t d = t->tokens > c->last_token ? t->tokens - c->last_token : 1;
            uint32_t       b = 0;
            while (b + 1 < FETCHER_TRACE_REUSE_BUCKETS && (d >> (b + 1)) != 0)
                b++;
            t->reuse[b]++;
        }
        c->last_token = t->tokens;
        if (outcome == FETCHER_TRACE_MISS) {
            c->misses++;
            t->cur_faults++;
        } else {
            c->hits++;
            if (outcome == FETCHER_TRACE_PREFETCH_HIT)
                c->prefetch_hits++;
        }
        if (t->n_log < t->opts.max_accesses) {
            if (!t->log) {
                uint64_t cap = t->opts.max_accesses;
                t->log = malloc(cap * sizeof(*t->log));
            }
            if (t->log)
                t->log[t->n_log++] = layer * t->opts.n_expert + expert;
            else
                t->truncated = true;
        } else {
            t->truncated = true;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

static uint32_t trace_lat_bucket(uint64_t ns)
{
    uint64_t us = ns / 1000;
    uint32_t b = 0;
    while (us > 1 && b + 1 < FETCHER_TRACE_LAT_BUCKETS) {
        us >>= 1;
        b++;
    }
    return b;
}

void fetcher_trace_load(struct fetcher_trace *t, uint32_t layer, uint32_t expert, uint64_t bytes,
                        uint64_t latency_ns)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c) {
        uint32_t b = trace_lat_bucket(latency_ns);
        c->loads++;
        c->bytes_read += bytes;
        c->lat[b]++;
        t->lat_all[b]++;
    }
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_load_error(struct fetcher_trace *t, uint32_t layer, uint32_t expert)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c)
        c->load_errors++;
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_prefetch(struct fetcher_trace *t, uint32_t layer, uint32_t expert)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c)
        c->prefetch_issued++;
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_prefetch_dropped(struct fetcher_trace *t, uint32_t layer, uint32_t expert)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c)
        c->prefetch_dropped++;
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_evict(struct fetcher_trace *t, uint32_t layer, uint32_t expert,
                         bool unused_prefetch)
{
    pthread_mutex_lock(&t->mu);
    struct trace_cell *c = trace_cell(t, layer, expert);
    if (c) {
        c->evictions++;
        if (unused_prefetch)
            c->prefetch_wasted++;
    }
    pthread_mutex_unlock(&t->mu);
}

void fetcher_trace_resident(struct fetcher_trace *t, uint32_t layer, int delta)
{
    pthread_mutex_lock(&t->mu);
    if (layer < t->opts.n_layer) {
        t->resident[layer] += delta;
        if (t->resident[layer] > t->peak[layer])
            t->peak[layer] = t->resident[layer];
    }
    pthread_mutex_unlock(&t->mu);
}

/* ---- Belady ------------------------------------------------------------------------------- */

struct belady_ent {
    uint32_t key;
    uint8_t  used;   /* hash slot taken */
    uint8_t  cached; /* key is in the simulated cache */
    uint64_t next;   /* next use index of the cached key (or scratch during the backward pass) */
};

struct belady_heap_ent {
    uint64_t next;
    uint32_t key;
};

static struct belady_ent *belady_find(struct belady_ent *h, uint64_t mask, uint32_t key)
{
    uint64_t i = ((uint64_t)key * UINT64_C(0x9e3779b97f4a7c15)) >> 20 & mask;
    while (h[i].used && h[i].key != key)
        i = (i + 1) & mask;
    if (!h[i].used) {
        h[i].used = 1;
        h[i].key = key;
        h[i].next = UINT64_MAX;
    }
    return &h[i];
}

static void belady_push(struct belady_heap_ent *hp, uint64_t *n, struct belady_heap_ent v)
{
    uint64_t i = (*n)++;
    while (i > 0) {
        uint64_t parent = (i - 1) / 2;
        if (hp[parent].next >= v.next)
            break;
        hp[i] = hp[parent];
        i = parent;
    }
    hp[i] = v;
}

static struct belady_heap_ent belady_pop(struct belady_heap_ent *hp, uint64_t *n)
{
    struct belady_heap_ent top = hp[0];
    struct belady_heap_ent last = hp[--(*n)];
    uint64_t               i = 0;
    for (;;) {
        uint64_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && hp[c + 1].next > hp[c].next)
            c++;
        if (hp[c].next <= last.next)
            break;
        hp[i] = hp[c];
        i = c;
    }
    if (*n > 0)
        hp[i] = last;
    return top;
}

int64_t fetcher_trace_belady_hits(const uint32_t *keys, size_t n, uint32_t n_slots)
{
    if (n == 0 || n_slots == 0)
        return 0;
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n)
        cap <<= 1;
    struct belady_ent      *h = calloc(cap, sizeof(*h));
    uint64_t               *next = malloc(n * sizeof(*next));
    struct belady_heap_ent *hp = malloc(n * sizeof(*hp));
    int64_t                 hits = 0;
    if (!h || !next || !hp) {
        hits = COMMON_ENOMEM;
        goto out_free;
    }
    /* Backward pass: next[i] = index of the next access to keys[i], UINT64_MAX if none. */
    for (size_t i = n; i-- > 0;) {
        struct belady_ent *e = belady_find(h, cap - 1, keys[i]);
        next[i] = e->next;
        e->next = i;
    }
    for (uint64_t i = 0; i < cap; i++)
        h[i].next = UINT64_MAX;
    uint64_t n_heap = 0, n_cached = 0;
    for (size_t i = 0; i < n; i++) {
        struct belady_ent *e = belady_find(h, cap - 1, keys[i]);
        if (e->cached) {
            hits++;
        } else {
            /* Demand paging: the missed key must come in; evict the farthest-used one. */
            while (n_cached >= n_slots) {
                struct belady_heap_ent v = belady_pop(hp, &n_heap);
                struct belady_ent     *x = belady_find(h, cap - 1, v.key);
                if (x->cached && x->next == v.next) {
                    x->cached = 0;
                    n_cached--;
                }
            }
            e->cached = 1;
            n_cached++;
        }
        e->next = next[i];
        belady_push(hp, &n_heap, (struct belady_heap_ent){.next = next[i], .key = keys[i]});
    }
out_free:
    free(h);
    free(next);
    free(hp);
    return hits;
}

/* ---- export ------------------------------------------------------------------------------- */

/* Snapshot under mu: totals with the open token closed into a copy. */
/* Entropy of layer l's access counts over log2(n_expert); -1 when it had no accesses. */
static double trace_layer_entropy(const struct fetcher_trace *t, uint32_t l)
{
    const struct trace_cell *c = &t->cells[(uint64_t)l * t->opts.n_expert];
    uint64_t                 n = 0;
    for (uint32_t x = 0; x < t->opts.n_expert; x++)
        n += c[x].activations;
    if (n == 0)
        return -1.0;
    if (t->opts.n_expert < 2)
        return 1.0;
    double h = 0.0;
    for (uint32_t x = 0; x < t->opts.n_expert; x++)
        if (c[x].activations) {
            const double p = (double)c[x].activations / (double)n;
            h -= p * log2(p);
        }
    return h / log2((double)t->opts.n_expert);
}

static void trace_totals_locked(const struct fetcher_trace *t, struct fetcher_trace_totals *s)
{
    *s = (struct fetcher_trace_totals){0};
    uint64_t n_cells = (uint64_t)t->opts.n_layer * t->opts.n_expert;
    for (uint64_t i = 0; i < n_cells; i++) {
        const struct trace_cell *c = &t->cells[i];
        s->accesses += c->activations;
        s->hits += c->hits;
        s->misses += c->misses;
        s->prefetch_hits += c->prefetch_hits;
        s->prefetch_issued += c->prefetch_issued;
        s->prefetch_wasted += c->prefetch_wasted;
        s->prefetch_dropped += c->prefetch_dropped;
        s->loads += c->loads;
        s->load_errors += c->load_errors;
        s->bytes_read += c->bytes_read;
        s->evictions += c->evictions;
    }
    s->tokens = t->tokens;
    s->faults = t->faults + t->cur_faults;
    s->max_faults = t->cur_faults > t->max_faults ? t->cur_faults : t->max_faults;
    s->steady_tokens = t->tokens > t->opts.warmup_tokens ? t->tokens - t->opts.warmup_tokens : 0;
    s->steady_faults = t->steady_faults;
    s->steady_max_faults = t->steady_max_faults;
    if (t->tokens > t->opts.warmup_tokens) {
        s->steady_faults += t->cur_faults;
        if (t->cur_faults > s->steady_max_faults)
            s->steady_max_faults = t->cur_faults;
    }
    s->belady_accesses = t->n_log;
    s->belady_truncated = t->truncated;
    memcpy(s->reuse, t->reuse, sizeof(s->reuse));
    s->first_uses = t->first_uses;
    uint32_t n_used = 0;
    for (uint32_t l = 0; l < t->opts.n_layer; l++) {
        const double h = trace_layer_entropy(t, l);
        if (h < 0.0)
            continue;
        if (n_used == 0 || h < s->entropy_min)
            s->entropy_min = h;
        if (n_used == 0 || h > s->entropy_max)
            s->entropy_max = h;
        s->entropy_mean += h;
        n_used++;
    }
    if (n_used)
        s->entropy_mean /= n_used;
    if (t->opts.n_slots > 0 && t->n_log > 0) {
        int64_t h = fetcher_trace_belady_hits(t->log, (size_t)t->n_log, t->opts.n_slots);
        s->belady_hits = h > 0 ? (uint64_t)h : 0;
    }
}

void fetcher_trace_totals(const struct fetcher_trace *t, struct fetcher_trace_totals *out)
{
    struct fetcher_trace *mt = (struct fetcher_trace *)(uintptr_t)t;
    pthread_mutex_lock(&mt->mu);
    trace_totals_locked(t, out);
    pthread_mutex_unlock(&mt->mu);
}

static double trace_ratio(uint64_t a, uint64_t b)
{
    return b ? (double)a / (double)b : 0.0;
}

int fetcher_trace_predictor(struct fetcher_trace *t, const char *name, uint64_t predicted,
                            uint64_t correct, uint64_t actual)
{
    if (!name || !name[0] || strlen(name) >= sizeof(t->preds[0].name) || correct > predicted ||
        correct > actual)
        return COMMON_EINVAL;
    int rc = COMMON_ENOMEM;
    pthread_mutex_lock(&t->mu);
    for (uint32_t i = 0; i < FETCHER_TRACE_MAX_PREDICTORS; i++) {
        struct trace_pred *p = &t->preds[i];
        if (p->name[0] && strcmp(p->name, name) != 0)
            continue;
        snprintf(p->name, sizeof(p->name), "%s", name);
        p->predicted = predicted;
        p->correct = correct;
        p->actual = actual;
        rc = COMMON_OK;
        break;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static json_t *trace_hist(const uint32_t *lat)
{
    json_t *a = json_array();
    for (uint32_t b = 0; b < FETCHER_TRACE_LAT_BUCKETS && a; b++)
        json_array_append_new(a, json_integer(lat[b]));
    return a;
}

/* A count as a JSON integer (the counters stay far below 2^63). */
static json_t *trace_n(uint64_t v)
{
    return json_integer((json_int_t)v);
}

/* The trace as a JSON object (schema sluice.fetcher.trace/1, docs/fetcher.md). Under the lock. */
static json_t *trace_json_locked(const struct fetcher_trace        *t,
                                 const struct fetcher_trace_totals *s)
{
    json_t *reuse = json_array(), *preds = json_array(), *layers = json_array();
    for (uint32_t b = 0; b < FETCHER_TRACE_REUSE_BUCKETS; b++)
        json_array_append_new(reuse, trace_n(s->reuse[b]));
    for (uint32_t i = 0; i < FETCHER_TRACE_MAX_PREDICTORS; i++) {
        const struct trace_pred *p = &t->preds[i];
        if (!p->name[0])
            continue;
        size_t n = 0;
        char  *name = common_utf8_repair(p->name, strlen(p->name), &n);
        json_array_append_new(
            preds, json_pack("{s:s%,s:o,s:o,s:o,s:f,s:f}", "name", name ? name : "", n, "predicted",
                             trace_n(p->predicted), "correct", trace_n(p->correct), "actual",
                             trace_n(p->actual), "precision", trace_ratio(p->correct, p->predicted),
                             "recall", trace_ratio(p->correct, p->actual)));
        free(name);
    }
    for (uint32_t l = 0; l < t->opts.n_layer; l++) {
        json_t *experts = json_array();
        for (uint32_t x = 0; x < t->opts.n_expert; x++) {
            const struct trace_cell *c = &t->cells[(uint64_t)l * t->opts.n_expert + x];
            json_t                  *e = json_pack(
                                 "{s:I,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "expert", (json_int_t)x,
                                 "activations", trace_n(c->activations), "hits", trace_n(c->hits), "misses",
                                 trace_n(c->misses), "prefetch_hits", trace_n(c->prefetch_hits), "prefetch_issued",
                                 trace_n(c->prefetch_issued), "prefetch_wasted", trace_n(c->prefetch_wasted),
                                 "prefetch_dropped", trace_n(c->prefetch_dropped), "loads", trace_n(c->loads),
                                 "load_errors", trace_n(c->load_errors), "bytes_read", trace_n(c->bytes_read),
                                 "evictions", trace_n(c->evictions));
            json_object_set_new(e, "latency_us_log2", trace_hist(c->lat));
            json_array_append_new(experts, e);
        }
        json_array_append_new(layers,
                              json_pack("{s:I,s:I,s:f,s:o}", "layer", (json_int_t)l,
                                        "peak_resident", (json_int_t)t->peak[l], "load_entropy",
                                        trace_layer_entropy(t, l), "experts", experts));
    }
    json_t *totals = json_pack(
        "{s:o,s:o,s:o,s:f,s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "accesses", trace_n(s->accesses),
        "hits", trace_n(s->hits), "misses", trace_n(s->misses), "hit_rate",
        trace_ratio(s->hits, s->accesses), "prefetch_hits", trace_n(s->prefetch_hits),
        "prefetch_issued", trace_n(s->prefetch_issued), "prefetch_wasted",
        trace_n(s->prefetch_wasted), "prefetch_dropped", trace_n(s->prefetch_dropped), "loads",
        trace_n(s->loads), "load_errors", trace_n(s->load_errors), "bytes_read",
        trace_n(s->bytes_read), "evictions", trace_n(s->evictions));
    json_t *tokens =
        json_pack("{s:{s:o,s:o,s:f,s:o},s:{s:o,s:o,s:f,s:o}}", "all", "tokens", trace_n(s->tokens),
                  "faults", trace_n(s->faults), "faults_per_token",
                  trace_ratio(s->faults, s->tokens), "max_faults", trace_n(s->max_faults), "steady",
                  "tokens", trace_n(s->steady_tokens), "faults", trace_n(s->steady_faults),
                  "faults_per_token", trace_ratio(s->steady_faults, s->steady_tokens), "max_faults",
                  trace_n(s->steady_max_faults));
    json_t *belady = json_pack(
        "{s:I,s:o,s:o,s:f,s:b}", "n_slots", (json_int_t)t->opts.n_slots, "accesses",
        trace_n(s->belady_accesses), "hits", trace_n(s->belady_hits), "hit_rate",
        trace_ratio(s->belady_hits, s->belady_accesses), "truncated", s->belady_truncated ? 1 : 0);
    json_t *routing = json_pack("{s:f,s:f,s:f,s:o,s:o}", "entropy_min", s->entropy_min,
                                "entropy_mean", s->entropy_mean, "entropy_max", s->entropy_max,
                                "first_uses", trace_n(s->first_uses), "reuse_tokens_log2", reuse);
    return json_pack("{s:s,s:I,s:I,s:I,s:I,s:o,s:o,s:o,s:o,s:o,s:o,s:o}", "schema",
                     "sluice.fetcher.trace/1", "n_layer", (json_int_t)t->opts.n_layer, "n_expert",
                     (json_int_t)t->opts.n_expert, "n_slots", (json_int_t)t->opts.n_slots,
                     "warmup_tokens", (json_int_t)t->opts.warmup_tokens, "totals", totals, "tokens",
                     tokens, "belady", belady, "routing", routing, "predictors", preds,
                     "latency_us_log2", trace_hist(t->lat_all), "layers", layers);
}

int fetcher_trace_write_json(const struct fetcher_trace *t, FILE *f)
{
    struct fetcher_trace       *mt = (struct fetcher_trace *)(uintptr_t)t;
    struct fetcher_trace_totals s;
    pthread_mutex_lock(&mt->mu);
    trace_totals_locked(t, &s);
    json_t *j = trace_json_locked(t, &s);
    pthread_mutex_unlock(&mt->mu);
    /* Compact, on one line (jq -C . pretty-prints it). */
    int rc =
        j && json_dumpf(j, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF ? COMMON_OK : COMMON_EIO;
    json_decref(j);
    return rc == COMMON_OK && ferror(f) ? COMMON_EIO : rc;
}

void fetcher_trace_write_summary(const struct fetcher_trace *t, FILE *f)
{
    struct fetcher_trace       *mt = (struct fetcher_trace *)(uintptr_t)t;
    struct fetcher_trace_totals s;
    char                        b[32];
    pthread_mutex_lock(&mt->mu);
    trace_totals_locked(t, &s);
    fprintf(f, "expert trace: %llu tokens (%llu steady after %u warm-up), %llu accesses\n",
            (unsigned long long)s.tokens, (unsigned long long)s.steady_tokens,
            t->opts.warmup_tokens, (unsigned long long)s.accesses);
    fprintf(f, "  hit rate %.1f%% (%llu hits, %llu by prefetch; %llu misses)",
            100.0 * trace_ratio(s.hits, s.accesses), (unsigned long long)s.hits,
            (unsigned long long)s.prefetch_hits, (unsigned long long)s.misses);
    if (t->opts.n_slots)
        fprintf(f, "; Belady optimum with %u slots %.1f%%%s", t->opts.n_slots,
                100.0 * trace_ratio(s.belady_hits, s.belady_accesses),
                s.belady_truncated ? " (partial trace)" : "");
    fprintf(f, "\n  faults/token %.2f (max %llu), steady %.2f (max %llu)\n",
            trace_ratio(s.faults, s.tokens), (unsigned long long)s.max_faults,
            trace_ratio(s.steady_faults, s.steady_tokens), (unsigned long long)s.steady_max_faults);
    fprintf(f, "  prefetch: %llu issued, %llu hits, %llu wasted, %llu dropped\n",
            (unsigned long long)s.prefetch_issued, (unsigned long long)s.prefetch_hits,
            (unsigned long long)s.prefetch_wasted, (unsigned long long)s.prefetch_dropped);
    uint64_t n_lat = 0, acc = 0;
    uint32_t median = 0;
    for (uint32_t i = 0; i < FETCHER_TRACE_LAT_BUCKETS; i++)
        n_lat += t->lat_all[i];
    for (uint32_t i = 0; i < FETCHER_TRACE_LAT_BUCKETS && n_lat; i++) {
        acc += t->lat_all[i];
        if (2 * acc >= n_lat) {
            median = i;
            break;
        }
    }
    fprintf(f, "  read %s in %llu loads (%llu errors, %llu evictions)",
            common_format_size(s.bytes_read, b, sizeof(b)), (unsigned long long)s.loads,
            (unsigned long long)s.load_errors, (unsigned long long)s.evictions);
    if (n_lat)
        fprintf(f, ", median load %llu-%llu us", median ? 1ull << median : 0ull, 2ull << median);
    for (uint32_t i = 0; i < FETCHER_TRACE_MAX_PREDICTORS; i++) {
        const struct trace_pred *p = &t->preds[i];
        if (p->name[0])
            fprintf(f,
                    "\n  predictor %s: precision %.1f%%, recall %.1f%% (%llu of %llu guesses, "
                    "%llu picks)",
                    p->name, 100.0 * trace_ratio(p->correct, p->predicted),
                    100.0 * trace_ratio(p->correct, p->actual), (unsigned long long)p->correct,
                    (unsigned long long)p->predicted, (unsigned long long)p->actual);
    }
    if (s.accesses) {
        /* Which case this run was: even or skewed load, short or long reuse. */
        fprintf(f,
                "\n  routing: load entropy per layer %.2f-%.2f (mean %.2f; 1 = uniform); reuse "
                "after 1 token %.1f%%, 2-3 %.1f%%, 4-15 %.1f%%, 16+ %.1f%%, first use %.1f%%",
                s.entropy_min, s.entropy_max, s.entropy_mean,
                100.0 * trace_ratio(s.reuse[0], s.accesses),
                100.0 * trace_ratio(s.reuse[1], s.accesses),
                100.0 * trace_ratio(s.reuse[2] + s.reuse[3], s.accesses),
                100.0 * trace_ratio(s.accesses - s.first_uses - s.reuse[0] - s.reuse[1] -
                                        s.reuse[2] - s.reuse[3],
                                    s.accesses),
                100.0 * trace_ratio(s.first_uses, s.accesses));
    }
    fputs("\n  peak resident bundles per layer:", f);
    for (uint32_t l = 0; l < t->opts.n_layer; l++)
        fprintf(f, " %lld", (long long)t->peak[l]);
    fputc('\n', f);
    pthread_mutex_unlock(&mt->mu);
}
