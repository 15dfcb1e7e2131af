/* common/fdpass.c - Unix stream sockets of this user, and descriptors passed over them. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"

static int fdpass_addr(const char *path, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(a->sun_path))
        return COMMON_EINVAL;
    memcpy(a->sun_path, path, n + 1);
    return COMMON_OK;
}

/* Waits until `fd` is readable; 0, COMMON_ETIMEDOUT or COMMON_EIO. */
static int fdpass_wait(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        int r = poll(&p, 1, timeout_ms);
        if (r > 0)
            return COMMON_OK;
        if (r == 0)
            return COMMON_ETIMEDOUT;
        if (errno != EINTR)
            return COMMON_EIO;
    }
}

int common_unix_connect(const char *path, int *fd)
{
    struct sockaddr_un a;
    if (fdpass_addr(path, &a) != COMMON_OK)
        return COMMON_EINVAL;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return COMMON_EIO;
    if (connect(s, (const struct sockaddr *)&a, sizeof(a)) != 0) {
        int err = errno;
        close(s);
        return err == ENOENT || err == ECONNREFUSED ? COMMON_ENOENT : COMMON_EIO;
    }
    *fd = s;
    return COMMON_OK;
}

int common_unix_listen(const char *path, int *fd)
{
    struct sockaddr_un a;
    if (fdpass_addr(path, &a) != COMMON_OK)
        return COMMON_EINVAL;
    int probe;
    if (common_unix_connect(path, &probe) == COMMON_OK) {
        close(probe);
        return COMMON_EBUSY; /* somebody live listens there */
    }
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return COMMON_EBUSY; /* not ours to remove */
        (void)unlink(path);
    }
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return COMMON_EIO;
    mode_t old = umask(0177);
    int    rc = bind(s, (const struct sockaddr *)&a, sizeof(a));
    umask(old);
    if (rc != 0 || chmod(path, 0600) != 0 || listen(s, 16) != 0) {
        close(s);
        return COMMON_EIO;
    }
    *fd = s;
    return COMMON_OK;
}

int common_unix_accept(int listen_fd, int timeout_ms, int *conn)
{
    for (;;) {
        int rc = fdpass_wait(listen_fd, timeout_ms);
        if (rc != COMMON_OK)
            return rc;
        int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)
                continue;
            return COMMON_EIO;
        }
        struct ucred cr;
        socklen_t    len = sizeof(cr);
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || cr.uid != geteuid()) {
            close(c);
            continue;
        }
        *conn = c;
        return COMMON_OK;
    }
}

/* One message of `len` bytes, with descriptor fd when fd >= 0. */
int common_fd_send_bytes(int sock, int fd, const void *data, size_t len)
{
    union {
        char           buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec  iov = {.iov_base = (void *)(uintptr_t)data, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t n;
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)len ? COMMON_OK : COMMON_EIO;
}

int common_fd_send(int sock, int fd, uint64_t tag)
{
    return fd < 0 ? COMMON_EINVAL : common_fd_send_bytes(sock, fd, &tag, sizeof(tag));
}

int common_fd_recv_bytes(int sock, int *fd, void *buf, size_t len, int timeout_ms)
{
    int rc = fdpass_wait(sock, timeout_ms);
    if (rc != COMMON_OK)
        return rc;
    union {
        char           buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } ctl;
    struct iovec  iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    ssize_t       n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return COMMON_EIO;
    int got = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int d;
            memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (got < 0)
                got = d;
            else
                close(d); /* one descriptor is expected: close extras */
        }
    }
    if (n == 0 && got < 0)
        return COMMON_ECLOSED;
    if (n != (ssize_t)len || (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
        if (got >= 0)
            close(got);
        return COMMON_EPROTO;
    }
    *fd = got;
    return COMMON_OK;
}

int common_fd_recv(int sock, int *fd, uint64_t *tag, int timeout_ms)
{
    uint64_t t = 0;
    int      got = -1;
    int      rc = common_fd_recv_bytes(sock, &got, &t, sizeof(t), timeout_ms);
    if (rc != COMMON_OK)
        return rc;
    if (got < 0)
        return COMMON_EPROTO;
    *fd = got;
    *tag = t;
    return COMMON_OK;
}
