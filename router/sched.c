/* router/sched.c - the router's requests and its scheduler thread: sequences stepped on the
 * executor's rings, tokens sampled and emitted, replay after an executor restart. */
#include "serve_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- requests ----------------------------------------------------------------------------- */

void router_rq_free(struct rq *r)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < r->n_stops; i++)
        free(r->stops[i]);
    router_tokens_fini(&r->all);
    if (r->sampler_ok)
        router_sampler_fini(&r->sampler);
    if (r->stop_ok)
        router_stop_fini(&r->stop);
    router_tokens_fini(&r->ev_tokens);
    router_tokens_fini(&r->ev_off);
    router_text_fini(&r->ev_text);
    free(r);
}

/* Under the lock: the request with `id` that a client may still poll, or NULL. */
struct rq *router_rq_find(struct router_serve *s, uint64_t id)
{
    for (struct rq *r = s->head; r; r = r->next)
        if (r->id == id && !r->superseded && (!r->delivered || r->acks))
            return r;
    return NULL;
}

/* Under the lock: ends a request (first reason wins) and wakes its pollers. */
void router_rq_finish(struct router_serve *s, struct rq *r, enum proto_stop_reason reason, int code,
                      const char *text)
{
    if (r->done)
        return;
    r->done = true;
    r->reason = reason;
    r->t_end = common_now_ns();
    if (reason == PROTO_STOP_ERROR) {
        r->err_code = code;
        snprintf(r->err_text, sizeof(r->err_text), "%s", text ? text : "");
        s->c_failed++;
    } else if (reason == PROTO_STOP_CANCEL) {
        s->c_cancelled++;
    } else {
        s->c_done++;
    }
    pthread_cond_broadcast(&s->cv_events);
    pthread_cond_signal(&s->cv_sched);
}

/* Under the lock: queues the text and token of one step for the pollers. */
int router_rq_emit(struct rq *r, const int32_t *id, const char *text, size_t len)
{
    int rc = 0;
    if (len && (rc = router_text_append(&r->ev_text, text, len)) < 0)
        return rc;
    if (id) {
        if ((rc = router_tokens_push(&r->ev_tokens, *id)) < 0)
            return rc;
        if ((rc = router_tokens_push(&r->ev_off, (int32_t)r->ev_text.len)) < 0) {
            r->ev_tokens.n--;
            return rc;
        }
    } else if (r->ev_off.n) {
        r->ev_off.ids[r->ev_off.n - 1] = (int32_t)r->ev_text.len; /* tail text rides along */
    }
    return 0;
}

/* ---- scheduler ---------------------------------------------------------------------------- */

static uint32_t serve_client_timeout_ms(const struct router_serve *s)
{
    return (s->o.client_timeout_s ? s->o.client_timeout_s : 60) * 1000u;
}

/* Under the lock: releases finished requests' slots, drops abandoned ones, frees polled ones. */
static void sched_reap(struct router_serve *s, uint64_t now)
{
    struct rq **pp = &s->head;
    while (*pp) {
        struct rq *r = *pp;
        bool       stale = r->n_pollers == 0 && now > r->last_seen_ns &&
                     now - r->last_seen_ns > (uint64_t)serve_client_timeout_ms(s) * 1000000ull;
        if (stale && !r->done) {
            COMMON_LOG_INFO(SERVE_COMP, "dropping request id=%llu: no poll for %u s",
                            (unsigned long long)r->id, serve_client_timeout_ms(s) / 1000);
            s->c_dropped++;
            router_rq_finish(s, r, PROTO_STOP_CANCEL, 0, NULL);
        }
        if (r->done && r->state == RQ_ACTIVE && r->tag == 0) {
            s->slots[r->seq] = NULL;
            r->seq = -1;
            r->state = RQ_DONE;
            s->n_active--;
            pthread_cond_broadcast(&s->cv_events);
        } else if (r->done && r->state == RQ_QUEUED) {
            r->state = RQ_DONE;
            s->n_queued--;
            pthread_cond_broadcast(&s->cv_events);
        }
        /* A delivered request of an acknowledging client lingers for a retried final poll. */
        uint64_t linger_ms = serve_client_timeout_ms(s) < SERVE_DONE_LINGER_MS
                                 ? serve_client_timeout_ms(s)
                                 : SERVE_DONE_LINGER_MS;
        bool     gone = r->superseded || (r->delivered && !r->acks) ||
                    (r->delivered && now > r->last_seen_ns &&
                     now - r->last_seen_ns > linger_ms * 1000000ull);
        if (r->state == RQ_DONE && r->n_pollers == 0 && (gone || stale)) {
            *pp = r->next;
            router_rq_free(r);
            pthread_cond_broadcast(&s->cv_events);
            continue;
        }
        pp = &r->next;
    }
}

