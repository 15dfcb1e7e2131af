/* executor/kernels/avx512.c - AVX-512 (F/BW/VL/VNNI) dot products for every weight type but Q2_K
 * and Q3_K. */
#include "kernels.h"

#include <immintrin.h>

#include "i2s_x86.h"
#include "kernels_impl.h"

/* F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4, TQ1_0 and TQ2_0 get
 * 512-bit dots (Q4_0: three raw blocks per load; the other block types two blocks, or one
 * 64-element chunk, per vector; VNNI vpdpbusd / vpdpwssd fuse the multiply-adds), I2_S 256-bit
 * ones with VNNI (i2s_x86.h); F32, F16, BF16, Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4, TQ1_0 and
 * TQ2_0 also a gemm.
 * Q2_K and Q3_K (scalar everywhere) and the activation quantizers come from the slower sets, which
 * this CPU also runs. As in avx2.c the integer sums are exact and only the order of the float
 * additions differs from ref.c. */

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

static inline float avx512_hsum_ps256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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

/* ------------------------------------------------------------------------------------------ */
/* Float dots (F32, F16, BF16)                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Any n: 64 elements per iteration over four accumulators, then 16 at a time, then one masked
 * load of the last n % 16 elements (masked-off lanes are not read, so nothing past the row is
 * touched). Products are exact for F16 and BF16 (widened to float); only the order of the float
 * additions differs from ref.c. BF16 widens with a shift rather than vdpbf16ps, which treats
 * subnormal inputs and results as zero (DAZ/FTZ) where ref.c does not. */

/* Mask of the first k (< 16) lanes. */
static inline __mmask16 avx512_tail_mask(int64_t k)
{
    return (__mmask16)((1u << k) - 1u);
}

static inline __m512 avx512_load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline __m512 avx512_maskz_load_f16(__mmask16 m, const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

static inline __m512 avx512_load_bf16(const uint16_t *p)
{
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static inline __m512 avx512_maskz_load_bf16(__mmask16 m, const uint16_t *p)
{
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static float avx512_dot_f32(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    __m512       s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t      i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(y + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(y + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), s0);
    if (i < n) {
        const __mmask16 m = avx512_tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i), s1);
    }
    return avx512_hsum_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static float avx512_dot_f16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m512          s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t         i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(avx512_load_f16(x + i), avx512_load_f16(y + i), s0);
        s1 = _mm512_fmadd_ps(avx512_load_f16(x + i + 16), avx512_load_f16(y + i + 16), s1);
        s2 = _mm512_fmadd_ps(avx512_load_f16(x + i + 32), avx512_load_f16(y + i + 32), s2);
        s3 = _mm512_fmadd_ps(avx512_load_f16(x + i + 48), avx512_load_f16(y + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(avx512_load_f16(x + i), avx512_load_f16(y + i), s0);
    if (i < n) {
        const __mmask16 m = avx512_tail_mask(n - i);
        s1 = _mm512_fmadd_ps(avx512_maskz_load_f16(m, x + i), avx512_maskz_load_f16(m, y + i), s1);
    }
    return avx512_hsum_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static float avx512_dot_bf16(int64_t n, const void *w, const void *a)
{
    const uint16_t *x = w, *y = a;
    __m512          s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t         i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(avx512_load_bf16(x + i), avx512_load_bf16(y + i), s0);
        s1 = _mm512_fmadd_ps(avx512_load_bf16(x + i + 16), avx512_load_bf16(y + i + 16), s1);
        s2 = _mm512_fmadd_ps(avx512_load_bf16(x + i + 32), avx512_load_bf16(y + i + 32), s2);
        s3 = _mm512_fmadd_ps(avx512_load_bf16(x + i + 48), avx512_load_bf16(y + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(avx512_load_bf16(x + i), avx512_load_bf16(y + i), s0);
    if (i < n) {
        const __mmask16 m = avx512_tail_mask(n - i);
        s1 =
            _mm512_fmadd_ps(avx512_maskz_load_bf16(m, x + i), avx512_maskz_load_bf16(m, y + i), s1);
    }
    return avx512_hsum_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* The float gemm (F32, F16, BF16): vec_dot's four accumulators per (row, activation), for
 * AVX512_FG_NA activations and AVX512_FG_R rows at a time. The activations are widened to float
 * once per chunk of AVX512_FG_COLS columns (F16: cvtph, BF16: the shift; exact, so the same floats
 * vec_dot makes) and read from L1; each row vector is loaded and widened once for all the
 * activations. Every accumulator takes the same products in the same order as vec_dot's
 * (64-element steps, then 16-element steps into s0, the masked tail into s1, the same final sum),
 * so each (row, activation) gets vec_dot's bits. One activation is vec_dot row by row. */
#define AVX512_FG_NA   4    /* activations a pass */
#define AVX512_FG_R    6    /* rows a register block: 6 x 4 accumulators */
#define AVX512_FG_COLS 1024 /* columns widened at a time (16 KiB for 4 activations) */
#define AVX512_FG_ROWS 36   /* rows whose accumulators persist between chunks (36 KiB) */
#ifndef AVX512_FG_PREFETCH
#define AVX512_FG_PREFETCH 2048 /* bytes ahead of a row's loads that the gemm prefetches */
#endif

enum avx512_fkind { AVX512_F32, AVX512_F16, AVX512_BF16 };

static inline __attribute__((always_inline)) __m512 avx512_fload(enum avx512_fkind k, const void *p,
                                                                 int64_t i)
{
    if (k == AVX512_F32)
        return _mm512_loadu_ps((const float *)p + i);
    if (k == AVX512_F16)
        return avx512_load_f16((const uint16_t *)p + i);
    return avx512_load_bf16((const uint16_t *)p + i);
}

static inline __attribute__((always_inline)) __m512
avx512_fload_mask(enum avx512_fkind k, __mmask16 m, const void *p, int64_t i)
{
    if (k == AVX512_F32)
        return _mm512_maskz_loadu_ps(m, (const float *)p + i);
    if (k == AVX512_F16)
        return avx512_maskz_load_f16(m, (const uint16_t *)p + i);
    return avx512_maskz_load_bf16(m, (const uint16_t *)p + i);
}

/* Columns [c0, c0 + nc) (nc a multiple of 64) of nr rows against na widened activations ya, onto
 * their accumulators s[row][a][q]. vec_dot's four accumulators are independent chains (s_q takes
 * elements 64 i + 16 q .. + 15), so one quarter at a time is done for all nr x na pairs, which
 * keeps nr * na accumulators in registers and loads each row's and activation's vector once for
 * all of them. */
static inline __attribute__((always_inline)) void
avx512_fg_rows(enum avx512_fkind k, int nr, int na, const char *xr, size_t rb, int64_t c0,
               int64_t nc, float (*ya)[AVX512_FG_COLS], __m512 (*s)[AVX512_FG_NA][4])
{
    const size_t esz = k == AVX512_F32 ? 4 : 2;
    for (int q = 0; q < 4; q++) {
        __m512 t[AVX512_FG_R][AVX512_FG_NA];
        for (int r = 0; r < nr; r++)
            for (int a = 0; a < na; a++)
                t[r][a] = s[r][a][q];
        for (int64_t i = 16 * q; i < nc; i += 64) {
            __m512 x[AVX512_FG_R];
            for (int r = 0; r < nr; r++) {
                if (q == 0) /* the first pass over the chunk brings the rows in */
                    for (size_t b = 0; b < 64 * esz; b += 64)
                        _mm_prefetch(xr + (size_t)r * rb + (size_t)(c0 + i) * esz + b +
                                         AVX512_FG_PREFETCH,
                                     _MM_HINT_T0);
                x[r] = avx512_fload(k, xr + (size_t)r * rb, c0 + i);
            }
            for (int a = 0; a < na; a++) {
                const __m512 v = _mm512_load_ps(ya[a] + i);
                for (int r = 0; r < nr; r++)
                    t[r][a] = _mm512_fmadd_ps(x[r], v, t[r][a]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int a = 0; a < na; a++)
                s[r][a][q] = t[r][a];
    }
}

/* avx512_fg_rows for na known at compile time, nr = AVX512_FG_R or 1. */
static inline __attribute__((always_inline)) void
avx512_fg_block(enum avx512_fkind k, int nr, int na, const char *xr, size_t rb, int64_t c0,
                int64_t nc, float (*ya)[AVX512_FG_COLS], __m512 (*s)[AVX512_FG_NA][4])
{
    if (nr == AVX512_FG_R)
        avx512_fg_rows(k, AVX512_FG_R, na, xr, rb, c0, nc, ya, s);
    else
        avx512_fg_rows(k, 1, na, xr, rb, c0, nc, ya, s);
}

static inline __attribute__((always_inline)) void
avx512_fgemm(enum avx512_fkind k, int64_t n, const void *w, size_t rb, int64_t n_rows,
             const void *act, size_t as, int64_t n_act, float *y, size_t ys)
{
    _Alignas(64) float  ya[AVX512_FG_NA][AVX512_FG_COLS];
    _Alignas(64) __m512 acc[AVX512_FG_ROWS][AVX512_FG_NA][4];
    const int64_t       n64 = n / 64 * 64;
    if (n_act == 1) { /* one activation: vec_dot's row by row streams the rows faster */
        for (int64_t r = 0; r < n_rows; r++) {
            const char *xr = (const char *)w + (size_t)r * rb;
            y[r] = k == AVX512_F32   ? avx512_dot_f32(n, xr, act)
                   : k == AVX512_F16 ? avx512_dot_f16(n, xr, act)
                                     : avx512_dot_bf16(n, xr, act);
        }
        return;
    }
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_FG_NA) {
        const int   na = n_act - j0 < AVX512_FG_NA ? (int)(n_act - j0) : AVX512_FG_NA;
        const char *aj[AVX512_FG_NA];
        for (int a = 0; a < na; a++)
            aj[a] = (const char *)act + (size_t)(j0 + a) * as;
        for (int64_t r0 = 0; r0 < n_rows; r0 += AVX512_FG_ROWS) {
            const int64_t nr = n_rows - r0 < AVX512_FG_ROWS ? n_rows - r0 : AVX512_FG_ROWS;
            for (int64_t r = 0; r < nr; r++)
                for (int a = 0; a < na; a++)
                    for (int q = 0; q < 4; q++)
                        acc[r][a][q] = _mm512_setzero_ps();
            for (int64_t c0 = 0; c0 < n64; c0 += AVX512_FG_COLS) {
                const int64_t nc = n64 - c0 < AVX512_FG_COLS ? n64 - c0 : AVX512_FG_COLS;
                if (r0 == 0 || n64 > AVX512_FG_COLS)
                    for (int a = 0; a < na; a++)
                        for (int64_t i = 0; i < nc; i += 16)
                            _mm512_store_ps(ya[a] + i, avx512_fload(k, aj[a], c0 + i));
                for (int64_t r = 0; r < nr;) {
                    const char *xr = (const char *)w + (size_t)(r0 + r) * rb;
                    const int   rr = nr - r >= AVX512_FG_R ? AVX512_FG_R : 1;
                    switch (na) {
                    case 4:
                        avx512_fg_block(k, rr, 4, xr, rb, c0, nc, ya, acc + r);
                        break;
                    case 3:
                        avx512_fg_block(k, rr, 3, xr, rb, c0, nc, ya, acc + r);
                        break;
                    case 2:
                        avx512_fg_block(k, rr, 2, xr, rb, c0, nc, ya, acc + r);
                        break;
                    default:
                        avx512_fg_block(k, rr, 1, xr, rb, c0, nc, ya, acc + r);
                        break;
                    }
                    r += rr;
                }
            }
            /* vec_dot's end: 16-element steps into s0, the masked tail into s1, the same sum. */
            for (int64_t r = 0; r < nr; r++) {
                const char *xr = (const char *)w + (size_t)(r0 + r) * rb;
                for (int a = 0; a < na; a++) {
                    __m512 *sq = acc[r][a];
                    int64_t i = n64;
                    for (; i + 16 <= n; i += 16)
                        sq[0] = _mm512_fmadd_ps(avx512_fload(k, xr, i), avx512_fload(k, aj[a], i),
                                                sq[0]);
                    if (i < n) {
                        const __mmask16 m = avx512_tail_mask(n - i);
                        sq[1] = _mm512_fmadd_ps(avx512_fload_mask(k, m, xr, i),
                                                avx512_fload_mask(k, m, aj[a], i), sq[1]);
                    }
                    y[(size_t)(j0 + a) * ys + (size_t)(r0 + r)] = avx512_hsum_ps(
                        _mm512_add_ps(_mm512_add_ps(sq[0], sq[1]), _mm512_add_ps(sq[2], sq[3])));
                }
            }
        }
    }
}

static void avx512_gemm_f32(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                            size_t as, int64_t n_act, float *y, size_t ys)
{
    avx512_fgemm(AVX512_F32, n, w, rb, n_rows, act, as, n_act, y, ys);
}

static void avx512_gemm_f16(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                            size_t as, int64_t n_act, float *y, size_t ys)
{
    avx512_fgemm(AVX512_F16, n, w, rb, n_rows, act, as, n_act, y, ys);
}

static void avx512_gemm_bf16(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t as, int64_t n_act, float *y, size_t ys)
{
    avx512_fgemm(AVX512_BF16, n, w, rb, n_rows, act, as, n_act, y, ys);
}

/* ------------------------------------------------------------------------------------------ */
/* Q4_0 x Q8_0                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Weights are read as they lie in memory: one 64-byte load covers a group of three 18-byte blocks
 * (54 bytes; the other 10 meet zero activations). The activation vector is rearranged once per
 * call into the same byte positions (struct avx512_q40_act), so the weights need no shuffle:
 * vpdpbusd multiplies the unsigned nibbles (0..15) by the int8 activations, each int32 lane
 * starting from -8 * (the sum of its activations), which applies Q4_0's offset of 8. A lane holds
 * quants of one block only, so lane sums are exact per-block partial sums; they are scaled in
 * float by that block's d_a (stored per lane) and d_w (picked from the loaded bytes by vpermw).
 * Only the order and grouping of float operations differ from ref.c. Layout of a group:
 *   bytes 0..17 block 0 (d at 0), 18..35 block 1 (d at 18), 36..53 block 2 (d at 36);
 *   lanes 0..4 -> block 0, 5..8 -> block 1, 9..13 -> block 2, 14..15 unused. */
#define AVX512_Q40_GROUP       3   /* blocks per 64-byte weight load */
#define AVX512_Q40_CHUNK       128 /* groups prepared at once (384 blocks, 32 KiB of stack) */
#define AVX512_Q40_NACT        4   /* activations sharing one weight unpack in the matmul kernel */
#define AVX512_Q40_SPAN        16  /* groups summed before each horizontal add (divides CHUNK) */
#define AVX512_Q40_GEMM_CHUNK  32  /* groups prepared at once per activation in the gemm (32 KiB) */
#define AVX512_Q40_GROUP_BYTES (AVX512_Q40_GROUP * 18)
#define AVX512_Q40_PREFETCH    1024 /* bytes ahead of the loads: best of 512..4096 on Zen 4 */
#define AVX512_Q80_PREFETCH    1024 /* Q8_0 matvec, likewise */

struct avx512_q40_act {
    int8_t  lo[64]; /* activation meeting the low nibble of weight byte p; 0 under d and past */
    int8_t  hi[64]; /* activation meeting the high nibble of weight byte p */
    int32_t c[16];  /* per lane: -8 * sum of the lane's lo and hi activations */
    float   da[16]; /* per lane: activation scale of the lane's block; 0 for unused lanes */
};

/* Lane -> block of the group (3: none, whose da is 0). */
static const int32_t k_avx512_q40_lane_blk[16] = {0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3};
/* Word l (< 16): the word of the group holding the d of lane l's block (unused lanes: block 2). */
static const int16_t k_avx512_q40_dw_idx[32] = {0, 0,  0,  0,  0,  9,  9,  9,
                                                9, 18, 18, 18, 18, 18, 18, 18};

/* Rearranges activation blocks y[0..nb) into ceil(nb / 3) groups at g. */
static void avx512_q40_prep(const struct executor_block_q8_0 *y, int64_t nb,
                            struct avx512_q40_act *g)
{
    const __m512i lane_blk = _mm512_loadu_si512(k_avx512_q40_lane_blk);
    const int64_t ng = (nb + AVX512_Q40_GROUP - 1) / AVX512_Q40_GROUP;
    for (int64_t k = 0; k < ng; k++, y += AVX512_Q40_GROUP) {
        const int64_t left = nb - k * AVX512_Q40_GROUP;
        const int     nbk = left < AVX512_Q40_GROUP ? (int)left : AVX512_Q40_GROUP;
        float         d[4] = {0, 0, 0, 0};
        _mm512_store_si512(g[k].lo, _mm512_setzero_si512());
        _mm512_store_si512(g[k].hi, _mm512_setzero_si512());
        for (int j = 0; j < nbk; j++) {
            memcpy(g[k].lo + 18 * j + 2, y[j].qs, 16);
            memcpy(g[k].hi + 18 * j + 2, y[j].qs + 16, 16);
            d[j] = avx512_fp16(y[j].d);
        }
        _mm512_store_ps(g[k].da,
                        _mm512_permutexvar_ps(lane_blk, _mm512_castps128_ps512(_mm_loadu_ps(d))));
    }
    /* second pass, so the byte stores above have left the store buffer */
    const __m512i ones = _mm512_set1_epi8(1);
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t k = 0; k < ng; k++) {
        __m512i s = _mm512_dpbusd_epi32(zero, ones, _mm512_load_si512(g[k].lo));
        s = _mm512_dpbusd_epi32(s, ones, _mm512_load_si512(g[k].hi));
        _mm512_store_si512(g[k].c, _mm512_sub_epi32(zero, _mm512_slli_epi32(s, 3)));
    }
}

/* acc + (lane sums * d_a) * d_w for one group of unpacked weights: the one sequence
 * of operations every Q4_0 kernel below runs per (row, activation, group), so they agree bit for
 * bit. */
static inline __m512 avx512_q40_group(__m512i lo, __m512i hi, __m512 dw,
                                      const struct avx512_q40_act *g, __m512 acc)
{
    __m512i s = _mm512_dpbusd_epi32(_mm512_load_si512(g->c), lo, _mm512_load_si512(g->lo));
    s = _mm512_dpbusd_epi32(s, hi, _mm512_load_si512(g->hi));
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_load_ps(g->da)), dw, acc);
}

/* Unpacks a group's weight bytes: low nibbles, high nibbles, and d_w per lane. */
struct avx512_q40_w {
    __m512i lo, hi;
    __m512  dw;
};

static inline struct avx512_q40_w avx512_q40_unpack(__m512i raw)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i didx = _mm512_loadu_si512(k_avx512_q40_dw_idx);
    return (struct avx512_q40_w){
        .lo = _mm512_and_si512(raw, m4),
        .hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4),
        .dw = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(didx, raw)))};
}

/* Loads group k of a row of nb blocks; the row's last group is loaded with a byte mask so nothing
 * past the row is read. */
static inline __m512i avx512_q40_load(const uint8_t *row, int64_t k, int64_t nb)
{
    const uint8_t *p = row + k * AVX512_Q40_GROUP_BYTES;
    const int64_t  left = nb - k * AVX512_Q40_GROUP;
    if (left > AVX512_Q40_GROUP)
        return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi8((1ull << (18 * left)) - 1, p);
}

/* Sums of one row over groups [k, k + nk) (nk <= AVX512_Q40_SPAN) for NA activations, whose
 * prepared groups are g + j * gs (g already at group k); out[j] = the span's sum.
 * Every kernel sums a row span by span, in order, through this one function, so gemv, gemm and
 * vec_dot agree bit for bit. Groups alternate between two accumulators per activation. NA = 1
 * streams rows from DRAM (matvec): the software prefetch ahead of the loads doubles the rate a core
 * reaches there (the hardware prefetcher alone got about half the bandwidth). */
static inline __attribute__((always_inline)) void avx512_q40_span(const int NA, const uint8_t *row,
                                                                  int64_t k, int64_t nk, int64_t nb,
                                                                  const struct avx512_q40_act *g,
                                                                  size_t gs, float *out)
{
    __m512 acc0[AVX512_Q40_NACT], acc1[AVX512_Q40_NACT];
    for (int j = 0; j < NA; j++)
        acc0[j] = acc1[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nk; i += 2) {
        const uint8_t *p = row + (k + i) * AVX512_Q40_GROUP_BYTES;
        if (NA == 1) {
            _mm_prefetch((const char *)p + AVX512_Q40_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)p + AVX512_Q40_PREFETCH + 64, _MM_HINT_T0);
        }
        const struct avx512_q40_w w0 = avx512_q40_unpack(_mm512_loadu_si512(p));
        const struct avx512_q40_w w1 = avx512_q40_unpack(avx512_q40_load(row, k + i + 1, nb));
        for (int j = 0; j < NA; j++) {
            const struct avx512_q40_act *gj = g + (size_t)j * gs + i;
            acc0[j] = avx512_q40_group(w0.lo, w0.hi, w0.dw, gj, acc0[j]);
            acc1[j] = avx512_q40_group(w1.lo, w1.hi, w1.dw, gj + 1, acc1[j]);
        }
    }
    if (i < nk) {
        const struct avx512_q40_w w0 = avx512_q40_unpack(avx512_q40_load(row, k + i, nb));
        for (int j = 0; j < NA; j++) {
            const struct avx512_q40_act *gj = g + (size_t)j * gs + i;
            acc0[j] = avx512_q40_group(w0.lo, w0.hi, w0.dw, gj, acc0[j]);
        }
    }
    for (int j = 0; j < NA; j++)
        out[j] = avx512_hsum_ps(_mm512_add_ps(acc0[j], acc1[j]));
}

