/* executor/gpu_host.c - the host backend of the device interface (cuda/gpu.h): one "device",
 * HOST0, whose memory is host memory and whose operations are plain loops on the CPU, each
 * written as its CUDA kernel computes (the same arithmetic and rounding, one row after another).
 * It is a reference, not a way to run fast: with SLUICE_GPU_BACKEND=host, executor/gpu.c's
 * forward pass (-ngl) runs without a device, so its tests run everywhere, under the sanitizers
 * too (device memory here is host memory they watch; it starts as 0xff bytes, NaN as floats and
 * halves, so a read of something never written shows). Argument checks are CUDA's. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "cuda/gpu.h"
#include "forward_impl.h"
#include "kernels/kernels.h"

#define HOST_ALIGN       256  /* as cudaMalloc's */
#define HOST_ATT_MAX_DIM 4096 /* CUDA's limits, kept so both refuse the same calls */
#define HOST_ROUTE_MAX_E 4096
#define HOST_ROUTE_MAX_K 64
#define HOST_GEMM_BK     32
#define HOST_GRID_Y_MAX  65535

static _Thread_local char h_err[256];

static int h_bad(const char *what)
{
    snprintf(h_err, sizeof(h_err), "%s: invalid argument", what);
    return -1;
}

/* Records a failure reported elsewhere, as one line (cut to fit). */
static int h_failed(const char *msg)
{
    snprintf(h_err, sizeof(h_err), "%.*s", (int)sizeof(h_err) - 1, msg);
    return -1;
}

int gpu_host_error(const char *msg)
{
    return h_failed(msg);
}

/* ---- graphs ---------------------------------------------------------------------------------- */

/* A graph here is the list of kernel operations queued on the thread between gpu_graph_begin
 * and gpu_graph_end, each with the arguments it was called with (host arrays copied), run again
 * in order by gpu_graph_launch: as CUDA's graphs, its kernels read device memory as it is when
 * they run, and the arguments they were captured with. Any other stream operation during a
 * capture (a copy, a wait, a synchronisation) fails the capture, as CUDA's do. */
#define H_MAX_ARGS 20
union h_arg {
    int64_t i;
    double  d;
    void   *p; /* recorded as uintptr_t: any pointer, const or not */
};
struct h_call {
    int (*run)(const union h_arg *a);
    union h_arg a[H_MAX_ARGS];
    void       *own; /* host arrays the arguments point into (freed with the graph) */
};
struct gpu_graph {
    struct h_call *calls;
    size_t         n, cap;
};
static _Thread_local struct gpu_graph *h_cap; /* the capture under way on this thread */
static _Thread_local bool              h_cap_failed;
static _Thread_local int               h_cap_dev; /* the device current when it began */

/* Appends a call to the capture; -1 (the capture failed) when out of memory. */
static int h_record(int (*run)(const union h_arg *a), const union h_arg *a, size_t n, void *own)
{
    struct gpu_graph *g = h_cap;
    if (n > H_MAX_ARGS ||
        (g->n == g->cap && !(g->calls = realloc(g->calls, (g->cap = g->cap ? 2 * g->cap : 64) *
                                                              sizeof(*g->calls))))) {
        free(own);
        h_cap_failed = true;
        g->n = g->cap = 0;
        return h_failed("recording a graph: out of memory");
    }
    struct h_call *c = &g->calls[g->n++];
    c->run = run;
    memcpy(c->a, a, n * sizeof(*a));
    c->own = own;
    return 0;
}

/* A stream operation that is no kernel, during a capture: the capture fails. */
static int h_not_captured(const char *what)
{
    h_cap_failed = true;
    snprintf(h_err, sizeof(h_err), "%s: not allowed during a graph capture", what);
    return -1;
}

#define HP(x)                                                                                      \
    {                                                                                              \
        .p = (void *)(uintptr_t)(x)                                                                \
    }
#define HI(x)                                                                                      \
    {                                                                                              \
        .i = (int64_t)(x)                                                                          \
    }
#define HF(x)                                                                                      \
    {                                                                                              \
        .d = (double)(x)                                                                           \
    }
/* First in a kernel operation: while the thread captures, the call is recorded (run replays it
 * from the recorded arguments), not made. */
#define H_RECORD(run, ...)                                                                         \
    do {                                                                                           \
        if (h_cap) {                                                                               \
            const union h_arg a_[] = {__VA_ARGS__};                                                \
            return h_record(run, a_, sizeof(a_) / sizeof(a_[0]), NULL);                            \
        }                                                                                          \
    } while (0)
/* First in a stream operation that is no kernel. */
#define H_NOT_CAPTURED(what)                                                                       \
    do {                                                                                           \
        if (h_cap)                                                                                 \
            return h_not_captured(what);                                                           \
    } while (0)

/* ---- device and memory ---------------------------------------------------------------------- */

/* SLUICE_GPU_HOST_DEVICES=N (1 to 8; 1 without it) devices, HOST0..: their memory is all host
 * memory, but each allocation belongs to the device current for the thread that made it, and
 * the operations below refuse memory of a device other than the caller's current one, as
 * CUDA's kernels cannot use it: a forward pass over several devices that forgets to switch
 * fails here, where it would fail (or run slowly over the bus) on the GPUs. */
static pthread_once_t    h_dev_once = PTHREAD_ONCE_INIT;
static int               h_n_dev = 1;
static _Thread_local int h_cur;    /* the calling thread's device */
static _Atomic bool      h_cpu_on; /* the CPU device (gpu_host_cpu_device) is in use */

static void h_dev_count_read(void)
{
    h_n_dev = common_host_device_count();
}

static int h_device_count(char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    (void)pthread_once(&h_dev_once, h_dev_count_read);
    return h_n_dev;
}

/* The devices whose memory is told apart: HOST0.. and, once in use, the CPU device after them. */
static int h_n_all(void)
{
    return h_device_count(NULL, 0) + (h_cpu_on ? 1 : 0);
}

int gpu_host_cpu_device(void)
{
    h_cpu_on = true;
    return h_device_count(NULL, 0);
}

/* A device's name in messages: HOST0.., CPU for the one after them. */
static const char *h_name(int dev, char *buf, size_t len)
{
    if (dev == h_device_count(NULL, 0))
        snprintf(buf, len, "CPU");
    else
        snprintf(buf, len, "HOST%d", dev);
    return buf;
}

/* The allocations of every device, sorted by address (only kept with two devices or more). */
struct h_block {
    uintptr_t p;
    size_t    bytes;
    int       dev;
};
static pthread_mutex_t h_blk_mu = PTHREAD_MUTEX_INITIALIZER;
static struct h_block *h_blks;
static size_t          h_n_blks, h_cap_blks;

/* Index of the first block whose start is above a. */
static size_t h_blk_after(uintptr_t a)
{
    size_t lo = 0, hi = h_n_blks;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (h_blks[mid].p <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Records [p, p + bytes) as the current device's; false when out of memory. */
static bool h_blk_add(const void *p, size_t bytes)
{
    if (h_n_all() < 2)
        return true;
    pthread_mutex_lock(&h_blk_mu);
    bool ok = true;
    if (h_n_blks == h_cap_blks) {
        const size_t    cap = h_cap_blks ? h_cap_blks * 2 : 256;
        struct h_block *b = realloc(h_blks, cap * sizeof(*b));
        if (b) {
            h_blks = b;
            h_cap_blks = cap;
        }
        ok = b != NULL;
    }
    if (ok) {
        const size_t i = h_blk_after((uintptr_t)p);
        memmove(&h_blks[i + 1], &h_blks[i], (h_n_blks - i) * sizeof(*h_blks));
        h_blks[i] = (struct h_block){(uintptr_t)p, bytes, h_cur};
        h_n_blks++;
    }
    pthread_mutex_unlock(&h_blk_mu);
    return ok;
}

static void h_blk_remove(const void *p)
{
    if (!p || h_n_all() < 2)
        return;
    pthread_mutex_lock(&h_blk_mu);
    const size_t i = h_blk_after((uintptr_t)p);
    if (i > 0 && h_blks[i - 1].p == (uintptr_t)p) {
        memmove(&h_blks[i - 1], &h_blks[i], (h_n_blks - i) * sizeof(*h_blks));
        h_n_blks--;
    }
    pthread_mutex_unlock(&h_blk_mu);
}

/* -1 (error recorded under `what`) when a or b is memory of a device other than the calling
 * thread's current one; memory no device allocated (a fetcher's, mapped) passes. */
static int h_here(const void *a, const void *b, const char *what)
{
    if (h_n_all() < 2)
        return 0;
    const void *ps[2] = {a, b};
    int         other = -1;
    pthread_mutex_lock(&h_blk_mu);
    for (int k = 0; k < 2 && other < 0; k++) {
        const size_t i = ps[k] ? h_blk_after((uintptr_t)ps[k]) : 0;
        if (i > 0 && (uintptr_t)ps[k] < h_blks[i - 1].p + h_blks[i - 1].bytes &&
            h_blks[i - 1].dev != h_cur)
            other = h_blks[i - 1].dev;
    }
    pthread_mutex_unlock(&h_blk_mu);
    if (other < 0)
        return 0;
    char on[16], cur[16];
    snprintf(h_err, sizeof(h_err), "%s: memory of %s used on %s (the thread's device)", what,
             h_name(other, on, sizeof(on)), h_name(h_cur, cur, sizeof(cur)));
    return -1;
}

static int h_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    const int n = h_device_count(NULL, 0);
    if (dev < 0 || dev >= h_n_all()) {
        if (why && why_len)
            snprintf(why, why_len, "device HOST%d does not exist (%d device%s: HOST0..HOST%d)", dev,
                     n, n == 1 ? "" : "s", n - 1);
        return -1;
    }
    h_cur = dev;
    if (info) {
        memset(info, 0, sizeof(*info));
        snprintf(info->name, sizeof(info->name), "host memory, the CPU reference backend");
        if (n > 1) /* the host's memory shared by the devices */
            snprintf(info->name + strlen(info->name), sizeof(info->name) - strlen(info->name),
                     " (%d of %d)", dev + 1, n);
        long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
        long page = sysconf(_SC_PAGESIZE), cpus = sysconf(_SC_NPROCESSORS_ONLN);
        info->total_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
        info->free_bytes = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
        info->n_sm = cpus > 0 ? (int)cpus : 1;
    }
    return 0;
}

static int h_use(int dev)
{
    if (dev < 0 || dev >= h_n_all())
        return h_bad("selecting the device");
    /* CUDA would queue the next kernels on the other device's stream, outside the capture */
    if (h_cap && dev != h_cap_dev)
        return h_not_captured("selecting another device");
    h_cur = dev;
    return 0;
}

static int h_current(void)
{
    return h_cur;
}

static const char *h_last_error(void)
{
    return h_err;
}

static void *h_alloc(size_t bytes)
{
    if (h_cap) { /* cudaMalloc ends a capture of this thread's (its mode: thread-local) */
        (void)h_not_captured("allocating device memory");
        return NULL;
    }
    const size_t n = (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
    void        *p = aligned_alloc(HOST_ALIGN, n ? n : HOST_ALIGN);
    if (!p) {
        snprintf(h_err, sizeof(h_err), "allocating %zu bytes: out of memory", bytes);
        return NULL;
    }
    memset(p, 0xff, n ? n : HOST_ALIGN);
    if (!h_blk_add(p, n ? n : HOST_ALIGN)) {
        free(p);
        snprintf(h_err, sizeof(h_err), "allocating %zu bytes: out of memory", bytes);
        return NULL;
    }
    return p;
}

static void h_release(void *p)
{
    if (h_cap && p)
        (void)h_not_captured("freeing device memory"); /* as cudaFree: the capture fails */
    h_blk_remove(p);
    free(p);
}

static int h_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes && (!dst || !src))
        return h_bad("copying memory");
    if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int h_upload(void *dst, const void *src, size_t bytes)
{
    H_NOT_CAPTURED("copying to the device");
    return h_here(dst, NULL, "copying to the device") < 0 ? -1 : h_copy(dst, src, bytes);
}

static bool h_registered(const void *p, size_t bytes);

static int h_upload_queued(void *dst, const void *src, size_t bytes)
{
    H_NOT_CAPTURED("copying to the device");
    if (h_here(dst, NULL, "copying to the device") < 0)
        return -1;
    if (bytes && !h_registered(src, bytes))
        return h_failed("copying to the device without a wait: the source is not registered host "
                        "memory (gpu_host_register)");
    return h_copy(dst, src, bytes); /* the stream here runs each operation as it is queued */
}

static int h_download(void *dst, const void *src, size_t bytes)
{
    H_NOT_CAPTURED("copying from the device");
    return h_here(src, NULL, "copying from the device") < 0 ? -1 : h_copy(dst, src, bytes);
}

static int hg_fill(const union h_arg *a);
static int h_fill(void *dst, int byte, size_t bytes)
{
    H_RECORD(hg_fill, HP(dst), HI(byte), HI(bytes));
    if (h_here(dst, NULL, "clearing device memory") < 0)
        return -1;
    if (bytes && !dst)
        return h_bad("clearing device memory");
    if (bytes)
        memset(dst, byte, bytes);
    return 0;
}

static int h_sync(void)
{
    H_NOT_CAPTURED("synchronising");
    return 0;
}

static double h_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the copy stream: a thread ----------------------------------------------------------------
 */

/* An event: done once the copier has done `seq` copies (0: done from the start). Kernels run in
 * the caller, so an event recorded after them is done at once. */
struct gpu_event {
    uint64_t seq;
};

struct h_job {
    void       *dst;
    const void *src;
    size_t      bytes;
};

/* The copies queued, in order, and the thread that does them (started at the first). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t  work, done_cv;
    struct h_job   *q; /* a ring of cap jobs from head */
    size_t          cap, head, n;
    uint64_t        queued, done;
    uint64_t        busy_ns, stall_ns;
    bool            started;
} hc = {.mu = PTHREAD_MUTEX_INITIALIZER,
        .work = PTHREAD_COND_INITIALIZER,
        .done_cv = PTHREAD_COND_INITIALIZER};

