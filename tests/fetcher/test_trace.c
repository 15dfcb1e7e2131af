/* tests/fetcher/test_trace.c - tracing: Belady on known traces, faults per token, JSON export. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetcher.h"
#include "tjson.h"

/* The textbook reference string (Silberschatz, Operating System Concepts): with 3 frames the
 * optimal policy takes 9 faults on these 20 references, so 11 hits. */
static const uint32_t g_ref[] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};

Test(fetcher_trace, belady_textbook_string)
{
    size_t n = sizeof(g_ref) / sizeof(g_ref[0]);
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 3), 11);
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 4), 12, "8 faults with 4 frames");
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 1), 0, "no reference repeats its predecessor");
}

Test(fetcher_trace, belady_enough_slots_misses_only_cold)
{
    size_t n = sizeof(g_ref) / sizeof(g_ref[0]);
    /* 6 distinct keys: with 6 slots only the first touch of each misses. */
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 6), (int64_t)n - 6);
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 100), (int64_t)n - 6);
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, 0, 3), 0);
    cr_assert_eq(fetcher_trace_belady_hits(g_ref, n, 0), 0);
}

/* LRU hits of the same sequence, by brute force. */
static int64_t lru_hits(const uint32_t *k, size_t n, uint32_t slots)
{
    uint32_t keys[64];
    size_t   last[64];
    uint32_t used = 0;
    int64_t  hits = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t j = 0;
        while (j < used && keys[j] != k[i])
            j++;
        if (j < used) {
            hits++;
        } else if (used < slots) {
            j = used++;
        } else {
            j = 0;
            for (uint32_t q = 1; q < used; q++)
                if (last[q] < last[j])
                    j = q;
        }
        keys[j] = k[i];
        last[j] = i;
    }
    return hits;
}

Test(fetcher_trace, belady_never_worse_than_lru)
{
    uint32_t seq[2000];
    uint64_t x = 12345;
    for (size_t i = 0; i < 2000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        seq[i] = (uint32_t)(x >> 33) % 24;
    }
    for (uint32_t slots = 1; slots <= 24; slots += 3) {
        int64_t b = fetcher_trace_belady_hits(seq, 2000, slots);
        int64_t l = lru_hits(seq, 2000, slots);
        cr_assert_geq(b, l, "slots %u: Belady %lld < LRU %lld", slots, (long long)b, (long long)l);
    }
}

Test(fetcher_trace, faults_per_token_split_cold_and_steady)
{
    struct fetcher_trace     *t = NULL;
    struct fetcher_trace_opts o = {.n_layer = 2, .n_expert = 4, .n_slots = 2, .warmup_tokens = 2};
    cr_assert_eq(fetcher_trace_create(&o, &t), COMMON_OK);
    /* token 1: 3 misses; token 2: 2 misses + 1 hit; token 3: 1 miss + 1 hit; token 4: 2 hits */
    const int plan[4][3] = {{3, 0, 0}, {2, 1, 0}, {1, 1, 0}, {0, 1, 1}};
    for (int tok = 0; tok < 4; tok++) {
        fetcher_trace_token(t);
        for (int i = 0; i < plan[tok][0]; i++)
            fetcher_trace_access(t, 0, (uint32_t)i, FETCHER_TRACE_MISS);
        for (int i = 0; i < plan[tok][1]; i++)
            fetcher_trace_access(t, 1, (uint32_t)i, FETCHER_TRACE_HIT);
        for (int i = 0; i < plan[tok][2]; i++)
            fetcher_trace_access(t, 1, 3, FETCHER_TRACE_PREFETCH_HIT);
    }
    struct fetcher_trace_totals s;
    fetcher_trace_totals(t, &s);
    cr_assert_eq(s.tokens, 4);
    cr_assert_eq(s.faults, 6);
    cr_assert_eq(s.max_faults, 3);
    cr_assert_eq(s.steady_tokens, 2);
    cr_assert_eq(s.steady_faults, 1);
    cr_assert_eq(s.steady_max_faults, 1);
    cr_assert_eq(s.accesses, 10);
    cr_assert_eq(s.hits, 4);
    cr_assert_eq(s.prefetch_hits, 1);
    cr_assert_eq(s.belady_accesses, 10);
    fetcher_trace_destroy(t);
}

