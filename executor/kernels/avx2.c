/* executor/kernels/avx2.c - AVX2+FMA+F16C dot products and activation quantizers. */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>

#include "i2s_x86.h"
#include "kernels_impl.h"

/* Integer work per block is exact, so these kernels differ from ref.c only in the order in which
 * the per-block float terms are added (8 lanes, then a horizontal sum). Activation quantizers are
 * byte-identical to ref.c. Compiled with -mavx2 -mfma -mf16c; only called when the CPU has them. */

/* Rounding mode of _mm256_round_ps: a macro, since the immediate must be an integer constant
 * expression (clang rejects a const variable). Half to even, as ggml's activation quantizers. */
#define AVX2_ROUND_EVEN (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline float avx2_hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int avx2_hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

static inline float avx2_fp16(uint16_t h)
{
    return _cvtsh_ss(h);
}

/* 32 nibbles of 16 bytes: low nibbles in bytes 0..15, high nibbles in 16..31 (ggml order). */
static inline __m256i avx2_nibbles(const uint8_t *p)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)p);
    const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* Bit i of 32 bits -> byte i = 0xFF when set, 0 otherwise. */
static inline __m256i avx2_bits_to_bytes(const uint8_t *p)
{
    uint32_t bits;
    memcpy(&bits, p, sizeof(bits));
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i       b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* Signed int8 x signed int8, summed in groups of 4 into 8 int32 lanes. */
static inline __m256i avx2_dot_i8(__m256i x, __m256i y)
{
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    const __m256i p16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Unsigned int8 (< 128) x signed int8, summed in groups of 4 into 8 int32 lanes. */
static inline __m256i avx2_dot_u8(__m256i ux, __m256i y)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ux, y), _mm256_set1_epi16(1));
}

/* ------------------------------------------------------------------------------------------ */
/* Activation quantizers                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Scales 32 floats by 127/amax, rounds half to even, packs to int8 in order. Returns the int32
 * sum of the quants in *sum when sum is not NULL. */
static inline __m256i avx2_q8_block(const float *x, float *d_out, int *sum)
{
    __m256       v0 = _mm256_loadu_ps(x);
    __m256       v1 = _mm256_loadu_ps(x + 8);
    __m256       v2 = _mm256_loadu_ps(x + 16);
    __m256       v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256       m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    *d_out = amax / 127.f;
    const __m256 mul = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    __m256i      i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, mul), AVX2_ROUND_EVEN));
    __m256i      i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, mul), AVX2_ROUND_EVEN));
    __m256i      i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, mul), AVX2_ROUND_EVEN));
    __m256i      i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, mul), AVX2_ROUND_EVEN));
    if (sum)
        *sum =
            avx2_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void avx2_act_q8_0(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_0 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float   d;
        __m256i q = avx2_q8_block(x, &d, NULL);
        y[i].d = kimpl_fp32_to_fp16(d);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
    }
}

static void avx2_act_q8_1(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_1 *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++, x += EXECUTOR_QK) {
        float   d;
        int     sum;
        __m256i q = avx2_q8_block(x, &d, &sum);
        y[i].d = kimpl_fp32_to_fp16(d);
        y[i].s = kimpl_fp32_to_fp16(d * (float)sum);
        _mm256_storeu_si256((__m256i *)y[i].qs, q);
    }
}

static void avx2_act_q8_K(const float *x, void *dst, int64_t n)
{
    struct executor_block_q8_K *y = dst;
    for (int64_t i = 0; i < n / EXECUTOR_QK_K; i++, x += EXECUTOR_QK_K) {
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256       m = _mm256_setzero_ps();
        for (int j = 0; j < EXECUTOR_QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!amax) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        /* ggml keeps the sign of the first element of largest magnitude. */
        float max = 0;
        for (int j = 0; j < EXECUTOR_QK_K; j++) {
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        }
        const float  iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        for (int j = 0; j < EXECUTOR_QK_K; j += 32) {
            __m256i i0 = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), mul), AVX2_ROUND_EVEN));
            __m256i i1 = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), mul), AVX2_ROUND_EVEN));
            __m256i i2 = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), mul), AVX2_ROUND_EVEN));
            __m256i i3 = _mm256_cvtps_epi32(
                _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), mul), AVX2_ROUND_EVEN));
            const __m256i lim = _mm256_set1_epi32(127);
            i0 = _mm256_min_epi32(i0, lim);
            i1 = _mm256_min_epi32(i1, lim);
            i2 = _mm256_min_epi32(i2, lim);
            i3 = _mm256_min_epi32(i3, lim);
            i0 = _mm256_packs_epi32(i0, i1);
            i2 = _mm256_packs_epi32(i2, i3);
            i0 = _mm256_packs_epi16(i0, i2);
            i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j), i0);
        }
        for (int j = 0; j < EXECUTOR_QK_K / 16; j += 2) {
            /* two groups of 16 int8 -> int16 sums */
            const __m256i q = _mm256_loadu_si256((const __m256i *)(y[i].qs + 16 * j));
            const __m256i s = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
            const __m256i t = _mm256_madd_epi16(s, _mm256_set1_epi16(1)); /* 8 x int32 */
            int32_t       lanes[8];
            _mm256_storeu_si256((__m256i *)lanes, t);
            y[i].bsums[j] = (int16_t)(lanes[0] + lanes[1] + lanes[2] + lanes[3]);
            y[i].bsums[j + 1] = (int16_t)(lanes[4] + lanes[5] + lanes[6] + lanes[7]);
        }
        y[i].d = 1 / iscale;
    }
}

