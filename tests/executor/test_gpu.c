/* tests/executor/test_gpu.c - the forward pass with layers on a device (-ngl) against llama.cpp's
 * reference figures and against the CPU path; without a device, the refusal. ctest runs it twice:
 * on the CUDA device where there is one (else skipped), and as executor_test_gpu_host on the
 * host backend (SLUICE_GPU_BACKEND=host), which runs executor/gpu.c's pass everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"
#include "executor.h"
#include "fixture.h"
#include "kernels/kernels.h"
#include "tjson.h"

#define GPU_TEST_THREADS 2
#define GPU_ALL          999
#define GPU_PPL_TOL      0.005 /* relative, against llama-perplexity */

/* Skips the test visibly when no device can run it. */
#define GPU_OR_SKIP()                                                                              \
    do {                                                                                           \
        char why_[256] = "";                                                                       \
        if (gpu_device_count(why_, sizeof(why_)) == 0)                                             \
            cr_skip_test("no device (%s; SLUICE_GPU_BACKEND=host runs these on the host "          \
                         "backend): skipped",                                                      \
                         why_);                                                                    \
    } while (0)

struct gpu_run {
    struct executor_threadpool *pool;
    struct executor_model      *m;
    struct executor_ctx        *c;
};

/* The KV cache type of every ctx the tests open (run_open_at), the CPU's and the device's. */
static enum common_cache_type g_cache_type;
static int32_t  g_n_cpu_moe;   /* --n-cpu-moe of the device side of check_*_against_cpu */
static uint64_t g_vram_budget; /* --vram-budget of the device side of check_*_against_cpu */
static bool     g_one_pass;    /* one_pass of every ctx run_open_at opens */
static uint32_t g_n_batch;     /* n_batch of every ctx run_open_at opens (0: the default) */

/* Opens a model with the layers on device 0 as pl places them. */
static void run_open_at(struct gpu_run *r, const char *path, struct executor_gpu_place pl)
{
    struct common_errmsg e = {{0}};
    memset(r, 0, sizeof(*r));
    cr_assert_eq(executor_threadpool_create(GPU_TEST_THREADS, &r->pool), 0);
    cr_assert_eq(executor_model_open(path, NULL, &r->m, &e), 0, "%s", e.text);
    int rc = executor_ctx_create(r->m,
                                 &(struct executor_ctx_opts){.n_ctx = 256,
                                                             .n_batch = g_n_batch,
                                                             .cache_type = g_cache_type,
                                                             .pool = r->pool,
                                                             .n_gpu_layers = pl.n_gpu_layers,
                                                             .n_cpu_moe = pl.n_cpu_moe,
                                                             .vram_budget = pl.vram_budget,
                                                             .expert_miss = pl.expert_miss,
                                                             .pool_policy = pl.pool_policy,
                                                             .devices = pl.devices,
                                                             .one_pass = g_one_pass || pl.one_pass},
                                 &r->c, &e);
    cr_assert_eq(rc, 0, "ctx with -ngl %d --n-cpu-moe %d --vram-budget %llu: %s", pl.n_gpu_layers,
                 pl.n_cpu_moe, (unsigned long long)pl.vram_budget, e.text);
}

/* Opens `path` with n_gpu_layers on device 0 (and g_n_cpu_moe, g_vram_budget with some). */
static void run_open(struct gpu_run *r, const char *path, int32_t ngl)
{
    run_open_at(r, path,
                (struct executor_gpu_place){.n_gpu_layers = ngl,
                                            .n_cpu_moe = ngl ? g_n_cpu_moe : 0,
                                            .vram_budget = ngl ? g_vram_budget : 0});
}

static void run_close(struct gpu_run *r)
{
    executor_ctx_destroy(r->c);
    executor_model_destroy(r->m);
    executor_threadpool_destroy(r->pool);
}

static int32_t argmax(const float *v, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = (int32_t)i;
    return best;
}

/* Greedy continuation of `prompt`; the last logits stay in `logits`. */
static void greedy(struct executor_ctx *c, const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen,
                   int32_t *out, float *logits)
{
    struct common_errmsg e = {{0}};
    const uint32_t       nv = executor_ctx_n_vocab(c);
    executor_ctx_reset(c);
    cr_assert_eq(executor_ctx_decode(c, prompt, n_prompt, logits, NULL, &e), 0, "%s", e.text);
    for (uint32_t i = 0; i < n_gen; i++) {
        out[i] = argmax(logits, nv);
        if (i + 1 < n_gen)
            cr_assert_eq(executor_ctx_decode(c, &out[i], 1, logits, NULL, &e), 0, "%s", e.text);
    }
}

static int32_t *json_ids(const struct tjson *arr, uint32_t *n)
{
    cr_assert(arr && arr->kind == TJSON_ARR, "expected an id array in reference.json");
    int32_t *ids = malloc((arr->len ? arr->len : 1) * sizeof(*ids));
    for (size_t i = 0; i < arr->len; i++)
        ids[i] = (int32_t)tjson_at(arr, i)->num;
    *n = (uint32_t)arr->len;
    return ids;
}

/* Every greedy case of reference.json "greedy"/<quant> with the layers on the device as pl
 * places them. */
static void check_greedy_at(const char *quant, struct executor_gpu_place pl)
{
    const int32_t ngl = pl.n_gpu_layers, n_cpu_moe = pl.n_cpu_moe;
    if (ngl > 0) /* the CPU device alone needs none */
        GPU_OR_SKIP();
    FIXTURE_OR_SKIP(ref_path, "moe-tiny/reference.json");
    char rel[128];
    snprintf(rel, sizeof(rel), "moe-tiny/moe-tiny-%s.gguf", quant);
    FIXTURE_OR_SKIP(model_path, rel);
    struct tjson *ref = tjson_load(ref_path);
    cr_assert_not_null(ref);
    const struct tjson *cases = tjson_get(tjson_get(ref, "greedy"), quant);
    cr_assert(cases && cases->kind == TJSON_ARR && cases->len > 0);
    struct gpu_run r;
    run_open_at(&r, model_path, pl);
    float *logits = malloc(executor_ctx_n_vocab(r.c) * sizeof(float));
    for (size_t k = 0; k < cases->len; k++) {
        uint32_t n_prompt, n_gen;
        int32_t *prompt = json_ids(tjson_get(tjson_at(cases, k), "prompt_ids"), &n_prompt);
        int32_t *want = json_ids(tjson_get(tjson_at(cases, k), "gen_ids"), &n_gen);
        int32_t *got = calloc(n_gen, sizeof(*got));
        greedy(r.c, prompt, n_prompt, n_gen, got, logits);
        for (uint32_t i = 0; i < n_gen; i++)
            cr_expect_eq(got[i], want[i],
                         "%s -ngl %d --n-cpu-moe %d case %zu: token %u is %d, llama.cpp %d", quant,
                         ngl, n_cpu_moe, k, i, got[i], want[i]);
        free(prompt);
        free(want);
        free(got);
    }
    free(logits);
    run_close(&r);
    tjson_free(ref);
    free(ref_path);
    free(model_path);
}

static void check_greedy_moe(const char *quant, int32_t ngl, int32_t n_cpu_moe)
{
    check_greedy_at(quant,
                    (struct executor_gpu_place){.n_gpu_layers = ngl, .n_cpu_moe = n_cpu_moe});
}

static void check_greedy(const char *quant, int32_t ngl)
{
    check_greedy_moe(quant, ngl, 0);
}

/* moe-tiny's q8_0 experts are 204 KiB each (three 256 x 256 parts); a token uses 2 of 8. */
#define GPU_TINY_EXPERT (204u * 1024u)

/* --n-cpu-moe: every layer on the device, the MoE of the first two (then of all four) computed
 * by the CPU between the device's attention blocks. */
Test(executor_gpu, greedy_q8_0_with_the_moe_on_the_cpu, .timeout = 300)
{
    check_greedy_moe("q8_0", GPU_ALL, 2);
    check_greedy_moe("q8_0", GPU_ALL, GPU_ALL);
}

/* --vram-budget: the experts of every layer in a pool of two slots (one token's experts; each
 * pick not in the pool copied in over the least recently used), then of five; tokens as
 * llama.cpp's. */
Test(executor_gpu, greedy_q8_0_with_the_experts_in_a_small_pool, .timeout = 300)
{
    check_greedy_at("q8_0", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                        .vram_budget = 2 * GPU_TINY_EXPERT});
    check_greedy_at("q8_0", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                        .vram_budget = 5 * GPU_TINY_EXPERT + 7});
    check_greedy_at("q8_0", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                        .n_cpu_moe = 2,
                                                        .vram_budget = 3 * GPU_TINY_EXPERT});
}

/* The steps of the pool tests, {first position, tokens}: a prefill of 40 (the matmul path), steps
 * of one token, a step of 5 (whose experts may outnumber the slots: rounds), over POOL_TOKS
 * tokens of the vocabulary (nv). */
#define POOL_TOKS 64
static const uint32_t g_pool_steps[][2] = {{0, 40}, {40, 1}, {41, 1}, {42, 1}, {43, 5}, {48, 1}};
#define POOL_STEPS (sizeof(g_pool_steps) / sizeof(g_pool_steps[0]))
static void pool_tokens(int32_t toks[POOL_TOKS], uint32_t nv)
{
    for (uint32_t i = 0; i < POOL_TOKS; i++)
        toks[i] = (int32_t)(1 + (i * 53 + 7) % (nv - 1));
}

