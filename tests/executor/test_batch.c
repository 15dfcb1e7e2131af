/* tests/executor/test_batch.c - continuous batching (executor_ctx_decode_batch): several
 * sequences in shared batches give each one the bits it gets alone. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gpu.h"
#include "executor.h"
#include "fixture.h"

#define BT_SEQS  5  /* sequences of a run */
#define BT_GEN   10 /* greedy tokens each generates */
#define BT_CTX   64
#define BT_STEPS (BT_GEN + 1)

/* Prompt lengths, and the step at which each sequence joins (its prompt then shares a batch
 * with the others' decode tokens). */
static const uint32_t bt_len[BT_SEQS] = {7, 1, 23, 12, 40};
static const uint32_t bt_join[BT_SEQS] = {0, 0, 0, 2, 5};

static char *t_dir;

static void batch_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
}

static void batch_teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
}

static void bt_prompt(uint32_t s, uint32_t n_vocab, int32_t *p)
{
    for (uint32_t i = 0; i < bt_len[s]; i++)
        p[i] = (int32_t)((i * 31 + s * 97 + 5) % n_vocab);
}

static int32_t bt_argmax(const float *l, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t v = 1; v < n; v++)
        if (l[v] > l[best])
            best = (int32_t)v;
    return best;
}

/* The device of a run: its -ngl (0: none) and, for the batch's contexts, the device weights they
 * share (the executor daemon's way; NULL: each context uploads its own). */
struct bt_dev {
    int32_t                            ngl, n_cpu_moe;
    uint64_t                           vram_budget;
    struct executor_devices            devices; /* zeroed: every device */
    const struct executor_gpu_weights *shared;
};

static struct executor_ctx *bt_ctx_on(struct executor_model *m, struct executor_threadpool *pool,
                                      uint32_t n_batch, enum common_cache_type ct,
                                      struct bt_dev dev)
{
    struct executor_ctx *c = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(executor_ctx_create(m,
                                     &(struct executor_ctx_opts){.n_ctx = BT_CTX,
                                                                 .n_batch = n_batch,
                                                                 .cache_type = ct,
                                                                 .pool = pool,
                                                                 .n_gpu_layers = dev.ngl,
                                                                 .n_cpu_moe = dev.n_cpu_moe,
                                                                 .vram_budget = dev.vram_budget,
                                                                 .devices = dev.devices,
                                                                 .gpu_weights = dev.shared},
                                     &c, &e),
                 0, "%s", e.text);
    return c;
}

static struct executor_ctx *bt_ctx(struct executor_model *m, struct executor_threadpool *pool,
                                   uint32_t n_batch, enum common_cache_type ct)
{
    return bt_ctx_on(m, pool, n_batch, ct, (struct bt_dev){0});
}

/* Each sequence alone (one context, default batches), greedy: the logits of every step. */
static float *bt_alone(struct executor_model *m, struct executor_threadpool *pool,
                       enum common_cache_type ct, uint32_t n_vocab, struct bt_dev dev)
{
    float *ref = malloc((size_t)BT_SEQS * BT_STEPS * n_vocab * sizeof(*ref));
    cr_assert_not_null(ref);
    struct executor_ctx *c = bt_ctx_on(m, pool, 0, ct, dev);
    struct common_errmsg e = {{0}};
    for (uint32_t s = 0; s < BT_SEQS; s++) {
        int32_t p[BT_CTX];
        bt_prompt(s, n_vocab, p);
        executor_ctx_reset(c);
        float *l = ref + (size_t)s * BT_STEPS * n_vocab;
        cr_assert_eq(executor_ctx_decode(c, p, bt_len[s], l, NULL, &e), 0, "%s", e.text);
        for (uint32_t k = 1; k < BT_STEPS; k++) {
            int32_t id = bt_argmax(l + (size_t)(k - 1) * n_vocab, n_vocab);
            cr_assert_eq(executor_ctx_decode(c, &id, 1, l + (size_t)k * n_vocab, NULL, &e), 0, "%s",
                         e.text);
        }
    }
    executor_ctx_destroy(c);
    return ref;
}

