/* tests/executor/test_kernels.c - SIMD kernels against the scalar reference; conversions;
 * quantizers. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "executor.h"
#include "kernels/kernels.h"

/* Tolerance of a SIMD dot against executor_vec_dot_ref on the same bytes: both compute exact
 * integer sums per block and differ only in the order of float additions, so we require
 *   |simd - ref| <= KTEST_DOT_RTOL * sum_i |w_i * a_i| + 1e-30
 * with w_i and a_i the dequantized weights and activations. Activation conversion must be
 * byte-identical to the reference. */
#define KTEST_DOT_RTOL 1e-5

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static uint64_t t_rng = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (t_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_uniform(void)
{
    return (float)((double)(rng_next() >> 11) * 0x1p-53);
}

static float rng_gauss(void)
{
    float u1 = rng_uniform(), u2 = rng_uniform();
    if (u1 < 1e-12f)
        u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* Gaussian data with a scale that changes every 64 elements and rare outliers. */
static void fill_data(float *x, int64_t n)
{
    float scale = 1.0f;
    for (int64_t i = 0; i < n; i++) {
        if (i % 64 == 0)
            scale = 0.01f + 2.0f * rng_uniform();
        x[i] = scale * rng_gauss();
        if (rng_next() % 97 == 0)
            x[i] *= 6.0f;
    }
}

static size_t row_bytes(uint32_t type, int64_t n)
{
    uint64_t                            out = 0;
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    cr_assert_not_null(ti, "type %u unknown", type);
    out = (uint64_t)(n / ti->blck) * ti->type_size;
    return (size_t)out;
}

static void select_or_skip(enum executor_isa isa)
{
    executor_kernels_init();
    if (executor_kernels_select(isa) != 0)
        cr_skip_test("CPU lacks the %s kernel set: skipped", executor_isa_name(isa));
}

static void restore_isa(void)
{
    if (executor_kernels_select(EXECUTOR_ISA_AVX512) != 0 &&
        executor_kernels_select(EXECUTOR_ISA_AVX2) != 0)
        executor_kernels_select(EXECUTOR_ISA_REF);
}

/* The kernel-only I2_S layouts, whose SIMD dots must give the reference's bits exactly: their
 * float work is one rounding per statement in block order (ref.c), so no compiler can fuse it. */
static bool is_i2s(uint32_t type)
{
    return type == COMMON_GGML_TYPE_I2S_Q128 || type == COMMON_GGML_TYPE_I2S_B32H ||
           type == COMMON_GGML_TYPE_I2S_B32F;
}

/* Types whose SIMD dots give the reference's bits exactly: I2_S, and the ternary types, whose
 * kernels all make llama.cpp's x86 lanes and one FMA per lane and block (ref.c). */
static bool is_bit_exact(uint32_t type)
{
    return is_i2s(type) || type == COMMON_GGML_TYPE_TQ1_0 || type == COMMON_GGML_TYPE_TQ2_0;
}

/* Element counts to test for a weight type: block-32 types take 1, 31, 32, 33, 255, 256, 257
 * blocks and 383, 384, 385, 769 (AVX-512 Q4_0 prepares activations 384 blocks at a time, in groups
 * of 3); K-quants and ternary types 1, 2, 3, 7, 8, 9 super-blocks; float types the block-32 counts
 * plus ragged ones (AVX-512: 64 per iteration, then 16, then a masked tail of n % 16; 47..100 take
 * each path). The I2_S block-32 layouts add 2, 3, 7, 8, 9 and 129 blocks (their kernels take 8
 * blocks per step, the last step partial); I2S_Q128 takes 1, 2, 3, 7, 8, 9, 20 and 54 blocks
 * (n = 128 .. 1152, 2560, 6912: two blocks per step). */
static int test_sizes(uint32_t type, int64_t *out)
{
    static const int64_t                b32[] = {1, 31, 32, 33, 255, 256, 257, 383, 384, 385, 769};
    static const int64_t                bk[] = {1, 2, 3, 7, 8, 9};
    static const int64_t                rag[] = {1, 7, 15, 17, 33, 47, 63, 65, 79, 100};
    static const int64_t                i2s[] = {2, 3, 7, 8, 9, 129};
    static const int64_t                q128[] = {1, 2, 3, 7, 8, 9, 20, 54};
    int                                 k = 0;
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    if (ti->blck == 256) {
        for (size_t i = 0; i < sizeof(bk) / sizeof(bk[0]); i++)
            out[k++] = 256 * bk[i];
        return k;
    }
    if (ti->blck == 128) {
        for (size_t i = 0; i < sizeof(q128) / sizeof(q128[0]); i++)
            out[k++] = 128 * q128[i];
        return k;
    }
    for (size_t i = 0; i < sizeof(b32) / sizeof(b32[0]); i++)
        out[k++] = 32 * b32[i];
    if (ti->blck == 1)
        for (size_t i = 0; i < sizeof(rag) / sizeof(rag[0]); i++)
            out[k++] = rag[i];
    if (is_i2s(type))
        for (size_t i = 0; i < sizeof(i2s) / sizeof(i2s[0]); i++)
            out[k++] = 32 * i2s[i];
    return k;
}

/* Compares the active kernel set with the reference for weights of `type`. */
static void check_vec_dot(uint32_t type)
{
    int64_t sizes[24];
    int     ns = test_sizes(type, sizes);
    double  worst = 0;
    for (int s = 0; s < ns; s++) {
        const int64_t  n = sizes[s];
        const uint32_t at = executor_vec_dot_type(type);
        float         *w = malloc((size_t)n * sizeof(float));
        float         *x = malloc((size_t)n * sizeof(float));
        float         *wd = malloc((size_t)n * sizeof(float));
        float         *xd = malloc((size_t)n * sizeof(float));
        size_t         wb = row_bytes(type, n);
        size_t         ab = executor_act_row_size(type, n);
        void          *wq = malloc(wb);
        void          *aq = malloc(ab);
        void          *aqr = malloc(ab);
        cr_assert(w && x && wd && xd && wq && aq && aqr);
        cr_assert_eq(ab, row_bytes(at, n));
        fill_data(w, n);
        fill_data(x, n);
        cr_assert_eq(executor_quantize_row_ref(type, w, wq, n), 0);
        cr_assert_eq(executor_quantize_act(type, x, aq, n), 0);
        cr_assert_eq(executor_quantize_act_ref(type, x, aqr, n), 0);
        cr_assert(memcmp(aq, aqr, ab) == 0, "%s: activation bytes differ from ref at n=%lld",
                  common_ggml_type_get(type)->name, (long long)n);
        cr_assert_eq(executor_dequantize_row(type, wq, wd, n), 0);
        cr_assert_eq(executor_dequantize_row(at, aq, xd, n), 0);
        double mag = 0;
        for (int64_t i = 0; i < n; i++)
            mag += fabs((double)wd[i] * (double)xd[i]);
        const float  simd = executor_vec_dot(type, n, wq, aq);
        const float  ref = executor_vec_dot_ref(type, n, wq, aq);
        const double err = fabs((double)simd - (double)ref);
        cr_assert(err <= KTEST_DOT_RTOL * mag + 1e-30,
                  "%s/%s n=%lld: simd %.9g ref %.9g |err| %.3g > %.1g * %.6g",
                  common_ggml_type_get(type)->name, executor_isa_name(executor_kernels_active()),
                  (long long)n, (double)simd, (double)ref, err, KTEST_DOT_RTOL, mag);
        if (is_bit_exact(type))
            cr_assert(memcmp(&simd, &ref, sizeof(simd)) == 0, "%s/%s n=%lld: simd %a ref %a",
                      common_ggml_type_get(type)->name,
                      executor_isa_name(executor_kernels_active()), (long long)n, (double)simd,
                      (double)ref);
        /* the ref dot tracks the float dot of the dequantized values */
        double exact = 0;
        for (int64_t i = 0; i < n; i++)
            exact += (double)wd[i] * (double)xd[i];
        cr_assert(fabs((double)ref - exact) <= 1e-4 * mag + 1e-30,
                  "%s n=%lld: ref %.9g vs dequantized dot %.9g", common_ggml_type_get(type)->name,
                  (long long)n, (double)ref, exact);
        if (mag > 0 && err / mag > worst)
            worst = err / mag;
        free(w);
        free(x);
        free(wd);
        free(xd);
        free(wq);
        free(aq);
        free(aqr);
    }
    cr_log_info("%s/%s: worst |simd-ref| / sum|w*a| = %.3g", common_ggml_type_get(type)->name,
                executor_isa_name(executor_kernels_active()), worst);
}

#define KTEST_DOT(tname, type)                                                                     \
    Test(executor_kernels, vec_dot_##tname##_avx2_matches_ref, .fini = restore_isa)                \
    {                                                                                              \
        select_or_skip(EXECUTOR_ISA_AVX2);                                                         \
        check_vec_dot(type);                                                                       \
    }                                                                                              \
    Test(executor_kernels, vec_dot_##tname##_avx512_matches_ref, .fini = restore_isa)              \
    {                                                                                              \
        select_or_skip(EXECUTOR_ISA_AVX512);                                                       \
        check_vec_dot(type);                                                                       \
    }                                                                                              \
    Test(executor_kernels, vec_dot_##tname##_ref_tracks_dequantized, .fini = restore_isa)          \
    {                                                                                              \
        select_or_skip(EXECUTOR_ISA_REF);                                                          \
        check_vec_dot(type);                                                                       \
    }

KTEST_DOT(f32, COMMON_GGML_TYPE_F32)
KTEST_DOT(f16, COMMON_GGML_TYPE_F16)
KTEST_DOT(bf16, COMMON_GGML_TYPE_BF16)
KTEST_DOT(q4_0, COMMON_GGML_TYPE_Q4_0)
KTEST_DOT(q4_1, COMMON_GGML_TYPE_Q4_1)
KTEST_DOT(q5_0, COMMON_GGML_TYPE_Q5_0)
KTEST_DOT(q5_1, COMMON_GGML_TYPE_Q5_1)
KTEST_DOT(q8_0, COMMON_GGML_TYPE_Q8_0)
KTEST_DOT(q2_K, COMMON_GGML_TYPE_Q2_K)
KTEST_DOT(q3_K, COMMON_GGML_TYPE_Q3_K)
KTEST_DOT(q4_K, COMMON_GGML_TYPE_Q4_K)
KTEST_DOT(q5_K, COMMON_GGML_TYPE_Q5_K)
KTEST_DOT(q6_K, COMMON_GGML_TYPE_Q6_K)
KTEST_DOT(mxfp4, COMMON_GGML_TYPE_MXFP4)
KTEST_DOT(tq1_0, COMMON_GGML_TYPE_TQ1_0)
KTEST_DOT(tq2_0, COMMON_GGML_TYPE_TQ2_0)
KTEST_DOT(i2s_q128, COMMON_GGML_TYPE_I2S_Q128)
KTEST_DOT(i2s_b32h, COMMON_GGML_TYPE_I2S_B32H)
KTEST_DOT(i2s_b32f, COMMON_GGML_TYPE_I2S_B32F)

/* Weight rows of random bytes reach every quant, 5th-bit and packed-scale pattern, not only the
 * ones the quantizer emits (every TQ1_0 byte decodes to 5 trits; TQ2_0's and I2_S's code 3, which
 * the quantizers never write, reads as +2); the fp16 (or f32) scale fields (byte offsets in each
 * block) are set to finite values of either sign so the dot stays finite. The I2_S layouts run at
 * every size of test_sizes() and must give the reference's bits. */
static const struct {
    uint32_t type;
    int      n_f16;   /* fp16 fields in each block */
    int      off[2];  /* their byte offsets */
    int      off_f32; /* byte offset of an f32 scale, -1 when none */
} k_random_rows[] = {
    {COMMON_GGML_TYPE_Q4_0, 1, {0, 0}, -1},     {COMMON_GGML_TYPE_Q4_1, 2, {0, 2}, -1},
    {COMMON_GGML_TYPE_Q5_0, 1, {0, 0}, -1},     {COMMON_GGML_TYPE_Q5_1, 2, {0, 2}, -1},
    {COMMON_GGML_TYPE_Q8_0, 1, {0, 0}, -1},     {COMMON_GGML_TYPE_Q4_K, 2, {0, 2}, -1},
    {COMMON_GGML_TYPE_Q5_K, 2, {0, 2}, -1},     {COMMON_GGML_TYPE_Q6_K, 1, {208, 208}, -1},
    {COMMON_GGML_TYPE_TQ1_0, 1, {52, 52}, -1},  {COMMON_GGML_TYPE_TQ2_0, 1, {64, 64}, -1},
    {COMMON_GGML_TYPE_I2S_Q128, 0, {0, 0}, -1}, {COMMON_GGML_TYPE_I2S_B32H, 1, {8, 8}, -1},
    {COMMON_GGML_TYPE_I2S_B32F, 0, {0, 0}, 8},
};

static void check_random_row(size_t t, int64_t n)
{
    const uint32_t                      type = k_random_rows[t].type;
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    const size_t                        wb = row_bytes(type, n);
    const size_t                        ab = executor_act_row_size(type, n);
    unsigned char                      *wq = malloc(wb);
    void                               *aq = malloc(ab);
    float *x = malloc((size_t)n * sizeof(float)), *wd = malloc((size_t)n * sizeof(float));
    float *xd = malloc((size_t)n * sizeof(float));
    cr_assert(wq && aq && x && wd && xd);
    for (size_t i = 0; i < wb; i++)
        wq[i] = (unsigned char)rng_next();
    for (size_t b = 0; b < wb / ti->type_size; b++) {
        for (int f = 0; f < k_random_rows[t].n_f16; f++) {
            const float    v = (rng_uniform() - 0.5f) * 0.05f;
            const uint16_t h = executor_fp32_to_fp16(v);
            memcpy(wq + b * ti->type_size + (size_t)k_random_rows[t].off[f], &h, 2);
        }
        if (k_random_rows[t].off_f32 >= 0) {
            const float v = (rng_uniform() - 0.5f) * 0.05f;
            memcpy(wq + b * ti->type_size + (size_t)k_random_rows[t].off_f32, &v, 4);
        }
    }
    fill_data(x, n);
    cr_assert_eq(executor_quantize_act(type, x, aq, n), 0);
    cr_assert_eq(executor_dequantize_row(type, wq, wd, n), 0);
    cr_assert_eq(executor_dequantize_row(executor_vec_dot_type(type), aq, xd, n), 0);
    double mag = 0, exact = 0;
    for (int64_t i = 0; i < n; i++) {
        mag += fabs((double)wd[i] * (double)xd[i]);
        exact += (double)wd[i] * (double)xd[i];
    }
    const float simd = executor_vec_dot(type, n, wq, aq);
    const float ref = executor_vec_dot_ref(type, n, wq, aq);
    cr_assert(fabs((double)simd - (double)ref) <= KTEST_DOT_RTOL * mag + 1e-30,
              "%s/%s random bytes n=%lld: simd %.9g ref %.9g (sum|w*a| %.6g)", ti->name,
              executor_isa_name(executor_kernels_active()), (long long)n, (double)simd, (double)ref,
              mag);
    if (is_bit_exact(type))
        cr_assert(memcmp(&simd, &ref, sizeof(simd)) == 0, "%s/%s random bytes n=%lld: %a vs %a",
                  ti->name, executor_isa_name(executor_kernels_active()), (long long)n,
                  (double)simd, (double)ref);
    if (is_i2s(type)) {
        /* dequantize and dot agree (code 3 included) */
        cr_assert(fabs((double)ref - exact) <= 1e-4 * mag + 1e-30,
                  "%s n=%lld: ref %.9g vs dequantized dot %.9g", ti->name, (long long)n,
                  (double)ref, exact);
    }
    free(wq);
    free(aq);
    free(x);
    free(wd);
    free(xd);
}

static void check_random_rows(void)
{
    for (size_t t = 0; t < sizeof(k_random_rows) / sizeof(k_random_rows[0]); t++) {
        const uint32_t type = k_random_rows[t].type;
        const uint32_t blck = common_ggml_type_get(type)->blck;
        if (!is_i2s(type)) {
            check_random_row(t, blck == 256 ? 256 * 5 : 32 * 37);
            continue;
        }
        int64_t sizes[24];
        int     ns = test_sizes(type, sizes);
        for (int i = 0; i < ns; i++)
            check_random_row(t, sizes[i]);
    }
}

Test(executor_kernels, vec_dot_random_bytes_avx2_matches_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX2);
    check_random_rows();
}

Test(executor_kernels, vec_dot_random_bytes_avx512_matches_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX512);
    check_random_rows();
}

Test(executor_kernels, vec_dot_random_bytes_ref_tracks_dequantized, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_REF);
    check_random_rows();
}

/* ------------------------------------------------------------------------------------------ */
/* Activation conversion edge cases                                                            */
/* ------------------------------------------------------------------------------------------ */

/* Zero blocks, a block whose largest magnitudes have both signs, tiny and huge values. */
static void check_act_edges(uint32_t weight_type)
{
    const int64_t n = 512;
    float         x[512];
    fill_data(x, n);
    for (int j = 0; j < 256; j++)
        x[j] = 0.0f; /* first super-block (and 8 blocks) all zero */
    x[300] = -5.0f;  /* equal magnitudes of both signs: first one wins in Q8_K */
    x[301] = 5.0f;
    x[320] = 1e-30f;
    x[400] = 3e4f;
    size_t         ab = executor_act_row_size(weight_type, n);
    unsigned char *a = malloc(ab);
    unsigned char *r = malloc(ab);
    cr_assert(a && r);
    cr_assert_eq(executor_quantize_act(weight_type, x, a, n), 0);
    cr_assert_eq(executor_quantize_act_ref(weight_type, x, r, n), 0);
    cr_assert(memcmp(a, r, ab) == 0, "%s/%s: activation bytes differ",
              common_ggml_type_get(weight_type)->name,
              executor_isa_name(executor_kernels_active()));
    free(a);
    free(r);
}

static void check_all_act_edges(void)
{
    check_act_edges(COMMON_GGML_TYPE_Q4_0); /* Q8_0 */
    check_act_edges(COMMON_GGML_TYPE_Q4_1); /* Q8_1 */
    check_act_edges(COMMON_GGML_TYPE_Q4_K); /* Q8_K */
    check_act_edges(COMMON_GGML_TYPE_F16);
    check_act_edges(COMMON_GGML_TYPE_BF16);
    check_act_edges(COMMON_GGML_TYPE_F32);
}

Test(executor_kernels, quantize_act_avx2_edges_match_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX2);
    check_all_act_edges();
}

Test(executor_kernels, quantize_act_avx512_edges_match_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX512);
    check_all_act_edges();
}