static uint64_t h_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *h_copier(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&hc.mu);
    for (;;) {
        while (hc.n == 0)
            pthread_cond_wait(&hc.work, &hc.mu);
        const struct h_job j = hc.q[hc.head];
        hc.head = (hc.head + 1) % hc.cap;
        hc.n--;
        pthread_mutex_unlock(&hc.mu);
        const uint64_t t0 = h_ns();
        memcpy(j.dst, j.src, j.bytes);
        const uint64_t dt = h_ns() - t0;
        pthread_mutex_lock(&hc.mu);
        hc.busy_ns += dt;
        hc.done++;
        pthread_cond_broadcast(&hc.done_cv);
    }
    return NULL;
}

static struct gpu_event *h_event_new(void)
{
    struct gpu_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        snprintf(h_err, sizeof(h_err), "creating an event: out of memory");
    return ev;
}

static void h_event_free(struct gpu_event *ev)
{
    free(ev);
}

/* The host backend's device memory is host memory: registering pins nothing, but checks what
 * CUDA checks, so that the pool's bookkeeping is tested here: the range must be mapped, and may
 * not overlap a registration (cudaErrorHostMemoryAlreadyRegistered); an unregistration names a
 * registration's start (else cudaErrorHostMemoryNotRegistered, which callers ignore). */
#define HOST_MAX_REGS 256
static pthread_mutex_t h_reg_mu = PTHREAD_MUTEX_INITIALIZER;
struct h_reg {
    uintptr_t p;
    size_t    bytes;
};
static struct h_reg h_regs[HOST_MAX_REGS];
static unsigned     h_n_regs;

static int h_host_register(const void *p, size_t bytes, bool read_only)
{
    (void)read_only;
    H_NOT_CAPTURED("registering host memory");
    if (!p || !bytes)
        return h_bad("registering host memory");
    const uintptr_t a = (uintptr_t)p;
    const void     *hole = common_unmapped_page(p, bytes);
    if (hole) {
        snprintf(h_err, sizeof(h_err), "registering host memory: %p is not mapped", hole);
        return -1;
    }
    pthread_mutex_lock(&h_reg_mu);
    int rc = 0;
    for (unsigned i = 0; i < h_n_regs && rc == 0; i++)
        if (a < h_regs[i].p + h_regs[i].bytes && h_regs[i].p < a + bytes) {
            snprintf(h_err, sizeof(h_err),
                     "registering host memory: part of it is already "
                     "registered");
            rc = -1;
        }
    if (rc == 0 && h_n_regs == HOST_MAX_REGS) {
        snprintf(h_err, sizeof(h_err), "registering host memory: out of memory");
        rc = -1;
    }
    if (rc == 0)
        h_regs[h_n_regs++] = (struct h_reg){a, bytes};
    pthread_mutex_unlock(&h_reg_mu);
    return rc;
}

/* Whether [p, p + bytes) lies in one registration. */
static bool h_registered(const void *p, size_t bytes)
{
    const uintptr_t a = (uintptr_t)p;
    bool            in = false;
    pthread_mutex_lock(&h_reg_mu);
    for (unsigned i = 0; i < h_n_regs && !in; i++)
        in = p && a >= h_regs[i].p && a - h_regs[i].p <= h_regs[i].bytes &&
             bytes <= h_regs[i].bytes - (a - h_regs[i].p);
    pthread_mutex_unlock(&h_reg_mu);
    return in;
}

static void h_host_unregister(const void *p)
{
    if (h_cap)
        (void)h_not_captured("unregistering host memory"); /* the capture fails */
    pthread_mutex_lock(&h_reg_mu);
    for (unsigned i = 0; i < h_n_regs; i++)
        if (h_regs[i].p == (uintptr_t)p) {
            h_regs[i] = h_regs[--h_n_regs];
            break;
        }
    pthread_mutex_unlock(&h_reg_mu);
}

/* Virtual memory management: address space without access until mapped, as on the device; a
 * mapped piece starts as 0xff bytes like every allocation here. */
#define HOST_VA_GRAN ((size_t)64 << 10)

static size_t h_va_granularity(void)
{
    return HOST_VA_GRAN;
}

static void *h_va_reserve(size_t bytes)
{
    if (!bytes || bytes % HOST_VA_GRAN) {
        h_bad("reserving address space");
        return NULL;
    }
    /* aligned to the granularity as CUDA's are: a larger range, its ends trimmed */
    const size_t n = bytes + HOST_VA_GRAN;
    uint8_t     *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(h_err, sizeof(h_err), "reserving %zu bytes of address space: out of memory",
                 bytes);
        return NULL;
    }
    const size_t head = (HOST_VA_GRAN - (uintptr_t)p % HOST_VA_GRAN) % HOST_VA_GRAN;
    if (head)
        (void)munmap(p, head);
    if (n - head > bytes)
        (void)munmap(p + head + bytes, n - head - bytes);
    if (!h_blk_add(p + head, bytes)) {
        (void)munmap(p + head, bytes);
        snprintf(h_err, sizeof(h_err), "reserving address space: out of memory");
        return NULL;
    }
    return p + head;
}

static int h_va_map(void *at, size_t bytes)
{
    if (!at || !bytes || bytes % HOST_VA_GRAN || (uintptr_t)at % HOST_VA_GRAN)
        return h_bad("mapping device memory");
    if (mprotect(at, bytes, PROT_READ | PROT_WRITE) != 0) {
        snprintf(h_err, sizeof(h_err), "mapping %zu bytes of device memory: out of memory", bytes);
        return -1;
    }
    memset(at, 0xff, bytes);
    return 0;
}

static void h_va_unmap(void *at, size_t bytes)
{
    if (at && bytes) {
        (void)madvise(at, bytes, MADV_DONTNEED);
        (void)mprotect(at, bytes, PROT_NONE);
    }
}

static void h_va_free(void *base, size_t bytes)
{
    h_blk_remove(base);
    if (base && bytes)
        (void)munmap(base, bytes);
}

static int h_copy_async(void *dst, const void *src, size_t bytes)
{
    H_NOT_CAPTURED("an asynchronous copy");
    if (h_here(dst, NULL, "copying to the device (copy stream)") < 0)
        return -1;
    if (bytes && (!dst || !src))
        return h_bad("copying to the device (copy stream)");
    if (!bytes)
        return 0;
    pthread_mutex_lock(&hc.mu);
    if (hc.n == hc.cap) {
        const size_t  cap = hc.cap ? hc.cap * 2 : 64;
        struct h_job *q = malloc(cap * sizeof(*q));
        if (!q) {
            pthread_mutex_unlock(&hc.mu);
            snprintf(h_err, sizeof(h_err), "copying to the device: out of memory");
            return -1;
        }
        for (size_t i = 0; i < hc.n; i++)
            q[i] = hc.q[(hc.head + i) % hc.cap];
        free(hc.q);
        hc.q = q;
        hc.cap = cap;
        hc.head = 0;
    }
    if (!hc.started) {
        pthread_t      t;
        pthread_attr_t at;
        int            rc = pthread_attr_init(&at);
        if (rc == 0) {
            (void)pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            rc = pthread_create(&t, &at, h_copier, NULL);
            (void)pthread_attr_destroy(&at);
        }
        if (rc != 0) {
            pthread_mutex_unlock(&hc.mu);
            snprintf(h_err, sizeof(h_err), "starting the copy thread: %s", strerror(rc));
            return -1;
        }
        hc.started = true;
    }
    hc.q[(hc.head + hc.n) % hc.cap] = (struct h_job){.dst = dst, .src = src, .bytes = bytes};
    hc.n++;
    hc.queued++;
    pthread_cond_signal(&hc.work);
    pthread_mutex_unlock(&hc.mu);
    return 0;
}

static int h_event_record_copy(struct gpu_event *ev)
{
    H_NOT_CAPTURED("recording an event");
    if (!ev)
        return h_bad("recording an event (copy stream)");
    pthread_mutex_lock(&hc.mu);
    ev->seq = hc.queued;
    pthread_mutex_unlock(&hc.mu);
    return 0;
}

static int h_event_record_kernels(struct gpu_event *ev)
{
    H_NOT_CAPTURED("recording an event");
    if (!ev)
        return h_bad("recording an event");
    pthread_mutex_lock(&hc.mu);
    ev->seq = 0; /* the kernels before it have run */
    pthread_mutex_unlock(&hc.mu);
    return 0;
}

/* Waits until ev is done; the time counts as the kernels' stall when `stall`. */
static int h_wait(struct gpu_event *ev, bool stall)
{
    if (!ev)
        return h_bad("waiting for an event");
    pthread_mutex_lock(&hc.mu);
    if (hc.done < ev->seq) {
        const uint64_t t0 = h_ns();
        while (hc.done < ev->seq)
            pthread_cond_wait(&hc.done_cv, &hc.mu);
        if (stall)
            hc.stall_ns += h_ns() - t0;
    }
    pthread_mutex_unlock(&hc.mu);
    return 0;
}

static int h_stream_wait(struct gpu_event *ev)
{
    H_NOT_CAPTURED("waiting for an event");
    return h_wait(ev, true);
}

/* Another process's event: the kernels run in the caller, so it waits here. */
static int h_stream_wait_shared(struct common_devmem_event *ev)
{
    H_NOT_CAPTURED("waiting for a shared event");
    struct common_errmsg e = {{0}};
    if (!ev || common_devmem_event_native(ev) != NULL)
        return h_bad("waiting for a shared event: not the host's emulation");
    const uint64_t t0 = h_ns();
    const int      rc = common_devmem_event_sync(ev, &e);
    pthread_mutex_lock(&hc.mu);
    hc.stall_ns += h_ns() - t0; /* the kernels' wait for another process's copies */
    pthread_mutex_unlock(&hc.mu);
    if (rc == COMMON_ECLOSED)
        return -2; /* its recorder died: a lost fetcher, not a failed device */
    if (rc != COMMON_OK)
        return h_failed(e.text);
    return 0;
}

/* The kernels queued so far are done: the record is done once this process's shared copies
 * queued before it are. */
static int h_event_record_kernels_shared(struct common_devmem_event *ev)
{
    H_NOT_CAPTURED("recording a shared event");
    struct common_errmsg e = {{0}};
    if (!ev || common_devmem_event_native(ev) != NULL)
        return h_bad("recording a shared event: not the host's emulation");
    if (common_devmem_event_record(ev, &e) != COMMON_OK)
        return h_failed(e.text);
    return 0;
}

static int h_event_sync(struct gpu_event *ev)
{
    H_NOT_CAPTURED("waiting for an event");
    return h_wait(ev, false);
}