static void avx2_act_f16(const float *x, void *dst, int64_t n)
{
    uint16_t *y = dst;
    int64_t   i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = kimpl_fp32_to_fp16(x[i]);
}

/* ------------------------------------------------------------------------------------------ */
/* Float dots                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static float avx2_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    __m256       s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t      i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), s0);
    float sum = avx2_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        sum += x[i] * y[i];
    return sum;
}

static inline __m256 avx2_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static float avx2_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m256          s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t         i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(avx2_load_f16(x + i), avx2_load_f16(y + i), s0);
        s1 = _mm256_fmadd_ps(avx2_load_f16(x + i + 8), avx2_load_f16(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(avx2_load_f16(x + i + 16), avx2_load_f16(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(avx2_load_f16(x + i + 24), avx2_load_f16(y + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(avx2_load_f16(x + i), avx2_load_f16(y + i), s0);
    float sum = avx2_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        sum += kimpl_fp16_to_fp32(x[i]) * kimpl_fp16_to_fp32(y[i]);
    return sum;
}

static inline __m256 avx2_load_bf16(const uint16_t *p)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static float avx2_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m256          s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t         i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(avx2_load_bf16(x + i), avx2_load_bf16(y + i), s0);
        s1 = _mm256_fmadd_ps(avx2_load_bf16(x + i + 8), avx2_load_bf16(y + i + 8), s1);
        s2 = _mm256_fmadd_ps(avx2_load_bf16(x + i + 16), avx2_load_bf16(y + i + 16), s2);
        s3 = _mm256_fmadd_ps(avx2_load_bf16(x + i + 24), avx2_load_bf16(y + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(avx2_load_bf16(x + i), avx2_load_bf16(y + i), s0);
    float sum = avx2_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        sum += kimpl_bf16_to_fp32(x[i]) * kimpl_bf16_to_fp32(y[i]);
    return sum;
}

/* ------------------------------------------------------------------------------------------ */
/* Block-32 dots                                                                               */
/* ------------------------------------------------------------------------------------------ */

#define AVX2_Q4_0_ROWS 4

/* Dots of R rows of Q4_0 (stride rb bytes) with one Q8_0 activation. Per block the activation
 * quants, their 8 * sum correction and scale are loaded once for all R rows; each row's arithmetic
 * is the same whatever R, so gemv and vec_dot agree bit for bit. */
static inline __attribute__((always_inline)) void
avx2_q4_0_rows(const int R, int64_t nb, const char *w, size_t rb,
               const struct executor_block_q8_0 *y, float *out)
{
    const __m256i eight = _mm256_set1_epi8(8);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256        acc[AVX2_Q4_0_ROWS];
    for (int r = 0; r < R; r++)
        acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i s8 = _mm256_maddubs_epi16(eight, qy); /* 8 * (a0 + a1) per int16 */
        const float   da = avx2_fp16(y[i].d);
        for (int r = 0; r < R; r++) {
            const struct executor_block_q4_0 *xb =
                (const struct executor_block_q4_0 *)(w + (size_t)r * rb) + i;
            /* (q - 8) * a summed in pairs = q * a - 8 * a: both fit int16 */
            const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(avx2_nibbles(xb->qs), qy), s8);
            const __m256  v = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(avx2_fp16(xb->d) * da), v, acc[r]);
        }
    }
    for (int r = 0; r < R; r++)
        out[r] = avx2_hsum_ps(acc[r]);
}

