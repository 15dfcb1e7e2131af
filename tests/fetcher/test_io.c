/* tests/fetcher/test_io.c - I/O engine: io_uring and pread read expert spans exactly; errors. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "io.h"

static struct common_gguf *t_g;
static struct common_model t_m;

#define OPEN_MODEL()                                                                               \
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");                                          \
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);                             \
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);                                   \
    free(path)

static void teardown(void)
{
    common_model_fini(&t_m);
    common_gguf_close(t_g);
    t_g = NULL;
}

/* Creates an engine over split 0 of the model, skipping the test when io_uring is missing. */
static struct fetcher_io *make_io(enum fetcher_io_mode mode, uint32_t qd, enum fetcher_direct d)
{
    struct fetcher_io_file f = {.fd = common_gguf_split_fd(t_g, 0),
                                .path = common_gguf_split_path(t_g, 0)};
    struct fetcher_io_opts o = {.mode = mode, .queue_depth = qd, .direct = d};
    struct fetcher_io     *io = NULL;
    struct common_errmsg   e = {{0}};
    int                    rc = fetcher_io_create(&o, &f, 1, &io, &e);
    if (rc == COMMON_ENOTSUP && mode == FETCHER_IO_URING)
        cr_skip_test("io_uring unavailable: %s", e.text);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    cr_assert_eq(fetcher_io_get_mode(io), mode);
    return io;
}

struct part_buf {
    uint8_t           *region; /* aligned, like a part region of a pool slot */
    uint8_t           *data;   /* region + offset % ALIGN */
    struct common_span span;
};

static uint64_t align_up(uint64_t v)
{
    return (v + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
}

/* Reads every part of every expert through `io`, at most qd in flight, and compares each with
 * common_gguf_read_span(). */
static void read_all_and_compare(struct fetcher_io *io)
{
    uint32_t         n = t_m.hp.n_layer * t_m.hp.n_expert * COMMON_EXPERT_PART_COUNT;
    struct part_buf *pb = calloc(n, sizeof(*pb));
    cr_assert_not_null(pb);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t part = i % 3, x = (i / 3) % t_m.hp.n_expert, l = i / 3 / t_m.hp.n_expert;
        cr_assert_eq(
            common_model_expert_span(&t_m, l, x, (enum common_expert_part)part, &pb[i].span),
            COMMON_OK);
        uint64_t start = pb[i].span.offset / FETCHER_ALIGN * FETCHER_ALIGN;
        uint64_t len = align_up(pb[i].span.offset + pb[i].span.size) - start;
        pb[i].region = aligned_alloc(FETCHER_ALIGN, len);
        cr_assert_not_null(pb[i].region);
        memset(pb[i].region, 0xa5, len);
        pb[i].data = pb[i].region + (pb[i].span.offset - start);
    }
    uint32_t               qd = fetcher_io_queue_depth(io), next = 0, done = 0;
    struct fetcher_io_req *reqs = calloc(qd, sizeof(*reqs));
    struct fetcher_io_cqe *cqes = calloc(qd, sizeof(*cqes));
    while (done < n) {
        uint32_t k = 0;
        while (next < n && fetcher_io_in_flight(io) + k < qd) {
            reqs[k++] = (struct fetcher_io_req){.file = pb[next].span.split,
                                                .offset = pb[next].span.offset,
                                                .len = pb[next].span.size,
                                                .buf = pb[next].data,
                                                .user = next};
            next++;
        }
        cr_assert_eq(fetcher_io_submit(io, reqs, k), COMMON_OK);
        uint32_t got = fetcher_io_reap(io, cqes, qd, true);
        for (uint32_t i = 0; i < got; i++) {
            struct common_errmsg e = {{0}};
            if (cqes[i].err)
                fetcher_io_describe_error(io, &cqes[i], &e);
            cr_assert_eq(cqes[i].err, 0, "%s", e.text);
            cr_assert_geq(cqes[i].bytes, cqes[i].len);
        }
        done += got;
    }
    cr_assert_eq(fetcher_io_in_flight(io), 0);
    uint8_t *ref = malloc(t_m.bytes_expert_bundle);
    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(common_gguf_read_span(t_g, &pb[i].span, ref, NULL), COMMON_OK);
        cr_assert_eq(memcmp(ref, pb[i].data, pb[i].span.size), 0, "part %u differs", i);
        free(pb[i].region);
    }
    free(ref);
    free(reqs);
    free(cqes);
    free(pb);
}