/* The sequences together: a step runs every active sequence's next token, or its prompt when it
 * joins, as one call in batches of n_batch rows (a prompt straddles batches); the lead context
 * is a separate one or sequence 0's. Every step's logits must equal the lone run's bit for bit.
 * With dev.ngl, the last ngl layers are on the device (the batch's contexts sharing one copy of
 * the weights, the lone run with its own), the MoE of the first dev.n_cpu_moe on the CPU:
 * sequences of few rows share device steps. */
static void bt_check_model_on(const char *path, enum common_cache_type ct, uint32_t n_batch,
                              bool lead_is_seq0, struct bt_dev dev)
{
    struct executor_threadpool *pool = NULL;
    struct executor_model      *m = NULL;
    struct common_errmsg        e = {{0}};
    cr_assert_eq(executor_threadpool_create(2, &pool), 0);
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    const uint32_t n_vocab = executor_model_hparams(m)->n_vocab;
    float         *ref = bt_alone(m, pool, ct, n_vocab, dev);

    struct executor_gpu_weights *gw = NULL;
    if (dev.ngl > 0) {
        const struct executor_gpu_place pl = {.n_gpu_layers = dev.ngl,
                                              .n_cpu_moe = dev.n_cpu_moe,
                                              .vram_budget = dev.vram_budget,
                                              .devices = dev.devices};
        cr_assert_eq(executor_gpu_weights_create(m, &pl, BT_CTX, n_batch ? n_batch : 512,
                                                 BT_SEQS + 1, &gw, &e),
                     0, "%s", e.text);
        dev.shared = gw;
    }
    struct executor_ctx *cs[BT_SEQS];
    for (uint32_t s = 0; s < BT_SEQS; s++)
        cs[s] = bt_ctx_on(m, pool, n_batch, ct, dev);
    struct executor_ctx *lead = lead_is_seq0 ? cs[0] : bt_ctx_on(m, pool, n_batch, ct, dev);
    float               *got = malloc((size_t)BT_SEQS * n_vocab * sizeof(*got));
    int32_t              prompts[BT_SEQS][BT_CTX], next[BT_SEQS];
    uint32_t             steps_done[BT_SEQS] = {0};
    for (uint32_t s = 0; s < BT_SEQS; s++)
        bt_prompt(s, n_vocab, prompts[s]);
    for (uint32_t step = 0;; step++) {
        struct executor_batch_seq q[BT_SEQS];
        uint32_t                  n = 0, who[BT_SEQS];
        for (uint32_t s = 0; s < BT_SEQS; s++) {
            if (step < bt_join[s] || steps_done[s] == BT_STEPS)
                continue;
            const bool first = steps_done[s] == 0;
            q[n] = (struct executor_batch_seq){.ctx = cs[s],
                                               .tokens = first ? prompts[s] : &next[s],
                                               .n = first ? bt_len[s] : 1,
                                               .logits = got + (size_t)s * n_vocab};
            who[n++] = s;
        }
        if (n == 0)
            break;
        cr_assert_eq(executor_ctx_decode_batch(lead, q, n, &e), 0, "step %u: %s", step, e.text);
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t s = who[i], k = steps_done[s]++;
            const float   *want = ref + ((size_t)s * BT_STEPS + k) * n_vocab;
            const float   *have = got + (size_t)s * n_vocab;
            cr_assert_eq(q[i].status, 0);
            cr_assert_eq(executor_ctx_n_past(cs[s]), bt_len[s] + k, "sequence %u step %u", s, k);
            cr_assert(memcmp(want, have, n_vocab * sizeof(float)) == 0,
                      "%s: sequence %u, step %u (batch step %u, %u sequences): logits differ "
                      "from the lone run's",
                      path, s, k, step, n);
            next[s] = bt_argmax(have, n_vocab);
        }
    }
    /* Where the backend has graphs, the steps of several sequences' tokens ran as the graph of
     * their set of members (gpu.c: gpu_graph_step), their logits the lone runs' all the same. */
    if (dev.ngl >= 999 && !dev.n_cpu_moe && !dev.vram_budget && !lead_is_seq0 &&
        gpu_graphs_supported() && !getenv("SLUICE_NO_CUDA_GRAPHS"))
        cr_assert_gt(executor_ctx_gpu_graph_steps(lead), 0,
                     "%s: no step of several sequences ran as a graph", path);
    free(got);
    for (uint32_t s = 0; s < BT_SEQS; s++)
        executor_ctx_destroy(cs[s]);
    if (!lead_is_seq0)
        executor_ctx_destroy(lead);
    executor_gpu_weights_destroy(gw);
    free(ref);
    executor_model_destroy(m);
    executor_threadpool_destroy(pool);
}

