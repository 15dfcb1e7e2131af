/* fetcher/io.c - I/O engine front: O_DIRECT ranges, merging, retries, per-request results. */
#include "io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct io_file {
    int   fd;     /* borrowed: buffered descriptor */
    int   dfd;    /* owned: O_DIRECT descriptor, or -1 */
    char *path;   /* owned: copy of the path, or NULL */
    bool  direct; /* dfd is usable (cleared when the file system refuses a direct read) */
};

/* One request inside an op: where its range sits in the op's read. */
struct io_member {
    struct fetcher_io_req req;
    uint64_t              rel;    /* offset of its read range from the op's start */
    uint64_t              rd_len; /* bytes of its read range (aligned when direct) */
    uint64_t              need;   /* bytes from its range start that must arrive */
};

/* An op and its members; ops live in a fixed table of queue_depth entries. */
struct io_slot {
    struct fetcher_io_op op;
    struct io_member     m[FETCHER_IO_MAX_IOV];
    uint32_t             n_members;
    uint32_t             file;
    bool                 direct;
    uint64_t             start; /* file offset of the op's first byte */
    uint64_t             total; /* bytes of the whole read */
    uint64_t             need;  /* bytes that must arrive for every member to succeed */
    uint64_t             done;  /* bytes read so far */
    uint32_t             next_free;
};

struct fetcher_io {
    struct fetcher_io_opts           opts;
    const struct fetcher_io_backend *ops;   /* borrowed: static table of the backend */
    void                            *be;    /* owned: backend state, freed by ops->destroy */
    enum fetcher_io_mode             mode;  /* URING or PREAD */
    struct io_file                  *files; /* owned: n_files */
    uint32_t                         n_files;
    uint32_t                         qd;
    struct io_slot                  *slots; /* owned: qd */
    uint32_t               free_head;       /* free list through next_free; UINT32_MAX = empty */
    uint32_t               in_flight;       /* requests accepted, not reaped */
    struct fetcher_io_cqe *pending;         /* owned: qd completions not yet returned */
    uint32_t               pend_head, pend_n;
    struct io_member      *scratch;       /* owned: qd members, for sorting a submit */
    bool                  *scratch_dir;   /* owned: qd direct flags of scratch */
    struct fetcher_io_op **opbuf;         /* owned: qd op pointers */
    bool                   warned_direct; /* logged the O_DIRECT fallback */
};

static uint64_t io_align_down(uint64_t v)
{
    return v / FETCHER_ALIGN * FETCHER_ALIGN;
}

static uint64_t io_align_up(uint64_t v)
{
    return (v + FETCHER_ALIGN - 1) / FETCHER_ALIGN * FETCHER_ALIGN;
}