static void run_case(enum fetcher_io_mode mode, uint32_t qd, enum fetcher_direct d)
{
    struct fetcher_io *io = make_io(mode, qd, d);
    read_all_and_compare(io);
    fetcher_io_destroy(io);
}

Test(fetcher_io, uring_qd1_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_URING, 1, FETCHER_DIRECT_AUTO);
}

Test(fetcher_io, uring_qd32_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_URING, 32, FETCHER_DIRECT_AUTO);
}

Test(fetcher_io, uring_buffered_qd32_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_URING, 32, FETCHER_DIRECT_OFF);
}

Test(fetcher_io, pread_qd1_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_PREAD, 1, FETCHER_DIRECT_AUTO);
}

Test(fetcher_io, pread_qd32_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_PREAD, 32, FETCHER_DIRECT_AUTO);
}

Test(fetcher_io, pread_buffered_qd32_matches_read_span, .fini = teardown)
{
    OPEN_MODEL();
    run_case(FETCHER_IO_PREAD, 32, FETCHER_DIRECT_OFF);
}

/* Buffered reads of the same part of neighbouring experts abut in the file: they are merged
 * into one vectored read, and each buffer still gets exactly its bytes. */
static void merged_case(enum fetcher_io_mode mode)
{
    struct fetcher_io    *io = make_io(mode, 32, FETCHER_DIRECT_OFF);
    uint32_t              ne = t_m.hp.n_expert;
    uint8_t              *buf[64];
    struct fetcher_io_req reqs[64];
    struct common_span    sp[64];
    cr_assert_leq(ne, 64);
    for (uint32_t x = 0; x < ne; x++) {
        cr_assert_eq(common_model_expert_span(&t_m, 1, ne - 1 - x, COMMON_EXPERT_UP, &sp[x]),
                     COMMON_OK);
        buf[x] = malloc(sp[x].size + 1);
        reqs[x] = (struct fetcher_io_req){.file = sp[x].split,
                                          .offset = sp[x].offset,
                                          .len = sp[x].size,
                                          .buf = buf[x],
                                          .user = x};
    }
    cr_assert_eq(fetcher_io_submit(io, reqs, ne), COMMON_OK);
    struct fetcher_io_cqe c[64];
    uint32_t              got = 0;
    while (got < ne)
        got += fetcher_io_reap(io, c + got, 64 - got, true);
    uint8_t *ref = malloc(t_m.bytes_expert_bundle);
    for (uint32_t i = 0; i < ne; i++) {
        cr_assert_eq(c[i].err, 0);
        uint32_t x = (uint32_t)c[i].user;
        cr_assert_eq(common_gguf_read_span(t_g, &sp[x], ref, NULL), COMMON_OK);
        cr_assert_eq(memcmp(ref, buf[x], sp[x].size), 0, "expert %u", x);
    }
    for (uint32_t x = 0; x < ne; x++)
        free(buf[x]);
    free(ref);
    fetcher_io_destroy(io);
}

Test(fetcher_io, uring_merged_reads_land_in_place, .fini = teardown)
{
    OPEN_MODEL();
    merged_case(FETCHER_IO_URING);
}

Test(fetcher_io, pread_merged_reads_land_in_place, .fini = teardown)
{
    OPEN_MODEL();
    merged_case(FETCHER_IO_PREAD);
}

