/* executor/cuda/device.cu - device selection, the backend's stream, memory, error recording. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h> /* the driver API's types: its functions come through entry points */

#include "gpu_impl.cuh"

/* Per device: the kernels' stream and the copy stream (gpu_copy_async), created by the device's
 * first gpu_select and kept for the process. */
static cudaStream_t     g_streams[GPU_MAX_DEVICES];
static cudaStream_t     g_copies[GPU_MAX_DEVICES];
static pthread_mutex_t  g_dev_mu = PTHREAD_MUTEX_INITIALIZER; /* their creation */
static char             g_err[256]; /* the last recorded error, one line */
static thread_local int t_dev;      /* the calling thread's device (gpu_use) */

cudaStream_t gpu_stream(void)
{
    return g_streams[t_dev];
}

int gpu_current_device(void)
{
    return t_dev;
}

/* The calling thread's copy stream. */
static cudaStream_t copy_stream(void)
{
    return g_copies[t_dev];
}

int cuda_use(int dev)
{
    if (dev < 0 || dev >= GPU_MAX_DEVICES)
        return gpu_record(cudaErrorInvalidDevice, "selecting the device");
    cudaError_t err = cudaSetDevice(dev);
    if (err == cudaSuccess) { /* under the lock: a stream another thread made is seen made */
        pthread_mutex_lock(&g_dev_mu);
        if (!g_streams[dev])
            err = cudaStreamCreateWithFlags(&g_streams[dev], cudaStreamNonBlocking);
        if (err == cudaSuccess && !g_copies[dev])
            err = cudaStreamCreateWithFlags(&g_copies[dev], cudaStreamNonBlocking);
        pthread_mutex_unlock(&g_dev_mu);
    }
    if (err == cudaSuccess)
        t_dev = dev;
    return gpu_record(err, "selecting the device");
}

int cuda_current(void)
{
    return t_dev;
}

int gpu_record(cudaError_t err, const char *what)
{
    if (err == cudaSuccess)
        return 0;
    snprintf(g_err, sizeof(g_err), "%s: %s (%s)", what, cudaGetErrorString(err),
             cudaGetErrorName(err));
    return -1;
}

const char *cuda_last_error(void)
{
    return g_err;
}

int cuda_device_count(char *why, size_t why_len)
{
    int         n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        /* No driver, no device: the CPU path is used; clear the runtime's error state. */
        (void)cudaGetLastError();
        if (why && why_len)
            snprintf(why, why_len, "%s", cudaGetErrorString(err));
        return 0;
    }
    if (n == 0 && why && why_len)
        snprintf(why, why_len, "no CUDA device found");
    return n;
}

int cuda_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    char tmp[8];
    int  n = cuda_device_count(why ? why : tmp, why ? why_len : sizeof(tmp));
    if (n == 0)
        return -1;
    if (dev < 0 || dev >= n) {
        if (why && why_len)
            snprintf(why, why_len, "device CUDA%d does not exist (%d device%s: CUDA0..CUDA%d)", dev,
                     n, n == 1 ? "" : "s", n - 1);
        return -1;
    }
    if (dev >= GPU_MAX_DEVICES) {
        if (why && why_len)
            snprintf(why, why_len, "CUDA%d: sluice uses at most %d devices (CUDA0..CUDA%d)", dev,
                     GPU_MAX_DEVICES, GPU_MAX_DEVICES - 1);
        return -1;
    }
    if (cuda_use(dev) < 0) {
        if (why && why_len)
            snprintf(why, why_len, "CUDA%d: %s", dev, g_err);
        return -1;
    }
    cudaDeviceProp p;
    cudaError_t    err = cudaGetDeviceProperties(&p, dev);
    size_t         free_b = 0, total_b = 0;
    if (err == cudaSuccess)
        err = cudaMemGetInfo(&free_b, &total_b);
    if (err != cudaSuccess) {
        gpu_record(err, "selecting the device");
        if (why && why_len)
            snprintf(why, why_len, "CUDA%d: %s", dev, g_err);
        return -1;
    }
    if (p.major < 8) {
        if (why && why_len)
            snprintf(why, why_len,
                     "CUDA%d (%.127s) has compute capability %d.%d; sluice needs 8.0 or later", dev,
                     p.name, p.major, p.minor);
        return -1;
    }
    if (info) {
        memset(info, 0, sizeof(*info));
        snprintf(info->name, sizeof(info->name), "%.127s", p.name);
        info->cc_major = p.major;
        info->cc_minor = p.minor;
        info->n_sm = p.multiProcessorCount;
        info->total_bytes = total_b;
        info->free_bytes = free_b;
    }
    return 0;
}