Test(executor_kernels, quantize_act_q8_K_keeps_sign_of_first_max)
{
    float x[256] = {0};
    x[10] = -2.0f;
    x[20] = 2.0f;
    x[30] = 1.0f;
    unsigned char buf[292];
    cr_assert_eq(executor_quantize_act_ref(COMMON_GGML_TYPE_Q4_K, x, buf, 256), 0);
    float d;
    memcpy(&d, buf, 4);
    const int8_t *qs = (const int8_t *)(buf + 4);
    /* iscale = -127 / -2: q = round(63.5 * x) */
    cr_assert_float_eq(d, 1.0f / 63.5f, 1e-9f);
    cr_assert_eq(qs[10], -127);
    cr_assert_eq(qs[20], 127);
    cr_assert_eq(qs[30], 64); /* 63.5 rounds half to even */
    int16_t bs0;
    memcpy(&bs0, buf + 4 + 256, 2);
    cr_assert_eq(bs0, -127 + 0); /* elements 0..15: only x[10] */
}

/* ------------------------------------------------------------------------------------------ */
/* Quantize -> dequantize round trips                                                          */
/* ------------------------------------------------------------------------------------------ */

/* Relative RMS error bounds (error RMS / data RMS) on fill_data(), whose scale changes every 64
 * elements and has 1% outliers; measured values are 70-90% of these (see the test's log). */