static void avx2_gemv_q4_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                           float *y)
{
    const int64_t nb = n / EXECUTOR_QK;
    int64_t       r = 0;
    for (; r + AVX2_Q4_0_ROWS <= n_rows; r += AVX2_Q4_0_ROWS)
        avx2_q4_0_rows(AVX2_Q4_0_ROWS, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
    for (; r < n_rows; r++)
        avx2_q4_0_rows(1, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
}

/* MXFP4 x Q8_0: the nibbles index the e2m1 table with a byte shuffle, the signed products are
 * made unsigned x signed for maddubs by moving the weight's sign onto the activation. */
static float avx2_dot_mxfp4(int64_t n, const void *w, const void *a)
{
    const struct executor_block_mxfp4 *x = w;
    const struct executor_block_q8_0  *y = a;
    const __m128i values = _mm_loadu_si128((const __m128i *)(const void *)kimpl_mxfp4_values);
    const __m256i table = _mm256_set_m128i(values, values);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256        acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / EXECUTOR_QK; i++) {
        const __m256i q = _mm256_shuffle_epi8(table, avx2_nibbles(x[i].qs));
        const __m256i qy = _mm256_loadu_si256((const __m256i *)(const void *)y[i].qs);
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(qy, q));
        const __m256  v = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        const float   d = avx2_fp16(y[i].d) * kimpl_e8m0_half(x[i].e);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), v, acc);
    }
    return avx2_hsum_ps(acc);
}

static float avx2_dot_q4_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx2_q4_0_rows(1, n / EXECUTOR_QK, w, 0, a, &y);
    return y;
}

static float avx2_dot_q8_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    __m256                            acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t                           i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256i qx0 = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qx1 = _mm256_loadu_si256((const __m256i *)x[i + 1].qs);
        const __m256i qy0 = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i qy1 = _mm256_loadu_si256((const __m256i *)y[i + 1].qs);
        const __m256  d0 = _mm256_set1_ps(avx2_fp16(x[i].d) * avx2_fp16(y[i].d));
        const __m256  d1 = _mm256_set1_ps(avx2_fp16(x[i + 1].d) * avx2_fp16(y[i + 1].d));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(avx2_dot_i8(qx0, qy0)), acc0);
        acc1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(avx2_dot_i8(qx1, qy1)), acc1);
    }
    for (; i < nb; i++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256  d = _mm256_set1_ps(avx2_fp16(x[i].d) * avx2_fp16(y[i].d));
        acc0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2_dot_i8(qx, qy)), acc0);
    }
    return avx2_hsum_ps(_mm256_add_ps(acc0, acc1));
}

static float avx2_dot_q4_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    __m256                            acc = _mm256_setzero_ps();
    float                             summs = 0;
    for (int64_t i = 0; i < nb; i++) {
        summs += avx2_fp16(x[i].m) * avx2_fp16(y[i].s);
        const __m256i qx = avx2_nibbles(x[i].qs);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256  d = _mm256_set1_ps(avx2_fp16(x[i].d) * avx2_fp16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2_dot_u8(qx, qy)), acc);
    }
    return avx2_hsum_ps(acc) + summs;
}