void *cuda_malloc(size_t bytes)
{
    void *p = NULL;
    if (gpu_record(cudaMalloc(&p, bytes ? bytes : 1), "allocating device memory") < 0)
        return NULL;
    return p;
}

void cuda_free(void *p)
{
    if (p)
        (void)cudaFree(p);
}

/* Per device: the kernel stream waits for another process's event (gpu_stream_wait_shared)
 * queued since its last synchronisation; and the event a bounded synchronisation records. */
static bool        g_shared_waits[GPU_MAX_DEVICES];
static cudaEvent_t g_sync_ev[GPU_MAX_DEVICES];
#define GPU_SHARED_SYNC_S 60 /* how long such a stream may take to drain */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Waits until the kernel stream has run everything queued. When it holds a wait for another
 * process's event (a fetcher's copies into the device pool), for GPU_SHARED_SYNC_S at the most:
 * CUDA leaves a wait for an event whose process died undefined, and it may never end. A stream
 * stuck so cannot be freed or synchronised again (cudaFree would wait for it too), so the
 * process ends, for its supervisor to restart it (the router replays its requests), rather than
 * hang for good. */
static cudaError_t stream_sync(void)
{
    const int    dev = t_dev;
    cudaStream_t s = g_streams[dev];
    if (!__atomic_exchange_n(&g_shared_waits[dev], false, __ATOMIC_ACQ_REL))
        return cudaStreamSynchronize(s);
    pthread_mutex_lock(&g_dev_mu);
    cudaError_t err = g_sync_ev[dev]
                          ? cudaSuccess
                          : cudaEventCreateWithFlags(&g_sync_ev[dev], cudaEventDisableTiming);
    pthread_mutex_unlock(&g_dev_mu);
    if (err != cudaSuccess || (err = cudaEventRecord(g_sync_ev[dev], s)) != cudaSuccess)
        return err;
    const double t0 = now_s();
    for (unsigned spins = 0;; spins++) {
        err = cudaEventQuery(g_sync_ev[dev]);
        if (err != cudaErrorNotReady)
            break;
        if (now_s() - t0 > GPU_SHARED_SYNC_S) {
            fprintf(stderr,
                    "sluice: CUDA%d: the device's stream has waited %d s for another process's "
                    "copies into the device pool (a fetcher that died with its copies in "
                    "flight?); a stream stuck so cannot be freed: exiting, for the supervisor to "
                    "restart this process\n",
                    dev, GPU_SHARED_SYNC_S);
            fflush(stderr);
            _exit(EXIT_FAILURE);
        }
        if (spins > 2000)
            usleep(50);
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError(); /* the queries' "not ready" is no later kernel's error */
    return err;
}

int cuda_upload(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return 0;
    /* The host buffer may be reused at once: copy on the stream, then wait for it. */
    if (gpu_record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, gpu_stream()),
                   "copying to the device") < 0)
        return -1;
    return gpu_record(stream_sync(), "copying to the device");
}

static int cuda_upload_queued(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return 0;
    return gpu_record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, gpu_stream()),
                      "copying to the device");
}

int cuda_download(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return cuda_sync();
    /* a copy to pageable memory waits for the stream inside cudaMemcpyAsync: a stream that waits
     * for another process is drained first, bounded (stream_sync) */
    if (__atomic_load_n(&g_shared_waits[t_dev], __ATOMIC_ACQUIRE) &&
        gpu_record(stream_sync(), "copying from the device") < 0)
        return -1;
    if (gpu_record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, gpu_stream()),
                   "copying from the device") < 0)
        return -1;
    return gpu_record(cudaStreamSynchronize(gpu_stream()), "copying from the device");
}

int cuda_memset(void *dst, int byte, size_t bytes)
{
    return gpu_record(cudaMemsetAsync(dst, byte, bytes, gpu_stream()), "clearing device memory");
}

int cuda_sync(void)
{
    return gpu_record(stream_sync(), "running kernels");
}

