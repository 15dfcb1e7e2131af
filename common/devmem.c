/* common/devmem.c - device memory two processes share: the backend of the process (the host's
 * emulation when SLUICE_GPU_BACKEND=host, none when "none", otherwise CUDA's where built) and
 * the argument checks both backends share. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmem_impl.h"

static pthread_mutex_t              g_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct devmem_backend *g_be;     /* set once open succeeded */
static uint32_t                     g_opened; /* a bit per device opened */
static size_t                       g_gran;   /* theirs (the same for every one) */

static const struct devmem_backend *devmem_pick(const char **why)
{
    const char *v = getenv("SLUICE_GPU_BACKEND");
    if (v && strcmp(v, "host") == 0)
        return devmem_host_backend();
    if (v && strcmp(v, "none") == 0) {
        *why = "no device backend (SLUICE_GPU_BACKEND=none)";
        return NULL;
    }
#ifdef SLUICE_HAVE_CUDA
    return devmem_cuda_backend();
#else
    *why = "this sluice was built without CUDA (-DSLUICE_CUDA=OFF or no nvcc)";
    return NULL;
#endif
}

int common_devmem_open(int dev, struct common_errmsg *e)
{
    if (dev < 0 || dev >= 32)
        return common_errmsg_set(e, COMMON_EINVAL, "device %d: not a device number", dev);
    pthread_mutex_lock(&g_mu);
    int                          rc = COMMON_OK;
    const char                  *why = NULL;
    const struct devmem_backend *be = g_be ? g_be : devmem_pick(&why);
    size_t                       gran = 0;
    if (!be)
        rc = common_errmsg_set(e, COMMON_ENOTSUP, "%s", why);
    else if ((rc = be->open(dev, &gran, e)) == COMMON_OK && g_be && gran != g_gran)
        rc = common_errmsg_set(e, COMMON_ENOTSUP,
                               "device memory: device %d's granularity (%zu) is not the others' "
                               "(%zu)",
                               dev, gran, g_gran);
    else if (rc == COMMON_OK) {
        g_opened |= 1u << dev;
        if (!g_be) { /* written once: the lock-free readers of g_gran (after devmem_be) */
            g_be = be;
            g_gran = gran;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

int common_devmem_select(int dev, struct common_errmsg *e)
{
    pthread_mutex_lock(&g_mu);
    const struct devmem_backend *be =
        g_be && dev >= 0 && dev < 32 && (g_opened & 1u << dev) ? g_be : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!be)
        return common_devmem_open(dev, e);
    return be->select ? be->select(dev, e) : COMMON_OK;
}

/* The backend once open (open's store is seen by any thread that later uses what it made). */
static const struct devmem_backend *devmem_be(struct common_errmsg *e)
{
    pthread_mutex_lock(&g_mu);
    const struct devmem_backend *be = g_be;
    pthread_mutex_unlock(&g_mu);
    if (!be)
        common_errmsg_set(e, COMMON_EINVAL, "device memory: common_devmem_open was not called");
    return be;
}

const char *common_devmem_backend(void)
{
    const struct devmem_backend *be = devmem_be(NULL);
    return be ? be->name : NULL;
}

size_t common_devmem_granularity(void)
{
    return devmem_be(NULL) ? g_gran : 0;
}

static int devmem_check_size(size_t bytes, struct common_errmsg *e)
{
    if (bytes == 0 || bytes % g_gran != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "device memory: %zu bytes is not a positive multiple of the "
                                 "granularity (%zu)",
                                 bytes, g_gran);
    return COMMON_OK;
}

void *common_devmem_reserve(size_t bytes, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    if (!be || devmem_check_size(bytes, e) != COMMON_OK)
        return NULL;
    return be->reserve(bytes, e);
}

void common_devmem_unreserve(void *base, size_t bytes)
{
    const struct devmem_backend *be = devmem_be(NULL);
    if (be && base)
        be->unreserve(base, bytes);
}

int common_devmem_piece_create(size_t bytes, struct common_devmem_piece **out,
                               struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    if (!be)
        return COMMON_EINVAL;
    int rc = devmem_check_size(bytes, e);
    return rc != COMMON_OK ? rc : be->piece_create(bytes, out, e);
}

/* The backend, and *h emptied for an export to fill (no descriptor, no bytes). */
static const struct devmem_backend *devmem_handle_out(struct common_devmem_handle *h,
                                                      struct common_errmsg        *e)
{
    memset(h, 0, sizeof(*h));
    h->fd = -1;
    return devmem_be(e);
}

int common_devmem_piece_export(const struct common_devmem_piece *p, struct common_devmem_handle *h,
                               struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_handle_out(h, e);
    return be ? be->piece_export(p, h, e) : COMMON_EINVAL;
}

/* Closes what a handle carries that its import did not take. */
static void devmem_handle_drop(struct common_devmem_handle *h)
{
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
}

int common_devmem_piece_import(struct common_devmem_handle *h, size_t bytes,
                               struct common_devmem_piece **out, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    int                          rc = be ? devmem_check_size(bytes, e) : COMMON_EINVAL;
    if (rc == COMMON_OK && h->fd < 0)
        rc = common_errmsg_set(e, COMMON_EINVAL, "device memory: the handle has no descriptor");
    if (rc != COMMON_OK) {
        devmem_handle_drop(h);
        return rc;
    }
    int fd = h->fd;
    h->fd = -1;
    return be->piece_import(fd, bytes, out, e); /* takes fd */
}

int common_devmem_piece_map(struct common_devmem_piece *p, void *at, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    if (!be)
        return COMMON_EINVAL;
    if (!at || (uintptr_t)at % g_gran != 0)
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "device memory: %p is not aligned to the granularity (%zu)", at,
                                 g_gran);
    return be->piece_map(p, at, e);
}

void common_devmem_piece_destroy(struct common_devmem_piece *p)
{
    const struct devmem_backend *be = devmem_be(NULL);
    if (be && p)
        be->piece_destroy(p);
}

size_t common_devmem_piece_bytes(const struct common_devmem_piece *p)
{
    const struct devmem_backend *be = devmem_be(NULL);
    return be && p ? be->piece_bytes(p) : 0;
}

int common_devmem_copy_async(void *dst, const void *src, size_t bytes, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    if (!be)
        return COMMON_EINVAL;
    return bytes == 0 ? COMMON_OK : be->copy_async(dst, src, bytes, e);
}

int common_devmem_host_register(const void *p, size_t bytes, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    if (!be)
        return COMMON_EINVAL;
    if (!p || !bytes)
        return common_errmsg_set(e, COMMON_EINVAL, "registering host memory: nothing to register");
    return be->host_register(p, bytes, e);
}

void common_devmem_host_unregister(const void *p)
{
    const struct devmem_backend *be = devmem_be(NULL);
    if (be && p)
        be->host_unregister(p);
}

bool common_devmem_copy_time(uint64_t *busy_ns)
{
    const struct devmem_backend *be = devmem_be(NULL);
    *busy_ns = be ? be->copy_busy_ns() : 0;
    return be != NULL;
}

int common_devmem_event_create(struct common_devmem_event **out, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    return be ? be->event_create(out, e) : COMMON_EINVAL;
}

int common_devmem_event_export(const struct common_devmem_event *ev, struct common_devmem_handle *h,
                               struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_handle_out(h, e);
    return be ? be->event_export(ev, h, e) : COMMON_EINVAL;
}

int common_devmem_event_import(struct common_devmem_handle *h, struct common_devmem_event **out,
                               struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    int                          rc = COMMON_EINVAL;
    if (be && h->len > COMMON_DEVMEM_BLOB)
        common_errmsg_set(e, COMMON_EINVAL, "device event: a handle of %u bytes (at most %d)",
                          h->len, COMMON_DEVMEM_BLOB);
    else if (be)
        rc = be->event_import(h, out, e);
    devmem_handle_drop(h);
    return rc;
}

int common_devmem_event_record(struct common_devmem_event *ev, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    return be ? be->event_record(ev, e) : COMMON_EINVAL;
}

int common_devmem_event_wait(struct common_devmem_event *ev, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    return be ? be->event_wait(ev, e) : COMMON_EINVAL;
}

int common_devmem_event_sync(struct common_devmem_event *ev, struct common_errmsg *e)
{
    const struct devmem_backend *be = devmem_be(e);
    return be ? be->event_sync(ev, e) : COMMON_EINVAL;
}

bool common_devmem_event_is_done(struct common_devmem_event *ev)
{
    const struct devmem_backend *be = devmem_be(NULL);
    return !be || be->event_is_done(ev);
}

void common_devmem_event_destroy(struct common_devmem_event *ev)
{
    const struct devmem_backend *be = devmem_be(NULL);
    if (be && ev)
        be->event_destroy(ev);
}

void *common_devmem_event_native(struct common_devmem_event *ev)
{
    const struct devmem_backend *be = devmem_be(NULL);
    return be && ev ? be->event_native(ev) : NULL;
}

/* A handle on the wire. */
#define DEVMEM_WIRE_MAGIC 0x48444d53u /* "SMDH" read as a little-endian u32 */
struct devmem_wire {
    uint32_t magic, has_fd, len, pad;
    uint64_t tag;
    uint8_t  blob[COMMON_DEVMEM_BLOB];
};

int common_devmem_handle_send(int sock, const struct common_devmem_handle *h, uint64_t tag)
{
    if (h->len > COMMON_DEVMEM_BLOB)
        return COMMON_EINVAL;
    struct devmem_wire w = {
        .magic = DEVMEM_WIRE_MAGIC, .has_fd = h->fd >= 0, .len = h->len, .tag = tag};
    memcpy(w.blob, h->blob, h->len);
    return common_fd_send_bytes(sock, h->fd, &w, sizeof(w));
}

int common_devmem_handle_recv(int sock, struct common_devmem_handle *h, uint64_t *tag,
                              int timeout_ms)
{
    struct devmem_wire w;
    int                fd = -1;
    int                rc = common_fd_recv_bytes(sock, &fd, &w, sizeof(w), timeout_ms);
    if (rc != COMMON_OK)
        return rc;
    if (w.magic != DEVMEM_WIRE_MAGIC || w.len > COMMON_DEVMEM_BLOB || w.has_fd > 1 ||
        (w.has_fd == 1) != (fd >= 0)) {
        if (fd >= 0)
            close(fd);
        return COMMON_EPROTO;
    }
    memset(h, 0, sizeof(*h));
    h->fd = fd;
    h->len = w.len;
    memcpy(h->blob, w.blob, w.len);
    *tag = w.tag;
    return COMMON_OK;
}
