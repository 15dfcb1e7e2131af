/* common/devmem_cuda.c - shared device memory on CUDA: virtual memory management with POSIX
 * descriptors as shareable handles, interprocess events (cudaIpc), and a copy stream of the
 * process's own. The driver's cuMem* functions are found through the runtime
 * (cudaGetDriverEntryPointByVersion), so nothing links libcuda and a machine without a driver
 * still runs the binary. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "devmem_impl.h"

_Static_assert(sizeof(cudaIpcEventHandle_t) <= COMMON_DEVMEM_BLOB, "an event handle fits a blob");

static struct {
    PFN_cuMemGetAllocationGranularity_v10020  granularity;
    PFN_cuMemAddressReserve_v10020            reserve;
    PFN_cuMemAddressFree_v10020               addr_free;
    PFN_cuMemCreate_v10020                    create;
    PFN_cuMemRelease_v10020                   release;
    PFN_cuMemMap_v10020                       map;
    PFN_cuMemUnmap_v10020                     unmap;
    PFN_cuMemSetAccess_v10020                 access;
    PFN_cuMemExportToShareableHandle_v10020   export_fd;
    PFN_cuMemImportFromShareableHandle_v10020 import_fd;
    PFN_cuDeviceGet_v2000                     device;
    PFN_cuDeviceGetAttribute_v2000            attribute;
    PFN_cuGetErrorName_v6000                  error_name; /* NULL: the driver has none */
} g_cu;
#define CUDA_MAX_DEVICES 32 /* as common_devmem_open's device numbers */
/* The copy streams, one per device opened (made by cuda_open, under devmem.c's lock): a stream
 * and the events recorded on it must be of the same device. */
static cudaStream_t      g_streams[CUDA_MAX_DEVICES];
static _Atomic int       g_dev0 = -1; /* the first device opened (the process's default) */
static _Thread_local int t_dev = -1;  /* the calling thread's device: the last it opened */

/* The calling thread's device, made current for CUDA: the last it opened, else the first the
 * process opened (a fetcher opens its one device on one thread and copies on others). */
static int cuda_here(void)
{
    const int d0 = atomic_load(&g_dev0);
    if (t_dev < 0 && d0 >= 0 && cudaSetDevice(d0) == cudaSuccess)
        t_dev = d0;
    return t_dev < 0 ? 0 : t_dev;
}

/* The calling thread's device's copy stream (its device opened before: see cuda_open). */
static cudaStream_t cuda_stream(void)
{
    return g_streams[cuda_here()];
}

static int cuda_fail(struct common_errmsg *e, cudaError_t err, const char *what)
{
    return common_errmsg_set(e, COMMON_EDEVICE, "device memory: %s: %s", what,
                             cudaGetErrorString(err));
}

static int cu_fail(struct common_errmsg *e, CUresult r, const char *what)
{
    const char *name = NULL;
    if (!g_cu.error_name || g_cu.error_name(r, &name) != CUDA_SUCCESS || !name)
        name = "an error";
    return common_errmsg_set(e, r == CUDA_ERROR_OUT_OF_MEMORY ? COMMON_ENOMEM : COMMON_EDEVICE,
                             "device memory: %s failed: %s (CUresult %d)", what, name, (int)r);
}

static CUmemAllocationProp cuda_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = cuda_here();
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