/* The device of a test: CUDA's where there is one, else the host backend's (this test's
 * process only); skips without either. */
static void bt_device_or_skip(void)
{
    const struct gpu_backend *cuda = gpu_backend_cuda();
    if (!getenv("SLUICE_GPU_BACKEND") && (!cuda || cuda->device_count(NULL, 0) == 0))
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0);
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) == 0)
        cr_skip_test("no device backend (%s): skipped", why);
}

static void bt_check_model(const char *path, enum common_cache_type ct, uint32_t n_batch,
                           bool lead_is_seq0)
{
    bt_check_model_on(path, ct, n_batch, lead_is_seq0, (struct bt_dev){0});
}

static char *bt_synth(const char *name, struct executor_synth_opts o)
{
    size_t n = strlen(t_dir) + strlen(name) + 2;
    char  *path = malloc(n);
    snprintf(path, n, "%s/%s", t_dir, name);
    o.path = path;
    o.seed = 11;
    struct common_errmsg e = {{0}};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth %s: %s", name, e.text);
    return path;
}

/* The real MoE fixture (llama layout, 8 experts top-2 as the fixture's README says), q8_0. */
Test(executor_batch, moe_fixture_sequences_match_alone, .timeout = 300)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q8_0.gguf");
    bt_check_model(path, COMMON_CACHE_F16, 8, false);
    bt_check_model(path, COMMON_CACHE_F16, 512, true);
    free(path);
}

/* Layers on the device (a CUDA device where there is one, else the host backend, which runs
 * executor/gpu.c's pass on the CPU): sequences of at most EXECUTOR_GPU_ROW_EXACT rows together
 * share device steps (decode tokens, the 7-, 1- and 12-token prompts), longer prompts run alone,
 * and every step's logits are the lone run's bits; all layers and the head on the device, then
 * two layers with the head on the CPU, then all layers with the MoE of the first two on the CPU
 * (--n-cpu-moe), then all with the experts in a small pool (--vram-budget). */
Test(executor_batch, device_sequences_match_alone, .timeout = 300)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q8_0.gguf");
    bt_device_or_skip();
    cr_log_info("on %s0", gpu_backend_name());
    bt_check_model_on(path, COMMON_CACHE_F16, 512, false, (struct bt_dev){.ngl = 999});
    bt_check_model_on(path, COMMON_CACHE_F16, 512, true, (struct bt_dev){.ngl = 2});
    bt_check_model_on(path, COMMON_CACHE_F16, 512, false,
                      (struct bt_dev){.ngl = 999, .n_cpu_moe = 2});
    /* The experts in a pool of three slots (moe-tiny's q8_0 experts are 204 KiB) shared by the
     * batch: a shared step's tokens take turns (rounds) when their experts outnumber the slots. */
    bt_check_model_on(path, COMMON_CACHE_F16, 512, true,
                      (struct bt_dev){.ngl = 999, .vram_budget = 3 * 204 * 1024});
    free(path);
}

