/* tests/tsan/tsan_ring.c - a shared-memory ring driven by a producer and a consumer thread, as a
 * plain program so ThreadSanitizer checks the acquire/release pairs of common/ring.c. 10^6
 * records per run, not the 10^7 of the two-process Criterion test, to keep the TSan suite short:
 * TSan slows each push and pop about tenfold (about 1 s per run here instead of 0.1 s). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"

#define N_RECORDS 1000000u

struct rec {
    uint64_t seq;   /* 0, 1, 2, ... */
    uint64_t check; /* ~seq: catches torn or stale slots */
};

struct side {
    void    *mem;     /* borrowed: the formatted ring, outlives both threads */
    size_t   len;     /* bytes of mem */
    uint32_t n_slots; /* ring geometry */
    int      rc;      /* first error, or 0 */
    uint64_t done;    /* records pushed or popped in order */
};

static void *producer(void *arg)
{
    struct side       *s = arg;
    struct common_ring r;
    s->rc = common_ring_attach(s->mem, s->len, sizeof(struct rec), s->n_slots, &r);
    for (uint64_t i = 0; s->rc == COMMON_OK && i < N_RECORDS; i++) {
        struct rec v = {i, ~i};
        s->rc = common_ring_push_wait(&r, &v, sizeof(v), 20000);
        s->done += s->rc == COMMON_OK;
    }
    return NULL;
}

static void *consumer(void *arg)
{
    struct side       *s = arg;
    struct common_ring r;
    s->rc = common_ring_attach(s->mem, s->len, sizeof(struct rec), s->n_slots, &r);
    for (uint64_t i = 0; s->rc == COMMON_OK && i < N_RECORDS; i++) {
        struct rec v;
        int        n = common_ring_pop_wait(&r, &v, sizeof(v), 20000);
        if (n != (int)sizeof(v)) {
            s->rc = n < 0 ? n : COMMON_ECORRUPT;
            break;
        }
        if (v.seq != i || v.check != ~i) {
            s->rc = COMMON_ECORRUPT;
            break;
        }
        s->done++;
    }
    return NULL;
}

/* One run: `n_slots` small makes both sides sleep and wake often; large keeps them spinning. */
static void run(uint32_t n_slots)
{
    size_t len = common_ring_bytes(sizeof(struct rec), n_slots);
    void  *mem = aligned_alloc(64, (len + 63) & ~(size_t)63);
    CHECK(mem != NULL, "alloc");
    if (mem == NULL)
        return;
    CHECK(common_ring_init(mem, len, sizeof(struct rec), n_slots) == COMMON_OK, "init");
    struct side p = {.mem = mem, .len = len, .n_slots = n_slots};
    struct side c = p;
    pthread_t   tp, tc;
    uint64_t    t0 = common_now_ns();
    CHECK(pthread_create(&tc, NULL, consumer, &c) == 0, "consumer thread");
    CHECK(pthread_create(&tp, NULL, producer, &p) == 0, "producer thread");
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    double s = (double)(common_now_ns() - t0) / 1e9;
    CHECK(p.rc == COMMON_OK, "n_slots %u: producer: %s", n_slots, common_strerror(p.rc));
    CHECK(c.rc == COMMON_OK, "n_slots %u: consumer: %s after %llu records", n_slots,
          common_strerror(c.rc), (unsigned long long)c.done);
    CHECK(c.done == N_RECORDS, "n_slots %u: %llu of %u records in order", n_slots,
          (unsigned long long)c.done, N_RECORDS);
    printf("n_slots %u: %u records in %.2f s\n", n_slots, N_RECORDS, s);
    free(mem);
}

int main(void)
{
    run(4);
    run(1024);
    return check_report();
}
