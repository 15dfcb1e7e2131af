/* tests/fetcher/test_probe.c - the storage probe, readiness queries and predictor counts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetcher.h"
#include "fixture.h"

static struct common_gguf *t_g;
static struct common_model t_m;

static void open_model(void)
{
    char *path = fixture_path("moe-tiny/moe-tiny-q4_0.gguf");
    if (!path)
        cr_skip_test("fixture moe-tiny/moe-tiny-q4_0.gguf absent: skipped");
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);
    free(path);
}

static void teardown(void)
{
    common_model_fini(&t_m);
    common_gguf_close(t_g);
    t_g = NULL;
}

/* Every expert part is read once (the budget is above the model) through the pread engine. */
Test(fetcher_probe, reads_every_part_once, .fini = teardown, .timeout = 60)
{
    open_model();
    struct fetcher_probe_result r;
    struct common_errmsg        e = {{0}};
    int                         rc =
        fetcher_probe_read(t_g, &t_m,
                           &(struct fetcher_probe_opts){
                               .io = FETCHER_IO_PREAD, .queue_depth = 4, .max_bytes = 1ull << 30},
                           &r, &e);
    cr_assert_eq(rc, COMMON_OK, "%s", e.text);
    cr_assert_eq(r.reads, (uint64_t)t_m.hp.n_layer * t_m.hp.n_expert * COMMON_EXPERT_PART_COUNT);
    cr_assert_geq(r.bytes, t_m.bytes_experts);
    cr_assert_gt(r.bytes_per_s, 0.0);
    cr_assert_eq(r.queue_depth, 4);
    cr_assert_eq(r.mode, FETCHER_IO_PREAD);
}

/* max_bytes stops the probe early; queue depth 1 works. */
Test(fetcher_probe, stops_at_max_bytes, .fini = teardown, .timeout = 60)
{
    open_model();
    struct fetcher_probe_result r;
    int                         rc = fetcher_probe_read(
                                t_g, &t_m, &(struct fetcher_probe_opts){.queue_depth = 1, .max_bytes = 100000}, &r, NULL);
    cr_assert_eq(rc, COMMON_OK);
    cr_assert_lt(r.reads, (uint64_t)t_m.hp.n_layer * t_m.hp.n_expert * COMMON_EXPERT_PART_COUNT);
    cr_assert_gt(r.reads, 0);
}

Test(fetcher_probe, rejects_mmap_mode, .fini = teardown)
{
    open_model();
    struct fetcher_probe_result r;
    cr_assert_eq(fetcher_probe_read(t_g, &t_m, &(struct fetcher_probe_opts){.io = FETCHER_IO_MMAP},
                                    &r, NULL),
                 COMMON_EINVAL);
}

/* is_ready: false before a load, true after an acquire, false for ids out of range. */
Test(fetcher_probe, is_ready_follows_loads, .fini = teardown, .timeout = 60)
{
    open_model();
    struct fetcher *f = NULL;
    cr_assert_eq(fetcher_create(t_g, &t_m,
                                &(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 4}, &f,
                                NULL),
                 COMMON_OK);
    cr_assert_not(fetcher_is_ready(f, 1, 3));
    const void *data;
    uint32_t    loan;
    for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
        cr_assert_eq(fetcher_acquire(f, 1, 3, (enum common_expert_part)p, &data, &loan), COMMON_OK);
        fetcher_release(f, loan);
    }
    cr_assert(fetcher_is_ready(f, 1, 3));
    cr_assert_not(fetcher_is_ready(f, 99, 0));
    fetcher_destroy(f);
}

