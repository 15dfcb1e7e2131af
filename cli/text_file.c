/* cli/text_file.c - texts given with -f (prompts, perplexity corpora): read whole and bounded. */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int cli_text_file_read(const char *prog, const char *path, size_t max_bytes, char **text,
                       size_t *len)
{
    char lim[32], got[32];
    /* O_NONBLOCK: opening a FIFO without a writer must not block; refused below anyway. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        cli_error(prog, "cannot open '%s': %s", path, strerror(err));
        return err == ENOENT ? COMMON_ENOENT : COMMON_EIO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cli_error(prog, "'%s' is not a regular file (FIFOs and devices are not read)", path);
        close(fd);
        return COMMON_EINVAL;
    }
    common_format_size(max_bytes, lim, sizeof(lim));
    if ((uint64_t)st.st_size > max_bytes) {
        cli_error(prog, "'%s' is larger than %s (%s)", path, lim,
                  common_format_size((uint64_t)st.st_size, got, sizeof(got)));
        close(fd);
        return COMMON_ERANGE;
    }
    /* Read up to one byte past the bound: the file may have grown since fstat. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    char  *buf = malloc(cap + 1);
    int    rc = buf ? COMMON_OK : COMMON_ENOMEM;
    while (rc == COMMON_OK) {
        if (n == cap) {
            if (cap > max_bytes) {
                cli_error(prog, "'%s' is larger than %s", path, lim);
                rc = COMMON_ERANGE;
                break;
            }
            size_t grow = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            char  *p = realloc(buf, grow + 1);
            if (!p) {
                rc = COMMON_ENOMEM;
                break;
            }
            buf = p;
            cap = grow;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            cli_error(prog, "cannot read '%s': %s", path, strerror(errno));
            rc = COMMON_EIO;
        } else if (r == 0) {
            break;
        } else {
            n += (size_t)r;
        }
    }
    close(fd);
    if (rc == COMMON_ENOMEM)
        cli_error(prog, "out of memory reading '%s'", path);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return COMMON_OK;
}