double cuda_membw_probe(size_t bytes)
{
    void       *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double      bw = 0.0;
    float       best = 0.0f;
    if (gpu_record(cudaMalloc(&a, bytes), "bandwidth probe") < 0 ||
        gpu_record(cudaMalloc(&b, bytes), "bandwidth probe") < 0 ||
        gpu_record(cudaEventCreate(&e0), "bandwidth probe") < 0 ||
        gpu_record(cudaEventCreate(&e1), "bandwidth probe") < 0 ||
        gpu_record(cudaMemsetAsync(a, 0x5a, bytes, gpu_stream()), "bandwidth probe") < 0)
        goto out;
    /* The best of a few device-to-device copies after a warm-up, counting bytes read and
     * written (what a kernel streaming weights can at most read). */
    for (int i = 0; i < 6; i++) {
        float ms = 0.0f;
        if (gpu_record(cudaEventRecord(e0, gpu_stream()), "bandwidth probe") < 0 ||
            gpu_record(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, gpu_stream()),
                       "bandwidth probe") < 0 ||
            gpu_record(cudaEventRecord(e1, gpu_stream()), "bandwidth probe") < 0 ||
            gpu_record(cudaEventSynchronize(e1), "bandwidth probe") < 0 ||
            gpu_record(cudaEventElapsedTime(&ms, e0, e1), "bandwidth probe") < 0)
            goto out;
        if (i > 0 && ms > 0.0f && (best == 0.0f || ms < best))
            best = ms;
    }
    if (best > 0.0f)
        bw = 2.0 * (double)bytes / ((double)best * 1e-3);
out:
    if (e0)
        (void)cudaEventDestroy(e0);
    if (e1)
        (void)cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return bw;
}

/* An event: CUDA's, without timing (the cheapest to record and wait on). */
struct gpu_event {
    cudaEvent_t e;
};

static struct gpu_event *cuda_event_new(void)
{
    struct gpu_event *ev = (struct gpu_event *)calloc(1, sizeof(*ev));
    if (!ev) {
        snprintf(g_err, sizeof(g_err), "creating an event: out of memory");
        return NULL;
    }
    if (gpu_record(cudaEventCreateWithFlags(&ev->e, cudaEventDisableTiming), "creating an event") <
        0) {
        free(ev);
        return NULL;
    }
    return ev;
}

static void cuda_event_free(struct gpu_event *ev)
{
    if (!ev)
        return;
    (void)cudaEventDestroy(ev->e);
    free(ev);
}

/* The copy streams' busy time and the kernels' waits for them (gpu_copy_times), from pairs of
 * timing events around each copy and each wait, read once both are done: a ring of pairs per
 * device (an event is its device's). A pair still in flight when its turn in the ring comes
 * again is not timed (counted in g_untimed). Timing is best effort: its failures are never the
 * caller's. */
#define TIMED_PAIRS 512
struct timed_pair {
    cudaEvent_t a, b;
    bool        stall; /* a kernels' wait, else a copy */
    bool        pending;
};
struct timed_ring {
    struct timed_pair *tp; /* TIMED_PAIRS of them, made at the device's first timed copy */
    unsigned           next;
    int                state; /* 0 = not made yet, 1 = made, -1 = unusable */
};
static pthread_mutex_t   g_tp_mu = PTHREAD_MUTEX_INITIALIZER;
static struct timed_ring g_tr[GPU_MAX_DEVICES];
static uint64_t          g_busy_ns, g_stall_ns, g_untimed;

/* Adds the done pairs of device dev, the calling thread's, to the totals (the lock held). */
static void timed_harvest(int dev)
{
    struct timed_ring *r = &g_tr[dev];
    for (unsigned i = 0; r->state == 1 && i < TIMED_PAIRS; i++) {
        struct timed_pair *t = &r->tp[i];
        if (!t->pending)
            continue;
        const cudaError_t q = cudaEventQuery(t->b);
        if (q == cudaErrorNotReady) {
            (void)cudaGetLastError(); /* not an error of anyone's */
            continue;
        }
        float ms = 0;
        if (q == cudaSuccess && cudaEventElapsedTime(&ms, t->a, t->b) == cudaSuccess && ms > 0)
            *(t->stall ? &g_stall_ns : &g_busy_ns) += (uint64_t)((double)ms * 1e6);
        else
            (void)cudaGetLastError();
        t->pending = false;
    }
}

/* A free pair of timing events for the next copy or wait on stream s (the lock held), or NULL:
 * timing unusable, the stream being captured into a graph, or the ring full of pairs in flight. */