static float avx2_dot_q5_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    __m256                            acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* (nibble | 16*bit) - 16 == nibble | (bit ? 0 : 0xF0) as int8 */
        const __m256i hi =
            _mm256_andnot_si256(avx2_bits_to_bytes(x[i].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i qx = _mm256_or_si256(avx2_nibbles(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256  d = _mm256_set1_ps(avx2_fp16(x[i].d) * avx2_fp16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2_dot_i8(qx, qy)), acc);
    }
    return avx2_hsum_ps(acc);
}

static float avx2_dot_q5_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    __m256                            acc = _mm256_setzero_ps();
    float                             summs = 0;
    for (int64_t i = 0; i < nb; i++) {
        summs += avx2_fp16(x[i].m) * avx2_fp16(y[i].s);
        const __m256i hi = _mm256_and_si256(avx2_bits_to_bytes(x[i].qh), _mm256_set1_epi8(0x10));
        const __m256i qx = _mm256_or_si256(avx2_nibbles(x[i].qs), hi);
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256  d = _mm256_set1_ps(avx2_fp16(x[i].d) * avx2_fp16(y[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(avx2_dot_u8(qx, qy)), acc);
    }
    return avx2_hsum_ps(acc) + summs;
}

/* ------------------------------------------------------------------------------------------ */
/* K-quant dots                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Unpacks the 8 scales and 8 mins of a Q4_K/Q5_K block into bytes. */
static inline void avx2_k4_scales(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t u[3];
    memcpy(u, packed, 12);
    const uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
    uint32_t       s[2], m[2];
    s[0] = u[0] & k1;
    m[0] = u[1] & k1;
    s[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    m[1] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    memcpy(sc, s, 8);
    memcpy(mn, m, 8);
}

/* Sum over j of mins[j] * (bsums[2j] + bsums[2j+1]). */
static inline int avx2_k4_min_sum(const int16_t *bsums, const uint8_t mn[8])
{
    const __m256i bs = _mm256_loadu_si256((const __m256i *)bsums);
    const __m128i pair =
        _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
    __m128i       p = _mm_madd_epi16(pair, m16);
    p = _mm_add_epi32(p, _mm_unpackhi_epi64(p, p));
    p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(p);
}

static float avx2_dot_q4_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_K *x = w;
    const struct executor_block_q8_K *y = a;
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const __m256i                     m4 = _mm256_set1_epi8(0x0F);
    __m256                            acc = _mm256_setzero_ps();
    float                             accm = 0;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        avx2_k4_scales(x[i].scales, sc, mn);
        const float d = avx2_fp16(x[i].d) * y[i].d;
        const float dmin = avx2_fp16(x[i].dmin) * y[i].d;
        accm += dmin * (float)avx2_k4_min_sum(y[i].bsums, mn);

        const uint8_t *q4 = x[i].qs;
        const int8_t  *q8 = y[i].qs;
        __m256i        sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)q4);
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)q8);
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q8 + 32));
            __m256i       p0 = _mm256_maddubs_epi16(lo, y0);
            __m256i       p1 = _mm256_maddubs_epi16(hi, y1);
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return avx2_hsum_ps(acc) - accm;
}

static float avx2_dot_q5_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_K *x = w;
    const struct executor_block_q8_K *y = a;
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const __m256i                     m4 = _mm256_set1_epi8(0x0F);
    const __m256i                     b1 = _mm256_set1_epi8(1);
    __m256                            acc = _mm256_setzero_ps();
    float                             accm = 0;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        avx2_k4_scales(x[i].scales, sc, mn);
        const float d = avx2_fp16(x[i].d) * y[i].d;
        const float dmin = avx2_fp16(x[i].dmin) * y[i].d;
        accm += dmin * (float)avx2_k4_min_sum(y[i].bsums, mn);

        const uint8_t *ql = x[i].qs;
        const int8_t  *q8 = y[i].qs;
        const __m256i  hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i        sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, ql += 32, q8 += 64) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i h0 =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), b1), 4);
            const __m256i h1 =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), b1), 4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h0);
            const __m256i hi =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1);
            const __m256i y0 = _mm256_loadu_si256((const __m256i *)q8);
            const __m256i y1 = _mm256_loadu_si256((const __m256i *)(q8 + 32));
            __m256i       p0 = _mm256_maddubs_epi16(lo, y0);
            __m256i       p1 = _mm256_maddubs_epi16(hi, y1);
            p0 = _mm256_madd_epi16(p0, _mm256_set1_epi16(sc[2 * j]));
            p1 = _mm256_madd_epi16(p1, _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return avx2_hsum_ps(acc) - accm;
}

/* Sum over the 16 groups of scale[j] * bsums[j] (Q6_K's -32 offset correction). */
static inline int avx2_scale_bsum(const int8_t *scales, const int16_t *bsums)
{
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
    const __m256i bs = _mm256_loadu_si256((const __m256i *)bsums);
    return avx2_hsum_epi32(_mm256_madd_epi16(s16, bs));
}

