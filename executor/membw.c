/* executor/membw.c - measures main-memory streaming read bandwidth with the pool's threads. */
#include "executor.h"

#include <stdlib.h>
#include <string.h>

#define MEMBW_DEFAULT_BYTES (1ull << 30)
#define MEMBW_PIECE_BYTES   (1u << 20) /* bytes per work item */

struct membw_job {
    const uint64_t *buf;      /* borrowed */
    uint64_t        sum[256]; /* per thread, so the reads cannot be optimised away */
};

static void membw_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    struct membw_job *j = arg;
    const size_t      w = MEMBW_PIECE_BYTES / sizeof(uint64_t);
    uint64_t          a = 0, b = 0, c = 0, d = 0;
    for (int64_t p = i0; p < i1; p++) {
        const uint64_t *s = j->buf + (size_t)p * w;
        for (size_t i = 0; i < w; i += 8) {
            a += s[i] ^ s[i + 4];
            b += s[i + 1] ^ s[i + 5];
            c += s[i + 2] ^ s[i + 6];
            d += s[i + 3] ^ s[i + 7];
        }
    }
    j->sum[ith & 255] += a + b + c + d;
}

int executor_membw_measure(const struct executor_membw_opts *o, double *bytes_per_s)
{
    struct executor_membw_opts def = {0};
    if (!o)
        o = &def;
    uint64_t bytes = o->bytes ? o->bytes : MEMBW_DEFAULT_BYTES;
    bytes = bytes / MEMBW_PIECE_BYTES * MEMBW_PIECE_BYTES;
    if (bytes == 0)
        bytes = MEMBW_PIECE_BYTES;
    uint32_t  reps = o->reps ? o->reps : 5;
    uint64_t *buf = aligned_alloc(4096, (size_t)bytes);
    if (!buf)
        return COMMON_ENOMEM;
    /* Touch every page (and give the words distinct values) before timing. */
    for (size_t i = 0; i < bytes / sizeof(uint64_t); i++)
        buf[i] = i * 0x9e3779b97f4a7c15ull;
    struct membw_job *j = calloc(1, sizeof(*j));
    if (!j) {
        free(buf);
        return COMMON_ENOMEM;
    }
    j->buf = buf;
    const int64_t n = (int64_t)(bytes / MEMBW_PIECE_BYTES);
    double        best = 0.0;
    for (uint32_t r = 0; r <= reps; r++) {
        uint64_t t0 = common_now_ns();
        executor_threadpool_for(o->pool, n, 16, membw_piece, j);
        uint64_t dt = common_now_ns() - t0;
        double   bw = (double)bytes / ((double)dt * 1e-9);
        if (r > 0 && bw > best) /* pass 0 warms up the threads and the TLB */
            best = bw;
    }
    free(j);
    free(buf);
    *bytes_per_s = best;
    return 0;
}
