/* executor/kernels/i2s_x86.h - private to kernels/: the I2_S x Q8_0 dots of the x86 kernel
 * sets, included by avx2.c and avx512.c, each compiled for its own instruction set (with VNNI the
 * group products take vpdpbusd). The functions are static: each set registers its own copies. */
#ifndef EXECUTOR_KERNELS_I2S_X86_H
#define EXECUTOR_KERNELS_I2S_X86_H

/* Not for use outside executor/kernels/: build with -mavx2 -mfma -mf16c at least. */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels_impl.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "i2s_x86.h needs AVX2 and F16C (-mavx2 -mf16c)"
#endif

/* Groups of 32 weights (a Q128 block's four, or one block-32 block) meet one Q8_0 block each.
 * Eight groups per step: the 2-bit codes c (0..3, unsigned) times the activations, less the
 * activations' sum (the -1 offset), exact in int32 lanes (i2s_x86_group); a horizontal-add tree
 * gives the eight exact group sums in one vector, which is converted and multiplied by the
 * activation scales (and the weight scales) as ref.c does, one rounding per product. The products
 * are added to sumf one by one in group order: the bits of ref.c. That serial chain of float adds
 * (one per 32 weights) bounds the speed; the integer work of the next steps runs under it, so the
 * vectors stay 256-bit in the AVX-512 build too: 512-bit ones (two groups per vector, an unpack
 * tree across 128-bit lanes) measured 10-20% slower on Zen 4. A last partial step has zeros for
 * the missing groups and adds only the products of the others. */

/* The int32 lane sums of (c - 1) * q over 32 codes c and activations q: with VNNI, vpdpbusd
 * multiplies the unsigned codes by the activations and a second one takes off their sum; without
 * it, the same in int16 pairs (|x| <= 1024) widened to int32. Both are exact. */
static inline __m256i i2s_x86_group(__m256i c, __m256i q)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i z = _mm256_setzero_si256();
    return _mm256_sub_epi32(_mm256_dpbusd_epi32(z, c, q),
                            _mm256_dpbusd_epi32(z, _mm256_set1_epi8(1), q));
#else
    const __m256i p =
        _mm256_sub_epi16(_mm256_maddubs_epi16(c, q), _mm256_maddubs_epi16(_mm256_set1_epi8(1), q));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* The lane sums of v[0..7], in order. */
static inline __m256i i2s_x86_sum8(const __m256i v[8])
{
    const __m256i s01 = _mm256_hadd_epi32(v[0], v[1]);
    const __m256i s23 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i s45 = _mm256_hadd_epi32(v[4], v[5]);
    const __m256i s67 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i lo = _mm256_hadd_epi32(s01, s23); /* per 128-bit half: sums of v[0..3] */
    const __m256i hi = _mm256_hadd_epi32(s45, s67);
    return _mm256_add_epi32(_mm256_permute2x128_si256(lo, hi, 0x20),
                            _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* Eight fp16 scales as floats. */
static inline __m256 i2s_x86_f16x8(uint16_t h0, uint16_t h1, uint16_t h2, uint16_t h3, uint16_t h4,
                                   uint16_t h5, uint16_t h6, uint16_t h7)
{
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h0, (short)h1, (short)h2, (short)h3, (short)h4,
                                          (short)h5, (short)h6, (short)h7));
}

/* The scales of 8 consecutive Q8_0 blocks as floats. */
static inline __m256 i2s_x86_q8_0_scales8(const struct executor_block_q8_0 *y)
{
    return i2s_x86_f16x8(y[0].d, y[1].d, y[2].d, y[3].d, y[4].d, y[5].d, y[6].d, y[7].d);
}

/* The scales of r (< 8) Q8_0 blocks as floats, 0 after them (a last partial step). */
static inline __m256 i2s_x86_q8_0_scales(const struct executor_block_q8_0 *y, int r)
{
    float d[8] = {0};
    for (int k = 0; k < r; k++)
        d[k] = _cvtsh_ss(y[k].d);
    return _mm256_loadu_ps(d);
}

/* Adds the first r products to sumf in order, as ref.c's loop. */
static inline float i2s_x86_add(float sumf, __m256 p, int r)
{
    float pf[8];
    _mm256_storeu_ps(pf, p);
    for (int k = 0; k < r; k++)
        sumf += pf[k];
    return sumf;
}

/* Q128: the group sums of nbk (1 or 2) blocks; a block's 32-byte load holds its four groups at
 * shifts 6, 4, 2, 0. */
static inline __attribute__((always_inline)) __m256i
i2s_x86_q128_sums(const struct executor_block_i2s_q128 *x, const struct executor_block_q8_0 *y,
                  const int nbk)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256i       v[8];
    for (int b = 0; b < 2; b++) {
        const __m256i bits =
            b < nbk ? _mm256_loadu_si256((const __m256i *)x[b].qs) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i c = _mm256_and_si256(_mm256_srli_epi16(bits, 6 - 2 * g), m3);
            v[4 * b + g] =
                b < nbk ? i2s_x86_group(c, _mm256_loadu_si256((const __m256i *)y[4 * b + g].qs))
                        : _mm256_setzero_si256();
        }
    }
    return i2s_x86_sum8(v);
}