/* Sets up sampler and stop tracking of a request becoming active, replaying the tokens of a
 * resumed one. Returns 0, a proto_stop_reason > 0 (a resumed request that had ended) or a
 * negative common_err (message in err). Scheduler, unlocked. */
static int sched_activate(struct router_serve *s, struct rq *r, struct router_text *tail, char *err,
                          size_t err_len)
{
    const struct proto_sampling *p = &r->sampling;
    struct router_sampler_opts   so = {
          .temperature = p->temp,
          .top_k = p->top_k,
          .top_p = p->top_p,
          .min_p = p->min_p,
          .repeat_penalty = p->repeat_penalty,
          .frequency_penalty = r->frequency_penalty,
          .presence_penalty = r->presence_penalty,
          .penalty_last_n = (int32_t)p->repeat_last_n,
          .seed = p->seed,
    };
    int rc = router_sampler_init(&r->sampler, &so, s->n_vocab);
    if (rc < 0) {
        snprintf(err, err_len, "sampler options rejected: %s", common_strerror(rc));
        return rc;
    }
    r->sampler_ok = true;
    for (uint32_t i = 0; i < r->n_prompt; i++)
        router_sampler_accept(&r->sampler, r->all.ids[i]);
    struct router_stop_opts to = {
        .stop = (const char *const *)r->stops, .n_stop = r->n_stops, .max_tokens = r->max_tokens};
    if ((rc = router_stop_init(&r->stop, s->vocab, &to)) < 0) {
        snprintf(err, err_len, "stop strings rejected: %s", common_strerror(rc));
        return rc;
    }
    r->stop_ok = true;
    /* A resumed request: its tokens go through the sampler (its PRNG and penalties) and the
     * stop tracking (the text held back for a stop string) as when they were sampled; their
     * text, which the client has, is dropped. One that had already ended ends now. */
    struct router_text scratch = {0};
    int                reason = ROUTER_STOP_NONE;
    for (uint32_t i = 0; i < r->n_resume && reason == ROUTER_STOP_NONE; i++) {
        const int32_t id = r->all.ids[r->n_prompt + i];
        router_sampler_replay(&r->sampler, id);
        router_text_clear(&scratch);
        reason = router_stop_push(&r->stop, id, &scratch);
    }
    router_text_fini(&scratch);
    /* Ended on EOS or the cap: the text held back for the stop strings goes out last. */
    if (reason > ROUTER_STOP_NONE && reason != ROUTER_STOP_STRING)
        rc = router_stop_finish(&r->stop, tail);
    if (reason < 0 || rc < 0) {
        snprintf(err, err_len, "resuming failed: %s", common_strerror(reason < 0 ? reason : rc));
        return reason < 0 ? reason : rc;
    }
    return reason == ROUTER_STOP_EOS      ? PROTO_STOP_EOS
           : reason == ROUTER_STOP_STRING ? PROTO_STOP_STRING
           : reason != ROUTER_STOP_NONE   ? PROTO_STOP_LENGTH
                                          : 0;
}

/* Under the lock: moves queued requests into free slots, in arrival order. */
static void sched_assign(struct router_serve *s)
{
    for (struct rq *r = s->head; r && s->n_queued; r = r->next) {
        if (r->state != RQ_QUEUED || r->done)
            continue;
        uint32_t slot = 0;
        while (slot < s->n_seq && s->slots[slot])
            slot++;
        if (slot == s->n_seq)
            return;
        char err[PROTO_MAX_ERROR_TEXT];
        pthread_mutex_unlock(&s->mu);
        struct router_text tail = {0};
        int                rc = sched_activate(s, r, &tail, err, sizeof(err));
        pthread_mutex_lock(&s->mu);
        r->state = RQ_ACTIVE;
        r->seq = (int)slot;
        s->slots[slot] = r;
        s->n_queued--;
        s->n_active++;
        if (rc < 0)
            router_rq_finish(s, r, PROTO_STOP_ERROR, rc, err);
        else if (rc > 0) { /* resumed after its end: at most the held-back text to send */
            if (tail.len && (rc = router_rq_emit(r, NULL, tail.ptr, tail.len)) < 0)
                router_rq_finish(s, r, PROTO_STOP_ERROR, rc, "out of memory");
            else
                router_rq_finish(s, r, (enum proto_stop_reason)rc, 0, NULL);
        }
        router_text_fini(&tail);
    }
}

