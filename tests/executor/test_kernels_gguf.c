/* tests/executor/test_kernels_gguf.c - reference quantizers against llama-quantize output
 * (fixtures). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "executor.h"
#include "fixture.h"
#include "kernels/kernels.h"

/* moe-tiny-f32.gguf and its llama-quantize conversions hold the same weights; quantizing the F32
 * tensors with executor_quantize_row_ref must give the converted files' blocks byte for byte
 * (llama-quantize without an importance matrix uses the *_ref quantizers, also for K-quants). */

/* Reads a tensor's data into a malloc'd buffer. */
static void *read_tensor(const struct common_gguf *g, const struct common_gguf_tensor *t)
{
    void *buf = malloc(t->size);
    cr_assert_not_null(buf);
    const int fd = common_gguf_split_fd(g, t->split);
    size_t    done = 0;
    cr_assert(fd >= 0);
    while (done < t->size) {
        ssize_t got = pread(fd, (char *)buf + done, t->size - done, (off_t)(t->offset + done));
        cr_assert(got > 0, "short read of %s", t->name);
        done += (size_t)got;
    }
    return buf;
}

/* Quantizes every non-F32 tensor of `quant_rel` from the F32 file and compares the bytes. */
static void check_file(const char *quant_rel, int expect_min_tensors)
{
    FIXTURE_OR_SKIP(f32_path, "moe-tiny/moe-tiny-f32.gguf");
    FIXTURE_OR_SKIP(q_path, quant_rel);
    struct common_gguf  *gf = NULL, *gq = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(f32_path, NULL, &gf, &e), 0, "%s", e.text);
    cr_assert_eq(common_gguf_open(q_path, NULL, &gq, &e), 0, "%s", e.text);
    int n_checked = 0;
    for (uint64_t i = 0; i < common_gguf_n_tensors(gq); i++) {
        const struct common_gguf_tensor *tq = common_gguf_tensor_at(gq, i);
        if (tq->type == COMMON_GGML_TYPE_F32)
            continue;
        const struct common_gguf_tensor *tf = common_gguf_tensor_find(gf, tq->name);
        cr_assert_not_null(tf, "%s missing from the F32 file", tq->name);
        cr_assert_eq(tf->type, COMMON_GGML_TYPE_F32);
        const uint64_t n = tf->size / sizeof(float);
        uint64_t       row_size;
        cr_assert_eq(common_ggml_row_size(tq->type, n, &row_size), 0);
        cr_assert_eq(row_size, tq->size, "%s: size mismatch", tq->name);
        float         *src = read_tensor(gf, tf);
        unsigned char *want = read_tensor(gq, tq);
        unsigned char *got = malloc(tq->size);
        cr_assert_not_null(got);
        cr_assert_eq(executor_quantize_row_ref(tq->type, src, got, (int64_t)n), 0, "%s", tq->name);
        if (memcmp(got, want, tq->size) != 0) {
            const struct common_ggml_type_info *ti = common_ggml_type_get(tq->type);
            uint64_t                            bad = 0, first = UINT64_MAX;
            for (uint64_t b = 0; b < tq->size / ti->type_size; b++) {
                if (memcmp(got + b * ti->type_size, want + b * ti->type_size, ti->type_size)) {
                    bad++;
                    if (first == UINT64_MAX)
                        first = b;
                }
            }
            cr_assert_fail("%s (%s): %llu of %llu blocks differ, first at block %llu", tq->name,
                           ti->name, (unsigned long long)bad,
                           (unsigned long long)(tq->size / ti->type_size),
                           (unsigned long long)first);
        }
        n_checked++;
        free(src);
        free(want);
        free(got);
    }
    cr_assert_geq(n_checked, expect_min_tensors, "only %d quantized tensors compared", n_checked);
    cr_log_info("%s: %d tensors byte-identical", quant_rel, n_checked);
    common_gguf_close(gf);
    common_gguf_close(gq);
    free(f32_path);
    free(q_path);
}

Test(executor_kernels_gguf, q8_0_matches_llama_quantize)
{
    check_file("moe-tiny/moe-tiny-q8_0.gguf", 30);
}

Test(executor_kernels_gguf, q4_0_pure_matches_llama_quantize)
{
    check_file("moe-tiny/moe-tiny-q4_0-pure.gguf", 30);
}

/* Q4_0 with Q8_0 attn_k/attn_v and a Q6_K output head. */
Test(executor_kernels_gguf, q4_0_mixed_matches_llama_quantize)
{
    check_file("moe-tiny/moe-tiny-q4_0.gguf", 30);
}

/* Q4_K, Q5_K, Q6_K and Q8_0 tensors. */
Test(executor_kernels_gguf, q4_k_m_matches_llama_quantize)
{
    check_file("moe-tiny/moe-tiny-q4_k_m.gguf", 30);
}

/* The dot kernels on real weights: every ISA agrees with the reference on each row of
 * blk.0.ffn_down_exps in the Q4_K_M file (Q4_K) and output.weight (Q6_K). */
Test(executor_kernels_gguf, dots_on_real_weights_match_ref)
{
    FIXTURE_OR_SKIP(q_path, "moe-tiny/moe-tiny-q4_k_m.gguf");
    struct common_gguf  *g = NULL;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_gguf_open(q_path, NULL, &g, &e), 0, "%s", e.text);
    static const char *names[] = {"blk.0.ffn_down_exps.weight", "output.weight",
                                  "blk.0.attn_output.weight", "blk.0.attn_k.weight"};
    float              x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_find(g, names[k]);
        cr_assert_not_null(t, "%s", names[k]);
        const int64_t n = (int64_t)t->ne[0];
        uint64_t      rb;
        cr_assert_eq(common_ggml_row_size(t->type, (uint64_t)n, &rb), 0);
        unsigned char *w = read_tensor(g, t);
        unsigned char  act[512];
        cr_assert_eq(executor_quantize_act(t->type, x, act, n), 0);
        for (uint64_t r = 0; r < t->size / rb; r++) {
            const float ref = executor_vec_dot_ref(t->type, n, w + r * rb, act);
            const float simd = executor_vec_dot(t->type, n, w + r * rb, act);
            cr_assert(fabsf(simd - ref) <= 1e-4f * (fabsf(ref) + 1.0f), "%s row %llu: %g vs %g",
                      names[k], (unsigned long long)r, (double)simd, (double)ref);
        }
        free(w);
    }
    common_gguf_close(g);
    free(q_path);
}