/* Logits with the experts in a pool (of 3 and of 2 slots) against every expert uploaded, bit
 * for bit: a prefill of 40 tokens (grouped by expert, the matmul path), decode steps of one
 * token, and a step of 5 tokens whose experts outnumber the slots (taken in rounds). The pool's
 * counters say that it was used and had to give slots up. */
Test(executor_gpu, expert_pool_logits_equal_every_expert_uploaded, .timeout = 300)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    const uint64_t budgets[] = {3 * GPU_TINY_EXPERT, 2 * GPU_TINY_EXPERT};
    for (size_t b = 0; b < sizeof(budgets) / sizeof(budgets[0]); b++) {
        struct gpu_run       all, pooled;
        struct common_errmsg e = {{0}};
        run_open(&all, model_path, GPU_ALL);
        run_open_at(
            &pooled, model_path,
            (struct executor_gpu_place){.n_gpu_layers = GPU_ALL, .vram_budget = budgets[b]});
        const uint32_t nv = executor_ctx_n_vocab(all.c);
        int32_t        toks[POOL_TOKS];
        pool_tokens(toks, nv);
        float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
        for (size_t k = 0; k < POOL_STEPS; k++) {
            const uint32_t at = g_pool_steps[k][0], n = g_pool_steps[k][1];
            cr_assert_eq(executor_ctx_decode(all.c, toks + at, n, la, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_decode(pooled.c, toks + at, n, lb, NULL, &e), 0, "%s",
                         e.text);
            cr_assert_eq(memcmp(la, lb, nv * sizeof(float)), 0,
                         "budget %llu: step %zu (%u tokens at %u): logits differ from every expert "
                         "uploaded",
                         (unsigned long long)budgets[b], k, n, at);
        }
        struct executor_gpu_pool_stats st;
        cr_assert(executor_ctx_gpu_pool_stats(pooled.c, &st));
        cr_assert_eq(st.n_slots, (uint32_t)(budgets[b] / GPU_TINY_EXPERT));
        cr_assert_eq(st.slot_bytes, GPU_TINY_EXPERT);
        cr_assert_gt(st.misses, 32, "fewer copies than experts: slots were never given up");
        cr_assert_eq(st.copied_bytes, st.misses * GPU_TINY_EXPERT);
        cr_assert(executor_ctx_gpu_pool_stats(all.c, &st));
        cr_assert_eq(st.n_slots, 0, "every expert uploaded: no pool");
        free(la);
        free(lb);
        run_close(&all);
        run_close(&pooled);
    }
    free(model_path);
}

/* --policy lfu in the device pool: the logits stay those of every expert uploaded, bit for bit,
 * and where a token's picks outnumber the slots (7 slots, 8 picks a token), so that the least
 * recently used is always the next one wanted, keeping the most used finds more of them. */
