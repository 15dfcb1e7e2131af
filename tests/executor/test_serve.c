/* tests/executor/test_serve.c - the executor daemon's services in-process: fetcher services
 * in a temp run dir, the executor's remote expert source and step service, the test as router. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "executor.h"
#include "fetcher.h"
#include "fixture.h"

#include "proto.h"

#define T_MODEL    "moe-tiny/moe-tiny-q8_0.gguf"
#define T_N_SEQ    2u
#define T_N_CTX    128u
#define T_SLOTS    PROTO_STEP_RING_SLOTS
#define T_THREADS  2u
#define T_GEN      16u
#define T_WAIT_MS  60000
#define T_FETCHERS 2u /* at most */

static const int32_t t_prompt_a[] = {1, 826, 262, 927, 265, 808};
static const int32_t t_prompt_b[] = {1, 450, 310, 271, 509};

/* Everything a test starts; file-static because Criterion fixtures take no arguments. */
struct t_env {
    bool                        no_direct; /* executor_remote_opts.no_direct_reads */
    uint32_t                    n_slots;   /* fetcher pool slots; 0 = one per bundle */
    char                       *model_path;
    char                       *dir;
    uint32_t                    n_fetchers;
    struct common_gguf         *gguf;
    struct common_model         desc;
    bool                        desc_ok;
    struct executor_remote     *remote;
    struct executor_model      *model;
    struct executor_threadpool *pool;
    struct executor_serve      *serve;
    uint32_t                    n_vocab;
    char                        url[512];
    /* router side */
    struct common_ring_segment seg[4];
    struct common_ring         req, rep;
    int32_t                   *tokens;
    float                     *logits;
    uint64_t                   next_tag;
    struct fetcher_server     *fetchers[T_FETCHERS];
};
static struct t_env t;

static void t_fetcher_start(uint32_t i)
{
    struct common_errmsg      e = {{0}};
    struct fetcher_serve_opts fo = {.model_path = t.model_path,
                                    .run_dir = t.dir,
                                    .shard = i,
                                    .n_shards = t.n_fetchers,
                                    .n_slots = t.n_slots,
                                    .io = FETCHER_IO_PREAD};
    cr_assert_eq(fetcher_serve_start(&fo, &t.fetchers[i], &e), 0, "fetcher %u: %s", i, e.text);
}

/* Starts n fetcher services (pools of n_slots slots; 0 = room for every expert) and the
 * executor over them, reading READY parts in place unless no_direct. */
static void t_start(uint32_t n_fetchers, bool no_direct, uint32_t n_slots)
{
    memset(&t, 0, sizeof(t));
    t.no_direct = no_direct;
    t.n_slots = n_slots;
    t.model_path = fixture_path(T_MODEL);
    if (!t.model_path)
        cr_skip_test("fixture %s not found: skipped", T_MODEL);
    t.dir = fixture_tmpdir();
    cr_assert_not_null(t.dir);
    t.n_fetchers = n_fetchers;
    for (uint32_t i = 0; i < n_fetchers; i++)
        t_fetcher_start(i);

    struct common_errmsg e = {{0}};
    executor_kernels_init();
    cr_assert_eq(common_gguf_open(t.model_path, NULL, &t.gguf, &e), 0, "%s", e.text);
    cr_assert_eq(common_model_init(&t.desc, t.gguf, &e), 0, "%s", e.text);
    t.desc_ok = true;
    struct executor_remote_opts ro = {.run_dir = t.dir,
                                      .n_fetchers = n_fetchers,
                                      .model = &t.desc,
                                      .connect_timeout_ms = 10000,
                                      .instance = 42,
                                      .direct_reads = !t.no_direct};
    cr_assert_eq(executor_remote_create(&ro, &t.remote, &e), 0, "%s", e.text);
    struct executor_expert_source src;
    executor_remote_source(t.remote, &src);
    struct executor_weights *w = NULL;
    cr_assert_eq(executor_weights_stream_create(
                     &t.desc, &(struct executor_weights_opts){.read_span = common_gguf_read_span},
                     &src, &w, &e),
                 0, "%s", e.text);
    cr_assert_eq(executor_model_create(&t.desc, w, &t.model, &e), 0, "%s", e.text);
    cr_assert_eq(executor_threadpool_create(T_THREADS, &t.pool), 0);
    struct executor_serve_opts so = {.run_dir = t.dir,
                                     .model_path = t.model_path,
                                     .model = t.model,
                                     .remote = t.remote,
                                     .pool = t.pool,
                                     .n_seq = T_N_SEQ,
                                     .n_ctx = T_N_CTX,
                                     .instance = 42};
    cr_assert_eq(executor_serve_start(&so, &t.serve, &e), 0, "%s", e.text);
    t.n_vocab = executor_model_hparams(t.model)->n_vocab;
    snprintf(t.url, sizeof(t.url), "ipc://%s/executor.ctl", t.dir);
}