int fetcher_io_create(const struct fetcher_io_opts *o, const struct fetcher_io_file *files,
                      uint32_t n_files, struct fetcher_io **out, struct common_errmsg *e)
{
    struct fetcher_io_opts opts = o ? *o : (struct fetcher_io_opts){0};
    if (n_files == 0 || !files)
        return common_errmsg_set(e, COMMON_EINVAL, "io: no files");
    if (opts.mode == FETCHER_IO_MMAP)
        return common_errmsg_set(e, COMMON_EINVAL, "io: mmap is not an I/O engine");
    if (opts.queue_depth == 0)
        opts.queue_depth = 32;
    if (opts.queue_depth > 4096)
        return common_errmsg_set(e, COMMON_EINVAL, "io: queue depth %u > 4096", opts.queue_depth);
    struct fetcher_io *io = calloc(1, sizeof(*io));
    if (!io)
        return common_errmsg_set(e, COMMON_ENOMEM, "io: out of memory");
    io->opts = opts;
    io->qd = opts.queue_depth;
    io->files = calloc(n_files, sizeof(*io->files));
    io->slots = calloc(io->qd, sizeof(*io->slots));
    io->pending = calloc(io->qd, sizeof(*io->pending));
    io->scratch = calloc(io->qd, sizeof(*io->scratch));
    io->opbuf = calloc(io->qd, sizeof(*io->opbuf));
    io->scratch_dir = calloc(io->qd, sizeof(*io->scratch_dir));
    int *fds = calloc(2 * (size_t)n_files, sizeof(*fds));
    int  rc;
    if (!io->files || !io->slots || !io->pending || !io->scratch || !io->opbuf ||
        !io->scratch_dir || !fds) {
        rc = common_errmsg_set(e, COMMON_ENOMEM, "io: out of memory");
        goto out_destroy;
    }
    io->n_files = n_files;
    for (uint32_t i = 0; i < n_files; i++) {
        struct io_file *f = &io->files[i];
        f->fd = files[i].fd;
        f->dfd = -1;
        if (files[i].path && !(f->path = strdup(files[i].path))) {
            rc = common_errmsg_set(e, COMMON_ENOMEM, "io: out of memory");
            goto out_destroy;
        }
        if (opts.direct != FETCHER_DIRECT_OFF && f->path) {
            f->dfd = open(f->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            f->direct = f->dfd >= 0;
        }
        fds[i] = f->fd;
        fds[n_files + i] = f->dfd;
    }
    for (uint32_t i = 0; i < io->qd; i++) {
        io->slots[i].op.id = i;
        io->slots[i].next_free = i + 1 < io->qd ? i + 1 : UINT32_MAX;
    }
    io->free_head = 0;

    rc = COMMON_ENOTSUP;
    if (opts.mode == FETCHER_IO_AUTO || opts.mode == FETCHER_IO_URING) {
        rc = fetcher_io_uring_create(io->qd, fds, 2 * n_files, opts.reg_base, opts.reg_bytes,
                                     &io->ops, &io->be, e);
        if (rc == COMMON_OK)
            io->mode = FETCHER_IO_URING;
        else if (opts.mode == FETCHER_IO_URING)
            goto out_destroy;
    }
    if (rc != COMMON_OK) {
        rc = fetcher_io_pread_create(io->qd, opts.n_threads, &io->ops, &io->be, e);
        if (rc != COMMON_OK)
            goto out_destroy;
        io->mode = FETCHER_IO_PREAD;
    }
    free(fds);
    *out = io;
    return COMMON_OK;

out_destroy:
    free(fds);
    fetcher_io_destroy(io);
    return rc;
}

void fetcher_io_destroy(struct fetcher_io *io)
{
    if (!io)
        return;
    /* Reads still in flight write into caller memory: finish them first. */
    struct fetcher_io_cqe c[16];
    while (io->be && io->in_flight > 0)
        (void)fetcher_io_reap(io, c, 16, true);
    if (io->ops && io->be)
        io->ops->destroy(io->be);
    for (uint32_t i = 0; io->files && i < io->n_files; i++) {
        if (io->files[i].dfd >= 0)
            close(io->files[i].dfd);
        free(io->files[i].path);
    }
    free(io->files);
    free(io->slots);
    free(io->pending);
    free(io->scratch);
    free(io->opbuf);
    free(io->scratch_dir);
    free(io);
}

enum fetcher_io_mode fetcher_io_get_mode(const struct fetcher_io *io)
{
    return io->mode;
}

uint32_t fetcher_io_queue_depth(const struct fetcher_io *io)
{
    return io->qd;
}

bool fetcher_io_is_direct(const struct fetcher_io *io, uint32_t file)
{
    return file < io->n_files && io->files[file].direct;
}

uint32_t fetcher_io_in_flight(const struct fetcher_io *io)
{
    return io->in_flight;
}

/* Fills the read range of member `m` from its request: the enclosing aligned range when the
 * file is direct and the buffer allows it, else exactly the request. */
static bool io_member_init(struct fetcher_io *io, struct io_member *m)
{
    const struct io_file *f = &io->files[m->req.file];
    uintptr_t             buf = (uintptr_t)m->req.buf;
    bool direct = f->direct && (buf - (uintptr_t)m->req.offset) % FETCHER_ALIGN == 0;
    if (direct) {
        uint64_t start = io_align_down(m->req.offset);
        m->rd_len = io_align_up(m->req.offset + m->req.len) - start;
        m->need = m->req.offset + m->req.len - start;
    } else {
        m->rd_len = m->req.len;
        m->need = m->req.len;
    }
    return direct;
}

static uint64_t io_member_start(const struct io_member *m, bool direct)
{
    return direct ? io_align_down(m->req.offset) : m->req.offset;
}

static uint8_t *io_member_buf(const struct io_member *m, bool direct)
{
    return (uint8_t *)m->req.buf - (m->req.offset - io_member_start(m, direct));
}

/* Orders members by (file, direct, start) so abutting reads sit next to each other. */
static int io_member_cmp(const struct io_member *a, bool da, const struct io_member *b, bool db)
{
    if (a->req.file != b->req.file)
        return a->req.file < b->req.file ? -1 : 1;
    if (da != db)
        return da ? -1 : 1;
    uint64_t sa = io_member_start(a, da), sb = io_member_start(b, db);
    return sa < sb ? -1 : sa > sb;
}

/* Builds ops from members[0..n) (each with its direct flag in dir[]) and starts them. */
static int io_start_members(struct fetcher_io *io, struct io_member *mem, const bool *dir,
                            uint32_t n)
{
    uint32_t n_ops = 0;
    uint32_t i = 0;
    while (i < n) {
        uint32_t        si = io->free_head;
        struct io_slot *s = &io->slots[si];
        io->free_head = s->next_free;
        s->file = mem[i].req.file;
        s->direct = dir[i];
        s->start = io_member_start(&mem[i], dir[i]);
        s->total = 0;
        s->need = 0;
        s->done = 0;
        s->n_members = 0;
        s->op.n_iov = 0;
        do {
            struct io_member *m = &s->m[s->n_members++];
            *m = mem[i];
            m->rel = s->total;
            s->op.iov[s->op.n_iov++] =
                (struct iovec){.iov_base = io_member_buf(m, s->direct), .iov_len = m->rd_len};
            s->need = s->total + m->need;
            s->total += m->rd_len;
            i++;
        } while (i < n && s->n_members < FETCHER_IO_MAX_IOV && mem[i].req.file == s->file &&
                 dir[i] == s->direct && io_member_start(&mem[i], dir[i]) == s->start + s->total &&
                 s->total + mem[i].rd_len <= FETCHER_IO_MAX_MERGE);
        const struct io_file *f = &io->files[s->file];
        s->op.fd = s->direct ? f->dfd : f->fd;
        s->op.offset = s->start;
        s->op.reg_file =
            io->mode == FETCHER_IO_URING
                ? fetcher_io_uring_file_index(io->be, s->direct ? io->n_files + s->file : s->file)
                : -1;
        s->op.reg_buf = -1;
        if (io->mode == FETCHER_IO_URING && s->op.n_iov == 1)
            s->op.reg_buf =
                fetcher_io_uring_buf_index(io->be, s->op.iov[0].iov_base, s->op.iov[0].iov_len);
        io->opbuf[n_ops++] = &s->op;
    }
    int rc = io->ops->start(io->be, io->opbuf, n_ops);
    if (rc != 0) {
        for (uint32_t k = 0; k < n_ops; k++) {
            struct io_slot *s = &io->slots[io->opbuf[k]->id];
            s->next_free = io->free_head;
            io->free_head = io->opbuf[k]->id;
        }
        return COMMON_EIO;
    }
    return COMMON_OK;
}

int fetcher_io_submit(struct fetcher_io *io, const struct fetcher_io_req *reqs, uint32_t n)
{
    if (n == 0)
        return COMMON_OK;
    if (n > io->qd - io->in_flight)
        return COMMON_EAGAIN;
    for (uint32_t i = 0; i < n; i++)
        if (reqs[i].file >= io->n_files || reqs[i].len == 0 || !reqs[i].buf)
            return COMMON_EINVAL;
    /* Insertion sort of the (small) batch into scratch, with each member's direct flag. */
    bool *flags = io->scratch_dir;
    for (uint32_t i = 0; i < n; i++) {
        struct io_member m = {.req = reqs[i]};
        bool             d = io_member_init(io, &m);
        uint32_t         j = i;
        while (j > 0 && io_member_cmp(&m, d, &io->scratch[j - 1], flags[j - 1]) < 0) {
            io->scratch[j] = io->scratch[j - 1];
            flags[j] = flags[j - 1];
            j--;
        }
        io->scratch[j] = m;
        flags[j] = d;
    }
    int rc = io_start_members(io, io->scratch, flags, n);
    if (rc == COMMON_OK)
        io->in_flight += n;
    return rc;
}

static void io_push_cqe(struct fetcher_io *io, struct fetcher_io_cqe *out, uint32_t max,
                        uint32_t *n_out, const struct fetcher_io_cqe *c)
{
    if (*n_out < max && io->pend_n == 0) {
        out[(*n_out)++] = *c;
        return;
    }
    io->pending[(io->pend_head + io->pend_n) % io->qd] = *c;
    io->pend_n++;
}

/* Completes every member of slot `s` from its progress; `err` (0 = end of file came first)
 * applies to members whose bytes did not all arrive. */
static void io_finish(struct fetcher_io *io, struct io_slot *s, int err, struct fetcher_io_cqe *out,
                      uint32_t max, uint32_t *n_out)
{
    for (uint32_t k = 0; k < s->n_members; k++) {
        const struct io_member *m = &s->m[k];
        bool                    ok = s->done >= m->rel + m->need;
        uint64_t                got = s->done > m->rel ? s->done - m->rel : 0;
        struct fetcher_io_cqe   c = {
              .user = m->req.user,
              .err = ok ? 0 : (err ? err : EIO),
              .short_read = !ok && err == 0,
              .file = m->req.file,
              .offset = m->req.offset,
              .len = m->req.len,
              .bytes = got < m->rd_len ? got : m->rd_len,
        };
        io_push_cqe(io, out, max, n_out, &c);
    }
    io->in_flight -= s->n_members;
    s->next_free = io->free_head;
    io->free_head = s->op.id;
}

/* Moves the op's read position past `res` bytes just read. */
static void io_advance(struct io_slot *s, uint64_t res)
{
    s->done += res;
    s->op.offset += res;
    uint32_t k = 0;
    while (k < s->op.n_iov && res >= s->op.iov[k].iov_len)
        res -= s->op.iov[k++].iov_len;
    memmove(s->op.iov, s->op.iov + k, (s->op.n_iov - k) * sizeof(s->op.iov[0]));
    s->op.n_iov -= k;
    if (res && s->op.n_iov) {
        s->op.iov[0].iov_base = (uint8_t *)s->op.iov[0].iov_base + res;
        s->op.iov[0].iov_len -= res;
    }
    s->op.reg_buf = -1;
}

uint32_t fetcher_io_reap(struct fetcher_io *io, struct fetcher_io_cqe *out, uint32_t max, bool wait)
{
    uint32_t n_out = 0;
    while (n_out < max && io->pend_n > 0) {
        out[n_out++] = io->pending[io->pend_head];
        io->pend_head = (io->pend_head + 1) % io->qd;
        io->pend_n--;
    }
    if (n_out > 0)
        wait = false;
    for (;;) {
        struct fetcher_io_op *done[64];
        uint32_t              n_done = io->ops->wait(io->be, done, 64, wait && n_out == 0);
        struct fetcher_io_op *restart[64];
        uint32_t              n_restart = 0;
        for (uint32_t i = 0; i < n_done; i++) {
            struct io_slot *s = &io->slots[done[i]->id];
            int64_t         res = done[i]->res;
            if (res > 0) {
                io_advance(s, (uint64_t)res);
                if (s->done >= s->need || s->op.n_iov == 0)
                    io_finish(io, s, 0, out, max, &n_out);
                else
                    restart[n_restart++] = &s->op; /* partial read: read the rest */
            } else if (res == 0) {
                io_finish(io, s, 0, out, max, &n_out); /* end of file before the need */
            } else if (res == -EINTR || res == -EAGAIN) {
                restart[n_restart++] = &s->op;
            } else if (res == -EINVAL && s->direct && s->done == 0) {
                /* The file system refuses O_DIRECT reads: read this file buffered from now. */
                struct io_file *f = &io->files[s->file];
                if (!io->warned_direct)
                    COMMON_LOG_WARN("fetcher.io", "O_DIRECT read refused path=%s; using buffered",
                                    f->path ? f->path : "?");
                io->warned_direct = true;
                f->direct = false;
                struct io_member mem[FETCHER_IO_MAX_IOV];
                bool             dir[FETCHER_IO_MAX_IOV];
                uint32_t         nm = s->n_members;
                for (uint32_t k = 0; k < nm; k++) {
                    mem[k] = s->m[k];
                    dir[k] = io_member_init(io, &mem[k]);
                }
                s->next_free = io->free_head;
                io->free_head = s->op.id;
                uint32_t k = 0;
                while (k < nm) { /* one buffered read per member */
                    if (io_start_members(io, mem + k, dir + k, 1) != COMMON_OK) {
                        struct fetcher_io_cqe c = {.user = mem[k].req.user,
                                                   .err = EIO,
                                                   .file = mem[k].req.file,
                                                   .offset = mem[k].req.offset,
                                                   .len = mem[k].req.len};
                        io_push_cqe(io, out, max, &n_out, &c);
                        io->in_flight--;
                    }
                    k++;
                }
            } else {
                io_finish(io, s, (int)-res, out, max, &n_out);
            }
        }
        if (n_restart > 0 && io->ops->start(io->be, restart, n_restart) != 0) {
            for (uint32_t i = 0; i < n_restart; i++)
                io_finish(io, &io->slots[restart[i]->id], EIO, out, max, &n_out);
        }
        if (n_out > 0 || !wait || n_done == 0)
            return n_out;
    }
}

void fetcher_io_wake(struct fetcher_io *io)
{
    io->ops->wake(io->be);
}

int fetcher_io_describe_error(const struct fetcher_io *io, const struct fetcher_io_cqe *c,
                              struct common_errmsg *e)
{
    const char *path = c->file < io->n_files && io->files[c->file].path ? io->files[c->file].path
                                                                        : "(unnamed file)";
    if (c->short_read)
        return common_errmsg_set(e, COMMON_EIO,
                                 "%s: read of %llu bytes at offset %llu failed: short read, the "
                                 "file ends before byte %llu",
                                 path, (unsigned long long)c->len, (unsigned long long)c->offset,
                                 (unsigned long long)(c->offset + c->len));
    return common_errmsg_set(
        e, COMMON_EIO, "%s: read of %llu bytes at offset %llu failed: %s (errno %d)", path,
        (unsigned long long)c->len, (unsigned long long)c->offset, strerror(c->err), c->err);
}