/* More sets of two sequences than a context keeps graphs for (8): sequence 0 steps with each
 * of nine others in turn, then with the first three again. Once the slots are full, a new set
 * takes the least recently used slot of as many members and captures into its graph again (on
 * CUDA, cudaGraphExecUpdate in place); every step's logits equal those of the same sequences
 * stepped alone, bit for bit, and every shared step ran as a graph. */
#define GS_SEQS 10
Test(executor_batch, device_graphs_of_more_sets_than_slots_match_alone, .timeout = 300)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_k_m.gguf");
    bt_device_or_skip();
    if (!gpu_graphs_supported() || getenv("SLUICE_NO_CUDA_GRAPHS"))
        cr_skip_test("%s: no graphs: skipped", gpu_backend_name());
    struct executor_threadpool *pool = NULL;
    struct executor_model      *m = NULL;
    struct common_errmsg        e = {{0}};
    cr_assert_eq(executor_threadpool_create(2, &pool), 0);
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    const uint32_t                  nv = executor_model_hparams(m)->n_vocab;
    const struct executor_gpu_place pl = {.n_gpu_layers = 999};
    struct executor_gpu_weights    *gw = NULL;
    cr_assert_eq(executor_gpu_weights_create(m, &pl, BT_CTX, 512, 2 * GS_SEQS + 1, &gw, &e), 0,
                 "%s", e.text);
    const struct bt_dev  dev = {.ngl = 999, .shared = gw};
    struct executor_ctx *cs[GS_SEQS], *alone[GS_SEQS];
    struct executor_ctx *lead = bt_ctx_on(m, pool, 512, COMMON_CACHE_F16, dev);
    float               *got = malloc(2 * (size_t)nv * sizeof(float));
    float               *want = malloc((size_t)nv * sizeof(float));
    int32_t              next[GS_SEQS];
    for (uint32_t s = 0; s < GS_SEQS; s++) {
        cs[s] = bt_ctx_on(m, pool, 512, COMMON_CACHE_F16, dev);
        alone[s] = bt_ctx_on(m, pool, 512, COMMON_CACHE_F16, dev);
        int32_t p[4];
        for (uint32_t i = 0; i < 4; i++)
            p[i] = (int32_t)(1 + (s * 131 + i * 17) % (nv - 1));
        cr_assert_eq(executor_ctx_decode(cs[s], p, 4, got, NULL, &e), 0, "%s", e.text);
        cr_assert_eq(executor_ctx_decode(alone[s], p, 4, want, NULL, &e), 0, "%s", e.text);
        next[s] = bt_argmax(got, nv);
    }
    const uint32_t rounds = 12;
    for (uint32_t r = 0; r < rounds; r++) {
        const uint32_t            pair[2] = {0, 1 + r % (GS_SEQS - 1)};
        struct executor_batch_seq q[2];
        for (uint32_t i = 0; i < 2; i++)
            q[i] = (struct executor_batch_seq){
                .ctx = cs[pair[i]], .tokens = &next[pair[i]], .n = 1, .logits = got + i * nv};
        cr_assert_eq(executor_ctx_decode_batch(lead, q, 2, &e), 0, "round %u: %s", r, e.text);
        for (uint32_t i = 0; i < 2; i++) {
            const uint32_t s = pair[i];
            cr_assert_eq(q[i].status, 0);
            cr_assert_eq(executor_ctx_decode(alone[s], &next[s], 1, want, NULL, &e), 0, "%s",
                         e.text);
            cr_assert(memcmp(want, got + i * nv, nv * sizeof(float)) == 0,
                      "round %u, sequence %u: logits differ from the lone run's", r, s);
            next[s] = bt_argmax(want, nv);
        }
    }
    cr_assert_eq(executor_ctx_gpu_graph_steps(lead), rounds, "every shared step a graph");
    for (uint32_t s = 0; s < GS_SEQS; s++) {
        executor_ctx_destroy(cs[s]);
        executor_ctx_destroy(alone[s]);
    }
    executor_ctx_destroy(lead);
    executor_gpu_weights_destroy(gw);
    free(got);
    free(want);
    executor_model_destroy(m);
    executor_threadpool_destroy(pool);
    free(path);
}

