/* tests/executor/test_models.c - synthetic models in every weight type; refusals of bad input. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "executor.h"
#include "fixture.h"
#include "kernels/kernels.h"

/* SIMD and scalar kernels differ only in float summation order (single dot products agree to
 * ~1e-5 relative). With float activations (f32, f16, bf16 weights) the layers amplify that
 * little: logits agree within MODELS_TOL_FLOAT * max(1, max |logit|). With 8-bit activations
 * (q8_0, q8_1, q8_K for the quantized types) a last-bit difference can move an activation across
 * a rounding boundary, a step of amax/127, so random-weight models differ more: MODELS_TOL_Q8.
 * The argmax must agree unless the reference's two best logits are closer than twice the
 * observed difference. */
#define MODELS_TOL_FLOAT 5e-3f
#define MODELS_TOL_Q8    3e-2f

static char *t_dir;

static void models_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
}

static void models_teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
    executor_kernels_init();
}

/* Writes a small model of weight type `type` (dense, or MoE with 4 experts top-2). */
static char *write_model(const char *name, uint32_t type, uint32_t n_expert)
{
    size_t n = strlen(t_dir) + strlen(name) + 2;
    char  *path = malloc(n);
    snprintf(path, n, "%s/%s", t_dir, name);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = path,
                                    .n_ctx = 256,
                                    .n_embd = 256,
                                    .n_layer = 2,
                                    .n_head = 8,
                                    .n_head_kv = 2,
                                    .n_ff = 512,
                                    .n_expert = n_expert,
                                    .n_expert_used = n_expert ? 2 : 0,
                                    .type = type,
                                    .seed = 7};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth %s: %s", name, e.text);
    return path;
}

/* Logits of the last token of a fixed 40-token prompt (two batches of 32 + 8). */
static float *run_logits(const char *path, struct executor_threadpool *pool, uint32_t *n_vocab)
{
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(
        executor_ctx_create(
            m, &(struct executor_ctx_opts){.n_ctx = 64, .n_batch = 32, .pool = pool}, &c, &e),
        0, "%s", e.text);
    *n_vocab = executor_ctx_n_vocab(c);
    float  *l = malloc(*n_vocab * sizeof(*l));
    int32_t p[40] = {0};
    for (int i = 0; i < 40; i++)
        p[i] = (int32_t)((i * 31 + 5) % (int32_t)*n_vocab);
    cr_assert_eq(executor_ctx_decode(c, p, 40, l, NULL, &e), 0, "%s", e.text);
    int32_t next = 3;
    cr_assert_eq(executor_ctx_decode(c, &next, 1, l, NULL, &e), 0, "%s", e.text);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    return l;
}

static void compare_isa(uint32_t type, uint32_t n_expert)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    char                                name[64];
    snprintf(name, sizeof(name), "m-%s-%u.gguf", ti->name, n_expert);
    char                       *path = write_model(name, type, n_expert);
    struct executor_threadpool *pool = NULL;
    cr_assert_eq(executor_threadpool_create(2, &pool), 0);
    executor_kernels_init();
    enum executor_isa best = executor_kernels_active();
    uint32_t          nv = 0;
    float            *fast = run_logits(path, pool, &nv);
    cr_assert_eq(executor_kernels_select(EXECUTOR_ISA_REF), 0);
    float *ref = run_logits(path, pool, &nv);
    cr_assert_eq(executor_kernels_select(best), 0);
    float    scale = 1.0f, diff = 0.0f;
    int32_t  am_f = 0, am_r = 0;
    uint32_t vdt = executor_vec_dot_type(type);
    float    tol =
        vdt == COMMON_GGML_TYPE_F32 || vdt == COMMON_GGML_TYPE_F16 || vdt == COMMON_GGML_TYPE_BF16
               ? MODELS_TOL_FLOAT
               : MODELS_TOL_Q8;
    for (uint32_t i = 0; i < nv; i++) {
        scale = fmaxf(scale, fabsf(ref[i]));
        diff = fmaxf(diff, fabsf(ref[i] - fast[i]));
        cr_assert(isfinite(fast[i]), "%s: logit %u is not finite", name, i);
        if (fast[i] > fast[am_f])
            am_f = (int32_t)i;
        if (ref[i] > ref[am_r])
            am_r = (int32_t)i;
    }
    cr_log_info("%s: %s vs ref max |diff| %.3g (scale %.3g)", name, executor_isa_name(best),
                (double)diff, (double)scale);
    float second = -INFINITY;
    for (uint32_t i = 0; i < nv; i++)
        if ((int32_t)i != am_r && ref[i] > second)
            second = ref[i];
    cr_expect_leq(diff, tol * scale, "%s: %s vs ref logits differ by %g (scale %g)", name,
                  executor_isa_name(best), (double)diff, (double)scale);
    if (ref[am_r] - second > 2 * diff)
        cr_expect_eq(am_f, am_r, "%s: argmax %d (%s) vs %d (ref)", name, am_f,
                     executor_isa_name(best), am_r);
    free(fast);
    free(ref);
    free(path);
    executor_threadpool_destroy(pool);
}