static struct timed_pair *timed_take(cudaStream_t s)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    struct timed_ring      *r = &g_tr[t_dev];
    if (r->state == 0) {
        r->tp = (struct timed_pair *)calloc(TIMED_PAIRS, sizeof(*r->tp));
        r->state = r->tp ? 1 : -1;
        for (unsigned i = 0; i < TIMED_PAIRS && r->state == 1; i++)
            if (cudaEventCreate(&r->tp[i].a) != cudaSuccess ||
                cudaEventCreate(&r->tp[i].b) != cudaSuccess) {
                (void)cudaGetLastError();
                r->state = -1;
            }
    }
    if (r->state != 1 || cudaStreamIsCapturing(s, &cs) != cudaSuccess ||
        cs != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return NULL;
    }
    struct timed_pair *t = &r->tp[r->next];
    if (t->pending)
        timed_harvest(t_dev);
    if (t->pending) {
        g_untimed++;
        return NULL;
    }
    r->next = (r->next + 1) % TIMED_PAIRS;
    return t;
}

/* Runs op (a copy or a wait queued on stream s) between the two events of a timed pair. */
static cudaError_t timed(cudaStream_t s, bool stall, cudaError_t (*op)(const void *),
                         const void *arg)
{
    pthread_mutex_lock(&g_tp_mu);
    struct timed_pair *t = timed_take(s);
    if (t && cudaEventRecord(t->a, s) != cudaSuccess) {
        (void)cudaGetLastError();
        t = NULL;
    }
    const cudaError_t err = op(arg);
    if (t && err == cudaSuccess) {
        if (cudaEventRecord(t->b, s) == cudaSuccess) {
            t->stall = stall;
            t->pending = true;
        } else {
            (void)cudaGetLastError();
        }
    }
    pthread_mutex_unlock(&g_tp_mu);
    return err;
}

struct copy_args {
    void       *dst;
    const void *src;
    size_t      bytes;
};

static cudaError_t copy_op(const void *arg)
{
    const struct copy_args *c = (const struct copy_args *)arg;
    return cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyHostToDevice, copy_stream());
}

static int cuda_copy_async(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return 0;
    const struct copy_args c = {dst, src, bytes};
    return gpu_record(timed(copy_stream(), false, copy_op, &c),
                      "copying to the device (copy stream)");
}

/* Portable (every context may use it); a mapping without write access (a fetcher's pool seen
 * from the executor daemon) needs cudaHostRegisterReadOnly, where the device supports it. */
static int cuda_host_register(const void *p, size_t bytes, bool read_only)
{
    if (!p || !bytes)
        return gpu_record(cudaErrorInvalidValue, "registering host memory");
    unsigned flags = cudaHostRegisterPortable;
    if (read_only) { /* asked of the calling thread's device (gpu_use) */
        int ok = 0;
        if (cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, t_dev) !=
                cudaSuccess ||
            !ok)
            return gpu_record(cudaErrorNotSupported, "registering read-only host memory");
        flags |= cudaHostRegisterReadOnly;
    }
    return gpu_record(cudaHostRegister((void *)(uintptr_t)p, bytes, flags),
                      "registering host memory as pinned");
}

static void cuda_host_unregister(const void *p)
{
    if (p)
        (void)cudaHostUnregister((void *)(uintptr_t)p);
}

/* ---- virtual memory management ----------------------------------------------------------- */
/* The driver's cuMem* functions, found through the runtime (cudaGetDriverEntryPointByVersion), so
 * that nothing links libcuda: a machine without the driver still runs the CPU path. Loaded once,
 * at the first question (the pool is made on one thread). */
static decltype(&cuMemGetAllocationGranularity) p_cu_granularity;
static decltype(&cuMemAddressReserve)           p_cu_reserve;
static decltype(&cuMemAddressFree)              p_cu_addr_free;
static decltype(&cuMemCreate)                   p_cu_create;
static decltype(&cuMemRelease)                  p_cu_release;
static decltype(&cuMemMap)                      p_cu_map;
static decltype(&cuMemUnmap)                    p_cu_unmap;
static decltype(&cuMemSetAccess)                p_cu_access;
static decltype(&cuDeviceGet)                   p_cu_device;
static decltype(&cuDeviceGetAttribute)          p_cu_attribute;
static pthread_once_t                           g_vmm_once = PTHREAD_ONCE_INIT;
static bool                                     g_vmm_loaded; /* the functions above found */
static pthread_mutex_t                          g_vmm_mu = PTHREAD_MUTEX_INITIALIZER;
static size_t g_vmm_gran[GPU_MAX_DEVICES]; /* per device; 0 = not available */
static bool   g_vmm_asked[GPU_MAX_DEVICES];

