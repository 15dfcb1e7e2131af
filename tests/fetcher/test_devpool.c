/* tests/fetcher/test_devpool.c - the fetcher's device expert pool (fetcher/devpool.c) on the
 * host's emulation of device memory: its handshake over the Unix socket, copies from the RAM pool
 * marked and waited for as the executor does, and what it refuses. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "devpool.h"
#include "fetcher.h"
#include "fixture.h"
#include "proto.h"

#define RAM_BYTES (1u << 20)
#define BUDGET    (512u << 10)

static char     g_dir[512], g_path[600];
static uint8_t *g_ram;

static void setup(void)
{
    /* the protocol on the host emulation: CUDA's calls are common_devmem's tests' (its event
     * handles open only in another process than their maker's) */
    setenv("SLUICE_GPU_BACKEND", "host", 1);
    common_log_set_level(COMMON_LOG_LEVEL_WARN);
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    snprintf(g_dir, sizeof(g_dir), "%s", dir);
    free(dir);
    snprintf(g_path, sizeof(g_path), "%s/fetcher-0.dev", g_dir);
    g_ram = malloc(RAM_BYTES);
    cr_assert_not_null(g_ram);
    for (uint32_t i = 0; i < RAM_BYTES; i++)
        g_ram[i] = (uint8_t)(i * 7u + (i >> 11));
}

static void teardown(void)
{
    free(g_ram);
    fixture_rmtree(g_dir);
}

/* The executor's side of the socket. */
struct client {
    int                          sock;
    struct proto_devpool_granted g;
    void                        *ctl_page;
    _Atomic uint32_t            *ctl;
    struct common_devmem_event  *ev[2], *kev;
    uint8_t                     *base;
};

static uint64_t send_handle(int sock, uint64_t tag, const void *blob, uint32_t len)
{
    struct common_devmem_handle h = {.fd = -1, .len = len};
    memcpy(h.blob, blob, len);
    return (uint64_t)common_devmem_handle_send(sock, &h, tag);
}

/* The next message: its tag, *h filled. */
static uint64_t recv_handle(int sock, struct common_devmem_handle *h)
{
    uint64_t tag = 0;
    cr_assert_eq(common_devmem_handle_recv(sock, h, &tag, 10000), COMMON_OK);
    return tag;
}

