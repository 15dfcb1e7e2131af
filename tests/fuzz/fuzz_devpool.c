/* tests/fuzz/fuzz_devpool.c - libFuzzer target: the records an executor's ring brings to a
 * fetcher's device pool (fetcher/devpool.c: DEV_COPY, DEV_MARK, DEV_WAIT and DEV_READ), any
 * fields, on the host's emulation of device memory. One pool is opened once, as an executor
 * does (its pieces all mapped), over moe-tiny's fetcher so that reads from storage go through
 * the staging (a RAM buffer and no staging where the fixture is absent). Each input is a run of
 * 48-byte records, then a mark: nothing may read or write outside the pool, the RAM pool or the
 * staging (ASan), and a refused record must make the next mark say so. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "devpool.h"
#include "fetcher.h"
#include "proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define POOL_BYTES (1u << 20)
#define RAM_BYTES  (256u << 10)

static struct fetcher_devpool     *g_d;
static _Atomic uint32_t           *g_ctl;    /* the control page: the last mark */
static const _Atomic uint32_t     *g_failed; /* its failure word */
static uint32_t                    g_seq;
static struct common_devmem_event *g_kev; /* the "executor's" kernels event, kept */
static uint8_t                    *g_ram; /* the RAM pool without the fixture */

/* The executor's side of OPEN; false when the pool could not be opened. */
static bool open_pool(const char *path)
{
    int sock = -1;
    if (common_unix_connect(path, &sock) != COMMON_OK)
        return false;
    const struct proto_devpool_open o = {
        .magic = PROTO_DEVPOOL_MAGIC, .device = 0, .bytes = POOL_BYTES, .n_events = 2};
    struct common_devmem_handle h = {.fd = -1, .len = sizeof(o)};
    uint64_t                    tag = 0;
    memcpy(h.blob, &o, sizeof(o));
    if (common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_OPEN) != COMMON_OK)
        return false;
    struct proto_devpool_granted g = {0};
    for (int m = 0; m < 4; m++) { /* GRANTED, CTL, two EVENTs */
        if (common_devmem_handle_recv(sock, &h, &tag, 10000) != COMMON_OK)
            return false;
        if (m == 0 && (tag != PROTO_DEVPOOL_GRANTED || h.len != sizeof(g)))
            return false;
        if (m == 0)
            memcpy(&g, h.blob, sizeof(g));
        if (m == 1 && h.fd >= 0) {
            void *p = mmap(NULL, PROTO_DEVPOOL_CTL_BYTES, PROT_READ, MAP_SHARED, h.fd, 0);
            if (p == MAP_FAILED)
                return false;
            g_ctl = p;
            g_failed = (const _Atomic uint32_t *)((const uint8_t *)p + 16);
        }
        if (h.fd >= 0)
            close(h.fd);
    }
    if (!g_ctl || common_devmem_event_create(&g_kev, NULL) != COMMON_OK ||
        common_devmem_event_export(g_kev, &h, NULL) != COMMON_OK ||
        common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_KEVENT) != COMMON_OK)
        return false;
    close(h.fd);
    for (uint32_t k = 0; g.granularity && k < g.bytes / g.granularity; k++) { /* every piece */
        h = (struct common_devmem_handle){.fd = -1, .len = sizeof(k)};
        memcpy(h.blob, &k, sizeof(k));
        if (common_devmem_handle_send(sock, &h, PROTO_DEVPOOL_PIECE) != COMMON_OK ||
            common_devmem_handle_recv(sock, &h, &tag, 10000) != COMMON_OK ||
            tag != PROTO_DEVPOOL_PIECE)
            return false;
        close(h.fd);
    }
    /* The socket stays open for the process's life: the pool lives while it does. */
    return true;
}

static void setup(void)
{
    setenv("SLUICE_GPU_BACKEND", "host", 1);
    common_log_set_level(COMMON_LOG_LEVEL_ERR); /* refused records are the point */
    static char dir[] = "/tmp/sluice-fuzz-devpool-XXXXXX";
    static char path[128];
    if (!mkdtemp(dir))
        abort();
    snprintf(path, sizeof(path), "%s/fetcher-0.dev", dir);
    static struct common_gguf  *g;
    static struct common_model  m;
    static struct fetcher      *f;
    struct fetcher_devpool_opts o = {.path = path, .budget = POOL_BYTES};
    char                        model[1024];
    snprintf(model, sizeof(model), "%s/moe-tiny/moe-tiny-q4_0.gguf", SLUICE_FIXTURES_DIR);
    if (access(model, R_OK) == 0 && common_gguf_open(model, NULL, &g, NULL) == COMMON_OK &&
        common_model_init(&m, g, NULL) == COMMON_OK &&
        fetcher_create(g, &m, &(struct fetcher_opts){.n_slots = 2}, &f, NULL) == COMMON_OK) {
        o.ram = fetcher_get_pool_base(f);
        o.ram_bytes = fetcher_get_pool_bytes(f);
        o.stage_from = f;
    } else {
        fprintf(stderr, "fuzz_devpool: %s absent: no staging\n", model);
        if (!(g_ram = calloc(1, RAM_BYTES)))
            abort();
        o.ram = g_ram;
        o.ram_bytes = RAM_BYTES;
    }
    if (fetcher_devpool_start(&o, &g_d, NULL) != COMMON_OK || !open_pool(path))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_d)
        setup();
    bool refused = false;
    for (size_t at = 0; at + sizeof(struct proto_fetch_req) <= size && at < 64 * 48; at += 48) {
        struct proto_fetch_req r;
        memcpy(&r, data + at, sizeof(r));
        r.op = PROTO_FETCH_DEV_COPY + r.op % 4; /* COPY, MARK, WAIT, READ */
        if (r.op == PROTO_FETCH_DEV_MARK) {
            r.tag %= 3; /* 2 is no event: refused */
            r.loan = ++g_seq ? g_seq : ++g_seq;
        }
        /* small values often, so that some records are valid */
        if (r.layer & 0x80000000u)
            r.layer %= 5;
        if (r.expert & 0x80000000u)
            r.expert %= 9;
        if (r.part & 0x80000000u)
            r.part %= 4;
        if (r.dst & (1ull << 63))
            r.dst %= POOL_BYTES;
        if (r.src & (1ull << 63))
            r.src %= RAM_BYTES;
        const int rc = fetcher_devpool_record(g_d, &r);
        if (r.op == PROTO_FETCH_DEV_MARK) {
            if (atomic_load(g_ctl) != r.loan)
                abort(); /* a mark is published, recorded or not */
            if ((rc != 0 || refused) && atomic_load(g_failed) != r.loan)
                abort(); /* as failed when it, or a record before it, was refused */
            refused = false;
        } else {
            refused = refused || rc != 0;
        }
    }
    const struct proto_fetch_req mark = {
        .op = PROTO_FETCH_DEV_MARK, .tag = 0, .loan = ++g_seq ? g_seq : ++g_seq};
    if (fetcher_devpool_record(g_d, &mark) != 0 || atomic_load(g_ctl) != mark.loan ||
        (refused && atomic_load(g_failed) != mark.loan))
        abort();
    return 0;
}
