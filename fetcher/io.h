/* fetcher/io.h - I/O engine: batched, merged, optionally O_DIRECT reads behind one interface. */
#ifndef FETCHER_IO_H
#define FETCHER_IO_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "fetcher.h"

/* Most buffers one merged read may scatter into, and its largest size. */
#define FETCHER_IO_MAX_IOV   16
#define FETCHER_IO_MAX_MERGE (UINT64_C(8) << 20)

/* One file the engine reads from. */
struct fetcher_io_file {
    int         fd;   /* borrowed: buffered read-only descriptor; must outlive the engine */
    const char *path; /* borrowed: for O_DIRECT reopening and error messages; may be NULL */
};

struct fetcher_io_opts {
    enum fetcher_io_mode mode;        /* AUTO, URING or PREAD (MMAP is not an engine) */
    enum fetcher_direct  direct;      /* AUTO: reopen each file with O_DIRECT where accepted */
    uint32_t             queue_depth; /* requests in flight at most; 0 = 32 */
    uint32_t             n_threads;   /* pread workers; 0 = min(queue_depth, 8) */
    void                *reg_base;    /* borrowed: memory to register with io_uring (the pool
                                         data); NULL = none */
    uint64_t reg_bytes;               /* bytes at reg_base */
};

/* One read. For an O_DIRECT file the engine reads the enclosing FETCHER_ALIGN-aligned range, so
 * `buf` must be congruent to `offset` modulo FETCHER_ALIGN with room before it back to the
 * aligned start and after it up to the aligned end (a pool part region laid out by the front);
 * otherwise the buffered descriptor is used. */
struct fetcher_io_req {
    uint32_t file;   /* index in the engine's file table */
    uint64_t offset; /* first byte wanted */
    uint64_t len;    /* bytes wanted; all must arrive (a short read is an error) */
    void    *buf;    /* borrowed: destination of the wanted bytes */
    uint64_t user;   /* caller's cookie, returned in the completion */
};

struct fetcher_io_cqe {
    uint64_t user;       /* the request's cookie */
    int      err;        /* 0, or a positive errno (EIO for a short read at end of file) */
    bool     short_read; /* the file ended before every wanted byte arrived */
    uint32_t file;       /* request's file, offset and length, for error messages */
    uint64_t offset;
    uint64_t len;
    uint64_t bytes; /* bytes of this request read from storage (the aligned range if direct) */
};

/* Opaque engine. Submit and reap belong to one thread (the owner); fetcher_io_wake() may be
 * called from any thread. */
struct fetcher_io;

/* Creates an engine over `files` (copied). mode AUTO tries io_uring, then the pread pool.
 * Returns 0, COMMON_ENOTSUP (URING asked but unavailable), COMMON_EINVAL, COMMON_ENOMEM,
 * with a message. */
int fetcher_io_create(const struct fetcher_io_opts *o, const struct fetcher_io_file *files,
                      uint32_t n_files, struct fetcher_io **out, struct common_errmsg *e);
/* Waits for reads in flight, then frees; accepts NULL. */
void fetcher_io_destroy(struct fetcher_io *io);

/* The backend in use (URING or PREAD), the queue depth, and whether file `file` is read with
 * O_DIRECT. */
enum fetcher_io_mode fetcher_io_get_mode(const struct fetcher_io *io);
uint32_t             fetcher_io_queue_depth(const struct fetcher_io *io);
bool                 fetcher_io_is_direct(const struct fetcher_io *io, uint32_t file);
/* Requests accepted and not yet reaped. */
uint32_t fetcher_io_in_flight(const struct fetcher_io *io);

/* Starts `n` reads: sorted by file and offset, reads that abut are merged into one vectored
 * read. Returns 0, COMMON_EAGAIN (more than queue_depth would be in flight; nothing started),
 * COMMON_EINVAL (bad file index or empty read). Owner thread. */
int fetcher_io_submit(struct fetcher_io *io, const struct fetcher_io_req *reqs, uint32_t n);

/* Collects up to `max` completions. With `wait`, blocks until at least one completes or
 * fetcher_io_wake() is called (then it may return 0). Returns the count. Owner thread. */
uint32_t fetcher_io_reap(struct fetcher_io *io, struct fetcher_io_cqe *out, uint32_t max,
                         bool wait);

/* Interrupts a blocked fetcher_io_reap(); a wake with nobody waiting makes the next one return
 * at once. Any thread. */
void fetcher_io_wake(struct fetcher_io *io);

/* Formats the error of a failed completion: "PATH: read of LEN bytes at offset OFF failed:
 * strerror" and returns COMMON_EIO. */
int fetcher_io_describe_error(const struct fetcher_io *io, const struct fetcher_io_cqe *c,
                              struct common_errmsg *e);

/* ---- backends (io_uring.c, io_pread.c); used by io.c only ---------------------------------- */

/* One read the backend performs: a contiguous file range scattered into iov. */
struct fetcher_io_op {
    int          fd;                      /* descriptor to read (direct or buffered) */
    int          reg_file;                /* io_uring registered file index, or -1 */
    uint64_t     offset;                  /* file offset of the next byte to read */
    struct iovec iov[FETCHER_IO_MAX_IOV]; /* remaining destination */
    uint32_t     n_iov;
    int          reg_buf; /* io_uring registered buffer index for a single iov, or -1 */
    int64_t      res;     /* set by the backend: bytes read this attempt, or -errno */
    uint32_t     id;      /* index in the engine's op table */
};

struct fetcher_io_backend {
    const char *name;
    /* Starts `n` ops; returns 0 or a negative errno (then none started). */
    int (*start)(void *be, struct fetcher_io_op **ops, uint32_t n);
    /* Stores finished ops (res set) into done[0..max); blocks for at least one with `wait`
     * unless woken. Returns the count. */
    uint32_t (*wait)(void *be, struct fetcher_io_op **done, uint32_t max, bool wait);
    void (*wake)(void *be);
    void (*destroy)(void *be);
};

/* Backend constructors: return 0 or a negative common_err; *be is the backend state. */
int fetcher_io_uring_create(uint32_t queue_depth, const int *fds, uint32_t n_fds, void *reg_base,
                            uint64_t reg_bytes, const struct fetcher_io_backend **ops, void **be,
                            struct common_errmsg *e);
int fetcher_io_pread_create(uint32_t queue_depth, uint32_t n_threads,
                            const struct fetcher_io_backend **ops, void **be,
                            struct common_errmsg *e);
/* io_uring registered index of descriptor fds[i] / buffer containing [p, p+len), or -1. */
int fetcher_io_uring_file_index(void *be, uint32_t i);
int fetcher_io_uring_buf_index(void *be, const void *p, uint64_t len);

#endif /* FETCHER_IO_H */