static int cu_record(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return 0;
    snprintf(g_err, sizeof(g_err), "%s: CUDA driver error %d", what, (int)r);
    return -1;
}

static CUmemAllocationProp cuda_vmm_prop(void)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = t_dev;
    return p;
}

static void cuda_vmm_load(void)
{
    struct {
        const char *name;
        void      **fn;
    } const t[] = {
        {"cuMemGetAllocationGranularity", (void **)&p_cu_granularity},
        {"cuMemAddressReserve", (void **)&p_cu_reserve},
        {"cuMemAddressFree", (void **)&p_cu_addr_free},
        {"cuMemCreate", (void **)&p_cu_create},
        {"cuMemRelease", (void **)&p_cu_release},
        {"cuMemMap", (void **)&p_cu_map},
        {"cuMemUnmap", (void **)&p_cu_unmap},
        {"cuMemSetAccess", (void **)&p_cu_access},
        {"cuDeviceGet", (void **)&p_cu_device},
        {"cuDeviceGetAttribute", (void **)&p_cu_attribute},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(t[i].name, t[i].fn, 12000, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*t[i].fn) {
            (void)cudaGetLastError();
            return;
        }
    }
    g_vmm_loaded = true;
}

/* The calling thread's device's granularity, asked once per device; 0 without VMM. */
static size_t cuda_va_granularity(void)
{
    (void)pthread_once(&g_vmm_once, cuda_vmm_load);
    if (!g_vmm_loaded)
        return 0;
    const int dev = t_dev;
    pthread_mutex_lock(&g_vmm_mu);
    if (!g_vmm_asked[dev]) {
        g_vmm_asked[dev] = true;
        CUdevice                  d = 0;
        int                       ok = 0;
        size_t                    gran = 0;
        const CUmemAllocationProp prop = cuda_vmm_prop();
        if (p_cu_device(&d, dev) == CUDA_SUCCESS &&
            p_cu_attribute(&ok, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d) ==
                CUDA_SUCCESS &&
            ok &&
            p_cu_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS)
            g_vmm_gran[dev] = gran;
    }
    const size_t gran = g_vmm_gran[dev];
    pthread_mutex_unlock(&g_vmm_mu);
    return gran;
}

static void *cuda_va_reserve(size_t bytes)
{
    CUdeviceptr p = 0;
    const size_t gran = cuda_va_granularity();
    if (!gran || !bytes || bytes % gran) {
        gpu_record(cudaErrorInvalidValue, "reserving device address space");
        return NULL;
    }
    if (cu_record(p_cu_reserve(&p, bytes, 0, 0, 0), "reserving device address space") < 0)
        return NULL;
    return (void *)(uintptr_t)p;
}

/* A piece of its own physical memory, mapped, its handle released at once: the memory lives
 * until it is unmapped. */
static int cuda_va_map(void *at, size_t bytes)
{
    const size_t gran = cuda_va_granularity();
    if (!gran || !at || !bytes || bytes % gran)
        return gpu_record(cudaErrorInvalidValue, "mapping device memory");
    const CUmemAllocationProp    prop = cuda_vmm_prop();
    CUmemGenericAllocationHandle h;
    const CUdeviceptr            p = (CUdeviceptr)(uintptr_t)at;
    if (cu_record(p_cu_create(&h, bytes, &prop, 0), "backing the expert pool") < 0)
        return -1;
    if (cu_record(p_cu_map(p, bytes, 0, h, 0), "mapping device memory") < 0) {
        (void)p_cu_release(h);
        return -1;
    }
    (void)p_cu_release(h);
    CUmemAccessDesc d;
    memset(&d, 0, sizeof(d));
    d.location = prop.location;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (cu_record(p_cu_access(p, bytes, &d, 1), "granting access to device memory") < 0) {
        (void)p_cu_unmap(p, bytes);
        return -1;
    }
    return 0;
}

static void cuda_va_unmap(void *at, size_t bytes)
{
    if (g_vmm_loaded && at && bytes)
        (void)p_cu_unmap((CUdeviceptr)(uintptr_t)at, bytes);
}

