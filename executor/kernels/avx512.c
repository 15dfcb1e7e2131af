/* executor/kernels/avx512.c - AVX-512 (F/BW/VL/VNNI) dot products for the hot weight types. */
#include "kernels.h"

#include <immintrin.h>

#include "kernels_impl.h"

/* Q4_0, Q8_0, Q4_K and Q6_K get 512-bit kernels (two blocks, or one 64-element chunk, per
 * vector; VNNI vpdpbusd / vpdpwssd fuse the multiply-adds). Every other entry, and the activation
 * quantizers, come from the AVX2 set, which this CPU also runs. As in avx2.c the integer sums are
 * exact and only the order of the float additions differs from ref.c. */

static inline float avx512_fp16(uint16_t h)
{
    return _cvtsh_ss(h);
}

static inline float avx512_hsum_ps(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int avx512_hsum_epi32_256(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Scale vector: d0 in lanes 0..7, d1 in lanes 8..15. */
static inline __m512 avx512_scale_pair(float d0, float d1)
{
    return _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
}

/* Two consecutive 32-byte activation blocks' quants as one vector. */
static inline __m512i avx512_load_pair(const int8_t *q0, const int8_t *q1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q0)),
                              _mm256_loadu_si256((const __m256i *)q1), 1);
}

/* [h0 x8, h1 x8] halves -> floats */
static inline __m512 avx512_fp16_pair(uint16_t h0, uint16_t h1)
{
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)h0)),
                                              _mm_set1_epi16((short)h1), 1);
    return _mm512_cvtph_ps(h);
}

#define AVX512_Q4_0_ROWS 4

/* Dots of R rows of Q4_0 (stride rb bytes) with one Q8_0 activation, two blocks per step. The
 * activation's quants, its 8 * sum correction and its scales are loaded once per step for all R
 * rows; each row's arithmetic is the same whatever R, so gemv and vec_dot agree bit for bit. */
static inline __attribute__((always_inline)) void
avx512_q4_0_rows(const int R, int64_t nb, const char *w, size_t rb,
                 const struct executor_block_q8_0 *y, float *out)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i eight = _mm512_set1_epi8(8);
    const __m512i perm = _mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3);
    const __m512i zero = _mm512_setzero_si512();
    __m512        acc[AVX512_Q4_0_ROWS];
    for (int r = 0; r < R; r++)
        acc[r] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qy = avx512_load_pair(y[i].qs, y[i + 1].qs);
        /* -(sum 8 * a), 4 elements per lane: the accumulator start of every row's dot */
        const __m512i nds = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, eight, qy));
        const __m512  da = avx512_fp16_pair(y[i].d, y[i + 1].d);
        for (int r = 0; r < R; r++) {
            const struct executor_block_q4_0 *xb =
                (const struct executor_block_q4_0 *)(w + (size_t)r * rb) + i;
            const __m256i t = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)xb[0].qs)),
                _mm_loadu_si128((const __m128i *)xb[1].qs), 1);
            /* [b0, b0, b1, b1] -> [b0 low nibbles, b0 high, b1 low, b1 high] */
            __m512i q = _mm512_permutexvar_epi64(perm, _mm512_castsi256_si512(t));
            q = _mm512_and_si512(_mm512_mask_srli_epi16(q, 0xFF00FF00u, q, 4), m4);
            /* sum (q - 8) * a = sum q * a - sum 8 * a */
            const __m512i v = _mm512_dpbusd_epi32(nds, q, qy);
            const __m512  dw = avx512_fp16_pair(xb[0].d, xb[1].d);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dw, da), acc[r]);
        }
    }
    for (int r = 0; r < R; r++)
        out[r] = avx512_hsum_ps(acc[r]);
    if (i < nb) {
        const __m256i qy = _mm256_loadu_si256((const __m256i *)y[i].qs);
        const __m256i z = _mm256_setzero_si256();
        const __m256i ds = _mm256_dpbusd_epi32(z, _mm256_set1_epi8(8), qy);
        const float   da = avx512_fp16(y[i].d);
        for (int r = 0; r < R; r++) {
            const struct executor_block_q4_0 *xb =
                (const struct executor_block_q4_0 *)(w + (size_t)r * rb) + i;
            const __m128i t = _mm_loadu_si128((const __m128i *)xb->qs);
            const __m256i q = _mm256_and_si256(
                _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1),
                _mm256_set1_epi8(0x0F));
            const __m256i v = _mm256_sub_epi32(_mm256_dpbusd_epi32(z, q, qy), ds);
            out[r] += (float)avx512_hsum_epi32_256(v) * (avx512_fp16(xb->d) * da);
        }
    }
}

static void avx512_gemv_q4_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             float *y)
{
    const int64_t nb = n / EXECUTOR_QK;
    int64_t       r = 0;
    for (; r + AVX512_Q4_0_ROWS <= n_rows; r += AVX512_Q4_0_ROWS)
        avx512_q4_0_rows(AVX512_Q4_0_ROWS, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
    for (; r < n_rows; r++)
        avx512_q4_0_rows(1, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
}

static float avx512_dot_q4_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx512_q4_0_rows(1, n / EXECUTOR_QK, w, 0, a, &y);
    return y;
}

static float avx512_dot_q8_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    __m512                            acc = _mm512_setzero_ps();
    const __m512i                     zero = _mm512_setzero_si512();
    int64_t                           i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m512i qx = avx512_load_pair(x[i].qs, x[i + 1].qs);
        const __m512i qy = avx512_load_pair(y[i].qs, y[i + 1].qs);
        /* |x| * (sign(x) * y): vpdpbusd wants one unsigned operand */
        const __m512i sy = _mm512_mask_sub_epi8(qy, _mm512_movepi8_mask(qx), zero, qy);
        const __m512i v = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(qx), sy);
        const __m512  d = avx512_scale_pair(avx512_fp16(x[i].d) * avx512_fp16(y[i].d),
                                            avx512_fp16(x[i + 1].d) * avx512_fp16(y[i + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(v), acc);
    }
    float sum = avx512_hsum_ps(acc);
    for (; i < nb; i++) {
        int s = 0;
        for (int j = 0; j < EXECUTOR_QK; j++)
            s += x[i].qs[j] * y[i].qs[j];
        sum += (float)s * (avx512_fp16(x[i].d) * avx512_fp16(y[i].d));
    }
    return sum;
}