/* The same over several devices, each with its share of the layers (CUDA devices where there are
 * two, else three host devices): a shared step's members pass from one device's layers to the
 * next; all layers and the head split by free memory, then 3 layers over two devices (3,1) with
 * the head on the CPU, then the experts in a pool on each device. */
Test(executor_batch, device_sequences_over_devices_match_alone, .timeout = 300)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q8_0.gguf");
    const struct gpu_backend *cuda = gpu_backend_cuda();
    if (!getenv("SLUICE_GPU_BACKEND") && (!cuda || cuda->device_count(NULL, 0) < 2)) {
        cr_assert_eq(setenv("SLUICE_GPU_BACKEND", "host", 1), 0); /* this test's process only */
        cr_assert_eq(setenv("SLUICE_GPU_HOST_DEVICES", "3", 1), 0);
    }
    char why[256] = "";
    if (gpu_device_count(why, sizeof(why)) < 2)
        cr_skip_test("fewer than two devices (%s): skipped", why);
    cr_log_info("on %d %s devices", gpu_device_count(NULL, 0), gpu_backend_name());
    bt_check_model_on(path, COMMON_CACHE_F16, 512, false, (struct bt_dev){.ngl = 999});
    bt_check_model_on(
        path, COMMON_CACHE_F16, 512, true,
        (struct bt_dev){.ngl = 3,
                        .devices = {.n = 2, .id = {1, 0}, .n_split = 2, .split = {3, 1}}});
    bt_check_model_on(path, COMMON_CACHE_F16, 512, true,
                      (struct bt_dev){.ngl = 999, .vram_budget = 3 * 204 * 1024});
    free(path);
}

/* A dense model with a q8_0 cache. */
Test(executor_batch, dense_q8_0_cache_sequences_match_alone, .init = batch_setup,
     .fini = batch_teardown, .timeout = 300)
{
    char *path =
        bt_synth("dense.gguf", (struct executor_synth_opts){.n_embd = 256,
                                                            .n_layer = 2,
                                                            .n_head = 4,
                                                            .n_head_kv = 2,
                                                            .n_ff = 512,
                                                            .n_vocab = 300,
                                                            .type = COMMON_GGML_TYPE_Q4_K});
    bt_check_model(path, COMMON_CACHE_Q8_0, 16, true);
    free(path);
}

/* gpt-oss: sliding-window layers (a window of 16, rings the sequences wrap) and sinks. */
Test(executor_batch, gpt_oss_sliding_window_sequences_match_alone, .init = batch_setup,
     .fini = batch_teardown, .timeout = 300)
{
    char *path = bt_synth("oss.gguf", (struct executor_synth_opts){.arch = COMMON_ARCH_GPTOSS,
                                                                   .n_embd = 128,
                                                                   .n_layer = 2,
                                                                   .n_head = 4,
                                                                   .n_head_kv = 2,
                                                                   .n_ff = 64,
                                                                   .n_vocab = 300,
                                                                   .type = COMMON_GGML_TYPE_MXFP4});
    bt_check_model(path, COMMON_CACHE_F16, 8, false);
    free(path);
}

/* deepseek2: latent attention (one cached row per position, heads in groups). */
Test(executor_batch, deepseek2_latent_sequences_match_alone, .init = batch_setup,
     .fini = batch_teardown, .timeout = 300)
{
    char *path = bt_synth("ds.gguf", (struct executor_synth_opts){.arch = COMMON_ARCH_DEEPSEEK2,
                                                                  .n_embd = 256,
                                                                  .n_layer = 2,
                                                                  .n_head = 4,
                                                                  .n_ff = 64,
                                                                  .n_vocab = 300});
    bt_check_model(path, COMMON_CACHE_F16, 8, false);
    free(path);
}

