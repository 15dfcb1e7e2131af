/* tests/router/fake_exec.h - a fake executor for router tests: control socket + step rings,
 * deterministic logits from each sequence's tokens. */
#ifndef TESTS_ROUTER_FAKE_EXEC_H
#define TESTS_ROUTER_FAKE_EXEC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "proto.h"
#include "router.h"

#define FAKE_MAX_SEQ 8
#define FAKE_MAX_CTX 512

/* Logits: only ids in [FAKE_LO, FAKE_HI) can win, so no control token ever ends a test early;
 * the winner depends on the last token and its position. */
#define FAKE_LO 300
#define FAKE_HI 900

static inline float fake_logit(int32_t last, uint32_t pos, uint32_t v)
{
    if (v < FAKE_LO || v >= FAKE_HI)
        return -20.0f;
    uint32_t h = (uint32_t)last * 2654435761u ^ (pos + 1u) * 40503u ^ v * 2246822519u;
    h ^= h >> 13;
    h *= 3266489917u;
    h ^= h >> 16;
    return (float)(h % 100000u) / 1000.0f;
}

/* What greedy decoding of the fake model gives for `prompt`: n tokens appended to out. */
static inline void fake_expected(const int32_t *prompt, uint32_t n_prompt, uint32_t n,
                                 uint32_t n_vocab, int32_t *out)
{
    int32_t  last = prompt[n_prompt - 1];
    uint32_t pos = n_prompt - 1;
    for (uint32_t k = 0; k < n; k++) {
        int32_t best = 0;
        float   bv = fake_logit(last, pos, 0);
        for (uint32_t v = 1; v < n_vocab; v++) {
            float x = fake_logit(last, pos, v);
            if (x > bv) {
                bv = x;
                best = (int32_t)v;
            }
        }
        out[k] = best;
        last = best;
        pos++;
    }
}

struct fake_exec {
    char                 dir[512];
    char                 url[600];
    struct proto_server *srv;
    pthread_mutex_t      mu;
    uint64_t             instance;
    /* link */
    struct common_ring_segment seg[4];
    struct common_ring         req, rep;
    uint32_t                   n_seq, n_ctx, n_vocab;
    pthread_t                  thr;
    bool                       running;
    atomic_bool                stop;
    atomic_int                 step_delay_us;
    atomic_bool                hang;        /* stop answering steps (simulated death) */
    atomic_uint                hang_at;     /* when > 0: hang once n_steps reaches it (cleared
                                               by the next ATTACH) */
    atomic_uint                n_steps;     /* EVALs answered */
    atomic_uint                n_attaches;  /* ATTACHes accepted */
    atomic_uint                n_more;      /* records flagged PROTO_STEP_F_MORE */
    atomic_uint                max_n;       /* the most tokens one EVAL carried */
    atomic_int                 force_plus1; /* when > 0: token force_plus1 - 1 wins at even
                                               positions (a chosen token in the stream) */
    uint32_t len[FAKE_MAX_SEQ];
    int32_t  hist[FAKE_MAX_SEQ][FAKE_MAX_CTX];
};

static void *fake_exec_loop(void *arg)
{
    struct fake_exec *f = arg;
    while (!atomic_load(&f->stop)) {
        if (atomic_load(&f->hang)) {
            usleep(1000);
            continue;
        }
        struct proto_step_req q;
        int                   rc = common_ring_pop_wait(&f->req, &q, sizeof(q), 20);
        if (rc != (int)sizeof(q))
            continue;
        if (q.flags & PROTO_STEP_F_MORE)
            atomic_fetch_add(&f->n_more, 1);
        if (q.op == PROTO_STEP_EVAL && q.n > atomic_load(&f->max_n))
            atomic_store(&f->max_n, q.n);
        int us = atomic_load(&f->step_delay_us);
        if (us)
            usleep((useconds_t)us);
        struct proto_step_rep p = {.tag = q.tag, .seq = q.seq};
        const int32_t        *row = (const int32_t *)f->seg[2].mem + (size_t)q.seq * f->n_ctx;
        float                *lg = (float *)f->seg[3].mem + (size_t)q.seq * f->n_vocab;
        if (q.op != PROTO_STEP_EVAL || q.seq >= f->n_seq || q.n == 0 ||
            (uint64_t)q.pos + q.n > f->n_ctx || (q.pos != 0 && q.pos != f->len[q.seq])) {
            p.status = COMMON_EINVAL;
        } else {
            for (uint32_t i = 0; i < q.n; i++)
                f->hist[q.seq][q.pos + i] = row[q.pos + i];
            f->len[q.seq] = q.pos + q.n;
            uint32_t last = f->len[q.seq] - 1;
            for (uint32_t v = 0; v < f->n_vocab; v++)
                lg[v] = fake_logit(f->hist[q.seq][last], last, v);
            int force = atomic_load(&f->force_plus1);
            if (force > 0 && (uint32_t)force <= f->n_vocab && last % 2 == 0)
                lg[force - 1] = 1000.0f;
            p.n_past = f->len[q.seq];
            const unsigned done = atomic_fetch_add(&f->n_steps, 1) + 1,
                           at = atomic_load(&f->hang_at);
            if (at && done >= at)
                atomic_store(&f->hang, true); /* this step is answered, none after it */
        }
        while (common_ring_push_wait(&f->rep, &p, sizeof(p), 20) == COMMON_ETIMEDOUT &&
               !atomic_load(&f->stop)) {
        }
    }
    return NULL;
}

