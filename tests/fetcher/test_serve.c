/* tests/fetcher/test_serve.c - the fetcher service: control socket, pool fd, executor rings. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fetcher.h"
#include "fixture.h"
#include "proto.h"

extern char **environ;

#define RING_SLOTS 64u
#define WAIT_MS    5000

static char                  *t_dir; /* temp dir: the run dir is t_dir/run */
static char                   t_run[512];
static char                  *t_model; /* fixture path */
static struct fetcher_server *t_srv;
static struct common_gguf    *t_g;
static struct common_model    t_m;
static bool                   t_m_init;

/* The executor's side of one link. */
struct exec_link {
    struct common_ring_segment req_seg, rep_seg;
    struct common_ring         req, rep;
};

static void teardown(void)
{
    if (t_srv)
        fetcher_serve_stop(t_srv, NULL);
    t_srv = NULL;
    if (t_m_init)
        common_model_fini(&t_m);
    t_m_init = false;
    common_gguf_close(t_g);
    t_g = NULL;
    if (t_dir) {
        fixture_rmtree(t_dir);
        free(t_dir);
    }
    t_dir = NULL;
    free(t_model);
    t_model = NULL;
}

static void open_model(void)
{
    cr_assert_eq(common_gguf_open(t_model, NULL, &t_g, NULL), COMMON_OK);
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);
    t_m_init = true;
}

static void start(uint32_t shard, uint32_t n_shards)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    open_model();
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts o = {.model_path = t_model,
                                   .run_dir = t_run,
                                   .shard = shard,
                                   .n_shards = n_shards,
                                   .n_slots = 4,
                                   .io = FETCHER_IO_PREAD};
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_OK, "%s", e.text);
}

#define START(shard, n)                                                                            \
    do {                                                                                           \
        FIXTURE_OR_SKIP(p_, "moe-tiny/moe-tiny-q4_0.gguf");                                        \
        t_model = p_;                                                                              \
        start((shard), (n));                                                                       \
    } while (0)

static void ctl_url(char *buf, size_t len, uint32_t shard)
{
    snprintf(buf, len, "ipc://%s/fetcher-%u.ctl", t_run, shard);
}

/* One control call; returns the reply kind (the reply is cleared). */
static enum proto_kind call(uint32_t shard, const struct proto_msg *req, struct proto_msg *rep)
{
    char                 url[600];
    struct common_errmsg e = {{0}};
    ctl_url(url, sizeof(url), shard);
    cr_assert_eq(proto_call(url, req, rep, WAIT_MS, &e), COMMON_OK, "%s", e.text);
    return rep->kind;
}

static struct proto_msg hello_req(void)
{
    struct proto_msg m = {.kind = PROTO_KIND_HELLO, .request_id = 1};
    m.u.hello.major = PROTO_VERSION_MAJOR;
    m.u.hello.minor = PROTO_VERSION_MINOR;
    m.u.hello.role = PROTO_ROLE_EXECUTOR;
    snprintf(m.u.hello.name, sizeof(m.u.hello.name), "executor");
    m.u.hello.pid = (uint32_t)getpid();
    return m;
}

/* Receives the pool fd over the Unix socket and maps it read-only. */
static const uint8_t *map_pool(uint32_t shard, uint64_t *tag, size_t *len)
{
    char path[600];
    int  sock = -1, fd = -1;
    snprintf(path, sizeof(path), "%s/fetcher-%u.pool", t_run, shard);
    cr_assert_eq(common_unix_connect(path, &sock), COMMON_OK);
    cr_assert_eq(common_fd_recv(sock, &fd, tag, WAIT_MS), COMMON_OK);
    close(sock);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(p, MAP_FAILED);
    close(fd);
    *len = (size_t)st.st_size;
    return p;
}

static void link_create(struct exec_link *l, const char *req_name, const char *rep_name)
{
    size_t qb = common_ring_bytes(sizeof(struct proto_fetch_req), RING_SLOTS);
    size_t pb = common_ring_bytes(sizeof(struct proto_fetch_rep), RING_SLOTS);
    cr_assert_eq(common_ring_segment_create(t_run, req_name, qb, &l->req_seg), COMMON_OK);
    cr_assert_eq(common_ring_segment_create(t_run, rep_name, pb, &l->rep_seg), COMMON_OK);
    cr_assert_eq(common_ring_init(l->req_seg.mem, qb, sizeof(struct proto_fetch_req), RING_SLOTS),
                 COMMON_OK);
    cr_assert_eq(common_ring_init(l->rep_seg.mem, pb, sizeof(struct proto_fetch_rep), RING_SLOTS),
                 COMMON_OK);
    cr_assert_eq(
        common_ring_attach(l->req_seg.mem, qb, sizeof(struct proto_fetch_req), RING_SLOTS, &l->req),
        COMMON_OK);
    cr_assert_eq(
        common_ring_attach(l->rep_seg.mem, pb, sizeof(struct proto_fetch_rep), RING_SLOTS, &l->rep),
        COMMON_OK);
}

static void link_close(struct exec_link *l)
{
    common_ring_segment_close(&l->req_seg);
    common_ring_segment_close(&l->rep_seg);
}

static struct proto_msg attach_req(const char *req_name, const char *rep_name, uint32_t pid)
{
    struct proto_msg m = {.kind = PROTO_KIND_ATTACH, .request_id = 2};
    m.u.attach.role = PROTO_ROLE_EXECUTOR;
    m.u.attach.pid = pid;
    m.u.attach.instance = 42;
    m.u.attach.n_segments = 2;
    snprintf(m.u.attach.segments[0], PROTO_MAX_NAME, "%s", req_name);
    snprintf(m.u.attach.segments[1], PROTO_MAX_NAME, "%s", rep_name);
    m.u.attach.params[0] = RING_SLOTS;
    return m;
}