#define ISA_TEST(tname, type, n_expert)                                                            \
    Test(executor_models, tname, .init = models_setup, .fini = models_teardown, .timeout = 120)    \
    {                                                                                              \
        compare_isa(type, n_expert);                                                               \
    }

ISA_TEST(simd_matches_ref_f32, COMMON_GGML_TYPE_F32, 0)
ISA_TEST(simd_matches_ref_f16, COMMON_GGML_TYPE_F16, 0)
ISA_TEST(simd_matches_ref_bf16, COMMON_GGML_TYPE_BF16, 0)
ISA_TEST(simd_matches_ref_q8_0, COMMON_GGML_TYPE_Q8_0, 0)
ISA_TEST(simd_matches_ref_q4_0, COMMON_GGML_TYPE_Q4_0, 0)
ISA_TEST(simd_matches_ref_q4_1, COMMON_GGML_TYPE_Q4_1, 0)
ISA_TEST(simd_matches_ref_q5_0, COMMON_GGML_TYPE_Q5_0, 0)
ISA_TEST(simd_matches_ref_q5_1, COMMON_GGML_TYPE_Q5_1, 0)
ISA_TEST(simd_matches_ref_q4_K, COMMON_GGML_TYPE_Q4_K, 0)
ISA_TEST(simd_matches_ref_q5_K, COMMON_GGML_TYPE_Q5_K, 0)
ISA_TEST(simd_matches_ref_q6_K, COMMON_GGML_TYPE_Q6_K, 0)
ISA_TEST(simd_matches_ref_moe_q8_0, COMMON_GGML_TYPE_Q8_0, 4)
ISA_TEST(simd_matches_ref_moe_q4_K, COMMON_GGML_TYPE_Q4_K, 4)
ISA_TEST(simd_matches_ref_moe_mxfp4, COMMON_GGML_TYPE_MXFP4, 4)
ISA_TEST(simd_matches_ref_i2_s, COMMON_GGML_TYPE_I2_S, 0)

/* pread of experts into a small slot pool gives the same logits as the mmap source. */
static int test_read_span(const struct common_gguf *g, const struct common_span *s, void *dst,
                          struct common_errmsg *e)
{
    ssize_t r = pread(common_gguf_split_fd(g, s->split), dst, s->size, (off_t)s->offset);
    return r == (ssize_t)s->size ? 0 : common_errmsg_set(e, COMMON_EIO, "short read");
}

