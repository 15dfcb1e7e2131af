/* tests/tsan/tsan_devmem.c - shared device memory's host emulation (its copy thread, events
 * waited on as futexes) driven by several threads at once, as a plain program for ThreadSanitizer.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common.h"

#define ROUNDS 300
#define CHUNK  4096

struct side {
    uint32_t seed;
    int      bad;
};

/* Each thread its own piece and events: copies a round's bytes, records, syncs, reads them back;
 * every tenth round through a second event the copy stream waits for. */
static void *side_run(void *arg)
{
    struct side                *s = arg;
    struct common_errmsg        e = {{0}};
    size_t                      g = common_devmem_granularity();
    struct common_devmem_piece *p = NULL;
    struct common_devmem_event *ev = NULL, *gate = NULL;
    uint8_t                    *at = common_devmem_reserve(g, &e);
    if (!at || common_devmem_piece_create(g, &p, &e) != COMMON_OK ||
        common_devmem_piece_map(p, at, &e) != COMMON_OK ||
        common_devmem_event_create(&ev, &e) != COMMON_OK ||
        common_devmem_event_create(&gate, &e) != COMMON_OK) {
        CHECK(0, "setup: %s", e.text);
        s->bad++;
        return NULL;
    }
    uint8_t *src = malloc(CHUNK);
    for (uint32_t r = 0; r < ROUNDS && src; r++) {
        memset(src, (int)((s->seed + r) & 0xff), CHUNK);
        size_t off = (size_t)(r % (g / CHUNK)) * CHUNK;
        if (r % 10 == 0 && (common_devmem_event_record(gate, &e) != COMMON_OK ||
                            common_devmem_event_wait(gate, &e) != COMMON_OK))
            s->bad++;
        if (common_devmem_copy_async(at + off, src, CHUNK, &e) != COMMON_OK ||
            common_devmem_event_record(ev, &e) != COMMON_OK ||
            common_devmem_event_sync(ev, &e) != COMMON_OK || !common_devmem_event_is_done(ev))
            s->bad++;
        if (at[off] != src[0] || at[off + CHUNK - 1] != src[0])
            s->bad++;
    }
    free(src);
    common_devmem_event_destroy(gate);
    common_devmem_event_destroy(ev);
    common_devmem_piece_destroy(p);
    common_devmem_unreserve(at, g);
    return NULL;
}

int main(void)
{
    setenv("SLUICE_GPU_BACKEND", "host", 1);
    struct common_errmsg e = {{0}};
    CHECK(common_devmem_open(0, &e) == COMMON_OK, "open: %s", e.text);
    struct side s[3] = {{.seed = 1}, {.seed = 50}, {.seed = 99}};
    pthread_t   t[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&t[i], NULL, side_run, &s[i]) == 0, "thread %d", i);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(s[i].bad == 0, "thread %d: %d bad rounds", i, s[i].bad);
    }
    return check_report();
}
