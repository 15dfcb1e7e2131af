/* tests/router/test_sampler.c - each stage of the sampling chain on crafted logits. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "router.h"

static struct router_sampler t_s;

static void fini(void)
{
    router_sampler_fini(&t_s);
}

/* Draws `n` tokens and counts how often each id comes out. */
static void histogram(const float *logits, uint32_t n_vocab, int n, unsigned *count)
{
    memset(count, 0, n_vocab * sizeof(*count));
    for (int i = 0; i < n; i++) {
        int32_t id = -1;
        cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
        cr_assert(id >= 0 && (uint32_t)id < n_vocab);
        count[id]++;
    }
}

Test(router_sampler, greedy_picks_argmax_lowest_id_on_ties, .fini = fini)
{
    const float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    cr_assert_eq(router_sampler_init(&t_s, NULL, 5), 0);
    int32_t id = -1;
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 1);
}

Test(router_sampler, greedy_skips_nan_and_minus_inf, .fini = fini)
{
    const float logits[4] = {NAN, -INFINITY, -3.0f, -5.0f};
    cr_assert_eq(router_sampler_init(&t_s, NULL, 4), 0);
    int32_t id = -1;
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 2);
    const float none[2] = {NAN, -INFINITY};
    router_sampler_fini(&t_s);
    cr_assert_eq(router_sampler_init(&t_s, NULL, 2), 0);
    cr_expect_eq(router_sampler_pick(&t_s, none, &id), COMMON_EINVAL);
}

/* Greedy is the sampler's temperature-0 case also with penalties: the argmax after them. */
Test(router_sampler, greedy_with_repeat_penalty_takes_the_penalised_argmax, .fini = fini)
{
    const float logits[3] = {1.0f, 3.0f, 2.0f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.temperature = 0.0f, .repeat_penalty = 2.0f}, 3),
        0);
    int32_t id = -1;
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 1, "no history: the plain argmax");
    router_sampler_accept(&t_s, 1);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 2, "3 / 2 < 2: the repeated token loses");
}

Test(router_sampler, logit_bias_changes_the_argmax_and_bans, .fini = fini)
{
    const float                    logits[4] = {3.0f, 2.0f, 1.0f, 0.0f};
    const struct router_logit_bias bias[] = {{0, -INFINITY}, {2, 1.5f}};
    cr_assert_eq(
        router_sampler_init(&t_s, &(struct router_sampler_opts){.bias = bias, .n_bias = 2}, 4), 0);
    int32_t id = -1;
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 2, "token 0 is banned and token 2 gets +1.5 (2.5 > 2.0)");
}

Test(router_sampler, repetition_penalty_follows_llama_cpp_rule, .fini = fini)
{
    /* 2.0 / 2 = 1.0 < 1.5: the repeated token loses; a negative logit is multiplied. */
    const float logits[3] = {2.0f, 1.5f, -1.0f};
    cr_assert_eq(
        router_sampler_init(&t_s, &(struct router_sampler_opts){.repeat_penalty = 2.0f}, 3), 0);
    int32_t id = -1;
    router_sampler_accept(&t_s, 0);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 1);
    router_sampler_reset(&t_s);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 0, "reset forgets the history");
}

Test(router_sampler, frequency_and_presence_penalties_count_occurrences, .fini = fini)
{
    /* token 0: 3.0 - 3*0.4 - 0.5 = 1.3 < 1.5 */
    const float logits[2] = {3.0f, 1.5f};
    cr_assert_eq(router_sampler_init(&t_s,
                                     &(struct router_sampler_opts){.frequency_penalty = 0.4f,
                                                                   .presence_penalty = 0.5f},
                                     2),
                 0);
    int32_t id = -1;
    router_sampler_accept(&t_s, 0);
    router_sampler_accept(&t_s, 0);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 0, "two occurrences: 3.0 - 0.8 - 0.5 = 1.7 still wins");
    router_sampler_accept(&t_s, 0);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 1, "three occurrences: 1.3 loses to 1.5");
}