static const struct {
    uint32_t type;
    double   max_rel_rms;
} k_roundtrip[] = {
    {COMMON_GGML_TYPE_F32, 0.0},      {COMMON_GGML_TYPE_F16, 0.0003},
    {COMMON_GGML_TYPE_BF16, 0.0025},  {COMMON_GGML_TYPE_Q8_0, 0.011},
    {COMMON_GGML_TYPE_Q8_1, 0.011},   {COMMON_GGML_TYPE_Q8_K, 0.025},
    {COMMON_GGML_TYPE_Q4_0, 0.17},    {COMMON_GGML_TYPE_Q4_1, 0.13},
    {COMMON_GGML_TYPE_Q5_0, 0.085},   {COMMON_GGML_TYPE_Q5_1, 0.065},
    {COMMON_GGML_TYPE_Q2_K, 0.45},    {COMMON_GGML_TYPE_Q3_K, 0.26},
    {COMMON_GGML_TYPE_Q4_K, 0.12},    {COMMON_GGML_TYPE_Q5_K, 0.06},
    {COMMON_GGML_TYPE_Q6_K, 0.033},   {COMMON_GGML_TYPE_MXFP4, 0.17},
    {COMMON_GGML_TYPE_TQ1_0, 0.9},    {COMMON_GGML_TYPE_TQ2_0, 0.9},
    {COMMON_GGML_TYPE_I2S_B32H, 0.7}, {COMMON_GGML_TYPE_I2S_B32F, 0.7},
};

Test(executor_kernels, quantize_roundtrip_within_bounds)
{
    const int64_t n = 256 * 64;
    float        *x = malloc((size_t)n * sizeof(float));
    float        *y = malloc((size_t)n * sizeof(float));
    cr_assert(x && y);
    fill_data(x, n);
    for (size_t t = 0; t < sizeof(k_roundtrip) / sizeof(k_roundtrip[0]); t++) {
        const uint32_t type = k_roundtrip[t].type;
        void          *q = malloc(row_bytes(type, n));
        cr_assert_not_null(q);
        cr_assert_eq(executor_quantize_row_ref(type, x, q, n), 0);
        cr_assert_eq(executor_dequantize_row(type, q, y, n), 0);
        double e2 = 0, x2 = 0;
        for (int64_t i = 0; i < n; i++) {
            e2 += ((double)y[i] - (double)x[i]) * ((double)y[i] - (double)x[i]);
            x2 += (double)x[i] * (double)x[i];
        }
        const double rel = sqrt(e2 / x2);
        cr_log_info("round trip %s: relative rms error %.5f", common_ggml_type_get(type)->name,
                    rel);
        cr_expect(rel <= k_roundtrip[t].max_rel_rms, "%s: relative rms error %.5f > %.5f",
                  common_ggml_type_get(type)->name, rel, k_roundtrip[t].max_rel_rms);
        free(q);
    }
    free(x);
    free(y);
}

Test(executor_kernels, q8_0_q4_0_elementwise_error_bounded)
{
    const int64_t n = 32 * 64;
    float         x[32 * 64], y[32 * 64];
    unsigned char q[34 * 64];
    fill_data(x, n);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q8_0, x, q, n), 0);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, q, y, n), 0);
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
        for (int j = 0; j < 32; j++) /* half a step, plus the fp16 rounding of d */
            cr_assert(fabsf(y[32 * b + j] - x[32 * b + j]) <= amax / 127 * 0.5f + amax * 1e-3f);
    }
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q4_0, x, q, n), 0);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_Q4_0, q, y, n), 0);
    for (int64_t b = 0; b < n / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[32 * b + j]));
        for (int j = 0; j < 32; j++) /* one step at most (the +8 clamp), plus fp16 of d */
            cr_assert(fabsf(y[32 * b + j] - x[32 * b + j]) <= amax / 8 + amax * 1e-2f);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Hand-derived bytes                                                                          */
/* ------------------------------------------------------------------------------------------ */

Test(executor_kernels, q8_0_quantize_known_bytes)
{
    /* amax 127 -> d = 1 (fp16 0x3C00), id = 1: q = roundf(x), halves away from zero. */
    float x[32] = {127.0f, -2.5f, 2.5f, 0.5f, -0.5f, 1.49f, -126.6f, 3.0f};
    for (int j = 8; j < 32; j++)
        x[j] = (float)(j - 20);
    unsigned char q[34];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q8_0, x, q, 32), 0);
    cr_assert_eq(q[0], 0x00);
    cr_assert_eq(q[1], 0x3C);
    const int8_t want[8] = {127, -3, 3, 1, -1, 1, -127, 3};
    for (int j = 0; j < 8; j++)
        cr_assert_eq((int8_t)q[2 + j], want[j], "q[%d] = %d, want %d", j, (int8_t)q[2 + j],
                     want[j]);
    for (int j = 8; j < 32; j++)
        cr_assert_eq((int8_t)q[2 + j], j - 20);

    /* The activation quantizer rounds half to even instead: 2.5 -> 2, 0.5 -> 0. */
    cr_assert_eq(executor_quantize_act_ref(COMMON_GGML_TYPE_Q8_0, x, q, 32), 0);
    const int8_t want_act[8] = {127, -2, 2, 0, 0, 1, -127, 3};
    for (int j = 0; j < 8; j++)
        cr_assert_eq((int8_t)q[2 + j], want_act[j], "act q[%d] = %d, want %d", j, (int8_t)q[2 + j],
                     want_act[j]);
}

Test(executor_kernels, q4_0_quantize_known_bytes)
{
    /* Block 0: max-magnitude value -8 -> d = -8 / -8 = 1, id = 1, q = min(15, (int)(x + 8.5)).
     * Block 1: max-magnitude value +8 -> d = -1, id = -1, so -8 maps to 16 and clamps to 15. */
    float x[64] = {0};
    x[0] = -8.0f;      /* 0 */
    x[1] = 7.0f;       /* 15 */
    x[2] = 0.5f;       /* 9 */
    x[3] = -0.5f;      /* 8 */
    x[4] = 7.4f;       /* 15.9 -> 15 */
    x[5] = 2.49f;      /* 10.99 -> 10 */
    x[16] = -7.9f;     /* 0.6 -> 0 */
    x[17] = 3.0f;      /* 11 */
    x[32 + 0] = 8.0f;  /* -8 + 8.5 -> 0 */
    x[32 + 1] = -8.0f; /* 16.5 -> 16 -> 15 */
    x[32 + 2] = 1.0f;  /* 7.5 -> 7 */
    unsigned char q[36];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q4_0, x, q, 64), 0);
    cr_assert_eq(q[0], 0x00);
    cr_assert_eq(q[1], 0x3C); /* +1.0 */
    const uint8_t want0[16] = {0x00 | 0 << 4, 15 | 11 << 4, 9 | 8 << 4, 8 | 8 << 4,
                               15 | 8 << 4,   10 | 8 << 4,  8 | 8 << 4, 8 | 8 << 4,
                               8 | 8 << 4,    8 | 8 << 4,   8 | 8 << 4, 8 | 8 << 4,
                               8 | 8 << 4,    8 | 8 << 4,   8 | 8 << 4, 8 | 8 << 4};
    for (int j = 0; j < 16; j++)
        cr_assert_eq(q[2 + j], want0[j], "block 0 byte %d = 0x%02x, want 0x%02x", j, q[2 + j],
                     want0[j]);
    cr_assert_eq(q[18], 0x00);
    cr_assert_eq(q[19], 0xBC); /* -1.0 */
    cr_assert_eq(q[20], 0x00 | 8 << 4);
    cr_assert_eq(q[21], 15 | 8 << 4);
    cr_assert_eq(q[22], 7 | 8 << 4);
    for (int j = 3; j < 16; j++)
        cr_assert_eq(q[20 + j], 8 | 8 << 4);
}

/* TQ1_0 bytes, derived by hand from ggml's packing (quantize_row_tq1_0_ref): d = amax, each weight
 * becomes the trit lroundf(x / d) + 1 (0, 1, 2; halves away from zero), five trits t0..t4 (t0 the
 * most significant) make v = 81 t0 + 27 t1 + 9 t2 + 3 t3 + t4, stored as ceil(v * 256 / 243).
 * qs[m] (m < 32) holds elements m, m + 32, .., m + 128; qs[32 + m] elements 160 + m, .., 224 + m
 * (step 16); qh[j] elements 240 + j, 244 + j, 248 + j, 252 + j as t0..t3 with t4 = 0. A zero
 * column is 1,1,1,1,1 -> v = 121 -> byte 128; a zero qh byte v = 120 -> 127. */
