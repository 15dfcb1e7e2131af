/* common/devmem_impl.h - private to common/: the backends behind common/devmem.c's functions. */
#ifndef COMMON_DEVMEM_IMPL_H
#define COMMON_DEVMEM_IMPL_H

#include "common.h"

/* One backend of the device memory interface (common.h, "Device memory two processes share").
 * common/devmem.c checks the arguments both backends share (open first, sizes multiples of the
 * granularity, handles' lengths) before it calls them. */
struct devmem_backend {
    const char *name;
    int (*open)(int dev, size_t *granularity, struct common_errmsg *e);
    /* Makes device dev, opened before, the calling thread's again (NULL: nothing to do). */
    int (*select)(int dev, struct common_errmsg *e);
    void *(*reserve)(size_t bytes, struct common_errmsg *e);
    void (*unreserve)(void *base, size_t bytes);
    int (*piece_create)(size_t bytes, struct common_devmem_piece **out, struct common_errmsg *e);
    int (*piece_export)(const struct common_devmem_piece *p, struct common_devmem_handle *h,
                        struct common_errmsg *e);
    int (*piece_import)(int fd, size_t bytes, struct common_devmem_piece **out,
                        struct common_errmsg *e);
    int (*piece_map)(struct common_devmem_piece *p, void *at, struct common_errmsg *e);
    void (*piece_destroy)(struct common_devmem_piece *p);
    size_t (*piece_bytes)(const struct common_devmem_piece *p);
    int (*copy_async)(void *dst, const void *src, size_t bytes, struct common_errmsg *e);
    uint64_t (*copy_busy_ns)(void);
    int (*host_register)(const void *p, size_t bytes, struct common_errmsg *e);
    void (*host_unregister)(const void *p);
    int (*event_create)(struct common_devmem_event **out, struct common_errmsg *e);
    int (*event_export)(const struct common_devmem_event *ev, struct common_devmem_handle *h,
                        struct common_errmsg *e);
    int (*event_import)(struct common_devmem_handle *h, struct common_devmem_event **out,
                        struct common_errmsg *e);
    int (*event_record)(struct common_devmem_event *ev, struct common_errmsg *e);
    int (*event_wait)(struct common_devmem_event *ev, struct common_errmsg *e);
    int (*event_sync)(struct common_devmem_event *ev, struct common_errmsg *e);
    bool (*event_is_done)(struct common_devmem_event *ev);
    void (*event_destroy)(struct common_devmem_event *ev);
    void *(*event_native)(struct common_devmem_event *ev);
};

/* The host's emulation (common/devmem_host.c). */
const struct devmem_backend *devmem_host_backend(void);
/* CUDA's (common/devmem_cuda.c), in builds with CUDA. */
const struct devmem_backend *devmem_cuda_backend(void);

#endif /* COMMON_DEVMEM_IMPL_H */