Test(executor_models, pread_source_matches_mmap, .init = models_setup, .fini = models_teardown,
     .timeout = 120)
{
    char                  *path = write_model("moe.gguf", COMMON_GGML_TYPE_Q4_0, 4);
    uint32_t               nv = 0;
    float                 *a = run_logits(path, NULL, &nv);
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(
        executor_model_open(path,
                            &(struct executor_model_opts){.weights = EXECUTOR_WEIGHTS_PREAD,
                                                          .read_span = test_read_span},
                            &m, &e),
        0, "%s", e.text);
    cr_assert_eq(
        executor_ctx_create(m, &(struct executor_ctx_opts){.n_ctx = 64, .n_batch = 32}, &c, &e), 0);
    float  *b = malloc(nv * sizeof(*b));
    int32_t p[40] = {0};
    for (int i = 0; i < 40; i++)
        p[i] = (int32_t)((i * 31 + 5) % (int32_t)nv);
    cr_assert_eq(executor_ctx_decode(c, p, 40, b, NULL, &e), 0, "%s", e.text);
    int32_t next = 3;
    cr_assert_eq(executor_ctx_decode(c, &next, 1, b, NULL, &e), 0, "%s", e.text);
    for (uint32_t i = 0; i < nv; i++)
        cr_assert_eq(a[i], b[i], "logit %u: mmap %g, pread %g", i, (double)a[i], (double)b[i]);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    free(a);
    free(b);
    free(path);
}

Test(executor_models, decode_refuses_prompt_longer_than_context, .init = models_setup,
     .fini = models_teardown)
{
    char                  *path = write_model("d.gguf", COMMON_GGML_TYPE_Q8_0, 0);
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(executor_ctx_create(m, &(struct executor_ctx_opts){.n_ctx = 16}, &c, &e), 0);
    int32_t toks[17] = {0};
    float  *l = malloc(executor_ctx_n_vocab(c) * sizeof(*l));
    cr_assert_eq(executor_ctx_decode(c, toks, 17, l, NULL, &e), COMMON_ERANGE);
    cr_expect(strstr(e.text, "17") && strstr(e.text, "16"), "message should give the numbers: %s",
              e.text);
    cr_expect_eq(executor_ctx_n_past(c), 0, "nothing may be evaluated");
    cr_assert_eq(executor_ctx_decode(c, toks, 10, l, NULL, &e), 0);
    cr_expect_eq(executor_ctx_decode(c, toks, 7, l, NULL, &e), COMMON_ERANGE);
    cr_expect_eq(executor_ctx_n_past(c), 10);
    toks[0] = (int32_t)executor_ctx_n_vocab(c);
    cr_expect_eq(executor_ctx_decode(c, toks, 1, l, NULL, &e), COMMON_EINVAL);
    free(l);
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    free(path);
}

Test(executor_models, q8_0_cache_refused_for_narrow_heads)
{
    FIXTURE_OR_SKIP(model_path, "models/llama-2-tiny-random.gguf");
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(model_path, NULL, &m, &e), 0, "%s", e.text);
    cr_expect_eq(executor_ctx_create(
                     m, &(struct executor_ctx_opts){.cache_type = COMMON_CACHE_Q8_0}, &c, &e),
                 COMMON_EINVAL);
    cr_expect_null(c);
    executor_model_destroy(m);
    free(model_path);
}

/* Rewrites the GGUF at `src` to `dst`, replacing the architecture name (and its key prefix) and
 * optionally giving tensor `bad` the type `bad_type` (data zero-filled to the new size). */
static void rewrite_gguf(const char *src, const char *dst, const char *arch, const char *bad,
                         uint32_t bad_type)
{
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(src, NULL, &g, NULL), 0);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), 0);
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        if (strcmp(kv->key, "general.architecture") == 0) {
            cr_assert_eq(common_gguf_writer_set_str(w, kv->key, arch), 0);
        } else if (strncmp(kv->key, "llama.", 6) == 0) {
            struct common_gguf_kv copy = *kv;
            char                  key[256];
            snprintf(key, sizeof(key), "%s.%s", arch, kv->key + 6);
            copy.key = key;
            cr_assert_eq(common_gguf_writer_copy_kv(w, &copy), 0);
        } else {
            cr_assert_eq(common_gguf_writer_copy_kv(w, kv), 0);
        }
    }
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        uint32_t type = bad && strcmp(t->name, bad) == 0 ? bad_type : t->type;
        cr_assert_eq(common_gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne), 0);
    }
    cr_assert_eq(common_gguf_writer_begin(w, dst, NULL), 0);
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        uint64_t                         size = t->size;
        if (bad && strcmp(t->name, bad) == 0)
            cr_assert_eq(common_ggml_row_size(bad_type, t->ne[0] * t->ne[1], &size), 0);
        char *buf = calloc(1, size);
        if (size == t->size)
            cr_assert_eq(pread(common_gguf_split_fd(g, 0), buf, size, (off_t)t->offset),
                         (ssize_t)size);
        cr_assert_eq(common_gguf_writer_write_data(w, buf, size, NULL), 0);
        free(buf);
    }
    cr_assert_eq(common_gguf_writer_finish(w, NULL), 0);
    common_gguf_writer_destroy(w);
    common_gguf_close(g);
}

