/* common/proc.c - what daemons need about processes: a peer's liveness, random instance ids. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
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
