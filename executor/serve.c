/* executor/serve.c - the executor's control socket and the step service for the router. */
#include "executor.h"
#include "proto.h"

#include <errno.h>
#include <fcntl.h>
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

#define SERVE_WAIT_MS 100 /* step-ring wait between checks of the router and of a new link */

/* The router's link: two rings and two slabs it created in the run directory. */
struct serve_link {
    struct common_ring_segment seg[4]; /* mapped: req, rep, tokens, logits (router's files) */
    struct common_ring         req;    /* consumer side: proto_step_req */
    struct common_ring         rep;    /* producer side: proto_step_rep */
    const int32_t             *tokens; /* mapped: (n_seq, n_ctx), router writes */
    float                     *logits; /* mapped: (n_seq, n_vocab), executor writes */
    uint32_t                   n_seq, n_ctx;
    uint32_t                   pid;
    uint64_t                   instance;
};

struct executor_serve {
    char                        *run_dir; /* owned */
    const struct executor_model *model;   /* borrowed */
    struct executor_remote      *remote;  /* borrowed, NULL for a dense model */
    uint32_t                     n_seq, n_ctx, n_vocab;
    struct executor_ctx        **ctx;    /* owned: n_seq contexts */
    struct executor_ctx_opts     co;     /* how they are made (gpu_weights = gpu_w) */
    struct executor_gpu_weights *gpu_w;  /* owned: -ngl's device weights, shared by ctx */
    int32_t                     *tokens; /* owned: (n_seq, n_ctx) copies of the router's ids */
    /* One round of step records (at most round_cap) and its batch; owned, of the step thread. */
    uint32_t                   round_cap;
    struct proto_step_req     *round;    /* (round_cap) records */
    struct proto_step_rep     *reps;     /* (round_cap) their replies */
    bool                      *bad;      /* (round_cap) the record was malformed */
    struct executor_batch_seq *bseq;     /* (n_seq) the batch's sequences */
    uint32_t                  *bidx;     /* (n_seq) their records in the round */
    bool                      *in_batch; /* (n_seq) the sequence is in the batch */
    struct proto_service      *svc;      /* owned: control socket, pid file */
    pthread_t                  thread;   /* the step thread */
    bool                       started;  /* thread running */
    _Atomic uint64_t           instance; /* new after a device failure (HELLO tells the router) */
    uint64_t                   fault_at; /* SLUICE_TEST_DEVICE_FAULT: batch that fails, 0 none */
    bool                       device_failed; /* of the step thread: a batch met COMMON_EDEVICE */
    struct common_errmsg       device_err;    /* its message */

    pthread_mutex_t    mu;       /* everything below */
    pthread_cond_t     cond;     /* a new link, or stop */
    struct serve_link *pending;  /* owned: attached, not yet taken by the step thread */
    bool               has_link; /* the step thread serves a link */
    bool               stop, draining;
    uint64_t           steps, tokens_done, step_ns, errors, bad_records, attaches, dropped;
    uint64_t           rounds, batches, batched_seqs, device_fallbacks;
    double             last_ms;
    struct executor_gpu_pool_stats gpu_pool; /* the device pool's, after the last round */
};

/* ---- the router link ----------------------------------------------------------------------- */

static void serve_link_free(struct serve_link *l)
{
    if (!l)
        return;
    for (int i = 0; i < 4; i++)
        common_ring_segment_close(&l->seg[i]);
    free(l);
}