static void t_setup1(void)
{
    t_start(1, false, 0);
}

static void t_setup1_pinned(void)
{
    t_start(1, true, 0);
}

static void t_setup1_small(void)
{
    t_start(1, false, 4);
}

static void t_setup2(void)
{
    t_start(2, false, 0);
}

static void t_router_close(void)
{
    for (int i = 0; i < 4; i++)
        common_ring_segment_close(&t.seg[i]);
    memset(t.seg, 0, sizeof(t.seg));
}

static void t_teardown(void)
{
    t_router_close();
    executor_serve_stop(t.serve);
    struct executor_weights *w = t.model ? executor_model_weights(t.model) : NULL;
    executor_model_destroy(t.model);
    executor_weights_destroy(w);
    executor_remote_destroy(t.remote);
    executor_threadpool_destroy(t.pool);
    if (t.desc_ok)
        common_model_fini(&t.desc);
    common_gguf_close(t.gguf);
    for (uint32_t i = 0; i < T_FETCHERS; i++)
        (void)fetcher_serve_stop(t.fetchers[i], NULL);
    fixture_rmtree(t.dir);
    free(t.dir);
    free(t.model_path);
    memset(&t, 0, sizeof(t));
}

/* ---- acting as the router ------------------------------------------------------------------ */

/* Sends ATTACH with the given numbers; returns the reply (caller clears it). */
static void t_attach_with(uint32_t n_seq, uint32_t n_ctx, uint32_t n_vocab, struct proto_msg *rep)
{
    struct proto_msg     req = {.kind = PROTO_KIND_ATTACH};
    struct common_errmsg e = {{0}};
    req.u.attach = (struct proto_attach){.role = PROTO_ROLE_ROUTER,
                                         .pid = (uint32_t)getpid(),
                                         .instance = 7,
                                         .n_segments = 4,
                                         .params = {T_SLOTS, n_seq, n_ctx, n_vocab}};
    snprintf(req.u.attach.segments[0], PROTO_MAX_NAME, "router-exec.req");
    snprintf(req.u.attach.segments[1], PROTO_MAX_NAME, "router-exec.rep");
    snprintf(req.u.attach.segments[2], PROTO_MAX_NAME, "router-exec.tokens");
    snprintf(req.u.attach.segments[3], PROTO_MAX_NAME, "router-exec.logits");
    cr_assert_eq(proto_call(t.url, &req, rep, 5000, &e), 0, "ATTACH: %s", e.text);
}

/* Creates the four segments and attaches them to the executor. */
static void t_router_attach(void)
{
    size_t rb = common_ring_bytes(sizeof(struct proto_step_req), T_SLOTS);
    size_t pb = common_ring_bytes(sizeof(struct proto_step_rep), T_SLOTS);
    cr_assert_eq(common_ring_segment_create(t.dir, "router-exec.req", rb, &t.seg[0]), 0);
    cr_assert_eq(common_ring_segment_create(t.dir, "router-exec.rep", pb, &t.seg[1]), 0);
    cr_assert_eq(common_ring_segment_create(t.dir, "router-exec.tokens",
                                            T_N_SEQ * T_N_CTX * sizeof(int32_t), &t.seg[2]),
                 0);
    cr_assert_eq(common_ring_segment_create(t.dir, "router-exec.logits",
                                            T_N_SEQ * t.n_vocab * sizeof(float), &t.seg[3]),
                 0);
    cr_assert_eq(common_ring_init(t.seg[0].mem, rb, sizeof(struct proto_step_req), T_SLOTS), 0);
    cr_assert_eq(common_ring_init(t.seg[1].mem, pb, sizeof(struct proto_step_rep), T_SLOTS), 0);
    cr_assert_eq(
        common_ring_attach(t.seg[0].mem, rb, sizeof(struct proto_step_req), T_SLOTS, &t.req), 0);
    cr_assert_eq(
        common_ring_attach(t.seg[1].mem, pb, sizeof(struct proto_step_rep), T_SLOTS, &t.rep), 0);
    t.tokens = t.seg[2].mem;
    t.logits = t.seg[3].mem;
    struct proto_msg rep;
    t_attach_with(T_N_SEQ, T_N_CTX, t.n_vocab, &rep);
    cr_assert_eq(rep.kind, PROTO_KIND_OK, "ATTACH refused: %s",
                 rep.kind == PROTO_KIND_ERROR ? rep.u.error.message : "?");
    proto_msg_clear(&rep);
}