/* Dots of n_rows Q4_0 rows (stride rb) with prepared groups g[0..ng) that start at group k0 of
 * rows of nb blocks. A row's total is its span sums added in order: y[r] = first span's sum, then
 * y[r] + each later one. */
static void avx512_q40_rows(const char *w, size_t rb, int64_t n_rows, int64_t nb, int64_t k0,
                            int64_t ng, const struct avx512_q40_act *g, float *y)
{
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *row = (const uint8_t *)(w + (size_t)r * rb);
        float          v = k0 == 0 ? 0.0f : y[r];
        for (int64_t k = 0; k < ng; k += AVX512_Q40_SPAN) {
            const int64_t nk = ng - k < AVX512_Q40_SPAN ? ng - k : AVX512_Q40_SPAN;
            float         s;
            avx512_q40_span(1, row, k0 + k, nk, nb, g + k, 0, &s);
            v = k0 + k == 0 ? s : v + s;
        }
        y[r] = v;
    }
}

static void avx512_gemv_q4_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             float *y)
{
    _Alignas(64) struct avx512_q40_act g[AVX512_Q40_CHUNK];
    const int64_t                      nb = n / EXECUTOR_QK;
    const int64_t                      ng = (nb + AVX512_Q40_GROUP - 1) / AVX512_Q40_GROUP;
    const struct executor_block_q8_0  *a = act;
    for (int64_t k0 = 0; k0 < ng; k0 += AVX512_Q40_CHUNK) {
        const int64_t nk = ng - k0 < AVX512_Q40_CHUNK ? ng - k0 : AVX512_Q40_CHUNK;
        const int64_t b0 = k0 * AVX512_Q40_GROUP;
        const int64_t nbk = nb - b0 < nk * AVX512_Q40_GROUP ? nb - b0 : nk * AVX512_Q40_GROUP;
        avx512_q40_prep(a + b0, nbk, g);
        avx512_q40_rows(w, rb, n_rows, nb, k0, nk, g, y);
    }
}

static float avx512_dot_q4_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx512_gemv_q4_0(n, w, 0, 1, a, &y);
    return y;
}