/* Formats the reason of a refusal into why[why_len] and returns rc. */
static int serve_refuse(char *why, size_t why_len, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int serve_refuse(char *why, size_t why_len, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    return rc;
}

/* Maps the segments named in an ATTACH and checks them; fills the error text on refusal. */
static int serve_link_open(struct executor_serve *s, const struct proto_attach *a,
                           struct serve_link **out, char *why, size_t why_len)
{
    if (a->role != PROTO_ROLE_ROUTER)
        return serve_refuse(why, why_len, COMMON_EINVAL,
                            "ATTACH from role %d: only a router attaches here", (int)a->role);
    if (a->n_segments != 4)
        return serve_refuse(why, why_len, COMMON_EINVAL, "ATTACH with %u segments, expected 4",
                            a->n_segments);
    uint32_t slots = a->params[0], n_seq = a->params[1], n_ctx = a->params[2],
             n_vocab = a->params[3];
    if (n_vocab != s->n_vocab)
        return serve_refuse(why, why_len, COMMON_EINVAL, "n_vocab %u does not match the model's %u",
                            n_vocab, s->n_vocab);
    if (n_seq == 0 || n_seq > s->n_seq)
        return serve_refuse(why, why_len, COMMON_EINVAL,
                            "n_seq %u is not in 1..%u (executor --parallel)", n_seq, s->n_seq);
    if (n_ctx == 0 || n_ctx > s->n_ctx)
        return serve_refuse(why, why_len, COMMON_EINVAL,
                            "n_ctx %u is not in 1..%u (executor --ctx-size)", n_ctx, s->n_ctx);
    if (slots == 0 || slots > COMMON_RING_MAX_SLOTS || (slots & (slots - 1)) != 0)
        return serve_refuse(why, why_len, COMMON_EINVAL, "ring slots %u is not a power of two",
                            slots);
    struct serve_link *l = calloc(1, sizeof(*l));
    if (!l)
        return serve_refuse(why, why_len, COMMON_ENOMEM, "out of memory");
    int rc = COMMON_OK;
    for (int i = 0; i < 4; i++) {
        if ((rc = common_ring_segment_open(s->run_dir, a->segments[i], &l->seg[i])) < 0) {
            snprintf(why, why_len, "cannot map segment '%s': %s", a->segments[i],
                     common_strerror(rc));
            goto out_free;
        }
    }
    if ((rc = common_ring_attach(l->seg[0].mem, l->seg[0].bytes, sizeof(struct proto_step_req),
                                 slots, &l->req)) < 0 ||
        (rc = common_ring_attach(l->seg[1].mem, l->seg[1].bytes, sizeof(struct proto_step_rep),
                                 slots, &l->rep)) < 0) {
        snprintf(why, why_len, "step rings do not hold %u slots of step records", slots);
        goto out_free;
    }
    uint64_t tok_bytes = (uint64_t)n_seq * n_ctx * sizeof(int32_t);
    uint64_t log_bytes = (uint64_t)n_seq * n_vocab * sizeof(float);
    if (l->seg[2].bytes < tok_bytes || l->seg[3].bytes < log_bytes) {
        rc = COMMON_EINVAL;
        snprintf(why, why_len, "slabs of %zu and %zu bytes, need %llu and %llu", l->seg[2].bytes,
                 l->seg[3].bytes, (unsigned long long)tok_bytes, (unsigned long long)log_bytes);
        goto out_free;
    }
    l->tokens = l->seg[2].mem;
    l->logits = l->seg[3].mem;
    l->n_seq = n_seq;
    l->n_ctx = n_ctx;
    l->pid = a->pid;
    l->instance = a->instance;
    *out = l;
    return COMMON_OK;

out_free:
    serve_link_free(l);
    return rc;
}

/* ---- the step thread ----------------------------------------------------------------------- */

static void serve_reset_all(struct executor_serve *s)
{
    for (uint32_t i = 0; i < s->n_seq; i++)
        executor_ctx_reset(s->ctx[i]);
}

/* Checks an EVAL and takes a private copy of its tokens (the router's slab may change under us)
 * into row `seq` of s->tokens; a first position of 0 resets the sequence. Returns 0 or the
 * status of the reply. */
static int serve_eval_prepare(struct executor_serve *s, struct serve_link *l,
                              const struct proto_step_req *q)
{
    if (q->n == 0)
        return COMMON_EINVAL;
    if ((uint64_t)q->pos + q->n > l->n_ctx)
        return COMMON_ERANGE;
    struct executor_ctx *c = s->ctx[q->seq];
    if (q->pos != 0 && q->pos != executor_ctx_n_past(c))
        return COMMON_EINVAL;
    int32_t *tok = s->tokens + (size_t)q->seq * s->n_ctx;
    memcpy(tok, l->tokens + (size_t)q->seq * l->n_ctx + q->pos, q->n * sizeof(int32_t));
    for (uint32_t i = 0; i < q->n; i++)
        if (tok[i] < 0 || (uint32_t)tok[i] >= s->n_vocab)
            return COMMON_EINVAL;
    if (q->pos == 0)
        executor_ctx_reset(c);
    return COMMON_OK;
}

/* Runs the EVALs gathered in s->bseq (distinct sequences) as one batched step; their statuses
 * go to the replies listed in s->bidx, and their sequences leave the batch. */
static void serve_run_batch(struct executor_serve *s, const struct proto_step_req *recs,
                            uint32_t nb, struct proto_step_rep *rep)
{
    struct common_errmsg e = {{0}};
    int                  rc = executor_ctx_decode_batch(s->ctx[0], s->bseq, nb, &e);
    const uint64_t       batch = s->batches + 1; /* written by this thread only: no lock to read */
    if (batch == s->fault_at) /* the test hook: as if the device had failed in this batch */
        rc = common_errmsg_set(&e, COMMON_EDEVICE,
                               "CUDA (SLUICE_TEST_DEVICE_FAULT=%llu): "
                               "an injected device failure",
                               (unsigned long long)batch);
    if (rc == COMMON_EDEVICE) { /* no replies: serve_thread falls back, the router replays */
        s->device_failed = true;
        s->device_err = e;
    } else if (rc < 0) {
        COMMON_LOG_WARN("executor.serve", "a step of %u sequence(s) failed: %s", nb,
                        e.text[0] ? e.text : common_strerror(rc));
    }
    const size_t row_bytes = (size_t)s->n_vocab * sizeof(float);
    for (uint32_t k = 0; k < nb; k++) {
        struct proto_step_rep *r = &rep[s->bidx[k]];
        r->status = s->bseq[k].status;
        r->n_past = executor_ctx_n_past(s->bseq[k].ctx);
        s->in_batch[recs[s->bidx[k]].seq] = false;
        if (r->status < 0 && rc < 0 && e.text[0] && row_bytes > 1) {
            /* the reason instead of logits, for the router to pass on to the client */
            const size_t cap = row_bytes < PROTO_MAX_ERROR_TEXT ? row_bytes : PROTO_MAX_ERROR_TEXT;
            const size_t n = strnlen(e.text, cap - 1);
            memcpy(s->bseq[k].logits, e.text, n);
            ((char *)s->bseq[k].logits)[n] = '\0';
            r->flags |= PROTO_STEP_REP_TEXT;
        }
    }
    pthread_mutex_lock(&s->mu);
    s->batches++;
    s->batched_seqs += nb;
    pthread_mutex_unlock(&s->mu);
}

/* Serves the n records of a round and pushes their replies: EVALs of distinct sequences run
 * as one batch; a record naming a sequence already in the batch runs the batch first, so the
 * records of a sequence take effect in ring order. Returns false when the link must be
 * dropped (s->device_failed says when the device failed: no reply is pushed then). */
static bool serve_round(struct executor_serve *s, struct serve_link *l,
                        const struct proto_step_req *recs, uint32_t n)
{
    uint64_t               t0 = common_now_ns();
    struct proto_step_rep *rep = s->reps;
    bool                  *bad = s->bad;
    uint32_t               nb = 0;
    for (uint32_t i = 0; i < n; i++) {
        const struct proto_step_req *q = &recs[i];
        const bool                   seq_ok = q->seq < l->n_seq;
        rep[i] = (struct proto_step_rep){.tag = q->tag, .seq = q->seq};
        bad[i] = false;
        if (seq_ok && s->in_batch[q->seq]) {
            serve_run_batch(s, recs, nb, rep);
            nb = 0;
            if (s->device_failed)
                return false;
        }
        if (q->op == PROTO_STEP_EVAL && seq_ok) {
            rep[i].status = serve_eval_prepare(s, l, q);
            bad[i] = rep[i].status < 0;
            if (rep[i].status == 0) {
                s->bseq[nb] =
                    (struct executor_batch_seq){.ctx = s->ctx[q->seq],
                                                .tokens = s->tokens + (size_t)q->seq * s->n_ctx,
                                                .n = q->n,
                                                .logits = l->logits + (size_t)q->seq * s->n_vocab};
                s->bidx[nb++] = i;
                s->in_batch[q->seq] = true;
            }
        } else if (q->op == PROTO_STEP_FREE && seq_ok) {
            executor_ctx_reset(s->ctx[q->seq]);
            rep[i].status = COMMON_OK;
        } else {
            rep[i].status = COMMON_EINVAL;
            bad[i] = true;
        }
        if (seq_ok && !s->in_batch[q->seq])
            rep[i].n_past = executor_ctx_n_past(s->ctx[q->seq]);
    }
    if (nb)
        serve_run_batch(s, recs, nb, rep);
    if (s->device_failed)
        return false;
    uint64_t                       dt = common_now_ns() - t0;
    struct executor_gpu_pool_stats gp;
    const bool                     pooled = executor_ctx_gpu_pool_stats(s->ctx[0], &gp);
    pthread_mutex_lock(&s->mu);
    if (pooled)
        s->gpu_pool = gp;
    s->rounds++;
    s->step_ns += dt;
    s->last_ms = (double)dt / 1e6;
    for (uint32_t i = 0; i < n; i++) {
        const struct proto_step_req *q = &recs[i];
        rep[i].ms = (double)dt / 1e6;
        if (bad[i])
            s->bad_records++;
        else if (rep[i].status < 0)
            s->errors++;
        if (q->op == PROTO_STEP_EVAL && rep[i].status == 0) {
            s->steps++;
            s->tokens_done += q->n;
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0; i < n; i++) {
        for (;;) {
            int rc = common_ring_push_wait(&l->rep, &rep[i], sizeof(rep[i]), SERVE_WAIT_MS);
            if (rc == COMMON_OK)
                break;
            if (rc != COMMON_ETIMEDOUT || common_pid_gone(l->pid))
                return false;
            pthread_mutex_lock(&s->mu);
            bool stop = s->stop || s->pending;
            pthread_mutex_unlock(&s->mu);
            if (stop)
                return true; /* the router moved on (or we stop): the replies are moot */
        }
    }
    return true;
}

/* Pops the rest of a round after its first record recs[0]: the records flagged "more" promise
 * another at once, and whatever else already waits in the ring joins too, up to the round's
 * capacity. Returns NULL with *n set, or why the link must be dropped. */
static const char *serve_collect(struct executor_serve *s, struct serve_link *l,
                                 struct proto_step_req *recs, uint32_t *n)
{
    while (*n < s->round_cap) {
        const bool more = (recs[*n - 1].flags & PROTO_STEP_F_MORE) != 0;
        int        rc =
            common_ring_pop_wait(&l->req, &recs[*n], sizeof(recs[0]), more ? SERVE_WAIT_MS : 0);
        if (rc == (int)sizeof(recs[0])) {
            (*n)++;
            continue;
        }
        if (rc == COMMON_ETIMEDOUT && more) {
            if (common_pid_gone(l->pid))
                return "router gone";
            pthread_mutex_lock(&s->mu);
            bool stop = s->stop || s->pending;
            pthread_mutex_unlock(&s->mu);
            if (stop)
                return NULL;
            continue;
        }
        if (rc == COMMON_ETIMEDOUT)
            return NULL;
        pthread_mutex_lock(&s->mu);
        s->bad_records++;
        pthread_mutex_unlock(&s->mu);
        if (rc >= 0) /* shorter than a record: gone from the ring, the round goes on */
            continue;
        return rc == COMMON_EINVAL ? "oversized record" : common_strerror(rc);
    }
    return NULL;
}

/* The device failed (s->device_err): the contexts with layers on it lost their caches and cannot
 * run again. They are made again on the CPU, and the service takes a new instance id: the
 * router's HELLO sees it, as after a restart of the executor, and the router attaches again and
 * replays its sequences, so no request is lost. Step thread. */
static void serve_fall_back(struct executor_serve *s)
{
    COMMON_LOG_ERR("executor",
                   "%s; going on without the device (on the CPU): the router replays "
                   "its sequences (their KV now in RAM: the fetchers give up pool slots for it "
                   "where their RAM budget plan left it out)",
                   s->device_err.text);
    for (uint32_t i = 0; i < s->n_seq; i++) {
        executor_ctx_destroy(s->ctx[i]);
        s->ctx[i] = NULL;
    }
    executor_gpu_weights_destroy(s->gpu_w);
    s->gpu_w = NULL;
    s->co.gpu_weights = NULL;
    for (uint32_t i = 0; i < s->n_seq; i++) {
        struct common_errmsg e = {{0}};
        int                  rc = executor_ctx_create(s->model, &s->co, &s->ctx[i], &e);
        if (rc < 0) {
            /* No context to step with: the process ends, for the supervisor to restart it. */
            COMMON_LOG_ERR("executor", "cannot go on on the CPU: %s; exiting",
                           e.text[0] ? e.text : common_strerror(rc));
            _exit(EXIT_FAILURE);
        }
    }
    if (s->remote) /* their KV is in RAM now: the fetchers shrink their pools for it */
        executor_remote_device_layers(s->remote, 0);
    atomic_store(&s->instance, common_random_id());
    pthread_mutex_lock(&s->mu);
    s->device_fallbacks++;
    pthread_mutex_unlock(&s->mu);
    s->device_failed = false;
}

static void *serve_thread(void *arg)
{
    struct executor_serve *s = arg;
    struct serve_link     *l = NULL;
    for (;;) {
        struct serve_link *old = NULL;
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->pending && !l) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += SERVE_WAIT_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            (void)pthread_cond_timedwait(&s->cond, &s->mu, &ts);
        }
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (s->pending) { /* a new ATTACH replaces the link: every sequence starts over */
            old = l;
            l = s->pending;
            s->pending = NULL;
            s->has_link = true;
            serve_reset_all(s);
            COMMON_LOG_INFO("executor.serve", "router attached pid=%u n_seq=%u n_ctx=%u", l->pid,
                            l->n_seq, l->n_ctx);
        }
        pthread_mutex_unlock(&s->mu);
        serve_link_free(old);

        struct proto_step_req *recs = s->round;
        int         rc = common_ring_pop_wait(&l->req, &recs[0], sizeof(recs[0]), SERVE_WAIT_MS);
        const char *drop = NULL;
        if (rc == (int)sizeof(recs[0])) {
            uint32_t n = 1;
            drop = serve_collect(s, l, recs, &n);
            if (!drop && !serve_round(s, l, recs, n))
                drop =
                    s->device_failed ? "the device failed" : "reply ring unusable or router gone";
        } else if (rc >= 0 || rc == COMMON_EINVAL) {
            pthread_mutex_lock(&s->mu);
            s->bad_records++;
            pthread_mutex_unlock(&s->mu);
            if (rc == COMMON_EINVAL) /* longer than a record: it stays in the ring */
                drop = "oversized record";
        } else if (rc == COMMON_ETIMEDOUT) {
            if (common_pid_gone(l->pid))
                drop = "router gone";
        } else {
            drop = common_strerror(rc);
        }
        if (drop) {
            COMMON_LOG_WARN("executor.serve", "router link dropped (%s)", drop);
            serve_link_free(l);
            l = NULL;
            serve_reset_all(s);
            pthread_mutex_lock(&s->mu);
            s->has_link = false;
            s->dropped++;
            pthread_mutex_unlock(&s->mu);
        }
        if (s->device_failed)
            serve_fall_back(s);
    }
    serve_link_free(l);
    return NULL;
}

