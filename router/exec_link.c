/* router/exec_link.c - the router's link to the executor: HELLO, the four segments, ATTACH. */
#include "serve_impl.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

const char *const router_serve_seg_names[SERVE_N_SEG] = {
    "router-exec.req", "router-exec.rep", "router-exec.tokens", "router-exec.logits"};

int router_exec_hello(struct router_serve *s, int timeout_ms, uint32_t *pid, uint64_t *instance,
                      struct common_errmsg *e)
{
    struct proto_msg req = {.kind = PROTO_KIND_HELLO, .request_id = common_random_id()}, rep;
    proto_hello_init(&req.u.hello, PROTO_ROLE_ROUTER, "router", s->instance);
    int rc = proto_client_call(s->exec, &req, &rep, timeout_ms, e);
    if (rc < 0)
        return rc;
    if (rep.kind == PROTO_KIND_ERROR) {
        rc = common_errmsg_set(e, rep.u.error.code < 0 ? rep.u.error.code : COMMON_EPROTO,
                               "executor refused HELLO: %s", rep.u.error.message);
    } else if (rep.kind != PROTO_KIND_HELLO) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "%s: answered HELLO with %s", s->exec_url,
                               proto_kind_name(rep.kind));
    } else if ((rc = proto_hello_check(&rep.u.hello, PROTO_ROLE_EXECUTOR, e)) < 0) {
        /* a peer that is not a compatible executor: e says what it is */
    } else {
        *pid = rep.u.hello.pid;
        *instance = rep.u.hello.instance;
    }
    proto_msg_clear(&rep);
    return rc;
}

void router_exec_segments_close(struct router_serve *s)
{
    for (int i = 0; i < SERVE_N_SEG; i++)
        common_ring_segment_close(&s->seg[i]);
    memset(s->seg, 0, sizeof(s->seg));
    s->tokens = NULL;
    s->logits = NULL;
}

static size_t slab_bytes(uint64_t rows, uint64_t cols)
{
    uint64_t b = rows * cols * 4u;
    return (size_t)(b < 4096 ? 4096 : (b + 4095) & ~(uint64_t)4095);
}

/* Creates the four segments (replacing stale files of a dead router) and ATTACHes them. */
int router_exec_attach(struct router_serve *s, struct common_errmsg *e)
{
    const uint32_t rs = (uint32_t)sizeof(struct proto_step_req);
    const uint32_t ps = (uint32_t)sizeof(struct proto_step_rep);
    size_t         bytes[SERVE_N_SEG] = {common_ring_bytes(rs, PROTO_STEP_RING_SLOTS),
                                         common_ring_bytes(ps, PROTO_STEP_RING_SLOTS),
                                         slab_bytes(s->n_seq, s->n_ctx), slab_bytes(s->n_seq, s->n_vocab)};
    int            rc;
    router_exec_segments_close(s);
    for (int i = 0; i < SERVE_N_SEG; i++) {
        rc =
            common_ring_segment_create(s->run_dir, router_serve_seg_names[i], bytes[i], &s->seg[i]);
        if (rc == COMMON_EBUSY) {
            char path[PROTO_MAX_PATH + 64];
            snprintf(path, sizeof(path), "%s/%s", s->run_dir, router_serve_seg_names[i]);
            unlink(path);
            rc = common_ring_segment_create(s->run_dir, router_serve_seg_names[i], bytes[i],
                                            &s->seg[i]);
        }
        if (rc < 0) {
            router_exec_segments_close(s);
            return common_errmsg_set(e, rc, "cannot create segment %s/%s: %s", s->run_dir,
                                     router_serve_seg_names[i], common_strerror(rc));
        }
    }
    if ((rc = common_ring_init(s->seg[0].mem, s->seg[0].bytes, rs, PROTO_STEP_RING_SLOTS)) < 0 ||
        (rc = common_ring_init(s->seg[1].mem, s->seg[1].bytes, ps, PROTO_STEP_RING_SLOTS)) < 0 ||
        (rc = common_ring_attach(s->seg[0].mem, s->seg[0].bytes, rs, PROTO_STEP_RING_SLOTS,
                                 &s->req_ring)) < 0 ||
        (rc = common_ring_attach(s->seg[1].mem, s->seg[1].bytes, ps, PROTO_STEP_RING_SLOTS,
                                 &s->rep_ring)) < 0) {
        router_exec_segments_close(s);
        return common_errmsg_set(e, rc, "cannot format the step rings");
    }
    s->tokens = s->seg[SERVE_SEG_TOKENS].mem;
    s->logits = s->seg[SERVE_SEG_LOGITS].mem;

    struct proto_msg req = {.kind = PROTO_KIND_ATTACH, .request_id = common_random_id()}, rep;
    req.u.attach.role = PROTO_ROLE_ROUTER;
    req.u.attach.pid = (uint32_t)getpid();
    req.u.attach.instance = s->instance;
    req.u.attach.n_segments = SERVE_N_SEG;
    for (int i = 0; i < SERVE_N_SEG; i++)
        snprintf(req.u.attach.segments[i], PROTO_MAX_NAME, "%s", router_serve_seg_names[i]);
    req.u.attach.params[0] = PROTO_STEP_RING_SLOTS;
    req.u.attach.params[1] = s->n_seq;
    req.u.attach.params[2] = s->n_ctx;
    req.u.attach.params[3] = s->n_vocab;
    if ((rc = proto_client_call(s->exec, &req, &rep, 10000, e)) < 0) {
        router_exec_segments_close(s);
        return rc;
    }
    if (rep.kind == PROTO_KIND_ERROR) {
        rc = common_errmsg_set(e, rep.u.error.code < 0 ? rep.u.error.code : COMMON_EPROTO,
                               "executor refused ATTACH (n_seq %u, n_ctx %u, n_vocab %u): %s",
                               s->n_seq, s->n_ctx, s->n_vocab, rep.u.error.message);
    } else if (rep.kind != PROTO_KIND_OK) {
        rc = common_errmsg_set(e, COMMON_EPROTO, "executor answered ATTACH with %s",
                               proto_kind_name(rep.kind));
    }
    proto_msg_clear(&rep);
    if (rc < 0)
        router_exec_segments_close(s);
    return rc;
}