Test(executor_gpu, lfu_pool_keeps_the_most_used_experts, .timeout = 300)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct gpu_run       all;
    struct common_errmsg e = {{0}};
    run_open(&all, model_path, GPU_ALL);
    const uint32_t nv = executor_ctx_n_vocab(all.c);
    int32_t        toks[POOL_TOKS];
    pool_tokens(toks, nv);
    float   *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
    uint64_t hits[2] = {0, 0};
    for (int lfu = 0; lfu < 2; lfu++) {
        struct gpu_run pooled;
        run_open_at(&pooled, model_path,
                    (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                .vram_budget = 7 * (uint64_t)GPU_TINY_EXPERT,
                                                .pool_policy =
                                                    lfu ? EXECUTOR_POOL_LFU : EXECUTOR_POOL_LRU});
        executor_ctx_reset(all.c);
        for (uint32_t t = 0; t < 48; t++) {
            cr_assert_eq(executor_ctx_decode(all.c, toks + t, 1, la, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_decode(pooled.c, toks + t, 1, lb, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(memcmp(la, lb, nv * sizeof(float)), 0, "%s: token %u: logits differ",
                         lfu ? "lfu" : "lru", t);
        }
        struct executor_gpu_pool_stats st;
        cr_assert(executor_ctx_gpu_pool_stats(pooled.c, &st));
        hits[lfu] = st.hits;
        run_close(&pooled);
    }
    cr_log_info("48 tokens, 7 slots: lru found %llu picks in the pool, lfu %llu",
                (unsigned long long)hits[0], (unsigned long long)hits[1]);
    cr_assert_gt(hits[1], hits[0], "lfu found no more than lru");
    free(la);
    free(lb);
    run_close(&all);
    free(model_path);
}

/* The pool's device memory: address space for every slot reserved at once, memory mapped behind
 * the slots as they are first filled (virtual memory management; the host backend maps 64 KiB
 * pieces and leaves the rest without access, so a read of a slot never filled would fault):
 * after one token, a few slots' worth; after the pool steps, every slot. The logits equal every
 * expert uploaded, and a plain allocation's (SLUICE_NO_VMM=1), bit for bit. */
Test(executor_gpu, expert_pool_memory_is_mapped_as_its_slots_fill, .timeout = 300)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct gpu_run                  all, vm, plain;
    struct common_errmsg            e = {{0}};
    struct executor_gpu_pool_stats  st;
    const struct executor_gpu_place pl = {.n_gpu_layers = GPU_ALL,
                                          .vram_budget = 24 * (uint64_t)GPU_TINY_EXPERT};
    run_open(&all, model_path, GPU_ALL);
    run_open_at(&vm, model_path, pl);
    cr_assert_eq(setenv("SLUICE_NO_VMM", "1", 1), 0);
    run_open_at(&plain, model_path, pl);
    cr_assert_eq(unsetenv("SLUICE_NO_VMM"), 0);
    cr_assert(executor_ctx_gpu_pool_stats(plain.c, &st));
    cr_assert(!st.on_demand && st.mapped_bytes == 24 * (uint64_t)GPU_TINY_EXPERT,
              "SLUICE_NO_VMM=1: one allocation of every slot");
    cr_assert(executor_ctx_gpu_pool_stats(vm.c, &st));
    cr_assert(st.on_demand, "no virtual memory management on this device");
    cr_assert_eq(st.n_slots, 24);
    const uint64_t first = st.mapped_bytes;
    cr_assert(first >= GPU_TINY_EXPERT && first < 24 * (uint64_t)GPU_TINY_EXPERT,
              "%llu bytes mapped before any token", (unsigned long long)first);
    const uint32_t nv = executor_ctx_n_vocab(all.c);
    int32_t        toks[POOL_TOKS];
    pool_tokens(toks, nv);
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float)),
          *lc = malloc(nv * sizeof(float));
    for (size_t k = 0; k < POOL_STEPS; k++) {
        /* the first step one token, so that few slots fill */
        const uint32_t at = k ? g_pool_steps[k][0] : 0, n = k ? g_pool_steps[k][1] : 1;
        cr_assert_eq(executor_ctx_decode(all.c, toks + at, n, la, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(executor_ctx_decode(vm.c, toks + at, n, lb, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(executor_ctx_decode(plain.c, toks + at, n, lc, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(memcmp(la, lb, nv * sizeof(float)), 0, "step %zu: mapped on demand", k);
        cr_assert_eq(memcmp(la, lc, nv * sizeof(float)), 0, "step %zu: one allocation", k);
        cr_assert(executor_ctx_gpu_pool_stats(vm.c, &st));
        if (k == 0)
            cr_assert(st.mapped_bytes < 24 * (uint64_t)GPU_TINY_EXPERT &&
                          st.mapped_bytes >= (st.hits + st.misses) / 4 * GPU_TINY_EXPERT,
                      "one token: %llu bytes mapped for %llu picks",
                      (unsigned long long)st.mapped_bytes,
                      (unsigned long long)(st.hits + st.misses));
    }
    /* empty slots are taken first: one a copy until the pool is full */
    const uint64_t filled = st.misses < 24 ? st.misses : 24;
    cr_assert_gt(st.mapped_bytes, first, "nothing mapped after the first token");
    cr_assert_geq(st.mapped_bytes, filled * GPU_TINY_EXPERT, "%llu slots filled, %llu bytes mapped",
                  (unsigned long long)filled, (unsigned long long)st.mapped_bytes);
    cr_log_info("%llu copies into 24 slots, %llu bytes mapped", (unsigned long long)st.misses,
                (unsigned long long)st.mapped_bytes);
    free(la);
    free(lb);
    free(lc);
    run_close(&all);
    run_close(&vm);
    run_close(&plain);
    free(model_path);
}

/* The MoE prefill's picks sorted on the device (SLUICE_MOE_DEVICE_SORT=1, gpu_moe_sort) give the
 * logits of the host's sort, bit for bit: two prefills of 40 and 100 tokens, then a decode step,
 * on each quantized MoE fixture. */
Test(executor_gpu, moe_device_sort_equals_host_sort, .timeout = 300)
{
    GPU_OR_SKIP();
    static const char *const rels[] = {"moe-tiny/moe-tiny-q8_0.gguf",
                                       "moe-tiny/moe-tiny-q4_k_m.gguf"};
    for (size_t f = 0; f < sizeof(rels) / sizeof(rels[0]); f++) {
        FIXTURE_OR_SKIP(model_path, rels[f]);
        struct gpu_run       host, dev;
        struct common_errmsg e = {{0}};
        cr_assert_eq(unsetenv("SLUICE_MOE_DEVICE_SORT"), 0);
        run_open(&host, model_path, GPU_ALL);
        cr_assert_eq(setenv("SLUICE_MOE_DEVICE_SORT", "1", 1), 0);
        run_open(&dev, model_path, GPU_ALL);
        cr_assert_eq(unsetenv("SLUICE_MOE_DEVICE_SORT"), 0);
        const uint32_t nv = executor_ctx_n_vocab(host.c);
        int32_t        toks[141];
        for (uint32_t i = 0; i < 141; i++)
            toks[i] = (int32_t)(1 + (i * 71 + 3) % (nv - 1));
        float         *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
        const uint32_t steps[][2] = {{0, 40}, {40, 100}, {140, 1}};
        for (size_t k = 0; k < 3; k++) {
            const uint32_t at = steps[k][0], n = steps[k][1];
            cr_assert_eq(executor_ctx_decode(host.c, toks + at, n, la, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_decode(dev.c, toks + at, n, lb, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(memcmp(la, lb, nv * sizeof(float)), 0,
                         "%s: step %zu (%u tokens at %u): the device's sort changed the logits",
                         rels[f], k, n, at);
        }
        free(la);
        free(lb);
        run_close(&host);
        run_close(&dev);
        free(model_path);
    }
}

/* A budget below one token's experts is refused, naming what it holds and what it needs. */
Test(executor_gpu, a_vram_budget_below_a_token_is_refused, .timeout = 60)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct executor_threadpool *pool = NULL;
    struct executor_model      *m = NULL;
    struct executor_ctx        *c = NULL;
    struct common_errmsg        e = {{0}};
    cr_assert_eq(executor_threadpool_create(1, &pool), 0);
    cr_assert_eq(executor_model_open(model_path, NULL, &m, &e), 0, "%s", e.text);
    const int rc =
        executor_ctx_create(m,
                            &(struct executor_ctx_opts){.n_ctx = 64,
                                                        .pool = pool,
                                                        .n_gpu_layers = GPU_ALL,
                                                        .vram_budget = 2 * GPU_TINY_EXPERT - 1},
                            &c, &e);
    cr_assert_eq(rc, COMMON_EINVAL, "%d: %s", rc, e.text);
    cr_assert_null(c);
    cr_assert(strstr(e.text, "--vram-budget") && strstr(e.text, "holds 1 of the experts") &&
                  strstr(e.text, "a token uses 2"),
              "%s", e.text);
    executor_model_destroy(m);
    executor_threadpool_destroy(pool);
    free(model_path);
}

Test(executor_gpu, greedy_f32_matches_llama_cpp, .timeout = 300)
{
    check_greedy("f32", GPU_ALL);
}

Test(executor_gpu, greedy_q8_0_matches_llama_cpp, .timeout = 300)
{
    check_greedy("q8_0", GPU_ALL);
}

Test(executor_gpu, greedy_q8_0_two_layers_on_the_device, .timeout = 300)
{
    check_greedy("q8_0", 2); /* layers 2, 3 on the device, the head on the CPU */
}

/* The relative L2 distance of two logit rows. */
static double rel_l2(const float *a, const float *b, uint32_t n)
{
    double num = 0, den = 0;
    for (uint32_t v = 0; v < n; v++) {
        const double d = (double)a[v] - (double)b[v];
        num += d * d;
        den += (double)a[v] * (double)a[v];
    }
    return sqrt(num / den);
}

/* The largest difference of one logit between a and b. */
static float max_abs_diff(const float *a, const float *b, uint32_t n)
{
    float m = 0;
    for (uint32_t v = 0; v < n; v++)
        m = fmaxf(m, fabsf(a[v] - b[v]));
    return m;
}

/* The top logit's lead over the second. */
static float top_margin(const float *v, uint32_t n)
{
    const int32_t best = argmax(v, n);
    float         second = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        if ((int32_t)i != best && v[i] > second)
            second = v[i];
    return v[best] - second;
}

/* The CPU and the device on one prompt long enough for the device's matmul path (prefill of
 * 48 tokens), then 16 decode steps both fed the CPU's greedy token: at every step the same top
 * token (unless the CPU's own lead is under 0.02, or under twice the largest difference of one
 * logit at that step: a tie that the order of sums may break either way), and logits close. Fed the
 * same tokens, a tie cannot send the two down different texts. Closeness: within CHECK_RTOL at
 * every step but at most one of a MoE model, which may differ up to CHECK_FLIP_RTOL: an expert
 * choice whose two gate logits are nearer than the two sides' roundings flips, and that token's
 * layer output changes by a whole expert's. Seen on an H100 with moe-tiny Q4_K_M: 0.002 to 0.009 at
 * fifteen steps, 0.030 at one, where the host backend (the same roundings but the order of sums)
 * gave 0.007: a discontinuity, not a drift. */
#define CHECK_RTOL      2e-2
#define CHECK_FLIP_RTOL 0.1
struct check_tol {
    double rtol; /* relative L2 difference of the logits allowed at every step */
    float  tie;  /* the CPU's lead under which the top token may differ */
};
static const struct check_tol g_tol = {CHECK_RTOL, 0.02f};

static void check_path_against_cpu(const char *rel, const char *model_path, int32_t ngl,
                                   struct check_tol tol)
{
    struct gpu_run       cpu, dev;
    struct common_errmsg e = {{0}};
    const bool           one = g_one_pass;
    g_one_pass = false; /* the CPU's own pass (unless SLUICE_ONE_PASS=1 says otherwise) */
    run_open(&cpu, model_path, 0);
    g_one_pass = one;
    run_open(&dev, model_path, ngl);
    cr_assert(!g_one_pass || executor_ctx_gpu_pass(dev.c), "%s: not on gpu.c's pass", rel);
    const uint32_t nv = executor_ctx_n_vocab(cpu.c), n_prompt = 48, n_gen = 16;
    int32_t        prompt[48];
    for (uint32_t i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(1 + (i * 37 + 11) % (nv - 1));
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
    cr_assert_eq(executor_ctx_decode(cpu.c, prompt, n_prompt, la, NULL, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_decode(dev.c, prompt, n_prompt, lb, NULL, &e), 0, "%s", e.text);
    double   worst = 0;
    uint32_t ties = 0, flips = 0;
    for (uint32_t i = 0; i < n_gen; i++) {
        const int32_t a = argmax(la, nv), b = argmax(lb, nv);
        const float   lead = top_margin(la, nv);
        const double  d = rel_l2(la, lb, nv);
        worst = d > worst ? d : worst;
        /* A near tie: the CPU's lead is under tol.tie, or under twice the largest difference
         * of any one logit at this step (which rtol bounds): the order of sums, or the AVX2 and
         * AVX-512 kernels' on the CPU side, may then give either token. */
        if (lead < fmaxf(tol.tie, 2.0f * max_abs_diff(la, lb, nv)))
            ties++;
        else
            cr_expect_eq(a, b, "%s -ngl %d: step %u: token %d on the device, %d on the CPU", rel,
                         ngl, i, b, a);
        if (getenv("SLUICE_TEST_STEPS")) /* a diagnosis: the steps, and a few logits of each */
            cr_log_info("step %u: %.3g lead %.3g; cpu %.7g %.7g %.7g, device %.7g %.7g %.7g", i, d,
                        (double)lead, (double)la[0], (double)la[1], (double)la[a], (double)lb[0],
                        (double)lb[1], (double)lb[a]);
        if (d >= tol.rtol) {
            flips++;
            cr_expect(executor_model_desc(cpu.m)->hp.n_expert > 0 && flips <= 1 &&
                          d < CHECK_FLIP_RTOL,
                      "%s -ngl %d: step %u: logits differ by %.3g (relative; %u such step(s))", rel,
                      ngl, i, d, flips);
        }
        if (i + 1 < n_gen) {
            cr_assert_eq(executor_ctx_decode(cpu.c, &a, 1, la, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_decode(dev.c, &a, 1, lb, NULL, &e), 0, "%s", e.text);
        }
    }
    cr_log_info("%s -ngl %d: logits differ by %.3g at most (relative); %u near-tie step(s), %u "
                "expert flip(s)",
                rel, ngl, worst, ties, flips);
    free(la);
    free(lb);
    run_close(&cpu);
    run_close(&dev);
}

/* --expert-miss cpu and auto: a decode step's experts missing from a pool of two slots are
 * computed on the CPU from RAM while the device computes the others; greedy tokens as
 * llama.cpp's. */
Test(executor_gpu, greedy_with_pool_misses_on_the_cpu, .timeout = 300)
{
    check_greedy_at("q8_0", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                        .vram_budget = 2 * GPU_TINY_EXPERT,
                                                        .expert_miss = EXECUTOR_MISS_CPU});
    check_greedy_at("f32", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                       .vram_budget = 2 * 3 * 256 * 256 * 4,
                                                       .expert_miss = EXECUTOR_MISS_CPU});
    check_greedy_at("q8_0", (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                        .vram_budget = 3 * GPU_TINY_EXPERT,
                                                        .expert_miss = EXECUTOR_MISS_AUTO});
}

/* The pool's misses on the CPU (cpu, then auto) against every expert uploaded: the prefill of
 * 40 tokens copies its misses in (the matmul path), the decode steps (of 1 and of 5 tokens)
 * compute theirs on the CPU; the logits within the device-against-CPU tolerance at every step
 * and the same top token (but near ties). Every pick of a decode step is counted once: found,
 * copied in, or computed on the CPU; in cpu mode no decode step copies. */
Test(executor_gpu, pool_misses_on_the_cpu_match_every_expert_uploaded, .timeout = 300)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    const enum executor_expert_miss modes[] = {EXECUTOR_MISS_CPU, EXECUTOR_MISS_AUTO};
    for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); mi++) {
        struct gpu_run       all, pooled;
        struct common_errmsg e = {{0}};
        run_open(&all, model_path, GPU_ALL);
        run_open_at(&pooled, model_path,
                    (struct executor_gpu_place){.n_gpu_layers = GPU_ALL,
                                                .vram_budget = 2 * GPU_TINY_EXPERT,
                                                .expert_miss = modes[mi]});
        const struct common_hparams *hp = executor_model_hparams(all.m);
        const uint32_t               nv = executor_ctx_n_vocab(all.c);
        int32_t                      toks[POOL_TOKS];
        pool_tokens(toks, nv);
        float   *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
        uint32_t n_tok = 0, flips = 0;
        uint64_t prefill_copies = 0, prefill_counted = 0;
        struct executor_gpu_pool_stats st;
        for (size_t k = 0; k < POOL_STEPS; k++) {
            const uint32_t at = g_pool_steps[k][0], n = g_pool_steps[k][1];
            cr_assert_eq(executor_ctx_decode(all.c, toks + at, n, la, NULL, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_decode(pooled.c, toks + at, n, lb, NULL, &e), 0, "%s",
                         e.text);
            n_tok += k ? n : 0;
            const double d = rel_l2(la, lb, nv);
            if (top_margin(la, nv) >= 0.02f)
                cr_expect_eq(argmax(la, nv), argmax(lb, nv), "%s: step %zu: another top token",
                             executor_expert_miss_name(modes[mi]), k);
            if (d >= CHECK_RTOL)
                flips++;
            cr_expect(flips <= 1 && d < CHECK_FLIP_RTOL,
                      "%s: step %zu (%u tokens at %u): logits differ by %.3g from every expert "
                      "uploaded (%u such steps)",
                      executor_expert_miss_name(modes[mi]), k, n, at, d, flips);
            cr_assert(executor_ctx_gpu_pool_stats(pooled.c, &st));
            if (k == 0) {
                prefill_copies = st.misses;
                prefill_counted = st.hits + st.misses + st.cpu_misses;
            }
        }
        cr_assert_eq(st.hits + st.misses + st.cpu_misses - prefill_counted,
                     (uint64_t)n_tok * hp->n_expert_used * hp->n_layer,
                     "every pick of a decode step counted once");
        cr_assert_gt(st.cpu_misses, 0);
        cr_assert_eq(st.copied_bytes, st.misses * GPU_TINY_EXPERT);
        if (modes[mi] == EXECUTOR_MISS_CPU)
            cr_assert_eq(st.misses, prefill_copies, "a decode step copied an expert in");
        else
            cr_assert(st.copy_gbps > 0 && st.cpu_gbps > 0, "auto measured no rates");
        free(la);
        free(lb);
        run_close(&all);
        run_close(&pooled);
    }
    free(model_path);
}

static void check_against_cpu(const char *rel, int32_t ngl)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, rel);
    check_path_against_cpu(rel, model_path, ngl, g_tol);
    free(model_path);
}

/* check_path_against_cpu on a random bitnet model (llama.cpp's bitnet: per-tensor scales,
 * attention and FFN sub-norms, relu^2) whose matrices are `type`, written by mkmodel's writer.
 * Such a model magnifies rounding: the CPU's own scalar and AVX2 kernels, which differ only in the
 * order of their float sums, gave logits up to 0.013 (TQ1_0, TQ2_0) and 0.021 (Q8_0) apart on it,
 * and the device path (its prefill rounds activations to f16) up to 0.045 from the CPU on the
 * host backend, where F32 weights stay within 0.003: hence 0.1 and ties under 0.05. A missing
 * scale or sub-norm moves the logits by tens of percent. */
static void check_bitnet_against_cpu_as(enum common_arch arch, uint32_t type,
                                        enum executor_synth_i2s layout, const char *name)
{
    GPU_OR_SKIP();
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[4096];
    snprintf(path, sizeof(path), "%s/bitnet.gguf", dir);
    const struct executor_synth_opts o = {.path = path,
                                          .arch = arch,
                                          .n_embd = 256,
                                          .n_layer = 2,
                                          .n_head = 4,
                                          .n_head_kv = 2,
                                          .n_ff = 512,
                                          .n_vocab = 512,
                                          .type = type,
                                          .i2s_layout = layout,
                                          .seed = 20,
                                          .n_threads = 1};
    struct common_errmsg             e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth: %s", e.text);
    check_path_against_cpu(name, path, GPU_ALL, (struct check_tol){0.1, 0.05f});
    fixture_rmtree(dir);
    free(dir);
}

static void check_bitnet_against_cpu(uint32_t type)
{
    check_bitnet_against_cpu_as(COMMON_ARCH_BITNET, type, EXECUTOR_SYNTH_I2S_QK256,
                                common_ggml_type_get(type)->name);
}

/* bitnet-b1.58 (relu^2, I2_S weights times one scale per tensor) in each of the three layouts:
 * Microsoft's (products unscaled, the tensor's scale after them), inline f16 block scales, and
 * block scales in a sibling tensor (rebuilt in memory with inline f32 scales). */
Test(executor_gpu, bitnet_b158_i2s_as_the_cpu, .timeout = 300)
{
    static const struct {
        enum executor_synth_i2s layout;
        const char             *name;
    } lay[] = {{EXECUTOR_SYNTH_I2S_QK256, "i2_s qk256"},
               {EXECUTOR_SYNTH_I2S_BITNET32, "i2_s bitnet32"},
               {EXECUTOR_SYNTH_I2S_SPLIT32, "i2_s split32"}};
    for (size_t i = 0; i < sizeof(lay) / sizeof(lay[0]); i++)
        check_bitnet_against_cpu_as(COMMON_ARCH_BITNET_B158, COMMON_GGML_TYPE_I2_S, lay[i].layout,
                                    lay[i].name);
}

Test(executor_gpu, bitnet_f32_as_the_cpu, .timeout = 300)
{
    check_bitnet_against_cpu(COMMON_GGML_TYPE_F32);
}

Test(executor_gpu, bitnet_tq1_0_as_the_cpu, .timeout = 300)
{
    check_bitnet_against_cpu(COMMON_GGML_TYPE_TQ1_0);
}

Test(executor_gpu, bitnet_tq2_0_as_the_cpu, .timeout = 300)
{
    check_bitnet_against_cpu(COMMON_GGML_TYPE_TQ2_0);
}

/* check_path_against_cpu on a random-weight model of `arch` (mkmodel's writer), Q8_0 or F32:
 * the MoE architectures the device path takes beside llama's layout. */
static void check_arch_against_cpu_as(enum common_arch arch, uint32_t n_head_kv, uint32_t type,
                                      bool lite, struct check_tol tol, uint32_t seed)
{
    GPU_OR_SKIP();
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[4096], name[64];
    snprintf(path, sizeof(path), "%s/arch.gguf", dir);
    snprintf(name, sizeof(name), "%s%s %s", common_arch_name(arch), lite ? " lite" : "",
             common_ggml_type_get(type)->name);
    const uint32_t width = common_ggml_type_get(type)->blck > 128 ? 256 : 128; /* K-quants: 256 */
    const struct executor_synth_opts o = {.path = path,
                                          .arch = arch,
                                          .lite = lite,
                                          .n_embd = width,
                                          .n_layer = 3,
                                          .n_head = 4,
                                          .n_head_kv = n_head_kv,
                                          .n_ff = width,
                                          .n_vocab = 512,
                                          .type = type,
                                          .seed = seed,
                                          .n_threads = 1};
    struct common_errmsg             e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth: %s", e.text);
    check_path_against_cpu(name, path, GPU_ALL, tol);
    fixture_rmtree(dir);
    free(dir);
}

static void check_arch_against_cpu(enum common_arch arch, uint32_t n_head_kv, uint32_t type)
{
    check_arch_against_cpu_as(arch, n_head_kv, type, false, g_tol, 7);
}

/* deepseek2 (V3's shape): latent attention with a q LoRA, a leading dense layer, a shared
 * expert, sigmoid routing with a selection bias over 4 groups of which 2 are kept, weights
 * scaled by 2.5. */
Test(executor_gpu, deepseek2_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_DEEPSEEK2, 4, COMMON_GGML_TYPE_F32);
}

/* deepseek2 in V2-Lite's shape: no q LoRA (wq), softmax routing without groups; Q8_0, whose
 * per-head blocks of attn_k_b and attn_v_b are quantized rows. The tolerance is wider than the
 * fixtures': in these random-weight models an activation the device and the CPU sum in another
 * order may quantize one int8 step apart, and the latent path has more such products (relative
 * differences of about 0.025 here, 0.015 for a llama of the same size, 0.001 in F32). */
Test(executor_gpu, deepseek2_lite_q8_0_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu_as(COMMON_ARCH_DEEPSEEK2, 4, COMMON_GGML_TYPE_Q8_0, true,
                              (struct check_tol){4e-2, 0.02f}, 7);
}

/* gpt-oss with its MoE on the CPU (--n-cpu-moe for every layer, the usual way to run it on a
 * small GPU): attention with sinks, q/k/v and output biases, a sliding window of 16 on every
 * other layer (the 48-token prompt passes it) on the device; F32 with the f16 cache, and Q8_0
 * with the q8_0 cache (tolerance as deepseek2_lite_q8_0_as_the_cpu's). */
Test(executor_gpu, gpt_oss_attention_as_the_cpu, .timeout = 300)
{
    g_n_cpu_moe = 999;
    check_arch_against_cpu(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_F32);
    g_cache_type = COMMON_CACHE_Q8_0;
    check_arch_against_cpu_as(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_Q8_0, false,
                              (struct check_tol){4e-2, 0.02f}, 7);
    g_cache_type = COMMON_CACHE_F16;
    g_n_cpu_moe = 0;
}

/* gpt-oss with its MoE on the device too: the router's bias, top-k of the logits weighted by
 * their softmax, the experts' gate, up and down biases and clamped SwiGLU (gpu_swiglu_oai), in
 * F32 (a prefill's per-expert matmuls), Q8_0 and MXFP4 (the int8 groups or tiles), decode steps in
 * one launch a part; then from a pool of three experts' slots of the eight (a prefill's experts one
 * by one from their slots; decode in rounds, misses copied in or computed on the CPU, whose
 * own expert path adds the biases). */
Test(executor_gpu, gpt_oss_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_F32);
    check_arch_against_cpu_as(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_Q8_0, false,
                              (struct check_tol){4e-2, 0.02f}, 7);
    /* seed 5: seed 7's MXFP4 model has a routing near tie at step 3, where an expert flips and
     * the two caches part (Q8_0 does the same at seeds 2 and 9) */
    check_arch_against_cpu_as(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_MXFP4, false,
                              (struct check_tol){4e-2, 0.02f}, 5);
    g_vram_budget = 3 * 3 * 128 * 128 * 4; /* three F32 experts of 128 x 128 */
    check_arch_against_cpu(COMMON_ARCH_GPTOSS, 2, COMMON_GGML_TYPE_F32);
    g_vram_budget = 0;
}

/* Q2_K and Q3_K weights (the usual low-bit quants of DeepSeek-sized models): a qwen3moe of each
 * type, the attention and the experts in that type, the int8 matvec over their split scales
 * (and Q2_K's split mins) and the prefill over them dequantized, against the CPU's kernels
 * (tolerance as deepseek2_lite_q8_0_as_the_cpu's). */
Test(executor_gpu, q2_k_and_q3_k_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu_as(COMMON_ARCH_QWEN3MOE, 2, COMMON_GGML_TYPE_Q2_K, false,
                              (struct check_tol){4e-2, 0.02f}, 7);
    check_arch_against_cpu_as(COMMON_ARCH_QWEN3MOE, 2, COMMON_GGML_TYPE_Q3_K, false,
                              (struct check_tol){4e-2, 0.02f}, 7);
}

/* olmoe: q/k norms over the whole projection. */
Test(executor_gpu, olmoe_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_OLMOE, 4, COMMON_GGML_TYPE_F32);
}

/* glm4moe: partial rotary, a leading dense layer, a shared expert, sigmoid routing with a bias. */
Test(executor_gpu, glm4moe_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_GLM4MOE, 2, COMMON_GGML_TYPE_F32);
}

