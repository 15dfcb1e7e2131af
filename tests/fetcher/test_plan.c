/* tests/fetcher/test_plan.c - budget plan: what fits, the refusal naming the minimum, formatting.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetcher.h"
#include "fixture.h"

static struct common_gguf *t_g;
static struct common_model t_m;

#define OPEN_MODEL()                                                                               \
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");                                          \
    cr_assert_eq(common_gguf_open(path, NULL, &t_g, NULL), COMMON_OK);                             \
    cr_assert_eq(common_model_init(&t_m, t_g, NULL), COMMON_OK);                                   \
    free(path)

static void teardown(void)
{
    common_model_fini(&t_m);
    common_gguf_close(t_g);
    t_g = NULL;
}

Test(fetcher_plan, slot_bytes_cover_aligned_parts, .fini = teardown)
{
    OPEN_MODEL();
    uint64_t sb = fetcher_plan_slot_bytes(&t_m);
    cr_assert_eq(sb % FETCHER_ALIGN, 0);
    cr_assert_geq(sb, t_m.bytes_expert_bundle);
    cr_assert_leq(sb, t_m.bytes_expert_bundle + 6 * FETCHER_ALIGN,
                  "at most one extra page before and after each of the 3 parts");
}

Test(fetcher_plan, fits_and_caps_at_every_bundle, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher_plan      p;
    struct common_errmsg     e = {{0}};
    struct fetcher_plan_opts o = {.ram_budget = UINT64_C(1) << 30, .kv_bytes = 1 << 20};
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(p.n_bundles, t_m.hp.n_layer * t_m.hp.n_expert);
    cr_assert_eq(p.n_slots, p.n_bundles, "1 GiB holds every expert of the tiny model");
    cr_assert_eq(p.resident_bytes, t_m.bytes_resident);
    cr_assert_eq(p.kv_bytes, 1u << 20);
    cr_assert_eq(p.pool_bytes, (uint64_t)p.n_slots * p.slot_bytes);
    cr_assert_eq(p.min_slots, 2 * t_m.hp.n_expert_used);

    /* Between the minimum and everything: the pool gets what is left. */
    o.ram_budget = p.min_budget + 3 * (p.slot_bytes + 256);
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(p.n_slots, p.min_slots + 3);
    cr_assert_leq(p.resident_bytes + p.kv_bytes + p.act_bytes + p.io_bytes + p.base_bytes +
                      p.pool_bytes,
                  o.ram_budget);
}

Test(fetcher_plan, refuses_naming_the_minimum, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher_plan      p;
    struct common_errmsg     e = {{0}};
    struct fetcher_plan_opts o = {.ram_budget = 1 << 20, .kv_bytes = 4 << 20};
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, &e), COMMON_ERANGE);
    cr_assert_gt(p.min_budget, o.ram_budget);
    char num[32];
    snprintf(num, sizeof(num), "%llu bytes", (unsigned long long)p.min_budget);
    cr_assert(strstr(e.text, num), "message names the minimum: %s", e.text);
    cr_assert(strstr(e.text, "minimum"), "%s", e.text);

    /* The named minimum is exact: it fits, one byte less does not. */
    o.ram_budget = p.min_budget;
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(p.n_slots, p.min_slots);
    o.ram_budget = p.min_budget - 1;
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, &e), COMMON_ERANGE);
}

Test(fetcher_plan, zero_budget_is_invalid, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher_plan      p;
    struct fetcher_plan_opts o = {0};
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, NULL), COMMON_EINVAL);
}

Test(fetcher_plan, format_names_every_line, .fini = teardown)
{
    OPEN_MODEL();
    struct fetcher_plan      p;
    struct fetcher_plan_opts o = {.ram_budget = 64 << 20};
    cr_assert_eq(fetcher_plan_compute(&t_m, &o, &p, NULL), COMMON_OK);
    char buf[2048];
    int  n = fetcher_plan_format(&p, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_lt((size_t)n, sizeof(buf));
    char slots[32];
    snprintf(slots, sizeof(slots), "%u slots", p.n_slots);
    const char *want[] = {"ram budget",  "resident weights", "kv cache", "activations",
                          "expert pool", "minimum budget",   slots};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        cr_assert(strstr(buf, want[i]), "plan text lacks '%s':\n%s", want[i], buf);
}