static int cuda_load(struct common_errmsg *e)
{
    const struct {
        const char *name;
        void      **fn;
    } t[] = {
        {"cuMemGetAllocationGranularity", (void **)&g_cu.granularity},
        {"cuMemAddressReserve", (void **)&g_cu.reserve},
        {"cuMemAddressFree", (void **)&g_cu.addr_free},
        {"cuMemCreate", (void **)&g_cu.create},
        {"cuMemRelease", (void **)&g_cu.release},
        {"cuMemMap", (void **)&g_cu.map},
        {"cuMemUnmap", (void **)&g_cu.unmap},
        {"cuMemSetAccess", (void **)&g_cu.access},
        {"cuMemExportToShareableHandle", (void **)&g_cu.export_fd},
        {"cuMemImportFromShareableHandle", (void **)&g_cu.import_fd},
        {"cuDeviceGet", (void **)&g_cu.device},
        {"cuDeviceGetAttribute", (void **)&g_cu.attribute},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(t[i].name, t[i].fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*t[i].fn)
            return common_errmsg_set(e, COMMON_ENOTSUP, "device memory: the CUDA driver has no %s",
                                     t[i].name);
    }
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuGetErrorName", (void **)&g_cu.error_name, 6000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
        g_cu.error_name = NULL; /* messages give the number alone */
    return COMMON_OK;
}

static int cuda_open(int dev, size_t *granularity, struct common_errmsg *e)
{
    int         n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0)
        return common_errmsg_set(e, COMMON_ENOTSUP, "device memory: no CUDA device (%s)",
                                 err != cudaSuccess ? cudaGetErrorString(err) : "none found");
    if (dev >= n)
        return common_errmsg_set(e, COMMON_EINVAL, "device memory: no device CUDA%d (%d found)",
                                 dev, n);
    if ((err = cudaSetDevice(dev)) == cudaErrorDevicesUnavailable) {
        (void)cudaGetLastError();
        return common_errmsg_set(e, COMMON_EBUSY,
                                 "device memory: CUDA%d is busy (its compute mode lets one process "
                                 "use it: a fetcher and an executor share a device only in the "
                                 "Default mode, nvidia-smi -c DEFAULT)",
                                 dev);
    }
    if (err != cudaSuccess)
        return cuda_fail(e, err, "cudaSetDevice");
    int rc = cuda_load(e);
    if (rc != COMMON_OK)
        return rc;
    t_dev = dev;
    int none = -1;
    (void)atomic_compare_exchange_strong(&g_dev0, &none, dev);
    CUdevice cd;
    int      vmm = 0, fds = 0;
    CUresult r = g_cu.device(&cd, dev);
    if (r == CUDA_SUCCESS)
        r = g_cu.attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cd);
    if (r == CUDA_SUCCESS)
        r = g_cu.attribute(&fds, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           cd);
    if (r != CUDA_SUCCESS)
        return cu_fail(e, r, "cuDeviceGetAttribute");
    if (!vmm || !fds)
        return common_errmsg_set(e, COMMON_ENOTSUP,
                                 "device memory: CUDA%d cannot share memory between processes "
                                 "(virtual memory management %s, POSIX descriptor handles %s)",
                                 dev, vmm ? "yes" : "no", fds ? "yes" : "no");
    CUmemAllocationProp p = cuda_prop();
    size_t              gran = 0;
    r = g_cu.granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS || gran == 0)
        return cu_fail(e, r, "cuMemGetAllocationGranularity");
    /* the device's copy stream (a fetcher's copies, or a process's own pool's) */
    if (!g_streams[dev] &&
        (err = cudaStreamCreateWithFlags(&g_streams[dev], cudaStreamNonBlocking)) != cudaSuccess)
        return cuda_fail(e, err, "cudaStreamCreate");
    *granularity = gran;
    return COMMON_OK;
}

static int cuda_select(int dev, struct common_errmsg *e)
{
    cudaError_t err = cudaSetDevice(dev);
    if (err != cudaSuccess)
        return cuda_fail(e, err, "cudaSetDevice");
    t_dev = dev;
    return COMMON_OK;
}