Test(executor_models, load_refuses_unsupported_weight_type, .init = models_setup,
     .fini = models_teardown)
{
    char *src = write_model("ok.gguf", COMMON_GGML_TYPE_F32, 0);
    char  dst[4096];
    snprintf(dst, sizeof(dst), "%s/bad.gguf", t_dir);
    rewrite_gguf(src, dst, "llama", "blk.1.attn_q.weight", COMMON_GGML_TYPE_IQ2_XXS);
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(dst, NULL, &m, &e), COMMON_ENOTSUP);
    cr_expect_null(m);
    cr_expect(strstr(e.text, "blk.1.attn_q.weight") && strstr(e.text, "iq2_xxs"),
              "message should name the tensor and type: %s", e.text);
    free(src);
}

Test(executor_models, load_refuses_unsupported_architecture, .init = models_setup,
     .fini = models_teardown)
{
    char *src = write_model("moe.gguf", COMMON_GGML_TYPE_F32, 4);
    char  dst[4096];
    snprintf(dst, sizeof(dst), "%s/gptneox.gguf", t_dir);
    rewrite_gguf(src, dst, "gptneox", NULL, 0);
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(dst, NULL, &m, &e), COMMON_ENOTSUP, "%s", e.text);
    cr_expect(strstr(e.text, "gptneox") && strstr(e.text, "qwen2moe, qwen3moe, olmoe"),
              "message should name the architecture and the supported ones: %s", e.text);
    free(src);
}

/* Copies the GGUF at `src` to `dst` with metadata key `key` set to the u32 `value`, or left out
 * when `drop`. */
static void rewrite_key(const char *src, const char *dst, const char *key, uint32_t value,
                        bool drop)
{
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(src, NULL, &g, NULL), 0);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), 0);
    bool seen = false;
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *kv = common_gguf_kv_at(g, i);
        if (strcmp(kv->key, key) != 0)
            cr_assert_eq(common_gguf_writer_copy_kv(w, kv), 0);
        else if ((seen = true) && !drop)
            cr_assert_eq(common_gguf_writer_set_u32(w, key, value), 0);
    }
    if (!seen && !drop)
        cr_assert_eq(common_gguf_writer_set_u32(w, key, value), 0);
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        cr_assert_eq(common_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne), 0);
    }
    cr_assert_eq(common_gguf_writer_begin(w, dst, NULL), 0);
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        char                            *buf = malloc(t->size);
        cr_assert_eq(pread(common_gguf_split_fd(g, 0), buf, t->size, (off_t)t->offset),
                     (ssize_t)t->size);
        cr_assert_eq(common_gguf_writer_write_data(w, buf, t->size, NULL), 0);
        free(buf);
    }
    cr_assert_eq(common_gguf_writer_finish(w, NULL), 0);
    common_gguf_writer_destroy(w);
    common_gguf_close(g);
}