static int h_copy_wait(struct gpu_event *ev)
{
    H_NOT_CAPTURED("waiting for an event");
    /* A kernels' event is done when recorded; a copy stream's is ordered by the queue. */
    return ev ? 0 : h_bad("waiting for kernels (copy stream)");
}

static bool h_copy_times(uint64_t *busy_ns, uint64_t *stall_ns)
{
    pthread_mutex_lock(&hc.mu);
    *busy_ns = hc.busy_ns;
    *stall_ns = hc.stall_ns;
    pthread_mutex_unlock(&hc.mu);
    return true;
}

/* The best of a few copies of `bytes`, counting bytes read and written. */
static double h_membw_probe(size_t bytes)
{
    void  *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
    double best = 0.0;
    if (a && b && bytes) {
        memset(a, 0x5a, bytes);
        memset(b, 0, bytes);
        for (int i = 0; i < 6; i++) {
            const double t0 = h_now();
            memcpy(b, a, bytes);
            const double dt = h_now() - t0;
            if (i > 0 && dt > 0.0 && (best == 0.0 || dt < best))
                best = dt;
        }
    }
    free(a);
    free(b);
    return best > 0.0 ? 2.0 * (double)bytes / best : 0.0;
}

/* ---- weights -------------------------------------------------------------------------------- */

static bool h_type_supported(uint32_t type)
{
    return gpu_type_implemented(type);
}

/* A supported type whose rows of `cols` fit row_bytes (quant.cu's row_fits). */
static bool h_row_fits(uint32_t type, int64_t cols, size_t row_bytes)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    return h_type_supported(type) && ti && cols >= 0 && cols % ti->blck == 0 &&
           (uint64_t)(cols / ti->blck) * ti->type_size <= row_bytes;
}

/* The dot product of n floats in eight interleaved f32 sums (a loop the compiler vectorizes),
 * added in a fixed order: as good as the device's warp sums, and fast enough for tests. */
static float h_dot(const float *a, const float *b, int64_t n)
{
    float   s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    for (; i < n; i++)
        s[0] += a[i] * b[i];
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* Row r of w expanded into tmp (cols floats). */
static void h_row(uint32_t type, const void *w, size_t row_bytes, int64_t r, int64_t cols,
                  float *tmp)
{
    (void)executor_dequantize_row(type, (const uint8_t *)w + (size_t)r * row_bytes, tmp, cols);
}

static int hg_dequant_rows(const union h_arg *a);
static int h_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                          const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                          bool out_f16)
{
    H_RECORD(hg_dequant_rows, HI(type), HP(w), HI(row_bytes), HI(cols), HP(ids), HI(n_rows),
             HP(out), HI(out_stride), HI(out_f16));
    static const char what[] = "gpu_dequant_rows: unsupported type or bad arguments";
    if (!h_row_fits(type, cols, row_bytes) || n_rows < 0 || (n_rows > 1 && out_stride < cols))
        return h_bad(what);
    if (n_rows == 0 || cols == 0)
        return 0;
    if (!w || !out)
        return h_bad(what);
    float *tmp = malloc((size_t)cols * sizeof(float));
    if (!tmp)
        return h_bad("gpu_dequant_rows: out of host memory");
    for (int64_t i = 0; i < n_rows; i++) {
        h_row(type, w, row_bytes, ids ? ids[i] : i, cols, tmp);
        for (int64_t c = 0; c < cols; c++) {
            if (out_f16)
                ((uint16_t *)out)[i * out_stride + c] = executor_fp32_to_fp16(tmp[c]);
            else
                ((float *)out)[i * out_stride + c] = tmp[c];
        }
    }
    free(tmp);
    return 0;
}

/* y[t * y_stride + r] = row r . x row t for the n activation rows, f32 accumulation. */
static int h_products(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                      const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    float *tmp = malloc(((size_t)cols ? (size_t)cols : 1) * sizeof(float));
    if (!tmp)
        return h_bad("matvec: out of host memory");
    for (int64_t r = 0; r < rows; r++) {
        h_row(type, w, row_bytes, r, cols, tmp);
        for (int64_t t = 0; t < n; t++)
            y[t * y_stride + r] = h_dot(tmp, x + t * x_stride, cols);
    }
    free(tmp);
    return 0;
}

static int hg_matvec(const union h_arg *a);
static int h_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                    const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    H_RECORD(hg_matvec, HI(type), HP(w), HI(row_bytes), HI(rows), HI(cols), HP(x), HI(x_stride),
             HI(n), HP(y), HI(y_stride));
    if (h_here(w, y, "gpu_matvec") < 0)
        return -1;
    static const char what[] = "gpu_matvec: unsupported type or bad arguments";
    if (!h_row_fits(type, cols, row_bytes) || rows < 0 || n < 1 || n > GPU_MATVEC_MAX_N ||
        (n > 1 && (x_stride < cols || y_stride < rows)))
        return h_bad(what);
    if (rows == 0)
        return 0;
    if (!w || !x || !y)
        return h_bad(what);
    return h_products(type, w, row_bytes, rows, cols, x, x_stride, n, y, y_stride);
}

static int hg_matvec_ids(const union h_arg *a);
static int h_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                        int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                        const float *x, int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    H_RECORD(hg_matvec_ids, HI(type), HP(w), HI(expert_bytes), HI(row_bytes), HI(rows), HI(cols),
             HP(ids), HI(n_items), HP(x), HI(x_stride), HI(x_div), HP(y), HI(y_stride));
    if (h_here(w, y, "gpu_matvec_ids") < 0)
        return -1;
    static const char what[] = "gpu_matvec_ids: unsupported type or bad arguments";
    if (!h_row_fits(type, cols, row_bytes) || rows < 0 || n_items < 0 || x_div < 1 ||
        (uint64_t)rows * row_bytes > expert_bytes || (n_items > x_div && x_stride < cols) ||
        (n_items > 1 && y_stride < rows))
        return h_bad(what);
    if (rows == 0 || n_items == 0)
        return 0;
    if (!w || !ids || !x || !y)
        return h_bad(what);
    for (int64_t i = 0; i < n_items; i++) {
        if (ids[i] < 0)
            return h_bad(what);
        const uint8_t *we = (const uint8_t *)w + (size_t)ids[i] * expert_bytes;
        if (h_products(type, we, row_bytes, rows, cols, x + (i / x_div) * x_stride, 0, 1,
                       y + i * y_stride, 0) < 0)
            return -1;
    }
    return 0;
}

static int hg_f32_to_f16(const union h_arg *a);
static int h_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out)
{
    H_RECORD(hg_f32_to_f16, HP(x), HI(x_stride), HI(n), HI(cols), HP(out));
    if (n < 0 || cols < 0 || (n > 1 && x_stride < cols))
        return h_bad("gpu_f32_to_f16: bad arguments");
    if (n == 0 || cols == 0)
        return 0;
    if (!x || !out)
        return h_bad("gpu_f32_to_f16: bad arguments");
    for (int64_t t = 0; t < n; t++)
        for (int64_t c = 0; c < cols; c++)
            out[t * cols + c] = executor_fp32_to_fp16(x[t * x_stride + c]);
    return 0;
}

static int hg_gemm_f16(const union h_arg *a);
static int h_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16,
                      int64_t n, float *y, int64_t y_stride)
{
    H_RECORD(hg_gemm_f16, HP(w16), HI(rows), HI(cols), HP(x16), HI(n), HP(y), HI(y_stride));
    static const char what[] =
        "gpu_gemm_f16: bad arguments (cols a multiple of 32, inputs 16-byte aligned)";
    if (rows < 0 || n < 0 || cols < 0 || cols % HOST_GEMM_BK != 0 || (n > 1 && y_stride < rows))
        return h_bad(what);
    if (rows == 0 || n == 0)
        return 0;
    if (!w16 || !x16 || !y || ((uintptr_t)w16 & 15) != 0 || ((uintptr_t)x16 & 15) != 0 ||
        (n + 63) / 64 > HOST_GRID_Y_MAX)
        return h_bad(what);
    float *xf = malloc((size_t)n * (size_t)cols * sizeof(float));
    float *wf = malloc((size_t)cols * sizeof(float));
    if (!xf || !wf) {
        free(xf);
        free(wf);
        return h_bad("gpu_gemm_f16: out of host memory");
    }
    for (int64_t i = 0; i < n * cols; i++)
        xf[i] = executor_fp16_to_fp32(x16[i]);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++)
            wf[c] = executor_fp16_to_fp32(w16[r * cols + c]);
        for (int64_t t = 0; t < n; t++)
            y[t * y_stride + r] = h_dot(wf, xf + t * cols, cols);
    }
    free(xf);
    free(wf);
    return 0;
}

/* gpu_gemm_q: the weights decoded, rounded to f16 as the kernel's tiles hold them, then
 * h_gemm_f16's products, row by row of the dense activations or of each tile. */
static int hg_gemm_q(const union h_arg *a);
static int h_gemm_q(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                    int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                    const struct gpu_mm_tile *tiles, int64_t n_tiles, const int32_t *n_used,
                    const int32_t *items, int32_t x_div, float *y, int64_t y_stride)
{
    H_RECORD(hg_gemm_q, HI(type), HP(w), HI(expert_bytes), HI(row_bytes), HI(rows), HI(cols),
             HP(x16), HI(n), HP(tiles), HI(n_tiles), HP(n_used), HP(items), HI(x_div), HP(y),
             HI(y_stride));
    static const char what[] = "gpu_gemm_q: unsupported type or bad arguments";
    const bool        by_tiles = tiles != NULL;
    if (!gpu_matvec_q8_supported(type) || !h_row_fits(type, cols, row_bytes) ||
        cols % HOST_GEMM_BK != 0 || rows < 0 || n < 0 || n_tiles < 0 ||
        (by_tiles && (x_div < 1 || !items)) || y_stride < rows ||
        (by_tiles && (uint64_t)rows * row_bytes > expert_bytes))
        return h_bad(what);
    const int64_t blocks_y = by_tiles ? n_tiles : (n + 63) / 64;
    if (rows == 0 || blocks_y == 0)
        return 0;
    if (cols == 0 || !w || !x16 || !y || ((uintptr_t)x16 & 15) != 0 || blocks_y > HOST_GRID_Y_MAX)
        return h_bad(what);
    /* The activations of a tile (or of the dense product) in f32, converted once. */
    const int64_t x_rows = by_tiles ? GPU_MM_TILE : n;
    float        *wf = malloc((size_t)cols * sizeof(float));
    float        *xf = malloc((size_t)x_rows * (size_t)cols * sizeof(float));
    if (!wf || !xf) {
        free(wf);
        free(xf);
        return h_bad("gpu_gemm_q: out of host memory");
    }
    int rc = 0;
    if (by_tiles && n_used && *n_used < n_tiles)
        n_tiles = *n_used < 0 ? 0 : *n_used; /* the tiles the sort made */
    for (int64_t b = 0; b < (by_tiles ? n_tiles : 1) && rc == 0; b++) {
        const struct gpu_mm_tile dense = {.expert = 0, .first = 0, .count = (int32_t)n};
        const struct gpu_mm_tile tl = by_tiles ? tiles[b] : dense;
        if (tl.expert < 0 || tl.count < 0 || (by_tiles && tl.count > GPU_MM_TILE)) {
            rc = h_bad(what);
            break;
        }
        for (int32_t j = 0; j < tl.count; j++) {
            const int64_t xr = by_tiles ? items[tl.first + j] / x_div : j;
            for (int64_t c = 0; c < cols; c++)
                xf[j * cols + c] = executor_fp16_to_fp32(x16[xr * cols + c]);
        }
        const uint8_t *we = (const uint8_t *)w + (size_t)tl.expert * (by_tiles ? expert_bytes : 0);
        for (int64_t r = 0; r < rows; r++) {
            h_row(type, we, row_bytes, r, cols, wf);
            for (int64_t c = 0; c < cols; c++)
                wf[c] = executor_fp16_to_fp32(executor_fp32_to_fp16(wf[c]));
            for (int32_t j = 0; j < tl.count; j++) {
                const int64_t yr = by_tiles ? items[tl.first + j] : j;
                y[yr * y_stride + r] = h_dot(wf, xf + j * cols, cols);
            }
        }
    }
    free(wf);
    free(xf);
    return rc;
}

/* ---- activations as the CPU rounds them (act.cu) -------------------------------------------- */