/* qwen2moe: q/k/v biases, a shared expert beside the routed ones scaled by the sigmoid of its
 * own gate (gpu_gated_add). */
Test(executor_gpu, qwen2moe_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_QWEN2MOE, 2, COMMON_GGML_TYPE_F32);
}

/* qwen3moe: per-head q/k norms, no shared expert. */
Test(executor_gpu, qwen3moe_as_the_cpu, .timeout = 300)
{
    check_arch_against_cpu(COMMON_ARCH_QWEN3MOE, 2, COMMON_GGML_TYPE_F32);
}

Test(executor_gpu, f32_as_the_cpu, .timeout = 300)
{
    check_against_cpu("moe-tiny/moe-tiny-f32.gguf", GPU_ALL);
}

Test(executor_gpu, q4_0_as_the_cpu, .timeout = 300)
{
    check_against_cpu("moe-tiny/moe-tiny-q4_0.gguf", GPU_ALL);
}

/* --cache-type q8_0 on both sides: the device's q8_0 cache (gpu_kv_store_q8, gpu_attention_q8)
 * against the CPU's, over a 48-token prefill and 16 decode steps (the graph form), every layer
 * on the device, then two; the placement says q8_0. */
Test(executor_gpu, q8_0_cache_as_the_cpu, .timeout = 300)
{
    g_cache_type = COMMON_CACHE_Q8_0;
    check_against_cpu("moe-tiny/moe-tiny-q8_0.gguf", GPU_ALL);
    check_against_cpu("moe-tiny/moe-tiny-q8_0.gguf", 2);
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct gpu_run r;
    run_open(&r, model_path, GPU_ALL);
    char line[1024];
    cr_assert(executor_ctx_gpu_describe(r.c, line, sizeof(line)));
    cr_assert(strstr(line, " KV (q8_0), "), "%s", line);
    run_close(&r);
    g_cache_type = COMMON_CACHE_F16;
    free(model_path);
}