static void attach(uint32_t shard, struct exec_link *l, const char *req_name, const char *rep_name)
{
    link_create(l, req_name, rep_name);
    struct proto_msg req = attach_req(req_name, rep_name, (uint32_t)getpid()), rep;
    enum proto_kind  k = call(shard, &req, &rep);
    cr_assert_eq(k, PROTO_KIND_OK, "attach: %s", k == PROTO_KIND_ERROR ? rep.u.error.message : "");
    proto_msg_clear(&rep);
}

static void push(struct exec_link *l, struct proto_fetch_req r)
{
    cr_assert_eq(common_ring_push_wait(&l->req, &r, sizeof(r), WAIT_MS), COMMON_OK);
}

static struct proto_fetch_rep pop(struct exec_link *l)
{
    struct proto_fetch_rep r;
    int                    n = common_ring_pop_wait(&l->rep, &r, sizeof(r), WAIT_MS);
    cr_assert_eq(n, (int)sizeof(r), "no reply (%d)", n);
    return r;
}

static struct proto_fetch_rep acquire(struct exec_link *l, uint32_t tag, uint32_t layer,
                                      uint32_t expert, uint32_t part)
{
    push(
        l,
        (struct proto_fetch_req){
            .op = PROTO_FETCH_ACQUIRE, .tag = tag, .layer = layer, .expert = expert, .part = part});
    struct proto_fetch_rep r = pop(l);
    cr_assert_eq(r.tag, tag);
    return r;
}

static void release(struct exec_link *l, uint32_t loan)
{
    push(l, (struct proto_fetch_req){.op = PROTO_FETCH_RELEASE, .loan = loan});
}

/* Value of stat `name` in a STATS reply from shard 0. */
static double stat_of(const char *name)
{
    struct proto_msg req = {.kind = PROTO_KIND_STATS, .request_id = 3}, rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_STATS_REPLY);
    for (uint32_t i = 0; i < rep.u.stats.n_stats; i++)
        if (strcmp(rep.u.stats.stats[i].name, name) == 0) {
            double v = rep.u.stats.stats[i].value;
            proto_msg_clear(&rep);
            return v;
        }
    cr_assert_fail("stat %s missing", name);
    return 0;
}

/* Waits until stat `name` equals v (counters move on the server's threads). */
static void wait_stat(const char *name, double v)
{
    while (stat_of(name) != v)
        usleep(20000);
    cr_assert_eq(stat_of(name), v, "stat %s: %g, want %g", name, stat_of(name), v);
}

static uint32_t pinned(void)
{
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(fetcher_serve_fetcher(t_srv), &c);
    return c.n_pinned;
}

static void compare_part(const uint8_t *pool, size_t pool_len, const struct proto_fetch_rep *r,
                         uint32_t layer, uint32_t expert, uint32_t part)
{
    struct common_span s;
    cr_assert_eq(common_model_expert_span(&t_m, layer, expert, (enum common_expert_part)part, &s),
                 COMMON_OK);
    cr_assert_eq(r->size, s.size, "size of (%u,%u,%u)", layer, expert, part);
    cr_assert(r->offset <= pool_len && r->size <= pool_len - r->offset, "reply inside the pool");
    uint8_t *ref = malloc(s.size);
    cr_assert_eq(common_gguf_read_span(t_g, &s, ref, NULL), COMMON_OK);
    cr_assert_eq(memcmp(pool + r->offset, ref, s.size), 0, "bytes of (%u,%u,%u)", layer, expert,
                 part);
    free(ref);
}

TestSuite(fetcher_serve, .fini = teardown, .timeout = 60);

Test(fetcher_serve, hello_reports_shard_map_and_pool_fd_tag)
{
    START(0, 1);
    struct proto_msg req = hello_req(), rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HELLO);
    struct proto_hello h = rep.u.hello;
    proto_msg_clear(&rep);
    cr_assert_eq(h.role, PROTO_ROLE_FETCHER);
    cr_assert_str_eq(h.name, "fetcher-0");
    cr_assert_eq(h.pid, (uint32_t)getpid());
    cr_assert_neq(h.instance, 0);
    cr_assert_eq(h.n_shards, 1);
    cr_assert_eq(h.shards[0].first_expert, 0);
    cr_assert_eq(h.shards[0].n_experts, t_m.hp.n_expert);

    uint64_t       tag = 0;
    size_t         len = 0;
    const uint8_t *pool = map_pool(0, &tag, &len);
    cr_assert_eq(tag, h.instance, "the pool fd's tag is the instance id");
    cr_assert_eq(len, fetcher_get_pool_bytes(fetcher_serve_fetcher(t_srv)));
    munmap((void *)(uintptr_t)pool, len);

    char  pidf[600];
    char *txt;
    snprintf(pidf, sizeof(pidf), "%s/fetcher-0.pid", t_run);
    cr_assert_not_null(txt = fixture_read_all(pidf, NULL));
    cr_assert_eq(strtoul(txt, NULL, 10), (unsigned long)getpid());
    free(txt);
}