/* Sends one record and waits for its reply. */
static struct proto_step_rep t_step_raw(struct proto_step_req q)
{
    q.tag = ++t.next_tag;
    cr_assert_eq(common_ring_push(&t.req, &q, sizeof(q)), 0);
    struct proto_step_rep r;
    cr_assert_eq(common_ring_pop_wait(&t.rep, &r, sizeof(r), T_WAIT_MS), (int)sizeof(r),
                 "no step reply");
    cr_assert_eq(r.tag, q.tag, "reply tag %llu for request %llu", (unsigned long long)r.tag,
                 (unsigned long long)q.tag);
    return r;
}

/* The greedy token of sequence seq's row of the logits slab. */
static int32_t t_argmax_row(uint32_t seq)
{
    const float *l = t.logits + (size_t)seq * t.n_vocab;
    int32_t      best = 0;
    for (uint32_t v = 1; v < t.n_vocab; v++)
        if (l[v] > l[best])
            best = (int32_t)v;
    return best;
}

/* EVAL of ids[0..n) at pos for seq; returns the greedy next token. */
static int32_t t_eval(uint32_t seq, uint32_t pos, const int32_t *ids, uint32_t n)
{
    memcpy(t.tokens + (size_t)seq * T_N_CTX + pos, ids, n * sizeof(int32_t));
    struct proto_step_rep r =
        t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = seq, .pos = pos, .n = n});
    cr_assert_eq(r.status, 0, "EVAL seq=%u pos=%u n=%u: %s", seq, pos, n,
                 common_strerror(r.status));
    cr_assert_eq(r.n_past, pos + n);
    return t_argmax_row(seq);
}

/* ---- the reference: an in-process model over mmap weights ---------------------------------- */

static void t_reference(const int32_t *prompt, uint32_t n_prompt, int32_t *out)
{
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(t.model_path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_create(
                     m, &(struct executor_ctx_opts){.n_ctx = T_N_CTX, .pool = t.pool}, &c, &e),
                 0, "%s", e.text);
    uint32_t nv = executor_ctx_n_vocab(c);
    float   *logits = malloc(nv * sizeof(float));
    cr_assert_eq(executor_ctx_decode(c, prompt, n_prompt, logits, NULL, &e), 0, "%s", e.text);
    for (uint32_t i = 0; i < T_GEN; i++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < nv; v++)
            if (logits[v] > logits[best])
                best = (int32_t)v;
        out[i] = best;
        if (i + 1 < T_GEN)
            cr_assert_eq(executor_ctx_decode(c, &best, 1, logits, NULL, &e), 0, "%s", e.text);
    }
    free(logits);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
}

/* Greedy generation through the step service on `seq`. */
static void t_generate(uint32_t seq, const int32_t *prompt, uint32_t n_prompt, int32_t *out)
{
    int32_t  next = t_eval(seq, 0, prompt, n_prompt);
    uint32_t pos = n_prompt;
    for (uint32_t i = 0; i < T_GEN; i++) {
        out[i] = next;
        if (i + 1 < T_GEN)
            next = t_eval(seq, pos++, &next, 1);
    }
}

static void t_expect_same(const int32_t *got, const int32_t *want, const char *what)
{
    for (uint32_t i = 0; i < T_GEN; i++)
        cr_expect_eq(got[i], want[i], "%s: token %u is %d, in-process gives %d", what, i, got[i],
                     want[i]);
}

#define N_OF(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

/* ---- tests --------------------------------------------------------------------------------- */