/* avx512_q40_rows for NA activations at once (prepared groups g[j * AVX512_Q40_GEMM_CHUNK + k]),
 * each weight group unpacked once for all of them; y[j * ys + r]. Spans run outermost so only one
 * span of the NA activations' tables (16 KiB) is hot in L1 while the rows (in L2: executor_matmul
 * tiles them) pass; whole-row tables overflowed L1 from about 3072 columns. */
static inline __attribute__((always_inline)) void
avx512_q40_rows_multi(const int NA, const char *w, size_t rb, int64_t n_rows, int64_t nb,
                      int64_t k0, int64_t ng, const struct avx512_q40_act *g, float *y, size_t ys)
{
    for (int64_t k = 0; k < ng; k += AVX512_Q40_SPAN) {
        const int64_t nk = ng - k < AVX512_Q40_SPAN ? ng - k : AVX512_Q40_SPAN;
        for (int64_t r = 0; r < n_rows; r++) {
            const uint8_t *row = (const uint8_t *)(w + (size_t)r * rb);
            float          s[AVX512_Q40_NACT];
            avx512_q40_span(NA, row, k0 + k, nk, nb, g + k, AVX512_Q40_GEMM_CHUNK, s);
            for (int j = 0; j < NA; j++) {
                float *yj = y + (size_t)j * ys + r;
                *yj = k0 + k == 0 ? s[j] : *yj + s[j];
            }
        }
    }
}

static void avx512_gemm_q4_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    _Alignas(64) struct avx512_q40_act g[AVX512_Q40_NACT * AVX512_Q40_GEMM_CHUNK];
    const int64_t                      nb = n / EXECUTOR_QK;
    const int64_t                      ng = (nb + AVX512_Q40_GROUP - 1) / AVX512_Q40_GROUP;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_Q40_NACT) {
        const int na = n_act - j0 < AVX512_Q40_NACT ? (int)(n_act - j0) : AVX512_Q40_NACT;
        for (int64_t k0 = 0; k0 < ng; k0 += AVX512_Q40_GEMM_CHUNK) {
            const int64_t nk = ng - k0 < AVX512_Q40_GEMM_CHUNK ? ng - k0 : AVX512_Q40_GEMM_CHUNK;
            const int64_t b0 = k0 * AVX512_Q40_GROUP;
            const int64_t nbk = nb - b0 < nk * AVX512_Q40_GROUP ? nb - b0 : nk * AVX512_Q40_GROUP;
            for (int j = 0; j < na; j++) {
                const struct executor_block_q8_0 *a =
                    (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
                avx512_q40_prep(a + b0, nbk, g + (size_t)j * AVX512_Q40_GEMM_CHUNK);
            }
            float *yj = y + (size_t)j0 * ys;
            switch (na) {
            case 4:
                avx512_q40_rows_multi(4, w, rb, n_rows, nb, k0, nk, g, yj, ys);
                break;
            case 3:
                avx512_q40_rows_multi(3, w, rb, n_rows, nb, k0, nk, g, yj, ys);
                break;
            case 2:
                avx512_q40_rows_multi(2, w, rb, n_rows, nb, k0, nk, g, yj, ys);
                break;
            default:
                avx512_q40_rows_multi(1, w, rb, n_rows, nb, k0, nk, g, yj, ys);
                break;
            }
        }
    }
}

#define AVX512_Q80_NACT 1 /* the dot below serves vec_dot and gemv (the gemm has its own) */

/* Dots of one Q8_0 row x with NA Q8_0 activations y[j] into out[j], two blocks per vector. The
 * weight side (|x|, its sign mask, d_w) is made once for all NA. avx512_gemm_q8_0 computes the
 * same integers another way and runs the same float operations in the same order, so vec_dot and
 * gemm agree bit for bit. */
static inline __attribute__((always_inline)) void
avx512_q8_0_acts(const int NA, int64_t nb, const struct executor_block_q8_0 *x,
                 const struct executor_block_q8_0 *const *y, float *out)
{
    const __m512i zero = _mm512_setzero_si512();
    __m512        acc[AVX512_Q80_NACT];
    for (int a = 0; a < NA; a++)
        acc[a] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) {
        if (NA == 1) {
            _mm_prefetch((const char *)(x + i) + AVX512_Q80_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)(x + i) + AVX512_Q80_PREFETCH + 64, _MM_HINT_T0);
        }
        const __m512i   qx = avx512_load_pair(x[i].qs, x[i + 1].qs);
        const __mmask64 neg = _mm512_movepi8_mask(qx);
        const __m512i   ax = _mm512_abs_epi8(qx);
        const float     dx0 = avx512_fp16(x[i].d), dx1 = avx512_fp16(x[i + 1].d);
        for (int a = 0; a < NA; a++) {
            const struct executor_block_q8_0 *ya = y[a];
            const __m512i                     qy = avx512_load_pair(ya[i].qs, ya[i + 1].qs);
            /* |x| * (sign(x) * y): vpdpbusd wants one unsigned operand */
            const __m512i sy = _mm512_mask_sub_epi8(qy, neg, zero, qy);
            const __m512i v = _mm512_dpbusd_epi32(zero, ax, sy);
            const __m512  d =
                avx512_scale_pair(dx0 * avx512_fp16(ya[i].d), dx1 * avx512_fp16(ya[i + 1].d));
            acc[a] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(v), acc[a]);
        }
    }
    for (int a = 0; a < NA; a++) {
        float sum = avx512_hsum_ps(acc[a]);
        for (int64_t k = i; k < nb; k++) {
            int s = 0;
            for (int j = 0; j < EXECUTOR_QK; j++)
                s += x[k].qs[j] * y[a][k].qs[j];
            const float d = avx512_fp16(x[k].d) * avx512_fp16(y[a][k].d);
            sum = sum + (float)s * d;
        }
        out[a] = sum;
    }
}

static float avx512_dot_q8_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_0 *y[1] = {a};
    float                             out;
    avx512_q8_0_acts(1, n / EXECUTOR_QK, w, y, &out);
    return out;
}

/* The Q8_0 gemm: up to AVX512_Q80G_NA activations per pass over a tile of rows. Each activation's
 * block pairs are prepared once per pass (quants + 128 as unsigned bytes, the two scales in a
 * vector), each row's once per pair for all of them (-128 times its sums of four, its scales), so
 * a (row, activation) pair costs one vpdpbusd, one multiply of scales, one conversion and one FMA
 * per pair of blocks. vpdpbusd over (y + 128, x) started from -128 * sum(x) is sum(x * y) exactly,
 * as vec_dot's |x| * (sign(x) * y); the scales' products are vec_dot's, lane for lane, and the
 * sums and the odd last block run as there: every (row, activation) gets vec_dot's bits. */
#define AVX512_Q80G_NA 8 /* activations per pass */
/* Block pairs of prepared activations per pass (128 KiB for 8, on the stack): whole rows up to
 * 8192 columns, so that rows stream through in order (shorter runs of each row left a batched
 * decode, whose weights come from DRAM, slower than the previous kernel). */
#define AVX512_Q80G_CHUNK 128
#define AVX512_Q80G_ROWS  64 /* rows of a tile whose accumulators persist between chunks */

/* One activation's pair of blocks, prepared for the gemm. */
struct avx512_q80_prep {
    __m512i yu; /* quants + 128 (x ^ 0x80), as unsigned bytes */
    __m512  dy; /* the first block's scale in lanes 0..7, the second's in 8..15 */
};

/* Pairs [p0, p0 + npk) of NA activations ya[] into g[i * NA + a]. */
static void avx512_q80_prep(int NA, const struct executor_block_q8_0 *const *ya, int64_t p0,
                            int64_t npk, struct avx512_q80_prep *g)
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int64_t i = 0; i < npk; i++)
        for (int a = 0; a < NA; a++) {
            const struct executor_block_q8_0 *b = ya[a] + 2 * (p0 + i);
            struct avx512_q80_prep           *q = g + i * NA + a;
            q->yu = _mm512_xor_si512(avx512_load_pair(b[0].qs, b[1].qs), flip);
            q->dy = avx512_scale_pair(avx512_fp16(b[0].d), avx512_fp16(b[1].d));
        }
}

/* Pairs [p0, p0 + npk) of n_rows rows (stride rb) against NA prepared activations, onto
 * acc[r * AVX512_Q80G_NA + a] (zeroed first when p0 is 0). */
static inline __attribute__((always_inline)) void
avx512_q80_rows(const int NA, const char *w, size_t rb, int64_t n_rows, int64_t p0, int64_t npk,
                const struct avx512_q80_prep *g, __m512 *acc)
{
    const __m512i m128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < n_rows; r++) {
        const struct executor_block_q8_0 *x =
            (const struct executor_block_q8_0 *)(w + (size_t)r * rb) + 2 * p0;
        __m512 s[AVX512_Q80G_NA];
        for (int a = 0; a < NA; a++)
            s[a] = p0 == 0 ? _mm512_setzero_ps() : acc[r * AVX512_Q80G_NA + a];
        for (int64_t i = 0; i < npk; i++, x += 2) {
            const __m512i qx = avx512_load_pair(x[0].qs, x[1].qs);
            /* -128 * (the sum of each four of x): vpdpbusd's start, so that (y + 128) . x is x . y
             */
            const __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, m128, qx));
            const __m512  dx = avx512_scale_pair(avx512_fp16(x[0].d), avx512_fp16(x[1].d));
            const struct avx512_q80_prep *q = g + i * NA;
            for (int a = 0; a < NA; a++) {
                const __m512i v = _mm512_dpbusd_epi32(corr, q[a].yu, qx);
                s[a] = _mm512_fmadd_ps(_mm512_mul_ps(dx, q[a].dy), _mm512_cvtepi32_ps(v), s[a]);
            }
        }
        for (int a = 0; a < NA; a++)
            acc[r * AVX512_Q80G_NA + a] = s[a];
    }
}