Test(executor_gpu, q4_k_m_as_the_cpu, .timeout = 300)
{
    check_against_cpu("moe-tiny/moe-tiny-q4_k_m.gguf", GPU_ALL);
}

Test(executor_gpu, q4_0_pure_as_the_cpu, .timeout = 300)
{
    check_against_cpu("moe-tiny/moe-tiny-q4_0-pure.gguf", 3);
}

Test(executor_gpu, llama2_tiny_dense_as_the_cpu, .timeout = 300)
{
    check_against_cpu("models/llama-2-tiny-random.gguf", GPU_ALL);
}

/* `sluice perplexity -ngl 999` on eval.txt within 0.5% of llama-perplexity's figure. */
static void check_ppl(const char *quant)
{
    GPU_OR_SKIP();
    const char *san = getenv("SLUICE_SANITIZER");
    if (san && *san && strcmp(gpu_backend_name(), "HOST") == 0)
        cr_skip_test("perplexity on the host backend under %s: skipped (a 90 s run there; the "
                     "release build checks it)",
                     san);
    FIXTURE_OR_SKIP(ref_path, "moe-tiny/reference.json");
    FIXTURE_OR_SKIP(eval_path, "moe-tiny/eval.txt");
    char rel[128];
    snprintf(rel, sizeof(rel), "moe-tiny/moe-tiny-%s.gguf", quant);
    FIXTURE_OR_SKIP(model_path, rel);
    struct tjson *ref = tjson_load(ref_path);
    cr_assert_not_null(ref);
    const struct tjson *want = tjson_get(tjson_get(tjson_get(ref, "perplexity"), quant), "ppl");
    cr_assert(want && want->kind == TJSON_NUM, "no perplexity for %s in reference.json", quant);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "'%s/bin/sluice' perplexity -m '%s' -f '%s' -c 128 -t %d -ngl %d 2>&1",
             SLUICE_BINARY_DIR, model_path, eval_path, GPU_TEST_THREADS, GPU_ALL);
    int   st = 0;
    char *out = fixture_run(cmd, &st);
    cr_assert(out && st == 0, "%s failed:\n%s", cmd, out ? out : "");
    const char *at = strstr(out, "Final estimate: PPL = ");
    double      ppl = -1;
    if (at)
        sscanf(at, "Final estimate: PPL = %lf", &ppl);
    char where[64];
    snprintf(where, sizeof(where), "gpu: %s0", gpu_backend_name());
    cr_assert(strstr(out, where) != NULL, "%s did not put layers on %s0", cmd, gpu_backend_name());
    free(out);
    const double rel_err = fabs(ppl - want->num) / want->num;
    cr_expect_leq(rel_err, GPU_PPL_TOL, "%s -ngl: PPL %.4f vs llama.cpp %.4f (%.3f%%)", quant, ppl,
                  want->num, rel_err * 100);
    cr_log_info("%s -ngl %d: PPL %.4f, llama.cpp %.4f (%.3f%%)", quant, GPU_ALL, ppl, want->num,
                rel_err * 100);
    tjson_free(ref);
    free(ref_path);
    free(eval_path);
    free(model_path);
}

Test(executor_gpu, perplexity_f32, .timeout = 300)
{
    check_ppl("f32");
}

Test(executor_gpu, perplexity_q8_0, .timeout = 300)
{
    check_ppl("q8_0");
}

Test(executor_gpu, perplexity_q4_0, .timeout = 300)
{
    check_ppl("q4_0");
}

Test(executor_gpu, perplexity_q4_k_m, .timeout = 300)
{
    check_ppl("q4_k_m");
}

/* Where no device is usable (this build without CUDA, no driver, no GPU), asking a ctx for
 * layers on one fails with one clear line and nothing else changes. */
