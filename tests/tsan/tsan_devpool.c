/* tests/tsan/tsan_devpool.c - the fetcher's device pool (fetcher/devpool.c) driven from several
 * threads at once, as a plain program for ThreadSanitizer: an executor thread opens pools, asks
 * for pieces and closes them, round after round, while a link-reader thread fires copy, mark,
 * wait and (a pool that stages, over moe-tiny's fetcher) read records at it and a third reads its
 * counters. Then two pools of one fetcher (--device-pools) served at once. Then a pool of one
 * process (fetcher_devpool_local_*) over the same fetcher: a thread queues copies, reads and marks
 * and waits for them, round after round, while the pool's worker does them and another thread maps
 * pieces and reads its copy time and counters. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "devpool.h"
#include "fetcher.h"
#include "fixture.h"
#include "proto.h"

#define ROUNDS    20
#define RAM_BYTES (256u << 10)

static char         g_path[256];
static _Atomic bool g_done;
static uint32_t     g_part_bytes[8]; /* gate of layer 1, expert x (0: no fixture, no reads) */
static struct fetcher_devpool *g_dev;
static struct fetcher         *g_f; /* moe-tiny's, NULL without the fixture */

/* Reads are served only while a pool is open: the last round keeps its pool open until one has
 * been (on a busy machine the reader may otherwise never meet an open pool). The deadline only
 * keeps a broken pool from hanging the test. */
static void wait_for_a_read(void)
{
    for (int i = 0; i < 600000 && g_part_bytes[0]; i++) {
        struct fetcher_devpool_counts c;
        fetcher_devpool_counts(g_dev, &c);
        if (c.stage_reads > 0)
            return;
        usleep(100);
    }
}

/* One executor's pool: OPEN, the handles taken and dropped, PIECEs 0..3, then close (the last
 * one after a read from storage). */
static int executor_round_at(const char *sock_path, bool last)
{
    int sock = -1, bad = 0;
    if (common_unix_connect(sock_path, &sock) != COMMON_OK)
        return 1;
    const struct proto_devpool_open o = {
        .magic = PROTO_DEVPOOL_MAGIC, .device = 0, .bytes = 4u << 16, .n_events = 2};
    struct common_devmem_handle h = {.fd = -1, .len = sizeof(o)};
    memcpy(h.blob, &o, sizeof(o));
    uint64_t                    tag = 0;
    struct common_devmem_event *ev = NULL;
    bad += common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_OPEN) != COMMON_OK;
    for (int m = 0; m < 4 && !bad; m++) { /* GRANTED, CTL, 2 EVENTs */
        bad += common_devmem_handle_recv(sock, &h, &tag, 10000) != COMMON_OK;
        if (h.fd >= 0)
            close(h.fd);
    }
    if (!bad && common_devmem_event_create(&ev, NULL) == COMMON_OK &&
        common_devmem_event_export(ev, &h, NULL) == COMMON_OK) {
        bad += common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_KEVENT) != COMMON_OK;
        close(h.fd);
    }
    for (uint32_t k = 0; k < 4 && !bad; k++) {
        h = (struct common_devmem_handle){.fd = -1, .len = sizeof(k)};
        memcpy(h.blob, &k, sizeof(k));
        bad += common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_PIECE) != COMMON_OK ||
               common_devmem_handle_recv(sock, &h, &tag, 10000) != COMMON_OK ||
               tag != PROTO_DEVPOOL_PIECE;
        if (h.fd >= 0)
            close(h.fd);
    }
    if (last && !bad)
        wait_for_a_read();
    close(sock);
    common_devmem_event_destroy(ev);
    return bad;
}

static void *executor_run(void *arg)
{
    int *bad = arg;
    for (int r = 0; r < ROUNDS; r++)
        *bad += executor_round_at(g_path, r == ROUNDS - 1);
    atomic_store(&g_done, true);
    return NULL;
}

/* One batch of the link's records for pool d: a wait, a copy, a mark, 8 reads, a mark. */
static void reader_batch(struct fetcher_devpool *d, uint32_t *seq)
{
    const struct proto_fetch_req recs[] = {
        {.op = PROTO_FETCH_DEV_WAIT},
        {.op = PROTO_FETCH_DEV_COPY, .bytes = 1000, .src = 64, .dst = 500},
        {.op = PROTO_FETCH_DEV_MARK, .tag = 1, .loan = ++*seq},
    };
    for (size_t i = 0; i < 3; i++)
        (void)fetcher_devpool_record(d, &recs[i]);
    for (uint32_t x = 0; x < 8 && g_part_bytes[0]; x++) { /* 8 reads, gathered, then a mark */
        const struct proto_fetch_req rd = {.op = PROTO_FETCH_DEV_READ,
                                           .layer = 1,
                                           .expert = (x + *seq) % 8,
                                           .part = 0,
                                           .bytes = g_part_bytes[(x + *seq) % 8],
                                           .dst = 0};
        (void)fetcher_devpool_record(d, &rd);
    }
    const struct proto_fetch_req mark = {.op = PROTO_FETCH_DEV_MARK, .tag = 0, .loan = ++*seq};
    (void)fetcher_devpool_record(d, &mark);
}