/* Unpacks the 8 scales and 8 mins of a Q4_K block into bytes. */
static inline void avx512_k4_scales(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8])
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

/* int16 lane -> scale index tables for vpermw: Q4_K chunk j uses scales 2j (lanes 0..15) and
 * 2j+1 (16..31); Q6_K piece k uses scales 4k + lane/8. */
static const int16_t k_avx512_q4k_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
     1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
     3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
     5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
     7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7},
};
static const int16_t k_avx512_q6k_idx[4][32] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
     2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
     6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8,  8,  8,  8,  8,  8,  8,  8,  9,  9,  9,  9,  9,  9,  9,  9,
     10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13,
     14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15},
};

static float avx512_dot_q4_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_K *x = w;
    const struct executor_block_q8_K *y = a;
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const __m512i                     m4 = _mm512_set1_epi8(0x0F);
    __m512i                           idx[4];
    for (int j = 0; j < 4; j++)
        idx[j] = _mm512_loadu_si512(k_avx512_q4k_idx[j]);
    __m512 acc = _mm512_setzero_ps();
    float  accm = 0;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        avx512_k4_scales(x[i].scales, sc, mn);
        const float d = avx512_fp16(x[i].d) * y[i].d;
        const float dmin = avx512_fp16(x[i].dmin) * y[i].d;

        /* mins: sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i pair =
            _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn));
        __m128i       pm = _mm_madd_epi16(pair, m16);
        pm = _mm_add_epi32(pm, _mm_unpackhi_epi64(pm, pm));
        pm = _mm_add_epi32(pm, _mm_shuffle_epi32(pm, _MM_SHUFFLE(2, 3, 0, 1)));
        accm += dmin * (float)_mm_cvtsi128_si32(pm);

        const __m512i sc16 =
            _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const uint8_t *q4 = x[i].qs;
        const int8_t  *q8 = y[i].qs;
        __m512i        sumi = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++, q4 += 32, q8 += 64) {
            const __m256i b = _mm256_loadu_si256((const __m256i *)q4);
            const __m512i q = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1), m4);
            const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(q8));
            sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx[j], sc16));
        }
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    return avx512_hsum_ps(acc) - accm;
}

static float avx512_dot_q6_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q6_K *x = w;
    const struct executor_block_q8_K *y = a;
    const int64_t                     nb = n / EXECUTOR_QK_K;
    const __m512i                     m4 = _mm512_set1_epi8(0x0F);
    const __m512i                     m3 = _mm512_set1_epi8(0x03);
    __m512i                           idx[4];
    for (int k = 0; k < 4; k++)
        idx[k] = _mm512_loadu_si512(k_avx512_q6k_idx[k]);
    float sum = 0;
    for (int64_t i = 0; i < nb; i++) {
        const float   d = avx512_fp16(x[i].d) * y[i].d;
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        /* quants are stored +32: subtract 32 * sum(scale * bsum) once per block */
        const int      corr = 32 * avx512_hsum_epi32_256(_mm256_madd_epi16(
                                       s16, _mm256_loadu_si256((const __m256i *)y[i].bsums)));
        const __m512i  sc16 = _mm512_castsi256_si512(s16);
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t  *q8 = y[i].qs;
        __m512i        sumi = _mm512_setzero_si512();
        for (int c = 0; c < 2; c++, ql += 64, qh += 32, q8 += 128) {
            const __m512i l = _mm512_loadu_si512(ql);
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            const __m512i h01 =
                _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
            const __m512i h23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(h, 4)),
                                                   _mm256_srli_epi16(h, 6), 1);
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                _mm512_slli_epi16(_mm512_and_si512(h01, m3), 4));
            const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                _mm512_slli_epi16(_mm512_and_si512(h23, m3), 4));
            const __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512(q8));
            const __m512i p23 = _mm512_maddubs_epi16(q23, _mm512_loadu_si512(q8 + 64));
            sumi = _mm512_dpwssd_epi32(sumi, p01, _mm512_permutexvar_epi16(idx[2 * c], sc16));
            sumi = _mm512_dpwssd_epi32(sumi, p23, _mm512_permutexvar_epi16(idx[2 * c + 1], sc16));
        }
        sum += d * (float)(_mm512_reduce_add_epi32(sumi) - corr);
    }
    return sum;
}

void executor_kernels_fill_avx512(struct executor_kernel_set *ks)
{
    ks->vec_dot[COMMON_GGML_TYPE_Q4_0] = avx512_dot_q4_0;
    ks->gemv[COMMON_GGML_TYPE_Q4_0] = avx512_gemv_q4_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q8_0] = avx512_dot_q8_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_K] = avx512_dot_q4_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q6_K] = avx512_dot_q6_K;
}
