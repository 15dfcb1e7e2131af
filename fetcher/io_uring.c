/* fetcher/io_uring.c - io_uring backend: one ring, registered files/buffers, eventfd wake. */
#include "io.h"

#ifdef SLUICE_HAVE_LIBURING

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* user_data of the eventfd read that wakes a blocked wait (ops use their address, never 1). */
#define URING_WAKE_TAG UINT64_C(1)
/* Largest registered buffer (the kernel's limit per iovec). */
#define URING_REG_CHUNK (UINT64_C(1) << 30)
#define URING_MAX_BUFS  64

struct uring_be {
    struct io_uring ring;      /* owned: io_uring_queue_exit in destroy */
    bool            ring_init; /* ring is set up */
    bool            files_reg; /* descriptors registered (IOSQE_FIXED_FILE) */
    int            *reg_of;    /* owned: registered index per descriptor slot, or -1 */
    uint32_t        n_fds;
    uint8_t        *reg_base; /* borrowed: registered buffer region, or NULL */
    uint64_t        reg_bytes;
    uint32_t        n_bufs;    /* registered buffers of URING_REG_CHUNK (last shorter) */
    int             efd;       /* owned: eventfd written by fetcher_io_wake */
    uint64_t        efd_val;   /* target of the armed eventfd read */
    bool            efd_armed; /* an eventfd read is queued */
};

static int uring_arm(struct uring_be *u)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_read(sqe, u->efd, &u->efd_val, sizeof(u->efd_val), 0);
    io_uring_sqe_set_data64(sqe, URING_WAKE_TAG);
    u->efd_armed = true;
    return 0;
}

static int uring_start(void *be, struct fetcher_io_op **ops, uint32_t n)
{
    struct uring_be *u = be;
    for (uint32_t i = 0; i < n; i++) {
        struct fetcher_io_op *op = ops[i];
        struct io_uring_sqe  *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) {
            int rc = io_uring_submit(&u->ring);
            if (rc < 0)
                return rc;
            sqe = io_uring_get_sqe(&u->ring);
            if (!sqe)
                return -EBUSY;
        }
        int fd = op->reg_file >= 0 ? op->reg_file : op->fd;
        if (op->n_iov == 1 && op->reg_buf >= 0)
            io_uring_prep_read_fixed(sqe, fd, op->iov[0].iov_base, (unsigned)op->iov[0].iov_len,
                                     op->offset, op->reg_buf);
        else if (op->n_iov == 1)
            io_uring_prep_read(sqe, fd, op->iov[0].iov_base, (unsigned)op->iov[0].iov_len,
                               op->offset);
        else
            io_uring_prep_readv(sqe, fd, op->iov, op->n_iov, op->offset);
        if (op->reg_file >= 0)
            io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
        io_uring_sqe_set_data(sqe, op);
    }
    int rc;
    do
        rc = io_uring_submit(&u->ring);
    while (rc == -EINTR);
    return rc < 0 ? rc : 0;
}

static uint32_t uring_wait(void *be, struct fetcher_io_op **done, uint32_t max, bool wait)
{
    struct uring_be *u = be;
    uint32_t         n = 0;
    bool             woken = false;
    for (;;) {
        struct io_uring_cqe *cqe = NULL;
        int                  rc;
        if (wait && n == 0 && !woken)
            rc = io_uring_wait_cqe(&u->ring, &cqe);
        else
            rc = io_uring_peek_cqe(&u->ring, &cqe);
        if (rc == -EINTR)
            continue;
        if (rc < 0 || !cqe)
            break;
        if (io_uring_cqe_get_data64(cqe) == URING_WAKE_TAG) {
            io_uring_cqe_seen(&u->ring, cqe);
            u->efd_armed = false;
            woken = true;
            if (uring_arm(u) == 0)
                (void)io_uring_submit(&u->ring);
            continue;
        }
        struct fetcher_io_op *op = io_uring_cqe_get_data(cqe);
        op->res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        done[n++] = op;
        if (n == max)
            break;
    }
    return n;
}

static void uring_wake(void *be)
{
    struct uring_be *u = be;
    uint64_t         one = 1;
    ssize_t          r;
    do
        r = write(u->efd, &one, sizeof(one));
    while (r < 0 && errno == EINTR);
}

static void uring_destroy(void *be)
{
    struct uring_be *u = be;
    if (!u)
        return;
    if (u->ring_init)
        io_uring_queue_exit(&u->ring); /* cancels the armed eventfd read */
    if (u->efd >= 0)
        close(u->efd);
    free(u->reg_of);
    free(u);
}

static const struct fetcher_io_backend g_uring_backend = {
    .name = "uring",
    .start = uring_start,
    .wait = uring_wait,
    .wake = uring_wake,
    .destroy = uring_destroy,
};