static int h_clamp_round(float v, int lo, int hi)
{
    const float r = nearbyintf(v); /* the default rounding: to nearest, ties to even */
    return r < (float)lo ? lo : r > (float)hi ? hi : (int)r;
}

/* A block of 32 as Q8_0 and Q8_1 activations: d = amax / 127 as f16, q = x * 127 / amax rounded
 * to nearest even, clamped to [-128, 127]. */
static float h_q8_32(const float *xs, int8_t *q)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(xs[j]));
    const float d = executor_fp16_to_fp32(executor_fp32_to_fp16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 32; j++)
        q[j] = (int8_t)h_clamp_round(xs[j] * id, -128, 127);
    return d;
}

/* A block of 256 as Q8_K activations: iscale = -127 / the signed value of the largest magnitude
 * (the first), q = min(127, iscale * x rounded to nearest even), d = 1 / iscale (0 for zeros). */
static float h_q8_K(const float *xs, int8_t *q)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; j++)
        if (fabsf(xs[j]) > amax) {
            amax = fabsf(xs[j]);
            max = xs[j];
        }
    if (amax == 0.0f) {
        memset(q, 0, 256);
        return 0.0f;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; j++)
        q[j] = (int8_t)h_clamp_round(iscale * xs[j], -2147483647, 127);
    return 1.0f / iscale;
}

static int hg_act_round(const union h_arg *a);
static int h_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                       float *out)
{
    H_RECORD(hg_act_round, HI(act_type), HP(x), HI(x_stride), HI(n), HI(cols), HP(out));
    if (!x || !out || n < 0 || cols < 0 || x_stride < cols)
        return h_bad("gpu_act_round: bad arguments");
    if (n == 0 || cols == 0)
        return 0;
    int8_t q[256];
    switch (act_type) {
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q8_1:
        if (cols % 32)
            return h_bad("gpu_act_round: cols not a multiple of 32");
        for (int64_t t = 0; t < n; t++)
            for (int64_t b = 0; b < cols / 32; b++) {
                float      *ys = out + t * cols + b * 32;
                const float d = h_q8_32(x + t * x_stride + b * 32, q);
                for (int j = 0; j < 32; j++)
                    ys[j] = d * (float)q[j];
            }
        return 0;
    case COMMON_GGML_TYPE_Q8_K:
        if (cols % 256)
            return h_bad("gpu_act_round: cols not a multiple of 256");
        for (int64_t t = 0; t < n; t++)
            for (int64_t b = 0; b < cols / 256; b++) {
                float      *ys = out + t * cols + b * 256;
                const float d = h_q8_K(x + t * x_stride + b * 256, q);
                for (int j = 0; j < 256; j++)
                    ys[j] = d * (float)q[j];
            }
        return 0;
    case COMMON_GGML_TYPE_F16:
    case COMMON_GGML_TYPE_BF16:
        for (int64_t t = 0; t < n; t++)
            for (int64_t c = 0; c < cols; c++) {
                const float v = x[t * x_stride + c];
                out[t * cols + c] = act_type == COMMON_GGML_TYPE_BF16
                                        ? executor_bf16_to_fp32(executor_fp32_to_bf16(v))
                                        : executor_fp16_to_fp32(executor_fp32_to_fp16(v));
            }
        return 0;
    default:
        return h_bad("gpu_act_round: not an activation type");
    }
}

static int hg_act_q8(const union h_arg *a);
static int h_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                    void *q8)
{
    H_RECORD(hg_act_q8, HI(act_type), HP(x), HI(x_stride), HI(n), HI(cols), HP(q8));
    if (h_here(x, q8, "gpu_act_q8") < 0)
        return -1;
    if (!x || !q8 || n < 0 || cols < 0 || cols % 32 || x_stride < cols || ((uintptr_t)q8 & 3) != 0)
        return h_bad("gpu_act_q8: bad arguments");
    const bool k = act_type == COMMON_GGML_TYPE_Q8_K;
    if (!k && act_type != COMMON_GGML_TYPE_Q8_0 && act_type != COMMON_GGML_TYPE_Q8_1)
        return h_bad("gpu_act_q8: not an int8 activation type");
    if (k && cols % 256)
        return h_bad("gpu_act_q8: cols not a multiple of 256");
    const int64_t blk = k ? 256 : 32;
    for (int64_t t = 0; t < n; t++) {
        uint8_t *row = (uint8_t *)q8 + (size_t)t * gpu_q8_row_bytes(cols);
        float   *d = (float *)(void *)(row + cols);
        for (int64_t b = 0; b < cols / blk; b++) {
            int8_t     *q = (int8_t *)row + b * blk;
            const float db =
                k ? h_q8_K(x + t * x_stride + b * blk, q) : h_q8_32(x + t * x_stride + b * blk, q);
            for (int64_t c = 0; c < blk / 32; c++)
                d[b * (blk / 32) + c] = db;
        }
    }
    return 0;
}

/* Image row `row` expanded to floats: value j times the scale of its 32. */
static void h_q8_expand(const void *q8, int64_t row, int64_t cols, float *out)
{
    const uint8_t *r = (const uint8_t *)q8 + (size_t)row * gpu_q8_row_bytes(cols);
    const int8_t  *q = (const int8_t *)r;
    const float   *d = (const float *)(const void *)(r + cols);
    for (int64_t j = 0; j < cols; j++)
        out[j] = d[j / 32] * (float)q[j];
}

/* silu(g) * u as h_swiglu computes it. */
static float h_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* The products of w (and w2, GLU) with image rows `row0 + t * step` (t < n) into tmp (n rows of
 * `rows`, then the same for w2), and y written by op. */
static int h_q8_op(int op, uint32_t type, const uint8_t *w, const uint8_t *w2, size_t row_bytes,
                   int64_t rows, int64_t cols, const void *q8, int64_t row0, int64_t n, float *y,
                   int64_t y_stride)
{
    float *x = calloc((size_t)(n * cols), sizeof(float));
    float *tmp = calloc((size_t)(2 * n * rows), sizeof(float));
    int    rc = x && tmp ? 0 : h_bad("matvec: out of host memory");
    for (int64_t t = 0; rc == 0 && t < n; t++)
        h_q8_expand(q8, row0 + t, cols, x + t * cols);
    if (rc == 0)
        rc = h_products(type, w, row_bytes, rows, cols, x, cols, n, tmp, rows);
    if (rc == 0 && op == GPU_MV_GLU)
        rc = h_products(type, w2, row_bytes, rows, cols, x, cols, n, tmp + n * rows, rows);
    for (int64_t t = 0; rc == 0 && t < n; t++)
        for (int64_t r = 0; r < rows; r++) {
            const float v = tmp[t * rows + r];
            float      *o = y + t * y_stride + r;
            *o = op == GPU_MV_GLU   ? h_silu_mul(v, tmp[(n + t) * rows + r])
                 : op == GPU_MV_ADD ? *o + v
                                    : v;
        }
    free(x);
    free(tmp);
    return rc;
}

static int hg_matvec_q8(const union h_arg *a);
static int h_matvec_q8(int op, uint32_t type, const void *w, const void *w2, size_t row_bytes,
                       int64_t rows, int64_t cols, const void *q8, int64_t n, float *y,
                       int64_t y_stride)
{
    H_RECORD(hg_matvec_q8, HI(op), HI(type), HP(w), HP(w2), HI(row_bytes), HI(rows), HI(cols),
             HP(q8), HI(n), HP(y), HI(y_stride));
    if (h_here(w, y, "gpu_matvec_q8") < 0)
        return -1;
    static const char what[] = "gpu_matvec_q8: unsupported type or bad arguments";
    if (!gpu_matvec_q8_supported(type) || !h_row_fits(type, cols, row_bytes) || rows < 0 || n < 1 ||
        n > GPU_MATVEC_MAX_N || (n > 1 && y_stride < rows) || op < GPU_MV_SET || op > GPU_MV_GLU)
        return h_bad(what);
    if (rows == 0)
        return 0;
    if (cols == 0 || !w || !q8 || !y || ((uintptr_t)q8 & 3) != 0 || (op == GPU_MV_GLU && !w2))
        return h_bad(what);
    return h_q8_op(op, type, w, w2, row_bytes, rows, cols, q8, 0, n, y, y_stride);
}

/* Each matrix's gpu_matvec_q8 in turn. */
/* gpu_matvec_q8_cat's arrays, as a graph keeps them. */
struct h_cat {
    const void *w[GPU_CAT_MAX];
    int64_t     rows[GPU_CAT_MAX];
    float      *y[GPU_CAT_MAX];
};
static int hg_matvec_q8_cat(const union h_arg *a);
static int h_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                           size_t row_bytes, int64_t cols, const void *q8, float *const *y)
{
    if (h_cap) { /* the arrays copied: the caller's are gone when the graph runs */
        struct h_cat *c =
            n_mat >= 1 && n_mat <= GPU_CAT_MAX && w && rows && y ? malloc(sizeof(*c)) : NULL;
        if (!c)
            return h_bad("gpu_matvec_q8_cat: unsupported type or bad arguments");
        for (int i = 0; i < n_mat; i++)
            c->w[i] = w[i], c->rows[i] = rows[i], c->y[i] = y[i];
        const union h_arg a[] = {HI(type), HI(n_mat), HP(c), HI(row_bytes), HI(cols), HP(q8)};
        return h_record(hg_matvec_q8_cat, a, sizeof(a) / sizeof(a[0]), c);
    }
    if (n_mat < 1 || n_mat > GPU_CAT_MAX || !w || !rows || !y || cols == 0)
        return h_bad("gpu_matvec_q8_cat: unsupported type or bad arguments");
    for (int i = 0; i < n_mat; i++)
        if (rows[i] < 1 || h_matvec_q8(GPU_MV_SET, type, w[i], NULL, row_bytes, rows[i], cols, q8,
                                       1, y[i], rows[i]) < 0)
            return rows[i] < 1 ? h_bad("gpu_matvec_q8_cat: unsupported type or bad arguments") : -1;
    return 0;
}

static int hg_matvec_ids_q8(const union h_arg *a);
static int h_matvec_ids_q8(uint32_t type, const void *w, const void *w2, size_t expert_bytes,
                           size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                           int64_t n_items, const void *q8, int64_t x_div, float *y,
                           int64_t y_stride)
{
    H_RECORD(hg_matvec_ids_q8, HI(type), HP(w), HP(w2), HI(expert_bytes), HI(row_bytes), HI(rows),
             HI(cols), HP(ids), HI(n_items), HP(q8), HI(x_div), HP(y), HI(y_stride));
    if (h_here(w, y, "gpu_matvec_ids_q8") < 0)
        return -1;
    static const char what[] = "gpu_matvec_ids_q8: unsupported type or bad arguments";
    if (!gpu_matvec_q8_supported(type) || !h_row_fits(type, cols, row_bytes) || rows < 0 ||
        n_items < 0 || x_div < 1 || (uint64_t)rows * row_bytes > expert_bytes ||
        (n_items > 1 && y_stride < rows))
        return h_bad(what);
    if (rows == 0 || n_items == 0)
        return 0;
    if (cols == 0 || !w || !ids || !q8 || !y || ((uintptr_t)q8 & 3) != 0)
        return h_bad(what);
    int rc = 0;
    for (int64_t i = 0; i < n_items && rc == 0; i++) {
        if (ids[i] < 0)
            return h_bad(what);
        const size_t off = (size_t)ids[i] * expert_bytes;
        rc = h_q8_op(w2 ? GPU_MV_GLU : GPU_MV_SET, type, (const uint8_t *)w + off,
                     w2 ? (const uint8_t *)w2 + off : NULL, row_bytes, rows, cols, q8, i / x_div, 1,
                     y + i * y_stride, 0);
    }
    return rc;
}

static int h_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                         uint32_t ne);