/* ---- control messages ---------------------------------------------------------------------- */

static void serve_stats(void *arg, struct proto_stats_reply *r)
{
    struct executor_serve *s = arg;
    pthread_mutex_lock(&s->mu);
    proto_stats_add(r, "steps", (double)s->steps);
    proto_stats_add(r, "tokens", (double)s->tokens_done);
    proto_stats_add(r, "step_ms_total", (double)s->step_ns / 1e6);
    proto_stats_add(r, "rounds", (double)s->rounds);
    proto_stats_add(r, "step_ms_mean",
                    s->rounds ? (double)s->step_ns / 1e6 / (double)s->rounds : 0.0);
    proto_stats_add(r, "batches", (double)s->batches);
    proto_stats_add(r, "batch_seqs_mean",
                    s->batches ? (double)s->batched_seqs / (double)s->batches : 0.0);
    proto_stats_add(r, "step_ms_last", s->last_ms);
    proto_stats_add(r, "errors", (double)s->errors);
    proto_stats_add(r, "bad_records", (double)s->bad_records);
    proto_stats_add(r, "attaches", (double)s->attaches);
    proto_stats_add(r, "links_dropped", (double)s->dropped);
    proto_stats_add(r, "device_fallbacks", (double)s->device_fallbacks);
    proto_stats_add(r, "router_linked", s->has_link || s->pending ? 1.0 : 0.0);
    if (s->gpu_pool.n_slots) {
        /* The device's expert pool (--vram-budget), as `sluice bench` reports it. */
        const struct executor_gpu_pool_stats *gp = &s->gpu_pool;
        proto_stats_add(r, "gpu_pool.slots", (double)gp->n_slots);
        proto_stats_add(r, "gpu_pool.hits", (double)gp->hits);
        proto_stats_add(r, "gpu_pool.copied", (double)gp->misses);
        proto_stats_add(r, "gpu_pool.cpu", (double)gp->cpu_misses);
        proto_stats_add(r, "gpu_pool.copied_bytes", (double)gp->copied_bytes);
        proto_stats_add(r, "gpu_pool.copy_busy_ms", (double)gp->copy_busy_ns / 1e6);
        proto_stats_add(r, "gpu_pool.copy_stall_ms", (double)gp->copy_stall_ns / 1e6);
        proto_stats_add(r, "gpu_pool.pinned_bytes", (double)gp->pinned_bytes);
        proto_stats_add(r, "gpu_pool.pinned_regions", (double)gp->pinned_regions);
        proto_stats_add(r, "gpu_pool.pin_adds", (double)gp->pin_adds);
        proto_stats_add(r, "gpu_pool.pin_removes", (double)gp->pin_removes);
        proto_stats_add(r, "gpu_pool.in_fetcher", gp->in_fetcher);
        proto_stats_add(r, "gpu_pool.fetcher_memory", gp->fetcher_memory);
        proto_stats_add(r, "gpu_pool.fetcher_losses", (double)gp->fetcher_losses);
        proto_stats_add(r, "gpu_pool.fetcher_wait_ms", (double)gp->fetcher_wait_ns / 1e6);
        proto_stats_add(r, "gpu_pool.fetcher_copy_ms", (double)gp->fetcher_copy_ns / 1e6);
        proto_stats_add(r, "gpu_pool.staged", (double)gp->staged);
        proto_stats_add(r, "gpu_pool.stage_failures", (double)gp->stage_failures);
        proto_stats_add(r, "gpu_pool.fetcher_retakes", (double)gp->fetcher_retakes);
    }
    pthread_mutex_unlock(&s->mu);
    proto_stats_add(r, "sequences", (double)s->n_seq);
    proto_stats_add(r, "n_ctx", (double)s->n_ctx);
    if (!s->remote)
        return;
    struct proto_shard shards[PROTO_MAX_SHARDS];
    uint32_t           n = executor_remote_shards(s->remote, shards, PROTO_MAX_SHARDS);
    proto_stats_add(r, "fetchers_down", (double)executor_remote_n_down(s->remote));
    for (uint32_t i = 0; i < n; i++) {
        struct executor_remote_stats st;
        char                         key[PROTO_MAX_KEY];
        if (executor_remote_stats(s->remote, i, &st) < 0)
            continue;
        snprintf(key, sizeof(key), "fetcher.%u.acquires", i);
        proto_stats_add(r, key, (double)st.acquires);
        snprintf(key, sizeof(key), "fetcher.%u.wait_ms", i);
        proto_stats_add(r, key, (double)st.wait_ns / 1e6);
        snprintf(key, sizeof(key), "fetcher.%u.errors", i);
        proto_stats_add(r, key, (double)st.errors);
        snprintf(key, sizeof(key), "fetcher.%u.hints", i);
        proto_stats_add(r, key, (double)st.hints);
        snprintf(key, sizeof(key), "fetcher.%u.direct", i);
        proto_stats_add(r, key, (double)st.direct);
        snprintf(key, sizeof(key), "fetcher.%u.torn", i);
        proto_stats_add(r, key, (double)st.torn);
        snprintf(key, sizeof(key), "fetcher.%u.relinks", i);
        proto_stats_add(r, key, (double)st.relinks);
        snprintf(key, sizeof(key), "fetcher.%u.up", i);
        proto_stats_add(r, key, st.up ? 1.0 : 0.0);
    }
}