static inline float i2s_x86_dot_q128(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_q128 *x = w;
    const struct executor_block_q8_0     *y = a;
    const int64_t                         nb = n / EXECUTOR_I2S_QK128;
    float                                 sumf = 0.0f;
    int64_t                               i = 0;
    for (; i + 2 <= nb; i += 2) {
        const __m256 isum = _mm256_cvtepi32_ps(i2s_x86_q128_sums(x + i, y + 4 * i, 2));
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(isum, i2s_x86_q8_0_scales8(y + 4 * i)), 8);
    }
    if (i < nb) {
        const __m256 isum = _mm256_cvtepi32_ps(i2s_x86_q128_sums(x + i, y + 4 * i, 1));
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(isum, i2s_x86_q8_0_scales(y + 4 * i, 4)), 4);
    }
    return sumf;
}

/* The 32 codes of a block-32 layout in element order: the 8 bytes broadcast, a byte shuffle puts
 * bytes 0..3 (4..7) into every dword of the low (high) 128-bit lane, dword s is shifted right by
 * 2s (byte i of dword s is then element 4i + s of the lane), masked to 2 bits and transposed
 * 4 x 4 by a second shuffle. */
static inline __m256i i2s_x86_b32_codes(const uint8_t *qs)
{
    uint64_t u;
    memcpy(&u, qs, sizeof(u));
    const __m256i spread = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6,
                                            7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
    const __m256i transpose =
        _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9,
                         13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x((long long)u), spread);
    const __m256i c = _mm256_and_si256(
        _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6)), _mm256_set1_epi8(3));
    return _mm256_shuffle_epi8(c, transpose);
}

/* The exact sums of r (<= 8) block-32 blocks (codes at qs + k * stride) with y[0..r), 0 after
 * them, as floats times the activation scales. */
static inline __attribute__((always_inline)) __m256
i2s_x86_b32_step(const uint8_t *qs, size_t stride, const struct executor_block_q8_0 *y, const int r)
{
    __m256i v[8];
    for (int k = 0; k < 8; k++)
        v[k] = k < r ? i2s_x86_group(i2s_x86_b32_codes(qs + (size_t)k * stride),
                                     _mm256_loadu_si256((const __m256i *)y[k].qs))
                     : _mm256_setzero_si256();
    const __m256 da = r == 8 ? i2s_x86_q8_0_scales8(y) : i2s_x86_q8_0_scales(y, r);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(i2s_x86_sum8(v)), da);
}

static inline float i2s_x86_dot_b32h(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_b32h *x = w;
    const struct executor_block_q8_0     *y = a;
    const int64_t                         nb = n / EXECUTOR_QK;
    float                                 sumf = 0.0f;
    int64_t                               i = 0;
    for (; i + 8 <= nb; i += 8) {
        const __m256 dw = i2s_x86_f16x8(x[i].d, x[i + 1].d, x[i + 2].d, x[i + 3].d, x[i + 4].d,
                                        x[i + 5].d, x[i + 6].d, x[i + 7].d);
        const __m256 t = i2s_x86_b32_step(x[i].qs, sizeof(x[0]), y + i, 8);
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(t, dw), 8);
    }
    if (i < nb) {
        const int r = (int)(nb - i);
        float     d[8] = {0};
        for (int k = 0; k < r; k++)
            d[k] = _cvtsh_ss(x[i + k].d);
        const __m256 t = i2s_x86_b32_step(x[i].qs, sizeof(x[0]), y + i, r);
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(t, _mm256_loadu_ps(d)), r);
    }
    return sumf;
}

static inline float i2s_x86_dot_b32f(int64_t n, const void *w, const void *a)
{
    const struct executor_block_i2s_b32f *x = w;
    const struct executor_block_q8_0     *y = a;
    const int64_t                         nb = n / EXECUTOR_QK;
    float                                 sumf = 0.0f;
    int64_t                               i = 0;
    for (; i + 8 <= nb; i += 8) {
        const __m256 dw =
            _mm256_setr_ps(kimpl_i2s_b32f_scale(&x[i]), kimpl_i2s_b32f_scale(&x[i + 1]),
                           kimpl_i2s_b32f_scale(&x[i + 2]), kimpl_i2s_b32f_scale(&x[i + 3]),
                           kimpl_i2s_b32f_scale(&x[i + 4]), kimpl_i2s_b32f_scale(&x[i + 5]),
                           kimpl_i2s_b32f_scale(&x[i + 6]), kimpl_i2s_b32f_scale(&x[i + 7]));
        const __m256 t = i2s_x86_b32_step(x[i].qs, sizeof(x[0]), y + i, 8);
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(t, dw), 8);
    }
    if (i < nb) {
        const int r = (int)(nb - i);
        float     d[8] = {0};
        for (int k = 0; k < r; k++)
            d[k] = kimpl_i2s_b32f_scale(&x[i + k]);
        const __m256 t = i2s_x86_b32_step(x[i].qs, sizeof(x[0]), y + i, r);
        sumf = i2s_x86_add(sumf, _mm256_mul_ps(t, _mm256_loadu_ps(d)), r);
    }
    return sumf;
}

#endif /* EXECUTOR_KERNELS_I2S_X86_H */