/* A read past the end of the file fails with a short read naming file and offset. */
static void eof_case(enum fetcher_io_mode mode, enum fetcher_direct d)
{
    struct fetcher_io    *io = make_io(mode, 4, d);
    uint64_t              size = common_gguf_split_size(t_g, 0);
    uint8_t              *buf = aligned_alloc(FETCHER_ALIGN, 4 * FETCHER_ALIGN);
    struct fetcher_io_req r = {.file = 0,
                               .offset = size - 100,
                               .len = 1000,
                               .buf = buf + (size - 100) % FETCHER_ALIGN,
                               .user = 7};
    cr_assert_eq(fetcher_io_submit(io, &r, 1), COMMON_OK);
    struct fetcher_io_cqe c;
    while (fetcher_io_reap(io, &c, 1, true) == 0)
        ;
    cr_assert_eq(c.user, 7);
    cr_assert_neq(c.err, 0);
    cr_assert(c.short_read);
    struct common_errmsg e = {{0}};
    cr_assert_eq(fetcher_io_describe_error(io, &c, &e), COMMON_EIO);
    cr_assert(strstr(e.text, common_gguf_split_path(t_g, 0)), "%s", e.text);
    char off[64];
    snprintf(off, sizeof(off), "offset %llu", (unsigned long long)(size - 100));
    cr_assert(strstr(e.text, off), "%s", e.text);
    free(buf);
    fetcher_io_destroy(io);
}

Test(fetcher_io, uring_read_past_eof_fails, .fini = teardown)
{
    OPEN_MODEL();
    eof_case(FETCHER_IO_URING, FETCHER_DIRECT_AUTO);
    eof_case(FETCHER_IO_URING, FETCHER_DIRECT_OFF);
}

Test(fetcher_io, pread_read_past_eof_fails, .fini = teardown)
{
    OPEN_MODEL();
    eof_case(FETCHER_IO_PREAD, FETCHER_DIRECT_AUTO);
    eof_case(FETCHER_IO_PREAD, FETCHER_DIRECT_OFF);
}

/* A descriptor closed under the engine gives EBADF, and the message names the file. */
static void closed_fd_case(enum fetcher_io_mode mode)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    /* A high descriptor number, so that the engine's own descriptors (lowest free first) do
     * not reuse it after the close. */
    int fd0 = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd0, 0);
    int fd = fcntl(fd0, F_DUPFD_CLOEXEC, 900);
    cr_assert_geq(fd, 900);
    close(fd0);
    close(fd);
    struct fetcher_io_file f = {.fd = fd, .path = path};
    struct fetcher_io_opts o = {.mode = mode, .queue_depth = 2, .direct = FETCHER_DIRECT_OFF};
    struct fetcher_io     *io = NULL;
    int                    rc = fetcher_io_create(&o, &f, 1, &io, NULL);
    if (rc == COMMON_ENOTSUP)
        cr_skip_test("io_uring unavailable");
    cr_assert_eq(rc, COMMON_OK);
    uint8_t               buf[64];
    struct fetcher_io_req r = {.file = 0, .offset = 0, .len = sizeof(buf), .buf = buf};
    cr_assert_eq(fetcher_io_submit(io, &r, 1), COMMON_OK);
    struct fetcher_io_cqe c;
    while (fetcher_io_reap(io, &c, 1, true) == 0)
        ;
    cr_assert_eq(c.err, EBADF);
    struct common_errmsg e = {{0}};
    fetcher_io_describe_error(io, &c, &e);
    cr_assert(strstr(e.text, path), "%s", e.text);
    cr_assert(strstr(e.text, "offset 0"), "%s", e.text);
    fetcher_io_destroy(io);
    free(path);
}

Test(fetcher_io, uring_closed_fd_fails)
{
    closed_fd_case(FETCHER_IO_URING);
}

Test(fetcher_io, pread_closed_fd_fails)
{
    closed_fd_case(FETCHER_IO_PREAD);
}

Test(fetcher_io, submit_beyond_queue_depth_is_refused, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher_io    *io = make_io(FETCHER_IO_PREAD, 2, FETCHER_DIRECT_OFF);
    uint8_t               buf[3][16];
    struct fetcher_io_req r[3];
    for (int i = 0; i < 3; i++)
        r[i] = (struct fetcher_io_req){.offset = (uint64_t)i * 16, .len = 16, .buf = buf[i]};
    cr_assert_eq(fetcher_io_submit(io, r, 3), COMMON_EAGAIN);
    r[0].file = 5;
    cr_assert_eq(fetcher_io_submit(io, r, 1), COMMON_EINVAL);
    fetcher_io_destroy(io);
}