Test(executor_kernels, tq1_0_quantize_known_bytes)
{
    float x[512] = {0};
    x[0] = 1.0f;   /* block 0: amax 1, d = 0x3C00 */
    x[32] = -1.0f; /* qs[0]: trits 2 0 1 2 0 -> v = 162 + 9 + 6 = 177 -> ceil(177 * 256 / 243) */
    x[96] = 0.5f;  /*   = 187 (0.5 rounds away from zero to 1, -0.5 to -1) */
    x[128] = -0.5f;
    x[1] = -1.0f;       /* qs[1]: 0 1 1 1 1 -> v = 40 -> 43 */
    x[2] = 0.49f;       /* qs[2]: rounds to 0: a zero column, 128 */
    x[160] = 1.0f;      /* qs[32]: 2 1 1 1 1 -> v = 202 -> 213 */
    x[240] = -1.0f;     /* qh[0]: 0 1 1 1 (0) -> v = 39 -> 42 */
    x[253] = 1.0f;      /* qh[1] (element 240 + 4 * 3 + 1): 1 1 1 2 (0) -> v = 123 -> 130 */
    x[256 + 5] = -2.0f; /* block 1: amax 2, d = 0x4000; qs[5]: 0 2 1 1 1 -> v = 67 -> 71 */
    x[256 + 37] = 1.0f; /*   (1 / 2 = 0.5 rounds to 1) */
    unsigned char q[2 * 54];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_TQ1_0, x, q, 512), 0);
    const uint8_t want0[6] = {187, 43, 128, 128, 128, 128};
    for (int j = 0; j < 6; j++)
        cr_assert_eq(q[j], want0[j], "block 0 qs[%d] = %u, want %u", j, q[j], want0[j]);
    cr_assert_eq(q[32], 213);
    cr_assert_eq(q[33], 128);
    const uint8_t wanth[4] = {42, 130, 127, 127};
    for (int j = 0; j < 4; j++)
        cr_assert_eq(q[48 + j], wanth[j], "block 0 qh[%d] = %u, want %u", j, q[48 + j], wanth[j]);
    cr_assert_eq(q[52], 0x00);
    cr_assert_eq(q[53], 0x3C);
    cr_assert_eq(q[54 + 5], 71);
    cr_assert_eq(q[54 + 4], 128);
    cr_assert_eq(q[54 + 48], 127);
    cr_assert_eq(q[54 + 52], 0x00);
    cr_assert_eq(q[54 + 53], 0x40);
    /* and the trits decode to the rounded values */
    float y[512];
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_TQ1_0, q, y, 512), 0);
    for (int j = 0; j < 512; j++) {
        const float d = j < 256 ? 1.0f : 2.0f;
        cr_assert_eq(y[j], d * (float)lroundf(x[j] / d), "element %d: %g", j, (double)y[j]);
    }
}

/* TQ2_0 bytes by hand (quantize_row_tq2_0_ref): quant q = lroundf(x / d) + 1 in bits 2k..2k+1 of
 * qs[32h + m] for element 128h + 32k + m; a zero byte is 1,1,1,1 = 0x55. */
Test(executor_kernels, tq2_0_quantize_known_bytes)
{
    float x[256] = {0};
    x[0] = 1.0f;        /* amax 1, d = 0x3C00 */
    x[32] = -1.0f;      /* qs[0] = 2 | 0 << 2 | 2 << 4 | 1 << 6 = 0x62 */
    x[64] = 0.5f;       /*   (0.5 rounds to 1: q 2) */
    x[96] = -0.49f;     /*   (-0.49 rounds to 0: q 1) */
    x[128 + 3] = -1.0f; /* qs[35] = 0 | 1 << 2 | 1 << 4 | 2 << 6 = 0x94 */
    x[128 + 96 + 3] = 1.0f;
    unsigned char q[66];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_TQ2_0, x, q, 256), 0);
    cr_assert_eq(q[0], 0x62);
    cr_assert_eq(q[35], 0x94);
    for (int j = 0; j < 64; j++)
        if (j != 0 && j != 35)
            cr_assert_eq(q[j], 0x55, "qs[%d] = 0x%02x", j, q[j]);
    cr_assert_eq(q[64], 0x00);
    cr_assert_eq(q[65], 0x3C);
}

/* Ternary data (each block -d, 0, +d with d a half and at least one +-d) round-trips exactly
 * through both ternary types; an all-zero block stays zero. */
Test(executor_kernels, ternary_roundtrip_is_exact)
{
    const int64_t  n = 256 * 9;
    float         *x = malloc((size_t)n * sizeof(float));
    float         *y = malloc((size_t)n * sizeof(float));
    unsigned char *q = malloc(66 * 9);
    cr_assert(x && y && q);
    for (int64_t b = 0; b < n / 256; b++) {
        const float d = b == 4 ? 0.0f : 0.125f * (float)(1 + b) * (b % 2 ? -1.0f : 1.0f);
        for (int j = 0; j < 256; j++)
            x[256 * b + j] = d * (float)((int)(rng_next() % 3) - 1);
        x[256 * b + (int64_t)(rng_next() % 256)] = d;
    }
    static const uint32_t types[2] = {COMMON_GGML_TYPE_TQ1_0, COMMON_GGML_TYPE_TQ2_0};
    for (int t = 0; t < 2; t++) {
        cr_assert_eq(executor_quantize_row_ref(types[t], x, q, n), 0);
        cr_assert_eq(executor_dequantize_row(types[t], q, y, n), 0);
        for (int64_t i = 0; i < n; i++)
            cr_assert_eq(y[i], x[i], "%s element %lld: %g comes back as %g",
                         common_ggml_type_get(types[t])->name, (long long)i, (double)x[i],
                         (double)y[i]);
    }
    free(x);
    free(y);
    free(q);
}

/* ------------------------------------------------------------------------------------------ */
/* I2_S (BitNet b1.58): three layouts of 2-bit codes c, weights c - 1                          */
/* ------------------------------------------------------------------------------------------ */

/* I2S_Q128 by hand: element j of a block is in byte j % 32 at shift 6 - 2 * (j / 32); the input is
 * the ternary values (code x > 0.5 -> 2, x < -0.5 -> 0, else 1, NaN too); a byte of four zeros is
 * 01 01 01 01 = 0x55. No scale is stored. */
Test(executor_kernels, i2s_q128_quantize_known_bytes)
{
    float x[256] = {0};
    x[33] = 1.0f;   /* byte 1: elements 1, 33, 65, 97 -> codes 1 2 1 1 = 0x65 */
    x[0] = -1.0f;   /* byte 0: elements 0, 32, 64, 96 -> 0 1 1 1 = 0x15 */
    x[64] = 0.5f;   /*   (0.5 is not above half: 0) */
    x[98] = -0.51f; /* byte 2: elements 2, 34, 66, 98 -> 1 1 1 0 = 0x54 */
    x[3] = NAN;     /* byte 3: zero */
    x[127] = 0.6f;  /* byte 31: elements 31, 63, 95, 127 -> 1 1 1 2 = 0x56 */
    x[159] = 1.0f;  /* block 1 byte 31: elements 128 + 31, 63, 95, 127 -> 2 1 1 0 = 0x94 */
    x[255] = -1.0f;
    unsigned char q[64];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_Q128, x, q, 256), 0);
    const struct {
        int     at;
        uint8_t byte;
    } want[] = {{0, 0x15}, {1, 0x65}, {2, 0x54}, {31, 0x56}, {63, 0x94}};
    for (int j = 0; j < 64; j++) {
        uint8_t w = 0x55;
        for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++)
            if (want[k].at == j)
                w = want[k].byte;
        cr_assert_eq(q[j], w, "qs[%d] = 0x%02x, want 0x%02x", j, q[j], w);
    }
    float y[256];
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_Q128, q, y, 256), 0);
    for (int j = 0; j < 256; j++) {
        const float t = x[j] > 0.5f ? 1.0f : x[j] < -0.5f ? -1.0f : 0.0f;
        cr_assert_eq(y[j], t, "element %d: %g", j, (double)y[j]);
    }
    /* hand bytes: code 3 (never written) reads +2, code 0 -1 */
    memset(q, 0x55, 32);
    q[1] = 0x65;
    q[5] = 0xFF;
    q[6] = 0x00;
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_Q128, q, y, 128), 0);
    for (int j = 0; j < 128; j++) {
        const float want_y = j == 33 ? 1.0f : j % 32 == 5 ? 2.0f : j % 32 == 6 ? -1.0f : 0.0f;
        cr_assert_eq(y[j], want_y, "element %d: %g, want %g", j, (double)y[j], (double)want_y);
    }
}

/* The block-32 layouts by hand: element j in byte j / 4 at shift 2 * (j % 4), then the scale
 * d = absmax (B32H: f16 0x3800 for 0.5; B32F: f32 0x3F000000); code clamp(lroundf(x / d), -1, 1)
 * + 1, halves away from zero. */
Test(executor_kernels, i2s_b32_quantize_known_bytes)
{
    float x[64] = {0}; /* block 1 all zero: d = 0, codes 0x55 */
    x[0] = 0.5f;       /* byte 0: elements 0..3 -> 2 1 0 1 = 2 | 1 << 2 | 0 << 4 | 1 << 6 = 0x46 */
    x[2] = -0.5f;
    x[5] = -0.5f; /* byte 1: 1 0 1 1 = 0x51 */
    x[8] = 0.25f; /* byte 2: x / d = 0.5 -> 2, -0.5 -> 0, 0.48 -> 1, -0.48 -> 1 = 0x52 */
    x[9] = -0.25f;
    x[10] = 0.24f;
    x[11] = -0.24f;
    x[31] = 0.3f; /* byte 7: 1 1 1 2 = 0x95 */
    static const uint8_t codes[8] = {0x46, 0x51, 0x52, 0x55, 0x55, 0x55, 0x55, 0x95};
    static const uint8_t scale_h[2] = {0x00, 0x38}, scale_f[4] = {0x00, 0x00, 0x00, 0x3F};
    unsigned char        qh[20], qf[2 + 24];
    unsigned char       *qfu = qf + 2; /* rows need only 2-byte alignment: f32 scales unaligned */
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_B32H, x, qh, 64), 0);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_B32F, x, qfu, 64), 0);
    for (int j = 0; j < 8; j++) {
        cr_assert_eq(qh[j], codes[j], "b32h byte %d = 0x%02x, want 0x%02x", j, qh[j], codes[j]);
        cr_assert_eq(qfu[j], codes[j], "b32f byte %d = 0x%02x, want 0x%02x", j, qfu[j], codes[j]);
        cr_assert_eq(qh[10 + j], 0x55);
        cr_assert_eq(qfu[12 + j], 0x55);
    }
    cr_assert(memcmp(qh + 8, scale_h, 2) == 0);
    cr_assert(memcmp(qfu + 8, scale_f, 4) == 0);
    cr_assert(qh[18] == 0 && qh[19] == 0);
    cr_assert(qfu[20] == 0 && qfu[21] == 0 && qfu[22] == 0 && qfu[23] == 0);
    float yh[64], yf[64];
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_B32H, qh, yh, 64), 0);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_B32F, qfu, yf, 64), 0);
    for (int j = 0; j < 64; j++) {
        const float want = 0.5f * (float)lroundf(x[j] / 0.5f);
        cr_assert_eq(yh[j], want, "b32h element %d: %g, want %g", j, (double)yh[j], (double)want);
        cr_assert_eq(yf[j], want, "b32f element %d: %g, want %g", j, (double)yf[j], (double)want);
    }
    /* hand bytes: codes 0, 1, 2, 3 (3 never written, reads +2) with d = 2 (f16 0x4000) */
    memset(qh, 0x55, 8);
    qh[0] = 0xE4; /* 0 | 1 << 2 | 2 << 4 | 3 << 6 */
    qh[8] = 0x00;
    qh[9] = 0x40;
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_B32H, qh, yh, 32), 0);
    static const float first[4] = {-2.0f, 0.0f, 2.0f, 4.0f};
    for (int j = 0; j < 32; j++)
        cr_assert_eq(yh[j], j < 4 ? first[j] : 0.0f, "element %d: %g", j, (double)yh[j]);
}