static void serve_health(void *arg, struct proto_health_reply *h)
{
    struct executor_serve *s = arg;
    uint32_t               down = s->remote ? executor_remote_n_down(s->remote) : 0;
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining, linked = s->has_link || s->pending;
    pthread_mutex_unlock(&s->mu);
    h->instance = atomic_load(&s->instance);
    if (draining) {
        h->state = PROTO_HEALTH_DRAINING;
        snprintf(h->message, sizeof(h->message), "draining");
    } else if (down) {
        h->state = PROTO_HEALTH_DEGRADED;
        snprintf(h->message, sizeof(h->message), "%u fetcher(s) missing", down);
    } else {
        h->state = PROTO_HEALTH_READY;
        snprintf(h->message, sizeof(h->message), "%s", linked ? "router linked" : "no router yet");
    }
}

static int serve_attach(struct executor_serve *s, const struct proto_attach *a,
                        struct proto_msg *rep)
{
    pthread_mutex_lock(&s->mu);
    bool draining = s->draining;
    pthread_mutex_unlock(&s->mu);
    if (draining) {
        snprintf(rep->u.error.message, sizeof(rep->u.error.message), "draining: no new link");
        return COMMON_EBUSY;
    }
    struct serve_link *l = NULL;
    char               why[PROTO_MAX_ERROR_TEXT] = "";
    int                rc = serve_link_open(s, a, &l, why, sizeof(why));
    if (rc < 0) {
        COMMON_LOG_WARN("executor.serve", "ATTACH refused: %s", why);
        snprintf(rep->u.error.message, sizeof(rep->u.error.message), "%s", why);
        return rc;
    }
    pthread_mutex_lock(&s->mu);
    struct serve_link *old = s->pending;
    s->pending = l;
    s->attaches++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    serve_link_free(old);
    rep->kind = PROTO_KIND_OK;
    return COMMON_OK;
}