Test(fetcher_serve, acquire_returns_the_file_bytes)
{
    START(0, 1);
    uint64_t         tag;
    size_t           len;
    const uint8_t   *pool = map_pool(0, &tag, &len);
    struct exec_link l;
    attach(0, &l, "exec-fetch-0.req", "exec-fetch-0.rep");
    uint32_t n = 0;
    for (uint32_t layer = 0; layer < t_m.hp.n_layer; layer++)
        for (uint32_t x = 0; x < t_m.hp.n_expert; x += 3)
            for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                struct proto_fetch_rep r = acquire(&l, 100 + n, layer, x, p);
                cr_assert_eq(r.status, COMMON_OK, "acquire (%u,%u,%u): %d", layer, x, p, r.status);
                compare_part(pool, len, &r, layer, x, p);
                release(&l, r.loan);
                n++;
            }
    /* A token mark and a hint are accepted without a reply. */
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_TOKEN});
    push(&l, (struct proto_fetch_req){
                 .op = PROTO_FETCH_HINT, .layer = 1, .expert = 1, .prio = FETCHER_PRIO_PREFETCH});
    /* A USE names the parts read in place by a mask: gate and down count two uses. */
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_USE,
                                      .layer = 0,
                                      .expert = 0,
                                      .part = 1u << COMMON_EXPERT_GATE | 1u << COMMON_EXPERT_DOWN});
    wait_stat("serve.releases", n);
    wait_stat("serve.tokens", 1);
    wait_stat("serve.hints", 1);
    wait_stat("serve.uses", 2);
    cr_assert_eq(stat_of("serve.acquires"), n);
    cr_assert_eq(stat_of("serve.bad_records"), 0);
    cr_assert_eq(stat_of("pool.pinned"), 0);
    cr_assert_gt(stat_of("trace.loads"), 0);
    cr_assert_gt(stat_of("trace.bytes_read"), 0);
    cr_assert_eq(pinned(), 0);
    link_close(&l);
    munmap((void *)(uintptr_t)pool, len);
}

Test(fetcher_serve, garbage_records_get_errors_and_service_goes_on)
{
    START(0, 1);
    uint64_t         tag;
    size_t           len;
    const uint8_t   *pool = map_pool(0, &tag, &len);
    struct exec_link l;
    attach(0, &l, "exec-fetch-0.req", "exec-fetch-0.rep");
    uint32_t               L = t_m.hp.n_layer, E = t_m.hp.n_expert;
    struct proto_fetch_rep r;
    r = acquire(&l, 1, L, 0, 0); /* layer out of range */
    cr_assert_eq(r.status, COMMON_EINVAL);
    cr_assert_eq(r.loan, FETCHER_LOAN_NONE);
    r = acquire(&l, 2, 0, E, 0); /* expert out of range */
    cr_assert_eq(r.status, COMMON_EINVAL);
    r = acquire(&l, 3, 0, 0, COMMON_EXPERT_PART_COUNT); /* part out of range */
    cr_assert_eq(r.status, COMMON_EINVAL);
    r = acquire(&l, 4, UINT32_MAX, UINT32_MAX, UINT32_MAX);
    cr_assert_eq(r.status, COMMON_EINVAL);
    push(&l, (struct proto_fetch_req){.op = 99, .tag = 5});                   /* unknown op */
    push(&l, (struct proto_fetch_req){.op = 0});                              /* unknown op */
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_RELEASE, .loan = 2}); /* not held */
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_RELEASE, .loan = UINT32_MAX});
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_HINT, .layer = 0, .expert = E, .prio = 0});
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_HINT, .layer = 0, .expert = 0, .prio = 9});
    /* USE masks: empty, a bit beyond the three parts, an expert out of range. */
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_USE, .layer = 0, .expert = 0, .part = 0});
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_USE, .layer = 0, .expert = 0, .part = 8});
    push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_USE, .layer = 0, .expert = E, .part = 1});
    /* A short record: the ring allows it; the fetcher counts it. */
    uint32_t shortrec = PROTO_FETCH_ACQUIRE;
    cr_assert_eq(common_ring_push(&l.req, &shortrec, sizeof(shortrec)), COMMON_OK);
    wait_stat("serve.bad_records", 14);
    /* Still serving. */
    r = acquire(&l, 6, 1, 2, COMMON_EXPERT_DOWN);
    cr_assert_eq(r.status, COMMON_OK);
    compare_part(pool, len, &r, 1, 2, COMMON_EXPERT_DOWN);
    /* A second RELEASE of the same loan is refused: the loan was ended once. */
    release(&l, r.loan);
    release(&l, r.loan);
    wait_stat("serve.bad_records", 15);
    cr_assert_eq(stat_of("serve.uses"), 0);
    cr_assert_eq(stat_of("serve.releases"), 1);
    cr_assert_eq(stat_of("serve.acquire_errors"), 4);
    cr_assert_eq(pinned(), 0);
    link_close(&l);
    munmap((void *)(uintptr_t)pool, len);
}