/* Ternary values t (-1, 0, +1) times a scale s, one 32-element block in 5 all zero. */
static void fill_ternary(float *x, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = s * (float)((int)(rng_next() % 3) - 1);
    if (n >= 6 * 32)
        for (int j = 0; j < 32; j++)
            x[5 * 32 + j] = 0.0f;
}

/* The layouts agree: t quantized as Q128 (no scale) and t * s as B32H and B32F (absmax s)
 * dequantize to the same values (Q128 times s) and give the same dot on every ISA, bit for bit.
 * Exact only for a power of two s: then each B32 product ((float)isum * d_a) * s is the Q128
 * product times s without rounding, and each rounded partial sum of the B32 chain is s times the
 * Q128 one (scaling by 2^k commutes with rounding), so dot(B32) = s * dot(Q128) exactly. Any other
 * s rounds each product (and B32H's f16 scale) differently from s times the Q128 sum. */
Test(executor_kernels, i2s_layouts_agree, .fini = restore_isa)
{
    static const int64_t  ns[] = {256, 384, 1152, 2560};
    static const float    ss[] = {0.25f, 2.0f};
    static const uint32_t b32[2] = {COMMON_GGML_TYPE_I2S_B32H, COMMON_GGML_TYPE_I2S_B32F};
    executor_kernels_init();
    for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++)
        for (size_t is = 0; is < sizeof(ss) / sizeof(ss[0]); is++) {
            const int64_t n = ns[in];
            const float   s = ss[is];
            float        *t = malloc((size_t)n * sizeof(float));
            float        *ts = malloc((size_t)n * sizeof(float));
            float        *x = malloc((size_t)n * sizeof(float));
            float        *y0 = malloc((size_t)n * sizeof(float));
            float        *y1 = malloc((size_t)n * sizeof(float));
            void         *q0 = malloc(row_bytes(COMMON_GGML_TYPE_I2S_Q128, n));
            void         *q1[2] = {malloc(row_bytes(b32[0], n)), malloc(row_bytes(b32[1], n))};
            const size_t  ab = executor_act_row_size(COMMON_GGML_TYPE_I2S_Q128, n);
            void         *act = malloc(ab);
            cr_assert(t && ts && x && y0 && y1 && q0 && q1[0] && q1[1] && act);
            cr_assert_eq(ab, executor_act_row_size(COMMON_GGML_TYPE_I2S_B32H, n));
            fill_ternary(t, n, 1.0f);
            for (int64_t i = 0; i < n; i++)
                ts[i] = t[i] * s;
            fill_data(x, n);
            cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_Q128, t, q0, n), 0);
            cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_Q128, q0, y0, n), 0);
            for (int64_t i = 0; i < n; i++)
                cr_assert_eq(y0[i], t[i], "q128 element %lld", (long long)i);
            for (int k = 0; k < 2; k++) {
                cr_assert_eq(executor_quantize_row_ref(b32[k], ts, q1[k], n), 0);
                cr_assert_eq(executor_dequantize_row(b32[k], q1[k], y1, n), 0);
                for (int64_t i = 0; i < n; i++)
                    cr_assert_eq(y1[i], y0[i] * s, "%s n=%lld element %lld: %g vs %g",
                                 common_ggml_type_get(b32[k])->name, (long long)n, (long long)i,
                                 (double)y1[i], (double)(y0[i] * s));
            }
            cr_assert_eq(executor_quantize_act_ref(COMMON_GGML_TYPE_I2S_Q128, x, act, n), 0);
            for (int isa = EXECUTOR_ISA_REF; isa <= EXECUTOR_ISA_AVX512; isa++) {
                if (executor_kernels_select((enum executor_isa)isa) != 0)
                    continue;
                const float d0 = executor_vec_dot(COMMON_GGML_TYPE_I2S_Q128, n, q0, act) * s;
                for (int k = 0; k < 2; k++) {
                    const float d1 = executor_vec_dot(b32[k], n, q1[k], act);
                    cr_assert(memcmp(&d0, &d1, sizeof(d0)) == 0,
                              "%s n=%lld s=%g: q128 * s %a, %s %a",
                              executor_isa_name((enum executor_isa)isa), (long long)n, (double)s,
                              (double)d0, common_ggml_type_get(b32[k])->name, (double)d1);
                }
            }
            restore_isa();
            free(t);
            free(ts);
            free(x);
            free(y0);
            free(y1);
            free(q0);
            free(q1[0]);
            free(q1[1]);
            free(act);
        }
}

/* The seed note's smoke test (a 64 x 256 matrix of bytes 0xAA: every code 2, weight +1, times
 * x = 0.5) through executor_matvec: about 128 per row. The Q8_0 activation of 0.5 is 127 with the
 * scale 0.5 / 127 rounded to f16, 1032 * 2^-18, so each row is exactly 256 * 127 * 1032 * 2^-18 =
 * 127.9921875 on every ISA. */
Test(executor_kernels, i2s_q128_matvec_all_plus_one, .fini = restore_isa)
{
    unsigned char w[64 * 64];
    float         x[256], y[64];
    unsigned char act[8 * 34];
    memset(w, 0xAA, sizeof(w));
    for (int j = 0; j < 256; j++)
        x[j] = 0.5f;
    executor_kernels_init();
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_I2S_Q128, 256), sizeof(act));
    for (int isa = EXECUTOR_ISA_REF; isa <= EXECUTOR_ISA_AVX512; isa++) {
        if (executor_kernels_select((enum executor_isa)isa) != 0)
            continue;
        cr_assert_eq(executor_quantize_act(COMMON_GGML_TYPE_I2S_Q128, x, act, 256), 0);
        cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_I2S_Q128, 256, w, 64, 0, 64, act, y), 0);
        for (int r = 0; r < 64; r++) {
            cr_assert(fabsf(y[r] - 128.0f) < 0.01f, "%s row %d: %g",
                      executor_isa_name((enum executor_isa)isa), r, (double)y[r]);
            cr_assert_eq(y[r], 127.9921875f, "%s row %d: %.9g",
                         executor_isa_name((enum executor_isa)isa), r, (double)y[r]);
        }
    }
}

/* executor_matvec on random ternary matrices against a plain f32 GEMV of the dequantized rows
 * (acc += w * x in float over the unquantized x): they differ by the 8-bit activations, whose
 * error per element is at most half a step of its block (amax / 254), random in sign, so the sum
 * stays well inside 1e-2 of sum |w * x| (measured 1.5e-3). */
Test(executor_kernels, i2s_matvec_matches_f32_gemv, .fini = restore_isa)
{
    static const uint32_t types[3] = {COMMON_GGML_TYPE_I2S_Q128, COMMON_GGML_TYPE_I2S_B32H,
                                      COMMON_GGML_TYPE_I2S_B32F};
    static const int64_t  ns[] = {256, 2560};
    const int64_t         n_rows = 33;
    double                worst = 0;
    executor_kernels_init();
    for (int ti = 0; ti < 3; ti++)
        for (size_t in = 0; in < sizeof(ns) / sizeof(ns[0]); in++) {
            const uint32_t type = types[ti];
            const int64_t  n = ns[in];
            const size_t   rb = row_bytes(type, n);
            unsigned char *w = malloc(rb * (size_t)n_rows);
            float         *v = malloc((size_t)n * sizeof(float));
            float         *x = malloc((size_t)n * sizeof(float));
            float         *ref = malloc((size_t)n_rows * sizeof(float));
            double        *mag = malloc((size_t)n_rows * sizeof(double));
            float         *y = malloc((size_t)n_rows * sizeof(float));
            void          *act = malloc(executor_act_row_size(type, n));
            cr_assert(w && v && x && ref && mag && y && act);
            for (int64_t j = 0; j < n; j++)
                x[j] = rng_gauss();
            for (int64_t r = 0; r < n_rows; r++) {
                const float s = type == COMMON_GGML_TYPE_I2S_Q128 ? 1.0f : 0.01f + rng_uniform();
                fill_ternary(v, n, s);
                cr_assert_eq(executor_quantize_row_ref(type, v, w + (size_t)r * rb, n), 0);
                cr_assert_eq(executor_dequantize_row(type, w + (size_t)r * rb, v, n), 0);
                float acc = 0.0f;
                mag[r] = 0;
                for (int64_t j = 0; j < n; j++) {
                    acc += v[j] * x[j];
                    mag[r] += fabs((double)v[j] * (double)x[j]);
                }
                ref[r] = acc;
            }
            for (int isa = EXECUTOR_ISA_REF; isa <= EXECUTOR_ISA_AVX512; isa++) {
                if (executor_kernels_select((enum executor_isa)isa) != 0)
                    continue;
                cr_assert_eq(executor_quantize_act(type, x, act, n), 0);
                cr_assert_eq(executor_matvec(type, n, w, rb, 0, n_rows, act, y), 0);
                for (int64_t r = 0; r < n_rows; r++) {
                    const double err = fabs((double)y[r] - (double)ref[r]);
                    cr_assert(err <= 1e-2 * mag[r] + 1e-6, "%s/%s n=%lld row %lld: %g vs f32 %g",
                              common_ggml_type_get(type)->name,
                              executor_isa_name((enum executor_isa)isa), (long long)n, (long long)r,
                              (double)y[r], (double)ref[r]);
                    if (mag[r] > 0 && err / mag[r] > worst)
                        worst = err / mag[r];
                }
            }
            restore_isa();
            free(w);
            free(v);
            free(x);
            free(ref);
            free(mag);
            free(y);
            free(act);
        }
    cr_log_info("i2_s matvec vs f32 gemv: worst |diff| / sum|w*x| = %.3g", worst);
}