Test(router_sampler, penalty_window_forgets_old_tokens, .fini = fini)
{
    const float logits[3] = {2.0f, 1.5f, 0.0f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.repeat_penalty = 4.0f, .penalty_last_n = 2}, 3),
        0);
    int32_t id = -1;
    router_sampler_accept(&t_s, 0);
    router_sampler_accept(&t_s, 2);
    router_sampler_accept(&t_s, 2);
    cr_assert_eq(router_sampler_pick(&t_s, logits, &id), 0);
    cr_expect_eq(id, 0, "token 0 fell out of the 2-token window");
}

Test(router_sampler, top_k_one_is_greedy_at_any_temperature, .fini = fini)
{
    const float logits[4] = {1.0f, 1.2f, 0.9f, 1.1f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.temperature = 5.0f, .top_k = 1, .seed = 7}, 4),
        0);
    unsigned count[4];
    histogram(logits, 4, 200, count);
    cr_expect_eq(count[1], 200);
}

Test(router_sampler, top_k_keeps_only_k_candidates, .fini = fini)
{
    const float logits[5] = {1.0f, 1.2f, 0.9f, 1.1f, 0.0f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.temperature = 1.0f, .top_k = 2, .seed = 3}, 5),
        0);
    unsigned count[5];
    histogram(logits, 5, 2000, count);
    cr_expect_eq(count[0] + count[2] + count[4], 0);
    cr_expect_gt(count[1], 0);
    cr_expect_gt(count[3], 0);
}

Test(router_sampler, top_p_cuts_the_tail, .fini = fini)
{
    /* probabilities ~ 0.665, 0.245, 0.090: top_p 0.8 keeps the first two */
    const float logits[3] = {2.0f, 1.0f, 0.0f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.temperature = 1.0f, .top_p = 0.8f, .seed = 11}, 3),
        0);
    unsigned count[3];
    histogram(logits, 3, 3000, count);
    cr_expect_eq(count[2], 0);
    cr_expect_gt(count[1], 0);
}

Test(router_sampler, min_p_drops_unlikely_tokens, .fini = fini)
{
    /* p relative to the best: 1, e^-1 = 0.37, e^-3 = 0.05; min_p 0.1 drops the last */
    const float logits[3] = {3.0f, 2.0f, 0.0f};
    cr_assert_eq(
        router_sampler_init(
            &t_s, &(struct router_sampler_opts){.temperature = 1.0f, .min_p = 0.1f, .seed = 5}, 3),
        0);
    unsigned count[3];
    histogram(logits, 3, 3000, count);
    cr_expect_eq(count[2], 0);
    cr_expect_gt(count[1], 0);
}

Test(router_sampler, temperature_flattens_or_sharpens, .fini = fini)
{
    const float logits[2] = {1.0f, 0.0f};
    unsigned    hot[2], cold[2];
    cr_assert_eq(router_sampler_init(
                     &t_s, &(struct router_sampler_opts){.temperature = 10.0f, .seed = 9}, 2),
                 0);
    histogram(logits, 2, 4000, hot);
    router_sampler_fini(&t_s);
    cr_assert_eq(
        router_sampler_init(&t_s, &(struct router_sampler_opts){.temperature = 0.1f, .seed = 9}, 2),
        0);
    histogram(logits, 2, 4000, cold);
    /* T=10: p1 = 1/(1+e^0.1) ~ 0.475; T=0.1: p1 ~ 4.5e-5 */
    cr_expect(hot[1] > 1700 && hot[1] < 2100, "hot[1] = %u", hot[1]);
    cr_expect_lt(cold[1], 10, "cold[1] = %u", cold[1]);
}

Test(router_sampler, same_seed_gives_same_tokens, .fini = fini)
{
    float logits[64];
    for (int i = 0; i < 64; i++)
        logits[i] = (float)((i * 37) % 17) / 4.0f;
    int32_t a[100], b[100];
    for (int run = 0; run < 2; run++) {
        cr_assert_eq(
            router_sampler_init(&t_s,
                                &(struct router_sampler_opts){
                                    .temperature = 1.3f, .top_k = 40, .top_p = 0.95f, .seed = 1234},
                                64),
            0);
        for (int i = 0; i < 100; i++) {
            cr_assert_eq(router_sampler_pick(&t_s, logits, run ? &b[i] : &a[i]), 0);
            router_sampler_accept(&t_s, run ? b[i] : a[i]);
        }
        router_sampler_fini(&t_s);
    }
    cr_expect_arr_eq(a, b, sizeof(a));
}