/* Each token's k down products into a scratch of k rows, then gpu_moe_combine's sum. */
static int hg_matvec_ids_combine_q8(const union h_arg *a);
static int h_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes,
                                   size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                                   const float *sel_w, int64_t n_tok, int32_t k, const void *q8,
                                   float *x, int64_t x_stride)
{
    H_RECORD(hg_matvec_ids_combine_q8, HI(type), HP(w), HI(expert_bytes), HI(row_bytes), HI(rows),
             HI(cols), HP(ids), HP(sel_w), HI(n_tok), HI(k), HP(q8), HP(x), HI(x_stride));
    static const char what[] = "gpu_matvec_ids_combine_q8: unsupported type or bad arguments";
    if (h_here(w, x, "gpu_matvec_ids_combine_q8") < 0)
        return -1;
    if (k < 1 || n_tok < 0 || rows < 0 || rows > UINT32_MAX || (n_tok > 1 && x_stride < rows))
        return h_bad(what);
    if (rows == 0 || n_tok == 0)
        return 0;
    if (!sel_w || !x)
        return h_bad(what);
    float *y = malloc((size_t)k * (size_t)rows * sizeof(float));
    if (!y)
        return h_bad("gpu_matvec_ids_combine_q8: out of host memory");
    int rc = 0;
    for (int64_t t = 0; t < n_tok && rc == 0; t++) {
        const uint8_t *img = (const uint8_t *)q8 + (size_t)(t * k) * gpu_q8_row_bytes(cols);
        rc = h_matvec_ids_q8(type, w, NULL, expert_bytes, row_bytes, rows, cols, ids + t * k, k,
                             q8 ? img : NULL, 1, y, rows);
        if (rc == 0)
            rc = h_moe_combine(x + t * x_stride, y, sel_w + t * k, 1, (uint32_t)k, (uint32_t)rows);
    }
    free(y);
    return rc;
}

static int hg_matvec_groups_q8(const union h_arg *a);
static int h_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                              int64_t rows, int64_t cols, const struct gpu_group *groups,
                              int64_t n_groups, const void *q8, float *y, int64_t y_stride)
{
    H_RECORD(hg_matvec_groups_q8, HI(type), HP(w), HI(expert_bytes), HI(row_bytes), HI(rows),
             HI(cols), HP(groups), HI(n_groups), HP(q8), HP(y), HI(y_stride));
    if (h_here(w, y, "gpu_matvec_groups_q8") < 0)
        return -1;
    static const char what[] = "gpu_matvec_groups_q8: unsupported type or bad arguments";
    if (!gpu_matvec_q8_supported(type) || !h_row_fits(type, cols, row_bytes) || rows < 0 ||
        n_groups < 0 || (uint64_t)rows * row_bytes > expert_bytes || y_stride < rows)
        return h_bad(what);
    if (rows == 0 || n_groups == 0)
        return 0;
    if (cols == 0 || !w || !groups || !q8 || !y || ((uintptr_t)q8 & 3) != 0)
        return h_bad(what);
    float *x = malloc((size_t)cols * sizeof(float));
    if (!x)
        return h_bad("matvec: out of host memory");
    int rc = 0;
    for (int64_t i = 0; i < n_groups && rc == 0; i++) {
        const struct gpu_group *g = &groups[i];
        if (g->expert < 0 || g->n < 1 || g->n > GPU_GROUP_MAX) {
            rc = h_bad(what);
            break;
        }
        for (int t = 0; t < g->n && rc == 0; t++) {
            h_q8_expand(q8, g->x_row[t], cols, x);
            rc = h_products(type, (const uint8_t *)w + (size_t)g->expert * expert_bytes, row_bytes,
                            rows, cols, x, 0, 1, y + (int64_t)g->y_row[t] * y_stride, 0);
        }
    }
    free(x);
    return rc;
}

/* ---- the other operations of a layer (ops.cu) ----------------------------------------------- */

static int hg_rmsnorm(const union h_arg *a);
static int h_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                     int64_t n_rows, int64_t width, float eps)
{
    H_RECORD(hg_rmsnorm, HP(y), HI(y_stride), HP(x), HI(x_stride), HP(w), HI(n_rows), HI(width),
             HF(eps));
    if (h_here(y, x, "gpu_rmsnorm") < 0)
        return -1;
    if (!y || !x || !w || n_rows < 0 || n_rows > INT32_MAX || width < 1 || y_stride < width ||
        x_stride < width)
        return h_bad("gpu_rmsnorm: bad arguments");
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * x_stride;
        float       *yr = y + r * y_stride;
        double       sum = 0.0;
        for (int64_t i = 0; i < width; i++)
            sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)width);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int64_t i = 0; i < width; i++)
            yr[i] = (xr[i] * scale) * w[i];
    }
    return 0;
}

/* The two operations it fuses, one after the other (y not x: x is read once). */
static int hg_rmsnorm_q8(const union h_arg *a);
static int h_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride,
                        const float *w, int64_t n_rows, int64_t width, float eps, uint32_t act_type,
                        void *q8)
{
    H_RECORD(hg_rmsnorm_q8, HP(y), HI(y_stride), HP(x), HI(x_stride), HP(w), HI(n_rows), HI(width),
             HF(eps), HI(act_type), HP(q8));
    if (y == x && n_rows > 0)
        return h_bad("gpu_rmsnorm_q8: bad arguments");
    return h_rmsnorm(y, y_stride, x, x_stride, w, n_rows, width, eps) < 0
               ? -1
               : h_act_q8(act_type, y, y_stride, n_rows, width, q8);
}

static int hg_add(const union h_arg *a);
static int h_add(float *y, const float *a, const float *b, int64_t n)
{
    H_RECORD(hg_add, HP(y), HP(a), HP(b), HI(n));
    if (h_here(y, a, "gpu_add") < 0)
        return -1;
    if (!y || !a || !b || n < 0)
        return h_bad("gpu_add: bad arguments");
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
    return 0;
}

/* Row r's bias row: ids[r] (row 0 without ids), or -1 when it is out of range (ops.cu's). */
static int64_t h_bias_row(const int32_t *ids, int64_t r, int32_t n_bias)
{
    const int32_t e = ids ? ids[r] : 0;
    return e >= 0 && e < n_bias ? e : -1;
}

static int hg_add_bias(const union h_arg *a);
static int h_add_bias(float *y, int64_t stride, const float *bias, int32_t n_bias,
                      const int32_t *ids, int64_t n_rows, int64_t width)
{
    H_RECORD(hg_add_bias, HP(y), HI(stride), HP(bias), HI(n_bias), HP(ids), HI(n_rows), HI(width));
    if (!y || !bias || n_bias < 1 || n_rows < 0 || width < 0 || stride < width)
        return h_bad("gpu_add_bias: bad arguments");
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t e = h_bias_row(ids, r, n_bias);
        for (int64_t c = 0; e >= 0 && c < width; c++)
            y[r * stride + c] += bias[e * width + c];
    }
    return 0;
}

static int hg_scale_rows(const union h_arg *a);
static int h_scale_rows(float *y, int64_t stride, int64_t n_rows, int64_t width, float s)
{
    H_RECORD(hg_scale_rows, HP(y), HI(stride), HI(n_rows), HI(width), HF(s));
    if (!y || n_rows < 0 || width < 0 || stride < width)
        return h_bad("gpu_scale_rows: bad arguments");
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t c = 0; c < width; c++)
            y[r * stride + c] *= s;
    return 0;
}

static int hg_swiglu(const union h_arg *a);
static int h_swiglu(float *g, const float *u, int64_t n, bool relu2)
{
    H_RECORD(hg_swiglu, HP(g), HP(u), HI(n), HI(relu2));
    if (!g || !u || n < 0)
        return h_bad("gpu_swiglu: bad arguments");
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        float       a;
        if (relu2) {
            const float r = x > 0.0f ? x : 0.0f;
            a = r * r;
        } else {
            a = x / (1.0f + expf(-x));
        }
        g[i] = a * u[i];
    }
    return 0;
}

static int hg_swiglu_oai(const union h_arg *a);
static int h_swiglu_oai(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                        const float *ub, int32_t n_bias, const int32_t *ids)
{
    H_RECORD(hg_swiglu_oai, HP(g), HP(u), HI(n_rows), HI(width), HP(gb), HP(ub), HI(n_bias),
             HP(ids));
    if (!g || !u || !gb || !ub || n_bias < 1 || n_rows < 0 || width < 0)
        return h_bad("gpu_swiglu_oai: bad arguments");
    const float alpha = 1.702f, limit = 7.0f;
    for (int64_t r = 0; r < n_rows; r++) {
        const int64_t e = h_bias_row(ids, r, n_bias);
        for (int64_t c = 0; e >= 0 && c < width; c++) {
            const int64_t i = r * width + c;
            const float   gv = g[i] + gb[e * width + c], uv = u[i] + ub[e * width + c];
            const float   x = gv < limit ? gv : limit;
            const float   y = uv < -limit ? -limit : uv > limit ? limit : uv;
            g[i] = x / (1.0f + expf(alpha * (-x))) * (y + 1.0f);
        }
    }
    return 0;
}

static int hg_rope(const union h_arg *a);
static int h_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
                  uint32_t n_rot, const float *cs, bool neox)
{
    H_RECORD(hg_rope, HP(v), HI(n_tok), HI(tok_stride), HI(n_heads), HI(head_dim), HI(n_rot),
             HP(cs), HI(neox));
    if (h_here(v, cs, "gpu_rope") < 0)
        return -1;
    if (!v || !cs || n_tok < 0 || n_rot > head_dim ||
        tok_stride < (int64_t)n_heads * (int64_t)head_dim)
        return h_bad("gpu_rope: bad arguments");
    const uint32_t half = n_rot / 2;
    for (int64_t t = 0; t < n_tok; t++)
        for (uint32_t h = 0; h < n_heads; h++) {
            float *x = v + t * tok_stride + (int64_t)h * head_dim;
            for (uint32_t i = 0; i < half; i++) {
                const uint32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                const float    c = cs[t * n_rot + 2 * i], s = cs[t * n_rot + 2 * i + 1];
                const float    x0 = x[a], x1 = x[b];
                x[a] = x0 * c - x1 * s;
                x[b] = x0 * s + x1 * c;
            }
        }
    return 0;
}

static int hg_kv_store(const union h_arg *a);
static int h_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                      const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                      uint32_t n_tok)
{
    H_RECORD(hg_kv_store, HP(k_cache), HP(v_cache), HI(k_width), HI(v_width), HP(k), HP(v),
             HI(pos0), HP(pos_dev), HI(n_tok));
    if (h_here(k_cache, k, "gpu_kv_store") < 0)
        return -1;
    if ((k_width && (!k_cache || !k)) || (v_width && (!v_cache || !v)))
        return h_bad("gpu_kv_store: bad arguments");
    if (pos_dev)
        pos0 = *pos_dev;
    for (uint32_t t = 0; t < n_tok; t++) {
        for (uint32_t c = 0; c < k_width; c++)
            k_cache[((int64_t)pos0 + t) * k_width + c] =
                executor_fp32_to_fp16(k[(int64_t)t * k_width + c]);
        for (uint32_t c = 0; c < v_width; c++)
            v_cache[((int64_t)pos0 + t) * v_width + c] =
                executor_fp32_to_fp16(v[(int64_t)t * v_width + c]);
    }
    return 0;
}

static int hg_rope_qk(const union h_arg *a);
/* The norms over each head, then both RoPEs and the cache store, as the separate operations. */
static int h_rope_qk(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                     uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                     const float *cs, bool neox, const float *q_norm, const float *k_norm,
                     float eps, const struct gpu_kv_dst *kv)
{
    if (h_cap) { /* kv copied: the caller's is gone when the graph runs */
        struct gpu_kv_dst *k2 = kv ? malloc(sizeof(*k2)) : NULL;
        if (kv && !k2)
            return h_failed("recording a graph: out of memory");
        if (k2)
            *k2 = *kv;
        const union h_arg a[] = {HP(q),         HI(q_stride), HI(n_head),   HP(k),     HI(k_stride),
                                 HI(n_head_kv), HI(n_tok),    HI(head_dim), HI(n_rot), HP(cs),
                                 HI(neox),      HP(q_norm),   HP(k_norm),   HF(eps),   HP(k2)};
        return h_record(hg_rope_qk, a, sizeof(a) / sizeof(a[0]), k2);
    }
    if (!q || !k || !cs || n_tok < 0 || head_dim == 0 || n_rot > head_dim ||
        q_stride < (int64_t)n_head * head_dim || k_stride < (int64_t)n_head_kv * head_dim ||
        (kv && (k_stride != (int64_t)n_head_kv * head_dim || !kv->k_cache || !kv->v_cache ||
                !kv->v || n_tok > UINT32_MAX)))
        return h_bad("gpu_rope_qk: bad arguments");
    for (int64_t t = 0; t < n_tok; t++)
        if ((q_norm && h_rmsnorm(q + t * q_stride, head_dim, q + t * q_stride, head_dim, q_norm,
                                 n_head, head_dim, eps) < 0) ||
            (k_norm && h_rmsnorm(k + t * k_stride, head_dim, k + t * k_stride, head_dim, k_norm,
                                 n_head_kv, head_dim, eps) < 0))
            return -1;
    if (h_rope(q, n_tok, q_stride, n_head, head_dim, n_rot, cs, neox) < 0 ||
        h_rope(k, n_tok, k_stride, n_head_kv, head_dim, n_rot, cs, neox) < 0)
        return -1;
    return kv ? h_kv_store(kv->k_cache, kv->v_cache, n_head_kv * head_dim,
                           n_head_kv * kv->head_dim_v, k, kv->v, kv->pos0, kv->pos_dev,
                           (uint32_t)n_tok)
              : 0;
}