static float avx2_dot_q6_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q6_K *x = w;
    const struct executor_block_q8_K *y = a;
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const __m256i                     m4 = _mm256_set1_epi8(0x0F);
    const __m256i                     m3 = _mm256_set1_epi8(0x03);
    __m256                            acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const float    d = avx2_fp16(x[i].d) * y[i].d;
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t  *sc = x[i].scales;
        const int8_t  *q8 = y[i].qs;
        /* quants are stored +32: subtract 32 * sum(scale * bsum) once per block */
        const int corr = 32 * avx2_scale_bsum(x[i].scales, y[i].bsums);
        __m256i   sumi = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, sc += 8, q8 += 128) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
            const __m256i q2 = _mm256_or_si256(
                _mm256_and_si256(l1, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
            const __m256i q3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
            const __m256i q4 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
            const __m256i qs[4] = {q1, q2, q3, q4};
            for (int k = 0; k < 4; k++) {
                const __m256i yk = _mm256_loadu_si256((const __m256i *)(q8 + 32 * k));
                const __m256i p = _mm256_maddubs_epi16(qs[k], yk);
                /* lanes 0..7 cover 16 elements with scale sc[2k], lanes 8..15 sc[2k+1] */
                const __m256i s16 =
                    _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, s16));
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(corr, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return avx2_hsum_ps(acc);
}

/* ------------------------------------------------------------------------------------------ */
/* Ternary x Q8_K                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Both ternary dots multiply the unsigned quants t (0..2, TQ2_0 0..3) by the activations with
 * vpmaddubsw and take off the Q8_K bsums in pairs: int32 lane k holds what llama.cpp's x86 kernel
 * puts there (ref.c), scaled by d_a * d_w with one FMA per lane and block and summed at the end as
 * ggml's hsum_float_8 does: llama.cpp's bits. */

/* ggml's hsum_float_8: (l0 + l4 + (l2 + l6)) + (l1 + l5 + (l3 + l7)). */
static inline float avx2_hsum_ps_ggml(__m256 v)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* x * 3 in each byte, mod 256: moves the next TQ1_0 trit to the top. */
static inline __m256i avx2_tq1_times3(__m256i x)
{
    return _mm256_add_epi8(x, _mm256_add_epi8(x, x));
}

static inline __m128i avx2_tq1_times3_128(__m128i x)
{
    return _mm_add_epi8(x, _mm_add_epi8(x, x));
}

/* TQ1_0's bytes are unpacked with their top bit flipped (s = q ^ 0x80 = q + 128 mod 256), where
 * AVX2's signed compares order them as unsigned; the flipped domain is closed under x3:
 * 3 (q + 128) = 3q + 384 = 3q + 128 mod 256, so each byte is flipped once, when loaded. */
static inline __m256i avx2_tq1_flip(__m256i q)
{
    return _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80));
}

/* The top trit of each byte q from its flipped s: (q * 3) >> 8 = (q >= 86) + (q >= 171). */
static inline __m256i avx2_tq1_top_trit(__m256i s)
{
    const __m256i ge86 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((char)(85 ^ 0x80)));
    const __m256i ge171 = _mm256_cmpgt_epi8(s, _mm256_set1_epi8((char)(170 ^ 0x80)));
    return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(ge86, ge171));
}

/* A ternary block's quants as eight vectors: t[k] holds the 32 unsigned quants that meet the
 * block's activations 32k .. 32k + 31. */
#define AVX2_TQ_VECS 8

/* TQ1_0: qs[0..31] times 3^k for k = 0..4 meet activations 32k..32k+31; the last 16 qs bytes
 * (elements 160 + 16k + m) and the 4 qh bytes (element 240 + 4k + j: the qh word times 3^k in
 * dword k of a 16-byte lane) share three vectors. */
static inline void avx2_tq1_unpack(const struct executor_block_tq1_0 *x, __m256i t[AVX2_TQ_VECS])
{
    __m256i p = avx2_tq1_flip(_mm256_loadu_si256((const __m256i *)x->qs));
    for (int k = 0; k < 5; k++, p = avx2_tq1_times3(p))
        t[k] = avx2_tq1_top_trit(p);
    /* r[k] = qs[32..47] * 3^k; the qh word times 3^k in dword k (all flipped) */
    __m128i       r[5];
    const __m128i flip = _mm_set1_epi8((char)0x80);
    r[0] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(x->qs + 32)), flip);
    for (int k = 1; k < 5; k++)
        r[k] = avx2_tq1_times3_128(r[k - 1]);
    uint32_t qh;
    memcpy(&qh, x->qh, sizeof(qh));
    const __m128i h0 = _mm_xor_si128(_mm_set1_epi32((int)qh), flip);
    const __m128i h1 = avx2_tq1_times3_128(h0);
    const __m128i h2 = avx2_tq1_times3_128(h1);
    const __m128i h3 = avx2_tq1_times3_128(h2);
    const __m128i h = _mm_unpacklo_epi64(_mm_unpacklo_epi32(h0, h1), _mm_unpacklo_epi32(h2, h3));
    t[5] = avx2_tq1_top_trit(_mm256_set_m128i(r[1], r[0]));
    t[6] = avx2_tq1_top_trit(_mm256_set_m128i(r[3], r[2]));
    t[7] = avx2_tq1_top_trit(_mm256_set_m128i(h, r[4]));
}