/* deepseek2 metadata that cannot describe the tensors is refused with the key named. */
Test(executor_models, deepseek2_bad_metadata_names_the_key, .init = models_setup,
     .fini = models_teardown)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof(src), "%s/ds.gguf", t_dir);
    snprintf(dst, sizeof(dst), "%s/bad.gguf", t_dir);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = src,
                                    .arch = COMMON_ARCH_DEEPSEEK2,
                                    .n_embd = 128,
                                    .n_layer = 3,
                                    .n_head = 4,
                                    .n_ff = 64,
                                    .type = COMMON_GGML_TYPE_Q8_0,
                                    .seed = 3};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "%s", e.text);
    struct executor_model *m = NULL;
    cr_assert_eq(executor_model_open(src, NULL, &m, &e), 0, "%s", e.text);
    executor_model_destroy(m);
    static const struct {
        const char *key;
        uint32_t    value;
        bool        drop;
        const char *want;
    } cases[] = {
        {"deepseek2.expert_group_count", 3, false, "expert_group_count 3"},
        {"deepseek2.expert_group_used_count", 4, false, "expert_group_used_count 4"},
        {"deepseek2.attention.kv_lora_rank", 0, true, "'deepseek2.attention.kv_lora_rank'"},
        {"deepseek2.attention.key_length_mla", 0, true, "'deepseek2.attention.key_length_mla'"},
        {"deepseek2.attention.key_length", 99, false, "key_length 99"},
        {"deepseek2.leading_dense_block_count", 0, false, "ffn_gate_inp"},
        {"deepseek2.leading_dense_block_count", 9, false, "leading_dense_block_count 9"},
        {"deepseek2.expert_gating_func", 7, false, "expert_gating_func 7"},
        {"deepseek2.expert_shared_count", 2, false, "2 shared experts"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        rewrite_key(src, dst, cases[i].key, cases[i].value, cases[i].drop);
        m = NULL;
        e.text[0] = '\0';
        cr_expect_lt(executor_model_open(dst, NULL, &m, &e), 0, "%s accepted", cases[i].key);
        cr_expect_null(m);
        cr_expect_not_null(strstr(e.text, cases[i].want), "%s: message '%s' should name '%s'",
                           cases[i].key, e.text, cases[i].want);
    }
}

/* Logits after each of n tokens of a deepseek2 model, fed in batches of `batch`. */
static float *mla_logits(const char *path, struct executor_threadpool *pool,
                         enum common_cache_type ct, uint32_t batch, uint32_t n, uint32_t *n_vocab)
{
    struct executor_model *m = NULL;
    struct executor_ctx   *c = NULL;
    struct common_errmsg   e = {{0}};
    cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
    cr_assert_eq(
        executor_ctx_create(m,
                            &(struct executor_ctx_opts){
                                .n_ctx = 64, .n_batch = batch, .cache_type = ct, .pool = pool},
                            &c, &e),
        0, "%s", e.text);
    *n_vocab = executor_ctx_n_vocab(c);
    float *l = malloc((size_t)n * *n_vocab * sizeof(*l));
    cr_assert_not_null(l);
    for (uint32_t t = 0; t < n; t += batch) {
        int32_t        p[64];
        const uint32_t k = n - t < batch ? n - t : batch;
        for (uint32_t i = 0; i < k; i++)
            p[i] = (int32_t)(((t + i) * 37 + 11) % *n_vocab);
        /* all logits of the batch: decode one token at a time through the last one */
        for (uint32_t i = 0; i < k; i++)
            cr_assert_eq(executor_ctx_decode(c, p + i, 1, l + (size_t)(t + i) * *n_vocab, NULL, &e),
                         0, "%s", e.text);
    }
    executor_ctx_destroy(c);
    executor_model_destroy(m);
    return l;
}

/* Latent attention runs a token's heads in groups over each cached row (fewer per group when a
 * step has few tokens): a prompt in one batch and token by token give the same bits, with the f16
 * and the q8_0 cache (heads 64 wide: the latent key of 160 fits q8_0 blocks), and q8_0 stays near
 * f16. */