int fetcher_io_uring_create(uint32_t queue_depth, const int *fds, uint32_t n_fds, void *reg_base,
                            uint64_t reg_bytes, const struct fetcher_io_backend **ops, void **be,
                            struct common_errmsg *e)
{
    struct uring_be *u = calloc(1, sizeof(*u));
    if (!u)
        return common_errmsg_set(e, COMMON_ENOMEM, "io_uring: out of memory");
    u->efd = -1;
    u->reg_of = calloc(n_fds ? n_fds : 1, sizeof(*u->reg_of));
    if (!u->reg_of) {
        uring_destroy(u);
        return common_errmsg_set(e, COMMON_ENOMEM, "io_uring: out of memory");
    }
    /* Ops in flight never exceed queue_depth; one more entry for the eventfd read. */
    int rc = io_uring_queue_init(queue_depth + 1, &u->ring, 0);
    if (rc < 0) {
        uring_destroy(u);
        return common_errmsg_set(e, COMMON_ENOTSUP, "io_uring unavailable: %s", strerror(-rc));
    }
    u->ring_init = true;
    u->efd = eventfd(0, EFD_CLOEXEC);
    if (u->efd < 0 || uring_arm(u) != 0 || io_uring_submit(&u->ring) < 0) {
        uring_destroy(u);
        return common_errmsg_set(e, COMMON_ENOTSUP, "io_uring: eventfd wake-up unavailable");
    }
    /* Registered files save a descriptor lookup per read; -1 entries stay sparse. A failure
     * (old kernel, bad descriptor) only means plain descriptors are used. */
    u->n_fds = n_fds;
    for (uint32_t i = 0; i < n_fds; i++)
        u->reg_of[i] = -1;
    if (n_fds > 0 && io_uring_register_files(&u->ring, fds, n_fds) == 0) {
        u->files_reg = true;
        for (uint32_t i = 0; i < n_fds; i++)
            u->reg_of[i] = fds[i] >= 0 ? (int)i : -1;
    }
    /* Registered buffers spare the kernel a page walk per read; they pin the memory, so a
     * refusal (RLIMIT_MEMLOCK) is not an error. */
    if (reg_base && reg_bytes > 0) {
        struct iovec iov[URING_MAX_BUFS];
        uint32_t     nb = 0;
        for (uint64_t off = 0; off < reg_bytes && nb < URING_MAX_BUFS; off += URING_REG_CHUNK) {
            uint64_t len = reg_bytes - off < URING_REG_CHUNK ? reg_bytes - off : URING_REG_CHUNK;
            iov[nb++] = (struct iovec){.iov_base = (uint8_t *)reg_base + off, .iov_len = len};
        }
        if (io_uring_register_buffers(&u->ring, iov, nb) == 0) {
            u->reg_base = reg_base;
            u->reg_bytes = (uint64_t)nb * URING_REG_CHUNK < reg_bytes
                               ? (uint64_t)nb * URING_REG_CHUNK
                               : reg_bytes;
            u->n_bufs = nb;
        } else {
            COMMON_LOG_DEBUG("fetcher.uring", "buffer registration refused bytes=%llu",
                             (unsigned long long)reg_bytes);
        }
    }
    *ops = &g_uring_backend;
    *be = u;
    return COMMON_OK;
}

int fetcher_io_uring_file_index(void *be, uint32_t i)
{
    struct uring_be *u = be;
    return u->files_reg && i < u->n_fds ? u->reg_of[i] : -1;
}

int fetcher_io_uring_buf_index(void *be, const void *p, uint64_t len)
{
    struct uring_be *u = be;
    const uint8_t   *b = p;
    if (!u->reg_base || b < u->reg_base || b + len > u->reg_base + u->reg_bytes)
        return -1;
    uint64_t off = (uint64_t)(b - u->reg_base);
    uint64_t idx = off / URING_REG_CHUNK;
    if ((off + len - 1) / URING_REG_CHUNK != idx)
        return -1;
    return (int)idx;
}

#else /* !SLUICE_HAVE_LIBURING: built without liburing, every engine is the pread pool. */

int fetcher_io_uring_create(uint32_t queue_depth, const int *fds, uint32_t n_fds, void *reg_base,
                            uint64_t reg_bytes, const struct fetcher_io_backend **ops, void **be,
                            struct common_errmsg *e)
{
    (void)queue_depth, (void)fds, (void)n_fds, (void)reg_base, (void)reg_bytes, (void)ops, (void)be;
    return common_errmsg_set(e, COMMON_ENOTSUP, "io_uring: built without liburing");
}

int fetcher_io_uring_file_index(void *be, uint32_t i)
{
    (void)be, (void)i;
    return -1;
}

int fetcher_io_uring_buf_index(void *be, const void *p, uint64_t len)
{
    (void)be, (void)p, (void)len;
    return -1;
}

#endif /* SLUICE_HAVE_LIBURING */