static void serve_hello(void *arg, struct proto_hello *h)
{
    struct executor_serve *s = arg;
    h->instance = atomic_load(&s->instance);
    h->n_shards = s->remote ? executor_remote_shards(s->remote, h->shards, PROTO_MAX_SHARDS) : 0;
}

static void serve_drain(void *arg)
{
    executor_serve_drain(arg);
}

/* The messages beyond the skeleton's: ATTACH of the router. A refusal is an ERROR reply carrying
 * the text written into it. */
static int serve_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct executor_serve *s = arg;
    if (req->kind == PROTO_KIND_ATTACH) {
        int rc = serve_attach(s, &req->u.attach, rep);
        if (rc < 0) {
            rep->kind = PROTO_KIND_ERROR;
            rep->u.error.code = rc;
        }
        return rc;
    }
    return proto_reply_error(rep, COMMON_EPROTO, "the executor does not serve '%s'",
                             proto_kind_name(req->kind));
}

/* The executor's part of the daemon skeleton. */
static const struct proto_service_ops g_executor_ops = {
    .hello = serve_hello,
    .health = serve_health,
    .stats = serve_stats,
    .drain = serve_drain,
    .handle = serve_handler,
};

/* ---- lifetime ------------------------------------------------------------------------------ */

/* Several devices whose count is the fetchers' and whose shards are ranges of whole layers
 * (--shard-by layer; sluicectl up --devices): device k takes fetcher k's layers, so that the
 * experts of its layers, and its pool, are that fetcher's alone (one fetcher per GPU). */