Test(executor_models, deepseek2_latent_attention_batches_agree, .init = models_setup,
     .fini = models_teardown)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/ds.gguf", t_dir);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = path,
                                    .arch = COMMON_ARCH_DEEPSEEK2,
                                    .n_embd = 256,
                                    .n_layer = 2,
                                    .n_head = 4,
                                    .n_ff = 64,
                                    .n_vocab = 300,
                                    .seed = 5};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "%s", e.text);
    struct executor_threadpool *pool = NULL;
    cr_assert_eq(executor_threadpool_create(2, &pool), 0);
    const uint32_t n = 40;
    uint32_t       nv = 0;
    float         *ref16 = NULL;
    for (int ct = 0; ct < 2; ct++) {
        const enum common_cache_type type = ct ? COMMON_CACHE_Q8_0 : COMMON_CACHE_F16;
        float                       *one = mla_logits(path, pool, type, 1, n, &nv);
        float                       *all = NULL;
        /* batches of 40 (one), then 13 (a tail of 1): the prefill's grouping differs from decode's
         */
        static const uint32_t batches[] = {40, 13};
        for (size_t bi = 0; bi < 2; bi++) {
            const uint32_t         b = batches[bi];
            struct executor_model *m = NULL;
            struct executor_ctx   *c = NULL;
            cr_assert_eq(executor_model_open(path, NULL, &m, &e), 0, "%s", e.text);
            cr_assert_eq(executor_ctx_create(
                             m,
                             &(struct executor_ctx_opts){
                                 .n_ctx = 64, .n_batch = b, .cache_type = type, .pool = pool},
                             &c, &e),
                         0, "%s", e.text);
            int32_t p[40];
            for (uint32_t i = 0; i < n; i++)
                p[i] = (int32_t)((i * 37 + 11) % nv);
            all = malloc(nv * sizeof(*all));
            cr_assert_eq(executor_ctx_decode(c, p, n, all, NULL, &e), 0, "%s", e.text);
            cr_expect(memcmp(all, one + (size_t)(n - 1) * nv, nv * sizeof(*all)) == 0,
                      "%s cache, batches of %u: the last logits differ from token by token",
                      common_cache_type_name(type), b);
            free(all);
            executor_ctx_destroy(c);
            executor_model_destroy(m);
        }
        if (!ct) {
            ref16 = one;
            continue;
        }
        float scale = 0.0f, diff = 0.0f;
        for (size_t i = 0; i < (size_t)n * nv; i++) {
            scale = fmaxf(scale, fabsf(ref16[i]));
            diff = fmaxf(diff, fabsf(ref16[i] - one[i]));
        }
        cr_expect_lt(diff, MODELS_TOL_Q8 * scale, "q8_0 cache: max |diff| %g of %g", (double)diff,
                     (double)scale);
        cr_expect_gt(diff, 0.0f, "the q8_0 cache should round something");
        free(one);
    }
    free(ref16);
    executor_threadpool_destroy(pool);
}

/* glm4moe: the prediction block after the last layer is described but not run or loaded. */
Test(executor_models, glm4moe_prediction_block_is_left_out, .init = models_setup,
     .fini = models_teardown)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof(src), "%s/glm.gguf", t_dir);
    snprintf(dst, sizeof(dst), "%s/bad.gguf", t_dir);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = src,
                                    .arch = COMMON_ARCH_GLM4MOE,
                                    .n_embd = 128,
                                    .n_layer = 3,
                                    .n_head = 4,
                                    .n_ff = 64,
                                    .type = COMMON_GGML_TYPE_Q8_0,
                                    .seed = 3};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "%s", e.text);
    struct executor_model *m = NULL;
    cr_assert_eq(executor_model_open(
                     src, &(struct executor_model_opts){.weights = EXECUTOR_WEIGHTS_MMAP}, &m, &e),
                 0, "%s", e.text);
    const struct common_model *d = executor_model_desc(m);
    cr_expect_eq(d->hp.n_layer, 3u, "block_count 4 less 1 prediction layer");
    cr_expect_gt(d->bytes_unused, 0u);
    cr_expect_eq(d->bytes_total, d->bytes_resident + d->bytes_experts + d->bytes_unused);
    executor_model_destroy(m);

    rewrite_key(src, dst, "glm4moe.nextn_predict_layers", 4, false);
    cr_expect_lt(executor_model_open(dst, NULL, &m, &e), 0);
    cr_expect_not_null(strstr(e.text, "nextn_predict_layers 4"), "%s", e.text);
    rewrite_key(src, dst, "glm4moe.rope.dimension_sections", 8, false);
    cr_expect_eq(executor_model_open(dst, NULL, &m, &e), COMMON_ENOTSUP);
    cr_expect_not_null(strstr(e.text, "rope.dimension_sections"), "%s", e.text);
}