Test(executor_serve, greedy_matches_in_process, .init = t_setup1, .fini = t_teardown,
     .timeout = 120)
{
    int32_t want[T_GEN], got[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want);
    t_router_attach();
    t_generate(0, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "one fetcher");
    struct executor_remote_stats st;
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st), 0);
    cr_expect_gt(st.acquires, 0, "experts came from the fetcher");
    cr_expect(st.up);
}

/* Once the pool has evicted nothing for a token, parts READY in it are read in place: a second
 * run of the same prompt sends no ACQUIRE, and the fetcher hears of every use. */
Test(executor_serve, settled_pool_is_read_in_place, .init = t_setup1, .fini = t_teardown,
     .timeout = 120)
{
    int32_t want[T_GEN], got[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want);
    t_router_attach();
    t_generate(0, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "first run");
    struct executor_remote_stats st0, st1;
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st0), 0);
    cr_expect_gt(st0.acquires, 0, "the cold pool was filled through ACQUIREs");
    t_generate(1, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "second run, read in place");
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st1), 0);
    cr_expect_eq(st1.acquires, st0.acquires, "a settled pool needs no ACQUIRE");
    cr_expect_gt(st1.direct, st0.direct, "parts were read in place");
    cr_expect_eq(st1.torn, 0);
    /* USE records are quiet: the fetcher reads them at its next wake-up (at most 200 ms). */
    struct fetcher_serve_counts fc = {0};
    for (;;) { /* the USE records reach the fetcher at its next wake-up; the timeout bounds it */
        fetcher_serve_counts(t.fetchers[0], &fc);
        if (fc.uses == st1.direct)
            break;
        usleep(100 * 1000);
    }
    cr_expect_eq(fc.uses, st1.direct, "the fetcher counted %llu uses of %llu direct reads",
                 (unsigned long long)fc.uses, (unsigned long long)st1.direct);
    cr_expect_eq(fc.bad_records, 0);
}

/* A direct read whose slot is evicted during the loan: its release says so, later parts are
 * pinned, and a generation through a pool that keeps evicting still gives the same tokens. */
Test(executor_serve, reused_direct_read_is_reported, .init = t_setup1_small, .fini = t_teardown,
     .timeout = 120)
{
    struct executor_expert_source src;
    executor_remote_source(t.remote, &src);
    const void *d = NULL;
    uint32_t    loan = 0, other = 0;
    src.token_begin(src.arg);
    cr_assert_eq(src.acquire(src.arg, 0, 0, COMMON_EXPERT_GATE, &d, &loan), 0);
    cr_assert_eq(src.release(src.arg, loan), 0, "a pinned loan is always valid");
    /* The loan came when its part was readable; the bundle is READY once every part is. */
    while (!src.is_ready(src.arg, 0, 0))
        usleep(10 * 1000);
    cr_assert(src.is_ready(src.arg, 0, 0));
    src.token_begin(src.arg); /* the pool's eviction count is noted */
    src.token_begin(src.arg); /* unchanged over a token: direct reads */
    struct executor_remote_stats st0, st1;
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st0), 0);
    cr_assert_eq(src.acquire(src.arg, 0, 0, COMMON_EXPERT_GATE, &d, &loan), 0);
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st1), 0);
    cr_assert_eq(st1.direct, st0.direct + 1, "expert 0 of layer 0 was read in place");
    /* Demand loads of five other experts through a pool of four slots evict it. */
    for (uint32_t x = 0; x < 5; x++) {
        cr_assert_eq(src.acquire(src.arg, 1, x, COMMON_EXPERT_GATE, &d, &other), 0);
        cr_assert_eq(src.release(src.arg, other), 0);
    }
    cr_expect_eq(src.release(src.arg, loan), COMMON_EAGAIN, "the reuse went unnoticed");
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st0), 0);
    cr_expect_eq(st0.torn, 1);
    cr_assert_eq(src.acquire(src.arg, 0, 0, COMMON_EXPERT_GATE, &d, &loan), 0);
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st1), 0);
    cr_expect_eq(st1.direct, st0.direct, "after a reuse, parts are pinned");
    cr_expect_eq(st1.acquires, st0.acquires + 1);
    cr_expect_eq(src.release(src.arg, loan), 0);

    int32_t want[T_GEN], got[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want);
    t_router_attach();
    t_generate(0, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "a pool of four slots");
}

