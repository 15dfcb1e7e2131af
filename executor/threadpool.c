/* executor/threadpool.c - the thread pool: workers created once, parallel loops, sleep when idle.
 */
#include "executor.h"

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL_MAX_THREADS 256
#define POOL_SPIN_NS     50000u /* a worker spins this long after a job before it sleeps */

/* The job word packs a generation (bits 63..32), a "closed" flag (bit 31) and the number of
 * workers inside the job (bits 30..0). Workers join an open job of a new generation with a CAS,
 * so a worker that wakes late (asleep, or descheduled by a busy machine) never holds the caller
 * up: the caller runs every piece nobody took, waits only for workers that joined, then closes
 * the job so that no one joins it afterwards. */
#define POOL_GEN_SHIFT 32
#define POOL_CLOSED    (1ull << 31)
#define POOL_ACTIVE    (POOL_CLOSED - 1)

struct executor_threadpool {
    uint32_t        n_threads; /* caller + workers */
    pthread_t      *threads;   /* owned: n_threads - 1 workers (index 0 unused) */
    uint32_t        n_started; /* workers actually created */
    pthread_mutex_t mu;        /* guards the sleeps and wake-ups below */
    pthread_cond_t  cv_work;   /* workers wait here for a new generation */
    pthread_cond_t  cv_done;   /* the caller waits here for the joined workers to leave */
    /* The job: written by the caller before the release store of `word`, read by workers that
     * joined it; stable until the caller closes the job. */
    executor_threadpool_fn fn;
    void                  *arg;
    int64_t                n;
    int64_t                chunk;
    /* Release store by the caller publishes the job; pairs with the acquire CAS in pool_join.
     * Workers leave with a release decrement; pairs with the caller's acquire CAS in pool_wait. */
    _Atomic uint64_t word;
    _Atomic int64_t  next; /* next item to hand out (relaxed: ordered by word) */
    _Atomic bool     stop; /* set under mu by executor_threadpool_destroy */
};

struct pool_worker_arg {
    struct executor_threadpool *pool; /* borrowed */
    uint32_t                    ith;
};

static void pool_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Takes pieces of the current job until none is left. */
static void pool_run_pieces(struct executor_threadpool *p, uint32_t ith)
{
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (i0 >= p->n)
            return;
        int64_t i1 = i0 + p->chunk < p->n ? i0 + p->chunk : p->n;
        p->fn(p->arg, i0, i1, ith);
    }
}

/* Joins the open job of a generation newer than *seen. Returns false when there is none. */
static bool pool_join(struct executor_threadpool *p, uint64_t *seen)
{
    uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
    for (;;) {
        if ((w >> POOL_GEN_SHIFT) == *seen || (w & POOL_CLOSED))
            return false;
        /* Acquire: pairs with the caller's release store of the job. */
        if (atomic_compare_exchange_weak_explicit(&p->word, &w, w + 1, memory_order_acquire,
                                                  memory_order_acquire)) {
            *seen = w >> POOL_GEN_SHIFT;
            return true;
        }
    }
}

/* True when a job the worker has not seen is open (or the pool stops). */
static bool pool_has_work(struct executor_threadpool *p, uint64_t seen)
{
    uint64_t w = atomic_load_explicit(&p->word, memory_order_relaxed);
    return ((w >> POOL_GEN_SHIFT) != seen && !(w & POOL_CLOSED)) ||
           atomic_load_explicit(&p->stop, memory_order_relaxed);
}

static void *pool_worker(void *varg)
{
    struct pool_worker_arg a = *(struct pool_worker_arg *)varg;
    free(varg);
    struct executor_threadpool *p = a.pool;
    uint64_t                    seen = 0;
    for (;;) {
        if (!pool_has_work(p, seen)) {
            uint64_t t0 = common_now_ns();
            while (!pool_has_work(p, seen) && common_now_ns() - t0 < POOL_SPIN_NS)
                for (int i = 0; i < 64 && !pool_has_work(p, seen); i++)
                    pool_cpu_relax();
        }
        if (!pool_has_work(p, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!pool_has_work(p, seen))
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        if (!pool_join(p, &seen))
            continue; /* closed before we could join: wait for the next one */
        pool_run_pieces(p, a.ith);
        /* Release: our writes to the job's outputs happen before the caller closes the job. */
        uint64_t w = atomic_fetch_sub_explicit(&p->word, 1, memory_order_release);
        if ((w & POOL_ACTIVE) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Counts distinct (package, core) pairs among the CPUs this process may run on. */
uint32_t executor_physical_cores(void)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        return n > 0 ? (uint32_t)n : 1;
    }
    uint64_t seen[CPU_SETSIZE];
    uint32_t n_seen = 0, n_cpus = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        n_cpus++;
        char path[128];
        long core = -1, pkg = -1;
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &core) != 1)
                core = -1;
            fclose(f);
        }
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
                 cpu);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &pkg) != 1)
                pkg = -1;
            fclose(f);
        }
        if (core < 0 || pkg < 0)
            return n_cpus > 0 ? (uint32_t)CPU_COUNT(&set) : 1; /* no topology: count CPUs */
        uint64_t key = ((uint64_t)pkg << 32) | (uint64_t)core;
        bool     dup = false;
        for (uint32_t i = 0; i < n_seen && !dup; i++)
            dup = seen[i] == key;
        if (!dup)
            seen[n_seen++] = key;
    }
    return n_seen > 0 ? n_seen : 1;
}