Test(fetcher_serve, second_attach_releases_the_first_links_loans)
{
    START(0, 1);
    struct exec_link a, b;
    attach(0, &a, "exec-fetch-0.req", "exec-fetch-0.rep");
    struct proto_fetch_rep r1 = acquire(&a, 1, 0, 0, COMMON_EXPERT_GATE);
    struct proto_fetch_rep r2 = acquire(&a, 2, 0, 1, COMMON_EXPERT_UP);
    struct proto_fetch_rep r3 = acquire(&a, 3, 0, 1, COMMON_EXPERT_DOWN);
    cr_assert_eq(r1.status + r2.status + r3.status, 0);
    cr_assert_eq(pinned(), 2, "two slots pinned, one of them twice");
    cr_assert_eq(stat_of("serve.link_pins"), 3);

    attach(0, &b, "exec-fetch-0b.req", "exec-fetch-0b.rep");
    cr_assert_eq(pinned(), 0, "the replaced link's loans are released");
    cr_assert_eq(stat_of("pool.pinned"), 0);
    cr_assert_eq(stat_of("serve.attaches"), 2);
    cr_assert_eq(stat_of("serve.links_dropped"), 1);
    /* The old ring is no longer served; the new one is. */
    release(&a, r1.loan);
    struct proto_fetch_rep r = acquire(&b, 7, 2, 3, COMMON_EXPERT_GATE);
    cr_assert_eq(r.status, COMMON_OK);
    release(&b, r.loan);
    wait_stat("serve.releases", 1);
    cr_assert_eq(stat_of("serve.bad_records"), 0, "the old link's late RELEASE was not read");
    link_close(&a);
    link_close(&b);
}

Test(fetcher_serve, attach_replaces_a_link_that_stopped_reading_replies)
{
    START(0, 1);
    struct exec_link a, b;
    attach(0, &a, "exec-fetch-0.req", "exec-fetch-0.rep");
    /* More ACQUIREs than the reply ring holds, never popped: the replies past the ring's room
     * wait in the link's backlog, and the link is replaced with them. */
    for (uint32_t i = 0; i < 3 * RING_SLOTS; i++)
        push(&a, (struct proto_fetch_req){.op = PROTO_FETCH_ACQUIRE, .tag = i, .part = i % 3});
    while (stat_of("serve.acquires") < RING_SLOTS)
        usleep(20000);
    cr_assert_geq(stat_of("serve.acquires"), RING_SLOTS, "replies fill the ring");
    cr_assert_gt(pinned(), 0);
    attach(0, &b, "exec-fetch-0b.req", "exec-fetch-0b.rep");
    while (pinned() != 0)
        usleep(20000);
    cr_assert_eq(pinned(), 0, "every loan of the replaced link is released");
    struct proto_fetch_rep r = acquire(&b, 1, 1, 1, COMMON_EXPERT_GATE);
    cr_assert_eq(r.status, COMMON_OK);
    release(&b, r.loan);
    wait_stat("serve.link_pins", 0);
    link_close(&a);
    link_close(&b);
}

/* The executor pops no reply until every ACQUIRE is answered (the reply ring fills, the rest
 * waits in the backlog), then pops them all: each ACQUIRE gets exactly one reply. */
Test(fetcher_serve, full_reply_ring_backlogs_and_answers_each_acquire_once)
{
    START(0, 1);
    uint64_t         tag;
    size_t           len;
    const uint8_t   *pool = map_pool(0, &tag, &len);
    struct exec_link l;
    attach(0, &l, "exec-fetch-0.req", "exec-fetch-0.rep");
    const uint32_t n = 3 * RING_SLOTS; /* the ring holds a third: the rest waits in the backlog */
    for (uint32_t i = 0; i < n; i++)   /* four bundles, one per slot: every acquire can pin */
        push(&l, (struct proto_fetch_req){.op = PROTO_FETCH_ACQUIRE,
                                          .tag = i,
                                          .layer = i % 4 / 2,
                                          .expert = i % 2,
                                          .part = i / 4 % COMMON_EXPERT_PART_COUNT});
    while (stat_of("serve.acquires") < n) /* progress, bounded by the suite's .timeout */
        usleep(1000);
    cr_assert_eq(stat_of("serve.acquire_errors"), 0);
    uint8_t  *seen = calloc(n, 1);
    uint32_t *loans = calloc(n, sizeof(*loans));
    for (uint32_t k = 0; k < n; k++) {
        struct proto_fetch_rep r;
        cr_assert_eq(common_ring_pop_wait(&l.rep, &r, sizeof(r), -1), (int)sizeof(r));
        cr_assert_lt(r.tag, n, "tag %u", r.tag);
        cr_assert_eq(seen[r.tag], 0, "tag %u answered twice", r.tag);
        seen[r.tag] = 1;
        cr_assert_eq(r.status, COMMON_OK, "tag %u: %d", r.tag, r.status);
        compare_part(pool, len, &r, r.tag % 4 / 2, r.tag % 2, r.tag / 4 % COMMON_EXPERT_PART_COUNT);
        loans[r.tag] = r.loan;
    }
    /* A last ACQUIRE after the backlog drained: its reply is the next one, nothing came twice. */
    struct proto_fetch_rep last = acquire(&l, n, 1, 1, COMMON_EXPERT_GATE);
    cr_assert_eq(last.status, COMMON_OK);
    cr_assert_eq(stat_of("serve.acquires"), n + 1);
    for (uint32_t i = 0; i < n; i++)
        release(&l, loans[i]);
    release(&l, last.loan);
    while (stat_of("serve.releases") < n + 1)
        usleep(1000);
    cr_assert_eq(stat_of("serve.link_pins"), 0);
    cr_assert_eq(stat_of("serve.bad_records"), 0);
    cr_assert_eq(pinned(), 0);
    free(seen);
    free(loans);
    link_close(&l);
    munmap((void *)(uintptr_t)pool, len);
}