Test(executor_serve, two_fetchers_share_the_experts, .init = t_setup2, .fini = t_teardown,
     .timeout = 120)
{
    int32_t want[T_GEN], got[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want);
    t_router_attach();
    t_generate(1, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "two fetchers");
    struct proto_shard sh[4];
    cr_assert_eq(executor_remote_shards(t.remote, sh, 4), 2);
    cr_expect_eq(sh[0].first_expert, 0);
    cr_expect_eq(sh[1].first_expert, sh[0].n_experts);
    cr_expect_eq(sh[0].n_experts + sh[1].n_experts, t.desc.hp.n_expert);
    for (uint32_t i = 0; i < 2; i++) {
        struct executor_remote_stats st;
        cr_assert_eq(executor_remote_stats(t.remote, i, &st), 0);
        cr_expect_gt(st.acquires, 0, "fetcher %u served nothing", i);
    }
}

Test(executor_serve, interleaved_sequences_match_each_alone, .init = t_setup1, .fini = t_teardown,
     .timeout = 180)
{
    int32_t want_a[T_GEN], want_b[T_GEN], got_a[T_GEN], got_b[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want_a);
    t_reference(t_prompt_b, N_OF(t_prompt_b), want_b);
    t_router_attach();
    int32_t  na = t_eval(0, 0, t_prompt_a, N_OF(t_prompt_a));
    int32_t  nb = t_eval(1, 0, t_prompt_b, N_OF(t_prompt_b));
    uint32_t pa = N_OF(t_prompt_a), pb = N_OF(t_prompt_b);
    for (uint32_t i = 0; i < T_GEN; i++) {
        got_a[i] = na;
        got_b[i] = nb;
        if (i + 1 < T_GEN) {
            na = t_eval(0, pa++, &na, 1);
            nb = t_eval(1, pb++, &nb, 1);
        }
    }
    t_expect_same(got_a, want_a, "sequence 0 interleaved");
    t_expect_same(got_b, want_b, "sequence 1 interleaved");
}

/* A STATS counter of the executor (-1 when absent). */
static double t_stat(const char *name)
{
    struct proto_msg     req = {.kind = PROTO_KIND_STATS}, rep;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_STATS_REPLY);
    double v = -1.0;
    for (uint32_t i = 0; i < rep.u.stats.n_stats; i++)
        if (strcmp(rep.u.stats.stats[i].name, name) == 0)
            v = rep.u.stats.stats[i].value;
    proto_msg_clear(&rep);
    return v;
}

/* Pushes the records of one round at once (all but the last flagged "more") and waits for all
 * their replies, which go to rep[] in the order of the records. */
static void t_round(struct proto_step_req *q, uint32_t n, struct proto_step_rep *rep)
{
    for (uint32_t i = 0; i < n; i++) {
        q[i].tag = ++t.next_tag;
        q[i].flags = i + 1 < n ? PROTO_STEP_F_MORE : 0;
        cr_assert_eq(common_ring_push(&t.req, &q[i], sizeof(q[i])), 0);
    }
    for (uint32_t k = 0; k < n; k++) {
        struct proto_step_rep r;
        cr_assert_eq(common_ring_pop_wait(&t.rep, &r, sizeof(r), T_WAIT_MS), (int)sizeof(r),
                     "no step reply");
        uint32_t i = 0;
        while (i < n && q[i].tag != r.tag)
            i++;
        cr_assert_lt(i, n, "reply with unknown tag %llu", (unsigned long long)r.tag);
        rep[i] = r;
    }
}

/* Rounds of both sequences (prompts together, then one token each) run as one batch per round:
 * each sequence's tokens are those it gets alone, and the executor counts batches of two. A
 * malformed record inside a round fails alone. */
