/* router/handlers.c - the router's client API: GENERATE (tokenize, queue), POLL, CANCEL. */
#include "serve_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool finite_in(float v, float lo, float hi)
{
    return isfinite(v) && v >= lo && v <= hi;
}

/* FNV-1a over `len` bytes, continuing from `h`. */
static uint64_t fnv_bytes(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fnv_str(uint64_t h, const char *s)
{
    return s ? fnv_bytes(h, s, strlen(s) + 1) : fnv_bytes(h, "", 0);
}

/* What identifies a GENERATE beyond its id: a client that re-sends one after losing the reply
 * (the connection closed) sends the same bytes, and gets OK instead of "id in use". */
static uint64_t generate_fingerprint(const struct proto_generate *g)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv_str(h, g->prompt);
    for (uint32_t i = 0; i < g->n_messages && i < PROTO_MAX_MESSAGES; i++) {
        h = fnv_bytes(h, g->messages[i].role, strnlen(g->messages[i].role, PROTO_MAX_ROLE));
        h = fnv_str(h, g->messages[i].content);
    }
    for (uint32_t i = 0; i < g->n_stops && i < PROTO_MAX_STOPS; i++)
        h = fnv_bytes(h, g->stops[i], strnlen(g->stops[i], PROTO_MAX_STOP_LEN));
    const struct proto_sampling *p = &g->sampling;
    uint64_t                     fields[] = {g->max_tokens,    g->stream,  g->special,
                                             g->n_messages,    g->n_stops, (uint64_t)(int64_t)p->top_k,
                                             p->repeat_last_n, p->seed};
    float                        reals[] = {p->temp, p->top_p, p->min_p, p->repeat_penalty};
    h = fnv_bytes(h, &g->n_resume, sizeof(g->n_resume));
    h = fnv_bytes(h, fields, sizeof(fields));
    return fnv_bytes(h, reals, sizeof(reals));
}

int router_handle_generate(struct router_serve *s, const struct proto_msg *req,
                           struct proto_msg *rep)
{
    return router_rq_submit(s, req->request_id, &req->u.generate, NULL, rep);
}