/* gpt-oss: a missing sliding window and a RoPE base of its own for the sliding layers are named. */
Test(executor_models, gpt_oss_bad_metadata_names_the_key, .init = models_setup,
     .fini = models_teardown)
{
    char src[4096], dst[4096];
    snprintf(src, sizeof(src), "%s/go.gguf", t_dir);
    snprintf(dst, sizeof(dst), "%s/bad.gguf", t_dir);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = src,
                                    .arch = COMMON_ARCH_GPTOSS,
                                    .n_embd = 128,
                                    .n_layer = 2,
                                    .n_head = 4,
                                    .n_head_kv = 2,
                                    .n_ff = 64,
                                    .type = COMMON_GGML_TYPE_MXFP4,
                                    .seed = 3};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "%s", e.text);
    struct executor_model *m = NULL;
    cr_assert_eq(executor_model_open(src, NULL, &m, &e), 0, "%s", e.text);
    const struct common_hparams *hp = executor_model_hparams(m);
    cr_expect_eq(hp->n_swa, 16u);
    cr_expect(common_hparams_layer_is_swa(hp, 0) && !common_hparams_layer_is_swa(hp, 1),
              "the even layers slide");
    executor_model_destroy(m);
    rewrite_key(src, dst, "gpt-oss.attention.sliding_window", 0, true);
    cr_expect_lt(executor_model_open(dst, NULL, &m, &e), 0);
    cr_expect_not_null(strstr(e.text, "'gpt-oss.attention.sliding_window'"), "%s", e.text);
    rewrite_key(src, dst, "gpt-oss.attention.sliding_window", 0, false);
    cr_expect_lt(executor_model_open(dst, NULL, &m, &e), 0);
    cr_expect_not_null(strstr(e.text, "sliding_window is 0"), "%s", e.text);
}

/* A bitnet-b1.58 model with I2_S weights in `layout` (seed 003's three). */
static char *write_bitnet_i2s(const char *name, enum executor_synth_i2s layout)
{
    size_t n = strlen(t_dir) + strlen(name) + 2;
    char  *path = malloc(n);
    snprintf(path, n, "%s/%s", t_dir, name);
    struct common_errmsg       e = {{0}};
    struct executor_synth_opts o = {.path = path,
                                    .arch = COMMON_ARCH_BITNET_B158,
                                    .n_ctx = 256,
                                    .n_embd = 256,
                                    .n_layer = 2,
                                    .n_head = 8,
                                    .n_head_kv = 2,
                                    .n_ff = 384,
                                    .type = COMMON_GGML_TYPE_I2_S,
                                    .i2s_layout = layout,
                                    .seed = 5};
    cr_assert_eq(executor_synth_write(&o, &e), 0, "synth %s: %s", name, e.text);
    return path;
}

/* The same ternary weights (one power-of-two scale per tensor) in Microsoft's layout, with
 * inline f16 block scales and with a sibling scale tensor: each is recognised by its size alone
 * and the three give the same logits to the bit, on the SIMD kernels and on the reference. */
Test(executor_models, i2s_layouts_give_the_same_logits, .init = models_setup,
     .fini = models_teardown, .timeout = 120)
{
    static const char          *names[3] = {"qk256.gguf", "bitnet32.gguf", "split32.gguf"};
    char                       *paths[3];
    struct executor_threadpool *pool = NULL;
    cr_assert_eq(executor_threadpool_create(2, &pool), 0);
    for (int l = 0; l < 3; l++)
        paths[l] = write_bitnet_i2s(names[l], (enum executor_synth_i2s)l);
    /* Which layout each file was read as: the kernel type of a weight view. */
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(paths[2], NULL, &g, NULL), 0);
    cr_expect_not_null(common_gguf_tensor_find(g, "blk.0.ffn_down.scales"));
    common_gguf_close(g);
    executor_kernels_init();
    const enum executor_isa best = executor_kernels_active();
    uint32_t                nv = 0;
    for (int pass = 0; pass < 2; pass++) {
        cr_assert_eq(executor_kernels_select(pass ? EXECUTOR_ISA_REF : best), 0);
        float *ref = run_logits(paths[0], pool, &nv);
        float  amax = 0.0f;
        for (uint32_t i = 0; i < nv; i++) {
            cr_assert(isfinite(ref[i]));
            amax = fmaxf(amax, fabsf(ref[i]));
        }
        cr_expect_gt(amax, 0.0f, "logits are all zero");
        for (int l = 1; l < 3; l++) {
            float *got = run_logits(paths[l], pool, &nv);
            cr_expect_arr_eq(got, ref, nv * sizeof(float), "%s and %s differ (%s)", names[l],
                             names[0], executor_isa_name(executor_kernels_active()));
            free(got);
        }
        free(ref);
    }
    cr_assert_eq(executor_kernels_select(best), 0);
    for (int l = 0; l < 3; l++)
        free(paths[l]);
    executor_threadpool_destroy(pool);
}

