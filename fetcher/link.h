/* fetcher/link.h - one executor link of the fetcher daemon: ring pair, reader, replies, loans. */
#ifndef FETCHER_LINK_H
#define FETCHER_LINK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "fetcher.h"
#include "proto.h"

/* What a link borrows from the service that owns it; filled once before the first link and
 * read-only afterwards (except *c, under *mu). */
struct fetcher_link_host {
    struct fetcher              *f;          /* borrowed: the fetcher that serves the ACQUIREs */
    const struct common_model   *m;          /* borrowed: spans of the parts, for reply sizes */
    const uint8_t               *pool_base;  /* borrowed: the fetcher's pool mapping */
    uint64_t                     pool_bytes; /* length of that mapping */
    uint32_t                     n_slots;    /* pool slots: loan ids are below this */
    uint32_t                     n_layer;    /* layers of the model */
    uint32_t                     first;      /* first expert of this shard */
    uint32_t                     n_exp;      /* experts of this shard */
    uint32_t                     first_layer, n_layers; /* of its layers */
    const char                  *run_dir;               /* borrowed: where the ring segments live */
    pthread_mutex_t             *mu; /* borrowed: guards *c and every link's loans */
    struct fetcher_serve_counts *c;  /* borrowed: data-plane counters, under *mu */
    /* DEVICE_LAYERS(n): the executor keeps n layers' KV on a device (NULL: ignored). On the
     * reader thread, without *mu. */
    void (*device_layers)(void *arg, uint32_t n);
    void *device_layers_arg;
    /* DEV_COPY, DEV_MARK, DEV_WAIT (the device pool's records): on the reader thread, without
     * *mu. NULL: counted as bad records. */
    void (*dev_record)(void *arg, const struct proto_fetch_req *r);
    void *dev_record_arg;
};

/* One executor's ring pair and the loans it holds. Shared: the service holds one reference,
 * each ACQUIRE being answered holds another; the last one frees the link. Opaque. */
struct fetcher_link;

/* Maps the two ring segments named by ATTACH `a` (records of proto_fetch_req in segments[0],
 * replies in segments[1], params[0] slots each) and makes a link over them holding one
 * reference, its reader not started. Returns 0, COMMON_EINVAL (bad ring size), COMMON_ENOENT /
 * COMMON_EIO (a segment), COMMON_ECORRUPT (a segment is not the ring announced), COMMON_ENOMEM;
 * e says what. `h` must outlive the link. */
int fetcher_link_create(const struct fetcher_link_host *h, const struct proto_attach *a,
                        struct fetcher_link **out, struct common_errmsg *e);

/* Starts the link's reader thread, which serves the records until the link is dropped, the
 * executor dies or a ring is corrupt. Returns 0 or COMMON_EAGAIN (no thread). */
int fetcher_link_start(struct fetcher_link *l);

/* Stops the reader, releases every loan the link holds, stops its replies and drops the
 * caller's reference (the link is freed once the ACQUIREs in flight are answered). Accepts NULL.
 * Takes h->mu: call without it. */
void fetcher_link_drop(struct fetcher_link *l);

/* True while the link serves (not dropped, its executor alive, its rings sound). */
bool fetcher_link_is_live(const struct fetcher_link *l);

/* The executor's pid from ATTACH (0 = not told). */
uint32_t fetcher_link_pid(const struct fetcher_link *l);

/* Loans the link holds now. Call with h->mu held. */
uint64_t fetcher_link_pins(const struct fetcher_link *l);

#endif /* FETCHER_LINK_H */