Test(executor_serve, batched_rounds_match_each_alone, .init = t_setup1, .fini = t_teardown,
     .timeout = 180)
{
    int32_t want_a[T_GEN], want_b[T_GEN], got_a[T_GEN], got_b[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want_a);
    t_reference(t_prompt_b, N_OF(t_prompt_b), want_b);
    t_router_attach();
    uint32_t pa = N_OF(t_prompt_a), pb = N_OF(t_prompt_b);
    memcpy(t.tokens, t_prompt_a, sizeof(t_prompt_a));
    memcpy(t.tokens + T_N_CTX, t_prompt_b, sizeof(t_prompt_b));
    struct proto_step_req q[3] = {
        {.op = PROTO_STEP_EVAL, .seq = 0, .pos = 0, .n = pa},
        {.op = PROTO_STEP_EVAL, .seq = 77, .pos = 0, .n = 1}, /* no such sequence */
        {.op = PROTO_STEP_EVAL, .seq = 1, .pos = 0, .n = pb},
    };
    struct proto_step_rep rep[3];
    t_round(q, 3, rep);
    cr_assert_eq(rep[0].status, 0);
    cr_expect_eq(rep[1].status, COMMON_EINVAL);
    cr_assert_eq(rep[2].status, 0);
    for (uint32_t i = 0; i < T_GEN; i++) {
        got_a[i] = t_argmax_row(0);
        got_b[i] = t_argmax_row(1);
        if (i + 1 == T_GEN)
            break;
        t.tokens[pa] = got_a[i];
        t.tokens[T_N_CTX + pb] = got_b[i];
        q[0] = (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = pa++, .n = 1};
        q[1] = (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 1, .pos = pb++, .n = 1};
        t_round(q, 2, rep);
        cr_assert(rep[0].status == 0 && rep[1].status == 0, "step %u: %d %d", i, rep[0].status,
                  rep[1].status);
        cr_expect(rep[0].n_past == pa && rep[1].n_past == pb);
    }
    t_expect_same(got_a, want_a, "sequence 0 batched");
    t_expect_same(got_b, want_b, "sequence 1 batched");
    cr_expect_eq(t_stat("batches"), (double)T_GEN, "one batch per round");
    cr_expect_eq(t_stat("batch_seqs_mean"), 2.0, "two sequences in each batch");
    /* Two records of one sequence in a round run in order: the second after the first. */
    t.tokens[pa] = 5;
    t.tokens[pa + 1] = 6;
    q[0] = (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = pa, .n = 1};
    q[1] = (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = pa + 1, .n = 1};
    t_round(q, 2, rep);
    cr_expect(rep[0].status == 0 && rep[1].status == 0, "%d %d", rep[0].status, rep[1].status);
    cr_expect_eq(rep[0].n_past, pa + 1);
    cr_expect_eq(rep[1].n_past, pa + 2);
}

Test(executor_serve, bad_records_get_errors_and_service_goes_on, .init = t_setup1,
     .fini = t_teardown, .timeout = 120)
{
    t_router_attach();
    struct proto_step_rep r;
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = T_N_SEQ, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "seq out of range");
    r = t_step_raw((struct proto_step_req){.op = 99, .seq = 0, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "unknown op");
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = 0, .n = 0});
    cr_expect_eq(r.status, COMMON_EINVAL, "n = 0");
    r = t_step_raw(
        (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = T_N_CTX - 1, .n = 2});
    cr_expect_eq(r.status, COMMON_ERANGE, "pos + n beyond n_ctx");
    r = t_step_raw(
        (struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = UINT32_MAX, .n = 2});
    cr_expect_eq(r.status, COMMON_ERANGE, "pos + n overflowing");
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = 3, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "pos beyond the sequence's length");
    t.tokens[0] = (int32_t)t.n_vocab;
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = 0, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "token id out of range");
    t.tokens[0] = -5;
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_EVAL, .seq = 0, .pos = 0, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "negative token id");

    /* The service goes on: a good prompt, a pos mismatch, then the right pos. */
    (void)t_eval(0, 0, t_prompt_a, N_OF(t_prompt_a));
    r = t_step_raw((struct proto_step_req){
        .op = PROTO_STEP_EVAL, .seq = 0, .pos = N_OF(t_prompt_a) - 1, .n = 1});
    cr_expect_eq(r.status, COMMON_EINVAL, "pos behind the sequence's length");
    cr_expect_eq(r.n_past, N_OF(t_prompt_a), "a refused step leaves the sequence alone");
    int32_t id = 262;
    (void)t_eval(0, N_OF(t_prompt_a), &id, 1);
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_FREE, .seq = 0});
    cr_expect_eq(r.status, 0);
    cr_expect_eq(r.n_past, 0);
    r = t_step_raw((struct proto_step_req){.op = PROTO_STEP_FREE, .seq = 77});
    cr_expect_eq(r.status, COMMON_EINVAL, "FREE of a sequence out of range");
}