/* Sends OPEN for `bytes` and 2 events; returns the reply's tag (the error text in why). */
static uint64_t open_pool_at(const char *path, uint32_t flags, struct client *c, uint64_t bytes,
                             char *why, size_t len)
{
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_unix_connect(path, &c->sock), COMMON_OK);
    const struct proto_devpool_open o = {
        .magic = PROTO_DEVPOOL_MAGIC, .device = 0, .bytes = bytes, .n_events = 2, .flags = flags};
    cr_assert_eq(send_handle(c->sock, PROTO_DEVPOOL_OPEN, &o, sizeof(o)), 0);
    struct common_devmem_handle h;
    uint64_t                    tag = recv_handle(c->sock, &h);
    if (tag != PROTO_DEVPOOL_GRANTED) {
        snprintf(why, len, "%.*s", (int)h.len, (const char *)h.blob);
        return tag;
    }
    cr_assert_eq(h.len, sizeof(c->g));
    memcpy(&c->g, h.blob, sizeof(c->g));
    cr_assert_eq(recv_handle(c->sock, &h), PROTO_DEVPOOL_CTL);
    void *p = mmap(NULL, PROTO_DEVPOOL_CTL_BYTES, PROT_READ, MAP_SHARED, h.fd, 0);
    close(h.fd);
    cr_assert_neq(p, MAP_FAILED);
    c->ctl_page = p;
    c->ctl = p;
    for (int k = 0; k < 2; k++) {
        cr_assert_eq(recv_handle(c->sock, &h), PROTO_DEVPOOL_EVENT);
        cr_assert_eq(common_devmem_event_import(&h, &c->ev[k], &e), COMMON_OK, "%s", e.text);
    }
    cr_assert_eq(common_devmem_event_create(&c->kev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_export(c->kev, &h, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_handle_send(c->sock, &h, PROTO_DEVPOOL_KEVENT), COMMON_OK);
    close(h.fd);
    c->base = common_devmem_reserve(c->g.bytes, &e);
    cr_assert_not_null(c->base, "%s", e.text);
    return tag;
}

static uint64_t open_pool(struct client *c, uint64_t bytes, char *why, size_t len)
{
    return open_pool_at(g_path, 0, c, bytes, why, len);
}

/* Frees what open_pool gave the client (its mapped pieces are the caller's). */
static void client_free(struct client *c)
{
    if (c->sock >= 0)
        close(c->sock);
    c->sock = -1;
    common_devmem_unreserve(c->base, c->g.bytes);
    common_devmem_event_destroy(c->ev[0]);
    common_devmem_event_destroy(c->ev[1]);
    common_devmem_event_destroy(c->kev);
    if (c->ctl_page)
        munmap(c->ctl_page, PROTO_DEVPOOL_CTL_BYTES);
    memset(c, 0, sizeof(*c));
}

/* Asks for piece k and maps it in the client's reservation; the reply's tag. */
static uint64_t get_piece(struct client *c, uint32_t k, struct common_devmem_piece **out)
{
    struct common_errmsg e = {{0}};
    cr_assert_eq(send_handle(c->sock, PROTO_DEVPOOL_PIECE, &k, sizeof(k)), 0);
    struct common_devmem_handle h;
    uint64_t                    tag = recv_handle(c->sock, &h);
    if (tag != PROTO_DEVPOOL_PIECE)
        return tag;
    cr_assert_eq(common_devmem_piece_import(&h, c->g.granularity, out, &e), COMMON_OK, "%s",
                 e.text);
    cr_assert_eq(common_devmem_piece_map(*out, c->base + (size_t)k * c->g.granularity, &e),
                 COMMON_OK, "%s", e.text);
    return tag;
}

/* Waits until the pool's open state is `open` (the service notices a closed connection at its
 * next look); false after 30 s. */
static bool wait_open(struct fetcher_devpool *d, bool open)
{
    for (int i = 0; i < 3000; i++) {
        struct fetcher_devpool_counts c;
        fetcher_devpool_counts(d, &c);
        if (c.open == open)
            return true;
        usleep(10000);
    }
    return false;
}

/* A service on `path` over `ram` (RAM_BYTES). */
static struct fetcher_devpool *start_at(const char *path, uint64_t budget, const uint8_t *ram)
{
    struct fetcher_devpool *d = NULL;
    struct common_errmsg    e = {{0}};
    const struct fetcher_devpool_opts o = {
        .path = path, .budget = budget, .ram = ram, .ram_bytes = RAM_BYTES};
    cr_assert_eq(fetcher_devpool_start(&o, &d, &e), COMMON_OK, "%s", e.text);
    return d;
}

TestSuite(fetcher_devpool, .init = setup, .fini = teardown, .timeout = 120);

/* What an executor does: the pool opened, two pieces mapped, a copy from the RAM pool across
 * their boundary queued, marked, waited for (control page, then event): the bytes are there in
 * the executor's mapping. */
Test(fetcher_devpool, copies_from_the_ram_pool_reach_the_executors_mapping)
{
    struct fetcher_devpool *d = start_at(g_path, BUDGET, g_ram);
    struct common_errmsg    e = {{0}};
    struct client c = {0};
    char          why[80] = "";
    cr_assert_eq(open_pool(&c, 300000, why, sizeof(why)), PROTO_DEVPOOL_GRANTED, "%s", why);
    const uint64_t gran = c.g.granularity;
    cr_assert_gt(gran, 0);
    cr_assert_eq(c.g.bytes, (300000 + gran - 1) / gran * gran);
    cr_assert_str_eq(c.g.backend, "HOST");
    cr_assert(wait_open(d, true));
    struct common_devmem_piece *p0 = NULL, *p1 = NULL;
    cr_assert_eq(get_piece(&c, 0, &p0), PROTO_DEVPOOL_PIECE);
    cr_assert_eq(get_piece(&c, 1, &p1), PROTO_DEVPOOL_PIECE);

    const uint64_t               dst = gran - 1000, src = 12345, n = 5000; /* across pieces */
    const struct proto_fetch_req wait = {.op = PROTO_FETCH_DEV_WAIT};
    const struct proto_fetch_req copy = {
        .op = PROTO_FETCH_DEV_COPY, .bytes = (uint32_t)n, .src = src, .dst = dst};
    const struct proto_fetch_req mark = {.op = PROTO_FETCH_DEV_MARK, .tag = 1, .loan = 7};
    cr_assert_eq(fetcher_devpool_record(d, &wait), COMMON_OK);
    cr_assert_eq(fetcher_devpool_record(d, &copy), COMMON_OK);
    cr_assert_eq(fetcher_devpool_record(d, &mark), COMMON_OK);
    cr_assert_eq(atomic_load(c.ctl), 7u, "the mark's number is published");
    cr_assert_eq(common_devmem_event_sync(c.ev[1], &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(memcmp(c.base + dst, g_ram + src, n), 0, "the copy is in the executor's view");

    /* Refused, each counted: a piece not made, outside the RAM pool, past the pool, an event
     * that does not exist (its mark published as failed), an unknown op. */
    const struct proto_fetch_req bad[] = {
        {.op = PROTO_FETCH_DEV_COPY, .bytes = 64, .src = 0, .dst = 2 * gran},
        {.op = PROTO_FETCH_DEV_COPY, .bytes = 64, .src = RAM_BYTES - 32, .dst = 0},
        {.op = PROTO_FETCH_DEV_COPY, .bytes = 64, .src = 0, .dst = UINT64_MAX - 8},
        {.op = PROTO_FETCH_DEV_COPY, .bytes = 0, .src = 0, .dst = 0},
        {.op = PROTO_FETCH_DEV_MARK, .tag = 2, .loan = 8},
        {.op = PROTO_FETCH_ACQUIRE},
        {.op = PROTO_FETCH_DEV_READ, .bytes = 64}, /* this pool does not stage */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(fetcher_devpool_record(d, &bad[i]), COMMON_EINVAL, "record %zu", i);
    /* The mark it could not record is published all the same, as failed: the executor waiting
     * for it learns at once that the copies before it are not to be trusted. */
    cr_expect_eq(atomic_load(c.ctl), 8u, "the refused mark's number is published");
    cr_expect_eq(*(const uint32_t *)((const uint8_t *)c.ctl_page + 16), 8u, "as failed");
    /* A piece past the pool is refused with a reason; the connection goes on. */
    struct common_devmem_piece *px = NULL;
    cr_expect_eq(get_piece(&c, (uint32_t)(c.g.bytes / gran), &px), PROTO_DEVPOOL_ERROR);
    struct common_devmem_piece *p2 = NULL;
    cr_assert_eq(get_piece(&c, 2, &p2), PROTO_DEVPOOL_PIECE);

    struct fetcher_devpool_counts k;
    fetcher_devpool_counts(d, &k);
    cr_expect(k.pinned, "the RAM pool registered as pinned memory");
    cr_expect_eq(k.opens, 1);
    cr_expect_eq(k.copies, 1);
    cr_expect_eq(k.copied_bytes, n);
    cr_expect_eq(k.marks, 1);
    cr_expect_eq(k.waits, 1);
    cr_expect_eq(k.bad, sizeof(bad) / sizeof(bad[0]));
    cr_expect_eq(k.pieces, 3);
    cr_expect_eq(k.bytes, 3 * gran);

    /* The executor goes: the pool is dropped, its records refused; the memory stays in the
     * executor's mapping. */
    close(c.sock);
    cr_assert(wait_open(d, false));
    cr_expect_eq(fetcher_devpool_record(d, &copy), COMMON_EINVAL);
    cr_expect_eq(memcmp(c.base + dst, g_ram + src, n), 0);
    common_devmem_piece_destroy(p0);
    common_devmem_piece_destroy(p1);
    common_devmem_piece_destroy(p2);
    c.sock = -1; /* closed above */
    client_free(&c);
    fetcher_devpool_stop(d);
}

/* A pool over the budget, a first message that is not OPEN, an OPEN with bad fields: each
 * answered with ERROR and a reason; a good OPEN after them is served. */
Test(fetcher_devpool, refuses_bad_openings_with_a_reason)
{
    struct fetcher_devpool *d = start_at(g_path, BUDGET, g_ram);
    struct client           c = {0};
    char                    why[80] = "";
    cr_assert_eq(open_pool(&c, BUDGET + 1, why, sizeof(why)), PROTO_DEVPOOL_ERROR);
    cr_expect(strstr(why, "--vram-budget 524288") != NULL, "%s", why);
    close(c.sock);

    struct common_devmem_handle h;
    int                         sock = -1;
    uint32_t                    k = 0;
    cr_assert_eq(common_unix_connect(g_path, &sock), COMMON_OK);
    cr_assert_eq(send_handle(sock, PROTO_DEVPOOL_PIECE, &k, sizeof(k)), 0);
    cr_assert_eq(recv_handle(sock, &h), PROTO_DEVPOOL_ERROR);
    cr_expect(strstr((const char *)h.blob, "expected OPEN") != NULL);
    close(sock);

    const struct proto_devpool_open bad[] = {
        {.magic = 1, .bytes = 4096, .n_events = 1},
        {.magic = PROTO_DEVPOOL_MAGIC, .bytes = 0, .n_events = 1},
        {.magic = PROTO_DEVPOOL_MAGIC, .bytes = 4096, .n_events = 0},
        {.magic = PROTO_DEVPOOL_MAGIC, .bytes = 4096, .n_events = PROTO_DEVPOOL_MAX_EVENTS + 1},
        {.magic = PROTO_DEVPOOL_MAGIC, .device = -1, .bytes = 4096, .n_events = 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(common_unix_connect(g_path, &sock), COMMON_OK);
        cr_assert_eq(send_handle(sock, PROTO_DEVPOOL_OPEN, &bad[i], sizeof(bad[i])), 0);
        cr_expect_eq(recv_handle(sock, &h), PROTO_DEVPOOL_ERROR, "OPEN %zu", i);
        close(sock);
    }
    /* A short OPEN. */
    cr_assert_eq(common_unix_connect(g_path, &sock), COMMON_OK);
    cr_assert_eq(send_handle(sock, PROTO_DEVPOOL_OPEN, &bad[0], 8), 0);
    cr_expect_eq(recv_handle(sock, &h), PROTO_DEVPOOL_ERROR);
    close(sock);

    struct client g = {0};
    cr_assert_eq(open_pool(&g, 4096, why, sizeof(why)), PROTO_DEVPOOL_GRANTED, "%s", why);
    cr_assert(wait_open(d, true));
    struct fetcher_devpool_counts n;
    fetcher_devpool_counts(d, &n);
    cr_expect_eq(n.opens, 1);
    cr_expect_eq(n.refused, 1 + 1 + 5 + 1);
    client_free(&g);
    fetcher_devpool_stop(d);
}

/* A second fetcher (ADOPTS: its budget not charged) maps the first one's pieces as the executor
 * hands them over (ADOPT), copies from its own RAM pool into them, and the bytes are in the
 * first fetcher's memory as the executor sees it. It refuses PIECE, an ADOPT without a
 * descriptor, out of range or of a piece it has. */
Test(fetcher_devpool, a_second_fetcher_adopts_the_pieces_and_copies_into_them)
{
    struct fetcher_devpool *a = NULL, *b = NULL;
    struct common_errmsg    e = {{0}};
    char                    path_b[700], why[80] = "";
    uint8_t                *ram_b = malloc(RAM_BYTES);
    cr_assert_not_null(ram_b);
    for (uint32_t i = 0; i < RAM_BYTES; i++)
        ram_b[i] = (uint8_t)(i * 13u + 5u);
    snprintf(path_b, sizeof(path_b), "%s/fetcher-1.dev", g_dir);
    a = start_at(g_path, BUDGET, g_ram);
    b = start_at(path_b, 4096, ram_b);

    struct client ca = {0}, cb = {0};
    cr_assert_eq(open_pool(&ca, 200000, why, sizeof(why)), PROTO_DEVPOOL_GRANTED, "%s", why);
    cr_assert_eq(open_pool_at(path_b, PROTO_DEVPOOL_ADOPTS, &cb, 200000, why, sizeof(why)),
                 PROTO_DEVPOOL_GRANTED, "over its budget, yet not charged: %s", why);
    cr_assert(wait_open(a, true));
    cr_assert(wait_open(b, true));
    const uint64_t gran = ca.g.granularity;

    /* piece 0 from fetcher 0, handed to fetcher 1, then mapped here */
    const uint32_t              k = 0;
    struct common_devmem_handle h, r;
    cr_assert_eq(send_handle(ca.sock, PROTO_DEVPOOL_PIECE, &k, sizeof(k)), 0);
    cr_assert_eq(recv_handle(ca.sock, &h), PROTO_DEVPOOL_PIECE);
    struct common_devmem_handle dup_h = h;
    dup_h.fd = dup(h.fd);
    cr_assert_eq(common_devmem_handle_send(cb.sock, &dup_h, PROTO_DEVPOOL_ADOPT), COMMON_OK);
    close(dup_h.fd);
    cr_assert_eq(recv_handle(cb.sock, &r), PROTO_DEVPOOL_ADOPTED);
    struct common_devmem_piece *p = NULL;
    cr_assert_eq(common_devmem_piece_import(&h, gran, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(p, ca.base, &e), COMMON_OK, "%s", e.text);

    /* fetcher 1 copies from its RAM pool into it, marks, and the bytes are there */
    const struct proto_fetch_req copy = {
        .op = PROTO_FETCH_DEV_COPY, .bytes = 3000, .src = 777, .dst = 100};
    const struct proto_fetch_req mark = {.op = PROTO_FETCH_DEV_MARK, .tag = 0, .loan = 1};
    cr_assert_eq(fetcher_devpool_record(b, &copy), COMMON_OK);
    cr_assert_eq(fetcher_devpool_record(b, &mark), COMMON_OK);
    cr_assert_eq(atomic_load(cb.ctl), 1u);
    cr_assert_eq(common_devmem_event_sync(cb.ev[0], &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(memcmp(ca.base + 100, ram_b + 777, 3000), 0, "fetcher 1's copy in the memory");

    /* refused: PIECE of an adopter, ADOPT of a piece it has, out of range, without a handle */
    cr_assert_eq(send_handle(cb.sock, PROTO_DEVPOOL_PIECE, &k, sizeof(k)), 0);
    cr_expect_eq(recv_handle(cb.sock, &r), PROTO_DEVPOOL_ERROR);
    const uint64_t bad_tags[] = {PROTO_DEVPOOL_ADOPT, PROTO_DEVPOOL_ADOPT | (uint64_t)99 << 32};
    for (size_t i = 0; i < 2; i++) {
        struct common_devmem_handle d2 = h;
        d2.fd = open("/dev/null", O_RDONLY);
        cr_assert_eq(common_devmem_handle_send(cb.sock, &d2, bad_tags[i]), COMMON_OK);
        close(d2.fd);
        cr_expect_eq(recv_handle(cb.sock, &r), PROTO_DEVPOOL_ERROR, "ADOPT %zu", i);
    }
    const uint32_t one = 1;
    cr_assert_eq(send_handle(cb.sock, PROTO_DEVPOOL_ADOPT | (uint64_t)1 << 32, &one, sizeof(one)),
                 0);
    cr_expect_eq(recv_handle(cb.sock, &r), PROTO_DEVPOOL_ERROR, "ADOPT without a handle");

    struct fetcher_devpool_counts n;
    fetcher_devpool_counts(b, &n);
    cr_expect_eq(n.pieces, 1);
    cr_expect_eq(n.copies, 1);
    fetcher_devpool_stop(b);
    fetcher_devpool_stop(a);
    common_devmem_piece_destroy(p);
    client_free(&ca);
    client_free(&cb);
    free(ram_b);
}

/* A pool fed from storage (--vram-fill storage) over moe-tiny's experts and a RAM pool of
 * two slots: the gate and up parts of 12 experts (6 of layers 1 and 2 each) read (more bundles than
 * staging slots: the reads gathered so far are done when they run out), marked, then every down
 * part, marked: each part in the executor's view equals the bytes the RAM pool gives for it, and
 * nothing failed. Bad reads are refused and counted, and the next mark says so. */
/* Opens the model at path and a fetcher over it with a pool of two slots. */
static void open_fetcher(const char *path, struct common_gguf **g, struct common_model *m,
                         struct fetcher **f)
{
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(path, NULL, g, NULL), COMMON_OK);
    cr_assert_eq(common_model_init(m, *g, NULL), COMMON_OK);
    cr_assert_eq(fetcher_create(*g, m, &(struct fetcher_opts){.n_slots = 2}, f, &e), COMMON_OK,
                 "%s", e.text);
}

static void check_staged_reads(bool qsf)
{
    FIXTURE_OR_SKIP(src, qsf ? "moe-tiny/moe-tiny-f32.gguf" : "moe-tiny/moe-tiny-q4_0.gguf");
    char *path = src;
    if (qsf) { /* experts of few distinct values, so that LZ4 shrinks every bundle */
        path = malloc(strlen(g_dir) + 16);
        cr_assert_not_null(path);
        sprintf(path, "%s/coarse.gguf", g_dir);
        cr_assert_eq(fixture_write_coarse_experts(src, path), 0);
        free(src);
    }
    struct common_gguf  *g = NULL;
    struct common_model  m;
    struct fetcher      *f = NULL;
    struct common_errmsg e = {{0}};
    char                 qpath[700];
    if (qsf) { /* every bundle LZ4-compressed: decoded in its staging slot */
        struct common_qsf_stats              st;
        const struct common_qsf_convert_opts co = {.lz4 = COMMON_QSF_LZ4_ALWAYS};
        cr_assert_eq(common_gguf_open(path, NULL, &g, NULL), COMMON_OK);
        cr_assert_eq(common_model_init(&m, g, NULL), COMMON_OK);
        snprintf(qpath, sizeof(qpath), "%s/model.qsf", g_dir);
        cr_assert_eq(common_qsf_convert(g, &m, qpath, &co, &st, &e), COMMON_OK, "%s", e.text);
        cr_assert_eq(st.n_lz4, st.n_bundles);
        common_model_fini(&m);
        common_gguf_close(g);
    }
    open_fetcher(qsf ? qpath : path, &g, &m, &f);
    const struct fetcher_devpool_opts o = {.path = g_path,
                                           .budget = 32u << 20,
                                           .ram = fetcher_get_pool_base(f),
                                           .ram_bytes = fetcher_get_pool_bytes(f),
                                           .stage_from = f};
    struct fetcher_devpool           *d = NULL;
    cr_assert_eq(fetcher_devpool_start(&o, &d, &e), COMMON_OK, "%s", e.text);
    struct client c = {0};
    char          why[80] = "";
    enum { N_X = 12, L = 1 };
#define LX(i) (L + (i) / 6u), ((i) % 6u) /* bundle i's layer and expert */
    uint64_t size[N_X][COMMON_EXPERT_PART_COUNT], at[N_X][COMMON_EXPERT_PART_COUNT], total = 0;
    for (uint32_t x = 0; x < N_X; x++)
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            struct common_span s;
            cr_assert_eq(common_model_expert_span(&m, LX(x), (enum common_expert_part)p, &s),
                         COMMON_OK);
            size[x][p] = s.size;
            at[x][p] = total;
            total += s.size;
        }
    cr_assert_eq(open_pool(&c, total, why, sizeof(why)), PROTO_DEVPOOL_GRANTED, "%s", why);
    cr_assert(c.g.flags & PROTO_DEVPOOL_STAGES, "the pool does not say it stages");
    const uint64_t              gran = c.g.granularity;
    struct common_devmem_piece *pieces[256] = {NULL};
    const uint32_t              n_pieces = (uint32_t)(c.g.bytes / gran);
    cr_assert_leq(n_pieces, 256);
    for (uint32_t k = 0; k < n_pieces; k++)
        cr_assert_eq(get_piece(&c, k, &pieces[k]), PROTO_DEVPOOL_PIECE);
    cr_assert(wait_open(d, true));

    for (int phase = 0; phase < 2; phase++) { /* gate and up, then down */
        for (uint32_t x = 0; x < N_X; x++)
            for (uint32_t p = phase ? 2 : 0; p < (phase ? 3u : 2u); p++) {
                const struct proto_fetch_req r = {.op = PROTO_FETCH_DEV_READ,
                                                  .layer = L + x / 6u,
                                                  .expert = x % 6u,
                                                  .part = p,
                                                  .bytes = (uint32_t)size[x][p],
                                                  .dst = at[x][p]};
                cr_assert_eq(fetcher_devpool_record(d, &r), COMMON_OK, "expert %u part %u", x, p);
            }
        const struct proto_fetch_req mark = {
            .op = PROTO_FETCH_DEV_MARK, .tag = (uint32_t)phase, .loan = 1u + (uint32_t)phase};
        cr_assert_eq(fetcher_devpool_record(d, &mark), COMMON_OK);
    }
    cr_assert_eq(atomic_load(c.ctl), 2u, "the marks are published");
    cr_assert_eq(*(const uint32_t *)((const uint8_t *)c.ctl_page + 16), 0u, "a read failed");
    for (int k = 0; k < 2; k++)
        cr_assert_eq(common_devmem_event_sync(c.ev[k], &e), COMMON_OK, "%s", e.text);
    for (uint32_t x = 0; x < N_X; x++)
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            const void *ref = NULL;
            uint32_t    loan = 0;
            cr_assert_eq(fetcher_acquire(f, LX(x), (enum common_expert_part)p, &ref, &loan),
                         COMMON_OK);
            cr_expect_eq(memcmp(c.base + at[x][p], ref, size[x][p]), 0, "expert %u part %u", x, p);
            fetcher_release(f, loan);
        }
    /* Refused: the wrong size, a part that does not exist, a layer past the model, a
     * destination past the pool. */
    const struct proto_fetch_req bad[] = {
        {.op = PROTO_FETCH_DEV_READ, .layer = L, .part = 0, .bytes = 64, .dst = 0},
        {.op = PROTO_FETCH_DEV_READ, .layer = L, .part = 3, .bytes = (uint32_t)size[0][0]},
        {.op = PROTO_FETCH_DEV_READ, .layer = 99, .part = 0, .bytes = (uint32_t)size[0][0]},
        {.op = PROTO_FETCH_DEV_READ,
         .layer = L,
         .part = 0,
         .bytes = (uint32_t)size[0][0],
         .dst = c.g.bytes},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(fetcher_devpool_record(d, &bad[i]), COMMON_EINVAL, "record %zu", i);
    /* the next mark says its copies are not all there */
    const struct proto_fetch_req mark = {.op = PROTO_FETCH_DEV_MARK, .tag = 0, .loan = 3};
    cr_assert_eq(fetcher_devpool_record(d, &mark), COMMON_OK);
    cr_expect_eq(atomic_load(c.ctl), 3u);
    cr_expect_eq(*(const uint32_t *)((const uint8_t *)c.ctl_page + 16), 3u,
                 "the mark after refused reads does not say so");
    struct fetcher_devpool_counts k;
    fetcher_devpool_counts(d, &k);
    cr_expect_eq(k.staged, 3 * N_X);
    cr_expect_eq(k.copies, 0, "nothing came from the RAM pool");
    cr_expect_geq(k.stage_reads, N_X + 1, "more bundles than slots: some read twice");
    cr_expect_eq(k.stage_reads + k.stage_hits, 3 * N_X);
    cr_expect_gt(k.stage_bytes, 0);
    cr_expect_eq(k.stage_failed, 0);
    cr_expect_eq(k.bad, sizeof(bad) / sizeof(bad[0]));
#undef LX
    client_free(&c);
    for (uint32_t i = 0; i < n_pieces; i++)
        common_devmem_piece_destroy(pieces[i]);
    fetcher_devpool_stop(d);
    fetcher_destroy(f);
    common_model_fini(&m);
    common_gguf_close(g);
    free(path);
}

Test(fetcher_devpool, reads_from_storage_through_staging_match_the_ram_pool)
{
    check_staged_reads(false);
}

/* The same from a QSF file whose bundles are all LZ4 frames (f32 experts of few values): each
 * checked and decoded in staging. */
Test(fetcher_devpool, qsf_bundles_staged_are_checked_and_decoded)
{
    check_staged_reads(true);
}

/* A pool of one process (fetcher_devpool_local_*, sluice run --vram-fill storage): reads from
 * storage through staging and a copy of a loan from the RAM pool, queued from this thread, done
 * on the pool's own in order, marked and waited for: every part equal to the fetcher's own load
 * of it. A read the pool cannot do is told by the next ready; what it never can is refused. */
Test(fetcher_devpool, a_pool_of_one_process_reads_and_copies_on_its_own_thread)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    struct common_gguf  *g = NULL;
    struct common_model  m;
    struct fetcher      *f = NULL;
    struct common_errmsg e = {{0}};
    open_fetcher(path, &g, &m, &f);
    enum { N_X = 10, L = 2 }; /* more bundles than staging slots */
    uint64_t size[N_X + 1][COMMON_EXPERT_PART_COUNT], at[N_X + 1][COMMON_EXPERT_PART_COUNT];
    uint64_t total = 0;
    for (uint32_t x = 0; x <= N_X; x++) /* the last one copied from the RAM pool */
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            struct common_span s;
            cr_assert_eq(common_model_expert_span(&m, L, x % 8u, (enum common_expert_part)p, &s),
                         COMMON_OK);
            size[x][p] = s.size;
            at[x][p] = total;
            total += s.size;
        }
    struct fetcher_devpool      *d = NULL;
    struct fetcher_devpool_local l;
    cr_assert_eq(fetcher_devpool_local_open(f, true, 0, total, total - 1, 2, &l, &d, &e),
                 COMMON_ERANGE, "over its budget");
    cr_assert(strstr(e.text, "--vram-budget"), "%s", e.text);
    cr_assert_eq(fetcher_devpool_local_open(f, true, 0, total, 32u << 20, 2, &l, &d, &e), COMMON_OK,
                 "%s", e.text);
    cr_assert(l.stages && l.bytes >= total && l.gran && l.kev && !strcmp(l.backend, "HOST"));
    for (uint32_t k = 0; k < l.bytes / l.gran; k++)
        cr_assert_eq(fetcher_devpool_local_piece(d, k, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(fetcher_devpool_local_piece(d, (uint32_t)(l.bytes / l.gran), &e), COMMON_EINVAL);
    cr_assert_eq(fetcher_devpool_local_after(d), COMMON_OK);
    for (int phase = 0; phase < 2; phase++) { /* gate and up, then down */
        for (uint32_t x = 0; x < N_X; x++)
            for (uint32_t p = phase ? 2 : 0; p < (phase ? 3u : 2u); p++)
                cr_assert_eq(fetcher_devpool_local_read(d, L, x % 8u, (enum common_expert_part)p,
                                                        at[x][p], size[x][p]),
                             COMMON_OK);
        cr_assert_eq(fetcher_devpool_local_mark(d, (uint32_t)phase), COMMON_OK);
    }
    const void *loans[COMMON_EXPERT_PART_COUNT];
    uint32_t    ln[COMMON_EXPERT_PART_COUNT];
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        cr_assert_eq(fetcher_acquire(f, L, N_X % 8u, (enum common_expert_part)p, &loans[p], &ln[p]),
                     COMMON_OK);
        cr_assert_eq(fetcher_devpool_local_copy(d, at[N_X][p], loans[p], size[N_X][p]), COMMON_OK);
    }
    uint8_t outside[64];
    cr_assert_eq(fetcher_devpool_local_copy(d, 0, outside, sizeof(outside)), COMMON_EINVAL,
                 "a copy from outside the RAM pool");
    cr_assert_eq(fetcher_devpool_local_mark(d, 1), COMMON_OK);
    cr_assert_eq(fetcher_devpool_local_mark(d, 2), COMMON_EINVAL, "no event 2");
    for (uint32_t k = 0; k < 2; k++) {
        struct common_devmem_event *ev = NULL;
        cr_assert_eq(fetcher_devpool_local_ready(d, k, &ev), COMMON_OK, "event %u", k);
        cr_assert_not_null(ev);
        cr_assert_eq(common_devmem_event_sync(ev, &e), COMMON_OK, "%s", e.text);
        cr_assert_eq(fetcher_devpool_local_ready(d, k, &ev), COMMON_OK);
        cr_assert_null(ev, "no mark since: nothing to wait for");
    }
    for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++)
        fetcher_release(f, ln[p]);
    for (uint32_t x = 0; x <= N_X; x++)
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            const void *ref = NULL;
            uint32_t    loan = 0;
            cr_assert_eq(fetcher_acquire(f, L, x % 8u, (enum common_expert_part)p, &ref, &loan),
                         COMMON_OK);
            cr_expect_eq(memcmp(l.base + at[x][p], ref, size[x][p]), 0, "expert %u part %u", x, p);
            fetcher_release(f, loan);
        }
    /* A read of the wrong size is queued but fails: the next ready says so, once. */
    struct common_devmem_event *ev = NULL;
    cr_assert_eq(fetcher_devpool_local_read(d, L, 0, COMMON_EXPERT_GATE, 0, 64), COMMON_OK);
    cr_assert_eq(fetcher_devpool_local_mark(d, 0), COMMON_OK);
    cr_assert_eq(fetcher_devpool_local_ready(d, 0, &ev), COMMON_EIO);
    cr_assert_eq(fetcher_devpool_local_read(d, L, 0, COMMON_EXPERT_GATE, 0, size[0][0]), COMMON_OK);
    cr_assert_eq(fetcher_devpool_local_mark(d, 0), COMMON_OK);
    cr_assert_eq(fetcher_devpool_local_ready(d, 0, &ev), COMMON_OK);
    struct fetcher_devpool_counts k;
    fetcher_devpool_counts(d, &k);
    cr_expect_eq(k.staged, 3 * N_X + 1);
    cr_expect_eq(k.copies, COMMON_EXPERT_PART_COUNT);
    cr_expect_geq(k.stage_reads, FETCHER_DEVPOOL_STAGE_SLOTS, "every slot used");
    cr_expect_eq(k.stage_failed, 0);
    cr_expect_eq(k.bad, 1, "the read of the wrong size");
    fetcher_devpool_stop(d);
    /* A pool that does not stage refuses reads. */
    cr_assert_eq(fetcher_devpool_local_open(f, false, 0, total, 32u << 20, 2, &l, &d, &e),
                 COMMON_OK, "%s", e.text);
    cr_assert(!l.stages);
    cr_assert_eq(fetcher_devpool_local_read(d, L, 0, COMMON_EXPERT_GATE, 0, size[0][0]),
                 COMMON_EINVAL);
    fetcher_devpool_stop(d);
    fetcher_destroy(f);
    common_model_fini(&m);
    common_gguf_close(g);
    free(path);
}