/* Bad sequences fail alone and leave the others' results whole; a context given twice, or one
 * of another model, is refused. */
Test(executor_batch, bad_sequences_fail_alone, .init = batch_setup, .fini = batch_teardown,
     .timeout = 120)
{
    char *path = bt_synth(
        "small.gguf", (struct executor_synth_opts){
                          .n_embd = 64, .n_layer = 1, .n_head = 2, .n_ff = 128, .n_vocab = 300});
    char *other = bt_synth(
        "other.gguf", (struct executor_synth_opts){
                          .n_embd = 64, .n_layer = 1, .n_head = 2, .n_ff = 128, .n_vocab = 300});
    struct executor_model *m = NULL, *m2 = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(executor_model_open(other, NULL, &m2, &e), 0, "%s", e.text);
    struct executor_ctx      *a = bt_ctx(m, NULL, 4, COMMON_CACHE_F16);
    struct executor_ctx      *b = bt_ctx(m, NULL, 4, COMMON_CACHE_F16);
    struct executor_ctx      *c = bt_ctx(m, NULL, 4, COMMON_CACHE_F16);
    struct executor_ctx      *x = bt_ctx(m2, NULL, 4, COMMON_CACHE_F16);
    struct executor_ctx      *alone = bt_ctx(m, NULL, 4, COMMON_CACHE_F16);
    float                     la[300], lb[300], lc[300], lx[300], ref[300];
    int32_t                   good[6] = {1, 2, 3, 4, 5, 6}, bad[2] = {7, 300};
    int32_t                   too_long[BT_CTX + 1] = {0};
    struct executor_batch_seq q[] = {
        {.ctx = a, .tokens = good, .n = 6, .logits = la},
        {.ctx = b, .tokens = bad, .n = 2, .logits = lb},
        {.ctx = c, .tokens = too_long, .n = BT_CTX + 1, .logits = lc},
        {.ctx = a, .tokens = good, .n = 1, .logits = lb},
        {.ctx = x, .tokens = good, .n = 1, .logits = lx},
    };
    int rc = executor_ctx_decode_batch(a, q, 5, &e);
    cr_expect_eq(rc, COMMON_EINVAL, "%d: %s", rc, e.text);
    cr_expect_not_null(strstr(e.text, "sequence 1"), "%s", e.text);
    cr_expect_eq(q[0].status, 0);
    cr_expect_eq(q[1].status, COMMON_EINVAL);
    cr_expect_eq(q[2].status, COMMON_ERANGE);
    cr_expect_eq(q[3].status, COMMON_EINVAL);
    cr_expect_eq(q[4].status, COMMON_EINVAL);
    cr_expect_eq(executor_ctx_n_past(a), 6u);
    cr_expect_eq(executor_ctx_n_past(b), 0u);
    cr_expect_eq(executor_ctx_n_past(c), 0u);
    cr_assert_eq(executor_ctx_decode(alone, good, 6, ref, NULL, &e), 0, "%s", e.text);
    cr_expect(memcmp(ref, la, sizeof(ref)) == 0, "the good sequence's logits changed");
    cr_expect_eq(executor_ctx_decode_batch(a, q, 0, &e), 0, "an empty step is no work");
    cr_expect_eq(executor_ctx_decode_batch(NULL, q, 1, &e), COMMON_EINVAL);
    executor_ctx_destroy(a);
    executor_ctx_destroy(b);
    executor_ctx_destroy(c);
    executor_ctx_destroy(x);
    executor_ctx_destroy(alone);
    executor_model_destroy(m);
    executor_model_destroy(m2);
    free(path);
    free(other);
}