static void *cuda_reserve(size_t bytes, struct common_errmsg *e)
{
    (void)cuda_here();
    CUdeviceptr p = 0;
    CUresult    r = g_cu.reserve(&p, bytes, common_devmem_granularity(), 0, 0);
    if (r != CUDA_SUCCESS) {
        cu_fail(e, r, "cuMemAddressReserve");
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

static void cuda_unreserve(void *base, size_t bytes)
{
    (void)g_cu.addr_free((CUdeviceptr)(uintptr_t)base, bytes);
}

struct common_devmem_piece {
    CUmemGenericAllocationHandle h;
    size_t                       bytes;
    void                        *at;  /* where mapped here; NULL when not */
    int                          dev; /* the device it was made or imported on */
};

static int cuda_piece_create(size_t bytes, struct common_devmem_piece **out,
                             struct common_errmsg *e)
{
    struct common_devmem_piece *p = calloc(1, sizeof(*p));
    if (!p)
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: out of host memory");
    CUmemAllocationProp prop = cuda_prop();
    CUresult            r = g_cu.create(&p->h, bytes, &prop, 0);
    if (r != CUDA_SUCCESS) {
        free(p);
        return cu_fail(e, r, "cuMemCreate");
    }
    p->bytes = bytes;
    p->dev = cuda_here();
    *out = p;
    return COMMON_OK;
}

static int cuda_piece_export(const struct common_devmem_piece *p, struct common_devmem_handle *h,
                             struct common_errmsg *e)
{
    (void)cuda_here();
    int      fd = -1;
    CUresult r = g_cu.export_fd(&fd, p->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS || fd < 0)
        return cu_fail(e, r, "cuMemExportToShareableHandle");
    h->fd = fd;
    h->len = 0;
    return COMMON_OK;
}

static int cuda_piece_import(int fd, size_t bytes, struct common_devmem_piece **out,
                             struct common_errmsg *e)
{
    (void)cuda_here();
    struct common_devmem_piece *p = calloc(1, sizeof(*p));
    CUresult                    r = CUDA_SUCCESS;
    if (p)
        r = g_cu.import_fd(&p->h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd); /* the imported handle holds the memory */
    if (!p)
        return common_errmsg_set(e, COMMON_ENOMEM, "device memory: out of host memory");
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_NOT_PERMITTED ||
        r == CUDA_ERROR_NOT_SUPPORTED) {
        free(p);
        return cu_fail(e, r, "cuMemImportFromShareableHandle");
    }
    if (r != CUDA_SUCCESS) {
        free(p);
        return common_errmsg_set(e, COMMON_EINVAL,
                                 "device memory: the descriptor is no device memory to import "
                                 "(CUresult %d)",
                                 (int)r);
    }
    p->bytes = bytes; /* checked by cuMemMap: a piece smaller than that does not map */
    p->dev = cuda_here();
    *out = p;
    return COMMON_OK;
}

static int cuda_piece_map(struct common_devmem_piece *p, void *at, struct common_errmsg *e)
{
    if (p->at)
        return common_errmsg_set(e, COMMON_EBUSY, "device memory: the piece is mapped already");
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)at;
    CUresult    r = g_cu.map(d, p->bytes, 0, p->h, 0);
    if (r != CUDA_SUCCESS)
        return cu_fail(e, r, "cuMemMap");
    CUmemAccessDesc a;
    memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = cuda_here();
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = g_cu.access(d, p->bytes, &a, 1)) != CUDA_SUCCESS) {
        (void)g_cu.unmap(d, p->bytes);
        return cu_fail(e, r, "cuMemSetAccess");
    }
    p->at = at;
    return COMMON_OK;
}

static void cuda_piece_destroy(struct common_devmem_piece *p)
{
    (void)cuda_here();
    if (p->at) {
        if (g_streams[p->dev]) /* no queued copy writes into it any more */
            (void)cudaStreamSynchronize(g_streams[p->dev]);
        (void)g_cu.unmap((CUdeviceptr)(uintptr_t)p->at, p->bytes);
    }
    (void)g_cu.release(p->h);
    free(p);
}

static size_t cuda_piece_bytes(const struct common_devmem_piece *p)
{
    return p->bytes;
}

/* The copies' busy time: a ring of timing-event pairs around each copy, each read once its end
 * is done (best effort: timing failures are never the copy's). */