/* The link's reader: records as an executor's ring brings them, open pool or not. */
static void *reader_run(void *arg)
{
    uint32_t seq = 0;
    while (!atomic_load(&g_done))
        reader_batch(arg, &seq);
    return NULL;
}

/* Two pools of one fetcher (--device-pools 2, their RAM registration shared, each record
 * selecting its pool's device): an executor thread per pool opens and closes it round after
 * round while the link's reader alternates batches between them. */
static struct fetcher_devpool *g_two[2];
static char                    g_two_path[2][256];

static void *two_exec(void *arg)
{
    const int k = (int)(intptr_t)arg;
    int       bad = 0;
    for (int r = 0; r < ROUNDS / 2; r++)
        bad += executor_round_at(g_two_path[k], false);
    return (void *)(intptr_t)bad;
}

static void *two_reader(void *arg)
{
    (void)arg;
    uint32_t seq = 0;
    for (unsigned i = 0; !atomic_load(&g_done); i++)
        reader_batch(g_two[i % 2], &seq);
    return NULL;
}

static void two_pools(const char *dir, uint8_t *ram, struct fetcher *f)
{
    struct fetcher_devpool_pin pin = {.pinned = false};
    struct common_errmsg       e = {{0}};
    CHECK(pthread_mutex_init(&pin.mu, NULL) == 0, "mutex");
    for (int k = 0; k < 2; k++) {
        CHECK(proto_devpool_path(g_two_path[k], sizeof(g_two_path[k]), dir, 3, (uint32_t)k) ==
                  COMMON_OK,
              "path");
        const struct fetcher_devpool_opts o = {.path = g_two_path[k],
                                               .budget = 1u << 20,
                                               .ram = ram,
                                               .ram_bytes = RAM_BYTES,
                                               .stage_from = f,
                                               .pin = &pin,
                                               .select = true};
        CHECK(fetcher_devpool_start(&o, &g_two[k], &e) == COMMON_OK, "start %d: %s", k, e.text);
    }
    atomic_store(&g_done, false);
    pthread_t tx[2], tr;
    void     *bad[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        CHECK(pthread_create(&tx[k], NULL, two_exec, (void *)(intptr_t)k) == 0, "thread");
    CHECK(pthread_create(&tr, NULL, two_reader, NULL) == 0, "reader thread");
    for (int k = 0; k < 2; k++)
        pthread_join(tx[k], &bad[k]);
    atomic_store(&g_done, true);
    pthread_join(tr, NULL);
    unsigned long long opens = 0;
    for (int k = 0; k < 2; k++) {
        struct fetcher_devpool_counts c;
        fetcher_devpool_counts(g_two[k], &c);
        opens += c.opens;
        CHECK(bad[k] == NULL, "pool %d: %d rounds failed", k, (int)(intptr_t)bad[k]);
        fetcher_devpool_stop(g_two[k]);
    }
    CHECK(opens == 2 * (ROUNDS / 2), "%llu pools opened", opens);
    fetcher_devpool_unpin(&pin, ram);
    pthread_mutex_destroy(&pin.mu);
}

static void *counter_run(void *arg)
{
    struct fetcher_devpool *d = arg;
    while (!atomic_load(&g_done)) {
        struct fetcher_devpool_counts c;
        fetcher_devpool_counts(d, &c);
        usleep(100);
    }
    return NULL;
}

#define LOCAL_ROUNDS 40

static _Atomic bool g_local_done;

static void *local_exec(void *arg)
{
    struct fetcher_devpool *d = arg;
    const uint8_t          *pool = fetcher_get_pool_base(g_f);
    int                     bad = 0;
    for (int r = 0; r < LOCAL_ROUNDS; r++) {
        bad += fetcher_devpool_local_after(d) != COMMON_OK;
        bad += fetcher_devpool_local_copy(d, 500, pool + 64, 1000) != COMMON_OK;
        for (uint32_t x = 0; x < 8; x++)
            bad += fetcher_devpool_local_read(d, 1, (x + (uint32_t)r) % 8, COMMON_EXPERT_GATE,
                                              (uint64_t)x << 16 >> 2,
                                              g_part_bytes[(x + (uint32_t)r) % 8]) != COMMON_OK;
        bad += fetcher_devpool_local_mark(d, (uint32_t)r % 2) != COMMON_OK;
        struct common_devmem_event *ev = NULL;
        bad += fetcher_devpool_local_ready(d, (uint32_t)r % 2, &ev) != COMMON_OK || !ev;
        bad += ev && common_devmem_event_sync(ev, NULL) != COMMON_OK;
    }
    atomic_store(&g_local_done, true);
    return (void *)(intptr_t)bad;
}

static void *local_side(void *arg)
{
    struct fetcher_devpool *d = arg;
    uint64_t                ns = 0;
    for (uint32_t k = 0; !atomic_load(&g_local_done); k++) {
        (void)fetcher_devpool_local_piece(d, k % 4, NULL);
        ns += fetcher_devpool_local_copy_ns(d);
        struct fetcher_devpool_counts c;
        fetcher_devpool_counts(d, &c);
        usleep(100);
    }
    return (void *)(uintptr_t)(ns & 1);
}

/* The local pool's part: every round's reads and copies done and marked, no failure. */
static void local_pool(void)
{
    struct fetcher_devpool      *d = NULL;
    struct fetcher_devpool_local l;
    struct common_errmsg         e = {{0}};
    CHECK(fetcher_devpool_local_open(g_f, true, 0, 4u << 16, 1u << 20, 2, &l, &d, &e) == COMMON_OK,
          "local open: %s", e.text);
    if (!d)
        return;
    CHECK(l.stages && l.bytes >= 4u << 16 && l.kev, "what the local pool made");
    for (uint32_t k = 0; k < 4; k++) /* (the side thread asks for them again: no-ops) */
        CHECK(fetcher_devpool_local_piece(d, k, &e) == COMMON_OK, "piece %u: %s", k, e.text);
    pthread_t tx, ts;
    void     *bad = NULL;
    CHECK(pthread_create(&tx, NULL, local_exec, d) == 0, "local executor thread");
    CHECK(pthread_create(&ts, NULL, local_side, d) == 0, "local side thread");
    pthread_join(tx, &bad);
    pthread_join(ts, NULL);
    struct fetcher_devpool_counts c;
    fetcher_devpool_counts(d, &c);
    CHECK(bad == NULL, "%d local calls failed", (int)(intptr_t)bad);
    CHECK(c.staged == 8 * LOCAL_ROUNDS && c.copies == LOCAL_ROUNDS && c.stage_reads > 0 &&
              c.stage_failed == 0 && c.bad == 0,
          "local pool: %llu staged, %llu copies, %llu reads, %llu bad",
          (unsigned long long)c.staged, (unsigned long long)c.copies,
          (unsigned long long)c.stage_reads, (unsigned long long)c.bad);
    fetcher_devpool_stop(d);
}

int main(void)
{
    setenv("SLUICE_GPU_BACKEND", "host", 1);
    common_log_set_level(COMMON_LOG_LEVEL_WARN); /* not a line per pool */
    char dir[] = "/tmp/sluice-tsan-devpool-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(g_path, sizeof(g_path), "%s/fetcher-0.dev", dir);
    uint8_t *ram = malloc(RAM_BYTES);
    CHECK(ram != NULL, "malloc");
    memset(ram, 7, RAM_BYTES);
    struct fetcher_devpool *d = NULL;
    struct common_errmsg    e = {{0}};
    /* moe-tiny's fetcher, for the reads from storage (skipped without the fixture) */
    struct common_gguf *g = NULL;
    struct common_model m;
    struct fetcher     *f = NULL;
    char               *path = fixture_path("moe-tiny/moe-tiny-q4_0.gguf");
    if (path) {
        CHECK(common_gguf_open(path, NULL, &g, NULL) == COMMON_OK, "open");
        CHECK(common_model_init(&m, g, NULL) == COMMON_OK, "model");
        CHECK(fetcher_create(g, &m, &(struct fetcher_opts){.n_slots = 2}, &f, &e) == COMMON_OK,
              "fetcher: %s", e.text);
        for (uint32_t x = 0; x < 8; x++) {
            struct common_span sp;
            CHECK(common_model_expert_span(&m, 1, x, COMMON_EXPERT_GATE, &sp) == COMMON_OK, "span");
            g_part_bytes[x] = (uint32_t)sp.size;
        }
    } else {
        printf("skip reads: fixture moe-tiny/moe-tiny-q4_0.gguf not found\n");
    }
    const struct fetcher_devpool_opts o = {
        .path = g_path, .budget = 1u << 20, .ram = ram, .ram_bytes = RAM_BYTES, .stage_from = f};
    CHECK(fetcher_devpool_start(&o, &d, &e) == COMMON_OK, "start: %s", e.text);
    g_dev = d;
    int       bad = 0;
    pthread_t te, tr, tc;
    CHECK(pthread_create(&te, NULL, executor_run, &bad) == 0, "executor thread");
    CHECK(pthread_create(&tr, NULL, reader_run, d) == 0, "reader thread");
    CHECK(pthread_create(&tc, NULL, counter_run, d) == 0, "counter thread");
    pthread_join(te, NULL);
    pthread_join(tr, NULL);
    pthread_join(tc, NULL);
    struct fetcher_devpool_counts c;
    fetcher_devpool_counts(d, &c);
    CHECK(bad == 0, "%d executor rounds failed", bad);
    CHECK(c.opens == ROUNDS, "%llu pools opened of %d", (unsigned long long)c.opens, ROUNDS);
    CHECK(c.pieces == 4 * ROUNDS, "%llu pieces", (unsigned long long)c.pieces);
    CHECK(!f || c.stage_reads > 0, "no bundle read from storage");
    fetcher_devpool_stop(d);
    two_pools(dir, ram, f);
    g_f = f;
    if (f)
        local_pool();
    if (f) {
        fetcher_destroy(f);
        common_model_fini(&m);
        common_gguf_close(g);
        free(path);
    }
    free(ram);
    rmdir(dir);
    return check_report();
}
