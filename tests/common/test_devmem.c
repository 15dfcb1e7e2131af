/* tests/common/test_devmem.c - device memory two processes share: a piece one process fills and
 * another reads, events ordering copies across processes, a maker that dies, bad handles. Runs on
 * the host's emulation (SLUICE_GPU_BACKEND=host, set here unless the environment names another
 * backend: SLUICE_GPU_BACKEND=cuda runs it on a device). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "fixture.h"

static void devmem_env(void)
{
    setenv("SLUICE_GPU_BACKEND", "host", 0);
}

TestSuite(common_devmem, .init = devmem_env, .timeout = 60);

/* Opens the backend in this process; skips the test where there is none. */
static void t_open(void)
{
    struct common_errmsg e = {{0}};
    int                  rc = common_devmem_open(0, &e);
    if (rc == COMMON_ENOTSUP)
        cr_skip_test("no device backend: %s", e.text);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
}

/* The byte at offset i of pattern `seed`. */
static uint8_t t_byte(uint32_t seed, size_t i)
{
    uint32_t x = (uint32_t)i * 2654435761u + seed * 40503u;
    return (uint8_t)(x >> 13);
}

static uint8_t *t_pattern(uint32_t seed, size_t bytes)
{
    uint8_t *p = malloc(bytes);
    cr_assert_not_null(p);
    for (size_t i = 0; i < bytes; i++)
        p[i] = t_byte(seed, i);
    return p;
}

/* At least `want` bytes, a multiple of the granularity. */
static size_t t_size(size_t want)
{
    size_t g = common_devmem_granularity();
    return (want + g - 1) / g * g;
}

/* Sends a handle and closes its descriptor here. */
static int t_send(int sock, struct common_devmem_handle *h)
{
    int rc = common_devmem_handle_send(sock, h, 7);
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    return rc;
}

static int t_recv(int sock, struct common_devmem_handle *h)
{
    uint64_t tag = 0;
    int      rc = common_devmem_handle_recv(sock, h, &tag, 20000);
    return rc == COMMON_OK && tag == 7 ? 0 : -1;
}

static void t_ack(int sock)
{
    char c = 'k';
    cr_assert_eq(write(sock, &c, 1), 1);
}

static int t_wait_ack(int sock)
{
    char c;
    return read(sock, &c, 1) == 1 && c == 'k' ? 0 : -1;
}

/* Forks the peer that runs fn (fixture_fork_peer). */
static pid_t t_fork(int (*fn)(int), int *sock)
{
    int pid = fixture_fork_peer(fn, sock);
    cr_assert_geq(pid, 0, "socketpair or fork failed");
    return (pid_t)pid;
}