#define TIMED_PAIRS 256
static struct {
    pthread_mutex_t mu;
    int             state; /* 0 = events not made, 1 = made, -1 = unusable */
    int             dev;   /* the device the events are of: only its copies are timed */
    unsigned        next;
    uint64_t        busy_ns;
    struct {
        cudaEvent_t a, b;
        bool        pending;
    } p[TIMED_PAIRS];
} g_tp = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Adds the pairs that are done (the lock held). */
static void cuda_timed_harvest(void)
{
    for (unsigned i = 0; g_tp.state == 1 && i < TIMED_PAIRS; i++) {
        if (!g_tp.p[i].pending)
            continue;
        const cudaError_t q = cudaEventQuery(g_tp.p[i].b);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError();
            continue;
        }
        float ms = 0;
        if (q == cudaSuccess &&
            cudaEventElapsedTime(&ms, g_tp.p[i].a, g_tp.p[i].b) == cudaSuccess && ms > 0)
            g_tp.busy_ns += (uint64_t)((double)ms * 1e6);
        else
            (void)cudaGetLastError();
        g_tp.p[i].pending = false;
    }
}

static uint64_t cuda_copy_busy_ns(void)
{
    (void)cuda_here();
    pthread_mutex_lock(&g_tp.mu);
    cuda_timed_harvest();
    const uint64_t ns = g_tp.busy_ns;
    pthread_mutex_unlock(&g_tp.mu);
    return ns;
}

static int cuda_host_register(const void *p, size_t bytes, struct common_errmsg *e)
{
    (void)cuda_here();
    cudaError_t err = cudaHostRegister((void *)(uintptr_t)p, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(e, err, "cudaHostRegister");
    }
    return COMMON_OK;
}