/* TQ2_0: bits 2k..2k+1 of 32 bytes meet 32 consecutive activations. */
static inline void avx2_tq2_unpack(const struct executor_block_tq2_0 *x, __m256i t[AVX2_TQ_VECS])
{
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m256i bits = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * h));
        for (int k = 0; k < 4; k++)
            t[4 * h + k] = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
    }
}

/* The step of one block and one activation that every ternary kernel below runs, so they agree
 * bit for bit: the quants t times the block's activations (avx2_tq_sum16), less its bsums, times
 * d_a * d_w onto acc (avx2_tq_finish; avx2_tq_block is both). The eight products stay in int16
 * pairs until one widening (|sum| <= 8 * 2 * 3 * 128 = 6144), the 16 bsums taken off there as
 * llama.cpp does: int32 lane k still holds bytes 4k .. 4k + 3 of every vector less the
 * activations 32k .. 32k + 31, the same integers. */
static inline __m256i avx2_tq_sum16(const __m256i                     t[AVX2_TQ_VECS],
                                    const struct executor_block_q8_K *y)
{
    __m256i s16 = _mm256_maddubs_epi16(t[0], _mm256_loadu_si256((const __m256i *)y->qs));
    for (int k = 1; k < AVX2_TQ_VECS; k++)
        s16 = _mm256_add_epi16(
            s16, _mm256_maddubs_epi16(t[k], _mm256_loadu_si256((const __m256i *)(y->qs + 32 * k))));
    return s16;
}

/* acc + (s16 less the block's bsums, widened) * (d_a * d_w). */
static inline __m256 avx2_tq_finish(__m256i s16, const struct executor_block_q8_K *y, float dw,
                                    __m256 acc)
{
    s16 = _mm256_sub_epi16(s16, _mm256_loadu_si256((const __m256i *)y->bsums)); /* |.| <= 2048 */
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1))),
                           _mm256_set1_ps(y->d * dw), acc);
}

static inline __m256 avx2_tq_block(const __m256i                     t[AVX2_TQ_VECS],
                                   const struct executor_block_q8_K *y, float dw, __m256 acc)
{
    return avx2_tq_finish(avx2_tq_sum16(t, y), y, dw, acc);
}

/* Activations sharing one unpack of a ternary block in the gemms. */
#define AVX2_TQ_NACT 4

/* Dots of n_rows ternary rows (TQ1_0 when tq1, else TQ2_0) with n_act activations: each block is
 * unpacked once for up to AVX2_TQ_NACT of them, which then run avx2_tq_block in block order as
 * vec_dot (n_rows = n_act = 1) does: the gemms and both vec_dots. The activations are the outer
 * loop: a group of AVX2_TQ_NACT (12 KiB at 2560 columns) stays in L1 while the rows (the gemm
 * tile, in L2) pass, rather than every activation passing for each row. */
static inline __attribute__((always_inline)) void
avx2_tq_rows(const bool tq1, int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    const int64_t nb = n / EXECUTOR_QK_K;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX2_TQ_NACT) {
        const int na = n_act - j0 < AVX2_TQ_NACT ? (int)(n_act - j0) : AVX2_TQ_NACT;
        const struct executor_block_q8_K *a[AVX2_TQ_NACT];
        for (int j = 0; j < na; j++)
            a[j] = (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
        for (int64_t r = 0; r < n_rows; r++) {
            const char *row = (const char *)w + (size_t)r * rb;
            __m256      acc[AVX2_TQ_NACT];
            for (int j = 0; j < na; j++)
                acc[j] = _mm256_setzero_ps();
            for (int64_t i = 0; i < nb; i++) {
                __m256i t[AVX2_TQ_VECS];
                float   dw;
                if (tq1) {
                    const struct executor_block_tq1_0 *x = (const void *)row;
                    avx2_tq1_unpack(x + i, t);
                    dw = avx2_fp16(x[i].d);
                } else {
                    const struct executor_block_tq2_0 *x = (const void *)row;
                    avx2_tq2_unpack(x + i, t);
                    dw = avx2_fp16(x[i].d);
                }
                for (int j = 0; j < na; j++)
                    acc[j] = avx2_tq_block(t, a[j] + i, dw, acc[j]);
            }
            for (int j = 0; j < na; j++)
                y[(size_t)(j0 + j) * ys + (size_t)r] = avx2_hsum_ps_ggml(acc[j]);
        }
    }
}