int router_rq_submit(struct router_serve *s, uint64_t id, const struct proto_generate *g,
                     const struct serve_gen_extra *x, struct proto_msg *rep)
{
    const struct proto_sampling *p = &g->sampling;
    if (id == 0)
        return proto_reply_error(rep, COMMON_EINVAL, "request id 0 is reserved");
    if (!finite_in(p->temp, 0.0f, 100.0f) || p->top_k < 0 || !finite_in(p->top_p, 0.0f, 1.0f) ||
        !finite_in(p->min_p, 0.0f, 1.0f) || !finite_in(p->repeat_penalty, 0.0f, 100.0f) ||
        p->repeat_last_n > 4096 ||
        (x && (!finite_in(x->presence_penalty, -2.0f, 2.0f) ||
               !finite_in(x->frequency_penalty, -2.0f, 2.0f))))
        return proto_reply_error(
            rep, COMMON_EINVAL,
            "sampling values out of range: temp in 0..100, top_k >= 0, top_p and "
            "min_p in 0..1, repeat_penalty in 0..100, repeat_last_n <= 4096, presence and "
            "frequency penalties in -2..2");
    if (!g->prompt && g->n_messages == 0)
        return proto_reply_error(rep, COMMON_EINVAL, "no prompt and no messages");
    if (g->prompt && g->n_messages)
        return proto_reply_error(rep, COMMON_EINVAL, "give a prompt or messages, not both");
    if (g->prompt && !g->prompt[0])
        return proto_reply_error(rep, COMMON_EINVAL, "empty prompt");
    if (g->n_stops > PROTO_MAX_STOPS)
        return proto_reply_error(rep, COMMON_EINVAL, "too many stop strings");
    for (uint32_t i = 0; i < g->n_stops; i++)
        if (!g->stops[i][0] || !memchr(g->stops[i], 0, PROTO_MAX_STOP_LEN))
            return proto_reply_error(rep, COMMON_EINVAL, "stop string %u is empty or too long", i);

    struct router_text   text = {0};
    struct router_tokens toks = {0};
    int                  rc = 0;
    const char          *src = g->prompt;
    size_t               src_len = g->prompt ? strlen(g->prompt) : 0;
    bool                 parse_special = g->special;
    if (g->n_messages) {
        struct router_chat_msg msgs[PROTO_MAX_MESSAGES];
        uint32_t               nm = g->n_messages < PROTO_MAX_MESSAGES ? g->n_messages : 0;
        for (uint32_t i = 0; i < nm; i++) {
            const struct proto_chat_msg *m = &g->messages[i];
            if (!memchr(m->role, 0, sizeof(m->role)) || !m->role[0] || !m->content)
                return proto_reply_error(rep, COMMON_EINVAL, "message %u has no role or content",
                                         i);
            msgs[i] = (struct router_chat_msg){.role = m->role, .content = m->content};
        }
        rc = router_chat_render(s->tmpl, msgs, nm,
                                &(struct router_chat_opts){.add_generation_prompt = true}, &text);
        if (rc < 0) {
            router_text_fini(&text);
            return proto_reply_error(rep, rc, "chat template %s failed", router_chat_name(s->tmpl));
        }
        src = text.ptr ? text.ptr : "";
        src_len = text.len;
        parse_special = true; /* as `sluice chat` tokenizes a rendered conversation */
    }
    rc = router_tokenize(
        s->vocab, src, src_len,
        &(struct router_tokenize_opts){.add_special = true, .parse_special = parse_special}, &toks);
    router_text_fini(&text);
    if (rc < 0) {
        router_tokens_fini(&toks);
        return proto_reply_error(rep, rc, "tokenizing the prompt failed");
    }
    if (toks.n == 0) {
        router_tokens_fini(&toks);
        return proto_reply_error(rep, COMMON_EINVAL, "the prompt has no tokens");
    }
    if (toks.n > s->n_ctx) {
        size_t n = toks.n;
        router_tokens_fini(&toks);
        return proto_reply_error(rep, COMMON_ERANGE,
                                 "the prompt has %zu tokens but the context holds %u", n, s->n_ctx);
    }
    /* A resumed request: the tokens the client already received follow the prompt. */
    const size_t n_prompt = toks.n;
    if (g->n_resume > 0 && (size_t)g->n_resume >= (size_t)s->n_ctx - n_prompt + 1) {
        router_tokens_fini(&toks);
        return proto_reply_error(rep, COMMON_ERANGE,
                                 "%zu prompt and %u resumed tokens do not fit the context of %u",
                                 n_prompt, g->n_resume, s->n_ctx);
    }
    for (uint32_t i = 0; i < g->n_resume && rc == 0; i++) {
        if (g->resume[i] < 0 || (uint32_t)g->resume[i] >= s->n_vocab)
            rc = proto_reply_error(rep, COMMON_EINVAL, "resumed token %u (%d) is not in 0..%u", i,
                                   g->resume[i], s->n_vocab - 1);
        else
            rc = router_tokens_push(&toks, g->resume[i]);
    }
    if (rc < 0) {
        router_tokens_fini(&toks);
        return rc;
    }

    struct rq *r = calloc(1, sizeof(*r));
    if (!r) {
        router_tokens_fini(&toks);
        return COMMON_ENOMEM;
    }
    r->id = id;
    r->fingerprint = generate_fingerprint(g);
    r->seq = -1;
    r->sampling = *p;
    if (x) {
        r->presence_penalty = x->presence_penalty;
        r->frequency_penalty = x->frequency_penalty;
    }
    r->max_tokens = g->max_tokens;
    r->stream = g->stream;
    r->all = toks;
    r->n_prompt = (uint32_t)n_prompt;
    r->n_resume = g->n_resume;
    r->n_generated = g->n_resume;
    r->ev_base_tokens = g->n_resume; /* the client acknowledges from what it has */
    r->ev_base_bytes = g->resume_bytes;
    for (uint32_t i = 0; i < g->n_stops; i++) {
        if (!(r->stops[i] = strdup(g->stops[i]))) {
            router_rq_free(r);
            return COMMON_ENOMEM;
        }
        r->n_stops++;
    }
    r->t_submit = r->last_seen_ns = common_now_ns();

    pthread_mutex_lock(&s->mu);
    uint32_t   queue_max = s->o.queue_max ? s->o.queue_max : 64;
    struct rq *same = router_rq_find(s, r->id);
    if (same && same->delivered) {
        same->superseded = true; /* finished and delivered: the id is free again */
        same = NULL;
    }
    if (same && same->fingerprint == r->fingerprint) {
        rc = 1; /* this GENERATE again, its reply lost: it runs already */
    } else if (same) {
        rc = proto_reply_error(rep, COMMON_EINVAL, "request id %llu is in use",
                               (unsigned long long)r->id);
    } else if (s->draining) {
        rc = proto_reply_error(rep, COMMON_EBUSY, "the router is draining: no new requests");
    } else if (s->n_queued >= queue_max) {
        rc = proto_reply_error(rep, COMMON_EBUSY, "queue full: %u requests waiting (--queue)",
                               s->n_queued);
    } else {
        struct rq **pp = &s->head;
        while (*pp)
            pp = &(*pp)->next;
        *pp = r;
        s->n_queued++;
        s->c_submitted++;
        s->c_prompt_tokens += r->n_prompt;
        if (r->n_resume)
            COMMON_LOG_INFO(SERVE_COMP, "request %llu resumed after %u tokens",
                            (unsigned long long)r->id, r->n_resume);
        pthread_cond_signal(&s->cv_sched);
        r = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (r) {
        router_rq_free(r);
        if (rc <= 0)
            return rc;
    }
    rep->kind = PROTO_KIND_OK;
    return 0;
}

/* Drops the front `d` tokens and `b` text bytes of the pending events. Under the lock. */
static void rq_drop_front(struct rq *r, size_t d, size_t b)
{
    if (d) { /* ids is NULL until a token came (memmove wants non-NULL) */
        memmove(r->ev_tokens.ids, r->ev_tokens.ids + d, (r->ev_tokens.n - d) * sizeof(int32_t));
        r->ev_tokens.n -= d;
    }
    for (size_t i = d; i < r->ev_off.n; i++)
        r->ev_off.ids[i - d] = r->ev_off.ids[i] - (int32_t)b;
    r->ev_off.n -= d;
    if (b)
        memmove(r->ev_text.ptr, r->ev_text.ptr + b, r->ev_text.len - b);
    r->ev_text.len -= b;
    if (r->ev_text.ptr)
        r->ev_text.ptr[r->ev_text.len] = '\0';
    r->ev_base_tokens += d;
    r->ev_base_bytes += b;
}

/* Drops what the client acknowledged (counts from the request's start). A POLL that
 * acknowledges less than an earlier one is a late copy whose reply nobody reads; one that
 * acknowledges more than was sent is a broken client: both get COMMON_EINVAL and change
 * nothing. Under the lock. */
static int rq_drop_acked(struct rq *r, uint64_t tokens, uint64_t bytes, char *why, size_t why_len)
{
    if (tokens < r->ev_base_tokens || bytes < r->ev_base_bytes ||
        tokens - r->ev_base_tokens > r->ev_tokens.n || bytes - r->ev_base_bytes > r->ev_text.len) {
        snprintf(why, why_len,
                 "POLL acknowledges %llu tokens and %llu bytes; the router holds tokens "
                 "[%llu, %llu) and bytes [%llu, %llu)",
                 (unsigned long long)tokens, (unsigned long long)bytes,
                 (unsigned long long)r->ev_base_tokens,
                 (unsigned long long)(r->ev_base_tokens + r->ev_tokens.n),
                 (unsigned long long)r->ev_base_bytes,
                 (unsigned long long)(r->ev_base_bytes + r->ev_text.len));
        return COMMON_EINVAL;
    }
    size_t d = (size_t)(tokens - r->ev_base_tokens), b = (size_t)(bytes - r->ev_base_bytes);
    for (size_t i = d; i < r->ev_off.n; i++)
        if ((size_t)r->ev_off.ids[i] < b) {
            snprintf(why, why_len, "POLL acknowledges %llu bytes inside token %llu's text",
                     (unsigned long long)bytes, (unsigned long long)(r->ev_base_tokens + i));
            return COMMON_EINVAL;
        }
    rq_drop_front(r, d, b);
    return 0;
}

/* Fills *ev with the front of the pending events (at most max_events tokens), and the final
 * state when they are all of them and the request is done. Under the lock. */
static int rq_fill_events(struct router_serve *s, struct rq *r, uint32_t max_events,
                          struct proto_events *ev, size_t *n_tokens, size_t *n_bytes)
{
    size_t k = r->ev_tokens.n < max_events ? r->ev_tokens.n : max_events;
    bool   all = k == r->ev_tokens.n;
    size_t tlen = all ? r->ev_text.len : (size_t)r->ev_off.ids[k - 1];
    *n_tokens = *n_bytes = 0;
    if (tlen) {
        if (!(ev->text = malloc(tlen + 1)))
            return COMMON_ENOMEM;
        memcpy(ev->text, r->ev_text.ptr, tlen);
        ev->text[tlen] = '\0';
        ev->text_len = (uint32_t)tlen;
    }
    ev->n_tokens = (uint32_t)k;
    if (k)
        memcpy(ev->tokens, r->ev_tokens.ids, k * sizeof(int32_t));
    *n_tokens = k;
    *n_bytes = tlen;
    if (r->done && all) {
        ev->done = true;
        ev->reason = r->reason;
        ev->error_code = r->err_code;
        snprintf(ev->error_text, sizeof(ev->error_text), "%s", r->err_text);
        ev->stats = (struct proto_final_stats){
            .n_prompt = r->n_prompt,
            .n_generated = r->n_generated,
            .queue_ms = serve_ms_between(r->t_submit, r->t_start ? r->t_start : r->t_end),
            .prompt_ms = r->t_prompt ? serve_ms_between(r->t_start, r->t_prompt) : 0.0,
            .decode_ms = r->t_prompt ? serve_ms_between(r->t_prompt, r->t_end) : 0.0,
        };
        if (!r->delivered) {
            r->delivered = true;
            pthread_cond_signal(&s->cv_sched);
        }
    }
    return 0;
}

int router_handle_poll(struct router_serve *s, const struct proto_msg *req, struct proto_msg *rep)
{
    const struct proto_poll *q = &req->u.poll;
    uint32_t                 max_events = q->max_events;
    if (max_events == 0 || max_events > PROTO_MAX_EVENT_TOKENS)
        max_events = PROTO_MAX_EVENT_TOKENS;
    uint32_t timeout_ms = q->timeout_ms;
    if (timeout_ms == 0)
        timeout_ms = s->o.poll_default_ms ? s->o.poll_default_ms : 2000;
    if (timeout_ms > SERVE_MAX_POLL_MS)
        timeout_ms = SERVE_MAX_POLL_MS;
    struct timespec ts;
    serve_deadline_after(&ts, timeout_ms);

    pthread_mutex_lock(&s->mu);
    struct rq *r = router_rq_find(s, req->request_id);
    if (!r || (r->delivered && !q->ack)) {
        pthread_mutex_unlock(&s->mu);
        return proto_reply_error(rep, COMMON_ENOENT, "no request with id %llu",
                                 (unsigned long long)req->request_id);
    }
    r->last_seen_ns = common_now_ns();
    if (q->ack) {
        char why[PROTO_MAX_ERROR_TEXT];
        r->acks = true;
        if (rq_drop_acked(r, q->ack_tokens, q->ack_bytes, why, sizeof(why)) < 0) {
            pthread_mutex_unlock(&s->mu);
            return proto_reply_error(rep, COMMON_EINVAL, "request %llu: %s",
                                     (unsigned long long)req->request_id, why);
        }
    }
    r->n_pollers++;
    for (;;) {
        bool ready = r->done || (r->stream && r->ev_tokens.n > 0);
        if (ready || s->stopping)
            break;
        if (pthread_cond_timedwait(&s->cv_events, &s->mu, &ts) == ETIMEDOUT)
            break;
    }
    /* A stream answered less than stream_ms ago gathers tokens until the interval ends (or the
     * request ends, or max_events are there): a fast generation then costs its client one
     * round trip per interval instead of one per token. */
    if (s->o.stream_ms && r->stream && r->last_reply_ns && !r->done && !s->stopping) {
        uint64_t until = r->last_reply_ns + (uint64_t)s->o.stream_ms * 1000000ull;
        if (until > common_now_ns()) {
            struct timespec gts;
            serve_deadline_after(&gts, (until - common_now_ns()) / 1000000ull + 1);
            r->gathering = true;
            while (!r->done && !s->stopping && r->ev_tokens.n < max_events &&
                   pthread_cond_timedwait(&s->cv_events, &s->mu, &gts) != ETIMEDOUT)
                ;
            r->gathering = false;
        }
    }
    struct proto_events *ev = &rep->u.events;
    memset(ev, 0, sizeof(*ev));
    rep->kind = PROTO_KIND_EVENTS;
    int rc = 0;
    if (r->stream || r->done) {
        size_t k = 0, tlen = 0;
        rc = rq_fill_events(s, r, max_events, ev, &k, &tlen);
        if (rc == 0 && !q->ack) /* 0.1 client: the reply consumes its events */
            rq_drop_front(r, k, tlen);
    }
    r->n_pollers--;
    r->last_seen_ns = common_now_ns();
    if (rep->u.events.n_tokens)
        r->last_reply_ns = r->last_seen_ns;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int router_handle_cancel(struct router_serve *s, const struct proto_msg *req, struct proto_msg *rep)
{
    pthread_mutex_lock(&s->mu);
    struct rq *r = router_rq_find(s, req->request_id);
    if (r) {
        r->last_seen_ns = common_now_ns();
        router_rq_finish(s, r, PROTO_STOP_CANCEL, 0, NULL);
    }
    pthread_mutex_unlock(&s->mu);
    if (!r)
        return proto_reply_error(rep, COMMON_ENOENT, "no request with id %llu",
                                 (unsigned long long)req->request_id);
    rep->kind = PROTO_KIND_OK;
    return 0;
}