static void cuda_host_unregister(const void *p)
{
    (void)cuda_here();
    if (cudaHostUnregister((void *)(uintptr_t)p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_copy_async(void *dst, const void *src, size_t bytes, struct common_errmsg *e)
{
    const int    dev = cuda_here();
    cudaStream_t st = g_streams[dev];
    pthread_mutex_lock(&g_tp.mu);
    if (g_tp.state == 0) {
        g_tp.state = 1;
        g_tp.dev = dev;
        for (unsigned i = 0; i < TIMED_PAIRS && g_tp.state == 1; i++)
            if (cudaEventCreate(&g_tp.p[i].a) != cudaSuccess ||
                cudaEventCreate(&g_tp.p[i].b) != cudaSuccess) {
                (void)cudaGetLastError();
                g_tp.state = -1;
            }
    }
    unsigned k = g_tp.next;
    if (g_tp.state == 1 && g_tp.p[k].pending)
        cuda_timed_harvest();
    const bool timed = g_tp.state == 1 && g_tp.dev == dev && !g_tp.p[k].pending &&
                       cudaEventRecord(g_tp.p[k].a, st) == cudaSuccess;
    cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st);
    if (timed && err == cudaSuccess && cudaEventRecord(g_tp.p[k].b, st) == cudaSuccess) {
        g_tp.p[k].pending = true;
        g_tp.next = (k + 1) % TIMED_PAIRS;
    }
    pthread_mutex_unlock(&g_tp.mu);
    return err == cudaSuccess ? COMMON_OK : cuda_fail(e, err, "cudaMemcpyAsync");
}

struct common_devmem_event {
    cudaEvent_t ev;
};

static int cuda_event_create(struct common_devmem_event **out, struct common_errmsg *e)
{
    (void)cuda_here();
    struct common_devmem_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return common_errmsg_set(e, COMMON_ENOMEM, "device event: out of host memory");
    cudaError_t err =
        cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming | cudaEventInterprocess);
    if (err != cudaSuccess) {
        free(ev);
        return cuda_fail(e, err, "cudaEventCreate");
    }
    *out = ev;
    return COMMON_OK;
}

static int cuda_event_export(const struct common_devmem_event *ev, struct common_devmem_handle *h,
                             struct common_errmsg *e)
{
    (void)cuda_here();
    cudaIpcEventHandle_t ih;
    cudaError_t          err = cudaIpcGetEventHandle(&ih, ev->ev);
    if (err != cudaSuccess)
        return cuda_fail(e, err, "cudaIpcGetEventHandle");
    memcpy(h->blob, &ih, sizeof(ih));
    h->len = sizeof(ih);
    return COMMON_OK;
}

static int cuda_event_import(struct common_devmem_handle *h, struct common_devmem_event **out,
                             struct common_errmsg *e)
{
    (void)cuda_here();
    cudaIpcEventHandle_t ih;
    if (h->len != sizeof(ih))
        return common_errmsg_set(e, COMMON_EINVAL, "device event: a handle of %u bytes, not %zu",
                                 h->len, sizeof(ih));
    memcpy(&ih, h->blob, sizeof(ih));
    struct common_devmem_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return common_errmsg_set(e, COMMON_ENOMEM, "device event: out of host memory");
    cudaError_t err = cudaIpcOpenEventHandle(&ev->ev, ih);
    if (err != cudaSuccess) {
        free(ev);
        (void)cudaGetLastError();
        return common_errmsg_set(e, COMMON_EINVAL, "device event: the handle names no event: %s",
                                 cudaGetErrorString(err));
    }
    *out = ev;
    return COMMON_OK;
}

static int cuda_event_record(struct common_devmem_event *ev, struct common_errmsg *e)
{
    (void)cuda_here();
    cudaError_t err = cudaEventRecord(ev->ev, cuda_stream());
    return err == cudaSuccess ? COMMON_OK : cuda_fail(e, err, "cudaEventRecord");
}

static int cuda_event_wait(struct common_devmem_event *ev, struct common_errmsg *e)
{
    (void)cuda_here();
    cudaError_t err = cudaStreamWaitEvent(cuda_stream(), ev->ev, 0);
    return err == cudaSuccess ? COMMON_OK : cuda_fail(e, err, "cudaStreamWaitEvent");
}

static int cuda_event_sync(struct common_devmem_event *ev, struct common_errmsg *e)
{
    (void)cuda_here();
    cudaError_t err = cudaEventSynchronize(ev->ev);
    return err == cudaSuccess ? COMMON_OK : cuda_fail(e, err, "cudaEventSynchronize");
}

static bool cuda_event_is_done(struct common_devmem_event *ev)
{
    (void)cuda_here();
    const cudaError_t q = cudaEventQuery(ev->ev);
    if (q != cudaSuccess)
        (void)cudaGetLastError(); /* not ready (or failed): not a later kernel's error */
    return q != cudaErrorNotReady;
}

static void cuda_event_destroy(struct common_devmem_event *ev)
{
    (void)cuda_here();
    (void)cudaEventDestroy(ev->ev);
    free(ev);
}

static void *cuda_event_native(struct common_devmem_event *ev)
{
    return (void *)ev->ev;
}

static const struct devmem_backend g_cuda = {
    .name = "CUDA",
    .open = cuda_open,
    .select = cuda_select,
    .reserve = cuda_reserve,
    .unreserve = cuda_unreserve,
    .piece_create = cuda_piece_create,
    .piece_export = cuda_piece_export,
    .piece_import = cuda_piece_import,
    .piece_map = cuda_piece_map,
    .piece_destroy = cuda_piece_destroy,
    .piece_bytes = cuda_piece_bytes,
    .copy_async = cuda_copy_async,
    .copy_busy_ns = cuda_copy_busy_ns,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .event_create = cuda_event_create,
    .event_export = cuda_event_export,
    .event_import = cuda_event_import,
    .event_record = cuda_event_record,
    .event_wait = cuda_event_wait,
    .event_sync = cuda_event_sync,
    .event_is_done = cuda_event_is_done,
    .event_destroy = cuda_event_destroy,
    .event_native = cuda_event_native,
};

const struct devmem_backend *devmem_cuda_backend(void)
{
    return &g_cuda;
}
