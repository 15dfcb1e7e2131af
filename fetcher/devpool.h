/* fetcher/devpool.h - private to fetcher/: the fetcher's device expert pool (DESIGN section 8). */
#ifndef FETCHER_DEVPOOL_H
#define FETCHER_DEVPOOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "fetcher.h"
#include "proto.h"

/* The device pool a fetcher started with --vram-budget makes for its executor: it listens on the
 * Unix socket "fetcher-<i>.dev" (proto.h: the device pool's messages), makes the pool's memory
 * and events with common_devmem when an executor asks, hands their handles over, and runs the
 * copies, marks and waits the executor's ring records ask for on its own copy stream, from its
 * RAM pool. One executor at a time; its pool ends when its connection closes. */
/* The RAM pool's registration with the device, shared by the pools of one fetcher
 * (--device-pools): the first pool opened registers it (portably: for every device), and the
 * fetcher unregisters it (fetcher_devpool_unpin) once every pool has stopped. */
struct fetcher_devpool_pin {
    pthread_mutex_t mu;
    bool            pinned;
};
void fetcher_devpool_unpin(struct fetcher_devpool_pin *p, const void *ram);

struct fetcher_devpool_opts {
    const char    *path;      /* the socket to listen on */
    uint64_t       budget;    /* the most device memory a pool may reserve */
    const uint8_t *ram;       /* borrowed: the RAM pool's mapping, DEV_COPY's source */
    uint64_t       ram_bytes; /* its bytes */
    /* Borrowed, or NULL: the fetcher whose model (layout, files, checks) DEV_READ reads into
     * FETCHER_DEVPOOL_STAGE_SLOTS pinned staging slots of its plan's slot size (the pool then
     * stages: PROTO_DEVPOOL_STAGES). Must outlive the pool. */
    struct fetcher *stage_from;
    /* Borrowed, or NULL (the pool registers and unregisters the RAM pool itself): shared with
     * the fetcher's other pools. */
    struct fetcher_devpool_pin *pin;
    bool select; /* one of several pools: each record first selects the pool's device */
};

/* Listens on o->path for an executor. Returns 0 or a negative common_err (e says what). */
int fetcher_devpool_start(const struct fetcher_devpool_opts *o, struct fetcher_devpool **out,
                          struct common_errmsg *e);
/* fetcher_devpool_stop (fetcher.h) stops listening, drops the pool (its copies waited for) and
 * removes the socket file. */

/* One DEV_COPY, DEV_MARK, DEV_WAIT or DEV_READ record of the link's ring (on the link's reader
 * thread): queued on the copy stream. DEV_READs are gathered and their bundles read together (at
 * the I/O engine's depth) before the next other record, or when the staging slots run out. A
 * copy, read or wait refused or failed is told by the next mark (the control page's failure
 * word). Returns 0, or COMMON_EINVAL (no pool, a range outside it or the RAM pool, a bad event, a
 * pool that does not stage) or COMMON_EDEVICE (counted as bad). */
int fetcher_devpool_record(struct fetcher_devpool *d, const struct proto_fetch_req *r);

#endif /* FETCHER_DEVPOOL_H */