static float h_round_f16(float x)
{
    return executor_fp16_to_fp32(executor_fp32_to_fp16(x));
}

/* The attention kernels' softmax over sc[lo, hi): exp(s - max) in place, in f32; returns one
 * over their sum (the probabilities are sc[p] times it). A sink (sinks NULL: none) takes part in
 * the max and the sum. */
static float h_softmax_exp(float *sc, uint32_t lo, uint32_t hi, const float *sink)
{
    float mx = sink ? *sink : -INFINITY, total = 0.0f;
    for (uint32_t p = lo; p < hi; p++)
        mx = fmaxf(mx, sc[p]);
    for (uint32_t p = lo; p < hi; p++) {
        sc[p] = expf(sc[p] - mx);
        total += sc[p];
    }
    if (sink)
        total += expf(*sink - mx);
    return 1.0f / total;
}

/* As the CUDA kernel with one chunk per row: the query rounded to f16, scaled scores, their max,
 * exp(score - max) and its sum in f32, the probabilities normalised and rounded to f16 before
 * the value sum. */
static int hg_attention(const union h_arg *a);
static int h_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                       uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                       uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                       uint32_t head_dim_v, float scale, uint32_t window, float *scratch,
                       const float *sinks)
{
    H_RECORD(hg_attention, HP(out), HP(q), HP(k_cache), HP(v_cache), HI(n_tok), HI(pos0),
             HP(pos_dev), HI(row_stride), HI(n_head), HI(n_head_kv), HI(head_dim_k), HI(head_dim_v),
             HF(scale), HI(window), HP(scratch), HP(sinks));
    if (h_here(out, k_cache, "gpu_attention") < 0)
        return -1;
    if (pos_dev) {
        pos0 = *pos_dev;
        if ((uint64_t)pos0 + n_tok > row_stride)
            return h_bad("gpu_attention: positions past the scratch's row");
    }
    if (!out || !q || !k_cache || (!v_cache && (n_head_kv != 1 || head_dim_v > head_dim_k)) ||
        !scratch || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || head_dim_k == 0 ||
        head_dim_v == 0 || head_dim_k > HOST_ATT_MAX_DIM || head_dim_v > HOST_ATT_MAX_DIM ||
        (uint64_t)pos0 + n_tok > INT32_MAX || (uint64_t)n_tok * n_head > INT32_MAX)
        return h_bad("gpu_attention: bad arguments");
    if (n_tok == 0)
        return 0;
    const uint32_t gqa = n_head / n_head_kv;
    const int64_t  k_width = (int64_t)n_head_kv * head_dim_k,
                  v_width = v_cache ? (int64_t)n_head_kv * head_dim_v : k_width;
    if (!v_cache) /* latent attention: the values head the key rows */
        v_cache = k_cache;
    float *qr = malloc(head_dim_k * sizeof(float)), *kf = malloc(head_dim_k * sizeof(float));
    float *sc = malloc(((size_t)pos0 + n_tok) * sizeof(float));
    if (!qr || !kf || !sc) {
        free(qr);
        free(kf);
        free(sc);
        return h_bad("gpu_attention: out of host memory");
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        const uint32_t last = pos0 + t + 1;
        const uint32_t p_lo = window && last > window ? last - window : 0;
        for (uint32_t h = 0; h < n_head; h++) {
            const uint32_t kvh = h / gqa;
            const float   *qv = q + ((int64_t)t * n_head + h) * head_dim_k;
            for (uint32_t d = 0; d < head_dim_k; d++)
                qr[d] = h_round_f16(qv[d]);
            for (uint32_t p = p_lo; p < last; p++) {
                const uint16_t *kr = k_cache + (int64_t)p * k_width + (int64_t)kvh * head_dim_k;
                for (uint32_t d = 0; d < head_dim_k; d++)
                    kf[d] = executor_fp16_to_fp32(kr[d]);
                sc[p] = h_dot(qr, kf, head_dim_k) * scale;
            }
            const float inv = h_softmax_exp(sc, p_lo, last, sinks ? &sinks[h] : NULL);
            float      *o = out + ((int64_t)t * n_head + h) * head_dim_v;
            memset(o, 0, head_dim_v * sizeof(*o));
            for (uint32_t p = p_lo; p < last; p++) {
                const float     pr = h_round_f16(sc[p] * inv);
                const uint16_t *vr = v_cache + (int64_t)p * v_width + (int64_t)kvh * head_dim_v;
                for (uint32_t d = 0; d < head_dim_v; d++)
                    o[d] += pr * executor_fp16_to_fp32(vr[d]);
            }
        }
    }
    free(qr);
    free(kf);
    free(sc);
    return 0;
}

/* ---- the q8_0 KV cache --------------------------------------------------------------------- */

#define HOST_Q8_BLOCK 34 /* an f16 scale and 32 int8 */

/* Rows quantized by the CPU's own activation quantizer (the CUDA kernel's arithmetic). */
static int hg_kv_store_q8(const union h_arg *a);
static int h_kv_store_q8(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                         const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                         uint32_t n_tok)
{
    H_RECORD(hg_kv_store_q8, HP(k_cache), HP(v_cache), HI(k_width), HI(v_width), HP(k), HP(v),
             HI(pos0), HP(pos_dev), HI(n_tok));
    if (h_here(k_cache, k, "gpu_kv_store_q8") < 0)
        return -1;
    if (k_width % 32 || v_width % 32 || (k_width && (!k_cache || !k)) ||
        (v_width && (!v_cache || !v)))
        return h_bad("gpu_kv_store_q8: bad arguments");
    if (pos_dev)
        pos0 = *pos_dev;
    const size_t kb = (size_t)k_width / 32 * HOST_Q8_BLOCK,
                 vb = (size_t)v_width / 32 * HOST_Q8_BLOCK;
    for (uint32_t t = 0; t < n_tok; t++) {
        const size_t p = (size_t)pos0 + t;
        if ((k_width && executor_quantize_act(COMMON_GGML_TYPE_Q8_0, k + (size_t)t * k_width,
                                              (uint8_t *)k_cache + p * kb, k_width) < 0) ||
            (v_width && executor_quantize_act(COMMON_GGML_TYPE_Q8_0, v + (size_t)t * v_width,
                                              (uint8_t *)v_cache + p * vb, v_width) < 0))
            return h_bad("gpu_kv_store_q8: quantizing");
    }
    return 0;
}

/* The dot of two q8_0 rows of n values as the CUDA kernel sums it: each block's integer dot
 * times both scales, added block after block. */
static float h_dot_q8(const uint8_t *a, const uint8_t *b, uint32_t n)
{
    float s = 0.0f;
    for (uint32_t i = 0; i < n / 32; i++, a += HOST_Q8_BLOCK, b += HOST_Q8_BLOCK) {
        uint16_t da, db;
        memcpy(&da, a, 2);
        memcpy(&db, b, 2);
        int32_t isum = 0;
        for (int j = 0; j < 32; j++)
            isum += (int32_t)(int8_t)a[2 + j] * (int32_t)(int8_t)b[2 + j];
        s += (float)isum * (executor_fp16_to_fp32(da) * executor_fp16_to_fp32(db));
    }
    return s;
}

/* As the CUDA kernel: the query quantized to q8_0, scores by h_dot_q8, scaled, softmax in f32,
 * the output the probabilities (unrounded) times the dequantized values, position by position. */
static int hg_attention_q8(const union h_arg *a);
static int h_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                          uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev,
                          uint32_t row_stride, uint32_t n_head, uint32_t n_head_kv,
                          uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                          float *scratch, const float *sinks)
{
    H_RECORD(hg_attention_q8, HP(out), HP(q), HP(k_cache), HP(v_cache), HI(n_tok), HI(pos0),
             HP(pos_dev), HI(row_stride), HI(n_head), HI(n_head_kv), HI(head_dim_k), HI(head_dim_v),
             HF(scale), HI(window), HP(scratch), HP(sinks));
    if (h_here(out, k_cache, "gpu_attention_q8") < 0)
        return -1;
    if (pos_dev) {
        pos0 = *pos_dev;
        if ((uint64_t)pos0 + n_tok > row_stride)
            return h_bad("gpu_attention_q8: positions past the scratch's row");
    }
    if (!out || !q || !k_cache || (!v_cache && (n_head_kv != 1 || head_dim_v > head_dim_k)) ||
        !scratch || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || head_dim_k == 0 ||
        head_dim_v == 0 || head_dim_k % 32 || head_dim_v % 32 || head_dim_k > HOST_ATT_MAX_DIM ||
        head_dim_v > HOST_ATT_MAX_DIM || (uint64_t)pos0 + n_tok > INT32_MAX ||
        (uint64_t)n_tok * n_head > INT32_MAX)
        return h_bad("gpu_attention_q8: bad arguments");
    if (n_tok == 0)
        return 0;
    const uint32_t gqa = n_head / n_head_kv;
    const size_t   hkb = head_dim_k / 32 * HOST_Q8_BLOCK, hvb = head_dim_v / 32 * HOST_Q8_BLOCK;
    const size_t   krow = hkb * n_head_kv, vrow = v_cache ? hvb * n_head_kv : krow;
    if (!v_cache) /* latent attention: the values head the key rows */
        v_cache = k_cache;
    uint8_t *qb = malloc(hkb);
    float   *sc = malloc(((size_t)pos0 + n_tok) * sizeof(float));
    if (!qb || !sc) {
        free(qb);
        free(sc);
        return h_bad("gpu_attention_q8: out of host memory");
    }
    int rc = 0;
    for (uint32_t t = 0; t < n_tok && rc == 0; t++) {
        const uint32_t last = pos0 + t + 1;
        const uint32_t p_lo = window && last > window ? last - window : 0;
        for (uint32_t h = 0; h < n_head && rc == 0; h++) {
            const uint32_t kvh = h / gqa;
            if (executor_quantize_act(COMMON_GGML_TYPE_Q8_0,
                                      q + ((int64_t)t * n_head + h) * head_dim_k, qb,
                                      head_dim_k) < 0) {
                rc = h_bad("gpu_attention_q8: quantizing the query");
                break;
            }
            for (uint32_t p = p_lo; p < last; p++)
                sc[p] = h_dot_q8(qb, (const uint8_t *)k_cache + p * krow + kvh * hkb, head_dim_k) *
                        scale;
            const float inv = h_softmax_exp(sc, p_lo, last, sinks ? &sinks[h] : NULL);
            float      *o = out + ((int64_t)t * n_head + h) * head_dim_v;
            memset(o, 0, head_dim_v * sizeof(*o));
            for (uint32_t p = p_lo; p < last; p++) {
                const float    pr = sc[p] * inv;
                const uint8_t *vr = (const uint8_t *)v_cache + p * vrow + kvh * hvb;
                for (uint32_t d = 0; d < head_dim_v; d++) {
                    const uint8_t *blk = vr + (size_t)(d / 32) * HOST_Q8_BLOCK;
                    uint16_t       dv;
                    memcpy(&dv, blk, 2);
                    o[d] += pr * (executor_fp16_to_fp32(dv) * (float)(int8_t)blk[2 + d % 32]);
                }
            }
        }
    }
    free(qb);
    free(sc);
    return rc;
}

/* gpu_moe_route's group-limited selection: the experts of every group outside the n_used best
 * (a group scoring the sum of its two best scores s) marked taken, so that none is selected. */