Test(executor_gpu, no_device_refused_with_a_reason, .timeout = 60)
{
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) > 0)
        cr_skip_test("a device is present (%s): the refusal is not reachable: skipped",
                     gpu_backend_name());
    FIXTURE_OR_SKIP(model_path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(model_path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_not(executor_gpu_usable(m, &(struct executor_devices){0}, 0, why, sizeof(why)));
    cr_assert(strlen(why) > 0);
    int rc = executor_ctx_create(
        m, &(struct executor_ctx_opts){.n_ctx = 64, .n_gpu_layers = GPU_ALL}, &c, &e);
    cr_assert_eq(rc, COMMON_ENOTSUP, "rc %d: %s", rc, e.text);
    cr_assert_null(c);
    cr_assert(strstr(e.text, "-ngl") != NULL, "message: %s", e.text);
    cr_log_info("refused: %s", e.text);
    executor_model_destroy(m);
    free(model_path);
}

/* A sequence's one-token steps as its captured graph (docs/gpu.md) give bit for bit the logits
 * of the same steps with their kernels launched one by one (SLUICE_NO_CUDA_GRAPHS, read at a
 * sequence's first such step), on a dense and a MoE model; the graph is captured once and
 * replayed (every step after the prompt counted). Skipped on a backend without graphs. */
static void check_graph_steps(const char *rel)
{
    GPU_OR_SKIP();
    cr_assert_eq(gpu_select(0, NULL, NULL, 0), 0);
    if (!gpu_graphs_supported())
        cr_skip_test("%s backend has no graphs: skipped", gpu_backend_name());
    FIXTURE_OR_SKIP(model_path, rel);
    struct gpu_run       gr, lr;
    struct common_errmsg e = {{0}};
    run_open(&gr, model_path, GPU_ALL);
    run_open(&lr, model_path, GPU_ALL);
    const uint32_t nv = executor_ctx_n_vocab(gr.c), n_prompt = 20, n_gen = 24;
    int32_t        prompt[20];
    for (uint32_t i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(1 + (i * 53 + 7) % (nv - 1));
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
    cr_assert_eq(executor_ctx_decode(gr.c, prompt, n_prompt, la, NULL, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_decode(lr.c, prompt, n_prompt, lb, NULL, &e), 0, "%s", e.text);
    for (uint32_t i = 0; i < n_gen; i++) {
        const int32_t tok = argmax(la, nv);
        cr_assert_eq(executor_ctx_decode(gr.c, &tok, 1, la, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(setenv("SLUICE_NO_CUDA_GRAPHS", "1", 1), 0);
        const int rc = executor_ctx_decode(lr.c, &tok, 1, lb, NULL, &e);
        cr_assert_eq(unsetenv("SLUICE_NO_CUDA_GRAPHS"), 0);
        cr_assert_eq(rc, 0, "%s", e.text);
        cr_assert(memcmp(la, lb, nv * sizeof(float)) == 0,
                  "%s: step %u: the graph's logits differ from the launched kernels'", rel, i);
    }
    cr_assert_eq(executor_ctx_gpu_graph_steps(gr.c), n_gen, "%s: steps run as a graph", rel);
    cr_assert_eq(executor_ctx_gpu_graph_steps(lr.c), 0, "%s: SLUICE_NO_CUDA_GRAPHS", rel);
    cr_log_info("%s: %u steps as a graph, the same logits", rel, n_gen);
    free(la);
    free(lb);
    run_close(&gr);
    run_close(&lr);
    free(model_path);
}

Test(executor_gpu, graph_steps_equal_launched_kernels_moe, .timeout = 120)
{
    check_graph_steps("moe-tiny/moe-tiny-q4_k_m.gguf");
}

Test(executor_gpu, graph_steps_equal_launched_kernels_dense, .timeout = 120)
{
    check_graph_steps("models/llama-2-tiny-random.gguf");
}

/* gpu_act_round gives exactly the CPU's quantized activations, expanded: for each activation
 * type, random rows (one with a zero block, one with ties of magnitude) at several widths. */
Test(executor_gpu, activations_rounded_as_the_cpu, .timeout = 60)
{
    GPU_OR_SKIP();
    cr_assert_eq(gpu_select(0, NULL, NULL, 0), 0);
    const uint32_t weights[] = {COMMON_GGML_TYPE_Q8_0, COMMON_GGML_TYPE_Q4_1, COMMON_GGML_TYPE_Q4_K,
                                COMMON_GGML_TYPE_F16, COMMON_GGML_TYPE_BF16};
    const int64_t  widths[] = {256, 512, 4096, 4352};
    const int64_t  n = 3;
    uint64_t       seed = 0x9e3779b97f4a7c15ull;
    for (size_t wi = 0; wi < sizeof(weights) / sizeof(weights[0]); wi++)
        for (size_t ci = 0; ci < sizeof(widths) / sizeof(widths[0]); ci++) {
            const int64_t  cols = widths[ci];
            const uint32_t vdt = executor_vec_dot_type(weights[wi]);
            float         *x = malloc((size_t)(n * cols) * sizeof(float));
            float         *want = malloc((size_t)(n * cols) * sizeof(float));
            float         *got = malloc((size_t)(n * cols) * sizeof(float));
            uint8_t       *q = malloc(executor_act_row_size(weights[wi], cols));
            for (int64_t i = 0; i < n * cols; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                x[i] = (float)((int64_t)(seed >> 33) % 20001 - 10000) / 1777.0f;
            }
            for (int64_t i = 0; i < 256; i++)
                x[cols + i] = 0.0f; /* a zero block in row 1 */
            x[2 * cols + 3] = 9.5f; /* row 2: two values of the largest magnitude */
            x[2 * cols + 7] = -9.5f;
            for (int64_t t = 0; t < n; t++) {
                cr_assert_eq(executor_quantize_act(weights[wi], x + t * cols, q, cols), 0);
                cr_assert_eq(executor_dequantize_row(vdt, q, want + t * cols, cols), 0);
            }
            float *dx = gpu_malloc((size_t)(n * cols) * sizeof(float));
            float *dy = gpu_malloc((size_t)(n * cols) * sizeof(float));
            cr_assert(dx && dy);
            cr_assert_eq(gpu_upload(dx, x, (size_t)(n * cols) * sizeof(float)), 0);
            cr_assert_eq(gpu_memset(dy, 0xff, (size_t)(n * cols) * sizeof(float)), 0);
            cr_assert_eq(gpu_act_round(vdt, dx, cols, n, cols, dy), 0, "%s", gpu_last_error());
            cr_assert_eq(gpu_download(got, dy, (size_t)(n * cols) * sizeof(float)), 0);
            for (int64_t i = 0; i < n * cols; i++)
                cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                          "weights %u (activations %u), %lld cols: element %lld is %.9g, the CPU "
                          "%.9g",
                          weights[wi], vdt, (long long)cols, (long long)i, (double)got[i],
                          (double)want[i]);
            if (gpu_matvec_q8_supported(weights[wi])) {
                /* The q8 image: each int8 value times its scale is the CPU's value too (the
                 * CPU backend's image is the CPU's activation blocks themselves). */
                const size_t rb = gpu_q8_row_bytes(cols);
                uint8_t     *img = malloc((size_t)n * rb);
                void        *dq = gpu_malloc((size_t)n * rb);
                cr_assert(img && dq);
                cr_assert_eq(gpu_memset(dq, 0xff, (size_t)n * rb), 0);
                cr_assert_eq(gpu_act_q8(vdt, dx, cols, n, cols, dq), 0, "%s", gpu_last_error());
                cr_assert_eq(gpu_download(img, dq, (size_t)n * rb), 0);
                for (int64_t t = 0; t < n; t++) {
                    if (gpu_matvec_any_rows()) { /* the CPU backend's: the CPU's blocks */
                        cr_assert_eq(executor_quantize_act(weights[wi], x + t * cols, q, cols), 0);
                        cr_assert(memcmp(img + (size_t)t * rb, q,
                                         executor_act_row_size(weights[wi], cols)) == 0,
                                  "q8 image, weights %u, %lld cols: row %lld is not the CPU's",
                                  weights[wi], (long long)cols, (long long)t);
                        continue;
                    }
                    const int8_t *qv = (const int8_t *)(img + (size_t)t * rb);
                    for (int64_t i = 0; i < cols; i++) {
                        float d;
                        memcpy(&d, img + (size_t)t * rb + (size_t)cols + (size_t)(i / 32) * 4,
                               sizeof(d));
                        const float v = d * (float)qv[i];
                        cr_assert(memcmp(&v, &want[t * cols + i], sizeof(float)) == 0,
                                  "q8 image, weights %u, %lld cols: row %lld value %lld is %.9g, "
                                  "the CPU %.9g",
                                  weights[wi], (long long)cols, (long long)t, (long long)i,
                                  (double)v, (double)want[t * cols + i]);
                    }
                }
                gpu_free(dq);
                free(img);
            }
            gpu_free(dx);
            gpu_free(dy);
            free(x);
            free(want);
            free(got);
            free(q);
        }
}

/* ---- several devices (--device, --tensor-split) ------------------------------------------- */

/* Two devices or more: CUDA's where there are, else three host devices (this test's process
 * only); skips visibly otherwise. */
static void devices_or_skip(void)
{
    const struct gpu_backend *cuda = gpu_backend_cuda();
    if (!getenv("SLUICE_GPU_BACKEND") && (!cuda || cuda->device_count(NULL, 0) < 2))
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    if (strcmp(getenv("SLUICE_GPU_BACKEND") ? getenv("SLUICE_GPU_BACKEND") : "", "host") == 0)
        cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "3", 1), 0);
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) < 2)
        cr_skip_test("fewer than two devices (%s): skipped", why);
}

