/* fetcher/devpool.h - private to fetcher/: the fetcher's device expert pool (DESIGN section 8). */
#ifndef FETCHER_DEVPOOL_H
#define FETCHER_DEVPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "proto.h"

/* The device pool a fetcher started with --vram-budget makes for its executor: it listens on the
 * Unix socket "fetcher-<i>.dev" (proto.h: the device pool's messages), makes the pool's memory
 * and events with common_devmem when an executor asks, hands their handles over, and runs the
 * copies, marks and waits the executor's ring records ask for on its own copy stream, from its
 * RAM pool. One executor at a time; its pool ends when its connection closes. */
struct fetcher_devpool;

struct fetcher_devpool_counts {
    uint64_t opens;        /* pools made */
    uint64_t refused;      /* OPENs refused (budget, no device, bad message) */
    uint64_t pieces;       /* pieces of device memory made and handed over */
    uint64_t copies;       /* DEV_COPYs queued */
    uint64_t copied_bytes; /* their bytes */
    uint64_t marks;        /* DEV_MARKs recorded */
    uint64_t waits;        /* DEV_WAITs queued */
    uint64_t bad;          /* device records refused (no pool, out of range, device error) */
    uint64_t bytes;        /* the open pool's device memory mapped now */
    uint64_t copy_busy_ns; /* the copy stream's time copying (this process's, all pools) */
    bool     open;         /* a pool is open now */
    bool     pinned;       /* the RAM pool is registered with the device as pinned memory */
};

/* Listens on `path` for an executor; its copies read [pool_base, pool_base + pool_bytes) (the RAM
 * pool's mapping, borrowed). budget: the most device memory a pool may reserve. Returns 0 or a
 * negative common_err (e says what). */
int fetcher_devpool_start(const char *path, uint64_t budget, const uint8_t *pool_base,
                          uint64_t pool_bytes, struct fetcher_devpool **out,
                          struct common_errmsg *e);
/* Stops listening, drops the pool (its copies waited for), removes the socket file. Accepts
 * NULL. */
void fetcher_devpool_stop(struct fetcher_devpool *d);

/* One DEV_COPY, DEV_MARK or DEV_WAIT record of the link's ring (on the link's reader thread):
 * queued on the copy stream. Returns 0, or COMMON_EINVAL (no pool, a range outside it or the RAM
 * pool, a bad event) or COMMON_EDEVICE (counted as bad; the executor sees its mark never come). */
int fetcher_devpool_record(struct fetcher_devpool *d, const struct proto_fetch_req *r);

void fetcher_devpool_counts(struct fetcher_devpool *d, struct fetcher_devpool_counts *out);

#endif /* FETCHER_DEVPOOL_H */