Test(fetcher_serve, dead_executor_link_is_dropped)
{
    START(0, 1);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0)
        _exit(0);
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    /* The child is gone: its pid is free (reuse within the test is unlikely). */
    struct exec_link l;
    link_create(&l, "exec-fetch-0.req", "exec-fetch-0.rep");
    struct proto_msg req = attach_req("exec-fetch-0.req", "exec-fetch-0.rep", (uint32_t)child), rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);
    wait_stat("serve.links_dropped", 1);
    struct proto_msg hreq = {.kind = PROTO_KIND_HEALTH}, hrep;
    cr_assert_eq(call(0, &hreq, &hrep), PROTO_KIND_HEALTH_REPLY);
    cr_assert(strstr(hrep.u.health.message, "no executor attached"), "%s", hrep.u.health.message);
    proto_msg_clear(&hrep);
    link_close(&l);
}

Test(fetcher_serve, attach_with_bad_segments_is_refused)
{
    START(0, 1);
    struct proto_msg rep, req = attach_req("missing.req", "missing.rep", (uint32_t)getpid());
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_ENOENT, "%s", rep.u.error.message);
    struct exec_link l;
    link_create(&l, "exec-fetch-0.req", "exec-fetch-0.rep");
    req = attach_req("exec-fetch-0.req", "exec-fetch-0.rep", (uint32_t)getpid());
    req.u.attach.params[0] = RING_SLOTS * 2; /* not what the segments hold */
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_ECORRUPT, "%s", rep.u.error.message);
    req.u.attach.params[0] = 3;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    req = attach_req("../x.req", "exec-fetch-0.rep", (uint32_t)getpid());
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    req = attach_req("exec-fetch-0.req", "exec-fetch-0.rep", (uint32_t)getpid());
    req.u.attach.role = PROTO_ROLE_ROUTER;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    req.u.attach.role = PROTO_ROLE_EXECUTOR;
    req.u.attach.n_segments = 1;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(stat_of("serve.attaches"), 0);
    link_close(&l);
}

/* Maps the pool of fetcher 1 (its length in *len) and attaches a link to it. */
static const uint8_t *attach_shard_1(struct exec_link *l, size_t *len)
{
    uint64_t       tag;
    const uint8_t *pool = map_pool(1, &tag, len);
    attach(1, l, "exec-fetch-1.req", "exec-fetch-1.rep");
    return pool;
}

Test(fetcher_serve, shard_1_of_2_refuses_experts_of_shard_0)
{
    START(1, 2);
    uint32_t         E = t_m.hp.n_expert;
    struct proto_msg req = hello_req(), rep;
    cr_assert_eq(call(1, &req, &rep), PROTO_KIND_HELLO);
    cr_assert_str_eq(rep.u.hello.name, "fetcher-1");
    cr_assert_eq(rep.u.hello.n_shards, 2);
    cr_assert_eq(rep.u.hello.shards[0].fetcher, 0);
    cr_assert_eq(rep.u.hello.shards[0].first_expert, 0);
    cr_assert_eq(rep.u.hello.shards[0].n_experts, E / 2);
    cr_assert_eq(rep.u.hello.shards[1].fetcher, 1);
    cr_assert_eq(rep.u.hello.shards[1].first_expert, E / 2);
    cr_assert_eq(rep.u.hello.shards[1].n_experts, E - E / 2);
    proto_msg_clear(&rep);

    size_t                 len;
    struct exec_link       l;
    const uint8_t         *pool = attach_shard_1(&l, &len);
    struct proto_fetch_rep r = acquire(&l, 1, 0, 0, COMMON_EXPERT_GATE);
    cr_assert_eq(r.status, COMMON_EINVAL, "expert 0 belongs to fetcher 0");
    r = acquire(&l, 2, 0, E / 2 - 1, COMMON_EXPERT_GATE);
    cr_assert_eq(r.status, COMMON_EINVAL);
    r = acquire(&l, 3, 3, E / 2, COMMON_EXPERT_UP);
    cr_assert_eq(r.status, COMMON_OK);
    compare_part(pool, len, &r, 3, E / 2, COMMON_EXPERT_UP);
    release(&l, r.loan);
    r = acquire(&l, 4, 0, E - 1, COMMON_EXPERT_DOWN);
    cr_assert_eq(r.status, COMMON_OK);
    compare_part(pool, len, &r, 0, E - 1, COMMON_EXPERT_DOWN);
    release(&l, r.loan);
    link_close(&l);
    munmap((void *)(uintptr_t)pool, len);
}

/* --shard-by file over GGUF splits by layer in two directories: fetcher 1 of 2 serves every
 * expert of the second directory's layers (its HELLO says so for both) and refuses the others'.
 * Three fetchers for two directories, or two for a one-file model, are refused in one line. */