/* The logits of a prompt and n_gen greedy steps on `a` and `b` are the same bits. */
static void check_same_steps(struct gpu_run *a, struct gpu_run *b, const char *what)
{
    struct common_errmsg e = {{0}};
    const uint32_t       nv = executor_ctx_n_vocab(a->c), n_prompt = 24, n_gen = 6;
    int32_t              prompt[24];
    for (uint32_t i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(1 + (i * 37 + 11) % (nv - 1));
    float *la = malloc(nv * sizeof(float)), *lb = malloc(nv * sizeof(float));
    cr_assert_eq(executor_ctx_decode(a->c, prompt, n_prompt, la, NULL, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_decode(b->c, prompt, n_prompt, lb, NULL, &e), 0, "%s", e.text);
    for (uint32_t i = 0;; i++) {
        cr_assert(memcmp(la, lb, nv * sizeof(float)) == 0, "%s: step %u: the logits differ", what,
                  i);
        if (i == n_gen)
            break;
        const int32_t tok = argmax(la, nv);
        cr_assert_eq(executor_ctx_decode(a->c, &tok, 1, la, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(executor_ctx_decode(b->c, &tok, 1, lb, NULL, &e), 0, "%s", e.text);
    }
    free(la);
    free(lb);
}

/* The fused kernels (a norm with the int8 image of its output, the per-head norms with RoPE)
 * give the launches they replace bit for bit, so a whole pass gives the same logits with them
 * as with SLUICE_NO_FUSION: decode steps (the int8 matvec) and a prefill. */
static void check_fusion_path(const char *what, const char *path)
{
    struct gpu_run a, b;
    run_open(&a, path, GPU_ALL);
    cr_assert_eq(setenv("SLUICE_NO_FUSION", "1", 1), 0);
    run_open(&b, path, GPU_ALL);
    cr_assert_eq(unsetenv("SLUICE_NO_FUSION"), 0);
    check_same_steps(&a, &b, what);
    cr_log_info("%s: the fused kernels give the unfused logits", what);
    run_close(&a);
    run_close(&b);
}

static void check_fusion(const char *rel)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(model_path, rel);
    check_fusion_path(rel, model_path);
    free(model_path);
}

/* A random-weight model of `arch` in `type` (qwen3moe: per-head q/k norms; olmoe: norms over
 * the whole projection). */
static void check_fusion_synth(enum common_arch arch, uint32_t type)
{
    GPU_OR_SKIP();
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[4096];
    snprintf(path, sizeof(path), "%s/fusion.gguf", dir);
    const struct executor_synth_opts o = {
        .path = path,
        .arch = arch,
        .n_embd = 256,
        .n_layer = 3,
        .n_head = 4,
        .n_head_kv = arch == COMMON_ARCH_OLMOE || arch == COMMON_ARCH_DEEPSEEK2 ? 4 : 2,
        .n_ff = 256,
        .n_vocab = 512,
        .type = type,
        .seed = 5,
        .n_threads = 1};
    struct common_errmsg             e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth: %s", e.text);
    char what[64];
    snprintf(what, sizeof(what), "%s %s", common_arch_name(arch), common_ggml_type_get(type)->name);
    check_fusion_path(what, path);
    fixture_rmtree(dir);
    free(dir);
}

Test(executor_gpu, fused_kernels_give_the_unfused_logits, .timeout = 300)
{
    check_fusion("moe-tiny/moe-tiny-q4_k_m.gguf");
    check_fusion("moe-tiny/moe-tiny-q8_0.gguf");
    check_fusion("models/llama-2-tiny-random.gguf");
    check_fusion_synth(COMMON_ARCH_QWEN3MOE, COMMON_GGML_TYPE_Q4_K);
    check_fusion_synth(COMMON_ARCH_QWEN3MOE, COMMON_GGML_TYPE_Q4_0);
    check_fusion_synth(COMMON_ARCH_OLMOE, COMMON_GGML_TYPE_Q8_0);
    check_fusion_synth(COMMON_ARCH_QWEN2MOE, COMMON_GGML_TYPE_Q8_0);  /* a gated shared expert */
    check_fusion_synth(COMMON_ARCH_DEEPSEEK2, COMMON_GGML_TYPE_Q4_0); /* an ungated one */
    check_fusion_synth(COMMON_ARCH_GPTOSS, COMMON_GGML_TYPE_Q8_0);    /* down biases */
}

/* The layers split over the devices give the logits of one device, bit for bit (the kernels are
 * the same; x passes between devices as it is): every layer and the head by free memory, three
 * layers over a list of two in another order (1,1; the head on the CPU), the experts in a pool
 * on each device, the MoE of the first two layers on the CPU (--n-cpu-moe 2), and a q8_0 KV
 * cache. Each device says what it holds; the layers and pools add up. */
static void check_split_path(const char *rel, const char *model_path)
{
    const struct {
        int32_t                 ngl;
        uint64_t                budget;
        struct executor_devices d;
        uint32_t                n_dev; /* devices with layers */
        int32_t                 n_cpu_moe;
        bool                    kv_q8;
    } cases[] = {
        {GPU_ALL, 0, {.n = 0}, 0, 0, false}, /* every device: at most the layers */
        {3, 0, {.n = 2, .id = {1, 0}, .n_split = 2, .split = {1, 1}}, 2, 0, false},
        {GPU_ALL, 3 * GPU_TINY_EXPERT, {.n = 2, .id = {0, 1}}, 2, 0, false},
        {GPU_ALL, 0, {.n = 2, .id = {0, 1}}, 2, 2, false}, /* --n-cpu-moe 2: device 0's MoE */
        {GPU_ALL, 0, {.n = 2, .id = {0, 1}}, 2, 0, true},  /* a q8_0 cache on each device */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct gpu_run one, split;
        if (cases[k].budget && !strstr(rel, "moe-tiny-q8_0"))
            continue; /* GPU_TINY_EXPERT is the q8_0 fixture's */
        if ((cases[k].n_cpu_moe || cases[k].kv_q8) && !strstr(rel, "moe-tiny"))
            continue; /* the fixture's MoE and head dims of 32s */
        g_cache_type = cases[k].kv_q8 ? COMMON_CACHE_Q8_0 : COMMON_CACHE_F16;
        run_open_at(&one, model_path,
                    (struct executor_gpu_place){.n_gpu_layers = cases[k].ngl,
                                                .n_cpu_moe = cases[k].n_cpu_moe,
                                                .vram_budget = cases[k].budget,
                                                .devices = {.single = true}});
        run_open_at(&split, model_path,
                    (struct executor_gpu_place){.n_gpu_layers = cases[k].ngl,
                                                .n_cpu_moe = cases[k].n_cpu_moe,
                                                .vram_budget = cases[k].budget,
                                                .devices = cases[k].d});
        g_cache_type = COMMON_CACHE_F16;
        char name[512], desc[2048];
        cr_assert_eq(executor_ctx_gpu_layers(split.c, name, sizeof(name)),
                     executor_ctx_gpu_layers(one.c, NULL, 0), "case %zu: layers", k);
        cr_assert(strstr(name, " + ") != NULL, "case %zu: one device named: %s", k, name);
        cr_assert(executor_ctx_gpu_describe(split.c, desc, sizeof(desc)));
        uint32_t lines = 0; /* a device's (not the CPU device's, SLUICE_ONE_PASS=1) */
        for (const char *q = desc; q; q = strchr(q, '\n'), q = q ? q + 1 : NULL)
            lines += strncmp(q, "gpu: CPU ", 9) != 0;
        if (cases[k].n_dev)
            cr_assert_eq(lines, cases[k].n_dev, "case %zu: a line per device:\n%s", k, desc);
        cr_assert_gt(lines, 1, "case %zu:\n%s", k, desc);
        cr_log_info("%s, case %zu: %s\n%s", rel, k, name, desc);
        char what[96];
        snprintf(what, sizeof(what), "%s, case %zu", rel, k);
        check_same_steps(&one, &split, what);
        if (!cases[k].budget && !cases[k].n_cpu_moe && gpu_graphs_supported()) {
            /* each device's one-token steps as its graph, the head's or not */
            const uint64_t g1 = executor_ctx_gpu_graph_steps(one.c);
            cr_assert_gt(g1, 0, "case %zu: no graph steps on one device", k);
            cr_assert_eq(executor_ctx_gpu_graph_steps(split.c), lines * g1,
                         "case %zu: graph steps of %u devices", k, lines);
        }
        if (cases[k].budget) { /* a pool per device, of the budget each */
            struct executor_gpu_pool_stats a, b;
            cr_assert(executor_ctx_gpu_pool_stats(one.c, &a));
            cr_assert(executor_ctx_gpu_pool_stats(split.c, &b));
            cr_assert_eq(b.n_slots, 2 * a.n_slots);
            cr_assert_eq(b.expert_bytes, a.expert_bytes);
            cr_assert_gt(b.misses, 0);
        }
        run_close(&one);
        run_close(&split);
    }
}

static void check_split(const char *rel)
{
    devices_or_skip();
    FIXTURE_OR_SKIP(model_path, rel);
    check_split_path(rel, model_path);
    free(model_path);
}

Test(gpu_devices, split_layers_give_one_devices_logits_q8_0, .timeout = 300)
{
    check_split("moe-tiny/moe-tiny-q8_0.gguf");
}

Test(gpu_devices, split_layers_give_one_devices_logits_q4_k_m, .timeout = 300)
{
    check_split("moe-tiny/moe-tiny-q4_k_m.gguf");
}

/* Made here: the fixtures' dense model has one layer. A dense llama and deepseek2 (latent
 * attention, whose cache holds no values) of four layers. */
static void check_split_synth(enum common_arch arch, uint32_t type)
{
    devices_or_skip();
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[4096];
    snprintf(path, sizeof(path), "%s/split.gguf", dir);
    const struct executor_synth_opts o = {.path = path,
                                          .arch = arch,
                                          .n_embd = 128,
                                          .n_layer = 4,
                                          .n_head = 4,
                                          .n_head_kv = arch == COMMON_ARCH_DEEPSEEK2 ? 4 : 2,
                                          .n_ff = 256,
                                          .n_vocab = 512,
                                          .type = type,
                                          .seed = 3,
                                          .n_threads = 1};
    struct common_errmsg             e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth: %s", e.text);
    check_split_path(common_arch_name(arch), path);
    fixture_rmtree(dir);
    free(dir);
}

Test(gpu_devices, split_layers_give_one_devices_logits_dense, .timeout = 300)
{
    check_split_synth(COMMON_ARCH_LLAMA, COMMON_GGML_TYPE_Q4_0);
}

Test(gpu_devices, split_layers_give_one_devices_logits_deepseek2, .timeout = 300)
{
    check_split_synth(COMMON_ARCH_DEEPSEEK2, COMMON_GGML_TYPE_Q8_0);
}

/* The host backend refuses memory of another device than the thread's, as CUDA's kernels
 * cannot use it: a pass that forgets to switch devices fails in the tests. */
Test(gpu_devices, host_backend_refuses_another_devices_memory, .timeout = 60)
{
    devices_or_skip();
    if (strcmp(gpu_backend_name(), "HOST") != 0)
        cr_skip_test("%s backend: the check is the host backend's: skipped", gpu_backend_name());
    cr_assert_eq(gpu_select(0, NULL, NULL, 0), 0);
    cr_assert_eq(gpu_select(1, NULL, NULL, 0), 0);
    cr_assert_eq(gpu_use(0), 0);
    float *a = gpu_malloc(64 * sizeof(float));
    cr_assert_not_null(a);
    cr_assert_eq(gpu_memset(a, 0, 64 * sizeof(float)), 0);
    cr_assert_eq(gpu_use(1), 0);
    cr_assert_eq(gpu_current(), 1);
    cr_assert_eq(gpu_memset(a, 0, 64 * sizeof(float)), -1);
    cr_assert(strstr(gpu_last_error(), "memory of HOST0 used on HOST1") != NULL, "%s",
              gpu_last_error());
    cr_assert_eq(gpu_add(a, a, a, 64), -1);
    cr_assert_eq(gpu_use(7), -1, "HOST7 does not exist");
    cr_assert_eq(gpu_current(), 1);
    cr_assert_eq(gpu_use(0), 0);
    cr_assert_eq(gpu_add(a, a, a, 64), 0);
    gpu_free(a);
}

/* What the options say: --device lists, --split-mode, --tensor-split; bad values refused. */
Test(gpu_devices, device_options_parse_as_llama_cpp, .timeout = 60)
{
    struct executor_devices d = {0};
    struct common_errmsg    e = {{0}};
    int32_t                 ids[EXECUTOR_MAX_DEVICES];
    cr_assert_eq(executor_devices_parse_list(&d, "CUDA1,CUDA0", &e), 0, "%s", e.text);
    cr_assert_eq(d.n, 2);
    cr_assert_eq(executor_devices_resolve(&d, ids, NULL, 0), 2);
    cr_assert(ids[0] == 1 && ids[1] == 0);
    cr_assert_eq(executor_devices_parse_split(&d, "3,1", &e), 0, "%s", e.text);
    cr_assert(d.n_split == 2 && d.split[0] == 3.0f && d.split[1] == 1.0f);
    cr_assert_eq(executor_devices_parse_mode(&d, "none", &e), 0);
    d.main_gpu = 1;
    cr_assert_eq(executor_devices_resolve(&d, ids, NULL, 0), 1);
    cr_assert_eq(ids[0], 1);
    cr_assert_eq(executor_devices_parse_list(&d, "none", &e), 0);
    cr_assert_eq(executor_devices_resolve(&d, ids, NULL, 0), 0);
    const char *bad_lists[] = {"CUDA", "CUDA0,", "GPU0", "CUDA0,CUDA0", "CUDA16", "CUDA-1", ""};
    for (size_t i = 0; i < sizeof(bad_lists) / sizeof(bad_lists[0]); i++) {
        struct executor_devices t = {0};
        cr_assert_eq(executor_devices_parse_list(&t, bad_lists[i], &e), COMMON_EINVAL, "'%s'",
                     bad_lists[i]);
        cr_assert_eq(t.n, 0);
    }
    const char *bad_splits[] = {"", "0", "0,0", "1,-1", "a", "1,,2", "nan"};
    for (size_t i = 0; i < sizeof(bad_splits) / sizeof(bad_splits[0]); i++) {
        struct executor_devices t = {0};
        cr_assert_eq(executor_devices_parse_split(&t, bad_splits[i], &e), COMMON_EINVAL, "'%s'",
                     bad_splits[i]);
    }
    cr_assert_eq(executor_devices_parse_mode(&d, "row", &e), COMMON_EINVAL);
}

/* ---- one forward pass: the CPU's layers on the CPU device (one_pass) ------------------------ */

/* Every layer and the head on the CPU device (no device needed): the greedy ids of
 * reference.json are llama.cpp's. */
Test(gpu_one_pass, cpu_device_greedy_matches_llama_cpp, .timeout = 300)
{
    check_greedy_at("q8_0", (struct executor_gpu_place){.one_pass = true});
    check_greedy_at("f32", (struct executor_gpu_place){.one_pass = true});
}

/* The CPU device's logits follow the CPU's own pass over a prompt and 16 steps (its kernels
 * are the same; the attention's and the experts' sums are grouped otherwise). */
Test(gpu_one_pass, cpu_device_logits_follow_the_cpu_pass, .timeout = 300)
{
    const char *rels[] = {"moe-tiny/moe-tiny-q8_0.gguf", "moe-tiny/moe-tiny-q4_k_m.gguf",
                          "models/llama-2-tiny-random.gguf"};
    for (size_t i = 0; i < sizeof(rels) / sizeof(rels[0]); i++) {
        FIXTURE_OR_SKIP(path, rels[i]);
        g_one_pass = true;
        check_path_against_cpu(rels[i], path, 0, g_tol);
        g_one_pass = false;
        free(path);
    }
}

/* -ngl 2 of moe-tiny's 4 layers: layers 0..1 on the CPU device, 2..3 on the device, in one pass
 * of gpu.c (a line for each in the description, the device's layers counted alone), whose
 * logits follow those of the same layers split between the CPU's own pass and the device. */
Test(gpu_one_pass, cpu_device_ahead_of_a_device, .timeout = 300)
{
    GPU_OR_SKIP();
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q8_0.gguf");
    struct gpu_run split, one;
    run_open_at(&split, path, (struct executor_gpu_place){.n_gpu_layers = 2});
    run_open_at(&one, path, (struct executor_gpu_place){.n_gpu_layers = 2, .one_pass = true});
    char desc[2048];
    cr_assert(executor_ctx_gpu_describe(one.c, desc, sizeof(desc)));
    cr_assert(strncmp(desc, "gpu: CPU (", 10) == 0 && strstr(desc, "layers 0..1 on the CPU") &&
                  strstr(desc, "\ngpu: ") && strstr(desc, "layers 2..3 on the device"),
              "%s", desc);
    cr_assert_eq(executor_ctx_gpu_layers(one.c, NULL, 0), 2);
    cr_assert_eq(executor_ctx_gpu_kv_layers(one.c), 2);
    run_close(&split);
    run_close(&one);
    g_one_pass = true; /* the device side of check_path_against_cpu */
    check_path_against_cpu("moe-tiny q8_0, one pass", path, 2, g_tol);
    g_one_pass = false;
    free(path);
}

/* gpt-oss's sliding-window layers (a window of 16) on the CPU device keep a ring of n_swa +
 * n_batch = 32 positions, as the CPU pass does, over a prompt of 48 (three batches of 16) and 16
 * steps, so the ring wraps: the logits are those of the whole context kept (SLUICE_NO_KV_RING=1),
 * bit for bit, in both cache types, and follow the CPU pass's. */
Test(gpu_one_pass, sliding_window_layers_keep_a_ring, .timeout = 300)
{
    char *dir = fixture_tmpdir();
    cr_assert_not_null(dir);
    char path[4096];
    snprintf(path, sizeof(path), "%s/gpt-oss.gguf", dir);
    const struct executor_synth_opts o = {.path = path,
                                          .arch = COMMON_ARCH_GPTOSS,
                                          .n_embd = 128,
                                          .n_layer = 3,
                                          .n_head = 4,
                                          .n_head_kv = 2,
                                          .n_ff = 128,
                                          .n_vocab = 512,
                                          .type = COMMON_GGML_TYPE_F32,
                                          .seed = 7,
                                          .n_threads = 1};
    struct common_errmsg             e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth: %s", e.text);
    g_n_batch = 16;
    for (int q8 = 0; q8 < 2; q8++) {
        g_cache_type = q8 ? COMMON_CACHE_Q8_0 : COMMON_CACHE_F16;
        struct gpu_run ring, whole;
        run_open_at(&ring, path, (struct executor_gpu_place){.one_pass = true});
        cr_assert_eq(setenv("SLUICE_NO_KV_RING", "1", 1), 0);
        run_open_at(&whole, path, (struct executor_gpu_place){.one_pass = true});
        cr_assert_eq(unsetenv("SLUICE_NO_KV_RING"), 0);
        cr_assert(executor_ctx_gpu_pass(ring.c) && executor_ctx_gpu_pass(whole.c));
        cr_assert_lt(executor_ctx_gpu_kv_bytes(ring.c), executor_ctx_gpu_kv_bytes(whole.c),
                     "no ring: %llu bytes of KV, %llu with the whole context",
                     (unsigned long long)executor_ctx_gpu_kv_bytes(ring.c),
                     (unsigned long long)executor_ctx_gpu_kv_bytes(whole.c));
        check_same_steps(&ring, &whole, q8 ? "gpt-oss ring, q8_0 cache" : "gpt-oss ring");
        run_close(&ring);
        run_close(&whole);
        g_one_pass = true;
        check_path_against_cpu(q8 ? "gpt-oss ring q8_0" : "gpt-oss ring", path, 0,
                               q8 ? (struct check_tol){4e-2, 0.02f} : g_tol);
        g_one_pass = false;
    }
    g_cache_type = COMMON_CACHE_F16;
    g_n_batch = 0;
    fixture_rmtree(dir);
    free(dir);
}