static void h_route_groups(const float *s, uint32_t n_expert, uint32_t n_group, uint32_t n_used,
                           unsigned char *taken)
{
    const uint32_t per = n_expert / n_group;
    float          gs[GPU_ROUTE_MAX_GROUPS];
    bool           kept[GPU_ROUTE_MAX_GROUPS] = {false};
    for (uint32_t g = 0; g < n_group; g++) {
        const float *gr = s + (size_t)g * per;
        int          b0 = -1, b1 = -1; /* the best two, ties to the lower index */
        for (uint32_t e = 0; e < per; e++)
            if (b0 < 0 || gr[e] > gr[b0]) {
                b1 = b0;
                b0 = (int)e;
            } else if (b1 < 0 || gr[e] > gr[b1]) {
                b1 = (int)e;
            }
        gs[g] = b1 < 0 ? gr[b0] : gr[b0] + gr[b1];
    }
    for (uint32_t j = 0; j < n_used; j++) {
        int bg = -1;
        for (uint32_t g = 0; g < n_group; g++)
            if (!kept[g] && (bg < 0 || gs[g] > gs[bg]))
                bg = (int)g;
        kept[bg] = true;
    }
    for (uint32_t e = 0; e < n_expert; e++)
        taken[e] = !kept[e / per];
}

static int hg_moe_route(const union h_arg *a);
static int h_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                       uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                       float scale, int32_t *sel, float *sel_w)
{
    H_RECORD(hg_moe_route, HP(logits), HP(bias), HI(n_tok), HI(n_expert), HI(k), HI(n_group),
             HI(n_group_used), HI(gating), HI(norm), HF(scale), HP(sel), HP(sel_w));
    if (h_here(logits, sel, "gpu_moe_route") < 0)
        return -1;
    if (!logits || !sel || !sel_w || n_expert == 0 || n_expert > HOST_ROUTE_MAX_E || k == 0 ||
        k > n_expert || k > HOST_ROUTE_MAX_K || gating < 0 || gating > 2 || n_tok > INT32_MAX ||
        !gpu_route_groups_ok(n_expert, k, n_group, n_group_used))
        return h_bad("gpu_moe_route: bad arguments");
    float         *p = malloc(n_expert * sizeof(float)), *s = malloc(n_expert * sizeof(float));
    unsigned char *taken = malloc(n_expert);
    if (!p || !s || !taken) {
        free(p);
        free(s);
        free(taken);
        return h_bad("gpu_moe_route: out of host memory");
    }
    for (uint32_t t = 0; t < n_tok; t++) {
        const float *l = logits + (int64_t)t * n_expert;
        if (gating == 1) {
            for (uint32_t e = 0; e < n_expert; e++)
                p[e] = 1.0f / (1.0f + expf(-l[e]));
        } else { /* gpt-oss (2): the logits; the softmax over the chosen ones comes after */
            memcpy(p, l, n_expert * sizeof(float));
            if (gating == 0)
                fwd_softmax(p, n_expert); /* the CPU's own */
        }
        for (uint32_t e = 0; e < n_expert; e++) {
            s[e] = bias ? p[e] + bias[e] : p[e];
            taken[e] = 0;
        }
        if (n_group > 1)
            h_route_groups(s, n_expert, n_group, n_group_used, taken);
        int32_t *so = sel + (int64_t)t * k;
        float   *wo = sel_w + (int64_t)t * k;
        for (uint32_t j = 0; j < k; j++) { /* the highest score, ties to the lower index */
            int bi = -1;
            for (uint32_t e = 0; e < n_expert; e++)
                if (!taken[e] && (bi < 0 || s[e] > s[bi]))
                    bi = (int)e;
            so[j] = bi;
            taken[bi] = 1;
        }
        for (uint32_t j = 0; j < k; j++)
            wo[j] = p[so[j]];
        if (gating == 2) /* the softmax of the chosen logits */
            fwd_softmax(wo, k);
        double sum = 0.0;
        for (uint32_t j = 0; j < k; j++)
            sum += (double)wo[j];
        const float fsum = (float)sum > 6.103515625e-5f ? (float)sum : 6.103515625e-5f;
        for (uint32_t j = 0; norm && j < k; j++)
            wo[j] = wo[j] / fsum;
        for (uint32_t j = 0; scale != 0.0f && scale != 1.0f && j < k; j++)
            wo[j] = wo[j] * scale;
    }
    free(p);
    free(s);
    free(taken);
    return 0;
}

/* A pick's expert, clamped into range as the CUDA sort does (the routing never writes one out of
 * range). */
static int32_t h_expert_of(int32_t x, uint32_t n_expert)
{
    return x < 0 ? 0 : (uint32_t)x >= n_expert ? (int32_t)n_expert - 1 : x;
}

/* gpu_moe_sort: a counting sort, stable, the tiles in expert order. */
static int hg_moe_sort(const union h_arg *a);
static int h_moe_sort(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile,
                      int32_t *items, struct gpu_mm_tile *tiles, int32_t *n_tiles)
{
    H_RECORD(hg_moe_sort, HP(sel), HI(n), HI(n_expert), HI(tile), HP(items), HP(tiles),
             HP(n_tiles));
    if (!sel || !items || !tiles || !n_tiles || n_expert == 0 || n_expert > HOST_ROUTE_MAX_E ||
        tile < 1 || n > INT32_MAX)
        return h_bad("gpu_moe_sort: bad arguments");
    int32_t *cur = calloc(n_expert, sizeof(int32_t));
    if (!cur)
        return h_bad("gpu_moe_sort: out of host memory");
    for (uint32_t i = 0; i < n; i++) {
        cur[h_expert_of(sel[i], n_expert)]++;
    }
    int32_t at = 0, nt = 0;
    for (uint32_t x = 0; x < n_expert; x++) {
        const int32_t c = cur[x];
        for (int32_t j = 0; j < c; j += tile)
            tiles[nt++] = (struct gpu_mm_tile){
                .expert = (int32_t)x, .first = at + j, .count = c - j < tile ? c - j : tile};
        cur[x] = at;
        at += c;
    }
    for (uint32_t i = 0; i < n; i++) {
        items[cur[h_expert_of(sel[i], n_expert)]++] = (int32_t)i;
    }
    *n_tiles = nt;
    free(cur);
    return 0;
}

static int hg_moe_combine(const union h_arg *a);
static int h_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                         uint32_t ne)
{
    H_RECORD(hg_moe_combine, HP(x), HP(y), HP(sel_w), HI(n_tok), HI(k), HI(ne));
    if (!x || !y || !sel_w || k == 0)
        return h_bad("gpu_moe_combine: bad arguments");
    for (uint32_t t = 0; t < n_tok; t++)
        for (uint32_t d = 0; d < ne; d++) {
            const float *w = sel_w + (int64_t)t * k;
            const float *yr = y + (int64_t)t * k * ne + d;
            float        acc = w[0] * yr[0];
            for (uint32_t j = 1; j < k; j++)
                acc = acc + w[j] * yr[(int64_t)j * ne];
            x[(int64_t)t * ne + d] = acc + x[(int64_t)t * ne + d];
        }
    return 0;
}

static int hg_gated_add(const union h_arg *a);
static int h_gated_add(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne)
{
    H_RECORD(hg_gated_add, HP(x), HP(y), HP(gate), HI(n_tok), HI(ne));
    if (!x || !y || !gate)
        return h_bad("gpu_gated_add: bad arguments");
    for (uint32_t t = 0; t < n_tok; t++) {
        const float g = gate[t];
        const float s = g != 0.0f ? h_silu_mul(g, 1.0f) / g : 0.5f; /* silu(g) / g */
        for (uint32_t d = 0; d < ne; d++)
            x[(int64_t)t * ne + d] = y[(int64_t)t * ne + d] * s + x[(int64_t)t * ne + d];
    }
    return 0;
}

static int h_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                  const int32_t *rows, int64_t n, int64_t width, bool gather)
{
    if (!dst || !src || (!rows && !gather) || n < 0 || width < 0 || dst_stride < width ||
        src_stride < width)
        return h_bad(gather ? "gpu_gather_rows: bad arguments" : "gpu_scatter_rows: bad arguments");
    for (int64_t r = 0; r < n; r++) {
        const int64_t rd = gather ? r : rows[r], rs = !gather ? r : rows ? rows[r] : r;
        memmove(dst + rd * dst_stride, src + rs * src_stride, (size_t)width * sizeof(float));
    }
    return 0;
}

static int hg_gather_rows(const union h_arg *a);
static int h_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                         const int32_t *rows, int64_t n, int64_t width)
{
    H_RECORD(hg_gather_rows, HP(dst), HI(dst_stride), HP(src), HI(src_stride), HP(rows), HI(n),
             HI(width));
    return h_rows(dst, dst_stride, src, src_stride, rows, n, width, true);
}

static int hg_scatter_rows(const union h_arg *a);
static int h_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                          const int32_t *rows, int64_t n, int64_t width)
{
    H_RECORD(hg_scatter_rows, HP(dst), HI(dst_stride), HP(src), HI(src_stride), HP(rows), HI(n),
             HI(width));
    return h_rows(dst, dst_stride, src, src_stride, rows, n, width, false);
}

static int hg_fill(const union h_arg *a)
{
    return h_fill((void *)a[0].p, (int)a[1].i, (size_t)a[2].i);
}