Test(fetcher_serve, by_file_shard_serves_the_layers_of_its_directory)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-q4_0.gguf");
    t_dir = fixture_tmpdir();
    char ssd[2][600], first[1024];
    for (int i = 0; i < 2; i++) {
        snprintf(ssd[i], sizeof(ssd[i]), "%s/ssd%d", t_dir, i + 1);
        cr_assert_eq(mkdir(ssd[i], 0700), 0);
    }
    cr_assert_eq(fixture_split_gguf_by_layer(src, ssd[0], ssd[1], "m", first, sizeof(first)), 0);
    t_model = strdup(first);
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    open_model();
    const uint32_t            E = t_m.hp.n_expert, L = t_m.hp.n_layer;
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts o = {.model_path = t_model,
                                   .run_dir = t_run,
                                   .shard = 1,
                                   .n_shards = 3,
                                   .shard_by = 1,
                                   .n_slots = 4,
                                   .io = FETCHER_IO_PREAD};
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "lie in 2 directories, for 3 fetchers"), "%s", e.text);
    o.n_shards = 2;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_OK, "%s", e.text);
    struct proto_msg req = hello_req(), rep;
    cr_assert_eq(call(1, &req, &rep), PROTO_KIND_HELLO);
    cr_assert_eq(rep.u.hello.n_shards, 2);
    for (uint32_t i = 0; i < 2; i++) {
        const struct proto_shard *sh = &rep.u.hello.shards[i];
        cr_assert(sh->fetcher == i && sh->first_expert == 0 && sh->n_experts == E &&
                      sh->first_layer == i * (L / 2) && sh->n_layers == L / 2,
                  "shard %u: experts %u+%u of layers %u+%u", i, sh->first_expert, sh->n_experts,
                  sh->first_layer, sh->n_layers);
    }
    proto_msg_clear(&rep);
    size_t                 len;
    struct exec_link       l;
    const uint8_t         *pool = attach_shard_1(&l, &len);
    struct proto_fetch_rep r = acquire(&l, 1, L / 2 - 1, 0, COMMON_EXPERT_GATE);
    cr_assert_eq(r.status, COMMON_EINVAL, "layer %u belongs to fetcher 0", L / 2 - 1);
    r = acquire(&l, 2, L - 1, E - 1, COMMON_EXPERT_DOWN);
    cr_assert_eq(r.status, COMMON_OK);
    compare_part(pool, len, &r, L - 1, E - 1, COMMON_EXPERT_DOWN);
    release(&l, r.loan);
    link_close(&l);
    munmap((void *)(uintptr_t)pool, len);
    fetcher_serve_stop(t_srv, NULL);
    t_srv = NULL;
    /* A one-file model has one directory. */
    o.model_path = src;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "lie in 1 directory, for 2 fetchers"), "%s", e.text);
    free(src);
}

/* --shard-by layer: fetcher 1 of 2 serves every expert of a range of layers, half of them, or
 * the last quarter with --layer-split 3,1 (its HELLO says so for both), and refuses the others';
 * shares that leave a fetcher no layer, or are not one per fetcher, are refused in one line. */
Test(fetcher_serve, by_layer_shard_serves_its_layers)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-q4_0.gguf");
    t_model = src;
    t_dir = fixture_tmpdir();
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    open_model();
    const uint32_t            E = t_m.hp.n_expert, L = t_m.hp.n_layer;
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts o = {.model_path = t_model,
                                   .run_dir = t_run,
                                   .shard = 1,
                                   .n_shards = 2,
                                   .shard_by = 2,
                                   .n_slots = 4,
                                   .io = FETCHER_IO_PREAD,
                                   .n_layer_split = 3,
                                   .layer_split = {1, 1, 1}};
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "3 shares for 2 fetchers"), "%s", e.text);
    o.n_layer_split = 2;
    o.layer_split[0] = 1;
    o.layer_split[1] = 0;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "leaves fetcher 1 no layer"), "%s", e.text);
    for (int split = 0; split < 2; split++) {
        o.n_layer_split = split ? 2 : 0;
        o.layer_split[0] = 3;
        o.layer_split[1] = 1;
        const uint32_t first1 = split ? (3 * L + 3) / 4 : L / 2; /* ceil(3L/4) */
        cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_OK, "%s", e.text);
        struct proto_msg req = hello_req(), rep;
        cr_assert_eq(call(1, &req, &rep), PROTO_KIND_HELLO);
        cr_assert_eq(rep.u.hello.n_shards, 2);
        for (uint32_t i = 0; i < 2; i++) {
            const struct proto_shard *sh = &rep.u.hello.shards[i];
            const uint32_t            l0 = i ? first1 : 0, n = i ? L - first1 : first1;
            cr_assert(sh->fetcher == i && sh->first_expert == 0 && sh->n_experts == E &&
                          sh->first_layer == l0 && sh->n_layers == n,
                      "split %d, shard %u: experts %u+%u of layers %u+%u", split, i,
                      sh->first_expert, sh->n_experts, sh->first_layer, sh->n_layers);
        }
        proto_msg_clear(&rep);
        size_t                 len;
        struct exec_link       l;
        const uint8_t         *pool = attach_shard_1(&l, &len);
        struct proto_fetch_rep r = acquire(&l, 1, first1 - 1, 0, COMMON_EXPERT_GATE);
        cr_assert_eq(r.status, COMMON_EINVAL, "layer %u belongs to fetcher 0", first1 - 1);
        r = acquire(&l, 2, L - 1, E - 1, COMMON_EXPERT_DOWN);
        cr_assert_eq(r.status, COMMON_OK);
        compare_part(pool, len, &r, L - 1, E - 1, COMMON_EXPERT_DOWN);
        release(&l, r.loan);
        link_close(&l);
        munmap((void *)(uintptr_t)pool, len);
        fetcher_serve_stop(t_srv, NULL);
        t_srv = NULL;
    }
}

/* A model file truncated under the running fetcher fails the reads past its new end: health says
 * DEGRADED and names the file, instead of READY. */
Test(fetcher_serve, health_degrades_when_the_model_file_shrinks)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-q4_0.gguf");
    char *copy_dir = fixture_tmpdir();
    cr_assert_not_null(copy_dir);
    size_t len = 0;
    char  *bytes = fixture_read_all(src, &len);
    cr_assert_not_null(bytes);
    free(src);
    char copy[600];
    snprintf(copy, sizeof(copy), "%s/model.gguf", copy_dir);
    FILE *f = fopen(copy, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
    free(bytes);
    t_model = strdup(copy);
    start(0, 1);
    struct proto_msg req = {.kind = PROTO_KIND_HEALTH}, rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_READY, "%s", rep.u.health.message);
    cr_assert_eq(truncate(copy, (off_t)(len / 2)), 0);
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_DEGRADED, "%s", rep.u.health.message);
    cr_assert(strstr(rep.u.health.message, "truncated"), "%s", rep.u.health.message);
    cr_assert(strstr(rep.u.health.message, "model.gguf"), "%s", rep.u.health.message);
    fixture_rmtree(copy_dir);
    free(copy_dir);
}

