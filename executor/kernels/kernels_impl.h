/* executor/kernels/kernels_impl.h - private to kernels/: ggml block layouts, scalar helpers, ISA
 * tables. */
#ifndef EXECUTOR_KERNELS_KERNELS_IMPL_H
#define EXECUTOR_KERNELS_KERNELS_IMPL_H

/* Not for use outside executor/kernels/: the layouts here mirror ggml-common.h byte for byte and
 * the function tables change with the kernels. Other code goes through kernels.h. */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "kernels.h"

#define EXECUTOR_QK            32  /* elements per block of Q4_0 .. Q8_1 */
#define EXECUTOR_QK_K          256 /* elements per K-quant super-block */
#define EXECUTOR_K_SCALE_BYTES 12  /* packed 6-bit scales and mins of Q4_K/Q5_K, and Q3_K scales */
#define EXECUTOR_TQ1_QS        48  /* bytes of 5 trits in a TQ1_0 block: (256 - 4 * 256 / 64) / 5 */

/* Block layouts (ggml-common.h). Scales `d`, `m`, `s`, `dmin` are IEEE half stored as bits. */
struct executor_block_q4_0 {
    uint16_t d;                   /* scale */
    uint8_t  qs[EXECUTOR_QK / 2]; /* element j in the low nibble of qs[j], j+16 in the high */
};
struct executor_block_q4_1 {
    uint16_t d;                   /* scale */
    uint16_t m;                   /* minimum (added) */
    uint8_t  qs[EXECUTOR_QK / 2]; /* nibbles as in Q4_0 */
};
struct executor_block_q5_0 {
    uint16_t d;                   /* scale */
    uint8_t  qh[4];               /* bit j: 5th bit of element j (little-endian u32) */
    uint8_t  qs[EXECUTOR_QK / 2]; /* low 4 bits as in Q4_0 */
};
struct executor_block_q5_1 {
    uint16_t d;                   /* scale */
    uint16_t m;                   /* minimum (added) */
    uint8_t  qh[4];               /* 5th bits as in Q5_0 */
    uint8_t  qs[EXECUTOR_QK / 2]; /* low 4 bits as in Q4_0 */
};
struct executor_block_q8_0 {
    uint16_t d;               /* scale */
    int8_t   qs[EXECUTOR_QK]; /* elements in order */
};
struct executor_block_q8_1 {
    uint16_t d;               /* scale */
    uint16_t s;               /* d * sum(qs) */
    int8_t   qs[EXECUTOR_QK]; /* elements in order */
};
struct executor_block_q2_K {
    uint8_t  scales[EXECUTOR_QK_K / 16]; /* per 16 elements: low nibble scale, high nibble min */
    uint8_t  qs[EXECUTOR_QK_K / 4];      /* 2-bit quants, 4 per byte (see dequantize) */
    uint16_t d;                          /* super-block scale of the scales */
    uint16_t dmin;                       /* super-block scale of the mins */
};
struct executor_block_q3_K {
    uint8_t  hmask[EXECUTOR_QK_K / 8];       /* high bit of each quant */
    uint8_t  qs[EXECUTOR_QK_K / 4];          /* low 2 bits */
    uint8_t  scales[EXECUTOR_K_SCALE_BYTES]; /* 16 six-bit scales, packed */
    uint16_t d;                              /* super-block scale */
};
struct executor_block_q4_K {
    uint16_t d;                              /* super-block scale of the scales */
    uint16_t dmin;                           /* super-block scale of the mins */
    uint8_t  scales[EXECUTOR_K_SCALE_BYTES]; /* 8 six-bit scales and 8 six-bit mins, packed */
    uint8_t  qs[EXECUTOR_QK_K / 2];          /* per 64 elements: 32 bytes, low nibbles first 32 */
};
struct executor_block_q5_K {
    uint16_t d; /* as Q4_K */
    uint16_t dmin;
    uint8_t  scales[EXECUTOR_K_SCALE_BYTES];
    uint8_t  qh[EXECUTOR_QK_K / 8]; /* 5th bits: bit 2c of qh[l] for element 64c+l, 2c+1 for +32 */
    uint8_t  qs[EXECUTOR_QK_K / 2]; /* low 4 bits as Q4_K */
};
struct executor_block_q6_K {
    uint8_t  ql[EXECUTOR_QK_K / 2];      /* low 4 bits */
    uint8_t  qh[EXECUTOR_QK_K / 4];      /* high 2 bits */
    int8_t   scales[EXECUTOR_QK_K / 16]; /* 8-bit scale per 16 elements */
    uint16_t d;                          /* super-block scale */
};
/* MXFP4 (gpt-oss): a shared power-of-two scale and 32 e2m1 values, nibbles as in Q4_0. */
struct executor_block_mxfp4 {
    uint8_t e;                   /* E8M0 exponent: the scale is 2^(e - 127) */
    uint8_t qs[EXECUTOR_QK / 2]; /* element j in the low nibble of qs[j], j+16 in the high */
};
/* Ternary types (BitNet b1.58, TriLMs): weights -d, 0, +d stored as 0, 1, 2 ("trits"), d = the
 * block's absmax. TQ1_0 packs 5 trits per byte as a base-3 number scaled to a byte:
 * byte = ceil(v * 256 / 243), v = sum t_k 3^(4-k); trit k comes back as the top of
 * (byte * 3^k mod 256) * 3 (kimpl_tq1_trit). qs[0..31] hold elements 32k + m (k = 0..4),
 * qs[32..47] elements 160 + 16k + m, and qh[j] (4 trits, the 5th 0) elements 240 + 4k + j. */
