/* fetcher/read.c - blocking reads of model spans with pread (the fallback I/O path). */
#include "fetcher.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int fetcher_read_span(const struct common_gguf *g, const struct common_span *span, void *dst,
                      struct common_errmsg *e)
{
    int      fd = common_gguf_split_fd(g, span->split);
    uint8_t *p = dst;
    uint64_t off = span->offset;
    uint64_t left = span->size;
    if (fd < 0)
        return common_errmsg_set(e, COMMON_EINVAL, "split %u has no open file", span->split);
    while (left > 0) {
        size_t  want = left > (1u << 30) ? (1u << 30) : (size_t)left;
        ssize_t r = pread(fd, p, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return common_errmsg_set(
                e, COMMON_EIO, "%s: read of %zu bytes at offset %llu failed: %s",
                common_gguf_split_path(g, span->split), want, (unsigned long long)off,
                r < 0 ? strerror(errno) : "end of file");
        p += r;
        off += (uint64_t)r;
        left -= (uint64_t)r;
    }
    return COMMON_OK;
}