Test(fetcher_serve, control_messages)
{
    START(0, 1);
    struct proto_msg req = {.kind = PROTO_KIND_HEALTH}, rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_READY);
    cr_assert_eq(rep.u.health.role, PROTO_ROLE_FETCHER);
    cr_assert_eq(rep.u.health.pid, (uint32_t)getpid());

    req = (struct proto_msg){.kind = PROTO_KIND_CONFIGURE};
    snprintf(req.u.configure.key, PROTO_MAX_KEY, "log.level");
    snprintf(req.u.configure.value, PROTO_MAX_VALUE, "warn");
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);
    snprintf(req.u.configure.value, PROTO_MAX_VALUE, "loud");
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    snprintf(req.u.configure.key, PROTO_MAX_KEY, "pool.slots");
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);

    req = (struct proto_msg){.kind = PROTO_KIND_LOAD_MODEL};
    snprintf(req.u.load_model.path, PROTO_MAX_PATH, "%s", t_model);
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);
    snprintf(req.u.load_model.path, PROTO_MAX_PATH, "/nonexistent/other.gguf");
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_ENOTSUP);

    req = (struct proto_msg){.kind = PROTO_KIND_GENERATE};
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    proto_msg_clear(&rep);
    /* Why an expert failed: nothing failed here (the reason of a real failure reaches the client:
     * pipeline_faults::qsf_corrupt_bundle_is_named_to_the_client). */
    req = (struct proto_msg){.kind = PROTO_KIND_EXPERT_ERROR, .u.expert_error = {1, 0}};
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);

    cr_assert_eq(stat_of("shard.n_experts"), t_m.hp.n_expert);
    cr_assert_eq(stat_of("pool.slots"), 4);

    req = (struct proto_msg){.kind = PROTO_KIND_DRAIN};
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);
    req = (struct proto_msg){.kind = PROTO_KIND_HEALTH};
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_DRAINING);
    struct exec_link l;
    link_create(&l, "exec-fetch-0.req", "exec-fetch-0.rep");
    req = attach_req("exec-fetch-0.req", "exec-fetch-0.rep", (uint32_t)getpid());
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EBUSY);
    link_close(&l);

    cr_assert_not(proto_service_shutdown_requested(fetcher_serve_service(t_srv)));
    req = (struct proto_msg){.kind = PROTO_KIND_SHUTDOWN};
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_OK);
    cr_assert(proto_service_shutdown_requested(fetcher_serve_service(t_srv)));
    common_log_set_level(COMMON_LOG_LEVEL_INFO);
}

Test(fetcher_serve, stop_removes_the_run_files)
{
    START(0, 1);
    char path[600];
    cr_assert_eq(fetcher_serve_stop(t_srv, NULL), COMMON_OK);
    t_srv = NULL;
    const char *names[] = {"fetcher-0.ctl", "fetcher-0.pool", "fetcher-0.pid"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", t_run, names[i]);
        cr_assert_neq(access(path, F_OK), 0, "%s left behind", names[i]);
    }
}

Test(fetcher_serve, start_refuses_bad_options)
{
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-q4_0.gguf");
    t_model = model;
    t_dir = fixture_tmpdir();
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts o = {.model_path = t_model, .run_dir = t_run, .n_slots = 4};
    o.io = FETCHER_IO_MMAP;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "mmap"), "%s", e.text);
    o.io = FETCHER_IO_AUTO;
    o.shard = 2;
    o.n_shards = 2;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    o.shard = 0;
    o.n_shards = 9; /* more shards than experts */
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_EINVAL);
    o.n_shards = 1;
    o.n_slots = 0;
    o.ram_budget = 1 << 20; /* far too small */
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_ERANGE);
    cr_assert(strstr(e.text, "minimum"), "%s", e.text);
    o.ram_budget = 0;
    o.model_path = "/nonexistent/model.gguf";
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_ENOENT);
    /* A second fetcher 0 in the same run dir. */
    o.model_path = t_model;
    o.n_slots = 4;
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_OK, "%s", e.text);
    struct fetcher_server *two = NULL;
    cr_assert_eq(fetcher_serve_start(&o, &two, &e), COMMON_EBUSY, "%s", e.text);
    /* The refused one did not remove the live one's files. */
    char path[600];
    snprintf(path, sizeof(path), "%s/fetcher-0.pid", t_run);
    cr_assert_eq(access(path, F_OK), 0);
}

Test(fetcher_serve, budget_plan_splits_the_pool_between_shards)
{
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-q4_0.gguf");
    t_model = model;
    t_dir = fixture_tmpdir();
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts o = {
        .model_path = t_model, .run_dir = t_run, .ram_budget = 1ull << 30, .n_shards = 2};
    cr_assert_eq(fetcher_serve_start(&o, &t_srv, &e), COMMON_OK, "%s", e.text);
    open_model();
    struct fetcher_plan plan;
    cr_assert_eq(fetcher_plan_compute(&t_m, &(struct fetcher_plan_opts){.ram_budget = 1ull << 30},
                                      &plan, NULL),
                 COMMON_OK);
    struct fetcher_pool_counts c;
    fetcher_get_pool_counts(fetcher_serve_fetcher(t_srv), &c);
    cr_assert_eq(c.n_slots, plan.n_slots / 2, "half the plan's %u slots, got %u", plan.n_slots,
                 c.n_slots);
}