struct executor_block_tq1_0 {
    uint8_t  qs[EXECUTOR_TQ1_QS];    /* 5 trits per byte */
    uint8_t  qh[EXECUTOR_QK_K / 64]; /* 4 trits per byte */
    uint16_t d;                      /* scale */
};
/* TQ2_0: 2 bits per element, (q - 1) * d with q in 0..2 (3, never written, reads as +2d):
 * bits 2k..2k+1 of qs[32h + m] are element 128h + 32k + m. */
struct executor_block_tq2_0 {
    uint8_t  qs[EXECUTOR_QK_K / 4]; /* 4 quants per byte */
    uint16_t d;                     /* scale */
};
/* I2_S (BitNet b1.58, Microsoft's ggml fork), kernel-only layouts of one file type: 2-bit codes
 * c, weight c - 1 (0, 1, 2 -> -1, 0, +1; 3, never written, reads as +2). Q128 is Microsoft's x86
 * layout, scale-free (the tensor's one scale is applied by the caller): element j (0..127) is in
 * byte j % 32 at bit shift 6 - 2 * (j / 32). The block-32 layouts hold element j in byte j / 4 at
 * shift 2 * (j % 4), then their scale d (weight (c - 1) * d). */
#define EXECUTOR_I2S_QK128 128 /* elements per I2S_Q128 block */
struct executor_block_i2s_q128 {
    uint8_t
        qs[EXECUTOR_I2S_QK128 / 4]; /* byte g: elements g, 32+g, 64+g, 96+g in bits 7:6 .. 1:0 */
};
struct executor_block_i2s_b32h {
    uint8_t  qs[EXECUTOR_QK / 4]; /* byte k: elements 4k .. 4k+3 in bits 1:0 .. 7:6 */
    uint16_t d;                   /* scale */
};
struct executor_block_i2s_b32f {
    uint8_t qs[EXECUTOR_QK / 4]; /* as I2S_B32H */
    uint8_t d[4];                /* scale, a little-endian f32, unaligned: read with memcpy */
};
struct executor_block_q8_K {
    float   d;                         /* scale (float, not half) */
    int8_t  qs[EXECUTOR_QK_K];         /* elements in order */
    int16_t bsums[EXECUTOR_QK_K / 16]; /* sum of each 16 quants */
};