/* ------------------------------------------------------------------------------------------ */
/* fp16 / bf16 conversions                                                                     */
/* ------------------------------------------------------------------------------------------ */

static float f_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

Test(executor_kernels, fp16_from_fp32_edge_values)
{
    static const struct {
        uint32_t in;
        uint16_t out;
    } c[] = {
        {0x00000000u, 0x0000}, /* +0 */
        {0x80000000u, 0x8000}, /* -0 */
        {0x3F800000u, 0x3C00}, /* 1 */
        {0xC0000000u, 0xC000}, /* -2 */
        {0x477FE000u, 0x7BFF}, /* 65504, largest half */
        {0x477FEFFFu, 0x7BFF}, /* just below the tie */
        {0x477FF000u, 0x7C00}, /* 65520: tie to even -> inf */
        {0x49742400u, 0x7C00}, /* 1e6 */
        {0x7F800000u, 0x7C00}, /* inf */
        {0xFF800000u, 0xFC00}, /* -inf */
        {0x7FC00000u, 0x7E00}, /* quiet NaN */
        {0x7F800001u, 0x7E00}, /* signalling NaN is quieted */
        {0xFFC00000u, 0xFE00}, /* negative NaN */
        {0x33800000u, 0x0001}, /* 2^-24, smallest subnormal */
        {0x33000000u, 0x0000}, /* 2^-25: tie to even -> 0 */
        {0x33000001u, 0x0001}, /* just above the tie */
        {0x33C00000u, 0x0002}, /* 3 * 2^-25: tie between 1 and 2 -> 2 */
        {0x387FC000u, 0x03FF}, /* largest subnormal */
        {0x38800000u, 0x0400}, /* 2^-14, smallest normal */
        {0x3F801000u, 0x3C00}, /* 1 + 2^-11: tie -> even (1) */
        {0x3F803000u, 0x3C02}, /* 1 + 3 * 2^-11: tie -> even (1 + 2^-9) */
        {0x3F801001u, 0x3C01}, /* just above a tie */
        {0xB3800000u, 0x8001}, /* -2^-24 */
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint16_t h = executor_fp32_to_fp16(f_from_bits(c[i].in));
        cr_expect_eq(h, c[i].out, "fp32 0x%08x -> fp16 0x%04x, want 0x%04x", c[i].in, h, c[i].out);
    }
}

Test(executor_kernels, fp16_to_fp32_edge_values)
{
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0x0001)), 0x33800000u);
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0x03FF)), 0x387FC000u);
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0x8400)), 0xB8800000u);
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0x7C00)), 0x7F800000u);
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0xFC00)), 0xFF800000u);
    cr_assert_eq(f_bits(executor_fp16_to_fp32(0x8000)), 0x80000000u);
    cr_assert(isnan(executor_fp16_to_fp32(0x7E00)));
    cr_assert(isnan(executor_fp16_to_fp32(0x7C01)));
    cr_assert_eq(executor_fp16_to_fp32(0x3555), 0.333251953125f);
    /* every finite half survives a round trip */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        if ((h & 0x7C00u) == 0x7C00u)
            continue;
        cr_assert_eq(executor_fp32_to_fp16(executor_fp16_to_fp32((uint16_t)h)), h,
                     "half 0x%04x does not round trip", h);
    }
}

Test(executor_kernels, bf16_conversion_edge_values)
{
    static const struct {
        uint32_t in;
        uint16_t out;
    } c[] = {
        {0x3F800000u, 0x3F80}, /* 1 */
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie -> even */
        {0x3F818000u, 0x3F82}, /* 1 + 3 * 2^-8: tie -> even */
        {0x3F808001u, 0x3F81}, /* just above a tie */
        {0x7F800000u, 0x7F80}, /* inf */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX rounds to inf */
        {0x7FC00000u, 0x7FC0}, /* quiet NaN */
        {0x7F800001u, 0x7FC0}, /* signalling NaN forced quiet */
        {0xFF800001u, 0xFFC0}, /* negative NaN */
        {0x00010000u, 0x0001}, /* subnormal kept (no flush) */
        {0x80000000u, 0x8000}, /* -0 */
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        uint16_t h = executor_fp32_to_bf16(f_from_bits(c[i].in));
        cr_expect_eq(h, c[i].out, "fp32 0x%08x -> bf16 0x%04x, want 0x%04x", c[i].in, h, c[i].out);
    }
    cr_assert_eq(f_bits(executor_bf16_to_fp32(0x3F80)), 0x3F800000u);
    cr_assert_eq(f_bits(executor_bf16_to_fp32(0x8001)), 0x80010000u);
}