/* Load entropy and reuse distances on a hand-made sequence. */
Test(fetcher_trace, routing_entropy_and_reuse_distances)
{
    struct fetcher_trace     *t = NULL;
    struct fetcher_trace_opts o = {.n_layer = 3, .n_expert = 4};
    cr_assert_eq(fetcher_trace_create(&o, &t), COMMON_OK);
    /* layer 0: all four experts once each per token (uniform); layer 1: always expert 2 (one
     * expert); layer 2: nothing. 10 tokens. */
    for (int tok = 0; tok < 10; tok++) {
        fetcher_trace_token(t);
        for (uint32_t x = 0; x < 4; x++)
            fetcher_trace_access(t, 0, x, FETCHER_TRACE_HIT);
        fetcher_trace_access(t, 1, 2, FETCHER_TRACE_HIT);
    }
    /* then expert 3 of layer 1 after 3 tokens, expert 0 of layer 0 after 20 */
    for (int tok = 0; tok < 20; tok++) {
        fetcher_trace_token(t);
        if (tok == 2)
            fetcher_trace_access(t, 1, 3, FETCHER_TRACE_MISS);
        if (tok == 5)
            fetcher_trace_access(t, 1, 3, FETCHER_TRACE_MISS); /* 3 tokens later: bucket 1 */
        if (tok == 19)
            fetcher_trace_access(t, 0, 0, FETCHER_TRACE_MISS); /* 20 tokens later: bucket 4 */
    }
    struct fetcher_trace_totals s;
    fetcher_trace_totals(t, &s);
    cr_assert_eq(s.accesses, 53);
    cr_assert_eq(s.first_uses, 6, "4 + 1 + 1 bundles");
    cr_assert_eq(s.reuse[0], 9 * 5, "every bundle of the first 10 tokens again after 1 token");
    cr_assert_eq(s.reuse[1], 1);
    cr_assert_eq(s.reuse[4], 1);
    uint64_t sum = s.first_uses;
    for (int b = 0; b < FETCHER_TRACE_REUSE_BUCKETS; b++)
        sum += s.reuse[b];
    cr_assert_eq(sum, s.accesses);
    /* layer 0: counts 11, 10, 10, 10 (near 1); layer 1: 10 of expert 2, 2 of expert 3 */
    const double p = 10.0 / 12.0, q = 2.0 / 12.0, h1 = -(p * log2(p) + q * log2(q)) / 2.0;
    cr_assert_float_eq(s.entropy_min, h1, 1e-9);
    cr_assert_gt(s.entropy_max, 0.99);
    cr_assert_lt(s.entropy_max, 1.0);
    cr_assert_float_eq(s.entropy_mean, (s.entropy_min + s.entropy_max) / 2.0, 1e-12,
                       "layer 2 had no accesses and is left out");
    char  *text = NULL;
    size_t len = 0;
    FILE  *f = open_memstream(&text, &len);
    fetcher_trace_write_summary(t, f);
    fclose(f);
    cr_assert(strstr(text, "load entropy per layer"), "%s", text);
    cr_assert(strstr(text, "first use 11.3%"), "%s", text);
    free(text);
    fetcher_trace_destroy(t);
}