Test(executor_serve, attach_with_wrong_numbers_is_refused, .init = t_setup1, .fini = t_teardown,
     .timeout = 60)
{
    t_router_attach(); /* the segments exist; a refused ATTACH names what is wrong */
    struct proto_msg rep;
    t_attach_with(T_N_SEQ, T_N_CTX, t.n_vocab + 1, &rep);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_expect_eq(rep.u.error.code, COMMON_EINVAL);
    cr_expect(strstr(rep.u.error.message, "n_vocab") != NULL, "message: %s", rep.u.error.message);
    proto_msg_clear(&rep);
    t_attach_with(T_N_SEQ + 1, T_N_CTX, t.n_vocab, &rep);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_expect(strstr(rep.u.error.message, "n_seq") != NULL, "message: %s", rep.u.error.message);
    proto_msg_clear(&rep);
    t_attach_with(T_N_SEQ, T_N_CTX * 2, t.n_vocab, &rep);
    cr_assert_eq(rep.kind, PROTO_KIND_ERROR);
    cr_expect(strstr(rep.u.error.message, "n_ctx") != NULL, "message: %s", rep.u.error.message);
    proto_msg_clear(&rep);
    /* The link attached first still serves. */
    (void)t_eval(0, 0, t_prompt_a, N_OF(t_prompt_a));
}

Test(executor_serve, control_messages, .init = t_setup1, .fini = t_teardown, .timeout = 60)
{
    struct proto_msg     req = {.kind = PROTO_KIND_HELLO}, rep;
    struct common_errmsg e = {{0}};
    req.u.hello.role = PROTO_ROLE_ROUTER;
    req.u.hello.major = PROTO_VERSION_MAJOR;
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HELLO);
    cr_expect_eq(rep.u.hello.role, PROTO_ROLE_EXECUTOR);
    cr_expect_eq(rep.u.hello.pid, (uint32_t)getpid());
    cr_expect_eq(rep.u.hello.instance, 42);
    cr_expect_eq(rep.u.hello.n_shards, 1);
    cr_expect_eq(rep.u.hello.shards[0].n_experts, t.desc.hp.n_expert);
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_HEALTH};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HEALTH_REPLY);
    cr_expect_eq(rep.u.health.state, PROTO_HEALTH_READY);
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_STATS};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_STATS_REPLY);
    bool has_steps = false, has_acq = false;
    for (uint32_t i = 0; i < rep.u.stats.n_stats; i++) {
        has_steps |= strcmp(rep.u.stats.stats[i].name, "steps") == 0;
        has_acq |= strcmp(rep.u.stats.stats[i].name, "fetcher.0.acquires") == 0;
    }
    cr_expect(has_steps && has_acq, "stats lack steps or fetcher.0.acquires");
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_CONFIGURE};
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "no.such.key");
    snprintf(req.u.configure.value, sizeof(req.u.configure.value), "1");
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_ERROR);
    cr_expect_eq(rep.u.error.code, COMMON_EINVAL);
    proto_msg_clear(&rep);
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "log.level");
    snprintf(req.u.configure.value, sizeof(req.u.configure.value), "%s",
             common_log_get_level() == COMMON_LOG_LEVEL_DEBUG ? "debug" : "warn");
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_OK);
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_LOAD_MODEL};
    snprintf(req.u.load_model.path, sizeof(req.u.load_model.path), "%s", t.model_path);
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_OK, "LOAD_MODEL of the loaded model");
    proto_msg_clear(&rep);
    snprintf(req.u.load_model.path, sizeof(req.u.load_model.path), "/nonexistent.gguf");
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_ERROR);
    cr_expect_eq(rep.u.error.code, COMMON_ENOTSUP);
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_GENERATE};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_ERROR, "the executor does not generate");
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_DRAIN};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_OK);
    proto_msg_clear(&rep);
    req = (struct proto_msg){.kind = PROTO_KIND_HEALTH};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.u.health.state, PROTO_HEALTH_DRAINING);
    proto_msg_clear(&rep);
    cr_expect(!proto_service_shutdown_requested(executor_serve_service(t.serve)));
    req = (struct proto_msg){.kind = PROTO_KIND_SHUTDOWN};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_expect_eq(rep.kind, PROTO_KIND_OK);
    proto_msg_clear(&rep);
    cr_expect(proto_service_shutdown_requested(executor_serve_service(t.serve)));
}