/* The executor died or restarted: wait for it, re-create the link, and rewind every active
 * request so the next rounds replay its prompt and tokens. */
static void sched_recover(struct router_serve *s)
{
    atomic_store(&s->recover_beat_ns, common_now_ns());
    pthread_mutex_lock(&s->mu);
    s->degraded = true;
    pthread_mutex_unlock(&s->mu);
    /* Tests: SLUICE_TEST_ROUTER_WEDGE=FILE makes the first wait after FILE appears hang, as a
     * call that never returns would (FILE is removed: a restarted router does not hang). */
    const char *wedge = getenv("SLUICE_TEST_ROUTER_WEDGE");
    if (wedge && unlink(wedge) == 0)
        for (;;)
            serve_sleep_ms(1000);
    router_exec_segments_close(s);
    COMMON_LOG_WARN(SERVE_COMP, "executor lost (pid %u); waiting for it to come back", s->exec_pid);
    uint32_t timeout_s = s->o.connect_timeout_s ? s->o.connect_timeout_s : 30;
    uint64_t deadline = common_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    bool     failed = false;
    for (;;) {
        /* One deadline for the whole wait: an executor that dies again while it attaches (the
         * supervisor restarts it once more) is waited for within the same time. */
        struct common_errmsg e = {{0}};
        uint64_t             now = common_now_ns();
        atomic_store(&s->recover_beat_ns, now);
        uint32_t left_s = now >= deadline ? 1 : (uint32_t)((deadline - now) / 1000000000ull) + 1;
        int      rc = router_exec_connect(s, left_s, true, &e);
        if (rc == 0)
            rc = router_exec_attach(s, &e);
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        bool late = common_now_ns() >= deadline;
        if (rc < 0 && late && !stopping) {
            /* Too long: fail the work in flight, and what comes while it keeps waiting for new
             * work's sake (a clear error rather than a request that waits for ever). */
            if (!failed)
                COMMON_LOG_ERR(SERVE_COMP, "executor did not come back: %s", e.text);
            for (struct rq *r = s->head; r; r = r->next)
                if (!r->done)
                    router_rq_finish(s, r, PROTO_STOP_ERROR, COMMON_ECLOSED,
                                     "the executor died and did not come back");
            failed = true;
        }
        if (rc < 0 && failed && s->draining) {
            /* Stopping without an executor: no round of the failed requests is in flight any
             * more, so their slots go and the drain can end. */
            for (uint32_t i = 0; i < s->n_seq; i++)
                if (s->slots[i])
                    s->slots[i]->tag = 0;
            pthread_mutex_unlock(&s->mu);
            atomic_store(&s->recover_beat_ns, 0);
            return;
        }
        if (rc == 0 || stopping) {
            if (rc == 0) {
                s->degraded = false;
                s->c_exec_restarts++;
                for (uint32_t i = 0; i < s->n_seq; i++) {
                    struct rq *r = s->slots[i];
                    if (r) {
                        r->tag = 0;
                        if (r->n_past) {
                            r->n_past = 0;
                            s->c_replays++;
                        }
                    }
                }
                COMMON_LOG_INFO(SERVE_COMP, "executor back (pid %u); replaying %u sequences",
                                s->exec_pid, s->n_active);
            }
            pthread_mutex_unlock(&s->mu);
            atomic_store(&s->recover_beat_ns, 0);
            return;
        }
        pthread_mutex_unlock(&s->mu);
        serve_sleep_ms(200);
    }
}

/* A failed step's reason, which the executor wrote in the sequence's logits row (the slab is
 * shared memory: read within the row and PROTO_MAX_ERROR_TEXT, whatever the bytes are). */
static void router_step_error_text(const struct router_serve *s, uint32_t seq, int status,
                                   char *msg, size_t len)
{
    char         why[PROTO_MAX_ERROR_TEXT];
    const size_t row = (size_t)s->n_vocab * sizeof(float);
    const size_t n = row < sizeof(why) ? row : sizeof(why);
    memcpy(why, (const char *)(s->logits + (size_t)seq * s->n_vocab), n);
    why[n - 1] = '\0';
    for (char *c = why; *c; c++) /* one line of printable text */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = ' ';
    if (why[0])
        snprintf(msg, len, "executor step failed: %.230s", why);
    else
        snprintf(msg, len, "executor step failed: %s", common_strerror(status));
}