/* Predictor counts appear in the JSON trace and in the summary; bad counts are refused. */
Test(fetcher_probe, trace_predictors_in_json_and_summary)
{
    struct fetcher_trace *t = NULL;
    cr_assert_eq(
        fetcher_trace_create(&(struct fetcher_trace_opts){.n_layer = 2, .n_expert = 4}, &t),
        COMMON_OK);
    cr_assert_eq(fetcher_trace_predictor(t, "gate", 10, 8, 12), COMMON_OK);
    cr_assert_eq(fetcher_trace_predictor(t, "gate", 20, 15, 20), COMMON_OK); /* replaces */
    cr_assert_eq(fetcher_trace_predictor(t, "gate", 1, 2, 3), COMMON_EINVAL);
    cr_assert_eq(fetcher_trace_predictor(t, "", 1, 1, 1), COMMON_EINVAL);
    char  *buf = NULL;
    size_t len = 0;
    FILE  *f = open_memstream(&buf, &len);
    cr_assert_eq(fetcher_trace_write_json(t, f), COMMON_OK);
    fetcher_trace_write_summary(t, f);
    fclose(f);
    cr_assert_not_null(strstr(buf, "\"predictors\":[{\"name\":\"gate\",\"predicted\":20,"
                                   "\"correct\":15,\"actual\":20,\"precision\":0.75,"
                                   "\"recall\":0.75}]"),
                       "%s", buf);
    cr_assert_not_null(strstr(buf, "predictor gate: precision 75.0%, recall 75.0%"), "%s", buf);
    free(buf);
    for (int i = 1; i < FETCHER_TRACE_MAX_PREDICTORS; i++) {
        char name[8];
        snprintf(name, sizeof(name), "p%d", i);
        cr_assert_eq(fetcher_trace_predictor(t, name, 1, 1, 1), COMMON_OK);
    }
    cr_assert_eq(fetcher_trace_predictor(t, "one-too-many", 1, 1, 1), COMMON_ENOMEM);
    fetcher_trace_destroy(t);
}

/* The load log records each completed load; replaying it reads the three parts of each logged
 * expert, repeats included, and nothing else. */
Test(fetcher_probe, load_log_replays_the_runs_reads, .fini = teardown, .timeout = 60)
{
    open_model();
    struct fetcher *f = NULL;
    cr_assert_eq(fetcher_create(t_g, &t_m,
                                &(struct fetcher_opts){.io = FETCHER_IO_PREAD, .n_slots = 2}, &f,
                                NULL),
                 COMMON_OK);
    cr_assert_eq(fetcher_load_log_start(f, 0), COMMON_EINVAL);
    cr_assert_eq(fetcher_load_log_start(f, 16), COMMON_OK);
    /* Three experts through a 2-slot pool, then the first again: four loads. */
    const uint32_t want[4][2] = {{0, 1}, {1, 2}, {2, 3}, {0, 1}};
    uint64_t       bytes = 0;
    for (int i = 0; i < 4; i++) {
        for (uint32_t p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
            const void        *data;
            uint32_t           loan;
            struct common_span s;
            cr_assert_eq(fetcher_acquire(f, want[i][0], want[i][1], (enum common_expert_part)p,
                                         &data, &loan),
                         COMMON_OK);
            fetcher_release(f, loan);
            cr_assert_eq(common_model_expert_span(&t_m, want[i][0], want[i][1],
                                                  (enum common_expert_part)p, &s),
                         COMMON_OK);
            bytes += s.size;
        }
    }
    cr_assert_eq(fetcher_load_log_count(f), 4);
    struct fetcher_probe_key *log = NULL;
    uint64_t                  n = fetcher_load_log_take(f, &log);
    cr_assert_eq(n, 4);
    cr_assert_not_null(log);
    for (int i = 0; i < 4; i++)
        cr_assert(log[i].layer == want[i][0] && log[i].expert == want[i][1], "log[%d] = (%u,%u)", i,
                  log[i].layer, log[i].expert);
    cr_assert_eq(fetcher_load_log_count(f), 0, "take stops the log");
    fetcher_destroy(f);

    struct fetcher_probe_result r;
    struct common_errmsg        e = {{0}};
    cr_assert_eq(
        fetcher_probe_read(t_g, &t_m,
                           &(struct fetcher_probe_opts){
                               .io = FETCHER_IO_PREAD, .queue_depth = 2, .keys = log, .n_keys = n},
                           &r, &e),
        COMMON_OK, "%s", e.text);
    cr_assert_eq(r.reads, 4 * COMMON_EXPERT_PART_COUNT);
    cr_assert_geq(r.bytes, bytes);
    /* Keys out of range, or none, are refused. */
    log[2].expert = t_m.hp.n_expert;
    cr_assert_eq(fetcher_probe_read(
                     t_g, &t_m,
                     &(struct fetcher_probe_opts){.io = FETCHER_IO_PREAD, .keys = log, .n_keys = n},
                     &r, NULL),
                 COMMON_EINVAL);
    cr_assert_eq(fetcher_probe_read(
                     t_g, &t_m,
                     &(struct fetcher_probe_opts){.io = FETCHER_IO_PREAD, .keys = log, .n_keys = 0},
                     &r, NULL),
                 COMMON_EINVAL);
    free(log);
}