/* ---- the daemon binary -------------------------------------------------------------------- */

/* Runs the NULL-terminated argument list with stdout/stderr to files; returns the exit status
 * (or -1), or 0 at once with *bg set when bg is given. */
static int run_bin(const char *out_path, const char *err_path, pid_t *bg, ...)
{
    char   *argv[32];
    int     n = 0;
    va_list ap;
    va_start(ap, bg);
    for (const char *a; n < 31 && (a = va_arg(ap, const char *));)
        argv[n++] = strdup(a);
    va_end(ap);
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int   rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    for (int i = 0; i < n; i++)
        free(argv[i]);
    cr_assert_eq(rc, 0, "spawn failed");
    if (bg) {
        *bg = pid;
        return 0;
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

Test(fetcher_serve, binary_help_and_bad_model)
{
    const char *bin = SLUICE_BINARY_DIR "/bin/sluice-fetcher";
    if (access(bin, X_OK) != 0)
        cr_skip_test("%s not built", bin);
    t_dir = fixture_tmpdir();
    char out[600], err[600], run[600], bad[600];
    snprintf(out, sizeof(out), "%s/out", t_dir);
    snprintf(err, sizeof(err), "%s/err", t_dir);
    snprintf(run, sizeof(run), "%s/run", t_dir);
    snprintf(bad, sizeof(bad), "%s/bad.gguf", t_dir);

    cr_assert_eq(run_bin(out, err, NULL, bin, "--help", NULL), 0);
    char *txt = fixture_read_all(out, NULL);
    cr_assert(txt && strstr(txt, "usage: sluice-fetcher") && strstr(txt, "--run-dir"));
    free(txt);

    cr_assert_eq(run_bin(out, err, NULL, bin, "-m", "/nonexistent/m.gguf", "--run-dir", run, NULL),
                 1);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && count_lines(txt) == 1 && strstr(txt, "error"), "stderr: %s", txt);
    free(txt);

    FILE *f = fopen(bad, "w");
    fputs("GGUF this is not a model", f);
    fclose(f);
    cr_assert_eq(run_bin(out, err, NULL, bin, "-m", bad, "--run-dir", run, NULL), 1);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && count_lines(txt) == 1 && strstr(txt, "error"), "stderr: %s", txt);
    free(txt);

    /* Usage errors: exit 2, one line naming the problem and one hint line. */
    cr_assert_eq(run_bin(out, err, NULL, bin, "-m", bad, "--run-dir", run, "--io", "mmap", NULL),
                 2);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && count_lines(txt) == 2 && strstr(txt, "sluice-fetcher: error: --io") &&
                  strstr(txt, "mmap") && strstr(txt, "--help"),
              "stderr: %s", txt);
    free(txt);
    cr_assert_eq(run_bin(out, err, NULL, bin, "--run-dir", run, NULL), 2);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && strstr(txt, "'--model' is required"), "stderr: %s", txt);
    free(txt);
    cr_assert_eq(run_bin(out, err, NULL, bin, "-m", bad, "--run-dir", run, "--verbose", NULL), 2);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && strstr(txt, "unknown option '--verbose'"), "stderr: %s", txt);
    free(txt);
    cr_assert_eq(run_bin(out, err, NULL, bin, "-m", bad, "--run-dir", run, "--io-depth=0", NULL),
                 2);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && strstr(txt, "--io-depth"), "stderr: %s", txt);
    free(txt);
}

Test(fetcher_serve, binary_serves_and_stops_on_sigterm)
{
    const char *bin = SLUICE_BINARY_DIR "/bin/sluice-fetcher";
    if (access(bin, X_OK) != 0)
        cr_skip_test("%s not built", bin);
    FIXTURE_OR_SKIP(model, "moe-tiny/moe-tiny-q4_0.gguf");
    t_model = model;
    t_dir = fixture_tmpdir();
    char out[600], err[600], trace[600], pidf[600];
    snprintf(out, sizeof(out), "%s/out", t_dir);
    snprintf(err, sizeof(err), "%s/err", t_dir);
    snprintf(trace, sizeof(trace), "%s/trace.json", t_dir);
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    snprintf(pidf, sizeof(pidf), "%s/fetcher-0.pid", t_run);
    pid_t pid;
    run_bin(out, err, &pid, bin, "-m", model, "--run-dir", t_run, "--ram-budget", "256M", "-c",
            "256", "--trace-out", trace, NULL);
    while (access(pidf, F_OK) != 0)
        usleep(10000);
    cr_assert_eq(access(pidf, F_OK), 0, "the daemon never wrote its pid file");
    struct proto_msg req = hello_req(), rep;
    cr_assert_eq(call(0, &req, &rep), PROTO_KIND_HELLO);
    cr_assert_eq(rep.u.hello.pid, (uint32_t)pid);
    proto_msg_clear(&rep);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    cr_assert_neq(access(pidf, F_OK), 0, "pid file removed");
    char *txt = fixture_read_all(trace, NULL);
    cr_assert(txt && strstr(txt, "sluice.fetcher.trace/1"));
    free(txt);
    txt = fixture_read_all(err, NULL);
    cr_assert(txt && strstr(txt, "memory plan"), "stderr: %s", txt);
    free(txt);
}