/* The PRNG and exp are our own, so this sequence is the same on every machine: a change here
 * means results changed for every user of a seed. */
Test(router_sampler, seeded_sequence_is_stable_across_machines, .fini = fini)
{
    const float logits[8] = {0.1f, 0.7f, 0.3f, 0.9f, 0.2f, 0.5f, 0.8f, 0.4f};
    cr_assert_eq(router_sampler_init(
                     &t_s, &(struct router_sampler_opts){.temperature = 1.0f, .seed = 42}, 8),
                 0);
    int32_t got[12];
    for (int i = 0; i < 12; i++)
        cr_assert_eq(router_sampler_pick(&t_s, logits, &got[i]), 0);
    /* recorded from this implementation (xoshiro256** / splitmix64, seed 42) */
    static const int32_t want[12] = {3, 1, 7, 0, 0, 2, 7, 4, 2, 5, 7, 6};
    cr_expect_arr_eq(got, want, sizeof(got));
}

Test(router_sampler, init_rejects_bad_options, .fini = fini)
{
    const struct router_logit_bias bad_bias = {7, 1.0f};
    cr_expect_eq(router_sampler_init(&t_s, NULL, 0), COMMON_EINVAL);
    cr_expect_eq(router_sampler_init(&t_s, &(struct router_sampler_opts){.top_k = -1}, 4),
                 COMMON_EINVAL);
    cr_expect_eq(router_sampler_init(&t_s, &(struct router_sampler_opts){.min_p = 2.0f}, 4),
                 COMMON_EINVAL);
    cr_expect_eq(router_sampler_init(&t_s, &(struct router_sampler_opts){.temperature = NAN}, 4),
                 COMMON_EINVAL);
    cr_expect_eq(
        router_sampler_init(&t_s, &(struct router_sampler_opts){.bias = &bad_bias, .n_bias = 1}, 4),
        COMMON_EINVAL);
}

Test(router_sampler, all_banned_is_an_error, .fini = fini)
{
    const float logits[2] = {-INFINITY, NAN};
    cr_assert_eq(router_sampler_init(&t_s, NULL, 2), 0);
    int32_t id = 99;
    cr_expect_eq(router_sampler_pick(&t_s, logits, &id), COMMON_EINVAL);
    cr_expect_eq(id, 99);
}

/* A sampler that replays the first k picks of another (a request resumed on a restarted router)
 * picks what the other picks next, for every k, sampled with penalties and greedy alike. */
Test(router_sampler, replaying_picks_continues_the_same_sequence)
{
    enum { NV = 50, STEPS = 40 };
    const struct router_sampler_opts kinds[] = {
        {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .repeat_penalty = 1.3f, .seed = 77},
        {.temperature = 0.0f, .repeat_penalty = 1.5f, .presence_penalty = 0.5f}};
    for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++) {
        float   logits[STEPS][NV];
        int32_t ids[STEPS];
        for (int t = 0; t < STEPS; t++)
            for (int v = 0; v < NV; v++)
                logits[t][v] = sinf((float)(t * 31 + v * 7)) * 3.0f;
        struct router_sampler a;
        cr_assert_eq(router_sampler_init(&a, &kinds[ki], NV), 0);
        for (int t = 0; t < STEPS; t++) {
            cr_assert_eq(router_sampler_pick(&a, logits[t], &ids[t]), 0);
            router_sampler_accept(&a, ids[t]);
        }
        router_sampler_fini(&a);
        for (int k = 0; k < STEPS; k++) {
            struct router_sampler b;
            cr_assert_eq(router_sampler_init(&b, &kinds[ki], NV), 0);
            for (int t = 0; t < k; t++)
                router_sampler_replay(&b, ids[t]);
            int32_t next = -1;
            cr_assert_eq(router_sampler_pick(&b, logits[k], &next), 0);
            cr_assert_eq(next, ids[k], "kind %zu: after %d replayed picks the next is %d, not %d",
                         ki, k, next, ids[k]);
            router_sampler_fini(&b);
        }
    }
}