static void cuda_va_free(void *base, size_t bytes)
{
    if (g_vmm_loaded && base && bytes)
        (void)p_cu_addr_free((CUdeviceptr)(uintptr_t)base, bytes);
}

static int cuda_event_record_copy(struct gpu_event *ev)
{
    return gpu_record(cudaEventRecord(ev->e, copy_stream()), "recording an event (copy stream)");
}

static int cuda_event_record_kernels(struct gpu_event *ev)
{
    return gpu_record(cudaEventRecord(ev->e, gpu_stream()), "recording an event");
}

static cudaError_t wait_op(const void *arg)
{
    return cudaStreamWaitEvent(gpu_stream(), ((const struct gpu_event *)arg)->e, 0);
}

static int cuda_stream_wait(struct gpu_event *ev)
{
    return gpu_record(timed(gpu_stream(), true, wait_op, ev), "waiting for copies");
}

/* common/devmem.c's (C linkage): the cudaEvent_t behind a shared event. */
extern "C" void *common_devmem_event_native(struct common_devmem_event *ev);

static cudaError_t wait_shared_op(const void *arg)
{
    const cudaError_t err = cudaStreamWaitEvent(gpu_stream(), (cudaEvent_t)arg, 0);
    if (err == cudaSuccess) /* the stream's next synchronisation is bounded (stream_sync) */
        __atomic_store_n(&g_shared_waits[t_dev], true, __ATOMIC_RELEASE);
    return err;
}

static int cuda_stream_wait_shared(struct common_devmem_event *ev)
{
    void *native = ev ? common_devmem_event_native(ev) : NULL;
    if (!native)
        return gpu_record(cudaErrorInvalidResourceHandle, "waiting for a shared event");
    return gpu_record(timed(gpu_stream(), true, wait_shared_op, native),
                      "waiting for a shared event");
}

static int cuda_event_record_kernels_shared(struct common_devmem_event *ev)
{
    void *native = ev ? common_devmem_event_native(ev) : NULL;
    if (!native)
        return gpu_record(cudaErrorInvalidResourceHandle, "recording a shared event");
    return gpu_record(cudaEventRecord((cudaEvent_t)native, gpu_stream()),
                      "recording a shared event");
}

static int cuda_copy_wait(struct gpu_event *ev)
{
    return gpu_record(cudaStreamWaitEvent(copy_stream(), ev->e, 0),
                      "waiting for kernels (copy stream)");
}

static int cuda_event_sync(struct gpu_event *ev)
{
    return gpu_record(cudaEventSynchronize(ev->e), "waiting for an event");
}

static bool cuda_copy_times(uint64_t *busy_ns, uint64_t *stall_ns)
{
    pthread_mutex_lock(&g_tp_mu);
    const int me = t_dev;
    bool      ok = false;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) /* each ring with its device current */
        if (g_tr[d].state == 1 && (d == me || cudaSetDevice(d) == cudaSuccess)) {
            timed_harvest(d);
            ok = true;
        }
    (void)cudaSetDevice(me);
    (void)cudaGetLastError();
    *busy_ns = g_busy_ns;
    *stall_ns = g_stall_ns;
    pthread_mutex_unlock(&g_tp_mu);
    return ok;
}

/* A captured graph, instantiated. */
struct gpu_graph {
    cudaGraphExec_t exec;
};

static int cuda_graph_begin(void)
{
    return gpu_record(cudaStreamBeginCapture(gpu_stream(), cudaStreamCaptureModeThreadLocal),
                      "beginning a graph capture");
}

static int cuda_graph_end(struct gpu_graph **out)
{
    cudaGraph_t       graph = NULL;
    const cudaError_t err = cudaStreamEndCapture(gpu_stream(), &graph);
    if (err != cudaSuccess || !graph) {
        if (graph)
            (void)cudaGraphDestroy(graph);
        (void)cudaGetLastError(); /* the capture's error is recorded here, not left sticky */
        return gpu_record(err != cudaSuccess ? err : cudaErrorStreamCaptureInvalidated,
                          "capturing a graph");
    }
    struct gpu_graph *gg = *out;
    if (gg) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(gg->exec, graph, &info) == cudaSuccess) {
            (void)cudaGraphDestroy(graph);
            return 0;
        }
        (void)cudaGetLastError();
        (void)cudaGraphExecDestroy(gg->exec);
        gg->exec = NULL;
    } else if (!(gg = (struct gpu_graph *)calloc(1, sizeof(*gg)))) {
        (void)cudaGraphDestroy(graph);
        snprintf(g_err, sizeof(g_err), "capturing a graph: out of memory");
        return -1;
    }
    const int rc = gpu_record(cudaGraphInstantiate(&gg->exec, graph, 0), "instantiating a graph");
    (void)cudaGraphDestroy(graph);
    if (rc < 0) {
        free(gg);
        *out = NULL;
        return -1;
    }
    *out = gg;
    return 0;
}