static float avx2_dot_tq1_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx2_tq_rows(true, n, w, 0, 1, a, 0, 1, &y, 1);
    return y;
}

static float avx2_dot_tq2_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx2_tq_rows(false, n, w, 0, 1, a, 0, 1, &y, 1);
    return y;
}

static void avx2_gemm_tq1_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                            size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    avx2_tq_rows(true, n, w, rb, n_rows, act, act_stride, n_act, y, ys);
}

/* The TQ1_0 gemv: two rows at a time, whose independent chains overlap where one row's dot
 * would wait on its own latencies, the call and the horizontal sums paid once per pair; each
 * row's integers and FMAs are vec_dot's, in its order (its bits; an odd last row runs vec_dot).
 * TQ2_0 keeps vec_dot row by row: the same two-row shape read 7-12 GB/s from DRAM on two threads
 * against vec_dot's 12-15 (Zen 3; its cheap unpack leaves it to the prefetchers, which follow
 * one stream better than two). */

static void avx2_gemv_tq1_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                            float *y)
{
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const struct executor_block_q8_K *a = act;
    int64_t                           r = 0;
    for (; r + 2 <= n_rows; r += 2) {
        const struct executor_block_tq1_0 *x0 = (const void *)((const char *)w + (size_t)r * rb);
        const struct executor_block_tq1_0 *x1 = (const void *)((const char *)x0 + rb);
        __m256                             acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t i = 0; i < nb; i++) {
            __m256i t0[AVX2_TQ_VECS], t1[AVX2_TQ_VECS];
            avx2_tq1_unpack(x0 + i, t0);
            avx2_tq1_unpack(x1 + i, t1);
            const __m256i s0 = avx2_tq_sum16(t0, a + i), s1 = avx2_tq_sum16(t1, a + i);
            acc0 = avx2_tq_finish(s0, a + i, avx2_fp16(x0[i].d), acc0);
            acc1 = avx2_tq_finish(s1, a + i, avx2_fp16(x1[i].d), acc1);
        }
        y[r] = avx2_hsum_ps_ggml(acc0);
        y[r + 1] = avx2_hsum_ps_ggml(acc1);
    }
    if (r < n_rows)
        avx2_tq_rows(true, n, (const char *)w + (size_t)r * rb, rb, 1, act, 0, 1, y + r, 1);
}

/* The TQ2_0 gemm: four activations at a time meet each row, half a block (32 bytes of qs, four
 * shifts and masks) at a time, their int16 sums in four registers, so nothing of a block spills;
 * each (row, activation) takes avx2_tq_block's integers and one FMA per block, the bits of
 * vec_dot, which the last n_act % 4 activations run. */
static void avx2_gemm_tq2_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                            size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    const int64_t nb = n / EXECUTOR_QK_K;
    const __m256i m3 = _mm256_set1_epi8(3);
    int64_t       j0 = 0;
    for (; j0 + 4 <= n_act; j0 += 4) {
        const struct executor_block_q8_K *a[4];
        for (int j = 0; j < 4; j++)
            a[j] = (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
        for (int64_t r = 0; r < n_rows; r++) {
            const struct executor_block_tq2_0 *x = (const void *)((const char *)w + (size_t)r * rb);
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            for (int64_t i = 0; i < nb; i++) {
                __m256i s16[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                                  _mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int h = 0; h < 2; h++) {
                    const __m256i bits = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * h));
                    for (int k = 0; k < 4; k++) {
                        const __m256i t = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
                        const size_t  o = (size_t)(128 * h + 32 * k);
                        for (int j = 0; j < 4; j++)
                            s16[j] = _mm256_add_epi16(
                                s16[j],
                                _mm256_maddubs_epi16(
                                    t, _mm256_loadu_si256((const __m256i *)(a[j][i].qs + o))));
                    }
                }
                const float dw = avx2_fp16(x[i].d);
                for (int j = 0; j < 4; j++) {
                    acc[j] = avx2_tq_finish(s16[j], a[j] + i, dw, acc[j]);
                }
            }
            for (int j = 0; j < 4; j++)
                y[(size_t)(j0 + j) * ys + (size_t)r] = avx2_hsum_ps_ggml(acc[j]);
        }
    }
    if (j0 < n_act)
        avx2_tq_rows(false, n, w, rb, n_rows, (const char *)act + (size_t)j0 * act_stride,
                     act_stride, n_act - j0, y + (size_t)j0 * ys, ys);
}