int executor_threadpool_create(uint32_t n_threads, struct executor_threadpool **out)
{
    if (n_threads == 0)
        n_threads = executor_physical_cores();
    if (n_threads > POOL_MAX_THREADS)
        return COMMON_EINVAL;
    struct executor_threadpool *p = calloc(1, sizeof(*p));
    if (!p)
        return COMMON_ENOMEM;
    p->n_threads = n_threads;
    p->threads = calloc(n_threads, sizeof(*p->threads));
    if (!p->threads) {
        free(p);
        return COMMON_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->word, POOL_CLOSED); /* generation 0, closed */
    atomic_init(&p->next, 0);
    atomic_init(&p->stop, false);
    for (uint32_t i = 1; i < n_threads; i++) {
        struct pool_worker_arg *a = malloc(sizeof(*a));
        if (!a) {
            executor_threadpool_destroy(p);
            return COMMON_ENOMEM;
        }
        a->pool = p;
        a->ith = i;
        if (pthread_create(&p->threads[i], NULL, pool_worker, a) != 0) {
            free(a);
            executor_threadpool_destroy(p);
            return COMMON_EAGAIN;
        }
        p->n_started++;
    }
    *out = p;
    return 0;
}

void executor_threadpool_destroy(struct executor_threadpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, true, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 1; i <= p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_work);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

uint32_t executor_threadpool_n_threads(const struct executor_threadpool *p)
{
    return p ? p->n_threads : 1;
}

/* Closes the current job once no worker is inside it; then every joined worker's writes are
 * visible and no late worker can join. */
static bool pool_try_close(struct executor_threadpool *p)
{
    uint64_t w = atomic_load_explicit(&p->word, memory_order_acquire);
    while ((w & POOL_ACTIVE) == 0)
        /* Acquire: pairs with the workers' release decrements. */
        if (atomic_compare_exchange_weak_explicit(&p->word, &w, w | POOL_CLOSED,
                                                  memory_order_acquire, memory_order_acquire))
            return true;
    return false;
}

static void pool_wait(struct executor_threadpool *p)
{
    uint64_t t0 = common_now_ns();
    for (uint32_t spins = 1; !pool_try_close(p); spins++) {
        if (spins % 64 == 0 && common_now_ns() - t0 > POOL_SPIN_NS) {
            pthread_mutex_lock(&p->mu);
            while (!pool_try_close(p))
                pthread_cond_wait(&p->cv_done, &p->mu);
            pthread_mutex_unlock(&p->mu);
            return;
        }
        pool_cpu_relax();
    }
}

void executor_threadpool_for(struct executor_threadpool *p, int64_t n, int64_t chunk,
                             executor_threadpool_fn fn, void *arg)
{
    if (n <= 0)
        return;
    uint32_t nth = p ? p->n_started + 1 : 1;
    if (chunk <= 0) {
        int64_t pieces = (int64_t)nth * 4;
        chunk = (n + pieces - 1) / pieces;
    }
    if (nth == 1 || n <= chunk) {
        for (int64_t i0 = 0; i0 < n; i0 += chunk)
            fn(arg, i0, i0 + chunk < n ? i0 + chunk : n, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    uint64_t gen = (atomic_load_explicit(&p->word, memory_order_relaxed) >> POOL_GEN_SHIFT) + 1;
    pthread_mutex_lock(&p->mu);
    /* Release: publishes the job fields above; pairs with the acquire CAS in pool_join. The
     * previous job is closed with no worker inside, so a plain store is safe. */
    atomic_store_explicit(&p->word, gen << POOL_GEN_SHIFT, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    pool_run_pieces(p, 0);
    pool_wait(p);
}