/* Picks and records the next token of `r` from its logits row; emits it. Scheduler thread. */
static void sched_sample(struct router_serve *s, struct rq *r, struct router_text *piece)
{
    const float *row = s->logits + (size_t)r->seq * s->n_vocab;
    int32_t      id = 0;
    int          rc = 0;
    rc = router_sampler_pick(&r->sampler, row, &id); /* greedy at temperature 0 */
    router_text_clear(piece);
    int reason = ROUTER_STOP_NONE;
    if (rc == 0 && (rc = router_tokens_push(&r->all, id)) == 0) {
        router_sampler_accept(&r->sampler, id);
        reason = router_stop_push(&r->stop, id, piece);
        if (reason < 0)
            rc = reason;
    }
    enum proto_stop_reason pr = PROTO_STOP_NONE;
    if (rc == 0) {
        if (reason == ROUTER_STOP_EOS)
            pr = PROTO_STOP_EOS;
        else if (reason == ROUTER_STOP_STRING)
            pr = PROTO_STOP_STRING;
        else if (reason == ROUTER_STOP_MAX_TOKENS)
            pr = PROTO_STOP_LENGTH;
        else if (r->all.n - 1 >= s->n_ctx)
            pr = PROTO_STOP_CONTEXT; /* every position used: the token cannot be fed */
    }
    size_t tail = piece->len;
    if (rc == 0 && pr != PROTO_STOP_NONE && pr != PROTO_STOP_STRING)
        rc = router_stop_finish(&r->stop, piece);
    pthread_mutex_lock(&s->mu);
    if (!r->done) {
        if (rc == 0) {
            r->n_generated++;
            s->c_gen_tokens++;
            rc = router_rq_emit(r, &id, piece->ptr, tail);
            if (rc == 0 && piece->len > tail)
                rc = router_rq_emit(r, NULL, piece->ptr + tail, piece->len - tail);
        }
        if (rc < 0)
            router_rq_finish(s, r, PROTO_STOP_ERROR, rc, "sampling failed");
        else if (pr != PROTO_STOP_NONE)
            router_rq_finish(s, r, pr, 0, NULL);
        else if (!r->gathering)
            pthread_cond_broadcast(&s->cv_events);
    }
    pthread_mutex_unlock(&s->mu);
}

/* One round: an EVAL for every request in batch[0..n), then their replies. Returns false when
 * the executor was lost (the caller recovers). */