/* HEALTH state of the executor. */
static enum proto_health_state t_health(void)
{
    struct proto_msg     req = {.kind = PROTO_KIND_HEALTH}, rep;
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_call(t.url, &req, &rep, 5000, &e), 0, "%s", e.text);
    cr_assert_eq(rep.kind, PROTO_KIND_HEALTH_REPLY);
    enum proto_health_state st = rep.u.health.state;
    proto_msg_clear(&rep);
    return st;
}

/* Pinned parts: the step in flight needs the fetcher (direct reads of a settled pool would
 * finish it from the old mapping before the restart). */
Test(executor_serve, fetcher_restart_relinks_and_tokens_stay, .init = t_setup1_pinned,
     .fini = t_teardown, .timeout = 180)
{
    int32_t want[T_GEN], got[T_GEN];
    t_reference(t_prompt_a, N_OF(t_prompt_a), want);
    t_router_attach();
    t_generate(0, t_prompt_a, N_OF(t_prompt_a), got);
    t_expect_same(got, want, "before the restart");

    /* The fetcher goes away with a step in flight: its ACQUIREs wait for the new fetcher. */
    cr_assert_eq(fetcher_serve_stop(t.fetchers[0], NULL), 0);
    t.fetchers[0] = NULL;
    memcpy(t.tokens, t_prompt_a, sizeof(t_prompt_a));
    struct proto_step_req q = {
        .op = PROTO_STEP_EVAL, .seq = 0, .tag = ++t.next_tag, .pos = 0, .n = N_OF(t_prompt_a)};
    cr_assert_eq(common_ring_push(&t.req, &q, sizeof(q)), 0);
    enum proto_health_state hs = PROTO_HEALTH_READY;
    while (hs != PROTO_HEALTH_DEGRADED) { /* bounded by the test's timeout */
        usleep(50 * 1000);
        hs = t_health();
    }
    cr_assert_eq(hs, PROTO_HEALTH_DEGRADED, "HEALTH while the fetcher is missing");

    t_fetcher_start(0);
    struct proto_step_rep r;
    cr_assert_eq(common_ring_pop_wait(&t.rep, &r, sizeof(r), T_WAIT_MS), (int)sizeof(r));
    cr_assert_eq(r.tag, q.tag);
    cr_assert_eq(r.status, 0, "the step in flight failed: %s", common_strerror(r.status));
    struct executor_remote_stats st = {0};
    cr_assert_eq(executor_remote_stats(t.remote, 0, &st), 0);
    cr_expect_eq(st.relinks, 1, "the executor did not follow the restart");
    cr_expect(st.up);
    cr_expect_eq(t_health(), PROTO_HEALTH_READY);

    /* The rest of the generation: the same tokens. */
    const float *l = t.logits;
    int32_t      next = 0;
    for (uint32_t v = 1; v < t.n_vocab; v++)
        if (l[v] > l[next])
            next = (int32_t)v;
    uint32_t pos = N_OF(t_prompt_a);
    for (uint32_t i = 0; i < T_GEN; i++) {
        got[i] = next;
        if (i + 1 < T_GEN)
            next = t_eval(0, pos++, &next, 1);
    }
    t_expect_same(got, want, "across the restart");
}

Test(executor_serve, binary_help_exits_zero, .timeout = 30)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/bin/sluice-executor --help", SLUICE_BINARY_DIR);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char   out[8192];
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "--help exit status %d", st);
    cr_expect(strstr(out, "usage: sluice-executor") != NULL, "output: %s", out);
    cr_expect(strstr(out, "--run-dir") != NULL);

    snprintf(cmd, sizeof(cmd), "%s/bin/sluice-executor --bogus 2>&1", SLUICE_BINARY_DIR);
    f = popen(cmd, "r");
    cr_assert_not_null(f);
    n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    st = pclose(f);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "a bad option exits 2 (usage error)");
    cr_expect(strstr(out, "sluice-executor: error: unknown option '--bogus'") != NULL, "%s", out);
    cr_expect(strstr(out, "usage:") == NULL, "one line and a hint, not the whole usage: %s", out);
}