static void avx512_gemm_q8_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    _Alignas(64) struct avx512_q80_prep g[AVX512_Q80G_CHUNK * AVX512_Q80G_NA];
    _Alignas(64) __m512                 acc[AVX512_Q80G_ROWS * AVX512_Q80G_NA];
    const int64_t                       nb = n / EXECUTOR_QK, npairs = nb / 2;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_Q80G_NA) {
        const int na = n_act - j0 < AVX512_Q80G_NA ? (int)(n_act - j0) : AVX512_Q80G_NA;
        const struct executor_block_q8_0 *ya[AVX512_Q80G_NA];
        for (int a = 0; a < na; a++)
            ya[a] = (const void *)((const char *)act + (size_t)(j0 + a) * act_stride);
        for (int64_t r0 = 0; r0 < n_rows; r0 += AVX512_Q80G_ROWS) {
            const int64_t nr = n_rows - r0 < AVX512_Q80G_ROWS ? n_rows - r0 : AVX512_Q80G_ROWS;
            const char   *wr = (const char *)w + (size_t)r0 * rb;
            for (int64_t p0 = 0; p0 < npairs; p0 += AVX512_Q80G_CHUNK) {
                const int64_t npk =
                    npairs - p0 < AVX512_Q80G_CHUNK ? npairs - p0 : AVX512_Q80G_CHUNK;
                if (r0 == 0 || npairs > AVX512_Q80G_CHUNK)
                    avx512_q80_prep(na, ya, p0, npk, g);
                switch (na) {
                case 8:
                    avx512_q80_rows(8, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 7:
                    avx512_q80_rows(7, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 6:
                    avx512_q80_rows(6, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 5:
                    avx512_q80_rows(5, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 4:
                    avx512_q80_rows(4, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 3:
                    avx512_q80_rows(3, wr, rb, nr, p0, npk, g, acc);
                    break;
                case 2:
                    avx512_q80_rows(2, wr, rb, nr, p0, npk, g, acc);
                    break;
                default:
                    avx512_q80_rows(1, wr, rb, nr, p0, npk, g, acc);
                    break;
                }
            }
            /* The sums and the odd last block, as vec_dot's. */
            for (int64_t r = 0; r < nr; r++) {
                const struct executor_block_q8_0 *x = (const void *)(wr + (size_t)r * rb);
                for (int a = 0; a < na; a++) {
                    float sum = npairs ? avx512_hsum_ps(acc[r * AVX512_Q80G_NA + a])
                                       : avx512_hsum_ps(_mm512_setzero_ps());
                    for (int64_t k = 2 * npairs; k < nb; k++) {
                        int t = 0;
                        for (int j = 0; j < EXECUTOR_QK; j++)
                            t += x[k].qs[j] * ya[a][k].qs[j];
                        const float d = avx512_fp16(x[k].d) * avx512_fp16(ya[a][k].d);
                        sum = sum + (float)t * d;
                    }
                    y[(size_t)(j0 + a) * ys + (size_t)(r0 + r)] = sum;
                }
            }
        }
    }
}

/* Bytes ahead of the loads that the K-quant dots prefetch (rows stream from DRAM in matvec; the
 * hardware prefetcher alone left much of the bandwidth unused). Reading past a row is harmless:
 * a prefetch never faults. */
#ifndef AVX512_K_PREFETCH
#define AVX512_K_PREFETCH 1024
#endif

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

#define AVX512_Q4K_NACT 4 /* activations sharing one weight unpack in the Q4_K/Q5_K gemm */

_Static_assert(offsetof(struct executor_block_q5_K, d) == offsetof(struct executor_block_q4_K, d) &&
                   offsetof(struct executor_block_q5_K, dmin) ==
                       offsetof(struct executor_block_q4_K, dmin) &&
                   offsetof(struct executor_block_q5_K, scales) ==
                       offsetof(struct executor_block_q4_K, scales),
               "avx512_k45_acts reads Q5_K's d, dmin and scales at Q4_K's offsets");

/* Dots of one Q4_K (Q5 = 0) or Q5_K (Q5 = 1) row x with NA Q8_K activations y[j] into out[j]. The
 * weight unpack (scales, nibbles and Q5_K's 5th bits, per-lane scale vectors) is done once for all
 * NA; each activation then runs the same operations in the same order whatever NA is, so vec_dot
 * (NA = 1) and gemm agree bit for bit. NA = 1 streams the row from DRAM (matvec) and prefetches
 * ahead. Q5_K: chunk j takes bit 2j of qh[l] for its first 32 elements and bit 2j+1 for the next
 * 32, so one vptestmb of qh (both halves) against those bits gives the byte mask that adds 16;
 * quants are then 0..31, so maddubs pairs stay within int16. The two blocks share d, dmin and the
 * scales at the same offsets. */
static inline __attribute__((always_inline)) void
avx512_k45_acts(const int Q5, const int NA, int64_t nb, const void *xv,
                const struct executor_block_q8_K *const *y, float *out)
{
    const size_t bs = Q5 ? sizeof(struct executor_block_q5_K) : sizeof(struct executor_block_q4_K);
    const size_t qs_off =
        Q5 ? offsetof(struct executor_block_q5_K, qs) : offsetof(struct executor_block_q4_K, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    __m512i       idx[4], hsel[4];
    for (int j = 0; j < 4; j++) {
        idx[j] = _mm512_loadu_si512(k_avx512_q4k_idx[j]);
        hsel[j] = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * j))),
                                     _mm256_set1_epi8((char)(1 << (2 * j + 1))), 1);
    }
    __m512 acc[AVX512_Q4K_NACT];
    __m256 accm[AVX512_Q4K_NACT];
    for (int a = 0; a < NA; a++) {
        acc[a] = _mm512_setzero_ps();
        accm[a] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *b = (const uint8_t *)xv + (size_t)i * bs;
        if (NA == 1) {
            const char *pf = (const char *)b + AVX512_K_PREFETCH;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            _mm_prefetch(pf + 128, _MM_HINT_T0);
        }
        uint8_t  sc[8], mn[8];
        uint16_t dh, dmh;
        memcpy(&dh, b + offsetof(struct executor_block_q4_K, d), sizeof(dh));
        memcpy(&dmh, b + offsetof(struct executor_block_q4_K, dmin), sizeof(dmh));
        avx512_k4_scales(b + offsetof(struct executor_block_q4_K, scales), sc, mn);
        const float xd = avx512_fp16(dh);
        const float xdmin = avx512_fp16(dmh);
        /* mins as 16 words, each twice: madd with the 16 bsums gives mn[j] * (bsums[2j] +
         * bsums[2j+1]) in int32 lane j */
        const __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);
        const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        const __m512i sc16 =
            _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        __m512i qh = _mm512_setzero_si512();
        if (Q5)
            qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(
                (const __m256i *)(b + offsetof(struct executor_block_q5_K, qh))));
        __m512i q[4], s16[4];
        for (int j = 0; j < 4; j++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(b + qs_off + 32 * j));
            q[j] = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(w), _mm256_srli_epi16(w, 4), 1), m4);
            if (Q5)
                q[j] = _mm512_mask_add_epi8(q[j], _mm512_test_epi8_mask(qh, hsel[j]), q[j], b4);
            s16[j] = _mm512_permutexvar_epi16(idx[j], sc16);
        }
        for (int a = 0; a < NA; a++) {
            const struct executor_block_q8_K *ya = y[a] + i;
            const __m256i                     pm =
                _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)ya->bsums), m16);
            accm[a] =
                _mm256_fmadd_ps(_mm256_set1_ps(xdmin * ya->d), _mm256_cvtepi32_ps(pm), accm[a]);
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < 4; j++) {
                const __m512i p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(ya->qs + 64 * j));
                sumi = _mm512_dpwssd_epi32(sumi, p, s16[j]);
            }
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(xd * ya->d), _mm512_cvtepi32_ps(sumi), acc[a]);
        }
    }
    for (int a = 0; a < NA; a++)
        out[a] = avx512_hsum_ps(acc[a]) - avx512_hsum_ps256(accm[a]);
}

static float avx512_dot_q4_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_K *y[1] = {a};
    float                             out;
    avx512_k45_acts(0, 1, n / EXECUTOR_QK_K, w, y, &out);
    return out;
}

static float avx512_dot_q5_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_K *y[1] = {a};
    float                             out;
    avx512_k45_acts(1, 1, n / EXECUTOR_QK_K, w, y, &out);
    return out;
}

/* The Q4_K (Q5 = 0) and Q5_K gemm: AVX512_Q4K_NACT activations share each row's unpack. */
static inline __attribute__((always_inline)) void
avx512_gemm_k45(const int Q5, int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    const int64_t nb = n / EXECUTOR_QK_K;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_Q4K_NACT) {
        const int na = n_act - j0 < AVX512_Q4K_NACT ? (int)(n_act - j0) : AVX512_Q4K_NACT;
        const struct executor_block_q8_K *ya[AVX512_Q4K_NACT];
        for (int j = 0; j < na; j++)
            ya[j] = (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
        for (int64_t r = 0; r < n_rows; r++) {
            const void *x = (const char *)w + (size_t)r * rb;
            float       out[AVX512_Q4K_NACT] = {0};
            switch (na) {
            case 4:
                avx512_k45_acts(Q5, 4, nb, x, ya, out);
                break;
            case 3:
                avx512_k45_acts(Q5, 3, nb, x, ya, out);
                break;
            case 2:
                avx512_k45_acts(Q5, 2, nb, x, ya, out);
                break;
            default:
                avx512_k45_acts(Q5, 1, nb, x, ya, out);
                break;
            }
            for (int j = 0; j < na; j++)
                y[(size_t)(j0 + j) * ys + (size_t)r] = out[j];
        }
    }
}

static void avx512_gemm_q4_K(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    avx512_gemm_k45(0, n, w, rb, n_rows, act, act_stride, n_act, y, ys);
}

static void avx512_gemm_q5_K(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    avx512_gemm_k45(1, n, w, rb, n_rows, act, act_stride, n_act, y, ys);
}

#define AVX512_Q6K_NACT 4 /* activations sharing one weight unpack in the Q6_K matmul kernel */

/* Dots of one Q6_K row x with NA Q8_K activations y[j] into out[j]; weights unpacked once for all
 * NA, and each activation runs the same operations whatever NA is (vec_dot is NA = 1), as for
 * Q4_K. The +32 offset of the quants is removed in the integer lanes: 32 * scale * bsum per group
 * of 16 is subtracted from the first 8 lanes before the one conversion per block. */
static inline __attribute__((always_inline)) void
avx512_q6_K_acts(const int NA, int64_t nb, const struct executor_block_q6_K *x,
                 const struct executor_block_q8_K *const *y, float *out)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m3 = _mm512_set1_epi8(0x03);
    __m512i       idx[4];
    for (int k = 0; k < 4; k++)
        idx[k] = _mm512_loadu_si512(k_avx512_q6k_idx[k]);
    __m512 acc[AVX512_Q6K_NACT];
    for (int a = 0; a < NA; a++)
        acc[a] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        if (NA == 1) {
            const char *pf = (const char *)(x + i) + AVX512_K_PREFETCH;
            _mm_prefetch(pf, _MM_HINT_T0);
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            _mm_prefetch(pf + 128, _MM_HINT_T0);
        }
        const float   xd = avx512_fp16(x[i].d);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        const __m512i sc16 = _mm512_castsi256_si512(s16);
        __m512i       q[4], s[4];
        for (int c = 0; c < 2; c++) {
            const __m512i l = _mm512_loadu_si512(x[i].ql + 64 * c);
            const __m256i h = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * c));
            const __m512i h01 =
                _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
            const __m512i h23 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_srli_epi16(h, 4)),
                                                   _mm256_srli_epi16(h, 6), 1);
            q[2 * c] = _mm512_or_si512(_mm512_and_si512(l, m4),
                                       _mm512_slli_epi16(_mm512_and_si512(h01, m3), 4));
            q[2 * c + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                           _mm512_slli_epi16(_mm512_and_si512(h23, m3), 4));
            s[2 * c] = _mm512_permutexvar_epi16(idx[2 * c], sc16);
            s[2 * c + 1] = _mm512_permutexvar_epi16(idx[2 * c + 1], sc16);
        }
        for (int a = 0; a < NA; a++) {
            const struct executor_block_q8_K *ya = y[a] + i;
            /* quants are stored +32: start from -32 * scale * bsum (8 lanes of pairs) */
            const __m256i corr =
                _mm256_madd_epi16(s16, _mm256_loadu_si256((const __m256i *)ya->bsums));
            __m512i sumi = _mm512_castsi256_si512(
                _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5)));
            sumi = _mm512_maskz_mov_epi32(0x00FF, sumi);
            for (int k = 0; k < 4; k++) {
                const __m512i p = _mm512_maddubs_epi16(q[k], _mm512_loadu_si512(ya->qs + 64 * k));
                sumi = _mm512_dpwssd_epi32(sumi, p, s[k]);
            }
            acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(xd * ya->d), _mm512_cvtepi32_ps(sumi), acc[a]);
        }
    }
    for (int a = 0; a < NA; a++)
        out[a] = avx512_hsum_ps(acc[a]);
}

static float avx512_dot_q6_K(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q8_K *y[1] = {a};
    float                             out;
    avx512_q6_K_acts(1, n / EXECUTOR_QK_K, w, y, &out);
    return out;
}