static int t_child_status(pid_t pid)
{
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A piece of `bytes` mapped in a fresh reservation of the same size. */
static struct common_devmem_piece *t_mapped(size_t bytes, struct common_devmem_piece *p,
                                            uint8_t **at)
{
    struct common_errmsg e = {{0}};
    *at = common_devmem_reserve(bytes, &e);
    cr_assert_not_null(*at, "%s", e.text);
    if (!p)
        cr_assert_eq(common_devmem_piece_create(bytes, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(p, *at, &e), COMMON_OK, "%s", e.text);
    return p;
}

#define T_BYTES ((size_t)32 << 20)

/* The importer: maps the piece it is sent, waits for the event, checks every byte. */
static int importer_checks(int sock)
{
    if (common_devmem_open(0, NULL) != COMMON_OK)
        return 10;
    size_t                      bytes = t_size(T_BYTES);
    struct common_devmem_handle hp, he;
    if (t_recv(sock, &hp) != 0 || t_recv(sock, &he) != 0)
        return 11;
    struct common_devmem_piece *p = NULL;
    struct common_devmem_event *ev = NULL;
    if (common_devmem_piece_import(&hp, bytes, &p, NULL) != COMMON_OK ||
        common_devmem_event_import(&he, &ev, NULL) != COMMON_OK)
        return 12;
    uint8_t *at = common_devmem_reserve(bytes, NULL);
    if (!at || common_devmem_piece_map(p, at, NULL) != COMMON_OK)
        return 13;
    if (common_devmem_event_sync(ev, NULL) != COMMON_OK || !common_devmem_event_is_done(ev))
        return 14;
    if (strcmp(common_devmem_backend(), "HOST") == 0) {
        for (size_t i = 0; i < bytes; i++)
            if (at[i] != t_byte(3, i))
                return 15;
    }
    common_devmem_event_destroy(ev);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(at, bytes);
    return 0;
}

Test(common_devmem, piece_filled_by_one_process_is_read_by_another)
{
    int   sock;
    pid_t pid = t_fork(importer_checks, &sock);
    t_open();
    struct common_errmsg        e = {{0}};
    size_t                      bytes = t_size(T_BYTES);
    uint8_t                    *at;
    struct common_devmem_piece *p = t_mapped(bytes, NULL, &at);
    cr_assert_eq(common_devmem_piece_bytes(p), bytes);
    uint8_t                    *src = t_pattern(3, bytes);
    struct common_devmem_event *ev;
    cr_assert_eq(common_devmem_event_create(&ev, &e), COMMON_OK, "%s", e.text);
    cr_assert(common_devmem_event_is_done(ev), "an event never recorded is done");
    /* Queued, recorded and sent before the copy has run: the importer's sync waits for it. */
    cr_assert_eq(common_devmem_copy_async(at, src, bytes, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_record(ev, &e), COMMON_OK, "%s", e.text);
    struct common_devmem_handle hp, he;
    cr_assert_eq(common_devmem_piece_export(p, &hp, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_export(ev, &he, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(t_send(sock, &hp), 0);
    cr_assert_eq(t_send(sock, &he), 0);
    cr_assert_eq(t_child_status(pid), 0, "the importer's check");
    cr_assert_eq(common_devmem_event_sync(ev, &e), COMMON_OK, "%s", e.text);
    uint64_t busy = 0;
    cr_assert(common_devmem_copy_time(&busy));
    cr_expect_gt(busy, 0, "the copy stream's time copying counts the copy");
    common_devmem_event_destroy(ev);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(at, bytes);
    free(src);
    close(sock);
}

/* B: its copy stream waits for A's event, then writes a marker over the end of A's piece, whose
 * last bytes A's big copy writes last: without the wait the marker would be overwritten. */
static int waiter_writes_after(int sock)
{
    if (common_devmem_open(0, NULL) != COMMON_OK)
        return 10;
    size_t                      bytes = t_size(T_BYTES);
    struct common_devmem_handle hp, he;
    struct common_devmem_piece *p = NULL;
    struct common_devmem_event *ea = NULL, *eb = NULL;
    if (t_recv(sock, &hp) != 0 || t_recv(sock, &he) != 0 ||
        common_devmem_piece_import(&hp, bytes, &p, NULL) != COMMON_OK ||
        common_devmem_event_import(&he, &ea, NULL) != COMMON_OK ||
        common_devmem_event_create(&eb, NULL) != COMMON_OK)
        return 11;
    uint8_t *at = common_devmem_reserve(bytes, NULL);
    if (!at || common_devmem_piece_map(p, at, NULL) != COMMON_OK)
        return 12;
    static const uint8_t marker[64] = {0xa5, 0x5a, 0xa5, 0x5a};
    if (common_devmem_event_wait(ea, NULL) != COMMON_OK ||
        common_devmem_copy_async(at + bytes - sizeof(marker), marker, sizeof(marker), NULL) !=
            COMMON_OK ||
        common_devmem_event_record(eb, NULL) != COMMON_OK)
        return 13;
    struct common_devmem_handle hb;
    if (common_devmem_event_export(eb, &hb, NULL) != COMMON_OK || t_send(sock, &hb) != 0)
        return 14;
    if (t_wait_ack(sock) != 0) /* A has checked */
        return 15;
    common_devmem_event_destroy(ea);
    common_devmem_event_destroy(eb);
    common_devmem_piece_destroy(p);
    return 0;
}

Test(common_devmem, copies_wait_for_the_other_processs_event)
{
    int   sock;
    pid_t pid = t_fork(waiter_writes_after, &sock);
    t_open();
    if (strcmp(common_devmem_backend(), "HOST") != 0)
        cr_skip_test("reads device memory from the host: the host backend only");
    struct common_errmsg        e = {{0}};
    size_t                      bytes = t_size(T_BYTES);
    uint8_t                    *at;
    struct common_devmem_piece *p = t_mapped(bytes, NULL, &at);
    uint8_t                    *src = t_pattern(9, bytes);
    struct common_devmem_event *ea, *eb;
    cr_assert_eq(common_devmem_event_create(&ea, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_copy_async(at, src, bytes, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_record(ea, &e), COMMON_OK, "%s", e.text);
    struct common_devmem_handle hp, he, hb;
    cr_assert_eq(common_devmem_piece_export(p, &hp, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_export(ea, &he, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(t_send(sock, &hp), 0);
    cr_assert_eq(t_send(sock, &he), 0);
    cr_assert_eq(t_recv(sock, &hb), 0);
    cr_assert_eq(common_devmem_event_import(&hb, &eb, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_sync(eb, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(at[bytes - 64], 0xa5, "B's marker, written after A's copy");
    cr_assert_eq(at[bytes - 63], 0x5a);
    cr_assert_eq(memcmp(at, src, bytes - 64), 0, "A's bytes before it");
    t_ack(sock);
    cr_assert_eq(t_child_status(pid), 0, "the waiter");
    common_devmem_event_destroy(ea);
    common_devmem_event_destroy(eb);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(at, bytes);
    free(src);
    close(sock);
}

/* The maker: fills a piece, sends it and its event, and dies without freeing anything. */
static int maker_dies(int sock)
{
    if (common_devmem_open(0, NULL) != COMMON_OK)
        return 10;
    size_t                      bytes = t_size(T_BYTES);
    struct common_devmem_piece *p = NULL;
    struct common_devmem_event *ev = NULL;
    uint8_t                    *at = common_devmem_reserve(bytes, NULL);
    uint8_t                    *src = malloc(bytes);
    if (!at || !src || common_devmem_piece_create(bytes, &p, NULL) != COMMON_OK ||
        common_devmem_piece_map(p, at, NULL) != COMMON_OK ||
        common_devmem_event_create(&ev, NULL) != COMMON_OK)
        return 11;
    for (size_t i = 0; i < bytes; i++)
        src[i] = t_byte(5, i);
    struct common_devmem_handle hp, he;
    if (common_devmem_copy_async(at, src, bytes, NULL) != COMMON_OK ||
        common_devmem_event_record(ev, NULL) != COMMON_OK ||
        common_devmem_piece_export(p, &hp, NULL) != COMMON_OK ||
        common_devmem_event_export(ev, &he, NULL) != COMMON_OK || t_send(sock, &hp) != 0 ||
        t_send(sock, &he) != 0)
        return 12;
    /* Dies at once, most likely with its copy still running: a record never done. */
    raise(SIGKILL);
    return 13;
}

Test(common_devmem, a_dead_maker_leaves_the_importers_memory)
{
    int   sock;
    pid_t pid = t_fork(maker_dies, &sock);
    t_open();
    struct common_errmsg        e = {{0}};
    size_t                      bytes = t_size(T_BYTES);
    struct common_devmem_handle hp, he;
    cr_assert_eq(t_recv(sock, &hp), 0);
    cr_assert_eq(t_recv(sock, &he), 0);
    struct common_devmem_piece *p;
    struct common_devmem_event *ev;
    cr_assert_eq(common_devmem_piece_import(&hp, bytes, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_import(&he, &ev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(t_child_status(pid), 128 + SIGKILL);
    uint8_t *at;
    t_mapped(bytes, p, &at);
    /* Its record is done (the copy finished before the kill) or never will be: the sync says
     * which, and does not hang. */
    int rc = common_devmem_event_sync(ev, &e);
    cr_assert(rc == COMMON_OK || rc == COMMON_ECLOSED, "sync: %d %s", rc, e.text);
    cr_assert(common_devmem_event_is_done(ev));
    cr_log_info("the dead maker's record: %s", rc == COMMON_OK ? "done" : "never done");
    if (rc == COMMON_ECLOSED)
        cr_assert(strstr(e.text, "gone"), "%s", e.text);
    if (rc == COMMON_OK && strcmp(common_devmem_backend(), "HOST") == 0) {
        for (size_t i = 0; i < bytes; i += 4093)
            cr_assert_eq(at[i], t_byte(5, i), "byte %zu", i);
    }
    /* Whatever the maker left, the memory is the importer's to use. */
    uint8_t                    *src = t_pattern(6, bytes);
    struct common_devmem_event *mine;
    cr_assert_eq(common_devmem_event_create(&mine, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_copy_async(at, src, bytes, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_wait(ev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_record(mine, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_sync(mine, &e), COMMON_OK, "%s", e.text);
    if (strcmp(common_devmem_backend(), "HOST") == 0)
        cr_assert_eq(memcmp(at, src, bytes), 0);
    common_devmem_event_destroy(mine);
    common_devmem_event_destroy(ev);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(at, bytes);
    free(src);
    close(sock);
}

Test(common_devmem, bad_handles_and_ranges_are_refused)
{
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_devmem_event_create(&(struct common_devmem_event *){NULL}, &e),
                 COMMON_EINVAL, "before open");
    cr_assert(strstr(e.text, "common_devmem_open"), "%s", e.text);
    t_open();
    if (strcmp(common_devmem_backend(), "HOST") != 0)
        cr_skip_test("the host backend's checks");
    cr_assert_eq(common_devmem_open(1, &e), COMMON_EINVAL, "another device");
    cr_assert_eq(common_devmem_open(0, &e), COMMON_OK, "the same device again");
    size_t g = common_devmem_granularity();
    cr_assert_gt(g, 0);
    struct common_devmem_piece *p = NULL;
    cr_assert_eq(common_devmem_piece_create(g + 1, &p, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "granularity"), "%s", e.text);
    cr_assert_null(common_devmem_reserve(g / 2, &e));

    /* A descriptor that is no piece: a plain file, a piece of another size, an event's page. */
    char *dir = fixture_tmpdir();
    char  path[256];
    snprintf(path, sizeof(path), "%.200s/f", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(path, 1, 10, f), 10);
    fclose(f);
    struct common_devmem_handle h = {.fd = open(path, O_RDWR)};
    cr_assert_geq(h.fd, 0);
    cr_assert_eq(common_devmem_piece_import(&h, g, &p, &e), COMMON_EINVAL);
    cr_assert_eq(h.fd, -1, "the descriptor is taken and closed on failure too");
    cr_assert(strstr(e.text, "device memory"), "%s", e.text);

    struct common_devmem_piece *q;
    cr_assert_eq(common_devmem_piece_create(2 * g, &q, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_export(q, &h, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_import(&h, g, &p, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "not the"), "%s", e.text);
    cr_assert_eq(common_devmem_piece_export(q, &h, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_import(&h, &(struct common_devmem_event *){NULL}, &e),
                 COMMON_EINVAL, "a piece is no event");
    h = (struct common_devmem_handle){.fd = -1};
    cr_assert_eq(common_devmem_event_import(&h, &(struct common_devmem_event *){NULL}, &e),
                 COMMON_EINVAL, "no descriptor");
    h = (struct common_devmem_handle){.fd = -1, .len = 65};
    cr_assert_eq(common_devmem_event_import(&h, &(struct common_devmem_event *){NULL}, &e),
                 COMMON_EINVAL, "too long");

    /* Mapping: inside a reservation, aligned, not over another piece; copies into mapped memory
     * only. */
    uint8_t *base = common_devmem_reserve(2 * g, &e);
    cr_assert_not_null(base, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(q, base + g, &e), COMMON_EINVAL, "runs past its end");
    cr_assert_eq(common_devmem_piece_map(q, base + 1, &e), COMMON_EINVAL, "not aligned");
    uint8_t local[64];
    cr_assert_eq(common_devmem_piece_map(q, local, &e), COMMON_EINVAL, "not reserved");
    cr_assert_eq(common_devmem_copy_async(base, local, 16, &e), COMMON_EINVAL, "nothing mapped");
    cr_assert_eq(common_devmem_piece_map(q, base, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(q, base, &e), COMMON_EBUSY, "mapped already");
    struct common_devmem_piece *r;
    cr_assert_eq(common_devmem_piece_create(g, &r, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(r, base + g, &e), COMMON_EBUSY, "over q");
    cr_assert_eq(common_devmem_copy_async(base + 2 * g - 8, local, 16, &e), COMMON_EINVAL,
                 "past the piece");
    memset(local, 0x3c, sizeof(local));
    cr_assert_eq(common_devmem_copy_async(base + 8, local, sizeof(local), &e), COMMON_OK);
    struct common_devmem_event *ev;
    cr_assert_eq(common_devmem_event_create(&ev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_record(ev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_event_sync(ev, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(base[8 + 63], 0x3c);
    common_devmem_event_destroy(ev);
    common_devmem_piece_destroy(r);
    common_devmem_piece_destroy(q);
    common_devmem_unreserve(base, 2 * g);
    fixture_rmtree(dir);
    free(dir);
}

/* The wire: a handle's bytes and descriptor cross together; a message that is no handle is
 * refused and its descriptor closed. */
Test(common_devmem, handles_cross_a_socket_and_garbage_does_not)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct common_devmem_handle h = {.fd = dup(0), .len = 5, .blob = {1, 2, 3, 4, 5}}, g;
    cr_assert_geq(h.fd, 0);
    cr_assert_eq(common_devmem_handle_send(sv[0], &h, 42), COMMON_OK);
    uint64_t tag = 0;
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 1000), COMMON_OK);
    cr_assert_eq(tag, 42);
    cr_assert_eq(g.len, 5);
    cr_assert_eq(g.blob[4], 5);
    cr_assert_geq(g.fd, 0);
    cr_assert_neq(g.fd, h.fd);
    close(g.fd);
    h.fd = -1; /* no descriptor: a CUDA event's handle */
    cr_assert_eq(common_devmem_handle_send(sv[0], &h, 43), COMMON_OK);
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 1000), COMMON_OK);
    cr_assert_eq(g.fd, -1);
    cr_assert_eq(tag, 43);
    h.len = COMMON_DEVMEM_BLOB + 1;
    cr_assert_eq(common_devmem_handle_send(sv[0], &h, 44), COMMON_EINVAL);

    /* A message of the right length with a bad magic, then one claiming a descriptor it lacks,
     * then a short one with a descriptor. */
    uint8_t junk[88];
    memset(junk, 0x5a, sizeof(junk));
    cr_assert_eq(common_fd_send_bytes(sv[0], 0, junk, sizeof(junk)), COMMON_OK);
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 1000), COMMON_EPROTO);
    cr_assert_eq(common_fd_send_bytes(sv[0], -1, junk, 8), COMMON_OK);
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 1000), COMMON_EPROTO);
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 50), COMMON_ETIMEDOUT);
    close(sv[0]);
    cr_assert_eq(common_devmem_handle_recv(sv[1], &g, &tag, 1000), COMMON_ECLOSED);
    close(sv[1]);
}

/* Host memory registered as pinned for the copy stream: refused where part of it is not mapped
 * or is registered already (as CUDA refuses), accepted again once unregistered. */
Test(common_devmem, host_memory_registers_as_cuda_allows)
{
    struct common_errmsg e = {{0}};
    t_open();
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_eq(munmap(m + 3 * page, page), 0); /* a hole at the end */
    cr_expect_eq(common_devmem_host_register(m, 4 * page, &e), COMMON_EINVAL);
    cr_expect(strstr(e.text, "not mapped") != NULL, "%s", e.text);
    cr_assert_eq(common_devmem_host_register(m, 2 * page, &e), COMMON_OK, "%s", e.text);
    cr_expect_eq(common_devmem_host_register(m + page, page, &e), COMMON_EINVAL, "overlaps");
    common_devmem_host_unregister(m);
    cr_expect_eq(common_devmem_host_register(m + page, page, &e), COMMON_OK, "%s", e.text);
    common_devmem_host_unregister(m + page);
    cr_expect_eq(common_devmem_host_register(NULL, page, &e), COMMON_EINVAL);
    munmap(m, 3 * page);
}

/* Several devices in one process (an executor whose layers span devices, each with a pool): each
 * open makes its device the thread's, pieces are made and mapped after either, and a device the
 * backend does not have is refused; select goes back to an opened one (or opens it). */
Test(common_devmem, several_devices_open_in_one_process)
{
    cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "2", 1), 0);
    struct common_errmsg e = {{0}};
    t_open();
    if (strcmp(common_devmem_backend(), "HOST") != 0)
        cr_skip_test("the host backend's devices");
    cr_assert_eq(common_devmem_open(1, &e), COMMON_OK, "%s", e.text);
    const size_t                g = common_devmem_granularity();
    struct common_devmem_piece *p = NULL, *q = NULL;
    uint8_t                    *base = common_devmem_reserve(2 * g, &e);
    cr_assert_not_null(base, "%s", e.text);
    cr_assert_eq(common_devmem_piece_create(g, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(p, base, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_open(0, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_create(g, &q, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_piece_map(q, base + g, &e), COMMON_OK, "%s", e.text);
    memset(base, 7, 2 * g);
    cr_assert_eq(base[2 * g - 1], 7);
    cr_assert_eq(common_devmem_open(2, &e), COMMON_EINVAL, "HOST2 is not there");
    cr_assert(strstr(e.text, "HOST0..HOST1"), "%s", e.text);
    /* select: back to an opened device without opening it again; one never opened is opened */
    cr_assert_eq(common_devmem_select(1, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_devmem_select(0, &e), COMMON_OK, "%s", e.text);
    e.text[0] = '\0';
    cr_assert_eq(common_devmem_select(2, &e), COMMON_EINVAL, "HOST2 is not there");
    cr_assert(strstr(e.text, "HOST0..HOST1"), "%s", e.text);
    cr_assert_eq(common_devmem_select(-1, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "not a device number"), "%s", e.text);
    common_devmem_piece_destroy(p);
    common_devmem_piece_destroy(q);
    common_devmem_unreserve(base, 2 * g);
}
