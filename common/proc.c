/* common/proc.c - what daemons need about processes: liveness, ids, run directory, pid files. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "common.h"

bool common_pid_gone(uint32_t pid)
{
    if (pid == 0 || pid > (uint32_t)INT_MAX)
        return false; /* not told, or not a pid: nothing can be said */
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH; /* EPERM: it exists, under another user */
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
    return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

uint64_t common_random_id(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
        v = common_now_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

int common_run_dir_prepare(const char *dir, struct common_errmsg *e)
{
    struct stat st;
    if (!dir || !*dir)
        return common_errmsg_set(e, COMMON_EINVAL, "no run directory given");
    if (lstat(dir, &st) != 0) {
        if (errno != ENOENT)
            return common_errmsg_set(e, common_err_from_errno(errno), "run dir %s: %s", dir,
                                     strerror(errno));
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return common_errmsg_set(e, common_err_from_errno(errno),
                                     "run dir %s: cannot create: %s", dir, strerror(errno));
        if (lstat(dir, &st) != 0)
            return common_errmsg_set(e, common_err_from_errno(errno), "run dir %s: %s", dir,
                                     strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return common_errmsg_set(e, COMMON_EINVAL, "run dir %s: not a directory%s", dir,
                                 S_ISLNK(st.st_mode) ? " (a symbolic link)" : "");
    if (st.st_uid != geteuid())
        return common_errmsg_set(e, COMMON_EINVAL, "run dir %s: owned by uid %u, not by this user",
                                 dir, (unsigned)st.st_uid);
    if ((st.st_mode & 077) != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "run dir %s: must have mode 0700 (it has %04o): other users could "
                                 "reach the daemons' sockets and segments",
                                 dir, (unsigned)(st.st_mode & 07777));
    return COMMON_OK;
}

/* True for a plain file name (no '/', not "." or ".."). */
static bool proc_name_ok(const char *name)
{
    return name && *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

int common_pid_file_write(const char *dir, const char *name, struct common_errmsg *e)
{
    char tmp[NAME_MAX + 1];
    if (!proc_name_ok(name) ||
        (size_t)snprintf(tmp, sizeof(tmp), ".%s.%ld.tmp", name, (long)getpid()) >= sizeof(tmp))
        return common_errmsg_set(e, COMMON_EINVAL, "pid file name '%s' unusable", name ? name : "");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return common_errmsg_set(e, COMMON_EIO, "%s: %s", dir, strerror(errno));
    int rc = COMMON_OK;
    (void)unlinkat(dfd, tmp, 0); /* a leftover of a crashed process of the same pid */
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = common_errmsg_set(e, COMMON_EIO, "%s/%s: %s", dir, tmp, strerror(errno));
        goto out_close_dir;
    }
    char buf[32];
    int  len = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
    bool ok = write(fd, buf, (size_t)len) == (ssize_t)len;
    ok = close(fd) == 0 && ok;
    if (!ok || renameat(dfd, tmp, dfd, name) != 0) {
        rc =
            common_errmsg_set(e, COMMON_EIO, "%s/%s: cannot write: %s", dir, name, strerror(errno));
        (void)unlinkat(dfd, tmp, 0);
    }
out_close_dir:
    close(dfd);
    return rc;
}

void common_pid_file_remove(const char *dir, const char *name)
{
    if (!dir || !proc_name_ok(name))
        return;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        char    buf[32];
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (strtol(buf, NULL, 10) == (long)getpid())
            (void)unlinkat(dfd, name, 0);
    }
    close(dfd);
}

const void *common_unmapped_page(const void *p, size_t bytes)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    const uintptr_t lo = a & ~(page - 1), hi = (a + bytes + page - 1) & ~(page - 1);
    unsigned char   vec[64];
    for (uintptr_t at = lo; at < hi;) { /* mincore fails with ENOMEM on an unmapped page */
        const uintptr_t n = hi - at < 64 * page ? hi - at : 64 * page;
        if (mincore((void *)at, (size_t)n, vec) != 0)
            return (const void *)at;
        at += n;
    }
    return NULL;
}