static void avx512_gemm_q6_K(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                             size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    const int64_t nb = n / EXECUTOR_QK_K;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_Q6K_NACT) {
        const int na = n_act - j0 < AVX512_Q6K_NACT ? (int)(n_act - j0) : AVX512_Q6K_NACT;
        const struct executor_block_q8_K *ya[AVX512_Q6K_NACT];
        for (int j = 0; j < na; j++)
            ya[j] = (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
        for (int64_t r = 0; r < n_rows; r++) {
            const struct executor_block_q6_K *x = (const void *)((const char *)w + (size_t)r * rb);
            float                             out[AVX512_Q6K_NACT] = {0};
            switch (na) {
            case 4:
                avx512_q6_K_acts(4, nb, x, ya, out);
                break;
            case 3:
                avx512_q6_K_acts(3, nb, x, ya, out);
                break;
            case 2:
                avx512_q6_K_acts(2, nb, x, ya, out);
                break;
            default:
                avx512_q6_K_acts(1, nb, x, ya, out);
                break;
            }
            for (int j = 0; j < na; j++)
                y[(size_t)(j0 + j) * ys + (size_t)r] = out[j];
        }
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Q4_1 x Q8_1, Q5_0 x Q8_0, Q5_1 x Q8_1                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Two blocks per vector, in element order: bytes 0..31 block i, 32..63 block i + 1, so the Q8
 * quants of the pair load as they lie and the 5th bits of the pair (qh, bit j = element j) are
 * a 64-bit byte mask as they lie. vpdpbusd multiplies the unsigned 4/5-bit quants by the int8
 * activations; lanes 0..7 hold block i, 8..15 block i + 1, each an exact integer sum, scaled in
 * float. An odd last block runs as a pair with itself whose second scale is 0 (the integer lanes
 * are finite, so they add exactly 0). Q4_1/Q5_1 add m * s per block in float, as ref.c does. */
#define AVX512_B32_PREFETCH 1024 /* bytes ahead of the weight loads, as the Q8_0 dot */

/* The 32 nibbles of each of two 16-byte quant arrays, in element order (low nibbles first). */
static inline __m512i avx512_nibbles_pair(const uint8_t *q0, const uint8_t *q1)
{
    const __m256i b =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q0)),
                                _mm_loadu_si128((const __m128i *)q1), 1);
    /* 128-bit lanes q0, q0, q1, q1; the odd ones shifted right by 4 */
    const __m512i d = _mm512_shuffle_i64x2(_mm512_castsi256_si512(b), _mm512_castsi256_si512(b),
                                           _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i sh = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    return _mm512_and_si512(_mm512_srlv_epi64(d, sh), _mm512_set1_epi8(0x0F));
}

/* The 5th bits of two blocks as a byte mask (bit j: element j of the pair). */
static inline __mmask64 avx512_qh_pair(const uint8_t *h0, const uint8_t *h1)
{
    uint32_t u0, u1;
    memcpy(&u0, h0, sizeof(u0));
    memcpy(&u1, h1, sizeof(u1));
    return (__mmask64)((uint64_t)u0 | ((uint64_t)u1 << 32));
}

static float avx512_dot_q4_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q4_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    const __m512i                     zero = _mm512_setzero_si512();
    __m512                            acc = _mm512_setzero_ps();
    float                             summs = 0;
    for (int64_t i = 0; i < nb; i += 2) {
        _mm_prefetch((const char *)(x + i) + AVX512_B32_PREFETCH, _MM_HINT_T0);
        const int64_t j = i + 1 < nb ? i + 1 : i; /* second block of the pair */
        const __m512i qx = avx512_nibbles_pair(x[i].qs, x[j].qs);
        const __m512i qy = avx512_load_pair(y[i].qs, y[j].qs);
        const float   d1 = j > i ? avx512_fp16(x[j].d) * avx512_fp16(y[j].d) : 0.0f;
        const __m512  d = avx512_scale_pair(avx512_fp16(x[i].d) * avx512_fp16(y[i].d), d1);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, qx, qy)), acc);
        summs += avx512_fp16(x[i].m) * avx512_fp16(y[i].s);
        if (j > i)
            summs += avx512_fp16(x[j].m) * avx512_fp16(y[j].s);
    }
    return avx512_hsum_ps(acc) + summs;
}

static float avx512_dot_q5_0(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_0 *x = w;
    const struct executor_block_q8_0 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    const __m512i                     zero = _mm512_setzero_si512();
    const __m512i                     b4 = _mm512_set1_epi8(0x10);
    __m512                            acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i += 2) {
        _mm_prefetch((const char *)(x + i) + AVX512_B32_PREFETCH, _MM_HINT_T0);
        const int64_t j = i + 1 < nb ? i + 1 : i;
        /* q = (nibble + 16 * bit) - 16: the unsigned 5-bit value times y, less 16 * sum(y) */
        const __m512i q5 = avx512_nibbles_pair(x[i].qs, x[j].qs);
        const __m512i qx = _mm512_mask_add_epi8(q5, avx512_qh_pair(x[i].qh, x[j].qh), q5, b4);
        const __m512i qy = avx512_load_pair(y[i].qs, y[j].qs);
        const __m512i s =
            _mm512_sub_epi32(_mm512_dpbusd_epi32(zero, qx, qy), _mm512_dpbusd_epi32(zero, b4, qy));
        const float  d1 = j > i ? avx512_fp16(x[j].d) * avx512_fp16(y[j].d) : 0.0f;
        const __m512 d = avx512_scale_pair(avx512_fp16(x[i].d) * avx512_fp16(y[i].d), d1);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc);
    }
    return avx512_hsum_ps(acc);
}

static float avx512_dot_q5_1(int64_t n, const void *w, const void *a)
{
    const struct executor_block_q5_1 *x = w;
    const struct executor_block_q8_1 *y = a;
    const int64_t                     nb = n / EXECUTOR_QK;
    const __m512i                     zero = _mm512_setzero_si512();
    const __m512i                     b4 = _mm512_set1_epi8(0x10);
    __m512                            acc = _mm512_setzero_ps();
    float                             summs = 0;
    for (int64_t i = 0; i < nb; i += 2) {
        _mm_prefetch((const char *)(x + i) + AVX512_B32_PREFETCH, _MM_HINT_T0);
        const int64_t j = i + 1 < nb ? i + 1 : i;
        const __m512i q4 = avx512_nibbles_pair(x[i].qs, x[j].qs);
        const __m512i qx = _mm512_mask_add_epi8(q4, avx512_qh_pair(x[i].qh, x[j].qh), q4, b4);
        const __m512i qy = avx512_load_pair(y[i].qs, y[j].qs);
        const float   d1 = j > i ? avx512_fp16(x[j].d) * avx512_fp16(y[j].d) : 0.0f;
        const __m512  d = avx512_scale_pair(avx512_fp16(x[i].d) * avx512_fp16(y[i].d), d1);
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(zero, qx, qy)), acc);
        summs += avx512_fp16(x[i].m) * avx512_fp16(y[i].s);
        if (j > i)
            summs += avx512_fp16(x[j].m) * avx512_fp16(y[j].s);
    }
    return avx512_hsum_ps(acc) + summs;
}

/* ------------------------------------------------------------------------------------------ */
/* Ternary x Q8_K                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* The ternary kernels give llama.cpp's x86 bits (ref.c): 8 int32 lanes, lane k holding the
 * unsigned quants (0..2, TQ2_0 0..3) times the activations of elements 32g + 4k .. 32g + 4k + 3 of
 * every 32-element group g, minus the Q8_K bsums 2k and 2k + 1; one FMA per lane and block by
 * d_a * d_w; ggml's hsum_float_8 at the end. vpdpbusd puts bytes 4m .. 4m + 3 into int32 lane m,
 * so a 64-byte product whose halves each hold whole 32-element groups gives lane k in lanes k and
 * k + 8. The matvecs (and vec_dot, their one-row case) prepare the activations per call in the
 * order the weight bytes come out of one load; the gemm takes activations in pairs. */

/* ggml's hsum_float_8: (l0 + l4 + (l2 + l6)) + (l1 + l5 + (l3 + l7)). */
static inline float avx512_hsum_ps_ggml(__m256 v)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline __m128i avx512_tq1_times3_128(__m128i x)
{
    return _mm_add_epi8(x, _mm_add_epi8(x, x));
}

/* The top trit (0..2) of each byte. */
static inline __m512i avx512_tq1_top_trit(__m512i q)
{
    const __m512i one = _mm512_set1_epi8(1);
    const __m512i t = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(86)), one);
    return _mm512_mask_add_epi8(t, _mm512_cmpge_epu8_mask(q, _mm512_set1_epi8((char)171)), t, one);
}

/* TQ1_0 matvec (and vec_dot, one row of it). A block's 48 qs bytes and its qh word, in every dword
 * of the last 16 bytes, form V_0 = [qs[0..31], qs[32..47], qh qh qh qh]; V_k = 3^k V_0 (byte-wise,
 * mod 256) holds y_k = (byte * 3^k) mod 256 for each byte, and 3 y_k = 256 t_k + y_{k+1} where t_k
 * is the byte's trit k (kimpl_tq1_trit). So the dot of the trits t_k with activations A_k is
 * (3 (V_k . A_k) - V_{k+1} . A_k) / 256: two vpdpbusd on the bytes themselves, exact in int32, and
 * no trit is extracted. The activations are prepared per call: A_k holds elements 32k .. 32k + 31
 * (trit k of qs[0..31]), 160 + 16k .. 175 + 16k (trit k of qs[32..47]) and, in dword k of the last
 * 16 bytes, 240 + 4k .. 243 + 4k (trit k of qh; the other dwords 0). Int32 lane m then holds part
 * of llama.cpp's lane m % 8, except lanes 8..11 of odd k (elements 176 .. 191 and 208 .. 223),
 * which belong to lanes 4..7: odd and even k sum apart and are joined lane by lane. */
#define AVX512_TQ1_CHUNK 64 /* blocks of prepared activations (24 KiB) */
/* Bytes ahead of the loads that the ternary matvecs prefetch: 2048..4096 reached 28 GB/s of
 * TQ2_0 rows on two threads here (the streaming limit), 1024 24.6. */
#ifndef AVX512_TQ_PREFETCH
#define AVX512_TQ_PREFETCH 3072
#endif
#define AVX512_TQ1_ROWS 64 /* rows whose accumulators persist between chunks of longer rows */

struct avx512_tq1_act {
    int8_t  a[5][64]; /* A_k */
    int32_t c[16];    /* (bsums[2k] + bsums[2k + 1]) * 256 in lane k (k < 8), 0 in lanes 8..15 */
};

static void avx512_tq1_prep(const struct executor_block_q8_K *y, int64_t nb,
                            struct avx512_tq1_act *g, float *d)
{
    for (int64_t i = 0; i < nb; i++) {
        for (int k = 0; k < 5; k++) {
            memcpy(g[i].a[k], y[i].qs + 32 * k, 32);
            memcpy(g[i].a[k] + 32, y[i].qs + 160 + 16 * k, 16);
            memset(g[i].a[k] + 48, 0, 16);
            if (k < 4)
                memcpy(g[i].a[k] + 48 + 4 * k, y[i].qs + 240 + 4 * k, 4);
        }
        for (int k = 0; k < 16; k++)
            g[i].c[k] = k < 8 ? (y[i].bsums[2 * k] + y[i].bsums[2 * k + 1]) * 256 : 0;
        d[i] = y[i].d;
    }
}

static inline __m512i avx512_times3(__m512i x)
{
    return _mm512_add_epi8(x, _mm512_add_epi8(x, x));
}

/* Blocks [0, nb) of one row with prepared activations g, da onto acc (llama.cpp's 8 lanes). */
static inline __m256 avx512_tq1_row(const struct executor_block_tq1_0 *x, int64_t nb,
                                    const struct avx512_tq1_act *g, const float *da, __m256 acc)
{
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t i = 0; i < nb; i++) {
        _mm_prefetch((const char *)(x + i) + AVX512_TQ_PREFETCH, _MM_HINT_T0);
        uint32_t qh;
        memcpy(&qh, x[i].qh, sizeof(qh));
        __m512i v[6];
        v[0] = _mm512_mask_set1_epi32(_mm512_maskz_loadu_epi8(0x0000FFFFFFFFFFFFull, x[i].qs),
                                      0xF000, (int)qh);
        for (int k = 1; k < 6; k++)
            v[k] = avx512_times3(v[k - 1]);
        const struct avx512_tq1_act *a = g + i;
        __m512i                      p1e = zero, p1o = zero, p2o = zero;
        __m512i                      p2e = _mm512_load_si512(a->c);
        for (int k = 0; k < 5; k++) {
            const __m512i ak = _mm512_load_si512(a->a[k]);
            if (k % 2 == 0) {
                p1e = _mm512_dpbusd_epi32(p1e, v[k], ak);
                p2e = _mm512_dpbusd_epi32(p2e, v[k + 1], ak);
            } else {
                p1o = _mm512_dpbusd_epi32(p1o, v[k], ak);
                p2o = _mm512_dpbusd_epi32(p2o, v[k + 1], ak);
            }
        }
        /* (3 p1 - p2) per parity; odd k's lanes 8..11 join lanes 12..15 (llama.cpp's 4..7) */
        const __m512i e = _mm512_sub_epi32(_mm512_add_epi32(p1e, _mm512_add_epi32(p1e, p1e)), p2e);
        const __m512i o = _mm512_sub_epi32(_mm512_add_epi32(p1o, _mm512_add_epi32(p1o, p1o)), p2o);
        const __m512i o2 = _mm512_mask_add_epi32(
            o, 0xF000, o, _mm512_shuffle_i64x2(o, o, _MM_SHUFFLE(2, 3, 1, 0)));
        const __m512i s = _mm512_mask_add_epi32(e, 0xF0FF, e, o2);
        const __m256i l = _mm256_srai_epi32(
            _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1)), 8);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(da[i] * avx512_fp16(x[i].d)),
                              acc);
    }
    return acc;
}