Test(executor_kernels, f16_act_simd_matches_scalar_on_specials, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX2);
    static const uint32_t in[16] = {0x7FC00000u, 0x7F800001u, 0xFFA00000u, 0x477FF000u,
                                    0x33000000u, 0x33C00000u, 0x3F801000u, 0x3F803000u,
                                    0x80000000u, 0x7F800000u, 0x387FC000u, 0x33000001u,
                                    0x3F801001u, 0xC0000000u, 0x477FE000u, 0x00000001u};
    float                 x[16];
    uint16_t              a[16], r[16];
    for (int i = 0; i < 16; i++)
        x[i] = f_from_bits(in[i]);
    cr_assert_eq(executor_quantize_act(COMMON_GGML_TYPE_F16, x, a, 16), 0);
    cr_assert_eq(executor_quantize_act_ref(COMMON_GGML_TYPE_F16, x, r, 16), 0);
    for (int i = 0; i < 16; i++)
        cr_expect_eq(a[i], r[i], "0x%08x: simd 0x%04x ref 0x%04x", in[i], a[i], r[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Matrix helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

static void check_matrix(uint32_t type, int64_t n_cols, int64_t n_rows, int64_t n_act)
{
    /* padded rows, keeping the documented alignment (2 bytes; 4 for F32) */
    const size_t   rb = row_bytes(type, n_cols) + (type == COMMON_GGML_TYPE_F32 ? 8 : 6);
    const size_t   ab = executor_act_row_size(type, n_cols);
    unsigned char *w = calloc((size_t)n_rows, rb);
    unsigned char *act = malloc(ab * (size_t)n_act);
    float         *x = malloc((size_t)n_cols * sizeof(float));
    float         *y = malloc((size_t)(n_rows * n_act) * sizeof(float));
    float         *yv = malloc((size_t)n_rows * sizeof(float));
    cr_assert(w && act && x && y && yv);
    for (int64_t r = 0; r < n_rows; r++) {
        fill_data(x, n_cols);
        cr_assert_eq(executor_quantize_row_ref(type, x, w + (size_t)r * rb, n_cols), 0);
    }
    for (int64_t j = 0; j < n_act; j++) {
        fill_data(x, n_cols);
        cr_assert_eq(executor_quantize_act(type, x, act + (size_t)j * ab, n_cols), 0);
    }
    cr_assert_eq(executor_matmul(type, n_cols, w, rb, 0, n_rows, act, ab, n_act, y, (size_t)n_rows),
                 0);
    for (int64_t j = 0; j < n_act; j++) {
        /* two halves, as two threads would split the rows */
        cr_assert_eq(executor_matvec(type, n_cols, w, rb, 0, n_rows / 2, act + (size_t)j * ab, yv),
                     0);
        cr_assert_eq(
            executor_matvec(type, n_cols, w, rb, n_rows / 2, n_rows, act + (size_t)j * ab, yv), 0);
        for (int64_t r = 0; r < n_rows; r++) {
            float d = executor_vec_dot(type, n_cols, w + (size_t)r * rb, act + (size_t)j * ab);
            cr_assert_eq(yv[r], d, "%s matvec row %lld", common_ggml_type_get(type)->name,
                         (long long)r);
            cr_assert_eq(y[(size_t)j * (size_t)n_rows + (size_t)r], d,
                         "%s matmul act %lld row %lld", common_ggml_type_get(type)->name,
                         (long long)j, (long long)r);
        }
    }
    free(w);
    free(act);
    free(x);
    free(y);
    free(yv);
}

/* The matrix cases of one kernel set: Q4_0 with 1..9 activations (the AVX-512 gemm takes them 4 at
 * a time), rows of 1, 2, 3, 385 and 769 blocks (partial groups, several activation chunks) and a
 * matrix larger than one gemm row tile (256 KiB); the types without gemv/gemm once each (odd block
 * counts, ragged float rows), so matvec and matmul never keep a slower set's kernel. */
static void check_matrices(void)
{
    for (int64_t n_act = 1; n_act <= 9; n_act++)
        check_matrix(COMMON_GGML_TYPE_Q4_0, 256, 37, n_act);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 32, 5, 3);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 64, 5, 2);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 96, 5, 5);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 32 * 385, 6, 5);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 32 * 769, 3, 6);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 4096, 130, 3);
    for (int64_t n_act = 1; n_act <= 6; n_act++) {
        check_matrix(COMMON_GGML_TYPE_Q8_0, 512, 19, n_act);
        check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 33, 7, n_act);
        check_matrix(COMMON_GGML_TYPE_Q4_K, 512, 23, n_act);
        check_matrix(COMMON_GGML_TYPE_Q4_K, 256 * 3, 5, n_act);
        check_matrix(COMMON_GGML_TYPE_Q5_K, 512, 23, n_act);
        check_matrix(COMMON_GGML_TYPE_Q5_K, 256 * 3, 5, n_act);
        check_matrix(COMMON_GGML_TYPE_Q6_K, 256 * 3, 5, n_act);
    }
    check_matrix(COMMON_GGML_TYPE_Q8_0, 4096, 70, 2);
    /* The AVX-512 Q8_0 gemm (up to 8 activations a pass, 128 pairs of blocks prepared at a time,
     * accumulators kept for 64 rows between them): 1..17 activations; rows of 1 block (no pair),
     * 33 (a block left after the pairs), 256 (one whole chunk), 257, 258 (a pair past a chunk)
     * and 515 blocks; 70 and 130 rows (several row tiles). */
    for (int64_t n_act = 1; n_act <= 17; n_act++) {
        check_matrix(COMMON_GGML_TYPE_Q8_0, 32, 5, n_act);
        check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 33, 7, n_act);
    }
    check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 256, 9, 8);
    check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 257, 3, 9);
    check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 258, 70, 3);
    check_matrix(COMMON_GGML_TYPE_Q8_0, 32 * 515, 66, 10);
    check_matrix(COMMON_GGML_TYPE_Q8_0, 4096, 130, 11);
    check_matrix(COMMON_GGML_TYPE_Q6_K, 256, 300, 2);
    /* The AVX-512 float gemm (4 activations a pass, 1024 columns widened at a time, accumulators
     * kept for 36 rows; one activation: vec_dot row by row): 1..9 activations; rows of 1, 15, 16,
     * 17, 63, 64 and 65 columns (no 64-element step, a 16-element step, a tail), 4096 (whole
     * chunks), 4160 and 8232 (a ragged last chunk and tail); 33 and 70 rows (several row blocks,
     * and 70 more than one row tile). */
    static const uint32_t fl[3] = {COMMON_GGML_TYPE_F16, COMMON_GGML_TYPE_F32,
                                   COMMON_GGML_TYPE_BF16};
    static const int64_t  fcols[10] = {1, 15, 16, 17, 63, 64, 65, 4096, 4160, 8232};
    for (int t = 0; t < 3; t++) {
        for (int64_t n_act = 1; n_act <= 9; n_act++)
            check_matrix(fl[t], 40 + 7 * t, 9, n_act);
        for (int c = 0; c < 10; c++)
            check_matrix(fl[t], fcols[c], c % 2 ? 33 : 5, 1 + c % 6);
        check_matrix(fl[t], 8232, 70, 5);
        check_matrix(fl[t], 4096, 40, 3);
    }
    check_matrix(COMMON_GGML_TYPE_Q4_1, 32 * 33, 7, 3);
    check_matrix(COMMON_GGML_TYPE_Q5_0, 32 * 33, 7, 3);
    check_matrix(COMMON_GGML_TYPE_Q5_1, 32 * 33, 7, 3);
    check_matrix(COMMON_GGML_TYPE_Q5_K, 256 * 3, 5, 3);
    check_matrix(COMMON_GGML_TYPE_Q5_K, 256, 7, 9);
    check_matrix(COMMON_GGML_TYPE_Q5_K, 4096, 130, 5); /* several gemm row tiles */
    /* the ternary gemm (AVX-512: pairs of activations, up to 8 per pass, 12 blocks prepared at a
     * time, accumulators kept for 64 rows) and gemv (64 blocks prepared at a time): 1..17
     * activations (odd counts leave a pair half used); rows of 1, 3, 12, 13, 25, 65 and 130 blocks
     * (one or several passes); 70, 130 and 300 rows (several row tiles); a matrix larger than one
     * gemm row tile (256 KiB). */
    static const uint32_t tq[2] = {COMMON_GGML_TYPE_TQ1_0, COMMON_GGML_TYPE_TQ2_0};
    for (int t = 0; t < 2; t++) {
        for (int64_t n_act = 1; n_act <= 17; n_act++) {
            check_matrix(tq[t], 256, 5, n_act);
            check_matrix(tq[t], 256 * 13, 7, n_act);
        }
        check_matrix(tq[t], 256 * 3, 5, 3);
        check_matrix(tq[t], 256 * 12, 9, 8);
        check_matrix(tq[t], 256 * 25, 3, 9);
        check_matrix(tq[t], 256 * 7, 70, 2);
        check_matrix(tq[t], 256 * 13, 130, 11);
        check_matrix(tq[t], 256 * 20, 300, 3);
        check_matrix(tq[t], 256 * 65, 3, 2);
        check_matrix(tq[t], 256 * 130, 70, 1);
    }
    check_matrix(COMMON_GGML_TYPE_I2S_Q128, 128 * 3, 5, 3);
    check_matrix(COMMON_GGML_TYPE_I2S_Q128, 2560, 70, 2);
    check_matrix(COMMON_GGML_TYPE_I2S_B32H, 32 * 33, 7, 3);
    check_matrix(COMMON_GGML_TYPE_I2S_B32F, 32 * 33, 7, 3);
    /* MXFP4's 4-row gemv and its gemm (2 rows x 4 activations, 32 pairs of blocks prepared and
     * summed at a time): 1..9 activations (1..3 after the groups of 4); rows of 1, 2, 3 (a block
     * left after the pairs), 31, 33, 64 (one chunk), 65, 97, 130 (a partial last chunk) and 385
     * blocks; odd and even row counts; a matrix larger than one gemm row tile (256 KiB). */
    for (int64_t n_act = 1; n_act <= 9; n_act++) {
        check_matrix(COMMON_GGML_TYPE_MXFP4, 32, 5, n_act);
        check_matrix(COMMON_GGML_TYPE_MXFP4, 96, 7, n_act);
        check_matrix(COMMON_GGML_TYPE_MXFP4, 512, 19, n_act);
        check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 33, 9, n_act);
    }
    check_matrix(COMMON_GGML_TYPE_MXFP4, 64, 1, 5);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 31, 4, 7);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 64, 17, 5);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 65, 3, 6);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 97, 5, 3);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 130, 7, 4);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 385, 6, 3);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 32 * 385, 8, 9);
    check_matrix(COMMON_GGML_TYPE_MXFP4, 4096, 130, 3);
}

Test(executor_kernels, matvec_and_matmul_equal_vec_dot_avx2, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX2);
    check_matrices();
}

Test(executor_kernels, matvec_and_matmul_equal_vec_dot_avx512, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX512);
    check_matrices();
}

Test(executor_kernels, matvec_and_matmul_equal_vec_dot_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_REF);
    check_matrix(COMMON_GGML_TYPE_Q4_0, 256, 37, 5);
    check_matrix(COMMON_GGML_TYPE_Q4_K, 512, 23, 4);
    check_matrix(COMMON_GGML_TYPE_TQ1_0, 512, 9, 3);
    check_matrix(COMMON_GGML_TYPE_TQ2_0, 512, 9, 3);
    check_matrix(COMMON_GGML_TYPE_I2S_Q128, 512, 9, 3);
    check_matrix(COMMON_GGML_TYPE_I2S_B32H, 32 * 9, 9, 3);
    check_matrix(COMMON_GGML_TYPE_I2S_B32F, 32 * 9, 9, 3);
}

/* ------------------------------------------------------------------------------------------ */
/* Weighted sums of F16 rows (latent attention's values)                                       */
/* ------------------------------------------------------------------------------------------ */

/* executor_wsum_f16 with the active set equals the reference bit for bit, for n columns, k rows
 * (stride with padding), m outputs, onto outputs that already hold values. */
static void check_wsum(int64_t n, int64_t k, int64_t m)
{
    const size_t xs = (size_t)(n + 3) * 2u, as = (size_t)k + 1u, ys = (size_t)n + 5u;
    uint16_t    *x = malloc(xs * (size_t)k + 2u);
    float       *a = malloc(sizeof(float) * as * (size_t)m);
    float *y = malloc(sizeof(float) * ys * (size_t)m), *yr = malloc(sizeof(float) * ys * (size_t)m);
    cr_assert(x && a && y && yr);
    for (int64_t i = 0; i < k; i++)
        for (int64_t d = 0; d < n + 3; d++)
            ((uint16_t *)(void *)((char *)x + (size_t)i * xs))[d] =
                executor_fp32_to_fp16(3.0f * rng_gauss());
    for (size_t i = 0; i < as * (size_t)m; i++)
        a[i] = rng_uniform();
    for (size_t i = 0; i < ys * (size_t)m; i++)
        y[i] = yr[i] = rng_gauss();
    cr_assert_eq(executor_wsum_f16(n, k, x, xs, a, as, m, y, ys), 0);
    cr_assert_eq(executor_wsum_f16_ref(n, k, x, xs, a, as, m, yr, ys), 0);
    for (int64_t j = 0; j < m; j++)
        for (int64_t d = 0; d < (int64_t)ys; d++) {
            const size_t i = (size_t)j * ys + (size_t)d;
            cr_assert(memcmp(&y[i], &yr[i], sizeof(float)) == 0,
                      "%s n=%lld k=%lld m=%lld: y[%lld][%lld] = %.9g, ref %.9g",
                      executor_isa_name(executor_kernels_active()), (long long)n, (long long)k,
                      (long long)m, (long long)j, (long long)d, (double)y[i], (double)yr[i]);
        }
    free(x);
    free(a);
    free(y);
    free(yr);
}