/* Drops the link (thread, mappings). Under f->mu. */
static void fake_exec_unlink(struct fake_exec *f)
{
    if (f->running) {
        atomic_store(&f->stop, true);
        pthread_join(f->thr, NULL);
        f->running = false;
    }
    for (int i = 0; i < 4; i++)
        common_ring_segment_close(&f->seg[i]);
    memset(f->seg, 0, sizeof(f->seg));
    memset(f->len, 0, sizeof(f->len));
}

static int fake_exec_handler(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    struct fake_exec *f = arg;
    if (req->kind == PROTO_KIND_HELLO) {
        rep->kind = PROTO_KIND_HELLO;
        memset(&rep->u.hello, 0, sizeof(rep->u.hello));
        rep->u.hello.major = PROTO_VERSION_MAJOR;
        rep->u.hello.minor = PROTO_VERSION_MINOR;
        rep->u.hello.role = PROTO_ROLE_EXECUTOR;
        snprintf(rep->u.hello.name, sizeof(rep->u.hello.name), "fake-executor");
        rep->u.hello.pid = (uint32_t)getpid();
        pthread_mutex_lock(&f->mu);
        rep->u.hello.instance = f->instance;
        pthread_mutex_unlock(&f->mu);
        return 0;
    }
    if (req->kind != PROTO_KIND_ATTACH)
        return COMMON_EPROTO;
    const struct proto_attach *a = &req->u.attach;
    if (a->n_segments != 4 || a->params[1] > FAKE_MAX_SEQ || a->params[2] > FAKE_MAX_CTX ||
        a->params[0] != PROTO_STEP_RING_SLOTS)
        return COMMON_EINVAL;
    pthread_mutex_lock(&f->mu);
    fake_exec_unlink(f);
    int rc = 0;
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = common_ring_segment_open(f->dir, a->segments[i], &f->seg[i]);
    if (rc == 0)
        rc = common_ring_attach(f->seg[0].mem, f->seg[0].bytes, sizeof(struct proto_step_req),
                                a->params[0], &f->req);
    if (rc == 0)
        rc = common_ring_attach(f->seg[1].mem, f->seg[1].bytes, sizeof(struct proto_step_rep),
                                a->params[0], &f->rep);
    f->n_seq = a->params[1];
    f->n_ctx = a->params[2];
    f->n_vocab = a->params[3];
    if (rc == 0 && (f->seg[2].bytes < (size_t)f->n_seq * f->n_ctx * 4 ||
                    f->seg[3].bytes < (size_t)f->n_seq * f->n_vocab * 4))
        rc = COMMON_EINVAL;
    if (rc == 0) {
        atomic_store(&f->stop, false);
        atomic_store(&f->hang, false);
        atomic_store(&f->hang_at, 0);
        rc = pthread_create(&f->thr, NULL, fake_exec_loop, f) == 0 ? 0 : COMMON_ENOMEM;
        f->running = rc == 0;
        atomic_fetch_add(&f->n_attaches, 1);
    }
    if (rc < 0)
        fake_exec_unlink(f);
    pthread_mutex_unlock(&f->mu);
    if (rc < 0)
        return rc;
    rep->kind = PROTO_KIND_OK;
    return 0;
}

static inline int fake_exec_start(struct fake_exec *f, const char *dir)
{
    memset(f, 0, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    snprintf(f->dir, sizeof(f->dir), "%s", dir);
    snprintf(f->url, sizeof(f->url), "ipc://%s/executor.ctl", dir);
    f->instance = 1000;
    struct proto_server_opts o = {.n_workers = 2};
    return proto_server_start(f->url, &o, fake_exec_handler, f, &f->srv, NULL);
}

/* A restart as the router sees it: steps stop being answered, the instance changes. */
static inline void fake_exec_restart(struct fake_exec *f)
{
    atomic_store(&f->hang, true);
    pthread_mutex_lock(&f->mu);
    f->instance++;
    pthread_mutex_unlock(&f->mu);
}

static inline void fake_exec_stop(struct fake_exec *f)
{
    proto_server_stop(f->srv);
    pthread_mutex_lock(&f->mu);
    fake_exec_unlink(f);
    pthread_mutex_unlock(&f->mu);
    pthread_mutex_destroy(&f->mu);
}

#endif /* TESTS_ROUTER_FAKE_EXEC_H */