static void avx512_gemv_tq1_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              float *y)
{
    _Alignas(64) struct avx512_tq1_act g[AVX512_TQ1_CHUNK];
    float                              da[AVX512_TQ1_CHUNK];
    __m256                             acc[AVX512_TQ1_ROWS];
    const int64_t                      nb = n / EXECUTOR_QK_K;
    const struct executor_block_q8_K  *a = act;
    if (nb <= AVX512_TQ1_CHUNK) {
        avx512_tq1_prep(a, nb, g, da);
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = avx512_hsum_ps_ggml(avx512_tq1_row(
                (const void *)((const char *)w + (size_t)r * rb), nb, g, da, _mm256_setzero_ps()));
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += AVX512_TQ1_ROWS) {
        const int64_t nr = n_rows - r0 < AVX512_TQ1_ROWS ? n_rows - r0 : AVX512_TQ1_ROWS;
        for (int64_t r = 0; r < nr; r++)
            acc[r] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < nb; k0 += AVX512_TQ1_CHUNK) {
            const int64_t nk = nb - k0 < AVX512_TQ1_CHUNK ? nb - k0 : AVX512_TQ1_CHUNK;
            avx512_tq1_prep(a + k0, nk, g, da);
            for (int64_t r = 0; r < nr; r++) {
                const struct executor_block_tq1_0 *x =
                    (const void *)((const char *)w + (size_t)(r0 + r) * rb);
                acc[r] = avx512_tq1_row(x + k0, nk, g, da, acc[r]);
            }
        }
        for (int64_t r = 0; r < nr; r++)
            y[r0 + r] = avx512_hsum_ps_ggml(acc[r]);
    }
}

static float avx512_dot_tq1_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx512_gemv_tq1_0(n, w, 0, 1, a, &y);
    return y;
}

/* TQ2_0 matvec (and vec_dot, one row of it): the block's 64 qs bytes in one load, shifted right by
 * 2k bits and masked, are the quants of elements 32k + m (bytes m < 32) and 128 + 32k + m (bytes
 * 32 + m); the activations are prepared per call in that order, A_k = [32k .. 32k + 31, 128 + 32k
 * .. 159 + 32k], so int32 lanes m and m + 8 both hold parts of llama.cpp's lane m. */
#define AVX512_TQ2_CHUNK 64 /* blocks of prepared activations (20 KiB) */
#define AVX512_TQ2_ROWS  64 /* rows whose accumulators persist between chunks of longer rows */

struct avx512_tq2_act {
    int8_t  a[4][64]; /* A_k */
    int32_t c[16];    /* -(bsums[2k] + bsums[2k + 1]) in lane k (k < 8), 0 in lanes 8..15 */
};

static void avx512_tq2_prep(const struct executor_block_q8_K *y, int64_t nb,
                            struct avx512_tq2_act *g, float *d)
{
    for (int64_t i = 0; i < nb; i++) {
        for (int k = 0; k < 4; k++)
            _mm512_store_si512(g[i].a[k],
                               avx512_load_pair(y[i].qs + 32 * k, y[i].qs + 128 + 32 * k));
        for (int k = 0; k < 16; k++)
            g[i].c[k] = k < 8 ? -(y[i].bsums[2 * k] + y[i].bsums[2 * k + 1]) : 0;
        d[i] = y[i].d;
    }
}

/* Blocks [0, nb) of one row with prepared activations g, da onto acc (llama.cpp's 8 lanes). */
static inline __m256 avx512_tq2_row(const struct executor_block_tq2_0 *x, int64_t nb,
                                    const struct avx512_tq2_act *g, const float *da, __m256 acc)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++) {
        const char *pf = (const char *)(x + i) + AVX512_TQ_PREFETCH;
        _mm_prefetch(pf, _MM_HINT_T0);
        _mm_prefetch(pf + 64, _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(x[i].qs);
        __m512i       s = _mm512_load_si512(g[i].c);
        s = _mm512_dpbusd_epi32(s, _mm512_and_si512(v, m3), _mm512_load_si512(g[i].a[0]));
        s = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(v, 2), m3),
                                _mm512_load_si512(g[i].a[1]));
        s = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(v, 4), m3),
                                _mm512_load_si512(g[i].a[2]));
        s = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(v, 6), m3),
                                _mm512_load_si512(g[i].a[3]));
        const __m256i l =
            _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_set1_ps(da[i] * avx512_fp16(x[i].d)),
                              acc);
    }
    return acc;
}

static void avx512_gemv_tq2_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              float *y)
{
    _Alignas(64) struct avx512_tq2_act g[AVX512_TQ2_CHUNK];
    float                              da[AVX512_TQ2_CHUNK];
    __m256                             acc[AVX512_TQ2_ROWS];
    const int64_t                      nb = n / EXECUTOR_QK_K;
    const struct executor_block_q8_K  *a = act;
    if (nb <= AVX512_TQ2_CHUNK) {
        avx512_tq2_prep(a, nb, g, da);
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = avx512_hsum_ps_ggml(avx512_tq2_row(
                (const void *)((const char *)w + (size_t)r * rb), nb, g, da, _mm256_setzero_ps()));
        return;
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += AVX512_TQ2_ROWS) {
        const int64_t nr = n_rows - r0 < AVX512_TQ2_ROWS ? n_rows - r0 : AVX512_TQ2_ROWS;
        for (int64_t r = 0; r < nr; r++)
            acc[r] = _mm256_setzero_ps();
        for (int64_t k0 = 0; k0 < nb; k0 += AVX512_TQ2_CHUNK) {
            const int64_t nk = nb - k0 < AVX512_TQ2_CHUNK ? nb - k0 : AVX512_TQ2_CHUNK;
            avx512_tq2_prep(a + k0, nk, g, da);
            for (int64_t r = 0; r < nr; r++) {
                const struct executor_block_tq2_0 *x =
                    (const void *)((const char *)w + (size_t)(r0 + r) * rb);
                acc[r] = avx512_tq2_row(x + k0, nk, g, da, acc[r]);
            }
        }
        for (int64_t r = 0; r < nr; r++)
            y[r0 + r] = avx512_hsum_ps_ggml(acc[r]);
    }
}

static float avx512_dot_tq2_0(int64_t n, const void *w, const void *a)
{
    float y;
    avx512_gemv_tq2_0(n, w, 0, 1, a, &y);
    return y;
}

/* The ternary gemm: several activations per pass over a tile of rows, each weight block unpacked
 * once for all of them. Activations go in pairs (a, b): chunk c (elements 32c .. 32c + 31) of a and
 * of b share one vector, and the weights' chunk c, unpacked into both halves of a vector, meets
 * both in one vpdpbusd that leaves a's 8 lanes in int32 lanes 0..7 and b's in 8..15: llama.cpp's
 * lanes with no halves to add. A pair starts from its bsum terms, is scaled by (d_a, d_b) * d_w
 * with one FMA per lane and block and summed as ggml's hsum_float_8, so each (row, activation)
 * gets the operations of vec_dot, in its order, and its bits. */
#define AVX512_TQ_NPAIR 4  /* activation pairs (8 activations) sharing one weight unpack */
#define AVX512_TQ_CHUNK 12 /* blocks of prepared pairs per pass (30 KiB for 4 pairs: L1) */
#define AVX512_TQ_ROWS  64 /* rows of a tile whose accumulators persist between passes */

/* One Q8_K block of an activation pair, prepared for the ternary gemm. */
struct avx512_tq_pair {
    int8_t  qs[8][64]; /* chunk c: elements 32c .. 32c + 31 of a, then those of b */
    int32_t bias[16];  /* -(bsums[2k] + bsums[2k + 1]) in lane k: a's lanes 0..7, b's 8..15 */
    float   d[16];     /* the Q8_K scale: a's in lanes 0..7, b's in 8..15 */
};

/* Prepares blocks [0, nb) of activations a and b into p[0], p[stride], p[2 * stride] ... */
static void avx512_tq_prep(const struct executor_block_q8_K *a, const struct executor_block_q8_K *b,
                           int64_t nb, struct avx512_tq_pair *p, size_t stride)
{
    const __m256i one = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < nb; i++, p += stride) {
        for (int c = 0; c < 8; c++)
            _mm512_store_si512(p->qs[c], avx512_load_pair(a[i].qs + 32 * c, b[i].qs + 32 * c));
        const __m256i sa = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[i].bsums), one);
        const __m256i sb = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)b[i].bsums), one);
        _mm512_store_si512(p->bias,
                           _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_inserti64x4(_mm512_castsi256_si512(sa), sb, 1)));
        _mm512_store_ps(p->d, avx512_scale_pair(a[i].d, b[i].d));
    }
}

/* The 8 weight chunks of a TQ2_0 block, each 32 quants (0..3) in both halves of a vector. */
static inline void avx512_tq2_chunks(const struct executor_block_tq2_0 *x, __m512i w[8])
{
    const __m512i m3 = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const __m512i b =
            _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * h)));
        w[4 * h] = _mm512_and_si512(b, m3);
        w[4 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(b, 2), m3);
        w[4 * h + 2] = _mm512_and_si512(_mm512_srli_epi16(b, 4), m3);
        w[4 * h + 3] = _mm512_and_si512(_mm512_srli_epi16(b, 6), m3);
    }
}

/* The 8 weight chunks of a TQ1_0 block, each 32 trits (0..2) in both halves of a vector: chunks
 * 0..4 are qs[0..31] times 3^c; chunk 5 is qs[32..47] times 1 | 3, chunk 6 times 9 | 27, chunk 7
 * times 81 | the qh word times 3^k in dword k (elements 240 + 4k + j). */
static inline void avx512_tq1_chunks(const struct executor_block_tq1_0 *x, __m512i w[8])
{
    const __mmask64 odd = 0xFFFF0000FFFF0000ull; /* 16-byte lanes 1 and 3 */
    __m512i         p = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x->qs));
    for (int c = 0; c < 5; c++) {
        w[c] = avx512_tq1_top_trit(p);
        if (c < 4)
            p = avx512_times3(p);
    }
    const __m512i r = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x->qs + 32)));
    __m512i       q = _mm512_mask_add_epi8(r, odd, r, _mm512_add_epi8(r, r));
    w[5] = avx512_tq1_top_trit(q);
    q = avx512_times3(avx512_times3(q));
    w[6] = avx512_tq1_top_trit(q);
    q = avx512_times3(avx512_times3(q));
    uint32_t qh;
    memcpy(&qh, x->qh, sizeof(qh));
    const __m128i h0 = _mm_set1_epi32((int)qh);
    const __m128i h1 = avx512_tq1_times3_128(h0);
    const __m128i h2 = avx512_tq1_times3_128(h1);
    const __m128i h3 = avx512_tq1_times3_128(h2);
    const __m512i h = _mm512_broadcast_i32x4(
        _mm_unpacklo_epi64(_mm_unpacklo_epi32(h0, h1), _mm_unpacklo_epi32(h2, h3)));
    w[7] = avx512_tq1_top_trit(_mm512_mask_blend_epi8(odd, q, h));
}

/* Blocks [i0, i0 + nbk) of n_rows rows (stride rb) with NP prepared pairs per block (g[i * NP +
 * p], block i0 + i), onto the accumulators acc[r * AVX512_TQ_NPAIR + p] (zeroed first when i0 is
 * 0). */