static bool sched_round(struct router_serve *s, struct rq **batch, uint32_t n,
                        struct router_text *piece)
{
    uint32_t       outstanding = 0;
    const uint32_t chunk = s->o.prefill_chunk ? s->o.prefill_chunk : 512;
    const uint64_t t_round = common_now_ns();
    for (uint32_t i = 0; i < n; i++) {
        struct rq *r = batch[i];
        int32_t   *row = s->tokens + (size_t)r->seq * s->n_ctx;
        /* The next piece of the prompt, or one token (sampled, or replayed after an executor
         * restart); all but the round's last record say more follow, so the executor runs the
         * round as one batch. */
        struct proto_step_req q = {.op = PROTO_STEP_EVAL,
                                   .seq = (uint32_t)r->seq,
                                   .pos = r->n_past,
                                   .flags = i + 1 < n ? PROTO_STEP_F_MORE : 0};
        if (r->n_past < r->n_prompt)
            q.n = r->n_prompt - r->n_past < chunk ? r->n_prompt - r->n_past : chunk;
        else
            q.n = 1;
        memcpy(row + r->n_past, r->all.ids + r->n_past, (size_t)q.n * sizeof(*row));
        r->step_n = q.n;
        q.tag = ++s->next_tag;
        if (r->t_start == 0) {
            pthread_mutex_lock(&s->mu);
            r->t_start = common_now_ns();
            pthread_mutex_unlock(&s->mu);
        }
        r->t_push = common_now_ns();
        int rc = common_ring_push_wait(&s->req_ring, &q, sizeof(q), 5000);
        if (rc < 0) {
            COMMON_LOG_WARN(SERVE_COMP, "step ring push failed: %s", common_strerror(rc));
            return false;
        }
        r->tag = q.tag;
        outstanding++;
    }
    uint64_t last_hello = common_now_ns();
    int      wait_ms = (int)(s->o.exec_wait_ms ? s->o.exec_wait_ms : 200);
    while (outstanding) {
        struct proto_step_rep p;
        int                   rc = common_ring_pop_wait(&s->rep_ring, &p, sizeof(p), wait_ms);
        if (rc == COMMON_ETIMEDOUT) {
            pthread_mutex_lock(&s->mu);
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (stopping || !router_exec_is_alive(s, &last_hello))
                return false;
            continue;
        }
        if (rc < 0) {
            COMMON_LOG_WARN(SERVE_COMP, "step ring broken: %s", common_strerror(rc));
            return false;
        }
        if (rc != (int)sizeof(p)) {
            COMMON_LOG_WARN(SERVE_COMP, "step reply of %d bytes ignored", rc);
            continue;
        }
        struct rq *r = NULL;
        for (uint32_t i = 0; i < n && !r; i++)
            if (batch[i]->tag == p.tag && p.tag != 0 && batch[i]->seq == (int)p.seq)
                r = batch[i];
        if (!r) {
            COMMON_LOG_DEBUG(SERVE_COMP, "stale step reply tag=%llu ignored",
                             (unsigned long long)p.tag);
            continue;
        }
        outstanding--;
        r->tag = 0;
        pthread_mutex_lock(&s->mu);
        s->c_steps++;
        s->step_wall_ns += common_now_ns() - r->t_push;
        s->step_exec_ms += p.ms;
        pthread_mutex_unlock(&s->mu);
        uint32_t want = r->n_past + r->step_n;
        if (p.status < 0 || p.n_past != want) {
            char msg[PROTO_MAX_ERROR_TEXT];
            if (p.status < 0 && (p.flags & PROTO_STEP_REP_TEXT) && s->n_vocab > 0)
                router_step_error_text(s, p.seq, p.status, msg, sizeof(msg));
            else if (p.status < 0)
                snprintf(msg, sizeof(msg), "executor step failed: %s", common_strerror(p.status));
            else
                snprintf(msg, sizeof(msg), "executor holds %u positions, expected %u", p.n_past,
                         want);
            pthread_mutex_lock(&s->mu);
            router_rq_finish(s, r, PROTO_STOP_ERROR, p.status < 0 ? p.status : COMMON_EPROTO, msg);
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        r->n_past = want;
        if (r->n_past < r->n_prompt)
            continue; /* more of the prompt next round */
        if (r->n_past == r->n_prompt && r->t_prompt == 0) {
            pthread_mutex_lock(&s->mu);
            r->t_prompt = common_now_ns();
            pthread_mutex_unlock(&s->mu);
        }
        if (r->n_past < r->all.n)
            continue; /* replaying after an executor restart */
        pthread_mutex_lock(&s->mu);
        bool done = r->done;
        pthread_mutex_unlock(&s->mu);
        if (!done)
            sched_sample(s, r, piece);
    }
    pthread_mutex_lock(&s->mu);
    s->c_rounds++;
    s->round_wall_ns += common_now_ns() - t_round;
    pthread_mutex_unlock(&s->mu);
    return true;
}

void *router_sched_main(void *arg)
{
    struct router_serve *s = arg;
    struct router_text   piece = {0};
    struct rq          **batch = calloc(s->n_seq, sizeof(*batch));
    uint64_t             last_hello = common_now_ns();
    pthread_mutex_lock(&s->mu);
    while (!s->stopping && batch) {
        sched_reap(s, common_now_ns());
        if (!s->degraded)
            sched_assign(s);
        uint32_t n = 0;
        for (uint32_t i = 0; i < s->n_seq; i++)
            if (s->slots[i] && !s->slots[i]->done)
                batch[n++] = s->slots[i];
        if (n == 0 && !s->degraded) {
            /* Idle: an executor that died or was restarted meanwhile is noticed now (its pid
             * gone, or a HELLO every 2 s naming another instance), not by the next request, so
             * that health and metrics say so and the link is made again before work comes. */
            pthread_mutex_unlock(&s->mu);
            const bool alive = router_exec_is_alive(s, &last_hello);
            pthread_mutex_lock(&s->mu);
            if (!alive && !s->stopping) {
                pthread_mutex_unlock(&s->mu);
                sched_recover(s);
                pthread_mutex_lock(&s->mu);
                last_hello = common_now_ns();
                continue;
            }
        }
        if (n == 0) {
            struct timespec ts;
            serve_deadline_after(&ts, 100);
            pthread_cond_timedwait(&s->cv_sched, &s->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        bool ok = sched_round(s, batch, n, &piece);
        if (!ok) {
            pthread_mutex_lock(&s->mu);
            bool stopping = s->stopping;
            pthread_mutex_unlock(&s->mu);
            if (!stopping)
                sched_recover(s);
        }
        pthread_mutex_lock(&s->mu);
        if (!ok && s->stopping) {
            for (uint32_t i = 0; i < n; i++)
                batch[i]->tag = 0;
        }
    }
    pthread_mutex_unlock(&s->mu);
    free(batch);
    router_text_fini(&piece);
    return NULL;
}
