/* fetcher/io_pread.c - pread backend: a thread pool running preadv when io_uring is absent. */
#include "io.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PREAD_MAX_THREADS 64

struct pread_be {
    pthread_mutex_t        mu;      /* guards everything below */
    pthread_cond_t         cv_work; /* signalled when an op is queued or on stop */
    pthread_cond_t         cv_done; /* signalled when an op finishes or on wake */
    struct fetcher_io_op **queue;   /* owned: ring of cap ops waiting for a worker */
    uint32_t               q_head, q_n;
    struct fetcher_io_op **done; /* owned: ring of cap finished ops */
    uint32_t               d_head, d_n;
    uint32_t               cap;   /* queue depth: ops in the backend never exceed it */
    bool                   woken; /* a wake is pending for the waiter */
    bool                   stop;  /* workers exit */
    pthread_t              threads[PREAD_MAX_THREADS];
    uint32_t               n_threads; /* started */
};

static void *pread_worker(void *arg)
{
    struct pread_be *b = arg;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->stop && b->q_n == 0)
            pthread_cond_wait(&b->cv_work, &b->mu);
        if (b->stop && b->q_n == 0)
            break;
        struct fetcher_io_op *op = b->queue[b->q_head];
        b->q_head = (b->q_head + 1) % b->cap;
        b->q_n--;
        pthread_mutex_unlock(&b->mu);
        ssize_t r = preadv(op->fd, op->iov, (int)op->n_iov, (off_t)op->offset);
        int64_t res = r < 0 ? -(int64_t)errno : (int64_t)r;
        pthread_mutex_lock(&b->mu);
        op->res = res;
        b->done[(b->d_head + b->d_n) % b->cap] = op;
        b->d_n++;
        pthread_cond_signal(&b->cv_done);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

static int pread_start(void *be, struct fetcher_io_op **ops, uint32_t n)
{
    struct pread_be *b = be;
    pthread_mutex_lock(&b->mu);
    if (b->q_n + b->d_n + n > b->cap) {
        pthread_mutex_unlock(&b->mu);
        return -EBUSY;
    }
    for (uint32_t i = 0; i < n; i++) {
        b->queue[(b->q_head + b->q_n) % b->cap] = ops[i];
        b->q_n++;
    }
    pthread_cond_broadcast(&b->cv_work);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

static uint32_t pread_wait(void *be, struct fetcher_io_op **done, uint32_t max, bool wait)
{
    struct pread_be *b = be;
    uint32_t         n = 0;
    pthread_mutex_lock(&b->mu);
    while (wait && b->d_n == 0 && !b->woken)
        pthread_cond_wait(&b->cv_done, &b->mu);
    b->woken = false;
    while (n < max && b->d_n > 0) {
        done[n++] = b->done[b->d_head];
        b->d_head = (b->d_head + 1) % b->cap;
        b->d_n--;
    }
    pthread_mutex_unlock(&b->mu);
    return n;
}

static void pread_wake(void *be)
{
    struct pread_be *b = be;
    pthread_mutex_lock(&b->mu);
    b->woken = true;
    pthread_cond_signal(&b->cv_done);
    pthread_mutex_unlock(&b->mu);
}

static void pread_destroy(void *be)
{
    struct pread_be *b = be;
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stop = true;
    pthread_cond_broadcast(&b->cv_work);
    pthread_mutex_unlock(&b->mu);
    for (uint32_t i = 0; i < b->n_threads; i++)
        pthread_join(b->threads[i], NULL);
    pthread_cond_destroy(&b->cv_done);
    pthread_cond_destroy(&b->cv_work);
    pthread_mutex_destroy(&b->mu);
    free(b->queue);
    free(b->done);
    free(b);
}

static const struct fetcher_io_backend g_pread_backend = {
    .name = "pread",
    .start = pread_start,
    .wait = pread_wait,
    .wake = pread_wake,
    .destroy = pread_destroy,
};

int fetcher_io_pread_create(uint32_t queue_depth, uint32_t n_threads,
                            const struct fetcher_io_backend **ops, void **be,
                            struct common_errmsg *e)
{
    if (n_threads == 0)
        n_threads = queue_depth < 8 ? queue_depth : 8;
    if (n_threads > PREAD_MAX_THREADS)
        n_threads = PREAD_MAX_THREADS;
    struct pread_be *b = calloc(1, sizeof(*b));
    if (!b)
        return common_errmsg_set(e, COMMON_ENOMEM, "pread: out of memory");
    b->cap = queue_depth;
    b->queue = calloc(queue_depth, sizeof(*b->queue));
    b->done = calloc(queue_depth, sizeof(*b->done));
    if (!b->queue || !b->done || pthread_mutex_init(&b->mu, NULL) != 0) {
        free(b->queue);
        free(b->done);
        free(b);
        return common_errmsg_set(e, COMMON_ENOMEM, "pread: out of memory");
    }
    pthread_cond_init(&b->cv_work, NULL);
    pthread_cond_init(&b->cv_done, NULL);
    for (uint32_t i = 0; i < n_threads; i++) {
        if (pthread_create(&b->threads[i], NULL, pread_worker, b) != 0) {
            pread_destroy(b);
            return common_errmsg_set(e, COMMON_EAGAIN, "pread: thread creation failed");
        }
        b->n_threads++;
    }
    *ops = &g_pread_backend;
    *be = b;
    return COMMON_OK;
}