_Static_assert(sizeof(struct executor_block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(struct executor_block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(struct executor_block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(struct executor_block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(struct executor_block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(struct executor_block_q8_1) == 36, "q8_1 layout");
_Static_assert(sizeof(struct executor_block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(struct executor_block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(struct executor_block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(struct executor_block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(struct executor_block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(struct executor_block_q8_K) == 292, "q8_K layout");
_Static_assert(sizeof(struct executor_block_mxfp4) == 17, "mxfp4 layout");
_Static_assert(sizeof(struct executor_block_tq1_0) == 54, "tq1_0 layout");
_Static_assert(sizeof(struct executor_block_tq2_0) == 66, "tq2_0 layout");
_Static_assert(sizeof(struct executor_block_i2s_q128) == 32, "i2_s:q128 layout");
_Static_assert(sizeof(struct executor_block_i2s_b32h) == 10, "i2_s:b32h layout");
_Static_assert(sizeof(struct executor_block_i2s_b32f) == 12, "i2_s:b32f layout");

/* The e2m1 values of an MXFP4 nibble, doubled (ggml's kvalues_mxfp4): the block scale is halved
 * to match, kimpl_e8m0_half(). */
static const int8_t kimpl_mxfp4_values[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                              0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128): half the E8M0 scale, exact (subnormal for e < 2), as ggml_e8m0_to_fp32_half. */
static inline float kimpl_e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float          f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

/* ------------------------------------------------------------------------------------------ */
/* Scalar helpers shared by every kernel file (inline so each file gets its own copy).        */
/* ------------------------------------------------------------------------------------------ */

static inline uint32_t kimpl_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float kimpl_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* IEEE half -> float, exact (subnormals, inf, NaN payload kept). */
static inline float kimpl_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * 0x1p-24f; /* zero or subnormal, exact */
        return kimpl_f32_from_bits(kimpl_f32_bits(v) | sign);
    }
    if (exp == 31)
        return kimpl_f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return kimpl_f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

/* float -> IEEE half, round to nearest even, as F16C vcvtps2ph with imm 0 (and ggml's
 * GGML_FP32_TO_FP16 for every non-NaN input): overflow gives inf, NaN stays a quiet NaN with the
 * top payload bits kept. */
static inline uint16_t kimpl_fp32_to_fp16(float f)
{
    uint32_t x = kimpl_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
    if (x >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (x >= 0x38800000u) { /* normal half */
        uint32_t m = x - 0x38000000u;
        return (uint16_t)(sign | ((m + 0xfffu + ((m >> 13) & 1u)) >> 13));
    }
    if (x <= 0x33000000u) /* <= 2^-25: rounds to (signed) zero */
        return sign;
    uint32_t e = x >> 23;
    uint32_t mant = (x & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

static inline float kimpl_bf16_to_fp32(uint16_t h)
{
    return kimpl_f32_from_bits((uint32_t)h << 16);
}

/* float -> bf16 as ggml's GGML_FP32_TO_BF16: round to nearest even, NaN forced quiet. */
static inline uint16_t kimpl_fp32_to_bf16(float f)
{
    uint32_t u = kimpl_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 64u);
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* ggml's nearest_int: round half to even through the 1.5*2^23 trick; |f| <= 4194303. */
static inline int kimpl_nearest_int(float f)
{
    float   v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, sizeof(i));
    return (i & 0x007fffff) - 0x00400000;
}

/* Unpacks scale j and min j (0..7) of a Q4_K/Q5_K block (ggml's get_scale_min_k4). */
static inline void kimpl_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Trit k (0..4, 0 the most significant) of a TQ1_0 byte, 0..2: the byte is v * 256 / 243
 * rounded up, so multiplying by 3^k (mod 256) brings trit k to the top and * 3 >> 8 reads it. */
static inline int kimpl_tq1_trit(uint8_t byte, int k)
{
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t        q = (uint8_t)(byte * pow3[k]);
    return (q * 3) >> 8;
}

/* The f32 scale of an I2S_B32F block (little-endian, possibly unaligned). */
static inline float kimpl_i2s_b32f_scale(const struct executor_block_i2s_b32f *x)
{
    float d;
    memcpy(&d, x->d, sizeof(d));
    return d;
}

/* Unpacks the 16 six-bit Q3_K scales (still biased by 32). */
static inline void kimpl_q3_K_scales(const uint8_t *packed, int8_t out[16])
{
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
        int hi = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (int8_t)(lo | (hi << 4));
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Kernel sets                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Dot product of one weight row with converted activations, both of n elements (n a positive
 * multiple of the block size, checked by the caller). */
typedef float (*executor_vec_dot_fn)(int64_t n, const void *w, const void *act);
/* Converts n activations (a multiple of the activation block size) into dst. */
typedef void (*executor_quantize_fn)(const float *x, void *dst, int64_t n);

/* Dots of n_rows consecutive weight rows (row r at (const char *)w + r * row_bytes) with one
 * activation vector into y[0..n_rows). Must give each row exactly the bits vec_dot gives it.
 * Used by executor_matmul on cache-resident row tiles, where sharing the activation work across
 * rows pays; executor_matvec streams rows from DRAM one at a time (measured faster there). */
typedef void (*executor_gemv_fn)(int64_t n, const void *w, size_t row_bytes, int64_t n_rows,
                                 const void *act, float *y);

/* Dots of n_rows weight rows with n_act activation vectors (act j at (const char *)act + j *
 * act_stride) into y[j * y_stride + r], 0 <= r < n_rows (prefill). Must give each (row, activation)
 * exactly the bits vec_dot gives it. Optional; executor_matmul runs it on row tiles that stay in
 * L2 while every activation passes over them. */
typedef void (*executor_gemm_fn)(int64_t n, const void *w, size_t row_bytes, int64_t n_rows,
                                 const void *act, size_t act_stride, int64_t n_act, float *y,
                                 size_t y_stride);

/* executor_wsum_f16 (sizes checked by the caller; n, k, m > 0). */
typedef void (*executor_wsum_f16_fn)(int64_t n, int64_t k, const uint16_t *x, size_t x_stride,
                                     const float *a, size_t a_stride, int64_t m, float *y,
                                     size_t y_stride);

/* One ISA's kernels, indexed by ggml type id. NULL entries are filled from the slower set, except
 * gemv and gemm, which are optional (NULL: loop over vec_dot) and reset when a faster set replaces
 * the vec_dot of their type. */
struct executor_kernel_set {
    executor_vec_dot_fn  vec_dot[COMMON_GGML_TYPE_COUNT];      /* by weight type */
    executor_gemv_fn     gemv[COMMON_GGML_TYPE_COUNT];         /* by weight type; may be NULL */
    executor_gemm_fn     gemm[COMMON_GGML_TYPE_COUNT];         /* by weight type; may be NULL */
    executor_quantize_fn quantize_act[COMMON_GGML_TYPE_COUNT]; /* by activation type */
    executor_wsum_f16_fn wsum_f16;
};

/* Fill the entries each file implements (ref fills all supported types). */
void executor_kernels_fill_ref(struct executor_kernel_set *ks);
/* The reference weight quantizer of `type` (kernels/quant_ref.c), NULL when there is none. */
executor_quantize_fn executor_ref_quantizer(uint32_t type);
void                 executor_kernels_fill_avx2(struct executor_kernel_set *ks);
void                 executor_kernels_fill_avx512(struct executor_kernel_set *ks);

/* CPU detection (kernels/cpu.c): fills *out from cpuid / the OS-enabled state. */
void executor_cpu_detect(struct executor_cpu_features *out);

/* Bytes of one block of `type` and its elements (0, 0 when unsupported by the kernels). */
struct executor_type_layout {
    uint32_t blck;      /* elements per block */
    uint32_t type_size; /* bytes per block */
};
struct executor_type_layout executor_type_layout(uint32_t type);

/* Returns 0 when `type` has a layout here and n >= 0 is a multiple of its block size, else
 * COMMON_EINVAL. */
int executor_kernels_check(uint32_t type, int64_t n);

/* The argument checks of executor_wsum_f16 and executor_wsum_f16_ref: COMMON_EINVAL, 0 when there
 * is nothing to do, 1 when the kernel should run. */
int executor_wsum_check(int64_t n, int64_t k, const uint16_t *x, size_t a_stride, const float *a,
                        int64_t m, const float *y, size_t y_stride);

#endif /* EXECUTOR_KERNELS_KERNELS_IMPL_H */