Test(fetcher_trace, json_is_valid_and_complete)
{
    struct fetcher_trace     *t = NULL;
    struct fetcher_trace_opts o = {.n_layer = 3, .n_expert = 4, .n_slots = 3};
    cr_assert_eq(fetcher_trace_create(&o, &t), COMMON_OK);
    size_t n = sizeof(g_ref) / sizeof(g_ref[0]);
    for (size_t i = 0; i < n; i++) {
        fetcher_trace_token(t);
        uint32_t l = g_ref[i] / 4, x = g_ref[i] % 4;
        fetcher_trace_access(t, l, x, FETCHER_TRACE_MISS);
        fetcher_trace_resident(t, l, +1);
        fetcher_trace_load(t, l, x, 4096, 150000); /* 150 us: bucket 7 */
    }
    fetcher_trace_prefetch(t, 2, 1);
    fetcher_trace_evict(t, 2, 1, true);
    fetcher_trace_load_error(t, 0, 0);
    fetcher_trace_access(t, 99, 0, FETCHER_TRACE_HIT); /* out of range: ignored */

    char  *text = NULL;
    size_t len = 0;
    FILE  *f = open_memstream(&text, &len);
    cr_assert_eq(fetcher_trace_write_json(t, f), COMMON_OK);
    fclose(f);
    struct tjson *j = tjson_parse(text);
    cr_assert_not_null(j, "invalid JSON:\n%s", text);
    cr_assert_str_eq(tjson_get(j, "schema")->str, "sluice.fetcher.trace/1");
    const struct tjson *tot = tjson_get(j, "totals");
    cr_assert_eq(tjson_get(tot, "accesses")->num, (double)n);
    cr_assert_eq(tjson_get(tot, "misses")->num, (double)n);
    cr_assert_eq(tjson_get(tot, "bytes_read")->num, 4096.0 * (double)n);
    cr_assert_eq(tjson_get(tot, "prefetch_wasted")->num, 1.0);
    cr_assert_eq(tjson_get(tot, "load_errors")->num, 1.0);
    const struct tjson *bel = tjson_get(j, "belady");
    cr_assert_eq(tjson_get(bel, "hits")->num, 11.0, "the textbook string again");
    cr_assert_eq(tjson_get(bel, "n_slots")->num, 3.0);
    const struct tjson *tok = tjson_get(tjson_get(j, "tokens"), "all");
    cr_assert_eq(tjson_get(tok, "tokens")->num, (double)n);
    cr_assert_eq(tjson_get(tok, "max_faults")->num, 1.0);
    const struct tjson *layers = tjson_get(j, "layers");
    cr_assert_eq(layers->kind, TJSON_ARR);
    cr_assert_eq(layers->len, 3);
    const struct tjson *l1 = tjson_at(layers, 1);
    cr_assert_eq(tjson_get(l1, "experts")->len, 4);
    /* layer 1 holds keys 4..7: 7 appears twice in the string, 4 once */
    cr_assert_eq(tjson_get(tjson_at(tjson_get(l1, "experts"), 3), "activations")->num, 2.0);
    cr_assert_eq(tjson_get(tjson_at(tjson_get(l1, "experts"), 0), "activations")->num, 1.0);
    cr_assert_eq(tjson_get(l1, "peak_resident")->num, 3.0, "one +1 per access, no eviction");
    /* layer 1: expert 3 twice, expert 0 once, over 4 experts */
    cr_assert_float_eq(tjson_get(l1, "load_entropy")->num,
                       -(2.0 / 3.0 * log2(2.0 / 3.0) + 1.0 / 3.0 * log2(1.0 / 3.0)) / 2.0, 1e-6);
    cr_assert_eq(tjson_get(tjson_at(layers, 2), "load_entropy")->num, -1.0, "no accesses");
    const struct tjson *rt = tjson_get(j, "routing");
    cr_assert_not_null(rt);
    cr_assert_eq(tjson_get(rt, "reuse_tokens_log2")->len, FETCHER_TRACE_REUSE_BUCKETS);
    cr_assert_eq(tjson_get(rt, "first_uses")->num, 6.0, "keys 0, 1, 2, 3, 4 and 7");
    const struct tjson *hist = tjson_get(j, "latency_us_log2");
    cr_assert_eq(hist->len, FETCHER_TRACE_LAT_BUCKETS);
    cr_assert_eq(tjson_at(hist, 7)->num, (double)n);
    tjson_free(j);
    free(text);

    text = NULL;
    f = open_memstream(&text, &len);
    fetcher_trace_write_summary(t, f);
    fclose(f);
    cr_assert(strstr(text, "Belady"), "%s", text);
    cr_assert(strstr(text, "faults/token"), "%s", text);
    free(text);
    fetcher_trace_destroy(t);
}