static void serve_devices_by_shards(const struct executor_serve *s, struct executor_devices *d)
{
    struct proto_shard sh[PROTO_MAX_SHARDS];
    int32_t            ids[EXECUTOR_MAX_DEVICES];
    const uint32_t     n = s->remote ? executor_remote_shards(s->remote, sh, PROTO_MAX_SHARDS) : 0;
    const int          n_dev = executor_devices_resolve(d, ids, NULL, 0);
    const uint32_t     n_expert = executor_model_hparams(s->model)->n_expert;
    if (n < 2 || n_dev != (int)n || n > EXECUTOR_MAX_DEVICES)
        return;
    for (uint32_t k = 0; k < n; k++)
        if (sh[k].n_layers == 0 || sh[k].first_expert != 0 || sh[k].n_experts != n_expert ||
            (k > 0 && sh[k].first_layer != sh[k - 1].first_layer + sh[k - 1].n_layers))
            return;
    d->n_at = n;
    for (uint32_t k = 0; k < n; k++)
        d->at[k] = sh[k].first_layer;
    COMMON_LOG_INFO("executor",
                    "the %u devices take the layers of the %u fetchers' shards, one fetcher each",
                    n, n);
}

int executor_serve_start(const struct executor_serve_opts *o, struct executor_serve **out,
                         struct common_errmsg *e)
{
    if (!o || !o->run_dir || !o->model)
        return common_errmsg_set(e, COMMON_EINVAL, "the step service needs a run dir and a model");
    struct executor_serve *s = calloc(1, sizeof(*s));
    if (!s)
        return common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
    int rc = COMMON_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    s->model = o->model;
    s->remote = o->remote;
    atomic_init(&s->instance, o->instance ? o->instance : common_random_id());
    const char *fault = getenv("SLUICE_TEST_DEVICE_FAULT");
    s->fault_at = fault ? strtoull(fault, NULL, 10) : 0;
    s->n_seq = o->n_seq ? o->n_seq : 4;
    s->n_vocab = executor_model_hparams(o->model)->n_vocab;
    if (s->n_seq > 256) {
        rc = common_errmsg_set(e, COMMON_EINVAL, "--parallel %u: at most 256 sequences", s->n_seq);
        goto out_stop;
    }
    if (!(s->run_dir = strdup(o->run_dir)) || !(s->ctx = calloc(s->n_seq, sizeof(*s->ctx)))) {
        common_errmsg_set(e, rc, "out of memory");
        goto out_stop;
    }
    s->co = (struct executor_ctx_opts){
        .n_ctx = o->n_ctx, .n_batch = o->n_batch, .cache_type = o->cache_type, .pool = o->pool};
    if (o->n_gpu_layers > 0) {
        const struct common_hparams *hp = &executor_model_desc(o->model)->hp;
        const uint32_t               n_ctx = o->n_ctx                 ? o->n_ctx
                                             : hp->n_ctx_train < 4096 ? hp->n_ctx_train
                                                                      : 4096;
        char                         why[256] = "";
        struct common_errmsg         ge = {{0}};
        struct executor_devices      devs = o->devices;
        serve_devices_by_shards(s, &devs);
        if (!executor_gpu_usable(o->model, &devs, o->n_cpu_moe, why, sizeof(why))) {
            COMMON_LOG_WARN("executor", "-ngl %d ignored, running on the CPU: %s", o->n_gpu_layers,
                            why);
        } else if ((rc = executor_gpu_weights_create(
                        o->model,
                        &(struct executor_gpu_place){.n_gpu_layers = o->n_gpu_layers,
                                                     .n_cpu_moe = o->n_cpu_moe,
                                                     .devices = devs,
                                                     .vram_budget = o->vram_budget,
                                                     .expert_miss = o->expert_miss,
                                                     .pool_policy = o->pool_policy,
                                                     .cache_type = o->cache_type},
                        n_ctx, o->n_batch ? o->n_batch : 512, s->n_seq, &s->gpu_w, &ge)) ==
                   COMMON_EDEVICE) {
            COMMON_LOG_WARN("executor",
                            "-ngl %d dropped, running on the CPU: %s (the fetchers give up "
                            "pool slots for those layers' KV where their RAM budget plan left "
                            "it out)",
                            o->n_gpu_layers, ge.text);
        } else if (rc < 0) {
            common_errmsg_set(e, rc, "%s", ge.text);
            goto out_stop;
        }
        s->co.gpu_weights = s->gpu_w;
    }
    for (uint32_t i = 0; i < s->n_seq; i++)
        if ((rc = executor_ctx_create(o->model, &s->co, &s->ctx[i], e)) < 0)
            goto out_stop;
    char gd[4096];
    if (executor_ctx_gpu_describe(s->ctx[0], gd, sizeof(gd)))
        for (char *line = gd, *next; line; line = next) { /* a line per device */
            if ((next = strchr(line, '\n')) != NULL)
                *next++ = '\0';
            COMMON_LOG_INFO("executor", "%s (x%u sequences)", line, s->n_seq);
        }
    if (s->remote) /* the fetchers' plans may have left the device's KV out of RAM */
        executor_remote_device_layers(s->remote, executor_ctx_gpu_kv_layers(s->ctx[0]));
    s->n_ctx = executor_ctx_n_ctx(s->ctx[0]);
    s->round_cap = 2 * s->n_seq + 2;
    s->tokens = malloc((size_t)s->n_seq * s->n_ctx * sizeof(int32_t));
    s->round = calloc(s->round_cap, sizeof(*s->round));
    s->reps = calloc(s->round_cap, sizeof(*s->reps));
    s->bad = calloc(s->round_cap, sizeof(*s->bad));
    s->bseq = calloc(s->n_seq, sizeof(*s->bseq));
    s->bidx = calloc(s->n_seq, sizeof(*s->bidx));
    s->in_batch = calloc(s->n_seq, sizeof(*s->in_batch));
    if (!s->tokens || !s->round || !s->reps || !s->bad || !s->bseq || !s->bidx || !s->in_batch) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "out of memory");
        goto out_stop;
    }
    if (pthread_create(&s->thread, NULL, serve_thread, s) != 0) {
        rc = common_errmsg_set(e, COMMON_EAGAIN, "cannot start the step thread");
        goto out_stop;
    }
    s->started = true;
    struct proto_service_opts so = {.run_dir = s->run_dir,
                                    .name = "executor",
                                    .role = PROTO_ROLE_EXECUTOR,
                                    .model_path = o->model_path,
                                    .instance = atomic_load(&s->instance),
                                    .n_workers = 4,
                                    .no_pidfile = o->no_pidfile};
    if ((rc = proto_service_start(&so, &g_executor_ops, s, &s->svc, e)) < 0)
        goto out_stop;
    *out = s;
    return COMMON_OK;

out_stop:
    executor_serve_stop(s);
    return rc;
}

struct proto_service *executor_serve_service(struct executor_serve *s)
{
    return s->svc;
}

void executor_serve_drain(struct executor_serve *s)
{
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_mutex_unlock(&s->mu);
}

void executor_serve_stop(struct executor_serve *s)
{
    if (!s)
        return;
    proto_service_stop(s->svc); /* no handler runs after this */
    s->svc = NULL;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->thread, NULL);
    serve_link_free(s->pending);
    for (uint32_t i = 0; s->ctx && i < s->n_seq; i++)
        executor_ctx_destroy(s->ctx[i]);
    executor_gpu_weights_destroy(s->gpu_w);
    free(s->ctx);
    free(s->tokens);
    free(s->round);
    free(s->reps);
    free(s->bad);
    free(s->bseq);
    free(s->bidx);
    free(s->in_batch);
    free(s->run_dir);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

uint32_t executor_serve_n_ctx(const struct executor_serve *s)
{
    return s->n_ctx;
}

uint32_t executor_serve_n_seq(const struct executor_serve *s)
{
    return s->n_seq;
}

uint64_t executor_serve_instance(struct executor_serve *s)
{
    return atomic_load(&s->instance);
}