/* executor_wsum_f16: 8 columns by up to 8 rows at a time (the sums in registers while the k
 * rows pass), the last n % 8 columns as the reference; mul then add, as the reference. */
static void avx2_wsum_f16(int64_t n, int64_t k, const uint16_t *x, size_t x_stride, const float *a,
                          size_t a_stride, int64_t m, float *y, size_t y_stride)
{
    const int64_t n8 = n & ~(int64_t)7;
    for (int64_t j0 = 0; j0 < m; j0 += 8) {
        const int64_t mj = m - j0 < 8 ? m - j0 : 8;
        const float  *aj0 = a + (size_t)j0 * a_stride;
        float        *yj0 = y + (size_t)j0 * y_stride;
        for (int64_t d = 0; d < n8; d += 8) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                acc[j] = j < mj ? _mm256_loadu_ps(yj0 + (size_t)j * y_stride + (size_t)d)
                                : _mm256_setzero_ps();
            for (int64_t i = 0; i < k; i++) {
                const __m256 xv = avx2_load_f16(
                    (const uint16_t *)(const void *)((const char *)(x + d) + (size_t)i * x_stride));
#pragma GCC unroll 8
                for (int j = 0; j < 8; j++)
                    if (j < mj)
                        acc[j] = _mm256_add_ps(
                            acc[j], _mm256_mul_ps(
                                        _mm256_set1_ps(aj0[(size_t)j * a_stride + (size_t)i]), xv));
            }
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++)
                if (j < mj)
                    _mm256_storeu_ps(yj0 + (size_t)j * y_stride + (size_t)d, acc[j]);
        }
        for (int64_t i = 0; n8 < n && i < k; i++) {
            const uint16_t *xi =
                (const uint16_t *)(const void *)((const char *)x + (size_t)i * x_stride);
            for (int64_t j = 0; j < mj; j++)
                for (int64_t d = n8; d < n; d++) {
                    /* two statements, so that no compiler fuses them into an FMA */
                    const float p =
                        aj0[(size_t)j * a_stride + (size_t)i] * kimpl_fp16_to_fp32(xi[d]);
                    yj0[(size_t)j * y_stride + (size_t)d] += p;
                }
        }
    }
}

void executor_kernels_fill_avx2(struct executor_kernel_set *ks)
{
    ks->wsum_f16 = avx2_wsum_f16;
    ks->vec_dot[COMMON_GGML_TYPE_F32] = avx2_dot_f32;
    ks->vec_dot[COMMON_GGML_TYPE_F16] = avx2_dot_f16;
    ks->vec_dot[COMMON_GGML_TYPE_BF16] = avx2_dot_bf16;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_0] = avx2_dot_q4_0;
    ks->gemv[COMMON_GGML_TYPE_Q4_0] = avx2_gemv_q4_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_1] = avx2_dot_q4_1;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_0] = avx2_dot_q5_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_1] = avx2_dot_q5_1;
    ks->vec_dot[COMMON_GGML_TYPE_Q8_0] = avx2_dot_q8_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_K] = avx2_dot_q4_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_K] = avx2_dot_q5_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q6_K] = avx2_dot_q6_K;
    ks->vec_dot[COMMON_GGML_TYPE_MXFP4] = avx2_dot_mxfp4;
    ks->vec_dot[COMMON_GGML_TYPE_TQ1_0] = avx2_dot_tq1_0;
    ks->vec_dot[COMMON_GGML_TYPE_TQ2_0] = avx2_dot_tq2_0;
    ks->gemm[COMMON_GGML_TYPE_TQ1_0] = avx2_gemm_tq1_0;
    ks->gemm[COMMON_GGML_TYPE_TQ2_0] = avx2_gemm_tq2_0;
    ks->gemv[COMMON_GGML_TYPE_TQ1_0] = avx2_gemv_tq1_0;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_Q128] = i2s_x86_dot_q128;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32H] = i2s_x86_dot_b32h;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32F] = i2s_x86_dot_b32f;

    ks->quantize_act[COMMON_GGML_TYPE_Q8_0] = avx2_act_q8_0;
    ks->quantize_act[COMMON_GGML_TYPE_Q8_1] = avx2_act_q8_1;
    ks->quantize_act[COMMON_GGML_TYPE_Q8_K] = avx2_act_q8_K;
    ks->quantize_act[COMMON_GGML_TYPE_F16] = avx2_act_f16;
}