static inline __attribute__((always_inline)) void
avx512_tq_rows(const int NP, const int TQ1, const char *w, size_t rb, int64_t n_rows, int64_t i0,
               int64_t nbk, const struct avx512_tq_pair *g, __m512 *acc)
{
    const size_t bs =
        TQ1 ? sizeof(struct executor_block_tq1_0) : sizeof(struct executor_block_tq2_0);
    for (int64_t r = 0; r < n_rows; r++) {
        const char *row = w + (size_t)r * rb + (size_t)i0 * bs;
        __m512      s[AVX512_TQ_NPAIR];
        for (int p = 0; p < NP; p++)
            s[p] = i0 == 0 ? _mm512_setzero_ps() : acc[r * AVX512_TQ_NPAIR + p];
        for (int64_t i = 0; i < nbk; i++) {
            __m512i wc[8];
            float   xd;
            if (TQ1) {
                const struct executor_block_tq1_0 *x = (const void *)(row + (size_t)i * bs);
                avx512_tq1_chunks(x, wc);
                xd = avx512_fp16(x->d);
            } else {
                const struct executor_block_tq2_0 *x = (const void *)(row + (size_t)i * bs);
                avx512_tq2_chunks(x, wc);
                xd = avx512_fp16(x->d);
            }
            const __m512 dw = _mm512_set1_ps(xd);
            for (int p = 0; p < NP; p++) {
                const struct avx512_tq_pair *q = g + i * NP + p;
                __m512i                      sumi = _mm512_load_si512(q->bias);
                for (int c = 0; c < 8; c++)
                    sumi = _mm512_dpbusd_epi32(sumi, wc[c], _mm512_load_si512(q->qs[c]));
                s[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi),
                                       _mm512_mul_ps(_mm512_load_ps(q->d), dw), s[p]);
            }
        }
        for (int p = 0; p < NP; p++)
            acc[r * AVX512_TQ_NPAIR + p] = s[p];
    }
}

static inline __attribute__((always_inline)) void
avx512_gemm_tq(const int TQ1, int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
               size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    _Alignas(64) struct avx512_tq_pair g[AVX512_TQ_CHUNK * AVX512_TQ_NPAIR];
    _Alignas(64) __m512                acc[AVX512_TQ_ROWS * AVX512_TQ_NPAIR];
    const int64_t                      nb = n / EXECUTOR_QK_K;
    for (int64_t j0 = 0; j0 < n_act; j0 += 2 * AVX512_TQ_NPAIR) {
        const int na = n_act - j0 < 2 * AVX512_TQ_NPAIR ? (int)(n_act - j0) : 2 * AVX512_TQ_NPAIR;
        const int np = (na + 1) / 2;
        for (int64_t r0 = 0; r0 < n_rows; r0 += AVX512_TQ_ROWS) {
            const int64_t nr = n_rows - r0 < AVX512_TQ_ROWS ? n_rows - r0 : AVX512_TQ_ROWS;
            const char   *wr = (const char *)w + (size_t)r0 * rb;
            for (int64_t k0 = 0; k0 < nb; k0 += AVX512_TQ_CHUNK) {
                const int64_t nk = nb - k0 < AVX512_TQ_CHUNK ? nb - k0 : AVX512_TQ_CHUNK;
                if (r0 == 0 || nb > AVX512_TQ_CHUNK) {
                    for (int p = 0; p < np; p++) {
                        const int ja = 2 * p, jb = ja + 1 < na ? ja + 1 : ja;
                        const struct executor_block_q8_K *a =
                            (const void *)((const char *)act + (size_t)(j0 + ja) * act_stride);
                        const struct executor_block_q8_K *b =
                            (const void *)((const char *)act + (size_t)(j0 + jb) * act_stride);
                        avx512_tq_prep(a + k0, b + k0, nk, g + p, (size_t)np);
                    }
                }
                switch (np) {
                case 4:
                    avx512_tq_rows(4, TQ1, wr, rb, nr, k0, nk, g, acc);
                    break;
                case 3:
                    avx512_tq_rows(3, TQ1, wr, rb, nr, k0, nk, g, acc);
                    break;
                case 2:
                    avx512_tq_rows(2, TQ1, wr, rb, nr, k0, nk, g, acc);
                    break;
                default:
                    avx512_tq_rows(1, TQ1, wr, rb, nr, k0, nk, g, acc);
                    break;
                }
            }
            for (int64_t r = 0; r < nr; r++) {
                for (int j = 0; j < na; j++) {
                    const __m512 s = acc[r * AVX512_TQ_NPAIR + j / 2];
                    const __m256 h =
                        j % 2 ? _mm512_extractf32x8_ps(s, 1) : _mm512_castps512_ps256(s);
                    y[(size_t)(j0 + j) * ys + (size_t)(r0 + r)] = avx512_hsum_ps_ggml(h);
                }
            }
        }
    }
}

static void avx512_gemm_tq1_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    avx512_gemm_tq(1, n, w, rb, n_rows, act, act_stride, n_act, y, ys);
}

static void avx512_gemm_tq2_0(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    avx512_gemm_tq(0, n, w, rb, n_rows, act, act_stride, n_act, y, ys);
}

/* ------------------------------------------------------------------------------------------ */
/* MXFP4 x Q8_0                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Two blocks per step, a "pair" p: blocks 2p and 2p + 1, lanes 0..7 the first, 8..15 the second
 * (nibbles in element order, as avx512_nibbles_pair gives them). The e2m1 values are looked up
 * offset by 12 (0..24, unsigned, for vpdpbusd) and each int32 lane starts from -12 * the sum of its
 * four activations (made once per pair for every row): sum(w * a) exactly. Lane sums are scaled by
 * d_a * d_w (one multiply of the activation's and the row's scale vectors) into one accumulator per
 * (row, activation). A row is summed in spans of AVX512_MXFP4_SPAN pairs (a horizontal add per
 * span, spans added in order), then an odd last block in scalar code; vec_dot, gemv and gemm all
 * run this sequence, so they give the same bits. The gemm prepares each activation pair once per
 * call (struct avx512_mxfp4_act) and unpacks each weight pair once for 4 activations. */
#define AVX512_MXFP4_ROWS       4  /* rows sharing one activation pair in the gemv */
#define AVX512_MXFP4_SPAN       32 /* pairs summed before each horizontal add */
#define AVX512_MXFP4_NACT       4  /* activations sharing one weight unpack in the gemm */
#define AVX512_MXFP4_GEMM_ROWS  2  /* rows sharing one prepared activation load in the gemm */
#define AVX512_MXFP4_GEMM_CHUNK 32 /* pairs prepared at once per activation */
_Static_assert(AVX512_MXFP4_GEMM_CHUNK % AVX512_MXFP4_SPAN == 0,
               "gemm spans must be vec_dot's spans");

/* A pair of activation blocks as the kernels use it; the gemm stores these (24 KiB of stack). */
struct avx512_mxfp4_act {
    int8_t  q[64];  /* quants of the two blocks */
    int32_t c[16];  /* per lane: -12 * the sum of the lane's 4 quants */
    float   da[16]; /* per lane: d of the lane's block */
};

/* The same in registers. */
struct avx512_mxfp4_a {
    __m512i q, c;
    __m512  da;
};

/* A pair of weight blocks: values + 12 (0..24) and d_w per lane. */
struct avx512_mxfp4_w {
    __m512i q;
    __m512  dw;
};

/* The e2m1 lookup table offset by 12, in every 128-bit lane for vpshufb. */
static inline __m512i avx512_mxfp4_table(void)
{
    int8_t shifted[16];
    for (int k = 0; k < 16; k++)
        shifted[k] = (int8_t)(kimpl_mxfp4_values[k] + 12);
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)shifted));
}

static inline struct avx512_mxfp4_a avx512_mxfp4_act_load(const struct executor_block_q8_0 *y)
{
    const __m512i q = avx512_load_pair(y[0].qs, y[1].qs);
    const __m512i zero = _mm512_setzero_si512();
    return (struct avx512_mxfp4_a){
        .q = q,
        .c = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(12), q)),
        .da = avx512_scale_pair(kimpl_fp16_to_fp32(y[0].d), kimpl_fp16_to_fp32(y[1].d))};
}

static inline struct avx512_mxfp4_w avx512_mxfp4_unpack(const struct executor_block_mxfp4 *x,
                                                        __m512i                            table)
{
    return (struct avx512_mxfp4_w){
        .q = _mm512_shuffle_epi8(table, avx512_nibbles_pair(x[0].qs, x[1].qs)),
        .dw = avx512_scale_pair(kimpl_e8m0_half(x[0].e), kimpl_e8m0_half(x[1].e))};
}

/* acc + (lane sums * (d_a * d_w)): the one sequence every MXFP4 kernel runs per (row, activation,
 * pair), so they agree bit for bit. */
static inline __m512 avx512_mxfp4_pair(struct avx512_mxfp4_w w, __m512i q, __m512i c, __m512 da,
                                       __m512 acc)
{
    const __m512i s = _mm512_dpbusd_epi32(c, w.q, q);
    return _mm512_fmadd_ps(_mm512_mul_ps(da, w.dw), _mm512_cvtepi32_ps(s), acc);
}

/* The dot of one block in scalar code (a row's odd last block). */
static inline float avx512_mxfp4_block(const struct executor_block_mxfp4 *x,
                                       const struct executor_block_q8_0  *y)
{
    int sumi = 0;
    for (int j = 0; j < EXECUTOR_QK / 2; j++)
        sumi += y->qs[j] * kimpl_mxfp4_values[x->qs[j] & 0x0F] +
                y->qs[j + EXECUTOR_QK / 2] * kimpl_mxfp4_values[x->qs[j] >> 4];
    return kimpl_fp16_to_fp32(y->d) * kimpl_e8m0_half(x->e) * (float)sumi;
}

static inline const struct executor_block_mxfp4 *avx512_mxfp4_row(const char *w, size_t rb,
                                                                  int64_t r)
{
    return (const struct executor_block_mxfp4 *)(const void *)(w + (size_t)r * rb);
}

/* Dots of R rows of MXFP4 (stride rb) with one Q8_0 activation y (gemv, vec_dot), the activation
 * pair made once for all R rows. */
static inline __attribute__((always_inline)) void
avx512_mxfp4_rows(const int R, int64_t nb, const char *w, size_t rb,
                  const struct executor_block_q8_0 *y, float *out)
{
    const __m512i table = avx512_mxfp4_table();
    const int64_t np = nb / 2;
    float         v[AVX512_MXFP4_ROWS];
    for (int r = 0; r < R; r++)
        v[r] = 0.0f;
    for (int64_t k = 0; k < np; k += AVX512_MXFP4_SPAN) {
        const int64_t ke = np - k < AVX512_MXFP4_SPAN ? np : k + AVX512_MXFP4_SPAN;
        __m512        acc[AVX512_MXFP4_ROWS];
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_setzero_ps();
        for (int64_t p = k; p < ke; p++) {
            const struct avx512_mxfp4_a a = avx512_mxfp4_act_load(y + 2 * p);
            for (int r = 0; r < R; r++)
                acc[r] = avx512_mxfp4_pair(
                    avx512_mxfp4_unpack(avx512_mxfp4_row(w, rb, r) + 2 * p, table), a.q, a.c, a.da,
                    acc[r]);
        }
        for (int r = 0; r < R; r++) {
            const float s = avx512_hsum_ps(acc[r]);
            v[r] = k == 0 ? s : v[r] + s;
        }
    }
    for (int r = 0; r < R; r++)
        out[r] = nb % 2 ? v[r] + avx512_mxfp4_block(avx512_mxfp4_row(w, rb, r) + nb - 1, y + nb - 1)
                        : v[r];
}