static int cuda_graph_launch(struct gpu_graph *gg)
{
    return gpu_record(cudaGraphLaunch(gg->exec, gpu_stream()), "launching a graph");
}

static void cuda_graph_free(struct gpu_graph *gg)
{
    if (!gg)
        return;
    if (gg->exec)
        (void)cudaGraphExecDestroy(gg->exec);
    free(gg);
}

extern "C" const struct gpu_backend *gpu_backend_cuda(void)
{
    static const struct gpu_backend be = {
        .name = "CUDA",
        .device_count = cuda_device_count,
        .select = cuda_select,
        .use = cuda_use,
        .current = cuda_current,
        .last_error = cuda_last_error,
        .alloc = cuda_malloc,
        .release = cuda_free,
        .upload = cuda_upload,
        .upload_queued = cuda_upload_queued,
        .download = cuda_download,
        .fill = cuda_memset,
        .sync = cuda_sync,
        .membw_probe = cuda_membw_probe,
        .event_new = cuda_event_new,
        .event_free = cuda_event_free,
        .copy_async = cuda_copy_async,
        .event_record_copy = cuda_event_record_copy,
        .event_record_kernels = cuda_event_record_kernels,
        .stream_wait = cuda_stream_wait,
        .stream_wait_shared = cuda_stream_wait_shared,
        .event_record_kernels_shared = cuda_event_record_kernels_shared,
        .copy_wait = cuda_copy_wait,
        .event_sync = cuda_event_sync,
        .host_register = cuda_host_register,
        .va_granularity = cuda_va_granularity,
        .va_reserve = cuda_va_reserve,
        .va_map = cuda_va_map,
        .va_unmap = cuda_va_unmap,
        .va_free = cuda_va_free,
        .host_unregister = cuda_host_unregister,
        .copy_times = cuda_copy_times,
        .matvec_any_rows = false,
        .weights_in_place = false,
        .attention_own_scratch = false,
        .threads = nullptr,
        .graph_begin = cuda_graph_begin,
        .graph_end = cuda_graph_end,
        .graph_launch = cuda_graph_launch,
        .graph_free = cuda_graph_free,
        .type_supported = cuda_type_supported,
        .dequant_rows = cuda_dequant_rows,
        .matvec = cuda_matvec,
        .matvec_ids = cuda_matvec_ids,
        .f32_to_f16 = cuda_f32_to_f16,
        .gemm_f16 = cuda_gemm_f16,
        .gemm_q = cuda_gemm_q,
        .act_round = cuda_act_round,
        .act_q8 = cuda_act_q8,
        .matvec_q8 = cuda_matvec_q8,
        .matvec_q8_cat = cuda_matvec_q8_cat,
        .matvec_ids_q8 = cuda_matvec_ids_q8,
        .matvec_ids_combine_q8 = cuda_matvec_ids_combine_q8,
        .matvec_groups_q8 = cuda_matvec_groups_q8,
        .rmsnorm = cuda_rmsnorm,
        .rmsnorm_q8 = cuda_rmsnorm_q8,
        .add = cuda_add,
        .add_bias = cuda_add_bias,
        .scale_rows = cuda_scale_rows,
        .swiglu = cuda_swiglu,
        .swiglu_oai = cuda_swiglu_oai,
        .rope = cuda_rope,
        .rope_qk = cuda_rope_qk,
        .kv_store = cuda_kv_store,
        .attention = cuda_attention,
        .kv_store_q8 = cuda_kv_store_q8,
        .attention_q8 = cuda_attention_q8,
        .attention_ring = nullptr,
        .moe_route = cuda_moe_route,
        .moe_sort = cuda_moe_sort,
        .moe_combine = cuda_moe_combine,
        .gated_add = cuda_gated_add,
        .gather_rows = cuda_gather_rows,
        .scatter_rows = cuda_scatter_rows,
    };
    return &be;
}