static void check_wsums(void)
{
    static const int64_t ns[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 255, 256, 257, 512};
    static const int64_t ms[] = {1, 2, 7, 8, 9, 16, 17};
    for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++)
        for (size_t j = 0; j < sizeof(ms) / sizeof(ms[0]); j++)
            check_wsum(ns[i], (int64_t)(1 + (i * 7 + j * 13) % 40), ms[j]);
    check_wsum(512, 300, 16);
}

Test(executor_kernels, wsum_f16_avx2_matches_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX2);
    check_wsums();
}

Test(executor_kernels, wsum_f16_avx512_matches_ref, .fini = restore_isa)
{
    select_or_skip(EXECUTOR_ISA_AVX512);
    check_wsums();
}

Test(executor_kernels, wsum_f16_ref_is_the_plain_sum)
{
    /* 2 outputs over 3 rows of 2 columns: y_j[d] += sum_i a_j[i] x_i[d] */
    uint16_t    x[6];
    const float xv[6] = {1.0f, -2.0f, 0.5f, 4.0f, 3.0f, 0.25f}, a[6] = {1, 2, 3, -1, 0.5f, 2};
    for (int i = 0; i < 6; i++)
        x[i] = executor_fp32_to_fp16(xv[i]);
    float y[4] = {10, 20, 30, 40};
    cr_assert_eq(executor_wsum_f16_ref(2, 3, x, 4, a, 3, 2, y, 2), 0);
    cr_expect_float_eq(y[0], 10 + 1 * 1.0f + 2 * 0.5f + 3 * 3.0f, 0);
    cr_expect_float_eq(y[1], 20 - 2.0f + 2 * 4.0f + 3 * 0.25f, 0);
    cr_expect_float_eq(y[2], 30 - 1.0f + 0.5f * 0.5f + 2 * 3.0f, 0);
    cr_expect_float_eq(y[3], 40 + 2.0f + 0.5f * 4.0f + 2 * 0.25f, 0);
    cr_expect_eq(executor_wsum_f16(2, 3, x, 4, a, 2, 2, y, 2), COMMON_EINVAL, "a_stride < k");
    cr_expect_eq(executor_wsum_f16(2, 3, x, 4, a, 3, 2, y, 1), COMMON_EINVAL, "y_stride < n");
    cr_expect_eq(executor_wsum_f16(2, 3, NULL, 4, a, 3, 2, y, 2), COMMON_EINVAL);
    cr_expect_eq(executor_wsum_f16(-1, 3, x, 4, a, 3, 2, y, 2), COMMON_EINVAL);
    cr_expect_eq(executor_wsum_f16(2, 0, NULL, 4, NULL, 3, 2, NULL, 2), 0, "nothing to do");
}

/* ------------------------------------------------------------------------------------------ */
/* Errors                                                                                      */
/* ------------------------------------------------------------------------------------------ */

Test(executor_kernels, bad_lengths_and_types_are_rejected)
{
    float         x[512] = {0};
    unsigned char q[1024];
    float         y[4];
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q4_0, x, q, 33), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q4_K, x, q, 288), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q4_0, x, q, -32), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_IQ2_XS, x, q, 256), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(999, x, q, 32), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_Q8_0, NULL, q, 32), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, q, x, 31), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_MXFP4, q, x, 31), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_IQ2_XS, q, x, 256), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_act(COMMON_GGML_TYPE_Q4_0, x, q, 48), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_act(COMMON_GGML_TYPE_Q8_K, x, q, 256), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_act_ref(COMMON_GGML_TYPE_Q6_K, x, q, 32), COMMON_EINVAL);
    cr_assert(isnan(executor_vec_dot(COMMON_GGML_TYPE_Q4_0, 40, q, q)));
    cr_assert(isnan(executor_vec_dot_ref(COMMON_GGML_TYPE_Q4_K, 32, q, q)));
    cr_assert(isnan(executor_vec_dot(COMMON_GGML_TYPE_Q8_1, 32, q, q)));
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_Q4_K, 100), 0);
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_Q4_0, 64), 68);
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_Q5_K, 256), 292);
    /* I2_S: Q128 takes whole 128-element blocks; the file type I2_S has no kernels */
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_Q128, x, q, 96), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_Q128, q, x, 64), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2S_B32H, q, x, 48), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2S_B32F, x, q, 16), COMMON_EINVAL);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_I2_S, q, x, 32), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_I2_S, x, q, 32), COMMON_EINVAL);
    cr_assert_eq(executor_quantize_act(COMMON_GGML_TYPE_I2S_Q128, x, q, 32), COMMON_EINVAL);
    cr_assert(isnan(executor_vec_dot(COMMON_GGML_TYPE_I2S_Q128, 160, q, q)));
    cr_assert(isnan(executor_vec_dot_ref(COMMON_GGML_TYPE_I2S_B32H, 40, q, q)));
    cr_assert(isnan(executor_vec_dot(COMMON_GGML_TYPE_I2_S, 32, q, q)));
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_I2S_Q128, 64), 0);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_I2S_Q128, 128, q, 31, 0, 1, q, y), COMMON_EINVAL);
    /* matrix helpers */
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 32, q, 34, 2, 1, q, y), COMMON_EINVAL);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 32, q, 34, -1, 1, q, y), COMMON_EINVAL);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 32, q, 33, 0, 1, q, y), COMMON_EINVAL);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 32, NULL, 34, 0, 1, q, y), COMMON_EINVAL);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 33, q, 34, 0, 1, q, y), COMMON_EINVAL);
    cr_assert_eq(executor_matvec(COMMON_GGML_TYPE_Q8_0, 32, NULL, 34, 1, 1, NULL, NULL), 0);
    cr_assert_eq(executor_matmul(COMMON_GGML_TYPE_Q8_0, 32, q, 34, 0, 2, q, 34, -1, y, 2),
                 COMMON_EINVAL);
    cr_assert_eq(executor_matmul(COMMON_GGML_TYPE_Q8_0, 32, q, 34, 0, 2, q, 33, 2, y, 2),
                 COMMON_EINVAL);
    cr_assert_eq(executor_matmul(COMMON_GGML_TYPE_Q8_0, 32, q, 34, 0, 2, q, 34, 2, y, 1),
                 COMMON_EINVAL);
}

Test(executor_kernels, select_rejects_unknown_isa, .fini = restore_isa)
{
    executor_kernels_init();
    cr_assert_eq(executor_kernels_select((enum executor_isa)7), COMMON_ENOTSUP);
    cr_assert_eq(executor_kernels_select(EXECUTOR_ISA_REF), 0);
    cr_assert_eq(executor_kernels_active(), EXECUTOR_ISA_REF);
    cr_assert_str_eq(executor_isa_name(EXECUTOR_ISA_AVX512), "avx512");
}

Test(executor_kernels, type_support_and_vec_dot_types)
{
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_Q4_K));
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_BF16));
    cr_assert_not(executor_type_is_supported(COMMON_GGML_TYPE_Q8_K));
    cr_assert_not(executor_type_is_supported(COMMON_GGML_TYPE_IQ4_NL));
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_Q5_0), COMMON_GGML_TYPE_Q8_0);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_Q5_1), COMMON_GGML_TYPE_Q8_1);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_Q3_K), COMMON_GGML_TYPE_Q8_K);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_BF16), COMMON_GGML_TYPE_BF16);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_F32), COMMON_GGML_TYPE_F32);
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_TQ1_0));
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_TQ2_0));
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_TQ1_0), COMMON_GGML_TYPE_Q8_K);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_TQ2_0), COMMON_GGML_TYPE_Q8_K);
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_TQ1_0, 512), 2 * 292);
    /* I2_S: the three kernel layouts take Q8_0 activations; the file type itself is not a kernel
     * type */
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_I2S_Q128));
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_I2S_B32H));
    cr_assert(executor_type_is_supported(COMMON_GGML_TYPE_I2S_B32F));
    cr_assert_not(executor_type_is_supported(COMMON_GGML_TYPE_I2_S));
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_I2S_Q128), COMMON_GGML_TYPE_Q8_0);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_I2S_B32H), COMMON_GGML_TYPE_Q8_0);
    cr_assert_eq(executor_vec_dot_type(COMMON_GGML_TYPE_I2S_B32F), COMMON_GGML_TYPE_Q8_0);
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_I2S_Q128, 256), 8 * 34);
    cr_assert_eq(executor_act_row_size(COMMON_GGML_TYPE_I2S_B32F, 64), 2 * 34);
}

/* MXFP4 decodes as ggml: the doubled e2m1 values {0, 1, 2, 3, 4, 6, 8, 12} and their negatives,
 * times half the E8M0 scale 2^(e - 127), subnormal below e = 2; the quantizer picks the
 * exponent floor(log2(amax)) - 2. */
Test(executor_kernels, mxfp4_decodes_as_ggml)
{
    static const float values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    unsigned char      blk[17];
    float              y[32];
    blk[0] = 129; /* half scale 2 */
    for (int j = 0; j < 16; j++)
        blk[1 + j] = (unsigned char)(j | (15 - j) << 4);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_MXFP4, blk, y, 32), 0);
    for (int j = 0; j < 16; j++) {
        cr_assert_eq(y[j], 2.0f * values[j], "low nibble %d", j);
        cr_assert_eq(y[j + 16], 2.0f * values[15 - j], "high nibble %d", j);
    }
    blk[0] = 1; /* 2^-127: a subnormal half scale */
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_MXFP4, blk, y, 32), 0);
    cr_assert_eq(y[1], ldexpf(1.0f, -127));
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j % 7) - 3.0f; /* amax 3: exponent floor(log2 3) - 2 = -1 */
    cr_assert_eq(executor_quantize_row_ref(COMMON_GGML_TYPE_MXFP4, x, blk, 32), 0);
    cr_assert_eq(blk[0], 126);
    cr_assert_eq(executor_dequantize_row(COMMON_GGML_TYPE_MXFP4, blk, y, 32), 0);
    for (int j = 0; j < 32; j++)
        cr_assert_eq(y[j], x[j], "%d: %g comes back as %g", j, (double)x[j], (double)y[j]);
}