static void avx512_gemv_mxfp4(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              float *y)
{
    const int64_t nb = n / EXECUTOR_QK;
    int64_t       r = 0;
    for (; r + AVX512_MXFP4_ROWS <= n_rows; r += AVX512_MXFP4_ROWS)
        avx512_mxfp4_rows(AVX512_MXFP4_ROWS, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
    for (; r < n_rows; r++)
        avx512_mxfp4_rows(1, nb, (const char *)w + (size_t)r * rb, rb, act, y + r);
}

static float avx512_dot_mxfp4(int64_t n, const void *w, const void *a)
{
    float y;
    avx512_mxfp4_rows(1, n / EXECUTOR_QK, w, 0, a, &y);
    return y;
}

/* Prepares the np pairs of activation blocks from y into g. */
static void avx512_mxfp4_prep(const struct executor_block_q8_0 *y, int64_t np,
                              struct avx512_mxfp4_act *g)
{
    for (int64_t p = 0; p < np; p++) {
        const struct avx512_mxfp4_a a = avx512_mxfp4_act_load(y + 2 * p);
        _mm512_store_si512(g[p].q, a.q);
        _mm512_store_si512(g[p].c, a.c);
        _mm512_store_ps(g[p].da, a.da);
    }
}

/* Span sums over pairs [p0, p0 + np) (np <= AVX512_MXFP4_SPAN) of R rows at w (stride rb) with NA
 * prepared activations g + j * gs (g at pair p0): out[r * AVX512_MXFP4_NACT + j]. Each weight
 * pair is unpacked once for NA activations, each prepared pair loaded once for R rows. */
static inline __attribute__((always_inline)) void
avx512_mxfp4_span(const int R, const int NA, const char *w, size_t rb, int64_t p0, int64_t np,
                  const struct avx512_mxfp4_act *g, size_t gs, __m512i table, float *out)
{
    __m512 acc[AVX512_MXFP4_GEMM_ROWS][AVX512_MXFP4_NACT];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NA; j++)
            acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        struct avx512_mxfp4_w x[AVX512_MXFP4_GEMM_ROWS];
        for (int r = 0; r < R; r++)
            x[r] = avx512_mxfp4_unpack(avx512_mxfp4_row(w, rb, r) + 2 * (p0 + p), table);
        for (int j = 0; j < NA; j++) {
            const struct avx512_mxfp4_act *a = g + (size_t)j * gs + p;
            const __m512i                  q = _mm512_load_si512(a->q);
            const __m512i                  c = _mm512_load_si512(a->c);
            const __m512                   da = _mm512_load_ps(a->da);
            for (int r = 0; r < R; r++)
                acc[r][j] = avx512_mxfp4_pair(x[r], q, c, da, acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < NA; j++)
            out[r * AVX512_MXFP4_NACT + j] = avx512_hsum_ps(acc[r][j]);
}

/* The pairs [k0, k0 + nk) of n_rows rows (stride rb) with NA activations prepared at
 * g[j * AVX512_MXFP4_GEMM_CHUNK + p]; span sums added in order into y[j * ys + r] (the first span
 * writes it). Spans run outermost so only one span of the NA activations (24 KiB) is hot in L1
 * while the rows (in L2: executor_matmul tiles them) pass over it, as in the Q4_0 gemm. */
static inline __attribute__((always_inline)) void
avx512_mxfp4_rows_multi(const int NA, const char *w, size_t rb, int64_t n_rows, int64_t k0,
                        int64_t nk, const struct avx512_mxfp4_act *g, float *y, size_t ys)
{
    const __m512i table = avx512_mxfp4_table();
    for (int64_t k = 0; k < nk; k += AVX512_MXFP4_SPAN) {
        const int64_t ns = nk - k < AVX512_MXFP4_SPAN ? nk - k : AVX512_MXFP4_SPAN;
        for (int64_t r = 0; r < n_rows; r += AVX512_MXFP4_GEMM_ROWS) {
            const char *wr = w + (size_t)r * rb;
            const int   R =
                n_rows - r < AVX512_MXFP4_GEMM_ROWS ? (int)(n_rows - r) : AVX512_MXFP4_GEMM_ROWS;
            float s[AVX512_MXFP4_GEMM_ROWS * AVX512_MXFP4_NACT];
            if (R == AVX512_MXFP4_GEMM_ROWS)
                avx512_mxfp4_span(AVX512_MXFP4_GEMM_ROWS, NA, wr, rb, k0 + k, ns, g + k,
                                  AVX512_MXFP4_GEMM_CHUNK, table, s);
            else
                avx512_mxfp4_span(1, NA, wr, rb, k0 + k, ns, g + k, AVX512_MXFP4_GEMM_CHUNK, table,
                                  s);
            for (int i = 0; i < R; i++)
                for (int j = 0; j < NA; j++) {
                    float *yj = y + (size_t)j * ys + (size_t)(r + i);
                    *yj = k0 + k == 0 ? s[i * AVX512_MXFP4_NACT + j]
                                      : *yj + s[i * AVX512_MXFP4_NACT + j];
                }
        }
    }
}

static void avx512_gemm_mxfp4(int64_t n, const void *w, size_t rb, int64_t n_rows, const void *act,
                              size_t act_stride, int64_t n_act, float *y, size_t ys)
{
    _Alignas(64) struct avx512_mxfp4_act g[AVX512_MXFP4_NACT * AVX512_MXFP4_GEMM_CHUNK];
    const int64_t                        nb = n / EXECUTOR_QK;
    const int64_t                        np = nb / 2;
    for (int64_t j0 = 0; j0 < n_act; j0 += AVX512_MXFP4_NACT) {
        const int na = n_act - j0 < AVX512_MXFP4_NACT ? (int)(n_act - j0) : AVX512_MXFP4_NACT;
        const struct executor_block_q8_0 *ya[AVX512_MXFP4_NACT];
        for (int j = 0; j < na; j++)
            ya[j] = (const void *)((const char *)act + (size_t)(j0 + j) * act_stride);
        float *yj = y + (size_t)j0 * ys;
        for (int64_t k0 = 0; k0 < np; k0 += AVX512_MXFP4_GEMM_CHUNK) {
            const int64_t nk =
                np - k0 < AVX512_MXFP4_GEMM_CHUNK ? np - k0 : AVX512_MXFP4_GEMM_CHUNK;
            for (int j = 0; j < na; j++)
                avx512_mxfp4_prep(ya[j] + 2 * k0, nk, g + (size_t)j * AVX512_MXFP4_GEMM_CHUNK);
            switch (na) {
            case 4:
                avx512_mxfp4_rows_multi(4, w, rb, n_rows, k0, nk, g, yj, ys);
                break;
            case 3:
                avx512_mxfp4_rows_multi(3, w, rb, n_rows, k0, nk, g, yj, ys);
                break;
            case 2:
                avx512_mxfp4_rows_multi(2, w, rb, n_rows, k0, nk, g, yj, ys);
                break;
            default:
                avx512_mxfp4_rows_multi(1, w, rb, n_rows, k0, nk, g, yj, ys);
                break;
            }
        }
        if (nb % 2 == 0)
            continue;
        /* the odd last block, added last as avx512_mxfp4_rows adds it */
        for (int j = 0; j < na; j++)
            for (int64_t r = 0; r < n_rows; r++) {
                float *yr = yj + (size_t)j * ys + (size_t)r;
                *yr = (np > 0 ? *yr : 0.0f) +
                      avx512_mxfp4_block(avx512_mxfp4_row(w, rb, r) + nb - 1, ya[j] + nb - 1);
            }
    }
}

/* Up to 8 output rows of executor_wsum_f16 over columns [d, d + 16) (lanes of `msk`): the sums
 * stay in registers while the k rows pass. */
static inline void avx512_wsum_block(int64_t k, const char *x, size_t x_stride, const float *a,
                                     size_t a_stride, int64_t mj, float *y, size_t y_stride,
                                     __mmask16 msk)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        acc[j] =
            j < mj ? _mm512_maskz_loadu_ps(msk, y + (size_t)j * y_stride) : _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        const __m512 xv =
            avx512_maskz_load_f16(msk, (const uint16_t *)(const void *)(x + (size_t)i * x_stride));
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            if (j < mj)
                acc[j] = _mm512_add_ps(
                    acc[j], _mm512_mul_ps(_mm512_set1_ps(a[(size_t)j * a_stride + (size_t)i]), xv));
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        if (j < mj)
            _mm512_mask_storeu_ps(y + (size_t)j * y_stride, msk, acc[j]);
}

/* executor_wsum_f16: 16 columns by up to 8 rows at a time; mul then add, as the reference. */
static void avx512_wsum_f16(int64_t n, int64_t k, const uint16_t *x, size_t x_stride,
                            const float *a, size_t a_stride, int64_t m, float *y, size_t y_stride)
{
    for (int64_t j0 = 0; j0 < m; j0 += 8) {
        const int64_t mj = m - j0 < 8 ? m - j0 : 8;
        for (int64_t d = 0; d < n; d += 16) {
            const __mmask16 msk = n - d >= 16 ? (__mmask16)0xFFFFu : avx512_tail_mask(n - d);
            avx512_wsum_block(k, (const char *)(x + d), x_stride, a + (size_t)j0 * a_stride,
                              a_stride, mj, y + (size_t)j0 * y_stride + (size_t)d, y_stride, msk);
        }
    }
}

void executor_kernels_fill_avx512(struct executor_kernel_set *ks)
{
    ks->wsum_f16 = avx512_wsum_f16;
    ks->vec_dot[COMMON_GGML_TYPE_F32] = avx512_dot_f32;
    ks->vec_dot[COMMON_GGML_TYPE_F16] = avx512_dot_f16;
    ks->vec_dot[COMMON_GGML_TYPE_BF16] = avx512_dot_bf16;
    ks->gemm[COMMON_GGML_TYPE_F32] = avx512_gemm_f32;
    ks->gemm[COMMON_GGML_TYPE_F16] = avx512_gemm_f16;
    ks->gemm[COMMON_GGML_TYPE_BF16] = avx512_gemm_bf16;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_1] = avx512_dot_q4_1;
    ks->vec_dot[COMMON_GGML_TYPE_MXFP4] = avx512_dot_mxfp4;
    ks->gemv[COMMON_GGML_TYPE_MXFP4] = avx512_gemv_mxfp4;
    ks->gemm[COMMON_GGML_TYPE_MXFP4] = avx512_gemm_mxfp4;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_0] = avx512_dot_q5_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_1] = avx512_dot_q5_1;
    ks->vec_dot[COMMON_GGML_TYPE_Q5_K] = avx512_dot_q5_K;
    ks->gemm[COMMON_GGML_TYPE_Q5_K] = avx512_gemm_q5_K;
    ks->vec_dot[COMMON_GGML_TYPE_TQ1_0] = avx512_dot_tq1_0;
    ks->gemv[COMMON_GGML_TYPE_TQ1_0] = avx512_gemv_tq1_0;
    ks->vec_dot[COMMON_GGML_TYPE_TQ2_0] = avx512_dot_tq2_0;
    ks->gemv[COMMON_GGML_TYPE_TQ2_0] = avx512_gemv_tq2_0;
    ks->gemm[COMMON_GGML_TYPE_TQ1_0] = avx512_gemm_tq1_0;
    ks->gemm[COMMON_GGML_TYPE_TQ2_0] = avx512_gemm_tq2_0;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_Q128] = i2s_x86_dot_q128;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32H] = i2s_x86_dot_b32h;
    ks->vec_dot[COMMON_GGML_TYPE_I2S_B32F] = i2s_x86_dot_b32f;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_0] = avx512_dot_q4_0;
    ks->gemv[COMMON_GGML_TYPE_Q4_0] = avx512_gemv_q4_0;
    ks->gemm[COMMON_GGML_TYPE_Q4_0] = avx512_gemm_q4_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q8_0] = avx512_dot_q8_0;
    ks->gemm[COMMON_GGML_TYPE_Q8_0] = avx512_gemm_q8_0;
    ks->vec_dot[COMMON_GGML_TYPE_Q4_K] = avx512_dot_q4_K;
    ks->gemm[COMMON_GGML_TYPE_Q4_K] = avx512_gemm_q4_K;
    ks->vec_dot[COMMON_GGML_TYPE_Q6_K] = avx512_dot_q6_K;
    ks->gemm[COMMON_GGML_TYPE_Q6_K] = avx512_gemm_q6_K;
}