/* Waits for the executor (any HELLO) until `timeout_s` passes or the service stops. */
int router_exec_connect(struct router_serve *s, uint32_t timeout_s, bool want_new,
                        struct common_errmsg *e)
{
    uint64_t deadline = common_now_ns() + (uint64_t)timeout_s * 1000000000ull;
    uint64_t old = s->exec_instance;
    uint32_t old_pid = s->exec_pid;
    for (;;) {
        uint32_t pid = 0;
        uint64_t inst = 0;
        if (atomic_load(&s->recover_beat_ns)) /* a pass of the scheduler's wait (watchdog) */
            atomic_store(&s->recover_beat_ns, common_now_ns());
        int rc = router_exec_hello(s, 500, &pid, &inst, e);
        if (rc == 0 && (!want_new || inst != old || !common_pid_gone(old_pid))) {
            s->exec_pid = pid;
            s->exec_instance = inst;
            return 0;
        }
        if (rc == COMMON_EPROTO && !want_new)
            return rc;
        pthread_mutex_lock(&s->mu);
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stopping)
            return COMMON_ECLOSED;
        if (common_now_ns() >= deadline)
            return common_errmsg_set(e, COMMON_ETIMEDOUT,
                                     "no executor at %s after %u s (start sluice-executor first)",
                                     s->exec_url, timeout_s);
        if (rc != COMMON_ETIMEDOUT)
            serve_sleep_ms(100);
        else /* silent: the next try dials afresh (proto_client_reopen) */
            (void)proto_client_reopen(s->exec, NULL);
    }
}

/* True while the executor answers (a HELLO every 2 s of silence) as the same instance. */
bool router_exec_is_alive(struct router_serve *s, uint64_t *last_hello_ns)
{
    if (common_pid_gone(s->exec_pid))
        return false;
    uint64_t now = common_now_ns();
    if (now - *last_hello_ns < 2000000000ull)
        return true;
    *last_hello_ns = now;
    uint32_t pid = 0;
    uint64_t inst = 0;
    int      rc = router_exec_hello(s, 500, &pid, &inst, NULL);
    if (rc == 0 && inst != s->exec_instance) {
        COMMON_LOG_WARN(SERVE_COMP, "executor restarted or lost its state (instance %llx -> %llx)",
                        (unsigned long long)s->exec_instance, (unsigned long long)inst);
        return false;
    }
    return true; /* busy or alive */
}