static int hg_dequant_rows(const union h_arg *a)
{
    return h_dequant_rows((uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i, (int64_t)a[3].i,
                          (const int32_t *)a[4].p, (int64_t)a[5].i, (void *)a[6].p, (int64_t)a[7].i,
                          a[8].i != 0);
}

static int hg_matvec(const union h_arg *a)
{
    return h_matvec((uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i, (int64_t)a[3].i,
                    (int64_t)a[4].i, (const float *)a[5].p, (int64_t)a[6].i, (int64_t)a[7].i,
                    (float *)a[8].p, (int64_t)a[9].i);
}

static int hg_matvec_ids(const union h_arg *a)
{
    return h_matvec_ids((uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i, (size_t)a[3].i,
                        (int64_t)a[4].i, (int64_t)a[5].i, (const int32_t *)a[6].p, (int64_t)a[7].i,
                        (const float *)a[8].p, (int64_t)a[9].i, (int64_t)a[10].i, (float *)a[11].p,
                        (int64_t)a[12].i);
}

static int hg_f32_to_f16(const union h_arg *a)
{
    return h_f32_to_f16((const float *)a[0].p, (int64_t)a[1].i, (int64_t)a[2].i, (int64_t)a[3].i,
                        (uint16_t *)a[4].p);
}

static int hg_gemm_f16(const union h_arg *a)
{
    return h_gemm_f16((const uint16_t *)a[0].p, (int64_t)a[1].i, (int64_t)a[2].i,
                      (const uint16_t *)a[3].p, (int64_t)a[4].i, (float *)a[5].p, (int64_t)a[6].i);
}

static int hg_gemm_q(const union h_arg *a)
{
    return h_gemm_q((uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i, (size_t)a[3].i,
                    (int64_t)a[4].i, (int64_t)a[5].i, (const uint16_t *)a[6].p, (int64_t)a[7].i,
                    (const struct gpu_mm_tile *)a[8].p, (int64_t)a[9].i, (const int32_t *)a[10].p,
                    (const int32_t *)a[11].p, (int32_t)a[12].i, (float *)a[13].p, (int64_t)a[14].i);
}

static int hg_act_round(const union h_arg *a)
{
    return h_act_round((uint32_t)a[0].i, (const float *)a[1].p, (int64_t)a[2].i, (int64_t)a[3].i,
                       (int64_t)a[4].i, (float *)a[5].p);
}

static int hg_act_q8(const union h_arg *a)
{
    return h_act_q8((uint32_t)a[0].i, (const float *)a[1].p, (int64_t)a[2].i, (int64_t)a[3].i,
                    (int64_t)a[4].i, (void *)a[5].p);
}

static int hg_matvec_q8(const union h_arg *a)
{
    return h_matvec_q8((int)a[0].i, (uint32_t)a[1].i, (const void *)a[2].p, (const void *)a[3].p,
                       (size_t)a[4].i, (int64_t)a[5].i, (int64_t)a[6].i, (const void *)a[7].p,
                       (int64_t)a[8].i, (float *)a[9].p, (int64_t)a[10].i);
}

static int hg_matvec_ids_q8(const union h_arg *a)
{
    return h_matvec_ids_q8((uint32_t)a[0].i, (const void *)a[1].p, (const void *)a[2].p,
                           (size_t)a[3].i, (size_t)a[4].i, (int64_t)a[5].i, (int64_t)a[6].i,
                           (const int32_t *)a[7].p, (int64_t)a[8].i, (const void *)a[9].p,
                           (int64_t)a[10].i, (float *)a[11].p, (int64_t)a[12].i);
}

static int hg_matvec_ids_combine_q8(const union h_arg *a)
{
    return h_matvec_ids_combine_q8(
        (uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i, (size_t)a[3].i, (int64_t)a[4].i,
        (int64_t)a[5].i, (const int32_t *)a[6].p, (const float *)a[7].p, (int64_t)a[8].i,
        (int32_t)a[9].i, (const void *)a[10].p, (float *)a[11].p, (int64_t)a[12].i);
}

static int hg_matvec_groups_q8(const union h_arg *a)
{
    return h_matvec_groups_q8((uint32_t)a[0].i, (const void *)a[1].p, (size_t)a[2].i,
                              (size_t)a[3].i, (int64_t)a[4].i, (int64_t)a[5].i,
                              (const struct gpu_group *)a[6].p, (int64_t)a[7].i,
                              (const void *)a[8].p, (float *)a[9].p, (int64_t)a[10].i);
}

static int hg_rmsnorm(const union h_arg *a)
{
    return h_rmsnorm((float *)a[0].p, (int64_t)a[1].i, (const float *)a[2].p, (int64_t)a[3].i,
                     (const float *)a[4].p, (int64_t)a[5].i, (int64_t)a[6].i, (float)a[7].d);
}

static int hg_rmsnorm_q8(const union h_arg *a)
{
    return h_rmsnorm_q8((float *)a[0].p, (int64_t)a[1].i, (const float *)a[2].p, (int64_t)a[3].i,
                        (const float *)a[4].p, (int64_t)a[5].i, (int64_t)a[6].i, (float)a[7].d,
                        (uint32_t)a[8].i, (void *)a[9].p);
}

static int hg_add(const union h_arg *a)
{
    return h_add((float *)a[0].p, (const float *)a[1].p, (const float *)a[2].p, (int64_t)a[3].i);
}

static int hg_add_bias(const union h_arg *a)
{
    return h_add_bias((float *)a[0].p, (int64_t)a[1].i, (const float *)a[2].p, (int32_t)a[3].i,
                      (const int32_t *)a[4].p, (int64_t)a[5].i, (int64_t)a[6].i);
}

static int hg_scale_rows(const union h_arg *a)
{
    return h_scale_rows((float *)a[0].p, (int64_t)a[1].i, (int64_t)a[2].i, (int64_t)a[3].i,
                        (float)a[4].d);
}

static int hg_swiglu(const union h_arg *a)
{
    return h_swiglu((float *)a[0].p, (const float *)a[1].p, (int64_t)a[2].i, a[3].i != 0);
}

static int hg_swiglu_oai(const union h_arg *a)
{
    return h_swiglu_oai((float *)a[0].p, (const float *)a[1].p, (int64_t)a[2].i, (int64_t)a[3].i,
                        (const float *)a[4].p, (const float *)a[5].p, (int32_t)a[6].i,
                        (const int32_t *)a[7].p);
}

static int hg_rope(const union h_arg *a)
{
    return h_rope((float *)a[0].p, (int64_t)a[1].i, (int64_t)a[2].i, (uint32_t)a[3].i,
                  (uint32_t)a[4].i, (uint32_t)a[5].i, (const float *)a[6].p, a[7].i != 0);
}

static int hg_kv_store(const union h_arg *a)
{
    return h_kv_store((uint16_t *)a[0].p, (uint16_t *)a[1].p, (uint32_t)a[2].i, (uint32_t)a[3].i,
                      (const float *)a[4].p, (const float *)a[5].p, (uint32_t)a[6].i,
                      (const uint32_t *)a[7].p, (uint32_t)a[8].i);
}

static int hg_attention(const union h_arg *a)
{
    return h_attention((float *)a[0].p, (const float *)a[1].p, (const uint16_t *)a[2].p,
                       (const uint16_t *)a[3].p, (uint32_t)a[4].i, (uint32_t)a[5].i,
                       (const uint32_t *)a[6].p, (uint32_t)a[7].i, (uint32_t)a[8].i,
                       (uint32_t)a[9].i, (uint32_t)a[10].i, (uint32_t)a[11].i, (float)a[12].d,
                       (uint32_t)a[13].i, (float *)a[14].p, (const float *)a[15].p);
}

static int hg_kv_store_q8(const union h_arg *a)
{
    return h_kv_store_q8((void *)a[0].p, (void *)a[1].p, (uint32_t)a[2].i, (uint32_t)a[3].i,
                         (const float *)a[4].p, (const float *)a[5].p, (uint32_t)a[6].i,
                         (const uint32_t *)a[7].p, (uint32_t)a[8].i);
}

static int hg_attention_q8(const union h_arg *a)
{
    return h_attention_q8((float *)a[0].p, (const float *)a[1].p, (const void *)a[2].p,
                          (const void *)a[3].p, (uint32_t)a[4].i, (uint32_t)a[5].i,
                          (const uint32_t *)a[6].p, (uint32_t)a[7].i, (uint32_t)a[8].i,
                          (uint32_t)a[9].i, (uint32_t)a[10].i, (uint32_t)a[11].i, (float)a[12].d,
                          (uint32_t)a[13].i, (float *)a[14].p, (const float *)a[15].p);
}

static int hg_moe_route(const union h_arg *a)
{
    return h_moe_route((const float *)a[0].p, (const float *)a[1].p, (uint32_t)a[2].i,
                       (uint32_t)a[3].i, (uint32_t)a[4].i, (uint32_t)a[5].i, (uint32_t)a[6].i,
                       (int)a[7].i, a[8].i != 0, (float)a[9].d, (int32_t *)a[10].p,
                       (float *)a[11].p);
}

static int hg_moe_sort(const union h_arg *a)
{
    return h_moe_sort((const int32_t *)a[0].p, (uint32_t)a[1].i, (uint32_t)a[2].i, (int32_t)a[3].i,
                      (int32_t *)a[4].p, (struct gpu_mm_tile *)a[5].p, (int32_t *)a[6].p);
}

static int hg_moe_combine(const union h_arg *a)
{
    return h_moe_combine((float *)a[0].p, (const float *)a[1].p, (const float *)a[2].p,
                         (uint32_t)a[3].i, (uint32_t)a[4].i, (uint32_t)a[5].i);
}

static int hg_gated_add(const union h_arg *a)
{
    return h_gated_add((float *)a[0].p, (const float *)a[1].p, (const float *)a[2].p,
                       (uint32_t)a[3].i, (uint32_t)a[4].i);
}

static int hg_gather_rows(const union h_arg *a)
{
    return h_gather_rows((float *)a[0].p, (int64_t)a[1].i, (const float *)a[2].p, (int64_t)a[3].i,
                         (const int32_t *)a[4].p, (int64_t)a[5].i, (int64_t)a[6].i);
}

static int hg_scatter_rows(const union h_arg *a)
{
    return h_scatter_rows((float *)a[0].p, (int64_t)a[1].i, (const float *)a[2].p, (int64_t)a[3].i,
                          (const int32_t *)a[4].p, (int64_t)a[5].i, (int64_t)a[6].i);
}

static int hg_matvec_q8_cat(const union h_arg *a)
{
    const struct h_cat *c = a[2].p;
    return h_matvec_q8_cat((uint32_t)a[0].i, (int)a[1].i, c->w, c->rows, (size_t)a[3].i, a[4].i,
                           a[5].p, c->y);
}

static int hg_rope_qk(const union h_arg *a)
{
    return h_rope_qk((float *)a[0].p, a[1].i, (uint32_t)a[2].i, (float *)a[3].p, a[4].i,
                     (uint32_t)a[5].i, a[6].i, (uint32_t)a[7].i, (uint32_t)a[8].i, a[9].p,
                     a[10].i != 0, a[11].p, a[12].p, (float)a[13].d, a[14].p);
}

static void h_graph_clear(struct gpu_graph *g)
{
    for (size_t i = 0; i < g->n; i++)
        free(g->calls[i].own);
    free(g->calls);
    *g = (struct gpu_graph){0};
}

static int h_graph_begin(void)
{
    if (h_cap)
        return h_not_captured("beginning a graph capture");
    h_cap_failed = false;
    h_cap_dev = h_cur;
    if (!(h_cap = calloc(1, sizeof(*h_cap))))
        return h_failed("beginning a graph capture: out of memory");
    return 0;
}

/* Ends the capture: *out made, or its calls replaced; -1 (h_err says why, *out unchanged) when
 * the capture failed. */
static int h_graph_end(struct gpu_graph **out)
{
    struct gpu_graph *g = h_cap;
    h_cap = NULL;
    if (!g)
        return h_failed("ending a graph capture: none under way");
    if (h_cap_failed) {
        h_graph_clear(g);
        free(g);
        return -1;
    }
    if (*out) {
        h_graph_clear(*out);
        **out = *g;
        free(g);
    } else {
        *out = g;
    }
    return 0;
}

static int h_graph_launch(struct gpu_graph *g)
{
    H_NOT_CAPTURED("launching a graph");
    for (size_t i = 0; i < g->n; i++)
        if (g->calls[i].run(g->calls[i].a) < 0)
            return -1;
    return 0;
}

static void h_graph_free(struct gpu_graph *g)
{
    if (!g)
        return;
    h_graph_clear(g);
    free(g);
}

const struct gpu_backend *gpu_backend_host(void)
{
    static const struct gpu_backend be = {
        .name = "HOST",
        .device_count = h_device_count,
        .select = h_select,
        .use = h_use,
        .current = h_current,
        .last_error = h_last_error,
        .alloc = h_alloc,
        .release = h_release,
        .upload = h_upload,
        .upload_queued = h_upload_queued,
        .download = h_download,
        .fill = h_fill,
        .sync = h_sync,
        .membw_probe = h_membw_probe,
        .event_new = h_event_new,
        .event_free = h_event_free,
        .copy_async = h_copy_async,
        .event_record_copy = h_event_record_copy,
        .event_record_kernels = h_event_record_kernels,
        .stream_wait = h_stream_wait,
        .stream_wait_shared = h_stream_wait_shared,
        .event_record_kernels_shared = h_event_record_kernels_shared,
        .copy_wait = h_copy_wait,
        .event_sync = h_event_sync,
        .host_register = h_host_register,
        .va_granularity = h_va_granularity,
        .va_reserve = h_va_reserve,
        .va_map = h_va_map,
        .va_unmap = h_va_unmap,
        .va_free = h_va_free,
        .host_unregister = h_host_unregister,
        .copy_times = h_copy_times,
        .graph_begin = h_graph_begin,
        .graph_end = h_graph_end,
        .graph_launch = h_graph_launch,
        .graph_free = h_graph_free,
        .type_supported = h_type_supported,
        .dequant_rows = h_dequant_rows,
        .matvec = h_matvec,
        .matvec_ids = h_matvec_ids,
        .f32_to_f16 = h_f32_to_f16,
        .gemm_f16 = h_gemm_f16,
        .gemm_q = h_gemm_q,
        .act_round = h_act_round,
        .act_q8 = h_act_q8,
        .matvec_q8 = h_matvec_q8,
        .matvec_q8_cat = h_matvec_q8_cat,
        .matvec_ids_q8 = h_matvec_ids_q8,
        .matvec_ids_combine_q8 = h_matvec_ids_combine_q8,
        .matvec_groups_q8 = h_matvec_groups_q8,
        .rmsnorm = h_rmsnorm,
        .rmsnorm_q8 = h_rmsnorm_q8,
        .add = h_add,
        .add_bias = h_add_bias,
        .scale_rows = h_scale_rows,
        .swiglu = h_swiglu,
        .swiglu_oai = h_swiglu_oai,
        .rope = h_rope,
        .rope_qk = h_rope_qk,
        .kv_store = h_kv_store,
        .attention = h_attention,
        .kv_store_q8 = h_kv_store_q8,
        .attention_q8 = h_attention_q8,
        .moe_route = h_moe_route,
        .moe_sort = h_moe_sort,
        .moe_combine = h_moe_combine,
        .gated_add = h_gated_add,
        .gather_rows = h_gather_rows,
        .scatter_rows = h_scatter_rows,
    };
    return &be;
}