/* Copies the GGUF at `src` to `dst`, giving tensor `name` `extra` more bytes of data (zeros; a
 * negative `extra` cuts its end off). */
static void rewrite_grown(const char *src, const char *dst, const char *name, int64_t extra)
{
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(src, NULL, &g, NULL), 0);
    struct common_gguf_writer *w = NULL;
    cr_assert_eq(common_gguf_writer_create(&w, 32), 0);
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++)
        cr_assert_eq(common_gguf_writer_copy_kv(w, common_gguf_kv_at(g, i)), 0);
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        const int64_t                    more = strcmp(t->name, name) == 0 ? extra : 0;
        cr_assert_eq(common_gguf_writer_add_tensor_sized(w, t->name, t->type, t->n_dims, t->ne,
                                                         t->type == COMMON_GGML_TYPE_I2_S
                                                             ? (uint64_t)((int64_t)t->size + more)
                                                             : 0),
                     0);
    }
    cr_assert_eq(common_gguf_writer_begin(w, dst, NULL), 0);
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        const int64_t                    more = strcmp(t->name, name) == 0 ? extra : 0;
        const uint64_t                   size = (uint64_t)((int64_t)t->size + more);
        char                            *buf = calloc(1, t->size + (more > 0 ? (uint64_t)more : 0));
        cr_assert_eq(pread(common_gguf_split_fd(g, 0), buf, t->size, (off_t)t->offset),
                     (ssize_t)t->size);
        cr_assert_eq(common_gguf_writer_write_data(w, buf, size, NULL), 0);
        free(buf);
    }
    cr_assert_eq(common_gguf_writer_finish(w, NULL), 0);
    common_gguf_writer_destroy(w);
    common_gguf_close(g);
}

/* I2_S data whose size fits none of the three layouts is refused with the tensor and the sizes
 * named, and so is one a little short of its layout; a little longer still loads. */
Test(executor_models, i2s_size_fitting_no_layout_is_refused, .init = models_setup,
     .fini = models_teardown, .timeout = 60)
{
    char *src = write_bitnet_i2s("ok.gguf", EXECUTOR_SYNTH_I2S_BITNET32);
    char  dst[4096];
    snprintf(dst, sizeof(dst), "%s/bad.gguf", t_dir);
    struct executor_model *m = NULL;
    struct common_errmsg   e = {{0}};
    rewrite_grown(src, dst, "blk.1.attn_k.weight", 96);
    cr_assert_eq(executor_model_open(dst, NULL, &m, &e), 0, "%s", e.text);
    executor_model_destroy(m);
    m = NULL;
    /* 96 bytes short: near enough in size, but the kernels would read past its data. */
    rewrite_grown(src, dst, "blk.1.attn_k.weight", -96);
    cr_assert_eq(executor_model_open(dst, NULL, &m, &e), COMMON_ECORRUPT, "%s", e.text);
    cr_expect_null(m);
    rewrite_grown(src, dst, "blk.1.attn_k.weight", 1024);
    cr_assert_eq(executor_model_open(dst, NULL, &m, &e), COMMON_ECORRUPT, "%s", e.text);
    cr_expect_null(m);
    cr_expect(strstr(e.text, "blk.1.attn_k.weight") && strstr(e.text, "fit no layout"),
              "message should name the tensor: %s", e.text);
    free(src);
}
